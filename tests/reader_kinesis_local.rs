//! The shard reader against kinesis-local: iterator types, long iterator chains, shard ends
//! after a split, and clear errors for bad input.

mod support;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use bytes::Bytes;
use futures::StreamExt;
use kinesis_dataflow::api::{KinesisAdmin, SharedKinesis};
use kinesis_dataflow::api::{PutRecordResult, PutRecordsEntry};
use kinesis_dataflow::{
    AwsKinesis, KinesisError, ReadSettings, Record, ShardStream, StartingPoint,
};

const SHARD0: &str = "shardId-000000000000";

fn kinesis() -> SharedKinesis {
    Arc::new(AwsKinesis::new(support::kinesis_client()))
}

fn fast() -> ReadSettings {
    ReadSettings::default()
        .poll_interval(Duration::from_millis(100))
        .unlimited_reads()
}

async fn put(api: &SharedKinesis, stream: &str, payloads: &[String]) -> Vec<(String, String)> {
    let mut stored = Vec::new();
    for chunk in payloads.chunks(500) {
        let entries = chunk
            .iter()
            .map(|p| PutRecordsEntry {
                data: Bytes::from(p.clone()),
                partition_key: "key".into(),
                explicit_hash_key: None,
            })
            .collect();
        let out = api.put_records(stream, entries).await.expect("PutRecords");
        for r in out.results {
            match r {
                PutRecordResult::Stored {
                    shard_id,
                    sequence_number,
                } => stored.push((shard_id, sequence_number)),
                PutRecordResult::Failed { code, message } => panic!("put failed: {code} {message}"),
            }
        }
    }
    stored
}

/// Takes `n` records, failing the test on an error item or after 60 s.
async fn take(stream: &mut ShardStream, n: usize) -> Vec<Record> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let item = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no record after 60 s ({} of {n}); emulator logs: {}",
                    out.len(),
                    support::logs_dir().display()
                )
            });
        match item {
            Some(Ok(r)) => out.push(r),
            Some(Err(e)) => panic!("unexpected error item: {e}"),
            None => panic!("stream ended after {} of {n} records", out.len()),
        }
    }
    out
}

fn text(r: &Record) -> String {
    String::from_utf8(r.data().to_vec()).unwrap()
}

async fn open(api: &SharedKinesis, stream: &str, shard: &str, at: StartingPoint) -> ShardStream {
    ShardStream::builder(api.clone(), stream, shard)
        .settings(fast())
        .open(at)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_iterator_type_starts_on_the_right_record() {
    let api = kinesis();
    let name = support::unique_name("positions");
    support::create_stream(&support::kinesis_client(), &name, 1).await;
    let mut stored = Vec::new();
    for i in 1..=6 {
        stored.extend(put(&api, &name, &[format!("r{i}")]).await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all = take(
        &mut open(&api, &name, SHARD0, StartingPoint::TrimHorizon).await,
        6,
    )
    .await;
    assert_eq!(
        all.iter().map(text).collect::<Vec<_>>(),
        ["r1", "r2", "r3", "r4", "r5", "r6"]
    );
    // Every field the SDK's answer gave is on the record, and the answer's lag too.
    for (record, (shard, sequence_number)) in all.iter().zip(&stored) {
        assert_eq!(record.sequence_number(), sequence_number);
        assert_eq!(record.shard_id(), shard);
        assert_eq!(record.partition_key(), "key");
        assert_eq!(record.stream(), Some(name.as_str()));
        assert!(
            record.millis_behind_latest().is_some(),
            "no lag on {record:?}"
        );
    }

    let second_arrival = all[1].approximate_arrival().expect("arrival time");
    let ms = second_arrival
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let at_time = take(
        &mut open(&api, &name, SHARD0, StartingPoint::AtTimestamp(ms)).await,
        1,
    )
    .await;
    assert_eq!(text(&at_time[0]), "r2", "AT_TIMESTAMP");

    let seq4 = stored[3].1.clone();
    let at_seq = take(
        &mut open(&api, &name, SHARD0, StartingPoint::AtSequence(seq4.clone())).await,
        1,
    )
    .await;
    assert_eq!(text(&at_seq[0]), "r4", "AT_SEQUENCE_NUMBER");
    let after_seq = take(
        &mut open(&api, &name, SHARD0, StartingPoint::AfterSequence(seq4)).await,
        1,
    )
    .await;
    assert_eq!(text(&after_seq[0]), "r5", "AFTER_SEQUENCE_NUMBER");

    let mut latest = open(&api, &name, SHARD0, StartingPoint::Latest).await;
    // Poll once so the LATEST iterator is issued before the next record is written.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), latest.next())
            .await
            .is_err(),
        "LATEST must not return an existing record"
    );
    put(&api, &name, &["r7".to_owned()]).await;
    let next = take(&mut latest, 1).await;
    assert_eq!(text(&next[0]), "r7", "LATEST");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_the_iterator_chain_across_many_reads() {
    let api = kinesis();
    let name = support::unique_name("chain");
    support::create_stream(&support::kinesis_client(), &name, 1).await;
    // Five reads of the default 1,000 records, the last one short. kinesis-local's PutRecords
    // slows as a shard fills (on a 2-core machine this test took 95 s with 10,500, 19 s with these);
    // `CHAIN_RECORDS=10500` runs the longer chain.
    let total: usize = std::env::var("CHAIN_RECORDS")
        .ok()
        .map(|n| n.parse().expect("CHAIN_RECORDS is a number of records"))
        .unwrap_or(4_500);
    let payloads: Vec<String> = (0..total).map(|i| format!("{i:06}")).collect();
    put(&api, &name, &payloads).await;

    // Default settings: 1,000 records a read, at most five reads a second.
    let mut shard = ShardStream::builder(api.clone(), name.as_str(), SHARD0)
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let read = take(&mut shard, total).await;
    for (i, r) in read.iter().enumerate() {
        assert_eq!(text(r), payloads[i], "record {i} out of place");
    }
    let mut seqs: Vec<&str> = read.iter().map(Record::sequence_number).collect();
    seqs.dedup();
    assert_eq!(seqs.len(), total, "a sequence number repeated");
    // Nothing more: the next poll finds no record.
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), shard.next())
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_parent_read_to_its_end_reports_both_children() {
    let api = kinesis();
    let client = support::kinesis_client();
    let name = support::unique_name("split");
    support::create_stream(&client, &name, 1).await;
    let payloads: Vec<String> = (0..3).map(|i| format!("before-split-{i}")).collect();
    put(&api, &name, &payloads).await;
    AwsKinesis::new(client.clone())
        .split_shard(&name, SHARD0, &(u128::MAX / 2).to_string())
        .await
        .expect("SplitShard");
    support::wait_active(&client, &name).await;
    put(&api, &name, &["after-split".to_owned()]).await;

    let mut parent = open(&api, &name, SHARD0, StartingPoint::TrimHorizon).await;
    let read = take(&mut parent, 3).await;
    assert_eq!(read.iter().map(text).collect::<Vec<_>>(), payloads);
    let end = tokio::time::timeout(Duration::from_secs(30), parent.next())
        .await
        .expect("the parent's end within 30 s");
    assert!(end.is_none(), "the parent stream must end, got {end:?}");
    let shard_end = parent.shard_end().expect("shard end reported");
    let mut children: Vec<_> = shard_end
        .child_shards
        .iter()
        .map(|c| c.shard_id.clone())
        .collect();
    children.sort();
    assert_eq!(children.len(), 2, "{shard_end:?}");
    for child in &shard_end.child_shards {
        assert_eq!(child.parent_shards, [SHARD0]);
    }
    assert_eq!(
        shard_end.last_sequence_number.as_deref(),
        Some(read[2].sequence_number())
    );
}

async fn first_error(mut stream: ShardStream) -> KinesisError {
    let item = tokio::time::timeout(Duration::from_secs(30), stream.next())
        .await
        .expect("an answer within 30 s");
    let err = match item {
        Some(Err(e)) => e,
        other => panic!("expected an error, got {other:?}"),
    };
    let after = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("the stream ends at once after a bad-input error");
    assert!(after.is_none(), "stream went on after {err}: {after:?}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_clear_error() {
    let api = kinesis();
    let name = support::unique_name("badinput");
    support::create_stream(&support::kinesis_client(), &name, 2).await;

    let missing = support::unique_name("no-such-stream");
    let err = first_error(open(&api, &missing, SHARD0, StartingPoint::TrimHorizon).await).await;
    assert!(
        matches!(err, KinesisError::StreamNotFound { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains(&missing) && msg.contains("us-east-1"), "{msg}");

    let err = first_error(
        open(
            &api,
            &name,
            "shardId-000000000099",
            StartingPoint::TrimHorizon,
        )
        .await,
    )
    .await;
    assert!(matches!(err, KinesisError::ShardNotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("shardId-000000000099"), "{err}");

    // A sequence number of shard 1 used on shard 0. (kinesis-local accepts one on an empty
    // shard, so shard 0 holds a record too; the service refuses it either way.)
    put(&api, &name, &["on-shard-0".to_owned()]).await;
    let key_for_shard1 = (0..1000)
        .map(|i| format!("k{i}"))
        .find(|k| kinesis_dataflow::api::memory::hash_key(k) > u128::MAX / 2)
        .unwrap();
    let out = api
        .put_records(
            &name,
            vec![PutRecordsEntry {
                data: Bytes::from_static(b"x"),
                partition_key: key_for_shard1,
                explicit_hash_key: None,
            }],
        )
        .await
        .unwrap();
    let PutRecordResult::Stored {
        shard_id,
        sequence_number,
    } = &out.results[0]
    else {
        panic!("{out:?}")
    };
    assert_eq!(shard_id, "shardId-000000000001");
    let err = first_error(
        open(
            &api,
            &name,
            SHARD0,
            StartingPoint::AtSequence(sequence_number.clone()),
        )
        .await,
    )
    .await;
    assert!(
        matches!(err, KinesisError::InvalidArgument { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains(SHARD0) || err.to_string().contains(sequence_number.as_str()),
        "{err}"
    );
}
