//! One scripted scenario, run against the in-memory transport and against kinesis-local: the
//! two must agree on everything the reader relies on (hash routing, shard layout and lineage,
//! iterator positions, shard ends, and how bad input fails).
//!
//! The stream has three shards: for two, kinesis-local puts the boundary one hash key lower
//! than the service does (2^127 - 1 instead of 2^127); the in-memory transport follows the
//! service.

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use kinesis_dataflow::api::{KinesisAdmin, SharedKinesis};
use kinesis_dataflow::api::{PutRecordResult, PutRecordsEntry, StreamStatus};
use kinesis_dataflow::{
    AwsKinesis, KinesisError, MemoryKinesis, ReadSettings, Record, ShardStream, StartingPoint,
};

#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    /// Shard id -> (starting hash key, ending hash key, parents, closed).
    layout: BTreeMap<String, (String, String, Vec<String>, bool)>,
    /// Shard id -> the payloads read from TRIM_HORIZON, in order.
    contents: BTreeMap<String, Vec<String>>,
    at_sequence: String,
    after_sequence: String,
    split_children: Vec<(String, Vec<String>)>,
    merge_children: Vec<(String, Vec<String>)>,
    unknown_shard: &'static str,
    foreign_sequence: &'static str,
}

fn kind(e: &KinesisError) -> &'static str {
    match e {
        KinesisError::StreamNotFound { .. } => "StreamNotFound",
        KinesisError::ShardNotFound { .. } => "ShardNotFound",
        KinesisError::InvalidArgument { .. } => "InvalidArgument",
        _ => "other",
    }
}

async fn wait_active(api: &SharedKinesis, stream: &str) {
    for _ in 0..300 {
        if api.describe_stream_summary(stream).await.unwrap().status == StreamStatus::Active {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("stream {stream} not ACTIVE after 30 s");
}

async fn layout(
    api: &SharedKinesis,
    stream: &str,
) -> BTreeMap<String, (String, String, Vec<String>, bool)> {
    let mut out = BTreeMap::new();
    let mut token = None;
    loop {
        let page = api.list_shards(stream, token).await.unwrap();
        for s in page.shards {
            let parents = s.parents().map(str::to_owned).collect();
            out.insert(
                s.shard_id.clone(),
                (
                    s.starting_hash_key.clone(),
                    s.ending_hash_key.clone(),
                    parents,
                    s.ending_sequence_number.is_some(),
                ),
            );
        }
        token = page.next_token;
        if token.is_none() {
            return out;
        }
    }
}

fn text(r: &Record) -> String {
    String::from_utf8(r.data().to_vec()).unwrap()
}

fn settings() -> ReadSettings {
    ReadSettings::default()
        .poll_interval(Duration::from_millis(50))
        .unlimited_reads()
}

/// Reads `n` records of a shard from `at`.
async fn read_n(
    api: &SharedKinesis,
    stream: &str,
    shard: &str,
    at: StartingPoint,
    n: usize,
) -> Vec<Record> {
    let mut s = ShardStream::builder(api.clone(), stream, shard)
        .settings(settings())
        .open(at)
        .unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(30), s.next()).await {
            Ok(Some(Ok(r))) => out.push(r),
            other => panic!("reading {shard}: {other:?}"),
        }
    }
    out
}

/// Reads a closed shard to its end; returns its payloads and children.
async fn read_to_end(
    api: &SharedKinesis,
    stream: &str,
    shard: &str,
) -> (Vec<String>, Vec<(String, Vec<String>)>) {
    let mut s = ShardStream::builder(api.clone(), stream, shard)
        .settings(settings())
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let mut payloads = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(30), s.next()).await {
            Ok(Some(Ok(r))) => payloads.push(text(&r)),
            Ok(None) => break,
            other => panic!("reading {shard} to its end: {other:?}"),
        }
    }
    let mut children: Vec<_> = s
        .shard_end()
        .expect("shard end")
        .child_shards
        .iter()
        .map(|c| {
            let mut parents = c.parent_shards.clone();
            parents.sort();
            (c.shard_id.clone(), parents)
        })
        .collect();
    children.sort();
    (payloads, children)
}

async fn first_error(
    api: &SharedKinesis,
    stream: &str,
    shard: &str,
    at: StartingPoint,
) -> KinesisError {
    let mut s = ShardStream::builder(api.clone(), stream, shard)
        .settings(settings())
        .open(at)
        .unwrap();
    match tokio::time::timeout(Duration::from_secs(30), s.next()).await {
        Ok(Some(Err(e))) => e,
        other => panic!("expected an error: {other:?}"),
    }
}

async fn put(
    api: &SharedKinesis,
    stream: &str,
    range: std::ops::Range<usize>,
) -> Vec<(String, String, String)> {
    let entries = range
        .clone()
        .map(|n| PutRecordsEntry {
            data: Bytes::from(format!("customer-{}:{n}", n % 8)),
            partition_key: format!("customer-{}", n % 8),
            explicit_hash_key: None,
        })
        .collect();
    let out = api.put_records(stream, entries).await.unwrap();
    out.results
        .into_iter()
        .zip(range)
        .map(|(r, n)| match r {
            PutRecordResult::Stored {
                shard_id,
                sequence_number,
            } => (shard_id, sequence_number, format!("customer-{}:{n}", n % 8)),
            PutRecordResult::Failed { code, message } => panic!("{code}: {message}"),
        })
        .collect()
}

async fn scenario(admin: Arc<dyn KinesisAdmin>, stream: &str) -> Outcome {
    let api: SharedKinesis = admin.clone();
    admin.create_stream(stream, 3).await.unwrap();
    wait_active(&api, stream).await;
    let stored = put(&api, stream, 0..40).await;

    let mut contents = BTreeMap::new();
    for shard in [
        "shardId-000000000000",
        "shardId-000000000001",
        "shardId-000000000002",
    ] {
        let n = stored.iter().filter(|(s, _, _)| s == shard).count();
        let read = read_n(&api, stream, shard, StartingPoint::TrimHorizon, n).await;
        contents.insert(shard.to_owned(), read.iter().map(text).collect::<Vec<_>>());
    }
    let on_shard0: Vec<_> = stored
        .iter()
        .filter(|(s, _, _)| s == "shardId-000000000000")
        .collect();
    let third = on_shard0[2].1.clone();
    let at_sequence = text(
        &read_n(
            &api,
            stream,
            "shardId-000000000000",
            StartingPoint::AtSequence(third.clone()),
            1,
        )
        .await[0],
    );
    let after_sequence = text(
        &read_n(
            &api,
            stream,
            "shardId-000000000000",
            StartingPoint::AfterSequence(third),
            1,
        )
        .await[0],
    );

    let unknown_shard = kind(
        &first_error(
            &api,
            stream,
            "shardId-000000000042",
            StartingPoint::TrimHorizon,
        )
        .await,
    );
    let on_shard1 = stored
        .iter()
        .find(|(s, _, _)| s == "shardId-000000000001")
        .unwrap();
    let foreign_sequence = kind(
        &first_error(
            &api,
            stream,
            "shardId-000000000000",
            StartingPoint::AtSequence(on_shard1.1.clone()),
        )
        .await,
    );

    // Split shard 0 in the middle of its range, then merge the two children back.
    let mid = (u128::MAX / 4).to_string();
    admin
        .split_shard(stream, "shardId-000000000000", &mid)
        .await
        .unwrap();
    wait_active(&api, stream).await;
    let (_, split_children) = read_to_end(&api, stream, "shardId-000000000000").await;
    admin
        .merge_shards(stream, "shardId-000000000003", "shardId-000000000004")
        .await
        .unwrap();
    wait_active(&api, stream).await;
    let (_, merge_children) = read_to_end(&api, stream, "shardId-000000000003").await;

    Outcome {
        layout: layout(&api, stream).await,
        contents,
        at_sequence,
        after_sequence,
        split_children,
        merge_children,
        unknown_shard,
        foreign_sequence,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_and_kinesis_local_agree() {
    let stream = support::unique_name("agree");
    let memory = scenario(Arc::new(MemoryKinesis::new()), &stream).await;
    let local = scenario(
        Arc::new(AwsKinesis::new(support::kinesis_client())),
        &stream,
    )
    .await;
    assert_eq!(
        memory,
        local,
        "emulator logs: {}",
        support::logs_dir().display()
    );
    // The scenario means something: both shards got records, and the lineage is complete.
    assert!(memory.contents.values().all(|v| !v.is_empty()));
    assert_eq!(memory.layout.len(), 6);
    assert_eq!(memory.merge_children.len(), 1);
}
