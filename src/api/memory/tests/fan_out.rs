//! Enhanced fan-out: consumers and subscriptions.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::{S0, kinesis};
use crate::api::{ConsumerStatus, KinesisApi};
use crate::error::KinesisError;
use crate::position::StartingPoint;

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
    let _events = kinesis
        .subscribe_to_shard("s", &consumer.consumer_arn, &shard, &StartingPoint::Latest)
        .await
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_subscription_ends_after_its_lifetime_and_heartbeats_meanwhile() {
    let kinesis = kinesis("s", 1).with_subscription_lifetime(Duration::from_secs(10));
    let arn = kinesis
        .register_stream_consumer("s", "app")
        .await
        .unwrap()
        .consumer_arn;
    kinesis.put("s", "k", "a").unwrap();
    let shard: Arc<str> = S0.into();
    let mut events = kinesis
        .subscribe_to_shard("s", &arn, &shard, &StartingPoint::TrimHorizon)
        .await
        .unwrap();
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

#[tokio::test(start_paused = true)]
async fn deregistering_ends_its_subscriptions_with_an_error() {
    let kinesis = kinesis("s", 1);
    let arn = kinesis
        .register_stream_consumer("s", "app")
        .await
        .unwrap()
        .consumer_arn;
    let shard: Arc<str> = S0.into();
    let mut events = kinesis
        .subscribe_to_shard("s", &arn, &shard, &StartingPoint::Latest)
        .await
        .unwrap();
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
