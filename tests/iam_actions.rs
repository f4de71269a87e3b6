//! Every AWS call of a full run, recorded by the fault proxy (`X-Amz-Target`) in front of both
//! emulators, is an action of the minimal IAM policy the guide documents (docs/guide/iam.md):
//! the broker face creating its stream and lease table, publishing, consuming, seeking and
//! shutting down, the core subscription and publisher doing the same, and a subscription
//! reading with enhanced fan-out, its consumer retired afterwards.

#![forbid(unsafe_code)]

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::broker::{KinesisBroker, KinesisStream};
use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisPosition, Publisher, ReadSettings, Subscription,
};
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher as _, Seekable, Seeker};
use ruststream::{Positioned, Subscriber, SubscriptionSource};
use support::proxy::{self, FaultProxy};

/// The actions of the guide's policy block (docs/guide/iam.md).
fn documented_actions() -> BTreeSet<String> {
    let path = support::repo_root().join("docs/guide/iam.md");
    let guide = std::fs::read_to_string(path).unwrap();
    let start = guide
        .find("# Minimal IAM policy")
        .expect("the guide documents the policy");
    let block = &guide[start..];
    let block = &block[block.find("```json").unwrap()..];
    let block = &block[..block[7..].find("```").unwrap() + 7];
    block
        .split('"')
        .filter(|s| s.starts_with("kinesis:") || s.starts_with("dynamodb:"))
        .map(str::to_owned)
        .collect()
}

/// `Kinesis_20131202.GetRecords` -> `kinesis:GetRecords`, `DynamoDB_20120810.Scan` ->
/// `dynamodb:Scan`.
fn action(target: &str) -> String {
    let (service, operation) = target.split_once('.').unwrap_or(("?", target));
    let prefix = if service.starts_with("Kinesis") {
        "kinesis"
    } else if service.starts_with("DynamoDB") {
        "dynamodb"
    } else {
        service
    };
    format!("{prefix}:{operation}")
}

/// The broker face through the proxies: creates its stream and its lease table, publishes,
/// consumes, seeks.
async fn through_the_broker_face(kinesis: &FaultProxy, dynamodb: &FaultProxy, stream: &str) {
    let broker = KinesisBroker::new()
        .sdk_config(support::sdk_config())
        .kinesis_endpoint(kinesis.url())
        .dynamodb_endpoint(dynamodb.url())
        .application(support::unique_name("iam-app"));
    let connected = broker.connect().await.unwrap();
    let mut subscriber = KinesisStream::new(stream)
        .create_if_missing(1)
        .start_at(KinesisPosition::horizon())
        .poll_interval(Duration::from_millis(50))
        .subscribe(&connected)
        .await
        .unwrap();
    let publisher = connected.publisher();
    for i in 0..3 {
        publisher
            .publish(
                OutgoingMessage::new(stream, format!("m{i}").as_bytes()),
                None,
            )
            .await
            .unwrap();
    }
    let seeker = subscriber.seeker();
    {
        let mut messages = std::pin::pin!(subscriber.stream());
        let mut first = None;
        for _ in 0..3 {
            let message = tokio::time::timeout(Duration::from_secs(30), messages.next())
                .await
                .expect("a delivery in time")
                .unwrap()
                .unwrap();
            first.get_or_insert(message.position());
            ruststream::IncomingMessage::ack(message).await.unwrap();
        }
        seeker.seek(first.unwrap()).await.unwrap();
        let again = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .expect("the seek redelivers")
            .unwrap()
            .unwrap();
        ruststream::IncomingMessage::ack(again).await.unwrap();
    }
    drop(subscriber);
    connected.shutdown().await.unwrap();
}

/// The core's clients through the proxies: Kinesis, and a DynamoDB lease store.
fn core_clients(
    kinesis: &FaultProxy,
    dynamodb: &FaultProxy,
) -> (SharedKinesis, Arc<DynamoLeaseStore>) {
    let api: SharedKinesis = Arc::new(AwsKinesis::new(aws_sdk_kinesis::Client::from_conf(
        proxy::kinesis_config_builder(kinesis).build(),
    )));
    let store = Arc::new(
        DynamoLeaseStore::new(
            aws_sdk_dynamodb::Client::from_conf(proxy::dynamodb_config_builder(dynamodb).build()),
            support::unique_name("iam-leases"),
        )
        .unwrap(),
    );
    (api, store)
}

/// Takes and acks four deliveries of `subscription` (30 s each at most), then shuts it down.
async fn ack_four_and_shut_down(mut subscription: Subscription) {
    for _ in 0..4 {
        let delivery = tokio::time::timeout(Duration::from_secs(30), subscription.next())
            .await
            .expect("a delivery in time")
            .unwrap()
            .unwrap();
        delivery.ack();
    }
    subscription.shutdown().await;
}

/// The core: a publisher, and a subscription with a DynamoDB lease store.
async fn through_the_core(api: &SharedKinesis, store: &Arc<DynamoLeaseStore>, stream: &str) {
    Publisher::new(api.clone(), stream)
        .publish("k", "core")
        .await
        .unwrap();
    let subscription = Subscription::builder(api.clone(), store.clone(), stream)
        .start_at(KinesisPosition::horizon())
        .checkpoint_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();
    ack_four_and_shut_down(subscription).await;
}

/// The core again, reading with enhanced fan-out (the consumer registered at start, each
/// shard subscribed to), and the consumer retired afterwards.
async fn through_fan_out(api: &SharedKinesis, store: Arc<DynamoLeaseStore>, stream: &str) {
    let fan_out = Subscription::builder(api.clone(), store, stream)
        .owner("iam-fan-out")
        .start_at(KinesisPosition::horizon())
        .read_settings(ReadSettings::default().fan_out("iam-consumer"))
        .start()
        .await
        .unwrap();
    ack_four_and_shut_down(fan_out).await;
    kinesis_dataflow::shard::deregister_consumer(api.as_ref(), stream, "iam-consumer")
        .await
        .unwrap();
}

/// Every call is documented, and the run made the calls a full run needs.
fn assert_every_call_documented(used: &BTreeSet<String>, documented: &BTreeSet<String>) {
    let undocumented: Vec<&String> = used.difference(documented).collect();
    assert!(
        undocumented.is_empty(),
        "calls the guide's policy does not allow: {undocumented:?}"
    );
    for needed in [
        "kinesis:ListShards",
        "kinesis:GetShardIterator",
        "kinesis:GetRecords",
        "kinesis:PutRecords",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
        "dynamodb:Query",
        "dynamodb:BatchGetItem",
        "kinesis:RegisterStreamConsumer",
        "kinesis:DescribeStreamConsumer",
        "kinesis:SubscribeToShard",
        "kinesis:DeregisterStreamConsumer",
    ] {
        assert!(used.contains(needed), "the run used {needed}: {used:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_a_full_run_is_in_the_documented_policy() {
    let documented = documented_actions();
    assert!(documented.contains("kinesis:GetRecords"), "{documented:?}");
    let kinesis = FaultProxy::start(&support::kinesis_endpoint()).await;
    let dynamodb = FaultProxy::start(&support::dynamodb_endpoint()).await;
    let stream = support::unique_name("iam");
    through_the_broker_face(&kinesis, &dynamodb, &stream).await;
    let (api, store) = core_clients(&kinesis, &dynamodb);
    through_the_core(&api, &store, &stream).await;
    through_fan_out(&api, store, &stream).await;
    let used: BTreeSet<String> = kinesis
        .distinct_targets()
        .iter()
        .chain(dynamodb.distinct_targets().iter())
        .map(|t| action(t))
        .collect();
    println!("actions used in the run: {used:?}");
    assert_every_call_documented(&used, &documented);
}
