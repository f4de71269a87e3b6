//! Subscriptions against kinesis-local and dynalite: instances sharing shards through the
//! lease table, crashes and graceful hand-offs, resharding with parents before children.

//!
//! Reads by polling; `subscription_local_fan_out.rs` runs the same scenarios with enhanced
//! fan-out.

mod support;

/// The fan-out consumer name, when the scenarios read with enhanced fan-out.
const FAN_OUT: Option<&str> = None;

include!("subscription_local/scenarios.rs");
