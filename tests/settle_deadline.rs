//! A settlement deadline per delivery (`settle_within`): a delivery kept unsettled past it is
//! taken back and delivered again (as its next attempt), past its attempts dead-lettered, and
//! whatever the timed-out delivery does later is ignored. Live, on kinesis-local, with the
//! dead letters written to a second stream.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::ack::DeadLetter;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    Delivery, DeliveryStreamExt, KinesisError, KinesisPosition, MemoryLeaseStore, Publisher,
    Record, ShardStream, StartingPoint, Subscription,
};

const DEADLINE: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_kept_past_their_deadline_come_back_and_then_go_to_the_dead_letters() {
    let client = support::kinesis_client();
    let source = support::unique_name("ledger");
    let dead = support::unique_name("ledger-dead");
    support::create_stream(&client, &source, 1).await;
    support::create_stream(&client, &dead, 1).await;
    let api: SharedKinesis = Arc::new(kinesis_dataflow::AwsKinesis::new(client.clone()));
    let producer = Publisher::new(api.clone(), source.as_str());
    let mut sequence_numbers = Vec::new();
    for data in ["slow", "stuck", "after"] {
        let stored = producer.publish("acct-1", data).await.unwrap();
        sequence_numbers.push(stored.sequence_number);
    }
    let store = MemoryLeaseStore::new();
    let sub = support::reading::fast(&api, Arc::new(store.clone()), source.as_str(), "a")
        .initial_position(KinesisPosition::horizon())
        .settle_within(DEADLINE)
        .max_attempts(2)
        .dead_letters(Publisher::new(api.clone(), dead.as_str()))
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    let mut deliveries = sub.errors_to(|e| panic!("no errors expected: {e}"));

    // Kept, never settled: "slow" on its first attempt, "stuck" on both of its attempts.
    let mut kept: Vec<Delivery<Record>> = Vec::new();
    let mut seen = Vec::new();
    let last = sequence_numbers[2].clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let rows = store.list(source.as_str()).await.unwrap();
        if rows.first().and_then(|row| row.checkpoint.clone())
            == Some(Checkpoint::Sequence(last.clone()))
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the checkpoint passes every record in time (seen: {seen:?})"
        );
        let Ok(next) = tokio::time::timeout(Duration::from_millis(200), deliveries.next()).await
        else {
            continue;
        };
        let delivery = next.expect("running");
        let data = String::from_utf8_lossy(delivery.data()).into_owned();
        seen.push(format!("{data}#{}", delivery.attempt()));
        match (data.as_str(), delivery.attempt()) {
            ("slow", 1) | ("stuck", _) => kept.push(delivery),
            _ => drop(delivery.ack()),
        }
    }
    assert_eq!(
        seen,
        ["slow#1", "stuck#1", "after#1", "slow#2", "stuck#2"],
        "each kept delivery came back once as its second attempt"
    );

    // The timed-out deliveries settle nothing any more: acking them now moves nothing.
    for delivery in kept {
        let _ = delivery.ack();
    }
    handle.shutdown().await;
    let rows = store.list(source.as_str()).await.unwrap();
    assert_eq!(rows[0].checkpoint, Some(Checkpoint::Sequence(last)));

    // "stuck" went to the dead letters after its second attempt timed out.
    let mut reader = ShardStream::builder(api.clone(), dead.as_str(), "shardId-000000000000")
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let record = tokio::time::timeout(Duration::from_secs(30), reader.next())
        .await
        .expect("a dead letter")
        .unwrap()
        .unwrap();
    let letter = DeadLetter::from_envelope(record.data()).unwrap();
    assert_eq!(&*letter.data, b"stuck");
    assert_eq!(&*letter.sequence_number, sequence_numbers[1].as_str());
    assert_eq!(letter.attempts, 2);
    assert_eq!(letter.last_error.as_deref(), Some("not settled within 1s"));
}

#[tokio::test]
async fn a_zero_deadline_is_refused_naming_the_setting() {
    let memory = kinesis_dataflow::MemoryKinesis::new();
    memory.add_stream("s", 1).unwrap();
    let error = Subscription::builder(Arc::new(memory), Arc::new(MemoryLeaseStore::new()), "s")
        .settle_within(Duration::ZERO)
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            KinesisError::InvalidConfig {
                setting: "settle_within",
                ..
            }
        ),
        "{error}"
    );
}
