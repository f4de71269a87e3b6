//! The "Shards" spec example (`examples/kinesis_subscriptions_shards.rs`, as shown) running
//! on the in-memory transport: shipments published with their customer as the partition key
//! reach the handler, each customer's in order.

mod support;

#[allow(dead_code)]
mod example {
    include!("../examples/kinesis_subscriptions_shards.rs");

    /// The example's `service`, as the spec shows it (private there).
    pub fn app(broker: KinesisBroker) -> RustStream {
        service(broker)
    }
}

use std::collections::HashMap;
use std::time::Duration;

use kinesis_dataflow::MemoryKinesis;
use kinesis_dataflow::broker::{KinesisBroker, KinesisOptions};
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher};
use support::shipped::{record_shipments, shipped};

#[allow(dead_code)]
mod manual {
    include!("../examples/manual/kinesis_subscriptions_shards.rs");

    /// The example's `service`, as the spec shows it (private there).
    pub fn app(broker: KinesisBroker) -> RustStream {
        service(broker)
    }
}

/// Both spec forms, one after the other (they share the global tracing recorder).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_example_ships_each_customers_shipments_in_order() {
    // The one global subscriber of this test binary (no other test here installs one).
    record_shipments();
    ships_in_order(example::app).await;
    support::shipped::clear_shipped();
    ships_in_order(manual::app).await;
}

async fn ships_in_order(service: fn(KinesisBroker) -> ruststream::runtime::RustStream) {
    let kinesis = MemoryKinesis::new();
    let running = service(KinesisBroker::in_memory(kinesis.clone()))
        .start()
        .await
        .expect("the app starts (and creates the stream)");
    // `create_if_missing(2)` made the two-shard stream.
    assert_eq!(
        kinesis_dataflow::api::KinesisApi::describe_stream_summary(&kinesis, "shipments")
            .await
            .unwrap()
            .open_shard_count,
        2
    );

    // A producer: its own connection on the same in-memory Kinesis.
    let producer = KinesisBroker::in_memory(kinesis.clone())
        .connect()
        .await
        .unwrap();
    let publisher = producer.publisher();
    let customers = ["alice", "bob", "carol", "dave"];
    let per_customer = 5;
    for seq in 0..per_customer {
        for customer in customers {
            let body = format!(r#"{{"customer":"{customer}","seq":{seq}}}"#);
            publisher
                .publish(
                    OutgoingMessage::new("shipments", body.as_bytes()),
                    Some(&KinesisOptions::partition_key(customer)),
                )
                .await
                .unwrap();
        }
    }
    // Each customer's records sit on the shard its key hashes to.
    let mut shards_used = 0;
    for shard in ["shardId-000000000000", "shardId-000000000001"] {
        let records = kinesis.records("shipments", shard).unwrap();
        if !records.is_empty() {
            shards_used += 1;
        }
    }
    assert!(shards_used >= 1);

    let expected = customers.len() * per_customer as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while shipped().len() < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {:?} shipped",
            shipped()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let events = shipped();
    assert_eq!(
        events.len(),
        expected,
        "each shipment handled once: {events:?}"
    );
    let mut by_customer: HashMap<String, Vec<u64>> = HashMap::new();
    for (customer, seq) in events {
        by_customer.entry(customer).or_default().push(seq);
    }
    for customer in customers {
        assert_eq!(
            by_customer[customer],
            (0..per_customer).collect::<Vec<_>>(),
            "{customer}'s shipments in order"
        );
    }

    running.shutdown().await.unwrap();
    let closed = producer.shutdown().await.unwrap();
    assert_eq!(closed.subscriptions_stopped, 0);
}
