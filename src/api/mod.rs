//! The seam: every Kinesis call the library makes, as one trait with two implementations,
//! and the calls that manage streams, as a second trait.
//!
//! | item | what it is |
//! |---|---|
//! | [`KinesisApi`] | the calls: ListShards, GetShardIterator, GetRecords, PutRecords, DescribeStreamSummary; for enhanced fan-out RegisterStreamConsumer, DescribeStreamConsumer, DeregisterStreamConsumer, SubscribeToShard |
//! | [`KinesisAdmin`] | the calls that create and reshard streams (CreateStream, SplitShard, MergeShards), for tests, demos and tooling |
//! | [`AwsKinesis`] | the AWS SDK client behind both traits (AWS, LocalStack, emulators) |
//! | [`MemoryKinesis`] | an in-memory Kinesis: the demo, in-process tests, deterministic fault injection (feature `test-util`) |
//! | [`layer`] | one way to wrap every call of the seam (counting, recording, faults) |
//! | [`ShardDescription`], [`GetRecordsOutput`], [`ChildShard`], [`PutRecordsEntry`], [`PutRecordsOutput`], [`StreamSummary`], [`StreamConsumer`], [`ShardEvent`] | what the calls take and return |
//!
//! Everything above the seam (the shard reader, subscriptions, the broker) is written against
//! [`KinesisApi`] only, so the in-memory transport exercises exactly the code that runs on AWS.

mod admin;
pub(crate) mod aws;
pub mod layer;
pub mod memory;

use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::stream::BoxStream;

pub use admin::KinesisAdmin;
pub use aws::AwsKinesis;
pub use memory::MemoryKinesis;

use crate::error::KinesisError;
use crate::position::StartingPoint;
use crate::record::Record;

/// The future every call of the seam returns.
pub type ApiFuture<'a, T> = BoxFuture<'a, Result<T, KinesisError>>;

/// The most records one GetRecords call may ask for.
pub const MAX_GET_RECORDS_LIMIT: u32 = 10_000;

/// The Kinesis calls the library makes to read and publish. The calls that create and reshard
/// streams are [`KinesisAdmin`]'s.
///
/// Implementations map the service's failures onto [`KinesisError`]: throttling to
/// [`KinesisError::Throttled`], an expired iterator to [`KinesisError::ExpiredIterator`], a
/// missing stream or shard to [`KinesisError::StreamNotFound`] / [`KinesisError::ShardNotFound`],
/// refused arguments to [`KinesisError::InvalidArgument`], a stream that exists already (or is
/// changing state) to [`KinesisError::ResourceInUse`], and transient failures to
/// [`KinesisError::Service`]. The reader's retry rules depend on that mapping.
pub trait KinesisApi: Send + Sync + 'static {
    /// The region the client talks to (for error messages).
    fn region(&self) -> &str;

    /// One page of ListShards. `next_token` continues a previous page; the answer's
    /// `next_token` is `None` on the last page.
    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
        next_token: Option<String>,
    ) -> ApiFuture<'a, ListShardsPage>;

    /// GetShardIterator for `shard` at `start`.
    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, String>;

    /// GetRecords with `iterator`, asking for at most `limit` records. The records are tagged
    /// with `shard` and, by the crate's transports, with `stream` (the shard reader names the
    /// stream of any record left unnamed).
    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: String,
        limit: u32,
    ) -> ApiFuture<'a, GetRecordsOutput>;

    /// PutRecords: at most 500 entries. Entries fail one by one; see [`PutRecordsOutput`].
    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
    ) -> ApiFuture<'a, PutRecordsOutput>;

    /// DescribeStreamSummary.
    fn describe_stream_summary<'a>(&'a self, stream: &'a str) -> ApiFuture<'a, StreamSummary>;

    /// RegisterStreamConsumer: registers the enhanced fan-out consumer `consumer` of `stream`.
    /// It is usually CREATING at first. A consumer of that name that exists already is
    /// [`KinesisError::ResourceInUse`].
    fn register_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer>;

    /// DescribeStreamConsumer: the consumer `consumer` of `stream`;
    /// [`KinesisError::StreamNotFound`] when there is no such consumer (or stream).
    fn describe_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer>;

    /// DeregisterStreamConsumer: removes the consumer `consumer` of `stream` (its
    /// subscriptions end).
    fn deregister_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, ()>;

    /// SubscribeToShard: the events the service pushes to the consumer `consumer_arn` from
    /// `shard` of `stream`, starting at `start` (an after-sub-sequence start subscribes at its
    /// sequence number). The stream of events ends when the subscription does (the service
    /// ends each after five minutes) or after the event that reaches the end of a closed shard;
    /// an `Err` item is its last. Calling again within five seconds of a successful call for
    /// the same consumer and shard is [`KinesisError::ResourceInUse`].
    fn subscribe_to_shard<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, ShardEvents>;
}

/// A shared API is an API: `Arc<MemoryKinesis>`, [`SharedKinesis`].
impl<T: KinesisApi + ?Sized> KinesisApi for Arc<T> {
    fn region(&self) -> &str {
        T::region(self)
    }

    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
        next_token: Option<String>,
    ) -> ApiFuture<'a, ListShardsPage> {
        T::list_shards(self, stream, next_token)
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, String> {
        T::get_shard_iterator(self, stream, shard, start)
    }

    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: String,
        limit: u32,
    ) -> ApiFuture<'a, GetRecordsOutput> {
        T::get_records(self, stream, shard, iterator, limit)
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        T::put_records(self, stream, entries)
    }

    fn describe_stream_summary<'a>(&'a self, stream: &'a str) -> ApiFuture<'a, StreamSummary> {
        T::describe_stream_summary(self, stream)
    }

    fn register_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        T::register_stream_consumer(self, stream, consumer)
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        T::describe_stream_consumer(self, stream, consumer)
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, ()> {
        T::deregister_stream_consumer(self, stream, consumer)
    }

    fn subscribe_to_shard<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, ShardEvents> {
        T::subscribe_to_shard(self, stream, consumer_arn, shard, start)
    }
}

/// The events of one SubscribeToShard subscription, in shard order (see
/// [`KinesisApi::subscribe_to_shard`]).
pub type ShardEvents = BoxStream<'static, Result<ShardEvent, KinesisError>>;

/// One event of a SubscribeToShard subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShardEvent {
    /// The records, in shard order (possibly none: the service also sends empty events).
    pub records: Vec<Record>,
    /// Where a new subscription resumes (after this sequence number); `None` in the event
    /// that reaches the end of a closed shard.
    pub continuation_sequence_number: Option<String>,
    /// How far behind the shard's tip the event is.
    pub millis_behind_latest: Option<u64>,
    /// The children of a closed shard, given with the event that reaches its end.
    pub child_shards: Vec<ChildShard>,
}

impl ShardEvent {
    /// True for the event that reaches the end of a closed shard.
    #[must_use]
    pub fn ends_shard(&self) -> bool {
        self.continuation_sequence_number.is_none()
    }
}

/// An enhanced fan-out consumer of a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamConsumer {
    /// Its name, unique within the stream.
    pub consumer_name: String,
    /// Its ARN, which SubscribeToShard takes.
    pub consumer_arn: String,
    /// Its state.
    pub status: ConsumerStatus,
}

/// Checks an enhanced fan-out consumer name as the service does: 1 to 128 letters, digits,
/// `_`, `.` or `-`. The error names the name.
pub(crate) fn check_consumer_name(name: &str) -> Result<(), String> {
    let valid = (1..=128).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
    if valid {
        Ok(())
    } else {
        Err(format!(
            "ConsumerName `{name}` must be 1 to 128 letters, digits, `_`, `.` or `-`"
        ))
    }
}

/// An enhanced fan-out consumer's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConsumerStatus {
    /// Being registered: it cannot subscribe yet.
    Creating,
    /// Being deregistered.
    Deleting,
    /// Ready to subscribe.
    Active,
}

/// A shared handle to any implementation of the seam.
pub type SharedKinesis = Arc<dyn KinesisApi>;

/// Every shard of `stream`, following ListShards' pages.
///
/// # Errors
///
/// The first failed page's error.
pub(crate) async fn list_all_shards(
    api: &dyn KinesisApi,
    stream: &str,
) -> Result<Vec<ShardDescription>, KinesisError> {
    let mut shards = Vec::new();
    let mut token = None;
    loop {
        let page = api.list_shards(stream, token).await?;
        shards.extend(page.shards);
        token = page.next_token;
        if token.is_none() {
            return Ok(shards);
        }
    }
}

/// One shard as ListShards describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardDescription {
    /// The shard id.
    pub shard_id: String,
    /// The parent of a split, or the first parent of a merge.
    pub parent_shard_id: Option<String>,
    /// The second parent of a merge.
    pub adjacent_parent_shard_id: Option<String>,
    /// The first hash key the shard takes (decimal).
    pub starting_hash_key: String,
    /// The last hash key the shard takes (decimal).
    pub ending_hash_key: String,
    /// The sequence number of the shard's first record.
    pub starting_sequence_number: String,
    /// Set once the shard is closed. Never infer that a shard was fully *read* from it: read
    /// to the shard's end (no next iterator) instead.
    pub ending_sequence_number: Option<String>,
}

impl ShardDescription {
    /// The shard's parents (none, one for a split, two for a merge).
    pub fn parents(&self) -> impl Iterator<Item = &str> {
        self.parent_shard_id
            .iter()
            .chain(self.adjacent_parent_shard_id.iter())
            .map(String::as_str)
    }
}

/// One page of ListShards.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListShardsPage {
    /// The shards of this page.
    pub shards: Vec<ShardDescription>,
    /// The token of the next page, `None` on the last page.
    pub next_token: Option<String>,
}

/// A child shard, reported by GetRecords at the end of a closed shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildShard {
    /// The child's id.
    pub shard_id: String,
    /// Every parent of the child (two for a merge).
    pub parent_shards: Vec<String>,
}

/// The answer of one GetRecords call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GetRecordsOutput {
    /// The records, in shard order.
    pub records: Vec<Record>,
    /// The iterator of the next read; `None` once a closed shard is read to its end.
    pub next_shard_iterator: Option<String>,
    /// How far behind the shard's tip this read is.
    pub millis_behind_latest: Option<u64>,
    /// The children of a closed shard, given with the answer that reaches its end.
    pub child_shards: Vec<ChildShard>,
}

/// One record to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PutRecordsEntry {
    /// The payload (at most 1 MiB together with the key).
    pub data: Bytes,
    /// The partition key (1 to 256 characters): its MD5 picks the shard.
    pub partition_key: String,
    /// A decimal hash key that overrides the key's hash when picking the shard.
    pub explicit_hash_key: Option<String>,
}

/// The outcome of one entry of PutRecords.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PutRecordResult {
    /// Stored.
    Stored {
        /// The shard it landed on.
        shard_id: String,
        /// Its sequence number.
        sequence_number: String,
    },
    /// Not stored; publish it again.
    Failed {
        /// The service's error code (e.g. `ProvisionedThroughputExceededException`).
        code: String,
        /// The service's message.
        message: String,
    },
}

/// The answer of PutRecords: one result per entry, in the order of the entries.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PutRecordsOutput {
    /// One result per entry.
    pub results: Vec<PutRecordResult>,
}

impl PutRecordsOutput {
    /// How many entries failed.
    #[must_use]
    pub fn failed_count(&self) -> usize {
        self.results
            .iter()
            .filter(|r| matches!(r, PutRecordResult::Failed { .. }))
            .count()
    }
}

/// A stream's lifecycle state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum StreamStatus {
    /// Being created.
    Creating,
    /// Being deleted.
    Deleting,
    /// Readable and writable.
    Active,
    /// Resharding or changing settings; still readable and writable.
    Updating,
}

/// What DescribeStreamSummary says about a stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSummary {
    /// The stream's name.
    pub stream_name: String,
    /// Its state.
    pub status: StreamStatus,
    /// How many shards are open.
    pub open_shard_count: u32,
    /// How long records are kept, in hours.
    pub retention_period_hours: u32,
}
