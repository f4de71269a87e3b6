//! Enhanced fan-out: consumers and subscriptions.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::{MemoryKinesis, S0, kinesis};
use crate::api::{ConsumerStatus, KinesisApi, ShardEvents};
use crate::error::KinesisError;
use crate::position::StartingPoint;

/// Registers the consumer "app" of the stream "s" and returns its ARN.
async fn register_app(kinesis: &MemoryKinesis) -> String {
    kinesis
        .register_stream_consumer("s", "app")
        .await
        .unwrap()
        .consumer_arn
}

/// Subscribes the consumer `arn` to the shard S0 of the stream "s" from `start`; the
/// subscription must be granted.
async fn subscribe(kinesis: &MemoryKinesis, arn: &str, start: &StartingPoint) -> ShardEvents {
    let shard: Arc<str> = S0.into();
    kinesis
        .subscribe_to_shard("s", arn, &shard, start)
        .await
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_consumer_is_creating_until_its_activation_time_and_cannot_subscribe_before() {
    let kinesis = kinesis("s", 1).with_consumer_activation(Duration::from_secs(3));
    let consumer = kinesis.register_stream_consumer("s", "app").await.unwrap();
    assert_eq!(consumer.status, ConsumerStatus::Creating);
    let shard: Arc<str> = S0.into();
    let early = kinesis
        .subscribe_to_shard("s", &consumer.consumer_arn, &shard, &StartingPoint::Latest)
        .await;
    assert!(matches!(early, Err(KinesisError::ResourceInUse { .. })));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let described = kinesis.describe_stream_consumer("s", "app").await.unwrap();
    assert_eq!(described.status, ConsumerStatus::Active);
    assert_eq!(described.consumer_arn, consumer.consumer_arn);
    let _events = subscribe(&kinesis, &consumer.consumer_arn, &StartingPoint::Latest).await;
}

#[tokio::test(start_paused = true)]
async fn a_subscription_ends_after_its_lifetime_and_heartbeats_meanwhile() {
    let kinesis = kinesis("s", 1).with_subscription_lifetime(Duration::from_secs(10));
    let arn = register_app(&kinesis).await;
    kinesis.put("s", "k", "a").unwrap();
    let mut events = subscribe(&kinesis, &arn, &StartingPoint::TrimHorizon).await;
    let first = events.next().await.unwrap().unwrap();
    assert_eq!(first.records.len(), 1);
    let mut heartbeats = 0;
    while let Some(event) = events.next().await {
        let event = event.unwrap();
        assert!(event.records.is_empty());
        assert_eq!(
            event.continuation_sequence_number,
            first.continuation_sequence_number
        );
        heartbeats += 1;
    }
    // One a second until the ten seconds are over.
    assert!((8..=10).contains(&heartbeats), "{heartbeats} heartbeats");
}

/// A subscription that starts after a record heartbeats while nothing arrives, as the
/// service's do, continuing after that record; one from the shard's first position ever sends
/// nothing until a record arrives (no sequence number names a place before it).
#[tokio::test(start_paused = true)]
async fn an_idle_subscription_heartbeats_once_a_record_lies_before_its_start() {
    let kinesis = kinesis("s", 1);
    let arn = register_app(&kinesis).await;
    let mut empty = subscribe(&kinesis, &arn, &StartingPoint::TrimHorizon).await;
    let nothing = tokio::time::timeout(Duration::from_secs(10), empty.next()).await;
    assert!(nothing.is_err(), "{nothing:?}");
    drop(empty);
    let (_, a) = kinesis.put("s", "k", "a").unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    for start in [
        StartingPoint::AfterSequence(a.clone()),
        StartingPoint::Latest,
    ] {
        let mut events = subscribe(&kinesis, &arn, &start).await;
        let event = tokio::time::timeout(Duration::from_secs(2), events.next())
            .await
            .expect("a heartbeat within two seconds")
            .unwrap()
            .unwrap();
        assert!(event.records.is_empty(), "{start:?}");
        assert_eq!(event.continuation_sequence_number.as_ref(), Some(&a));
        drop(events);
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn deregistering_ends_its_subscriptions_with_an_error() {
    let kinesis = kinesis("s", 1);
    let arn = register_app(&kinesis).await;
    let mut events = subscribe(&kinesis, &arn, &StartingPoint::Latest).await;
    kinesis
        .deregister_stream_consumer("s", "app")
        .await
        .unwrap();
    assert!(matches!(
        events.next().await,
        Some(Err(KinesisError::StreamNotFound { .. }))
    ));
    assert!(events.next().await.is_none());
}

#[tokio::test]
async fn a_bad_consumer_name_is_refused_naming_it() {
    let kinesis = kinesis("s", 1);
    let error = kinesis
        .register_stream_consumer("s", "no spaces")
        .await
        .unwrap_err();
    super::assert_invalid(&error, "no spaces");
}
