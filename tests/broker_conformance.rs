//! The framework's conformance suites, run against the broker on the in-memory transport.

use std::time::Duration;

use kinesis_dataflow::MemoryKinesis;
use kinesis_dataflow::broker::{KinesisBroker, KinesisStream};
use ruststream::conformance::harness;

fn stream(name: &str) -> KinesisStream {
    KinesisStream::new(name)
        .create_if_missing(1)
        .poll_interval(Duration::from_millis(20))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_in_memory() {
    let broker = KinesisBroker::in_memory(MemoryKinesis::new());
    harness::lifecycle(move || broker.clone(), stream, |c| c.publisher()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_handle_closes_in_memory() {
    let broker = KinesisBroker::in_memory(MemoryKinesis::new());
    ruststream::conformance::lifecycle::shared_handle_closes(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_in_memory() {
    let broker = KinesisBroker::in_memory(MemoryKinesis::new());
    ruststream::conformance::lifecycle::shutdown_flushes(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
        ruststream::testing::Backlog::Delivered,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlement_in_memory() {
    let broker = KinesisBroker::in_memory(MemoryKinesis::new());
    let _answers = ruststream::conformance::settlement::suite(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
        Duration::ZERO,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redelivery_address_in_memory() {
    let broker = KinesisBroker::in_memory(MemoryKinesis::new());
    harness::redelivery_address(move || broker.clone(), stream, |c| c.publisher()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_order_in_memory() {
    let broker = KinesisBroker::in_memory(MemoryKinesis::new());
    ruststream::conformance::message_shape::keyed_order(
        move || broker.clone(),
        &ruststream::conformance::helpers::unique_subject("keyed"),
        |n| {
            KinesisStream::new(n)
                .create_if_missing(2)
                .poll_interval(Duration::from_millis(20))
        },
        |c| c.publisher(),
        |key, _headers| {
            Some(kinesis_dataflow::broker::KinesisOptions::partition_key(
                String::from_utf8_lossy(key),
            ))
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_in_memory() {
    let broker = KinesisBroker::in_memory(MemoryKinesis::new());
    ruststream::conformance::capabilities::batches(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_options_in_memory() {
    use kinesis_dataflow::broker::{KinesisOptions, KinesisPublish};
    use ruststream::IncomingMessage;
    use ruststream::conformance::message_shape::{self, OptionCases};
    let broker = KinesisBroker::in_memory(MemoryKinesis::new());
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
