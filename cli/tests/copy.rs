//! `lease-table copy` against kinesis-local and dynalite: an application that began on a
//! single-key lease table (as earlier versions created them) moves to a by-stream table while
//! stopped, and resumes there without reading anything again. Refused while it runs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use common::cli;
use kinesis_dataflow::lease::{KeyLayout, LeaseStore};
use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore, Subscription};
use kinesis_dataflow_test_support as support;

mod common;

/// A subscription of `owner` on `stream` with `store`, quick to list and stop.
async fn start(stream: &str, store: DynamoLeaseStore, owner: &str) -> Subscription {
    let api = Arc::new(AwsKinesis::new(support::kinesis_client()));
    common::quick_subscription(api, Arc::new(store), stream, owner)
        .start()
        .await
        .expect("the subscription starts")
}

/// Puts `tag-0..count`, keys spread over the shards; their payloads.
async fn put(stream: &str, tag: &str, count: usize) -> BTreeSet<String> {
    let client = support::kinesis_client();
    let mut payloads = BTreeSet::new();
    for i in 0..count {
        let data = format!("{tag}-{i:02}");
        client
            .put_record()
            .stream_name(stream)
            .partition_key(format!("key-{i}"))
            .data(Blob::new(data.clone()))
            .send()
            .await
            .expect("PutRecord");
        payloads.insert(data);
    }
    payloads
}

/// `status` of `stream` on `table`, without reading the stream (`--records-cap 0`); succeeds.
async fn run_status(table: &str, stream: &str, extra: &[&str]) -> common::Run {
    let args = [
        "status",
        "--table",
        table,
        "--stream",
        stream,
        "--records-cap",
        "0",
    ];
    cli(&[&args[..], extra].concat()).await.ok()
}

/// `status --json` of `stream` on `table`.
async fn status_json(table: &str, stream: &str) -> serde_json::Value {
    run_status(table, stream, &["--json"]).await.json()
}

/// What `sub` delivers within `quiet` of quiet, acked.
async fn drain(sub: &mut Subscription, quiet: Duration) -> Vec<String> {
    use futures::StreamExt;
    let mut got = Vec::new();
    while let Ok(Some(Ok(delivery))) = tokio::time::timeout(quiet, sub.next()).await {
        got.push(String::from_utf8_lossy(delivery.data()).into_owned());
        delivery.ack();
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_key_table_is_copied_while_stopped_and_the_application_resumes_on_the_copy() {
    support::init_tracing();
    let dynamodb = support::dynamodb_client();
    let stream = support::unique_name("copy");
    support::create_stream(&support::kinesis_client(), &stream, 2).await;
    let old = support::unique_name("copy-old");
    let new = support::unique_name("copy-new");
    support::create_table_keyed_by(&dynamodb, &old, "leaseKey").await;
    let old_store = || DynamoLeaseStore::new(dynamodb.clone(), &old).unwrap();

    // The application reads everything on the old table.
    let mut sub = start(&stream, old_store(), "instance-a").await;
    let first = put(&stream, "first", 12).await;
    support::read_until(
        &mut sub,
        &first,
        "the first records",
        Duration::from_secs(20),
    )
    .await;

    // `status` says what the old table costs and how to move.
    let status = run_status(&old, &stream, &[]).await;
    assert!(
        status.stdout.contains("keyed by leaseKey alone")
            && status.stdout.contains("lease-table copy"),
        "{status:#?}"
    );
    let json = status_json(&old, &stream).await;
    assert_eq!(json["key_layout"], "single_key", "{json:#}");

    // While it runs, the copy is refused and writes nothing.
    let copy = [
        "lease-table",
        "copy",
        "--from",
        &old,
        "--to",
        &new,
        "--lease-duration",
        "1",
    ];
    let refused = cli(&copy).await;
    assert_eq!(refused.code, 3, "{refused:#?}");
    assert!(
        refused.stderr.contains("stop the application first") && refused.stderr.contains(&old),
        "{refused:#?}"
    );
    let described = dynamodb.describe_table().table_name(&new).send().await;
    assert!(described.is_err(), "the copy created {new}");

    // Stopped: a dry run says what it would copy, then the copy is made, and made again
    // harmlessly.
    sub.shutdown().await;
    let dry = cli(&[&copy[..], &["--dry-run"]].concat()).await.ok();
    assert!(
        dry.stdout.contains(&format!("{stream}: 2 shard rows")),
        "{dry:#?}"
    );
    assert!(
        dynamodb
            .describe_table()
            .table_name(&new)
            .send()
            .await
            .is_err()
    );
    let done = cli(&copy).await.ok();
    assert!(
        done.stdout.contains("copied 2 shard rows of 1 streams") && done.stdout.contains(&new),
        "{done:#?}"
    );
    let again = cli(&copy).await.ok();
    assert!(
        again.stdout.contains("copied 0 shard rows of 1 streams"),
        "{again:#?}"
    );
    assert!(again.stdout.contains("(2 already there)"), "{again:#?}");

    // The copy is keyed by stream, holds the checkpoints, and no owner or instance row.
    let new_store = DynamoLeaseStore::new(dynamodb.clone(), &new).unwrap();
    assert_eq!(new_store.key_layout().await.unwrap(), KeyLayout::ByStream);
    let old_rows = old_store().list(&stream).await.unwrap();
    let new_rows = new_store.list(&stream).await.unwrap();
    let shard_rows: Vec<_> = old_rows
        .iter()
        .filter(|r| !r.shard_id.starts_with("worker:"))
        .collect();
    assert_eq!(new_rows.len(), shard_rows.len(), "{new_rows:?}");
    for (copied, original) in new_rows.iter().zip(shard_rows) {
        assert_eq!(copied.shard_id, original.shard_id);
        assert_eq!(copied.checkpoint, original.checkpoint);
        assert!(copied.checkpoint.is_some(), "{copied:?}");
        assert_eq!(copied.owner, None);
    }

    let status = run_status(&new, &stream, &[]).await;
    assert!(!status.stdout.contains("leaseKey"), "{status:#?}");

    // The application resumes on the copy: only what came since, nothing read again.
    let second = put(&stream, "second", 6).await;
    let mut sub = start(&stream, new_store, "instance-b").await;
    let mut got = support::read_until(
        &mut sub,
        &second,
        "the new records",
        Duration::from_secs(20),
    )
    .await
    .into_iter()
    .map(|(_, payload)| payload)
    .collect::<Vec<_>>();
    got.extend(drain(&mut sub, Duration::from_secs(2)).await);
    sub.shutdown().await;
    got.sort();
    assert_eq!(got, second.into_iter().collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_through_the_copy_can_no_longer_write_the_old_table() {
    use kinesis_dataflow::lease::Lease;
    use kinesis_dataflow::position::Checkpoint;

    support::init_tracing();
    let dynamodb = support::dynamodb_client();
    let old = support::unique_name("copy-frozen-old");
    let new = support::unique_name("copy-frozen-new");
    support::create_table_keyed_by(&dynamodb, &old, "leaseKey").await;
    let old_store = DynamoLeaseStore::new(dynamodb.clone(), &old).unwrap();

    // An instance holds a lease on the old table, then freezes (no renewal) past the watch.
    let mut lease = Lease::new("frozen", "shardId-000000000000", vec![]);
    lease.checkpoint = Some(Checkpoint::Sequence("42".into()));
    assert!(old_store.create(&lease).await.unwrap());
    let held = old_store.take(&lease, "frozen").await.unwrap();

    let copy = [
        "lease-table",
        "copy",
        "--from",
        &old,
        "--to",
        &new,
        "--lease-duration",
        "1",
    ];
    let done = cli(&copy).await.ok();
    assert!(
        done.stdout.contains("copied 1 shard rows of 1 streams"),
        "{done:#?}"
    );

    // Resumed, it can write the old table no more: neither renew nor checkpoint.
    let renewed = old_store.renew(&held).await;
    assert!(
        matches!(&renewed, Err(e) if e.is_lost()),
        "a renewal after the copy: {renewed:?}"
    );
    let checkpointed = old_store
        .checkpoint(&held, &Checkpoint::Sequence("43".into()))
        .await;
    assert!(
        matches!(&checkpointed, Err(e) if e.is_lost()),
        "a checkpoint after the copy: {checkpointed:?}"
    );

    // The copy holds the checkpoint, without an owner.
    let new_store = DynamoLeaseStore::new(dynamodb.clone(), &new).unwrap();
    let rows = new_store.list("frozen").await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].checkpoint, lease.checkpoint);
    assert_eq!(rows[0].owner, None);

    // Run again, the copy finishes harmlessly over its own fence.
    let again = cli(&copy).await.ok();
    assert!(again.stdout.contains("(1 already there)"), "{again:#?}");
}
