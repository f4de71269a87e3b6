//! `workers`: the instances (worker rows `worker:<owner>`), when each was last seen, and the
//! leases each holds.

use std::collections::BTreeMap;

use kinesis_dataflow::lease::LeaseRow;
use serde_json::{Value, json};

use crate::Failure;
use crate::args::{Target, WorkersArgs};
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
    let reading = Reading {
        target: &args.target,
        region: &aws.region,
        at_ms: time::now_ms(),
        shards: shards.len(),
        rows: &rows,
    };
    if args.json {
        output::print_json(&to_json(&reading), false);
    } else {
        print!("{}", render(&reading));
    }
    Ok(())
}

/// What `workers` read: the stream's shard count and the lease rows, and when.
struct Reading<'a> {
    target: &'a Target,
    region: &'a str,
    at_ms: u64,
    shards: usize,
    rows: &'a [LeaseRow],
}

impl Reading<'_> {
    /// The roster row (`worker:`), if any.
    fn roster(&self) -> Option<&LeaseRow> {
        self.rows.iter().find(|r| r.lease.shard_id == WORKER_PREFIX)
    }

    /// How many rows are shards' (not workers' nor the roster).
    fn shard_rows(&self) -> usize {
        self.rows
            .iter()
            .filter(|r| !aws::is_worker_or_roster(&r.lease.shard_id))
            .count()
    }
}

/// The JSON document of `workers --json`.
fn to_json(reading: &Reading<'_>) -> Value {
    let list: Vec<Value> = workers(reading.rows)
        .values()
        .map(|w| worker_json(w, reading.at_ms))
        .collect();
    json!({
        "table": reading.target.table,
        "stream": reading.target.stream,
        "region": reading.region,
        "read_at_ms": reading.at_ms,
        "read_at": time::format(reading.at_ms),
        "shards": reading.shards,
        "shard_rows": reading.shard_rows(),
        "roster": reading.roster().map(|r| json!({
            "counter": r.lease.counter,
            "last_written_ms": r.last_written_ms,
        })),
        "workers": list,
    })
}

/// One owner in the JSON document.
fn worker_json(w: &Worker, now: u64) -> Value {
    let row = w.row.as_ref();
    let limits = row.and_then(|r| r.lease.limits);
    let last_written = row.and_then(|r| r.last_written_ms);
    json!({
        "owner": w.owner,
        "state": w.state(),
        "counter": row.map(|r| r.lease.counter),
        "last_written_ms": last_written,
        "last_seen_ms_ago": last_written.map(|t| now.saturating_sub(t)),
        "capacity": limits.map(|l| l.weight),
        "max_leases": limits.and_then(|l| l.max_leases),
        "liveness_group": row.and_then(|r| r.lease.liveness_group.as_deref()),
        "leases": w.shards.len(),
        "shards": w.shards,
    })
}

/// The table form: a header, the summary, and one line per owner.
fn render(reading: &Reading<'_>) -> String {
    let now = reading.at_ms;
    let workers = workers(reading.rows);
    let mut out = format!(
        "stream `{}` (region {}), lease table `{}`, read at {}\n",
        reading.target.stream,
        reading.region,
        reading.target.table,
        time::format(now)
    );
    let active = workers.values().filter(|w| w.state() == "active").count();
    out.push_str(&format!(
        "{}; {}, {} shard rows, {} held",
        output::count(active, "active instance"),
        output::count(reading.shards, "shard"),
        reading.shard_rows(),
        workers.values().map(|w| w.shards.len()).sum::<usize>()
    ));
    match reading.roster() {
        Some(r) => out.push_str(&format!(
            "; roster row moved {} ago (counter {})\n\n",
            output::age(r.last_written_ms, now),
            r.lease.counter
        )),
        None => out.push_str("; no roster row (no instance has run on this stream)\n\n"),
    }
    if workers.is_empty() {
        out.push_str("no instances: none is running, and no lease is held\n");
        return out;
    }
    let lines: Vec<Vec<String>> = workers.values().map(|w| worker_cells(w, now)).collect();
    out.push_str(&output::table(
        &[
            "OWNER",
            "STATE",
            "LAST SEEN",
            "COUNTER",
            "CAPACITY",
            "GROUP",
            "LEASES",
            "SHARDS",
        ],
        &lines,
    ));
    out
}

/// One owner's line of the table.
fn worker_cells(w: &Worker, now: u64) -> Vec<String> {
    let row = w.row.as_ref();
    let limits = row.and_then(|r| r.lease.limits).unwrap_or_default();
    let max = limits
        .max_leases
        .map_or_else(String::new, |m| format!(" (max {m})"));
    vec![
        w.owner.clone(),
        w.state().to_owned(),
        row.map_or_else(|| "-".to_owned(), |r| output::age(r.last_written_ms, now)),
        row.map_or_else(|| "-".to_owned(), |r| r.lease.counter.to_string()),
        format!("{}{max}", limits.weight),
        group(row),
        w.shards.len().to_string(),
        w.shards.join(" "),
    ]
}

/// The GROUP cell: the liveness group the instance named in its row (`<anchor stream>/<id>`,
/// when it reads several streams as one `MultiSubscription`), `-` otherwise.
fn group(row: Option<&LeaseRow>) -> String {
    row.and_then(|r| r.lease.liveness_group.clone())
        .unwrap_or_else(|| "-".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kinesis_dataflow::lease::Lease;

    fn worker_row(owner: &str, group: Option<&str>) -> LeaseRow {
        let mut lease = Lease::new("payments", format!("{WORKER_PREFIX}{owner}"), Vec::new());
        lease.owner = Some(owner.to_owned());
        lease.counter = 7;
        lease.liveness_group = group.map(str::to_owned);
        LeaseRow {
            lease,
            last_written_ms: Some(1_000),
        }
    }

    /// An instance of a `MultiSubscription` names its liveness group in its worker row:
    /// `workers` shows it, in the table and in the JSON document; a plain one shows none.
    #[test]
    fn the_liveness_group_of_each_instance_is_shown() {
        let rows = [
            worker_row("a", Some("orders/42-9f3a")),
            worker_row("b", None),
        ];
        let target = Target {
            table: "t".to_owned(),
            stream: "payments".to_owned(),
        };
        let reading = Reading {
            target: &target,
            region: "eu-west-1",
            at_ms: 2_000,
            shards: 2,
            rows: &rows,
        };
        let json = to_json(&reading);
        assert_eq!(json["workers"][0]["liveness_group"], "orders/42-9f3a");
        assert!(json["workers"][1]["liveness_group"].is_null(), "{json:#}");
        let table = render(&reading);
        let line = |owner: &str| {
            let found = table.lines().find(|l| l.starts_with(owner));
            found.unwrap_or_else(|| panic!("no line for {owner}:\n{table}"))
        };
        assert!(table.contains("GROUP"), "{table}");
        assert!(line("a ").contains("orders/42-9f3a"), "{table}");
        assert!(line("b ").contains(" - "), "{table}");
    }
}
