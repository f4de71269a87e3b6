//! Poison records: a record failing its attempts goes to the dead-letter destination with its
//! origin, the shard waits for that write (later records of its key come after it), and the
//! checkpoint then passes it. In memory with a callback destination (and a destination that
//! fails at first), and live with a Publisher writing to a dead-letter stream.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::ack::{DeadLetter, dead_letters_fn};
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    DeliveryStreamExt, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Publisher,
    ShardStream, StartingPoint, Subscription,
};

const STREAM: &str = "payments";

/// What happened, in order: `handled:<data>` and `dead:<data>`.
type Timeline = Arc<Mutex<Vec<String>>>;

/// Reads every record: `poison` fails each attempt, the others are acked.
async fn run(sub: Subscription, timeline: Timeline, records: usize) {
    let mut deliveries = sub.errors_to(|e| panic!("no errors expected: {e}"));
    let mut handled = 0;
    while handled < records {
        let delivery = tokio::time::timeout(Duration::from_secs(30), deliveries.next())
            .await
            .expect("a delivery")
            .expect("running");
        let data = String::from_utf8_lossy(delivery.data()).into_owned();
        if data == "poison" {
            let attempt = delivery.attempt();
            delivery.fail(format!("attempt {attempt} failed"));
            continue;
        }
        timeline.lock().unwrap().push(format!("handled:{data}"));
        delivery.ack();
        handled += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_failing_its_attempts_is_dead_lettered_before_the_shard_goes_on() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    memory.put(STREAM, "acct-1", "first").unwrap();
    let (_, poison_seq) = memory.put(STREAM, "acct-1", "poison").unwrap();
    let (_, last_seq) = memory.put(STREAM, "acct-1", "after").unwrap();
    let api: SharedKinesis = Arc::new(memory);
    let store = MemoryLeaseStore::new();
    let timeline: Timeline = Arc::default();
    let letters: Arc<Mutex<Vec<DeadLetter>>> = Arc::default();
    let failures_left = Arc::new(Mutex::new(2));
    let (log, kept, failing) = (timeline.clone(), letters.clone(), failures_left.clone());
    let sub = support::reading::fast(&api, Arc::new(store.clone()), STREAM, "a")
        .initial_position(KinesisPosition::horizon())
        .max_attempts(3)
        .dead_letters(dead_letters_fn(move |letter: DeadLetter| {
            let (log, kept, failing) = (log.clone(), kept.clone(), failing.clone());
            async move {
                // The destination fails twice: the write is retried, never dropped.
                {
                    let mut left = failing.lock().unwrap();
                    if *left > 0 {
                        *left -= 1;
                        return Err(KinesisError::Stopped {
                            stream: "dead-letter destination down".into(),
                        });
                    }
                }
                log.lock()
                    .unwrap()
                    .push(format!("dead:{}", String::from_utf8_lossy(&letter.data)));
                kept.lock().unwrap().push(letter);
                Ok(())
            }
        }))
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    run(sub, timeline.clone(), 2).await;
    assert_eq!(
        *timeline.lock().unwrap(),
        ["handled:first", "dead:poison", "handled:after"],
        "the key's later record comes after the dead letter"
    );
    let letter = letters.lock().unwrap()[0].clone();
    assert_eq!(&*letter.sequence_number, poison_seq);
    assert_eq!(&*letter.stream, STREAM);
    assert_eq!(&*letter.shard, "shardId-000000000000");
    assert_eq!(&*letter.partition_key, "acct-1");
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.last_error.as_deref(), Some("attempt 3 failed"));
    assert_eq!(
        *failures_left.lock().unwrap(),
        0,
        "the failed writes were retried"
    );
    handle.shutdown().await;
    let rows = store.list(STREAM).await.unwrap();
    assert_eq!(rows[0].checkpoint, Some(Checkpoint::Sequence(last_seq)));
}

#[tokio::test]
async fn max_attempts_without_a_destination_is_refused() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let error = Subscription::builder(Arc::new(memory), Arc::new(MemoryLeaseStore::new()), STREAM)
        .max_attempts(3)
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            KinesisError::InvalidConfig {
                setting: "max_attempts",
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("dead_letters"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_land_in_a_stream_with_their_origin() {
    let client = support::kinesis_client();
    let source = support::unique_name("payments");
    let dead = support::unique_name("payments-dead");
    support::create_stream(&client, &source, 1).await;
    support::create_stream(&client, &dead, 1).await;
    let api: SharedKinesis = Arc::new(kinesis_dataflow::AwsKinesis::new(client.clone()));
    let producer = Publisher::new(api.clone(), source.as_str());
    let mut poison_seq = String::new();
    for data in ["first", "poison", "after"] {
        let stored = producer.publish("acct-9", data).await.unwrap();
        if data == "poison" {
            poison_seq = stored.sequence_number.clone();
        }
    }
    let timeline: Timeline = Arc::default();
    let sub = support::reading::fast(
        &api,
        Arc::new(MemoryLeaseStore::new()),
        source.as_str(),
        "a",
    )
    .initial_position(KinesisPosition::horizon())
    .max_attempts(2)
    .dead_letters(Publisher::new(api.clone(), dead.as_str()))
    .start()
    .await
    .unwrap();
    let handle = sub.shutdown_handle();
    run(sub, timeline.clone(), 2).await;
    handle.shutdown().await;
    assert_eq!(
        *timeline.lock().unwrap(),
        ["handled:first", "handled:after"]
    );

    // The dead-letter stream holds one envelope naming its origin, under the original key.
    let mut reader = ShardStream::builder(api.clone(), dead.as_str(), "shardId-000000000000")
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let record = tokio::time::timeout(Duration::from_secs(30), reader.next())
        .await
        .expect("a dead letter")
        .unwrap()
        .unwrap();
    assert_eq!(record.partition_key(), "acct-9");
    let letter = DeadLetter::from_envelope(record.data()).unwrap();
    assert_eq!(&*letter.stream, source.as_str());
    assert_eq!(&*letter.sequence_number, poison_seq.as_str());
    assert_eq!(&*letter.data, b"poison");
    assert_eq!(letter.attempts, 2);
    assert_eq!(letter.last_error.as_deref(), Some("attempt 2 failed"));
}

/// Reads until `after` is handed out, failing every other record; `None` when `after` does
/// not come within the (paused) clock's 10 minutes.
async fn fail_all_until_after(sub: Subscription) -> Option<()> {
    let mut deliveries = sub.errors_to(|e| panic!("no errors expected: {e}"));
    tokio::time::timeout(Duration::from_secs(600), async {
        loop {
            let delivery = deliveries.next().await.expect("running");
            if delivery.data().as_ref() == b"after" {
                delivery.ack();
                return;
            }
            delivery.fail("never handled");
        }
    })
    .await
    .ok()
}

/// A record whose envelope cannot fit in a Kinesis record (its data base64-encoded passes
/// 1 MiB), and a KPL user record with an empty partition key (which PutRecords refuses), are
/// dead-lettered in a form the stream takes: the shard goes on.
#[tokio::test(start_paused = true)]
async fn a_letter_the_stream_cannot_take_as_it_is_goes_in_a_form_it_can() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    memory.add_stream("dead", 1).unwrap();
    let (_, big_seq) = memory.put(STREAM, "acct-1", vec![b'x'; 900_000]).unwrap();
    let aggregate = kinesis_dataflow::kpl::aggregate([("", None, b"keyless".as_slice())]);
    memory.put(STREAM, "outer", aggregate).unwrap();
    memory.put(STREAM, "acct-1", "after").unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let sub = support::reading::fast(&api, Arc::new(MemoryLeaseStore::new()), STREAM, "a")
        .initial_position(KinesisPosition::horizon())
        .read_settings(kinesis_dataflow::ReadSettings::default().deaggregate(true))
        .max_attempts(1)
        .dead_letters(Publisher::new(api.clone(), "dead"))
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    assert!(
        fail_all_until_after(sub).await.is_some(),
        "the shard went on past both dead letters"
    );
    handle.shutdown().await;

    let mut reader = ShardStream::builder(api.clone(), "dead", "shardId-000000000000")
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let big = reader.next().await.unwrap().unwrap();
    assert_eq!(big.partition_key(), "acct-1");
    let letter = DeadLetter::from_envelope(big.data()).unwrap();
    assert_eq!(&*letter.sequence_number, big_seq.as_str());
    assert!(letter.data.is_empty(), "the data is left out");
    assert_eq!(letter.omitted_bytes, Some(900_000), "and its size is named");
    let keyless = reader.next().await.unwrap().unwrap();
    assert_eq!(
        keyless.partition_key(),
        "shardId-000000000000",
        "the shard's id as key"
    );
    let letter = DeadLetter::from_envelope(keyless.data()).unwrap();
    assert_eq!(
        &*letter.partition_key, "",
        "the envelope keeps the original key"
    );
    assert_eq!(&*letter.data, b"keyless");
}
