//! Slow calls beside the subscription's loop, on the in-memory transport and lease store: a
//! seek whose first iterators come slowly does not hold up the worker row's renewals (the
//! loop carries on while they are fetched), and a take on a slow table is renewed before its
//! gate closes. In both, every shard is taken once and kept.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::api::memory::Fault;
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::{KinesisPosition, MemoryKinesis, MemoryLeaseStore};
use kinesis_dataflow_test_support::timings::LEASE_DURATION;
use support::reading::{Log, log_until_end};
use support::unknown::{Answer, Takes, Unknown, Write};

const STREAM: &str = "slow";
/// A hang guard for each step.
const PATIENCE: Duration = Duration::from_secs(30);

/// A layer that only counts the takes of each shard (no call is the `u64::MAX`-th).
fn counting(takes: &Takes) -> Arc<Unknown> {
    Arc::new(Unknown::new(
        Write::Take,
        Answer::Timeout,
        u64::MAX,
        takes.clone(),
    ))
}

/// Each of `shards` shards taken exactly once.
fn taken_once(takes: &Takes, shards: usize) {
    let takes = takes.lock().unwrap().clone();
    assert_eq!(takes.len(), shards, "{takes:?}");
    assert!(
        takes.values().all(|n| *n == 1),
        "each shard taken once and kept: {takes:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seek_with_slow_first_iterators_does_not_hold_up_the_renewals() {
    // More shards than the calls allowed at once (32), so the seek's first iterators come in
    // rounds, together longer than two thirds of the lease duration.
    const SHARDS: u32 = 96;
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, SHARDS).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let takes: Takes = Arc::default();
    let store = counting(&takes).store(Arc::new(MemoryLeaseStore::new()));
    let sub = support::reading::fast(&api, store, STREAM, "a")
        .initial_position(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    let seeker = sub.seeker();
    let stop = sub.shutdown_handle();
    let log: Log = Arc::default();
    let running = tokio::spawn(log_until_end(sub, "a", log.clone()));
    // Slow, within the call timeout (a third of the lease duration): 3 rounds of 250 ms.
    let slow = LEASE_DURATION * 5 / 18;
    memory.inject(Fault::latency(Operation::GetShardIterator, slow).times(SHARDS));
    tokio::time::timeout(PATIENCE, seeker.seek(KinesisPosition::horizon()))
        .await
        .expect("the seek ends")
        .expect("the seek moves every shard");
    for i in 0..40 {
        memory
            .put(STREAM, &format!("key-{i}"), format!("p{i:04}"))
            .unwrap();
    }
    tokio::time::sleep(LEASE_DURATION * 2).await;
    tokio::time::timeout(PATIENCE, stop.shutdown())
        .await
        .expect("the stop ends");
    running.await.unwrap();
    taken_once(&takes, SHARDS as usize);
    assert_eq!(log.lock().unwrap().len(), 40, "each record once");
}

/// A fresh take on a slow table gets its first renewal before its gate closes: the renewal
/// is timed from when the take was sent, not from when the shard's keeper started (after the
/// take and the first iterator, each a slow call). Each shard is taken once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_on_a_slow_table_is_renewed_before_its_gate_closes() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 2).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let table = MemoryLeaseStore::new();
    for i in 0..20 {
        memory
            .put(STREAM, &format!("key-{}", i % 8), format!("p{i:04}"))
            .unwrap();
    }
    // A first instance reads everything and stops: the shards resume from checkpoints.
    let first = support::reading::fast(&api, Arc::new(table.clone()), STREAM, "first")
        .initial_position(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    let stop = first.shutdown_handle();
    let log: Log = Arc::default();
    let running = tokio::spawn(log_until_end(first, "first", log.clone()));
    while log.lock().unwrap().len() < 20 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::timeout(PATIENCE, stop.shutdown())
        .await
        .expect("the stop ends");
    running.await.unwrap();

    // Slow, each within the call timeout (a third of the lease duration): the take, then the
    // first iterator, together longer than the first renewal's margin.
    table.set_latency(LEASE_DURATION * 5 / 18);
    memory.inject(Fault::latency(Operation::GetShardIterator, LEASE_DURATION * 2 / 9).times(2));
    let takes: Takes = Arc::default();
    let store = counting(&takes).store(Arc::new(table.clone()));
    let again = support::reading::fast(&api, store, STREAM, "again")
        .initial_position(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    let stop = again.shutdown_handle();
    let log: Log = Arc::default();
    let running = tokio::spawn(log_until_end(again, "again", log.clone()));
    tokio::time::sleep(LEASE_DURATION * 4).await;
    tokio::time::timeout(PATIENCE, stop.shutdown())
        .await
        .expect("the stop ends");
    running.await.unwrap();
    taken_once(&takes, 2);
    assert!(log.lock().unwrap().is_empty(), "nothing read twice");
}
