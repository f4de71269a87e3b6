//! Enhanced fan-out subscriptions spread over several SDK clients ("lanes", a connection each
//! over HTTP/2) once one carries its cap, against kinesis-local: every subscription delivers
//! its shard's record whichever lane it is on, the lanes grow only when every one is full, and
//! a subscription that ends frees its place. (How many TCP connections the lanes open over
//! HTTP/2 is measured by `probes idle --tls`, against an emulator whose certificate the SDK's
//! own HTTPS client can trust; see BENCHMARKS.md.)

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::{ConsumerStatus, KinesisApi, PutRecordsEntry};
use kinesis_dataflow::{AwsKinesis, StartingPoint};

const SHARDS: i32 = 5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_past_a_connections_cap_open_another_lane_and_all_deliver() {
    let stream = support::unique_name("lanes");
    support::create_stream(&support::kinesis_client(), &stream, SHARDS).await;
    let kinesis = AwsKinesis::new(support::kinesis_client()).subscriptions_per_connection(2);
    assert_eq!(kinesis.fan_out_connections(), 1);

    // One record at the start of each shard's hash range.
    let shards = kinesis.list_shards(&stream, None).await.unwrap().shards;
    assert_eq!(shards.len(), 5);
    let entries = shards
        .iter()
        .map(|s| PutRecordsEntry {
            data: bytes::Bytes::from(s.shard_id.clone()),
            partition_key: "k".into(),
            explicit_hash_key: Some(s.starting_hash_key.clone()),
        })
        .collect();
    assert_eq!(
        kinesis
            .put_records(&stream, entries)
            .await
            .unwrap()
            .failed_count(),
        0
    );

    kinesis
        .register_stream_consumer(&stream, "lanes")
        .await
        .unwrap();
    let mut arn = None;
    for _ in 0..300 {
        let consumer = kinesis
            .describe_stream_consumer(&stream, "lanes")
            .await
            .unwrap();
        if consumer.status == ConsumerStatus::Active {
            arn = Some(consumer.consumer_arn);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let arn = arn.expect("the consumer is ACTIVE within 30 s");

    // Five subscriptions open at once, two a lane: three lanes.
    let mut subscriptions = Vec::new();
    for shard in &shards {
        let id: Arc<str> = shard.shard_id.as_str().into();
        let events = kinesis
            .subscribe_to_shard(&stream, &arn, &id, &StartingPoint::TrimHorizon)
            .await
            .unwrap_or_else(|e| panic!("subscribing to {id}: {e}"));
        subscriptions.push((id, events));
    }
    assert_eq!(kinesis.fan_out_connections(), 3);
    for (shard, events) in &mut subscriptions {
        let first = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match events.next().await {
                    Some(Ok(event)) if !event.records.is_empty() => return event.records,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => panic!("{shard}: {e}"),
                    None => panic!("{shard}: the subscription ended"),
                }
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{shard}: no record within 20 s"));
        assert_eq!(&first[0].data()[..], shard.as_bytes());
    }

    // Two end: their places are taken again before any lane opens.
    drop(subscriptions.drain(..2));
    for shard in &shards[..2] {
        let id: Arc<str> = shard.shard_id.as_str().into();
        // Kinesis refuses a second subscription of the consumer to a shard for a moment after
        // the first ends; the place on the lane is what is checked here.
        let again = kinesis
            .subscribe_to_shard(&stream, &arn, &id, &StartingPoint::Latest)
            .await;
        subscriptions.push((id, again.expect("subscribing again")));
    }
    assert_eq!(kinesis.fan_out_connections(), 3);
    drop(subscriptions);
    kinesis
        .deregister_stream_consumer(&stream, "lanes")
        .await
        .unwrap();
}
