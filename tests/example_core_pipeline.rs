//! The core-pipeline example (`examples/core_pipeline.rs`): errors aside, filters that skip,
//! per-shard batches into the ack sink, on the in-memory transport and live on the emulators. Every large payment is
//! handed on once, each account's in order, and every record (the filtered-out ones too) is
//! settled, so each shard's checkpoint reaches its last record.

#![forbid(unsafe_code)]

mod support;

#[allow(dead_code)]
mod example {
    include!("../examples/core_pipeline.rs");
}

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Publisher,
    ReadSettings, Subscription,
};

use kinesis_dataflow::api::SharedKinesis;

use kinesis_dataflow::lease::SharedLeaseStore;

use kinesis_dataflow::position::Checkpoint;

const PAYMENTS: u32 = 40;

fn payment(i: u32) -> (String, String) {
    (
        format!("account-{}", i % 5),
        format!("{i}:{}", (i * 37) % 100),
    )
}

/// Runs the example's pipeline over `stream` until every shard's checkpoint is at its last
/// record, then checks what was handed on.
async fn runs(
    api: SharedKinesis,
    store: SharedLeaseStore,
    stream: &str,
    last: HashMap<String, String>,
) {
    let subscription = Subscription::builder(api, store.clone(), stream)
        .start_at(KinesisPosition::horizon())
        .read_settings(ReadSettings::default().poll_interval(Duration::from_millis(50)))
        .checkpoint_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    let stop = subscription.shutdown_handle();
    let handed_on = Arc::new(Mutex::new(Vec::new()));
    let sink = handed_on.clone();
    let running = tokio::spawn(example::pipeline(subscription, move |batch| {
        assert!(
            !batch.is_empty() && batch.len() <= 8,
            "batches of at most 8"
        );
        sink.lock().unwrap().extend(batch);
    }));

    // A hang guard, not a timing claim.
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let leases = store.list(stream).await.unwrap();
            let done = last.iter().all(|(shard, seq)| {
                leases.iter().any(|l| {
                    &l.shard_id == shard && l.checkpoint == Some(Checkpoint::Sequence(seq.clone()))
                })
            });
            if done {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("every shard's checkpoint reaches its last record");
    stop.shutdown().await;
    running
        .await
        .unwrap()
        .expect("the pipeline ends with its checkpoints written");

    let handed_on = handed_on.lock().unwrap().clone();
    let mut by_account: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for i in 0..PAYMENTS {
        let (account, body) = payment(i);
        let amount: u32 = body.split_once(':').unwrap().1.parse().unwrap();
        if amount >= example::LARGE {
            by_account.entry(account).or_default().push(i);
        }
    }
    let mut seen: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for (id, amount) in &handed_on {
        assert!(
            *amount >= example::LARGE,
            "{id}: {amount} passed the filter"
        );
        let i: u32 = id.parse().unwrap();
        seen.entry(payment(i).0).or_default().push(i);
    }
    assert_eq!(
        seen, by_account,
        "each large payment once, each account's in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_core_pipeline_settles_everything_in_memory() {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("payments", 2).unwrap();
    let mut last = HashMap::new();
    for i in 0..PAYMENTS {
        let (key, body) = payment(i);
        let (shard, seq) = kinesis.put("payments", &key, body).unwrap();
        last.insert(shard, seq);
    }
    assert_eq!(last.len(), 2, "both shards hold payments");
    runs(
        Arc::new(kinesis),
        Arc::new(MemoryLeaseStore::new()),
        "payments",
        last,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_core_pipeline_settles_everything_live() {
    let api: SharedKinesis = Arc::new(AwsKinesis::new(support::kinesis_client()));
    let stream = support::unique_name("payments");
    support::create_stream(&support::kinesis_client(), &stream, 2).await;
    let publisher = Publisher::new(api.clone(), stream.as_str());
    let mut last = HashMap::new();
    for i in 0..PAYMENTS {
        let (key, body) = payment(i);
        let stored = publisher.publish(key, body).await.unwrap();
        last.insert(stored.shard_id, stored.sequence_number);
    }
    assert_eq!(last.len(), 2, "both shards hold payments");
    let store: SharedLeaseStore = Arc::new(
        DynamoLeaseStore::new(support::dynamodb_client(), support::unique_name("leases")).unwrap(),
    );
    runs(api, store, &stream, last).await;
}
