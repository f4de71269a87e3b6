//! The broker face against the wire-protocol emulators (kinesis-local for Kinesis, dynalite
//! for the DynamoDB lease table), started by `tests/support`.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use kinesis_dataflow::broker::{KinesisBroker, KinesisOptions, KinesisStream};
use ruststream::conformance::harness;
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher};
use support::shipped::{record_shipments, shipped};

#[allow(dead_code)]
mod example {
    include!("../examples/kinesis_subscriptions_shards.rs");

    /// The example's `service`, as the spec shows it (private there).
    pub fn app(broker: KinesisBroker) -> RustStream {
        service(broker)
    }
}

/// A broker on the emulators, with its own lease table.
fn live_broker(application: &str) -> KinesisBroker {
    KinesisBroker::new()
        .sdk_config(support::sdk_config())
        .kinesis_endpoint(support::kinesis_endpoint())
        .dynamodb_endpoint(support::dynamodb_endpoint())
        .application(application)
}

fn stream(name: &str) -> KinesisStream {
    KinesisStream::new(name)
        .create_if_missing(1)
        .poll_interval(Duration::from_millis(50))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_example_live() {
    // The one global subscriber of this test binary (no other test here installs one).
    record_shipments();
    let application = support::unique_name("shipping");
    let running = example::app(live_broker(&application))
        .start()
        .await
        .expect("the app starts (and creates the stream and the lease table)");

    let producer = live_broker(&application).connect().await.unwrap();
    let publisher = producer.publisher();
    let customers = ["alice", "bob", "carol", "dave"];
    let per_customer = 5u64;
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
    let expected = customers.len() * per_customer as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while shipped().lock().unwrap().len() < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {:?} shipped",
            shipped().lock().unwrap()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut by_customer: HashMap<String, Vec<u64>> = HashMap::new();
    for (customer, seq) in shipped().lock().unwrap().clone() {
        by_customer.entry(customer).or_default().push(seq);
    }
    for customer in customers {
        assert_eq!(
            by_customer[customer],
            (0..per_customer).collect::<Vec<_>>(),
            "{customer}'s shipments in order, once each"
        );
    }
    running.shutdown().await.unwrap();
    producer.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_live() {
    let broker = live_broker(&support::unique_name("lifecycle"));
    harness::lifecycle(move || broker.clone(), stream, |c| c.publisher()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_handle_closes_live() {
    let broker = live_broker(&support::unique_name("shared"));
    ruststream::conformance::lifecycle::shared_handle_closes(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_live() {
    let broker = live_broker(&support::unique_name("flushes"));
    ruststream::conformance::lifecycle::shutdown_flushes(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
        ruststream::testing::Backlog::Delivered,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlement_live() {
    let broker = live_broker(&support::unique_name("settlement"));
    let _answers = ruststream::conformance::settlement::suite(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
        Duration::ZERO,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_address_live() {
    let broker = live_broker(&support::unique_name("redelivery"));
    harness::redelivery_address(move || broker.clone(), stream, |c| c.publisher()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_order_live() {
    let broker = live_broker(&support::unique_name("keyed"));
    ruststream::conformance::message_shape::keyed_order(
        move || broker.clone(),
        &ruststream::conformance::helpers::unique_subject("keyed"),
        |n| {
            KinesisStream::new(n)
                .create_if_missing(2)
                .poll_interval(Duration::from_millis(50))
        },
        |c| c.publisher(),
        |key, _headers| Some(KinesisOptions::partition_key(String::from_utf8_lossy(key))),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_live() {
    let broker = live_broker(&support::unique_name("batches"));
    ruststream::conformance::capabilities::batches(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_options_live() {
    use kinesis_dataflow::broker::KinesisPublish;
    use ruststream::IncomingMessage;
    use ruststream::conformance::message_shape::{self, OptionCases};
    let broker = live_broker(&support::unique_name("options"));
    message_shape::publish_options(
        move || broker.clone(),
        &ruststream::conformance::helpers::unique_subject("options"),
        stream,
        KinesisPublish::default().partition_key("policy-key"),
        OptionCases::new(Some(b"policy-key".to_vec()))
            .overrides(
                KinesisOptions::partition_key("call-key"),
                Some(b"call-key".to_vec()),
            )
            .refuses(KinesisOptions::partition_key(""))
            .refuses(KinesisOptions::partition_key("k".repeat(257))),
        |m| m.partition_key().map(<[u8]>::to_vec),
    )
    .await;
}
