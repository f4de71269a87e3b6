//! The rules for deliveries that are not settled by an explicit ack or skip, and the ack sink's
//! durability, on the in-memory transport and lease store: a panic, a dropped subscription, a
//! shutdown, the `redeliver_dropped` setting, `retry` after `map`, and a sink close that waits
//! for a written checkpoint (or fails naming what went wrong).

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    AckSink, Delivery, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Record,
    Subscription, SubscriptionBuilder,
};
use support::cutoff::CutOff;

const STREAM: &str = "ledger";
const SHARD0: &str = "shardId-000000000000";

fn setup(records: usize) -> (SharedKinesis, MemoryLeaseStore) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    for i in 0..records {
        memory
            .put(STREAM, &format!("key-{}", i % 3), format!("{i:05}"))
            .unwrap();
    }
    (Arc::new(memory), MemoryLeaseStore::new())
}

fn builder(api: &SharedKinesis, store: &MemoryLeaseStore, owner: &str) -> SubscriptionBuilder {
    // `initial_position`: a restart follows the checkpoints (`start_at` would override them).
    support::reading::fast(api, Arc::new(store.clone()), STREAM, owner)
        .initial_position(KinesisPosition::horizon())
}

async fn next(sub: &mut Subscription) -> Delivery<Record> {
    match tokio::time::timeout(Duration::from_secs(20), sub.next()).await {
        Ok(Some(Ok(d))) => d,
        other => panic!("expected a delivery, got {other:?}"),
    }
}

async fn take(sub: &mut Subscription, n: usize) -> Vec<Delivery<Record>> {
    let mut out = Vec::new();
    while out.len() < n {
        out.push(next(sub).await);
    }
    out
}

fn payload(d: &Record) -> String {
    String::from_utf8_lossy(d.data()).into_owned()
}

async fn stored_checkpoint(store: &MemoryLeaseStore) -> Option<Checkpoint> {
    store
        .list(STREAM)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.shard_id == SHARD0)
        .and_then(|l| l.checkpoint)
}

/// Starts a second instance on the same lease table and returns its first payload.
async fn first_payload_after_restart(api: &SharedKinesis, store: &MemoryLeaseStore) -> String {
    let mut again = builder(api, store, "b").start().await.unwrap();
    let first = next(&mut again).await;
    let text = payload(&first);
    first.ack();
    again.shutdown().await;
    text
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_dropped_by_a_panic_is_delivered_again() {
    let (api, store) = setup(6);
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let mut first = take(&mut sub, 3).await.into_iter();
    first.next().unwrap().ack();
    let doomed = first.next().unwrap();
    let doomed_seq = doomed.sequence_number().to_owned();
    // A handler panics while it holds the delivery; the task's unwinding drops it.
    let crashed = tokio::spawn(async move {
        let _held = doomed;
        panic!("the handler failed");
    })
    .await;
    assert!(crashed.unwrap_err().is_panic());
    first.next().unwrap().ack();
    let again = next(&mut sub).await;
    assert_eq!(
        again.sequence_number(),
        doomed_seq,
        "the same record, again"
    );
    assert_eq!(payload(&again), "00001");
    again.ack();
    for d in take(&mut sub, 3).await {
        d.ack();
    }
    sub.shutdown().await;
    let last = stored_checkpoint(&store).await;
    assert!(matches!(last, Some(Checkpoint::Sequence(_))), "{last:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_dropped_with_their_subscription_are_read_again_after_a_restart() {
    let (api, store) = setup(10);
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let mut held = take(&mut sub, 10).await;
    let handle = sub.shutdown_handle();
    for d in held.drain(..4) {
        d.ack();
    }
    // The pipeline goes away as a whole: the subscription first (as `forward`, `chunks`,
    // `filter` and `buffer_unordered` hold it), then what it still held.
    let pipeline = (sub, held);
    drop(pipeline);
    handle.shutdown().await;
    assert_eq!(first_payload_after_restart(&api, &store).await, "00004");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_dropped_once_shutdown_began_are_read_again_after_a_restart() {
    let (api, store) = setup(10);
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let mut held = take(&mut sub, 10).await;
    for d in held.drain(..4) {
        d.ack();
    }
    let handle = sub.shutdown_handle();
    let stopping = tokio::spawn(async move { handle.shutdown().await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A timeout or a `select!` dropping the pipeline's half-done work while it stops.
    drop(held);
    stopping.await.unwrap();
    drop(sub);
    assert_eq!(first_payload_after_restart(&api, &store).await, "00004");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_filtered_out_while_running_is_passed() {
    let (api, store) = setup(6);
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    for (i, d) in take(&mut sub, 6).await.into_iter().enumerate() {
        if i != 2 {
            d.ack();
        }
    }
    sub.shutdown().await;
    drop(sub);
    let last = stored_checkpoint(&store).await;
    let Some(Checkpoint::Sequence(seq)) = last else {
        panic!("a checkpoint: {last:?}")
    };
    // Record 2 was dropped in the ordinary course: the checkpoint passed it.
    let mut again = builder(&api, &store, "b").start().await.unwrap();
    let after = tokio::time::timeout(Duration::from_millis(700), again.next()).await;
    assert!(after.is_err(), "nothing is read again: {after:?}");
    again.shutdown().await;
    assert!(!seq.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redeliver_dropped_a_dropped_delivery_comes_back() {
    let (api, store) = setup(4);
    let mut sub = builder(&api, &store, "a")
        .redeliver_dropped(true)
        .start()
        .await
        .unwrap();
    let mut first = take(&mut sub, 2).await.into_iter();
    first.next().unwrap().ack();
    drop(first.next().unwrap());
    let again = next(&mut sub).await;
    assert_eq!(payload(&again), "00001", "the dropped record, again");
    again.ack();
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_map_redelivers_the_original_record() {
    let (api, store) = setup(3);
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let mapped: Delivery<usize> = next(&mut sub).await.map(|r| r.data().len());
    assert_eq!(*mapped, 5);
    let key = mapped.dedupe_key();
    mapped.retry();
    let again = next(&mut sub).await;
    assert_eq!(payload(&again), "00000");
    assert_eq!(
        again.dedupe_key(),
        key,
        "a redelivery has the same dedupe key"
    );
    assert_eq!(key.shard.as_ref(), SHARD0);
    again.ack();
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_into_hands_the_delivery_back_on_failure() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    memory.put(STREAM, "k", "{\"n\":1}").unwrap();
    memory.put(STREAM, "k", "not json").unwrap();
    let api: SharedKinesis = Arc::new(memory);
    let store = MemoryLeaseStore::new();
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let good = next(&mut sub)
        .await
        .decode_into(|b| serde_json::from_slice::<serde_json::Value>(b))
        .unwrap();
    assert_eq!(good["n"], 1);
    good.ack();
    let (error, bad) = next(&mut sub)
        .await
        .decode_into(|b| serde_json::from_slice::<serde_json::Value>(b))
        .unwrap_err();
    assert!(matches!(error, KinesisError::Decode { .. }), "{error}");
    assert_eq!(payload(&bad), "not json", "the delivery comes back whole");
    bad.skip();
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_the_ack_sink_waits_for_a_written_checkpoint() {
    let (api, store) = setup(10);
    // Background checkpoints far apart: only the sink's close can have written it.
    let sub = builder(&api, &store, "a")
        .checkpoint_interval(Duration::from_secs(600))
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    let mut last = None;
    let result = sub
        .filter_map(|item| async move { item.ok() })
        .take(10)
        .inspect(|d| last = Some(d.sequence_number().to_owned()))
        .map(Ok)
        .forward(AckSink::new())
        .await;
    result.expect("the checkpoint is written");
    assert_eq!(
        stored_checkpoint(&store).await,
        Some(Checkpoint::Sequence(last.unwrap())),
        "durable when forward returns"
    );
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ack_sink_fails_when_the_lease_table_cannot_be_written() {
    let (api, store) = setup(10);
    let cut = CutOff::new(Arc::new(store.clone()));
    let sub = support::reading::fast(&api, cut.store(), STREAM, "a")
        .initial_position(KinesisPosition::horizon())
        .checkpoint_interval(Duration::from_secs(600))
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    let deliveries: Vec<_> = sub
        .filter_map(|item| async move { item.ok() })
        .take(10)
        .collect()
        .await;
    cut.set_down(true);
    let result = tokio::time::timeout(
        Duration::from_secs(60),
        futures::stream::iter(deliveries.into_iter().map(Ok)).forward(AckSink::new()),
    )
    .await
    .expect("the sink does not hang");
    let error = result.expect_err("the checkpoint cannot be written");
    let text = error.to_string();
    assert!(
        matches!(error, KinesisError::NotCheckpointed { .. }),
        "a lease-table error: {text}"
    );
    assert!(text.contains(STREAM) && text.contains(SHARD0), "{text}");
    cut.set_down(false);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stop_log_says_when_the_final_checkpoints_failed() {
    support::events::record_events();
    let (api, store) = setup(4);
    let cut = CutOff::new(Arc::new(store.clone()));
    let mut sub = support::reading::fast(&api, cut.store(), STREAM, "log-check")
        .initial_position(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    for d in take(&mut sub, 4).await {
        d.ack();
    }
    cut.set_down(true);
    sub.shutdown().await;
    // Other tests of this binary stop subscriptions beside this one: keep to its own lines.
    let own = |message: &str| -> Vec<support::events::Fields> {
        support::events::events(message)
            .into_iter()
            .filter(|fields| fields.get("owner").map(String::as_str) == Some("log-check"))
            .collect()
    };
    let ok = own("subscription stopped; final checkpoints written, leases released");
    let failed = own(
        "subscription stopped; some shards could not write their final checkpoint or release \
         their lease (they expire, and their unsettled records are read again)",
    );
    assert!(ok.is_empty(), "no claim of success: {ok:?}");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["failed"], "1");
    cut.set_down(false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_in_flight_bound_counts_bytes_too() {
    // Ten records of 5 bytes, at most 12 bytes in flight: three go out (15 bytes), then the
    // reader waits until they are settled.
    let (api, store) = setup(10);
    let mut sub = builder(&api, &store, "a")
        .max_in_flight_bytes(12)
        .start()
        .await
        .unwrap();
    let first = take(&mut sub, 3).await;
    let fourth = tokio::time::timeout(Duration::from_millis(500), sub.next()).await;
    assert!(fourth.is_err(), "15 bytes in flight: the reader waits");
    for d in first {
        d.ack();
    }
    let more = take(&mut sub, 3).await;
    assert_eq!(payload(&more[0]), "00003");
    for d in more {
        d.ack();
    }
    sub.shutdown().await;
}
