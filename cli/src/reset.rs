//! `reset`: moves an application's checkpoints on a stream, fenced like every other write.
//!
//! The steps: read the shards and the rows; decide each shard's new checkpoint and print the
//! plan; refuse while live instances hold leases to change (unless `--force`); then take every
//! lease to change (conditional on its owner and counter), write the new checkpoints, release
//! the leases, and move the roster row so running instances take them again at once.
//!
//! A row written for an earlier stream of the same name (deleted and created again) is not the
//! listed shard's: the library would replace it at its next listing, and a checkpoint written
//! into it would be lost. The reset replaces it itself, while it holds it, by a row of the
//! listed shard at the new position.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, SystemTime};

use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_kinesis::types::ShardIteratorType;
use kinesis_dataflow::StartingPoint;
use kinesis_dataflow::lease::{Lease, LeaseRow, LeaseStore};
use kinesis_dataflow::position::Checkpoint;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::Failure;
use crate::args::{Position, ResetArgs};
use crate::aws::{self, Aws, Shard, WORKER_PREFIX};
use crate::output;
use crate::time;
use crate::workers;

/// A holder whose lease row was written this recently counts as live even without a worker
/// row (an instance that stepped aside keeps reading what it holds).
pub const LIVE_WINDOW_MS: u64 = 60_000;

/// How many times a take is tried when the row changes between the read and the take.
const TAKE_ATTEMPTS: usize = 5;

/// One shard's part of the plan.
struct Change {
    shard: Shard,
    row: LeaseRow,
    to: Checkpoint,
    /// The checkpoint is not already `to`, or the row is of an earlier stream.
    changed: bool,
    /// The row was written for a shard of an earlier stream of the same name: it is replaced
    /// by a row of this shard (see [`is_earlier_stream`]).
    earlier_stream: bool,
    /// Its holder counts as live.
    live_owner: bool,
}

/// Runs `reset`: reads, plans, prints the plan, then refuses, stops, or applies it.
pub async fn run(args: &ResetArgs) -> Result<(), Failure> {
    let aws = aws::connect(&args.target).await?;
    let stream = &args.target.stream;
    let reading = Reading::new(
        aws.shards(stream).await?,
        aws.rows(stream).await?,
        time::now_ms(),
    );
    let (with_rows, skipped) = with_rows(args, &reading)?;
    if let Position::Sequence(seq) = &args.to {
        check_sequence(&aws, stream, &with_rows[0].0, seq).await?;
    }
    let latest = StartingPoint::since(SystemTime::now());
    let plan = plan(args, &reading, with_rows, skipped, &latest)?;
    if !args.json {
        print!("{}", plan_text(args, &aws, &plan));
    }
    let (ending, applied) = match next_step(args, &plan) {
        Step::Stop(said) => {
            if !args.json {
                println!("\n{said}");
            }
            let ending = if args.dry_run {
                Ending::DryRun
            } else {
                Ending::NothingToChange
            };
            (ending, Applied::default())
        }
        Step::Refuse(message) => (
            Ending::Refused,
            Applied {
                failure: Some(Failure::refused(message)),
                ..Applied::default()
            },
        ),
        Step::Apply => {
            let applied = apply(&aws.store, args, &plan.changes).await;
            if !args.json && applied.failure.is_none() {
                println!("\n{}", done_text(stream, plan.to_change()));
            }
            (applied.ending(), applied)
        }
    };
    if args.json {
        let mut doc = plan_json(args, &aws.region, &plan);
        add_outcome(&mut doc, ending, &applied);
        output::print_json(&doc, false);
    }
    applied.result()
}

/// How a reset ended, as `--json` says it (`outcome`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// `--dry-run`: nothing written.
    DryRun,
    /// Every checkpoint already where asked: nothing written.
    NothingToChange,
    /// Refused because live instances hold leases to change (exit status 3): nothing written.
    Refused,
    /// Every change written, every lease released.
    Applied,
    /// A call failed (exit status 1): `written` says which rows were written before it.
    Failed,
}

impl Ending {
    /// The word `--json` gives it.
    fn word(self) -> &'static str {
        match self {
            Self::DryRun => "dry_run",
            Self::NothingToChange => "nothing_to_change",
            Self::Refused => "refused",
            Self::Applied => "applied",
            Self::Failed => "failed",
        }
    }
}

/// What applying the reset did.
#[derive(Debug, Default)]
struct Applied {
    /// The shards whose rows were written (the checkpoint moved, or the row of an earlier
    /// stream replaced), in the order written.
    written: Vec<String>,
    /// Each step that failed.
    failures: Vec<StepFailure>,
    /// Why the command fails (exit status 1 or 3); `None`: it succeeded.
    failure: Option<Failure>,
}

impl Applied {
    /// How the reset ended: applied, refused (exit status 3: an instance took a lease
    /// meanwhile, without --force), or failed.
    fn ending(&self) -> Ending {
        match &self.failure {
            None => Ending::Applied,
            Some(failure) if failure.code == 3 => Ending::Refused,
            Some(_) => Ending::Failed,
        }
    }

    /// The command's result.
    fn result(self) -> Result<(), Failure> {
        self.failure.map_or(Ok(()), Err)
    }
}

/// One step of the reset that failed on one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StepFailure {
    /// The shard.
    shard_id: String,
    /// `take`, `write` or `release`.
    step: &'static str,
    /// What went wrong.
    error: String,
}

/// Adds the outcome to the plan's JSON document: `outcome`, `applied`, `exit_status`,
/// `written`, `failures`, `error`, and `written` per shard.
fn add_outcome(doc: &mut Value, ending: Ending, applied: &Applied) {
    let written: HashSet<&str> = applied.written.iter().map(String::as_str).collect();
    if let Some(shards) = doc["shards"].as_array_mut() {
        for shard in shards {
            let id = shard["shard_id"].as_str().unwrap_or_default();
            shard["written"] = Value::Bool(written.contains(id));
        }
    }
    let failures: Vec<Value> = applied
        .failures
        .iter()
        .map(|f| json!({"shard_id": f.shard_id, "step": f.step, "error": f.error}))
        .collect();
    doc["outcome"] = json!(ending.word());
    doc["applied"] = json!(ending == Ending::Applied);
    doc["exit_status"] = json!(applied.failure.as_ref().map_or(0, |f| f.code));
    doc["written"] = json!(applied.written);
    doc["failures"] = json!(failures);
    doc["error"] = json!(applied.failure.as_ref().map(|f| &f.message));
}

/// What the tool read: the stream's shards, the lease rows and their owners, and when.
struct Reading {
    shards: Vec<Shard>,
    rows: Vec<LeaseRow>,
    owners: BTreeMap<String, workers::Worker>,
    now: u64,
}

impl Reading {
    fn new(shards: Vec<Shard>, rows: Vec<LeaseRow>, now: u64) -> Self {
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
type Skipped = Vec<(String, String)>;

/// The shards to reset with their rows, and those skipped for want of a row. A named shard
/// without a row, or no row at all, is refused.
fn with_rows(
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
struct Plan {
    changes: Vec<Change>,
    skipped: Skipped,
    notes: Vec<String>,
    refusal: Option<String>,
}

impl Plan {
    /// How many checkpoints change.
    fn to_change(&self) -> usize {
        self.changes.iter().filter(|c| c.changed).count()
    }
}

/// Decides each shard's new checkpoint; refuses reading a finished parent again while its
/// children are held.
fn plan(
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

/// What `reset` does once the plan is printed.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Stop, saying this (in the table form), exit status 0.
    Stop(String),
    /// Refuse: live instances hold leases to change; exit status 3.
    Refuse(String),
    /// Take the leases and write the checkpoints.
    Apply,
}

/// The step after the plan: a refusal (only said under `--dry-run`), a dry run, nothing to
/// change, or the reset.
fn next_step(args: &ResetArgs, plan: &Plan) -> Step {
    match (&plan.refusal, args.dry_run) {
        (Some(message), true) => Step::Stop(format!(
            "without --force this reset would be refused: {message}"
        )),
        (Some(message), false) => Step::Refuse(message.clone()),
        (None, true) => Step::Stop("dry run: nothing written".to_owned()),
        (None, false) if plan.to_change() == 0 => Step::Stop("nothing to change".to_owned()),
        (None, false) => Step::Apply,
    }
}

/// What a reset done says.
fn done_text(stream: &str, changed: usize) -> String {
    format!(
        "reset {} of stream `{stream}`. Running instances take the leases again within about a \
         second (the roster row was moved) and read from the new positions: after a forced \
         reset, within two thirds of the lease duration and a second of its start (measured \
         with 10 s leases: 7.8 s). Stopped instances read from there when they start.",
        output::count(changed, "shard")
    )
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

/// True when `row` was written for a shard of an earlier stream of the same name: it records
/// a starting sequence number other than the listed shard's. The library's rule (a row written
/// before the number was recorded counts as this stream's): such a row is deleted at the next
/// listing and the shard read from its beginning.
fn is_earlier_stream(row: &Lease, shard: &Shard) -> bool {
    row.starting_sequence_number
        .as_deref()
        .is_some_and(|seq| seq != shard.starting_sequence_number)
}

/// True when the shard's row says it was read to its end: SHARD_END in a row of this stream.
fn is_finished(row: &Lease, shard: &Shard) -> bool {
    row.is_finished() && !is_earlier_stream(row, shard)
}

/// Whether a decimal sequence number is at most another.
fn seq_le(a: &str, b: &str) -> bool {
    let (a, b) = (a.trim_start_matches('0'), b.trim_start_matches('0'));
    (a.len(), a) <= (b.len(), b)
}

/// Checks that `seq` is a record of `shard`: within its range, and accepted by
/// GetShardIterator AT_SEQUENCE_NUMBER.
async fn check_sequence(aws: &Aws, stream: &str, shard: &Shard, seq: &str) -> Result<(), Failure> {
    let out_of_range = |why: String| {
        Failure::usage(format!(
            "--to sequence:{seq} is not a record of shard `{}`: {why}",
            shard.id
        ))
    };
    if !seq_le(&shard.starting_sequence_number, seq) {
        return Err(out_of_range(format!(
            "the shard begins at {}",
            shard.starting_sequence_number
        )));
    }
    if let Some(end) = &shard.ending_sequence_number
        && !seq_le(seq, end)
    {
        return Err(out_of_range(format!("the shard ends at {end}")));
    }
    let checked = aws
        .kinesis
        .get_shard_iterator()
        .stream_name(stream)
        .shard_id(&shard.id)
        .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
        .starting_sequence_number(seq)
        .send()
        .await;
    match checked {
        Ok(_) => Ok(()),
        Err(err) if err.code() == Some("InvalidArgumentException") => Err(out_of_range(
            err.message().unwrap_or("refused by Kinesis").to_owned(),
        )),
        Err(err) => Err(Failure::failed(format!(
            "GetShardIterator on `{}` to check the sequence number failed: {}",
            shard.id,
            DisplayErrorContext(&err)
        ))),
    }
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

/// Warnings about the plan: finished shards read again while their children are not reset.
fn notes(
    args: &ResetArgs,
    changes: &[Change],
    shards: &[Shard],
    rows: &BTreeMap<&str, &LeaseRow>,
) -> Vec<String> {
    let reset: HashSet<&str> = changes.iter().map(|c| c.shard.id.as_str()).collect();
    let mut notes = Vec::new();
    for change in changes.iter().filter(|c| c.changed) {
        if is_finished(&change.row.lease, &change.shard) && change.to != Checkpoint::ShardEnd {
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
    }
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
    if !earlier.is_empty() {
        notes.push(format!(
            "rows written for an earlier stream of the same name (deleted and created again): \
             {}; each is replaced by a row of this stream's shard at the new position",
            earlier.join(", ")
        ));
    }
    if args.to == Position::Latest && changes.iter().any(|c| c.changed && c.shard.is_closed()) {
        notes.push(
            "closed shards are set to SHARD_END at latest: nothing arrives in them any more"
                .to_owned(),
        );
    }
    notes
}

/// Refuses to read a finished parent again while one of its descendants, not reset with it,
/// is held by an instance: that instance goes on reading it while the parent is read again,
/// so the keys' order across the reshard would break. A finished child stays finished, so its
/// own children go on being read: they are followed too (a split, then a merge). Unfinished
/// children nobody holds wait for the parent.
fn held_children(
    changes: &[Change],
    shards: &[Shard],
    rows: &BTreeMap<&str, &LeaseRow>,
) -> Option<String> {
    let reset: HashSet<&str> = changes.iter().map(|c| c.shard.id.as_str()).collect();
    let mut refused = Vec::new();
    let mut seen = HashSet::new();
    for change in changes.iter().filter(|c| c.changed) {
        if !is_finished(&change.row.lease, &change.shard) || change.to == Checkpoint::ShardEnd {
            continue;
        }
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
fn refusal(live: &[&Change], owners: &BTreeMap<String, workers::Worker>, now: u64) -> String {
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

/// `--to` as the plan says it.
fn position_text(to: &Position) -> String {
    match to {
        Position::Horizon => "horizon".to_owned(),
        Position::Latest => "latest".to_owned(),
        Position::Timestamp(ms) => format!("timestamp:{}", time::format(*ms)),
        Position::Sequence(seq) => format!("sequence:{seq}"),
    }
}

/// The plan in the table form: a header, per shard from -> to, the shards skipped, the notes.
fn plan_text(args: &ResetArgs, aws: &Aws, plan: &Plan) -> String {
    let mut out = format!(
        "reset stream `{}` (region {}), lease table `{}`, to {}{}\n\n",
        args.target.stream,
        aws.region,
        args.target.table,
        position_text(&args.to),
        if args.dry_run { " (dry run)" } else { "" }
    );
    let lines: Vec<Vec<String>> = plan.changes.iter().map(change_cells).collect();
    out.push_str(&output::table(
        &["SHARD", "STATE", "OWNER", "FROM", "TO"],
        &lines,
    ));
    for (shard, why) in &plan.skipped {
        out.push_str(&format!("skipped {shard}: {why}\n"));
    }
    for note in &plan.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

/// One shard's line of the plan.
fn change_cells(c: &Change) -> Vec<String> {
    let owner = match (&c.row.lease.owner, c.live_owner) {
        (None, _) => "-".to_owned(),
        (Some(o), true) => format!("{o} (live)"),
        (Some(o), false) => format!("{o} (silent)"),
    };
    vec![
        c.shard.id.clone(),
        shard_state(&c.shard).to_owned(),
        owner,
        from_text(c),
        if c.changed {
            output::checkpoint(Some(&c.to))
        } else {
            "(unchanged)".to_owned()
        },
    ]
}

/// The checkpoint a change moves from, in words: none for a row of an earlier stream.
fn from_text(c: &Change) -> String {
    if c.earlier_stream {
        EARLIER_STREAM_ROW.to_owned()
    } else {
        output::checkpoint(c.row.lease.checkpoint.as_ref())
    }
}

/// What the plan says in place of the checkpoint of a row of an earlier stream.
const EARLIER_STREAM_ROW: &str = "- (row of an earlier stream of the same name)";

/// `open` or `closed`.
fn shard_state(shard: &Shard) -> &'static str {
    if shard.is_closed() { "closed" } else { "open" }
}

/// The plan as one JSON document.
fn plan_json(args: &ResetArgs, region: &str, plan: &Plan) -> Value {
    let shards: Vec<Value> = plan
        .changes
        .iter()
        .map(|c| {
            json!({
                "shard_id": c.shard.id,
                "state": shard_state(&c.shard),
                "owner": c.row.lease.owner,
                "owner_live": c.live_owner,
                "counter": c.row.lease.counter,
                "from": c.row.lease.checkpoint.as_ref().map(Checkpoint::encode),
                "to": c.to.encode(),
                "changed": c.changed,
                "earlier_stream_row": c.earlier_stream,
            })
        })
        .collect();
    let skipped: Vec<Value> = plan
        .skipped
        .iter()
        .map(|(shard, why)| json!({"shard_id": shard, "reason": why}))
        .collect();
    json!({
        "table": args.target.table,
        "stream": args.target.stream,
        "region": region,
        "to": position_text(&args.to),
        "dry_run": args.dry_run,
        "force": args.force,
        "refused": plan.refusal,
        "shards": shards,
        "skipped": skipped,
        "notes": plan.notes,
    })
}

/// Takes every lease to change, writes the checkpoints, releases the leases, moves the roster.
async fn apply(store: &dyn LeaseStore, args: &ResetArgs, changes: &[Change]) -> Applied {
    let me = format!(
        "{}{}-{}",
        kinesis_dataflow::lease::RESET_OWNER_PREFIX,
        std::process::id(),
        time::now_ms()
    );
    let (held, hold_until) = match take_all(store, args, changes, &me).await {
        Ok(taken) => taken,
        Err((failure, failures)) => {
            return Applied {
                written: Vec::new(),
                failures,
                failure: Some(failure),
            };
        }
    };
    let writes = write_all(store, held, args.json).await;
    if let Some(until) = hold_until {
        let left = until.saturating_duration_since(Instant::now());
        if !args.json && !left.is_zero() {
            println!(
                "holding the leases taken from instances for {:.1} s: they stop reading those \
                 shards within two thirds of the lease duration, so no shard has two readers",
                left.as_secs_f64()
            );
        }
        tokio::time::sleep_until(until).await;
    }
    let unreleased = release_all(store, writes.to_release).await;
    bump_roster(store, &args.target.stream, &me).await;
    let failed = writes.failed.as_ref().map(|f| f.error.clone());
    let failure = outcome(failed, &writes.written, released(&unreleased)).err();
    Applied {
        written: writes.written,
        failures: writes.failed.into_iter().chain(unreleased).collect(),
        failure,
    }
}

/// Takes every lease to change; when one cannot be taken, releases those taken and fails.
/// Also says until when the leases taken from instances are to be held: an instance's reader
/// stops two thirds of the lease duration after its last renewal, which was sent before the
/// take that succeeded (or that take would have failed its condition). Whether a lease is
/// taken from an instance is judged by the row the successful take was conditioned on, not
/// by the row as first read: an instance may take a free lease, or renew its own, between the
/// reading and the take.
async fn take_all<'c>(
    store: &dyn LeaseStore,
    args: &ResetArgs,
    changes: &'c [Change],
    me: &str,
) -> Result<(Vec<(Lease, &'c Change)>, Option<Instant>), (Failure, Vec<StepFailure>)> {
    let hold = Duration::from_millis(args.lease_duration_ms * 2 / 3);
    let mut held: Vec<(Lease, &Change)> = Vec::new();
    let mut hold_until: Option<Instant> = None;
    for change in changes.iter().filter(|c| c.changed) {
        match take(
            store,
            &args.target.stream,
            &change.row.lease,
            me,
            args.force,
        )
        .await
        {
            Ok(took) => {
                if took.from.is_some() {
                    hold_until = hold_until.max(Some(took.sent + hold));
                }
                held.push((took.lease, change));
            }
            Err(failure) => {
                let unreleased = release_all(store, held.into_iter().map(|(l, _)| l)).await;
                let took = StepFailure {
                    shard_id: change.shard.id.clone(),
                    step: "take",
                    error: failure.message.clone(),
                };
                let failure = take_failed(failure, released(&unreleased));
                return Err((failure, std::iter::once(took).chain(unreleased).collect()));
            }
        }
    }
    Ok((held, hold_until))
}

/// A failed take, with what became of the leases taken before it.
fn take_failed(failure: Failure, released: Result<(), String>) -> Failure {
    let leases = match released {
        Ok(()) => "the leases taken so far were released".to_owned(),
        Err(message) => {
            format!("{message}: those leases are free again once they expire (the lease duration)")
        }
    };
    Failure {
        message: format!("{}; no checkpoint was changed ({leases})", failure.message),
        ..failure
    }
}

/// What the checkpoint writes did.
struct Writes {
    /// The shards written.
    written: Vec<String>,
    /// The first write that failed (none is tried after it).
    failed: Option<StepFailure>,
    /// Every lease held, to release.
    to_release: Vec<Lease>,
}

/// Writes the new checkpoints under the leases held, stopping at the first failure. A row of
/// an earlier stream is replaced instead (see [`replace`]).
async fn write_all(store: &dyn LeaseStore, held: Vec<(Lease, &Change)>, json: bool) -> Writes {
    let mut writes = Writes {
        written: Vec::new(),
        failed: None,
        to_release: Vec::new(),
    };
    for (lease, change) in held {
        if writes.failed.is_some() {
            writes.to_release.push(lease);
            continue;
        }
        let written = if change.earlier_stream {
            replace(store, &lease, change).await
        } else {
            store.checkpoint(&lease, &change.to).await.map_err(|e| {
                let message = format!(
                    "writing the checkpoint of `{}` failed: {e}",
                    change.shard.id
                );
                (message, Some(lease))
            })
        };
        match written {
            Ok(lease) => {
                if !json {
                    println!(
                        "{}: {} -> {}",
                        change.shard.id,
                        from_text(change),
                        output::checkpoint(Some(&change.to))
                    );
                }
                writes.written.push(change.shard.id.clone());
                writes.to_release.push(lease);
            }
            Err((error, still_held)) => {
                writes.failed = Some(StepFailure {
                    shard_id: change.shard.id.clone(),
                    step: "write",
                    error,
                });
                writes.to_release.extend(still_held);
            }
        }
    }
    writes
}

/// Replaces `held`, a row of an earlier stream of the same name that the reset holds, by a row
/// of the listed shard (its parents and starting sequence number) at the new checkpoint, held
/// by the reset like the rows it writes: the old row is deleted (conditional on the reset's
/// hold), then the new one created (conditional on there being none). Between the two an
/// instance's listing may create the shard's row itself (at the application's position): the
/// reset then fails, saying to run it again. On failure, the lease still held, if any.
async fn replace(
    store: &dyn LeaseStore,
    held: &Lease,
    change: &Change,
) -> Result<Lease, (String, Option<Lease>)> {
    let id = &change.shard.id;
    if let Err(e) = store.delete(held).await {
        let message = format!(
            "deleting the row of `{id}` written for an earlier stream of the same name failed: \
             {e}"
        );
        return Err((message, Some(held.clone())));
    }
    let row = Lease {
        stream: held.stream.clone(),
        shard_id: held.shard_id.clone(),
        owner: held.owner.clone(),
        counter: held.counter.saturating_add(1),
        checkpoint: Some(change.to.clone()),
        parents: change.shard.parents.clone(),
        starting_sequence_number: Some(change.shard.starting_sequence_number.clone()),
        limits: None,
    };
    let deleted = format!(
        "the row of `{id}` written for an earlier stream of the same name was deleted, but"
    );
    let again = "run the reset again";
    match store.create(&row).await {
        Ok(true) => Ok(row),
        Ok(false) => Err((
            format!(
                "{deleted} an instance created the row of this stream's shard meanwhile (at the \
                 application's position); {again}"
            ),
            None,
        )),
        Err(e) => {
            // The create may have landed all the same (a timeout): the row read back says.
            let ids = [id.clone()];
            match store
                .get(&row.stream, &ids)
                .await
                .map(|rows| rows.into_iter().next())
            {
                Ok(Some(found)) if found.owner == row.owner => Ok(found),
                _ => Err((
                    format!(
                        "{deleted} creating the row of this stream's shard failed: {e}; an \
                         instance creates it at its next listing (at the application's \
                         position): {again}"
                    ),
                    None,
                )),
            }
        }
    }
}

/// The reset's result from a failed write (if any), the shards written and the releases.
fn outcome(
    failed: Option<String>,
    written: &[String],
    released: Result<(), String>,
) -> Result<(), Failure> {
    if let Some(message) = failed {
        let before = if written.is_empty() {
            "none".to_owned()
        } else {
            written.join(", ")
        };
        return Err(Failure::failed(format!(
            "{message}; written before it: {before} (run the reset again to finish)"
        )));
    }
    released.map_err(|message| {
        Failure::failed(format!(
            "the checkpoints were written, but {message}; those leases are taken again once \
             they expire (the lease duration)"
        ))
    })
}

/// A lease the reset took.
struct Took {
    /// The lease as now held by the reset.
    lease: Lease,
    /// Who held it just before (`None`: nobody).
    from: Option<String>,
    /// When the take that succeeded was sent.
    sent: Instant,
}

/// Takes `lease` for `me`, reading the row again when it changed meanwhile. Without `force` a
/// row that an instance took meanwhile refuses the reset. A take whose answer was lost (a
/// timeout, a 5xx, or a retry that found the reset's own write and so read as lost) is
/// settled by the row read back: when it names `me`, the take landed.
async fn take(
    store: &dyn LeaseStore,
    stream: &str,
    lease: &Lease,
    me: &str,
    force: bool,
) -> Result<Took, Failure> {
    let mut current = lease.clone();
    for _ in 0..TAKE_ATTEMPTS {
        let sent = Instant::now();
        match store.take(&current, me).await {
            Ok(taken) => {
                return Ok(Took {
                    lease: taken,
                    from: current.owner,
                    sent,
                });
            }
            Err(e) if e.is_lost() || e.is_retryable() => {
                let ids = [current.shard_id.clone()];
                let fresh = store.get(stream, &ids).await.map_err(|read| {
                    Failure::failed(format!(
                        "taking the lease of `{}` failed ({e}), and reading its row again                          failed: {read}",
                        ids[0]
                    ))
                })?;
                let Some(fresh) = fresh.into_iter().next() else {
                    return Err(Failure::failed(format!(
                        "the row of `{}` was deleted meanwhile (the stream deleted?)",
                        ids[0]
                    )));
                };
                if fresh.owner.as_deref() == Some(me) {
                    return Ok(Took {
                        lease: fresh,
                        from: current.owner,
                        sent,
                    });
                }
                if !e.is_lost() {
                    return Err(Failure::failed(format!(
                        "taking the lease of `{}` failed: {e}",
                        current.shard_id
                    )));
                }
                if !force && let Some(owner) = &fresh.owner {
                    return Err(Failure::refused(format!(
                        "`{owner}` wrote the lease of `{}` meanwhile (a live instance holds \
                         it); stop the instances or pass --force",
                        fresh.shard_id
                    )));
                }
                current = fresh;
            }
            Err(e) => {
                return Err(Failure::failed(format!(
                    "taking the lease of `{}` failed: {e}",
                    current.shard_id
                )));
            }
        }
    }
    Err(Failure::failed(format!(
        "the lease of `{}` changed under each of {TAKE_ATTEMPTS} takes",
        current.shard_id
    )))
}

/// Releases every lease; the releases that failed.
async fn release_all(
    store: &dyn LeaseStore,
    leases: impl IntoIterator<Item = Lease>,
) -> Vec<StepFailure> {
    let mut failures = Vec::new();
    for lease in leases {
        if let Err(e) = store.release(&lease).await {
            eprintln!(
                "kinesis-dataflow: releasing the lease of `{}` failed: {e}",
                lease.shard_id
            );
            failures.push(StepFailure {
                shard_id: lease.shard_id.clone(),
                step: "release",
                error: e.to_string(),
            });
        }
    }
    failures
}

/// The releases as a result: the error names the leases that could not be released.
fn released(failures: &[StepFailure]) -> Result<(), String> {
    if failures.is_empty() {
        return Ok(());
    }
    let shards: Vec<&str> = failures.iter().map(|f| f.shard_id.as_str()).collect();
    Err(format!("releasing {} failed", shards.join(", ")))
}

/// Moves the roster row (when there is one), so running instances list at once and take the
/// released leases within about a second. Failure only delays that to their next listing.
async fn bump_roster(store: &dyn LeaseStore, stream: &str, me: &str) {
    let ids = [WORKER_PREFIX.to_owned()];
    if let Ok(Some(roster)) = store
        .get(stream, &ids)
        .await
        .map(|rows| rows.into_iter().next())
        && let Err(e) = store.take(&roster, me).await
        && !e.is_lost()
    {
        eprintln!(
            "kinesis-dataflow: could not move the roster row ({e}); running instances take the \
             leases at their next listing"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_stops_a_dry_run_and_refuses_a_reset() {
        let args = |dry_run| ResetArgs {
            target: crate::args::Target {
                table: "t".into(),
                stream: "s".into(),
            },
            to: Position::Horizon,
            shards: vec![],
            dry_run,
            force: false,
            lease_duration_ms: 10_000,
            json: false,
        };
        let plan = |refusal: Option<&str>| Plan {
            changes: vec![],
            skipped: vec![],
            notes: vec![],
            refusal: refusal.map(str::to_owned),
        };
        assert_eq!(
            next_step(&args(true), &plan(Some("held"))),
            Step::Stop("without --force this reset would be refused: held".into())
        );
        assert_eq!(
            next_step(&args(false), &plan(Some("held"))),
            Step::Refuse("held".into())
        );
        assert_eq!(
            next_step(&args(true), &plan(None)),
            Step::Stop("dry run: nothing written".into())
        );
        assert_eq!(
            next_step(&args(false), &plan(None)),
            Step::Stop("nothing to change".into())
        );
    }

    #[test]
    fn a_failed_write_is_said_before_a_failed_release() {
        let written = ["a".to_owned(), "b".to_owned()];
        let failed = outcome(Some("writing c failed".into()), &written, Err("x".into()));
        let failed = failed.unwrap_err();
        assert_eq!(failed.code, 1);
        assert!(
            failed.message.contains("writing c failed")
                && failed.message.contains("written before it: a, b"),
            "{}",
            failed.message
        );
        let none = outcome(Some("w".into()), &[], Ok(())).unwrap_err();
        assert!(
            none.message.contains("written before it: none"),
            "{}",
            none.message
        );
        let unreleased = outcome(None, &written, Err("releasing a failed".into())).unwrap_err();
        assert!(
            unreleased
                .message
                .contains("the checkpoints were written, but releasing a failed")
        );
        assert!(outcome(None, &written, Ok(())).is_ok());
        let take = take_failed(Failure::refused("held".into()), Ok(()));
        assert_eq!(take.code, 3, "a refused take stays a refusal");
        assert!(
            take.message.contains("no checkpoint was changed"),
            "{}",
            take.message
        );
    }

    #[test]
    fn sequence_numbers_compare_as_numbers() {
        assert!(seq_le("9", "10"));
        assert!(!seq_le("10", "9"));
        assert!(seq_le("0042", "42"));
        assert!(seq_le(
            "49590338271490256608559692538361571095921575989136588898",
            "49590338271490256608559692538361571095921575989136588899"
        ));
    }

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

/// The reset's takes racing an instance, in memory under paused time: a real subscription on
/// [`MemoryKinesis`](kinesis_dataflow::MemoryKinesis) and the reset's own steps on the same
/// [`MemoryLeaseStore`](kinesis_dataflow::MemoryLeaseStore).
#[cfg(test)]
mod races {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use kinesis_dataflow::api::SharedKinesis;
    use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
    use kinesis_dataflow::lease::{LeaseError, LeaseFuture};
    use kinesis_dataflow::{
        KinesisPosition, MemoryKinesis, MemoryLeaseStore, ReadSettings, Subscription,
        SubscriptionBuilder,
    };
    use kinesis_dataflow_test_support::read_until;

    use super::*;
    use crate::args::Target;

    const STREAM: &str = "orders";
    const SHARD: &str = "shardId-000000000000";
    /// The instances' lease duration, which the reset is told.
    const LEASE: Duration = Duration::from_secs(3);
    /// Long enough for anything asked of an instance here, in paused time.
    const PATIENCE: Duration = Duration::from_secs(60);

    /// A one-shard stream with `first-00..04` in it, and an empty lease store.
    fn one_shard() -> (MemoryKinesis, SharedKinesis, MemoryLeaseStore) {
        let memory = MemoryKinesis::new();
        memory.add_stream(STREAM, 1).unwrap();
        put(&memory, "first", 5);
        let api: SharedKinesis = Arc::new(memory.clone());
        (memory, api, MemoryLeaseStore::new())
    }

    /// Puts `tag-00..count` on the one shard; their payloads.
    fn put(memory: &MemoryKinesis, tag: &str, count: usize) -> BTreeSet<String> {
        (0..count)
            .map(|i| {
                let payload = format!("{tag}-{i:02}");
                memory.put(STREAM, "key", payload.clone()).unwrap();
                payload
            })
            .collect()
    }

    /// An instance that lists, renews and checkpoints quickly, from the oldest record.
    fn instance(api: &SharedKinesis, store: &MemoryLeaseStore, owner: &str) -> SubscriptionBuilder {
        Subscription::builder(api.clone(), Arc::new(store.clone()), STREAM)
            .owner(owner)
            .read_settings(
                ReadSettings::default()
                    .poll_interval(Duration::from_millis(100))
                    .unlimited_reads(),
            )
            .list_interval(Duration::from_millis(300))
            .lease_duration(LEASE)
            .checkpoint_interval(Duration::from_millis(100))
            .shutdown_timeout(Duration::from_secs(2))
            .initial_position(KinesisPosition::horizon())
    }

    /// The shard's row as `store` has it now.
    async fn row(store: &dyn LeaseStore) -> Lease {
        let ids = [SHARD.to_owned()];
        store.get(STREAM, &ids).await.unwrap().remove(0)
    }

    /// Waits until `owner` holds the shard's lease.
    async fn held_by(store: &dyn LeaseStore, owner: &str) {
        let waited = tokio::time::timeout(PATIENCE, async {
            while row(store).await.owner.as_deref() != Some(owner) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(waited.is_ok(), "`{owner}` never took the lease");
    }

    /// `reset --to horizon` (with `--force` or not) as planned from the table as it is now.
    async fn horizon_plan(store: &dyn LeaseStore, force: bool) -> (ResetArgs, Plan) {
        horizon_plan_listing(store, None, force).await
    }

    /// [`horizon_plan`] with the shard listed as beginning at `listed_start` (default: where
    /// its row says it begins).
    async fn horizon_plan_listing(
        store: &dyn LeaseStore,
        listed_start: Option<&str>,
        force: bool,
    ) -> (ResetArgs, Plan) {
        let args = ResetArgs {
            target: Target {
                table: "leases".into(),
                stream: STREAM.into(),
            },
            to: Position::Horizon,
            shards: vec![],
            dry_run: false,
            force,
            lease_duration_ms: u64::try_from(LEASE.as_millis()).unwrap(),
            json: true,
        };
        let row = row(store).await;
        let shard = Shard {
            id: SHARD.into(),
            parents: vec![],
            starting_sequence_number: listed_start
                .map(str::to_owned)
                .or_else(|| row.starting_sequence_number.clone())
                .unwrap(),
            ending_sequence_number: None,
        };
        let rows = vec![LeaseRow {
            lease: row,
            last_written_ms: None,
        }];
        let reading = Reading::new(vec![shard], rows, time::now_ms());
        let (with_rows, skipped) = with_rows(&args, &reading).unwrap();
        let latest = StartingPoint::since(SystemTime::now());
        let plan = plan(&args, &reading, with_rows, skipped, &latest).unwrap();
        (args, plan)
    }

    /// The lease is free when the reset reads the table; an instance takes it before the
    /// reset's take. A forced reset takes it from that instance, and must hold it until the
    /// instance has stopped reading (as for a lease held when read): released at once, the
    /// instance's reader, which has not yet found the lease gone, would go on reading from
    /// its old position beside the reader taking the free lease.
    #[tokio::test(start_paused = true)]
    async fn a_forced_reset_holds_a_lease_an_instance_took_after_the_reading() {
        let (memory, api, store) = one_shard();
        let (args, plan) = horizon_plan_after_a_first_reader(&api, &store, true).await;
        assert_eq!(plan.changes[0].row.lease.owner, None, "read free");
        let mut b = instance(&api, &store, "b").start().await.unwrap();
        held_by(&store, "b").await;
        apply(&store, &args, &plan.changes).await.result().unwrap();

        // What arrives now may only be read after the shard is read again from the horizon.
        let mut all = first_records();
        all.extend(put(&memory, "late", 1));
        let got = read_until(&mut b, &all, "everything again", PATIENCE).await;
        assert_eq!(
            got.first().map(|(_, payload)| payload.as_str()),
            Some("first-00"),
            "read again from the horizon first, nothing from the old position: {got:?}"
        );
        b.shutdown().await;
    }

    /// The same race without `--force`: refused (exit status 3), nothing written, the lease
    /// left with the instance.
    #[tokio::test(start_paused = true)]
    async fn a_reset_without_force_is_refused_when_an_instance_took_the_lease_meanwhile() {
        let (_memory, api, store) = one_shard();
        let (args, plan) = horizon_plan_after_a_first_reader(&api, &store, false).await;
        let mut b = instance(&api, &store, "b").start().await.unwrap();
        held_by(&store, "b").await;
        let before = row(&store).await.checkpoint;
        let refused = apply(&store, &args, &plan.changes)
            .await
            .result()
            .unwrap_err();
        assert_eq!(refused.code, 3, "{}", refused.message);
        assert!(
            refused.message.contains("`b`")
                && refused.message.contains("no checkpoint was changed"),
            "{}",
            refused.message
        );
        let after = row(&store).await;
        assert_eq!(
            (after.owner.as_deref(), after.checkpoint),
            (Some("b"), before)
        );
        b.shutdown().await;
    }

    /// The payloads [`one_shard`] puts.
    fn first_records() -> BTreeSet<String> {
        (0..5).map(|i| format!("first-{i:02}")).collect()
    }

    /// A first instance reads the five records and stops gracefully (the lease free, settled
    /// at the last record); then the plan of a reset to the horizon, read from the table.
    async fn horizon_plan_after_a_first_reader(
        api: &SharedKinesis,
        store: &MemoryLeaseStore,
        force: bool,
    ) -> (ResetArgs, Plan) {
        let mut first = instance(api, store, "first").start().await.unwrap();
        read_until(&mut first, &first_records(), "the first records", PATIENCE).await;
        first.shutdown().await;
        horizon_plan(store, force).await
    }

    /// Applies the reset's first take, then answers as a timeout would: the take's outcome is
    /// unknown to the reset.
    struct FirstTakeUnanswered(std::sync::atomic::AtomicBool);

    impl LeaseLayer for FirstTakeUnanswered {
        fn around<'a, T: Send + 'a>(
            &'a self,
            call: LeaseCall<'a>,
            next: LeaseFuture<'a, T>,
        ) -> LeaseFuture<'a, T> {
            let LeaseCall::Take { lease, .. } = call else {
                return next;
            };
            if self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
                return next;
            }
            Box::pin(async move {
                next.await?;
                Err(LeaseError::Unavailable {
                    table: "leases".into(),
                    operation: call.operation(),
                    message: format!("no answer for `{}`", lease.shard_id),
                    source: None,
                })
            })
        }
    }

    /// The reset's take of a free lease is applied but its answer lost: the row read back
    /// names the reset, so the take landed; the reset goes on, and leaves no lease behind.
    #[tokio::test(start_paused = true)]
    async fn a_take_whose_answer_was_lost_is_settled_by_reading_the_row_back() {
        let (_memory, api, store) = one_shard();
        let (args, plan) = horizon_plan_after_a_first_reader(&api, &store, false).await;
        let layered = LayeredStore::new(Arc::new(store.clone()), FirstTakeUnanswered(false.into()));
        apply(&layered, &args, &plan.changes)
            .await
            .result()
            .unwrap();
        let after = row(&store).await;
        assert_eq!(
            (after.owner, after.checkpoint),
            (None, Some(Checkpoint::Start(StartingPoint::TrimHorizon)))
        );
    }

    /// A row of shard 0 of an earlier stream of the same name, which began at `1`, read to its
    /// end; the listed shard 0 begins at `2`.
    async fn earlier_stream_row(store: &MemoryLeaseStore) {
        let mut old = Lease::new(STREAM, SHARD, vec![]);
        old.counter = 3;
        old.checkpoint = Some(Checkpoint::ShardEnd);
        old.starting_sequence_number = Some("1".into());
        assert!(store.create(&old).await.unwrap());
    }

    /// A row of an earlier stream is planned as changed whatever its checkpoint, is not taken
    /// for a finished shard, and is replaced by a row of the listed shard at the new position.
    #[tokio::test(start_paused = true)]
    async fn a_row_of_an_earlier_stream_is_replaced_by_one_of_the_listed_shard() {
        let store = MemoryLeaseStore::new();
        earlier_stream_row(&store).await;
        let (args, plan) = horizon_plan_listing(&store, Some("2"), false).await;
        let change = &plan.changes[0];
        assert!(change.earlier_stream && change.changed);
        assert_eq!(from_text(change), EARLIER_STREAM_ROW);
        assert!(
            plan.notes[0].contains("earlier stream of the same name")
                && plan.notes[0].contains("began at 1, this stream's at 2"),
            "{:?}",
            plan.notes
        );
        apply(&store, &args, &plan.changes).await.result().unwrap();
        let after = row(&store).await;
        assert_eq!(after.starting_sequence_number.as_deref(), Some("2"));
        assert_eq!(
            after.checkpoint,
            Some(Checkpoint::Start(StartingPoint::TrimHorizon))
        );
        assert_eq!(after.owner, None, "released");
        assert!(after.counter > 3, "{after:?}");
    }

    /// Creates the listed shard's row (as an instance's listing does) right after the reset
    /// deletes the row of the earlier stream.
    struct CreatesAfterTheDelete(MemoryLeaseStore);

    impl LeaseLayer for CreatesAfterTheDelete {
        fn around<'a, T: Send + 'a>(
            &'a self,
            call: LeaseCall<'a>,
            next: LeaseFuture<'a, T>,
        ) -> LeaseFuture<'a, T> {
            if !matches!(call, LeaseCall::Delete { .. }) {
                return next;
            }
            Box::pin(async move {
                let deleted = next.await?;
                let mut new = Lease::new(STREAM, SHARD, vec![]);
                new.starting_sequence_number = Some("2".into());
                assert!(self.0.create(&new).await.unwrap());
                Ok(deleted)
            })
        }
    }

    /// An instance's listing creates the shard's row between the reset's deletion of the
    /// earlier stream's row and its creation of the new one: the reset fails (exit status 1)
    /// saying so, and the instance's row is left as it made it.
    #[tokio::test(start_paused = true)]
    async fn a_row_created_by_an_instance_during_the_replacement_fails_the_reset_clearly() {
        let store = MemoryLeaseStore::new();
        earlier_stream_row(&store).await;
        let (args, plan) = horizon_plan_listing(&store, Some("2"), false).await;
        let layered = LayeredStore::new(
            Arc::new(store.clone()),
            CreatesAfterTheDelete(store.clone()),
        );
        let failed = apply(&layered, &args, &plan.changes)
            .await
            .result()
            .unwrap_err();
        assert_eq!(failed.code, 1, "{}", failed.message);
        assert!(
            failed
                .message
                .contains("an instance created the row of this stream's shard meanwhile")
                && failed.message.contains("run the reset again"),
            "{}",
            failed.message
        );
        let after = row(&store).await;
        assert_eq!(
            (after.owner, after.checkpoint, after.counter),
            (None, None, 0)
        );
    }

    /// Fails every checkpoint write of one shard.
    struct WriteFails(&'static str);

    impl LeaseLayer for WriteFails {
        fn around<'a, T: Send + 'a>(
            &'a self,
            call: LeaseCall<'a>,
            next: LeaseFuture<'a, T>,
        ) -> LeaseFuture<'a, T> {
            match call {
                LeaseCall::Checkpoint { lease, .. } if lease.shard_id == self.0 => {
                    Box::pin(async move {
                        Err(LeaseError::Unavailable {
                            table: "leases".into(),
                            operation: call.operation(),
                            message: "throttled".into(),
                            source: None,
                        })
                    })
                }
                _ => next,
            }
        }
    }

    /// Two free rows; the second's checkpoint write fails. The JSON document says what was
    /// done: the first row written, the second's write failed (and nothing after it tried),
    /// every lease released, exit status 1.
    #[tokio::test(start_paused = true)]
    async fn the_json_document_says_which_rows_were_written_and_which_failed() {
        let store = MemoryLeaseStore::new();
        let ids = ["shardId-000000000000", "shardId-000000000001"];
        let mut shards = Vec::new();
        let mut rows = Vec::new();
        for id in ids {
            let mut row = Lease::new(STREAM, id, vec![]);
            row.checkpoint = Some(Checkpoint::Sequence("5".into()));
            row.starting_sequence_number = Some("1".into());
            assert!(store.create(&row).await.unwrap());
            shards.push(Shard {
                id: id.into(),
                parents: vec![],
                starting_sequence_number: "1".into(),
                ending_sequence_number: None,
            });
            rows.push(LeaseRow {
                lease: row,
                last_written_ms: None,
            });
        }
        let args = ResetArgs {
            target: Target {
                table: "leases".into(),
                stream: STREAM.into(),
            },
            to: Position::Horizon,
            shards: vec![],
            dry_run: false,
            force: false,
            lease_duration_ms: 3_000,
            json: true,
        };
        let reading = Reading::new(shards, rows, time::now_ms());
        let (with_rows, skipped) = with_rows(&args, &reading).unwrap();
        let latest = StartingPoint::since(SystemTime::now());
        let plan = plan(&args, &reading, with_rows, skipped, &latest).unwrap();
        let layered = LayeredStore::new(Arc::new(store.clone()), WriteFails(ids[1]));
        let applied = apply(&layered, &args, &plan.changes).await;

        let mut doc = plan_json(&args, "test-region", &plan);
        add_outcome(&mut doc, applied.ending(), &applied);
        assert_eq!(doc["outcome"], "failed", "{doc:#}");
        assert_eq!(doc["applied"], false);
        assert_eq!(doc["exit_status"], 1);
        assert_eq!(doc["written"], json!([ids[0]]));
        assert_eq!(doc["shards"][0]["written"], true);
        assert_eq!(doc["shards"][1]["written"], false);
        assert_eq!(doc["failures"][0]["shard_id"], ids[1], "{doc:#}");
        assert_eq!(doc["failures"][0]["step"], "write");
        assert!(
            doc["failures"][0]["error"]
                .as_str()
                .unwrap()
                .contains("throttled"),
            "{doc:#}"
        );
        assert_eq!(doc["failures"].as_array().unwrap().len(), 1, "{doc:#}");
        let error = doc["error"].as_str().unwrap();
        assert!(
            error.contains("written before it: shardId-000000000000"),
            "{error}"
        );
        // The plan's fields are still there, as a script may read them.
        assert_eq!(doc["shards"][1]["to"], "TRIM_HORIZON");
        assert_eq!(doc["region"], "test-region");
        for id in ids {
            let ids = [id.to_owned()];
            let row = store.get(STREAM, &ids).await.unwrap().remove(0);
            assert_eq!(row.owner, None, "{id} released");
        }
    }
}
