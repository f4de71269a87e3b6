//! A stream of a `MultiSubscription` deleted in Kinesis and created again in its name while
//! the instance that found it deleted is still stopping, live on kinesis-local and dynalite:
//! the rows of the deleted stream are removed, but not those another instance already wrote
//! for the stream created again (its worker row: removing it would make that instance drop
//! what it reads).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{LeaseError, LeaseFuture, SharedLeaseStore};
use kinesis_dataflow::position::CLOCK_SKEW_ALLOWANCE;
use kinesis_dataflow::subscription::ShutdownHandle;
use kinesis_dataflow::{
    AwsKinesis, Delivery, KinesisPosition, MultiSubscription, ReadSettings, Record, StreamSet,
    Subscription,
};
use tokio::task::JoinHandle;

/// A hang guard for each step.
const PATIENCE: Duration = Duration::from_secs(60);

/// Counts the rows held by `owner` that this view deleted.
#[derive(Debug)]
struct DeletesOf {
    owner: &'static str,
    count: AtomicU64,
}

impl LeaseLayer for DeletesOf {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let theirs = matches!(call, LeaseCall::Delete { lease } if lease.owner.as_deref() == Some(self.owner));
        Box::pin(async move {
            let result = next.await;
            if theirs && result.is_ok() {
                self.count.fetch_add(1, Ordering::SeqCst);
            }
            result
        })
    }
}

/// Instance A on `stream`, reading from the start with fast timings; its stop waits
/// [`PATIENCE`] for what it holds.
async fn start_a(api: &SharedKinesis, store: SharedLeaseStore, stream: &str) -> MultiSubscription {
    let fast = |each: kinesis_dataflow::SubscriptionBuilder| {
        each.initial_position(KinesisPosition::horizon())
            .read_settings(
                ReadSettings::default()
                    .poll_interval(Duration::from_millis(100))
                    .unlimited_reads(),
            )
            .list_interval(Duration::from_millis(300))
            .lease_duration(Duration::from_secs(2))
            .checkpoint_interval(Duration::from_millis(100))
    };
    MultiSubscription::builder(api.clone(), store, StreamSet::new([stream.to_owned()]))
        .configure(|each| fast(each).owner("a").shutdown_timeout(PATIENCE))
        .start()
        .await
        .unwrap()
}

async fn put(client: &aws_sdk_kinesis::Client, stream: &str, data: &'static str) {
    client
        .put_record()
        .stream_name(stream)
        .partition_key("key")
        .data(aws_sdk_kinesis::primitives::Blob::new(data))
        .send()
        .await
        .unwrap();
}

/// A's first delivery, held; then A read on (acking everything) by a task of its own.
async fn hold_the_first_delivery(
    mut a: MultiSubscription,
) -> (Delivery<Record>, ShutdownHandle, JoinHandle<()>) {
    let held = loop {
        match tokio::time::timeout(PATIENCE, a.next()).await {
            Ok(Some(Ok(d))) => break d,
            Ok(Some(Err(e))) => eprintln!("read error (retried): {e}"),
            other => panic!("expected a delivery, got {other:?}"),
        }
    };
    let stop_a = a.shutdown_handle();
    let reading = tokio::spawn(async move {
        while let Some(item) = a.next().await {
            if let Ok(d) = item {
                d.ack();
            }
        }
    });
    (held, stop_a, reading)
}

/// Deletes the stream and waits until A finds it deleted.
async fn delete_until_a_finds_it_deleted(client: &aws_sdk_kinesis::Client, stream: &str) {
    client
        .delete_stream()
        .stream_name(stream)
        .send()
        .await
        .unwrap();
    support::eventually("A finds the stream deleted", PATIENCE, async || {
        !support::events::events(
            "the stream was deleted: its readers stop and its lease rows are removed",
        )
        .is_empty()
    })
    .await;
}

/// Creates the stream again and starts instance B on it; B's worker row (and the roster row
/// it moved) are the stream created again's.
async fn create_again_and_start_b(
    client: &aws_sdk_kinesis::Client,
    api: &SharedKinesis,
    table: &SharedLeaseStore,
    stream: &str,
) -> Subscription {
    support::create_stream(client, stream, 1).await;
    let b = support::reading::fast(api, table.clone(), stream, "b")
        .initial_position(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    let b_rows = table.list(stream).await.unwrap();
    assert!(
        b_rows
            .iter()
            .any(|r| r.shard_id == "worker:b" && r.owner.as_deref() == Some("b")),
        "B's worker row is there: {b_rows:?}"
    );
    b
}

/// B reads what is put to the stream created again.
async fn b_reads_the_stream_created_again(
    client: &aws_sdk_kinesis::Client,
    stream: &str,
    b: &mut Subscription,
) {
    put(client, stream, "second").await;
    b_reads(b, "second").await;
}

/// B reads the record `data` (acking everything).
async fn b_reads(b: &mut Subscription, data: &str) {
    let read = tokio::time::timeout(PATIENCE, async {
        loop {
            match b.next().await {
                Some(Ok(d)) if d.data() == data.as_bytes() => {
                    d.ack();
                    break;
                }
                Some(Ok(d)) => {
                    d.ack();
                }
                Some(Err(e)) => eprintln!("read error (retried): {e}"),
                None => panic!("B's stream ended"),
            }
        }
    })
    .await;
    assert!(read.is_ok(), "B reads `{data}` of the stream created again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_streams_rows_go_but_not_those_of_the_stream_created_again() {
    support::events::record_events();
    let client = support::kinesis_client();
    let api: SharedKinesis = Arc::new(AwsKinesis::new(client.clone()));
    let stream = support::unique_name("again");
    support::create_stream(&client, &stream, 1).await;
    let table: SharedLeaseStore = Arc::new(support::lease_store("again-leases"));
    let deletes = Arc::new(DeletesOf {
        owner: "b",
        count: AtomicU64::new(0),
    });
    let a_store: SharedLeaseStore = Arc::new(LayeredStore::new(table.clone(), deletes.clone()));
    let a = start_a(&api, a_store, &stream).await;
    put(&client, &stream, "first").await;
    // Held: once A finds the stream deleted, its stop waits for this delivery.
    let (held, stop_a, reading) = hold_the_first_delivery(a).await;
    delete_until_a_finds_it_deleted(&client, &stream).await;
    // Created again, and read by another instance, while A's stop waits.
    let mut b = create_again_and_start_b(&client, &api, &table, &stream).await;
    held.ack();
    support::eventually(
        "A removes the deleted stream's rows",
        PATIENCE,
        async || !support::events::events("removed the deleted stream's lease rows").is_empty(),
    )
    .await;
    assert_eq!(
        deletes.count.load(Ordering::SeqCst),
        0,
        "no row of the stream created again (held by B) was removed"
    );
    b_reads_the_stream_created_again(&client, &stream, &mut b).await;
    tokio::time::timeout(PATIENCE, stop_a.shutdown())
        .await
        .expect("A stops");
    reading.await.unwrap();
    tokio::time::timeout(PATIENCE, b.shutdown())
        .await
        .expect("B stops");
}

/// Fails every listing's read of the table while switched on (the instance's other calls go
/// through): its next listing comes late.
#[derive(Default)]
struct ListingsFail(AtomicBool);

impl LeaseLayer for ListingsFail {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        if !(matches!(call, LeaseCall::List { .. }) && self.0.load(Ordering::SeqCst)) {
            return next;
        }
        Box::pin(async move {
            Err(LeaseError::Unavailable {
                table: "(the test's layer)".into(),
                operation: call.operation(),
                message: "listings fail for now".into(),
                source: None,
            })
        })
    }
}

/// A finds the stream deleted and removes its rows; the stream is created again and written
/// to; B, which reads from the tip and held nothing, lists it only some seconds later. No row
/// tells B that the stream was created again, but B's own last listing does: the shard began
/// elsewhere then. B reads the new shard from its beginning, not from the tip (which would
/// leave out what was written before B's listing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_created_again_after_its_rows_were_removed_is_read_from_its_start() {
    support::events::record_events();
    let client = support::kinesis_client();
    let api: SharedKinesis = Arc::new(AwsKinesis::new(client.clone()));
    let stream = support::unique_name("again-removed");
    support::create_stream(&client, &stream, 1).await;
    let table: SharedLeaseStore = Arc::new(support::lease_store("again-removed-leases"));
    let a = start_a(&api, table.clone(), &stream).await;
    put(&client, &stream, "first").await;
    let (first, stop_a, reading) = hold_the_first_delivery(a).await;
    first.ack();

    // B joins while A holds the only shard.
    let late = Arc::new(ListingsFail::default());
    let b_store: SharedLeaseStore = Arc::new(LayeredStore::new(table.clone(), late.clone()));
    let mut b = support::reading::fast(&api, b_store, &stream, "b")
        .start()
        .await
        .unwrap();
    let rows = table.list(&stream).await.unwrap();
    let shard = rows.iter().find(|r| r.shard_id == "shardId-000000000000");
    assert_eq!(
        shard.and_then(|r| r.owner.as_deref()),
        Some("a"),
        "{rows:?}"
    );

    late.0.store(true, Ordering::SeqCst);
    delete_until_a_finds_it_deleted(&client, &stream).await;
    support::eventually(
        "A removes the deleted stream's rows",
        PATIENCE,
        async || !support::events::events("removed the deleted stream's lease rows").is_empty(),
    )
    .await;
    let rows = table.list(&stream).await.unwrap();
    assert!(
        rows.iter().all(|r| r.shard_id.starts_with("worker:")),
        "{rows:?}"
    );
    tokio::time::timeout(PATIENCE, stop_a.shutdown())
        .await
        .expect("A stops");
    reading.await.unwrap();

    support::create_stream(&client, &stream, 1).await;
    put(&client, &stream, "second").await;
    // Well before B's next listing: the tip it would start at (then, less the clock skew
    // allowance) leaves it out.
    tokio::time::sleep(CLOCK_SKEW_ALLOWANCE + Duration::from_millis(1500)).await;
    late.0.store(false, Ordering::SeqCst);
    b_reads(&mut b, "second").await;
    tokio::time::timeout(PATIENCE, b.shutdown())
        .await
        .expect("B stops");
}
