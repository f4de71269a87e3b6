//! [`AckSink`]: the terminal of a pipeline. It settles what reaches it, and its close waits
//! until a checkpoint written to the lease table covers every delivery it settled.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Sink;
use futures::future::{BoxFuture, try_join_all};

use super::delivery::Delivery;
use super::tracker::{Settlement, ShardAcks};
use crate::error::KinesisError;

/// What an [`AckSink`] keeps of the deliveries it settled: per shard ledger, the highest one,
/// to wait for a checkpoint covering it.
#[derive(Default, Clone)]
pub struct Receipts {
    shards: Vec<(Arc<ShardAcks>, u64)>,
}

impl fmt::Debug for Receipts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.shards
                    .iter()
                    .map(|(acks, index)| (acks.shard(), index)),
            )
            .finish()
    }
}

impl Receipts {
    /// Notes a settled delivery; the ledger's `Arc` is cloned only for a shard not seen yet
    /// (per delivery, the count is shared with the reader's thread: no atomics here).
    fn note(&mut self, (acks, index): (&Arc<ShardAcks>, u64)) {
        match self.shards.iter_mut().find(|(a, _)| Arc::ptr_eq(a, acks)) {
            Some((_, highest)) => *highest = (*highest).max(index),
            None => self.shards.push((acks.clone(), index)),
        }
    }

    /// Notes the delivery of `token`, about to be acked.
    pub(crate) fn note_token(&mut self, token: &super::AckToken) {
        self.note(token.receipt());
    }

    fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// Notes again every delivery `earlier` noted (those of a wait that failed: still not
    /// covered, so a later wait must fail or cover them too).
    pub(crate) fn restore(&mut self, earlier: Self) {
        for (acks, index) in &earlier.shards {
            self.note((acks, *index));
        }
    }

    /// Waits until a written checkpoint covers every delivery noted (asking each shard for a
    /// write now). Fails as soon as one shard's cannot be: its lease was lost, the table could
    /// not be written, a seek moved it, or its subscription stopped first.
    pub(crate) fn covered(self) -> BoxFuture<'static, Result<(), KinesisError>> {
        Box::pin(async move {
            try_join_all(
                self.shards
                    .iter()
                    .map(|(acks, index)| acks.durability().covered(*index)),
            )
            .await
            .map(drop)
        })
    }
}

/// Something that can be settled: a [`Delivery`], or a batch of them.
pub trait Settle {
    /// Settles everything in `self` as `how`.
    fn settle(self, how: Settlement);

    /// Settles everything in `self` as `how`, noting in `receipts` what to wait for before a
    /// checkpoint covers it (what the [`AckSink`] does).
    fn settle_noting(self, how: Settlement, receipts: &mut Receipts)
    where
        Self: Sized,
    {
        let _ = receipts;
        self.settle(how);
    }
}

impl<T> Settle for Delivery<T> {
    fn settle(self, how: Settlement) {
        self.into_parts().1.settle_as(how);
    }

    fn settle_noting(self, how: Settlement, receipts: &mut Receipts) {
        receipts.note(self.receipt());
        self.settle(how);
    }
}

impl<T> Settle for Vec<Delivery<T>> {
    fn settle(self, how: Settlement) {
        for delivery in self {
            delivery.settle(how);
        }
    }

    fn settle_noting(self, how: Settlement, receipts: &mut Receipts) {
        for delivery in self {
            delivery.settle_noting(how, receipts);
        }
    }
}

/// A `Sink` that settles every delivery (or batch of deliveries) sent into it, and whose close
/// waits until what it settled is checkpointed.
///
/// * **Sending** settles at once (acknowledged, or skipped for [`skipping`](Self::skipping)).
///   The subscription writes checkpoints in the background, at most once per shard per
///   checkpoint interval.
/// * **Closing** (so `forward(..)` completing) asks each shard it settled deliveries of to write
///   its checkpoint now, and waits until a written checkpoint covers every one of them.
/// * **Flushing** does not wait by default: `StreamExt::forward` flushes whenever its source
///   is pending, and waiting there would write a checkpoint per shard each time the pipeline
///   idles instead of one per interval. [`durable_flush`](Self::durable_flush) makes every
///   flush wait too, for a pipeline that must know each flush is durable.
///
/// When durability cannot be reached the sink fails: the lease was lost
/// ([`KinesisError::LeaseStore`] naming the stream and shard), the lease table could not be
/// written (its error), a seek moved the shard ([`KinesisError::Superseded`]), or the
/// subscription stopped before writing, or the shard's checkpoint writer ended without writing
/// (a lease store that panicked in a call, say: [`KinesisError::Stopped`]). The deliveries stay
/// settled; the shard's next reader delivers those the checkpoint does not cover again. A
/// failed flush or close keeps what it waited for, so a second close never reports those
/// deliveries durable: it fails again, or succeeds only once a checkpoint covers them.
///
/// ```
/// use futures::{SinkExt, StreamExt};
/// use kinesis_dataflow::KinesisError;
/// use kinesis_dataflow::ack::{AckSink, Delivery};
///
/// async fn finish<S>(deliveries: S) -> Result<(), KinesisError>
/// where
///     S: futures::Stream<Item = Vec<Delivery<String>>> + Unpin,
/// {
///     // Returns once every delivery is covered by a written checkpoint.
///     deliveries.map(Ok).forward(AckSink::new()).await
/// }
/// ```
#[must_use = "sinks do nothing unless items are sent into them"]
pub struct AckSink {
    settlement: Settlement,
    durable_flush: bool,
    receipts: Receipts,
    /// A wait under way, with the receipts it waits for (noted again if it fails).
    waiting: Option<(Receipts, BoxFuture<'static, Result<(), KinesisError>>)>,
}

impl fmt::Debug for AckSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AckSink")
            .field("settlement", &self.settlement)
            .field("durable_flush", &self.durable_flush)
            .field("receipts", &self.receipts)
            .field("waiting", &self.waiting.is_some())
            .finish()
    }
}

impl Default for AckSink {
    fn default() -> Self {
        Self::new()
    }
}

impl AckSink {
    /// A sink that acknowledges what it receives.
    pub fn new() -> Self {
        Self {
            settlement: Settlement::Acked,
            durable_flush: false,
            receipts: Receipts::default(),
            waiting: None,
        }
    }

    /// A sink that settles what it receives as skipped.
    pub fn skipping() -> Self {
        Self {
            settlement: Settlement::Skipped,
            ..Self::new()
        }
    }

    /// With `true`, every flush waits, as a close does, until a written checkpoint covers
    /// what the sink settled (each flush then writes a checkpoint per shard it touched).
    pub fn durable_flush(mut self, on: bool) -> Self {
        self.durable_flush = on;
        self
    }

    /// Waits until a written checkpoint covers everything settled so far.
    fn poll_durable(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), KinesisError>> {
        if self.waiting.is_none() {
            if self.receipts.is_empty() {
                return Poll::Ready(Ok(()));
            }
            let receipts = std::mem::take(&mut self.receipts);
            self.waiting = Some((receipts.clone(), receipts.covered()));
        }
        let (_, waiting) = self.waiting.as_mut().expect("set above");
        let result = futures::ready!(waiting.as_mut().poll(cx));
        let (receipts, _) = self.waiting.take().expect("set above");
        if result.is_err() {
            // Still not covered: a later flush or close waits for them again (and fails
            // again while their shards cannot write), instead of reporting them durable.
            self.receipts.restore(receipts);
        }
        Poll::Ready(result)
    }
}

impl<S: Settle> Sink<S> for AckSink {
    type Error = KinesisError;

    fn poll_ready(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), KinesisError>> {
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: S) -> Result<(), KinesisError> {
        let this = self.get_mut();
        item.settle_noting(this.settlement, &mut this.receipts);
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), KinesisError>> {
        let this = self.get_mut();
        if this.durable_flush {
            this.poll_durable(cx)
        } else {
            Poll::Ready(Ok(()))
        }
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), KinesisError>> {
        self.get_mut().poll_durable(cx)
    }
}
