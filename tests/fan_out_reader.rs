//! A `ShardStream` reading with enhanced fan-out (`ReadSettings::fan_out`): on the in-memory
//! transport with paused time (subscriptions that end, the five-second rule, failures, the
//! closing event) and on kinesis-local (records pushed over the SDK's event stream, a closed
//! shard's end confirmed by GetRecords).

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::memory::Fault;
use kinesis_dataflow::api::{KinesisAdmin, SharedKinesis};
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::{
    AwsKinesis, KinesisError, MemoryKinesis, ReadSettings, ShardStream, StartingPoint,
};

const SHARD: &str = "shardId-000000000000";

fn fan_out(api: SharedKinesis, stream: &str, shard: &str, start: StartingPoint) -> ShardStream {
    ShardStream::builder(api, stream, shard)
        .settings(
            ReadSettings::default()
                .fan_out("app")
                .poll_interval(Duration::from_millis(100)),
        )
        .open(start)
        .unwrap()
}

/// Reads until `count` records came; returns their payloads and the errors seen meanwhile.
async fn read(stream: &mut ShardStream, count: usize) -> (Vec<String>, Vec<KinesisError>) {
    let mut got = Vec::new();
    let mut errors = Vec::new();
    while got.len() < count {
        match tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .expect("records in time")
        {
            Some(Ok(record)) => got.push(String::from_utf8_lossy(record.data()).into_owned()),
            Some(Err(e)) => errors.push(e),
            None => panic!("the stream ended after {got:?}"),
        }
    }
    (got, errors)
}

#[tokio::test(start_paused = true)]
async fn subscriptions_that_end_are_resumed_after_their_last_event_without_a_skip_or_a_repeat() {
    // Subscriptions of 7 s: the next one begins more than five seconds after the last.
    let memory = MemoryKinesis::new().with_subscription_lifetime(Duration::from_secs(7));
    memory.add_stream("s", 1).unwrap();
    memory.put("s", "k", "before").unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let mut stream = fan_out(api, "s", SHARD, StartingPoint::TrimHorizon);
    let (first, errors) = read(&mut stream, 1).await;
    assert_eq!(first, ["before"]);
    assert!(errors.is_empty(), "{errors:?}");
    // Read while the records arrive, over several subscriptions.
    let reader = tokio::spawn(async move { read(&mut stream, 30).await });
    let mut expected = Vec::new();
    for i in 0..30 {
        let payload = format!("r{i:02}");
        memory.put("s", "k", payload.clone()).unwrap();
        expected.push(payload);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (got, errors) = reader.await.unwrap();
    assert_eq!(got, expected, "in order, once each");
    assert!(errors.is_empty(), "{errors:?}");
    // The consumer was registered, and the shard subscribed to again as subscriptions ended.
    assert_eq!(memory.call_count(Operation::RegisterStreamConsumer), 1);
    assert!(memory.call_count(Operation::SubscribeToShard) >= 4);
}

#[tokio::test(start_paused = true)]
async fn a_failed_subscription_is_reported_and_one_refused_for_now_is_bridged_quietly() {
    // Subscriptions of 1 s: the next one comes within five seconds and is refused
    // (ResourceInUse) until the five seconds are over: bridged by GetRecords, not reported.
    let memory = MemoryKinesis::new().with_subscription_lifetime(Duration::from_secs(1));
    memory.add_stream("s", 1).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let mut stream = fan_out(api, "s", SHARD, StartingPoint::TrimHorizon);
    memory.put("s", "k", "a").unwrap();
    let (got, _) = read(&mut stream, 1).await;
    assert_eq!(got, ["a"]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    memory.put("s", "k", "b").unwrap();
    memory.inject(Fault::fail(Operation::SubscribeToShard, "connection reset"));
    let (got, errors) = read(&mut stream, 1).await;
    assert_eq!(got, ["b"]);
    assert_eq!(errors.len(), 1, "only the failure is reported: {errors:?}");
    assert!(
        matches!(errors[0], KinesisError::Service { .. }),
        "{errors:?}"
    );
    // The refused one (within five seconds of the last) was bridged: "b" came by GetRecords.
    assert!(memory.call_count(Operation::GetRecords) >= 1, "bridged");
    // Once the five seconds are over the reader subscribes again, after "b".
    tokio::time::sleep(Duration::from_secs(6)).await;
    memory.put("s", "k", "c").unwrap();
    let (got, errors) = read(&mut stream, 1).await;
    assert_eq!(got, ["c"]);
    assert!(errors.is_empty(), "{errors:?}");
    let subscribed = memory.call_count(Operation::SubscribeToShard);
    assert!(subscribed > 3, "asked again: {subscribed} calls");
}

#[tokio::test(start_paused = true)]
async fn a_throttled_subscription_waits_quietly_and_a_deleted_consumer_is_registered_again() {
    let memory = MemoryKinesis::new();
    memory.add_stream("s", 1).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    // The first subscription is throttled (the rate limit per shard and consumer): waited
    // out, not reported.
    memory.inject(Fault::throttle(Operation::SubscribeToShard));
    let mut stream = fan_out(api.clone(), "s", SHARD, StartingPoint::TrimHorizon);
    memory.put("s", "k", "a").unwrap();
    let (got, errors) = read(&mut stream, 1).await;
    assert_eq!(got, ["a"]);
    assert!(errors.is_empty(), "a throttle is not reported: {errors:?}");
    // The consumer is deleted under the reader: its subscription fails (reported), and the
    // reader registers the consumer again and goes on after the last record.
    api.deregister_stream_consumer("s", "app").await.unwrap();
    tokio::time::sleep(Duration::from_secs(6)).await;
    memory.put("s", "k", "b").unwrap();
    let (got, errors) = read(&mut stream, 1).await;
    assert_eq!(got, ["b"], "nothing skipped or repeated");
    assert!(
        errors
            .iter()
            .any(|e| matches!(e, KinesisError::StreamNotFound { .. })),
        "the deleted consumer is reported: {errors:?}"
    );
    assert_eq!(memory.call_count(Operation::RegisterStreamConsumer), 2);
    let consumer = api.describe_stream_consumer("s", "app").await.unwrap();
    assert_eq!(consumer.consumer_name, "app");
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_is_not_pulled_holds_one_event_at_most_and_resumes_after_it() {
    // Subscriptions of a minute; the consumer stops pulling for ten.
    let memory = MemoryKinesis::new().with_subscription_lifetime(Duration::from_secs(60));
    memory.add_stream("s", 1).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let mut stream = fan_out(api, "s", SHARD, StartingPoint::TrimHorizon);
    memory.put("s", "k", "first").unwrap();
    assert_eq!(read(&mut stream, 1).await.0, ["first"]);
    let mut expected = Vec::new();
    for minute in 0..10 {
        for i in 0..2_500 {
            let payload = format!("{minute}:{i:04}");
            memory.put("s", "k", payload.clone()).unwrap();
            expected.push(payload);
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    }
    // 25,000 records arrived meanwhile; the reader holds no more than one event (at most
    // 10,000 records in the in-memory transport), and the service's side waits.
    assert!(stream.buffered_len() <= 10_000, "{}", stream.buffered_len());
    let (got, errors) = read(&mut stream, expected.len()).await;
    assert_eq!(
        got, expected,
        "every record once, in order, across subscriptions"
    );
    assert!(errors.is_empty(), "{errors:?}");
}

#[tokio::test(start_paused = true)]
async fn a_closed_shard_ends_with_the_children_its_last_event_names() {
    let memory = MemoryKinesis::new();
    memory.add_stream("s", 1).unwrap();
    memory.put("s", "k", "a").unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let mut stream = fan_out(api.clone(), "s", SHARD, StartingPoint::TrimHorizon);
    assert_eq!(read(&mut stream, 1).await.0, ["a"]);
    memory
        .split_shard("s", SHARD, "170141183460469231731687303715884105728")
        .await
        .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(60), stream.next())
        .await
        .expect("the end in time");
    assert!(end.is_none(), "{end:?}");
    let children: Vec<String> = stream
        .shard_end()
        .expect("read to its end")
        .child_shards
        .iter()
        .map(|c| c.shard_id.clone())
        .collect();
    assert_eq!(children.len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_local_pushes_records_and_a_split_shard_ends() {
    let stream_name = support::unique_name("fan-out-reader");
    support::create_stream(&support::kinesis_client(), &stream_name, 1).await;
    let aws = Arc::new(AwsKinesis::new(support::kinesis_client()));
    let api: SharedKinesis = aws.clone();
    let publish = |payload: &'static str| {
        let (api, stream_name) = (api.clone(), stream_name.clone());
        async move {
            let entry = kinesis_dataflow::api::PutRecordsEntry {
                data: bytes::Bytes::from_static(payload.as_bytes()),
                partition_key: "k".into(),
                explicit_hash_key: None,
            };
            let out = api.put_records(&stream_name, vec![entry]).await.unwrap();
            assert_eq!(out.failed_count(), 0);
        }
    };
    publish("a").await;
    let mut stream = fan_out(api.clone(), &stream_name, SHARD, StartingPoint::TrimHorizon);
    assert_eq!(read(&mut stream, 1).await.0, ["a"]);
    publish("b").await;
    publish("c").await;
    assert_eq!(read(&mut stream, 2).await.0, ["b", "c"]);
    aws.split_shard(
        &stream_name,
        SHARD,
        "170141183460469231731687303715884105728",
    )
    .await
    .unwrap();
    let end = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match stream.next().await {
                None => return,
                Some(Ok(record)) => panic!("a record after the split: {record:?}"),
                Some(Err(e)) => eprintln!("{e}"),
            }
        }
    })
    .await;
    assert!(end.is_ok(), "the parent's end within a minute");
    let end = stream.shard_end().expect("read to its end");
    assert_eq!(end.child_shards.len(), 2, "{end:?}");
}
