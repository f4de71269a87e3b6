//! Broken and extreme KPL aggregates through a de-aggregating subscription on kinesis-local,
//! with its leases in dynalite: each has one clear behaviour, nothing wedges the shard, and the
//! checkpoint passes them all, so a restart reads none of them again.
//!
//! - a truncated aggregate and one with a wrong MD5 are handed on as plain records (the KCL's
//!   rule: such a record is not an aggregate);
//! - an index out of range fails that user record only, as an error item naming the shard,
//!   the sequence number and the sub-sequence number; the user records around it come;
//! - an aggregate of no user records yields nothing;
//! - an aggregate of 1 MiB holding tens of thousands of tiny user records yields each, in order;
//! - an empty partition key in the aggregate's table is handed on as it is.

mod support;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use bytes::Bytes;
use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::kpl::aggregate;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    AwsKinesis, DynamoLeaseStore, KinesisError, KinesisPosition, ReadSettings, Subscription,
};
use md5::{Digest, Md5};
use prost::Message;

const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];
/// Tiny user records in the 1 MiB aggregate.
const TINY: u32 = 90_000;

/// The format's messages, written out here so that the test can build what this crate's
/// `aggregate` never would (an index out of range).
#[derive(Clone, PartialEq, Message)]
struct AggregatedRecord {
    #[prost(string, repeated, tag = "1")]
    partition_key_table: Vec<String>,
    #[prost(message, repeated, tag = "3")]
    records: Vec<UserRecord>,
}

#[derive(Clone, PartialEq, Message)]
struct UserRecord {
    #[prost(uint64, tag = "1")]
    partition_key_index: u64,
    #[prost(bytes = "vec", tag = "3")]
    data: Vec<u8>,
}

fn framed(message: &AggregatedRecord) -> Vec<u8> {
    let body = message.encode_to_vec();
    let mut data = MAGIC.to_vec();
    data.extend_from_slice(&body);
    data.extend_from_slice(&Md5::digest(&body));
    data
}

/// What one put should come out as: user records (key, payload), or an error item for one
/// user record (its sub-sequence number).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Out {
    User(String, Vec<u8>),
    Failed(u64),
}

fn user(key: &str, data: &[u8]) -> Out {
    Out::User(key.to_owned(), data.to_vec())
}

/// The puts (partition key, data) and what each yields.
fn workload() -> Vec<(String, Vec<u8>, Vec<Out>)> {
    let good = aggregate([
        ("a", None, &b"a0"[..]),
        ("a", None, b"a1"),
        ("a", None, b"a2"),
    ]);
    let truncated = good[..20].to_vec();
    let mut bad_digest = good.to_vec();
    *bad_digest.last_mut().unwrap() ^= 0x55;
    let out_of_range = framed(&AggregatedRecord {
        partition_key_table: vec!["b".into()],
        records: vec![
            UserRecord {
                partition_key_index: 0,
                data: b"b0".to_vec(),
            },
            UserRecord {
                partition_key_index: 5,
                data: b"b1".to_vec(),
            },
            UserRecord {
                partition_key_index: 0,
                data: b"b2".to_vec(),
            },
        ],
    });
    let tiny: Vec<[u8; 4]> = (0..TINY).map(u32::to_le_bytes).collect();
    let big = aggregate(tiny.iter().map(|d| ("t", None, &d[..])));
    assert!(
        big.len() < 1 << 20 && big.len() > 900_000,
        "the big aggregate is just under the 1 MiB record limit: {} bytes",
        big.len()
    );
    let tiny_out: Vec<Out> = tiny.iter().map(|d| user("t", d)).collect();
    vec![
        (
            "agg".into(),
            good.to_vec(),
            vec![user("a", b"a0"), user("a", b"a1"), user("a", b"a2")],
        ),
        (
            "trunc".into(),
            truncated.clone(),
            vec![user("trunc", &truncated)],
        ),
        (
            "md5".into(),
            bad_digest.clone(),
            vec![user("md5", &bad_digest)],
        ),
        (
            "range".into(),
            out_of_range,
            vec![user("b", b"b0"), Out::Failed(1), user("b", b"b2")],
        ),
        ("none".into(), aggregate([]).to_vec(), Vec::new()),
        ("big".into(), big.to_vec(), tiny_out),
        (
            "empty".into(),
            aggregate([("", None, &b"empty key"[..])]).to_vec(),
            vec![user("", b"empty key")],
        ),
        ("end".into(), b"end".to_vec(), vec![user("end", b"end")]),
    ]
}

async fn subscription(api: &SharedKinesis, store: &DynamoLeaseStore, stream: &str) -> Subscription {
    support::reading::fast(api, Arc::new(store.clone()), stream, "bad-input")
        .read_settings(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(50))
                .unlimited_reads()
                .deaggregate(true),
        )
        .initial_position(KinesisPosition::horizon())
        .start()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_and_extreme_aggregates_each_behave_and_nothing_wedges() {
    let client = support::kinesis_client();
    let stream = support::unique_name("kpl-bad");
    support::create_stream(&client, &stream, 1).await;
    let mut expected = Vec::new();
    let mut sequence_of_range = String::new();
    let mut last = String::new();
    for (key, data, out) in workload() {
        let put = client
            .put_record()
            .stream_name(&stream)
            .partition_key(&key)
            .data(Blob::new(data))
            .send()
            .await
            .unwrap_or_else(|e| panic!("put {key}: {e:?}"));
        if key == "range" {
            sequence_of_range = put.sequence_number.clone();
        }
        last = put.sequence_number;
        expected.extend(out);
    }
    let api: SharedKinesis = Arc::new(AwsKinesis::new(client.clone()));
    let store =
        DynamoLeaseStore::new(support::dynamodb_client(), support::unique_name("leases")).unwrap();
    let mut sub = subscription(&api, &store, &stream).await;

    let mut got = Vec::with_capacity(expected.len());
    while got.len() < expected.len() {
        let item = tokio::time::timeout(Duration::from_secs(60), sub.next())
            .await
            .unwrap_or_else(|_| panic!("wedged after {} of {} items", got.len(), expected.len()))
            .expect("the subscription runs");
        match item {
            Ok(delivery) => {
                got.push(user(delivery.partition_key(), delivery.data()));
                delivery.ack();
            }
            // A slow emulator's timeouts are retried: only the user record's error counts.
            Err(e) if e.is_retryable() => eprintln!("retried: {e}"),
            Err(e) => got.push(failed(&e, &stream, &sequence_of_range)),
        }
    }
    let first_wrong = got.iter().zip(&expected).position(|(g, e)| g != e);
    assert_eq!(first_wrong, None, "items in order as each rule says");

    // Every item settled: the checkpoint passes all of them.
    sub.shutdown().await;
    let rows = store.list(&stream).await.unwrap();
    assert_eq!(rows[0].checkpoint, Some(Checkpoint::Sequence(last)));

    // Started again: nothing of the above comes back, the next record does.
    client
        .put_record()
        .stream_name(&stream)
        .partition_key("after")
        .data(Blob::new(&b"after"[..]))
        .send()
        .await
        .unwrap();
    let mut sub = subscription(&api, &store, &stream).await;
    let next = tokio::time::timeout(Duration::from_secs(30), sub.next())
        .await
        .expect("the next record in time")
        .expect("the subscription runs")
        .expect("no error");
    assert_eq!(next.data(), &Bytes::from_static(b"after"));
    next.ack();
    sub.shutdown().await;
}

/// The error item for the user record whose index is out of range: names the shard, the
/// aggregate's sequence number and the user record's place.
fn failed(e: &KinesisError, stream: &str, sequence_number: &str) -> Out {
    let message = e.to_string();
    for part in [stream, "shardId-000000000000", sequence_number, "index 5"] {
        assert!(message.contains(part), "{message:?} names {part:?}");
    }
    match e {
        KinesisError::InvalidUserRecord {
            sub_sequence_number,
            ..
        } => Out::Failed(*sub_sequence_number),
        other => panic!("an invalid user record, not {other}"),
    }
}
