//! The fast test timings: what a test's `Subscription` uses so that listings, lease expiries,
//! checkpoints and polls happen within a test's patience.

use std::time::Duration;

use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::SharedLeaseStore;
use kinesis_dataflow::{ReadSettings, Subscription, SubscriptionBuilder};

/// Pause between two reads of a shard that returned nothing.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Pause between two listings of the shards and the leases.
pub const LIST_INTERVAL: Duration = Duration::from_millis(200);
/// How long a lease lasts without a renewal.
pub const LEASE_DURATION: Duration = Duration::from_millis(900);
/// Pause between two checkpoint writes of a shard.
pub const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(100);

/// A subscription builder of `stream` for `owner`, its leases in `store`, with the fast
/// timings: listings every 200 ms, 900 ms leases, checkpoints every 100 ms, polls every 50 ms
/// (without the read-rate cap); the default start position.
pub fn fast(
    api: &SharedKinesis,
    store: SharedLeaseStore,
    stream: &str,
    owner: &str,
) -> SubscriptionBuilder {
    with_fast_timings(Subscription::builder(api.clone(), store, stream)).owner(owner)
}

/// `builder` with the fast timings of [`fast`] (for a builder made elsewhere, such as each
/// stream's of a `MultiSubscription`).
pub fn with_fast_timings(builder: SubscriptionBuilder) -> SubscriptionBuilder {
    builder
        .read_settings(
            ReadSettings::default()
                .poll_interval(POLL_INTERVAL)
                .unlimited_reads(),
        )
        .list_interval(LIST_INTERVAL)
        .lease_duration(LEASE_DURATION)
        .checkpoint_interval(CHECKPOINT_INTERVAL)
}
