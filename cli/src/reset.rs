//! `reset`: moves an application's checkpoints on a stream, fenced like every other write.
//!
//! The steps: read the shards and the rows; decide each shard's new checkpoint and print the
//! plan; refuse while live instances hold leases to change (unless `--force`); then take every
//! lease to change (conditional on its owner and counter), write the new checkpoints, release
//! the leases, and move the roster row so running instances take them again at once.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_kinesis::types::ShardIteratorType;
use kinesis_dataflow::StartingPoint;
use kinesis_dataflow::lease::{Lease, LeaseRow, LeaseStore};
use kinesis_dataflow::position::Checkpoint;
use serde_json::{Value, json};

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
    /// The checkpoint is not already `to`.
    changed: bool,
    /// Its holder counts as live.
    live_owner: bool,
}

/// Runs `reset`.
pub async fn run(args: &ResetArgs) -> Result<(), Failure> {
    let aws = aws::connect(&args.target).await?;
    let stream = &args.target.stream;
    let shards = aws.shards(stream).await?;
    let rows = aws.rows(stream).await?;
    let now = time::now_ms();
    let table = &args.target.table;

    let targets = targets(args, &shards)?;
    let by_id: BTreeMap<&str, &LeaseRow> = rows
        .iter()
        .filter(|r| !aws::is_worker_or_roster(&r.lease.shard_id))
        .map(|r| (r.lease.shard_id.as_str(), r))
        .collect();
    let mut skipped: Vec<(String, String)> = Vec::new();
    let mut with_rows = Vec::new();
    for shard in targets {
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
    if let Position::Sequence(seq) = &args.to {
        check_sequence(&aws, stream, &with_rows[0].0, seq).await?;
    }

    let owners = workers::workers(&rows);
    let is_live = |row: &LeaseRow| -> bool {
        let Some(owner) = row.lease.owner.as_deref() else {
            return false;
        };
        let worker_alive = owners
            .get(owner)
            .and_then(|w| w.row.as_ref())
            .is_some_and(|r| r.lease.owner.is_some());
        let written_lately = row
            .last_written_ms
            .is_some_and(|w| now.saturating_sub(w) < LIVE_WINDOW_MS);
        worker_alive || written_lately
    };
    let latest = StartingPoint::since(SystemTime::now());
    let changes: Vec<Change> = with_rows
        .into_iter()
        .map(|(shard, row)| {
            let to = new_checkpoint(&args.to, &shard, &latest);
            Change {
                changed: row.lease.checkpoint.as_ref() != Some(&to),
                live_owner: is_live(&row),
                shard,
                row,
                to,
            }
        })
        .collect();
    if let Some(message) = held_children(&changes, &shards, &by_id) {
        return Err(Failure::usage(message));
    }
    let notes = notes(args, &changes, &shards, &by_id);
    let live: Vec<&Change> = changes
        .iter()
        .filter(|c| c.changed && c.live_owner)
        .collect();
    let refusal = (!live.is_empty() && !args.force).then(|| refusal(&live, &owners, now));
    let to_change = changes.iter().filter(|c| c.changed).count();

    if args.json {
        let doc = plan_json(args, &aws, &changes, &skipped, &notes, refusal.as_deref());
        output::print_json(&doc, false);
    } else {
        print!("{}", plan_text(args, &aws, &changes, &skipped, &notes));
    }
    if let Some(message) = refusal {
        if args.dry_run {
            if !args.json {
                println!("\nwithout --force this reset would be refused: {message}");
            }
            return Ok(());
        }
        return Err(Failure::refused(message));
    }
    if args.dry_run {
        if !args.json {
            println!("\ndry run: nothing written");
        }
        return Ok(());
    }
    if to_change == 0 {
        if !args.json {
            println!("\nnothing to change");
        }
        return Ok(());
    }
    apply(&aws, args, &changes).await?;
    if !args.json {
        println!(
            "\nreset {} of stream `{stream}`. Running instances take the leases \
             again within about a second (the roster row was moved) and read from the new \
             positions: after a forced reset, within two thirds of the lease duration and a \
             second of its start (measured with 10 s leases: 7.8 s). Stopped instances read \
             from there when they start.",
            output::count(to_change, "shard")
        );
    }
    Ok(())
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
        if change.row.lease.is_finished() && change.to != Checkpoint::ShardEnd {
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
    if args.to == Position::Latest && changes.iter().any(|c| c.changed && c.shard.is_closed()) {
        notes.push(
            "closed shards are set to SHARD_END at latest: nothing arrives in them any more"
                .to_owned(),
        );
    }
    notes
}

/// Refuses to read a finished parent again while one of its children, not reset with it, is
/// held by an instance: that instance goes on reading the child while the parent is read
/// again, so the keys' order across the split would break. Children nobody holds wait.
fn held_children(
    changes: &[Change],
    shards: &[Shard],
    rows: &BTreeMap<&str, &LeaseRow>,
) -> Option<String> {
    let reset: HashSet<&str> = changes.iter().map(|c| c.shard.id.as_str()).collect();
    let mut refused = Vec::new();
    for change in changes.iter().filter(|c| c.changed) {
        if !change.row.lease.is_finished() || change.to == Checkpoint::ShardEnd {
            continue;
        }
        for child in shards
            .iter()
            .filter(|s| s.parents.contains(&change.shard.id))
        {
            let holder = rows
                .get(child.id.as_str())
                .and_then(|row| row.lease.owner.as_deref());
            if let (false, Some(holder)) = (reset.contains(child.id.as_str()), holder) {
                refused.push(format!("{} (held by `{holder}`)", child.id));
            }
        }
    }
    (!refused.is_empty()).then(|| {
        format!(
            "reading a finished parent again while its children are read would break the order \
             of their keys: the children {} are held and not reset; reset them too (name them \
             with --shard, or leave --shard out), or stop the instances first",
            refused.join(", ")
        )
    })
}

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

fn position_text(to: &Position) -> String {
    match to {
        Position::Horizon => "horizon".to_owned(),
        Position::Latest => "latest".to_owned(),
        Position::Timestamp(ms) => format!("timestamp:{}", time::format(*ms)),
        Position::Sequence(seq) => format!("sequence:{seq}"),
    }
}

fn plan_text(
    args: &ResetArgs,
    aws: &Aws,
    changes: &[Change],
    skipped: &[(String, String)],
    notes: &[String],
) -> String {
    let mut out = format!(
        "reset stream `{}` (region {}), lease table `{}`, to {}{}\n\n",
        args.target.stream,
        aws.region,
        args.target.table,
        position_text(&args.to),
        if args.dry_run { " (dry run)" } else { "" }
    );
    let lines: Vec<Vec<String>> = changes
        .iter()
        .map(|c| {
            let owner = match (&c.row.lease.owner, c.live_owner) {
                (None, _) => "-".to_owned(),
                (Some(o), true) => format!("{o} (live)"),
                (Some(o), false) => format!("{o} (silent)"),
            };
            vec![
                c.shard.id.clone(),
                if c.shard.is_closed() {
                    "closed"
                } else {
                    "open"
                }
                .to_owned(),
                owner,
                output::checkpoint(c.row.lease.checkpoint.as_ref()),
                if c.changed {
                    output::checkpoint(Some(&c.to))
                } else {
                    "(unchanged)".to_owned()
                },
            ]
        })
        .collect();
    out.push_str(&output::table(
        &["SHARD", "STATE", "OWNER", "FROM", "TO"],
        &lines,
    ));
    for (shard, why) in skipped {
        out.push_str(&format!("skipped {shard}: {why}\n"));
    }
    for note in notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

fn plan_json(
    args: &ResetArgs,
    aws: &Aws,
    changes: &[Change],
    skipped: &[(String, String)],
    notes: &[String],
    refusal: Option<&str>,
) -> Value {
    let shards: Vec<Value> = changes
        .iter()
        .map(|c| {
            json!({
                "shard_id": c.shard.id,
                "state": if c.shard.is_closed() { "closed" } else { "open" },
                "owner": c.row.lease.owner,
                "owner_live": c.live_owner,
                "counter": c.row.lease.counter,
                "from": c.row.lease.checkpoint.as_ref().map(Checkpoint::encode),
                "to": c.to.encode(),
                "changed": c.changed,
            })
        })
        .collect();
    let skipped: Vec<Value> = skipped
        .iter()
        .map(|(shard, why)| json!({"shard_id": shard, "reason": why}))
        .collect();
    json!({
        "table": args.target.table,
        "stream": args.target.stream,
        "region": aws.region,
        "to": position_text(&args.to),
        "dry_run": args.dry_run,
        "force": args.force,
        "refused": refusal,
        "shards": shards,
        "skipped": skipped,
        "notes": notes,
    })
}

/// Takes every lease to change, writes the checkpoints, releases the leases, moves the roster.
async fn apply(aws: &Aws, args: &ResetArgs, changes: &[Change]) -> Result<(), Failure> {
    let store = &aws.store;
    let stream = &args.target.stream;
    let me = format!(
        "{}{}-{}",
        kinesis_dataflow::lease::RESET_OWNER_PREFIX,
        std::process::id(),
        time::now_ms()
    );
    let mut held: Vec<(Lease, &Change)> = Vec::new();
    // A lease taken from an instance is held until that instance's reader has stopped: its
    // gate closes two thirds of the lease duration after its last renewal, which was sent
    // before this take (or this take would have failed its condition).
    let hold = Duration::from_millis(args.lease_duration_ms * 2 / 3);
    let mut hold_until: Option<Instant> = None;
    for change in changes.iter().filter(|c| c.changed) {
        let sent = Instant::now();
        match take(aws, stream, &change.row.lease, &me, args.force).await {
            Ok(lease) => {
                if change.row.lease.owner.is_some() {
                    hold_until = hold_until.max(Some(sent + hold));
                }
                held.push((lease, change));
            }
            Err(failure) => {
                let released = release_all(aws, held.into_iter().map(|(l, _)| l)).await;
                let leases = match released {
                    Ok(()) => "the leases taken so far were released".to_owned(),
                    Err(message) => format!(
                        "{message}: those leases are free again once they expire (the lease \
                         duration)"
                    ),
                };
                return Err(Failure {
                    message: format!("{}; no checkpoint was changed ({leases})", failure.message),
                    ..failure
                });
            }
        }
    }
    let mut written = Vec::new();
    let mut failed = None;
    let mut to_release = Vec::new();
    for (lease, change) in held {
        if failed.is_some() {
            to_release.push(lease);
            continue;
        }
        match store.checkpoint(&lease, &change.to).await {
            Ok(lease) => {
                if !args.json {
                    println!(
                        "{}: {} -> {}",
                        change.shard.id,
                        output::checkpoint(change.row.lease.checkpoint.as_ref()),
                        output::checkpoint(Some(&change.to))
                    );
                }
                written.push(change.shard.id.clone());
                to_release.push(lease);
            }
            Err(e) => {
                failed = Some(format!(
                    "writing the checkpoint of `{}` failed: {e}",
                    change.shard.id
                ));
                to_release.push(lease);
            }
        }
    }
    if let Some(until) = hold_until {
        let left = until.saturating_duration_since(Instant::now());
        if !args.json && !left.is_zero() {
            println!(
                "holding the leases taken from instances for {:.1} s: they stop reading those \
                 shards within two thirds of the lease duration, so no shard has two readers",
                left.as_secs_f64()
            );
        }
        tokio::time::sleep_until(until.into()).await;
    }
    let released = release_all(aws, to_release).await;
    bump_roster(store, stream, &me).await;
    if let Some(message) = failed {
        return Err(Failure::failed(format!(
            "{message}; written before it: {} (run the reset again to finish)",
            if written.is_empty() {
                "none".to_owned()
            } else {
                written.join(", ")
            }
        )));
    }
    if let Err(message) = released {
        return Err(Failure::failed(format!(
            "the checkpoints were written, but {message}; those leases are taken again once \
             they expire (the lease duration)"
        )));
    }
    Ok(())
}

/// Takes `lease` for `me`, reading the row again when it changed meanwhile. Without `force` a
/// row that an instance took meanwhile refuses the reset.
async fn take(
    aws: &Aws,
    stream: &str,
    lease: &Lease,
    me: &str,
    force: bool,
) -> Result<Lease, Failure> {
    let store = &aws.store;
    let mut current = lease.clone();
    for _ in 0..TAKE_ATTEMPTS {
        match store.take(&current, me).await {
            Ok(taken) => return Ok(taken),
            Err(e) if e.is_lost() => {
                let ids = [current.shard_id.clone()];
                let fresh = store.get(stream, &ids).await.map_err(|e| {
                    Failure::failed(format!("reading the row of `{}` again: {e}", ids[0]))
                })?;
                let Some(fresh) = fresh.into_iter().next() else {
                    return Err(Failure::failed(format!(
                        "the row of `{}` was deleted meanwhile (the stream deleted?)",
                        ids[0]
                    )));
                };
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

/// Releases every lease; the error names those that could not be released.
async fn release_all(aws: &Aws, leases: impl IntoIterator<Item = Lease>) -> Result<(), String> {
    let mut failures = Vec::new();
    for lease in leases {
        if let Err(e) = aws.store.release(&lease).await {
            eprintln!(
                "kinesis-dataflow: releasing the lease of `{}` failed: {e}",
                lease.shard_id
            );
            failures.push(lease.shard_id.clone());
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("releasing {} failed", failures.join(", ")))
    }
}

/// Moves the roster row (when there is one), so running instances list at once and take the
/// released leases within about a second. Failure only delays that to their next listing.
async fn bump_roster(store: &kinesis_dataflow::DynamoLeaseStore, stream: &str, me: &str) {
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
    fn sequence_numbers_compare_as_numbers() {
        assert!(seq_le("9", "10"));
        assert!(!seq_le("10", "9"));
        assert!(seq_le("0042", "42"));
        assert!(seq_le(
            "49590338271490256608559692538361571095921575989136588898",
            "49590338271490256608559692538361571095921575989136588899"
        ));
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
