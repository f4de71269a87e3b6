//! Publishing: records into a stream through PutRecords, batched, retried, and in order per
//! partition key.
//!
//! | item | what it is |
//! |---|---|
//! | [`Publisher`] | a cheap, cloneable handle on one stream: [`publish`](Publisher::publish) one record, [`publish_batch`](Publisher::publish_batch) many |
//! | [`OutgoingRecord`], [`Published`] | a record to send; where one was stored |
//! | [`PublishSink`], [`Publishable`] | a publisher as a `Sink` ([`sink`](Publisher::sink), [`delivery_sink`](Publisher::delivery_sink)): `stream.forward(publisher.sink())`, acking deliveries once stored |
//! | [`RetryPolicy`], [`KeyOrder`] | how failures are retried; how a key's records share calls |
//! | [`Collect`] | publishes from many tasks sharing PutRecords calls ([`collect`](Publisher::collect)) |
//! | [`Aggregate`] | user records packed into KPL aggregates per shard ([`aggregate`](Publisher::aggregate)) |
//! | [`PublishFailure`], [`FailedRecord`], [`EntryError`] | what [`KinesisError::PublishFailed`] carries: counts, the records not written, the last error |
//! | [`MAX_RECORDS_PER_CALL`], [`MAX_BYTES_PER_CALL`], [`MAX_RECORD_BYTES`], [`MAX_PARTITION_KEY_CHARS`] | the service's limits (and the call-size defaults) |
//! | [`DEFAULT_MAX_ATTEMPTS`], [`DEFAULT_INITIAL_BACKOFF`], [`DEFAULT_MAX_BACKOFF`] | the retry defaults: 8 rounds, 100 ms doubling to 5 s |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
//! use std::sync::Arc;
//! use kinesis_dataflow::{MemoryKinesis, OutgoingRecord, Publisher};
//!
//! let kinesis = MemoryKinesis::new();
//! kinesis.add_stream("orders", 2)?;
//! let publisher = Publisher::new(Arc::new(kinesis.clone()), "orders");
//!
//! let one = publisher.publish("customer-1", "created").await?;
//! let batch = publisher
//!     .publish_batch(vec![
//!         OutgoingRecord::new("customer-1", "paid"),
//!         OutgoingRecord::new("customer-2", "created"),
//!     ])
//!     .await?;
//! assert_eq!(batch.len(), 2); // in input order
//! assert_eq!(batch[0].shard_id, one.shard_id); // one key, one shard
//! assert!(batch[0].sequence_number > one.sequence_number);
//! # Ok(()) }
//! ```
//!
//! # How a batch is sent
//!
//! Every record is checked first (see the table below): a record the service would refuse
//! fails the whole batch with [`KinesisError::InvalidRecord`] before anything is sent. The
//! batch then goes out in *rounds*. A round sends, in batch order and one call after another,
//! every record not stored yet, split into PutRecords calls of at most
//! [`max_records_per_call`](Publisher::max_records_per_call) records (500) and
//! [`max_bytes_per_call`](Publisher::max_bytes_per_call) bytes of data and partition keys
//! (5 MiB); a call ends at the first record that does not fit, so no record overtakes
//! another. Stored records are never sent again. When a round leaves records unstored, the
//! publisher logs a `warn` event, waits (the [`RetryPolicy`] backoff: from 100 ms, with
//! jitter) and starts the next round. Two kinds of rounds:
//!
//! - **Only write limits turned records away** (every failure was an entry's
//!   `ProvisionedThroughputExceededException`: a shard over its 1,000 records or 1 MiB a
//!   second). The shard takes more within the second, so the next round follows after the
//!   first backoff, as the KPL retries such records, and these rounds do not count against
//!   [`RetryPolicy::max_attempts`]; the publish keeps at it for
//!   [`RetryPolicy::patience`] (as long as the counted rounds would wait in all: 11.3 s
//!   with the defaults), like the KPL's record time-to-live. Measured against the write
//!   limits, plain `publish_batch` went from 0.62 of a raw loop retrying every 100 ms (every
//!   round doubling the wait) to 0.99.
//! - **Any other failure** (an entry's `InternalFailure`, a whole call throttled or failed):
//!   the round counts against [`RetryPolicy::max_attempts`] (8), and the wait doubles with
//!   each such round in a row that stored nothing, capped at 5 s.
//!
//! Each call logs a `debug` event.
//!
//! | what happens | what the publisher does |
//! |---|---|
//! | an empty partition key, one over 256 characters, a record over 1 MiB (data + key bytes), an explicit hash key the service refuses (not a decimal from 0 to 2^128 - 1 without leading zeros, e.g. `007`) | [`KinesisError::InvalidRecord`] naming the stream, the record's position, key and size; nothing is sent |
//! | an entry fails with `ProvisionedThroughputExceededException` (the shard's write limit) | resent after the first backoff, for at most [`RetryPolicy::patience`] |
//! | an entry fails with `InternalFailure`, or any code not in the next row | resent in the next round |
//! | an entry fails with `AccessDeniedException`, `KMSAccessDeniedException`, `KMSDisabledException`, `KMSInvalidStateException`, `KMSNotFoundException`, `KMSOptInRequired`, `ResourceNotFoundException`, `ValidationException` or `InvalidArgumentException` | stops: [`KinesisError::PublishFailed`] |
//! | a whole call fails and [`KinesisError::is_retryable`] (throttled, a 5xx, a dropped connection) | its records are resent in the next round |
//! | a [`collect`](Publisher::collect)ing publisher's task stops before it answers a call (a panic in the task carrying the call, its runtime shutting down) | stops: [`KinesisError::PublishFailed`] hands every unwritten record back, those of that call as possibly stored (whether it was made cannot be told) |
//! | a whole call fails otherwise, before any record was written or may have been (an unknown stream: [`KinesisError::StreamNotFound`]; denied access) | that error, at once |
//! | a whole call fails otherwise, after some records were written, or after an earlier call failed as a whole (its records may be stored) | stops: [`KinesisError::PublishFailed`] |
//! | records are left after the last counted round, or once the patience has run out | [`KinesisError::PublishFailed`] |
//!
//! [`KinesisError::PublishFailed`] carries a [`PublishFailure`]: how many records were
//! written (they stay written) and where, every record that was not (handed back, in batch
//! order, with its last error, the record it was held back behind, and whether it may have
//! been stored all the same, [`FailedRecord::maybe_stored`]), and the last error's code and
//! message. Nothing is dropped silently.
//!
//! # The ordering guarantee
//!
//! **What the service does.** PutRecords stores the entries of one call that it accepts in
//! the order of the call (later entries on a shard get higher sequence numbers), but it does
//! not stop at an entry it refuses: it goes on with the next ones. So two records of one key
//! sent in one call are stored out of order only when the earlier one fails and the later one
//! is stored; the earlier one, resent, then lands after it. This is why AWS says PutRecords
//! "does not guarantee the ordering of records".
//!
//! **The publisher's rule.** *A record is sent only when every earlier record of its
//! partition key (earlier in the batch) is stored, or is placed before it in the same call.*
//! Each round makes every unstored record eligible; a call takes the eligible records in
//! batch order; and when an entry fails, its key is blocked for the rest of the round: the
//! key's later records are held back from the round's later calls. The next round resends
//! the failed record first and the key's later records after it, in their original order.
//! Why the rule holds: if `a` comes before `b` (same key) and `b` goes into call `C`, then
//! `a` was unstored at the start of the round and eligible; calls take eligible records in
//! batch order, so `a` went into an earlier call of the round or into `C` ahead of `b`. Had
//! it failed in an earlier call, the key would be blocked and `b` held back; so `a` is
//! stored, or in `C` before `b`.
//!
//! **What that guarantees**, for the records of one partition key in one `publish_batch`:
//!
//! - [`KeyOrder::Batched`] (the default; a call carries as many records of a key as fit):
//!   they are stored in batch order, *except* where the service, in one call, refused an
//!   entry and stored a later entry of the same key. The publisher never adds a reordering
//!   of its own (retries never let a later record overtake an earlier one), and when the
//!   service does this it logs a `warn` event naming the key. With throttling the case needs
//!   the shard's limit to run out in the middle of a key's run of entries and an entry after
//!   the refused one to fit again; on AWS this is rare, but possible.
//! - [`KeyOrder::Strict`] (a call carries at most one record of a key, and the key's next
//!   record is sent once the previous one is stored): they are stored in batch order, always.
//!   Records of many keys still share a call; records of one hot key take a call each.
//!
//! The key is the partition key, even when explicit hash keys send one key's records to
//! different shards. Across calls of the publisher: a `publish` or `publish_batch` returns
//! only once all its records are stored, so awaiting them one after another from one task
//! keeps each key's order; calls running concurrently (from several tasks) are independent
//! of each other, each with its own PutRecords calls, and have no order between them. After
//! a [`KinesisError::PublishFailed`], publish the handed-back records again before anything
//! newer of their keys to keep the order.
//!
//! # Collection and aggregation
//!
//! On by default, as the KPL collects by default: every publish of the publisher (and its
//! clones) runs its own rounds, as above, from its own task, and hands each of its calls to
//! one background task that puts the calls of many publishes, in arrival order, into one
//! PutRecords call, until a call's worth is collected or [`Collect::linger`] (default 0) has
//! passed since the first one, several such calls at once
//! ([`Collect::max_calls_in_flight`], 4): with no linger, the calls that arrive while every
//! call slot is taken share the next PutRecords call, and one takes at most half of the
//! records outstanding, so that one call fills while another is answered. Each publish gets
//! the results of its own entries and goes on from there: it returns once its own records
//! are stored, with their places, or fails with an error about its own records only,
//! whatever the other publishes of its calls wait for (records of a shard over its write
//! limit are retried in their own publish's rounds, in later calls). The ordering guarantee
//! is unchanged: one publish's records keep the rule above, a task awaiting one publish
//! after another still orders them, and publishes running concurrently had no order between
//! them to keep (so a record of one publish never waits for, or fails with, a record of the
//! same key of another; with [`KeyOrder::Strict`] one call may carry records of one key from
//! several publishes). A publish whose future is dropped stops, as without collection: it
//! makes no more rounds, and a call of it not sent yet is not sent. A call that fills a
//! PutRecords call by itself (500 records or 5 MiB, or the publisher's own bounds) gains
//! nothing from sharing one: it goes out from its publish's own task, so batch publishers
//! keep as many calls in flight as they run.
//! [`Publisher::without_collect`] turns it off: each
//! publish then makes its own calls from its own task, so a handler that publishes one record
//! per message makes one PutRecords call per record.
//!
//! [`Publisher::aggregate`] makes the background task collect whole publishes instead, into
//! batches it sends as one publish each (up to [`Collect::max_calls_in_flight`] at once; an
//! aggregate holds records of many publishes, so a publish returns when its batch is done,
//! with its own records' answer), and packs the user records of each batch into KPL aggregates
//! (the format the KPL writes and the KCL, AWS's `aws-kinesis-agg` libraries and
//! [`ReadSettings::deaggregate`](crate::ReadSettings::deaggregate) read), one stream of them
//! per shard predicted from the listed hash-key ranges, each at most [`Aggregate::max_bytes`]
//! (50 KiB). A shard stores 1,000 records a second: packed, that is 1,000 aggregates, not
//! 1,000 user records. A user record's place carries its
//! [`sub_sequence_number`](Published::sub_sequence_number). The ordering rule applies per
//! shard: a shard's aggregates of one batch go in order, and an aggregate that failed holds
//! the shard's later ones back, so a key's user records (one key, one shard) keep their order.
//! A record too big to share an aggregate, and an aggregate of one, go out as plain records.
//! After a reshard an aggregate can land on another shard than predicted: the publisher then
//! lists the shards again, and if some of its user records lie outside the range of the shard
//! it landed on (a reader that drops such aggregates, as the KCL does, would lose them), it
//! puts all of them again by the new listing, with every later record of the same predicted
//! shard from that call (so each key's last copies keep their order), and answers with their
//! new places, as the KPL does. Readers see the records put again twice. Such an aggregate
//! never counts as written unchecked: when the shards cannot be listed again, it is put again
//! once they can (and if they cannot, its user records fail with the listing's error), and
//! when the publish ends in a failure, its user records, with the later records of its
//! predicted shard, are among the records not written.
//!
//! **Duplicates.** Delivery is at least once. Entries the answer marks stored are never sent
//! again, but a whole call that failed may have been stored before its answer was lost (a
//! timeout, a dropped connection, or no answer within [`PUT_CALL_TIMEOUT`]), and so may an
//! entry an answer holds no result for; resending them can store their records twice. A
//! publish that fails after such a call hands its records back as
//! [`FailedRecord::maybe_stored`]: publishing them again may store them twice. Kinesis has no
//! idempotent put: consumers must tolerate duplicates, as they must for redelivery anyway.

mod aggregate;
mod aggregated;
mod check;
mod collect;
mod dead_letters;
mod plan;
mod run;
mod settings;
mod sink;
mod split;

use crate::telemetry::PublishMetrics;
use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use tokio::time::{Duration, Instant};

use crate::error::FirstOfKey;
pub use crate::error::{EntryError, FailedRecord, PublishFailure};
pub use crate::record::{OutgoingRecord, Published};
pub use aggregate::{Aggregate, DEFAULT_AGGREGATE_BYTES, MAX_AGGREGATE_BYTES};
pub use collect::{Collect, DEFAULT_AGGREGATION_LINGER, DEFAULT_CALLS_IN_FLIGHT, DEFAULT_LINGER};
pub use settings::{
    DEFAULT_INITIAL_BACKOFF, DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_BACKOFF, KeyOrder,
    MAX_BYTES_PER_CALL, MAX_PARTITION_KEY_CHARS, MAX_RECORD_BYTES, MAX_RECORDS_PER_CALL,
    PUT_CALL_TIMEOUT, RetryPolicy,
};
pub use sink::{PublishSink, Publishable};

use self::collect::Collector;
use self::plan::{CallLimits, Plan};
use self::run::{Run, error_kind};
use crate::api::{PutRecordResult, PutRecordsEntry, PutRecordsOutput, SharedKinesis};
use crate::error::KinesisError;

/// The entry error code of a record over its shard's write limit (1,000 records or 1 MiB a
/// second).
const THROUGHPUT_EXCEEDED: &str = "ProvisionedThroughputExceededException";

/// Entry error codes that retrying cannot fix: a publish stops at them.
const FATAL_ENTRY_CODES: &[&str] = &[
    "AccessDeniedException",
    "KMSAccessDeniedException",
    "KMSDisabledException",
    "KMSInvalidStateException",
    "KMSNotFoundException",
    "KMSOptInRequired",
    "ResourceNotFoundException",
    "ValidationException",
    "InvalidArgumentException",
];

/// Publishes records to one stream.
///
/// A `Publisher` is a handle: cloning it is cheap (two `Arc`s and a few numbers) and every
/// clone may publish from any task at the same time. Each call of
/// [`publish`](Self::publish) or [`publish_batch`](Self::publish_batch) makes its own
/// PutRecords calls; see the [module docs](self) for batching, retries and the ordering
/// guarantee.
///
/// | setting | default |
/// |---|---|
/// | [`max_records_per_call`](Self::max_records_per_call) | 500 (the service's limit) |
/// | [`max_bytes_per_call`](Self::max_bytes_per_call) | 5 MiB (the service's limit) |
/// | [`retry`](Self::retry) | [`RetryPolicy::default`]: 8 counted rounds, backoff from 100 ms doubling to at most 5 s, with jitter; records over a shard's write limit retried for 11.3 s |
/// | [`key_order`](Self::key_order) | [`KeyOrder::Batched`] |
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use kinesis_dataflow::api::memory::Fault;
/// use kinesis_dataflow::publish::{KeyOrder, RetryPolicy};
/// use kinesis_dataflow::{MemoryKinesis, OutgoingRecord, Publisher};
/// use kinesis_dataflow::error::Operation;
///
/// let kinesis = MemoryKinesis::new();
/// kinesis.add_stream("payments", 1)?;
/// let publisher = Publisher::new(Arc::new(kinesis.clone()), "payments")
///     .max_records_per_call(100)
///     .retry(RetryPolicy::default().initial_backoff(Duration::from_millis(10)))
///     .key_order(KeyOrder::Strict);
///
/// // The shard throttles the first call; the publisher waits and sends the records again.
/// // (`inject` and `call_count` are test hooks of the `test-util` feature.)
/// kinesis.inject(Fault::throttle(Operation::PutRecords).on_shard("shardId-000000000000"));
/// let records = (0..3).map(|i| OutgoingRecord::new(format!("account-{i}"), "debit")).collect();
/// let published = publisher.publish_batch(records).await?;
/// assert_eq!(published.len(), 3);
/// assert_eq!(kinesis.call_count(Operation::PutRecords), 2);
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Publisher {
    api: SharedKinesis,
    stream: Arc<str>,
    limits: CallLimits,
    retry: RetryPolicy,
    key_order: KeyOrder,
    collector: Option<Arc<Collector>>,
    /// [`collect`](Self::collect) was called: its settings stand under `aggregate` too.
    collect_set: bool,
    /// [`without_collect`](Self::without_collect) was called after
    /// [`aggregate`](Self::aggregate): refused by [`validate`](Self::validate).
    without_collect_after_aggregate: bool,
    metrics: PublishMetrics,
}

impl fmt::Debug for Publisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Publisher")
            .field("stream", &self.stream)
            .field("region", &self.api.region())
            .field("max_records_per_call", &self.limits.records)
            .field("max_bytes_per_call", &self.limits.bytes)
            .field("retry", &self.retry)
            .field("key_order", &self.key_order)
            .field("collect", &self.collector.as_ref().map(|c| c.settings()))
            .field(
                "aggregate",
                &self.collector.as_ref().and_then(|c| c.aggregate()),
            )
            .field(
                "without_collect_after_aggregate",
                &self.without_collect_after_aggregate,
            )
            .finish()
    }
}

impl Publisher {
    /// A publisher to `stream` through `api`, with the default settings.
    pub fn new(api: SharedKinesis, stream: impl Into<Arc<str>>) -> Self {
        let stream = stream.into();
        Self {
            api,
            metrics: PublishMetrics::new(&stream),
            stream,
            limits: CallLimits {
                records: MAX_RECORDS_PER_CALL,
                bytes: MAX_BYTES_PER_CALL,
            },
            retry: RetryPolicy::default(),
            key_order: KeyOrder::default(),
            collector: Some(Arc::new(Collector::new(Collect::default(), None))),
            collect_set: false,
            without_collect_after_aggregate: false,
        }
    }

    /// The most records one PutRecords call carries: 1 to 500 (default 500, the service's
    /// limit).
    #[must_use]
    pub fn max_records_per_call(mut self, records: usize) -> Self {
        self.limits.records = records;
        self.own_collector()
    }

    /// The most bytes of data and partition keys one PutRecords call carries: 1 MiB to
    /// 5 MiB (default 5 MiB, the service's limit). At least 1 MiB, so any valid record fits.
    #[must_use]
    pub fn max_bytes_per_call(mut self, bytes: usize) -> Self {
        self.limits.bytes = bytes;
        self.own_collector()
    }

    /// How failed records are retried (default [`RetryPolicy::default`]).
    #[must_use]
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self.own_collector()
    }

    /// How a key's records share calls (default [`KeyOrder::Batched`]).
    #[must_use]
    pub fn key_order(mut self, order: KeyOrder) -> Self {
        self.key_order = order;
        self.own_collector()
    }

    /// How the publishes of this publisher and its clones, from any number of tasks, are
    /// collected into shared PutRecords calls (each publish still returns once its own
    /// records are stored): see [`Collect`] for how, and the [module docs](self) for what it
    /// keeps of the ordering guarantee. **On by default**,
    /// with [`Collect::default`] (no linger: a lone publish goes at once).
    /// [`without_collect`](Self::without_collect) turns it off. Clones share one collecting
    /// task per tokio runtime they publish from, started there at that runtime's first
    /// publish (so each runtime's publishes are batched apart, and none waits on a runtime
    /// that is not running; [`Collect::max_calls_in_flight`] applies to each); a clone given
    /// other sending settings afterwards ([`retry`](Self::retry),
    /// [`key_order`](Self::key_order), the per-call bounds, `collect`) collects on its own.
    #[must_use]
    pub fn collect(mut self, settings: Collect) -> Self {
        let aggregate = self.collector.as_ref().and_then(|c| c.aggregate());
        self.collector = Some(Arc::new(Collector::new(settings, aggregate)));
        self.collect_set = true;
        self.without_collect_after_aggregate = false;
        self
    }

    /// Each publish makes its own PutRecords calls, from the task that awaits it, with no
    /// background task: the publisher as it was before collection was on by default. For a
    /// program that publishes only whole batches from one task, or that must not start
    /// tasks of its own. An [`aggregate`](Self::aggregate) set after this collects again.
    /// Set after `aggregate`, it is refused: aggregation packs the records of collected
    /// publishes and needs collection, so [`validate`](Self::validate), every publish and
    /// every sink fail with [`KinesisError::InvalidConfig`] naming both settings (rather than
    /// aggregation silently turned off). A [`collect`](Self::collect) or `aggregate` after it
    /// collects and aggregates again.
    #[must_use]
    pub fn without_collect(mut self) -> Self {
        if self
            .collector
            .as_ref()
            .is_some_and(|c| c.aggregate().is_some())
        {
            self.without_collect_after_aggregate = true;
            return self;
        }
        self.collector = None;
        self.collect_set = false;
        self
    }

    /// Packs the user records of this publisher's publishes into KPL aggregates, one per
    /// predicted shard, up to [`Aggregate`]'s bounds: a shard takes 1,000 records a second,
    /// and an aggregate of many small user records counts as one. Collects too (see
    /// [`collect`](Self::collect)): with the settings given to `collect`, else with a
    /// linger of [`DEFAULT_AGGREGATION_LINGER`] (10 ms), so that user records from tasks that
    /// publish a few at a time meet in one aggregate (measured against the write limits, a
    /// linger of 5 to 100 ms made a quarter of the calls that none made, and stored a third
    /// more user records a second; the KPL's own default is 100 ms). Each user record's place carries its sub-sequence
    /// number. Readers must de-aggregate ([`ReadSettings::deaggregate`], the KCL, AWS's
    /// `aws-kinesis-agg` libraries). See [`Aggregate`] and the [module docs](self) for how
    /// records are packed and what happens after a reshard.
    ///
    /// [`ReadSettings::deaggregate`]: crate::ReadSettings::deaggregate
    #[must_use]
    pub fn aggregate(mut self, settings: Aggregate) -> Self {
        let collect = match &self.collector {
            Some(collector) if self.collect_set => collector.settings(),
            _ => Collect::default().linger(DEFAULT_AGGREGATION_LINGER),
        };
        self.collector = Some(Arc::new(Collector::new(collect, Some(settings))));
        self.without_collect_after_aggregate = false;
        self
    }

    /// A collecting publisher whose sending settings change gets a collector of its own
    /// (same settings, its own task): the task sends by the settings of the publisher that
    /// started it, so a clone configured differently must not share it.
    fn own_collector(mut self) -> Self {
        if let Some(collector) = &self.collector {
            self.collector = Some(Arc::new(Collector::new(
                collector.settings(),
                collector.aggregate(),
            )));
        }
        self
    }

    /// The stream this publisher writes to.
    #[must_use]
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// Checks every setting; the error names the setting and the refused value. Publishing
    /// checks them too, before any call.
    ///
    /// # Errors
    ///
    /// [`KinesisError::InvalidConfig`] for a record count outside 1..=500, a byte limit
    /// outside 1 MiB..=5 MiB, a refused [`RetryPolicy`], [`Collect`] or [`Aggregate`], or
    /// [`without_collect`](Self::without_collect) after [`aggregate`](Self::aggregate).
    pub fn validate(&self) -> Result<(), KinesisError> {
        if self.without_collect_after_aggregate {
            return Err(KinesisError::InvalidConfig {
                setting: "without_collect",
                value: "after aggregate(..)".into(),
                reason: "aggregate(..) packs the records of collected publishes and needs \
                         collection: drop one of without_collect() and aggregate(..) (a \
                         collect(..) or aggregate(..) after them collects and aggregates)"
                    .into(),
            });
        }
        if !(1..=MAX_RECORDS_PER_CALL).contains(&self.limits.records) {
            return Err(KinesisError::InvalidConfig {
                setting: "max_records_per_call",
                value: self.limits.records.to_string(),
                reason: format!("PutRecords takes 1 to {MAX_RECORDS_PER_CALL} records per call"),
            });
        }
        if !(MAX_RECORD_BYTES..=MAX_BYTES_PER_CALL).contains(&self.limits.bytes) {
            return Err(KinesisError::InvalidConfig {
                setting: "max_bytes_per_call",
                value: self.limits.bytes.to_string(),
                reason: format!(
                    "must be {MAX_RECORD_BYTES} (1 MiB, so the largest record fits) to \
                     {MAX_BYTES_PER_CALL} (5 MiB, the most PutRecords takes)"
                ),
            });
        }
        if let Some(collector) = &self.collector {
            collector.settings().validate()?;
            if let Some(aggregate) = collector.aggregate() {
                aggregate.validate()?;
            }
        }
        self.retry.validate()
    }

    /// Publishes one record of `data` under partition key `key`, and returns where it was
    /// stored. A batch of one: see [`publish_batch`](Self::publish_batch) for the errors.
    ///
    /// # Errors
    ///
    /// As [`publish_batch`](Self::publish_batch).
    pub async fn publish(
        &self,
        key: impl Into<String>,
        data: impl Into<bytes::Bytes>,
    ) -> Result<Published, KinesisError> {
        let record = OutgoingRecord::new(key, data);
        if self.collector.is_some() {
            let mut published = self.publish_batch(vec![record]).await?;
            // One record in, one place out: `publish_batch` returns a place for every record.
            return Ok(published.swap_remove(0));
        }
        self.validate()?;
        let size = check::check(&record, &self.stream, 0)?;
        // The first call without the batch machinery; only a failure sets it up, with this
        // answer as its first call's (the same rounds, waits and errors as a batch of one).
        let mut answer =
            run::put_within(&self.api, &self.stream, vec![check::entry(&record)]).await;
        if let Ok(out) = &mut answer
            && let [
                PutRecordResult::Stored {
                    shard_id,
                    sequence_number,
                },
            ] = out.results.as_mut_slice()
        {
            self.metrics.call(1);
            self.metrics.stored(1);
            return Ok(Published {
                shard_id: std::mem::take(shard_id),
                sequence_number: std::mem::take(sequence_number),
                sub_sequence_number: None,
            });
        }
        let plan = Plan::new(
            [record.partition_key.as_str()],
            vec![size],
            self.key_order,
            self.limits,
        );
        let mut run = Run::new(self, vec![record], plan);
        run.answered = Some(answer);
        let mut published = run.run_to_the_end().await?;
        Ok(published.swap_remove(0))
    }

    /// Publishes `records` and returns where each was stored, in input order.
    ///
    /// The records go out in PutRecords calls of at most 500 records and 5 MiB, in order;
    /// failed entries are retried with backoff without ever letting a later record of their
    /// partition key overtake them (see the [module docs](self)). An empty batch makes no
    /// call.
    ///
    /// # Errors
    ///
    /// - [`KinesisError::InvalidConfig`]: a setting is out of range (nothing sent).
    /// - [`KinesisError::InvalidRecord`]: a record the service would refuse (nothing sent).
    /// - The call's own error when the first failure cannot be fixed by retrying and nothing
    ///   was written, e.g. [`KinesisError::StreamNotFound`] or [`KinesisError::AccessDenied`]:
    ///   only when no earlier call of the publish failed as a whole or left an entry without
    ///   a result (after such a call, records may be stored, and the failure is a
    ///   `PublishFailed` that says so).
    /// - [`KinesisError::PublishFailed`]: records left unwritten after the last round, or a
    ///   failure retrying cannot fix after some records were written. It says how many were
    ///   written and hands back the others.
    pub async fn publish_batch(
        &self,
        records: Vec<OutgoingRecord>,
    ) -> Result<Vec<Published>, KinesisError> {
        self.validate()?;
        let sizes = records
            .iter()
            .enumerate()
            .map(|(index, record)| check::check(record, &self.stream, index))
            .collect::<Result<Vec<usize>, KinesisError>>()?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        match &self.collector {
            // User records to pack into aggregates: the collector packs them with those of
            // other publishes and sends them.
            Some(collector) if collector.aggregate().is_some() => {
                collector.publish(self, records, sizes).await
            }
            // Otherwise the publish runs its own rounds here, and each call of them goes
            // through the collector, if any (`put`).
            _ => self.send_checked(records, sizes).await,
        }
    }

    /// Whether `records` records of `bytes` bytes fill one PutRecords call by themselves.
    fn fills_a_call(&self, records: usize, bytes: usize) -> bool {
        records >= self.limits.records || bytes >= self.limits.bytes
    }

    /// Makes one PutRecords call of a publish's round: `entries`, of `bytes` bytes of data
    /// and partition keys. A collecting publisher hands it to its collecting task, which
    /// sends it with the calls of other publishes, unless it fills a call by itself (then it
    /// gains nothing from sharing one and goes out from this task).
    async fn put(
        &self,
        entries: Vec<PutRecordsEntry>,
        bytes: usize,
    ) -> Result<PutRecordsOutput, KinesisError> {
        match &self.collector {
            Some(collector)
                if collector.aggregate().is_none() && !self.fills_a_call(entries.len(), bytes) =>
            {
                collector.put(self, entries, bytes).await
            }
            _ => {
                self.metrics.call(entries.len());
                run::put_within(&self.api, &self.stream, entries).await
            }
        }
    }

    /// Sends checked `records` (of these `sizes`; not empty) in calls of its own.
    async fn send_checked(
        &self,
        records: Vec<OutgoingRecord>,
        sizes: Vec<usize>,
    ) -> Result<Vec<Published>, KinesisError> {
        let plan = Plan::new(
            records.iter().map(|r| r.partition_key.as_str()),
            sizes,
            self.key_order,
            self.limits,
        );
        Run::new(self, records, plan).run_to_the_end().await
    }

    /// As [`send_checked`](Self::send_checked), with the ordering rule applied to `keys`
    /// (one per record) instead of the partition keys.
    async fn send_keyed(
        &self,
        records: Vec<OutgoingRecord>,
        sizes: Vec<usize>,
        keys: &[Arc<str>],
    ) -> Result<Vec<Published>, KinesisError> {
        let plan = Plan::new(
            keys.iter().map(|k| &**k),
            sizes,
            self.key_order,
            self.limits,
        );
        Run::new(self, records, plan).run_to_the_end().await
    }
}
