//! [`LeaseGate`]: whether a held shard may still yield records.
//!
//! Others see a lease as expired one lease duration after they last saw its counter move,
//! and the counter moves when a renewal (or a checkpoint) reaches the table, which is after
//! the call was sent. So the holder times its own lease from the moment it *sent* the last
//! write that succeeded, and stops yielding records once two thirds of the lease duration
//! have passed since then. The check is made where records are handed out, so a
//! coordinator that is busy (a slow listing, a hanging call) cannot let a reader run past
//! its lease.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

/// Shared between a held shard's pump and the coordinator.
#[derive(Debug)]
pub(crate) struct LeaseGate {
    revoked: AtomicBool,
    base: Instant,
    /// Nanoseconds after `base` until which the lease is safely ours.
    valid_until: AtomicU64,
    give_up_after: Duration,
}

impl LeaseGate {
    /// A gate for a lease whose counter last moved by a write sent at `sent`.
    pub(crate) fn new(sent: Instant, give_up_after: Duration) -> Self {
        let gate = Self {
            revoked: AtomicBool::new(false),
            base: sent,
            valid_until: AtomicU64::new(0),
            give_up_after,
        };
        gate.renewed(sent);
        gate
    }

    /// A gate for the same lease, open until the same deadline: for a new reader of a shard
    /// whose old reader is revoked.
    pub(crate) fn successor(previous: &Self) -> Self {
        Self {
            revoked: AtomicBool::new(false),
            base: previous.base,
            valid_until: AtomicU64::new(previous.valid_until.load(Ordering::Acquire)),
            give_up_after: previous.give_up_after,
        }
    }

    /// A write sent at `sent` moved the counter: the lease is ours for longer.
    pub(crate) fn renewed(&self, sent: Instant) {
        let until = sent.saturating_duration_since(self.base) + self.give_up_after;
        let nanos = u64::try_from(until.as_nanos()).unwrap_or(u64::MAX);
        self.valid_until.fetch_max(nanos, Ordering::AcqRel);
    }

    /// When the holder stops reading unless it renews first.
    pub(crate) fn deadline(&self) -> Instant {
        self.base + Duration::from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    /// How long ago the last successful write was sent.
    pub(crate) fn since_renewed(&self) -> Duration {
        (Instant::now() + self.give_up_after).saturating_duration_since(self.deadline())
    }

    /// The shard is being handed off or its lease is gone: stop now.
    pub(crate) fn revoke(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    /// True when the shard was revoked.
    pub(crate) fn is_revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// True while records of this shard may be handed out.
    pub(crate) fn is_open(&self) -> bool {
        !self.is_revoked() && Instant::now() < self.deadline()
    }

    /// True when the lease ran out without a renewal (as opposed to a revocation).
    pub(crate) fn is_expired(&self) -> bool {
        Instant::now() >= self.deadline()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renewal_extends_from_when_it_was_sent_and_never_shortens() {
        let start = Instant::now();
        let gate = LeaseGate::new(start, Duration::from_secs(6));
        assert_eq!(gate.deadline(), start + Duration::from_secs(6));
        gate.renewed(start + Duration::from_secs(3));
        assert_eq!(gate.deadline(), start + Duration::from_secs(9));
        // A slow answer to an older renewal does not move the deadline back.
        gate.renewed(start + Duration::from_secs(1));
        assert_eq!(gate.deadline(), start + Duration::from_secs(9));
        assert!(gate.is_open());
        gate.revoke();
        assert!(!gate.is_open());
        assert!(!gate.is_expired());
    }

    #[test]
    fn a_lease_not_renewed_in_time_closes_the_gate() {
        let gate = LeaseGate::new(Instant::now(), Duration::ZERO);
        assert!(gate.is_expired());
        assert!(!gate.is_open());
        assert!(!gate.is_revoked());
    }
}
