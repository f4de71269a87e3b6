//! A liveness group: the streams one instance reads as a [`MultiSubscription`], judged alive
//! by one worker row, that of the group's *anchor* stream (the first of the set), so that the
//! other instances watch one row per instance instead of one per stream and instance.
//!
//! * **This instance.** Every worker row it writes names the group (`<anchor>/<id>`, a new id
//!   at each start). Every reader, of every stream, also answers to the anchor row's gate: it
//!   stops once that row is stale (as for its own stream's row), and for good once the row was
//!   lost, that is declared gone by another instance (the gate's epoch moved since the shard
//!   was taken). Each stream's coordinator then drops its shards before it reads on.
//! * **The others.** A listing of stream `t` that finds another instance's worker row naming a
//!   group anchored elsewhere reads that anchor row *after* the listing: when it is released
//!   and names the same group, the instance was declared gone, and its leases in `t` are free
//!   at once (see `listing::declared_elsewhere`). A row that vanished or names another group
//!   (a restart) is not taken as a declaration: those leases wait for their expiry. Nothing is
//!   ever written into another stream's rows. Because the anchor row is read after the listing,
//!   a lease taken after the instance came back is never freed by an old declaration: the
//!   instance took its anchor row again before it took anything.
//! * **The watch.** Only the anchor stream's coordinator watches rows every third of a second:
//!   its ring's worker rows, its roster row, and the table-wide roster row, which every roster
//!   move moves too. Another stream's coordinator watches only the rows its ring holds that the
//!   anchor's watch does not cover (instances that read the anchor stream under a group
//!   anchored on it), and reads its own roster row only when the table-wide one moved. In a
//!   fleet whose instances all read the same set, the watch reads of an instance do not grow
//!   with the number of streams.
//!
//! [`MultiSubscription`]: crate::MultiSubscription

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::gate::WorkerGate;
use crate::lease::{Lease, WORKER_ROW_PREFIX};

/// The pseudo-stream of the table-wide rows (no Kinesis stream name has parentheses).
pub(crate) const TABLE_ROWS: &str = "(table)";

/// The anchor stream a worker row's group names (`<anchor>/<id>`).
pub(crate) fn anchor_of(group: &str) -> Option<&str> {
    group.rsplit_once('/').map(|(anchor, _)| anchor)
}

/// The liveness group of one instance's streams.
#[derive(Debug)]
pub(crate) struct LivenessGroup {
    anchor: Arc<str>,
    id: String,
    /// The anchor stream's worker gate: every reader of the group asks it too.
    gate: Arc<WorkerGate>,
    /// Moves when the streams should read their own roster row (the table-wide one moved).
    news: AtomicU64,
    /// Moves when this instance declared another gone: every stream lists and moves its
    /// roster row, so the others take that instance's shards of every stream at once.
    declared: AtomicU64,
    /// Moves when the anchor's listing saw an instance it covered declared gone by another:
    /// every stream lists (without moving its roster row: the declarer moved them).
    observed: AtomicU64,
    /// The anchor stream stopped: the group is no more (see [`LivenessGroup::dissolve`]).
    dissolved: AtomicBool,
    hub: Mutex<Hub>,
}

#[derive(Debug, Default)]
struct Hub {
    /// The streams of the group running here.
    members: BTreeSet<Arc<str>>,
    /// The live worker rows of the anchor stream at its last listing: owner to group.
    anchored: HashMap<String, String>,
    /// The table-wide roster counter as last read (`None`: never read).
    table_roster: Option<Option<u64>>,
}

impl LivenessGroup {
    /// A group anchored on `anchor`; `give_up_after`: how long after the last write of the
    /// anchor row was sent its gate stays open.
    pub(crate) fn new(anchor: Arc<str>, give_up_after: Duration) -> Self {
        let id = format!("{anchor}/{}", fresh_id());
        Self {
            anchor,
            id,
            gate: Arc::new(WorkerGate::new(give_up_after)),
            news: AtomicU64::new(0),
            declared: AtomicU64::new(0),
            observed: AtomicU64::new(0),
            dissolved: AtomicBool::new(false),
            hub: Mutex::new(Hub::default()),
        }
    }

    fn hub(&self) -> MutexGuard<'_, Hub> {
        self.hub.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The group as written into every worker row of the instance; `None` once dissolved.
    pub(crate) fn id(&self) -> Option<&str> {
        (!self.is_dissolved()).then_some(self.id.as_str())
    }

    /// True when `stream` is the anchor (of a group not dissolved).
    pub(crate) fn is_anchor(&self, stream: &str) -> bool {
        !self.is_dissolved() && *self.anchor == *stream
    }

    /// True once the anchor stream stopped.
    pub(crate) fn is_dissolved(&self) -> bool {
        self.dissolved.load(Ordering::SeqCst)
    }

    /// The anchor stream stopped while others may go on (removed from the set, deleted, or
    /// the whole subscription stopping): the group is no more. Its streams watch their own
    /// rings again, and write their worker rows without the group before they take anything
    /// (see `Coordinator::worker_row_current`). `row_deleted`: the anchor row was deleted by
    /// this instance, so it can never be found released under the group; otherwise (found
    /// written by another, or not deleted) it may be, and every reader of the group's epoch
    /// so far stops for good, its shards dropped.
    pub(crate) fn dissolve(&self, row_deleted: bool) {
        if !row_deleted {
            self.gate.lost();
        }
        self.dissolved.store(true, Ordering::SeqCst);
        self.gate.unbind();
        self.hub().anchored.clear();
        self.declared_one();
    }

    /// The anchor stream's worker gate.
    pub(crate) fn gate(&self) -> &Arc<WorkerGate> {
        &self.gate
    }

    /// `stream`'s coordinator started.
    pub(crate) fn join(&self, stream: &Arc<str>) {
        self.hub().members.insert(stream.clone());
    }

    /// True when streams other than the anchor run here (they need the table-wide roster).
    pub(crate) fn has_others(&self) -> bool {
        self.hub().members.iter().any(|m| !self.is_anchor(m))
    }

    /// `stream`'s coordinator ended.
    pub(crate) fn leave(&self, stream: &str) {
        let mut hub = self.hub();
        hub.members.remove(stream);
        if self.is_anchor(stream) {
            hub.anchored.clear();
        }
    }

    /// The anchor stream listed these rows; `expired`: rows nobody wrote for their expiry.
    pub(crate) fn anchor_listed(
        &self,
        rows: &BTreeMap<String, Lease>,
        expired: &dyn Fn(&Lease) -> bool,
    ) {
        let anchored: HashMap<String, String> = rows
            .values()
            .filter(|row| row.shard_id.len() > WORKER_ROW_PREFIX.len())
            .filter(|row| row.shard_id.starts_with(WORKER_ROW_PREFIX) && !expired(row))
            .filter_map(|row| Some((row.owner.clone()?, row.liveness_group.clone()?)))
            .collect();
        let before = std::mem::replace(&mut self.hub().anchored, anchored);
        // An instance of a group this one watched was declared gone by another (a plain
        // `Subscription` of the anchor stream, say): every stream lists.
        let declared = before.iter().any(|(owner, group)| {
            rows.get(&format!("{WORKER_ROW_PREFIX}{owner}"))
                .is_some_and(|row| {
                    row.owner.is_none() && row.liveness_group.as_ref() == Some(group)
                })
        });
        if declared {
            self.observed.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// True when another instance's worker row `row` (of a stream other than the anchor) is
    /// watched through its anchor row by this group's anchor watch: it names a group
    /// anchored on this group's anchor, which runs here and listed that instance's anchor
    /// row live under that group.
    pub(crate) fn covers(&self, row: &Lease) -> bool {
        let (Some(owner), Some(group)) = (&row.owner, &row.liveness_group) else {
            return false;
        };
        if self.is_dissolved() {
            return false;
        }
        if anchor_of(group) != Some(&*self.anchor) {
            return false;
        }
        let hub = self.hub();
        hub.members.contains(&self.anchor) && hub.anchored.get(owner) == Some(group)
    }

    /// The anchor's watch read the table-wide roster counter: the streams read their own
    /// roster row when it moved.
    pub(crate) fn table_roster_read(&self, counter: Option<u64>) {
        let mut hub = self.hub();
        if hub.table_roster.is_some_and(|seen| seen != counter) {
            self.news.fetch_add(1, Ordering::SeqCst);
        }
        hub.table_roster = Some(counter);
    }

    /// How often the table-wide roster row was seen moving.
    pub(crate) fn news(&self) -> u64 {
        self.news.load(Ordering::SeqCst)
    }

    /// This instance declared another gone (through the anchor stream), or the group
    /// dissolved.
    pub(crate) fn declared_one(&self) {
        self.declared.fetch_add(1, Ordering::SeqCst);
    }

    /// How often the anchor's listing saw an instance it covered declared gone by another.
    pub(crate) fn observed(&self) -> u64 {
        self.observed.load(Ordering::SeqCst)
    }

    /// How many instances this one declared gone so far.
    pub(crate) fn declarations(&self) -> u64 {
        self.declared.load(Ordering::SeqCst)
    }
}

/// A group id unique to this start: the process id and a random suffix.
fn fresh_id() -> String {
    format!(
        "{}-{:016x}",
        std::process::id(),
        crate::jitter::unpredictable()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker(owner: &str, group: Option<&str>) -> Lease {
        let mut row = Lease::new("a", format!("worker:{owner}"), vec![]);
        row.owner = Some(owner.to_owned());
        row.liveness_group = group.map(str::to_owned);
        row
    }

    #[test]
    fn a_row_is_covered_only_while_the_anchor_runs_here_and_listed_it_under_that_group() {
        let group = LivenessGroup::new("a".into(), Duration::from_secs(2));
        let id = group.id().unwrap();
        assert!(id.starts_with("a/") && anchor_of(id) == Some("a"));
        let x = worker("x", Some("a/x-1"));
        let rows: BTreeMap<String, Lease> = [
            x.clone(),
            worker("y", Some("a/y-1")),
            worker("z", None),
            Lease::new("a", "worker:", vec![]),
        ]
        .into_iter()
        .map(|r| (r.shard_id.clone(), r))
        .collect();
        group.anchor_listed(&rows, &|row| row.shard_id == "worker:y");
        assert!(!group.covers(&x), "the anchor does not run here");
        group.join(&Arc::from("a"));
        assert!(group.covers(&x));
        assert!(!group.covers(&worker("y", Some("a/y-1"))), "expired there");
        assert!(!group.covers(&worker("x", Some("a/x-2"))), "another start");
        assert!(
            !group.covers(&worker("x", Some("b/x-1"))),
            "anchored elsewhere"
        );
        assert!(!group.covers(&worker("z", None)), "no group");
        group.leave("a");
        assert!(!group.covers(&x));
    }

    #[test]
    fn a_dissolved_group_names_nothing_covers_nothing_and_closes_the_old_epoch_if_need_be() {
        let now = tokio::time::Instant::now();
        for row_deleted in [true, false] {
            let group = LivenessGroup::new("a".into(), Duration::from_secs(2));
            group.join(&Arc::from("a"));
            let x = worker("x", Some("a/x-1"));
            let rows = [(x.shard_id.clone(), x.clone())].into_iter().collect();
            group.anchor_listed(&rows, &|_| false);
            let (gate, epoch) = (group.gate(), group.gate().epoch());
            gate.renewed(now);
            let declarations = group.declarations();
            group.dissolve(row_deleted);
            assert_eq!(group.id(), None);
            assert!(!group.is_anchor("a") && !group.covers(&x));
            assert_eq!(group.declarations(), declarations + 1, "every stream lists");
            assert_eq!(
                gate.is_open_in(epoch, now),
                row_deleted,
                "row deleted: {row_deleted}"
            );
            assert!(
                gate.is_open_in(gate.epoch(), now),
                "unbound for new readers"
            );
        }
    }

    #[test]
    fn the_streams_hear_when_the_table_wide_roster_moved() {
        let group = LivenessGroup::new("a".into(), Duration::from_secs(2));
        group.table_roster_read(Some(3));
        assert_eq!(group.news(), 0, "the first read is no news");
        group.table_roster_read(Some(3));
        assert_eq!(group.news(), 0);
        group.table_roster_read(Some(4));
        assert_eq!(group.news(), 1);
        group.table_roster_read(None);
        assert_eq!(group.news(), 2);
    }

    #[test]
    fn a_lost_anchor_row_closes_the_readers_of_its_epoch_for_good() {
        let group = LivenessGroup::new("a".into(), Duration::from_secs(2));
        let now = tokio::time::Instant::now();
        let (gate, epoch) = (group.gate(), group.gate().epoch());
        assert!(gate.is_open_in(epoch, now), "unbound: no anchor row yet");
        gate.renewed(now);
        assert!(gate.is_open_in(epoch, now));
        gate.lost();
        assert!(!gate.is_open_in(epoch, now));
        gate.renewed(now);
        assert!(
            !gate.is_open_in(epoch, now),
            "closed for good to that epoch"
        );
        assert!(gate.is_open_in(gate.epoch(), now));
    }
}
