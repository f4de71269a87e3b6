//! The shard tree and the lease rows: which rows a listing creates, where a shard nobody has
//! read yet begins, and which shards may be read now. Pure functions over the listing and the
//! table, tested without I/O; the coordinator carries their answers out.
//!
//! The rules:
//!
//! * Every listed shard gets a row. A shard whose row is created is either **to be read** or
//!   **passed** (recorded as finished without being read), and that is decided once, by the
//!   instance that creates the row, so every instance agrees.
//! * A new shard with a parent that has a row (or a new parent that is to be read) is a
//!   **descendant**: it is read after its parents, from its beginning (no checkpoint), or from
//!   the start timestamp when its new parents start at one.
//! * Any other new shard is on the **frontier** of what this application reads, and starts at
//!   the position that applies to it: `initial_position(..)`, else `start_at(..)`, else the
//!   tip. At the tip, a closed shard is passed (nothing will arrive in it), and an open one
//!   starts at the time the subscription started ([`Checkpoint::Initial`]).
//! * A shard may be read only once each listed parent is finished (its row says SHARD_END) or
//!   is no longer listed (past the retention period). A parent that is still to be read always
//!   holds its children back, at any depth.
//! * A row recorded for a shard of an earlier stream of the same name (its starting sequence
//!   number differs from the listed shard's) is not the shard's: the shard is not read until
//!   that row is replaced, and the row does not count as its parents' being read past. A
//!   shard whose row is replaced so is new to the application, whose stream was created
//!   again: it is read from its beginning, whatever the position.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::api::ShardDescription;
use crate::lease::Lease;
use crate::position::{Checkpoint, KinesisPosition, StartingPoint};

/// Where shards that nobody has read yet begin.
#[derive(Debug, Clone)]
pub(crate) struct Frontier<'a> {
    /// The position new frontier shards start at (`initial_position`, else `start_at`); `None`
    /// for the tip.
    pub(crate) position: Option<&'a KinesisPosition>,
    /// The time the tip stands for (AT_TIMESTAMP): when the subscription started, or now.
    pub(crate) tip: StartingPoint,
    /// Shards of a stream created again: their row of an earlier stream of the same name is
    /// being replaced, or they began elsewhere at this instance's last listing. Read from
    /// their beginning.
    pub(crate) recreated: &'a HashSet<String>,
}

/// What a new shard's row says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Fate {
    /// To be read, from this checkpoint (`None`: from the beginning, after its parents).
    Read(Option<Checkpoint>),
    /// Never read: recorded as finished.
    Passed,
}

/// The rows to create for the listed shards that have none, parents before children.
pub(crate) fn new_rows(
    stream: &str,
    shards: &[ShardDescription],
    rows: &BTreeMap<String, Lease>,
    frontier: &Frontier<'_>,
) -> Vec<Lease> {
    let tree = Tree::new(shards);
    let mut fates: HashMap<&str, Fate> = HashMap::new();
    let mut order = Vec::new();
    for shard in shards {
        tree.decide(&shard.shard_id, rows, frontier, &mut fates, &mut order);
    }
    order
        .into_iter()
        .map(|id| {
            let shard = tree.shards[id];
            let mut lease = Lease::new(stream, id, shard.parents().map(str::to_owned).collect());
            lease.starting_sequence_number = Some(shard.starting_sequence_number.clone());
            lease.checkpoint = match &fates[id] {
                Fate::Read(checkpoint) => checkpoint.clone(),
                Fate::Passed => Some(Checkpoint::ShardEnd),
            };
            lease
        })
        .collect()
}

/// The listing as a tree: shards by id, and which listed shards name each as a parent.
struct Tree<'a> {
    shards: HashMap<&'a str, &'a ShardDescription>,
    children: HashMap<&'a str, Vec<&'a str>>,
}

impl<'a> Tree<'a> {
    fn new(listed: &'a [ShardDescription]) -> Self {
        let shards: HashMap<&str, &ShardDescription> =
            listed.iter().map(|s| (s.shard_id.as_str(), s)).collect();
        let mut children: HashMap<&str, Vec<&str>> = HashMap::new();
        for shard in listed {
            for parent in shard.parents() {
                children.entry(parent).or_default().push(&shard.shard_id);
            }
        }
        Self { shards, children }
    }

    /// True when the shard is closed: the service says so, or a listed shard descends from it.
    fn is_closed(&self, id: &str) -> bool {
        self.children.contains_key(id)
            || self
                .shards
                .get(id)
                .is_some_and(|s| s.ending_sequence_number.is_some())
    }

    /// True when a listed child of the shard has been started (its row records where its
    /// reader began, or how far it got): the shard itself is read past. A child's row of an
    /// earlier stream of the same name says nothing of this stream's shards.
    fn read_past(&self, id: &str, rows: &BTreeMap<String, Lease>) -> bool {
        self.children.get(id).is_some_and(|children| {
            children.iter().any(|child| {
                rows.get(*child).is_some_and(|row| {
                    let earlier = (self.shards.get(*child))
                        .is_some_and(|shard| is_other_generation(row, shard));
                    !earlier
                        && matches!(
                            row.checkpoint,
                            Some(
                                Checkpoint::Start(_)
                                    | Checkpoint::Sequence(_)
                                    | Checkpoint::SubSequence(..)
                                    | Checkpoint::ShardEnd
                            )
                        )
                })
            })
        })
    }

    /// Decides the fate of `id` when it has no row (its new parents first), recording the
    /// order in which rows are to be created. Returns `None` for a shard that has a row.
    fn decide(
        &self,
        id: &'a str,
        rows: &BTreeMap<String, Lease>,
        frontier: &Frontier<'_>,
        fates: &mut HashMap<&'a str, Fate>,
        order: &mut Vec<&'a str>,
    ) -> Option<Fate> {
        if rows.contains_key(id) {
            return None;
        }
        if let Some(fate) = fates.get(id) {
            return Some(fate.clone());
        }
        let shard = self.shards.get(id)?;
        let fate = if self.read_past(id, rows) {
            // A row that went while the shard is still listed: its children are ahead of it.
            Fate::Passed
        } else {
            let mut descendant = false;
            let mut inherited = None;
            for parent in shard.parents() {
                let Some(parent) = self.shards.get(parent).map(|p| p.shard_id.as_str()) else {
                    // Past the retention period: nothing of it will be read.
                    continue;
                };
                match self.decide(parent, rows, frontier, fates, order) {
                    None => descendant = true,
                    Some(Fate::Passed) => {}
                    Some(Fate::Read(checkpoint)) => {
                        descendant = true;
                        if let Some(Checkpoint::Initial(at @ StartingPoint::AtTimestamp(_))) =
                            checkpoint
                        {
                            inherited.get_or_insert(at);
                        }
                    }
                }
            }
            if descendant {
                // A parent with a row is read to its end first: the child from its beginning.
                // Children of new shards that start at a time start at that time too.
                let any_parent_has_row = shard.parents().any(|p| rows.contains_key(p));
                let checkpoint = inherited
                    .filter(|_| !any_parent_has_row)
                    .map(Checkpoint::Initial);
                Fate::Read(checkpoint)
            } else {
                self.frontier_fate(id, frontier)
            }
        };
        fates.insert(id, fate.clone());
        order.push(id);
        Some(fate)
    }

    /// The fate of a shard on the frontier: no parent of it will be read.
    fn frontier_fate(&self, id: &str, frontier: &Frontier<'_>) -> Fate {
        if frontier.recreated.contains(id) {
            return Fate::Read(Some(Checkpoint::Initial(StartingPoint::TrimHorizon)));
        }
        match frontier.position.and_then(|p| p.for_shard(id)) {
            None | Some(StartingPoint::Latest) => {
                if self.is_closed(id) {
                    Fate::Passed
                } else {
                    Fate::Read(Some(Checkpoint::Initial(frontier.tip.clone())))
                }
            }
            Some(point) => Fate::Read(Some(Checkpoint::Initial(point))),
        }
    }
}

/// True when the row was written for a shard of an earlier stream of the same name.
pub(crate) fn is_other_generation(row: &Lease, shard: &ShardDescription) -> bool {
    row.is_other_generation(&shard.starting_sequence_number)
}

/// The rows of the shards that may be read now, in listing order: not finished, the row of
/// this generation, and every listed parent finished.
pub(crate) fn eligible<'r>(
    shards: &[ShardDescription],
    rows: &'r BTreeMap<String, Lease>,
) -> Vec<&'r Lease> {
    let listed: HashSet<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
    let by_id: HashMap<&str, &ShardDescription> =
        shards.iter().map(|s| (s.shard_id.as_str(), s)).collect();
    let finished = |id: &str| -> bool {
        if !listed.contains(id) {
            // Past the retention period: nothing left to read.
            return true;
        }
        rows.get(id)
            .is_some_and(|row| row.is_finished() && !is_other_generation(row, by_id[id]))
    };
    shards
        .iter()
        .filter_map(|shard| {
            let row = rows.get(&shard.shard_id)?;
            let ready = !row.is_finished()
                && !is_other_generation(row, shard)
                && shard.parents().all(finished);
            ready.then_some(row)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = "s";

    fn shard(id: &str, parents: &[&str], closed: bool) -> ShardDescription {
        ShardDescription {
            shard_id: id.to_owned(),
            parent_shard_id: parents.first().map(|p| (*p).to_owned()),
            adjacent_parent_shard_id: parents.get(1).map(|p| (*p).to_owned()),
            starting_hash_key: "0".into(),
            ending_hash_key: "1".into(),
            starting_sequence_number: format!("100{}", id.len()),
            ending_sequence_number: closed.then(|| "9223372036854775807".to_owned()),
        }
    }

    /// Shard 0 split into 2 and 3, then 2 split into 4 and 5; shard 1 open all along.
    fn split_twice() -> Vec<ShardDescription> {
        vec![
            shard("0", &[], true),
            shard("1", &[], false),
            shard("2", &["0"], true),
            shard("3", &["0"], false),
            shard("4", &["2"], false),
            shard("5", &["2"], false),
        ]
    }

    fn row(id: &str, parents: &[&str], checkpoint: Option<Checkpoint>) -> (String, Lease) {
        let mut lease = Lease::new(
            STREAM,
            id,
            parents.iter().map(|p| (*p).to_owned()).collect(),
        );
        lease.checkpoint = checkpoint;
        (id.to_owned(), lease)
    }

    fn tip() -> StartingPoint {
        StartingPoint::AtTimestamp(5_000)
    }

    fn created(
        shards: &[ShardDescription],
        rows: &BTreeMap<String, Lease>,
        position: Option<&KinesisPosition>,
    ) -> Vec<(String, Option<Checkpoint>)> {
        let none = HashSet::new();
        let frontier = Frontier {
            position,
            tip: tip(),
            recreated: &none,
        };
        new_rows(STREAM, shards, rows, &frontier)
            .into_iter()
            .map(|l| (l.shard_id, l.checkpoint))
            .collect()
    }

    fn initial(point: StartingPoint) -> Option<Checkpoint> {
        Some(Checkpoint::Initial(point))
    }

    #[test]
    fn a_first_start_at_the_tip_passes_every_closed_shard() {
        let rows = created(&split_twice(), &BTreeMap::new(), None);
        assert_eq!(
            rows,
            vec![
                ("0".into(), Some(Checkpoint::ShardEnd)),
                ("1".into(), initial(tip())),
                ("2".into(), Some(Checkpoint::ShardEnd)),
                ("3".into(), initial(tip())),
                ("4".into(), initial(tip())),
                ("5".into(), initial(tip())),
            ]
        );
        let latest = KinesisPosition::latest();
        assert_eq!(
            created(&split_twice(), &BTreeMap::new(), Some(&latest)),
            rows
        );
    }

    #[test]
    fn a_first_start_at_the_horizon_reads_the_roots_then_every_descendant() {
        let horizon = KinesisPosition::horizon();
        assert_eq!(
            created(&split_twice(), &BTreeMap::new(), Some(&horizon)),
            vec![
                ("0".into(), initial(StartingPoint::TrimHorizon)),
                ("1".into(), initial(StartingPoint::TrimHorizon)),
                ("2".into(), None),
                ("3".into(), None),
                ("4".into(), None),
                ("5".into(), None),
            ]
        );
    }

    #[test]
    fn a_first_start_at_a_time_starts_every_shard_there_after_its_parents() {
        let at = KinesisPosition::timestamp(7);
        let t = initial(StartingPoint::AtTimestamp(7));
        assert_eq!(
            created(&split_twice(), &BTreeMap::new(), Some(&at)),
            ["0", "1", "2", "3", "4", "5"]
                .into_iter()
                .map(|id| (id.to_owned(), t.clone()))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn shards_split_while_nobody_read_descend_from_the_checkpointed_parent() {
        // Shards 0 and 1 were read and checkpointed; 0 was split twice meanwhile.
        let rows: BTreeMap<String, Lease> = [
            row("0", &[], Some(Checkpoint::Sequence("10".into()))),
            row("1", &[], Some(Checkpoint::Sequence("11".into()))),
        ]
        .into_iter()
        .collect();
        for position in [
            None,
            Some(KinesisPosition::latest()),
            Some(KinesisPosition::horizon()),
            Some(KinesisPosition::timestamp(7)),
        ] {
            let new = created(&split_twice(), &rows, position.as_ref());
            assert_eq!(
                new,
                vec![
                    ("2".into(), None),
                    ("3".into(), None),
                    ("4".into(), None),
                    ("5".into(), None),
                ],
                "{position:?}"
            );
        }
    }

    #[test]
    fn a_grandchild_waits_for_an_unread_child_of_a_read_parent() {
        let mut rows: BTreeMap<String, Lease> = [
            row("0", &[], Some(Checkpoint::Sequence("10".into()))),
            row("1", &[], Some(Checkpoint::Sequence("11".into()))),
            row("2", &["0"], None),
            row("3", &["0"], None),
            row("4", &["2"], None),
            row("5", &["2"], None),
        ]
        .into_iter()
        .collect();
        let shards = split_twice();
        let ids = |rows: &BTreeMap<String, Lease>| -> Vec<String> {
            eligible(&shards, rows)
                .into_iter()
                .map(|l| l.shard_id.clone())
                .collect()
        };
        assert_eq!(ids(&rows), ["0", "1"]);
        rows.get_mut("0").unwrap().checkpoint = Some(Checkpoint::ShardEnd);
        assert_eq!(ids(&rows), ["1", "2", "3"]);
        rows.get_mut("2").unwrap().checkpoint = Some(Checkpoint::Sequence("20".into()));
        assert_eq!(
            ids(&rows),
            ["1", "2", "3"],
            "a parent being read holds back"
        );
        rows.get_mut("2").unwrap().checkpoint = Some(Checkpoint::ShardEnd);
        assert_eq!(ids(&rows), ["1", "3", "4", "5"]);
    }

    #[test]
    fn a_merge_waits_for_both_parents_and_a_parent_past_retention_holds_nothing() {
        let shards = vec![
            shard("1", &[], true),
            shard("2", &[], true),
            shard("3", &["1", "2"], false),
        ];
        let mut rows: BTreeMap<String, Lease> = [
            row("1", &[], Some(Checkpoint::ShardEnd)),
            row("2", &[], Some(Checkpoint::Sequence("5".into()))),
            row("3", &["1", "2"], None),
        ]
        .into_iter()
        .collect();
        let ids = |shards: &[ShardDescription], rows: &BTreeMap<String, Lease>| -> Vec<String> {
            eligible(shards, rows)
                .into_iter()
                .map(|l| l.shard_id.clone())
                .collect()
        };
        assert_eq!(ids(&shards, &rows), ["2"]);
        // Shard 2 leaves the listing (past retention) before anyone finished it.
        assert_eq!(
            ids(
                &shards[..1]
                    .iter()
                    .chain(&shards[2..])
                    .cloned()
                    .collect::<Vec<_>>(),
                &rows
            ),
            ["3"]
        );
        rows.get_mut("2").unwrap().checkpoint = Some(Checkpoint::ShardEnd);
        assert_eq!(ids(&shards, &rows), ["3"]);
    }

    #[test]
    fn a_merge_of_a_read_parent_and_a_passed_one_is_a_descendant() {
        let shards = vec![
            shard("1", &[], true),
            shard("2", &[], true),
            shard("3", &["1", "2"], false),
        ];
        let rows: BTreeMap<String, Lease> = [row("1", &[], Some(Checkpoint::Sequence("5".into())))]
            .into_iter()
            .collect();
        assert_eq!(
            created(&shards, &rows, None),
            vec![("2".into(), Some(Checkpoint::ShardEnd)), ("3".into(), None)]
        );
    }

    #[test]
    fn a_sequence_position_reads_its_shard_and_what_descends_from_it() {
        let at = KinesisPosition::sequence("2", "42");
        assert_eq!(
            created(&split_twice(), &BTreeMap::new(), Some(&at)),
            vec![
                ("0".into(), Some(Checkpoint::ShardEnd)),
                ("1".into(), initial(tip())),
                ("2".into(), initial(StartingPoint::AtSequence("42".into()))),
                ("3".into(), initial(tip())),
                ("4".into(), None),
                ("5".into(), None),
            ]
        );
    }

    #[test]
    fn a_listed_shard_whose_row_vanished_after_a_child_started_comes_back_finished() {
        let shards = vec![shard("0", &[], true), shard("1", &["0"], false)];
        let rows: BTreeMap<String, Lease> =
            [row("1", &["0"], Some(Checkpoint::Sequence("9".into())))]
                .into_iter()
                .collect();
        let horizon = KinesisPosition::horizon();
        assert_eq!(
            created(&shards, &rows, Some(&horizon)),
            vec![("0".into(), Some(Checkpoint::ShardEnd))]
        );
        // A child that has not started yet does not count.
        let rows: BTreeMap<String, Lease> = [row("1", &["0"], None)].into_iter().collect();
        assert_eq!(
            created(&shards, &rows, Some(&horizon)),
            vec![("0".into(), initial(StartingPoint::TrimHorizon))]
        );
    }

    #[test]
    fn a_row_of_an_earlier_stream_of_the_same_name_holds_its_shard_back() {
        let shards = vec![shard("0", &[], false)];
        let (id, mut old) = row("0", &[], Some(Checkpoint::ShardEnd));
        old.starting_sequence_number = Some("1".into());
        assert!(is_other_generation(&old, &shards[0]));
        let rows: BTreeMap<String, Lease> = [(id, old.clone())].into_iter().collect();
        assert!(eligible(&shards, &rows).is_empty());
        // A row without the attribute (written before it existed) is taken as the shard's.
        old.starting_sequence_number = None;
        old.checkpoint = None;
        let rows: BTreeMap<String, Lease> = [("0".to_owned(), old)].into_iter().collect();
        assert_eq!(eligible(&shards, &rows).len(), 1);
        let create = |recreated: &HashSet<String>| {
            let frontier = Frontier {
                position: None,
                tip: tip(),
                recreated,
            };
            new_rows(STREAM, &shards, &BTreeMap::new(), &frontier).remove(0)
        };
        // New rows record the shard's starting sequence number.
        let new = create(&HashSet::new());
        assert_eq!(
            new.starting_sequence_number.as_deref(),
            Some(shards[0].starting_sequence_number.as_str())
        );
        assert_eq!(new.checkpoint, initial(tip()));
        // Once the old row is gone, the shard of the stream created again is read from its
        // beginning.
        let new = create(&["0".to_owned()].into());
        assert_eq!(new.checkpoint, initial(StartingPoint::TrimHorizon));
    }

    /// The stream was created again and split as before. The earlier stream's rows of the
    /// children are still held (by an instance that crashed), so only the parent's went: the
    /// children's rows say nothing of the new stream, and the new parent is read, not passed
    /// as if its children had read past it.
    #[test]
    fn rows_of_an_earlier_streams_children_do_not_pass_the_new_parent() {
        let shards = vec![
            shard("0", &[], true),
            shard("1", &["0"], false),
            shard("2", &["0"], false),
        ];
        let rows: BTreeMap<String, Lease> = ["1", "2"]
            .into_iter()
            .map(|id| {
                let (id, mut old) = row(id, &["0"], Some(Checkpoint::Sequence("77".into())));
                old.starting_sequence_number = Some("1".into());
                (id, old)
            })
            .collect();
        let recreated: HashSet<String> = ["0".to_owned()].into();
        let frontier = Frontier {
            position: None,
            tip: tip(),
            recreated: &recreated,
        };
        let created = new_rows(STREAM, &shards, &rows, &frontier);
        assert_eq!(created.len(), 1, "{created:?}");
        assert_eq!(created[0].shard_id, "0");
        assert_eq!(created[0].checkpoint, initial(StartingPoint::TrimHorizon));
        // Rows of this stream's children do read past it.
        let rows: BTreeMap<String, Lease> = ["1", "2"]
            .into_iter()
            .map(|id| {
                let (id, mut own) = row(id, &["0"], Some(Checkpoint::Sequence("77".into())));
                own.starting_sequence_number = Some(shards[1].starting_sequence_number.clone());
                (id, own)
            })
            .collect();
        let created = new_rows(STREAM, &shards, &rows, &frontier);
        assert_eq!(created[0].checkpoint, Some(Checkpoint::ShardEnd));
    }
}
