//! [`LeaseGate`]: whether a held shard may still yield records.
//!
//! Others see a lease as expired one lease duration after they last saw its counter move,
//! and the counter moves when a renewal (or a checkpoint) reaches the table, which is after
//! the call was sent. So the holder times its own lease from the moment it *sent* the last
//! write that succeeded, and stops yielding records once two thirds of the lease duration
//! have passed since then. The check is made where records are handed out, so a
//! coordinator that is busy (a slow listing, a hanging call) cannot let a reader run past
//! its lease.
//!
//! Every reader of an instance also stops once the instance's own worker row has not been
//! renewed for two thirds of the worker timeout ([`WorkerGate`]): another instance that sees
//! the worker row unchanged for the whole worker timeout may declare the instance gone and
//! take all its shards at once, without waiting for each lease to expire in its view.
//!
//! In a [`MultiSubscription`](crate::MultiSubscription) every reader, of every stream, also
//! answers to the worker row of the group's anchor stream ([`super::group`]), and only for
//! as long as that row was not lost since the reader's shard was taken (the gate's *epoch*).
//!
//! The check before each record reads the clock precisely only now and then: in between, a
//! coarser and cheaper clock tells that the gate's earliest deadline is still far ([`shortcut`]).

mod shortcut;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use shortcut::Shortcut;

/// Shared between a held shard's pump and the coordinator.
#[derive(Debug)]
pub(crate) struct LeaseGate {
    revoked: AtomicBool,
    base: Instant,
    /// Nanoseconds after `base` until which the lease is safely ours.
    valid_until: AtomicU64,
    give_up_after: Duration,
    /// The instance's worker row, which must be fresh too.
    worker: Arc<WorkerGate>,
    /// Nanoseconds from the worker gate's `base` to this gate's: one reading of the clock,
    /// taken from `base`, then times both gates.
    worker_offset: i64,
    /// In a liveness group: the anchor stream's worker gate, and its epoch when the shard
    /// was taken. The anchor's row must be fresh too, and not lost since.
    anchor: Option<Anchor>,
    /// Until when the gate is sure to be open, on a cheaper clock. Written by
    /// [`is_open`](Self::is_open), which only the shard's pump calls.
    shortcut: Shortcut,
}

/// A liveness group's anchor gate as a [`LeaseGate`] answers to it.
#[derive(Debug, Clone)]
struct Anchor {
    gate: Arc<WorkerGate>,
    /// The anchor's epoch when the shard was taken.
    epoch: u64,
    /// Nanoseconds from the anchor gate's `base` to the lease gate's.
    offset: i64,
}

/// `to - from` in nanoseconds, negative when `to` is earlier.
fn nanos_between(from: Instant, to: Instant) -> i64 {
    let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    match to.checked_duration_since(from) {
        Some(later) => nanos(later),
        None => -nanos(from.duration_since(to)),
    }
}

impl LeaseGate {
    /// A gate for a lease whose counter last moved by a write sent at `sent`, read by an
    /// instance whose worker row `worker` times.
    pub(crate) fn new(sent: Instant, give_up_after: Duration, worker: Arc<WorkerGate>) -> Self {
        let gate = Self {
            revoked: AtomicBool::new(false),
            base: sent,
            valid_until: AtomicU64::new(0),
            give_up_after,
            worker_offset: nanos_between(worker.base, sent),
            worker,
            anchor: None,
            shortcut: Shortcut::default(),
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
            worker: previous.worker.clone(),
            worker_offset: previous.worker_offset,
            anchor: previous.anchor.clone(),
            shortcut: Shortcut::default(),
        }
    }

    /// The same gate, answering also to a liveness group's anchor gate as it is in `epoch`.
    #[must_use]
    pub(crate) fn anchored(mut self, anchor: Option<(Arc<WorkerGate>, u64)>) -> Self {
        self.anchor = anchor.map(|(gate, epoch)| Anchor {
            offset: nanos_between(gate.base, self.base),
            gate,
            epoch,
        });
        self
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

    /// True while records of this shard may be handed out. Asked before every record is
    /// handed out, by the shard's pump only.
    ///
    /// A revocation is seen at once. The deadlines are judged on a coarse clock while the
    /// last precise check's [`Shortcut`] holds (nothing that can close the gate early changed
    /// since, and the coarse clock has not reached it); otherwise by one precise reading of
    /// tokio's clock, one subtraction, and the rest in integers (each worker gate's time is
    /// this gate's plus a fixed offset).
    pub(crate) fn is_open(&self) -> bool {
        if self.is_revoked() {
            return false;
        }
        let changes = self.changes();
        if self.shortcut.admits(changes) {
            return true;
        }
        let monotonic = self.shortcut.before_check();
        let now = Instant::now();
        let since_base = now.saturating_duration_since(self.base);
        let since_base = u64::try_from(since_base.as_nanos()).unwrap_or(u64::MAX);
        let signed = i64::try_from(since_base).unwrap_or(i64::MAX);
        let open = since_base < self.valid_until.load(Ordering::Acquire)
            && (self.worker).is_open_at(signed.saturating_add(self.worker_offset))
            && (self.anchor.as_ref()).is_none_or(|anchor| {
                (anchor.gate).is_open_in_at(anchor.epoch, signed.saturating_add(anchor.offset))
            });
        match monotonic {
            Some(monotonic) if open => {
                let open_for = Duration::from_nanos(self.open_for(since_base, signed));
                self.shortcut.note(monotonic, now, open_for, changes);
            }
            _ => self.shortcut.forget(),
        }
        open
    }

    /// How many nanoseconds after `since_base` the earliest of the gate's deadlines is (the
    /// gate being open at `since_base`; `signed` is the same as an `i64`).
    fn open_for(&self, since_base: u64, signed: i64) -> u64 {
        let lease = self
            .valid_until
            .load(Ordering::Acquire)
            .saturating_sub(since_base);
        let worker = (self.worker).open_for_at(signed.saturating_add(self.worker_offset));
        let anchor = (self.anchor.as_ref())
            .and_then(|anchor| (anchor.gate).open_for_at(signed.saturating_add(anchor.offset)));
        lease
            .min(worker.unwrap_or(u64::MAX))
            .min(anchor.unwrap_or(u64::MAX))
    }

    /// The count of changes that can close the gate before its deadlines: the worker gate's
    /// and the anchor's (each only grows, so the sum moves whenever either does).
    fn changes(&self) -> u64 {
        let anchor = (self.anchor.as_ref()).map_or(0, |anchor| anchor.gate.changes());
        self.worker.changes().wrapping_add(anchor)
    }

    /// True when the lease ran out without a renewal (as opposed to a revocation).
    pub(crate) fn is_expired(&self) -> bool {
        Instant::now() >= self.deadline()
    }
}

/// Whether an instance's worker row is fresh enough for its readers to go on, shared by every
/// [`LeaseGate`] of the instance.
///
/// Unbound (always open) while the instance has no worker row: nobody can declare an instance
/// gone through a row that does not exist, and each lease still has its own gate. Bound from
/// the first write of the row on, it closes two thirds of the worker timeout after the last
/// write that succeeded was sent, exactly like a lease.
///
/// Its *epoch* counts the times the row was lost (written by another instance: declared
/// gone). A liveness group's readers each answer to the epoch their shard was taken in, so a
/// loss closes them for good, whatever renewal succeeds later.
#[derive(Debug)]
pub(crate) struct WorkerGate {
    base: Instant,
    bound: AtomicBool,
    /// Nanoseconds after `base` until which the worker row is safely this instance's.
    valid_until: AtomicU64,
    give_up_after: Duration,
    epoch: AtomicU64,
    /// Counts what can close the gate before its deadline: a loss, an unbinding, a binding.
    changes: AtomicU64,
}

impl WorkerGate {
    /// An unbound gate.
    pub(crate) fn new(give_up_after: Duration) -> Self {
        Self {
            base: Instant::now(),
            bound: AtomicBool::new(false),
            valid_until: AtomicU64::new(0),
            give_up_after,
            epoch: AtomicU64::new(0),
            changes: AtomicU64::new(0),
        }
    }

    /// The count of changes that can close the gate before its deadline (see
    /// [`LeaseGate::is_open`]).
    fn changes(&self) -> u64 {
        self.changes.load(Ordering::SeqCst)
    }

    /// The number of times the row was lost so far.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The row was lost (another instance wrote it): closed until written again, and closed
    /// for good to every reader of an earlier epoch.
    pub(crate) fn lost(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        self.valid_until.store(0, Ordering::SeqCst);
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// True while a reader of `epoch` may hand out records.
    #[cfg(test)]
    pub(crate) fn is_open_in(&self, epoch: u64, now: Instant) -> bool {
        self.is_open_in_at(epoch, nanos_between(self.base, now))
    }

    /// True while a reader of `epoch` may hand out records, at `since_base` nanoseconds
    /// after the gate's base.
    fn is_open_in_at(&self, epoch: u64, since_base: i64) -> bool {
        // The deadline first: a loss moves the epoch before it closes the deadline, and a
        // renewal after the loss reopens the deadline only then, so a reader that sees the
        // reopened deadline sees the new epoch too.
        self.is_open_at(since_base) && self.epoch() == epoch
    }

    /// A write of the worker row sent at `sent` succeeded.
    pub(crate) fn renewed(&self, sent: Instant) {
        let until = sent.saturating_duration_since(self.base) + self.give_up_after;
        let nanos = u64::try_from(until.as_nanos()).unwrap_or(u64::MAX);
        if self.bound.load(Ordering::Acquire) {
            self.valid_until.fetch_max(nanos, Ordering::AcqRel);
        } else {
            self.valid_until.store(nanos, Ordering::Release);
            self.bound.store(true, Ordering::Release);
            self.changes.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// The instance deleted its own worker row: its readers answer to their leases only.
    pub(crate) fn unbind(&self) {
        self.bound.store(false, Ordering::Release);
        self.changes.fetch_add(1, Ordering::SeqCst);
    }

    /// Nanoseconds from `since_base` (after the gate's base) to the row's deadline; `None`
    /// while unbound (no deadline).
    fn open_for_at(&self, since_base: i64) -> Option<u64> {
        if !self.bound.load(Ordering::Acquire) {
            return None;
        }
        let since_base = u64::try_from(since_base).unwrap_or(0);
        Some(
            self.valid_until
                .load(Ordering::Acquire)
                .saturating_sub(since_base),
        )
    }

    /// True while the readers may hand out records (as far as the worker row goes), at
    /// `since_base` nanoseconds after the gate's base (a time before it counts as the base
    /// itself).
    fn is_open_at(&self, since_base: i64) -> bool {
        !self.bound.load(Ordering::Acquire)
            || u64::try_from(since_base).unwrap_or(0) < self.valid_until.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unbound() -> Arc<WorkerGate> {
        Arc::new(WorkerGate::new(Duration::from_secs(6)))
    }

    #[test]
    fn a_renewal_extends_from_when_it_was_sent_and_never_shortens() {
        let start = Instant::now();
        let gate = LeaseGate::new(start, Duration::from_secs(6), unbound());
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

    /// Real time (no paused clock): the gates take notes on the coarse clock.
    #[test]
    fn with_a_note_taken_a_lost_worker_row_or_anchor_closes_the_gate_at_once() {
        let (worker, anchor) = (unbound(), unbound());
        worker.renewed(Instant::now());
        let gate = LeaseGate::new(Instant::now(), Duration::from_secs(60), worker.clone())
            .anchored(Some((anchor.clone(), anchor.epoch())));
        assert!(gate.is_open());
        #[cfg(target_os = "linux")]
        assert!(
            gate.shortcut.admits(gate.changes()),
            "the check took a note on the coarse clock"
        );
        worker.lost();
        assert!(!gate.is_open(), "the worker row was lost");
        worker.renewed(Instant::now());
        assert!(gate.is_open(), "written again");
        anchor.renewed(Instant::now());
        assert!(gate.is_open(), "the anchor's row written");
        anchor.lost();
        assert!(!gate.is_open(), "the anchor's row was lost");
        anchor.renewed(Instant::now());
        assert!(
            !gate.is_open(),
            "lost since the shard was taken: closed for good"
        );
    }

    #[test]
    fn with_a_note_taken_a_worker_row_bound_late_closes_the_gate_at_its_own_deadline() {
        let worker = Arc::new(WorkerGate::new(Duration::from_millis(20)));
        let written = Instant::now();
        let gate = LeaseGate::new(Instant::now(), Duration::from_secs(60), worker.clone());
        assert!(
            gate.is_open(),
            "unbound: the lease alone decides, for a minute"
        );
        #[cfg(target_os = "linux")]
        assert!(gate.shortcut.admits(gate.changes()), "a note was taken");
        std::thread::sleep(Duration::from_millis(50));
        // The first write of the worker row succeeds, sent 50 ms ago: its deadline passed.
        worker.renewed(written);
        assert!(!gate.is_open());
    }

    #[test]
    fn with_a_note_taken_a_lease_not_renewed_closes_the_gate_at_its_deadline() {
        // Open for longer than the coarse clock's lag allowance: the first check takes a note.
        let gate = LeaseGate::new(Instant::now(), Duration::from_millis(200), unbound());
        // Open now unless this thread was held up for most of the 200 ms; then no note.
        let noted = gate.is_open() && gate.shortcut.admits(gate.changes());
        std::thread::sleep(Duration::from_millis(300));
        if noted {
            assert!(!gate.shortcut.admits(gate.changes()), "the note ran out");
        }
        assert!(!gate.is_open());
        assert!(gate.is_expired());
    }

    #[test]
    fn a_lease_not_renewed_in_time_closes_the_gate() {
        let gate = LeaseGate::new(Instant::now(), Duration::ZERO, unbound());
        assert!(gate.is_expired());
        assert!(!gate.is_open());
        assert!(!gate.is_revoked());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stale_worker_row_closes_every_gate_of_the_instance_until_unbound() {
        let worker = unbound();
        let gate = LeaseGate::new(Instant::now(), Duration::from_secs(60), worker.clone());
        assert!(gate.is_open(), "no worker row yet: the lease alone decides");
        worker.renewed(Instant::now());
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(gate.is_open());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            !gate.is_open(),
            "six seconds after the last worker row write"
        );
        assert!(!gate.is_expired(), "the lease itself is still fresh");
        worker.renewed(Instant::now());
        assert!(gate.is_open());
        tokio::time::advance(Duration::from_secs(7)).await;
        worker.unbind();
        assert!(gate.is_open(), "the row was deleted on purpose");
    }

    /// The lease gate times the worker and anchor gates from its own clock reading, shifted
    /// by the distance between their bases: a gate made long after the worker gate (or,
    /// for a lease sent before it, earlier) closes exactly when each row's time runs out.
    #[tokio::test(start_paused = true)]
    async fn gates_made_at_other_times_close_at_each_rows_own_deadline() {
        let sent_before = Instant::now();
        tokio::time::advance(Duration::from_secs(100)).await;
        let worker = unbound();
        let anchor = unbound();
        tokio::time::advance(Duration::from_secs(50)).await;
        worker.renewed(Instant::now() - Duration::from_secs(2));
        anchor.renewed(Instant::now());
        let gates = [
            LeaseGate::new(Instant::now(), Duration::from_secs(60), worker.clone()),
            LeaseGate::new(sent_before, Duration::from_secs(300), worker.clone()),
        ]
        .map(|gate| gate.anchored(Some((anchor.clone(), anchor.epoch()))));
        // Open for `open_for` more, closed a millisecond after.
        let closes_after = async |open_for: u64, why: &str| {
            tokio::time::advance(Duration::from_millis(open_for - 1)).await;
            assert!(gates.iter().all(LeaseGate::is_open), "before: {why}");
            tokio::time::advance(Duration::from_millis(1)).await;
            assert!(gates.iter().all(|gate| !gate.is_open()), "{why}");
        };
        closes_after(4_000, "the worker row was last written six seconds ago").await;
        worker.renewed(Instant::now());
        closes_after(2_000, "the anchor row was last written six seconds ago").await;
        anchor.renewed(Instant::now());
        assert!(gates.iter().all(LeaseGate::is_open));
        anchor.lost();
        anchor.renewed(Instant::now());
        assert!(
            gates.iter().all(|gate| !gate.is_open()),
            "the anchor row was lost since the shards were taken"
        );
    }
}
