//! How this instance judges other rows alive: a row whose owner and counter have not changed
//! for its expiry ([`Expiry`]: the lease duration for a shard's row, the worker timeout for an
//! instance's worker row), measured on this instance's own monotonic clock, has expired. No
//! other host's clock is trusted.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use crate::lease::Lease;

/// How long a row may stay unchanged before it has expired: a shard's lease row the lease
/// duration, an instance's worker row the (shorter) worker timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Expiry {
    pub(crate) lease: Duration,
    pub(crate) worker: Duration,
}

impl Expiry {
    /// The expiry of `row`.
    pub(crate) fn of(&self, row: &Lease) -> Duration {
        if row.shard_id.starts_with(super::plan::WORKER_PREFIX) {
            self.worker
        } else {
            self.lease
        }
    }
}

impl From<Duration> for Expiry {
    /// The same expiry for every row.
    fn from(both: Duration) -> Self {
        Self {
            lease: both,
            worker: both,
        }
    }
}

/// What was last seen of one row, and since when.
#[derive(Debug)]
struct LastChange {
    counter: u64,
    owner: Option<String>,
    since: Instant,
}

/// The rows as seen at each listing.
#[derive(Debug, Default)]
pub(crate) struct Liveness {
    seen: HashMap<String, LastChange>,
}

impl Liveness {
    /// Records the rows of a listing made at `now`; forgets rows that are gone.
    pub(crate) fn observe(&mut self, rows: &BTreeMap<String, Lease>, now: Instant) {
        self.observe_some(rows, now);
        self.seen.retain(|id, _| rows.contains_key(id));
    }

    /// Records some rows read at `now` (the others are left as they were).
    pub(crate) fn observe_some(&mut self, rows: &BTreeMap<String, Lease>, now: Instant) {
        for row in rows.values() {
            let changed = self
                .seen
                .get(&row.shard_id)
                .is_none_or(|seen| seen.counter != row.counter || seen.owner != row.owner);
            if changed {
                self.seen.insert(
                    row.shard_id.clone(),
                    LastChange {
                        counter: row.counter,
                        owner: row.owner.clone(),
                        since: now,
                    },
                );
            }
        }
    }

    /// Forgets a row (it was deleted).
    pub(crate) fn forget(&mut self, id: &str) {
        self.seen.remove(id);
    }

    /// How long until the row expires as of `now` if nobody writes it; `None` for a row
    /// never seen.
    pub(crate) fn remaining(
        &self,
        row: &Lease,
        now: Instant,
        expiry: impl Into<Expiry>,
    ) -> Option<Duration> {
        let expiry = expiry.into().of(row);
        self.seen
            .get(&row.shard_id)
            .map(|seen| expiry.saturating_sub(now.saturating_duration_since(seen.since)))
    }

    /// True when nobody has written the row for its expiry as of `now`.
    pub(crate) fn is_expired(&self, row: &Lease, now: Instant, expiry: impl Into<Expiry>) -> bool {
        let expiry = expiry.into().of(row);
        self.seen
            .get(&row.shard_id)
            .is_some_and(|seen| now.saturating_duration_since(seen.since) >= expiry)
    }
}

/// The instances this one waits on: for each other owner holding shard rows that have not
/// expired, how many it holds and the longest time until they expire if nobody renews them
/// (the most this instance waits for them, should that instance be gone). Worker rows are
/// left out.
pub(crate) fn waiting_on(
    rows: &BTreeMap<String, Lease>,
    me: &str,
    liveness: &Liveness,
    now: Instant,
    lease_duration: Duration,
) -> BTreeMap<String, (usize, Duration)> {
    let mut waits: BTreeMap<String, (usize, Duration)> = BTreeMap::new();
    for row in rows.values() {
        let Some(owner) = row.owner.as_deref() else {
            continue;
        };
        if owner == me || row.shard_id.starts_with(super::plan::WORKER_PREFIX) {
            continue;
        }
        if liveness.is_expired(row, now, lease_duration) {
            continue;
        }
        let left = liveness
            .remaining(row, now, lease_duration)
            .unwrap_or(lease_duration);
        let entry = waits.entry(owner.to_owned()).or_default();
        entry.0 += 1;
        entry.1 = entry.1.max(left);
    }
    waits
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_are_per_other_owner_with_the_longest_time_left() {
        let lease = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut rows = BTreeMap::new();
        for (id, owner) in [
            ("s0", "x"),
            ("s1", "x"),
            ("s2", "me"),
            ("s3", "y"),
            ("worker:x", "x"),
        ] {
            let mut row = Lease::new("s", id, vec![]);
            row.owner = Some(owner.to_owned());
            rows.insert(id.to_owned(), row);
        }
        let mut live = Liveness::default();
        live.observe(&rows, t0);
        // s1 renewed 4 s later: x's leases are gone 14 s after t0 at the latest.
        rows.get_mut("s1").unwrap().counter = 1;
        live.observe(&rows, t0 + Duration::from_secs(4));
        let waits = waiting_on(&rows, "me", &live, t0 + Duration::from_secs(5), lease);
        assert_eq!(
            waits,
            BTreeMap::from([
                ("x".to_owned(), (2, Duration::from_secs(9))),
                ("y".to_owned(), (1, Duration::from_secs(5))),
            ])
        );
        // Once expired, nobody is waited on.
        assert!(waiting_on(&rows, "me", &live, t0 + Duration::from_secs(14), lease).is_empty());
    }

    fn rows(counter: u64, owner: Option<&str>) -> BTreeMap<String, Lease> {
        let mut lease = Lease::new("s", "0", vec![]);
        lease.counter = counter;
        lease.owner = owner.map(str::to_owned);
        [("0".to_owned(), lease)].into_iter().collect()
    }

    #[test]
    fn a_row_expires_a_lease_duration_after_it_last_changed_on_this_clock() {
        let lease = Duration::from_secs(10);
        let t0 = Instant::now();
        let mut live = Liveness::default();
        let seen = rows(1, Some("a"));
        live.observe(&seen, t0);
        let row = &seen["0"];
        assert!(!live.is_expired(row, t0 + Duration::from_secs(9), lease));
        assert!(live.is_expired(row, t0 + lease, lease));
        // A renewal seen later restarts the count, whatever the time on the writer's clock.
        let renewed = rows(2, Some("a"));
        live.observe(&renewed, t0 + Duration::from_secs(9));
        assert!(!live.is_expired(&renewed["0"], t0 + lease, lease));
        // Seeing the same row again does not.
        live.observe(&renewed, t0 + Duration::from_secs(15));
        assert!(live.is_expired(&renewed["0"], t0 + Duration::from_secs(19), lease));
        // A row never seen is not judged expired; a row gone is forgotten.
        live.observe(&BTreeMap::new(), t0);
        assert!(!live.is_expired(&renewed["0"], t0 + Duration::from_secs(60), lease));
    }

    #[test]
    fn a_worker_row_expires_after_the_worker_timeout_and_a_lease_after_the_lease_duration() {
        let expiry = Expiry {
            lease: Duration::from_secs(10),
            worker: Duration::from_secs(4),
        };
        let t0 = Instant::now();
        let mut rows = rows(1, Some("a"));
        let mut worker = Lease::new(
            "s",
            format!("{}a", super::super::plan::WORKER_PREFIX),
            vec![],
        );
        worker.owner = Some("a".to_owned());
        rows.insert(worker.shard_id.clone(), worker.clone());
        let mut live = Liveness::default();
        live.observe(&rows, t0);
        let later = t0 + Duration::from_secs(4);
        assert!(live.is_expired(&worker, later, expiry));
        assert!(!live.is_expired(&rows["0"], later, expiry));
        assert_eq!(
            live.remaining(&rows["0"], later, expiry),
            Some(Duration::from_secs(6))
        );
    }
}
