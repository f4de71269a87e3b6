//! [`KinesisSubscriber`]: a core subscription as a RustStream subscriber.

use std::fmt;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::Stream;
use ruststream::{BatchSubscriber, BufferedSubscriber, Subscriber};

use super::broker::{Inner, StreamClaim};
use super::in_process::Taken;
use super::message::{KinesisMessage, Shared};
use super::seeker::KinesisSeeker;
use crate::ack::Delivery;
use crate::error::KinesisError;
use crate::record::Record;
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
        claim: StreamClaim,
    ) -> Self {
        if let Some(accounting) = &inner.accounting {
            accounting.opened(&stream);
        }
        let seeker = KinesisSeeker::new(subscription.seeker(), inner.clone());
        Self {
            buffered: BufferedSubscriber::new(Wire {
                subscription,
                shared: Arc::new(Shared::new(stream, inner, seeker)),
                parked: None,
                _claim: claim,
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

impl ruststream::Seekable for KinesisSubscriber {
    type Seeker = KinesisSeeker;

    fn seeker(&self) -> KinesisSeeker {
        self.buffered.seeker()
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
    shared: Arc<Shared>,
    /// In process: a delayed redelivery read before the harness's timer for it fell due.
    parked: Option<Delivery<Record>>,
    _claim: StreamClaim,
}

impl ruststream::Seekable for Wire {
    type Seeker = KinesisSeeker;

    fn seeker(&self) -> KinesisSeeker {
        self.shared.seeker.clone()
    }
}

impl Drop for Wire {
    fn drop(&mut self) {
        if let Some(delivery) = self.parked.take() {
            // Not delivered: it must not count as settled.
            delivery.retry();
        }
        if let Some(accounting) = &self.shared.inner.accounting {
            accounting.closed(&self.shared.stream);
        }
        // Dropping the subscription stops it in the background; a new one of the stream on
        // this connection waits for that.
        self.shared
            .inner
            .stopping(&self.shared.stream, self.subscription.shutdown_handle());
    }
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
                if self.shared.inner.is_closed() {
                    return Poll::Ready(None);
                }
                let next = match self.parked.take() {
                    // A seek since: it is no longer the next record.
                    Some(parked) if parked.is_stale() => continue,
                    Some(parked) => Poll::Ready(Some(Ok(parked))),
                    None => Pin::new(&mut self.subscription).poll_next(cx),
                };
                return match next {
                    Poll::Ready(Some(Ok(delivery))) => {
                        let counted = match &self.shared.inner.accounting {
                            None => None,
                            Some(accounting) => match accounting.take(
                                &self.shared.stream,
                                delivery.shard_id_shared(),
                                delivery.sequence_number(),
                                cx.waker(),
                            ) {
                                Taken::Uncounted => None,
                                Taken::Counted(counted) => Some(counted),
                                Taken::Park => {
                                    self.parked = Some(delivery);
                                    return Poll::Pending;
                                }
                            },
                        };
                        Poll::Ready(Some(Ok(KinesisMessage::new(
                            delivery,
                            self.shared.clone(),
                            counted,
                        ))))
                    }
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
