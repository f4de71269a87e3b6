//! [`Graveyard`]: where the fields of records dropped by a consumer wait for the transport's
//! next read to free them.
//!
//! A transport that decodes answers on its read tasks while the consumer drops the records on
//! its own thread makes every free reach across threads: each record's key, sequence number
//! and payload were allocated where its answer was decoded. Groups buried here are freed
//! instead by the transport when its next answer arrives, on the thread of a read task.

use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use super::Fields;

/// At most this many groups wait (64 records each)...
pub(super) const ROOM: usize = 512;
/// ...holding at most this many payload bytes; past either, a group is freed where it is
/// dropped, so a transport that stops reading holds no more than this.
pub(super) const ROOM_BYTES: usize = 8 << 20;

/// Groups of records dropped and not freed yet.
#[derive(Default)]
pub(crate) struct Graveyard {
    dead: Mutex<Dead>,
}

#[derive(Default)]
struct Dead {
    groups: Vec<Box<[Fields]>>,
    /// The payload bytes of `groups`.
    bytes: usize,
}

impl fmt::Debug for Graveyard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (waiting, bytes) = {
            let dead = self.lock();
            (dead.groups.len(), dead.bytes)
        };
        f.debug_struct("Graveyard")
            .field("waiting", &waiting)
            .field("bytes", &bytes)
            .finish()
    }
}

impl Graveyard {
    fn lock(&self) -> MutexGuard<'_, Dead> {
        self.dead.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `members`, whose payloads hold `bytes`, to be freed by the next
    /// [`clear`](Self::clear); frees them now when the graveyard is full.
    pub(super) fn bury(&self, members: Box<[Fields]>, bytes: usize) {
        let mut dead = self.lock();
        if dead.groups.len() < ROOM && dead.bytes + bytes <= ROOM_BYTES {
            dead.groups.push(members);
            dead.bytes += bytes;
            return;
        }
        drop(dead);
        drop(members);
    }

    /// Frees every group buried so far, on the calling thread.
    pub(crate) fn clear(&self) {
        let groups = {
            let mut dead = self.lock();
            if dead.groups.is_empty() {
                return;
            }
            dead.bytes = 0;
            let room = dead.groups.capacity();
            std::mem::replace(&mut dead.groups, Vec::with_capacity(room))
        };
        drop(groups);
    }

    /// How many groups wait.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.lock().groups.len()
    }
}
