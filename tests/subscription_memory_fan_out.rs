//! The scenarios of `subscription_memory.rs` on the in-memory transport and lease store, every
//! instance reading with enhanced fan-out: out-of-order acks, coalesced checkpoint writes,
//! dropped deliveries, an unreachable lease store, a skewed clock, resharding.

mod support;

/// The fan-out consumer name the scenarios read as.
const FAN_OUT: Option<&str> = Some("subscription-tests");

include!("subscription_memory/scenarios.rs");
