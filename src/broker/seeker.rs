//! [`KinesisSeeker`]: the framework's `Seeker` over the core's
//! [`SubscriptionSeeker`](crate::SubscriptionSeeker).

use std::fmt;
use std::sync::Arc;

use super::connection::Connection;
use crate::error::KinesisError;
use crate::position::KinesisPosition;
use crate::subscription::SubscriptionSeeker;

/// Moves one subscription of the broker face to a [`KinesisPosition`]; minted by the
/// subscriber (`Seekable::seeker`) or read in a handler through the
/// [`SeekHandle`](super::SeekHandle) key.
///
/// A position of one record ([`KinesisPosition::sequence`], or `position()` of a delivered
/// message) moves that record's shard: the record is delivered again, then the rest of its
/// shard. A position of every shard (horizon, latest, a timestamp) moves every shard this
/// instance holds. The move is this instance's only; the table and the checkpoint rules are in
/// [`SubscriptionSeeker`].
#[derive(Clone)]
pub struct KinesisSeeker {
    core: SubscriptionSeeker,
    inner: Arc<Connection>,
}

impl fmt::Debug for KinesisSeeker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KinesisSeeker")
            .field("core", &self.core)
            .field("closed", &self.inner.is_closed())
            .finish()
    }
}

impl KinesisSeeker {
    pub(crate) fn new(core: SubscriptionSeeker, inner: Arc<Connection>) -> Self {
        Self { core, inner }
    }
}

impl ruststream::Seeker for KinesisSeeker {
    type Position = KinesisPosition;
    type Error = KinesisError;

    /// # Errors
    ///
    /// [`KinesisError::ShutDown`] after the connection was shut down; otherwise as
    /// [`SubscriptionSeeker::seek`] (a shard this subscription does not read, a sequence number
    /// the service does not know, a stopped subscription). A refused seek moves nothing.
    async fn seek(&self, to: KinesisPosition) -> Result<(), KinesisError> {
        self.inner.check_open()?;
        match self.core.seek(to).await {
            Err(KinesisError::Stopped { .. }) if self.inner.is_closed() => {
                Err(KinesisError::ShutDown)
            }
            other => other,
        }
    }
}
