//! The reset's takes racing an instance, in memory under paused time: a real subscription on
//! [`MemoryKinesis`](kinesis_dataflow::MemoryKinesis) and the reset's own steps on the same
//! [`MemoryLeaseStore`](kinesis_dataflow::MemoryLeaseStore).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{Lease, LeaseError, LeaseFuture, LeaseRow, LeaseStore};
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    KinesisPosition, MemoryKinesis, MemoryLeaseStore, ReadSettings, StartingPoint, Subscription,
    SubscriptionBuilder,
};
use kinesis_dataflow_test_support::read_until;
use serde_json::json;

use super::apply::apply;
use super::plan::{Plan, Reading, plan, with_rows};
use super::report::{EARLIER_STREAM_ROW, add_outcome, from_text, plan_json};
use crate::args::{Position, ResetArgs, Target};
use crate::aws::Shard;
use crate::time;

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";
/// The instances' lease duration, which the reset is told.
const LEASE: Duration = Duration::from_secs(3);
/// Long enough for anything asked of an instance here, in paused time.
const PATIENCE: Duration = Duration::from_secs(60);

/// A one-shard stream with `first-00..04` in it, and an empty lease store.
fn one_shard() -> (MemoryKinesis, SharedKinesis, MemoryLeaseStore) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    put(&memory, "first", 5);
    let api: SharedKinesis = Arc::new(memory.clone());
    (memory, api, MemoryLeaseStore::new())
}

/// Puts `tag-00..count` on the one shard; their payloads.
fn put(memory: &MemoryKinesis, tag: &str, count: usize) -> BTreeSet<String> {
    (0..count)
        .map(|i| {
            let payload = format!("{tag}-{i:02}");
            memory.put(STREAM, "key", payload.clone()).unwrap();
            payload
        })
        .collect()
}

/// An instance that lists, renews and checkpoints quickly, from the oldest record.
fn instance(api: &SharedKinesis, store: &MemoryLeaseStore, owner: &str) -> SubscriptionBuilder {
    Subscription::builder(api.clone(), Arc::new(store.clone()), STREAM)
        .owner(owner)
        .read_settings(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(100))
                .unlimited_reads(),
        )
        .list_interval(Duration::from_millis(300))
        .lease_duration(LEASE)
        .checkpoint_interval(Duration::from_millis(100))
        .shutdown_timeout(Duration::from_secs(2))
        .initial_position(KinesisPosition::horizon())
}

/// The shard's row as `store` has it now.
async fn row(store: &dyn LeaseStore) -> Lease {
    let ids = [SHARD.to_owned()];
    store.get(STREAM, &ids).await.unwrap().remove(0)
}

/// Waits until `owner` holds the shard's lease.
async fn held_by(store: &dyn LeaseStore, owner: &str) {
    let waited = tokio::time::timeout(PATIENCE, async {
        while row(store).await.owner.as_deref() != Some(owner) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "`{owner}` never took the lease");
}

/// `reset --to horizon` (with `--force` or not) as planned from the table as it is now.
async fn horizon_plan(store: &dyn LeaseStore, force: bool) -> (ResetArgs, Plan) {
    horizon_plan_listing(store, None, force).await
}

/// [`horizon_plan`] with the shard listed as beginning at `listed_start` (default: where
/// its row says it begins).
async fn horizon_plan_listing(
    store: &dyn LeaseStore,
    listed_start: Option<&str>,
    force: bool,
) -> (ResetArgs, Plan) {
    let args = ResetArgs {
        target: Target {
            table: "leases".into(),
            stream: STREAM.into(),
        },
        to: Position::Horizon,
        shards: vec![],
        dry_run: false,
        force,
        lease_duration_ms: u64::try_from(LEASE.as_millis()).unwrap(),
        json: true,
    };
    let row = row(store).await;
    let shard = Shard {
        id: SHARD.into(),
        parents: vec![],
        starting_sequence_number: listed_start
            .map(str::to_owned)
            .or_else(|| row.starting_sequence_number.clone())
            .unwrap(),
        ending_sequence_number: None,
    };
    let rows = vec![LeaseRow {
        lease: row,
        last_written_ms: None,
    }];
    let reading = Reading::new(vec![shard], rows, time::now_ms());
    let (with_rows, skipped) = with_rows(&args, &reading).unwrap();
    let latest = StartingPoint::since(SystemTime::now());
    let plan = plan(&args, &reading, with_rows, skipped, &latest).unwrap();
    (args, plan)
}

/// The lease is free when the reset reads the table; an instance takes it before the
/// reset's take. A forced reset takes it from that instance, and must hold it until the
/// instance has stopped reading (as for a lease held when read): released at once, the
/// instance's reader, which has not yet found the lease gone, would go on reading from
/// its old position beside the reader taking the free lease.
#[tokio::test(start_paused = true)]
async fn a_forced_reset_holds_a_lease_an_instance_took_after_the_reading() {
    let (memory, api, store) = one_shard();
    let (args, plan) = horizon_plan_after_a_first_reader(&api, &store, true).await;
    assert_eq!(plan.changes[0].row.lease.owner, None, "read free");
    let mut b = instance(&api, &store, "b").start().await.unwrap();
    held_by(&store, "b").await;
    apply(&store, &args, &plan.changes).await.result().unwrap();

    // What arrives now may only be read after the shard is read again from the horizon.
    let mut all = first_records();
    all.extend(put(&memory, "late", 1));
    let got = read_until(&mut b, &all, "everything again", PATIENCE).await;
    assert_eq!(
        got.first().map(|(_, payload)| payload.as_str()),
        Some("first-00"),
        "read again from the horizon first, nothing from the old position: {got:?}"
    );
    b.shutdown().await;
}

/// The same race without `--force`: refused (exit status 3), nothing written, the lease
/// left with the instance.
#[tokio::test(start_paused = true)]
async fn a_reset_without_force_is_refused_when_an_instance_took_the_lease_meanwhile() {
    let (_memory, api, store) = one_shard();
    let (args, plan) = horizon_plan_after_a_first_reader(&api, &store, false).await;
    let mut b = instance(&api, &store, "b").start().await.unwrap();
    held_by(&store, "b").await;
    let before = row(&store).await.checkpoint;
    let refused = apply(&store, &args, &plan.changes)
        .await
        .result()
        .unwrap_err();
    assert_eq!(refused.code, 3, "{}", refused.message);
    assert!(
        refused.message.contains("`b`") && refused.message.contains("no checkpoint was changed"),
        "{}",
        refused.message
    );
    let after = row(&store).await;
    assert_eq!(
        (after.owner.as_deref(), after.checkpoint),
        (Some("b"), before)
    );
    b.shutdown().await;
}

/// The payloads [`one_shard`] puts.
fn first_records() -> BTreeSet<String> {
    (0..5).map(|i| format!("first-{i:02}")).collect()
}

/// A first instance reads the five records and stops gracefully (the lease free, settled
/// at the last record); then the plan of a reset to the horizon, read from the table.
async fn horizon_plan_after_a_first_reader(
    api: &SharedKinesis,
    store: &MemoryLeaseStore,
    force: bool,
) -> (ResetArgs, Plan) {
    let mut first = instance(api, store, "first").start().await.unwrap();
    read_until(&mut first, &first_records(), "the first records", PATIENCE).await;
    first.shutdown().await;
    horizon_plan(store, force).await
}

/// Applies the reset's first take, then answers as a timeout would: the take's outcome is
/// unknown to the reset.
struct FirstTakeUnanswered(std::sync::atomic::AtomicBool);

impl LeaseLayer for FirstTakeUnanswered {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let LeaseCall::Take { lease, .. } = call else {
            return next;
        };
        if self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return next;
        }
        Box::pin(async move {
            next.await?;
            Err(LeaseError::Unavailable {
                table: "leases".into(),
                operation: call.operation(),
                message: format!("no answer for `{}`", lease.shard_id),
                source: None,
            })
        })
    }
}

/// The reset's take of a free lease is applied but its answer lost: the row read back
/// names the reset, so the take landed; the reset goes on, and leaves no lease behind.
#[tokio::test(start_paused = true)]
async fn a_take_whose_answer_was_lost_is_settled_by_reading_the_row_back() {
    let (_memory, api, store) = one_shard();
    let (args, plan) = horizon_plan_after_a_first_reader(&api, &store, false).await;
    let layered = LayeredStore::new(Arc::new(store.clone()), FirstTakeUnanswered(false.into()));
    apply(&layered, &args, &plan.changes)
        .await
        .result()
        .unwrap();
    let after = row(&store).await;
    assert_eq!(
        (after.owner, after.checkpoint),
        (None, Some(Checkpoint::Start(StartingPoint::TrimHorizon)))
    );
}

/// A row of shard 0 of an earlier stream of the same name, which began at `1`, read to its
/// end; the listed shard 0 begins at `2`.
async fn earlier_stream_row(store: &MemoryLeaseStore) {
    let mut old = Lease::new(STREAM, SHARD, vec![]);
    old.counter = 3;
    old.checkpoint = Some(Checkpoint::ShardEnd);
    old.starting_sequence_number = Some("1".into());
    assert!(store.create(&old).await.unwrap());
}

/// A row of an earlier stream is planned as changed whatever its checkpoint, is not taken
/// for a finished shard, and is replaced by a row of the listed shard at the new position.
#[tokio::test(start_paused = true)]
async fn a_row_of_an_earlier_stream_is_replaced_by_one_of_the_listed_shard() {
    let store = MemoryLeaseStore::new();
    earlier_stream_row(&store).await;
    let (args, plan) = horizon_plan_listing(&store, Some("2"), false).await;
    let change = &plan.changes[0];
    assert!(change.earlier_stream && change.changed);
    assert_eq!(from_text(change), EARLIER_STREAM_ROW);
    assert!(
        plan.notes[0].contains("earlier stream of the same name")
            && plan.notes[0].contains("began at 1, this stream's at 2"),
        "{:?}",
        plan.notes
    );
    apply(&store, &args, &plan.changes).await.result().unwrap();
    let after = row(&store).await;
    assert_eq!(after.starting_sequence_number.as_deref(), Some("2"));
    assert_eq!(
        after.checkpoint,
        Some(Checkpoint::Start(StartingPoint::TrimHorizon))
    );
    assert_eq!(after.owner, None, "released");
    assert!(after.counter > 3, "{after:?}");
}

/// Applies the replacement, then answers that its condition failed, as a transport's retry
/// of a write that landed is answered.
struct ReplacedButLost;

impl LeaseLayer for ReplacedButLost {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let LeaseCall::Replace { old, .. } = call else {
            return next;
        };
        Box::pin(async move {
            next.await?;
            Err(LeaseError::Lost {
                stream: old.stream.clone(),
                shard: old.shard_id.clone(),
                owner: old.owner.clone().unwrap_or_default(),
            })
        })
    }
}

/// The reset's replacement lands but is answered as lost: the row read back is the reset's
/// own write, so the reset goes on, and releases it.
#[tokio::test(start_paused = true)]
async fn a_replacement_that_landed_but_was_answered_lost_is_settled_by_reading_back() {
    let store = MemoryLeaseStore::new();
    earlier_stream_row(&store).await;
    let (args, plan) = horizon_plan_listing(&store, Some("2"), false).await;
    let layered = LayeredStore::new(Arc::new(store.clone()), ReplacedButLost);
    apply(&layered, &args, &plan.changes)
        .await
        .result()
        .unwrap();
    let after = row(&store).await;
    assert_eq!(
        (
            after.owner,
            after.checkpoint,
            after.starting_sequence_number
        ),
        (
            None,
            Some(Checkpoint::Start(StartingPoint::TrimHorizon)),
            Some("2".into())
        )
    );
}

/// Replaces the row of the earlier stream by the listed shard's (as an instance's listing does
/// once the reset's hold has lapsed) right before the reset's own replacement.
struct ReplacedFirst(MemoryLeaseStore);

impl LeaseLayer for ReplacedFirst {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let LeaseCall::Replace { old, .. } = call else {
            return next;
        };
        Box::pin(async move {
            let mut new = Lease::new(STREAM, SHARD, vec![]);
            new.starting_sequence_number = Some("2".into());
            self.0.replace(old, &new).await.unwrap();
            next.await
        })
    }
}

/// An instance's listing replaces the earlier stream's row first: the reset fails (exit
/// status 1) saying so, and the instance's row is left as it made it.
#[tokio::test(start_paused = true)]
async fn a_row_replaced_by_an_instance_first_fails_the_reset_clearly() {
    let store = MemoryLeaseStore::new();
    earlier_stream_row(&store).await;
    let (args, plan) = horizon_plan_listing(&store, Some("2"), false).await;
    let layered = LayeredStore::new(Arc::new(store.clone()), ReplacedFirst(store.clone()));
    let failed = apply(&layered, &args, &plan.changes)
        .await
        .result()
        .unwrap_err();
    assert_eq!(failed.code, 1, "{}", failed.message);
    assert!(
        failed
            .message
            .contains("the row changed while the reset held it")
            && failed.message.contains("run the reset again"),
        "{}",
        failed.message
    );
    let after = row(&store).await;
    assert_eq!(
        (
            after.owner,
            after.checkpoint,
            after.starting_sequence_number
        ),
        (None, None, Some("2".into()))
    );
}

/// Fails every checkpoint write of one shard.
struct WriteFails(&'static str);

impl LeaseLayer for WriteFails {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        match call {
            LeaseCall::Checkpoint { lease, .. } if lease.shard_id == self.0 => {
                Box::pin(async move {
                    Err(LeaseError::Unavailable {
                        table: "leases".into(),
                        operation: call.operation(),
                        message: "throttled".into(),
                        source: None,
                    })
                })
            }
            _ => next,
        }
    }
}

/// Two free rows; the second's checkpoint write fails. The JSON document says what was
/// done: the first row written, the second's write failed (and nothing after it tried),
/// every lease released, exit status 1.
#[tokio::test(start_paused = true)]
async fn the_json_document_says_which_rows_were_written_and_which_failed() {
    let store = MemoryLeaseStore::new();
    let ids = ["shardId-000000000000", "shardId-000000000001"];
    let mut shards = Vec::new();
    let mut rows = Vec::new();
    for id in ids {
        let mut row = Lease::new(STREAM, id, vec![]);
        row.checkpoint = Some(Checkpoint::Sequence("5".into()));
        row.starting_sequence_number = Some("1".into());
        assert!(store.create(&row).await.unwrap());
        shards.push(Shard {
            id: id.into(),
            parents: vec![],
            starting_sequence_number: "1".into(),
            ending_sequence_number: None,
        });
        rows.push(LeaseRow {
            lease: row,
            last_written_ms: None,
        });
    }
    let args = ResetArgs {
        target: Target {
            table: "leases".into(),
            stream: STREAM.into(),
        },
        to: Position::Horizon,
        shards: vec![],
        dry_run: false,
        force: false,
        lease_duration_ms: 3_000,
        json: true,
    };
    let reading = Reading::new(shards, rows, time::now_ms());
    let (with_rows, skipped) = with_rows(&args, &reading).unwrap();
    let latest = StartingPoint::since(SystemTime::now());
    let plan = plan(&args, &reading, with_rows, skipped, &latest).unwrap();
    let layered = LayeredStore::new(Arc::new(store.clone()), WriteFails(ids[1]));
    let applied = apply(&layered, &args, &plan.changes).await;

    let mut doc = plan_json(&args, "test-region", &plan);
    add_outcome(&mut doc, applied.ending(), &applied);
    assert_eq!(doc["outcome"], "failed", "{doc:#}");
    assert_eq!(doc["applied"], false);
    assert_eq!(doc["exit_status"], 1);
    assert_eq!(doc["written"], json!([ids[0]]));
    assert_eq!(doc["shards"][0]["written"], true);
    assert_eq!(doc["shards"][1]["written"], false);
    assert_eq!(doc["failures"][0]["shard_id"], ids[1], "{doc:#}");
    assert_eq!(doc["failures"][0]["step"], "write");
    assert!(
        doc["failures"][0]["error"]
            .as_str()
            .unwrap()
            .contains("throttled"),
        "{doc:#}"
    );
    assert_eq!(doc["failures"].as_array().unwrap().len(), 1, "{doc:#}");
    let error = doc["error"].as_str().unwrap();
    assert!(
        error.contains("written before it: shardId-000000000000"),
        "{error}"
    );
    // The plan's fields are still there, as a script may read them.
    assert_eq!(doc["shards"][1]["to"], "TRIM_HORIZON");
    assert_eq!(doc["region"], "test-region");
    for id in ids {
        let ids = [id.to_owned()];
        let row = store.get(STREAM, &ids).await.unwrap().remove(0);
        assert_eq!(row.owner, None, "{id} released");
    }
}
