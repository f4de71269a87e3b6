//! [`AckSink`]: the terminal of a pipeline, settling what reaches it.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Sink;

use super::delivery::Delivery;
use super::tracker::Settlement;

/// Something that can be settled: a [`Delivery`], or a batch of them.
pub trait Settle {
    /// Settles everything in `self` as `how`.
    fn settle(self, how: Settlement);
}

impl<T> Settle for Delivery<T> {
    fn settle(self, how: Settlement) {
        self.into_parts().1.settle_as(how);
    }
}

impl<T> Settle for Vec<Delivery<T>> {
    fn settle(self, how: Settlement) {
        for delivery in self {
            delivery.settle(how);
        }
    }
}

/// A `Sink` that acknowledges every delivery (or batch of deliveries) sent into it.
///
/// Acknowledging never waits: the subscription writes checkpoints in the background, at most
/// once per shard per checkpoint interval. Sending into the sink cannot fail.
///
/// ```
/// use futures::{SinkExt, StreamExt};
/// use kinesis_dataflow::ack::{AckSink, Delivery};
///
/// async fn finish<S>(deliveries: S)
/// where
///     S: futures::Stream<Item = Vec<Delivery<String>>> + Unpin,
/// {
///     let _ = deliveries.map(Ok).forward(AckSink::new()).await;
/// }
/// ```
#[derive(Debug, Clone, Copy, Default)]
#[must_use = "sinks do nothing unless items are sent into them"]
pub struct AckSink {
    settlement: Option<Settlement>,
}

impl AckSink {
    /// A sink that acknowledges what it receives.
    pub fn new() -> Self {
        Self { settlement: None }
    }

    /// A sink that settles what it receives as skipped.
    pub fn skipping() -> Self {
        Self {
            settlement: Some(Settlement::Skipped),
        }
    }
}

impl<S: Settle> Sink<S> for AckSink {
    type Error = Infallible;

    fn poll_ready(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: S) -> Result<(), Infallible> {
        item.settle(self.settlement.unwrap_or(Settlement::Acked));
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }
}
