//! The plan: the shards to reset with their rows, and each one's new checkpoint, decided from
//! what was read, without I/O.

use std::collections::BTreeMap;

use kinesis_dataflow::StartingPoint;
use kinesis_dataflow::lease::LeaseRow;
use kinesis_dataflow::position::Checkpoint;

use super::checks::{held_children, notes, refusal};
use crate::Failure;
use crate::args::{Position, ResetArgs};
use crate::aws::{self, Shard, is_earlier_stream};
use crate::workers;

/// A holder whose lease row was written this recently counts as live even without a worker
/// row (an instance that stepped aside keeps reading what it holds).
pub(super) const LIVE_WINDOW_MS: u64 = 60_000;

/// One shard's part of the plan.
pub(super) struct Change {
    pub(super) shard: Shard,
    pub(super) row: LeaseRow,
    pub(super) to: Checkpoint,
    /// The checkpoint is not already `to`, or the row is of an earlier stream.
    pub(super) changed: bool,
    /// The row was written for a shard of an earlier stream of the same name: it is replaced
    /// by a row of this shard (see [`aws::is_earlier_stream`]).
    pub(super) earlier_stream: bool,
    /// Its holder counts as live.
    pub(super) live_owner: bool,
}

/// What the tool read: the stream's shards, the lease rows and their owners, and when.
pub(super) struct Reading {
    shards: Vec<Shard>,
    rows: Vec<LeaseRow>,
    owners: BTreeMap<String, workers::Worker>,
    now: u64,
}

impl Reading {
    pub(super) fn new(shards: Vec<Shard>, rows: Vec<LeaseRow>, now: u64) -> Self {
        Self {
            owners: workers::workers(&rows),
            shards,
            rows,
            now,
        }
    }

    /// The shards' rows (not workers' nor the roster), by shard id.
    fn shard_rows(&self) -> BTreeMap<&str, &LeaseRow> {
        self.rows
            .iter()
            .filter(|r| !aws::is_worker_or_roster(&r.lease.shard_id))
            .map(|r| (r.lease.shard_id.as_str(), r))
            .collect()
    }

    /// Whether the holder of `row` counts as live: its worker row is there and not declared
    /// gone, or it wrote the row within [`LIVE_WINDOW_MS`].
    fn is_live(&self, row: &LeaseRow) -> bool {
        let Some(owner) = row.lease.owner.as_deref() else {
            return false;
        };
        let worker_alive = self
            .owners
            .get(owner)
            .and_then(|w| w.row.as_ref())
            .is_some_and(|r| r.lease.owner.is_some());
        let written_lately = row
            .last_written_ms
            .is_some_and(|w| self.now.saturating_sub(w) < LIVE_WINDOW_MS);
        worker_alive || written_lately
    }
}

/// Shards skipped, with why.
pub(super) type Skipped = Vec<(String, String)>;

/// The shards to reset with their rows, and those skipped for want of a row. A named shard
/// without a row, or no row at all, is refused.
pub(super) fn with_rows(
    args: &ResetArgs,
    reading: &Reading,
) -> Result<(Vec<(Shard, LeaseRow)>, Skipped), Failure> {
    let (stream, table) = (&args.target.stream, &args.target.table);
    let by_id = reading.shard_rows();
    let mut skipped = Vec::new();
    let mut with_rows = Vec::new();
    for shard in targets(args, &reading.shards)? {
        match by_id.get(shard.id.as_str()) {
            Some(row) => with_rows.push((shard, (*row).clone())),
            None if !args.shards.is_empty() => {
                return Err(Failure::usage(format!(
                    "shard `{}` of stream `{stream}` has no row in lease table `{table}`: no \
                     instance of the application has listed it yet, so there is no checkpoint \
                     to move (its first reader starts where the application's position says)",
                    shard.id
                )));
            }
            None => skipped.push((
                shard.id.clone(),
                "no lease row yet: the instances create it at their next listing".to_owned(),
            )),
        }
    }
    if with_rows.is_empty() {
        return Err(Failure::usage(format!(
            "lease table `{table}` holds no row for any shard of stream `{stream}`: no \
             application has read this stream with this table; check --table / --application \
             and --stream"
        )));
    }
    Ok((with_rows, skipped))
}

/// The reset decided: each shard's change, the shards skipped, the notes, and the refusal
/// while live instances hold leases to change (without `--force`).
pub(super) struct Plan {
    pub(super) changes: Vec<Change>,
    pub(super) skipped: Skipped,
    pub(super) notes: Vec<String>,
    pub(super) refusal: Option<String>,
}

impl Plan {
    /// How many checkpoints change.
    pub(super) fn to_change(&self) -> usize {
        self.changes.iter().filter(|c| c.changed).count()
    }
}

/// Decides each shard's new checkpoint; refuses reading a finished parent again while its
/// children are held.
pub(super) fn plan(
    args: &ResetArgs,
    reading: &Reading,
    with_rows: Vec<(Shard, LeaseRow)>,
    skipped: Skipped,
    latest: &StartingPoint,
) -> Result<Plan, Failure> {
    let changes: Vec<Change> = with_rows
        .into_iter()
        .map(|(shard, row)| {
            let to = new_checkpoint(&args.to, &shard, latest);
            let earlier_stream = is_earlier_stream(&row.lease, &shard);
            Change {
                changed: earlier_stream || row.lease.checkpoint.as_ref() != Some(&to),
                earlier_stream,
                live_owner: reading.is_live(&row),
                shard,
                row,
                to,
            }
        })
        .collect();
    let by_id = reading.shard_rows();
    if let Some(message) = held_children(&changes, &reading.shards, &by_id) {
        return Err(Failure::usage(message));
    }
    let notes = notes(args, &changes, &reading.shards, &by_id);
    let live: Vec<&Change> = changes
        .iter()
        .filter(|c| c.changed && c.live_owner)
        .collect();
    let refusal =
        (!live.is_empty() && !args.force).then(|| refusal(&live, &reading.owners, reading.now));
    Ok(Plan {
        changes,
        skipped,
        notes,
        refusal,
    })
}

/// The listed shards to reset: all, or those named (each must be a shard of the stream).
fn targets(args: &ResetArgs, shards: &[Shard]) -> Result<Vec<Shard>, Failure> {
    if args.shards.is_empty() {
        return Ok(shards.to_vec());
    }
    args.shards
        .iter()
        .map(|id| {
            shards.iter().find(|s| &s.id == id).cloned().ok_or_else(|| {
                let known: Vec<&str> = shards.iter().map(|s| s.id.as_str()).collect();
                Failure::usage(format!(
                    "shard `{id}` is not a shard of stream `{}` (its shards: {})",
                    args.target.stream,
                    known.join(", ")
                ))
            })
        })
        .collect()
}

/// The checkpoint that makes a reader taking the lease open at `to`.
fn new_checkpoint(to: &Position, shard: &Shard, latest: &StartingPoint) -> Checkpoint {
    match to {
        Position::Horizon => Checkpoint::Start(StartingPoint::TrimHorizon),
        // Nothing arrives in a closed shard any more: at the tip it is finished.
        Position::Latest if shard.is_closed() => Checkpoint::ShardEnd,
        Position::Latest => Checkpoint::Start(latest.clone()),
        Position::Timestamp(ms) => Checkpoint::Start(StartingPoint::AtTimestamp(*ms)),
        Position::Sequence(seq) => Checkpoint::Start(StartingPoint::AtSequence(seq.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_become_checkpoints_a_reader_opens_at() {
        let open = Shard {
            id: "s".into(),
            parents: vec![],
            starting_sequence_number: "1".into(),
            ending_sequence_number: None,
        };
        let closed = Shard {
            ending_sequence_number: Some("9".into()),
            ..open.clone()
        };
        let now = StartingPoint::AtTimestamp(5);
        assert_eq!(
            new_checkpoint(&Position::Horizon, &closed, &now),
            Checkpoint::Start(StartingPoint::TrimHorizon)
        );
        assert_eq!(
            new_checkpoint(&Position::Latest, &open, &now),
            Checkpoint::Start(now.clone())
        );
        assert_eq!(
            new_checkpoint(&Position::Latest, &closed, &now),
            Checkpoint::ShardEnd
        );
        assert_eq!(
            new_checkpoint(&Position::Timestamp(7), &closed, &now),
            Checkpoint::Start(StartingPoint::AtTimestamp(7))
        );
        assert_eq!(
            new_checkpoint(&Position::Sequence("3".into()), &open, &now),
            Checkpoint::Start(StartingPoint::AtSequence("3".into()))
        );
    }
}
