//! Several streams in one subscription (`MultiSubscription`), against kinesis-local and
//! dynalite: two instances over two streams sharing one lease table, a split in one stream
//! while the other flows, a crash, per-key order in both; streams inserted, removed and
//! deleted while running.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kinesis_dataflow::api::{KinesisAdmin, PutRecordsEntry, SharedKinesis};
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{LeaseFuture, SharedLeaseStore};
use kinesis_dataflow::subscription::ShutdownHandle;
use kinesis_dataflow::{
    AwsKinesis, KinesisError, KinesisPosition, MultiSubscription, MultiSubscriptionBuilder,
    ReadSettings, StreamSet,
};

const KEYS: usize = 8;

fn builder(
    api: &SharedKinesis,
    store: &SharedLeaseStore,
    streams: &StreamSet,
    owner: &str,
) -> MultiSubscriptionBuilder {
    leased(api, store, streams, owner, Duration::from_secs(2))
}

/// The tests' fast timings, with leases of `lease_duration`.
fn leased(
    api: &SharedKinesis,
    store: &SharedLeaseStore,
    streams: &StreamSet,
    owner: &str,
    lease_duration: Duration,
) -> MultiSubscriptionBuilder {
    let owner = owner.to_owned();
    MultiSubscription::builder(api.clone(), store.clone(), streams.clone()).configure(|each| {
        each.owner(owner)
            .initial_position(KinesisPosition::horizon())
            .read_settings(
                ReadSettings::default()
                    .poll_interval(Duration::from_millis(100))
                    .unlimited_reads(),
            )
            .list_interval(Duration::from_millis(300))
            .lease_duration(lease_duration)
            .checkpoint_interval(Duration::from_millis(100))
    })
}

/// One delivery as the consumers log it.
#[derive(Debug, Clone)]
struct Seen {
    instance: usize,
    stream: String,
    key: String,
    ordinal: usize,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// Reads `sub` until it ends, acking everything and logging each delivery.
fn consume(instance: usize, mut sub: MultiSubscription, log: Log, errors: Log) -> ShutdownHandle {
    let handle = sub.shutdown_handle();
    tokio::spawn(async move {
        while let Some(item) = sub.next().await {
            match item {
                Ok(d) => {
                    let data = String::from_utf8_lossy(d.data()).into_owned();
                    let ordinal = data.rsplit(':').next().unwrap().parse().unwrap();
                    log.lock().unwrap().push(Seen {
                        instance,
                        stream: d
                            .stream()
                            .expect("every record names its stream")
                            .to_owned(),
                        key: d.partition_key().to_owned(),
                        ordinal,
                    });
                    d.ack();
                }
                Err(e) => {
                    eprintln!("instance {instance}: {e}");
                    if transient(&e) {
                        continue;
                    }
                    errors.lock().unwrap().push(Seen {
                        instance,
                        stream: e.to_string(),
                        key: String::new(),
                        ordinal: 0,
                    });
                }
            }
        }
        sub.shutdown().await;
    });
    handle
}

/// A call that failed and is retried (on a loaded machine kinesis-local can miss the fast
/// timings' call timeout), or a reader stopped by such failures: reported, but nothing the
/// tests look for. Anything else is kept in the error log.
fn transient(error: &KinesisError) -> bool {
    match error {
        KinesisError::ReaderStopped { last, .. } => last.is_retryable(),
        other => other.is_retryable(),
    }
}

/// Writes round `round` to `stream`: one record per key, `stream:key:round`.
async fn write_round(api: &SharedKinesis, stream: &str, round: usize) {
    let entries = (0..KEYS)
        .map(|k| PutRecordsEntry {
            data: Bytes::from(format!("{stream}:key-{k}:{round}")),
            partition_key: format!("key-{k}"),
            explicit_hash_key: None,
        })
        .collect();
    let out = api.put_records(stream, entries).await.unwrap();
    assert_eq!(out.failed_count(), 0);
}

/// Waits until every (stream, key, round) below `rounds` was delivered at least once.
async fn wait_delivered(log: &Log, streams: &[&str], rounds: usize, what: &str) {
    let expected: BTreeSet<(String, String, usize)> = streams
        .iter()
        .flat_map(|s| {
            (0..KEYS)
                .flat_map(move |k| (0..rounds).map(move |r| (s.to_string(), format!("key-{k}"), r)))
        })
        .collect();
    let seen = || -> BTreeSet<(String, String, usize)> {
        let log = log.lock().unwrap();
        log.iter()
            .map(|s| (s.stream.clone(), s.key.clone(), s.ordinal))
            .collect()
    };
    let done = tokio::time::timeout(Duration::from_secs(60), async {
        while !expected.is_subset(&seen()) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    if done.is_err() {
        let missing: Vec<_> = expected.difference(&seen()).take(10).cloned().collect();
        panic!("{what}: not delivered within 60 s, e.g. {missing:?}");
    }
}

/// Per stream and key, the rounds come in order: each instance's deliveries rise, and the
/// first deliveries of every round rise across instances (a crash may replay, never reorder).
fn assert_per_key_order(log: &[Seen]) {
    let mut by_instance: BTreeMap<(usize, &str, &str), Vec<usize>> = BTreeMap::new();
    let mut firsts: BTreeMap<(&str, &str), Vec<usize>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for s in log {
        by_instance
            .entry((s.instance, &s.stream, &s.key))
            .or_default()
            .push(s.ordinal);
        if seen.insert((&s.stream, &s.key, s.ordinal)) {
            firsts
                .entry((&s.stream, &s.key))
                .or_default()
                .push(s.ordinal);
        }
    }
    for ((instance, stream, key), ordinals) in &by_instance {
        // An instance that took a crashed one's shard replays from the checkpoint: still in order.
        assert!(
            ordinals.windows(2).all(|w| w[0] < w[1]),
            "instance {instance}, {stream} {key}: out of order or repeated: {ordinals:?}"
        );
    }
    for ((stream, key), ordinals) in &firsts {
        assert!(
            ordinals.windows(2).all(|w| w[0] < w[1]),
            "{stream} {key}: first deliveries out of order: {ordinals:?}"
        );
    }
}

/// The clients, a lease table of its own, and the consumers' logs of a test.
struct World {
    client: aws_sdk_kinesis::Client,
    api: SharedKinesis,
    store: SharedLeaseStore,
    log: Log,
    errors: Log,
}

impl World {
    fn new(leases: &str) -> Self {
        let client = support::kinesis_client();
        let api: SharedKinesis = Arc::new(AwsKinesis::new(client.clone()));
        let store: SharedLeaseStore = Arc::new(support::lease_store(leases));
        Self {
            client,
            api,
            store,
            log: Arc::default(),
            errors: Arc::default(),
        }
    }

    /// Starts an instance on `streams` and consumes it ([`consume`]).
    async fn start(&self, instance: usize, streams: &StreamSet, owner: &str) -> ShutdownHandle {
        let sub = builder(&self.api, &self.store, streams, owner)
            .start()
            .await
            .unwrap();
        consume(instance, sub, self.log.clone(), self.errors.clone())
    }

    /// Whether the deliveries include round `round` of `stream`.
    fn has_round(&self, stream: &str, round: usize) -> bool {
        self.log
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.stream == stream && s.ordinal == round)
    }

    /// The errors (other than retried calls) that name `stream`.
    fn errors_about(&self, stream: &str) -> usize {
        self.errors
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.stream.contains(stream))
            .count()
    }
}

/// Starts instance 1 and reads it like [`consume`] (errors printed only) until the returned
/// sender aborts it: a crash.
async fn start_abortable(
    world: &World,
    streams: &StreamSet,
    owner: &str,
) -> tokio::sync::oneshot::Sender<()> {
    let first = builder(&world.api, &world.store, streams, owner)
        .start()
        .await
        .unwrap();
    consume_abortable(world, first)
}

/// Reads `first` as instance 1 (errors printed only) until the returned sender aborts it.
fn consume_abortable(world: &World, first: MultiSubscription) -> tokio::sync::oneshot::Sender<()> {
    let (abort_tx, abort_rx) = tokio::sync::oneshot::channel::<()>();
    let log = world.log.clone();
    tokio::spawn(async move {
        let mut sub = first;
        let mut abort_rx = abort_rx;
        loop {
            tokio::select! {
                _ = &mut abort_rx => { sub.abort(); return; }
                item = sub.next() => match item {
                    Some(Ok(d)) => {
                        let data = String::from_utf8_lossy(d.data()).into_owned();
                        let ordinal = data.rsplit(':').next().unwrap().parse().unwrap();
                        log.lock().unwrap().push(Seen {
                            instance: 1,
                            stream: d.stream().unwrap().to_owned(),
                            key: d.partition_key().to_owned(),
                            ordinal,
                        });
                        d.ack();
                    }
                    Some(Err(e)) => eprintln!("instance 1: {e}"),
                    None => return,
                }
            }
        }
    });
    abort_tx
}

/// Five rounds to both streams, then more until both instances have delivered some: on a
/// loaded machine the hand-off to the newcomer can take several listings, and a lease not
/// renewed in time goes back and forth. Returns the rounds written.
async fn write_until_both_instances_read(world: &World, orders: &str, payments: &str) -> usize {
    let both = [orders, payments];
    let mut rounds = 0;
    loop {
        write_round(&world.api, orders, rounds).await;
        write_round(&world.api, payments, rounds).await;
        rounds += 1;
        if rounds < 5 {
            continue;
        }
        wait_delivered(&world.log, &both, rounds, "before the split").await;
        let instances: BTreeSet<usize> = world
            .log
            .lock()
            .unwrap()
            .iter()
            .map(|s| s.instance)
            .collect();
        if instances.len() == 2 {
            return rounds;
        }
        assert!(
            rounds < 50,
            "both instances read within 50 rounds: {instances:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A split in `orders` while `payments` flows; every round of `rounds` delivered.
async fn split_one_stream_while_the_other_flows(
    world: &World,
    orders: &str,
    payments: &str,
    rounds: std::ops::Range<usize>,
) {
    let api = &world.api;
    AwsKinesis::new(world.client.clone())
        .split_shard(orders, "shardId-000000000000", &(u128::MAX / 4).to_string())
        .await
        .unwrap();
    for round in rounds.clone() {
        write_round(api, payments, round).await;
    }
    support::wait_active(&world.client, orders).await;
    for round in rounds.clone() {
        write_round(api, orders, round).await;
    }
    wait_delivered(
        &world.log,
        &[orders, payments],
        rounds.end,
        "after the split",
    )
    .await;
}

/// Waits (60 s at most) until every key of `streams` has every round below `rounds`.
async fn assert_every_round_comes_after_the_crash(world: &World, streams: &[&str], rounds: usize) {
    let expect_rounds: Vec<usize> = (0..rounds).collect();
    let all_delivered = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let done = {
                let log = world.log.lock().unwrap();
                let got: BTreeSet<(String, String, usize)> = log
                    .iter()
                    .map(|s| (s.stream.clone(), s.key.clone(), s.ordinal))
                    .collect();
                streams.iter().all(|s| {
                    (0..KEYS).all(|k| {
                        expect_rounds
                            .iter()
                            .all(|r| got.contains(&(s.to_string(), format!("key-{k}"), *r)))
                    })
                })
            };
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        all_delivered.is_ok(),
        "not every record came after the crash"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_two_streams_through_a_split_and_a_crash() {
    support::init_tracing();
    let world = World::new("multi-leases");
    let orders = support::unique_name("multi-orders");
    let payments = support::unique_name("multi-payments");
    support::create_stream(&world.client, &orders, 2).await;
    support::create_stream(&world.client, &payments, 1).await;
    let streams = StreamSet::new([orders.clone(), payments.clone()]);
    // The first instance is aborted below: keep it where the test can reach it.
    let abort_first = start_abortable(&world, &streams, "first").await;
    let second = world.start(2, &streams, "second").await;
    let rounds = write_until_both_instances_read(&world, &orders, &payments).await;
    let (split_rounds, crash_rounds) = (rounds..rounds + 5, rounds + 5..rounds + 10);
    split_one_stream_while_the_other_flows(&world, &orders, &payments, split_rounds).await;

    // The first instance crashes; the second takes everything over.
    abort_first.send(()).unwrap();
    for round in crash_rounds.clone() {
        write_round(&world.api, &orders, round).await;
        write_round(&world.api, &payments, round).await;
    }
    let both = [orders.as_str(), payments.as_str()];
    assert_every_round_comes_after_the_crash(&world, &both, crash_rounds.end).await;
    second.shutdown().await;
    let ordered = world.log.lock().unwrap().clone();
    assert_per_key_order(&ordered);
    assert!(
        ordered
            .iter()
            .any(|s| s.instance == 2 && s.stream == orders && s.ordinal >= crash_rounds.start),
        "the second instance read orders after the crash"
    );
    let errors = world.errors.lock().unwrap();
    assert!(errors.is_empty(), "no errors but retried calls: {errors:?}");
}

async fn rows_of(store: &SharedLeaseStore, stream: &str) -> Vec<kinesis_dataflow::lease::Lease> {
    store.list(stream).await.unwrap()
}

/// Removed: the stream's leases are released and its rows (checkpoints) kept, and it is not
/// read any more.
async fn a_removed_stream_keeps_its_rows_and_is_not_read(
    world: &World,
    streams: &StreamSet,
    a: &str,
) {
    assert!(streams.remove(a));
    support::eventually(
        "the removed stream's leases released",
        Duration::from_secs(30),
        async || {
            let rows = rows_of(&world.store, a).await;
            let shards: Vec<_> = rows
                .iter()
                .filter(|l| !l.shard_id.starts_with("worker:"))
                .collect();
            !shards.is_empty()
                && shards
                    .iter()
                    .all(|l| l.owner.is_none() && l.checkpoint.is_some())
        },
    )
    .await;
    write_round(&world.api, a, 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!world.has_round(a, 1), "a removed stream is not read");
}

/// Deleted in Kinesis: the stream's readers stop and its rows are removed.
async fn a_deleted_streams_rows_are_removed(world: &World, b: &str) {
    assert!(!rows_of(&world.store, b).await.is_empty());
    world
        .client
        .delete_stream()
        .stream_name(b)
        .send()
        .await
        .unwrap();
    support::eventually(
        "the deleted stream's rows removed",
        Duration::from_secs(30),
        async || rows_of(&world.store, b).await.is_empty(),
    )
    .await;
}

/// Inserted before it exists: reported by name, read once created.
async fn a_stream_inserted_before_it_exists_is_reported_then_read(
    world: &World,
    streams: &StreamSet,
    c: &str,
) {
    assert!(streams.insert(c.to_owned()));
    support::eventually(
        "a missing stream reported",
        Duration::from_secs(30),
        async || world.errors_about(c) > 0,
    )
    .await;
    support::create_stream(&world.client, c, 1).await;
    write_round(&world.api, c, 0).await;
    wait_delivered(&world.log, &[c], 1, "the stream created after its insert").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_inserted_removed_and_deleted_while_running() {
    support::init_tracing();
    let world = World::new("set-leases");
    let a = support::unique_name("set-a");
    let b = support::unique_name("set-b");
    let c = support::unique_name("set-c");
    support::create_stream(&world.client, &a, 1).await;
    support::create_stream(&world.client, &b, 2).await;
    let streams = StreamSet::new([a.clone()]);
    let handle = world.start(1, &streams, "only").await;
    write_round(&world.api, &a, 0).await;
    wait_delivered(&world.log, &[a.as_str()], 1, "the first stream").await;

    // Inserted: picked up within a listing.
    assert!(streams.insert(b.clone()));
    write_round(&world.api, &b, 0).await;
    wait_delivered(&world.log, &[b.as_str()], 1, "the inserted stream").await;
    a_removed_stream_keeps_its_rows_and_is_not_read(&world, &streams, &a).await;
    a_deleted_streams_rows_are_removed(&world, &b).await;
    a_stream_inserted_before_it_exists_is_reported_then_read(&world, &streams, &c).await;

    // Inserted back: resumes from its checkpoints (round 0 is not read again).
    assert!(streams.insert(a.clone()));
    wait_delivered(&world.log, &[a.as_str()], 2, "the stream inserted back").await;
    handle.shutdown().await;
    let log = world.log.lock().unwrap();
    let a_zero = log
        .iter()
        .filter(|s| s.stream == a && s.ordinal == 0)
        .count();
    assert_eq!(
        a_zero, KEYS,
        "round 0 of the stream inserted back read once"
    );
    let reported = world.errors.lock().unwrap();
    let about_c = reported
        .iter()
        .filter(|e| e.stream.contains(c.as_str()))
        .count();
    assert_eq!(about_c, 1, "the missing stream reported once: {reported:?}");
}

/// Counts the rows one instance reads by id (`get`), by stream and row.
#[derive(Clone, Default)]
struct RowReads(Arc<Mutex<BTreeMap<(String, String), usize>>>);

impl LeaseLayer for RowReads {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        if let LeaseCall::Get { stream, ids } = call {
            let mut reads = self.0.lock().unwrap();
            for id in ids {
                *reads.entry((stream.to_owned(), id.clone())).or_default() += 1;
            }
        }
        next
    }
}

/// Two instances of three streams with leases far longer than the test: a crashed instance's
/// shards of every stream are read again only if the other declared it gone through its
/// anchor stream's worker row (the first of the set), and the other watched no worker row of
/// the crashed one outside that stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_instance_of_three_streams_is_taken_over_in_each_through_its_anchor_row() {
    support::init_tracing();
    let world = World::new("group-leases");
    // Named so that the first of the set (the anchor) is known.
    let names: Vec<String> = ["grp-a", "grp-b", "grp-c"]
        .iter()
        .map(|p| support::unique_name(p))
        .collect();
    for name in &names {
        support::create_stream(&world.client, name, 2).await;
    }
    let streams = StreamSet::new(names.clone());
    let grouped = |store: &SharedLeaseStore, owner: &str| {
        leased(&world.api, store, &streams, owner, Duration::from_secs(600))
    };
    let first = grouped(&world.store, "first").start().await.unwrap();
    let abort_first = consume_abortable(&world, first);
    let reads = RowReads::default();
    let counted: SharedLeaseStore = Arc::new(LayeredStore::new(world.store.clone(), reads.clone()));
    let second = grouped(&counted, "second").start().await.unwrap();
    let second = consume(2, second, world.log.clone(), world.errors.clone());
    let all: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut rounds = 0;
    loop {
        for name in &all {
            write_round(&world.api, name, rounds).await;
        }
        rounds += 1;
        wait_delivered(&world.log, &all, rounds, "before the crash").await;
        let instances: BTreeSet<(usize, String)> = (world.log.lock().unwrap().iter())
            .filter(|s| s.ordinal + 1 == rounds)
            .map(|s| (s.instance, s.stream.clone()))
            .collect();
        if instances.len() == 2 * all.len() {
            break;
        }
        assert!(
            rounds < 60,
            "both instances read every stream within 60 rounds"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // From here on (the first listings of all three streams are long done) the survivor
    // reads no worker row of the crashed one outside the anchor stream.
    reads.0.lock().unwrap().clear();
    abort_first.send(()).unwrap();
    let after = rounds + 5;
    for round in rounds..after {
        for name in &all {
            write_round(&world.api, name, round).await;
        }
    }
    // The leases run 600 s: only a declaration frees them within this wait.
    wait_delivered(&world.log, &all, after, "after the crash").await;
    second.shutdown().await;
    let watched: Vec<(String, String)> = (reads.0.lock().unwrap().keys())
        .filter(|(stream, id)| *stream != names[0] && id == "worker:first")
        .cloned()
        .collect();
    assert!(
        watched.is_empty(),
        "the crashed instance's worker rows read outside its anchor stream: {watched:?}"
    );
    assert_per_key_order(&world.log.lock().unwrap());
    let errors = world.errors.lock().unwrap();
    assert!(errors.is_empty(), "no errors but retried calls: {errors:?}");
}
