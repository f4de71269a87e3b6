//! [`HangUp`]: a fan-out reader's subscription, shared with whoever may have to end it while
//! the reader is not running (a shard handed back gracefully ends its subscription before its
//! lease is released, so the next holder can subscribe at once).

use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Poll, Waker};

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

/// The slot, and the reader waiting on the subscription's next event.
#[derive(Default)]
struct Shared {
    slot: Slot,
    /// Woken when the slot changes under the reader (dropping the event stream wakes
    /// nobody).
    reader: Option<Waker>,
}

/// A handle on a fan-out reader's subscription: [`hang_up`](Self::hang_up) ends it at once
/// (its connection is closed, so the service lets another subscription begin) and for good.
#[derive(Clone, Default)]
pub(crate) struct HangUp(Arc<Mutex<Shared>>);

impl std::fmt::Debug for HangUp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.lock().slot {
            Slot::Empty => "empty",
            Slot::Open(_) => "open",
            Slot::Suspended => "suspended",
            Slot::HungUp => "hung up",
        };
        f.debug_tuple("HangUp").field(&state).finish()
    }
}

impl HangUp {
    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `slot` in place unless `keep` says the current one stays; wakes the waiting
    /// reader after a change, so it sees the new slot (it may be parked on the old events).
    fn replace(&self, keep: impl Fn(&Slot) -> bool, slot: Slot) {
        let mut shared = self.lock();
        if keep(&shared.slot) {
            return;
        }
        let ended = std::mem::replace(&mut shared.slot, slot);
        let reader = shared.reader.take();
        drop(shared);
        drop(ended);
        if let Some(reader) = reader {
            reader.wake();
        }
    }

    /// Ends the subscription now, and every later one before it begins.
    pub(crate) fn hang_up(&self) {
        self.replace(|_| false, Slot::HungUp);
    }

    /// Ends the subscription now; until [`resume`](Self::resume) the reader does not
    /// subscribe and reads by GetRecords instead (a seek that opens a new subscription while
    /// the old reader may still be needed). No effect after a hang-up.
    pub(crate) fn suspend(&self) {
        self.replace(|slot| matches!(slot, Slot::HungUp), Slot::Suspended);
    }

    /// Lets a suspended reader subscribe again.
    pub(crate) fn resume(&self) {
        self.replace(|slot| !matches!(slot, Slot::Suspended), Slot::Empty);
    }

    pub(super) fn is_suspended(&self) -> bool {
        matches!(self.lock().slot, Slot::Suspended)
    }

    pub(super) fn is_hung_up(&self) -> bool {
        matches!(self.lock().slot, Slot::HungUp)
    }

    pub(super) fn is_open(&self) -> bool {
        matches!(self.lock().slot, Slot::Open(_))
    }

    /// Keeps `events` as the subscription; `false` (and they are dropped at once) while
    /// suspended or after a hang-up.
    pub(super) fn set(&self, events: ShardEvents) -> bool {
        let mut shared = self.lock();
        if matches!(shared.slot, Slot::HungUp | Slot::Suspended) {
            return false;
        }
        shared.slot = Slot::Open(events);
        true
    }

    /// Drops the subscription (it ended or failed); a hang-up stays.
    pub(super) fn clear(&self) {
        let mut shared = self.lock();
        if matches!(shared.slot, Slot::Open(_)) {
            shared.slot = Slot::Empty;
        }
    }

    /// The subscription's next event: `None` without a subscription, `Some(None)` once it
    /// ended. After a hang-up it never completes (the reader is being dropped).
    pub(super) async fn next(&self) -> Option<Option<Result<ShardEvent, KinesisError>>> {
        std::future::poll_fn(|cx| {
            let mut shared = self.lock();
            let polled = match &mut shared.slot {
                Slot::Empty | Slot::Suspended => Poll::Ready(None),
                Slot::Open(events) => events.poll_next_unpin(cx).map(Some),
                Slot::HungUp => Poll::Pending,
            };
            if polled.is_pending() {
                shared.reader = Some(cx.waker().clone());
            }
            polled
        })
        .await
    }
}
