//! [`Shortcut`]: the lease gate's per-record check without a precise clock reading.
//!
//! A precise reading of the monotonic clock (`clock_gettime(CLOCK_MONOTONIC)`, what
//! `Instant::now()` does) costs some 20 to 30 ns, and the gate is asked before every record is
//! handed out: in the project's drain benchmark that is about 4 % of the raw SDK loop's CPU.
//! On Linux, `CLOCK_MONOTONIC_COARSE` is read from the same clock without the hardware counter
//! (a few ns): the time as of the kernel's last timekeeping update, so it lags by about one
//! scheduler tick (`clock_getres` gives its length; 4 ms on the project's machine, where
//! 2,000,000 readings lagged by up to 5.7 ms, more than a tick when a tick came late).
//!
//! So each precise check that finds the gate open also notes until when, on the coarse clock,
//! the gate is sure to stay open: the earliest of its deadlines, less an allowance for the
//! coarse clock's lag ([`LAG_ALLOWANCE`], or four ticks if that is more). Until the coarse
//! clock reaches that point the gate answers from the note; past it, it reads the precise
//! clock again (and, if a renewal moved a deadline on, notes a later point). A deadline only
//! moves later by itself; whatever can close the gate sooner (a revocation, a worker row
//! lost, unbound or bound again) is seen through counters checked on every call, and drops
//! the note.
//!
//! The gate itself closes a third of a lease duration (of a worker timeout) before anyone
//! may take the lease: with the defaults (10 s, 4 s) at least 1.3 s, so a coarse clock late
//! by far more than the allowance still leaves the lease safe; at the shortest settings
//! allowed (300 ms) the margin is 100 ms, twice the allowance.
//!
//! The note is taken only while tokio's clock *is* the monotonic clock. Under tokio's paused
//! test clock (`start_paused`, `time::pause`), the gate's deadlines run on virtual time that
//! the coarse clock knows nothing of: a gate that sees tokio's clock stand still while the
//! monotonic clock moves never takes a note, and reads tokio's clock for every record, as
//! before. (A test that pauses tokio's clock after a gate took its first note keeps that
//! note until it runs out in real time: pause before the subscription starts.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use clocks::{coarse_ns, monotonic_ns, resolution_ns};

/// The least allowance for the coarse clock's lag behind the precise one: 50 ms.
pub(super) const LAG_ALLOWANCE: Duration = Duration::from_millis(50);

/// The note of a [`LeaseGate`](super::LeaseGate): a coarse-clock time before which the gate is
/// open, valid while the gate's counter of changes stands where it was.
#[derive(Debug, Default)]
pub(super) struct Shortcut {
    /// Nanoseconds on the coarse clock; 0: no note.
    until: AtomicU64,
    /// The gate's changes when the note was taken.
    changes: AtomicU64,
    /// Tokio's clock was seen paused or apart from the monotonic clock: no notes, ever.
    off: AtomicBool,
}

impl Shortcut {
    /// True when the note says the gate is open: taken at `changes`, and the coarse clock has
    /// not reached it.
    pub(super) fn admits(&self, changes: u64) -> bool {
        let until = self.until.load(Ordering::Acquire);
        until != 0
            && self.changes.load(Ordering::Acquire) == changes
            && coarse_ns().is_some_and(|now| now < until)
    }

    /// Reads the monotonic clock before a precise check (`None`: no coarse clock here, or no
    /// notes for this gate).
    pub(super) fn before_check(&self) -> Option<u64> {
        if self.off.load(Ordering::Relaxed) {
            return None;
        }
        monotonic_ns()
    }

    /// After a precise check at `now` (tokio's clock) that found the gate open for `open_for`
    /// more: notes until when it stays open, `monotonic` having been read before `now`.
    pub(super) fn note(&self, monotonic: u64, now: Instant, open_for: Duration, changes: u64) {
        if !tokio_is_monotonic(now) {
            self.off.store(true, Ordering::Relaxed);
            self.until.store(0, Ordering::Release);
            return;
        }
        self.changes.store(changes, Ordering::Release);
        self.until.store(
            until(monotonic, open_for, coarse_lag_ns()),
            Ordering::Release,
        );
    }

    /// Drops the note (the gate was found closed).
    pub(super) fn forget(&self) {
        self.until.store(0, Ordering::Release);
    }
}

/// The coarse-clock time before which a gate found open for `open_for` at (or after)
/// `monotonic` stays open, with the coarse clock lagging by at most `lag`: 0 (no note) when
/// that is not later than `monotonic`.
fn until(monotonic: u64, open_for: Duration, lag: u64) -> u64 {
    let open_for = u64::try_from(open_for.as_nanos()).unwrap_or(u64::MAX);
    let until = monotonic.saturating_add(open_for).saturating_sub(lag);
    if until > monotonic { until } else { 0 }
}

/// True when tokio's clock reads as the monotonic clock around `now` (it was read just
/// before): a std reading falls between two of tokio's, and tokio's moved. Paused, tokio's
/// clock stands still; paused once and resumed, it runs apart from the monotonic clock (ahead
/// of it by what was advanced, behind it by the real time spent paused).
fn tokio_is_monotonic(now: Instant) -> bool {
    let real = std::time::Instant::now();
    let after = Instant::now();
    now < after && now.into_std() <= real && real <= after.into_std()
}

/// The allowance for the coarse clock's lag: [`LAG_ALLOWANCE`], or four of its ticks if that is
/// more.
fn coarse_lag_ns() -> u64 {
    static LAG: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *LAG.get_or_init(|| {
        let least = u64::try_from(LAG_ALLOWANCE.as_nanos()).unwrap_or(u64::MAX);
        let tick = resolution_ns().unwrap_or(u64::MAX / 4);
        tick.saturating_mul(4).max(least)
    })
}

/// The clocks, read through libc (its vDSO where there is one, the system call elsewhere).
#[cfg(target_os = "linux")]
mod clocks {
    use nix::sys::time::TimeSpec;
    use nix::time::{ClockId, clock_getres, clock_gettime};

    pub(super) fn coarse_ns() -> Option<u64> {
        nanos(clock_gettime(ClockId::CLOCK_MONOTONIC_COARSE))
    }

    pub(super) fn monotonic_ns() -> Option<u64> {
        nanos(clock_gettime(ClockId::CLOCK_MONOTONIC))
    }

    pub(super) fn resolution_ns() -> Option<u64> {
        nanos(clock_getres(ClockId::CLOCK_MONOTONIC_COARSE))
    }

    fn nanos(time: nix::Result<TimeSpec>) -> Option<u64> {
        let time = time.ok()?;
        let seconds = u64::try_from(time.tv_sec()).unwrap_or(0);
        let nanos = u64::try_from(time.tv_nsec()).unwrap_or(0);
        Some(seconds.saturating_mul(1_000_000_000).saturating_add(nanos))
    }
}

/// No coarse clock: every check is precise.
#[cfg(not(target_os = "linux"))]
mod clocks {
    pub(super) fn coarse_ns() -> Option<u64> {
        None
    }

    pub(super) fn monotonic_ns() -> Option<u64> {
        None
    }

    pub(super) fn resolution_ns() -> Option<u64> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_ends_the_lag_before_the_deadline_and_never_before_it_starts() {
        let second = Duration::from_secs(1);
        assert_eq!(
            until(1_000, second, 8_000_000),
            1_000 + 1_000_000_000 - 8_000_000
        );
        assert_eq!(until(1_000, Duration::from_millis(8), 8_000_000), 0);
        assert_eq!(until(1_000, Duration::ZERO, 0), 0);
        assert_eq!(until(u64::MAX - 5, second, 0), u64::MAX);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_coarse_clock_lags_the_precise_one_by_less_than_the_allowance() {
        for _ in 0..10_000 {
            let precise = monotonic_ns().expect("linux");
            let coarse = coarse_ns().expect("linux");
            assert!(
                coarse + coarse_lag_ns() >= precise,
                "coarse {coarse} ns, precise {precise} ns: lagging by more than {} ns",
                coarse_lag_ns()
            );
        }
    }

    #[tokio::test]
    async fn tokio_reads_as_the_monotonic_clock_unless_paused() {
        assert!(tokio_is_monotonic(Instant::now()));
        tokio::time::pause();
        assert!(!tokio_is_monotonic(Instant::now()));
        tokio::time::advance(Duration::from_secs(5)).await;
        tokio::time::resume();
        assert!(
            !tokio_is_monotonic(Instant::now()),
            "advanced once, tokio's clock runs apart"
        );
    }

    #[cfg(target_os = "linux")]
    #[tokio::test(start_paused = true)]
    async fn a_paused_clock_turns_notes_off_for_good() {
        let shortcut = Shortcut::default();
        let monotonic = shortcut.before_check().expect("linux");
        shortcut.note(monotonic, Instant::now(), Duration::from_secs(60), 0);
        assert!(!shortcut.admits(0));
        assert!(shortcut.before_check().is_none());
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_note_admits_at_its_own_changes_only_and_until_forgotten() {
        let shortcut = Shortcut::default();
        assert!(!shortcut.admits(0), "no note yet");
        let monotonic = shortcut.before_check().expect("linux");
        shortcut.note(monotonic, Instant::now(), Duration::from_secs(60), 3);
        assert!(shortcut.admits(3));
        assert!(!shortcut.admits(4), "the gate changed since");
        shortcut.forget();
        assert!(!shortcut.admits(3));
        let monotonic = shortcut.before_check().expect("linux");
        shortcut.note(monotonic, Instant::now(), LAG_ALLOWANCE, 3);
        assert!(
            !shortcut.admits(3),
            "open for no longer than the lag allowance"
        );
    }
}
