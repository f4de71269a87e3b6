//! Records at the edges of what the service takes, through the real wire protocol: an empty
//! record and a record of exactly 1 MiB (data and partition key together) are written and read
//! back intact, in order, with a normal record after each; one byte more is refused before any
//! call, naming the record.

#![forbid(unsafe_code)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::{
    AwsKinesis, KinesisError, OutgoingRecord, Publisher, ReadSettings, ShardStream, StartingPoint,
};

const MIB: usize = 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_and_a_one_mib_record_round_trip_and_one_byte_more_is_refused() {
    let stream = support::unique_name("sizes");
    support::create_stream(&support::kinesis_client(), &stream, 1).await;
    let api: SharedKinesis = Arc::new(AwsKinesis::new(support::kinesis_client()));
    let publisher = Publisher::new(api.clone(), stream.as_str());
    let key = "k";
    let largest = vec![b'x'; MIB - key.len()];
    let sent: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"after-empty".to_vec(),
        largest.clone(),
        b"after-largest".to_vec(),
    ];
    for data in &sent {
        publisher.publish(key, data.clone()).await.unwrap();
    }

    let too_big = publisher
        .publish_batch(vec![OutgoingRecord::new(
            key,
            vec![b'x'; MIB - key.len() + 1],
        )])
        .await;
    match too_big {
        Err(KinesisError::InvalidRecord { index, size, .. }) => {
            assert_eq!(index, 0);
            assert_eq!(size, MIB + 1);
        }
        other => panic!("expected InvalidRecord, got {other:?}"),
    }

    let mut shard = ShardStream::builder(api, stream.as_str(), "shardId-000000000000")
        .settings(ReadSettings::default().poll_interval(Duration::from_millis(50)))
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    for expected in &sent {
        let record = tokio::time::timeout(Duration::from_secs(30), shard.next())
            .await
            .expect("a record in time")
            .expect("the shard is open")
            .expect("read");
        assert_eq!(record.data().len(), expected.len());
        assert_eq!(&record.data()[..], &expected[..]);
        assert_eq!(record.partition_key(), key);
    }
}
