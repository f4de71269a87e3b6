//! Spreads the first GetRecords of shard readers opened together.
//!
//! A subscription that takes many shards at once (its start, a takeover) hands them all to
//! its stream together; read at once, every first GetRecords would be in flight at the same
//! moment, each holding a connection of its own over HTTP/1.1, and the client's pool would
//! keep them all. The readers of one subscription share a [`FirstReads`]: each reader's first
//! read takes the next free slot, slots at least [`spacing`] apart, so a shard opened alone
//! reads at once and a thousand opened together read over one `poll_interval`.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How far apart the first reads of readers opened together go: a thousand per
/// `poll_interval` (1 ms at the default of 1 s).
pub(crate) fn spacing(poll_interval: Duration) -> Duration {
    poll_interval / 1_000
}

/// When a first read asked for at `now` goes out, given the earliest moment the next one may
/// (`next_free`); returns that slot and the new `next_free`.
pub(crate) fn slot(
    now: Instant,
    next_free: Option<Instant>,
    spacing: Duration,
) -> (Instant, Instant) {
    let at = next_free.map_or(now, |free| free.max(now));
    (at, at + spacing)
}

/// The slots of first reads, shared by the readers of one subscription.
#[derive(Debug, Default)]
pub(crate) struct FirstReads {
    next_free: Mutex<Option<Instant>>,
}

impl FirstReads {
    /// Takes the next slot for a first read asked for now.
    pub(crate) fn take(&self, spacing: Duration) -> Instant {
        let mut next_free = self
            .next_free
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (at, after) = slot(Instant::now(), *next_free, spacing);
        *next_free = Some(after);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_alone_goes_at_once() {
        let now = Instant::now();
        let ms = Duration::from_millis(1);
        assert_eq!(slot(now, None, ms), (now, now + ms));
        // A slot freed in the past does not delay a read asked for later.
        assert_eq!(slot(now, Some(now - ms * 50), ms), (now, now + ms));
    }

    #[test]
    fn reads_asked_together_go_one_spacing_apart() {
        let now = Instant::now();
        let ms = Duration::from_millis(1);
        let mut free = None;
        let slots: Vec<Instant> = (0..4)
            .map(|_| {
                let (at, after) = slot(now, free, ms);
                free = Some(after);
                at
            })
            .collect();
        assert_eq!(slots, vec![now, now + ms, now + ms * 2, now + ms * 3]);
    }

    #[test]
    fn a_thousand_fit_in_the_default_poll_interval() {
        assert_eq!(spacing(Duration::from_secs(1)), Duration::from_millis(1));
        assert_eq!(
            spacing(Duration::from_millis(100)) * 1_000,
            Duration::from_millis(100)
        );
    }
}
