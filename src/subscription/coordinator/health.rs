//! Whether this instance can do the work: list the stream's shards and read them. An instance
//! that cannot does not count towards the shares (its worker row goes) and takes nothing, so
//! the healthy instances take the shards it cannot read.
//!
//! * The listing: the last ListShards failed.
//! * The readers: a reader gave up after failing over and over. Reads stay suspect until a
//!   GetRecords of any reader here succeeds, or for a cool-down (after which the instance
//!   tries again); each give-up with no success in between doubles the cool-down, up to
//!   [`MAX_COOLDOWN`].

use std::time::Duration;

use tokio::time::Instant;

/// The longest an instance waits before it tries to read again after its readers gave up.
pub(crate) const MAX_COOLDOWN: Duration = Duration::from_secs(300);

#[derive(Debug)]
struct Suspicion {
    /// Successful reads counted when the reader gave up.
    reads_at: u64,
    until: Instant,
}

/// The health of one instance.
#[derive(Debug)]
pub(crate) struct Health {
    listing_ok: bool,
    suspect: Option<Suspicion>,
    first_cooldown: Duration,
    cooldown: Duration,
}

impl Health {
    /// Healthy; a reader's give-up keeps reads suspect for `cooldown` at first.
    pub(crate) fn new(cooldown: Duration) -> Self {
        Self {
            listing_ok: true,
            suspect: None,
            first_cooldown: cooldown,
            cooldown,
        }
    }

    /// The outcome of a ListShards.
    pub(crate) fn listed(&mut self, ok: bool) {
        self.listing_ok = ok;
    }

    /// A reader gave up after repeated failures, with `reads` successful reads counted so far.
    pub(crate) fn reader_gave_up(&mut self, reads: u64, now: Instant) {
        let again = self.suspect.as_ref().is_some_and(|s| s.reads_at == reads);
        if again {
            self.cooldown = (self.cooldown * 2).min(MAX_COOLDOWN);
        }
        self.suspect = Some(Suspicion {
            reads_at: reads,
            until: now + self.cooldown,
        });
    }

    /// True when the instance can do the work, with `reads` successful reads counted so far.
    pub(crate) fn can_work(&mut self, reads: u64, now: Instant) -> bool {
        if let Some(s) = &self.suspect
            && reads > s.reads_at
        {
            // A read succeeded since: reads work again.
            self.suspect = None;
            self.cooldown = self.first_cooldown;
        }
        let reads_ok = self.suspect.as_ref().is_none_or(|s| now >= s.until);
        self.listing_ok && reads_ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_listing_makes_the_instance_unfit_until_one_succeeds() {
        let now = Instant::now();
        let mut health = Health::new(Duration::from_secs(30));
        assert!(health.can_work(0, now));
        health.listed(false);
        assert!(!health.can_work(0, now));
        health.listed(true);
        assert!(health.can_work(0, now));
    }

    #[test]
    fn readers_that_gave_up_keep_the_instance_out_until_a_read_works_or_the_cool_down_ends() {
        let t0 = Instant::now();
        let mut health = Health::new(Duration::from_secs(30));
        health.reader_gave_up(5, t0);
        assert!(!health.can_work(5, t0 + Duration::from_secs(29)));
        assert!(
            health.can_work(5, t0 + Duration::from_secs(30)),
            "tries again"
        );
        // Giving up again with no read in between doubles the cool-down.
        let t1 = t0 + Duration::from_secs(40);
        health.reader_gave_up(5, t1);
        assert!(!health.can_work(5, t1 + Duration::from_secs(59)));
        assert!(health.can_work(5, t1 + Duration::from_secs(60)));
        // A successful read clears the suspicion and the cool-down starts over.
        health.reader_gave_up(5, t1 + Duration::from_secs(70));
        assert!(health.can_work(6, t1 + Duration::from_secs(71)));
        health.reader_gave_up(6, t1 + Duration::from_secs(80));
        assert!(health.can_work(6, t1 + Duration::from_secs(110)));
    }
}
