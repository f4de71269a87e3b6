//! The lease stores' contract: one suite run against [`MemoryLeaseStore`], against
//! [`DynamoLeaseStore`] on dynalite (a fresh table per test, in the by-stream layout it
//! creates) and against a single-key table made as earlier versions made them, plus
//! DynamoDB-only checks of the table itself, of what a listing costs, and of the error
//! mapping.

mod support;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::config::interceptors::{
    BeforeSerializationInterceptorContextMut, FinalizerInterceptorContextMut,
};
use aws_sdk_dynamodb::config::retry::RetryConfig;
use aws_sdk_dynamodb::config::timeout::TimeoutConfig;
use aws_sdk_dynamodb::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_dynamodb::error::BoxError;
use aws_sdk_dynamodb::operation::create_table::CreateTableInput;
use aws_sdk_dynamodb::operation::describe_table::DescribeTableOutput;
use aws_sdk_dynamodb::types::{AttributeValue, BillingMode, KeyType, TableStatus};
use futures::StreamExt;
use kinesis_dataflow::error::Operation;
use kinesis_dataflow::lease::{KeyLayout, Lease, LeaseError, LeaseStore, SharedLeaseStore};
use kinesis_dataflow::position::{Checkpoint, StartingPoint};
use kinesis_dataflow::{DynamoLeaseStore, MemoryLeaseStore};

const STREAM: &str = "orders";
const SHARD: &str = "shardId-000000000000";

/// Where to look when a DynamoDB test fails.
fn logs() -> String {
    format!("emulator logs: {}", support::logs_dir().display())
}

fn shard(i: usize) -> String {
    format!("shardId-{i:012}")
}

fn memory_store() -> SharedLeaseStore {
    Arc::new(MemoryLeaseStore::new())
}

/// A prepared store on a fresh table, listing in small pages so every `list` paginates.
async fn dynamo_store() -> SharedLeaseStore {
    let store = paged_store(support::dynamodb_client(), &support::unique_name("leases")).await;
    Arc::new(store)
}

/// A prepared store on `table`, listing in pages of 7 rows.
async fn paged_store(client: aws_sdk_dynamodb::Client, table: &str) -> DynamoLeaseStore {
    let store = DynamoLeaseStore::new(client, table)
        .expect("a valid table name")
        .with_scan_page_size(7);
    store
        .prepare()
        .await
        .unwrap_or_else(|err| panic!("prepare {table}: {err} ({})", logs()));
    store
}

/// A store on a fresh table keyed by `leaseKey` alone, as tables were created before the
/// by-stream layout, listing in small pages (so a Scan reads several pages, then segments).
async fn single_key_store() -> SharedLeaseStore {
    let client = support::dynamodb_client();
    let table = support::unique_name("old-leases");
    support::create_table_keyed_by(&client, &table, "leaseKey").await;
    let store = paged_store(client, &table).await;
    assert_eq!(
        store.key_layout().await.expect("layout"),
        KeyLayout::SingleKey
    );
    Arc::new(store)
}

/// The only lease of `stream` on `shard`, as listed now.
async fn current(store: &SharedLeaseStore, stream: &str, shard: &str) -> Lease {
    store
        .list(stream)
        .await
        .unwrap_or_else(|err| panic!("list {stream}: {err} ({})", logs()))
        .into_iter()
        .find(|lease| lease.shard_id == shard)
        .unwrap_or_else(|| panic!("no lease for {stream}/{shard} ({})", logs()))
}

/// A created lease, then taken by `owner`.
async fn held_by(store: &SharedLeaseStore, owner: &str) -> Lease {
    let free = Lease::new(STREAM, SHARD, vec![]);
    assert!(store.create(&free).await.expect("create"), "{}", logs());
    store.take(&free, owner).await.expect("take a free lease")
}

fn assert_lost(err: &LeaseError, expected_owner: &str) {
    assert!(
        matches!(err, LeaseError::Lost { stream, shard, owner }
            if stream == STREAM && shard == SHARD && owner == expected_owner),
        "expected Lost for {expected_owner}, got {err:?} ({})",
        logs()
    );
    assert!(!err.is_retryable());
}

// ---------------------------------------------------------------------------------------------
// The shared suite: each function runs once per store.

macro_rules! both_stores {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::memory_store()).await;
                }
            )*
        }
        mod dynamodb {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::dynamo_store().await).await;
                }
            )*
        }
        mod dynamodb_single_key {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::single_key_store().await).await;
                }
            )*
        }
    };
}

both_stores!(
    prepare_is_idempotent,
    create_is_idempotent,
    create_stores_the_lease_as_given,
    racing_takes_have_one_winner,
    renew_bumps_the_counter_until_stolen,
    checkpoint_is_fenced,
    release_frees_the_lease_for_another_owner,
    shard_end_round_trips,
    streams_share_a_table_without_mixing,
    parents_round_trip,
    list_paginates_and_orders_by_shard,
    get_reads_the_named_rows_as_they_are_now,
    worker_limits_round_trip,
    writes_by_a_non_holder_are_lost,
    delete_is_conditional_on_owner_and_counter,
    replace_is_one_write_fenced_on_owner_and_counter,
    a_checkpoint_that_does_not_decode_is_refused,
    get_reads_a_repeated_id_once,
);

async fn prepare_is_idempotent(store: SharedLeaseStore) {
    store.prepare().await.expect("prepare again");
    store.prepare().await.expect("and again");
    assert!(store.list(STREAM).await.expect("list").is_empty());
}

async fn create_is_idempotent(store: SharedLeaseStore) {
    let lease = Lease::new(STREAM, SHARD, vec![]);
    assert!(store.create(&lease).await.expect("create"));
    let held = store.take(&lease, "a").await.expect("take");
    // A second create (another instance discovering the same shard) changes nothing.
    let mut again = Lease::new(STREAM, SHARD, vec!["shardId-000000000009".into()]);
    assert!(!store.create(&again).await.expect("create again"));
    again.checkpoint = Some(Checkpoint::ShardEnd);
    assert!(!store.create(&again).await.expect("create a third time"));
    assert_eq!(store.list(STREAM).await.expect("list"), vec![held]);
}

async fn create_stores_the_lease_as_given(store: SharedLeaseStore) {
    let mut lease = Lease::new(STREAM, SHARD, vec!["shardId-000000000007".into()]);
    lease.checkpoint = Some(Checkpoint::Sequence("4959".into()));
    lease.counter = 41;
    assert!(store.create(&lease).await.expect("create"));
    assert_eq!(current(&store, STREAM, SHARD).await, lease);
    let held = store.take(&lease, "a").await.expect("take");
    assert_eq!(held.counter, 42);
    assert_eq!(held.checkpoint, lease.checkpoint);
}

async fn racing_takes_have_one_winner(store: SharedLeaseStore) {
    for round in 0..5 {
        let shard_id = shard(round);
        let free = Lease::new(STREAM, &shard_id, vec![]);
        assert!(store.create(&free).await.expect("create"));
        // Round 0 races for a free lease; later rounds for an expired one (held by "old").
        let view = if round == 0 {
            free
        } else {
            store.take(&free, "old").await.expect("take as old")
        };
        let race = |owner: &'static str| {
            let store = Arc::clone(&store);
            let view = view.clone();
            tokio::spawn(async move { (owner, store.take(&view, owner).await) })
        };
        let (a, b) = (race("a"), race("b"));
        let results = [a.await.expect("task a"), b.await.expect("task b")];
        let winners: Vec<_> = results
            .iter()
            .filter_map(|(owner, result)| result.as_ref().ok().map(|lease| (*owner, lease)))
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {results:?} ({})", logs());
        let (winner, won) = winners[0];
        assert_eq!(won.owner.as_deref(), Some(winner));
        assert_eq!(won.counter, view.counter + 1);
        for (owner, result) in &results {
            if let Err(err) = result {
                assert!(
                    matches!(err, LeaseError::Lost { shard, owner: o, .. }
                        if *shard == shard_id && o == owner),
                    "round {round}: {err:?}"
                );
            }
        }
        assert_eq!(&current(&store, STREAM, &shard_id).await, won);
    }
}

async fn renew_bumps_the_counter_until_stolen(store: SharedLeaseStore) {
    let held = held_by(&store, "a").await;
    assert_eq!((held.owner.as_deref(), held.counter), (Some("a"), 1));
    let renewed = store.renew(&held).await.expect("renew");
    assert_eq!((renewed.owner.as_deref(), renewed.counter), (Some("a"), 2));
    let renewed = store.renew(&renewed).await.expect("renew again");
    assert_eq!(renewed.counter, 3);
    // A stale view (the counter moved on) is refused even for the holder.
    assert_lost(&store.renew(&held).await.unwrap_err(), "a");

    // "b" saw the counter stand still and takes the lease over.
    let stolen = store.take(&renewed, "b").await.expect("take over");
    assert_eq!((stolen.owner.as_deref(), stolen.counter), (Some("b"), 4));
    assert_lost(&store.renew(&renewed).await.unwrap_err(), "a");
    assert_eq!(current(&store, STREAM, SHARD).await, stolen);
}

async fn checkpoint_is_fenced(store: SharedLeaseStore) {
    let held = held_by(&store, "a").await;
    let first =
        Checkpoint::Sequence("49590338271490256608559692538361571095921575989136588898".into());
    let held = store.checkpoint(&held, &first).await.expect("checkpoint");
    assert_eq!(held.checkpoint.as_ref(), Some(&first));
    assert_eq!(held.counter, 2);

    let stolen = store.take(&held, "b").await.expect("steal");
    let err = store
        .checkpoint(&held, &Checkpoint::Sequence("99".into()))
        .await
        .unwrap_err();
    assert_lost(&err, "a");
    let stored = current(&store, STREAM, SHARD).await;
    assert_eq!(stored.checkpoint.as_ref(), Some(&first), "{}", logs());
    assert_eq!(stored, stolen);

    // The new holder can move it on.
    let moved = store
        .checkpoint(&stolen, &Checkpoint::Sequence("100".into()))
        .await
        .expect("checkpoint by the new holder");
    assert_eq!(moved.checkpoint, Some(Checkpoint::Sequence("100".into())));
}

async fn release_frees_the_lease_for_another_owner(store: SharedLeaseStore) {
    let held = held_by(&store, "a").await;
    let held = store
        .checkpoint(&held, &Checkpoint::Sequence("7".into()))
        .await
        .expect("checkpoint");
    let released = store.release(&held).await.expect("release");
    assert_eq!(released.owner, None);
    assert_eq!(released.counter, held.counter + 1);
    assert_eq!(released.checkpoint, held.checkpoint);
    assert_eq!(current(&store, STREAM, SHARD).await, released);

    // Released once: the holder's old view cannot write any more.
    assert_lost(&store.release(&held).await.unwrap_err(), "a");
    assert_lost(&store.renew(&held).await.unwrap_err(), "a");
    // Taking from the stale held view fails; from the released view it works at once.
    assert_lost(&store.take(&held, "b").await.unwrap_err(), "b");
    let taken = store
        .take(&released, "b")
        .await
        .expect("take after release");
    assert_eq!(
        (taken.owner.as_deref(), taken.counter),
        (Some("b"), released.counter + 1)
    );
    assert_eq!(taken.checkpoint, Some(Checkpoint::Sequence("7".into())));
}

async fn delete_is_conditional_on_owner_and_counter(store: SharedLeaseStore) {
    let held = held_by(&store, "a").await;
    let renewed = store.renew(&held).await.expect("renew");
    // A stale view (the row was written since) cannot delete it, nor can a view with another
    // owner or none.
    assert_lost(&store.delete(&held).await.unwrap_err(), "a");
    let mut impostor = renewed.clone();
    impostor.owner = Some("b".into());
    assert_lost(&store.delete(&impostor).await.unwrap_err(), "b");
    let mut unowned = renewed.clone();
    unowned.owner = None;
    assert!(store.delete(&unowned).await.unwrap_err().is_lost());
    assert_eq!(current(&store, STREAM, SHARD).await, renewed);

    // The current view deletes it; the row is gone, and so is a second delete's target.
    store.delete(&renewed).await.expect("delete");
    assert!(
        store.list(STREAM).await.expect("list").is_empty(),
        "{}",
        logs()
    );
    assert_lost(&store.delete(&renewed).await.unwrap_err(), "a");

    // An unowned row is deleted from its unowned view; the shard can be created again after.
    let free = Lease::new(STREAM, SHARD, vec![]);
    assert!(store.create(&free).await.expect("create again"));
    store.delete(&free).await.expect("delete an unowned row");
    assert!(store.list(STREAM).await.expect("list").is_empty());
}

async fn replace_is_one_write_fenced_on_owner_and_counter(store: SharedLeaseStore) {
    // The row of an earlier stream's shard 0: began at 1, read to its end, held by "a".
    let mut earlier = Lease::new(STREAM, SHARD, vec!["shardId-000000000009".into()]);
    earlier.starting_sequence_number = Some("1".into());
    earlier.checkpoint = Some(Checkpoint::ShardEnd);
    assert!(store.create(&earlier).await.expect("create"));
    let held = store.take(&earlier, "a").await.expect("take");
    let renewed = store.renew(&held).await.expect("renew");
    let mut new = Lease::new(STREAM, SHARD, vec![]);
    new.starting_sequence_number = Some("2".into());
    new.checkpoint = Some(Checkpoint::Start(StartingPoint::TrimHorizon));
    // A stale view, or one with another owner or none, replaces nothing.
    assert_lost(&store.replace(&held, &new).await.unwrap_err(), "a");
    let mut impostor = renewed.clone();
    impostor.owner = Some("b".into());
    assert_lost(&store.replace(&impostor, &new).await.unwrap_err(), "b");
    let mut unowned = renewed.clone();
    unowned.owner = None;
    assert!(store.replace(&unowned, &new).await.unwrap_err().is_lost());
    assert_eq!(current(&store, STREAM, SHARD).await, renewed);

    // The current view is replaced by the new row as given, with the next counter: the old
    // holder's view is fenced, and so is a second replacement from it.
    let written = store.replace(&renewed, &new).await.expect("replace");
    assert_eq!(
        written,
        Lease {
            counter: renewed.counter + 1,
            ..new.clone()
        }
    );
    assert_eq!(current(&store, STREAM, SHARD).await, written);
    assert_lost(&store.renew(&renewed).await.unwrap_err(), "a");
    assert_lost(&store.replace(&renewed, &new).await.unwrap_err(), "a");
    // A missing row is not replaced either.
    let mut missing = Lease::new(STREAM, "shardId-000000000005", vec![]);
    missing.counter = 3;
    assert!(store.replace(&missing, &new).await.unwrap_err().is_lost());
    assert_eq!(store.list(STREAM).await.expect("list"), vec![written]);
}

async fn shard_end_round_trips(store: SharedLeaseStore) {
    let held = held_by(&store, "a").await;
    assert!(!held.is_finished());
    let done = store
        .checkpoint(&held, &Checkpoint::ShardEnd)
        .await
        .expect("checkpoint SHARD_END");
    assert!(done.is_finished());
    let stored = current(&store, STREAM, SHARD).await;
    assert_eq!(stored.checkpoint, Some(Checkpoint::ShardEnd));
    assert!(stored.is_finished());
    let released = store.release(&done).await.expect("release");
    assert!(released.is_finished());
}

async fn streams_share_a_table_without_mixing(store: SharedLeaseStore) {
    for stream in ["clicks", "views", "clicks-archive"] {
        for i in 0..3 {
            assert!(
                store
                    .create(&Lease::new(stream, shard(i), vec![]))
                    .await
                    .expect("create")
            );
        }
    }
    let clicks = store.list("clicks").await.expect("list clicks");
    let taken = store.take(&clicks[1], "a").await.expect("take");
    assert_eq!(taken.stream, "clicks");

    let clicks = store.list("clicks").await.expect("list clicks");
    let views = store.list("views").await.expect("list views");
    let archive = store.list("clicks-archive").await.expect("list archive");
    for (stream, leases) in [
        ("clicks", &clicks),
        ("views", &views),
        ("clicks-archive", &archive),
    ] {
        assert_eq!(leases.len(), 3, "{stream}: {leases:?}");
        assert!(leases.iter().all(|l| l.stream == stream), "{leases:?}");
    }
    assert_eq!(clicks[1].owner.as_deref(), Some("a"));
    assert!(
        views
            .iter()
            .chain(&archive)
            .all(|l| l.owner.is_none() && l.counter == 0)
    );
    assert!(store.list("nothing-here").await.expect("list").is_empty());
}

async fn parents_round_trip(store: SharedLeaseStore) {
    let leases = [
        Lease::new(STREAM, shard(0), vec![]),
        Lease::new(STREAM, shard(1), vec![]),
        Lease::new(STREAM, shard(2), vec![shard(0)]),
        Lease::new(STREAM, shard(3), vec![shard(0)]),
        Lease::new(STREAM, shard(4), vec![shard(2), shard(3)]),
    ];
    for lease in &leases {
        assert!(store.create(lease).await.expect("create"));
    }
    assert_eq!(store.list(STREAM).await.expect("list"), leases);
    let merged = store.take(&leases[4], "a").await.expect("take");
    assert_eq!(merged.parents, vec![shard(2), shard(3)]);
}

async fn list_paginates_and_orders_by_shard(store: SharedLeaseStore) {
    const SHARDS: usize = 120;
    // Created in a scrambled order, mixed with another stream's rows.
    let mut expected: Vec<Lease> = (0..SHARDS)
        .map(|i| Lease::new(STREAM, shard(i), vec![]))
        .collect();
    let mut rows: Vec<Lease> = expected.clone();
    rows.extend((0..10).map(|i| Lease::new("other", shard(i), vec![])));
    rows.reverse();
    rows.swap(3, 77);
    let created: Vec<bool> = futures::stream::iter(rows.iter())
        .map(|lease| {
            let store = Arc::clone(&store);
            async move { store.create(lease).await }
        })
        .buffer_unordered(8)
        .map(|result| result.expect("create"))
        .collect()
        .await;
    assert!(created.iter().all(|c| *c));

    let first = store.take(&expected[57], "a").await.expect("take");
    expected[57] = first;
    let listed = store.list(STREAM).await.expect("list");
    assert_eq!(listed.len(), SHARDS, "{}", logs());
    assert_eq!(listed, expected);
    assert_eq!(store.list("other").await.expect("list other").len(), 10);
}

async fn get_reads_the_named_rows_as_they_are_now(store: SharedLeaseStore) {
    // More ids than one BatchGetItem call takes, some of rows that do not exist, and rows of
    // another stream with the same ids.
    for i in 0..150 {
        assert!(
            store
                .create(&Lease::new(STREAM, shard(i), vec![]))
                .await
                .expect("create")
        );
    }
    for i in 0..5 {
        assert!(
            store
                .create(&Lease::new("other", shard(i), vec![]))
                .await
                .expect("create")
        );
    }
    let seen = current(&store, STREAM, &shard(3)).await;
    let held = store.take(&seen, "a").await.expect("take");
    let wanted: Vec<String> = (0..130).rev().map(shard).chain([shard(900)]).collect();
    let rows = store.get(STREAM, &wanted).await.expect("get");
    let ids: Vec<String> = rows.iter().map(|r| r.shard_id.clone()).collect();
    assert_eq!(ids, (0..130).map(shard).collect::<Vec<_>>(), "{}", logs());
    assert!(rows.iter().all(|r| r.stream == STREAM));
    assert_eq!(rows[3], held);
    assert!(
        store
            .get(STREAM, &[])
            .await
            .expect("get nothing")
            .is_empty()
    );
}

async fn get_reads_a_repeated_id_once(store: SharedLeaseStore) {
    for i in 0..3 {
        assert!(
            store
                .create(&Lease::new(STREAM, shard(i), vec![]))
                .await
                .expect("create")
        );
    }
    // Repeated ids, within one batch and across the batches of more than 100 ids.
    let wanted: Vec<String> = [shard(2), shard(0), shard(2), shard(9)]
        .into_iter()
        .chain((0..120).map(|i| shard(i % 2)))
        .collect();
    let rows = store
        .get(STREAM, &wanted)
        .await
        .unwrap_or_else(|err| panic!("get with repeated ids: {err} ({})", logs()));
    let ids: Vec<String> = rows.iter().map(|r| r.shard_id.clone()).collect();
    assert_eq!(ids, [shard(0), shard(1), shard(2)], "{}", logs());
}

async fn a_checkpoint_that_does_not_decode_is_refused(store: SharedLeaseStore) {
    let held = held_by(&store, "a").await;
    for bad in [
        Checkpoint::Sequence(String::new()),
        Checkpoint::SubSequence("abc".into(), 3),
    ] {
        let text = format!("{:?}", bad.encode());
        let err = store.checkpoint(&held, &bad).await.unwrap_err();
        assert!(
            matches!(err, LeaseError::Invalid { .. }) && err.to_string().contains(&text),
            "a checkpoint of {text}: {err:?}"
        );
        let mut lease = Lease::new(STREAM, shard(7), vec![]);
        lease.checkpoint = Some(bad.clone());
        let err = store.create(&lease).await.unwrap_err();
        assert!(
            matches!(err, LeaseError::Invalid { .. }) && err.to_string().contains(&text),
            "a row created with a checkpoint of {text}: {err:?}"
        );
        // Nothing was written: the row is as it was, and the stream still lists.
        let rows = store
            .list(STREAM)
            .await
            .unwrap_or_else(|err| panic!("list after {text}: {err} ({})", logs()));
        assert_eq!(rows, vec![held.clone()], "{}", logs());
    }
    // The holder goes on.
    let next = Checkpoint::Sequence("5".into());
    let moved = store.checkpoint(&held, &next).await.expect("checkpoint");
    assert_eq!(moved.checkpoint, Some(next));
}

async fn worker_limits_round_trip(store: SharedLeaseStore) {
    let mut row = Lease::new(STREAM, "worker:a", vec![]);
    row.owner = Some("a".into());
    row.limits = Some(kinesis_dataflow::lease::WorkerLimits {
        weight: 3,
        max_leases: Some(250),
    });
    assert!(store.create(&row).await.expect("create"));
    let renewed = store.renew(&row).await.expect("renew");
    let read = store
        .get(STREAM, &["worker:a".to_owned()])
        .await
        .expect("get");
    assert_eq!(read, vec![renewed.clone()]);
    assert_eq!(read[0].limits, row.limits, "kept by a renewal");
}

async fn writes_by_a_non_holder_are_lost(store: SharedLeaseStore) {
    // A row that does not exist cannot be taken (take never creates).
    let missing = Lease::new(STREAM, SHARD, vec![]);
    assert_lost(&store.take(&missing, "a").await.unwrap_err(), "a");
    assert!(store.list(STREAM).await.expect("list").is_empty());

    // Holder operations need an owner in the caller's view.
    assert!(store.create(&missing).await.expect("create"));
    for err in [
        store.renew(&missing).await.unwrap_err(),
        store.release(&missing).await.unwrap_err(),
        store
            .checkpoint(&missing, &Checkpoint::ShardEnd)
            .await
            .unwrap_err(),
    ] {
        assert!(err.is_lost(), "{err:?}");
    }
    // A view claiming an owner the row does not have is refused.
    let mut claimed = missing.clone();
    claimed.owner = Some("a".into());
    assert_lost(&store.renew(&claimed).await.unwrap_err(), "a");
    // Taking a free lease from a view that says someone holds it is refused as well.
    assert_lost(&store.take(&claimed, "b").await.unwrap_err(), "b");
    assert_eq!(current(&store, STREAM, SHARD).await, missing);
}

// ---------------------------------------------------------------------------------------------
// DynamoDB only: the table itself.

/// A store without a page limit, on a table that does not exist yet.
fn unprepared_store() -> DynamoLeaseStore {
    DynamoLeaseStore::new(support::dynamodb_client(), support::unique_name("leases"))
        .expect("a valid table name")
}

/// The row of `shard` of `stream` in a by-stream table, as stored.
async fn raw_item(
    client: &aws_sdk_dynamodb::Client,
    table: &str,
    (stream, shard): (&str, &str),
) -> std::collections::HashMap<String, AttributeValue> {
    let key = format!("{stream}#{shard}");
    client
        .get_item()
        .table_name(table)
        .key("streamName", AttributeValue::S(stream.into()))
        .key("shardId", AttributeValue::S(shard.into()))
        .consistent_read(true)
        .send()
        .await
        .unwrap_or_else(|err| panic!("GetItem {key}: {err:?} ({})", logs()))
        .item
        .unwrap_or_else(|| panic!("no row {key} ({})", logs()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_creates_a_missing_on_demand_table() {
    let store = unprepared_store();
    let client = store.client().clone();
    let missing = client
        .describe_table()
        .table_name(store.table())
        .send()
        .await;
    assert!(missing.is_err(), "the table exists already: {missing:?}");

    // Two instances starting at once: both create-or-wait, both succeed.
    let other = DynamoLeaseStore::new(support::dynamodb_client(), store.table()).unwrap();
    let (a, b) = futures::join!(store.prepare(), other.prepare());
    a.unwrap_or_else(|err| panic!("prepare: {err} ({})", logs()));
    b.unwrap_or_else(|err| panic!("concurrent prepare: {err} ({})", logs()));

    let described = client
        .describe_table()
        .table_name(store.table())
        .send()
        .await
        .expect("DescribeTable");
    let table = described.table().expect("a table description");
    assert_eq!(table.table_status(), Some(&TableStatus::Active));
    assert_eq!(
        table.billing_mode_summary().and_then(|b| b.billing_mode()),
        Some(&BillingMode::PayPerRequest),
        "{table:?}"
    );
    let keys: Vec<(&str, &KeyType)> = table
        .key_schema()
        .iter()
        .map(|k| (k.attribute_name(), k.key_type()))
        .collect();
    assert_eq!(
        keys,
        [("streamName", &KeyType::Hash), ("shardId", &KeyType::Range)],
        "{table:?}"
    );
    assert_eq!(
        store.key_layout().await.expect("layout"),
        KeyLayout::ByStream
    );

    store.prepare().await.expect("prepare is idempotent");
    // Usable at once, with the default (unlimited) Scan pages too.
    assert!(
        store
            .create(&Lease::new(STREAM, SHARD, vec![]))
            .await
            .expect("create")
    );
    assert_eq!(store.list(STREAM).await.expect("list").len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_follow_the_documented_schema() {
    let store = unprepared_store();
    store.prepare().await.expect("prepare");
    let client = store.client().clone();
    let key = (STREAM, SHARD);

    let free = Lease::new(STREAM, SHARD, vec!["shardId-000000000001".into()]);
    assert!(store.create(&free).await.expect("create"));
    let row = raw_item(&client, store.table(), key).await;
    assert!(!row.contains_key("leaseKey"), "{row:?}");
    assert_eq!(row["streamName"], AttributeValue::S(STREAM.into()));
    assert_eq!(row["shardId"], AttributeValue::S(SHARD.into()));
    assert_eq!(row["leaseCounter"], AttributeValue::N("0".into()));
    assert_eq!(
        row["parentShardIds"],
        AttributeValue::L(vec![AttributeValue::S("shardId-000000000001".into())])
    );
    assert!(
        matches!(row["lastWrittenAt"], AttributeValue::N(_)),
        "{row:?}"
    );
    assert!(
        !row.contains_key("leaseOwner") && !row.contains_key("checkpoint"),
        "{row:?}"
    );

    let held = store.take(&free, "worker-1").await.expect("take");
    let held = store
        .checkpoint(&held, &Checkpoint::ShardEnd)
        .await
        .expect("checkpoint");
    let row = raw_item(&client, store.table(), key).await;
    assert_eq!(row["leaseOwner"], AttributeValue::S("worker-1".into()));
    assert_eq!(row["leaseCounter"], AttributeValue::N("2".into()));
    assert_eq!(row["checkpoint"], AttributeValue::S("SHARD_END".into()));

    store.release(&held).await.expect("release");
    let row = raw_item(&client, store.table(), key).await;
    assert!(!row.contains_key("leaseOwner"), "{row:?}");
    assert_eq!(row["leaseCounter"], AttributeValue::N("3".into()));
}

#[tokio::test]
async fn invalid_table_names_are_refused_before_any_call() {
    let conf = support::sdk_config();
    for bad in [
        "ab",
        "lease table",
        "leases/prod",
        "tablé",
        &"x".repeat(256),
    ] {
        let err = DynamoLeaseStore::from_conf(&conf, bad).unwrap_err();
        assert!(
            matches!(&err, LeaseError::InvalidConfig { setting: "lease_table", value, .. }
                if value.contains(bad)),
            "{bad}: {err:?}"
        );
        assert!(err.to_string().contains("lease_table"), "{err}");
    }
    let ok = DynamoLeaseStore::from_conf(&conf, DynamoLeaseStore::default_table_name("my app"))
        .expect("the default name is valid");
    assert_eq!(ok.table(), "kinesis-dataflow-my-app");
}

/// Renames the table of every CreateTable call, so the service sees a name it refuses while
/// the store believes it asked for a valid one.
#[derive(Debug)]
struct RenameTableOnCreate(&'static str);

impl Intercept for RenameTableOnCreate {
    fn name(&self) -> &'static str {
        "RenameTableOnCreate"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(input) = context.input_mut().downcast_mut::<CreateTableInput>() {
            input.table_name = Some(self.0.to_owned());
        }
        Ok(())
    }
}

/// Reports every ACTIVE table as UPDATING (as DynamoDB does while a table's settings change,
/// the table fully usable all along).
#[derive(Debug)]
struct ActiveIsUpdating;

impl Intercept for ActiveIsUpdating {
    fn name(&self) -> &'static str {
        "ActiveIsUpdating"
    }

    fn modify_before_attempt_completion(
        &self,
        context: &mut FinalizerInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let described = context
            .output_or_error_mut()
            .and_then(|answer| answer.as_mut().ok())
            .and_then(|output| output.downcast_mut::<DescribeTableOutput>())
            .and_then(|output| output.table.as_mut());
        if let Some(table) = described
            && table.table_status == Some(TableStatus::Active)
        {
            table.table_status = Some(TableStatus::Updating);
        }
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_accepts_an_updating_table() {
    let client = aws_sdk_dynamodb::Client::from_conf(
        support::dynamodb_config_builder()
            .interceptor(ActiveIsUpdating)
            .build(),
    );
    let table = support::unique_name("leases");
    // Created by the store, then found ready though it is UPDATING; and again once it exists.
    let store = DynamoLeaseStore::new(client, &table).expect("a valid table name");
    for _ in 0..2 {
        store
            .prepare()
            .await
            .unwrap_or_else(|err| panic!("prepare an UPDATING table: {err} ({})", logs()));
    }
    store.check_table().await.expect("check_table");
    assert!(store.list(STREAM).await.expect("list").is_empty());
}

#[tokio::test]
async fn a_table_name_the_service_refuses_names_the_table_and_the_call() {
    let client = aws_sdk_dynamodb::Client::from_conf(
        support::dynamodb_config_builder()
            .interceptor(RenameTableOnCreate("refused name!"))
            .build(),
    );
    let table = support::unique_name("leases");
    let store = DynamoLeaseStore::new(client, &table).expect("valid locally");
    let err = store.prepare().await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::Invalid { table: t, operation: Operation::CreateTable, message, .. }
            if *t == table && message.contains("ValidationException")),
        "{err:?} ({})",
        logs()
    );
    assert!(!err.is_retryable());
    let text = err.to_string();
    assert!(
        text.contains(&table) && text.contains("CreateTable"),
        "{text}"
    );
}

#[tokio::test]
async fn a_missing_table_is_table_not_found() {
    // The first call reads the table's key layout, and finds no table.
    let store = unprepared_store();
    let err = store.list(STREAM).await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::TableNotFound { table, operation: Operation::DescribeTable } if table == store.table()),
        "{err:?} ({})",
        logs()
    );
    let lease = Lease::new(STREAM, SHARD, vec![]);
    for err in [
        store.create(&lease).await.unwrap_err(),
        store.take(&lease, "a").await.unwrap_err(),
    ] {
        assert!(
            matches!(&err, LeaseError::TableNotFound { table, .. } if table == store.table()),
            "{err:?}"
        );
        assert!(err.to_string().contains(store.table()), "{err}");
    }
    // A table deleted once its layout is known: the call that finds it gone is named.
    let store = unprepared_store();
    store.prepare().await.expect("prepare");
    store
        .client()
        .delete_table()
        .table_name(store.table())
        .send()
        .await
        .expect("DeleteTable");
    let err = store.take(&lease, "a").await.unwrap_err();
    assert!(
        matches!(
            &err,
            LeaseError::TableNotFound {
                operation: Operation::UpdateItem,
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_malformed_row_names_its_key_and_attribute() {
    let store = unprepared_store();
    store.prepare().await.expect("prepare");
    store
        .client()
        .put_item()
        .table_name(store.table())
        .item("streamName", AttributeValue::S(STREAM.into()))
        .item("shardId", AttributeValue::S("broken".into()))
        .item("leaseCounter", AttributeValue::S("seven".into()))
        .send()
        .await
        .expect("PutItem");
    let err = store.list(STREAM).await.unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(
            &err,
            LeaseError::Invalid {
                operation: Operation::Query,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        text.contains("orders#broken") && text.contains("leaseCounter"),
        "{text}"
    );
    // Other streams in the same table are unaffected.
    assert!(store.list("other").await.expect("list other").is_empty());
}

/// Creates `streams` × `shards` free leases (streams `s00`, `s01`, ...) in `store`.
async fn fill(store: &DynamoLeaseStore, streams: usize, shards: usize) {
    let leases: Vec<Lease> = (0..streams)
        .flat_map(|s| (0..shards).map(move |i| Lease::new(format!("s{s:02}"), shard(i), vec![])))
        .collect();
    let created: Vec<bool> = futures::stream::iter(&leases)
        .map(|lease| async move { store.create(lease).await.expect("create") })
        .buffer_unordered(16)
        .collect()
        .await;
    assert!(created.into_iter().all(|c| c));
}

/// What listing one stream costs in a table shared by several: the by-stream layout's Query
/// reads that stream's rows, a single-key table's Scan every row of the table. The units are
/// the table's own figures (`ReturnConsumedCapacity`, which dynalite computes as DynamoDB
/// does). `LEASE_TABLE_SCALE=<streams>x<shards>` (default `4x400`) sets the table's size; the
/// BENCHMARKS figures are `10x1000`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_reads_its_streams_rows_and_a_scan_the_whole_table() {
    let scale = std::env::var("LEASE_TABLE_SCALE").unwrap_or_else(|_| "4x400".to_owned());
    let (streams, shards) = scale
        .split_once('x')
        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
        .unwrap_or_else(|| panic!("LEASE_TABLE_SCALE={scale:?}: expected <streams>x<shards>"));
    let client = support::dynamodb_client();
    let by_stream = DynamoLeaseStore::new(client.clone(), support::unique_name("cost")).unwrap();
    by_stream.prepare().await.expect("prepare");
    let old = support::unique_name("cost-old");
    support::create_table_keyed_by(&client, &old, "leaseKey").await;
    // Pages of 100 rows: the first Scan reads several, so the second reads in segments.
    let single_key = DynamoLeaseStore::new(client, &old)
        .unwrap()
        .with_scan_page_size(100);
    single_key.prepare().await.expect("prepare");
    futures::join!(
        fill(&by_stream, streams, shards),
        fill(&single_key, streams, shards)
    );

    let cost = |store: &DynamoLeaseStore| {
        let store = store.clone();
        async move {
            let (units, rows) = (store.consumed_read_units(), store.rows_read());
            let listed = store.list("s01").await.expect("list");
            let cost = (
                store.consumed_read_units() - units,
                store.rows_read() - rows,
            );
            (listed, cost)
        }
    };
    let (queried, (query_units, query_rows)) = cost(&by_stream).await;
    let (scanned, (scan_units, scan_rows)) = cost(&single_key).await;
    // The second Scan reads in parallel segments (as many as the first read pages): the same
    // rows.
    let (scanned_again, (again_units, again_rows)) = cost(&single_key).await;
    eprintln!(
        "{streams} streams x {shards} shards: one listing reads {query_rows} rows for \
         {query_units} read units by Query, {scan_rows} rows for {scan_units} units by Scan \
         ({again_rows} rows, {again_units} units again in segments)"
    );
    assert_eq!(queried.len(), shards);
    assert_eq!(queried, scanned);
    assert_eq!(scanned, scanned_again);
    let rows = |n: usize| u64::try_from(n).unwrap();
    assert_eq!(query_rows, rows(shards));
    assert_eq!(
        (scan_rows, again_rows),
        (rows(streams * shards), rows(streams * shards))
    );
    // dynalite charges a Scan as an eventually consistent read (half a unit per 4 KB) where
    // DynamoDB charges a consistent one in full, and a single-key row is larger (`leaseKey`).
    assert!(query_units > 0.0, "no consumed capacity reported");
    #[allow(clippy::cast_precision_loss)]
    let ratio = 2.0 * scan_units / query_units;
    assert!(
        ratio > streams as f64 * 0.8,
        "a Scan of {streams} streams costs {ratio:.2}x a Query of one"
    );

    // A watch read costs the rows it names: a unit each (they are under 4 KB).
    let (units, rows) = (by_stream.consumed_read_units(), by_stream.rows_read());
    let ids = [shard(0), shard(1), shard(2)];
    assert_eq!(by_stream.get("s00", &ids).await.expect("get").len(), 3);
    assert!((by_stream.consumed_read_units() - units - 3.0).abs() < f64::EPSILON);
    assert_eq!(by_stream.rows_read() - rows, 3);
}

#[tokio::test]
async fn a_table_with_another_key_is_refused() {
    let client = support::dynamodb_client();
    let table = support::unique_name("not-leases");
    support::create_table_keyed_by(&client, &table, "id").await;
    let store = DynamoLeaseStore::new(client, &table).unwrap();
    let err = store.prepare().await.unwrap_err();
    assert!(
        matches!(&err, LeaseError::Invalid { operation: Operation::DescribeTable, message, .. }
            if message.contains("leaseKey") && message.contains("streamName")
                && message.contains("shardId") && message.contains("id (HASH)")),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_unreachable_endpoint_is_unavailable() {
    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let conf = aws_sdk_dynamodb::config::Builder::from(&support::sdk_config())
        .endpoint_url(format!("http://127.0.0.1:{port}"))
        .retry_config(RetryConfig::disabled())
        .timeout_config(
            TimeoutConfig::builder()
                .operation_timeout(Duration::from_secs(5))
                .build(),
        )
        .build();
    let store = DynamoLeaseStore::new(aws_sdk_dynamodb::Client::from_conf(conf), "leases").unwrap();
    for err in [
        store.prepare().await.unwrap_err(),
        store.list(STREAM).await.unwrap_err(),
        store
            .take(&Lease::new(STREAM, SHARD, vec![]), "a")
            .await
            .unwrap_err(),
    ] {
        assert!(err.is_retryable(), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("`leases`"), "{text}");
        assert!(!text.contains("test"), "credentials leak? {text}");
    }
}

#[tokio::test]
async fn small_pages_are_followed() {
    let table = support::unique_name("leases");
    let store = DynamoLeaseStore::new(support::dynamodb_client(), &table)
        .unwrap()
        .with_scan_page_size(3);
    store.prepare().await.expect("prepare");
    for i in 0..20 {
        assert!(
            store
                .create(&Lease::new(STREAM, shard(i), vec![]))
                .await
                .expect("create")
        );
    }
    // The service really answers such a Query in several pages...
    let page = store
        .client()
        .query()
        .table_name(&table)
        .key_condition_expression("streamName = :s")
        .expression_attribute_values(":s", AttributeValue::S(STREAM.into()))
        .limit(3)
        .consistent_read(true)
        .send()
        .await
        .expect("Query");
    assert_eq!(page.items().len(), 3);
    assert!(page.last_evaluated_key().is_some(), "{page:?}");
    // ...and the store follows them all.
    let listed = store.list(STREAM).await.expect("list");
    let shards: Vec<String> = listed.into_iter().map(|l| l.shard_id).collect();
    assert_eq!(shards, (0..20).map(shard).collect::<Vec<_>>());
}

/// Rewrites every UpdateItem to name an attribute by the bare reserved word `owner` instead of
/// its alias, as a store that forgot to alias a DynamoDB reserved word would send it.
#[derive(Debug)]
struct UnaliasUpdates;

impl Intercept for UnaliasUpdates {
    fn name(&self) -> &'static str {
        "UnaliasUpdates"
    }

    fn modify_before_serialization(
        &self,
        context: &mut BeforeSerializationInterceptorContextMut<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        if let Some(input) = context
            .input_mut()
            .downcast_mut::<aws_sdk_dynamodb::operation::update_item::UpdateItemInput>(
        ) {
            // `#owner` stands for the owner attribute; write the bare reserved word instead.
            for expr in [
                &mut input.update_expression,
                &mut input.condition_expression,
            ]
            .into_iter()
            .flatten()
            {
                *expr = expr.replace("#owner", "owner");
            }
        }
        Ok(())
    }
}

#[tokio::test]
async fn a_reserved_word_clash_is_a_clear_error_naming_the_table_and_the_call() {
    let table = support::unique_name("leases");
    // Prepare the table with a normal client, then write through one that drops the aliases.
    DynamoLeaseStore::new(support::dynamodb_client(), &table)
        .unwrap()
        .prepare()
        .await
        .unwrap();
    let client = aws_sdk_dynamodb::Client::from_conf(
        support::dynamodb_config_builder()
            .interceptor(UnaliasUpdates)
            .build(),
    );
    let store = DynamoLeaseStore::new(client, &table).unwrap();
    let lease = Lease::new(STREAM, SHARD, vec![]);
    assert!(store.create(&lease).await.unwrap());
    let err = store.take(&lease, "a").await.unwrap_err();
    assert!(
        matches!(
            &err,
            LeaseError::Invalid {
                operation: Operation::UpdateItem,
                ..
            }
        ),
        "{err:?} ({})",
        logs()
    );
    let text = err.to_string();
    assert!(
        text.contains(&table) && text.contains("UpdateItem") && text.contains("reserved"),
        "{text}"
    );
    assert!(!err.is_retryable());
}

/// Gives every call up after `0`, as the subscription bounds its calls.
struct GiveUpAfter(Duration);

impl kinesis_dataflow::lease::layer::LeaseLayer for GiveUpAfter {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: kinesis_dataflow::lease::layer::LeaseCall<'a>,
        next: kinesis_dataflow::lease::LeaseFuture<'a, T>,
    ) -> kinesis_dataflow::lease::LeaseFuture<'a, T> {
        let limit = self.0;
        Box::pin(async move {
            tokio::time::timeout(limit, next).await.unwrap_or_else(|_| {
                Err(LeaseError::Unavailable {
                    table: "(test)".to_owned(),
                    operation: call.operation(),
                    message: format!("no answer within {limit:?}"),
                    source: None,
                })
            })
        })
    }
}

/// A single-key table whose one Scan takes longer than a call may: the store learns from the
/// Scans cut short to read the table in parallel segments, so a listing gets through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_cut_short_by_the_time_limit_still_sizes_the_next_one() {
    use support::proxy::{self, Fault, FaultProxy, Rule};

    let client = support::dynamodb_client();
    let table = support::unique_name("slow-scan");
    support::create_table_keyed_by(&client, &table, "leaseKey").await;
    let direct = DynamoLeaseStore::new(client, &table).unwrap();
    fill(&direct, 1, 60).await;

    let dynamodb = FaultProxy::start(&support::dynamodb_endpoint()).await;
    let slow = dynamodb.add(Rule::on("Scan", Fault::Latency(Duration::from_millis(250))));
    // Pages of 5 rows: one Scan of the whole table reads 13 pages, one after the other.
    let store = DynamoLeaseStore::new(
        aws_sdk_dynamodb::Client::from_conf(proxy::dynamodb_config_builder(&dynamodb).build()),
        &table,
    )
    .unwrap()
    .with_scan_page_size(5);
    let bounded = kinesis_dataflow::lease::layer::LayeredStore::new(
        Arc::new(store),
        GiveUpAfter(Duration::from_secs(1)),
    );
    // As a subscription does first: the table's layout is known from then on.
    bounded.prepare().await.expect("prepare");
    let mut outcomes = Vec::new();
    for _ in 0..6 {
        outcomes.push(bounded.list("s00").await.map(|rows| rows.len()));
    }
    assert!(dynamodb.injected(slow) > 0, "{}", dynamodb.summary());
    assert!(
        outcomes.iter().any(|o| matches!(o, Ok(60))),
        "no listing got through: {outcomes:?} ({})",
        logs()
    );
    // A listing cut short names the call it was making.
    if let Some(Err(err)) = outcomes.iter().find(|o| o.is_err()) {
        assert!(err.to_string().contains("Scan"), "{err}");
    }
}
