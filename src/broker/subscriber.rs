//! [`KinesisSubscriber`]: a core subscription as a RustStream subscriber.

use std::fmt;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::Stream;
use ruststream::{BatchSubscriber, BufferedSubscriber, Subscriber};

use super::broker::Inner;
use super::message::{Attempts, KinesisMessage};
use crate::error::KinesisError;
use crate::subscription::Subscription;

/// The records of every shard this instance holds of one stream, as [`KinesisMessage`]s.
///
/// Each shard's records come in order; shards are read side by side. A failed read the core
/// retries on its own is logged at debug level and not passed on; errors that need attention
/// (a shard that cannot be read, a KPL-aggregated record, a failing lease table) are. The
/// stream ends when the subscription stops or the connection is shut down.
///
/// A batch subscription (`&[T]` bodies) gets a shard's records in order, in batches of at most
/// the mount site's size; a partial batch waits at most the descriptor's
/// [`max_wait`](super::KinesisStream::max_wait) for more.
pub struct KinesisSubscriber {
    buffered: BufferedSubscriber<Wire>,
}

impl fmt::Debug for KinesisSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KinesisSubscriber")
            .field("buffered", &self.buffered)
            .finish()
    }
}

impl KinesisSubscriber {
    pub(crate) fn new(
        subscription: Subscription,
        stream: Arc<str>,
        inner: Arc<Inner>,
        max_wait: Duration,
    ) -> Self {
        Self {
            buffered: BufferedSubscriber::new(Wire {
                subscription,
                stream,
                attempts: Attempts::default(),
                inner,
            })
            .max_wait(max_wait),
        }
    }
}

impl Subscriber for KinesisSubscriber {
    type Message = KinesisMessage;
    type Error = KinesisError;

    fn stream(&mut self) -> impl Stream<Item = Result<KinesisMessage, KinesisError>> + Send + '_ {
        self.buffered.stream()
    }
}

impl BatchSubscriber for KinesisSubscriber {
    type Batch = Vec<KinesisMessage>;

    fn batches(
        &mut self,
        size: NonZeroUsize,
    ) -> impl Stream<Item = Result<Vec<KinesisMessage>, KinesisError>> + Send + '_ {
        self.buffered.batches(size)
    }
}

/// The core subscription, message by message.
struct Wire {
    subscription: Subscription,
    stream: Arc<str>,
    attempts: Attempts,
    inner: Arc<Inner>,
}

impl fmt::Debug for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wire")
            .field("subscription", &self.subscription)
            .finish_non_exhaustive()
    }
}

impl Subscriber for Wire {
    type Message = KinesisMessage;
    type Error = KinesisError;

    fn stream(&mut self) -> impl Stream<Item = Result<KinesisMessage, KinesisError>> + Send + '_ {
        futures::stream::poll_fn(move |cx| {
            loop {
                if self.inner.is_closed() {
                    return Poll::Ready(None);
                }
                return match Pin::new(&mut self.subscription).poll_next(cx) {
                    Poll::Ready(Some(Ok(delivery))) => Poll::Ready(Some(Ok(KinesisMessage::new(
                        delivery,
                        self.stream.clone(),
                        self.attempts.clone(),
                        self.inner.clone(),
                    )))),
                    Poll::Ready(Some(Err(e))) if e.is_retryable() => {
                        tracing::debug!(error = %e, "read failed; the subscription retries it");
                        continue;
                    }
                    Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
                    Poll::Ready(None) => Poll::Ready(None),
                    Poll::Pending => Poll::Pending,
                };
            }
        })
    }
}
