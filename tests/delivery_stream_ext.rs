//! `DeliveryStreamExt` on a real subscription (in-memory transport and lease store): filters
//! that skip what they leave out, batches per shard with a time limit, errors taken aside.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::api::memory::Fault;
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    AckSink, DeliveryStreamExt, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore,
    SubscriptionBuilder,
};

const STREAM: &str = "events";

fn builder(api: &SharedKinesis, store: &MemoryLeaseStore) -> SubscriptionBuilder {
    support::reading::fast(api, Arc::new(store.clone()), STREAM, "a")
        .initial_position(KinesisPosition::horizon())
}

/// A partition key that lands in `shard` of a two-shard stream (found on a scratch copy).
fn key_for(shard: &str) -> String {
    let scratch = MemoryKinesis::new();
    scratch.add_stream(STREAM, 2).unwrap();
    (0..)
        .map(|i| format!("key-{i}"))
        .find(|key| scratch.put(STREAM, key, "probe").unwrap().0 == shard)
        .unwrap()
}

/// Writes `count` records `tag:i` into `shard`.
fn write_to(memory: &MemoryKinesis, shard: &str, tag: &str, count: usize) {
    let key = key_for(shard);
    for i in 0..count {
        let (landed, _) = memory.put(STREAM, &key, format!("{tag}:{i}")).unwrap();
        assert_eq!(landed, shard);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filter_or_skip_settles_what_it_leaves_out_even_with_redeliver_dropped() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let mut last = String::new();
    for i in 0..20 {
        last = memory.put(STREAM, "k", format!("{i}")).unwrap().1;
    }
    let api: SharedKinesis = Arc::new(memory);
    let store = MemoryLeaseStore::new();
    let sub = builder(&api, &store)
        .redeliver_dropped(true)
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let pipeline = tokio::spawn(
        sub.errors_to(|e| panic!("no errors expected: {e}"))
            .filter_or_skip(|record| record.data()[0] == b'1')
            .inspect(move |d| log.lock().unwrap().push(d.data().to_vec()))
            .map(Ok)
            .forward(AckSink::new()),
    );
    // A hang guard, not a timing claim: the checkpoint reaches the last record (skipped).
    tokio::time::timeout(Duration::from_secs(30), async {
        while store.list(STREAM).await.unwrap()[0].checkpoint
            != Some(Checkpoint::Sequence(last.clone()))
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the checkpoint passes the skipped records");
    handle.shutdown().await;
    pipeline.await.unwrap().unwrap();
    let seen = seen.lock().unwrap().clone();
    let expected: Vec<Vec<u8>> = [
        "1", "10", "11", "12", "13", "14", "15", "16", "17", "18", "19",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    // With redeliver_dropped on, a plain `filter` would have sent every other record back
    // forever; these were skipped once each.
    assert_eq!(seen, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_by_shard_keep_shards_apart_and_close_a_quiet_shards_batch() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 2).unwrap();
    let busy = "shardId-000000000000";
    let quiet = "shardId-000000000001";
    write_to(&memory, quiet, "q", 3);
    write_to(&memory, busy, "b", 25);
    let api: SharedKinesis = Arc::new(memory);
    let store = MemoryLeaseStore::new();
    let sub = builder(&api, &store).start().await.unwrap();
    let handle = sub.shutdown_handle();
    let mut batches = sub
        .errors_to(|e| panic!("no errors expected: {e}"))
        .batches_by_shard(10, Duration::from_millis(300));
    let mut per_shard: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut quiet_batches = 0;
    // A hang guard, not a timing claim: with `.chunks(10)` the quiet shard's 3 records would
    // never be handed on while the subscription runs.
    tokio::time::timeout(Duration::from_secs(30), async {
        while per_shard.get(quiet).map_or(0, Vec::len) < 3 {
            let batch = batches.next().await.unwrap();
            assert!(!batch.is_empty() && batch.len() <= 10, "{}", batch.len());
            let shard = batch[0].shard_id().to_owned();
            assert!(
                batch.iter().all(|d| d.shard_id() == shard),
                "one shard a batch"
            );
            if shard == quiet {
                quiet_batches += 1;
            }
            for d in batch {
                per_shard
                    .entry(shard.clone())
                    .or_default()
                    .push(String::from_utf8_lossy(d.data()).into_owned());
                d.ack();
            }
        }
    })
    .await
    .expect("the quiet shard's batch is handed on");
    assert_eq!(per_shard[quiet], ["q:0", "q:1", "q:2"], "in shard order");
    assert_eq!(quiet_batches, 1);
    drop(batches);
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_to_hands_errors_aside_and_reading_goes_on() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    for i in 0..5 {
        memory.put(STREAM, "k", format!("{i}")).unwrap();
    }
    memory.inject(Fault::fail(Operation::GetRecords, "injected failure").times(2));
    let api: SharedKinesis = Arc::new(memory);
    let store = MemoryLeaseStore::new();
    let sub = builder(&api, &store).start().await.unwrap();
    let handle = sub.shutdown_handle();
    let errors: Arc<Mutex<Vec<KinesisError>>> = Arc::default();
    let seen = errors.clone();
    let records: Vec<String> = tokio::time::timeout(
        Duration::from_secs(30),
        sub.errors_to(move |e| seen.lock().unwrap().push(e))
            .take(5)
            .map(|d| String::from_utf8_lossy(&d.ack().data().clone()).into_owned())
            .collect(),
    )
    .await
    .expect("every record after the errors");
    assert_eq!(records, ["0", "1", "2", "3", "4"]);
    let errors = errors.lock().unwrap().clone();
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(
        errors[0].to_string().contains("injected failure"),
        "{}",
        errors[0]
    );
    handle.shutdown().await;
}
