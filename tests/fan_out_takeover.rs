//! Taking over a shard read with enhanced fan-out while the previous holder's subscription is
//! still active (the service allows one per consumer and shard): the successor bridges by
//! GetRecords until a subscription is granted, and switches over without a skip or a repeat.
//! In memory with paused time: a reader beside a subscription held open and not read, a
//! frozen holder (its lease row no longer renewed, its subscription open for 25 s or its full
//! five minutes), and a graceful hand-off, which ends its subscription before it releases. On
//! kinesis-local (which also allows one active subscription): a frozen holder and a killed one.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::{ConsumerStatus, ShardEvents, SharedKinesis};
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::kpl::aggregate;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{Lease, LeaseFuture, LeaseStore, SharedLeaseStore};
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    AwsKinesis, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Publisher, ReadSettings,
    ShardStream, StartingPoint, Subscription, SubscriptionBuilder,
};
use kinesis_dataflow_test_support::timings::{LEASE_DURATION, LIST_INTERVAL, POLL_INTERVAL};
use tokio::time::Instant;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";
const CONSUMER: &str = "app";

/// The consumer's ARN, registered now.
async fn consumer(api: &SharedKinesis) -> String {
    api.register_stream_consumer(STREAM, CONSUMER)
        .await
        .unwrap()
        .consumer_arn
}

/// A subscription of the consumer to the shard, as another holder opened it: kept open and
/// not read, as a frozen process keeps it.
async fn hold(api: &SharedKinesis, arn: &str, at: StartingPoint) -> ShardEvents {
    api.subscribe_to_shard(STREAM, arn, &Arc::from(SHARD), &at)
        .await
        .expect("the holder subscribes")
}

fn reader(api: &SharedKinesis, start: StartingPoint) -> ShardStream {
    ShardStream::builder(api.clone(), STREAM, SHARD)
        .settings(
            ReadSettings::default()
                .fan_out(CONSUMER)
                .deaggregate(true)
                .poll_interval(Duration::from_millis(100)),
        )
        .open(start)
        .unwrap()
}

async fn read(stream: &mut ShardStream, count: usize) -> Vec<String> {
    let mut got = Vec::new();
    while got.len() < count {
        match tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("records in time")
        {
            Some(Ok(record)) => got.push(String::from_utf8_lossy(record.data()).into_owned()),
            Some(Err(e)) => panic!("no error reaches the stream: {e}"),
            None => panic!("the stream ended after {got:?}"),
        }
    }
    got
}

/// A one-shard stream whose consumer already has a subscription held open (and not read) by
/// another holder, from the oldest record.
async fn beside_a_holder() -> (MemoryKinesis, SharedKinesis, ShardEvents) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let arn = consumer(&api).await;
    let held = hold(&api, &arn, StartingPoint::TrimHorizon).await;
    (memory, api, held)
}

/// An instance reading `stream` with fan-out as [`CONSUMER`], with the fast test timings.
fn fan_out_instance(
    api: &SharedKinesis,
    store: SharedLeaseStore,
    stream: &str,
    owner: &str,
) -> SubscriptionBuilder {
    support::reading::fast(api, store, stream, owner)
        .read_settings(
            ReadSettings::default()
                .fan_out(CONSUMER)
                .poll_interval(POLL_INTERVAL)
                .unlimited_reads(),
        )
        .initial_position(KinesisPosition::horizon())
}

/// The shard's row as a frozen holder left it: owned by `frozen`, settled through `settled`,
/// no longer renewed.
async fn frozen_row(store: &MemoryLeaseStore, stream: &str, settled: &str) {
    let lease = Lease::new(stream, SHARD, vec![]);
    assert!(store.create(&lease).await.unwrap());
    let listed = store.list(stream).await.unwrap().remove(0);
    let taken = store.take(&listed, "frozen").await.unwrap();
    store
        .checkpoint(&taken, &Checkpoint::Sequence(settled.to_owned()))
        .await
        .unwrap();
}

/// The starting point of the last SubscribeToShard call.
fn last_subscribe_at(memory: &MemoryKinesis) -> Option<StartingPoint> {
    memory
        .calls()
        .into_iter()
        .rfind(|c| c.operation == Operation::SubscribeToShard)
        .and_then(|c| c.starting_point)
}

#[tokio::test(start_paused = true)]
async fn a_reader_bridges_while_another_subscription_is_active_and_switches_without_a_gap() {
    let (memory, api, held) = beside_a_holder().await;
    memory.put(STREAM, "k", "p0").unwrap();
    memory.put(STREAM, "k", "p1").unwrap();
    let users = aggregate([
        ("k", None, &b"a0"[..]),
        ("k", None, b"a1"),
        ("k", None, b"a2"),
    ]);
    let (_, aggregate_seq) = memory.put(STREAM, "k", users).unwrap();

    // Refused as in use: read by GetRecords, the aggregate taken apart, nothing reported.
    let mut stream = reader(&api, StartingPoint::TrimHorizon);
    assert_eq!(read(&mut stream, 5).await, ["p0", "p1", "a0", "a1", "a2"]);
    assert!(memory.call_count(Operation::GetRecords) >= 1, "bridged");
    assert_eq!(memory.active_subscriptions(), 1, "the holder's only");

    // The holder's connection closes; once a subscription is allowed the reader takes it,
    // starting after the last record it handed on (the aggregate, read whole).
    drop(held);
    tokio::time::sleep(Duration::from_secs(6)).await;
    memory.put(STREAM, "k", "p2").unwrap();
    memory.put(STREAM, "k", "p3").unwrap();
    assert_eq!(read(&mut stream, 2).await, ["p2", "p3"]);
    assert_eq!(memory.active_subscriptions(), 1, "the reader's own");
    assert_eq!(
        last_subscribe_at(&memory),
        Some(StartingPoint::AfterSequence(aggregate_seq))
    );
    let polled = memory.call_count(Operation::GetRecords);
    memory.put(STREAM, "k", "p4").unwrap();
    assert_eq!(read(&mut stream, 1).await, ["p4"]);
    assert_eq!(
        memory.call_count(Operation::GetRecords),
        polled,
        "read by its subscription now"
    );
}

#[tokio::test(start_paused = true)]
async fn a_shard_that_ends_while_bridged_ends_the_stream_with_its_children() {
    let (memory, api, _held) = beside_a_holder().await;
    memory.put(STREAM, "k", "a").unwrap();
    let mut stream = reader(&api, StartingPoint::TrimHorizon);
    assert_eq!(read(&mut stream, 1).await, ["a"]);
    memory
        .split_shard(STREAM, SHARD, &(u128::MAX / 2).to_string())
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("the end in time");
    assert!(end.is_none(), "{end:?}");
    let children = &stream.shard_end().expect("read to its end").child_shards;
    assert_eq!(children.len(), 2);
    assert_eq!(memory.active_subscriptions(), 1, "the holder's only");
}

/// Puts `r000`, `r001`, … under four keys, one every `every`, until told to stop; returns
/// what it put.
fn produce(
    memory: &MemoryKinesis,
    every: Duration,
) -> (Arc<Mutex<bool>>, tokio::task::JoinHandle<Vec<String>>) {
    let stop = Arc::new(Mutex::new(false));
    let memory = memory.clone();
    let task = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut put = Vec::new();
            while !*stop.lock().unwrap() {
                let payload = format!("r{:03}", put.len());
                memory
                    .put(STREAM, &format!("key-{}", put.len() % 4), payload.clone())
                    .unwrap();
                put.push(payload);
                tokio::time::sleep(every).await;
            }
            put
        }
    });
    (stop, task)
}

/// A frozen holder of the shard: its lease row, settled through `r009`, no longer renewed,
/// and its subscription, which it read up to `r019` and keeps open for `hold` (or its whole
/// lifetime). The successor must deliver `r010` on, once each and in order, with no error,
/// reading by GetRecords while the holder's subscription lasts and by subscription after.
async fn frozen_holder(hold_for: Option<Duration>) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let store = MemoryLeaseStore::new();
    let (stop, producer) = produce(&memory, Duration::from_millis(250));
    tokio::time::sleep(Duration::from_secs(5)).await;
    let records = memory.records(STREAM, SHARD).unwrap();
    let settled = records[9].sequence_number().to_owned();

    frozen_row(&store, STREAM, &settled).await;
    let arn = consumer(&api).await;
    let mut held = hold(&api, &arn, StartingPoint::AfterSequence(settled)).await;
    let first = held.next().await.unwrap().unwrap();
    assert!(!first.records.is_empty(), "the holder was reading");
    let frozen_at = Instant::now();

    let mut successor = fan_out_instance(&api, Arc::new(store.clone()), STREAM, "successor")
        .start()
        .await
        .unwrap();
    let mut got: Vec<String> = Vec::new();
    let mut first_at = None;
    let mut held = Some(held);
    let run_for = hold_for.unwrap_or(Duration::from_secs(300)) + Duration::from_secs(10);
    while frozen_at.elapsed() < run_for {
        if let Some(after) = hold_for
            && frozen_at.elapsed() >= after
        {
            // The holder resumes, finds its lease gone and closes its subscription.
            held = None;
        }
        match tokio::time::timeout(Duration::from_millis(500), successor.next()).await {
            Ok(Some(Ok(delivery))) => {
                first_at.get_or_insert_with(|| frozen_at.elapsed());
                got.push(String::from_utf8_lossy(delivery.data()).into_owned());
                delivery.ack();
            }
            Ok(Some(Err(e))) => panic!("no error reaches the stream: {e}"),
            Ok(None) => panic!("the subscription ended"),
            Err(_) => {}
        }
    }
    *stop.lock().unwrap() = true;
    let put = producer.await.unwrap();
    // The last records put arrive within a poll interval or an event.
    let until = Instant::now() + Duration::from_secs(5);
    while got.len() < put.len() - 10 && Instant::now() < until {
        if let Ok(Some(Ok(delivery))) =
            tokio::time::timeout(Duration::from_millis(200), successor.next()).await
        {
            got.push(String::from_utf8_lossy(delivery.data()).into_owned());
            delivery.ack();
        }
    }
    assert_eq!(
        got,
        put[10..],
        "every record after the checkpoint, once, in order"
    );
    let first_at = first_at.expect("the successor delivered");
    let bound = LEASE_DURATION + 2 * LIST_INTERVAL + POLL_INTERVAL;
    assert!(
        first_at <= bound,
        "first delivery {first_at:?} after the freeze, over {bound:?}"
    );
    // After the holder's subscription ended, the successor reads by its own.
    assert_eq!(memory.active_subscriptions(), 1, "the successor's");
    let polled = memory.call_count(Operation::GetRecords);
    memory.put(STREAM, "key-0", "last").unwrap();
    let last = tokio::time::timeout(Duration::from_secs(5), successor.next())
        .await
        .expect("in time")
        .expect("running")
        .expect("a delivery");
    assert_eq!(&last.data()[..], b"last");
    last.ack();
    assert_eq!(
        memory.call_count(Operation::GetRecords),
        polled,
        "by subscription"
    );
    drop(held);
    successor.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_frozen_holder_that_resumes_after_25_s_does_not_stall_the_successor() {
    frozen_holder(Some(Duration::from_secs(25))).await;
}

#[tokio::test(start_paused = true)]
async fn a_frozen_holders_subscription_kept_its_full_five_minutes_does_not_stall_it_either() {
    frozen_holder(None).await;
}

/// Notes, at each lease release, how many subscriptions were still active.
struct AtRelease {
    memory: MemoryKinesis,
    active: Arc<Mutex<Vec<usize>>>,
}

impl LeaseLayer for AtRelease {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        if matches!(call, LeaseCall::Release { .. }) {
            self.active
                .lock()
                .unwrap()
                .push(self.memory.active_subscriptions());
        }
        next
    }
}

#[tokio::test(start_paused = true)]
async fn a_graceful_hand_off_ends_its_subscription_before_it_releases_the_lease() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let store = MemoryLeaseStore::new();
    let active = Arc::new(Mutex::new(Vec::new()));
    let layered: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        AtRelease {
            memory: memory.clone(),
            active: active.clone(),
        },
    ));
    let start =
        |owner: &str, store: SharedLeaseStore| fan_out_instance(&api, store, STREAM, owner).start();
    let mut first = start("first", layered).await.unwrap();
    memory.put(STREAM, "k", "a").unwrap();
    let a = first.next().await.unwrap().unwrap();
    assert_eq!(&a.data()[..], b"a");
    a.ack();
    // Past the five-second rule: only an active subscription could refuse the next holder.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(memory.active_subscriptions(), 1);
    // Stopped gracefully while the stream is not read.
    first.shutdown_handle().shutdown().await;
    assert_eq!(
        *active.lock().unwrap(),
        [0],
        "the subscription ended before the release"
    );

    let mut second = start("second", Arc::new(store.clone())).await.unwrap();
    memory.put(STREAM, "k", "b").unwrap();
    let b = tokio::time::timeout(Duration::from_secs(5), second.next())
        .await
        .expect("in time")
        .unwrap()
        .unwrap();
    assert_eq!(&b.data()[..], b"b");
    b.ack();
    assert_eq!(
        memory.call_count(Operation::GetRecords),
        0,
        "subscribed at once, never bridged"
    );
    second.shutdown().await;
    drop(first);
}

/// The next delivery of `sub` within 30 s, acked, as its payload; an error fails the test.
async fn next_acked(sub: &mut Subscription) -> String {
    let delivery = tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .expect("a delivery in time")
        .expect("running")
        .unwrap_or_else(|e| panic!("no error reaches the stream: {e}"));
    let payload = String::from_utf8_lossy(delivery.data()).into_owned();
    delivery.ack();
    payload
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_kinesis_local_the_successor_of_a_frozen_or_a_killed_holder_reads_without_error() {
    let name = support::unique_name("takeover");
    support::create_stream(&support::kinesis_client(), &name, 1).await;
    let api: SharedKinesis = Arc::new(AwsKinesis::new(support::kinesis_client()));
    let publisher = Publisher::new(api.clone(), name.clone()).without_collect();
    api.register_stream_consumer(&name, CONSUMER).await.unwrap();
    let arn = loop {
        let described = api.describe_stream_consumer(&name, CONSUMER).await.unwrap();
        if described.status == ConsumerStatus::Active {
            break described.consumer_arn;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let store = MemoryLeaseStore::new();
    let f0 = publisher.publish("k", "f0").await.unwrap();
    publisher.publish("k", "f1").await.unwrap();

    // A frozen holder: its row (settled through f0) no longer renewed, its subscription open
    // and not read. kinesis-local refuses a second one while it lasts.
    frozen_row(&store, &name, &f0.sequence_number).await;
    let held = api
        .subscribe_to_shard(
            &name,
            &arn,
            &Arc::from(SHARD),
            &StartingPoint::AfterSequence(f0.sequence_number),
        )
        .await
        .unwrap();
    let start = |owner: &str| fan_out_instance(&api, Arc::new(store.clone()), &name, owner).start();
    let mut successor = start("successor").await.unwrap();
    assert_eq!(next_acked(&mut successor).await, "f1");
    publisher.publish("k", "f2").await.unwrap();
    assert_eq!(next_acked(&mut successor).await, "f2");
    // The holder's connection closes; the successor goes on (by its own subscription once
    // it is granted).
    drop(held);
    tokio::time::sleep(Duration::from_secs(2)).await;
    publisher.publish("k", "f3").await.unwrap();
    assert_eq!(next_acked(&mut successor).await, "f3");
    tokio::time::sleep(Duration::from_millis(500)).await;

    // A killed holder: nothing flushed or released; its connection is gone.
    successor.abort();
    let mut next = start("next").await.unwrap();
    publisher.publish("k", "k0").await.unwrap();
    assert_eq!(
        next_acked(&mut next).await,
        "k0",
        "after the last checkpoint"
    );
    next.shutdown().await;
}
