//! [`Durability`]: how far one shard's settled deliveries are covered by a checkpoint written
//! to the lease table, and the waits on it (the ack sink's close, an explicit flush).
//!
//! The shard's keeper says when a checkpoint write covering the ledger up to an index
//! succeeded ([`written`](Durability::written)), or why none will
//! ([`failed`](Durability::failed)); a waiter asks for a write now
//! ([`flush_wanted`](Durability::flush_wanted)) and is answered by either.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::error::KinesisError;

/// How often a waiter asks for a write again while the writes cover no more than before.
const ASK_AGAIN: std::time::Duration = std::time::Duration::from_millis(100);

#[derive(Debug, Default)]
struct State {
    /// Every ledger index below this is covered by a written checkpoint.
    below: u64,
    /// Why no later checkpoint will be written, once that is known.
    failure: Option<KinesisError>,
}

/// The durability of one shard's ledger.
#[derive(Debug, Default)]
pub(crate) struct Durability {
    state: Mutex<State>,
    /// Woken by a write or a failure.
    changed: Notify,
    /// Woken when a waiter wants a write now.
    wanted: Notify,
}

impl Durability {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A checkpoint covering every index below `below` was written.
    pub(crate) fn written(&self, below: u64) {
        let mut state = self.lock();
        let grew = below > state.below;
        state.below = state.below.max(below);
        drop(state);
        // A write that covers no more (an earlier delivery is still unsettled) wakes nobody:
        // the waiters would only ask again at once.
        if grew {
            self.changed.notify_waiters();
        }
    }

    /// No checkpoint covering what is settled now will be written, because of `error`.
    pub(crate) fn failed(&self, error: KinesisError) {
        let mut state = self.lock();
        if state.failure.is_none() {
            state.failure = Some(error);
        }
        drop(state);
        self.changed.notify_waiters();
    }

    /// Waits until a written checkpoint covers index `index`, asking for a write meanwhile:
    /// again after each write that covered more, and every [`ASK_AGAIN`] while none does (an
    /// earlier delivery still unsettled holds the checkpoint back until it is settled).
    pub(crate) async fn covered(&self, index: u64) -> Result<(), KinesisError> {
        loop {
            let changed = self.changed.notified();
            {
                let state = self.lock();
                if state.below > index {
                    return Ok(());
                }
                if let Some(error) = &state.failure {
                    return Err(error.clone());
                }
            }
            self.wanted.notify_one();
            let _ = tokio::time::timeout(ASK_AGAIN, changed).await;
        }
    }

    /// Resolves when a waiter wants a checkpoint written now (for the keeper).
    pub(crate) async fn flush_wanted(&self) {
        self.wanted.notified().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_wait_ends_with_the_write_that_covers_it_or_with_the_failure() {
        let durability = std::sync::Arc::new(Durability::default());
        durability.written(3);
        assert!(durability.covered(2).await.is_ok());
        let waiting = tokio::spawn({
            let durability = durability.clone();
            async move { durability.covered(5).await }
        });
        durability.flush_wanted().await;
        durability.written(6);
        assert!(waiting.await.unwrap().is_ok());
        let waiting = tokio::spawn({
            let durability = durability.clone();
            async move { durability.covered(9).await }
        });
        durability.flush_wanted().await;
        durability.failed(KinesisError::Stopped { stream: "s".into() });
        assert!(matches!(
            waiting.await.unwrap(),
            Err(KinesisError::Stopped { .. })
        ));
    }

    /// While a delivery before the one waited for is unsettled, the keeper's writes cover no
    /// more; the waiter must not ask for a write again at once each time (the keeper and the
    /// waiter would then take turns as fast as they can).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_that_covers_no_more_does_not_set_the_waiter_asking_again_at_once() {
        let durability = std::sync::Arc::new(Durability::default());
        durability.written(3);
        let waiting = tokio::spawn({
            let durability = durability.clone();
            async move { durability.covered(5).await }
        });
        // The keeper: each time a write is wanted, it writes the same checkpoint again.
        let mut asked = 0;
        let window = tokio::time::Instant::now() + std::time::Duration::from_millis(500);
        while asked < 10_000 {
            match tokio::time::timeout_at(window, durability.flush_wanted()).await {
                Ok(()) => asked += 1,
                Err(_) => break,
            }
            durability.written(3);
        }
        assert!(asked < 100, "asked {asked} times in half a second");
        durability.written(6);
        assert!(waiting.await.unwrap().is_ok());
    }
}
