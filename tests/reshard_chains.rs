//! Chains of reshards while no instance runs, then a start under every start position: a
//! shard never starts while an ancestor that will still be read is unfinished, so nothing
//! written after the last checkpoint is lost and every key keeps its order. On the in-memory
//! transport and lease store (the same scenarios run on the emulators in
//! `reshard_chains_local.rs`).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kinesis_dataflow::{
    KinesisPosition, MemoryKinesis, MemoryLeaseStore, SharedKinesis, Subscription,
    SubscriptionBuilder,
};

const STREAM: &str = "chains";
const KEYS: usize = 12;

/// What happens to the stream while nobody reads it.
#[derive(Debug, Clone, Copy)]
enum Reshard {
    /// Shard 0 splits into 2 and 3, then 2 splits into 4 and 5.
    SplitTwice,
    /// Shard 0 splits into 2 and 3, then 2 and 3 merge into 4.
    SplitThenMerge,
}

/// How the second instance is started.
#[derive(Debug, Clone, Copy)]
enum Start {
    /// No position at all.
    Default,
    /// `initial_position(latest())`: only shards without a checkpoint.
    InitialLatest,
    /// `start_at(timestamp(..))`, at a time before the reshards.
    Timestamp,
    /// `start_at(horizon())`.
    Horizon,
    /// `start_at(latest())`: the startup shards skip to the tip.
    Latest,
}

fn builder(api: &SharedKinesis, store: &MemoryLeaseStore, owner: &str) -> SubscriptionBuilder {
    support::reading::fast(api, Arc::new(store.clone()), STREAM, owner)
}

/// Writes `count` records, `phase:ordinal` keyed round-robin over the keys.
fn write(memory: &MemoryKinesis, phase: &str, from: usize, count: usize) -> Vec<String> {
    support::reading::write_tagged(memory, STREAM, phase, from, count, KEYS)
}

/// Reads (and acks) until every `expected` payload came.
async fn read_until(
    sub: &mut Subscription,
    expected: &BTreeSet<String>,
    what: &str,
) -> Vec<(String, String)> {
    support::reading::read_until(sub, expected, what, Duration::from_secs(20)).await
}

/// Each key's records were first delivered in the order they were written (a redelivery of
/// an earlier record is allowed; a record delivered for the first time before an earlier
/// record of its key is not).
fn assert_key_order(got: &[(String, String)], what: &str) {
    let mut first_seen: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    let mut delivered = BTreeSet::new();
    for (key, payload) in got {
        if delivered.insert(payload.clone()) {
            let ordinal: usize = payload.split_once(':').unwrap().1.parse().unwrap();
            first_seen.entry(key).or_default().push(ordinal);
        }
    }
    for (key, ordinals) in first_seen {
        let mut sorted = ordinals.clone();
        sorted.sort_unstable();
        assert_eq!(
            ordinals, sorted,
            "{what}: key {key}'s records were first delivered out of order"
        );
    }
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

async fn reshard(api: &SharedKinesis, how: Reshard) {
    let half = u128::MAX / 2;
    // Shard 0 holds the low half of the key space; 2 its low quarter, 3 the next.
    api.split_shard(STREAM, "shardId-000000000000", &(half / 2).to_string())
        .await
        .unwrap();
    match how {
        Reshard::SplitTwice => api
            .split_shard(STREAM, "shardId-000000000002", &(half / 4).to_string())
            .await
            .unwrap(),
        Reshard::SplitThenMerge => api
            .merge_shards(STREAM, "shardId-000000000002", "shardId-000000000003")
            .await
            .unwrap(),
    }
}

async fn run(how: Reshard, start: Start) {
    support::init_tracing();
    let what = format!("{how:?} then {start:?}");
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 2).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let store = MemoryLeaseStore::new();

    // A first instance reads and checkpoints everything written while it runs, then stops.
    let mut a = builder(&api, &store, "a").start().await.unwrap();
    let first: BTreeSet<String> = write(&memory, "first", 0, 48).into_iter().collect();
    let got_a = read_until(&mut a, &first, "the first instance").await;
    assert_key_order(&got_a, "the first instance");
    a.shutdown().await;

    // Nobody reads while the stream is resharded twice and producers keep writing.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before_reshards = now_ms();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut after_checkpoint: BTreeSet<String> =
        write(&memory, "down", 48, 48).into_iter().collect();
    reshard(&api, how).await;
    after_checkpoint.extend(write(&memory, "down", 96, 48));

    let b = builder(&api, &store, "b");
    let b = match start {
        Start::Default => b,
        Start::InitialLatest => b.initial_position(KinesisPosition::latest()),
        Start::Timestamp => b.start_at(KinesisPosition::timestamp(before_reshards)),
        Start::Horizon => b.start_at(KinesisPosition::horizon()),
        Start::Latest => b.start_at(KinesisPosition::latest()),
    };
    let mut b = b.start().await.unwrap();
    let after_start: BTreeSet<String> = write(&memory, "up", 144, 48).into_iter().collect();
    let expected: BTreeSet<String> = match start {
        // The startup shards skip to the tip (the spec's start_at, ahead of checkpoints):
        // what was written after `start` returned is what is promised.
        Start::Latest => after_start,
        Start::Horizon => {
            let mut all = first;
            all.extend(after_checkpoint);
            all.extend(after_start);
            all
        }
        _ => {
            let mut all = after_checkpoint;
            all.extend(after_start);
            all
        }
    };
    let got = read_until(&mut b, &expected, &what).await;
    assert_key_order(&got, &what);
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_twice_then_default_start() {
    run(Reshard::SplitTwice, Start::Default).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_twice_then_initial_latest() {
    run(Reshard::SplitTwice, Start::InitialLatest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_twice_then_timestamp() {
    run(Reshard::SplitTwice, Start::Timestamp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_twice_then_horizon() {
    run(Reshard::SplitTwice, Start::Horizon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_twice_then_latest() {
    run(Reshard::SplitTwice, Start::Latest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_then_merge_then_default_start() {
    run(Reshard::SplitThenMerge, Start::Default).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_then_merge_then_initial_latest() {
    run(Reshard::SplitThenMerge, Start::InitialLatest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_then_merge_then_timestamp() {
    run(Reshard::SplitThenMerge, Start::Timestamp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_then_merge_then_horizon() {
    run(Reshard::SplitThenMerge, Start::Horizon).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_then_merge_then_latest() {
    run(Reshard::SplitThenMerge, Start::Latest).await;
}
