//! The framework's conformance suites, each run against a given broker: the in-memory
//! transport (`tests/broker_conformance.rs`), the in-process mode
//! (`tests/broker_in_process.rs`) and the emulators (`tests/broker_live.rs`) run the same calls.

use std::time::Duration;

use kinesis_dataflow::KinesisError;
use kinesis_dataflow::broker::{ConnectedKinesis, KinesisOptions, KinesisPublish, KinesisStream};
use ruststream::Broker;
use ruststream::IncomingMessage;
use ruststream::conformance::harness;
use ruststream::conformance::helpers::unique_subject;
use ruststream::conformance::message_shape::{self, OptionCases};
use ruststream::conformance::{capabilities, lifecycle, retry, settlement};

/// A broker the suites can run: [`KinesisBroker`](kinesis_dataflow::broker::KinesisBroker)
/// itself, or wrapped in the framework's `InProcessBroker`.
pub trait SuiteBroker:
    Broker<Connected = ConnectedKinesis, Error = KinesisError> + Clone + Send + Sync + 'static
{
}

impl<B> SuiteBroker for B where
    B: Broker<Connected = ConnectedKinesis, Error = KinesisError> + Clone + Send + Sync + 'static
{
}

fn stream(name: &str) -> KinesisStream {
    KinesisStream::new(name)
        .create_if_missing(1)
        .poll_interval(Duration::from_millis(20))
}

/// `harness::lifecycle`.
pub async fn lifecycle_suite<B: SuiteBroker>(broker: B) {
    harness::lifecycle(move || broker.clone(), stream, |c| c.publisher()).await;
}

/// `lifecycle::shared_handle_closes`.
pub async fn shared_handle_closes<B: SuiteBroker>(broker: B) {
    lifecycle::shared_handle_closes(move || broker.clone(), stream, |c| c.publisher()).await;
}

/// `lifecycle::shutdown_flushes`: a resumed consumer reads from its checkpoint, so the backlog
/// is delivered.
pub async fn shutdown_flushes<B: SuiteBroker>(broker: B) {
    lifecycle::shutdown_flushes(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
        ruststream::testing::Backlog::Delivered,
    )
    .await;
}

/// `settlement::suite`.
pub async fn settlement_suite<B: SuiteBroker>(broker: B) {
    let _answers = settlement::suite(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
        Duration::ZERO,
    )
    .await;
}

/// `retry::broker_moves` with the broker's descriptor, then with a bare stream name (the
/// attribute form `#[subscriber("name")]`): the core applies `max_attempts` and `dead_letter`.
/// `by_name` is the same broker with `create_missing_streams` (a name carries no settings).
pub async fn broker_moves<B: SuiteBroker>(broker: B, by_name: B) {
    let attempts = std::num::NonZeroU32::new(2).expect("two");
    retry::broker_moves(move || broker.clone(), stream, |c| c.publisher(), attempts).await;
    retry::broker_moves(
        move || by_name.clone(),
        |name| ruststream::Name::new(name.to_owned()),
        |c| c.publisher(),
        attempts,
    )
    .await;
}

/// `message_shape::keyed_order` on a two-shard stream.
pub async fn keyed_order<B: SuiteBroker>(broker: B) {
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
pub async fn publish_options<B: SuiteBroker>(broker: B) {
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
pub async fn batches<B: SuiteBroker>(broker: B) {
    capabilities::batches(move || broker.clone(), stream, |c| c.publisher()).await;
}

/// `capabilities::seeking`: back, forward, before the first delivery, after shutdown.
pub async fn seeking<B: SuiteBroker>(broker: B) {
    capabilities::seeking(move || broker.clone(), stream, |c| c.publisher()).await;
}

/// `capabilities::batch_seeking`.
pub async fn batch_seeking<B: SuiteBroker>(broker: B) {
    capabilities::batch_seeking(move || broker.clone(), stream, |c| c.publisher()).await;
}

/// `capabilities::seeking_unknown_position`: a record of a shard the stream does not have.
pub async fn seeking_unknown_position<B: SuiteBroker>(broker: B) {
    capabilities::seeking_unknown_position(
        move || broker.clone(),
        stream,
        |c| c.publisher(),
        |_| {
            kinesis_dataflow::KinesisPosition::sequence(
                "shardId-000000000099",
                "49000000000000000000000000000000000000000000000000000000",
            )
        },
    )
    .await;
}
