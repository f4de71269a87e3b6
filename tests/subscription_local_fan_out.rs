//! The scenarios of `subscription_local.rs` against kinesis-local and dynalite, every instance
//! reading with enhanced fan-out (SubscribeToShard over the SDK's event stream): instances
//! sharing shards, a crash taken over from its checkpoint, a graceful hand-off without
//! duplicates, resharding with every key in order, an instance cut off from DynamoDB.

mod support;

/// The fan-out consumer name the scenarios read as.
const FAN_OUT: Option<&str> = Some("subscription-tests");

include!("subscription_local/scenarios.rs");
