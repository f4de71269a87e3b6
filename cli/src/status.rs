//! `status`: the shard tree, and per shard its owner, checkpoint, lease counter, age and lag.

use std::collections::{BTreeMap, HashMap, HashSet};

use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata};
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::ShardIteratorType;
use futures::StreamExt;
use kinesis_dataflow::StartingPoint;
use kinesis_dataflow::lease::{KeyLayout, LeaseRow};
use kinesis_dataflow::position::Checkpoint;
use serde_json::{Value, json};

use crate::Failure;
use crate::args::StatusArgs;
use crate::aws::{self, Aws, Shard, is_earlier_stream};
use crate::output;
use crate::time;

/// The most GetRecords calls spent counting one shard's records behind.
const MAX_COUNT_CALLS: u32 = 10;
/// How many shards' lag is measured at once.
const LAG_CONCURRENCY: usize = 8;

/// How far a shard's checkpoint is behind the tip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lag {
    /// Not measured (`--records-cap 0`, or no row to start from).
    NotMeasured,
    /// The shard is finished (SHARD_END): nothing behind.
    Finished,
    /// Measured from the checkpoint.
    Measured {
        /// MillisBehindLatest of the first record after the checkpoint.
        millis_behind: Option<i64>,
        /// Records counted between the checkpoint and the tip.
        records: u64,
        /// False when counting stopped at the cap (or the call budget) before the tip.
        exact: bool,
    },
    /// A call failed.
    Failed(String),
}

/// One line of the tree: a listed shard (with its row, if any).
struct Line {
    shard: Shard,
    depth: usize,
    children: Vec<String>,
    row: Option<LeaseRow>,
    /// The row was written for a shard of an earlier stream of the same name (deleted and
    /// created again): an instance replaces it once nobody holds it and reads the shard from
    /// its beginning, so its checkpoint says nothing of this stream.
    earlier: bool,
    waiting: bool,
    lag: Lag,
}

impl Line {
    /// The row says the shard was read to its end: SHARD_END, in a row of this stream.
    fn is_finished(&self) -> bool {
        !self.earlier && self.row.as_ref().is_some_and(|r| r.lease.is_finished())
    }
}

/// One reading of the table and the stream.
struct Snapshot {
    at_ms: u64,
    lines: Vec<Line>,
    /// Rows of shards the stream no longer lists (past the retention period).
    unlisted: Vec<LeaseRow>,
}

/// Runs `status`.
pub async fn run(args: &StatusArgs) -> Result<(), Failure> {
    let aws = aws::connect(&args.target).await?;
    let stream = &args.target.stream;
    let mut previous: Option<HashMap<String, u64>> = None;
    let mut round: u64 = 0;
    loop {
        round += 1;
        match snapshot(&aws, stream, args.records_cap).await {
            Ok(snap) => {
                let counters: HashMap<String, u64> = snap
                    .lines
                    .iter()
                    .filter_map(|l| Some((l.shard.id.clone(), l.row.as_ref()?.lease.counter)))
                    .collect();
                if args.json {
                    let doc = to_json(&aws, args, &snap, previous.as_ref());
                    output::print_json(&doc, args.watch.is_some());
                } else {
                    print!("{}", render(&aws, args, &snap, previous.as_ref(), round));
                }
                previous = Some(counters);
            }
            // The first reading fails the command; a later one (a throttle, a network blip)
            // only costs a round of --watch.
            Err(failure) if round > 1 => {
                eprintln!(
                    "kinesis-dataflow: {} (round {round}; trying again)",
                    failure.message
                );
            }
            Err(failure) => return Err(failure),
        }
        let Some(every) = args.watch else { break };
        if args.watch_count.is_some_and(|k| round >= k) {
            break;
        }
        tokio::time::sleep(every).await;
    }
    Ok(())
}

/// Reads the stream's shards and the lease rows, and measures each shard's lag.
async fn snapshot(aws: &Aws, stream: &str, records_cap: u64) -> Result<Snapshot, Failure> {
    let shards = aws.shards(stream).await?;
    let rows = aws.rows(stream).await?;
    let at_ms = time::now_ms();
    let mut by_id: BTreeMap<String, LeaseRow> = rows
        .into_iter()
        .filter(|r| !aws::is_worker_or_roster(&r.lease.shard_id))
        .map(|r| (r.lease.shard_id.clone(), r))
        .collect();
    let mut lines = lines(&shards, &by_id);
    let listed: HashSet<&str> = shards.iter().map(|s| s.id.as_str()).collect();
    by_id.retain(|id, _| !listed.contains(id.as_str()));
    if records_cap > 0 {
        measure_lags(aws, stream, &mut lines, records_cap).await;
    }
    Ok(Snapshot {
        at_ms,
        lines,
        unlisted: by_id.into_values().collect(),
    })
}

/// The lines of the tree, each with its row and whether that row waits for its parents; the
/// lag not measured yet.
fn lines(shards: &[Shard], by_id: &BTreeMap<String, LeaseRow>) -> Vec<Line> {
    let listed: HashMap<&str, &Shard> = shards.iter().map(|s| (s.id.as_str(), s)).collect();
    // As the library judges a parent: past the retention period, or SHARD_END in a row of
    // this stream (not of an earlier stream of the same name).
    let finished = |id: &str| match listed.get(id) {
        None => true,
        Some(shard) => by_id
            .get(id)
            .is_some_and(|r| r.lease.is_finished() && !is_earlier_stream(&r.lease, shard)),
    };
    tree_order(shards)
        .into_iter()
        .map(|(depth, index)| {
            let shard = shards[index].clone();
            let children = shards
                .iter()
                .filter(|s| s.parents.contains(&shard.id))
                .map(|s| s.id.clone())
                .collect();
            let row = by_id.get(&shard.id).cloned();
            let earlier = row
                .as_ref()
                .is_some_and(|r| is_earlier_stream(&r.lease, &shard));
            let waiting =
                row.is_some() && !finished(&shard.id) && shard.parents.iter().any(|p| !finished(p));
            Line {
                row,
                earlier,
                shard,
                depth,
                children,
                waiting,
                lag: Lag::NotMeasured,
            }
        })
        .collect()
}

/// Measures the lag of every line with a row, `LAG_CONCURRENCY` shards at a time.
async fn measure_lags(aws: &Aws, stream: &str, lines: &mut [Line], cap: u64) {
    let lags: Vec<Lag> = futures::stream::iter(lines.iter())
        .map(|line| async move {
            match &line.row {
                None => Lag::NotMeasured,
                // Its checkpoint is an earlier stream's: the shard is read from its beginning.
                Some(_) if line.earlier => lag(aws, stream, &line.shard.id, None, cap).await,
                Some(row) => {
                    lag(
                        aws,
                        stream,
                        &line.shard.id,
                        row.lease.checkpoint.as_ref(),
                        cap,
                    )
                    .await
                }
            }
        })
        .buffered(LAG_CONCURRENCY)
        .collect()
        .await;
    for (line, lag) in lines.iter_mut().zip(lags) {
        line.lag = lag;
    }
}

/// The listed shards in tree order, each with its depth: roots (no listed parent) in id order,
/// each followed by its children. A merged shard appears under its first listed parent.
fn tree_order(shards: &[Shard]) -> Vec<(usize, usize)> {
    let index: HashMap<&str, usize> = shards
        .iter()
        .enumerate()
        .map(|(i, s)| (s.id.as_str(), i))
        .collect();
    let mut children: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, shard) in shards.iter().enumerate() {
        match shard.parents.iter().find_map(|p| index.get(p.as_str())) {
            Some(&parent) => children.entry(parent).or_default().push(i),
            None => roots.push(i),
        }
    }
    let mut order = Vec::with_capacity(shards.len());
    let mut seen = HashSet::new();
    let mut stack: Vec<(usize, usize)> = roots.into_iter().rev().map(|i| (0, i)).collect();
    while let Some((depth, i)) = stack.pop() {
        if !seen.insert(i) {
            continue;
        }
        order.push((depth, i));
        if let Some(kids) = children.get(&i) {
            stack.extend(kids.iter().rev().map(|&k| (depth + 1, k)));
        }
    }
    // A parent cycle cannot come from Kinesis; show such shards flat rather than lose them.
    for i in 0..shards.len() {
        if !seen.contains(&i) {
            order.push((0, i));
        }
    }
    order
}

/// Where a reader taking the shard now would open, as the library decides it from the row.
fn resume_point(checkpoint: Option<&Checkpoint>) -> Option<StartingPoint> {
    Some(match checkpoint {
        // No checkpoint: a descendant, read from its beginning.
        None => StartingPoint::TrimHorizon,
        Some(Checkpoint::ShardEnd) => return None,
        Some(Checkpoint::Sequence(seq)) => StartingPoint::AfterSequence(seq.clone()),
        // The aggregate at `seq` is partly read: count it as one record behind.
        Some(Checkpoint::SubSequence(seq, _)) => StartingPoint::AtSequence(seq.clone()),
        Some(Checkpoint::Start(point) | Checkpoint::Initial(point)) => match point {
            StartingPoint::AfterSubSequence(seq, _) => StartingPoint::AtSequence(seq.clone()),
            other => other.clone(),
        },
    })
}

/// Measures how far `checkpoint` is behind the tip: MillisBehindLatest of a GetRecords of one
/// record from there, then GetRecords until the tip, counting up to `cap` records.
async fn lag(
    aws: &Aws,
    stream: &str,
    shard: &str,
    checkpoint: Option<&Checkpoint>,
    cap: u64,
) -> Lag {
    let Some(point) = resume_point(checkpoint) else {
        return Lag::Finished;
    };
    match shard_iterator(aws, stream, shard, &point).await {
        Ok(iterator) => count_behind(aws, shard, iterator, cap).await,
        Err(message) => Lag::Failed(message),
    }
}

/// A shard iterator at `point` (GetShardIterator).
async fn shard_iterator(
    aws: &Aws,
    stream: &str,
    shard: &str,
    point: &StartingPoint,
) -> Result<Option<String>, String> {
    let request = aws
        .kinesis
        .get_shard_iterator()
        .stream_name(stream)
        .shard_id(shard)
        .shard_iterator_type(ShardIteratorType::from(point.iterator_type()));
    let request = match point {
        StartingPoint::AtTimestamp(ms) => request.timestamp(DateTime::from_millis(
            i64::try_from(*ms).unwrap_or(i64::MAX),
        )),
        StartingPoint::AtSequence(seq)
        | StartingPoint::AfterSequence(seq)
        | StartingPoint::AfterSubSequence(seq, _) => request.starting_sequence_number(seq),
        StartingPoint::TrimHorizon | StartingPoint::Latest => request,
    };
    match request.send().await {
        Ok(out) => Ok(out.shard_iterator),
        Err(err) => Err(call_error("GetShardIterator", shard, &err)),
    }
}

/// How many records the next GetRecords of the count asks for: one first (for its
/// MillisBehindLatest), then what is left under the cap; `None` once the cap or the call budget
/// is reached.
fn next_limit(calls: u32, records: u64, cap: u64) -> Option<u64> {
    if calls >= MAX_COUNT_CALLS || records >= cap {
        None
    } else if calls == 0 {
        Some(1)
    } else {
        Some((cap - records).min(10_000))
    }
}

/// Counts the records from `iterator` to the tip (GetRecords), up to `cap`.
async fn count_behind(aws: &Aws, shard: &str, mut iterator: Option<String>, cap: u64) -> Lag {
    let mut records: u64 = 0;
    let mut millis_behind = None;
    let mut calls = 0;
    let mut at_tip = false;
    while let Some(current) = iterator.take() {
        let Some(limit) = next_limit(calls, records, cap) else {
            iterator = Some(current);
            break;
        };
        let out = match aws
            .kinesis
            .get_records()
            .shard_iterator(current)
            .limit(i32::try_from(limit).unwrap_or(10_000))
            .send()
            .await
        {
            Ok(out) => out,
            Err(err) => return Lag::Failed(call_error("GetRecords", shard, &err)),
        };
        calls += 1;
        if calls == 1 {
            millis_behind = out.millis_behind_latest();
        }
        let got = out.records().len() as u64;
        records += got;
        iterator = out.next_shard_iterator().map(str::to_owned);
        if got == 0 && out.millis_behind_latest() == Some(0) {
            at_tip = true;
            break;
        }
    }
    // No next iterator: the end of a closed shard was reached.
    Lag::Measured {
        millis_behind,
        records,
        exact: at_tip || iterator.is_none(),
    }
}

/// A failed Kinesis call on a shard, in a line: the error code and message when there are.
fn call_error<E, R>(call: &str, shard: &str, err: &aws_sdk_kinesis::error::SdkError<E, R>) -> String
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    match err.code() {
        Some(code) => format!(
            "{call} on {shard}: {code}: {}",
            err.message().unwrap_or("(no message)")
        ),
        None => format!("{call} on {shard}: {}", DisplayErrorContext(err)),
    }
}

/// The lag in JSON: `lag` and `lag_error`.
fn lag_json(lag: &Lag) -> (Value, Value) {
    match lag {
        Lag::NotMeasured => (Value::Null, Value::Null),
        Lag::Finished => (
            json!({"millis_behind": 0, "records_behind": 0, "records_behind_exact": true}),
            Value::Null,
        ),
        Lag::Measured {
            millis_behind,
            records,
            exact,
        } => (
            json!({
                "millis_behind": millis_behind,
                "records_behind": records,
                "records_behind_exact": exact,
            }),
            Value::Null,
        ),
        Lag::Failed(message) => (Value::Null, Value::String(message.clone())),
    }
}

/// A lease row in JSON.
fn row_json(row: &LeaseRow, at_ms: u64) -> Value {
    let checkpoint = row.lease.checkpoint.as_ref();
    json!({
        "owner": row.lease.owner,
        "counter": row.lease.counter,
        "checkpoint": checkpoint.map(|c| c.encode()),
        "checkpoint_kind": output::checkpoint_kind(checkpoint),
        "last_written_ms": row.last_written_ms,
        "age_ms": row.last_written_ms.map(|w| at_ms.saturating_sub(w)),
    })
}

/// The JSON document of one reading.
fn to_json(
    aws: &Aws,
    args: &StatusArgs,
    snap: &Snapshot,
    previous: Option<&HashMap<String, u64>>,
) -> Value {
    let shards: Vec<Value> = snap
        .lines
        .iter()
        .map(|line| {
            let (lag, lag_error) = lag_json(&line.lag);
            let row = line.row.as_ref().map(|r| row_json(r, snap.at_ms));
            let delta = match (&line.row, previous.and_then(|p| p.get(&line.shard.id))) {
                (Some(row), Some(before)) => json!(row.lease.counter.saturating_sub(*before)),
                _ => Value::Null,
            };
            json!({
                "shard_id": line.shard.id,
                "parents": line.shard.parents,
                "children": line.children,
                "depth": line.depth,
                "state": if line.shard.is_closed() { "closed" } else { "open" },
                "starting_sequence_number": line.shard.starting_sequence_number,
                "ending_sequence_number": line.shard.ending_sequence_number,
                "finished": line.is_finished(),
                "earlier_stream_row": line.earlier,
                "waiting_for_parents": line.waiting,
                "row": row,
                "counter_delta": delta,
                "lag": lag,
                "lag_error": lag_error,
            })
        })
        .collect();
    let unlisted: Vec<Value> = snap
        .unlisted
        .iter()
        .map(|r| {
            let mut v = row_json(r, snap.at_ms);
            v["shard_id"] = json!(r.lease.shard_id);
            v
        })
        .collect();
    json!({
        "table": args.target.table,
        "key_layout": match aws.layout {
            KeyLayout::SingleKey => "single_key",
            _ => "by_stream",
        },
        "stream": args.target.stream,
        "region": aws.region,
        "read_at_ms": snap.at_ms,
        "read_at": time::format(snap.at_ms),
        "shards": shards,
        "unlisted_rows": unlisted,
    })
}

/// The table form of one reading: a header, the summary, the shard table and the notes.
fn render(
    aws: &Aws,
    args: &StatusArgs,
    snap: &Snapshot,
    previous: Option<&HashMap<String, u64>>,
    round: u64,
) -> String {
    let mut out = String::new();
    if args.watch.is_some() {
        out.push_str(&format!("--- round {round} ---\n"));
    }
    out.push_str(&format!(
        "stream `{}` (region {}), lease table `{}`, read at {}\n",
        args.target.stream,
        aws.region,
        args.target.table,
        time::format(snap.at_ms)
    ));
    out.push_str(&summary(snap));
    let mut notes = Vec::new();
    if aws.layout == KeyLayout::SingleKey {
        notes.push(format!(
            "lease table `{}` is keyed by leaseKey alone (created before the by-stream layout): \
             each listing scans every stream's rows; `kinesis-dataflow lease-table copy` moves \
             a stopped application to a table keyed by stream",
            args.target.table
        ));
    }
    let rows: Vec<Vec<String>> = snap
        .lines
        .iter()
        .map(|line| shard_cells(line, previous, snap.at_ms, &mut notes))
        .collect();
    out.push_str(&output::table(&HEADERS, &rows));
    notes.extend(snap.unlisted.iter().map(unlisted_note));
    if !notes.is_empty() {
        out.push('\n');
        for note in notes {
            out.push_str(&format!("note: {note}\n"));
        }
    }
    out
}

/// The CHECKPOINT cell of a row of an earlier stream of the same name.
const EARLIER_STREAM_ROW: &str = "- (earlier stream's row)";

/// The columns of the shard table.
const HEADERS: [&str; 8] = [
    "SHARD",
    "STATE",
    "OWNER",
    "CHECKPOINT",
    "COUNTER",
    "AGE",
    "BEHIND",
    "RECORDS",
];

/// `3 shards (2 open, 1 closed), 1 finished; 2 leases held by 1 owner`, and a blank line.
fn summary(snap: &Snapshot) -> String {
    let open = snap.lines.iter().filter(|l| !l.shard.is_closed()).count();
    let held: Vec<&str> = snap
        .lines
        .iter()
        .filter_map(|l| l.row.as_ref()?.lease.owner.as_deref())
        .collect();
    let owners: HashSet<&str> = held.iter().copied().collect();
    let finished = snap.lines.iter().filter(|l| l.is_finished()).count();
    format!(
        "{} ({open} open, {} closed), {finished} finished; {} held by {}\n\n",
        output::count(snap.lines.len(), "shard"),
        snap.lines.len() - open,
        output::count(held.len(), "lease"),
        output::count(owners.len(), "owner")
    )
}

/// One line of the shard table; what it cannot show goes to `notes`.
fn shard_cells(
    line: &Line,
    previous: Option<&HashMap<String, u64>>,
    at_ms: u64,
    notes: &mut Vec<String>,
) -> Vec<String> {
    let id = &line.shard.id;
    let before = previous.and_then(|p| p.get(id)).copied();
    let [owner, checkpoint, counter, age] = match &line.row {
        Some(row) if line.earlier => {
            notes.push(format!(
                "{id}: the row was written for an earlier stream of the same name (deleted and \
                 created again): an instance replaces it once nobody holds it (at a listing \
                 after its lease lapsed) and reads the shard from its beginning; BEHIND and \
                 RECORDS count from there"
            ));
            let [owner, _, counter, age] = row_cells(row, before, at_ms);
            [owner, EARLIER_STREAM_ROW.to_owned(), counter, age]
        }
        Some(row) => row_cells(row, before, at_ms),
        None => {
            notes.push(format!(
                "{id}: no lease row yet (no instance has listed the shard)"
            ));
            [
                "(no row)".to_owned(),
                String::new(),
                String::new(),
                String::new(),
            ]
        }
    };
    if let Lag::Failed(message) = &line.lag {
        notes.push(format!("{id}: lag unknown: {message}"));
    }
    let (behind, records) = lag_cells(&line.lag);
    vec![
        shard_label(line),
        shard_state(line),
        owner,
        checkpoint,
        counter,
        age,
        behind,
        records,
    ]
}

/// The shard id, indented under its parent, with the parents of a merge.
fn shard_label(line: &Line) -> String {
    let indent = if line.depth == 0 {
        String::new()
    } else {
        format!("{}└ ", "  ".repeat(line.depth - 1))
    };
    let merge = if line.shard.parents.len() > 1 {
        format!(" (merge of {})", line.shard.parents.join(" + "))
    } else {
        String::new()
    };
    format!("{indent}{}{merge}", line.shard.id)
}

/// `open` or `closed`, and whether the row waits for its parents.
fn shard_state(line: &Line) -> String {
    let state = if line.shard.is_closed() {
        "closed"
    } else {
        "open"
    };
    if line.waiting {
        format!("{state}, waits for parents")
    } else {
        state.to_owned()
    }
}

/// OWNER, CHECKPOINT, COUNTER (with its movement since the last round) and AGE of a row.
fn row_cells(row: &LeaseRow, counter_before: Option<u64>, at_ms: u64) -> [String; 4] {
    let mut counter = row.lease.counter.to_string();
    if let Some(before) = counter_before {
        counter.push_str(&format!(" (+{})", row.lease.counter.saturating_sub(before)));
    }
    [
        row.lease.owner.clone().unwrap_or_else(|| "-".to_owned()),
        output::checkpoint(row.lease.checkpoint.as_ref()),
        counter,
        output::age(row.last_written_ms, at_ms),
    ]
}

/// BEHIND and RECORDS.
fn lag_cells(lag: &Lag) -> (String, String) {
    match lag {
        Lag::NotMeasured => (String::new(), String::new()),
        Lag::Finished => ("-".to_owned(), "-".to_owned()),
        Lag::Measured {
            millis_behind,
            records,
            exact,
        } => (
            millis_behind.map_or_else(
                || "?".to_owned(),
                |ms| time::human(u64::try_from(ms).unwrap_or(0)),
            ),
            if *exact {
                records.to_string()
            } else {
                format!(">={records}")
            },
        ),
        Lag::Failed(_) => ("error".to_owned(), "error".to_owned()),
    }
}

/// The note on a row of a shard the stream no longer lists.
fn unlisted_note(row: &LeaseRow) -> String {
    format!(
        "{}: a row for a shard the stream no longer lists (past the retention period; the \
         instances delete it), checkpoint {}",
        row.lease.shard_id,
        output::checkpoint(row.lease.checkpoint.as_ref())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(id: &str, parents: &[&str]) -> Shard {
        Shard {
            id: id.to_owned(),
            parents: parents.iter().map(|p| (*p).to_owned()).collect(),
            starting_sequence_number: "1".into(),
            ending_sequence_number: None,
        }
    }

    #[test]
    fn the_tree_puts_children_under_their_parents() {
        // 0 split into 2 and 3; 1 and 3 merged into 4; 5 is a child of a shard past retention.
        let shards = vec![
            shard("0", &[]),
            shard("1", &[]),
            shard("2", &["0"]),
            shard("3", &["0"]),
            shard("4", &["3", "1"]),
            shard("5", &["gone"]),
        ];
        let order: Vec<(usize, &str)> = tree_order(&shards)
            .into_iter()
            .map(|(d, i)| (d, shards[i].id.as_str()))
            .collect();
        assert_eq!(
            order,
            vec![(0, "0"), (1, "2"), (1, "3"), (2, "4"), (0, "1"), (0, "5")]
        );
    }

    /// A row of shard `id`, its checkpoint `checkpoint`, written for a shard that started at
    /// `starting`.
    fn row(id: &str, checkpoint: Checkpoint, starting: &str) -> LeaseRow {
        let mut lease = kinesis_dataflow::lease::Lease::new("orders", id, Vec::new());
        lease.checkpoint = Some(checkpoint);
        lease.starting_sequence_number = Some(starting.to_owned());
        LeaseRow {
            lease,
            last_written_ms: Some(1_000),
        }
    }

    /// The stream was deleted and created again; the rows are the earlier stream's. Its
    /// SHARD_END finishes nothing of this stream (the child waits), its checkpoint is not
    /// shown as this stream's, and the lag counts from the shard's beginning.
    #[test]
    fn rows_of_an_earlier_stream_of_the_same_name_are_told_apart() {
        let shards = vec![shard("0", &[]), shard("1", &["0"]), shard("2", &[])];
        let by_id: BTreeMap<String, LeaseRow> = [
            row("0", Checkpoint::ShardEnd, "0-earlier"),
            row("1", Checkpoint::Sequence("90".into()), "1"),
            row("2", Checkpoint::Sequence("70".into()), "2-earlier"),
        ]
        .into_iter()
        .map(|r| (r.lease.shard_id.clone(), r))
        .collect();
        let lines = lines(&shards, &by_id);
        let by: HashMap<&str, &Line> = lines.iter().map(|l| (l.shard.id.as_str(), l)).collect();
        assert!(by["0"].earlier && !by["0"].is_finished());
        assert!(
            !by["1"].earlier && by["1"].waiting,
            "its parent is not finished"
        );
        assert!(by["2"].earlier && !by["2"].waiting);

        let mut notes = Vec::new();
        let cells = shard_cells(by["2"], None, 2_000, &mut notes);
        assert_eq!(cells[3], EARLIER_STREAM_ROW);
        assert!(
            notes.len() == 1 && notes[0].contains("earlier stream of the same name"),
            "{notes:?}"
        );
        // The same stream's rows read as before.
        let mut same = by_id.clone();
        same.insert("0".into(), row("0", Checkpoint::ShardEnd, "1"));
        let lines = super::lines(&shards, &same);
        assert!(lines.iter().all(|l| l.shard.id == "2" || !l.earlier));
        assert!(lines[0].is_finished() && !lines[1].waiting);
    }

    #[test]
    fn the_count_asks_for_one_record_then_what_the_cap_leaves() {
        assert_eq!(next_limit(0, 0, 10_000), Some(1));
        assert_eq!(next_limit(1, 1, 10_000), Some(9_999));
        assert_eq!(next_limit(1, 1, 50_000), Some(10_000));
        assert_eq!(next_limit(2, 7, 7), None);
        assert_eq!(next_limit(MAX_COUNT_CALLS, 0, 10_000), None);
    }

    #[test]
    fn the_lag_starts_where_a_reader_would() {
        assert_eq!(resume_point(Some(&Checkpoint::ShardEnd)), None);
        assert_eq!(resume_point(None), Some(StartingPoint::TrimHorizon));
        assert_eq!(
            resume_point(Some(&Checkpoint::Sequence("5".into()))),
            Some(StartingPoint::AfterSequence("5".into()))
        );
        assert_eq!(
            resume_point(Some(&Checkpoint::SubSequence("5".into(), 2))),
            Some(StartingPoint::AtSequence("5".into()))
        );
        assert_eq!(
            resume_point(Some(&Checkpoint::Initial(StartingPoint::AtTimestamp(7)))),
            Some(StartingPoint::AtTimestamp(7))
        );
    }
}
