//! [`Graveyard`]: where the fields of records dropped by a consumer wait for the transport's
//! next read to free them.
//!
//! A transport that decodes answers on one thread while the consumer drops the records on
//! another makes every free reach across: each record's key, sequence number and payload were
//! allocated by the decoding thread. Groups buried here are freed instead by the transport as
//! it reads the next answer, on the thread that decodes it.

use std::fmt;
use std::sync::{Mutex, PoisonError};

use super::Fields;

/// At most this many groups wait (64 records each); past it a group is freed where it is
/// dropped, so a transport that stops reading holds no more than this.
pub(super) const ROOM: usize = 1024;

/// Groups of records dropped and not freed yet.
#[derive(Default)]
pub(crate) struct Graveyard {
    dead: Mutex<Vec<Box<[Fields]>>>,
}

impl fmt::Debug for Graveyard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let waiting = self.lock().len();
        f.debug_struct("Graveyard")
            .field("waiting", &waiting)
            .finish()
    }
}

impl Graveyard {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Box<[Fields]>>> {
        self.dead.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keeps `members` to be freed by the next [`clear`](Self::clear), or frees them now when
    /// the graveyard is full.
    pub(super) fn bury(&self, members: Box<[Fields]>) {
        let mut dead = self.lock();
        if dead.len() < ROOM {
            dead.push(members);
            return;
        }
        drop(dead);
        drop(members);
    }

    /// Frees every group buried so far, on the calling thread.
    pub(crate) fn clear(&self) {
        let dead = std::mem::take(&mut *self.lock());
        drop(dead);
    }

    /// How many groups wait.
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.lock().len()
    }
}
