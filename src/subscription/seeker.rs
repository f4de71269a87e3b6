//! [`SubscriptionSeeker`]: moves a running subscription to another position.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::error::KinesisError;
use crate::position::KinesisPosition;

/// A seek asked of the running coordinator, answered once the new readers are in place.
pub(crate) struct SeekRequest {
    pub(crate) to: KinesisPosition,
    pub(crate) reply: oneshot::Sender<Result<(), KinesisError>>,
}

/// Moves a running [`Subscription`](super::Subscription) to another position; cloneable, usable
/// from any task and any runtime (the work runs on the subscription's own).
///
/// What a seek moves:
///
/// | position | shards moved | where the next delivery of each comes from |
/// |---|---|---|
/// | [`sequence(shard, seq)`](KinesisPosition::sequence) | that shard | the record `seq` itself, then the rest of the shard |
/// | [`horizon()`](KinesisPosition::horizon) | every shard held now | the oldest record the shard keeps |
/// | [`latest()`](KinesisPosition::latest) | every shard held now | the first record written after the seek |
/// | [`timestamp(ms)`](KinesisPosition::timestamp) | every shard held now | the first record that arrived at or after `ms` |
///
/// When [`seek`](Self::seek) returns, the subscription's next delivery of a moved shard comes
/// from the new position: what the old reader had read ahead is dropped, and so are records
/// sent back for a retry. Each moved shard keeps a fresh ledger from there, so its checkpoint
/// follows the deliveries settled after the seek (it moves back after a seek back once those
/// are settled); settling a delivery handed out before the seek no longer moves it. A seek
/// moves this instance only: shards other instances hold, and shards this one takes later,
/// start from their checkpoints.
#[derive(Clone)]
pub struct SubscriptionSeeker {
    control: mpsc::UnboundedSender<SeekRequest>,
    stream: Arc<str>,
}

impl fmt::Debug for SubscriptionSeeker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubscriptionSeeker")
            .field("stream", &self.stream)
            .field("running", &!self.control.is_closed())
            .finish()
    }
}

impl SubscriptionSeeker {
    pub(crate) fn new(control: mpsc::UnboundedSender<SeekRequest>, stream: Arc<str>) -> Self {
        Self { control, stream }
    }

    /// Moves the subscription to `to` (see the table above), and returns once the new readers
    /// are in place.
    ///
    /// # Errors
    ///
    /// [`KinesisError::SeekRefused`] for a sequence number of a shard this subscription does
    /// not read; the service's refusal of the position (a sequence number it does not know,
    /// e.g. [`KinesisError::InvalidArgument`]); [`KinesisError::Stopped`] once the
    /// subscription has stopped. A refused seek moves nothing.
    pub async fn seek(&self, to: KinesisPosition) -> Result<(), KinesisError> {
        let (reply, answer) = oneshot::channel();
        self.control
            .send(SeekRequest { to, reply })
            .map_err(|_| self.stopped())?;
        answer.await.map_err(|_| self.stopped())?
    }

    fn stopped(&self) -> KinesisError {
        KinesisError::Stopped {
            stream: self.stream.to_string(),
        }
    }
}
