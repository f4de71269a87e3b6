//! A start that stumbles, instances that start together, and an instance that can reach the
//! lease table but not Kinesis, against kinesis-local and dynalite through the fault proxy.
//!
//! * Nothing written after `start()` returned is missed when one of the calls of the first
//!   listing fails (ListShards, the lease table scan, a lease take, a first iterator), under
//!   the default position, `start_at(latest())` and `start_at(timestamp(..))`.
//! * Two instances started at the same moment miss nothing written after both returned.
//! * An instance whose Kinesis calls all fail stops counting towards the shares: the healthy
//!   instance takes the shards it cannot read.

mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_kinesis::config::retry::RetryConfig;
use bytes::Bytes;
use futures::StreamExt;
use kinesis_dataflow::api::PutRecordsEntry;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::SharedLeaseStore;
use kinesis_dataflow::subscription::ShutdownHandle;
use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisPosition, ReadSettings, Subscription, SubscriptionBuilder,
};
use support::proxy::{self, Fault, FaultProxy, Rule};
use tokio::task::JoinHandle;

/// Where the subscription under test starts.
#[derive(Debug, Clone, Copy)]
enum Position {
    Default,
    Latest,
    Timestamp,
}

fn direct() -> SharedKinesis {
    support::init_tracing();
    Arc::new(AwsKinesis::new(support::kinesis_client()))
}

/// Clients through the two proxies, with the SDK's own retries off so that every injected
/// failure reaches the library.
fn proxied(
    kinesis: &FaultProxy,
    dynamodb: &FaultProxy,
    table: &str,
) -> (SharedKinesis, SharedLeaseStore) {
    let api = aws_sdk_kinesis::Client::from_conf(
        proxy::kinesis_config_builder(kinesis)
            .retry_config(RetryConfig::disabled())
            .build(),
    );
    let db = aws_sdk_dynamodb::Client::from_conf(
        proxy::dynamodb_config_builder(dynamodb)
            .retry_config(aws_sdk_dynamodb::config::retry::RetryConfig::disabled())
            .build(),
    );
    (
        Arc::new(AwsKinesis::new(api)),
        Arc::new(DynamoLeaseStore::new(db, table.to_owned()).unwrap()),
    )
}

fn store(table: &str) -> SharedLeaseStore {
    Arc::new(DynamoLeaseStore::new(support::dynamodb_client(), table.to_owned()).unwrap())
}

fn builder(
    api: SharedKinesis,
    store: SharedLeaseStore,
    stream: &str,
    owner: &str,
) -> SubscriptionBuilder {
    Subscription::builder(api, store, stream)
        .owner(owner)
        .read_settings(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(100))
                .failure_backoff(Duration::from_millis(100))
                .unlimited_reads(),
        )
        .list_interval(Duration::from_secs(1))
        .lease_duration(Duration::from_secs(3))
        .checkpoint_interval(Duration::from_millis(200))
        .shutdown_timeout(Duration::from_secs(3))
}

fn positioned(builder: SubscriptionBuilder, position: Position) -> SubscriptionBuilder {
    match position {
        Position::Default => builder,
        Position::Latest => builder.start_at(KinesisPosition::latest()),
        Position::Timestamp => {
            let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            builder.start_at(KinesisPosition::timestamp(
                u64::try_from(now.as_millis()).unwrap(),
            ))
        }
    }
}

/// Writes `count` records over many keys (so over every shard); returns their payloads.
async fn publish(api: &SharedKinesis, stream: &str, tag: &str, count: usize) -> BTreeSet<String> {
    let entries: Vec<PutRecordsEntry> = (0..count)
        .map(|i| PutRecordsEntry {
            data: Bytes::from(format!("{tag}-{i:04}")),
            partition_key: format!("key-{i}"),
            explicit_hash_key: None,
        })
        .collect();
    let out = api.put_records(stream, entries).await.unwrap();
    assert_eq!(out.failed_count(), 0);
    (0..count).map(|i| format!("{tag}-{i:04}")).collect()
}

/// A running subscription whose deliveries are recorded and acknowledged.
struct Consumer {
    got: Arc<Mutex<BTreeSet<String>>>,
    shards: Arc<Mutex<Vec<String>>>,
    handle: ShutdownHandle,
    task: JoinHandle<()>,
}

impl Consumer {
    fn run(sub: Subscription) -> Self {
        let got = Arc::new(Mutex::new(BTreeSet::new()));
        let shards = Arc::new(Mutex::new(Vec::new()));
        let handle = sub.shutdown_handle();
        let task = {
            let (got, shards) = (got.clone(), shards.clone());
            tokio::spawn(async move {
                let mut sub = sub;
                let mut tick = tokio::time::interval(Duration::from_millis(50));
                loop {
                    tokio::select! {
                        item = sub.next() => match item {
                            Some(Ok(d)) => {
                                got.lock().unwrap().insert(String::from_utf8_lossy(d.data()).into_owned());
                                d.ack();
                            }
                            Some(Err(e)) => eprintln!("{}: {e}", sub.owner()),
                            None => break,
                        },
                        _ = tick.tick() => *shards.lock().unwrap() = sub.shards(),
                    }
                }
            })
        };
        Self {
            got,
            shards,
            handle,
            task,
        }
    }

    fn got(&self) -> BTreeSet<String> {
        self.got.lock().unwrap().clone()
    }

    fn shards(&self) -> Vec<String> {
        self.shards.lock().unwrap().clone()
    }

    async fn stop(self) {
        self.handle.shutdown().await;
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

/// Waits until `consumers` together delivered every payload of `expected`.
async fn wait_delivered(consumers: &[&Consumer], expected: &BTreeSet<String>, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(40);
    loop {
        let mut got = BTreeSet::new();
        for c in consumers {
            got.extend(c.got());
        }
        let missing: Vec<&String> = expected.difference(&got).collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: {} of {} records written after start() returned never came: {missing:?} \
             (logs: {})",
            missing.len(),
            expected.len(),
            support::logs_dir().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One fault of the first listing, then records written right after `start()` returned.
async fn stumble(name: &str, rule: Rule, position: Position) {
    let what = format!("{name} under {position:?}");
    let api = direct();
    let stream = support::unique_name(name);
    support::create_stream(&support::kinesis_client(), &stream, 2).await;
    let table = support::unique_name("stumble-leases");
    let kinesis_proxy = FaultProxy::start(&support::kinesis_endpoint()).await;
    let dynamodb_proxy = FaultProxy::start(&support::dynamodb_endpoint()).await;
    let (proxied_api, proxied_store) = proxied(&kinesis_proxy, &dynamodb_proxy, &table);
    // The table exists before the fault is armed: preparing it is not part of the listing.
    proxied_store.prepare().await.unwrap();
    let id = if rule_is_dynamodb(name) {
        dynamodb_proxy.add(rule)
    } else {
        kinesis_proxy.add(rule)
    };
    let sub = positioned(builder(proxied_api, proxied_store, &stream, "a"), position)
        .start()
        .await
        .unwrap_or_else(|e| panic!("{what}: start failed: {e}"));
    let expected = publish(&api, &stream, "after", 60).await;
    let consumer = Consumer::run(sub);
    wait_delivered(&[&consumer], &expected, &what).await;
    let injected = kinesis_proxy.injected(id) + dynamodb_proxy.injected(id);
    assert!(injected > 0, "{what}: the fault was never injected");
    consumer.stop().await;
}

fn rule_is_dynamodb(name: &str) -> bool {
    name.starts_with("query") || name.starts_with("take")
}

async fn each_position(name: &str, rule: impl Fn() -> Rule) {
    for position in [Position::Default, Position::Latest, Position::Timestamp] {
        stumble(name, rule(), position).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_list_shards_misses_nothing_written_after_start() {
    each_position("list-shards", || {
        Rule::on("ListShards", Fault::Status(500)).times(1)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_table_query_misses_nothing_written_after_start() {
    each_position("query", || Rule::on("Query", Fault::Status(500)).times(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_first_takes_miss_nothing_written_after_start() {
    each_position("take-fails", || {
        Rule::on("UpdateItem", Fault::Status(500)).times(3)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_that_times_out_misses_nothing_written_after_start() {
    // The write reaches the table after the client gave up: the lease is held without the
    // instance knowing.
    each_position("take-slow", || {
        Rule::on("UpdateItem", Fault::Latency(Duration::from_millis(1500))).times(2)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_first_iterator_misses_nothing_written_after_start() {
    each_position("iterator", || {
        Rule::on("GetShardIterator", Fault::Status(500)).times(1)
    })
    .await;
}

/// Two instances started at the same moment: whatever each opens with, together they miss
/// nothing written after the first of them returned from `start()`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_started_together_miss_nothing() {
    for position in [Position::Default, Position::Latest, Position::Timestamp] {
        let api = direct();
        let stream = support::unique_name("together");
        support::create_stream(&support::kinesis_client(), &stream, 4).await;
        let table = support::unique_name("together-leases");
        let a = positioned(builder(direct(), store(&table), &stream, "a"), position);
        let b = positioned(builder(direct(), store(&table), &stream, "b"), position);
        let (tx, rx) = tokio::sync::oneshot::channel();
        let writer = {
            let (api, stream) = (api.clone(), stream.clone());
            tokio::spawn(async move {
                // Starts writing as soon as the first instance is up.
                let _ = rx.await;
                let mut all = BTreeSet::new();
                for round in 0..10 {
                    all.extend(publish(&api, &stream, &format!("r{round}"), 20).await);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                all
            })
        };
        let tx = Mutex::new(Some(tx));
        let started = |sub: Subscription| {
            if let Some(tx) = tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
            sub
        };
        let (a, b) = tokio::join!(async { started(a.start().await.unwrap()) }, async {
            started(b.start().await.unwrap())
        });
        let (a, b) = (Consumer::run(a), Consumer::run(b));
        let expected = writer.await.unwrap();
        wait_delivered(
            &[&a, &b],
            &expected,
            &format!("together under {position:?}"),
        )
        .await;
        a.stop().await;
        b.stop().await;
    }
}

/// An instance that keeps its lease-table access but loses Kinesis stops counting as a worker:
/// the healthy instance takes the shards it cannot read, and reads everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_that_cannot_reach_kinesis_leaves_its_shards_to_the_others() {
    let api = direct();
    let stream = support::unique_name("sick");
    support::create_stream(&support::kinesis_client(), &stream, 4).await;
    let table = support::unique_name("sick-leases");
    let kinesis_proxy = FaultProxy::start(&support::kinesis_endpoint()).await;
    let dynamodb_proxy = FaultProxy::start(&support::dynamodb_endpoint()).await;
    let (sick_api, sick_store) = proxied(&kinesis_proxy, &dynamodb_proxy, &table);
    let sick = Consumer::run(
        builder(sick_api, sick_store, &stream, "sick")
            .start_at(KinesisPosition::horizon())
            .start()
            .await
            .unwrap(),
    );
    let healthy = Consumer::run(
        builder(direct(), store(&table), &stream, "healthy")
            .start_at(KinesisPosition::horizon())
            .start()
            .await
            .unwrap(),
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while sick.shards().len() + healthy.shards().len() < 4 || healthy.shards().len() == 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the two never shared the shards"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // From now on every Kinesis call of "sick" is refused.
    kinesis_proxy.add(Rule::any(Fault::Error {
        status: 400,
        error_type: "AccessDeniedException".into(),
        message: "User is not authorized to perform this action (injected by the fault proxy)"
            .into(),
    }));
    let expected = publish(&api, &stream, "while-sick", 80).await;
    wait_delivered(&[&healthy], &expected, "the healthy instance").await;
    // Every shard ends with the healthy instance (a shard it took over may still be changing
    // hands while the last records arrive).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while healthy.shards().len() < 4 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the healthy instance reads {:?}, the sick one {:?}",
            healthy.shards(),
            sick.shards()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sick.stop().await;
    healthy.stop().await;
}
