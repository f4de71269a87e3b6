//! KPL de-aggregation in a subscription, on the in-memory transport: user records in order
//! with their own keys, checkpoints inside an aggregate, a restart in the middle of one
//! resuming after its last settled user record, and de-aggregation off by default.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::kpl::aggregate;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore, ReadSettings, Subscription,
};

const STREAM: &str = "orders";

fn settings(deaggregate: bool) -> ReadSettings {
    ReadSettings::default()
        .poll_interval(Duration::from_millis(10))
        .unlimited_reads()
        .deaggregate(deaggregate)
}

async fn start(api: &SharedKinesis, store: &MemoryLeaseStore, deaggregate: bool) -> Subscription {
    Subscription::builder(api.clone(), Arc::new(store.clone()), STREAM)
        .initial_position(KinesisPosition::horizon())
        .read_settings(settings(deaggregate))
        .checkpoint_interval(Duration::from_millis(50))
        .start()
        .await
        .unwrap()
}

async fn next(
    sub: &mut Subscription,
) -> Result<kinesis_dataflow::Delivery<kinesis_dataflow::Record>, KinesisError> {
    tokio::time::timeout(Duration::from_secs(10), sub.next())
        .await
        .expect("an item in time")
        .expect("running")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_records_come_in_order_and_a_restart_resumes_inside_the_aggregate() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let data = aggregate([
        ("cust-1", None, &b"u0"[..]),
        ("cust-2", Some("42"), b"u1"),
        ("cust-1", None, b"u2"),
        ("cust-3", None, b"u3"),
    ]);
    let (_, aggregate_seq) = memory.put(STREAM, "outer-key", data).unwrap();
    let (_, plain_seq) = memory.put(STREAM, "cust-9", "plain").unwrap();
    let api: SharedKinesis = Arc::new(memory);
    let store = MemoryLeaseStore::new();

    let mut sub = start(&api, &store, true).await;
    let mut seen = Vec::new();
    for _ in 0..2 {
        let delivery = next(&mut sub).await.unwrap();
        seen.push((
            delivery.partition_key().to_owned(),
            delivery.explicit_hash_key().map(str::to_owned),
            delivery.sub_sequence_number(),
            String::from_utf8_lossy(delivery.data()).into_owned(),
        ));
        assert_eq!(delivery.sequence_number(), aggregate_seq);
        assert_eq!(
            delivery.dedupe_key().sub_sequence_number,
            delivery.sub_sequence_number()
        );
        let _ = delivery.ack();
    }
    assert_eq!(
        seen,
        [
            ("cust-1".into(), None, Some(0), "u0".into()),
            ("cust-2".into(), Some("42".into()), Some(1), "u1".into()),
        ]
    );
    // The third is handed out and never settled before the stop.
    let third = next(&mut sub).await.unwrap();
    assert_eq!(third.sub_sequence_number(), Some(2));
    drop(sub);
    drop(third);
    // Dropping the subscription hands the lease back after a final checkpoint.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let rows = store.list(STREAM).await.unwrap();
        if rows[0].owner.is_none() {
            assert_eq!(
                rows[0].checkpoint,
                Some(Checkpoint::SubSequence(aggregate_seq.clone(), 1)),
                "the checkpoint names the last settled user record"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease is released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A new instance resumes with the aggregate's third user record, then goes on.
    let mut again = start(&api, &store, true).await;
    let mut rest = Vec::new();
    for _ in 0..3 {
        let delivery = next(&mut again).await.unwrap();
        rest.push((
            delivery.sub_sequence_number(),
            String::from_utf8_lossy(delivery.data()).into_owned(),
        ));
        let _ = delivery.ack();
    }
    assert_eq!(
        rest,
        [
            (Some(2), "u2".into()),
            (Some(3), "u3".into()),
            (None, "plain".into())
        ]
    );
    again.shutdown().await;
    let rows = store.list(STREAM).await.unwrap();
    assert_eq!(rows[0].checkpoint, Some(Checkpoint::Sequence(plain_seq)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_deaggregation_an_aggregate_is_an_error_saying_how_to_turn_it_on() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    memory
        .put(STREAM, "k", aggregate([("a", None, &b"x"[..])]))
        .unwrap();
    memory.put(STREAM, "k", "after").unwrap();
    let api: SharedKinesis = Arc::new(memory);
    let mut sub = start(&api, &MemoryLeaseStore::new(), false).await;
    let error = next(&mut sub).await.unwrap_err();
    assert!(
        error
            .to_string()
            .contains("ReadSettings::deaggregate(true)"),
        "{error}"
    );
    let after = next(&mut sub).await.unwrap();
    assert_eq!(&after.data()[..], b"after");
    let _ = after.ack();
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_records_of_another_shard_are_delivered_unless_told_to_drop_them_as_the_kcl_does() {
    // Two shards; the aggregate's own key "a" hashes into the lower half (shard 0), one of its
    // user records names an explicit hash key of the upper half (shard 1): put against a map
    // from before a split.
    let upper = "300000000000000000000000000000000000000";
    for discard in [false, true] {
        let memory = MemoryKinesis::new();
        memory.add_stream(STREAM, 2).unwrap();
        let data = aggregate([
            ("mine", Some("5"), &b"kept"[..]),
            ("theirs", Some(upper), b"moved"),
        ]);
        let (shard, _) = memory.put(STREAM, "a", data).unwrap();
        assert_eq!(shard, "shardId-000000000000");
        memory.put(STREAM, "a", "after").unwrap();
        let api: SharedKinesis = Arc::new(memory);
        let mut sub = Subscription::builder(api.clone(), Arc::new(MemoryLeaseStore::new()), STREAM)
            .initial_position(KinesisPosition::horizon())
            .read_settings(settings(true).discard_misplaced_user_records(discard))
            .start()
            .await
            .unwrap();
        let mut seen = Vec::new();
        loop {
            let delivery = next(&mut sub).await.unwrap();
            seen.push(String::from_utf8_lossy(delivery.data()).into_owned());
            let _ = delivery.ack();
            if seen.last().map(String::as_str) == Some("after") {
                break;
            }
        }
        let expected: &[&str] = if discard {
            &["after"]
        } else {
            &["kept", "moved", "after"]
        };
        assert_eq!(seen, expected, "discard: {discard}");
        sub.shutdown().await;
    }
}
