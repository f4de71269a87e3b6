//! A real process crash between a poison record's last attempt and its dead-letter write: the
//! child process (this test binary, run again with `DEAD_CHILD_*` set) reads from
//! kinesis-local with its leases in dynalite, fails the poison record on both of its attempts,
//! acks the records around it, and aborts while its dead letter is being written (after
//! several checkpoint intervals). Started again on the same lease table with a working
//! dead-letter stream, the subscription delivers the poison record again, dead-letters it once,
//! and only then passes it: nothing is lost.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::ack::{DeadLetter, dead_letters_fn};
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    AwsKinesis, DeliveryStreamExt, DynamoLeaseStore, KinesisPosition, Publisher, ShardStream,
    StartingPoint, Subscription,
};

const RECORDS: [&str; 4] = ["first", "poison", "third", "fourth"];

/// The emulators' endpoints: the parent's (the child is given them; it starts none).
struct Endpoints {
    kinesis: String,
    dynamodb: String,
}

fn api(at: &Endpoints) -> SharedKinesis {
    Arc::new(AwsKinesis::new(support::kinesis_client_at(&at.kinesis)))
}

fn store(at: &Endpoints, table: &str) -> DynamoLeaseStore {
    DynamoLeaseStore::new(support::dynamodb_client_at(&at.dynamodb), table).unwrap()
}

fn subscription(
    at: &Endpoints,
    stream: &str,
    table: &str,
    owner: &str,
) -> kinesis_dataflow::SubscriptionBuilder {
    support::reading::fast(&api(at), Arc::new(store(at, table)), stream, owner)
        .initial_position(KinesisPosition::horizon())
        .max_attempts(2)
}

/// Fails "poison" on every attempt and acks the rest, until the lease row's checkpoint is
/// `until` (checked between deliveries; `None`: forever).
async fn consume(
    sub: Subscription,
    stream: &str,
    rows: &DynamoLeaseStore,
    until: Option<Checkpoint>,
) {
    let mut deliveries = sub.errors_to(|e| panic!("no errors expected: {e}"));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        if let Some(until) = &until {
            let row = rows.list(stream).await.unwrap();
            if row.first().and_then(|r| r.checkpoint.as_ref()) == Some(until) {
                return;
            }
        }
        assert!(tokio::time::Instant::now() < deadline, "done in time");
        let Ok(next) = tokio::time::timeout(Duration::from_millis(200), deliveries.next()).await
        else {
            continue;
        };
        let delivery = next.expect("running");
        if delivery.data().as_ref() == b"poison" {
            let attempt = delivery.attempt();
            delivery.fail(format!("attempt {attempt} failed"));
        } else {
            let _ = delivery.ack();
        }
    }
}

/// The child's part: the dead-letter write starts, checkpoint intervals pass, the process
/// aborts before the write completes.
async fn child(at: &Endpoints, stream: &str, table: &str) -> ! {
    let sub = subscription(at, stream, table, "child")
        .dead_letters(dead_letters_fn(|_letter: DeadLetter| async {
            tokio::time::sleep(Duration::from_secs(2)).await;
            println!("child: crashing while the dead letter is being written");
            std::process::abort();
        }))
        .start()
        .await
        .unwrap();
    consume(sub, stream, &store(at, table), None).await;
    unreachable!("the dead-letter write aborts the process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_before_the_dead_letter_is_written_loses_nothing() {
    let var = |name: &str| std::env::var(name).ok();
    if let (Some(stream), Some(table), Some(kinesis), Some(dynamodb)) = (
        var("DEAD_CHILD_STREAM"),
        var("DEAD_CHILD_TABLE"),
        var("DEAD_CHILD_KINESIS"),
        var("DEAD_CHILD_DYNAMODB"),
    ) {
        child(&Endpoints { kinesis, dynamodb }, &stream, &table).await;
    }
    let at = Endpoints {
        kinesis: support::kinesis_endpoint(),
        dynamodb: support::dynamodb_endpoint(),
    };
    let client = support::kinesis_client();
    let stream = support::unique_name("crash-dead");
    let dead = support::unique_name("crash-dead-letters");
    let table = support::unique_name("crash-dead-leases");
    support::create_stream(&client, &stream, 1).await;
    support::create_stream(&client, &dead, 1).await;
    let producer = Publisher::new(api(&at), stream.as_str());
    let mut sequence_numbers = Vec::new();
    for data in RECORDS {
        sequence_numbers.push(
            producer
                .publish("acct", data)
                .await
                .unwrap()
                .sequence_number,
        );
    }
    let status = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_crash_before_the_dead_letter_is_written_loses_nothing",
            "--nocapture",
        ])
        .env("DEAD_CHILD_STREAM", &stream)
        .env("DEAD_CHILD_TABLE", &table)
        .env("DEAD_CHILD_KINESIS", &at.kinesis)
        .env("DEAD_CHILD_DYNAMODB", &at.dynamodb)
        .kill_on_drop(true)
        .status()
        .await
        .unwrap();
    assert!(!status.success(), "the child crashed: {status}");
    let rows = store(&at, &table).list(&stream).await.unwrap();
    assert_eq!(
        rows[0].checkpoint,
        Some(Checkpoint::Sequence(sequence_numbers[0].clone())),
        "the crashed child's checkpoint stopped before the poison record"
    );

    // Once the crashed child's lease expires, a new instance reads the poison record again,
    // dead-letters it (to a stream this time), and passes it.
    let sub = subscription(&at, &stream, &table, "after-crash")
        .dead_letters(Publisher::new(api(&at), dead.as_str()))
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    // Returns once the checkpoint passed every record, the poison one included.
    consume(
        sub,
        &stream,
        &store(&at, &table),
        Some(Checkpoint::Sequence(sequence_numbers[3].clone())),
    )
    .await;
    handle.shutdown().await;
    let mut reader = ShardStream::builder(api(&at), dead.as_str(), "shardId-000000000000")
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let record = tokio::time::timeout(Duration::from_secs(30), reader.next())
        .await
        .expect("a dead letter")
        .unwrap()
        .unwrap();
    let letter = DeadLetter::from_envelope(record.data()).unwrap();
    assert_eq!(&*letter.data, b"poison");
    assert_eq!(&*letter.sequence_number, sequence_numbers[1].as_str());
    assert_eq!(letter.attempts, 2);
}
