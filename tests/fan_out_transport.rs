//! Enhanced fan-out at the seam, one scripted scenario against the in-memory transport and
//! against kinesis-local (through the AWS SDK, over plain HTTP/1.1): registering a consumer,
//! subscribing at each kind of position, resuming from the continuation sequence number, the
//! event that ends a closed shard, the five-second rule, deregistering.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::{
    ConsumerStatus, KinesisAdmin, ShardEvent, SharedKinesis, StreamStatus,
};
use kinesis_dataflow::{AwsKinesis, KinesisError, MemoryKinesis, StartingPoint};

const SHARD: &str = "shardId-000000000000";

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    registered_again: &'static str,
    from_horizon: Vec<String>,
    /// The continuation is the last record's sequence number.
    continuation_is_last: bool,
    after_continuation: Vec<String>,
    from_latest: Vec<String>,
    /// A second subscription while the first is active (and not read).
    while_active: &'static str,
    at_timestamp: Vec<String>,
    /// The records of the parent after its split.
    closed: Vec<String>,
    unknown_consumer: &'static str,
    deregistered: &'static str,
}

/// What subscribing says: refused at the call, or in the subscription's first event (as
/// kinesis-local refuses), or "ok".
async fn subscribe_kind(api: &SharedKinesis, stream: &str, arn: &str, shard: &str) -> &'static str {
    let subscribed = api
        .subscribe_to_shard(stream, arn, &shard.into(), &StartingPoint::TrimHorizon)
        .await;
    let mut events = match subscribed {
        Ok(events) => events,
        Err(e) => return kind::<()>(&Err(e)),
    };
    match tokio::time::timeout(Duration::from_secs(2), events.next()).await {
        Ok(Some(Err(e))) => kind::<()>(&Err(e)),
        _ => "ok",
    }
}

fn kind<T>(result: &Result<T, KinesisError>) -> &'static str {
    match result {
        Ok(_) => "ok",
        Err(KinesisError::StreamNotFound { .. }) => "StreamNotFound",
        Err(KinesisError::ResourceInUse { .. }) => "ResourceInUse",
        Err(KinesisError::InvalidArgument { .. }) => "InvalidArgument",
        Err(KinesisError::Throttled { .. }) => "Throttled",
        Err(_) => "other",
    }
}

async fn wait_active(api: &SharedKinesis, stream: &str) {
    for _ in 0..300 {
        if api.describe_stream_summary(stream).await.unwrap().status == StreamStatus::Active {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("stream {stream} not ACTIVE after 30 s");
}

/// The consumer's ARN once it is ACTIVE.
async fn active_consumer(api: &SharedKinesis, stream: &str, name: &str) -> String {
    for _ in 0..300 {
        let consumer = api.describe_stream_consumer(stream, name).await.unwrap();
        if consumer.status == ConsumerStatus::Active {
            assert_eq!(consumer.consumer_name, name);
            return consumer.consumer_arn;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("consumer {name} not ACTIVE after 30 s");
}

async fn put(api: &SharedKinesis, stream: &str, payloads: &[&str]) {
    let entries = payloads
        .iter()
        .map(|p| kinesis_dataflow::api::PutRecordsEntry {
            data: bytes::Bytes::from(p.to_string()),
            partition_key: "k".into(),
            explicit_hash_key: None,
        })
        .collect();
    let out = api.put_records(stream, entries).await.unwrap();
    assert_eq!(out.failed_count(), 0);
}

/// Subscribes and collects events until `count` records came (or the shard ended); gives the
/// events.
async fn events(
    api: &SharedKinesis,
    stream: &str,
    arn: &str,
    shard: &str,
    start: &StartingPoint,
    count: usize,
) -> Vec<ShardEvent> {
    let shard: Arc<str> = shard.into();
    let mut events = api
        .subscribe_to_shard(stream, arn, &shard, start)
        .await
        .unwrap();
    let mut out: Vec<ShardEvent> = Vec::new();
    let collect = async {
        while out.iter().map(|e| e.records.len()).sum::<usize>() < count
            && !out.last().is_some_and(ShardEvent::ends_shard)
        {
            match events.next().await {
                Some(Ok(event)) => out.push(event),
                Some(Err(e)) => panic!("subscription failed: {e}"),
                None => break,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), collect)
        .await
        .expect("events in time");
    out
}

fn payloads(events: &[ShardEvent]) -> Vec<String> {
    events
        .iter()
        .flat_map(|e| &e.records)
        .map(|r| String::from_utf8_lossy(r.data()).into_owned())
        .collect()
}

/// The outcome, the events of the closed parent, and what subscribing again at once said.
async fn scenario(
    admin: Arc<dyn KinesisAdmin>,
    stream: &str,
) -> (Outcome, Vec<ShardEvent>, &'static str) {
    let api: SharedKinesis = admin.clone();
    admin.create_stream(stream, 1).await.unwrap();
    wait_active(&api, stream).await;
    api.register_stream_consumer(stream, "app").await.unwrap();
    let registered_again = kind(&api.register_stream_consumer(stream, "app").await);
    let arn = active_consumer(&api, stream, "app").await;

    put(&api, stream, &["a", "b", "c"]).await;
    let first = events(&api, stream, &arn, SHARD, &StartingPoint::TrimHorizon, 3).await;
    let last_seq = first
        .iter()
        .flat_map(|e| &e.records)
        .last()
        .map(|r| r.sequence_number().to_owned());
    let continuation = first.last().unwrap().continuation_sequence_number.clone();
    let again_at_once = kind(
        &api.subscribe_to_shard(stream, &arn, &SHARD.into(), &StartingPoint::TrimHorizon)
            .await,
    );
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    put(&api, stream, &["d", "e"]).await;
    let resume = StartingPoint::AfterSequence(continuation.clone().unwrap());
    let after = events(&api, stream, &arn, SHARD, &resume, 2).await;

    tokio::time::sleep(Duration::from_millis(5_100)).await;
    let (latest, while_active) = {
        let shard: Arc<str> = SHARD.into();
        let mut subscription = api
            .subscribe_to_shard(stream, &arn, &shard, &StartingPoint::Latest)
            .await
            .unwrap();
        // One active subscription per consumer and shard: a second one is refused.
        let while_active = subscribe_kind(&api, stream, &arn, SHARD).await;
        put(&api, stream, &["f"]).await;
        let mut got = Vec::new();
        while got.is_empty() {
            let event = tokio::time::timeout(Duration::from_secs(20), subscription.next())
                .await
                .expect("an event in time")
                .expect("open")
                .expect("no error");
            got.extend(event.records);
        }
        let got: Vec<String> = got
            .iter()
            .map(|r| String::from_utf8_lossy(r.data()).into_owned())
            .collect();
        (got, while_active)
    };

    tokio::time::sleep(Duration::from_millis(5_100)).await;
    let before_g = std::time::SystemTime::now() - Duration::from_millis(1);
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    put(&api, stream, &["g"]).await;
    let at_time = events(
        &api,
        stream,
        &arn,
        SHARD,
        &StartingPoint::since(before_g),
        1,
    )
    .await;

    admin
        .split_shard(stream, SHARD, "170141183460469231731687303715884105728")
        .await
        .unwrap();
    wait_active(&api, stream).await;
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    let closed = events(&api, stream, &arn, SHARD, &resume, 4).await;

    let unknown_consumer = kind(&api.describe_stream_consumer(stream, "nobody").await);
    api.deregister_stream_consumer(stream, "app").await.unwrap();
    let mut deregistered = "still there";
    for _ in 0..100 {
        let described = api.describe_stream_consumer(stream, "app").await;
        if described.is_err() {
            deregistered = kind(&described);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let outcome = Outcome {
        registered_again,
        from_horizon: payloads(&first),
        continuation_is_last: continuation == last_seq,
        after_continuation: payloads(&after),
        from_latest: latest,
        while_active,
        at_timestamp: payloads(&at_time),
        closed: payloads(&closed),
        unknown_consumer,
        deregistered,
    };
    (outcome, closed, again_at_once)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_kinesis_local_agree_on_fan_out() {
    let stream = support::unique_name("fan-out");
    let (memory, memory_closed, memory_again) =
        scenario(Arc::new(MemoryKinesis::new()), &stream).await;
    let (local, local_closed, local_again) = scenario(
        Arc::new(AwsKinesis::new(support::kinesis_client())),
        &stream,
    )
    .await;
    assert_eq!(
        memory,
        local,
        "emulator logs: {}",
        support::logs_dir().display()
    );
    // The scenario means something.
    assert_eq!(memory.from_horizon, ["a", "b", "c"]);
    assert_eq!(memory.after_continuation, ["d", "e"]);
    assert_eq!(memory.closed, ["d", "e", "f", "g"]);
    assert!(memory.continuation_is_last);
    assert_eq!(memory.while_active, "ResourceInUse");
    // Where they differ: the service (and the in-memory transport) ends a closed shard's
    // subscription with an event that names its children and no continuation; kinesis-local
    // goes on sending empty events (the fan-out reader confirms a shard's end by GetRecords).
    let last = memory_closed.last().unwrap();
    assert!(last.ends_shard());
    let mut children: Vec<&str> = last
        .child_shards
        .iter()
        .map(|c| c.shard_id.as_str())
        .collect();
    children.sort_unstable();
    assert_eq!(children, ["shardId-000000000001", "shardId-000000000002"]);
    assert!(local_closed.iter().all(|e| !e.ends_shard()));
    // And the service refuses a consumer's second subscription to a shard within five seconds
    // of the first (so does the in-memory transport); kinesis-local does not.
    assert_eq!((memory_again, local_again), ("ResourceInUse", "ok"));
}
