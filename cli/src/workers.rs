//! `workers`: the instances (worker rows `worker:<owner>`), when each was last seen, and the
//! leases each holds.

use std::collections::BTreeMap;

use kinesis_dataflow::lease::LeaseRow;
use serde_json::{Value, json};

use crate::Failure;
use crate::args::WorkersArgs;
use crate::aws::{self, WORKER_PREFIX};
use crate::output;
use crate::time;

/// One owner: an instance with a worker row, or a holder of leases without one.
#[derive(Debug)]
pub struct Worker {
    /// The owner id.
    pub owner: String,
    /// Its worker row, if any.
    pub row: Option<LeaseRow>,
    /// The shards it holds.
    pub shards: Vec<String>,
}

impl Worker {
    /// `active`, `declared gone` (its row was released by another instance), or `no worker
    /// row`.
    pub fn state(&self) -> &'static str {
        match &self.row {
            Some(row) if row.lease.owner.is_some() => "active",
            Some(_) => "declared gone",
            None => "no worker row",
        }
    }
}

/// The owners of `rows`, by owner id.
pub fn workers(rows: &[LeaseRow]) -> BTreeMap<String, Worker> {
    let mut workers: BTreeMap<String, Worker> = BTreeMap::new();
    for row in rows {
        if let Some(owner) = aws::worker_owner(&row.lease.shard_id) {
            workers
                .entry(owner.to_owned())
                .or_insert_with(|| Worker {
                    owner: owner.to_owned(),
                    row: None,
                    shards: Vec::new(),
                })
                .row = Some(row.clone());
        }
    }
    for row in rows {
        if aws::is_worker_or_roster(&row.lease.shard_id) {
            continue;
        }
        if let Some(owner) = &row.lease.owner {
            workers
                .entry(owner.clone())
                .or_insert_with(|| Worker {
                    owner: owner.clone(),
                    row: None,
                    shards: Vec::new(),
                })
                .shards
                .push(row.lease.shard_id.clone());
        }
    }
    workers
}

/// Runs `workers`.
pub async fn run(args: &WorkersArgs) -> Result<(), Failure> {
    let aws = aws::connect(&args.target).await?;
    let stream = &args.target.stream;
    // The stream must exist: a typo should not look like an application with no instances.
    let shards = aws.shards(stream).await?;
    let rows = aws.rows(stream).await?;
    let now = time::now_ms();
    let roster = rows.iter().find(|r| r.lease.shard_id == WORKER_PREFIX);
    let workers = workers(&rows);
    let shard_rows = rows
        .iter()
        .filter(|r| !aws::is_worker_or_roster(&r.lease.shard_id))
        .count();
    if args.json {
        let list: Vec<Value> = workers
            .values()
            .map(|w| {
                let row = w.row.as_ref();
                let limits = row.and_then(|r| r.lease.limits);
                json!({
                    "owner": w.owner,
                    "state": w.state(),
                    "counter": row.map(|r| r.lease.counter),
                    "last_written_ms": row.and_then(|r| r.last_written_ms),
                    "last_seen_ms_ago": row.and_then(|r| r.last_written_ms).map(|t| now.saturating_sub(t)),
                    "capacity": limits.map(|l| l.weight),
                    "max_leases": limits.and_then(|l| l.max_leases),
                    "leases": w.shards.len(),
                    "shards": w.shards,
                })
            })
            .collect();
        output::print_json(
            &json!({
                "table": args.target.table,
                "stream": stream,
                "region": aws.region,
                "read_at_ms": now,
                "read_at": time::format(now),
                "shards": shards.len(),
                "shard_rows": shard_rows,
                "roster": roster.map(|r| json!({
                    "counter": r.lease.counter,
                    "last_written_ms": r.last_written_ms,
                })),
                "workers": list,
            }),
            false,
        );
        return Ok(());
    }
    let mut out = format!(
        "stream `{stream}` (region {}), lease table `{}`, read at {}\n",
        aws.region,
        args.target.table,
        time::format(now)
    );
    let active = workers.values().filter(|w| w.state() == "active").count();
    out.push_str(&format!(
        "{}; {}, {shard_rows} shard rows, {} held",
        output::count(active, "active instance"),
        output::count(shards.len(), "shard"),
        workers.values().map(|w| w.shards.len()).sum::<usize>()
    ));
    match roster {
        Some(r) => out.push_str(&format!(
            "; roster row moved {} ago (counter {})\n\n",
            output::age(r.last_written_ms, now),
            r.lease.counter
        )),
        None => out.push_str("; no roster row (no instance has run on this stream)\n\n"),
    }
    if workers.is_empty() {
        out.push_str("no instances: none is running, and no lease is held\n");
        print!("{out}");
        return Ok(());
    }
    let lines: Vec<Vec<String>> = workers
        .values()
        .map(|w| {
            let row = w.row.as_ref();
            let limits = row.and_then(|r| r.lease.limits).unwrap_or_default();
            vec![
                w.owner.clone(),
                w.state().to_owned(),
                row.map_or_else(|| "-".to_owned(), |r| output::age(r.last_written_ms, now)),
                row.map_or_else(|| "-".to_owned(), |r| r.lease.counter.to_string()),
                format!(
                    "{}{}",
                    limits.weight,
                    limits
                        .max_leases
                        .map_or_else(String::new, |m| format!(" (max {m})"))
                ),
                w.shards.len().to_string(),
                w.shards.join(" "),
            ]
        })
        .collect();
    out.push_str(&output::table(
        &[
            "OWNER",
            "STATE",
            "LAST SEEN",
            "COUNTER",
            "CAPACITY",
            "LEASES",
            "SHARDS",
        ],
        &lines,
    ));
    print!("{out}");
    Ok(())
}
