//! Where a subscription starts, on the in-memory transport under paused time:
//!
//! * positions the service would refuse are refused at `start`, naming their setting;
//! * a position of one record names its stream in a `MultiSubscription`;
//! * a `start_at` naming a shard the stream does not list is refused at `start`, and one that
//!   does not apply at this start is said;
//! * a `start_at` of every shard after a finished split replays the children, not the finished
//!   parent, and says so.

mod support;

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    Delivery, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore, MultiSubscription,
    Record, StartingPoint, StreamSet, SubscriptionBuilder,
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

/// Reads `n` deliveries (acking each) within `within`: their payloads, and the errors seen.
async fn read<S>(sub: &mut S, n: usize, within: Duration) -> (Vec<String>, Vec<String>)
where
    S: Stream<Item = Result<Delivery<Record>, KinesisError>> + Unpin,
{
    let mut got = Vec::new();
    let mut errors = Vec::new();
    let _ = tokio::time::timeout(within, async {
        while got.len() < n {
            match sub.next().await {
                Some(Ok(d)) => {
                    got.push(String::from_utf8_lossy(d.data()).into_owned());
                    d.ack();
                }
                Some(Err(e)) => errors.push(e.to_string()),
                None => break,
            }
        }
    })
    .await;
    (got, errors)
}

/// The checkpoint of `shard` of `stream` in the table.
async fn checkpoint(store: &MemoryLeaseStore, stream: &str, shard: &str) -> Option<Checkpoint> {
    (store.list(stream).await.unwrap().into_iter())
        .find(|row| row.shard_id == shard)
        .and_then(|row| row.checkpoint)
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
            store.list(STREAM).await.unwrap().is_empty(),
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

/// Streams `a` and `b` of one shard each (so both have a shard `shardId-000000000000`), with
/// records `a-0`, `a-1` and `b-0`; the sequence number of `a-0`.
fn two_streams() -> (MemoryKinesis, SharedKinesis, MemoryLeaseStore, String) {
    let memory = MemoryKinesis::new();
    memory.add_stream("a", 1).unwrap();
    memory.add_stream("b", 1).unwrap();
    let seq_a = memory.put("a", "k", "a-0").unwrap().1;
    memory.put("a", "k", "a-1").unwrap();
    memory.put("b", "k", "b-0").unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    (memory, api, MemoryLeaseStore::new(), seq_a)
}

#[tokio::test(start_paused = true)]
async fn a_position_of_one_record_shared_by_every_stream_is_refused_saying_how_to_name_its_stream()
{
    let (_memory, api, store, seq_a) = two_streams();
    let position = KinesisPosition::sequence(SHARD0, seq_a);
    for setting in ["start_at", "initial_position"] {
        let position = position.clone();
        let started = tokio::time::timeout(
            START_WITHIN,
            MultiSubscription::builder(
                api.clone(),
                Arc::new(store.clone()),
                StreamSet::new(["a", "b"]),
            )
            .configure(|each| {
                let each = support::timings::with_fast_timings(each).owner("a");
                match setting {
                    "start_at" => each.start_at(position),
                    _ => each.initial_position(position),
                }
            })
            .start(),
        )
        .await
        .expect("start answers");
        match started {
            Err(KinesisError::InvalidConfig {
                setting: named,
                reason,
                ..
            }) => {
                assert_eq!(named, setting);
                assert!(reason.contains(&format!("{setting}_for")), "{reason}");
            }
            other => panic!("{setting}: expected InvalidConfig, got {other:?}"),
        }
        assert!(
            store.list("b").await.unwrap().is_empty(),
            "no row of stream b was written"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_position_given_for_one_stream_applies_to_that_stream_only() {
    let (memory, api, store, seq_a) = two_streams();
    let mut all =
        MultiSubscription::builder(api, Arc::new(store.clone()), StreamSet::new(["a", "b"]))
            .configure(|each| support::timings::with_fast_timings(each).owner("x"))
            .initial_position_for("a", KinesisPosition::sequence(SHARD0, seq_a.clone()))
            .start()
            .await
            .unwrap();
    memory.put("b", "k", "b-1").unwrap();
    let (mut got, errors) = read(&mut all, 3, Duration::from_secs(20)).await;
    got.sort();
    assert_eq!(
        got,
        ["a-0", "a-1", "b-1"],
        "a from its record, b from the tip"
    );
    assert!(errors.is_empty(), "{errors:?}");
    let b = checkpoint(&store, "b", SHARD0).await;
    assert!(
        !matches!(b, Some(Checkpoint::Initial(StartingPoint::AtSequence(_)))),
        "b's row does not begin at a's record: {b:?}"
    );
    all.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_replay_given_for_a_stream_inserted_later_applies_at_its_start() {
    let (memory, api, store, _) = two_streams();
    memory.add_stream("c", 1).unwrap();
    memory.put("c", "k", "c-0").unwrap();
    let seq_c1 = memory.put("c", "k", "c-1").unwrap().1;
    memory.put("c", "k", "c-2").unwrap();
    let streams = StreamSet::new(["b"]);
    let mut all = MultiSubscription::builder(api, Arc::new(store.clone()), streams.clone())
        .configure(|each| {
            support::timings::with_fast_timings(each)
                .owner("x")
                .start_at(KinesisPosition::horizon())
        })
        .start_at_for("c", KinesisPosition::sequence(SHARD0, seq_c1))
        .start()
        .await
        .unwrap();
    let (got, errors) = read(&mut all, 1, Duration::from_secs(20)).await;
    assert_eq!(got, ["b-0"], "the shared position applies to b");
    streams.insert("c");
    let (got, errors_c) = read(&mut all, 2, Duration::from_secs(20)).await;
    assert_eq!(got, ["c-1", "c-2"], "c from its own record");
    assert!(
        errors.is_empty() && errors_c.is_empty(),
        "{errors:?} {errors_c:?}"
    );
    all.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_position_given_for_one_stream_the_service_would_refuse_is_refused_naming_it() {
    let (_memory, api, store, _) = two_streams();
    let started = tokio::time::timeout(
        START_WITHIN,
        MultiSubscription::builder(api, Arc::new(store.clone()), StreamSet::new(["a", "b"]))
            .configure(|each| support::timings::with_fast_timings(each).owner("x"))
            .start_at_for("b", KinesisPosition::sequence(SHARD0, "4959 "))
            .start(),
    )
    .await
    .expect("start answers");
    match started {
        Err(KinesisError::InvalidConfig { setting, value, .. }) => {
            assert_eq!(setting, "start_at_for");
            assert!(value.starts_with("b: "), "{value}");
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
}

/// What is logged when a position naming one shard does not apply at a start.
const NOT_APPLIED: &str = "a position naming one shard does not apply at this start";

/// The `(setting, shard, why)` of each [`NOT_APPLIED`] line of `owner` so far.
fn not_applied(owner: &str) -> Vec<(String, String, String)> {
    let field = |fields: &support::events::Fields, name: &str| {
        fields.get(name).cloned().unwrap_or_default()
    };
    (support::events::events(NOT_APPLIED).iter())
        .filter(|fields| fields.get("owner").map(String::as_str) == Some(owner))
        .map(|f| (field(f, "setting"), field(f, "shard"), field(f, "why")))
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_replay_of_a_shard_the_stream_does_not_list_is_refused_at_start() {
    let (memory, api, store) = setup(2);
    let seq = memory.put(STREAM, "k", "r-0").unwrap().1;
    // A mistyped shard id: one zero short.
    let typo = KinesisPosition::sequence("shardId-00000000000", seq);
    let started =
        tokio::time::timeout(START_WITHIN, fast(&api, &store, "a").start_at(typo).start())
            .await
            .expect("start answers");
    match started {
        Err(KinesisError::InvalidConfig {
            setting, reason, ..
        }) => {
            assert_eq!(setting, "start_at");
            assert!(
                reason.contains("shardId-00000000000") && reason.contains(SHARD0),
                "names the shard and those listed: {reason}"
            );
        }
        other => panic!("expected InvalidConfig, got {other:?}"),
    }
    let shard_rows: Vec<_> = (store.list(STREAM).await.unwrap().into_iter())
        .filter(|row| !row.shard_id.starts_with("worker:"))
        .collect();
    assert!(
        shard_rows.is_empty(),
        "no shard row created: {shard_rows:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_first_position_of_a_shard_the_stream_does_not_list_is_said() {
    support::events::record_events();
    let (memory, api, store) = setup(1);
    let seq = memory.put(STREAM, "k", "r-0").unwrap().1;
    let typo = KinesisPosition::sequence("shardId-00000000000", seq);
    let mut sub = fast(&api, &store, "initial-typo")
        .initial_position(typo)
        .start()
        .await
        .unwrap();
    assert_eq!(
        not_applied("initial-typo"),
        [(
            "initial_position".to_owned(),
            "shardId-00000000000".to_owned(),
            "the stream does not list it (a mistyped id, or a shard past the retention period)"
                .to_owned()
        )]
    );
    sub.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_replay_of_a_shard_another_instance_holds_is_said_not_to_apply_here() {
    support::events::record_events();
    let (memory, api, store) = setup(1);
    let seq = memory.put(STREAM, "k", "r-0").unwrap().1;
    // Of two instances over one shard, the first in owner order reads it: "held-a" keeps it.
    let mut holder = fast(&api, &store, "held-a").start().await.unwrap();
    let mut late = fast(&api, &store, "held-b")
        .start_at(KinesisPosition::sequence(SHARD0, seq))
        .start()
        .await
        .unwrap();
    assert!(late.shards().is_empty(), "{:?}", late.shards());
    let said = not_applied("held-b");
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(
        (said[0].0.as_str(), said[0].1.as_str()),
        ("start_at", SHARD0)
    );
    assert!(
        said[0].2.contains("not opened by this instance"),
        "{said:?}"
    );
    late.shutdown().await;
    holder.shutdown().await;
}

/// What is logged when `start_at` reaches back before shards that are finished.
const FINISHED_NOT_REPLAYED: &str = "start_at does not read finished shards again: their \
     records are not replayed (the command-line tool's `reset` replays them)";

/// Shard 0 read to its end, split, and its children read by an instance that then stopped:
/// the parent's row says SHARD_END. Returns the payloads written (parent's, children's).
async fn read_through_a_split(
    memory: &MemoryKinesis,
    api: &SharedKinesis,
    store: &MemoryLeaseStore,
) -> (Vec<String>, Vec<String>) {
    let parent = support::reading::write_tagged(memory, STREAM, "p", 0, 3, 3);
    let mut first = fast(api, store, "first")
        .initial_position(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    let (got, _) = read(&mut first, 3, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 3);
    memory
        .split_shard(STREAM, SHARD0, &(u128::MAX / 2).to_string())
        .await
        .unwrap();
    let children = support::reading::write_tagged(memory, STREAM, "c", 0, 3, 3);
    let (got, _) = read(&mut first, 3, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 3);
    first.shutdown().await;
    assert_eq!(
        checkpoint(store, STREAM, SHARD0).await,
        Some(Checkpoint::ShardEnd)
    );
    (parent, children)
}

#[tokio::test(start_paused = true)]
async fn a_replay_from_the_horizon_after_a_finished_split_reads_the_children_and_says_so() {
    support::events::record_events();
    for (owner, position) in [
        ("replay-horizon", KinesisPosition::horizon()),
        ("replay-time", KinesisPosition::timestamp(0)),
    ] {
        let (memory, api, store) = setup(1);
        let (_parent, mut children) = read_through_a_split(&memory, &api, &store).await;
        let mut replay = fast(&api, &store, owner)
            .start_at(position)
            .start()
            .await
            .unwrap();
        // Everything there is, and a little time for more to come (none should).
        let (mut got, errors) = read(&mut replay, 6, Duration::from_secs(10)).await;
        got.sort();
        children.sort();
        assert_eq!(
            got, children,
            "{owner}: the children again, not their finished parent"
        );
        assert!(errors.is_empty(), "{errors:?}");
        let said: Vec<_> = (support::events::events(FINISHED_NOT_REPLAYED).into_iter())
            .filter(|fields| fields.get("owner").map(String::as_str) == Some(owner))
            .collect();
        assert_eq!(said.len(), 1, "{owner}: {said:?}");
        assert_eq!(said[0].get("finished").map(String::as_str), Some("1"));
        assert_eq!(said[0].get("shards").map(String::as_str), Some(SHARD0));
        replay.shutdown().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_replay_of_a_record_of_a_finished_shard_is_said_not_to_happen() {
    support::events::record_events();
    let (memory, api, store) = setup(1);
    let seq = memory.put(STREAM, "k", "p-first").unwrap().1;
    read_through_a_split(&memory, &api, &store).await;
    let mut replay = fast(&api, &store, "replay-record")
        .start_at(KinesisPosition::sequence(SHARD0, seq))
        .start()
        .await
        .unwrap();
    let said = not_applied("replay-record");
    assert_eq!(said.len(), 1, "{said:?}");
    assert_eq!(
        (said[0].0.as_str(), said[0].1.as_str()),
        ("start_at", SHARD0)
    );
    assert!(said[0].2.contains("finished"), "{said:?}");
    replay.shutdown().await;
}
