//! `examples/start_positions.rs`: records are written first, then the app is started at each
//! of the four positions in turn, and exactly the records the position names are handled (in
//! shard order, once each). Once on the in-memory transport, once on the emulators
//! (kinesis-local + dynalite, started by `tests/support`).
//!
//! Every run writes one more record to each shard after the app started (a "tail"): the last
//! record of every shard is then one the run must deliver, and since a shard's records reach
//! the handler in order, once the tails are in, nothing that the position lets through can
//! still be on its way.
#![forbid(unsafe_code)]

mod support;

#[allow(dead_code)]
mod example {
    include!("../examples/start_positions.rs");
}

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kinesis_dataflow::broker::KinesisBroker;
use kinesis_dataflow::{KinesisPosition, MemoryKinesis};

// ---------------------------------------------------------------------------------------------
// What the example's handler logged

/// One `record` event of the example's handler.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Handled {
    stream: String,
    shard: String,
    sequence_number: String,
    data: String,
}

/// The `record` events logged so far, in handling order.
fn handled() -> Vec<Handled> {
    support::events::events("record")
        .into_iter()
        .filter_map(|f| {
            Some(Handled {
                stream: f.get("stream")?.clone(),
                shard: f.get("shard")?.clone(),
                sequence_number: f.get("sequence_number")?.clone(),
                data: f.get("data")?.clone(),
            })
        })
        .collect()
}

/// Installs the recorder as this test binary's one global subscriber.
fn record_handled() {
    support::events::record_events();
}

/// What was handled from `stream` so far.
fn handled_from(stream: &str) -> Vec<Handled> {
    handled()
        .into_iter()
        .filter(|h| h.stream == stream)
        .collect()
}

fn forget(stream: &str) {
    support::events::forget("record", |f| {
        f.get("stream").map(String::as_str) == Some(stream)
    });
}

// ---------------------------------------------------------------------------------------------
// Writing records

/// Where the test writes its records: straight into the in-memory Kinesis, or through the SDK
/// into kinesis-local. Either way it learns each record's shard and sequence number.
enum Writer {
    Memory(MemoryKinesis),
    Live(aws_sdk_kinesis::Client),
}

/// One record the test wrote, in the order it wrote them.
#[derive(Debug, Clone)]
struct Written {
    data: String,
    shard: String,
    sequence_number: String,
}

impl Writer {
    async fn put(&self, stream: &str, key: &str, data: &str) -> Written {
        let (shard, sequence_number) = match self {
            Writer::Memory(kinesis) => kinesis
                .put(stream, key, data.to_owned())
                .expect("the in-memory put succeeds"),
            Writer::Live(client) => {
                let out = client
                    .put_record()
                    .stream_name(stream)
                    .partition_key(key)
                    .data(aws_sdk_kinesis::primitives::Blob::new(data.as_bytes()))
                    .send()
                    .await
                    .unwrap_or_else(|e| {
                        panic!(
                            "PutRecord {stream}: {} (logs: {})",
                            aws_sdk_kinesis::error::DisplayErrorContext(e),
                            support::logs_dir().display()
                        )
                    });
                (out.shard_id().to_owned(), out.sequence_number().to_owned())
            }
        };
        Written {
            data: data.to_owned(),
            shard,
            sequence_number,
        }
    }
}

/// Writes `<label>-0`, `<label>-1`, ... (each its own partition key) to `stream` until every
/// one of `shards` holds at least `per_shard` of them.
async fn write_spread(
    writer: &Writer,
    stream: &str,
    shards: &[String],
    label: &str,
    per_shard: usize,
    log: &mut Vec<Written>,
) {
    let mut counts: BTreeMap<String, usize> = shards.iter().map(|s| (s.clone(), 0)).collect();
    for i in 0..200 {
        if counts.values().all(|&n| n >= per_shard) {
            return;
        }
        let data = format!("{label}-{i}");
        let written = writer.put(stream, &data, &data).await;
        *counts
            .get_mut(&written.shard)
            .unwrap_or_else(|| panic!("{data} went to an unknown shard {}", written.shard)) += 1;
        log.push(written);
    }
    panic!("200 keys did not cover every shard {per_shard} times: {counts:?}");
}

fn now_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

// ---------------------------------------------------------------------------------------------
// The scenario

/// The stream's shards, as the example's stream holds them.
const SHARDS: [&str; 2] = ["shardId-000000000000", "shardId-000000000001"];

/// Which of the written records (by index in the log, the record, and the log's length when
/// the app started) a run must handle.
type Expect = Box<dyn Fn(usize, &Written, usize) -> bool>;

/// The records written before the runs: group `a`, a point in time, group `b`.
struct Groups {
    log: Vec<Written>,
    /// A time strictly after every `a` record arrived and at or before every `b` record.
    between: u64,
    /// The index of the first `b` record in the log.
    first_b: usize,
}

/// Writes group `a` (two records or more on each shard), takes a time, and writes group `b`
/// (one or more on each). Both clocks are this host's (the in-memory store's and the
/// emulator's); the pauses only keep the groups apart by more than a millisecond.
async fn write_two_groups(writer: &Writer, stream: &str, shards: &[String]) -> Groups {
    let mut log: Vec<Written> = Vec::new();
    write_spread(writer, stream, shards, "a", 2, &mut log).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let between = now_ms();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let first_b = log.len();
    write_spread(writer, stream, shards, "b", 1, &mut log).await;
    Groups {
        log,
        between,
        first_b,
    }
}

/// The index of the second `a` record of shard 1: the sequence position names it (so the
/// first is left out).
fn second_record_of_shard_1(log: &[Written]) -> usize {
    log.iter()
        .position(|w| w.shard == SHARDS[1])
        .and_then(|first| {
            log.iter()
                .enumerate()
                .skip(first + 1)
                .find(|(_, w)| w.shard == SHARDS[1])
                .map(|(i, _)| i)
        })
        .expect("shard 1 holds two `a` records")
}

/// The four runs: a label, the position, and what it must handle.
fn runs(groups: &Groups) -> Vec<(&'static str, KinesisPosition, Expect)> {
    let first_b = groups.first_b;
    let named = second_record_of_shard_1(&groups.log);
    let named_record = groups.log[named].clone();
    vec![
        // Every record.
        (
            "horizon",
            KinesisPosition::horizon(),
            Box::new(|_, _, _| true),
        ),
        // Only what was written after the start.
        (
            "latest",
            KinesisPosition::latest(),
            Box::new(|i, _, started| i >= started),
        ),
        // What arrived at or after the time: group `b` and everything after it.
        (
            "timestamp",
            KinesisPosition::timestamp(groups.between),
            Box::new(move |i, _, _| i >= first_b),
        ),
        // The named record and the rest of its shard; the other shard opens at the tip.
        (
            "sequence",
            KinesisPosition::sequence(
                named_record.shard.clone(),
                named_record.sequence_number.clone(),
            ),
            Box::new(move |i, w, started| {
                (w.shard == named_record.shard && i >= named) || i >= started
            }),
        ),
    ]
}

/// The example's command line for `position`.
fn command_line(position: &KinesisPosition) -> String {
    match position {
        KinesisPosition::Horizon => "horizon".to_owned(),
        KinesisPosition::Latest => "latest".to_owned(),
        KinesisPosition::Timestamp(ms) => format!("timestamp:{ms}"),
        KinesisPosition::Sequence {
            shard,
            sequence_number,
        } => format!("sequence:{shard}:{sequence_number}"),
        other => panic!("the example takes no position like {other:?}"),
    }
}

/// Waits until `count` records of `stream` were handled, `wait` at most.
async fn wait_handled(stream: &str, label: &str, count: usize, wait: Duration) {
    let deadline = tokio::time::Instant::now() + wait;
    while handled_from(stream).len() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{label}: {} of {} records handled after {wait:?}: {:?} (logs: {})",
            handled_from(stream).len(),
            count,
            handled_from(stream),
            support::logs_dir().display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Per shard: exactly the expected records, in the order they were written, once each.
fn assert_handled_exactly(stream: &str, label: &str, text: &str, expected: &[&Written]) {
    let got = handled_from(stream);
    for shard in SHARDS {
        let want: Vec<(&str, &str)> = expected
            .iter()
            .filter(|w| w.shard == shard)
            .map(|w| (w.data.as_str(), w.sequence_number.as_str()))
            .collect();
        let have: Vec<(&str, &str)> = got
            .iter()
            .filter(|h| h.shard == shard)
            .map(|h| (h.data.as_str(), h.sequence_number.as_str()))
            .collect();
        assert_eq!(have, want, "{label} ({text}): what {shard} delivered");
    }
    assert_eq!(
        got.len(),
        expected.len(),
        "{label}: no record of another shard: {got:?}"
    );
}

/// One run: the app started at `position` (parsed from its command line) with `broker`, a
/// tail written to every shard, and exactly the expected records handled.
async fn run_at(
    writer: &Writer,
    stream: &str,
    broker: KinesisBroker,
    wait: Duration,
    log: &mut Vec<Written>,
    (label, position, expected): (&str, KinesisPosition, Expect),
) {
    forget(stream);
    // The example's command line names the same position.
    let text = command_line(&position);
    let args = example::Args::parse([text.as_str(), stream]).unwrap();
    assert_eq!(args.start, position, "{label}: the command line's position");
    let running = example::service(broker, &args.stream, args.start)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{label}: the app starts: {e}"));
    let started = log.len();
    let shards: Vec<String> = SHARDS.iter().map(|s| (*s).to_owned()).collect();
    write_spread(writer, stream, &shards, &format!("{label}-tail"), 1, log).await;
    let expected: Vec<&Written> = log
        .iter()
        .enumerate()
        .filter(|(i, w)| expected(*i, w, started))
        .map(|(_, w)| w)
        .collect();
    wait_handled(stream, label, expected.len(), wait).await;
    running
        .shutdown()
        .await
        .unwrap_or_else(|e| panic!("{label}: the app stops: {e}"));
    assert_handled_exactly(stream, label, &text, &expected);
}

/// Writes two groups of records with a point in time between them, then runs the app at each
/// position and checks what it handled. `broker` makes a broker with its own, empty lease
/// store for each run (no checkpoint of an earlier run applies).
async fn scenario(
    writer: Writer,
    stream: &str,
    broker: impl Fn() -> KinesisBroker,
    wait: Duration,
) {
    record_handled();
    let shards: Vec<String> = SHARDS.iter().map(|s| (*s).to_owned()).collect();
    let mut groups = write_two_groups(&writer, stream, &shards).await;
    for run in runs(&groups) {
        run_at(&writer, stream, broker(), wait, &mut groups.log, run).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_start_position_handles_exactly_its_records_in_memory() {
    let kinesis = MemoryKinesis::new();
    let stream = "positions-in-memory";
    kinesis.add_stream(stream, 2).unwrap();
    let broker_kinesis = kinesis.clone();
    scenario(
        Writer::Memory(kinesis),
        stream,
        // A fresh in-memory lease store each time, on the same streams.
        move || KinesisBroker::in_memory(broker_kinesis.clone()),
        Duration::from_secs(30),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_start_position_handles_exactly_its_records_live() {
    let client = support::kinesis_client();
    let stream = support::unique_name("positions");
    support::create_stream(&client, &stream, 2).await;
    scenario(
        Writer::Live(client),
        &stream,
        // A lease table of its own for each run.
        || support::live_broker(&support::unique_name("positions-app")),
        Duration::from_secs(60),
    )
    .await;
}

#[test]
fn the_command_line_names_the_four_positions() {
    use example::{Args, DEFAULT_STREAM, parse_position};

    let none: [&str; 0] = [];
    assert_eq!(
        Args::parse(none),
        Ok(Args {
            start: KinesisPosition::horizon(),
            stream: DEFAULT_STREAM.to_owned(),
        }),
        "the defaults"
    );
    assert_eq!(
        Args::parse(["latest", "orders"]),
        Ok(Args {
            start: KinesisPosition::latest(),
            stream: "orders".to_owned(),
        })
    );
    assert_eq!(parse_position("horizon"), Ok(KinesisPosition::horizon()));
    assert_eq!(
        parse_position("timestamp:1700000000000"),
        Ok(KinesisPosition::timestamp(1_700_000_000_000))
    );
    assert_eq!(
        parse_position(
            "sequence:shardId-000000000001:49590338271490256608559692538361571095921575989136588898"
        ),
        Ok(KinesisPosition::sequence(
            "shardId-000000000001",
            "49590338271490256608559692538361571095921575989136588898"
        ))
    );
    for bad in [
        "",
        "oldest",
        "horizon:1",
        "timestamp:",
        "timestamp:yesterday",
        "timestamp:-5",
        "sequence:shardId-000000000001",
        "sequence::4959",
        "sequence:shardId-000000000001:",
        "sequence:shardId-000000000001:49x",
    ] {
        assert!(parse_position(bad).is_err(), "`{bad}` is refused");
    }
    assert!(Args::parse(["horizon", "orders", "extra"]).is_err());
}
