//! Renewals are never starved by other work: 500 shards taken at once from a lease table that
//! answers every call just inside the call timeout. On the in-memory transport and lease store,
//! in paused time (the whole run takes a few seconds of real time).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::PutRecordsEntry;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::{
    KinesisPosition, MemoryKinesis, MemoryLeaseStore, ReadSettings, Subscription,
};

const STREAM: &str = "wide";
const SHARDS: u32 = 500;
/// Renewals every second, so each call may take up to a second.
const LEASE: Duration = Duration::from_secs(3);
/// Every lease-table call answers this late: near the one-second call timeout.
const TABLE_LATENCY: Duration = Duration::from_millis(900);

/// How many times each shard was opened (a GetShardIterator for it).
fn opened(memory: &MemoryKinesis) -> BTreeMap<String, usize> {
    let mut opened = BTreeMap::new();
    for call in memory.calls() {
        if call.operation == Operation::GetShardIterator {
            *opened.entry(call.shard.unwrap_or_default()).or_default() += 1;
        }
    }
    opened
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn five_hundred_shards_from_a_slow_lease_table_keep_every_lease_and_redeliver_nothing() {
    let memory = MemoryKinesis::new().with_list_shards_page_size(1000);
    memory.add_stream(STREAM, SHARDS).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let store = MemoryLeaseStore::new();
    store.set_latency(TABLE_LATENCY);
    // One record per shard, by explicit hash key, so every shard has something to deliver.
    let entries: Vec<PutRecordsEntry> = (0..SHARDS)
        .map(|i| PutRecordsEntry {
            data: format!("record-{i:04}").into(),
            partition_key: format!("k{i}"),
            explicit_hash_key: Some(
                (u128::MAX / u128::from(SHARDS) * u128::from(i) + 1).to_string(),
            ),
        })
        .collect();
    let written: BTreeSet<String> = entries
        .iter()
        .map(|e| String::from_utf8_lossy(&e.data).into_owned())
        .collect();
    let out = api.put_records(STREAM, entries).await.unwrap();
    assert_eq!(out.failed_count(), 0);
    memory.clear_calls();

    let began = tokio::time::Instant::now();
    let mut sub = Subscription::builder(api.clone(), Arc::new(store.clone()), STREAM)
        .owner("a")
        .start_at(KinesisPosition::horizon())
        .read_settings(ReadSettings::default().poll_interval(Duration::from_millis(500)))
        .lease_duration(LEASE)
        .checkpoint_interval(Duration::from_secs(1))
        .start()
        .await
        .unwrap();

    let started_in = began.elapsed();
    let mut delivered: BTreeMap<String, usize> = BTreeMap::new();
    let mut all_in = None;
    // Read for a while past the last first delivery: a lease released for lack of renewal
    // would be taken again and its record redelivered from the last checkpoint.
    let until = tokio::time::Instant::now() + Duration::from_secs(120);
    while tokio::time::Instant::now() < until {
        match tokio::time::timeout_at(until, sub.next()).await {
            Ok(Some(Ok(d))) => {
                *delivered
                    .entry(String::from_utf8_lossy(d.data()).into_owned())
                    .or_default() += 1;
                d.ack();
                if all_in.is_none() && delivered.len() == written.len() {
                    all_in = Some(began.elapsed());
                }
            }
            Ok(Some(Err(e))) => panic!("no error is expected: {e}"),
            Ok(None) => panic!("the subscription ended"),
            Err(_) => break,
        }
    }
    println!(
        "[renewals] {SHARDS} shards, table latency {TABLE_LATENCY:?}: start() returned after \
         {started_in:?}, every record delivered after {all_in:?} (tokio time)"
    );
    let missing: Vec<&String> = written
        .iter()
        .filter(|w| !delivered.contains_key(*w))
        .collect();
    assert!(missing.is_empty(), "never delivered: {missing:?}");
    let twice: Vec<(&String, &usize)> = delivered.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let reopened: Vec<(String, usize)> = opened(&memory)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(
        reopened.is_empty(),
        "shards released and taken again: {reopened:?}"
    );
    assert_eq!(
        sub.shards().len(),
        SHARDS as usize,
        "every shard is still held"
    );
    store.set_latency(Duration::ZERO);
    sub.shutdown().await;
}
