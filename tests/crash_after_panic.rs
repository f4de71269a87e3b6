//! A real process crash right after a handler panicked: the child process (this test binary,
//! run again with `CRASH_CHILD` set) reads from kinesis-local with its leases in dynalite, a
//! handler task panics while it holds record 1, later records are acked and a checkpoint
//! interval passes, then the process aborts. Started again on the same lease table, the
//! subscription delivers record 1 first: the panic's drop never let a checkpoint pass it.

mod support;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore, KinesisPosition, Subscription};

const RECORDS: usize = 6;

/// The emulators' endpoints: the parent's (the child is given them; it starts none).
struct Endpoints {
    kinesis: String,
    dynamodb: String,
}

fn subscription(
    at: &Endpoints,
    stream: &str,
    table: &str,
    owner: &str,
) -> kinesis_dataflow::SubscriptionBuilder {
    let api: SharedKinesis = Arc::new(AwsKinesis::new(support::kinesis_client_at(&at.kinesis)));
    let store = DynamoLeaseStore::new(support::dynamodb_client_at(&at.dynamodb), table).unwrap();
    support::reading::fast(&api, Arc::new(store), stream, owner)
        .initial_position(KinesisPosition::horizon())
}

async fn next(sub: &mut Subscription) -> kinesis_dataflow::Delivery<kinesis_dataflow::Record> {
    tokio::time::timeout(Duration::from_secs(60), sub.next())
        .await
        .expect("a delivery in time")
        .expect("running")
        .expect("no error")
}

/// The child's part: panic while holding record 1, ack the others, wait, crash.
async fn child(at: &Endpoints, stream: &str, table: &str) -> ! {
    let mut sub = subscription(at, stream, table, "child")
        .start()
        .await
        .unwrap();
    next(&mut sub).await.ack();
    let doomed = next(&mut sub).await;
    let crashed = tokio::spawn(async move {
        let _held = doomed;
        panic!("the handler failed on record 1");
    })
    .await;
    assert!(crashed.unwrap_err().is_panic());
    // The panicked record comes back in-process; this handler ignores it and acks the rest,
    // so only the ledger keeps the checkpoint from passing record 1.
    let mut acked = 0;
    while acked < RECORDS - 2 {
        let delivery = next(&mut sub).await;
        if delivery.data().as_ref() == b"1" {
            std::mem::forget(delivery);
            continue;
        }
        delivery.ack();
        acked += 1;
    }
    // Several checkpoint intervals: the old rule would have written a checkpoint past record 1.
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("child: crashing now");
    std::process::abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_dropped_by_a_panic_comes_back_after_the_process_crashes() {
    let var = |name: &str| std::env::var(name).ok();
    if let (Some(stream), Some(table), Some(kinesis), Some(dynamodb)) = (
        var("CRASH_CHILD_STREAM"),
        var("CRASH_CHILD_TABLE"),
        var("CRASH_CHILD_KINESIS"),
        var("CRASH_CHILD_DYNAMODB"),
    ) {
        child(&Endpoints { kinesis, dynamodb }, &stream, &table).await;
    }
    let at = Endpoints {
        kinesis: support::kinesis_endpoint(),
        dynamodb: support::dynamodb_endpoint(),
    };
    let client = support::kinesis_client();
    let stream = support::unique_name("crash");
    let table = support::unique_name("crash-leases");
    support::create_stream(&client, &stream, 1).await;
    for i in 0..RECORDS {
        client
            .put_record()
            .stream_name(&stream)
            .partition_key("k")
            .data(Blob::new(i.to_string()))
            .send()
            .await
            .unwrap();
    }
    let status = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_record_dropped_by_a_panic_comes_back_after_the_process_crashes",
            "--nocapture",
        ])
        .env("CRASH_CHILD_STREAM", &stream)
        .env("CRASH_CHILD_TABLE", &table)
        .env("CRASH_CHILD_KINESIS", &at.kinesis)
        .env("CRASH_CHILD_DYNAMODB", &at.dynamodb)
        .kill_on_drop(true)
        .status()
        .await
        .unwrap();
    assert!(!status.success(), "the child crashed: {status}");

    // Once the crashed child's lease expires, a new instance delivers record 1 first.
    let mut again = subscription(&at, &stream, &table, "after-crash")
        .start()
        .await
        .unwrap();
    let first = next(&mut again).await;
    assert_eq!(
        first.data().as_ref(),
        b"1",
        "the panicked record comes back"
    );
    first.ack();
    again.shutdown().await;
}
