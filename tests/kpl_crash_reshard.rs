//! A subscription over an aggregated, keyed workload on kinesis-local with its leases in
//! dynalite, killed in the middle of an aggregate, then the stream split and merged while an
//! aggregating publisher (with the shard map it listed before) goes on writing. A second
//! instance reads everything: nothing is lost, each key's records come in order, and it
//! resumes inside the aggregate where the crashed one's checkpoint stopped (a sub-sequence
//! checkpoint), so it redelivers only what was acked after that checkpoint.
//!
//! The child process (this test binary, run again with `KPL_CRASH_*` set) reads with
//! de-aggregation, appends each user record it acks to a log file, pauses after 100 for the
//! checkpoint to be written, acks 7 more, and aborts.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::publish::{Aggregate, Published};
use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisPosition, OutgoingRecord, Publisher, ReadSettings,
    Subscription,
};

const KEYS: usize = 8;
/// User records per aggregate: the first phase's 320 make 8 aggregates.
const PER_AGGREGATE: usize = 40;
/// The child acks this many, pauses for a checkpoint, then acks `AFTER_CHECKPOINT` more.
const BEFORE_PAUSE: usize = 100;
const AFTER_CHECKPOINT: usize = 7;

struct Endpoints {
    kinesis: String,
    dynamodb: String,
}

fn api(at: &Endpoints) -> SharedKinesis {
    Arc::new(AwsKinesis::new(support::kinesis_client_at(&at.kinesis)))
}

fn store(at: &Endpoints, table: &str) -> DynamoLeaseStore {
    DynamoLeaseStore::new(support::dynamodb_client_at(&at.dynamodb), table).unwrap()
}

async fn subscription(at: &Endpoints, stream: &str, table: &str, owner: &str) -> Subscription {
    support::reading::fast(&api(at), Arc::new(store(at, table)), stream, owner)
        .read_settings(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(50))
                .unlimited_reads()
                .deaggregate(true)
                // The publisher puts misplaced user records again: drop the stale copies, as
                // the KCL does.
                .discard_misplaced_user_records(true),
        )
        .initial_position(KinesisPosition::horizon())
        .start()
        .await
        .unwrap()
}

/// `count` user records `key-<k>:<n>`, the keys taking turns, numbered on from `from` per key.
fn records(from: usize, count: usize) -> Vec<OutgoingRecord> {
    (0..count)
        .map(|i| {
            let key = format!("key-{}", i % KEYS);
            OutgoingRecord::new(key.clone(), format!("{key}:{:04}", from + i / KEYS))
        })
        .collect()
}

/// The child's part: acks and logs, pauses once for a checkpoint, aborts mid-aggregate.
async fn child(at: &Endpoints, stream: &str, table: &str, log: &str) -> ! {
    let mut sub = subscription(at, stream, table, "crashing").await;
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(log)
        .unwrap();
    let mut acked = 0;
    while let Some(item) = sub.next().await {
        let Ok(delivery) = item else { continue };
        writeln!(file, "{}", String::from_utf8_lossy(delivery.data())).unwrap();
        file.flush().unwrap();
        delivery.ack();
        acked += 1;
        if acked == BEFORE_PAUSE {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if acked == BEFORE_PAUSE + AFTER_CHECKPOINT {
            println!("child: aborting after {acked} acked user records");
            std::process::abort();
        }
    }
    unreachable!("the child aborts");
}

/// The test's name: the child runs this test binary filtered to it.
const TEST_NAME: &str =
    "killed_mid_aggregate_then_split_and_merged_loses_nothing_and_keeps_key_order";

/// In the child (`KPL_CRASH_*` set): its endpoints, stream, table and log file.
fn child_settings() -> Option<(Endpoints, String, String, String)> {
    let var = |name: &str| std::env::var(name).ok();
    let (Some(stream), Some(table), Some(kinesis), Some(dynamodb), Some(log)) = (
        var("KPL_CRASH_STREAM"),
        var("KPL_CRASH_TABLE"),
        var("KPL_CRASH_KINESIS"),
        var("KPL_CRASH_DYNAMODB"),
        var("KPL_CRASH_LOG"),
    ) else {
        return None;
    };
    Some((Endpoints { kinesis, dynamodb }, stream, table, log))
}

/// Runs the child until it crashes; returns the user records it acked, as it logged them.
async fn run_the_crashing_child(
    at: &Endpoints,
    stream: &str,
    table: &str,
    log: &std::path::Path,
) -> Vec<String> {
    let status = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST_NAME, "--nocapture"])
        .env("KPL_CRASH_STREAM", stream)
        .env("KPL_CRASH_TABLE", table)
        .env("KPL_CRASH_KINESIS", &at.kinesis)
        .env("KPL_CRASH_DYNAMODB", &at.dynamodb)
        .env("KPL_CRASH_LOG", log)
        .kill_on_drop(true)
        .status()
        .await
        .unwrap();
    assert!(!status.success(), "the child crashed: {status}");
    let acked: Vec<String> = std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(acked.len(), BEFORE_PAUSE + AFTER_CHECKPOINT);
    acked
}

/// The child's checkpoint is inside the aggregate, at one of the records it acked after the
/// pause began; returns that record's index.
async fn checkpoint_inside_the_aggregate(
    at: &Endpoints,
    stream: &str,
    table: &str,
    places: &[Published],
) -> usize {
    let rows = store(at, table).list(stream).await.unwrap();
    let checkpoint = rows[0].checkpoint.clone();
    let at_place = |i: usize| {
        Checkpoint::SubSequence(
            places[i].sequence_number.clone(),
            places[i].sub_sequence_number.unwrap(),
        )
    };
    (BEFORE_PAUSE - 1..BEFORE_PAUSE + AFTER_CHECKPOINT)
        .find(|&i| checkpoint == Some(at_place(i)))
        .unwrap_or_else(|| panic!("a checkpoint inside the aggregate, not {checkpoint:?}"))
}

/// Split, publish `records(from, 160)` (the publisher's map is stale), merge the children,
/// publish the next 160.
async fn split_publish_merge_publish(
    client: &aws_sdk_kinesis::Client,
    publisher: &Publisher,
    stream: &str,
    from: usize,
) {
    client
        .split_shard()
        .stream_name(stream)
        .shard_to_split("shardId-000000000000")
        .new_starting_hash_key("170141183460469231731687303715884105728")
        .send()
        .await
        .unwrap();
    support::wait_active(client, stream).await;
    publisher
        .publish_batch(records(from / KEYS, 160))
        .await
        .unwrap();
    client
        .merge_shards()
        .stream_name(stream)
        .shard_to_merge("shardId-000000000001")
        .adjacent_shard_to_merge("shardId-000000000002")
        .send()
        .await
        .unwrap();
    support::wait_active(client, stream).await;
    publisher
        .publish_batch(records((from + 160) / KEYS, 160))
        .await
        .unwrap();
}

/// Once the crashed child's lease expires, a second instance reads the rest: every record of
/// `expected` the child did not ack. Returns what it read.
async fn a_second_instance_reads_the_rest(
    at: &Endpoints,
    stream: &str,
    table: &str,
    expected: &BTreeSet<String>,
    acked: &[String],
) -> Vec<String> {
    let mut sub = subscription(at, stream, table, "second").await;
    let missing: BTreeSet<String> = expected
        .difference(&acked.iter().cloned().collect())
        .cloned()
        .collect();
    let got = support::reading::read_until(
        &mut sub,
        &missing,
        "second instance",
        Duration::from_secs(60),
    )
    .await;
    sub.shutdown().await;
    got.into_iter().map(|(_, data)| data).collect()
}

/// Each key in order within the second instance, and no gap across the crash.
fn assert_each_key_in_order_without_a_gap(acked: &[String], got: &[String]) {
    let mut last: BTreeMap<String, usize> = BTreeMap::new();
    for line in acked.iter().chain(got) {
        let (key, n) = line.split_once(':').unwrap();
        let n: usize = n.parse().unwrap();
        if let Some(&before) = last.get(key) {
            assert!(n <= before + 1, "{key}: {n} after {before}: a gap");
        }
        last.insert(key.to_owned(), n);
    }
    let mut per_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for line in got {
        let (key, n) = line.split_once(':').unwrap();
        per_key.entry(key).or_default().push(n.parse().unwrap());
    }
    for (key, ns) in &per_key {
        assert!(ns.windows(2).all(|w| w[0] < w[1]), "{key} in order: {ns:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_mid_aggregate_then_split_and_merged_loses_nothing_and_keeps_key_order() {
    if let Some((at, stream, table, log)) = child_settings() {
        child(&at, &stream, &table, &log).await;
    }
    let at = Endpoints {
        kinesis: support::kinesis_endpoint(),
        dynamodb: support::dynamodb_endpoint(),
    };
    let client = support::kinesis_client();
    let stream = support::unique_name("kpl-crash");
    let table = support::unique_name("kpl-crash-leases");
    let log = support::logs_dir().join(format!("{stream}.acked"));
    support::create_stream(&client, &stream, 1).await;
    let publisher = Publisher::new(api(&at), stream.as_str())
        .aggregate(Aggregate::default().max_records(PER_AGGREGATE));
    let first = 320;
    let places = publisher.publish_batch(records(0, first)).await.unwrap();
    assert_eq!(
        places[BEFORE_PAUSE].sub_sequence_number,
        Some(20),
        "mid-aggregate"
    );
    let acked = run_the_crashing_child(&at, &stream, &table, &log).await;
    let stopped = checkpoint_inside_the_aggregate(&at, &stream, &table, &places).await;
    split_publish_merge_publish(&client, &publisher, &stream, first).await;
    let expected: BTreeSet<String> = records(0, first + 320)
        .into_iter()
        .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
        .collect();
    let got = a_second_instance_reads_the_rest(&at, &stream, &table, &expected, &acked).await;
    assert_each_key_in_order_without_a_gap(&acked, &got);
    // Resumed right after the checkpoint: only what was acked after it comes again.
    let again = got.iter().filter(|l| acked.contains(l)).count();
    assert_eq!(
        again,
        BEFORE_PAUSE + AFTER_CHECKPOINT - 1 - stopped,
        "redelivered: {again}"
    );
}
