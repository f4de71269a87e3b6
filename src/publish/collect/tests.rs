use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::api::MemoryKinesis;
use crate::api::memory::Fault;
use crate::error::Operation;
use crate::publish::RetryPolicy;

#[test]
fn collection_is_on_by_default_and_aggregation_lingers_unless_told() {
    use crate::publish::Aggregate;
    let kinesis = MemoryKinesis::new();
    let settings = |p: &Publisher| p.collector.as_ref().map(|c| c.settings());
    let default = Publisher::new(Arc::new(kinesis), "orders");
    assert_eq!(settings(&default), Some(Collect::default()));
    assert_eq!(settings(&default.clone().without_collect()), None);
    let aggregated = default.clone().aggregate(Aggregate::default());
    assert_eq!(
        settings(&aggregated),
        Some(Collect::default().linger(DEFAULT_AGGREGATION_LINGER))
    );
    let told = default
        .collect(Collect::default().max_calls_in_flight(2))
        .aggregate(Aggregate::default());
    assert_eq!(
        settings(&told),
        Some(Collect::default().max_calls_in_flight(2))
    );
}

#[tokio::test]
async fn a_batch_that_fills_a_call_goes_out_from_its_own_task() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 1).unwrap();
    let publisher = Publisher::new(Arc::new(kinesis.clone()), "orders").max_records_per_call(2);
    let started = |p: &Publisher| {
        let collector = p.collector.as_ref().expect("collecting");
        !collector.queues.lock().unwrap().is_empty()
    };
    let two = || vec![OutgoingRecord::new("a", "1"), OutgoingRecord::new("b", "2")];
    publisher.publish_batch(two()).await.unwrap();
    assert!(!started(&publisher), "a full call's worth is not collected");
    publisher.publish("c", "3").await.unwrap();
    assert!(started(&publisher), "a lone record is");
    assert_eq!(
        kinesis
            .records("orders", "shardId-000000000000")
            .unwrap()
            .len(),
        3
    );
}

/// A publish from a runtime other than the one the collecting task started on is not
/// left to that task, which does not run while its runtime is kept but not driven (here a
/// current-thread runtime used once, for a first publish at start-up).
#[test]
fn a_publish_does_not_wait_on_a_runtime_that_is_not_running() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 1).unwrap();
    let publisher = Publisher::new(Arc::new(kinesis.clone()), "orders");
    let start_up = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    start_up.block_on(publisher.publish("k", "1")).unwrap();
    let work = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let published = work.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), publisher.publish("k", "2")).await
    });
    assert!(
        matches!(published, Ok(Ok(_))),
        "the second publish: {published:?}"
    );
    assert_eq!(
        kinesis
            .records("orders", "shardId-000000000000")
            .unwrap()
            .len(),
        2
    );
    drop(start_up);
}

/// The collecting task is gone with its runtime, and a new one cannot start on a runtime
/// that is shutting down (tokio drops such a task inside `spawn`): the publish answers
/// that the publisher stopped, rather than spawning again and again under the lock, and
/// hands the record back. Whether the request reached the task before the runtime's workers
/// dropped it is up to the threads: either way the record is possibly stored.
#[test]
fn a_publish_on_a_runtime_shutting_down_says_the_publisher_stopped() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 1).unwrap();
    let publisher = Publisher::new(Arc::new(kinesis), "orders");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(publisher.publish("a", "1")).unwrap();
    let handle = runtime.handle().clone();
    runtime.shutdown_background();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // Its own thread, so a publish that never returns fails the test instead of hanging it.
    std::thread::spawn(move || {
        let answer = handle.block_on(publisher.publish("b", "2"));
        let _ = done_tx.send(answer);
    });
    let answer = done_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the publish returned");
    let Err(KinesisError::PublishFailed(failure)) = answer else {
        panic!("expected PublishFailed, got {answer:?}");
    };
    assert_eq!(failure.last_code, "PublisherStopped", "{failure:?}");
    assert_eq!(failure.failed.len(), 1);
    let back = &failure.failed[0];
    assert_eq!(
        (back.record.data.as_ref(), back.maybe_stored),
        (&b"2"[..], true)
    );
    assert!(
        failure.to_string().contains("stopped before it answered"),
        "{failure}"
    );
}

fn publisher(kinesis: &MemoryKinesis) -> Publisher {
    Publisher::new(Arc::new(kinesis.clone()), "orders")
        .retry(
            RetryPolicy::default()
                .max_attempts(2)
                .initial_backoff(Duration::from_millis(10)),
        )
        .collect(Collect::default().linger(Duration::from_millis(20)))
}

/// 64 tasks, each publishing its key's records one at a time, awaiting each.
async fn publish_from_tasks(publisher: &Publisher, tasks: usize, each: usize) {
    let mut handles = Vec::new();
    for task in 0..tasks {
        let publisher = publisher.clone();
        handles.push(tokio::spawn(async move {
            for n in 0..each {
                publisher
                    .publish(format!("key-{task}"), format!("{task}:{n}"))
                    .await
                    .unwrap();
            }
        }));
    }
    for handle in handles {
        handle.await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn single_publishes_from_many_tasks_share_calls_and_keep_each_keys_order() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 2).unwrap();
    let publisher = publisher(&kinesis);
    publish_from_tasks(&publisher, 64, 5).await;
    // Each task's n-th publish waits for its (n-1)-th: five rounds of 64 publishes, each
    // in two calls of 32 (a batch takes at most half of what is outstanding).
    assert_eq!(kinesis.call_count(Operation::PutRecords), 10);
    for shard in ["shardId-000000000000", "shardId-000000000001"] {
        let mut last = std::collections::HashMap::new();
        for record in kinesis.records("orders", shard).unwrap() {
            let data = String::from_utf8(record.data().to_vec()).unwrap();
            let (task, n) = data.split_once(':').unwrap();
            let n: usize = n.parse().unwrap();
            let before = last.insert(task.to_owned(), n);
            assert_eq!(before.map_or(0, |b| b + 1), n, "task {task} in order");
        }
    }
}

/// PutRecords calls that never answer.
struct Stall;

impl crate::api::layer::KinesisLayer for Stall {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: crate::api::layer::ApiCall<'a>,
        next: crate::api::ApiFuture<'a, T>,
    ) -> crate::api::ApiFuture<'a, T> {
        match call {
            crate::api::layer::ApiCall::PutRecords { .. } => Box::pin(std::future::pending()),
            _ => next,
        }
    }
}

#[test]
fn records_lost_with_a_runtime_that_shut_down_are_no_longer_outstanding() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 1).unwrap();
    let api = crate::api::layer::Layered::new(Arc::new(kinesis), Stall);
    let publisher = Publisher::new(Arc::new(api), "orders").collect(Collect::default());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stalled = publisher.clone();
    runtime.spawn(async move { stalled.publish("k", "x").await });
    runtime.block_on(async { tokio::time::sleep(Duration::from_millis(50)).await });
    let collector = publisher.collector.clone().unwrap();
    assert_eq!(
        collector.outstanding.load(Ordering::Relaxed),
        1,
        "on its way"
    );
    // The runtime goes, and the collecting task and its call with it.
    drop(runtime);
    assert_eq!(collector.outstanding.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn a_clone_configured_differently_sends_by_its_own_settings() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 1).unwrap();
    let publisher = publisher(&kinesis);
    // The first publish starts the collecting task.
    publisher.publish("k", "first").await.unwrap();
    kinesis.clear_calls();
    let small_calls = publisher.clone().max_records_per_call(1);
    let records = (0..3).map(|i| OutgoingRecord::new("k", format!("{i}")));
    small_calls.publish_batch(records.collect()).await.unwrap();
    assert_eq!(
        kinesis.call_count(Operation::PutRecords),
        3,
        "one record per call, as the clone was told"
    );
    // The original keeps its own.
    kinesis.clear_calls();
    let records = (0..3).map(|i| OutgoingRecord::new("k", format!("{i}")));
    publisher.publish_batch(records.collect()).await.unwrap();
    assert_eq!(kinesis.call_count(Operation::PutRecords), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failure_reaches_only_the_publishes_whose_records_failed() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 2).unwrap();
    let shard0 = "shardId-000000000000";
    kinesis.inject(
        Fault::fail(Operation::PutRecords, "internal failure")
            .on_shard(shard0)
            .times(u32::MAX),
    );
    let publisher = publisher(&kinesis);
    let outcomes =
        futures::future::join_all((0..32).map(|i| publisher.publish(format!("key-{i}"), "x")))
            .await;
    let (ok, failed): (Vec<_>, Vec<_>) = outcomes.into_iter().partition(Result::is_ok);
    assert!(!ok.is_empty() && !failed.is_empty(), "keys on both shards");
    for place in ok {
        assert_eq!(place.unwrap().shard_id, "shardId-000000000001");
    }
    for error in failed {
        let Err(KinesisError::PublishFailed(failure)) = error else {
            panic!("a publish failure, not {error:?}");
        };
        assert_eq!((failure.total(), failure.failed[0].index), (1, 0));
        assert_eq!(failure.attempts, 2);
    }
    // The first rounds in two calls of 16; the failing publishes' second rounds share
    // calls again (two: the half rule).
    assert_eq!(kinesis.call_count(Operation::PutRecords), 4);
}

/// `n` partition keys whose records go to shard `shard` (0 or 1) of a stream of two.
fn keys_on(shard: u128, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("key-{i}"))
        .filter(|key| crate::api::memory::hash_key(key) >> 127 == shard)
        .take(n)
        .collect()
}

/// 64 tasks publish at once, half of them to a shard over its write limit for good: the
/// publishes to the other shard share batches with those, and each must return once its
/// own record is stored, not once the batch's throttled records are given up (the retry
/// patience, 11.3 s); nor may the batches retrying take the call slots from new publishes.
#[tokio::test(start_paused = true)]
async fn a_publish_returns_once_its_own_records_are_stored_whatever_its_batch_waits_for() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 2).unwrap();
    kinesis.inject(
        Fault::throttle(Operation::PutRecords)
            .on_shard("shardId-000000000000")
            .times(u32::MAX),
    );
    // The defaults: 4 calls in flight, no linger, 11.3 s of patience for throttled ones.
    let publisher = Publisher::new(Arc::new(kinesis.clone()), "orders");
    let start = tokio::time::Instant::now();
    let publish = |key: String| {
        let publisher = publisher.clone();
        tokio::spawn(async move {
            let outcome = publisher.publish(key, "x").await;
            (outcome, start.elapsed())
        })
    };
    let test = async {
        let (mut throttled, mut healthy) = (Vec::new(), Vec::new());
        let mut cold = keys_on(1, 33);
        let late = cold.pop().unwrap();
        for (hot, cold) in keys_on(0, 32).into_iter().zip(cold) {
            throttled.push(publish(hot));
            healthy.push(publish(cold));
        }
        for task in healthy {
            let (outcome, took) = task.await.unwrap();
            assert_eq!(outcome.unwrap().shard_id, "shardId-000000000001");
            assert!(took < Duration::from_secs(1), "returned after {took:?}");
        }
        // The throttled ones are still retrying: a new publish to the healthy shard goes.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let (outcome, took) = publish(late).await.unwrap();
        outcome.unwrap();
        assert!(
            took < Duration::from_secs(3),
            "published at 2 s, returned at {took:?}"
        );
        for task in throttled {
            let (outcome, took) = task.await.unwrap();
            assert!(
                matches!(outcome, Err(KinesisError::PublishFailed(_))),
                "{outcome:?}"
            );
            assert!(
                took >= RetryPolicy::default().patience(),
                "gave up at {took:?}"
            );
        }
    };
    tokio::time::timeout(Duration::from_secs(120), test)
        .await
        .expect("every publish returns");
}

/// With [`KeyOrder::Strict`](crate::publish::KeyOrder::Strict), two concurrent publishes
/// of one partition key collected into one batch: the first one's record fails for good
/// (its explicit hash key sends it to a failing shard); the second one's goes elsewhere,
/// and concurrent publishes have no order between them: it is sent, and stored.
#[tokio::test(start_paused = true)]
async fn a_failing_publish_holds_back_no_record_of_another_of_its_key() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 2).unwrap();
    kinesis.inject(
        Fault::fail(Operation::PutRecords, "internal failure")
            .on_shard("shardId-000000000000")
            .times(u32::MAX),
    );
    // One call slot: a batch takes whatever arrives within the linger.
    let publisher = publisher(&kinesis)
        .key_order(crate::publish::KeyOrder::Strict)
        .collect(
            Collect::default()
                .linger(Duration::from_millis(20))
                .max_calls_in_flight(1),
        );
    let first = OutgoingRecord::new("k", "first").with_explicit_hash_key("0");
    let second =
        OutgoingRecord::new("k", "second").with_explicit_hash_key((1u128 << 127).to_string());
    let (first, second) = tokio::time::timeout(
        Duration::from_secs(60),
        futures::future::join(
            publisher.publish_batch(vec![first]),
            publisher.publish_batch(vec![second]),
        ),
    )
    .await
    .expect("both return");
    let Err(KinesisError::PublishFailed(failure)) = first else {
        panic!("the first publish fails: {first:?}");
    };
    assert_eq!(
        failure.failed[0].last_error.as_ref().unwrap().code,
        "InternalFailure"
    );
    let second = second.expect("the second publish is stored");
    assert_eq!(second[0].shard_id, "shardId-000000000001");
    assert_eq!(
        kinesis
            .records("orders", "shardId-000000000001")
            .unwrap()
            .len(),
        1
    );
}

/// A publish dropped while its batch waits for a call slot is not sent: as without
/// collection, dropping a publish's future stops it (what a sink dropped mid-batch relies
/// on: its deliveries go back, and a copy sent later could land after their new copies).
#[tokio::test(start_paused = true)]
async fn a_publish_dropped_before_its_call_goes_is_not_sent() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 1).unwrap();
    // The first call takes a second, and holds the only call slot meanwhile.
    kinesis.inject(Fault::latency(
        Operation::PutRecords,
        Duration::from_secs(1),
    ));
    let publisher = Publisher::new(Arc::new(kinesis.clone()), "orders")
        .collect(Collect::default().max_calls_in_flight(1));
    let first = tokio::spawn({
        let publisher = publisher.clone();
        async move { publisher.publish("a", "first").await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    let dropped = tokio::time::timeout(
        Duration::from_millis(100),
        publisher.publish("b", "dropped"),
    )
    .await;
    assert!(dropped.is_err(), "still waiting: {dropped:?}");
    first.await.unwrap().unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let stored: Vec<_> = kinesis
        .records("orders", "shardId-000000000000")
        .unwrap()
        .iter()
        .map(|r| r.data().clone())
        .collect();
    assert_eq!(stored, ["first"]);
}

#[test]
fn a_publisher_outliving_its_runtime_collects_on_the_next_one() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 1).unwrap();
    let publisher = publisher(&kinesis);
    for round in 0..2 {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let place = runtime
            .block_on(publisher.publish("key", format!("round {round}")))
            .unwrap();
        assert_eq!(place.shard_id, "shardId-000000000000");
    }
    assert_eq!(
        kinesis
            .records("orders", "shardId-000000000000")
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_batch_takes_at_most_half_of_what_is_outstanding_when_two_calls_may_run() {
    let call = CallLimits {
        records: 500,
        bytes: 5 << 20,
    };
    let records = |outstanding, slots| batch_limits(call, outstanding, slots).records;
    assert_eq!(records(64, 4), 32);
    assert_eq!(records(63, 4), 32);
    assert_eq!(records(1, 4), 1);
    assert_eq!(records(0, 4), 1);
    assert_eq!(records(5_000, 4), 500, "never over a call");
    assert_eq!(records(64, 1), 500, "one slot: no second call to fill");
}

#[tokio::test]
async fn settings_out_of_range_are_refused_by_name() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("orders", 1).unwrap();
    for (settings, name) in [
        (
            Collect::default().linger(Duration::from_secs(11)),
            "Collect::linger",
        ),
        (
            Collect::default().max_calls_in_flight(0),
            "Collect::max_calls_in_flight",
        ),
    ] {
        let publisher = Publisher::new(Arc::new(kinesis.clone()), "orders").collect(settings);
        let error = publisher.publish("key", "x").await.unwrap_err();
        assert!(
            matches!(&error, KinesisError::InvalidConfig { setting, .. } if *setting == name),
            "{error}"
        );
    }
    assert_eq!(kinesis.call_count(Operation::PutRecords), 0);
}
