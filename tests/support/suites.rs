//! The framework's conformance suites, each run against a given broker: the in-memory
//! transport (`tests/broker_conformance.rs`) and the emulators (`tests/broker_live.rs`) run the
//! same calls.

use std::time::Duration;

use kinesis_dataflow::broker::{KinesisBroker, KinesisOptions, KinesisPublish, KinesisStream};
use ruststream::IncomingMessage;
use ruststream::conformance::harness;
use ruststream::conformance::helpers::unique_subject;
use ruststream::conformance::message_shape::{self, OptionCases};
use ruststream::conformance::{capabilities, lifecycle, settlement};

fn stream(name: &str) -> KinesisStream {
    KinesisStream::new(name)
        .create_if_missing(1)
        .poll_interval(Duration::from_millis(20))
}

/// `harness::lifecycle`.
pub async fn lifecycle_suite(broker: KinesisBroker) {
    harness::lifecycle(move || broker.clone(), stream, |c| c.publisher()).await;
}

/// `lifecycle::shared_handle_closes`.
pub async fn shared_handle_closes(broker: KinesisBroker) {
    lifecycle::shared_handle_closes(move || broker.clone(), stream, |c| c.publisher()).await;
}

/// `lifecycle::shutdown_flushes`: a resumed consumer reads from its checkpoint, so the backlog
/// is delivered.
pub async fn shutdown_flushes(broker: KinesisBroker) {
    lifecycle::shutdown_flushes(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
        ruststream::testing::Backlog::Delivered,
    )
    .await;
}

/// `settlement::suite`.
pub async fn settlement_suite(broker: KinesisBroker) {
    let _answers = settlement::suite(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
        Duration::ZERO,
    )
    .await;
}

/// `harness::redelivery_address`.
pub async fn redelivery_address(broker: KinesisBroker) {
    harness::redelivery_address(move || broker.clone(), stream, |c| c.publisher()).await;
}

/// `message_shape::keyed_order` on a two-shard stream.
pub async fn keyed_order(broker: KinesisBroker) {
    message_shape::keyed_order(
        move || broker.clone(),
        &unique_subject("keyed"),
        |n| {
            KinesisStream::new(n)
                .create_if_missing(2)
                .poll_interval(Duration::from_millis(20))
        },
        |c| c.publisher(),
        |key, _headers| Some(KinesisOptions::partition_key(String::from_utf8_lossy(key))),
    )
    .await;
}

/// `message_shape::publish_options`: the partition key of the policy, overridden per publish,
/// and the keys the service refuses.
pub async fn publish_options(broker: KinesisBroker) {
    message_shape::publish_options(
        move || broker.clone(),
        &unique_subject("options"),
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

/// `capabilities::batches`.
pub async fn batches(broker: KinesisBroker) {
    capabilities::batches(move || broker.clone(), stream, |c| c.publisher()).await;
}
