//! [`PublishSink`]: a [`Publisher`] as a `futures::Sink`, so that
//! `stream.forward(publisher.sink())` publishes a stream, and a sink of deliveries acks each
//! one once its record is stored.
//!
//! The sink batches and hands each batch to [`Publisher::publish_batch`], one batch at a
//! time: the batching, the retries, the checks and the per-key ordering guarantee are
//! `publish_batch`'s (see the [module docs](super)).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::mem;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use futures::Sink;

use futures::future::BoxFuture;

use super::plan::CallLimits;
use super::{Publisher, check};
use crate::ack::{AckToken, Delivery, Receipts};
use crate::error::FailedRecord;
use crate::error::KinesisError;
use crate::record::{OutgoingRecord, Published};

/// What a [`PublishSink`] takes: a record, and the token to ack once it is stored (if any).
///
/// Implemented for [`OutgoingRecord`] (nothing to ack) and for
/// [`Delivery<OutgoingRecord>`](Delivery) (a record read from a stream and mapped to one to
/// publish: acked once it is stored).
pub trait Publishable {
    /// The record to publish, and the token to ack once PutRecords stored it.
    fn split(self) -> (OutgoingRecord, Option<AckToken>);
}

impl Publishable for OutgoingRecord {
    fn split(self) -> (OutgoingRecord, Option<AckToken>) {
        (self, None)
    }
}

impl Publishable for Delivery<OutgoingRecord> {
    fn split(self) -> (OutgoingRecord, Option<AckToken>) {
        let (record, token) = self.into_parts();
        (record, Some(token))
    }
}

impl Publisher {
    /// A `Sink` of [`OutgoingRecord`]s publishing to this publisher's stream:
    /// `stream.forward(publisher.sink())` publishes a whole stream. See [`PublishSink`].
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
    /// use std::sync::Arc;
    /// use futures::StreamExt;
    /// use kinesis_dataflow::{MemoryKinesis, OutgoingRecord, Publisher};
    ///
    /// let kinesis = MemoryKinesis::new();
    /// kinesis.add_stream("orders", 1)?;
    /// let publisher = Publisher::new(Arc::new(kinesis.clone()), "orders");
    ///
    /// let orders = (0..1000).map(|i| {
    ///     OutgoingRecord::new(format!("customer-{}", i % 10), format!("order {i}"))
    /// });
    /// futures::stream::iter(orders.map(Ok)).forward(publisher.sink()).await?;
    ///
    /// let stored = kinesis.records("orders", "shardId-000000000000")?;
    /// assert_eq!(stored.len(), 1000);
    /// assert_eq!(&stored[999].data()[..], b"order 999");
    /// # Ok(()) }
    /// ```
    pub fn sink(&self) -> PublishSink {
        PublishSink::new(self.clone())
    }

    /// A `Sink` of deliveries mapped to [`OutgoingRecord`]s, which acks each delivery once its
    /// record is stored, and whose close returns once written checkpoints cover them all: a
    /// stream-to-stream pipeline whose checkpoint never passes a record that was not
    /// published, durable end to end. See [`PublishSink`].
    pub fn delivery_sink(&self) -> PublishSink<Delivery<OutgoingRecord>> {
        PublishSink::new(self.clone())
    }
}

/// The future of the batch in flight.
type Sending = Pin<Box<dyn Future<Output = Result<Vec<Published>, KinesisError>> + Send>>;

/// Records taken by the sink and not yet handed to the publisher, with their tokens.
#[derive(Default)]
struct Batch {
    records: Vec<OutgoingRecord>,
    tokens: Vec<Option<AckToken>>,
    bytes: usize,
}

impl Batch {
    fn push(&mut self, record: OutgoingRecord, size: usize, token: Option<AckToken>) {
        self.records.push(record);
        self.tokens.push(token);
        self.bytes += size;
    }

    /// Whether a record of `size` bytes still fits in one PutRecords call with these.
    fn fits(&self, size: usize, limits: CallLimits) -> bool {
        self.records.len() < limits.records && self.bytes + size <= limits.bytes
    }
}

/// The batch in flight and the tokens of its records, in batch order.
struct InFlight {
    sending: Sending,
    tokens: Vec<Option<AckToken>>,
}

/// How far [`PublishSink::poll_drain`] goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Until {
    /// Until the buffer can take another record.
    Room,
    /// Until everything taken is stored.
    Empty,
}

/// A `Sink` publishing what it is sent through a [`Publisher`]; made by [`Publisher::sink`]
/// (for [`OutgoingRecord`]s) or [`Publisher::delivery_sink`] (for
/// [`Delivery<OutgoingRecord>`](Delivery)s), or [`PublishSink::new`] for any [`Publishable`].
///
/// **Batches.** The sink buffers records until one more would not fit in one PutRecords call
/// ([`max_records_per_call`](Publisher::max_records_per_call),
/// [`max_bytes_per_call`](Publisher::max_bytes_per_call)), then hands the buffer to
/// [`publish_batch`](Publisher::publish_batch). One batch is in flight at a time and the next
/// one fills meanwhile: `poll_ready` waits for the batch in flight only when the buffer is
/// full, which is the sink's back-pressure. Batches go out in the order the records came, so
/// each key keeps the order `publish_batch` guarantees within a batch across the whole stream.
/// `poll_flush` sends the partial buffer and returns once everything sent into the sink is
/// stored; until then, nothing is known to be stored.
///
/// **Durable to the end.** `poll_close` (so `forward(..)` completing) flushes, then waits, as
/// [`AckSink`](crate::AckSink)'s close does, until checkpoints written to the lease table
/// cover every delivery the sink acked, asking each of their shards to write now. When it
/// returns `Ok`, every record read is stored on the destination and the source's checkpoint
/// says so: a restart reads none of them again. A close fails when that cannot be reached
/// (the lease was lost, the table could not be written, the subscription stopped first);
/// the deliveries stay acked and the shard's next reader delivers again those the checkpoint
/// does not cover; a second close fails again rather than report them durable. A sink of
/// plain records has nothing to wait for.
///
/// **Acks.** A delivery is acked once PutRecords stored its record, never before. When a
/// batch fails for good, its stored records are acked and the tokens of all others (the
/// batch's, the buffer's, and any item sent after the failure) are sent back with
/// [`AckToken::retry`]: delivered again while their subscription runs, and never passed by
/// its checkpoint (after the subscription stopped, its next reader reads them again).
/// Dropping the sink does the same with everything it holds: its buffer is not sent, and a
/// batch in flight is abandoned mid-way, so some of its records may be stored twice. An
/// abandoned batch sends nothing after the drop (with collection too: its rounds run in the
/// sink's own future, and a call of it still waiting for its shared call is not sent), so the
/// copies published after redelivery are not followed by stale ones; only a PutRecords call
/// already on its way cannot be called back. With [`Publisher::aggregate`], a batch whose
/// aggregates are shared with other publishes still waiting goes on to its end (up to the
/// retry patience): a `warn` event says when records of it were stored after the drop.
///
/// **Failures.** The first failure stops the sink; it takes nothing more. It is reported by
/// the next `start_send`, `poll_flush` or `poll_close`; `poll_ready` itself never fails, so
/// the item `forward` took from its stream when the failure was found is handed to
/// `start_send`, and a delivery's token is kept unsettled rather than dropped.
///
/// - A batch that fails fails the sink with [`publish_batch`](Publisher::publish_batch)'s
///   error. When it is [`KinesisError::PublishFailed`], its
///   [`PublishFailure`](super::PublishFailure) hands back every record the sink took and did
///   not write, in order: the batch's unwritten records, then the records the sink held
///   behind the batch, then those sent after the failure (at positions after the batch's).
/// - A record the service would refuse (an empty partition key, one over 256 characters, a
///   record over 1 MiB) fails the sink with [`KinesisError::InvalidRecord`], whose `index`
///   is the record's position among all records sent into the sink, counted from 0. The
///   records before it are published first (and acked); it and anything sent after it are
///   not (a delivery's token stays unsettled). With `forward`, what is sent after it is the
///   one item `forward` had already taken from its stream: the error cannot carry it, so a
///   plain record is dropped there (the stream's consumer knows its position: the refused
///   one's plus one). If publishing the records before it fails, that failure is reported
///   instead.
/// - A publisher with invalid settings fails the sink with [`KinesisError::InvalidConfig`]
///   at the first record.
#[must_use = "sinks do nothing unless items are sent into them"]
pub struct PublishSink<T = OutgoingRecord> {
    publisher: Publisher,
    limits: CallLimits,
    /// Records waiting for the next batch.
    buffer: Batch,
    /// A record that did not fit in the buffer: the first of the next one.
    overflow: Option<(OutgoingRecord, usize, Option<AckToken>)>,
    in_flight: Option<InFlight>,
    /// How many records were sent into the sink: the next one's position.
    taken: usize,
    /// A record that was refused, reported once the records before it are stored.
    refused: Option<KinesisError>,
    /// The failure that stopped the sink.
    failed: Option<KinesisError>,
    /// The deliveries acked: what the close waits to see covered by written checkpoints.
    receipts: Receipts,
    /// The close's wait for those checkpoints, with the receipts it waits for.
    durable: Option<(Receipts, BoxFuture<'static, Result<(), KinesisError>>)>,
    _items: PhantomData<fn(T)>,
}

impl<T> fmt::Debug for PublishSink<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PublishSink")
            .field("stream", &self.publisher.stream())
            .field("buffered", &self.buffer.records.len())
            .field("in_flight", &self.in_flight.is_some())
            .field("taken", &self.taken)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl<T: Publishable> PublishSink<T> {
    /// A sink publishing through `publisher` (as [`Publisher::sink`] makes).
    pub fn new(publisher: Publisher) -> Self {
        let failed = publisher.validate().err();
        Self {
            limits: publisher.limits,
            publisher,
            buffer: Batch::default(),
            overflow: None,
            in_flight: None,
            taken: 0,
            refused: None,
            failed,
            receipts: Receipts::default(),
            durable: None,
            _items: PhantomData,
        }
    }

    /// Takes one record: buffers it, or notes that it is refused.
    fn take(&mut self, record: OutgoingRecord, token: Option<AckToken>) {
        let index = self.taken;
        self.taken += 1;
        match check::check(&record, self.publisher.stream(), index) {
            Ok(size) => {
                // Only when sent without `poll_ready` first: the buffer grows past one call,
                // which `publish_batch` splits.
                if let Some((held, held_size, held_token)) = self.overflow.take() {
                    self.buffer.push(held, held_size, held_token);
                }
                if self.buffer.fits(size, self.limits) {
                    self.buffer.push(record, size, token);
                } else {
                    self.overflow = Some((record, size, token));
                }
            }
            Err(error) => {
                abandon(token);
                self.refused = Some(in_sink(error));
            }
        }
    }

    /// Sends or waits for batches until `until` holds or the sink failed.
    fn poll_drain(&mut self, cx: &mut Context<'_>, until: Until) -> Poll<()> {
        loop {
            let idle = match self.poll_in_flight(cx) {
                Poll::Ready(true) => true,
                Poll::Ready(false) => return Poll::Ready(()),
                Poll::Pending => false,
            };
            let reached = match until {
                Until::Room => {
                    self.overflow.is_none() && self.buffer.records.len() < self.limits.records
                }
                Until::Empty => idle && self.overflow.is_none() && self.buffer.records.is_empty(),
            };
            if reached {
                return Poll::Ready(());
            }
            if !idle {
                return Poll::Pending;
            }
            self.launch();
        }
    }

    /// Polls the batch in flight; `Ready(true)` once none is in flight, `Ready(false)` when
    /// it failed (the sink is failed then).
    fn poll_in_flight(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        let Some(in_flight) = &mut self.in_flight else {
            return Poll::Ready(true);
        };
        let result = ready!(in_flight.sending.as_mut().poll(cx));
        let tokens = mem::take(&mut in_flight.tokens);
        self.in_flight = None;
        match result {
            Ok(_) => {
                for token in tokens.into_iter().flatten() {
                    self.receipts.note_token(&token);
                    token.ack();
                }
                Poll::Ready(true)
            }
            Err(error) => {
                settle_failed(tokens, &error);
                self.fail(error);
                Poll::Ready(false)
            }
        }
    }

    /// Hands the buffer to the publisher; the overflow record starts the next buffer.
    fn launch(&mut self) {
        let batch = mem::take(&mut self.buffer);
        if let Some((record, size, token)) = self.overflow.take() {
            self.buffer.push(record, size, token);
        }
        let publisher = self.publisher.clone();
        let records = batch.records;
        self.in_flight = Some(InFlight {
            sending: Box::pin(async move { publisher.publish_batch(records).await }),
            tokens: batch.tokens,
        });
    }

    /// Stops the sink with `error`: what it still holds is handed back in the error (when it
    /// can carry records) and its tokens are left unsettled.
    fn fail(&mut self, mut error: KinesisError) {
        let mut held = mem::take(&mut self.buffer);
        if let Some((record, size, token)) = self.overflow.take() {
            held.push(record, size, token);
        }
        let unsettled = held.tokens.iter().flatten().count();
        held.tokens.into_iter().for_each(abandon);
        hand_back(&mut error, held.records);
        tracing::warn!(
            stream = self.publisher.stream(),
            unsettled,
            %error,
            "publish sink failed; it takes nothing more"
        );
        self.refused = None;
        self.failed = Some(error);
    }

    /// What `poll_flush` and `poll_close` answer once drained.
    fn outcome(&mut self) -> Result<(), KinesisError> {
        if self.failed.is_none() {
            self.failed = self.refused.take();
        }
        match &self.failed {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }
}

impl<T: Publishable> Sink<T> for PublishSink<T> {
    type Error = KinesisError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), KinesisError>> {
        let this = self.get_mut();
        if this.failed.is_none() {
            if this.refused.is_some() {
                ready!(this.poll_drain(cx, Until::Empty));
                if this.failed.is_none() {
                    this.failed = this.refused.take();
                }
            } else {
                ready!(this.poll_drain(cx, Until::Room));
            }
        }
        // A failure is reported by `start_send`, which gets the item `forward` already took.
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: T) -> Result<(), KinesisError> {
        let this = self.get_mut();
        let (record, token) = item.split();
        if let Some(error) = this.failed.as_mut().or(this.refused.as_mut()) {
            abandon(token);
            hand_back(error, [record]);
            return Err(error.clone());
        }
        this.take(record, token);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), KinesisError>> {
        let this = self.get_mut();
        if this.failed.is_none() {
            ready!(this.poll_drain(cx, Until::Empty));
        }
        Poll::Ready(this.outcome())
    }

    /// Flushes, then waits until written checkpoints cover every delivery the sink acked
    /// (asking their shards to write now), as [`AckSink`](crate::AckSink)'s close does.
    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), KinesisError>> {
        let this = self.get_mut();
        if this.durable.is_none() {
            if this.failed.is_none() {
                ready!(this.poll_drain(cx, Until::Empty));
            }
            this.outcome()?;
            let receipts = mem::take(&mut this.receipts);
            this.durable = Some((receipts.clone(), receipts.covered()));
        }
        let (_, durable) = this.durable.as_mut().expect("set above");
        let result = ready!(durable.as_mut().poll(cx));
        let (receipts, _) = this.durable.take().expect("set above");
        if result.is_err() {
            // Still not covered: a second close waits for them again rather than reporting
            // them durable.
            this.receipts.restore(receipts);
        }
        Poll::Ready(result)
    }
}

impl<T> Drop for PublishSink<T> {
    fn drop(&mut self) {
        let in_flight = self.in_flight.take().map(|f| f.tokens).unwrap_or_default();
        let overflow = self.overflow.take().and_then(|(_, _, token)| token);
        let buffered = mem::take(&mut self.buffer.tokens);
        let tokens = in_flight.into_iter().chain(buffered).chain([overflow]);
        tokens.for_each(abandon);
    }
}

/// Sends an unstored record's delivery back (it is delivered again while its subscription
/// runs, and read again by the shard's next reader once it stopped): never acked, never
/// passed by the checkpoint.
fn abandon(token: Option<AckToken>) {
    if let Some(token) = token {
        token.retry();
    }
}

/// Acks the tokens of the records a failed batch stored; leaves the others unsettled.
fn settle_failed(tokens: Vec<Option<AckToken>>, error: &KinesisError) {
    let stored = |index: usize| match error {
        KinesisError::PublishFailed(failure) => {
            failure.published.get(index).is_some_and(Option::is_some)
        }
        // Any other error of `publish_batch` means nothing of the batch was written.
        _ => false,
    };
    for (index, token) in tokens.into_iter().enumerate() {
        match token {
            Some(token) if stored(index) => token.ack(),
            other => abandon(other),
        }
    }
}

/// Adds `records` to the records a [`KinesisError::PublishFailed`] hands back, at positions
/// after its batch's; other errors cannot carry them.
fn hand_back(error: &mut KinesisError, records: impl IntoIterator<Item = OutgoingRecord>) {
    let KinesisError::PublishFailed(failure) = error else {
        return;
    };
    for record in records {
        let index = failure.published.len();
        let behind = failure
            .failed
            .iter()
            .find(|f| f.record.partition_key == record.partition_key)
            .map(|f| f.index);
        failure.published.push(None);
        failure.failed.push(FailedRecord {
            index,
            record,
            last_error: None,
            behind,
            maybe_stored: false,
        });
    }
}

/// Says, in an [`KinesisError::InvalidRecord`] found by the sink, what its position counts.
fn in_sink(error: KinesisError) -> KinesisError {
    match error {
        KinesisError::InvalidRecord {
            stream,
            index,
            partition_key,
            size,
            mut reason,
        } => {
            reason.push_str(
                "; in a PublishSink, the record's position counts every record sent into the \
                 sink from 0: the records before it are published, and the sink takes nothing \
                 after it",
            );
            KinesisError::InvalidRecord {
                stream,
                index,
                partition_key,
                size,
                reason,
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_static_unpin<S: Send + 'static + Unpin>() {}

    #[test]
    fn sinks_are_send_static_and_unpin() {
        send_static_unpin::<PublishSink>();
        send_static_unpin::<PublishSink<Delivery<OutgoingRecord>>>();
    }
}
