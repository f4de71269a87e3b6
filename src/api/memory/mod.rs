//! An in-memory Kinesis Data Streams: the demo, in-process tests, deterministic fault
//! injection.
//!
//! [`MemoryKinesis`] implements [`KinesisApi`] and [`KinesisAdmin`] with the service's rules on
//! everything a reader or a producer relies on:
//!
//! - **Streams and shards.** A stream of N shards splits the 128-bit hash key space evenly, as
//!   the service does; shard ids are `shardId-000000000000`, counting up for the children of
//!   splits and merges. Streams are ACTIVE at once; retention is reported as 24 hours.
//! - **Routing.** A record goes to the open shard whose hash key range holds the MD5 of its
//!   partition key (a big-endian `u128`), or its explicit hash key.
//! - **Sequence numbers.** 56-digit decimal strings, strictly increasing within a shard,
//!   unique within the stream, and naming their shard: a sequence number of another shard or
//!   stream is refused by GetShardIterator like the service refuses it.
//! - **Iterators.** All five iterator types (AT_TIMESTAMP opens at the first record that
//!   arrived at or after the time, and at the tip for a time after the newest record).
//!   Iterators are opaque and stateless (nothing is kept per iterator) and expire after the
//!   iterator TTL (5 minutes by default), measured with the tokio clock so paused-time tests
//!   can step past it.
//! - **Reads.** Up to `limit` records (at most 10 MiB) from the iterator's position,
//!   `MillisBehindLatest`, and at the end of a closed shard no next iterator and its
//!   `ChildShards`. Records older than the trim horizon ([`MemoryKinesis::trim`]) are gone: a
//!   read from before it starts at it.
//! - **Enhanced fan-out.** Registered consumers and SubscribeToShard subscriptions that push
//!   each shard's records as they arrive, with the service's rules on consumer states, one
//!   active subscription per consumer and shard (held until its event stream is dropped, ends
//!   or is cut: a frozen holder keeps it; [`MemoryKinesis::active_subscriptions`]), the
//!   five-second resubscription limit, subscription lifetimes and the event that ends a closed
//!   shard (see [`MemoryKinesis::with_subscription_lifetime`]).
//! - **Faults** (with the `test-util` feature). `MemoryKinesis::inject` scripts throttles,
//!   failures, expired iterators and latency, consumed one per call in injection order;
//!   `MemoryKinesis::set_latency` slows every call; `MemoryKinesis::calls` and
//!   `MemoryKinesis::call_count` read the log of the calls made through the traits. Without
//!   the feature none of this exists: no call is logged and nothing stands between a call and
//!   its answer.
//!
//! ```
//! use std::sync::Arc;
//!
//! use kinesis_dataflow::api::{KinesisApi, MemoryKinesis};
//! use kinesis_dataflow::position::StartingPoint;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kinesis_dataflow::error::KinesisError> {
//! let kinesis = MemoryKinesis::new();
//! kinesis.add_stream("orders", 2)?;
//! let (shard, _sequence_number) = kinesis.put("orders", "customer-1", "hello")?;
//!
//! let iterator = kinesis
//!     .get_shard_iterator("orders", &shard, &StartingPoint::TrimHorizon)
//!     .await?;
//! let shard: Arc<str> = shard.into();
//! let page = kinesis.get_records("orders", &shard, iterator, 100).await?;
//! assert_eq!(page.records.len(), 1);
//! assert_eq!(page.records[0].data().as_ref(), b"hello");
//! assert_eq!(page.millis_behind_latest, Some(0));
//! assert!(page.next_shard_iterator.is_some(), "an open shard never ends");
//! # Ok(())
//! # }
//! ```

mod fan_out;
#[cfg(feature = "test-util")]
mod faults;
mod hash;
mod ops;
mod sequence;
mod shard;
mod stream;
#[cfg(test)]
mod tests;
mod token;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::time::Instant;

pub use fan_out::DEFAULT_SUBSCRIPTION_LIFETIME;
#[cfg(feature = "test-util")]
pub use faults::{CALL_LOG_CAPACITY, Call, Fault, FaultKind};

#[cfg(feature = "test-util")]
use self::faults::{CallLog, FaultQueue};
use self::ops::{entry_hash, invalid, refused};
use self::stream::{StreamState, check_stream_name};
use self::token::IteratorToken;
use super::{
    ApiFuture, GetRecordsOutput, KinesisAdmin, KinesisApi, ListShardsPage, PutRecordsEntry,
    PutRecordsOutput, ShardEvents, StreamConsumer, StreamSummary,
};
use crate::error::{KinesisError, Operation};
use crate::position::StartingPoint;
use crate::record::Record;

/// The hash key Kinesis routes a record with `partition_key` by: the MD5 digest of the key's
/// UTF-8 bytes, read as a big-endian `u128`. The record goes to the open shard whose hash key
/// range holds it.
///
/// ```
/// use kinesis_dataflow::api::MemoryKinesis;
/// use kinesis_dataflow::api::memory::hash_key;
///
/// # fn main() -> Result<(), kinesis_dataflow::error::KinesisError> {
/// // MD5("") = d41d8cd98f00b204e9800998ecf8427e
/// assert_eq!(hash_key(""), 0xd41d_8cd9_8f00_b204_e980_0998_ecf8_427e);
///
/// // In a stream of two shards, shard 1 takes the upper half of the key space.
/// let kinesis = MemoryKinesis::new();
/// kinesis.add_stream("orders", 2)?;
/// let (shard, _) = kinesis.put("orders", "customer-1", "x")?;
/// let upper = hash_key("customer-1") >= 1 << 127;
/// assert_eq!(shard == "shardId-000000000001", upper);
/// # Ok(())
/// # }
/// ```
#[must_use]
pub fn hash_key(partition_key: &str) -> u128 {
    hash::hash_of(partition_key)
}

/// The region a [`MemoryKinesis`] reports unless [`MemoryKinesis::with_region`] says otherwise.
pub const DEFAULT_REGION: &str = "memory";

/// How long a shard iterator lives unless [`MemoryKinesis::with_iterator_ttl`] says otherwise
/// (five minutes, like the service).
pub const DEFAULT_ITERATOR_TTL: Duration = Duration::from_secs(300);

/// How many shards one ListShards page holds unless
/// [`MemoryKinesis::with_list_shards_page_size`] says otherwise (the service's maximum).
pub const DEFAULT_LIST_SHARDS_PAGE_SIZE: usize = 1000;

/// The most shards one stream may be created with (a limit of this store; the service's is
/// an account quota).
pub const MAX_SHARDS_PER_STREAM: u32 = 100_000;

const RETENTION_PERIOD_HOURS: u32 = 24;
const MAX_PUT_RECORDS_ENTRIES: usize = 500;
const MAX_RECORD_BYTES: usize = 1024 * 1024;
const MAX_PUT_RECORDS_BYTES: usize = 5 * 1024 * 1024;
const MAX_PARTITION_KEY_CHARS: usize = 256;

/// Tells the iterators of one store from those of another.
static NEXT_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// The shared, mutable part of a [`MemoryKinesis`].
struct State {
    streams: HashMap<String, StreamState>,
    next_stream_number: u64,
    /// The test hooks: injected faults, the call log, the latency of every call.
    #[cfg(feature = "test-util")]
    faults: FaultQueue,
    #[cfg(feature = "test-util")]
    log: CallLog,
    #[cfg(feature = "test-util")]
    latency: Duration,
    iterator_ttl: Duration,
    list_page_size: usize,
    observer: Option<PutObserver>,
    fan_out: fan_out::FanOut,
}

/// Told of every record stored: the stream's name and the record.
pub type PutObserver = Arc<dyn Fn(&str, &Record) + Send + Sync>;

/// An in-memory Kinesis Data Streams behind [`KinesisApi`] and [`KinesisAdmin`].
///
/// Clones share one store: hand one clone to the code under test and keep another to add
/// streams, publish, reshard, and (with the `test-util` feature) inject faults and read the
/// call log. The builder methods (`with_*`) are meant for construction; the settings they
/// change other than the region are shared by every clone.
///
/// See the [module docs](self) for what it models and an example.
#[derive(Clone)]
pub struct MemoryKinesis {
    state: Arc<Mutex<State>>,
    region: Arc<str>,
    instance: u64,
    epoch: Instant,
}

impl Default for MemoryKinesis {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for MemoryKinesis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("MemoryKinesis");
        out.field("region", &self.region);
        if let Ok(state) = self.state.try_lock() {
            let mut streams: Vec<(&str, usize)> = state
                .streams
                .iter()
                .map(|(name, s)| (name.as_str(), s.open_shard_count()))
                .collect();
            streams.sort_unstable();
            out.field("open_shards_by_stream", &streams);
            #[cfg(feature = "test-util")]
            out.field("pending_faults", &state.faults.pending().len())
                .field("latency", &state.latency);
            out.field("iterator_ttl", &state.iterator_ttl);
        }
        out.finish_non_exhaustive()
    }
}

impl MemoryKinesis {
    /// An empty store in region `"memory"`, iterators living five minutes.
    #[must_use]
    pub fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                streams: HashMap::new(),
                next_stream_number: 1,
                #[cfg(feature = "test-util")]
                faults: FaultQueue::default(),
                #[cfg(feature = "test-util")]
                log: CallLog::default(),
                #[cfg(feature = "test-util")]
                latency: Duration::ZERO,
                iterator_ttl: DEFAULT_ITERATOR_TTL,
                list_page_size: DEFAULT_LIST_SHARDS_PAGE_SIZE,
                observer: None,
                fan_out: fan_out::FanOut::default(),
            })),
            region: DEFAULT_REGION.into(),
            instance: NEXT_INSTANCE.fetch_add(1, Ordering::Relaxed),
            epoch: Instant::now(),
        }
    }

    /// Reports `region` (in [`KinesisApi::region`] and in errors).
    #[must_use]
    pub fn with_region(mut self, region: &str) -> Self {
        self.region = region.into();
        self
    }

    /// Makes shard iterators expire `ttl` after they were issued (by the tokio clock).
    #[must_use]
    pub fn with_iterator_ttl(self, ttl: Duration) -> Self {
        self.lock().iterator_ttl = ttl;
        self
    }

    /// Makes ListShards answer `page_size` shards per page (at least 1).
    #[must_use]
    pub fn with_list_shards_page_size(self, page_size: usize) -> Self {
        self.lock().list_page_size = page_size.max(1);
        self
    }

    /// Calls `observer` with every record stored from now on (by [`put`](Self::put) and by
    /// PutRecords), after it is stored and before the call that stored it returns. It replaces
    /// an observer set earlier. The observer must not call back into this store.
    pub fn on_put(&self, observer: impl Fn(&str, &Record) + Send + Sync + 'static) {
        self.lock().observer = Some(Arc::new(observer));
    }

    /// Tells the observer, if any, of records just stored (called with the lock released).
    fn observed(&self, observer: Option<PutObserver>, stream: &str, stored: &[Record]) {
        if let Some(observer) = observer {
            for record in stored {
                observer(stream, record);
            }
        }
    }

    /// Creates stream `name` with `shard_count` open shards at once, like CreateStream
    /// ([`create_stream`](Self::create_stream)) but without awaiting, and without going through
    /// the call log or fault injection of the `test-util` feature.
    ///
    /// # Errors
    ///
    /// [`KinesisError::InvalidArgument`] for a malformed name or a shard count of 0 (or above
    /// [`MAX_SHARDS_PER_STREAM`]); [`KinesisError::ResourceInUse`] for a stream that already
    /// exists.
    pub fn add_stream(&self, name: &str, shard_count: u32) -> Result<(), KinesisError> {
        self.create(Operation::CreateStream, name, shard_count)
    }

    /// Publishes one record, like PutRecords with one entry but without going through the
    /// call log or fault injection of the `test-util` feature. Returns the shard id and the
    /// sequence number.
    ///
    /// # Errors
    ///
    /// [`KinesisError::StreamNotFound`] for an unknown stream,
    /// [`KinesisError::InvalidArgument`] for a partition key that is empty or longer than 256
    /// characters, or a record above 1 MiB.
    pub fn put(
        &self,
        stream: &str,
        partition_key: &str,
        data: impl Into<Bytes>,
    ) -> Result<(String, String), KinesisError> {
        let op = Operation::PutRecords;
        let data = data.into();
        let hash = entry_hash(op, stream, None, partition_key, data.len(), None)?;
        let mut state = self.lock();
        let stream_state = self.stream_mut(&mut state, op, stream)?;
        let index = stream_state.route(hash);
        let now = SystemTime::now();
        let sequence_number =
            stream_state.append(index, partition_key.to_owned(), data.clone(), now);
        let shard_id = stream_state.shard_id(index);
        let observer = state.observer.clone();
        drop(state);
        if observer.is_some() {
            let record = Record::new(
                shard_id.clone(),
                sequence_number.clone(),
                partition_key,
                data,
                Some(now),
            );
            self.observed(observer, stream, std::slice::from_ref(&record));
        }
        Ok((shard_id.to_string(), sequence_number))
    }

    /// Drops the records of every shard of `stream` that arrived before `older_than`, as the
    /// retention period does; returns how many (0 for an unknown stream). Iterators and
    /// sequence numbers stay valid: a read from before the new trim horizon starts at it.
    /// A shard closed before `older_than` and left with no record expires, as one past the
    /// retention period: it leaves the ListShards answer, and reading it answers
    /// [`KinesisError::ShardNotFound`].
    pub fn trim(&self, stream: &str, older_than: SystemTime) -> usize {
        let mut state = self.lock();
        let Some(stream_state) = state.streams.get_mut(stream) else {
            return 0;
        };
        let trimmed = stream_state
            .shards
            .iter_mut()
            .map(|s| s.trim(older_than))
            .sum();
        tracing::debug!(stream, trimmed, "memory kinesis: trimmed records");
        trimmed
    }

    /// The records `shard` of `stream` still holds, oldest first, without going through the
    /// call log or fault injection of the `test-util` feature (for assertions).
    ///
    /// # Errors
    ///
    /// [`KinesisError::StreamNotFound`] or [`KinesisError::ShardNotFound`].
    pub fn records(&self, stream: &str, shard: &str) -> Result<Vec<Record>, KinesisError> {
        let op = Operation::GetRecords;
        let mut state = self.lock();
        let stream_state = self.stream_mut(&mut state, op, stream)?;
        let index = stream_state
            .index_of(shard)
            .map_err(|r| refused(op, stream, r))?;
        let id = stream_state.shard_id(index);
        Ok(stream_state.shards[index]
            .records()
            .map(|r| {
                Record::read(
                    id.clone(),
                    r.sequence_number.clone(),
                    r.partition_key.clone(),
                    r.data.clone(),
                    Some(r.arrival),
                    None,
                )
            })
            .collect())
    }

    /// Queues `fault` behind the faults injected before it. Each call of the traits consumes
    /// at most one matching fault: the earliest one.
    ///
    /// A test hook: only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    pub fn inject(&self, fault: Fault) {
        self.lock().faults.push(fault);
    }

    /// The injected faults that are not used up yet, in injection order.
    ///
    /// A test hook: only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    #[must_use]
    pub fn pending_faults(&self) -> Vec<Fault> {
        self.lock().faults.pending()
    }

    /// Drops every injected fault that is not used up yet.
    ///
    /// A test hook: only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// Delays every answer of the traits by `latency` (a `tokio::time::sleep`), on top of any
    /// [`FaultKind::Latency`]. `Duration::ZERO` turns it off.
    ///
    /// A test hook: only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    pub fn set_latency(&self, latency: Duration) {
        self.lock().latency = latency;
    }

    /// The calls made through the traits, oldest first (at most the last
    /// [`CALL_LOG_CAPACITY`]), failed and faulted ones included. The sync helpers
    /// ([`add_stream`](Self::add_stream), [`put`](Self::put), ...) are not logged.
    ///
    /// A test hook: only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    #[must_use]
    pub fn calls(&self) -> Vec<Call> {
        self.lock().log.calls()
    }

    /// How many calls of `operation` were made through the traits (exact, however long the
    /// log grew).
    ///
    /// A test hook: only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    #[must_use]
    pub fn call_count(&self, operation: Operation) -> usize {
        self.lock().log.count(operation)
    }

    /// Forgets the logged calls and resets the counts.
    ///
    /// A test hook: only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    pub fn clear_calls(&self) {
        self.lock().log.clear();
    }

    /// CreateStream, as [`KinesisAdmin::create_stream`] (which calls this): creates stream
    /// `stream` with `shard_count` open shards. Unlike [`add_stream`](Self::add_stream), it
    /// goes through the call log and fault injection of the `test-util` feature.
    ///
    /// # Errors
    ///
    /// As [`add_stream`](Self::add_stream); with the `test-util` feature, an injected fault's
    /// error.
    pub fn create_stream<'a>(&'a self, stream: &'a str, shard_count: u32) -> ApiFuture<'a, ()> {
        Box::pin(async move {
            #[cfg(feature = "test-util")]
            self.gate(self.call(Operation::CreateStream, stream), &[])
                .await?;
            self.create(Operation::CreateStream, stream, shard_count)
        })
    }

    /// SplitShard, as [`KinesisAdmin::split_shard`] (which calls this): closes open shard
    /// `shard` of `stream` and opens two children, the second one taking the hash keys from
    /// `new_starting_hash_key` (a decimal 128-bit hash key) on.
    ///
    /// # Errors
    ///
    /// [`KinesisError::StreamNotFound`] or [`KinesisError::ShardNotFound`];
    /// [`KinesisError::InvalidArgument`] for a malformed name or hash key, a closed shard, or
    /// a hash key the shard cannot split at (it must be above the shard's first hash key and
    /// at most its last); with the `test-util` feature, an injected fault's error.
    pub fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        new_starting_hash_key: &'a str,
    ) -> ApiFuture<'a, ()> {
        Box::pin(async move {
            #[cfg(feature = "test-util")]
            {
                let call = Call {
                    shard: Some(shard.to_owned()),
                    ..self.call(Operation::SplitShard, stream)
                };
                self.gate(call, &[shard]).await?;
            }
            self.split(stream, shard, new_starting_hash_key)
        })
    }

    /// MergeShards, as [`KinesisAdmin::merge_shards`] (which calls this): closes open shards
    /// `shard` and `adjacent` of `stream`, whose hash key ranges must touch, and opens one
    /// child taking both ranges.
    ///
    /// # Errors
    ///
    /// [`KinesisError::StreamNotFound`] or [`KinesisError::ShardNotFound`];
    /// [`KinesisError::InvalidArgument`] for a malformed name, a closed shard, a shard merged
    /// with itself, or shards that are not adjacent; with the `test-util` feature, an injected
    /// fault's error.
    pub fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        adjacent: &'a str,
    ) -> ApiFuture<'a, ()> {
        Box::pin(async move {
            #[cfg(feature = "test-util")]
            {
                let call = Call {
                    shard: Some(shard.to_owned()),
                    ..self.call(Operation::MergeShards, stream)
                };
                self.gate(call, &[shard, adjacent]).await?;
            }
            self.merge(stream, shard, adjacent)
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn stream_mut<'s>(
        &self,
        state: &'s mut State,
        operation: Operation,
        stream: &str,
    ) -> Result<&'s mut StreamState, KinesisError> {
        check_stream_name(stream).map_err(|message| invalid(operation, stream, message))?;
        state
            .streams
            .get_mut(stream)
            .ok_or_else(|| KinesisError::StreamNotFound {
                operation,
                stream: stream.to_owned(),
                region: self.region.to_string(),
                source: None,
            })
    }

    /// Nanoseconds of the tokio clock since this store was made.
    fn clock_nanos(&self) -> u64 {
        let elapsed = Instant::now().saturating_duration_since(self.epoch);
        u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX)
    }

    fn iterator(&self, stream: &str, shard: u64, position: u64) -> String {
        IteratorToken {
            instance: self.instance,
            stream: stream.to_owned(),
            shard,
            position,
            issued_nanos: self.clock_nanos(),
        }
        .encode()
    }

    #[cfg(feature = "test-util")]
    fn call(&self, operation: Operation, stream: &str) -> Call {
        Call {
            operation,
            stream: stream.to_owned(),
            shard: None,
            starting_point: None,
            limit: None,
            iterator: None,
            at: Instant::now(),
        }
    }

    /// Logs the call, consumes a matching fault, and waits the latency. Returns the fault
    /// when it fails single PutRecords entries, and the fault's error when it fails the call.
    #[cfg(feature = "test-util")]
    async fn gate(&self, call: Call, shards: &[&str]) -> Result<Option<Fault>, KinesisError> {
        let operation = call.operation;
        let stream = call.stream.clone();
        let (fault, latency) = {
            let mut state = self.lock();
            state.log.record(call);
            (state.faults.take(operation, shards), state.latency)
        };
        let delay = latency.saturating_add(fault.as_ref().map_or(Duration::ZERO, Fault::delay));
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let Some(fault) = fault else {
            return Ok(None);
        };
        tracing::debug!(%operation, stream, ?fault, "memory kinesis: injected fault");
        if fault.is_per_entry() {
            return Ok(Some(fault));
        }
        match fault.error(&stream) {
            Some(error) => Err(error),
            None => Ok(None),
        }
    }
}

impl KinesisApi for MemoryKinesis {
    fn region(&self) -> &str {
        &self.region
    }

    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
        next_token: Option<String>,
    ) -> ApiFuture<'a, ListShardsPage> {
        Box::pin(async move {
            #[cfg(feature = "test-util")]
            self.gate(self.call(Operation::ListShards, stream), &[])
                .await?;
            self.list_page(stream, next_token.as_deref())
        })
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, String> {
        Box::pin(async move {
            #[cfg(feature = "test-util")]
            {
                let call = Call {
                    shard: Some(shard.to_owned()),
                    starting_point: Some(start.clone()),
                    ..self.call(Operation::GetShardIterator, stream)
                };
                self.gate(call, &[shard]).await?;
            }
            self.shard_iterator(stream, shard, start)
        })
    }

    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: String,
        limit: u32,
    ) -> ApiFuture<'a, GetRecordsOutput> {
        Box::pin(async move {
            #[cfg(feature = "test-util")]
            {
                let call = Call {
                    shard: Some(shard.to_string()),
                    limit: Some(limit),
                    iterator: Some(iterator.clone()),
                    ..self.call(Operation::GetRecords, stream)
                };
                self.gate(call, &[&**shard]).await?;
            }
            self.read(stream, shard, &iterator, limit)
        })
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        Box::pin(async move {
            #[cfg(feature = "test-util")]
            {
                let routed = self.routed_shards(stream, &entries);
                let routed: Vec<&str> = routed.iter().map(String::as_str).collect();
                let fault = self
                    .gate(self.call(Operation::PutRecords, stream), &routed)
                    .await?;
                self.put_entries(stream, entries, |shard| {
                    fault.as_ref().and_then(|f| f.entry_failure(stream, shard))
                })
            }
            #[cfg(not(feature = "test-util"))]
            self.put_entries(stream, entries, |_| None)
        })
    }

    fn describe_stream_summary<'a>(&'a self, stream: &'a str) -> ApiFuture<'a, StreamSummary> {
        Box::pin(async move {
            #[cfg(feature = "test-util")]
            self.gate(self.call(Operation::DescribeStreamSummary, stream), &[])
                .await?;
            self.summary(stream)
        })
    }

    fn register_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        Box::pin(self.register(stream, consumer))
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        Box::pin(self.describe_consumer(stream, consumer))
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, ()> {
        Box::pin(self.deregister(stream, consumer))
    }

    fn subscribe_to_shard<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, ShardEvents> {
        Box::pin(self.subscribe(stream, consumer_arn, shard, start))
    }
}

/// Calls the inherent methods of the same names, so code holding a [`MemoryKinesis`] needs no
/// import to create and reshard streams.
impl KinesisAdmin for MemoryKinesis {
    fn create_stream<'a>(&'a self, stream: &'a str, shard_count: u32) -> ApiFuture<'a, ()> {
        MemoryKinesis::create_stream(self, stream, shard_count)
    }

    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        new_starting_hash_key: &'a str,
    ) -> ApiFuture<'a, ()> {
        MemoryKinesis::split_shard(self, stream, shard, new_starting_hash_key)
    }

    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        adjacent: &'a str,
    ) -> ApiFuture<'a, ()> {
        MemoryKinesis::merge_shards(self, stream, shard, adjacent)
    }
}
