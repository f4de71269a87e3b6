//! The batch example (`examples/batch.rs`, as shown) in process and live on the emulators:
//! every record reaches the handler once, each customer's in order, in non-empty batches of at
//! most the mount site's size, each batch of one shard.

mod support;

#[allow(dead_code)]
mod example {
    include!("../examples/batch.rs");
}

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use example::{BATCH_SIZE, PACKED, STREAM, Shipment};
use kinesis_dataflow::MemoryKinesis;
use kinesis_dataflow::api::memory::hash_key;
use kinesis_dataflow::broker::{ConnectedKinesis, KinesisBroker, KinesisOptions};
use ruststream::runtime::HandlerOutcome;
use ruststream::testing::TestApp;
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher};

/// How many shipments each customer sends.
const PER_CUSTOMER: u64 = 9;

/// Publishes `PER_CUSTOMER` shipments for each customer through `producer`, round by round,
/// each with its customer as the partition key. Returns them in publish order.
async fn publish(producer: &ConnectedKinesis, customers: &[&str]) -> Vec<Shipment> {
    let publisher = producer.publisher();
    let mut sent = Vec::new();
    for seq in 1..=PER_CUSTOMER {
        for customer in customers {
            let body = format!(r#"{{"customer":"{customer}","seq":{seq}}}"#);
            publisher
                .publish(
                    OutgoingMessage::new(STREAM, body.as_bytes()),
                    Some(&KinesisOptions::partition_key(*customer)),
                )
                .await
                .expect("the shipment is published");
            sent.push(Shipment {
                customer: (*customer).to_owned(),
                seq,
            });
        }
    }
    sent
}

/// Every batch is non-empty and no larger than the size it was mounted with.
fn assert_batch_sizes_within_the_size(batches: &[Vec<Shipment>]) {
    for batch in batches {
        assert!(
            !batch.is_empty() && batch.len() <= BATCH_SIZE.get(),
            "a batch of {} (size {BATCH_SIZE}): {batches:?}",
            batch.len()
        );
    }
}

/// Each customer's sequence numbers, in the order the handler saw them.
fn by_customer(batches: &[Vec<Shipment>]) -> BTreeMap<String, Vec<u64>> {
    let mut seen: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for shipment in batches.iter().flatten() {
        seen.entry(shipment.customer.clone())
            .or_default()
            .push(shipment.seq);
    }
    seen
}

/// In process (one shard per stream): the whole run arrives in publish order, cut into batches
/// of at most the size, each settled by the handler's one outcome.
#[tokio::test(start_paused = true)]
async fn in_process_every_record_arrives_once_in_order_in_batches_of_at_most_the_size() {
    let kinesis = MemoryKinesis::new();
    let tb = TestApp::start(example::service(KinesisBroker::in_memory(kinesis.clone())))
        .await
        .expect("the app starts in process");
    // A producer on the same in-memory Kinesis: the run is stored first and handled after, so
    // the batches can fill up (a publish through the harness drives each record on its own).
    let producer = KinesisBroker::in_memory(kinesis).connect().await.unwrap();
    let sent = publish(&producer, &["ada", "grace", "linus"]).await;
    tb.settle().await.expect("every shipment is handled");

    let broker = tb.broker::<KinesisBroker>();
    let packed = broker.subscriber(STREAM);
    let batches = packed.batches::<Shipment>();
    assert_batch_sizes_within_the_size(&batches);
    assert_eq!(
        batches.concat(),
        sent,
        "one shard: every shipment once, in publish order"
    );
    assert!(
        batches.len() < sent.len(),
        "the records were handled in batches: {batches:?}"
    );
    packed
        .assert_called(batches.len())
        .settled(HandlerOutcome::ack());

    producer.shutdown().await.unwrap();
    tb.shutdown().await.expect("shuts down");
}

/// Live on kinesis-local + dynalite (two shards): every shipment once, each customer's in
/// order, in batches of at most the size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_every_record_arrives_once_in_order_in_batches_of_at_most_the_size() {
    let application = support::unique_name("packing");
    let running = example::service(support::live_broker(&application))
        .start()
        .await
        .expect("the app starts (and creates the stream and the lease table)");
    let producer = support::live_broker(&application).connect().await.unwrap();
    // Customer names of this test only: the in-process test's handler writes to `PACKED` too.
    let customers = ["live-ada", "live-grace", "live-linus", "live-margaret"];
    let sent = publish(&producer, &customers).await;

    let ours = || -> Vec<Vec<Shipment>> {
        PACKED
            .lock()
            .unwrap()
            .iter()
            .filter(|batch| batch.iter().any(|s| s.customer.starts_with("live-")))
            .cloned()
            .collect()
    };
    // A hang guard, not a timing claim.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while ours().iter().map(Vec::len).sum::<usize>() < sent.len() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {:?} packed (logs: {})",
            ours(),
            support::logs_dir().display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    running.shutdown().await.unwrap();
    producer.shutdown().await.unwrap();

    let batches = ours();
    assert!(
        batches
            .iter()
            .flatten()
            .all(|s| s.customer.starts_with("live-")),
        "a batch of this app holds only this app's records: {batches:?}"
    );
    assert_batch_sizes_within_the_size(&batches);
    // One shard per batch: the stream's two shards split the hash-key range in halves.
    let upper = |customer: &str| hash_key(customer) >= 1u128 << 127;
    assert!(
        customers.iter().any(|c| upper(c)) && customers.iter().any(|c| !upper(c)),
        "the customers cover both shards"
    );
    for batch in &batches {
        let shards: BTreeSet<bool> = batch.iter().map(|s| upper(&s.customer)).collect();
        assert_eq!(
            shards.len(),
            1,
            "a batch holds one shard's records: {batch:?}"
        );
    }
    let seen = by_customer(&batches);
    assert_eq!(seen.len(), customers.len(), "{seen:?}");
    for customer in customers {
        assert_eq!(
            seen[customer],
            (1..=PER_CUSTOMER).collect::<Vec<_>>(),
            "{customer}'s shipments once each, in order"
        );
    }
}
