//! A fan-out `ShardStream` whose SubscribeToShard event stream is cut mid-way, against
//! kinesis-local through the fault proxy ([`Fault::CutStreamAfter`]): after the event with the
//! records published first, the connection drops inside the next event (the one with the
//! records published meanwhile), without the stream's terminating chunk. The reader reports
//! the cut as an error on its stream, subscribes again after the last whole event's
//! continuation sequence number, and every record, published before, around or after the
//! cut, comes exactly once and in order.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kinesis_dataflow::api::{PutRecordsEntry, SharedKinesis};
use kinesis_dataflow::{AwsKinesis, KinesisError, ReadSettings, ShardStream, StartingPoint};
use support::proxy::{self, Fault, FaultProxy, Rule};

const SHARD: &str = "shardId-000000000000";
/// The subscription is cut inside its second event: kinesis-local sends no `initial-response`
/// message, so its first message is the event with the records published before the
/// subscription, and the next one (about a second later) carries those published on reading
/// them.
const WHOLE_EVENTS_BEFORE_THE_CUT: u64 = 1;
/// The longest wait for one item of the stream.
const ITEM_TIMEOUT: Duration = Duration::from_secs(60);

/// Publishes `payloads` in one PutRecords call, straight to kinesis-local (one partition key,
/// so they keep their order).
async fn publish(api: &SharedKinesis, stream: &str, payloads: &[String]) {
    let entries = payloads
        .iter()
        .map(|payload| PutRecordsEntry {
            data: Bytes::from(payload.clone()),
            partition_key: "k".into(),
            explicit_hash_key: None,
        })
        .collect();
    let out = api.put_records(stream, entries).await.unwrap();
    assert_eq!(out.failed_count(), 0);
}

fn payloads(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i:02}")).collect()
}

/// The next item of the stream, within [`ITEM_TIMEOUT`].
async fn next(stream: &mut ShardStream, got: &[String]) -> Result<String, KinesisError> {
    match tokio::time::timeout(ITEM_TIMEOUT, stream.next()).await {
        Ok(Some(item)) => item.map(|record| String::from_utf8_lossy(record.data()).into_owned()),
        Ok(None) => panic!("the stream ended after {got:?}"),
        Err(_) => panic!("nothing came for {ITEM_TIMEOUT:?} after {got:?}"),
    }
}

/// Reads until `done` holds of the records and errors read so far.
async fn read_until(
    stream: &mut ShardStream,
    got: &mut Vec<String>,
    errors: &mut Vec<KinesisError>,
    done: impl Fn(&[String], &[KinesisError]) -> bool,
) {
    while !done(got, errors) {
        match next(stream, got).await {
            Ok(payload) => got.push(payload),
            Err(e) => errors.push(e),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_cut_mid_stream_is_reported_and_resumed_without_a_skip_or_a_repeat() {
    support::init_tracing();
    let stream_name = support::unique_name("fan-out-cut");
    support::create_stream(&support::kinesis_client(), &stream_name, 1).await;
    let direct: SharedKinesis = Arc::new(AwsKinesis::new(support::kinesis_client()));
    let proxy = FaultProxy::start(&support::kinesis_endpoint()).await;
    let cut = proxy.add(
        Rule::on(
            "SubscribeToShard",
            Fault::CutStreamAfter(WHOLE_EVENTS_BEFORE_THE_CUT),
        )
        .times(1),
    );
    let client = aws_sdk_kinesis::Client::from_conf(proxy::kinesis_config_builder(&proxy).build());
    let api: SharedKinesis = Arc::new(AwsKinesis::new(client));
    let (before, around, after) = (payloads("a", 5), payloads("b", 5), payloads("c", 5));
    publish(&direct, &stream_name, &before).await;
    let mut stream = ShardStream::builder(api, stream_name.as_str(), SHARD)
        .settings(
            ReadSettings::default()
                .fan_out("app")
                .poll_interval(Duration::from_millis(100))
                .failure_backoff(Duration::from_millis(200)),
        )
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let (mut got, mut errors) = (Vec::new(), Vec::new());
    // The records published before the subscription come in its first event, whole.
    read_until(&mut stream, &mut got, &mut errors, |got, _| got.len() >= 5).await;
    assert!(errors.is_empty(), "an error before the cut: {errors:?}");
    // Records for the event the cut falls in; read until the cut is reported.
    publish(&direct, &stream_name, &around).await;
    read_until(&mut stream, &mut got, &mut errors, |_, errors| {
        !errors.is_empty()
    })
    .await;
    // Records published once the cut was reported.
    publish(&direct, &stream_name, &after).await;
    read_until(&mut stream, &mut got, &mut errors, |got, _| got.len() >= 15).await;

    let expected: Vec<String> = [before, around, after].concat();
    assert_eq!(got, expected, "every record once, in order");
    for e in &errors {
        eprintln!("reported: {e}");
    }
    // The cut is reported. kinesis-local takes a moment to notice the connection is gone and
    // refuses the next subscriptions meanwhile ("another active subscription exists",
    // ResourceInUse inside the event stream): those are waited out, not reported.
    assert!(
        errors.iter().all(KinesisError::is_retryable),
        "only failures the reader retries: {errors:?}"
    );
    assert_eq!(errors.len(), 1, "the cut alone is reported: {errors:?}");
    assert!(proxy.injected(cut) >= 1, "{}", proxy.summary());
    assert!(
        proxy.count("SubscribeToShard") >= 2,
        "subscribed again: {}",
        proxy.summary()
    );
    assert_eq!(proxy.upstream_errors(), 0, "{}", proxy.summary());
}
