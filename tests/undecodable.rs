//! A record whose data does not decode, read from kinesis-local with the lease table on
//! dynalite: decoding it through the delivery gives one error naming the stream, shard,
//! sequence number, partition key and the decoder's error; skipping it lets the shard go on,
//! and the checkpoint passes it.

#![forbid(unsafe_code)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    AwsKinesis, Delivery, DynamoLeaseStore, KinesisError, KinesisPosition, Publisher, Record,
    Subscription,
};

async fn next(subscription: &mut Subscription) -> Delivery<Record> {
    tokio::time::timeout(Duration::from_secs(30), subscription.next())
        .await
        .expect("a delivery in time")
        .expect("the subscription runs")
        .expect("a record")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_does_not_decode_is_one_error_naming_it_and_skipping_it_moves_on() {
    support::init_tracing();
    let stream = support::unique_name("undecodable");
    support::create_stream(&support::kinesis_client(), &stream, 1).await;
    let api: SharedKinesis = Arc::new(AwsKinesis::new(support::kinesis_client()));
    let publisher = Publisher::new(api.clone(), stream.as_str());
    publisher.publish("order-1", "{not json").await.unwrap();
    publisher.publish("order-2", r#"{"id":2}"#).await.unwrap();
    let store = Arc::new(
        DynamoLeaseStore::new(
            support::dynamodb_client(),
            support::unique_name("undecodable-leases"),
        )
        .unwrap(),
    );
    let mut orders = Subscription::builder(api, store.clone(), stream.as_str())
        .start_at(KinesisPosition::horizon())
        .checkpoint_interval(Duration::from_millis(100))
        .start()
        .await
        .unwrap();

    let bad = next(&mut orders).await;
    let error = bad
        .decode(serde_json::from_slice::<serde_json::Value>)
        .unwrap_err();
    let decoder_error = serde_json::from_slice::<serde_json::Value>(b"{not json")
        .unwrap_err()
        .to_string();
    assert!(matches!(&error, KinesisError::Decode { .. }), "{error:?}");
    // The message names the record; the decoder's error is the source, said once in the
    // error's report (its message and causes on one line).
    let text = error.to_string();
    assert!(!text.contains(&decoder_error), "the cause twice: {text}");
    let text = error.report();
    println!("{text}");
    for part in [
        stream.as_str(),
        bad.shard_id(),
        bad.value().sequence_number(),
        "order-1",
        decoder_error.as_str(),
    ] {
        assert!(text.contains(part), "`{part}` is not named in: {text}");
    }
    assert_eq!(text.matches(&decoder_error).count(), 1, "{text}");
    assert!(
        std::error::Error::source(&error).is_some_and(|s| s.to_string() == decoder_error),
        "the decoder's error is the source"
    );
    bad.skip();

    let good = next(&mut orders).await;
    let order = good
        .decode(serde_json::from_slice::<serde_json::Value>)
        .expect("the next record decodes");
    assert_eq!(order["id"], 2);
    let good_seq = good.value().sequence_number().to_owned();
    good.ack();

    // The checkpoint passes the skipped record and the acked one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let rows = store.list(&stream).await.unwrap();
        if rows
            .iter()
            .any(|l| l.checkpoint == Some(Checkpoint::Sequence(good_seq.clone())))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the checkpoint never reached {good_seq}: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    orders.shutdown().await;
}
