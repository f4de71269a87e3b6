//! Chains of reshards while no instance runs, then a start under every start position: a
//! shard never starts while an ancestor that will still be read is unfinished, so nothing
//! written after the last checkpoint is lost and every key keeps its order. Every scenario runs
//! on the in-memory transport and lease store, and on kinesis-local and dynalite.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use kinesis_dataflow::api::PutRecordsEntry;
use kinesis_dataflow::api::{KinesisAdmin, SharedKinesis};
use kinesis_dataflow::lease::SharedLeaseStore;
use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription,
    SubscriptionBuilder,
};

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

/// Where a scenario runs: the in-memory transport, or the emulators.
struct Place {
    api: SharedKinesis,
    /// The same transport, to reshard.
    admin: Arc<dyn KinesisAdmin>,
    store: SharedLeaseStore,
    stream: String,
    /// The emulator's client, to wait for the stream to be ACTIVE after a reshard.
    client: Option<aws_sdk_kinesis::Client>,
}

impl Place {
    fn memory() -> Self {
        let memory = Arc::new(MemoryKinesis::new());
        memory.add_stream("chains", 2).unwrap();
        Self {
            api: memory.clone(),
            admin: memory,
            store: Arc::new(MemoryLeaseStore::new()),
            stream: "chains".to_owned(),
            client: None,
        }
    }

    async fn emulators() -> Self {
        let client = support::kinesis_client();
        let stream = support::unique_name("chains");
        support::create_stream(&client, &stream, 2).await;
        let table = support::unique_name("chains-leases");
        let aws = Arc::new(AwsKinesis::new(client.clone()));
        Self {
            api: aws.clone(),
            admin: aws,
            store: Arc::new(DynamoLeaseStore::new(support::dynamodb_client(), table).unwrap()),
            stream,
            client: Some(client),
        }
    }

    fn builder(&self, owner: &str) -> SubscriptionBuilder {
        support::reading::fast(&self.api, self.store.clone(), &self.stream, owner)
    }

    /// Writes `count` records, `phase:ordinal` keyed round-robin over the keys.
    async fn write(&self, phase: &str, from: usize, count: usize) -> Vec<String> {
        let data: Vec<String> = (from..from + count)
            .map(|i| format!("{phase}:{i:05}"))
            .collect();
        let entries = (from..from + count)
            .zip(&data)
            .map(|(i, d)| PutRecordsEntry {
                data: Bytes::from(d.clone()),
                partition_key: format!("key-{}", i % KEYS),
                explicit_hash_key: None,
            })
            .collect();
        let out = self.api.put_records(&self.stream, entries).await.unwrap();
        assert_eq!(out.failed_count(), 0);
        data
    }

    async fn settled(&self) {
        if let Some(client) = &self.client {
            support::wait_active(client, &self.stream).await;
        }
    }
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

async fn reshard(place: &Place, how: Reshard) {
    let (admin, stream) = (&place.admin, place.stream.as_str());
    let half = u128::MAX / 2;
    // Shard 0 holds the low half of the key space; 2 its low quarter, 3 the next.
    admin
        .split_shard(stream, "shardId-000000000000", &(half / 2).to_string())
        .await
        .unwrap();
    place.settled().await;
    match how {
        Reshard::SplitTwice => admin
            .split_shard(stream, "shardId-000000000002", &(half / 4).to_string())
            .await
            .unwrap(),
        Reshard::SplitThenMerge => admin
            .merge_shards(stream, "shardId-000000000002", "shardId-000000000003")
            .await
            .unwrap(),
    }
    place.settled().await;
}

async fn run(place: Place, how: Reshard, start: Start) {
    support::init_tracing();
    let what = format!("{how:?} then {start:?}");

    // A first instance reads and checkpoints everything written while it runs, then stops.
    let mut a = place.builder("a").start().await.unwrap();
    let first: BTreeSet<String> = place.write("first", 0, 48).await.into_iter().collect();
    let got_a = read_until(&mut a, &first, "the first instance").await;
    assert_key_order(&got_a, "the first instance");
    a.shutdown().await;

    // Nobody reads while the stream is resharded twice and producers keep writing.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before_reshards = now_ms();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut after_checkpoint: BTreeSet<String> =
        place.write("down", 48, 48).await.into_iter().collect();
    reshard(&place, how).await;
    after_checkpoint.extend(place.write("down", 96, 48).await);

    let b = place.builder("b");
    let b = match start {
        Start::Default => b,
        Start::InitialLatest => b.initial_position(KinesisPosition::latest()),
        Start::Timestamp => b.start_at(KinesisPosition::timestamp(before_reshards)),
        Start::Horizon => b.start_at(KinesisPosition::horizon()),
        Start::Latest => b.start_at(KinesisPosition::latest()),
    };
    let mut b = b.start().await.unwrap();
    let after_start: BTreeSet<String> = place.write("up", 144, 48).await.into_iter().collect();
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

/// Every start position after one chain of reshards, on one transport.
async fn every_start(place: impl AsyncFn() -> Place, how: Reshard) {
    for start in [
        Start::Default,
        Start::InitialLatest,
        Start::Timestamp,
        Start::Horizon,
        Start::Latest,
    ] {
        run(place().await, how, start).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_twice_in_memory() {
    every_start(async || Place::memory(), Reshard::SplitTwice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_then_merge_in_memory() {
    every_start(async || Place::memory(), Reshard::SplitThenMerge).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_twice_on_the_emulators() {
    every_start(Place::emulators, Reshard::SplitTwice).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_then_merge_on_the_emulators() {
    every_start(Place::emulators, Reshard::SplitThenMerge).await;
}
