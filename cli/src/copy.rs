//! `lease-table copy`: copies an application's lease table into a new table in the by-stream
//! layout, so an application that began on a single-key table can move while it is stopped.
//!
//! It reads every row of the source (every stream), refuses while an instance still renews a
//! row, then fences the source: it takes every row (shard, instance and roster rows) under an
//! owner of its own, so an instance that was only frozen (a paused process or VM) finds its
//! leases lost at its next write instead of renewing and checkpointing on the old table while
//! the application runs on the new one. Only then does it create each shard's row in the
//! destination as it is (checkpoint, parents, counter, starting sequence number), without its
//! owner, and it reads the source again afterwards: a row that moved or vanished meanwhile
//! fails the copy. Instance rows are not copied: instances write their own when they start. A
//! row already in the destination is kept; one that differs from the source's is reported, and
//! the copy fails.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::Args;
use clap::builder::NonEmptyStringValueParser;
use kinesis_dataflow::DynamoLeaseStore;
use kinesis_dataflow::lease::{KeyLayout, Lease, LeaseRow, LeaseStore};

use crate::{Failure, args, aws, time};

/// The owner prefix `lease-table copy` takes the source table's rows as, to fence them.
pub const COPY_OWNER_PREFIX: &str = "kinesis-dataflow-copy-";

/// `lease-table copy --help`, after the options.
pub const COPY_AFTER_HELP: &str = "\
Copies every shard row of every stream from --from to --to, without its owner: checkpoints,
parents and counters as they are. The destination is created when missing, keyed by stream and
shard (partition key streamName, sort key shardId), so a listing reads one stream's rows with a
Query instead of scanning the whole table. Instance rows (worker:...) are not copied.

Stop the application first: while any row's counter moves within --lease-duration the copy is
refused, writing nothing (exit 3). Before writing, the copy takes every row of --from (owner
kinesis-dataflow-copy-...) and leaves them taken, so an instance that was only paused loses its
leases at its next write to the old table; a row that moved or vanished by the time the copy
is written fails the copy (exit 1). Then start the application on the new table, never again
on the old one. A row already in the destination is kept; one that differs from the source is
reported (exit 1). Running the copy again after a failure finishes it.";

/// `lease-table`'s commands.
#[derive(Debug, clap::Subcommand)]
pub enum LeaseTableCommand {
    /// copy the lease table into a new one keyed by stream and shard (stop the application
    /// first)
    #[command(after_help = COPY_AFTER_HELP)]
    Copy(CopyFlags),
}

/// `lease-table copy`'s flags.
#[derive(Debug, Args)]
pub struct CopyFlags {
    /// the lease table to copy
    #[arg(long, value_name = "TABLE", value_parser = NonEmptyStringValueParser::new())]
    from: String,
    /// the new lease table (created when missing)
    #[arg(long, value_name = "TABLE", value_parser = NonEmptyStringValueParser::new())]
    to: String,
    /// the application's lease duration (the library's default is 10): a row written within
    /// it belongs to a live instance
    #[arg(long = "lease-duration", value_name = "SECONDS", value_parser = args::lease_duration_ms, default_value = "10")]
    lease_duration_ms: u64,
    /// print what would be copied and stop
    #[arg(long)]
    dry_run: bool,
}

/// `lease-table copy`'s options, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyArgs {
    /// The table read.
    pub from: String,
    /// The table written.
    pub to: String,
    /// How long rows are watched for a live instance, in milliseconds.
    pub lease_duration_ms: u64,
    /// Print and stop.
    pub dry_run: bool,
}

/// The flags checked: two different tables.
pub fn copy_args(command: LeaseTableCommand) -> Result<CopyArgs, Failure> {
    let LeaseTableCommand::Copy(flags) = command;
    if flags.from == flags.to {
        return Err(Failure::usage(format!(
            "--from and --to both name `{}`; the copy goes to a new table",
            flags.to
        )));
    }
    Ok(CopyArgs {
        from: flags.from,
        to: flags.to,
        lease_duration_ms: flags.lease_duration_ms,
        dry_run: flags.dry_run,
    })
}

/// The rows to create in the destination: every shard row, without its owner, in (stream,
/// shard) order. Instance and roster rows (`worker:...`) are left out.
pub fn plan(rows: &[LeaseRow]) -> Vec<Lease> {
    rows.iter()
        .filter(|row| !row.lease.shard_id.starts_with("worker:"))
        .map(|row| Lease {
            owner: None,
            ..row.lease.clone()
        })
        .collect()
}

/// The rows that moved between two reads, `stream/shard (owner)`: a counter that changed, a
/// row that appeared, and a row that vanished (`stream/shard (owner, deleted)`).
pub fn moved(before: &[LeaseRow], after: &[LeaseRow]) -> Vec<String> {
    let key = |r: &LeaseRow| (r.lease.stream.clone(), r.lease.shard_id.clone());
    let counters: BTreeMap<(String, String), u64> =
        before.iter().map(|r| (key(r), r.lease.counter)).collect();
    let found: BTreeMap<(String, String), u64> =
        after.iter().map(|r| (key(r), r.lease.counter)).collect();
    let owner = |r: &LeaseRow| {
        r.lease
            .owner
            .clone()
            .unwrap_or_else(|| "no owner".to_owned())
    };
    let changed = after
        .iter()
        .filter(|r| counters.get(&key(r)) != Some(&r.lease.counter))
        .map(|r| format!("{}/{} ({})", r.lease.stream, r.lease.shard_id, owner(r)));
    let vanished = before
        .iter()
        .filter(|r| !found.contains_key(&key(r)))
        .map(|r| {
            format!(
                "{}/{} ({}, deleted)",
                r.lease.stream,
                r.lease.shard_id,
                owner(r)
            )
        });
    changed.chain(vanished).collect()
}

/// Whether a destination row is the copy of `wanted` (the counter aside).
fn same(found: &Lease, wanted: &Lease) -> bool {
    found.checkpoint == wanted.checkpoint
        && found.parents == wanted.parents
        && found.starting_sequence_number == wanted.starting_sequence_number
}

/// Runs `lease-table copy`.
pub async fn run(args: &CopyArgs) -> Result<(), Failure> {
    let (config, region) = aws::config().await?;
    let client = aws_sdk_dynamodb::Client::new(&config);
    let from = DynamoLeaseStore::new(client.clone(), args.from.clone())
        .map_err(|e| Failure::usage(format!("--from: {e}")))?;
    let to = DynamoLeaseStore::new(client, args.to.clone())
        .map_err(|e| Failure::usage(format!("--to: {e}")))?;
    from.check_table()
        .await
        .map_err(|e| aws::table_error(&args.from, &region, &e))?;
    let rows = read_still(&from, Duration::from_millis(args.lease_duration_ms)).await?;
    let copies = plan(&rows);
    let streams: BTreeMap<&str, usize> = copies.iter().fold(BTreeMap::new(), |mut n, l| {
        *n.entry(l.stream.as_str()).or_default() += 1;
        n
    });
    for (stream, count) in &streams {
        println!("{stream}: {count} shard rows");
    }
    if args.dry_run {
        println!("dry run: nothing written to `{}`", args.to);
        return Ok(());
    }
    to.prepare()
        .await
        .map_err(|e| Failure::failed(e.to_string()))?;
    if to
        .key_layout()
        .await
        .map_err(|e| Failure::failed(e.to_string()))?
        != KeyLayout::ByStream
    {
        return Err(Failure::usage(format!(
            "--to `{}` is a single-key table; name a new table (it is created keyed by stream and \
             shard)",
            args.to
        )));
    }
    let me = format!(
        "{COPY_OWNER_PREFIX}{}-{}",
        std::process::id(),
        time::now_ms()
    );
    let fenced = fence(&from, &rows, &me).await?;
    let (created, kept, differing) = write(&to, &plan(&fenced)).await?;
    let after = from
        .list_every_stream()
        .await
        .map_err(|e| Failure::failed(e.to_string()))?;
    let since = moved(&fenced, &after);
    if !since.is_empty() {
        return Err(Failure::failed(format!(
            "rows of `{}` moved while the copy was written: {}; an instance still writes it: \
             stop the application, then run the copy again (the rows of `{}` are kept)",
            args.from,
            since.join(", "),
            args.to
        )));
    }
    if !differing.is_empty() {
        return Err(Failure::failed(format!(
            "{} rows of `{}` differ from `{}`'s and were left as they are: {}",
            differing.len(),
            args.to,
            args.from,
            differing.join(", ")
        )));
    }
    println!(
        "copied {created} shard rows of {} streams from `{}` to `{}` ({kept} already there); \
         start the application on `{}`",
        streams.len(),
        args.from,
        args.to,
        args.to
    );
    Ok(())
}

/// Every row of `table`, refused when a counter moves within `wait` (read again after it
/// only when some row has an owner).
async fn read_still(table: &DynamoLeaseStore, wait: Duration) -> Result<Vec<LeaseRow>, Failure> {
    let read = || async {
        table
            .list_every_stream()
            .await
            .map_err(|e| Failure::failed(e.to_string()))
    };
    let rows = read().await?;
    if rows.iter().all(|r| r.lease.owner.is_none()) {
        return Ok(rows);
    }
    eprintln!(
        "some rows have an owner: watching them for {} ms for a live instance",
        wait.as_millis()
    );
    tokio::time::sleep(wait).await;
    let again = read().await?;
    let live = moved(&rows, &again);
    if !live.is_empty() {
        return Err(Failure::refused(format!(
            "instances still write `{}`: {}; stop the application first (nothing written)",
            table.table(),
            live.join(", ")
        )));
    }
    Ok(again)
}

/// Takes every row of `table` for `me`, on condition that it is as `rows` read it, so that
/// whoever held it fails its next write (renewal, checkpoint) as lost: the rows as taken. A
/// row written meanwhile refuses the copy; the rows taken so far are released.
async fn fence(
    table: &DynamoLeaseStore,
    rows: &[LeaseRow],
    me: &str,
) -> Result<Vec<LeaseRow>, Failure> {
    let mut fenced = Vec::with_capacity(rows.len());
    for row in rows {
        match table.take(&row.lease, me).await {
            Ok(lease) => fenced.push(LeaseRow {
                lease,
                last_written_ms: None,
            }),
            Err(e) => {
                let mut released = Vec::new();
                for taken in &fenced {
                    if let Err(e) = table.release(&taken.lease).await {
                        released.push(format!(
                            "{}/{}: {e}",
                            taken.lease.stream, taken.lease.shard_id
                        ));
                    }
                }
                let leases = if released.is_empty() {
                    "the rows taken so far were released".to_owned()
                } else {
                    format!(
                        "releasing some rows taken failed ({}): they are free again once they \
                         expire",
                        released.join(", ")
                    )
                };
                let what = format!("{}/{}", row.lease.stream, row.lease.shard_id);
                return Err(if e.is_lost() {
                    Failure::refused(format!(
                        "instances still write `{}`: {what} moved; stop the application first \
                         (nothing copied; {leases})",
                        table.table()
                    ))
                } else {
                    Failure::failed(format!(
                        "taking {what} of `{}` failed: {e} (nothing copied; {leases})",
                        table.table()
                    ))
                });
            }
        }
    }
    Ok(fenced)
}

/// Creates each row; the rows created, the rows already there as wanted, and those that differ.
async fn write(
    to: &DynamoLeaseStore,
    copies: &[Lease],
) -> Result<(usize, usize, Vec<String>), Failure> {
    let failed = |e: kinesis_dataflow::lease::LeaseError| Failure::failed(e.to_string());
    let (mut created, mut kept, mut differing) = (0, 0, Vec::new());
    let mut existing: BTreeMap<String, Vec<Lease>> = BTreeMap::new();
    for lease in copies {
        if to.create(lease).await.map_err(failed)? {
            created += 1;
            continue;
        }
        if !existing.contains_key(&lease.stream) {
            let rows = to.list(&lease.stream).await.map_err(failed)?;
            existing.insert(lease.stream.clone(), rows);
        }
        let found = existing[&lease.stream]
            .iter()
            .find(|row| row.shard_id == lease.shard_id);
        match found {
            Some(row) if same(row, lease) => kept += 1,
            _ => differing.push(format!("{}/{}", lease.stream, lease.shard_id)),
        }
    }
    Ok((created, kept, differing))
}

#[cfg(test)]
mod tests {
    use kinesis_dataflow::position::Checkpoint;

    use super::*;

    fn row(stream: &str, shard: &str, owner: Option<&str>, counter: u64) -> LeaseRow {
        let mut lease = Lease::new(stream, shard, vec![]);
        lease.owner = owner.map(str::to_owned);
        lease.counter = counter;
        lease.checkpoint = Some(Checkpoint::Sequence("42".into()));
        LeaseRow {
            lease,
            last_written_ms: Some(1),
        }
    }

    #[test]
    fn shard_rows_are_copied_without_owners_and_instance_rows_are_not() {
        let rows = [
            row("a", "shardId-0", Some("i-1"), 7),
            row("a", "worker:", None, 3),
            row("a", "worker:i-1", Some("i-1"), 9),
            row("b", "shardId-0", None, 2),
        ];
        let copies = plan(&rows);
        assert_eq!(copies.len(), 2);
        assert_eq!(copies[0].owner, None);
        assert_eq!(copies[0].counter, 7);
        assert_eq!(copies[0].checkpoint, rows[0].lease.checkpoint);
        assert_eq!(copies[1].stream, "b");
    }

    #[test]
    fn a_moved_counter_names_the_row_and_its_owner() {
        let before = [row("a", "s0", Some("i-1"), 1), row("a", "s1", None, 1)];
        let after = [row("a", "s0", Some("i-1"), 2), row("a", "s1", None, 1)];
        assert_eq!(moved(&before, &after), ["a/s0 (i-1)"]);
        assert!(moved(&before, &before).is_empty());
        // A row that appeared meanwhile was written by someone.
        let new = [
            row("a", "s0", Some("i-1"), 1),
            row("a", "s1", None, 1),
            row("a", "s2", None, 0),
        ];
        assert_eq!(moved(&before, &new), ["a/s2 (no owner)"]);
        // A row that vanished meanwhile was deleted by someone.
        assert_eq!(
            moved(&before, &after[..1]),
            ["a/s0 (i-1)", "a/s1 (no owner, deleted)"]
        );
    }

    #[test]
    fn the_same_table_twice_is_refused() {
        let err = copy_args(LeaseTableCommand::Copy(CopyFlags {
            from: "t1".into(),
            to: "t1".into(),
            lease_duration_ms: 10_000,
            dry_run: false,
        }))
        .unwrap_err();
        assert_eq!(err.code, 2);
        assert!(err.message.contains("`t1`"), "{}", err.message);
    }
}
