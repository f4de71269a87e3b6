//! [`HangUp`]: a fan-out reader's subscription, shared with whoever may have to end it while
//! the reader is not running (a shard handed back gracefully ends its subscription before its
//! lease is released, so the next holder can subscribe at once).

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Poll;

use futures::StreamExt;

use crate::api::{ShardEvent, ShardEvents};
use crate::error::KinesisError;

/// The slot of a fan-out reader's subscription.
#[derive(Default)]
enum Slot {
    /// No subscription now.
    #[default]
    Empty,
    Open(ShardEvents),
    /// Ended for now: the reader reads by GetRecords until [`HangUp::resume`].
    Suspended,
    /// Ended for good: the reader subscribes no more.
    HungUp,
}

/// A handle on a fan-out reader's subscription: [`hang_up`](Self::hang_up) ends it at once
/// (its connection is closed, so the service lets another subscription begin) and for good.
#[derive(Clone, Default)]
pub(crate) struct HangUp(Arc<Mutex<Slot>>);

impl std::fmt::Debug for HangUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*self.lock() {
            Slot::Empty => "empty",
            Slot::Open(_) => "open",
            Slot::Suspended => "suspended",
            Slot::HungUp => "hung up",
        };
        f.debug_tuple("HangUp").field(&state).finish()
    }
}

impl HangUp {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the subscription now, and every later one before it begins.
    pub(crate) fn hang_up(&self) {
        let ended = std::mem::replace(&mut *self.lock(), Slot::HungUp);
        drop(ended);
    }

    /// Ends the subscription now; until [`resume`](Self::resume) the reader does not
    /// subscribe and reads by GetRecords instead (a seek that opens a new subscription while
    /// the old reader may still be needed). No effect after a hang-up.
    pub(crate) fn suspend(&self) {
        let mut slot = self.lock();
        if !matches!(*slot, Slot::HungUp) {
            let ended = std::mem::replace(&mut *slot, Slot::Suspended);
            drop(slot);
            drop(ended);
        }
    }

    /// Lets a suspended reader subscribe again.
    pub(crate) fn resume(&self) {
        let mut slot = self.lock();
        if matches!(*slot, Slot::Suspended) {
            *slot = Slot::Empty;
        }
    }

    pub(super) fn is_suspended(&self) -> bool {
        matches!(*self.lock(), Slot::Suspended)
    }

    pub(super) fn is_hung_up(&self) -> bool {
        matches!(*self.lock(), Slot::HungUp)
    }

    pub(super) fn is_open(&self) -> bool {
        matches!(*self.lock(), Slot::Open(_))
    }

    /// Keeps `events` as the subscription; `false` (and they are dropped at once) while
    /// suspended or after a hang-up.
    pub(super) fn set(&self, events: ShardEvents) -> bool {
        let mut slot = self.lock();
        if matches!(*slot, Slot::HungUp | Slot::Suspended) {
            return false;
        }
        *slot = Slot::Open(events);
        true
    }

    /// Drops the subscription (it ended or failed); a hang-up stays.
    pub(super) fn clear(&self) {
        let mut slot = self.lock();
        if matches!(*slot, Slot::Open(_)) {
            *slot = Slot::Empty;
        }
    }

    /// The subscription's next event: `None` without a subscription, `Some(None)` once it
    /// ended. After a hang-up it never completes (the reader is being dropped).
    pub(super) async fn next(&self) -> Option<Option<Result<ShardEvent, KinesisError>>> {
        std::future::poll_fn(|cx| match &mut *self.lock() {
            Slot::Empty | Slot::Suspended => Poll::Ready(None),
            Slot::Open(events) => events.poll_next_unpin(cx).map(Some),
            Slot::HungUp => Poll::Pending,
        })
        .await
    }
}
