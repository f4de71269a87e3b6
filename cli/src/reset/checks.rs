//! What the plan checks, without I/O: rows of an earlier stream, finished shards read again
//! while their descendants are held, the notes, and the refusal while live instances hold
//! leases to change.

use std::collections::{BTreeMap, HashSet};

use kinesis_dataflow::lease::{Lease, LeaseRow};
use kinesis_dataflow::position::Checkpoint;

use super::plan::Change;
use crate::args::{Position, ResetArgs};
use crate::aws::{Shard, is_earlier_stream};
use crate::output;
use crate::workers;

/// True when the shard's row says it was read to its end: SHARD_END in a row of this stream.
fn is_finished(row: &Lease, shard: &Shard) -> bool {
    row.is_finished() && !is_earlier_stream(row, shard)
}

/// Warnings about the plan: finished shards read again while their children are not reset.
pub(super) fn notes(
    args: &ResetArgs,
    changes: &[Change],
    shards: &[Shard],
    rows: &BTreeMap<&str, &LeaseRow>,
) -> Vec<String> {
    let mut notes = waiting_children(changes, shards, rows);
    notes.extend(earlier_stream_rows(changes));
    if args.to == Position::Latest && changes.iter().any(|c| c.changed && c.shard.is_closed()) {
        notes.push(
            "closed shards are set to SHARD_END at latest: nothing arrives in them any more"
                .to_owned(),
        );
    }
    notes
}

/// The ids of the shards reset.
fn reset_ids(changes: &[Change]) -> HashSet<&str> {
    changes.iter().map(|c| c.shard.id.as_str()).collect()
}

/// The finished shards the plan reads again: changed, finished in a row of this stream, and
/// not set to SHARD_END.
fn finished_read_again(changes: &[Change]) -> impl Iterator<Item = &Change> {
    changes.iter().filter(|c| {
        c.changed && is_finished(&c.row.lease, &c.shard) && c.to != Checkpoint::ShardEnd
    })
}

/// A note for each finished shard read again whose children, with rows and not reset, wait
/// for it to be read to its end again.
fn waiting_children(
    changes: &[Change],
    shards: &[Shard],
    rows: &BTreeMap<&str, &LeaseRow>,
) -> Vec<String> {
    let reset = reset_ids(changes);
    let mut notes = Vec::new();
    for change in finished_read_again(changes) {
        let children: Vec<&str> = shards
            .iter()
            .filter(|s| s.parents.contains(&change.shard.id))
            .map(|s| s.id.as_str())
            .filter(|id| !reset.contains(id) && rows.contains_key(id))
            .collect();
        // Held children are refused before this (see `held_children`): these wait.
        if !children.is_empty() {
            notes.push(format!(
                "{} is finished and is read again; its children {} are not reset: nobody \
                 reads them now, so they wait until it is read to its end again, then go on \
                 from their own checkpoints (name them with --shard too, or leave --shard \
                 out, to read them again)",
                change.shard.id,
                children.join(", ")
            ));
        }
    }
    notes
}

/// The note naming the rows written for an earlier stream of the same name, if any.
fn earlier_stream_rows(changes: &[Change]) -> Option<String> {
    let earlier: Vec<String> = changes
        .iter()
        .filter(|c| c.earlier_stream)
        .map(|c| {
            format!(
                "{} (the row's shard began at {}, this stream's at {})",
                c.shard.id,
                c.row
                    .lease
                    .starting_sequence_number
                    .as_deref()
                    .unwrap_or("?"),
                c.shard.starting_sequence_number
            )
        })
        .collect();
    (!earlier.is_empty()).then(|| {
        format!(
            "rows written for an earlier stream of the same name (deleted and created again): \
             {}; each is replaced by a row of this stream's shard at the new position",
            earlier.join(", ")
        )
    })
}

/// Refuses to read a finished parent again while one of its descendants, not reset with it,
/// is held by an instance: that instance goes on reading it while the parent is read again,
/// so the keys' order across the reshard would break. A finished child stays finished, so its
/// own children go on being read: they are followed too (a split, then a merge). Unfinished
/// children nobody holds wait for the parent.
pub(super) fn held_children(
    changes: &[Change],
    shards: &[Shard],
    rows: &BTreeMap<&str, &LeaseRow>,
) -> Option<String> {
    let reset = reset_ids(changes);
    let mut refused = Vec::new();
    let mut seen = HashSet::new();
    for change in finished_read_again(changes) {
        let mut parents = vec![change.shard.id.as_str()];
        while let Some(parent) = parents.pop() {
            for child in shards
                .iter()
                .filter(|s| s.parents.iter().any(|p| p == parent))
            {
                let id = child.id.as_str();
                if reset.contains(id) || !seen.insert(id) {
                    continue;
                }
                let row = rows.get(id);
                match row.and_then(|row| row.lease.owner.as_deref()) {
                    Some(holder) => refused.push(format!("{id} (held by `{holder}`)")),
                    None if row.is_some_and(|row| is_finished(&row.lease, child)) => {
                        parents.push(id);
                    }
                    None => {}
                }
            }
        }
    }
    (!refused.is_empty()).then(|| {
        format!(
            "reading a finished parent again while its descendants are read would break the \
             order of their keys: {} are held and not reset; reset them too (name them with \
             --shard, or leave --shard out), or stop the instances first",
            refused.join(", ")
        )
    })
}

/// The refusal while live instances hold leases to change: each owner, when it was last seen,
/// and the shards it holds.
pub(super) fn refusal(
    live: &[&Change],
    owners: &BTreeMap<String, workers::Worker>,
    now: u64,
) -> String {
    let mut by_owner: BTreeMap<&str, Vec<&Change>> = BTreeMap::new();
    for change in live {
        if let Some(owner) = change.row.lease.owner.as_deref() {
            by_owner.entry(owner).or_default().push(change);
        }
    }
    let described: Vec<String> = by_owner
        .iter()
        .map(|(owner, changes)| {
            let seen = owners
                .get(*owner)
                .and_then(|w| w.row.as_ref())
                .and_then(|r| r.last_written_ms)
                .or_else(|| changes.iter().filter_map(|c| c.row.last_written_ms).max());
            let shards: Vec<&str> = changes.iter().map(|c| c.shard.id.as_str()).collect();
            format!(
                "`{owner}` (last seen {} ago) holds {}",
                output::age(seen, now),
                shards.join(", ")
            )
        })
        .collect();
    format!(
        "live instances hold leases to reset: {}; stop them first (a graceful stop releases \
         the leases), or pass --force to take the leases from them (they stop reading those \
         shards and resume from the new positions); nothing was written",
        described.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use kinesis_dataflow::StartingPoint;

    use super::*;

    /// Shard 0 split into 1 and 2, merged into 3: 0, 1 and 2 finished, 3 held by `live`.
    fn split_then_merged() -> (Vec<Shard>, Vec<LeaseRow>) {
        let shard = |id: &str, parents: &[&str], closed: bool| Shard {
            id: id.into(),
            parents: parents.iter().map(|p| (*p).to_owned()).collect(),
            starting_sequence_number: "1".into(),
            ending_sequence_number: closed.then(|| "9".into()),
        };
        let row = |id: &str, parents: &[&str], owner: Option<&str>, checkpoint| LeaseRow {
            lease: Lease {
                stream: "s".into(),
                shard_id: id.into(),
                owner: owner.map(str::to_owned),
                counter: 3,
                checkpoint: Some(checkpoint),
                parents: parents.iter().map(|p| (*p).to_owned()).collect(),
                starting_sequence_number: Some("1".into()),
                limits: None,
                liveness_group: None,
            },
            last_written_ms: None,
        };
        let shards = vec![
            shard("shardId-0", &[], true),
            shard("shardId-1", &["shardId-0"], true),
            shard("shardId-2", &["shardId-0"], true),
            shard("shardId-3", &["shardId-1", "shardId-2"], false),
        ];
        let rows = vec![
            row("shardId-0", &[], None, Checkpoint::ShardEnd),
            row("shardId-1", &["shardId-0"], None, Checkpoint::ShardEnd),
            row("shardId-2", &["shardId-0"], None, Checkpoint::ShardEnd),
            row(
                "shardId-3",
                &["shardId-1", "shardId-2"],
                Some("live"),
                Checkpoint::Sequence("5".into()),
            ),
        ];
        (shards, rows)
    }

    #[test]
    fn a_finished_ancestor_is_not_read_again_while_a_descendant_is_held() {
        let (shards, rows) = split_then_merged();
        let by_id: BTreeMap<&str, &LeaseRow> = rows
            .iter()
            .map(|r| (r.lease.shard_id.as_str(), r))
            .collect();
        let reset = |ids: &[&str]| -> Vec<Change> {
            ids.iter()
                .map(|id| {
                    let at = shards.iter().position(|s| s.id == *id).unwrap();
                    Change {
                        shard: shards[at].clone(),
                        row: rows[at].clone(),
                        to: Checkpoint::Start(StartingPoint::TrimHorizon),
                        changed: true,
                        earlier_stream: false,
                        live_owner: false,
                    }
                })
                .collect()
        };
        // The grandchild is read on through two finished children: refused, naming it.
        let refused = held_children(&reset(&["shardId-0"]), &shards, &by_id).unwrap();
        assert!(refused.contains("shardId-3 (held by `live`)"), "{refused}");
        // With the whole tree reset, nothing is read on meanwhile.
        let all = ["shardId-0", "shardId-1", "shardId-2", "shardId-3"];
        assert_eq!(held_children(&reset(&all), &shards, &by_id), None);
    }
}
