//! One shard as a `Stream` of records.
//!
//! | item | what it is |
//! |---|---|
//! | [`ShardStreamBuilder`] | builds a [`ShardStream`]: stream, shard, settings, settled position |
//! | [`ShardStream`] | the `Stream<Item = Result<Record, KinesisError>>` of one shard |
//! | [`ReadSettings`] | poll interval, read-rate cap, batch size, failure handling |
//! | [`SettledPosition`] | the settled sequence number an expired iterator is renewed after |
//! | [`ShardEnd`] | what a closed shard reports when it is fully read |
//! | [`KPL_MAGIC`] | the bytes that mark a KPL-aggregated record |
//! | [`register_consumer`], [`deregister_consumer`] | the enhanced fan-out consumer ([`ReadSettings::fan_out`]) |
//!
//! **Enhanced fan-out.** With [`ReadSettings::fan_out`] a shard is read through
//! SubscribeToShard instead of GetRecords: the reader registers the consumer when it is
//! missing and waits until it is ACTIVE, subscribes where polling would open its first
//! iterator, and hands on each event's records as a GetRecords answer's. A subscription ends
//! after five minutes (the service's rule): the reader subscribes again right after the last
//! event's continuation sequence number, so nothing is skipped or repeated. A failed
//! subscription (another subscription of this consumer to the shard, as in a takeover race;
//! a dropped connection; a deleted consumer, registered again) is reported on the stream and
//! retried after the failure backoff, with polling's stop rule. Every call is given up after
//! [`READ_CALL_TIMEOUT`], and a subscription that sends no event for
//! [`SUBSCRIPTION_IDLE_LIMIT`] is dropped and subscribed again after its last event, so no
//! call or connection that never answers holds the shard unread. Back-pressure: the next event
//! is taken only when everything of the previous one was, so at most one event waits in the
//! reader, beyond what the transport's flow control lets the service send ahead. The end of
//! a closed shard comes with the event that names its children; where a service does not send
//! it (the emulators), the reader confirms the end with one GetRecords after the continuation
//! when the subscription is idle and caught up (at once, then after ten poll intervals,
//! doubling while the shard stays idle, up to eighty).

mod consumer;
mod deaggregate;
mod first_reads;
mod reader;
mod settings;
mod stream;

/// The first four bytes of a record aggregated by the Kinesis Producer Library (the same as
/// [`kpl::MAGIC`](crate::kpl::MAGIC)).
pub use crate::kpl::MAGIC as KPL_MAGIC;
pub use crate::position::SettledPosition;
pub use consumer::{CONSUMER_ACTIVATION_TIMEOUT, deregister_consumer, register_consumer};
pub(crate) use first_reads::FirstReads;
pub(crate) use reader::{HangUp, ReadProbe};
pub use settings::{
    DEFAULT_BATCH_SIZE, DEFAULT_FAILURE_BACKOFF, DEFAULT_MAX_FAILURES, DEFAULT_POLL_INTERVAL,
    MAX_WAIT, READ_CALL_TIMEOUT, ReadSettings, SERVICE_READS_PER_SECOND, SUBSCRIPTION_IDLE_LIMIT,
};
pub use stream::{ShardStream, ShardStreamBuilder};

use crate::api::ChildShard;

/// A closed shard, read to its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardEnd {
    /// The shard that ended.
    pub shard_id: String,
    /// Its children, as the last GetRecords answer named them.
    pub child_shards: Vec<ChildShard>,
    /// The last record this reader read from it, if any.
    pub last_sequence_number: Option<String>,
}
