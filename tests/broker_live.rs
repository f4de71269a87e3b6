//! The broker face against the wire-protocol emulators (kinesis-local for Kinesis, dynalite
//! for the DynamoDB lease table), started by `tests/support`.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use kinesis_dataflow::broker::{KinesisBroker, KinesisOptions, KinesisStream};
use ruststream::conformance::in_process::{self, Refusal};
use ruststream::conformance::settlement;
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher};
use support::shipped::{record_shipments, shipped};
use support::suites;

#[allow(dead_code)]
mod example {
    include!("../examples/kinesis_subscriptions_shards.rs");

    /// The example's `service`, as the spec shows it (private there).
    pub fn app(broker: KinesisBroker) -> RustStream {
        service(broker)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_example_live() {
    // The one global subscriber of this test binary (no other test here installs one).
    record_shipments();
    let application = support::unique_name("shipping");
    let running = example::app(support::live_broker(&application))
        .start()
        .await
        .expect("the app starts (and creates the stream and the lease table)");

    let producer = support::live_broker(&application).connect().await.unwrap();
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
    while shipped().len() < expected {
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {:?} shipped",
            shipped()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut by_customer: HashMap<String, Vec<u64>> = HashMap::new();
    for (customer, seq) in shipped() {
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
    suites::lifecycle_suite(support::live_broker(&support::unique_name("lifecycle"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_handle_closes_live() {
    suites::shared_handle_closes(support::live_broker(&support::unique_name("shared"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_live() {
    suites::shutdown_flushes(support::live_broker(&support::unique_name("flushes"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlement_live() {
    suites::settlement_suite(support::live_broker(&support::unique_name("settlement"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_moves_live() {
    let application = support::unique_name("moves");
    suites::broker_moves(
        support::live_broker(&application),
        support::live_broker(&application).create_missing_streams(1),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_order_live() {
    suites::keyed_order(support::live_broker(&support::unique_name("keyed"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_options_live() {
    suites::publish_options(support::live_broker(&support::unique_name("options"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_live() {
    suites::batches(support::live_broker(&support::unique_name("batches"))).await;
}

/// The in-process transport declares the backlog the emulators show: a subscription by name
/// opens at LATEST, so what was written before it is not delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_backlog_matches_the_emulators() {
    let application = support::unique_name("backlog");
    in_process::backlog_matches_server(
        move || support::live_broker(&application).create_missing_streams(1),
        |c| c.publisher(),
    )
    .await;
}

/// The in-process transport refuses what the emulators refuse: a record over the size limit,
/// a stream name the service rejects, an invalid descriptor, and a second subscription of a
/// stream on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_refuses_like_the_emulators() {
    let application = support::unique_name("refusals");
    let shared = support::unique_name("conflict");
    in_process::refuses_like_the_server(
        move || support::live_broker(&application).create_missing_streams(1),
        |c| c.publisher(),
        [
            Refusal::PayloadOver {
                name: support::unique_name("limit"),
                // 1 MiB of data and key; the publisher's random keys are 16 characters.
                limit: 1024 * 1024 - 16,
            },
            Refusal::Publish {
                name: "not a stream name!".into(),
            },
            Refusal::Subscription {
                source: KinesisStream::new("").create_if_missing(1),
            },
            Refusal::Conflicting {
                open: KinesisStream::new(shared.clone()).create_if_missing(1),
                refused: KinesisStream::new(shared).create_if_missing(1),
            },
        ],
    )
    .await;
}

/// Settlement answers the same live and in process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_process_settles_like_the_emulators() {
    let application = support::unique_name("settles");
    settlement::matches_in_process(
        move || support::live_broker(&application),
        |n| {
            KinesisStream::new(n)
                .create_if_missing(1)
                .poll_interval(Duration::from_millis(20))
        },
        |c| c.publisher(),
        Duration::ZERO,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeking_live() {
    suites::seeking(support::live_broker(&support::unique_name("seeking"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_seeking_live() {
    suites::batch_seeking(support::live_broker(&support::unique_name("batchseek"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeking_unknown_position_live() {
    suites::seeking_unknown_position(support::live_broker(&support::unique_name("unknownpos")))
        .await;
}

/// Missing or expired credentials fail `connect` with an error that says so, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_refuses_missing_or_expired_credentials() {
    use aws_sdk_kinesis::config::{Credentials, SharedCredentialsProvider};
    let region = aws_config::Region::new("us-east-1");
    let none = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(region.clone())
        .build();
    let expired = aws_config::SdkConfig::builder()
        .behavior_version(aws_config::BehaviorVersion::latest())
        .region(region)
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "AKIDEXPIRED1234",
            "expired-secret",
            None,
            Some(std::time::SystemTime::now() - Duration::from_secs(3600)),
            "test",
        )))
        .build();
    for (config, expected) in [(none, "no credentials provider"), (expired, "expired")] {
        let connected = KinesisBroker::new()
            .sdk_config(config)
            .kinesis_endpoint(support::kinesis_endpoint())
            .dynamodb_endpoint(support::dynamodb_endpoint())
            .connect()
            .await;
        match connected {
            Err(e @ kinesis_dataflow::KinesisError::Credentials { .. }) => {
                let message = e.to_string();
                assert!(message.contains(expected), "{message}");
                assert!(!message.contains("expired-secret"), "{message}");
            }
            other => panic!("expected a credentials error, got {other:?}"),
        }
    }
}

/// A broker set up for the emulators describes the Kinesis emulator's host and port as its
/// server (what a labeled registration puts in the AsyncAPI document), and connects there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_broker_describes_the_endpoint_it_connects_to() {
    use ruststream::DescribeServer;

    let broker = support::live_broker("described");
    let endpoint = support::kinesis_endpoint();
    let host = endpoint
        .split_once("://")
        .map_or(endpoint.as_str(), |(_, rest)| rest)
        .trim_end_matches('/');
    let spec = broker.describe_server();
    assert_eq!(spec.host.as_deref(), Some(host), "{spec:?}");
    assert_eq!(spec.protocol, "kinesis");
    let connected = broker
        .connect()
        .await
        .expect("the described broker connects");
    connected.shutdown().await.unwrap();
}
