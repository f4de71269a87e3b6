//! Watching the other instances between listings, so a crashed one is noticed within a
//! second of the lease duration rather than at the first listing after its leases expired.
//!
//! Each instance reads a few rows many times a second ([`watch_interval`]): the worker rows of
//! the next [`WATCHED`] instances after it in owner order (a ring, so every instance is watched
//! by that many others and the reads grow with the number of instances, never with the number
//! of shards), and the roster row. What a read means is decided by [`judge`]:
//!
//! * a watched worker row unchanged for the worker timeout on this instance's clock is
//!   *declared gone*: released (owner removed) on condition that it is still as read, after
//!   which every instance may take that owner's leases at once (see [`super::plan::shares`]);
//! * a watched row gone or released by someone else, or a roster row that moved, means the
//!   instances changed: list again now.
//!
//! The roster row is moved by an instance that joined, declared another gone, handed a shard
//! back, finished a shard or stopped, so the others hear of it at their next read instead of
//! at their next listing. Every move also moves a table-wide roster row; in a
//! [`MultiSubscription`](crate::MultiSubscription)'s liveness group the anchor stream reads that
//! one instead of its own, and the watch of the group's other streams reads only what the
//! anchor's does not cover (see [`crate::subscription::group`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::liveness::{Expiry, Liveness};
use super::plan::{ROSTER_ROW, worker_owner};
use super::shared::Shared;
use super::worker::worker_row_id;
use crate::lease::{Lease, LeaseError};
use crate::subscription::group::TABLE_ROWS;

/// How many other instances each instance watches.
pub(crate) const WATCHED: usize = 2;

/// How often the watched rows are read: a thirtieth of the lease duration or a twelfth of
/// the worker timeout, whichever is shorter (a third of a second by default), at least every
/// 20 ms.
pub(crate) fn watch_interval(expiry: Expiry) -> Duration {
    (expiry.lease / 30)
        .min(expiry.worker / 12)
        .max(Duration::from_millis(20))
}

/// The worker rows this instance watches: those of the next [`WATCHED`] live instances after
/// it in owner order, wrapping around (all of them when there are that few).
pub(crate) fn ring(
    rows: &BTreeMap<String, Lease>,
    owner: &str,
    expired: &dyn Fn(&Lease) -> bool,
) -> Vec<String> {
    let live: Vec<&str> = rows
        .values()
        .filter(|row| row.owner.is_some() && !expired(row))
        .filter_map(|row| worker_owner(&row.shard_id))
        .filter(|o| *o != owner)
        .collect();
    let after = live.partition_point(|o| *o < owner);
    live.iter()
        .cycle()
        .skip(after)
        .take(WATCHED.min(live.len()))
        .map(|o| worker_row_id(o))
        .collect()
}

/// What one read of the watched rows means.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdict {
    /// Worker rows to release: their owners are gone.
    pub(crate) declare: Vec<Lease>,
    /// The instances changed: list again now.
    pub(crate) list: bool,
    /// The roster row's counter as read (`None`: no such row yet).
    pub(crate) roster: Option<u64>,
    /// How long until the first watched row would expire, if none changes meanwhile.
    pub(crate) first_expiry: Option<Duration>,
}

/// Judges a read of the `watched` rows and the roster row, made at `now` on this instance's
/// clock, after `liveness` has observed it. `roster_seen` is the roster counter of the
/// previous read (`None` before the first read).
pub(crate) fn judge(
    watched: &[String],
    read: &BTreeMap<String, Lease>,
    roster_seen: Option<Option<u64>>,
    liveness: &Liveness,
    now: Instant,
    expiry: impl Into<Expiry>,
) -> Verdict {
    let expiry = expiry.into();
    let mut verdict = Verdict {
        roster: read.get(ROSTER_ROW).map(|row| row.counter),
        ..Verdict::default()
    };
    verdict.list = roster_seen.is_some_and(|seen| seen != verdict.roster);
    for id in watched {
        match read.get(id) {
            None => verdict.list = true,
            Some(row) if row.owner.is_none() => verdict.list = true,
            Some(row) if liveness.is_expired(row, now, expiry) => {
                verdict.declare.push(row.clone());
            }
            Some(row) => {
                let left = liveness.remaining(row, now, expiry);
                verdict.first_expiry = verdict.first_expiry.min(left).or(left);
            }
        }
    }
    verdict
}

/// The watch's state in the coordinator.
#[derive(Debug)]
pub(crate) struct Watch {
    /// The worker rows watched (from the last listing).
    pub(crate) ring: Vec<String>,
    /// Those rows as that listing read them (a liveness group's other streams leave out, at
    /// each read, the rows the anchor's watch has come to cover since).
    pub(crate) ring_rows: BTreeMap<String, Lease>,
    /// A read or a declaration is under way.
    pub(crate) busy: bool,
    /// When the next read starts.
    pub(crate) next: Instant,
    /// The roster counter of the last read; `None` before the first.
    pub(crate) roster: Option<Option<u64>>,
    /// This instance is moving the roster row.
    pub(crate) moving: bool,
    /// Move it once more when the current move is done.
    pub(crate) move_again: bool,
    /// In a liveness group, for a stream other than the anchor: the group's news (moves of
    /// the table-wide roster row) as of this stream's last read of its own roster row.
    pub(crate) news_seen: Option<u64>,
    /// In a liveness group: the group's declarations this stream has listed for.
    pub(crate) declarations_seen: u64,
    /// In a liveness group: the declarations by others the anchor saw, listed for.
    pub(crate) observed_seen: u64,
}

impl Default for Watch {
    fn default() -> Self {
        Self {
            ring: Vec::new(),
            ring_rows: BTreeMap::new(),
            busy: false,
            next: Instant::now(),
            roster: None,
            moving: false,
            move_again: false,
            news_seen: None,
            declarations_seen: 0,
            observed_seen: 0,
        }
    }
}

/// What one watch read asks for.
#[derive(Debug, Default)]
pub(crate) struct WatchPlan {
    /// Worker rows of this stream.
    pub(crate) ring: Vec<String>,
    /// This stream's roster row too.
    pub(crate) roster: bool,
    /// The table-wide roster row too (a liveness group's anchor).
    pub(crate) table_roster: bool,
    /// The group's news when the read was planned.
    pub(crate) news: Option<u64>,
}

impl WatchPlan {
    /// True when the read needs no call.
    pub(crate) fn is_empty(&self) -> bool {
        self.ring.is_empty() && !self.roster && !self.table_roster
    }
}

/// What one watch read found.
#[derive(Debug, Default)]
pub(crate) struct WatchRead {
    /// What was asked for.
    pub(crate) plan: WatchPlan,
    /// The rows of this stream read, by id.
    pub(crate) rows: BTreeMap<String, Lease>,
    /// The table-wide roster counter, when it was read (`Some(None)`: no such row).
    pub(crate) table_roster: Option<Option<u64>>,
}

/// Reads what `plan` asks for.
pub(crate) async fn read(shared: Arc<Shared>, plan: WatchPlan) -> Result<WatchRead, LeaseError> {
    let mut ids = plan.ring.clone();
    if plan.roster {
        ids.push(ROSTER_ROW.to_owned());
    }
    let mut read = WatchRead::default();
    if !ids.is_empty() {
        let rows = shared.store.get(&shared.stream, &ids).await?;
        read.rows = rows.into_iter().map(|r| (r.shard_id.clone(), r)).collect();
    }
    if plan.table_roster {
        let ids = [ROSTER_ROW.to_owned()];
        let row = shared.store.get(TABLE_ROWS, &ids).await?.pop();
        read.table_roster = Some(row.map(|row| row.counter));
    }
    read.plan = plan;
    Ok(read)
}

/// Declares the owner of `row` gone: releases its worker row on condition that it is still
/// as read, then bumps the roster row so every instance lists again.
pub(crate) async fn declare(shared: Arc<Shared>, row: Lease) -> Result<(), LeaseError> {
    shared.store.release(&row).await?;
    bump_roster(&shared).await;
    Ok(())
}

/// Moves the stream's roster row's counter, then the table-wide one's (creating each row
/// when missing), so that instances reading several streams hear of it through that one row.
/// Failures are only logged: the others then learn of the change at their next listing.
pub(crate) async fn bump_roster(shared: &Shared) {
    bump_roster_of(shared, &shared.stream).await;
    bump_roster_of(shared, TABLE_ROWS).await;
}

async fn bump_roster_of(shared: &Shared, stream: &str) {
    let owner = shared.config.owner.as_str();
    let bumped = async {
        let ids = [ROSTER_ROW.to_owned()];
        match shared.store.get(stream, &ids).await?.pop() {
            Some(row) => shared.store.take(&row, owner).await.map(drop),
            None => {
                let mut row = Lease::new(stream, ROSTER_ROW, Vec::new());
                row.owner = Some(owner.to_owned());
                shared.store.create(&row).await.map(drop)
            }
        }
    };
    match bumped.await {
        // Someone else moved it at the same time: just as good.
        Err(e) if e.is_lost() => {}
        Err(e) => {
            tracing::debug!(error = %e, "could not move the roster row; the others notice at their next listing");
        }
        Ok(()) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(owner: &str, counter: u64, held: bool) -> Lease {
        let mut row = Lease::new("s", worker_row_id(owner), vec![]);
        row.counter = counter;
        row.owner = held.then(|| owner.to_owned());
        row
    }

    fn table(rows: Vec<Lease>) -> BTreeMap<String, Lease> {
        rows.into_iter().map(|r| (r.shard_id.clone(), r)).collect()
    }

    fn never(_: &Lease) -> bool {
        false
    }

    #[test]
    fn each_instance_watches_the_next_two_live_ones_in_a_ring() {
        let rows = table(vec![
            worker("a", 1, true),
            worker("b", 1, true),
            worker("c", 1, true),
            worker("d", 1, false),
            worker("e", 1, true),
            Lease::new("s", ROSTER_ROW, vec![]),
            Lease::new("s", "shardId-1", vec![]),
        ]);
        assert_eq!(ring(&rows, "a", &never), ["worker:b", "worker:c"]);
        assert_eq!(ring(&rows, "c", &never), ["worker:e", "worker:a"]);
        assert_eq!(ring(&rows, "e", &never), ["worker:a", "worker:b"]);
        // An instance not in the table yet watches the ones after its place.
        assert_eq!(ring(&rows, "bb", &never), ["worker:c", "worker:e"]);
        let expired = |row: &Lease| row.shard_id == "worker:b";
        assert_eq!(ring(&rows, "a", &expired), ["worker:c", "worker:e"]);
        let two = table(vec![worker("a", 1, true), worker("b", 1, true)]);
        assert_eq!(ring(&two, "a", &never), ["worker:b"]);
        assert!(ring(&table(vec![worker("a", 1, true)]), "a", &never).is_empty());
    }

    #[test]
    fn a_watched_row_unchanged_for_the_lease_duration_is_declared_gone() {
        let lease = Duration::from_secs(10);
        let t0 = Instant::now();
        let watched = vec!["worker:b".to_owned(), "worker:c".to_owned()];
        let read = table(vec![worker("b", 4, true), worker("c", 7, true)]);
        let mut live = Liveness::default();
        live.observe_some(&read, t0);
        let verdict = judge(&watched, &read, None, &live, t0, lease);
        assert_eq!(verdict.first_expiry, Some(lease));
        assert!(verdict.declare.is_empty() && !verdict.list);
        // c renews; b does not.
        let later = t0 + Duration::from_secs(4);
        let read = table(vec![worker("b", 4, true), worker("c", 8, true)]);
        live.observe_some(&read, later);
        let verdict = judge(&watched, &read, Some(None), &live, later, lease);
        assert_eq!(verdict.first_expiry, Some(Duration::from_secs(6)));
        let at = t0 + lease;
        live.observe_some(&read, at);
        let verdict = judge(&watched, &read, Some(None), &live, at, lease);
        assert_eq!(verdict.declare, vec![worker("b", 4, true)]);
        assert!(!verdict.list);
    }

    #[test]
    fn a_watched_row_gone_or_released_or_a_moved_roster_means_list_again() {
        let lease = Duration::from_secs(10);
        let now = Instant::now();
        let watched = vec!["worker:b".to_owned()];
        let mut live = Liveness::default();
        let gone = table(vec![]);
        assert!(judge(&watched, &gone, None, &live, now, lease).list);
        let released = table(vec![worker("b", 5, false)]);
        live.observe_some(&released, now);
        let verdict = judge(&watched, &released, None, &live, now + lease, lease);
        assert!(verdict.list && verdict.declare.is_empty());
        let mut roster = Lease::new("s", ROSTER_ROW, vec![]);
        roster.counter = 3;
        let read = table(vec![worker("b", 5, true), roster]);
        live.observe_some(&read, now);
        let first = judge(&watched, &read, None, &live, now, lease);
        assert_eq!((first.list, first.roster), (false, Some(3)));
        assert!(!judge(&watched, &read, Some(Some(3)), &live, now, lease).list);
        assert!(judge(&watched, &read, Some(Some(2)), &live, now, lease).list);
        assert!(judge(&watched, &read, Some(None), &live, now, lease).list);
    }

    #[test]
    fn the_watch_reads_a_few_times_a_second() {
        let expiry = |lease: u64, worker: u64| Expiry {
            lease: Duration::from_millis(lease),
            worker: Duration::from_millis(worker),
        };
        let third = Duration::from_millis(333) + Duration::from_nanos(333_333);
        assert_eq!(watch_interval(expiry(10_000, 4_000)), third);
        assert_eq!(watch_interval(expiry(300, 300)), Duration::from_millis(20));
        // A long lease: the worker timeout still sets the pace.
        assert_eq!(watch_interval(expiry(600_000, 4_000)), third);
    }
}
