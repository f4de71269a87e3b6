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
use kinesis_dataflow::lease::SharedLeaseStore;
use kinesis_dataflow::subscription::ShutdownHandle;
use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisError, KinesisPosition, MultiSubscription,
    MultiSubscriptionBuilder, ReadSettings, StreamSet,
};

const KEYS: usize = 8;

fn builder(
    api: &SharedKinesis,
    store: &SharedLeaseStore,
    streams: &StreamSet,
    owner: &str,
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
            .lease_duration(Duration::from_secs(2))
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_two_streams_through_a_split_and_a_crash() {
    support::init_tracing();
    let client = support::kinesis_client();
    let aws = Arc::new(AwsKinesis::new(client.clone()));
    let api: SharedKinesis = aws.clone();
    let orders = support::unique_name("multi-orders");
    let payments = support::unique_name("multi-payments");
    support::create_stream(&client, &orders, 2).await;
    support::create_stream(&client, &payments, 1).await;
    let store: SharedLeaseStore = Arc::new(
        DynamoLeaseStore::new(
            support::dynamodb_client(),
            support::unique_name("multi-leases"),
        )
        .unwrap(),
    );
    let streams = StreamSet::new([orders.clone(), payments.clone()]);
    let log: Log = Arc::default();
    let errors: Log = Arc::default();

    let first = builder(&api, &store, &streams, "first")
        .start()
        .await
        .unwrap();
    // The first instance is aborted below: keep it where the test can reach it.
    let (abort_tx, abort_rx) = tokio::sync::oneshot::channel::<()>();
    {
        let log = log.clone();
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
    }
    let second = builder(&api, &store, &streams, "second")
        .start()
        .await
        .unwrap();
    let second = consume(2, second, log.clone(), errors.clone());
    // Five rounds, then more until both instances have delivered some: on a loaded machine the
    // hand-off to the newcomer can take several listings, and a lease not renewed in time
    // goes back and forth.
    let both = [orders.as_str(), payments.as_str()];
    let mut rounds = 0;
    loop {
        write_round(&api, &orders, rounds).await;
        write_round(&api, &payments, rounds).await;
        rounds += 1;
        if rounds < 5 {
            continue;
        }
        wait_delivered(&log, &both, rounds, "before the split").await;
        let instances: BTreeSet<usize> = log.lock().unwrap().iter().map(|s| s.instance).collect();
        if instances.len() == 2 {
            break;
        }
        assert!(
            rounds < 50,
            "both instances read within 50 rounds: {instances:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (split_rounds, crash_rounds) = (rounds..rounds + 5, rounds + 5..rounds + 10);

    // A split in one stream while the other flows.
    aws.split_shard(
        &orders,
        "shardId-000000000000",
        &(u128::MAX / 4).to_string(),
    )
    .await
    .unwrap();
    for round in split_rounds.clone() {
        write_round(&api, &payments, round).await;
    }
    support::wait_active(&client, &orders).await;
    for round in split_rounds.clone() {
        write_round(&api, &orders, round).await;
    }
    wait_delivered(&log, &both, split_rounds.end, "after the split").await;

    // The first instance crashes; the second takes everything over.
    abort_tx.send(()).unwrap();
    for round in crash_rounds.clone() {
        write_round(&api, &orders, round).await;
        write_round(&api, &payments, round).await;
    }
    let expect_rounds: Vec<usize> = (0..crash_rounds.end).collect();
    let all_delivered = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let done = {
                let log = log.lock().unwrap();
                let got: BTreeSet<(String, String, usize)> = log
                    .iter()
                    .map(|s| (s.stream.clone(), s.key.clone(), s.ordinal))
                    .collect();
                both.iter().all(|s| {
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
    second.shutdown().await;
    let ordered = log.lock().unwrap().clone();
    assert_per_key_order(&ordered);
    assert!(
        ordered
            .iter()
            .any(|s| s.instance == 2 && s.stream == orders && s.ordinal >= crash_rounds.start),
        "the second instance read orders after the crash"
    );
    let errors = errors.lock().unwrap();
    assert!(errors.is_empty(), "no errors but retried calls: {errors:?}");
}

async fn rows_of(store: &SharedLeaseStore, stream: &str) -> Vec<kinesis_dataflow::lease::Lease> {
    store.list(stream).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_inserted_removed_and_deleted_while_running() {
    support::init_tracing();
    let client = support::kinesis_client();
    let api: SharedKinesis = Arc::new(AwsKinesis::new(client.clone()));
    let a = support::unique_name("set-a");
    let b = support::unique_name("set-b");
    let c = support::unique_name("set-c");
    support::create_stream(&client, &a, 1).await;
    support::create_stream(&client, &b, 2).await;
    let store: SharedLeaseStore = Arc::new(
        DynamoLeaseStore::new(
            support::dynamodb_client(),
            support::unique_name("set-leases"),
        )
        .unwrap(),
    );
    let streams = StreamSet::new([a.clone()]);
    let log: Log = Arc::default();
    let errors: Log = Arc::default();
    let sub = builder(&api, &store, &streams, "only")
        .start()
        .await
        .unwrap();
    let handle = consume(1, sub, log.clone(), errors.clone());

    write_round(&api, &a, 0).await;
    wait_delivered(&log, &[a.as_str()], 1, "the first stream").await;

    // Inserted: picked up within a listing.
    assert!(streams.insert(b.clone()));
    write_round(&api, &b, 0).await;
    wait_delivered(&log, &[b.as_str()], 1, "the inserted stream").await;

    // Removed: its leases are released and its rows (checkpoints) kept.
    assert!(streams.remove(&a));
    support::eventually(
        "the removed stream's leases released",
        Duration::from_secs(30),
        async || {
            let rows = rows_of(&store, &a).await;
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
    write_round(&api, &a, 1).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !log.lock()
            .unwrap()
            .iter()
            .any(|s| s.stream == a && s.ordinal == 1),
        "a removed stream is not read"
    );

    // Deleted in Kinesis: its readers stop and its rows are removed.
    assert!(!rows_of(&store, &b).await.is_empty());
    client.delete_stream().stream_name(&b).send().await.unwrap();
    support::eventually(
        "the deleted stream's rows removed",
        Duration::from_secs(30),
        async || rows_of(&store, &b).await.is_empty(),
    )
    .await;

    // Inserted before it exists: reported once by name, read once created.
    assert!(streams.insert(c.clone()));
    support::eventually(
        "a missing stream reported",
        Duration::from_secs(30),
        async || {
            errors
                .lock()
                .unwrap()
                .iter()
                .any(|e| e.stream.contains(c.as_str()))
        },
    )
    .await;
    support::create_stream(&client, &c, 1).await;
    write_round(&api, &c, 0).await;
    wait_delivered(
        &log,
        &[c.as_str()],
        1,
        "the stream created after its insert",
    )
    .await;

    // Inserted back: resumes from its checkpoints (round 0 is not read again).
    assert!(streams.insert(a.clone()));
    wait_delivered(&log, &[a.as_str()], 2, "the stream inserted back").await;
    handle.shutdown().await;
    let log = log.lock().unwrap();
    let a_zero = log
        .iter()
        .filter(|s| s.stream == a && s.ordinal == 0)
        .count();
    assert_eq!(
        a_zero, KEYS,
        "round 0 of the stream inserted back read once"
    );
    let reported = errors.lock().unwrap();
    let about_c = reported
        .iter()
        .filter(|e| e.stream.contains(c.as_str()))
        .count();
    assert_eq!(about_c, 1, "the missing stream reported once: {reported:?}");
}
