//! [`KinesisSubscriber`]: a core subscription as a RustStream subscriber.

use std::fmt;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::{Stream, StreamExt};
use ruststream::{BatchSubscriber, Subscriber};

use super::connection::{Connection, StreamClaim};
use super::in_process::Taken;
use super::message::{KinesisMessage, Shared};
use super::read_limit::ReadLimit;
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
/// A batch subscription (`&[T]` bodies) gets the records of one shard per batch, in order, in
/// batches of at most the mount site's size: a batch closes when it is full, when the next
/// record comes from another shard, or when the descriptor's
/// [`max_wait`](super::KinesisStream::max_wait) has passed since its first record. The batch
/// context names the shard ([`KinesisBatchContext`](super::KinesisBatchContext)).
pub struct KinesisSubscriber {
    /// Behind a mutex only to make the subscriber `Sync` (the framework holds `&subscriber`
    /// across awaits on routes that publish); it is reached through `&mut self`, never locked.
    messages: std::sync::Mutex<MessageStream>,
    seeker: KinesisSeeker,
    max_wait: Duration,
    /// The GetRecords limit a batch subscription sets to its size.
    read_limit: ReadLimit,
}

impl fmt::Debug for KinesisSubscriber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KinesisSubscriber")
            .field("seeker", &self.seeker)
            .field("max_wait", &self.max_wait)
            .finish()
    }
}

impl KinesisSubscriber {
    pub(crate) fn new(
        subscription: Subscription,
        stream: Arc<str>,
        inner: Arc<Connection>,
        max_wait: Duration,
        claim: StreamClaim,
        max_attempts: Option<u32>,
        read_limit: ReadLimit,
    ) -> Self {
        let seeker = KinesisSeeker::new(subscription.seeker(), inner.clone());
        Self {
            messages: std::sync::Mutex::new(MessageStream {
                subscription,
                shared: Arc::new(Shared::new(stream, inner, seeker.clone(), max_attempts)),
                parked: None,
                _claim: claim,
            }),
            seeker,
            max_wait,
            read_limit,
        }
    }

    fn messages(&mut self) -> &mut MessageStream {
        self.messages
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Subscriber for KinesisSubscriber {
    type Message = KinesisMessage;
    type Error = KinesisError;

    fn stream(&mut self) -> impl Stream<Item = Result<KinesisMessage, KinesisError>> + Send + '_ {
        self.messages().stream()
    }
}

impl ruststream::Seekable for KinesisSubscriber {
    type Seeker = KinesisSeeker;

    fn seeker(&self) -> KinesisSeeker {
        self.seeker.clone()
    }
}

impl BatchSubscriber for KinesisSubscriber {
    type Batch = Vec<KinesisMessage>;

    fn batches(
        &mut self,
        size: NonZeroUsize,
    ) -> impl Stream<Item = Result<Vec<KinesisMessage>, KinesisError>> + Send + '_ {
        let max_wait = self.max_wait;
        // GetRecords asks for a batch's worth (unless the descriptor set `batch_size`).
        self.read_limit.set(size.get());
        let messages = Box::pin(self.messages().stream());
        futures::stream::unfold((messages, Carry::Nothing), move |state| {
            next_batch(state, size.get(), max_wait)
        })
    }
}

/// What filling one batch left for the next.
enum Carry {
    Nothing,
    /// The first record of another shard: it opens the next batch.
    Message(Box<KinesisMessage>),
    /// An error met while filling: yielded after the batch.
    Error(KinesisError),
    /// The stream ended while filling.
    Ended,
}

/// One batch: records of one shard, up to `max`, closed early by another shard's record or
/// by `max_wait` after the first.
async fn next_batch<S>(
    (mut messages, carry): (S, Carry),
    max: usize,
    max_wait: Duration,
) -> Option<(Result<Vec<KinesisMessage>, KinesisError>, (S, Carry))>
where
    S: Stream<Item = Result<KinesisMessage, KinesisError>> + Unpin,
{
    let first = match carry {
        Carry::Error(e) => return Some((Err(e), (messages, Carry::Nothing))),
        Carry::Ended => return None,
        // A seek since it was read: it is no longer the next record of its shard.
        Carry::Message(first) if !first.is_stale() => *first,
        Carry::Message(_) | Carry::Nothing => match messages.next().await? {
            Ok(first) => first,
            Err(e) => return Some((Err(e), (messages, Carry::Nothing))),
        },
    };
    let shard = first.shard().cloned();
    let mut batch = Vec::with_capacity(max.min(64));
    batch.push(first);
    let mut carry = Carry::Nothing;
    if max > 1 {
        let deadline = tokio::time::sleep(max_wait);
        tokio::pin!(deadline);
        while batch.len() < max {
            tokio::select! {
                () = &mut deadline => break,
                next = messages.next() => match next {
                    Some(Ok(message)) if message.shard() == shard.as_ref() => batch.push(message),
                    Some(Ok(message)) => {
                        carry = Carry::Message(Box::new(message));
                        break;
                    }
                    Some(Err(e)) => {
                        carry = Carry::Error(e);
                        break;
                    }
                    None => {
                        carry = Carry::Ended;
                        break;
                    }
                },
            }
        }
    }
    Some((Ok(batch), (messages, carry)))
}

/// The core subscription, message by message.
struct MessageStream {
    subscription: Subscription,
    shared: Arc<Shared>,
    /// In process: a delayed redelivery read before the harness's timer for it fell due.
    parked: Option<Delivery<Record>>,
    _claim: StreamClaim,
}

impl ruststream::Seekable for MessageStream {
    type Seeker = KinesisSeeker;

    fn seeker(&self) -> KinesisSeeker {
        self.shared.seeker.clone()
    }
}

impl Drop for MessageStream {
    fn drop(&mut self) {
        if let Some(delivery) = self.parked.take() {
            // Not delivered: it must not count as settled.
            delivery.retry();
        }
        self.shared.inner.harness.closed(&self.shared.stream);
        // Dropping the subscription stops it in the background; a new one of the stream on
        // this connection waits for that.
        self.shared
            .inner
            .stopping(&self.shared.stream, self.subscription.shutdown_handle());
    }
}

impl fmt::Debug for MessageStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MessageStream")
            .field("subscription", &self.subscription)
            .finish_non_exhaustive()
    }
}

impl Subscriber for MessageStream {
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
                        let counted = match self.shared.inner.harness.take(
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

/// The framework needs a subscriber it can share across awaits (routes with `Out` slots or
/// replies); this fails to compile if `KinesisSubscriber` stops being `Send + Sync`.
const _: fn() = || {
    fn shareable<T: Send + Sync + 'static>() {}
    shareable::<KinesisSubscriber>();
};
