//! Credentials never show: a full run (connect, subscribe, publish, read, a refused call,
//! shutdown) with known secrets in the SDK configuration, every log line of every crate (the
//! AWS SDK included) captured at TRACE, and the `Debug` and `Display` forms of the handles and
//! errors: none contains the secret key or the session token.

#![forbid(unsafe_code)]

mod support;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_kinesis::config::{Credentials, SharedCredentialsProvider};
use futures::StreamExt;
use kinesis_dataflow::api::{KinesisAdmin, KinesisApi};
use kinesis_dataflow::broker::{KinesisBroker, KinesisStream};
use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore, KinesisPosition, Publisher, Subscription};
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher as _, Subscribe};

const SECRET_KEY: &str = "sEcReT/kinesis+dataflow+0123456789abcdefKEY";
const SESSION_TOKEN: &str = "ToKeN//kinesis-dataflow-session-9876543210-zyxwv";

/// Every log line, in one buffer.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn config() -> aws_config::SdkConfig {
    aws_config::SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "AKIDKINESISDATAFLOW",
            SECRET_KEY,
            Some(SESSION_TOKEN.into()),
            None,
            "test",
        )))
        .build()
}

fn assert_clean(what: &str, text: &str) {
    assert!(
        !text.contains(SECRET_KEY) && !text.contains(SESSION_TOKEN),
        "{what} shows a credential:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_in_logs_or_debug_output() {
    let captured = Captured::default();
    let writer = captured.clone();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("trace"))
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();

    let config = config();
    let kinesis_conf = aws_sdk_kinesis::config::Builder::from(&config)
        .endpoint_url(support::kinesis_endpoint())
        .build();
    let dynamo_conf = aws_sdk_dynamodb::config::Builder::from(&config)
        .endpoint_url(support::dynamodb_endpoint())
        .build();
    let api = Arc::new(AwsKinesis::new(aws_sdk_kinesis::Client::from_conf(
        kinesis_conf,
    )));
    let store = Arc::new(
        DynamoLeaseStore::new(
            aws_sdk_dynamodb::Client::from_conf(dynamo_conf),
            support::unique_name("secret-leases"),
        )
        .unwrap(),
    );
    let mut shown = vec![format!("{api:?}"), format!("{store:?}")];

    // The core: publish, subscribe, read, settle, shut down.
    let stream = support::unique_name("secrets");
    api.create_stream(&stream, 1).await.unwrap();
    support::wait_active(&support::kinesis_client(), &stream).await;
    let publisher = Publisher::new(api.clone(), stream.as_str());
    shown.push(format!("{publisher:?}"));
    for i in 0..5 {
        publisher.publish("k", format!("record {i}")).await.unwrap();
    }
    let mut subscription = Subscription::builder(api.clone(), store.clone(), stream.as_str())
        .start_at(KinesisPosition::horizon())
        .list_interval(Duration::from_millis(300))
        .start()
        .await
        .unwrap();
    shown.push(format!("{subscription:?}"));
    for _ in 0..5 {
        let delivery = tokio::time::timeout(Duration::from_secs(30), subscription.next())
            .await
            .expect("a delivery in time")
            .expect("the subscription runs")
            .unwrap();
        shown.push(format!("{delivery:?}"));
        delivery.ack();
    }
    subscription.shutdown().await;

    // A refused call: its error, both forms.
    let missing = api
        .describe_stream_summary("no-such-stream-for-secrets")
        .await
        .unwrap_err();
    shown.push(format!("{missing:?}"));
    shown.push(missing.to_string());

    // The broker face over the same configuration.
    let broker = KinesisBroker::new()
        .sdk_config(config)
        .kinesis_endpoint(support::kinesis_endpoint())
        .dynamodb_endpoint(support::dynamodb_endpoint())
        .application(support::unique_name("secret-app"));
    shown.push(format!("{broker:?}"));
    let connected = broker.connect().await.unwrap();
    shown.push(format!("{connected:?}"));
    let publisher = connected.publisher();
    shown.push(format!("{publisher:?}"));
    publisher
        .publish(
            OutgoingMessage::new(stream.as_str(), b"via the broker".as_slice()),
            None,
        )
        .await
        .unwrap();
    let subscriber = KinesisStream::new(stream.as_str());
    shown.push(format!("{subscriber:?}"));
    let subscribed = connected.subscribe(&stream).await.unwrap();
    shown.push(format!("{subscribed:?}"));
    drop(subscribed);
    let closed = connected.shutdown().await.unwrap();
    shown.push(format!("{closed:?}"));

    for (i, text) in shown.iter().enumerate() {
        assert_clean(&format!("Debug/Display output #{i}"), text);
    }
    let logs = String::from_utf8_lossy(&captured.0.lock().unwrap()).into_owned();
    assert!(
        logs.contains("kinesis_dataflow"),
        "the logs were captured ({} bytes)",
        logs.len()
    );
    assert_clean("the logs", &logs);
}
