//! Subscription rules that need faults or exact control: out-of-order acks, coalesced
//! checkpoint writes, dropped deliveries, an unreachable lease store, and a skewed clock. They
//! run on the in-memory transport and lease store.

//!
//! Reads by polling; `subscription_memory_fan_out.rs` runs the same scenarios with enhanced
//! fan-out.

mod support;

/// The fan-out consumer name, when the scenarios read with enhanced fan-out.
const FAN_OUT: Option<&str> = None;

include!("subscription_memory/scenarios.rs");
