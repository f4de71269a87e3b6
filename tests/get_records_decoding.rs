//! GetRecords answers are decoded by the transport itself (`src/api/aws/decode.rs`), not by
//! the SDK: against kinesis-local, every answer it decodes must say what the SDK's decoding of
//! the same answer says, for keys and payloads that need escapes and every base64 letter,
//! up to a closed shard's last answer with its children.

mod support;

use std::sync::Arc;
use std::time::SystemTime;

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};
use kinesis_dataflow::AwsKinesis;
use kinesis_dataflow::api::{ChildShard, KinesisApi};

const SHARD0: &str = "shardId-000000000000";

/// Keys that JSON escapes or that are not ASCII.
const KEYS: [&str; 7] = [
    "plain",
    "quote \" inside",
    "back\\slash",
    "slash/key",
    "tab\tand\nline",
    "ключ",
    "🦀 emoji",
];

/// Payloads of every length from 1 to 600 bytes and one of 200 KiB, of bytes that give
/// every base64 letter.
fn payloads() -> Vec<Vec<u8>> {
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed.to_le_bytes()[3]
    };
    let mut out: Vec<Vec<u8>> = (1..=600)
        .map(|n| (0..n).map(|_| next()).collect())
        .collect();
    out.push((0..200 * 1024).map(|_| next()).collect());
    out
}

#[derive(Debug, PartialEq)]
struct Seen {
    sequence_number: String,
    partition_key: String,
    data: Vec<u8>,
    arrival: Option<SystemTime>,
}

#[derive(Debug, PartialEq)]
struct Answer {
    records: Vec<Seen>,
    has_next: bool,
    has_millis_behind: bool,
    children: Vec<ChildShard>,
}

async fn by_sdk(client: &aws_sdk_kinesis::Client, iterator: &str) -> (Answer, Option<String>) {
    let out = client
        .get_records()
        .shard_iterator(iterator)
        .limit(250)
        .send()
        .await
        .expect("GetRecords through the SDK");
    let answer = Answer {
        records: out
            .records
            .into_iter()
            .map(|r| Seen {
                sequence_number: r.sequence_number,
                partition_key: r.partition_key.unwrap_or_default(),
                data: r.data.into_inner(),
                arrival: r
                    .approximate_arrival_timestamp
                    .and_then(|t| SystemTime::try_from(t).ok()),
            })
            .collect(),
        has_next: out.next_shard_iterator.is_some(),
        has_millis_behind: out.millis_behind_latest.is_some(),
        children: out
            .child_shards
            .unwrap_or_default()
            .into_iter()
            .map(|c| ChildShard {
                shard_id: c.shard_id,
                parent_shards: c.parent_shards,
            })
            .collect(),
    };
    (answer, out.next_shard_iterator)
}

async fn by_transport(api: &AwsKinesis, stream: &str, iterator: &str) -> Answer {
    let out = api
        .get_records(stream, &Arc::from(SHARD0), iterator.to_owned(), 250)
        .await
        .expect("GetRecords through the transport");
    Answer {
        records: out
            .records
            .iter()
            .map(|r| Seen {
                sequence_number: r.sequence_number().to_owned(),
                partition_key: r.partition_key().to_owned(),
                data: r.data().to_vec(),
                arrival: r.approximate_arrival(),
            })
            .collect(),
        has_next: out.next_shard_iterator.is_some(),
        has_millis_behind: out.millis_behind_latest.is_some(),
        children: out.child_shards,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_transport_decodes_every_answer_as_the_sdk_does() {
    support::events::record_events();
    let client = support::kinesis_client();
    let api = AwsKinesis::new(client.clone());
    let stream = support::unique_name("decoding");
    support::create_stream(&client, &stream, 1).await;

    let payloads = payloads();
    for chunk in payloads.chunks(100) {
        let mut request = client.put_records().stream_name(&stream);
        for (i, data) in chunk.iter().enumerate() {
            let entry = PutRecordsRequestEntry::builder()
                .partition_key(KEYS[i % KEYS.len()])
                .data(Blob::new(data.clone()))
                .build()
                .expect("entry");
            request = request.records(entry);
        }
        let out = request.send().await.expect("PutRecords");
        assert_eq!(out.failed_record_count, Some(0));
    }
    client
        .split_shard()
        .stream_name(&stream)
        .shard_to_split(SHARD0)
        .new_starting_hash_key("170141183460469231731687303715884105728")
        .send()
        .await
        .expect("SplitShard");
    support::wait_active(&client, &stream).await;

    let mut iterator = client
        .get_shard_iterator()
        .stream_name(&stream)
        .shard_id(SHARD0)
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .expect("GetShardIterator")
        .shard_iterator
        .expect("an iterator");
    let (mut records, mut calls) = (0, 0);
    loop {
        // Through the transport's own client, outside its GetRecords: the SDK decodes.
        let (expected, next) = by_sdk(api.client(), &iterator).await;
        let decoded = by_transport(&api, &stream, &iterator).await;
        calls += 1;
        assert_eq!(decoded, expected, "answer {calls}");
        records += decoded.records.len();
        match next {
            Some(next) => iterator = next,
            None => {
                assert_eq!(decoded.children.len(), 2, "the closed shard's children");
                break;
            }
        }
        assert!(calls < 1_000, "the closed shard never ended");
    }
    assert_eq!(records, payloads.len());
    let decoded = support::events::events("GetRecords answer decoded");
    assert_eq!(
        decoded.len(),
        calls,
        "every answer decoded by the transport"
    );
    let left = support::events::events("GetRecords answer left to the SDK's decoder");
    assert!(
        left.is_empty(),
        "answers the transport did not decode: {left:?}"
    );
}
