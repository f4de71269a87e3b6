//! Where a subscription starts, on the in-memory transport under paused time: positions the
//! service would refuse are refused at `start`, naming their setting.

mod support;

use std::sync::Arc;
use std::time::Duration;

use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::{
    KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore, MultiSubscription, StreamSet,
    SubscriptionBuilder,
};

const STREAM: &str = "orders";
const SHARD0: &str = "shardId-000000000000";

/// The longest a `start` may take here (paused time: only a hang would reach it).
const START_WITHIN: Duration = Duration::from_secs(60);

fn setup(shards: u32) -> (MemoryKinesis, SharedKinesis, MemoryLeaseStore) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, shards).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    (memory, api, MemoryLeaseStore::new())
}

fn fast(api: &SharedKinesis, store: &MemoryLeaseStore, owner: &str) -> SubscriptionBuilder {
    support::reading::fast(api, Arc::new(store.clone()), STREAM, owner)
}

/// The setting an `InvalidConfig` names, or a panic saying what came instead.
fn refused_setting<T: std::fmt::Debug>(started: Result<T, KinesisError>) -> &'static str {
    match started {
        Err(KinesisError::InvalidConfig { setting, .. }) => setting,
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

/// Sequence numbers and shard ids the service refuses: a sequence number is `0` or 1 to 129
/// digits without a leading zero, a shard id 1 to 128 letters, digits, `_`, `.` or `-`.
fn malformed() -> Vec<KinesisPosition> {
    let mut positions: Vec<KinesisPosition> = ["4959 ", "", "49x5", "0123", " 4959", "-1"]
        .into_iter()
        .map(|seq| KinesisPosition::sequence(SHARD0, seq))
        .collect();
    positions.push(KinesisPosition::sequence(SHARD0, "1".repeat(130)));
    positions.push(KinesisPosition::sub_sequence(SHARD0, "4959 ", 2));
    positions.push(KinesisPosition::sequence("", "4959"));
    positions.push(KinesisPosition::sequence("shardId-000000000000 ", "4959"));
    positions.push(KinesisPosition::sequence("s".repeat(129), "4959"));
    positions
}

#[tokio::test(start_paused = true)]
async fn a_position_the_service_would_refuse_is_refused_at_start_naming_its_setting() {
    let (_memory, api, store) = setup(2);
    for position in malformed() {
        let started = tokio::time::timeout(
            START_WITHIN,
            fast(&api, &store, "a").start_at(position.clone()).start(),
        )
        .await
        .expect("start answers");
        assert_eq!(refused_setting(started), "start_at", "{position:?}");
        let started = tokio::time::timeout(
            START_WITHIN,
            fast(&api, &store, "a")
                .initial_position(position.clone())
                .start(),
        )
        .await
        .expect("start answers");
        assert_eq!(refused_setting(started), "initial_position", "{position:?}");
        // Before any call: the table holds nothing of the stream.
        assert!(
            kinesis_dataflow::lease::LeaseStore::list(&store, STREAM)
                .await
                .unwrap()
                .is_empty(),
            "{position:?}: nothing written"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_multi_stream_subscription_refuses_a_malformed_position_naming_its_setting() {
    let (memory, api, store) = setup(1);
    memory.add_stream("payments", 1).unwrap();
    let position = KinesisPosition::sequence(SHARD0, "4959 ");
    let started = tokio::time::timeout(
        START_WITHIN,
        MultiSubscription::builder(
            api.clone(),
            Arc::new(store.clone()),
            StreamSet::new([STREAM, "payments"]),
        )
        .configure(|each| {
            support::timings::with_fast_timings(each)
                .owner("a")
                .start_at(position)
        })
        .start(),
    )
    .await
    .expect("start answers");
    assert_eq!(refused_setting(started), "start_at");
}
