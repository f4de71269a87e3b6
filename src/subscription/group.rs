//! A liveness group: the streams of one [`MultiSubscription`](crate::MultiSubscription)
//! are judged alive by one worker row, their *anchor* stream's, so the other instances watch
//! that row instead of one per stream.
//!
//! * **This instance's side.** Every reader, of every stream, stops once the anchor stream's
//!   worker row is stale, as it does once its own stream's row is. Every worker row of the
//!   group names the anchor and the group ([`Lease::liveness_group`](crate::lease::Lease),
//!   `anchor/id`). When the anchor's row was declared gone, every stream drops its shards
//!   before reading on: the others may have released its row too.
//! * **The others' side.** Another instance's row that names an anchor this instance reads
//!   too is watched there, by the anchor stream's coordinator, for every stream; the others
//!   skip it while that read keeps confirming it. When the anchor's row is declared gone (by
//!   this instance, or seen released by anyone), the other streams' coordinators release that
//!   group's rows of their streams, and every instance takes its shards at once, as for one
//!   stream.
//! * **The roster.** Every roster move also moves one table-wide roster row; one coordinator
//!   of a group (the *lead*, its first stream by name) reads only that row, and each stream's
//!   coordinator reads its own roster row only when the table-wide one moved.
//!
//! So the watch reads of an instance grow with the instances it watches, not with the number
//! of streams it reads.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::gate::WorkerGate;

/// The pseudo-stream of the table-wide rows (no Kinesis stream name has parentheses).
pub(crate) const TABLE_ROWS: &str = "(table)";

/// Another instance's group: its owner and its group id.
pub(crate) type GroupKey = (String, String);

/// The liveness group of one instance's streams.
#[derive(Debug)]
pub(crate) struct LivenessGroup {
    /// The anchor stream: the first of the set at the start.
    anchor: Option<Arc<str>>,
    /// Written into every worker row of the group: `anchor/id`.
    pub(crate) id: String,
    /// The anchor stream's worker gate, which every reader asks too.
    pub(crate) anchor_gate: Arc<WorkerGate>,
    /// Every stream's worker gate (closed when the anchor's row was declared gone).
    gates: Mutex<Vec<Weak<WorkerGate>>>,
    hub: Mutex<Hub>,
}

/// What the streams' coordinators tell each other.
#[derive(Debug, Default)]
struct Hub {
    /// The streams of this group running now.
    members: BTreeSet<Arc<str>>,
    /// For each other group: the streams whose ring holds one of its worker rows.
    seen: BTreeMap<GroupKey, BTreeSet<Arc<str>>>,
    /// When each other group's anchor row was last read fresh.
    confirmed: HashMap<GroupKey, Instant>,
    /// Other groups declared gone: when this instance learnt it, and the streams that have
    /// not released their rows of it yet.
    gone: HashMap<GroupKey, (Instant, BTreeSet<Arc<str>>)>,
    /// Other groups whose anchor row was seen released and acted on: not again until it is
    /// seen held again.
    handled: HashSet<GroupKey>,
    /// The table-wide roster counter as the lead last read it (`None`: never read).
    roster: Option<Option<u64>>,
}

/// The anchor stream named by a worker row's liveness group (`anchor/id`).
pub(crate) fn anchor_of(group: &str) -> Option<&str> {
    group.split_once('/').map(|(anchor, _)| anchor)
}

impl LivenessGroup {
    /// A new group anchored on `anchor`; `give_up_after`: how long after its last write
    /// sent the anchor's row is stale for this instance's readers.
    pub(crate) fn new(anchor: Option<Arc<str>>, give_up_after: Duration) -> Self {
        let id = format!("{}/{}", anchor.as_deref().unwrap_or(""), fresh_id());
        Self {
            anchor,
            id,
            anchor_gate: Arc::new(WorkerGate::new(give_up_after)),
            gates: Mutex::new(Vec::new()),
            hub: Mutex::new(Hub::default()),
        }
    }

    /// The worker gate of `stream`'s coordinator, and the anchor's gate its readers ask too
    /// (`None` for the anchor itself, whose own gate it is).
    pub(crate) fn gates_for(
        &self,
        stream: &str,
        give_up_after: Duration,
    ) -> (Arc<WorkerGate>, Option<Arc<WorkerGate>>) {
        if self.anchor.as_deref() == Some(stream) {
            return (self.anchor_gate.clone(), None);
        }
        let gate = Arc::new(WorkerGate::new(give_up_after));
        let mut gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        gates.retain(|g| g.strong_count() > 0);
        gates.push(Arc::downgrade(&gate));
        (gate, Some(self.anchor_gate.clone()))
    }

    /// True when `stream` is the anchor.
    pub(crate) fn is_anchor(&self, stream: &str) -> bool {
        self.anchor.as_deref() == Some(stream)
    }

    /// The anchor's row was declared gone: every stream's gate closes until its coordinator
    /// dropped its shards.
    pub(crate) fn anchor_lost(&self) {
        self.anchor_gate.lost();
        let gates = self.gates.lock().unwrap_or_else(PoisonError::into_inner);
        for gate in gates.iter().filter_map(Weak::upgrade) {
            gate.lost();
        }
    }

    fn hub(&self) -> MutexGuard<'_, Hub> {
        self.hub.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `stream`'s coordinator started.
    pub(crate) fn join(&self, stream: &Arc<str>) {
        self.hub().members.insert(stream.clone());
    }

    /// `stream`'s coordinator ended: it watches nothing any more.
    pub(crate) fn leave(&self, stream: &str) {
        let mut hub = self.hub();
        hub.members.remove(stream);
        for streams in hub.seen.values_mut() {
            streams.remove(stream);
        }
        hub.seen.retain(|_, streams| !streams.is_empty());
    }

    /// True when `stream` reads the table-wide roster row for the group.
    pub(crate) fn is_lead(&self, stream: &str) -> bool {
        self.hub().members.first().is_some_and(|s| &**s == stream)
    }

    /// `stream`'s listing saw these other groups' worker rows held.
    pub(crate) fn listed(&self, stream: &Arc<str>, groups: impl IntoIterator<Item = GroupKey>) {
        let mut hub = self.hub();
        for streams in hub.seen.values_mut() {
            streams.remove(stream);
        }
        for key in groups {
            hub.seen.entry(key).or_default().insert(stream.clone());
        }
        hub.seen.retain(|_, streams| !streams.is_empty());
    }

    /// The other groups whose anchor is `stream`: its coordinator reads their rows for
    /// every stream.
    pub(crate) fn watched_by(&self, stream: &str) -> Vec<GroupKey> {
        let hub = self.hub();
        hub.seen
            .keys()
            .filter(|(_, group)| anchor_of(group) == Some(stream))
            .cloned()
            .collect()
    }

    /// True when `stream`'s coordinator need not read `key`'s row of its stream: this
    /// instance reads `key`'s anchor stream, which read the row fresh within `fresh`.
    pub(crate) fn covered(
        &self,
        key: &GroupKey,
        stream: &str,
        now: Instant,
        fresh: Duration,
    ) -> bool {
        let hub = self.hub();
        anchor_of(&key.1)
            .is_some_and(|anchor| anchor != stream && hub.members.iter().any(|m| &**m == anchor))
            && hub
                .confirmed
                .get(key)
                .is_some_and(|at| now.saturating_duration_since(*at) < fresh)
    }

    /// The watching coordinator read `key`'s row fresh at `at`.
    pub(crate) fn confirm(&self, key: GroupKey, at: Instant) {
        let mut hub = self.hub();
        hub.handled.remove(&key);
        hub.confirmed.insert(key, at);
    }

    /// `key` was declared gone in `stream` (its watched row released): every other stream
    /// whose ring holds it releases the group's row of its stream once.
    /// Once per release: a row seen released again is not acted on again until it was seen
    /// held meanwhile.
    pub(crate) fn gone(&self, key: GroupKey, stream: &str, at: Instant) {
        let mut hub = self.hub();
        hub.confirmed.remove(&key);
        if !hub.handled.insert(key.clone()) {
            return;
        }
        let mut pending = hub.seen.get(&key).cloned().unwrap_or_default();
        pending.retain(|s| &**s != stream);
        if !pending.is_empty() {
            hub.gone.insert(key, (at, pending));
        }
    }

    /// The groups declared gone whose rows `stream` has still to release (an entry older
    /// than `keep` is dropped: its streams left or could not release it).
    pub(crate) fn gone_in(&self, stream: &str, now: Instant, keep: Duration) -> Vec<GroupKey> {
        let mut hub = self.hub();
        hub.gone
            .retain(|_, (at, _)| now.saturating_duration_since(*at) < keep);
        hub.gone
            .iter()
            .filter(|(_, (_, pending))| pending.iter().any(|s| &**s == stream))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// `stream` released its row of `key` (or found none to release).
    pub(crate) fn released(&self, key: &GroupKey, stream: &str) {
        let mut hub = self.hub();
        if let Some((_, pending)) = hub.gone.get_mut(key) {
            pending.retain(|s| &**s != stream);
            if pending.is_empty() {
                hub.gone.remove(key);
            }
        }
    }

    /// The table-wide roster counter as last read (`None`: never read).
    pub(crate) fn roster(&self) -> Option<Option<u64>> {
        self.hub().roster
    }

    /// The lead read the table-wide roster row.
    pub(crate) fn set_roster(&self, counter: Option<u64>) {
        self.hub().roster = Some(counter);
    }
}

/// A group id unique to this start: the process id and a random suffix.
fn fresh_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    format!("{}-{:016x}", std::process::id(), hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(owner: &str, anchor: &str) -> GroupKey {
        (owner.to_owned(), format!("{anchor}/{owner}-1"))
    }

    fn group(streams: &[&str]) -> (LivenessGroup, Vec<Arc<str>>) {
        let names: Vec<Arc<str>> = streams.iter().map(|s| Arc::from(*s)).collect();
        let group = LivenessGroup::new(names.first().cloned(), Duration::from_secs(2));
        for name in &names {
            group.join(name);
        }
        (group, names)
    }

    #[test]
    fn another_group_is_watched_by_its_anchor_stream_and_skipped_by_the_others() {
        let (group, s) = group(&["a", "b"]);
        assert!(group.is_lead("a") && !group.is_lead("b"));
        assert!(group.id.starts_with("a/") && anchor_of(&group.id) == Some("a"));
        group.listed(&s[1], [key("x", "a"), key("y", "b"), key("z", "c")]);
        group.listed(&s[0], [key("x", "a")]);
        assert_eq!(group.watched_by("a"), [key("x", "a")]);
        assert_eq!(group.watched_by("b"), [key("y", "b")]);
        let now = Instant::now();
        let fresh = Duration::from_secs(1);
        assert!(
            !group.covered(&key("x", "a"), "b", now, fresh),
            "not read yet"
        );
        group.confirm(key("x", "a"), now);
        assert!(group.covered(&key("x", "a"), "b", now, fresh));
        assert!(
            !group.covered(&key("x", "a"), "a", now, fresh),
            "a reads it itself"
        );
        assert!(
            !group.covered(&key("x", "a"), "b", now + fresh, fresh),
            "read too long ago"
        );
        group.confirm(key("z", "c"), now);
        assert!(
            !group.covered(&key("z", "c"), "b", now, fresh),
            "c is not read here"
        );
        // The anchor left: nothing is skipped any more.
        group.leave("a");
        assert!(!group.covered(&key("x", "a"), "b", now, fresh));
        assert!(group.is_lead("b"));
    }

    #[test]
    fn a_group_declared_gone_is_released_once_in_every_other_stream_that_saw_it() {
        let (group, s) = group(&["a", "b", "c"]);
        group.listed(&s[0], [key("x", "a")]);
        group.listed(&s[1], [key("x", "a")]);
        group.listed(&s[2], [key("y", "a")]);
        let now = Instant::now();
        group.confirm(key("x", "a"), now);
        group.gone(key("x", "a"), "a", now);
        let keep = Duration::from_secs(5);
        assert!(
            !group.covered(&key("x", "a"), "b", now, keep),
            "no longer confirmed"
        );
        assert!(
            group.gone_in("a", now, keep).is_empty(),
            "a released it itself"
        );
        assert_eq!(group.gone_in("b", now, keep), [key("x", "a")]);
        assert!(group.gone_in("c", now, keep).is_empty());
        assert!(
            group.gone_in("b", now + keep, keep).is_empty(),
            "given up on"
        );
        group.gone(key("x", "a"), "a", now);
        assert!(
            group.gone_in("b", now, keep).is_empty(),
            "seen released again: no news"
        );
        group.confirm(key("x", "a"), now);
        group.gone(key("x", "a"), "a", now);
        group.released(&key("x", "a"), "b");
        assert!(group.gone_in("b", now, keep).is_empty(), "released once");
    }

    #[test]
    fn the_anchors_row_declared_gone_closes_every_streams_gate_until_each_forgot() {
        let (group, _) = group(&["a", "b"]);
        let give_up = Duration::from_secs(2);
        let (a, a_anchor) = group.gates_for("a", give_up);
        let (b, b_anchor) = group.gates_for("b", give_up);
        assert!(a_anchor.is_none() && Arc::ptr_eq(&a, &group.anchor_gate));
        assert!(b_anchor.is_some_and(|g| Arc::ptr_eq(&g, &group.anchor_gate)));
        let now = Instant::now();
        a.renewed(now);
        b.renewed(now);
        assert!(a.is_open(now) && b.is_open(now));
        group.anchor_lost();
        assert!(!a.is_open(now) && !b.is_open(now));
        assert!(a.must_forget() && b.must_forget());
        b.renewed(now);
        assert!(
            !b.is_open(now),
            "a write before the shards are dropped does not count"
        );
        b.forgot();
        b.renewed(now);
        assert!(b.is_open(now));
    }
}
