//! The crate's errors from real calls against kinesis-local keep the SDK's error as their
//! source, and a stream that exists already is its own case.

mod support;

use std::error::Error as _;

use kinesis_dataflow::{AwsKinesis, KinesisError, StartingPoint};

use kinesis_dataflow::api::{KinesisAdmin, KinesisApi};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_of_real_calls_keep_their_cause() {
    let api = AwsKinesis::new(support::kinesis_client());
    let stream = support::unique_name("errors");
    let missing = api
        .get_shard_iterator(&stream, "shardId-000000000000", &StartingPoint::Latest)
        .await
        .unwrap_err();
    assert!(
        matches!(missing, KinesisError::StreamNotFound { .. }),
        "{missing:?}"
    );
    assert!(
        missing.source().is_some(),
        "the SDK's error is kept: {missing:?}"
    );

    api.create_stream(&stream, 1).await.unwrap();
    let again = api.create_stream(&stream, 1).await.unwrap_err();
    assert!(
        matches!(&again, KinesisError::ResourceInUse { stream: s, .. } if *s == stream),
        "{again:?}"
    );
    assert!(again.source().is_some(), "{again:?}");
}
