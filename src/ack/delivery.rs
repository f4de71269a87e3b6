//! [`Delivery`]: a value together with what settles it.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::time::Duration;

use super::tracker::{SendBack, Settlement, ShardAcks};
use crate::position::Checkpoint;
use crate::record::Record;

/// The right (and duty) to settle one delivered record.
///
/// Settle it with [`ack`](Self::ack), [`skip`](Self::skip) or [`retry`](Self::retry). A token
/// dropped without being settled follows the rules in the [module docs](super): passed as
/// [`Settlement::Dropped`] in the ordinary course of a running subscription (that is what makes
/// `filter` work), sent back for redelivery when the subscription says so
/// ([`redeliver_dropped`](crate::SubscriptionBuilder::redeliver_dropped)), and never passed
/// when it is dropped by a panic or after the subscription stopped reading its shard.
#[must_use = "a delivery that is dropped without being settled counts as dropped"]
pub struct AckToken {
    acks: Arc<ShardAcks>,
    index: u64,
    settled: bool,
    /// The record as read (a clone shares its buffers): what a redelivery hands out again.
    record: Option<Record>,
    /// Which delivery of the record this is (1 for the first).
    attempt: u32,
}

impl fmt::Debug for AckToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckToken")
            .field("shard", &self.acks.shard())
            .field("index", &self.index)
            .field("settled", &self.settled)
            .finish()
    }
}

impl AckToken {
    /// The token of the record registered at `index` of `acks`; `record` is kept for its
    /// redelivery.
    pub(crate) fn new(acks: Arc<ShardAcks>, index: u64, record: Option<Record>) -> Self {
        Self {
            acks,
            index,
            settled: false,
            record,
            attempt: 1,
        }
    }

    /// The same token, for the record's `attempt`-th delivery.
    pub(crate) fn with_attempt(mut self, attempt: u32) -> Self {
        self.attempt = attempt;
        self
    }

    /// Which delivery of the record this is: 1 the first time, 2 after one `retry`, and so
    /// on. Counted in this process only: a hand-off or a restart starts again at 1.
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// Like [`retry`](Self::retry), noting why this attempt failed; past the subscription's
    /// [`max_attempts`](crate::SubscriptionBuilder::max_attempts) the record is
    /// dead-lettered with `error` as its last error instead of delivered again.
    pub fn fail(mut self, error: impl fmt::Display) {
        self.send_back(SendBack {
            last_error: Some(error.to_string()),
            ..SendBack::default()
        });
    }

    /// Sends the record to the subscription's dead-letter destination now, whatever its
    /// attempts, with `reason` as its last error (a record that will never decode, say). The
    /// shard waits until the dead letter is written; then the checkpoint passes the record.
    /// Without a destination the record is logged at error level and skipped.
    pub fn dead_letter(mut self, reason: impl fmt::Display) {
        self.send_back(SendBack {
            last_error: Some(reason.to_string()),
            dead: true,
            ..SendBack::default()
        });
    }

    /// Sends the record back to be delivered again at once, still unsettled, before any later
    /// record of its shard that has not been handed out yet. The checkpoint does not pass it
    /// meanwhile.
    pub fn retry(self) {
        self.retry_after(Duration::ZERO);
    }

    /// Like [`retry`](Self::retry), after `delay`. Later records of the shard wait for it.
    pub fn retry_after(mut self, delay: Duration) {
        self.send_back(SendBack {
            delay,
            ..SendBack::default()
        });
    }

    /// What identifies the record for a sink that must not apply it twice: its stream,
    /// shard and sequence number (see [`DedupeKey`]).
    #[must_use]
    pub fn dedupe_key(&self) -> DedupeKey {
        DedupeKey {
            stream: self.acks.stream().clone(),
            shard: self.acks.shard().clone(),
            sequence_number: self.record.as_ref().map(|r| Arc::from(r.sequence_number())),
            sub_sequence_number: self.record.as_ref().and_then(Record::sub_sequence_number),
        }
    }

    /// The ledger and index this token settles (for the ack sink's durability wait).
    pub(crate) fn receipt(&self) -> (&Arc<ShardAcks>, u64) {
        (&self.acks, self.index)
    }

    /// The position of this record in its shard, as a checkpoint settled through it: the
    /// record's sequence number, and inside a KPL aggregate its sub-sequence number. `None`
    /// only for a token made outside a subscription, without its record.
    #[must_use]
    pub fn position(&self) -> Option<Checkpoint> {
        let record = self.record.as_ref()?;
        let seq = record.sequence_number().to_owned();
        Some(match record.sub_sequence_number() {
            Some(sub) => Checkpoint::SubSequence(seq, sub),
            None => Checkpoint::Sequence(seq),
        })
    }

    /// Requeues the record; a token without one (never the case for the subscription's)
    /// abandons it, so it is read again rather than passed.
    fn send_back(&mut self, mut back: SendBack) {
        if self.settled {
            return;
        }
        back.attempts = self.attempt;
        match self.record.take() {
            Some(record) if !self.acks.is_closed() => {
                self.settled = true;
                self.acks.requeue(self.index, record, back);
            }
            _ => self.settle(Settlement::Abandoned),
        }
    }

    /// Settles the record as processed.
    pub fn ack(mut self) {
        self.settle(Settlement::Acked);
    }

    /// Settles the record as deliberately not processed.
    pub fn skip(mut self) {
        self.settle(Settlement::Skipped);
    }

    /// Settles the record as `how`.
    pub fn settle_as(mut self, how: Settlement) {
        self.settle(how);
    }

    /// The id of the shard the record came from.
    #[must_use]
    pub fn shard_id(&self) -> &str {
        self.acks.shard()
    }

    /// The span of the shard's reader (`shard`, with `stream` and `shard` fields, inside the
    /// subscription's span): enter it, or instrument the work on the record with it, and the
    /// work's log lines name their shard. [`Span::none`](tracing::Span::none) for a delivery
    /// made outside a subscription.
    #[must_use]
    pub fn span(&self) -> tracing::Span {
        self.acks.span().clone()
    }

    /// True when the subscription moved its shard (a seek) after this was handed out:
    /// settling it no longer moves the checkpoint.
    #[must_use]
    pub fn is_stale(&self) -> bool {
        self.acks.is_retired()
    }

    /// True when a send-back now requeues the record; false when it would be abandoned
    /// (the shard's ledger is closed: a seek, a lost lease or a stop), so it is not read
    /// again from this ledger. (The broker face's in-process harness asks.)
    #[cfg(feature = "broker")]
    pub(crate) fn requeues(&self) -> bool {
        !self.settled && self.record.is_some() && !self.acks.is_closed()
    }

    fn settle(&mut self, how: Settlement) {
        if !self.settled {
            self.settled = true;
            self.acks.settle_attempt(self.index, self.attempt, how);
        }
    }
}

impl Drop for AckToken {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let (stream, shard) = (self.acks.stream().clone(), self.acks.shard().clone());
        if self.acks.is_closed() {
            tracing::debug!(%stream, %shard, "delivery dropped after its shard was closed; read again by the next reader");
            self.settle(Settlement::Abandoned);
        } else if std::thread::panicking() {
            tracing::warn!(%stream, %shard, "delivery dropped by a panic; sent back for redelivery");
            self.send_back(SendBack {
                last_error: Some("dropped by a panic".into()),
                ..SendBack::default()
            });
        } else if self.acks.redelivers_dropped() {
            tracing::debug!(%stream, %shard, "delivery dropped without being settled; sent back for redelivery");
            self.send_back(SendBack::default());
        } else {
            tracing::debug!(%stream, %shard, "delivery dropped without being settled; counted as dropped");
            self.settle(Settlement::Dropped);
        }
    }
}

/// What identifies a delivered record, for a sink that must apply each record once: the
/// stream, the shard, the sequence number (unique within the stream) and, for a user record
/// taken out of a KPL aggregate, its sub-sequence number. A redelivery of a record has the
/// same key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DedupeKey {
    /// The stream.
    pub stream: Arc<str>,
    /// The shard the record was read from.
    pub shard: Arc<str>,
    /// The record's sequence number (`None` only for a token not made by a reader).
    pub sequence_number: Option<Arc<str>>,
    /// A user record's place in its KPL aggregate (`None` for a record not aggregated).
    pub sub_sequence_number: Option<u64>,
}

/// A value delivered from a shard, carrying the token that settles it.
///
/// `Delivery` keeps its token through [`map`](Self::map), `filter` (a filtered-out delivery
/// is settled when dropped) and `.chunks(n)` (a `Vec<Delivery<T>>` settles element by
/// element, or all at once through the [`AckSink`](super::AckSink)).
#[must_use = "a delivery that is dropped without being settled counts as dropped"]
pub struct Delivery<T> {
    value: T,
    token: AckToken,
}

impl<T: fmt::Debug> fmt::Debug for Delivery<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delivery")
            .field("value", &self.value)
            .field("token", &self.token)
            .finish()
    }
}

impl<T> Delivery<T> {
    /// Pairs a value with its token.
    pub(crate) fn new(value: T, token: AckToken) -> Self {
        Self { value, token }
    }

    /// The delivered value.
    pub fn value(&self) -> &T {
        &self.value
    }

    /// Transforms the value, keeping the token.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Delivery<U> {
        Delivery {
            value: f(self.value),
            token: self.token,
        }
    }

    /// Splits the delivery into its value and its token.
    pub fn into_parts(self) -> (T, AckToken) {
        (self.value, self.token)
    }

    /// Settles the delivery as processed and returns the value.
    pub fn ack(self) -> T {
        self.token.ack();
        self.value
    }

    /// Settles the delivery as skipped and returns the value.
    pub fn skip(self) -> T {
        self.token.skip();
        self.value
    }

    /// The id of the shard the value came from.
    #[must_use]
    pub fn shard_id(&self) -> &str {
        self.token.shard_id()
    }

    /// The span of the shard's reader: see [`AckToken::span`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
    /// use std::sync::Arc;
    /// use futures::StreamExt;
    /// use tracing::Instrument;
    /// use kinesis_dataflow::{KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription};
    ///
    /// let kinesis = MemoryKinesis::new();
    /// kinesis.add_stream("orders", 1)?;
    /// kinesis.put("orders", "customer-1", "first order")?;
    /// let mut orders = Subscription::builder(Arc::new(kinesis), Arc::new(MemoryLeaseStore::new()), "orders")
    ///     .start_at(KinesisPosition::horizon())
    ///     .start()
    ///     .await?;
    /// let delivery = orders.next().await.unwrap()?;
    /// let span = delivery.span();
    /// async {
    ///     // Logged with `stream=orders shard=shardId-000000000000`.
    ///     tracing::info!(bytes = delivery.data().len(), "handling an order");
    ///     delivery.ack();
    /// }
    /// .instrument(span)
    /// .await;
    /// orders.shutdown().await;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn span(&self) -> tracing::Span {
        self.token.span()
    }

    /// True when the subscription moved its shard (a seek) after this was handed out:
    /// settling it no longer moves the checkpoint.
    #[must_use]
    pub fn is_stale(&self) -> bool {
        self.token.is_stale()
    }

    /// True when [`retry`](Self::retry) now requeues the record (see the token's).
    #[cfg(feature = "broker")]
    pub(crate) fn requeues(&self) -> bool {
        self.token.requeues()
    }

    /// Sends the record this value came from back to be delivered again at once (as the
    /// record it was read as, whatever `map` made of it), still unsettled, before any later
    /// record of its shard that has not been handed out yet. The checkpoint does not pass it
    /// meanwhile.
    pub fn retry(self) {
        self.token.retry();
    }

    /// Like [`retry`](Self::retry), after `delay`. Later records of the shard wait for it.
    pub fn retry_after(self, delay: Duration) {
        self.token.retry_after(delay);
    }

    /// What identifies the record for a sink that must not apply it twice.
    #[must_use]
    pub fn dedupe_key(&self) -> DedupeKey {
        self.token.dedupe_key()
    }

    /// Transforms the value with `f`, which may fail; on failure the delivery comes back
    /// (with the value `f` gave back in its error) for the caller to settle.
    ///
    /// # Errors
    ///
    /// `f`'s error, with the delivery.
    // The delivery itself comes back on failure: that is the point, not an oversight.
    #[allow(clippy::result_large_err)]
    pub fn try_map<U, E>(
        self,
        f: impl FnOnce(T) -> Result<U, (E, T)>,
    ) -> Result<Delivery<U>, (E, Delivery<T>)> {
        let Self { value, token } = self;
        match f(value) {
            Ok(value) => Ok(Delivery { value, token }),
            Err((error, value)) => Err((error, Delivery { value, token })),
        }
    }

    /// The ledger and index that settle this delivery.
    pub(crate) fn receipt(&self) -> (&Arc<ShardAcks>, u64) {
        self.token.receipt()
    }

    /// The record's position in its shard (see [`AckToken::position`]): what a sink that
    /// stores its effects in a database stores with them, in the same transaction, and what
    /// its [`PositionSource`](crate::subscription::PositionSource) gives back when a shard
    /// is taken, so the shard opens right after the last effect committed.
    #[must_use]
    pub fn position(&self) -> Option<Checkpoint> {
        self.token.position()
    }

    /// Which delivery of the record this is (see [`AckToken::attempt`]).
    #[must_use]
    pub fn attempt(&self) -> u32 {
        self.token.attempt()
    }

    /// Sends the record back noting why it failed (see [`AckToken::fail`]).
    pub fn fail(self, error: impl fmt::Display) {
        self.token.fail(error);
    }

    /// Dead-letters the record now (see [`AckToken::dead_letter`]).
    pub fn dead_letter(self, reason: impl fmt::Display) {
        self.token.dead_letter(reason);
    }

    /// Tells apart the shards (their ledgers) of deliveries held at the same time.
    pub(crate) fn ledger_key(&self) -> usize {
        Arc::as_ptr(&self.token.acks) as usize
    }
}

impl Delivery<Record> {
    /// Decodes the record's data with `decode` (`serde_json::from_slice`, a protobuf
    /// decoder, ...). A failure is [`KinesisError::Decode`](crate::error::KinesisError::Decode): one
    /// error naming the stream, the shard, the sequence number and the partition key, with the
    /// decoder's error as its source. The delivery is left as it was, unsettled: the caller
    /// decides, usually [`skip`](Self::skip) for a record that will never decode (the shard goes
    /// on and the checkpoint passes it) or [`retry`](Self::retry).
    ///
    /// ```
    /// # async fn demo() -> Result<(), kinesis_dataflow::KinesisError> {
    /// use std::sync::Arc;
    ///
    /// use futures::StreamExt;
    /// use kinesis_dataflow::{
    ///     KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription,
    /// };
    ///
    /// let kinesis = MemoryKinesis::new();
    /// kinesis.add_stream("orders", 1)?;
    /// kinesis.put("orders", "order-1", "{not json")?;
    /// let mut orders = Subscription::builder(
    ///     Arc::new(kinesis),
    ///     Arc::new(MemoryLeaseStore::new()),
    ///     "orders",
    /// )
    /// .start_at(KinesisPosition::horizon())
    /// .start()
    /// .await?;
    ///
    /// let delivery = orders.next().await.expect("a record")?;
    /// match delivery.decode(serde_json::from_slice::<serde_json::Value>) {
    ///     Ok(order) => {
    ///         println!("{order}");
    ///         delivery.ack();
    ///     }
    ///     Err(error) => {
    ///         // record 4900... (partition key `order-1`) of shard `shardId-000000000000` in
    ///         // stream `orders` does not decode (...): key must be a string at line 1 column 2
    ///         assert!(matches!(
    ///             &error,
    ///             KinesisError::Decode { partition_key, .. } if partition_key == "order-1"
    ///         ));
    ///         eprintln!("{}", error.report());
    ///         delivery.skip();
    ///     }
    /// }
    /// orders.shutdown().await;
    /// # Ok(())
    /// # }
    /// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
    /// ```
    ///
    /// # Errors
    ///
    /// [`KinesisError::Decode`](crate::error::KinesisError::Decode) when `decode` fails.
    pub fn decode<'a, T, E>(
        &'a self,
        decode: impl FnOnce(&'a [u8]) -> Result<T, E>,
    ) -> Result<T, crate::error::KinesisError>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        decode(self.value.data()).map_err(|e| crate::error::KinesisError::Decode {
            stream: self.token.acks.stream().to_string(),
            shard: self.value.shard_id().to_owned(),
            sequence_number: self.value.sequence_number().to_owned(),
            partition_key: self.value.partition_key().to_owned(),
            source: std::sync::Arc::new(e),
        })
    }

    /// [`decode`](Self::decode), consuming the delivery: the decoded value keeps the token;
    /// on failure the delivery comes back with the error, unsettled, for the caller to
    /// [`skip`](Self::skip) or [`retry`](Self::retry).
    ///
    /// # Errors
    ///
    /// [`KinesisError::Decode`](crate::error::KinesisError::Decode), with the delivery.
    #[allow(clippy::result_large_err)]
    pub fn decode_into<U, E>(
        self,
        decode: impl FnOnce(&[u8]) -> Result<U, E>,
    ) -> Result<Delivery<U>, (crate::error::KinesisError, Self)>
    where
        E: std::error::Error + Send + Sync + 'static,
    {
        match self.decode(decode) {
            Ok(value) => Ok(Delivery {
                value,
                token: self.token,
            }),
            Err(error) => Err((error, self)),
        }
    }
}

impl<T> Deref for Delivery<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Delivery<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}
