// The scenarios of `subscription_local.rs` (polling) and `subscription_local_fan_out.rs`
// (enhanced fan-out), included by both: the same tests in both read modes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::{Arc, Mutex};
use std::time::Duration;
use support::cutoff::CutOff;

use bytes::Bytes;
use futures::StreamExt;
use kinesis_dataflow::api::{KinesisAdmin, SharedKinesis};
use kinesis_dataflow::api::{PutRecordResult, PutRecordsEntry};
use kinesis_dataflow::lease::SharedLeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::subscription::ShutdownHandle;
use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore, KinesisPosition, ReadSettings, Subscription};
use tokio::task::JoinHandle;

/// The read settings of every instance: polling, or fan-out as [`FAN_OUT`] says.
fn read_settings() -> ReadSettings {
    let settings = ReadSettings::default()
        .poll_interval(Duration::from_millis(100))
        .unlimited_reads();
    match FAN_OUT {
        Some(consumer) => settings.fan_out(consumer),
        None => settings,
    }
}

/// One delivery as a consumer saw it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Got {
    /// Global delivery order across every consumer of the test.
    at: u64,
    owner: String,
    shard: String,
    sequence_number: String,
    key: String,
    payload: String,
}

static ORDER: AtomicU64 = AtomicU64::new(0);

/// A running subscription whose deliveries are recorded and acknowledged.
struct Consumer {
    got: Arc<Mutex<Vec<Got>>>,
    shards: Arc<Mutex<Vec<String>>>,
    handle: ShutdownHandle,
    crash: Arc<tokio::sync::Notify>,
    task: JoinHandle<()>,
}

impl Consumer {
    async fn start(
        api: &SharedKinesis,
        store: &SharedLeaseStore,
        stream: &str,
        owner: &str,
    ) -> Self {
        let sub = Subscription::builder(api.clone(), store.clone(), stream)
            .owner(owner)
            .start_at(KinesisPosition::horizon())
            .read_settings(read_settings())
            .list_interval(Duration::from_millis(500))
            .lease_duration(Duration::from_secs(3))
            .checkpoint_interval(Duration::from_millis(200))
            .shutdown_timeout(Duration::from_secs(5))
            .start()
            .await
            .expect("subscription starts");
        let got = Arc::new(Mutex::new(Vec::new()));
        let shards = Arc::new(Mutex::new(Vec::new()));
        let handle = sub.shutdown_handle();
        let crash = Arc::new(tokio::sync::Notify::new());
        let task = {
            let (got, shards, owner) = (got.clone(), shards.clone(), owner.to_owned());
            let crash = crash.clone();
            tokio::spawn(async move {
                let mut sub = sub;
                let mut tick = tokio::time::interval(Duration::from_millis(50));
                loop {
                    tokio::select! {
                        item = sub.next() => match item {
                            Some(Ok(d)) => {
                                got.lock().unwrap().push(Got {
                                    at: ORDER.fetch_add(1, Ordering::SeqCst),
                                    owner: owner.clone(),
                                    shard: d.shard_id().to_owned(),
                                    sequence_number: d.sequence_number().to_owned(),
                                    key: d.partition_key().to_owned(),
                                    payload: String::from_utf8(d.data().to_vec()).unwrap(),
                                });
                                d.ack();
                            }
                            Some(Err(e)) => eprintln!("{owner}: {e}"),
                            None => break,
                        },
                        _ = tick.tick() => *shards.lock().unwrap() = sub.shards(),
                        _ = crash.notified() => {
                            // Gone without a word: no flush, no release.
                            sub.abort();
                            break;
                        }
                    }
                }
                *shards.lock().unwrap() = Vec::new();
            })
        };
        Self {
            got,
            shards,
            handle,
            crash,
            task,
        }
    }

    fn shards(&self) -> Vec<String> {
        self.shards.lock().unwrap().clone()
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    /// Graceful stop.
    async fn shutdown(self) -> Vec<Got> {
        self.handle.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
        self.got.lock().unwrap().clone()
    }

    /// A crash: the subscription stops without flushing or releasing anything.
    async fn vanish(self) -> Vec<Got> {
        self.crash.notify_one();
        let _ = self.task.await;
        self.got.lock().unwrap().clone()
    }
}

fn kinesis() -> SharedKinesis {
    support::init_tracing();
    Arc::new(AwsKinesis::new(support::kinesis_client()))
}

async fn lease_store() -> SharedLeaseStore {
    let table = support::unique_name("leases");
    Arc::new(DynamoLeaseStore::new(support::dynamodb_client(), table).unwrap())
}

async fn publish(
    api: &SharedKinesis,
    stream: &str,
    keys: usize,
    range: std::ops::Range<usize>,
) -> usize {
    let mut n = 0;
    let all: Vec<usize> = range.collect();
    for chunk in all.chunks(500) {
        let entries = chunk
            .iter()
            .map(|i| PutRecordsEntry {
                data: Bytes::from(format!("{}:{i:06}", i % keys)),
                partition_key: format!("key-{}", i % keys),
                explicit_hash_key: None,
            })
            .collect();
        let out = api.put_records(stream, entries).await.unwrap();
        for r in out.results {
            assert!(matches!(r, PutRecordResult::Stored { .. }), "{r:?}");
            n += 1;
        }
    }
    n
}

async fn wait_until(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for: {what}; emulator logs: {}",
            support::logs_dir().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn distinct_payloads(got: &[Got]) -> BTreeSet<String> {
    got.iter().map(|g| g.payload.clone()).collect()
}

fn balanced(a: &Consumer, b: &Consumer, total: usize) -> bool {
    let (sa, sb) = (a.shards(), b.shards());
    sa.len() + sb.len() == total
        && sa.len().abs_diff(sb.len()) <= 1
        && sa.iter().all(|s| !sb.contains(s))
}

/// Checks that every key's records arrived in publish order: ordered by the global delivery
/// order, a key's payloads never go back (a repeat of the latest one is a duplicate, allowed).
fn assert_key_order(got: &[Got]) {
    let mut sorted: Vec<&Got> = got.iter().collect();
    sorted.sort_by_key(|g| g.at);
    let mut last: HashMap<&str, &str> = HashMap::new();
    for g in sorted {
        if let Some(previous) = last.insert(&g.key, &g.payload) {
            assert!(
                previous <= g.payload.as_str(),
                "key {} out of order: {previous} then {}",
                g.key,
                g.payload
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_a_four_shard_stream() {
    let api = kinesis();
    let store = lease_store().await;
    let stream = support::unique_name("share");
    support::create_stream(&support::kinesis_client(), &stream, 4).await;
    let a = Consumer::start(&api, &store, &stream, "instance-a").await;
    let b = Consumer::start(&api, &store, &stream, "instance-b").await;
    wait_until("two shards each", Duration::from_secs(60), || {
        balanced(&a, &b, 4)
    })
    .await;

    let total = publish(&api, &stream, 16, 0..400).await;
    wait_until("every record", Duration::from_secs(60), || {
        distinct_payloads(&a.got()).len() + distinct_payloads(&b.got()).len() >= total
    })
    .await;
    let (ga, gb) = (a.shutdown().await, b.shutdown().await);
    let shards_a: BTreeSet<_> = ga.iter().map(|g| g.shard.clone()).collect();
    let shards_b: BTreeSet<_> = gb.iter().map(|g| g.shard.clone()).collect();
    assert!(
        shards_a.is_disjoint(&shards_b),
        "a shard read by both: {shards_a:?} {shards_b:?}"
    );
    let all: Vec<Got> = ga.iter().chain(gb.iter()).cloned().collect();
    assert_eq!(
        distinct_payloads(&all).len(),
        total,
        "every record delivered"
    );
    assert_eq!(all.len(), total, "no record delivered twice");
    assert_key_order(&all);
    if let Some(consumer) = FAN_OUT {
        // Read as the fan-out consumer, which stays registered after both stopped.
        let described = api.describe_stream_consumer(&stream, consumer).await;
        assert!(described.is_ok(), "{described:?}");
    }
}

/// Two instances on a two-shard stream, one shard each, after both consumed a first batch of
/// 200 records. Returns the transport, the lease store, the stream, both consumers and the
/// batch size.
async fn two_instances_after_a_first_batch(
    prefix: &str,
) -> (
    SharedKinesis,
    SharedLeaseStore,
    String,
    Consumer,
    Consumer,
    usize,
) {
    let api = kinesis();
    let store = lease_store().await;
    let stream = support::unique_name(prefix);
    support::create_stream(&support::kinesis_client(), &stream, 2).await;
    let a = Consumer::start(&api, &store, &stream, "instance-a").await;
    let b = Consumer::start(&api, &store, &stream, "instance-b").await;
    wait_until("one shard each", Duration::from_secs(60), || {
        balanced(&a, &b, 2)
    })
    .await;
    let first = publish(&api, &stream, 8, 0..200).await;
    wait_until("the first batch", Duration::from_secs(60), || {
        distinct_payloads(&a.got()).len() + distinct_payloads(&b.got()).len() >= first
    })
    .await;
    (api, store, stream, a, b, first)
}

/// The owners whose worker rows the lease table holds for `stream`.
async fn worker_rows(store: &SharedLeaseStore, stream: &str) -> BTreeSet<String> {
    store
        .list(stream)
        .await
        .expect("list the lease table")
        .into_iter()
        .filter_map(|l| l.shard_id.strip_prefix("worker:").map(str::to_owned))
        .filter(|owner| !owner.is_empty()) // (the roster row)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_instance_is_taken_over_from_its_checkpoint() {
    let (api, store, stream, a, b, first) = two_instances_after_a_first_batch("vanish").await;
    let a_shards = a.shards();
    let crashed = tokio::time::Instant::now();
    let got_a = a.vanish().await;
    let rest = publish(&api, &stream, 8, 200..300).await;
    // B takes A's shard once the lease expires (3 s), then resumes from the checkpoint.
    wait_until("B reads A's shard", Duration::from_secs(60), || {
        a_shards.iter().all(|s| b.shards().contains(s))
    })
    .await;
    eprintln!("crashed shard taken over after {:?}", crashed.elapsed());
    // The crashed instance's worker row is left behind; B deletes it once nobody renewed it
    // for the lease duration, and keeps its own.
    let mut rows = worker_rows(&store, &stream).await;
    while rows.contains("instance-a") && crashed.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        rows = worker_rows(&store, &stream).await;
    }
    assert_eq!(
        rows,
        BTreeSet::from(["instance-b".to_owned()]),
        "the crashed instance's worker row is deleted"
    );
    wait_until("every record", Duration::from_secs(60), || {
        let all: Vec<Got> = got_a.iter().cloned().chain(b.got()).collect();
        distinct_payloads(&all).len() >= first + rest
    })
    .await;
    let got_b = b.shutdown().await;
    let all: Vec<Got> = got_a.iter().cloned().chain(got_b.iter().cloned()).collect();
    assert_eq!(distinct_payloads(&all).len(), first + rest, "nothing lost");
    // Duplicates only from A's unsettled (not yet checkpointed) tail: each is a record A
    // delivered, and per shard they are the last ones A delivered.
    for shard in &a_shards {
        let a_seqs: Vec<&str> = got_a
            .iter()
            .filter(|g| &g.shard == shard)
            .map(|g| g.sequence_number.as_str())
            .collect();
        let b_seqs: BTreeSet<&str> = got_b
            .iter()
            .filter(|g| &g.shard == shard)
            .map(|g| g.sequence_number.as_str())
            .collect();
        let repeated: Vec<bool> = a_seqs.iter().map(|s| b_seqs.contains(s)).collect();
        if let Some(first_dup) = repeated.iter().position(|r| *r) {
            assert!(
                repeated[first_dup..].iter().all(|r| *r),
                "duplicates are not A's tail on {shard}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_hands_over_without_duplicates() {
    let (api, store, stream, a, b, first) = two_instances_after_a_first_batch("graceful").await;
    let a_shards = a.shards();
    let started = tokio::time::Instant::now();
    let got_a = a.shutdown().await;
    assert_eq!(
        worker_rows(&store, &stream).await,
        BTreeSet::from(["instance-b".to_owned()]),
        "a graceful stop deletes the instance's worker row"
    );
    wait_until("B reads A's shard", Duration::from_secs(30), || {
        a_shards.iter().all(|s| b.shards().contains(s))
    })
    .await;
    eprintln!("released shard taken over after {:?}", started.elapsed());
    let rest = publish(&api, &stream, 8, 200..300).await;
    wait_until("every record", Duration::from_secs(60), || {
        distinct_payloads(&got_a).len() + distinct_payloads(&b.got()).len() >= first + rest
    })
    .await;
    let got_b = b.shutdown().await;
    let all: Vec<Got> = got_a.iter().chain(got_b.iter()).cloned().collect();
    assert_eq!(distinct_payloads(&all).len(), first + rest, "nothing lost");
    assert_eq!(
        all.len(),
        first + rest,
        "no duplicates after a graceful hand-over"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resharding_keeps_every_key_in_order_and_children_wait_for_parents() {
    let api = kinesis();
    let store = lease_store().await;
    let client = support::kinesis_client();
    let admin = AwsKinesis::new(client.clone());
    let stream = support::unique_name("reshard");
    support::create_stream(&client, &stream, 2).await;
    let a = Consumer::start(&api, &store, &stream, "instance-a").await;
    let b = Consumer::start(&api, &store, &stream, "instance-b").await;
    wait_until("one shard each", Duration::from_secs(60), || {
        balanced(&a, &b, 2)
    })
    .await;

    // Watch the lease table: a child must never be held while a parent is unfinished.
    let watcher = {
        let (store, stream) = (store.clone(), stream.clone());
        tokio::spawn(async move {
            let mut violations = Vec::new();
            for _ in 0..200 {
                let leases: BTreeMap<String, _> = store
                    .list(&stream)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|l| (l.shard_id.clone(), l))
                    .collect();
                for lease in leases.values() {
                    if lease.owner.is_some() || lease.checkpoint.is_some() {
                        for parent in &lease.parents {
                            if leases
                                .get(parent)
                                .is_some_and(|p| p.checkpoint != Some(Checkpoint::ShardEnd))
                            {
                                violations.push(format!(
                                    "{} active before {parent} finished",
                                    lease.shard_id
                                ));
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            violations
        })
    };

    let mut published = publish(&api, &stream, 12, 0..150).await;
    admin
        .split_shard(
        &stream,
        "shardId-000000000000",
        &(u128::MAX / 4).to_string(),
    )
    .await
    .unwrap();
    support::wait_active(&client, &stream).await;
    published += publish(&api, &stream, 12, 150..300).await;
    admin
        .merge_shards(&stream, "shardId-000000000002", "shardId-000000000003")
        .await
        .unwrap();
    support::wait_active(&client, &stream).await;
    published += publish(&api, &stream, 12, 300..450).await;

    wait_until("every record", Duration::from_secs(120), || {
        distinct_payloads(&a.got()).len() + distinct_payloads(&b.got()).len() >= published
    })
    .await;
    let (ga, gb) = (a.shutdown().await, b.shutdown().await);
    let all: Vec<Got> = ga.iter().chain(gb.iter()).cloned().collect();
    assert_eq!(distinct_payloads(&all).len(), published);
    // Per key, across every shard the key lived on, records arrive in publish order.
    assert_key_order(&all);
    let violations = watcher.await.unwrap_or_default();
    let leases = store.list(&stream).await.unwrap();
    for shard in [
        "shardId-000000000000",
        "shardId-000000000002",
        "shardId-000000000003",
    ] {
        let lease = leases.iter().find(|l| l.shard_id == shard).unwrap();
        assert_eq!(
            lease.checkpoint,
            Some(Checkpoint::ShardEnd),
            "{shard} finished"
        );
    }
    assert!(
        violations.is_empty(),
        "children active before their parents: {violations:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_cut_off_from_dynamodb_stops_reading_and_cannot_checkpoint() {
    let api = kinesis();
    let store = lease_store().await;
    let stream = support::unique_name("cutoff");
    support::create_stream(&support::kinesis_client(), &stream, 1).await;
    let a_view = CutOff::new(store.clone());
    let a_store: SharedLeaseStore = a_view.store();
    let a = Consumer::start(&api, &a_store, &stream, "instance-a").await;
    wait_until("A reads the shard", Duration::from_secs(30), || {
        a.shards().len() == 1
    })
    .await;
    let first = publish(&api, &stream, 4, 0..50).await;
    wait_until("the first batch", Duration::from_secs(30), || {
        distinct_payloads(&a.got()).len() >= first
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A can no longer reach DynamoDB; everything else can. B starts at once, so it takes
    // the shard as soon as the lease expires in its own view: the two never read together.
    a_view.set_down(true);
    let rest = publish(&api, &stream, 4, 50..60).await;
    let b = Consumer::start(&api, &store, &stream, "instance-b").await;
    let watching = tokio::time::Instant::now();
    loop {
        let (a_reads, b_reads) = (!a.shards().is_empty(), !b.shards().is_empty());
        assert!(!(a_reads && b_reads), "A still reads the shard B took");
        if !a_reads && b_reads {
            break;
        }
        assert!(
            watching.elapsed() < Duration::from_secs(30),
            "B never took the shard (A reads: {a_reads})"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let a_checkpoints = a_view.checkpoints();
    a_view.set_down(false);
    wait_until("every record", Duration::from_secs(30), || {
        distinct_payloads(&a.got()).len() + distinct_payloads(&b.got()).len() >= first + rest
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        a_view.checkpoints(),
        a_checkpoints,
        "no checkpoint written by A once it lost the lease"
    );
    let leases = store.list(&stream).await.unwrap();
    let shard = leases
        .iter()
        .find(|l| !l.shard_id.starts_with("worker:"))
        .unwrap();
    assert_eq!(shard.owner.as_deref(), Some("instance-b"));
    let (ga, gb) = (a.shutdown().await, b.shutdown().await);
    let all: Vec<Got> = ga.iter().chain(gb.iter()).cloned().collect();
    assert_eq!(distinct_payloads(&all).len(), first + rest, "nothing lost");
}
