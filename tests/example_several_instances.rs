//! The several-instances example (`examples/several_instances.rs`, as shown) on the in-memory
//! transport and live on the emulators: both instances end up holding shards, every shipment
//! published is handled at least once and each customer's in order, and once A stops, B holds
//! every shard.

mod support;

#[allow(dead_code)]
mod example {
    include!("../examples/several_instances.rs");
}

use std::sync::Arc;
use std::time::Duration;

use example::{Fleet, INSTANCE_A, INSTANCE_B, Report};
use kinesis_dataflow::broker::{KinesisBroker, KinesisStream};
use kinesis_dataflow::{DynamoLeaseStore, MemoryKinesis, MemoryLeaseStore};

/// The example's subscription with short intervals, so that a hand-off or a release is picked
/// up within a fraction of a second.
fn quick(name: &str) -> KinesisStream {
    example::shipments(name)
        .poll_interval(Duration::from_millis(50))
        .list_interval(Duration::from_millis(200))
        .lease_duration(Duration::from_secs(3))
        .checkpoint_interval(Duration::from_millis(500))
}

/// How long each step of the run may take before it gives up: a hang guard only.
const PATIENCE: Duration = Duration::from_secs(60);

/// What every run must show.
fn assert_report(report: &Report) {
    assert_eq!(report.shards.len(), 4, "{report:#?}");
    assert!(
        !report.balanced.of(INSTANCE_A).is_empty() && !report.balanced.of(INSTANCE_B).is_empty(),
        "both instances hold shards once balanced: {}",
        report.balanced
    );
    assert!(
        report.balanced.unowned.is_empty(),
        "every shard held once balanced: {}",
        report.balanced
    );
    assert_eq!(
        report.after_a_stopped.of(INSTANCE_B),
        report.shards.as_slice(),
        "B holds every shard after A stopped: {}",
        report.after_a_stopped
    );
    assert!(
        report.after_a_stopped.of(INSTANCE_A).is_empty(),
        "A holds nothing after it stopped: {}",
        report.after_a_stopped
    );
    assert!(!report.published.is_empty());
    let audit = report.audit();
    assert!(
        audit.lost.is_empty(),
        "every shipment handled at least once; lost: {:?}",
        audit.lost
    );
    assert!(
        audit.out_of_order.is_empty(),
        "each customer's shipments in order; out of order: {:?}",
        audit.out_of_order
    );
    for instance in [INSTANCE_A, INSTANCE_B] {
        assert!(
            report.handled.iter().any(|h| h.instance == instance),
            "{instance} handled shipments"
        );
    }
}

/// Two brokers on one in-memory Kinesis and one lease store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_shards_in_memory() {
    support::init_tracing();
    let kinesis = MemoryKinesis::new();
    let leases = Arc::new(MemoryLeaseStore::new());
    let broker = || KinesisBroker::in_memory(kinesis.clone()).lease_store(leases.clone());
    let report = example::run(Fleet {
        a: broker(),
        b: broker(),
        producer: KinesisBroker::in_memory(kinesis.clone()),
        leases,
        stream: quick("fleet-shipments"),
        patience: PATIENCE,
    })
    .await
    .expect("the run completes");
    assert_report(&report);
}

/// Two brokers on kinesis-local, with the same application name (so the same DynamoDB lease
/// table on dynalite).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_the_shards_live() {
    support::init_tracing();
    let application = support::unique_name("fleet");
    let broker = || support::live_broker(&application);
    let table = DynamoLeaseStore::default_table_name(&application);
    let leases = DynamoLeaseStore::new(support::dynamodb_client(), table).unwrap();
    let report = example::run(Fleet {
        a: broker(),
        b: broker(),
        producer: broker(),
        leases: Arc::new(leases),
        stream: quick(&support::unique_name("fleet-shipments")),
        patience: PATIENCE,
    })
    .await
    .unwrap_or_else(|e| {
        panic!(
            "the run completes: {e} (logs: {})",
            support::logs_dir().display()
        )
    });
    assert_report(&report);
}
