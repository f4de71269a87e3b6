//! The in-process mode: `TestApp::start(service(KinesisBroker::new()))` with no server, and
//! the framework's conformance suites on the production broker's in-process transport.

mod support;

#[allow(dead_code)]
mod example {
    include!("../examples/kinesis_subscriptions_shards.rs");

    /// The example's `service`, as the spec shows it (private there).
    pub fn app(broker: KinesisBroker) -> RustStream {
        service(broker)
    }
}

use std::time::Duration;

use kinesis_dataflow::MemoryKinesis;
use kinesis_dataflow::api::KinesisApi;
use kinesis_dataflow::broker::{KinesisBroker, KinesisStream};
use ruststream::conformance::harness::{self, InProcessBroker};
use ruststream::runtime::{AppInfo, HandlerOutcome, RustStream};
use ruststream::subscriber;
use ruststream::testing::TestApp;
use serde::{Deserialize, Serialize};
use support::suites;

fn in_process() -> InProcessBroker<KinesisBroker> {
    InProcessBroker::new(KinesisBroker::new())
}

#[derive(Debug, Serialize, Deserialize, PartialEq, Clone)]
struct Shipment {
    customer: String,
    seq: u64,
}

fn shipment(customer: &str, seq: u64) -> Shipment {
    Shipment {
        customer: customer.to_owned(),
        seq,
    }
}

#[tokio::test(start_paused = true)]
async fn the_shards_example_runs_in_process_with_one_shard_and_every_record_in_order() {
    let kinesis = MemoryKinesis::new();
    let tb = TestApp::start(example::app(KinesisBroker::in_memory(kinesis.clone())))
        .await
        .expect("the app starts in process");
    let sent: Vec<Shipment> = (1..=3)
        .flat_map(|seq| [shipment("ada", seq), shipment("bob", seq)])
        .collect();
    for s in &sent {
        tb.broker::<KinesisBroker>()
            .publish("shipments", s)
            .await
            .expect("the publish reaches the handler and settles");
    }
    let broker = tb.broker::<KinesisBroker>();
    let handled = broker.subscriber("shipments");
    assert_eq!(
        handled.received::<Shipment>(),
        sent,
        "one shard: every record in publish order"
    );
    handled
        .assert_called(sent.len())
        .settled(HandlerOutcome::ack());
    // `create_if_missing(2)` made one shard in process.
    let summary = kinesis.describe_stream_summary("shipments").await.unwrap();
    assert_eq!(summary.open_shard_count, 1);
    tb.shutdown().await.expect("shuts down");
}

static RETRIED_ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Sends shipment 1 back for 30 s the first time it sees it.
#[subscriber(KinesisStream::new("retried").create_if_missing(1))]
async fn retried(shipment: &Shipment) -> HandlerOutcome {
    if shipment.seq == 1 && first_time(&RETRIED_ONCE) {
        HandlerOutcome::retry_after(Duration::from_secs(30))
    } else {
        HandlerOutcome::ack()
    }
}

#[tokio::test(start_paused = true)]
async fn a_delayed_retry_waits_for_the_clock_and_holds_back_the_records_after_it() {
    let app =
        RustStream::new(AppInfo::new("retries", "0.1.0")).with_broker(KinesisBroker::new(), |b| {
            b.include(retried);
        });
    let tb = TestApp::start(app).await.expect("starts");
    let broker = tb.broker::<KinesisBroker>();
    let seqs = || -> Vec<u64> {
        broker
            .subscriber("retried")
            .received::<Shipment>()
            .iter()
            .map(|s| s.seq)
            .collect()
    };
    broker
        .publish("retried", &shipment("ada", 1))
        .await
        .unwrap();
    assert_eq!(seqs(), [1], "the retry waits for its 30 s");

    // Shipment 2 comes after shipment 1 on the shard, so it is delivered only after the retry:
    // the publish returns once the clock passed the 30 s (longer than a live lease's give-up
    // time, which in process does not apply).
    let before = tokio::time::Instant::now();
    broker
        .publish("retried", &shipment("ada", 2))
        .await
        .unwrap();
    assert!(before.elapsed() >= Duration::from_secs(29));
    assert_eq!(
        seqs(),
        [1, 1, 2],
        "the retry, then the record held behind it"
    );
    tb.shutdown().await.unwrap();
}

/// Never handles shipment 1 (a poison record); acks the others.
#[subscriber(KinesisStream::new("poisoned").create_if_missing(1))]
async fn poisoned(shipment: &Shipment) -> HandlerOutcome {
    if shipment.seq == 1 {
        HandlerOutcome::retry()
    } else {
        HandlerOutcome::ack()
    }
}

/// Reads the dead letters of `poisoned`.
#[subscriber(KinesisStream::new("poisoned-dead").create_if_missing(1))]
async fn undeliverable(shipment: &Shipment) -> HandlerOutcome {
    let _ = shipment;
    HandlerOutcome::ack()
}

#[tokio::test(start_paused = true)]
async fn a_poison_record_goes_to_the_dead_letter_stream_after_its_attempts_and_its_key_goes_on() {
    let app =
        RustStream::new(AppInfo::new("poison", "0.1.0")).with_broker(KinesisBroker::new(), |b| {
            b.include(undeliverable);
            b.include(poisoned)
                .max_attempts(ruststream::nonzero!(3u32))
                .dead_letter("poisoned-dead");
        });
    let tb = TestApp::start(app).await.expect("starts");
    let broker = tb.broker::<KinesisBroker>();
    broker
        .publish("poisoned", &shipment("ada", 1))
        .await
        .unwrap();
    broker
        .publish("poisoned", &shipment("ada", 2))
        .await
        .unwrap();
    let seqs = |name: &str| -> Vec<u64> {
        broker
            .subscriber(name)
            .received::<Shipment>()
            .iter()
            .map(|s| s.seq)
            .collect()
    };
    for _ in 0..100 {
        if seqs("poisoned-dead") == [1] && seqs("poisoned").len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        seqs("poisoned"),
        [1, 1, 1, 2],
        "three attempts, then the key's next record"
    );
    assert_eq!(seqs("poisoned-dead"), [1], "the spent record, once");
    tb.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_subscription_of_a_stream_on_one_connection_is_refused() {
    use ruststream::Subscribe;
    let connected = ruststream::testing::InProcess::connect_in_process(
        KinesisBroker::new().create_missing_streams(1),
    )
    .await
    .unwrap();
    let first = connected.subscribe("twice").await.unwrap();
    let second = connected.subscribe("twice").await;
    assert!(
        matches!(
            second,
            Err(kinesis_dataflow::KinesisError::AlreadySubscribed { ref stream }) if stream == "twice"
        ),
        "{second:?}"
    );
    drop(first);
    connected
        .subscribe("twice")
        .await
        .expect("open again once the first is dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_suite_in_process() {
    harness::run_suite(|| KinesisBroker::new().create_missing_streams(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_in_process() {
    suites::lifecycle_suite(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_handle_closes_in_process() {
    suites::shared_handle_closes(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_flushes_in_process() {
    suites::shutdown_flushes(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settlement_in_process() {
    suites::settlement_suite(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_moves_in_process() {
    suites::broker_moves(
        in_process(),
        InProcessBroker::new(KinesisBroker::new().create_missing_streams(1)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_order_in_process() {
    suites::keyed_order(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_options_in_process() {
    suites::publish_options(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_in_process() {
    suites::batches(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeking_in_process() {
    suites::seeking(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_seeking_in_process() {
    suites::batch_seeking(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeking_unknown_position_in_process() {
    suites::seeking_unknown_position(in_process()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_keeps_track_only_of_the_subscriptions_still_running() {
    use ruststream::{ConnectedBroker, Subscribe};
    let connected = ruststream::testing::InProcess::connect_in_process(
        KinesisBroker::new().create_missing_streams(1),
    )
    .await
    .unwrap();
    // Each one is dropped, and stopped before the next one opens.
    for _ in 0..3 {
        drop(connected.subscribe("churn").await.unwrap());
    }
    let live = connected.subscribe("churn").await.unwrap();
    let closed = connected.shutdown().await.unwrap();
    assert_eq!(
        (
            closed.subscriptions_stopped,
            closed.subscriptions_unfinished
        ),
        (1, 0),
        "only the running subscription is left to stop"
    );
    drop(live);
}

/// True the first time it is asked about `flag`.
fn first_time(flag: &std::sync::atomic::AtomicBool) -> bool {
    !flag.swap(true, std::sync::atomic::Ordering::SeqCst)
}

static FLAKY_PANICS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Panics once on shipment 1; its failure policy retries it.
#[subscriber(
    KinesisStream::new("flaky").create_if_missing(1),
    on_failure(panic = retry)
)]
async fn flaky(shipment: &Shipment) -> HandlerOutcome {
    if shipment.seq == 1 && first_time(&FLAKY_PANICS) {
        panic!("shipment 1 fails once");
    }
    HandlerOutcome::ack()
}

#[tokio::test(start_paused = true)]
async fn a_panicking_handler_is_settled_by_its_failure_policy_and_the_shard_goes_on() {
    let app =
        RustStream::new(AppInfo::new("flaky", "0.1.0")).with_broker(KinesisBroker::new(), |b| {
            b.include(flaky);
        });
    let tb = TestApp::start(app).await.unwrap();
    let broker = tb.broker::<KinesisBroker>();
    broker.publish("flaky", &shipment("ada", 1)).await.unwrap();
    broker.publish("flaky", &shipment("ada", 2)).await.unwrap();
    let seqs: Vec<u64> = broker
        .subscriber("flaky")
        .received::<Shipment>()
        .iter()
        .map(|s| s.seq)
        .collect();
    assert_eq!(
        seqs,
        [1, 1, 2],
        "retried after the panic, then the next one"
    );
    assert!(tb.run_result().is_ok(), "the service keeps running");
    tb.shutdown().await.unwrap();
}

static FRAGILE_PANICS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Panics once on shipment 1, under the framework's default policy for a panic (fail fast).
#[subscriber(KinesisStream::new("fragile").create_if_missing(1))]
async fn fragile(shipment: &Shipment) -> HandlerOutcome {
    if shipment.seq == 1 && first_time(&FRAGILE_PANICS) {
        panic!("shipment 1 fails once");
    }
    HandlerOutcome::ack()
}

fn fragile_app(broker: KinesisBroker) -> RustStream {
    RustStream::new(AppInfo::new("fragile", "0.1.0")).with_broker(broker, |b| {
        b.include(fragile);
    })
}

#[tokio::test(start_paused = true)]
async fn a_fail_fast_panic_stops_the_service_and_the_restarted_one_handles_the_record() {
    // Clones of one broker share the in-process world: the restart finds the lease table.
    let broker = KinesisBroker::new();
    let tb = TestApp::start(fragile_app(broker.clone())).await.unwrap();
    let _ = tb
        .broker::<KinesisBroker>()
        .publish("fragile", &shipment("ada", 1))
        .await;
    assert!(tb.run_result().is_err(), "the panic tore the service down");
    let _ = tb.shutdown().await;

    // The panicking record was never settled: the restarted service reads it again, before
    // what comes after it.
    let tb = TestApp::start(fragile_app(broker)).await.unwrap();
    tb.broker::<KinesisBroker>()
        .publish("fragile", &shipment("ada", 2))
        .await
        .unwrap();
    let seqs: Vec<u64> = tb
        .broker::<KinesisBroker>()
        .subscriber("fragile")
        .received::<Shipment>()
        .iter()
        .map(|s| s.seq)
        .collect();
    assert_eq!(seqs, [1, 2]);
    tb.shutdown().await.unwrap();
}

/// A shipment passed on to another stream.
#[derive(Debug, Serialize, Deserialize, PartialEq, Clone, ruststream::Outgoing)]
#[outgoing(name = "forwarded")]
struct Forward {
    customer: String,
    seq: u64,
}

#[derive(ruststream::OutSlot)]
#[publishes(Forward)]
struct Forwarded;

/// Passes each shipment on through an `Out` slot whose key is fixed at the mount site.
#[subscriber(KinesisStream::new("inbound").create_if_missing(1))]
async fn forward(
    shipment: &Shipment,
    ruststream::runtime::Out(out): ruststream::runtime::Out<
        impl ruststream::Publisher<Options = kinesis_dataflow::broker::KinesisOptions>,
        Forwarded,
    >,
) -> HandlerOutcome {
    let next = Forward {
        customer: shipment.customer.clone(),
        seq: shipment.seq,
    };
    match out.message(&next).publish().await {
        Ok(()) => HandlerOutcome::ack(),
        Err(_) => HandlerOutcome::retry(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_handler_publishes_through_an_out_slot_with_the_key_fixed_at_the_mount_site() {
    use kinesis_dataflow::broker::{KinesisPublish, KinesisPublishSettings};
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("forwarded", 1).unwrap();
    let app = RustStream::new(AppInfo::new("forwarding", "0.1.0")).with_broker(
        KinesisBroker::in_memory(kinesis.clone()),
        |b| {
            b.include(forward)
                .out(Forwarded, KinesisPublish::default())
                .fixed_partition_key("forwarded-key")
                .build();
        },
    );
    let tb = TestApp::start(app)
        .await
        .expect("an Out-slot handler mounts on a Kinesis stream");
    tb.broker::<KinesisBroker>()
        .publish("inbound", &shipment("ada", 1))
        .await
        .unwrap();
    tb.broker::<KinesisBroker>()
        .published::<Forward>("forwarded")
        .assert_called_once()
        .with(&Forward {
            customer: "ada".into(),
            seq: 1,
        });
    let stored = kinesis
        .records("forwarded", "shardId-000000000000")
        .unwrap();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].partition_key(), "forwarded-key");
    tb.shutdown().await.unwrap();
}

static DECODED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

#[subscriber(KinesisStream::new("mixed").create_if_missing(1))]
async fn decode_shipments(shipment: &Shipment) -> HandlerOutcome {
    DECODED.lock().unwrap().push(shipment.seq);
    HandlerOutcome::ack()
}

/// A body that does not decode is skipped by the framework's default decode policy (drop),
/// logged with its stream, shard and sequence number next to the decode error, and the records
/// after it are handled: the shard is not wedged.
#[tokio::test(start_paused = true)]
async fn a_body_that_does_not_decode_is_skipped_and_the_shard_goes_on() {
    let kinesis = MemoryKinesis::new();
    let app = RustStream::new(AppInfo::new("mixed", "0.1.0")).with_broker(
        KinesisBroker::in_memory(kinesis.clone()),
        |b| {
            b.include(decode_shipments);
        },
    );
    let tb = TestApp::start(app).await.unwrap();
    let broker = tb.broker::<KinesisBroker>();
    broker.publish("mixed", &"not a shipment").await.unwrap();
    broker.subscriber("mixed").assert_last_failed_to_decode();
    broker.publish("mixed", &shipment("ada", 2)).await.unwrap();
    assert_eq!(*DECODED.lock().unwrap(), [2], "the next record is handled");
    tb.shutdown().await.unwrap();
    let stored = kinesis.records("mixed", "shardId-000000000000").unwrap();
    assert_eq!(stored.len(), 2, "both records were written");
}

static LABELED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

#[subscriber(KinesisStream::new("labeled").create_if_missing(1))]
async fn labeled_shipments(shipment: &Shipment) {
    LABELED.lock().unwrap().push(shipment.seq);
}

/// The broker describes its server, so a service can register it under a label (the name of
/// its AsyncAPI server); the labeled broker runs like any other.
#[tokio::test(start_paused = true)]
async fn a_broker_registered_under_a_label_describes_its_server_and_runs() {
    let kinesis = MemoryKinesis::new();
    let app = RustStream::new(AppInfo::new("labeled", "0.1.0")).with_broker_labeled(
        "orders-stream",
        KinesisBroker::in_memory(kinesis.clone()),
        |b| {
            b.include(labeled_shipments);
        },
    );
    let server = &app.servers()["orders-stream"];
    assert_eq!(server.protocol, "kinesis");
    assert_eq!(server.host, None, "the in-memory transport has no host");
    let tb = TestApp::start(app).await.unwrap();
    let broker = tb.broker::<KinesisBroker>();
    broker
        .publish("labeled", &shipment("ada", 7))
        .await
        .unwrap();
    assert_eq!(*LABELED.lock().unwrap(), [7]);
    tb.shutdown().await.unwrap();
}

static SEEKS_ONCE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// On shipment 1, the first time: seeks to the tip, then sends the record back.
#[subscriber(KinesisStream::new("seeking").create_if_missing(1))]
async fn seeks_then_retries(
    shipment: &Shipment,
    ctx: &mut ruststream::runtime::Context<'_, kinesis_dataflow::broker::KinesisContext>,
) -> HandlerOutcome {
    if shipment.seq == 1 && first_time(&SEEKS_ONCE) {
        let seeker = ctx.context(kinesis_dataflow::broker::SeekHandle).clone();
        ruststream::Seeker::seek(&seeker, kinesis_dataflow::KinesisPosition::latest())
            .await
            .expect("the seek is taken");
        HandlerOutcome::retry()
    } else {
        HandlerOutcome::ack()
    }
}

/// A record sent back after a seek moved past it is not read again, so the test harness must
/// not wait for its redelivery: the publish returns.
#[tokio::test(start_paused = true)]
async fn a_send_back_after_a_seek_does_not_hold_the_publish() {
    let app =
        RustStream::new(AppInfo::new("seeking", "0.1.0")).with_broker(KinesisBroker::new(), |b| {
            b.include(seeks_then_retries);
        });
    let tb = TestApp::start(app).await.expect("starts");
    let broker = tb.broker::<KinesisBroker>();
    tokio::time::timeout(
        Duration::from_secs(600),
        broker.publish("seeking", &shipment("ada", 1)),
    )
    .await
    .expect("the publish returns: nothing is owed after the seek")
    .unwrap();
    let seqs: Vec<u64> = broker
        .subscriber("seeking")
        .received::<Shipment>()
        .iter()
        .map(|s| s.seq)
        .collect();
    assert_eq!(seqs, [1], "the seek moved past the record sent back");
    tb.shutdown().await.unwrap();
}

/// Never handles any shipment: one attempt, then the dead letters.
#[subscriber(KinesisStream::new("spent").create_if_missing(1))]
async fn spent_at_once(shipment: &Shipment) -> HandlerOutcome {
    let _ = shipment;
    HandlerOutcome::retry()
}

#[tokio::test(start_paused = true)]
async fn a_publish_returns_once_the_spent_records_dead_letter_is_written() {
    let kinesis = MemoryKinesis::new();
    let app = RustStream::new(AppInfo::new("spent", "0.1.0")).with_broker(
        KinesisBroker::in_memory(kinesis.clone()),
        |b| {
            b.include(spent_at_once)
                .max_attempts(ruststream::nonzero!(1u32))
                .dead_letter("spent-dead");
        },
    );
    let tb = TestApp::start(app).await.expect("starts");
    let broker = tb.broker::<KinesisBroker>();
    broker.publish("spent", &shipment("ada", 1)).await.unwrap();
    let iterator = kinesis
        .get_shard_iterator(
            "spent-dead",
            "shardId-000000000000",
            &kinesis_dataflow::StartingPoint::TrimHorizon,
        )
        .await
        .unwrap();
    let shard: std::sync::Arc<str> = "shardId-000000000000".into();
    let stored = kinesis
        .get_records("spent-dead", &shard, iterator, 100)
        .await
        .unwrap();
    assert_eq!(
        stored.records.len(),
        1,
        "the dead letter is stored when the publish returns"
    );
    tb.shutdown().await.unwrap();
}

/// A shipment passed on, packed with others into a KPL aggregate.
#[derive(Debug, Serialize, Deserialize, PartialEq, Clone, ruststream::Outgoing)]
#[outgoing(name = "packed")]
struct PackedShipment {
    customer: String,
    seq: u64,
}

#[derive(ruststream::OutSlot)]
#[publishes(PackedShipment)]
struct Packed;

/// Passes each shipment on as three, published at once through an aggregating `Out` slot, so
/// they are stored as one KPL aggregate.
#[subscriber(KinesisStream::new("to-pack").create_if_missing(1))]
async fn pack_three(
    shipment: &Shipment,
    ruststream::runtime::Out(out): ruststream::runtime::Out<
        impl ruststream::Publisher<Options = kinesis_dataflow::broker::KinesisOptions>,
        Packed,
    >,
) -> HandlerOutcome {
    let three: Vec<PackedShipment> = (0..3)
        .map(|i| PackedShipment {
            customer: shipment.customer.clone(),
            seq: shipment.seq * 10 + i,
        })
        .collect();
    let sent = futures::future::join_all(three.iter().map(|s| out.message(s).publish())).await;
    if sent.iter().all(Result::is_ok) {
        HandlerOutcome::ack()
    } else {
        HandlerOutcome::retry()
    }
}

static UNPACKED: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// Handles the user records of the aggregates, slowly, one at a time.
#[subscriber(KinesisStream::new("packed").create_if_missing(1).deaggregate(true))]
async fn unpacked(shipment: &PackedShipment) -> HandlerOutcome {
    tokio::time::sleep(Duration::from_millis(100)).await;
    UNPACKED.lock().unwrap().push(shipment.seq);
    HandlerOutcome::ack()
}

/// A KPL aggregate counts for the harness as its user records, each delivered on its own to a
/// de-aggregating subscriber: the publish returns once every one of them is handled, and
/// `published` lists them one by one.
#[tokio::test(start_paused = true)]
async fn an_aggregates_user_records_are_each_counted_and_listed() {
    use kinesis_dataflow::broker::KinesisPublish;
    use kinesis_dataflow::publish::{Aggregate, Collect};
    let kinesis = MemoryKinesis::new();
    let app = RustStream::new(AppInfo::new("packing", "0.1.0")).with_broker(
        KinesisBroker::in_memory(kinesis.clone()),
        |b| {
            b.include(pack_three)
                .out(
                    Packed,
                    KinesisPublish::default()
                        .collect(Collect::default().linger(Duration::from_millis(50)))
                        .aggregate(Aggregate::default()),
                )
                .build();
            b.include(unpacked);
        },
    );
    let tb = TestApp::start(app).await.expect("starts");
    let broker = tb.broker::<KinesisBroker>();
    broker
        .publish("to-pack", &shipment("ada", 1))
        .await
        .unwrap();
    let stored = kinesis.records("packed", "shardId-000000000000").unwrap();
    assert_eq!(stored.len(), 1, "the three are stored as one aggregate");
    assert_eq!(
        *UNPACKED.lock().unwrap(),
        [10, 11, 12],
        "the publish returned once every user record was handled"
    );
    let listed: Vec<u64> = broker
        .published::<PackedShipment>("packed")
        .decoded()
        .iter()
        .map(|s| s.seq)
        .collect();
    assert_eq!(listed, [10, 11, 12], "published lists the user records");
    tb.shutdown().await.unwrap();
}

static SKIPPING: std::sync::Mutex<Vec<u64>> = std::sync::Mutex::new(Vec::new());

/// Does not de-aggregate: an aggregate is skipped.
#[subscriber(KinesisStream::new("packed-skipped").create_if_missing(1))]
async fn skips_aggregates(shipment: &PackedShipment) -> HandlerOutcome {
    SKIPPING.lock().unwrap().push(shipment.seq);
    HandlerOutcome::ack()
}

/// A subscriber that does not de-aggregate skips an aggregate: the harness does not wait for a
/// delivery of it, and the plain record after it is handled.
#[tokio::test(start_paused = true)]
async fn an_aggregate_a_subscriber_skips_is_not_waited_for() {
    let kinesis = MemoryKinesis::new();
    let app = RustStream::new(AppInfo::new("skipping", "0.1.0")).with_broker(
        KinesisBroker::in_memory(kinesis.clone()),
        |b| {
            b.include(skips_aggregates);
        },
    );
    let tb = TestApp::start(app).await.expect("starts");
    let broker = tb.broker::<KinesisBroker>();
    let body = |seq: u64| {
        serde_json::to_vec(&PackedShipment {
            customer: "ada".into(),
            seq,
        })
        .unwrap()
    };
    let (one, two) = (body(1), body(2));
    let packed = kinesis_dataflow::kpl::aggregate([("k", None, &one[..]), ("k", None, &two[..])]);
    kinesis.put("packed-skipped", "k", packed).unwrap();
    tokio::time::timeout(
        Duration::from_secs(600),
        broker.publish(
            "packed-skipped",
            &PackedShipment {
                customer: "ada".into(),
                seq: 3,
            },
        ),
    )
    .await
    .expect("the publish returns: the skipped aggregate is owed nothing")
    .unwrap();
    assert_eq!(*SKIPPING.lock().unwrap(), [3]);
    tb.shutdown().await.unwrap();
}
