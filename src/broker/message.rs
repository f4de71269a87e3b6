//! [`KinesisMessage`]: one delivered record and its settlement; [`KinesisContext`] and its keys.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ruststream::{
    AckError, BuildBatchContext, BuildContext, ContextField, Field, HeaderMap, IncomingMessage,
    Partitioned, Positioned,
};

use super::connection::Connection;
use super::in_process::Counted;
use super::seeker::KinesisSeeker;
use crate::ack::Delivery;
use crate::error::KinesisError;
use crate::position::KinesisPosition;
use crate::record::Record;

/// What every message of one subscription shares (one reference per message).
pub(crate) struct Shared {
    pub(crate) stream: Arc<str>,
    pub(crate) inner: Arc<Connection>,
    pub(crate) seeker: KinesisSeeker,
    /// The mount site's `max_attempts`: a record sent back on that delivery is dead-lettered
    /// by the core, not delivered again.
    max_attempts: Option<u32>,
}

impl Shared {
    pub(crate) fn new(
        stream: Arc<str>,
        inner: Arc<Connection>,
        seeker: KinesisSeeker,
        max_attempts: Option<u32>,
    ) -> Self {
        Self {
            stream,
            inner,
            seeker,
            max_attempts,
        }
    }
}

/// One record delivered to a handler, with what settles it (see the
/// [settlement table](super#settlement-on-a-log)).
///
/// The headers come from the record's [envelope](super::envelope) (none for a bare record).
pub struct KinesisMessage {
    delivery: Option<Delivery<Record>>,
    headers: HeaderMap,
    offset: usize,
    attempt: u64,
    shared: Arc<Shared>,
    /// In process: released to the test harness when the message is dropped.
    _counted: Option<Counted>,
}

impl fmt::Debug for KinesisMessage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = f.debug_struct("KinesisMessage");
        out.field("stream", &self.shared.stream);
        if let Some(delivery) = &self.delivery {
            out.field("shard", &delivery.shard_id())
                .field("sequence_number", &delivery.sequence_number())
                .field("partition_key", &delivery.partition_key());
        }
        out.field("attempt", &self.attempt).finish()
    }
}

impl KinesisMessage {
    pub(crate) fn new(
        delivery: Delivery<Record>,
        shared: Arc<Shared>,
        counted: Option<Counted>,
    ) -> Self {
        let attempt = u64::from(delivery.attempt());
        let (headers, offset) = super::envelope::decode(delivery.data());
        Self {
            delivery: Some(delivery),
            headers,
            offset,
            attempt,
            shared,
            _counted: counted,
        }
    }

    /// The record (present until the message is settled).
    #[must_use]
    pub fn record(&self) -> Option<&Record> {
        self.delivery.as_deref()
    }

    /// The stream the record was read from.
    #[must_use]
    pub fn stream(&self) -> &str {
        &self.shared.stream
    }

    /// The span of the shard's reader (`stream` and `shard` fields): instrument the handler's
    /// work with it, and its log lines name their shard. [`Span::none`](tracing::Span::none)
    /// once the message is settled.
    #[must_use]
    pub fn span(&self) -> tracing::Span {
        self.delivery
            .as_ref()
            .map_or_else(tracing::Span::none, Delivery::span)
    }

    /// True when a seek moved the record's shard after it was read: it is no longer the
    /// next record, and settling it moves nothing.
    pub(crate) fn is_stale(&self) -> bool {
        self.delivery.as_ref().is_some_and(Delivery::is_stale)
    }

    /// The shard the record was read from (present until the message is settled).
    pub(crate) fn shard(&self) -> Option<&Arc<str>> {
        self.delivery.as_ref().map(|d| d.shard_id_shared())
    }

    /// Sends the record back (holding the checkpoint) and remembers this attempt.
    fn send_back(&mut self, when: Redelivery) {
        let delay = match when {
            Redelivery::Backoff => retry_backoff(self.attempt),
            Redelivery::After(delay) => delay,
        };
        if let Some(delivery) = self.delivery.take() {
            // In process, the harness counts the redelivery before it can be read (a record
            // on its last attempt goes to the dead letters instead).
            let after = match when {
                Redelivery::Backoff => None,
                Redelivery::After(_) => Some(delay),
            };
            let spent = self
                .shared
                .max_attempts
                .is_some_and(|max| self.attempt >= u64::from(max));
            // A record the core abandons (its ledger closed by a seek, a lost lease or a
            // stop) is not read again from here: nothing is owed.
            if !spent && delivery.requeues() {
                self.shared.inner.harness.requeued(
                    &self.shared.stream,
                    delivery.shard_id_shared(),
                    delivery.sequence_number(),
                    after,
                );
            }
            delivery.retry_after(delay);
        }
    }

    /// After shutdown: the record is held (it will be read again from the checkpoint) and the
    /// settlement is refused.
    fn refuse_closed(&mut self) -> Result<(), AckError> {
        self.send_back(Redelivery::Backoff);
        Err(AckError::Broker(Box::new(KinesisError::ShutDown)))
    }
}

/// When a record sent back comes again.
#[derive(Clone, Copy)]
enum Redelivery {
    /// `retry()` or an unsettled drop: after the retry backoff of its attempt.
    Backoff,
    /// `retry_after(d)`: after `d`.
    After(Duration),
}

/// The first wait of [`retry()`](ruststream::runtime::HandlerOutcome::retry): a record sent
/// back on its first delivery comes again after this.
pub const RETRY_BACKOFF_FIRST: Duration = Duration::from_millis(50);

/// The longest wait of [`retry()`](ruststream::runtime::HandlerOutcome::retry): the backoff
/// doubles per attempt up to this.
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// The wait before the redelivery of a record sent back on delivery `attempt` (1 = first).
fn retry_backoff(attempt: u64) -> Duration {
    let doublings = u32::try_from(attempt.saturating_sub(1).min(16)).unwrap_or(16);
    RETRY_BACKOFF_FIRST
        .saturating_mul(1 << doublings)
        .min(RETRY_BACKOFF_MAX)
}

impl Drop for KinesisMessage {
    /// A message dropped unsettled is sent back like `retry()` (with its backoff): the
    /// checkpoint does not pass it.
    fn drop(&mut self) {
        if self.delivery.is_some() {
            tracing::debug!(stream = %self.shared.stream, "message dropped unsettled; redelivered");
            self.send_back(Redelivery::Backoff);
        }
    }
}

impl IncomingMessage for KinesisMessage {
    fn payload(&self) -> &[u8] {
        self.delivery
            .as_ref()
            .map_or(&[], |d| &d.data()[self.offset..])
    }

    fn headers(&self) -> &HeaderMap {
        &self.headers
    }

    fn partition_key(&self) -> Option<&[u8]> {
        Partitioned::partition_key(self)
    }

    fn redelivery_count(&self) -> Option<u64> {
        Some(self.attempt)
    }

    async fn ack(mut self) -> Result<(), AckError> {
        if self.shared.inner.is_closed() {
            return self.refuse_closed();
        }
        if let Some(delivery) = self.delivery.take() {
            delivery.ack();
        }
        Ok(())
    }

    async fn nack(mut self, requeue: bool) -> Result<(), AckError> {
        if self.shared.inner.is_closed() {
            return self.refuse_closed();
        }
        if requeue {
            self.send_back(Redelivery::Backoff);
        } else if let Some(delivery) = self.delivery.take() {
            // The framework logged why just before (a handler's drop, or a body that did not
            // decode, with the decode error); this names the record.
            tracing::warn!(
                stream = %self.shared.stream,
                shard = %delivery.shard_id(),
                sequence_number = %delivery.sequence_number(),
                partition_key = %delivery.partition_key(),
                "record skipped (dropped by the handler or its decode policy); the checkpoint \
                 passes it"
            );
            delivery.skip();
        }
        Ok(())
    }

    fn supports_nack_after(&self) -> bool {
        true
    }

    async fn nack_after(mut self, delay: Duration) -> Result<(), AckError> {
        if self.shared.inner.is_closed() {
            return self.refuse_closed();
        }
        self.send_back(Redelivery::After(delay));
        Ok(())
    }
}

impl Positioned for KinesisMessage {
    type Position = KinesisPosition;

    /// The record's position: seeking to it delivers this record again, then the rest of its
    /// shard.
    fn position(&self) -> KinesisPosition {
        match &self.delivery {
            Some(d) => position_of(d.shard_id(), d.sequence_number(), d.sub_sequence_number()),
            // Only a settled message has no record, and settling consumes it.
            None => KinesisPosition::latest(),
        }
    }
}

impl Partitioned for KinesisMessage {
    fn partition_key(&self) -> Option<&[u8]> {
        self.delivery.as_ref().map(|d| d.partition_key().as_bytes())
    }
}

/// What a handler may read about the record it handles, through the keys below
/// (`Ctx<ShardId>`, `ctx.context(ShardId)`).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KinesisContext {
    /// The stream name.
    pub stream: Arc<str>,
    /// The shard id.
    pub shard_id: Arc<str>,
    /// The record's sequence number (a KPL aggregate's, for one of its user records).
    pub sequence_number: String,
    /// A KPL user record's sub-sequence number within its aggregate (`deaggregate(true)`).
    pub sub_sequence_number: Option<u64>,
    /// The record's partition key.
    pub partition_key: String,
    /// When the service accepted the record (approximate).
    pub arrival: Option<SystemTime>,
    /// How far the shard's tip was ahead of the read that returned the record, in ms.
    pub millis_behind_latest: Option<u64>,
    /// Moves the subscription that delivered the record.
    pub seeker: KinesisSeeker,
}

impl BuildContext<KinesisMessage> for KinesisContext {
    fn build(msg: &KinesisMessage) -> Self {
        let record = msg.record();
        Self {
            stream: msg.shared.stream.clone(),
            shard_id: record.map_or_else(|| Arc::from(""), |r| r.shard_id_shared().clone()),
            sequence_number: record
                .map(|r| r.sequence_number().to_owned())
                .unwrap_or_default(),
            sub_sequence_number: record.and_then(Record::sub_sequence_number),
            partition_key: record
                .map(|r| r.partition_key().to_owned())
                .unwrap_or_default(),
            arrival: record.and_then(Record::approximate_arrival),
            millis_behind_latest: record.and_then(Record::millis_behind_latest),
            seeker: msg.shared.seeker.clone(),
        }
    }
}

/// What a batch handler may read about its batch: the stream, the shard every record of the
/// batch comes from (`ctx.context(ShardId)`), and the seeker of the subscription that
/// delivered it (`ctx.context(SeekHandle)`). Per-record data rides each element.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct KinesisBatchContext {
    /// The stream name.
    pub stream: Arc<str>,
    /// The shard of every record of the batch.
    pub shard_id: Arc<str>,
    /// Moves the subscription that delivered the batch.
    pub seeker: KinesisSeeker,
}

impl BuildBatchContext<KinesisMessage> for KinesisBatchContext {
    fn build(first: &KinesisMessage) -> Self {
        Self {
            stream: first.shared.stream.clone(),
            shard_id: first.shard().cloned().unwrap_or_else(|| Arc::from("")),
            seeker: first.shared.seeker.clone(),
        }
    }
}

impl Field<KinesisBatchContext> for StreamName {
    type Value<'a> = &'a str;

    fn get(self, batch: &KinesisBatchContext) -> &str {
        &batch.stream
    }
}

impl Field<KinesisBatchContext> for ShardId {
    type Value<'a> = &'a str;

    fn get(self, batch: &KinesisBatchContext) -> &str {
        &batch.shard_id
    }
}

impl Field<KinesisBatchContext> for SeekHandle {
    type Value<'a> = &'a KinesisSeeker;

    fn get(self, batch: &KinesisBatchContext) -> &KinesisSeeker {
        &batch.seeker
    }
}

macro_rules! context_key {
    ($(#[$doc:meta])* $key:ident, $field:ident, $owned:ty, $borrowed:ty, |$c:ident| $read:expr, |$b:ident| $get:expr) => {
        $(#[$doc])*
        #[derive(Debug, Default, Clone, Copy)]
        pub struct $key;

        impl ContextField for $key {
            type Context = KinesisContext;
            type Value = $owned;

            fn read(self, $c: &KinesisContext) -> $owned {
                $read
            }
        }

        impl Field<KinesisContext> for $key {
            type Value<'a> = $borrowed;

            fn get(self, $b: &KinesisContext) -> Self::Value<'_> {
                $get
            }
        }
    };
}

context_key!(
    /// The stream name (`Arc<str>`).
    StreamName, stream, Arc<str>, &'a str, |c| c.stream.clone(), |c| &c.stream
);
context_key!(
    /// The shard id (`Arc<str>`).
    ShardId, shard_id, Arc<str>, &'a str, |c| c.shard_id.clone(), |c| &c.shard_id
);
context_key!(
    /// The record's sequence number.
    SequenceNumber, sequence_number, String, &'a str, |c| c.sequence_number.clone(), |c| &c.sequence_number
);
context_key!(
    /// The record's partition key.
    PartitionKey, partition_key, String, &'a str, |c| c.partition_key.clone(), |c| &c.partition_key
);
context_key!(
    /// When the service accepted the record (approximate; `None` when the service did not say).
    ArrivalTime, arrival, Option<SystemTime>, Option<SystemTime>, |c| c.arrival, |c| c.arrival
);
context_key!(
    /// How far behind the shard's tip the read that returned the record was, in milliseconds
    /// (`MillisBehindLatest`; `None` when the service did not say).
    MillisBehindLatest, millis_behind_latest, Option<u64>, Option<u64>, |c| c.millis_behind_latest, |c| c.millis_behind_latest
);
context_key!(
    /// The record's position ([`KinesisPosition::sequence`], or
    /// [`KinesisPosition::sub_sequence`] for a KPL user record, built when read): seeking to it
    /// delivers the record again.
    Position, position, KinesisPosition, KinesisPosition,
    |c| position_of(&c.shard_id, &c.sequence_number, c.sub_sequence_number),
    |c| position_of(&c.shard_id, &c.sequence_number, c.sub_sequence_number)
);

/// The position that opens at one record: inside its aggregate for a KPL user record.
fn position_of(shard: &str, sequence_number: &str, sub: Option<u64>) -> KinesisPosition {
    match sub {
        Some(sub) => KinesisPosition::sub_sequence(shard, sequence_number, sub),
        None => KinesisPosition::sequence(shard, sequence_number),
    }
}
context_key!(
    /// The seeker of the subscription that delivered the record.
    SeekHandle, seeker, KinesisSeeker, &'a KinesisSeeker, |c| c.seeker.clone(), |c| &c.seeker
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retry_backoff_doubles_per_attempt_and_stays_bounded() {
        let waits: Vec<u128> = (1..=9).map(|a| retry_backoff(a).as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(retry_backoff(u64::MAX), RETRY_BACKOFF_MAX);
    }
}
