//! GetRecords answers are decoded by the transport itself (`src/api/aws/decode.rs`), not by
//! the SDK: every answer it decodes must say what the SDK's decoding of the same answer says.
//! Against kinesis-local: keys and payloads that need escapes and every base64 letter, up to a
//! closed shard's last answer with its children. In process, through the SDK's whole call
//! path with an HTTP client that answers from a list: members missing or null, both forms of
//! timestamp, bodies the transport leaves to the SDK, and an answer after a retried error.

mod support;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use aws_sdk_kinesis::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_runtime_api::http::StatusCode;
use aws_smithy_types::body::SdkBody;
use kinesis_dataflow::AwsKinesis;
use kinesis_dataflow::api::{ChildShard, KinesisApi};
use tracing::Instrument;

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

/// What either decoding made of an answer.
#[derive(Debug, PartialEq)]
struct Answer {
    records: Vec<Seen>,
    next: Option<String>,
    millis_behind: Option<u64>,
    children: Vec<ChildShard>,
}

async fn by_sdk(client: &aws_sdk_kinesis::Client, iterator: &str) -> Result<Answer, String> {
    let out = client
        .get_records()
        .shard_iterator(iterator)
        .limit(250)
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(Answer {
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
        next: out.next_shard_iterator,
        millis_behind: out
            .millis_behind_latest
            .map(|m| u64::try_from(m).unwrap_or(0)),
        children: out
            .child_shards
            .unwrap_or_default()
            .into_iter()
            .map(|c| ChildShard {
                shard_id: c.shard_id,
                parent_shards: c.parent_shards,
            })
            .collect(),
    })
}

/// Through the transport, in a span naming `test` (the two tests of this binary run side by
/// side, and count their own events).
async fn by_transport(
    api: &AwsKinesis,
    stream: &str,
    iterator: &str,
    test: &'static str,
) -> Result<Answer, String> {
    let out = api
        .get_records(stream, &Arc::from(SHARD0), iterator.to_owned(), 250)
        .instrument(tracing::info_span!("case", test))
        .await
        .map_err(|e| format!("{e:?}"))?;
    Ok(Answer {
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
        next: out.next_shard_iterator,
        millis_behind: out.millis_behind_latest,
        children: out.child_shards,
    })
}

/// The events logged with `message` inside the span of test `test` (the two tests of this
/// binary run side by side).
fn events_of(message: &str, test: &str) -> Vec<support::events::Fields> {
    support::events::events(message)
        .into_iter()
        .filter(|fields| fields.get("test").map(String::as_str) == Some(test))
        .collect()
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
        let expected = by_sdk(api.client(), &iterator)
            .await
            .expect("through the SDK");
        let decoded = by_transport(&api, &stream, &iterator, "emulator")
            .await
            .expect("through the transport");
        calls += 1;
        // Iterators and lags are the emulator's to choose from call to call.
        assert_eq!(decoded.records, expected.records, "answer {calls}");
        assert_eq!(decoded.children, expected.children, "answer {calls}");
        assert_eq!(
            decoded.next.is_some(),
            expected.next.is_some(),
            "answer {calls}"
        );
        assert_eq!(
            decoded.millis_behind.is_some(),
            expected.millis_behind.is_some(),
            "answer {calls}"
        );
        records += decoded.records.len();
        match expected.next {
            Some(next) => iterator = next,
            None => {
                assert_eq!(decoded.children.len(), 2, "the closed shard's children");
                break;
            }
        }
        assert!(calls < 1_000, "the closed shard never ended");
    }
    assert_eq!(records, payloads.len());
    let decoded = events_of("GetRecords answer decoded", "emulator");
    assert_eq!(
        decoded.len(),
        calls,
        "every answer decoded by the transport"
    );
    let left = events_of("GetRecords answer left to the SDK's decoder", "emulator");
    assert!(
        left.is_empty(),
        "answers the transport did not decode: {left:?}"
    );
}

/// An HTTP client answering every request with the next of its answers.
#[derive(Debug, Clone, Default)]
struct Answers(Arc<Mutex<VecDeque<(u16, &'static str)>>>);

impl Answers {
    fn push(&self, status: u16, body: &'static str) {
        self.0.lock().unwrap().push_back((status, body));
    }
}

impl HttpConnector for Answers {
    fn call(&self, _request: HttpRequest) -> HttpConnectorFuture {
        let (status, body) = self.0.lock().unwrap().pop_front().expect("an answer left");
        let response = HttpResponse::new(
            StatusCode::try_from(status).expect("a status"),
            SdkBody::from(body),
        );
        HttpConnectorFuture::ready(Ok(response))
    }
}

impl HttpClient for Answers {
    fn http_connector(
        &self,
        _settings: &HttpConnectorSettings,
        _components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(self.clone())
    }
}

/// Successful answers: members missing or null, escapes, timestamps of both forms.
const DECODED: [&str; 6] = [
    r#"{"Records": [
        {"SequenceNumber": "49", "ApproximateArrivalTimestamp": 1.7332000001234E9,
         "Data": "aGVsbG8\/Pz8=", "PartitionKey": "k\u00e9y \"1\"\t", "EncryptionType": "KMS"},
        {"SequenceNumber": "50", "ApproximateArrivalTimestamp": 1733200000.123456789,
         "Data": "", "PartitionKey": "k2"},
        {"SequenceNumber": "51", "ApproximateArrivalTimestamp": 1733200001, "Data": "/w==",
         "PartitionKey": "k3"}
     ], "NextShardIterator": "AAA", "MillisBehindLatest": 1500}"#,
    r#"{"Records": [{"SequenceNumber": "1", "Data": "aGk="}], "NextShardIterator": "n"}"#,
    r#"{"Records": [{"SequenceNumber": "1", "Data": "aGk=", "PartitionKey": null,
         "ApproximateArrivalTimestamp": null}], "MillisBehindLatest": null}"#,
    r#"{"Records": null, "MillisBehindLatest": 0, "ChildShards": [
        {"ShardId": "shardId-2", "ParentShards": ["shardId-0", "shardId-1"],
         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}},
        {"ShardId": "shardId-3", "ParentShards": null}]}"#,
    r#"{"Records": [], "NextShardIterator": "x", "MillisBehindLatest": 0,
        "SomethingNew": {"a": [1, 2.5, null]}}"#,
    "{}",
];

/// Bodies the transport leaves to the SDK, and what the SDK makes of them.
const LEFT: [&str; 4] = [
    r#"{"Records": [{"SequenceNumber": "1"}]}"#,
    r#"{"Records": [{"Data": "aGk="}]}"#,
    r#"{"Records": [{"SequenceNumber": "1", "Data": "aGk=",
         "ApproximateArrivalTimestamp": "1733200000"}]}"#,
    r#"{"Records": 3}"#,
];

fn answers_client(answers: &Answers) -> aws_sdk_kinesis::Client {
    let config = aws_sdk_kinesis::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new("id", "secret", None, None, "test"))
        .http_client(answers.clone())
        .build();
    aws_sdk_kinesis::Client::from_conf(config)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_of_answer_reads_as_the_sdk_reads_it() {
    support::events::record_events();
    let answers = Answers::default();
    let api = AwsKinesis::new(answers_client(&answers));
    for (i, body) in DECODED.iter().chain(&LEFT).enumerate() {
        answers.push(200, body);
        answers.push(200, body);
        let expected = by_sdk(api.client(), "it").await;
        let decoded = by_transport(&api, "s", "it", "shapes").await;
        match (&expected, &decoded) {
            (Ok(expected), Ok(decoded)) => assert_eq!(decoded, expected, "body {i}: {body}"),
            // Only a body left to the SDK may fail (the same way both times).
            (Err(_), Err(_)) if i >= DECODED.len() => {}
            _ => panic!("body {i}: the SDK read {expected:?}, the transport {decoded:?}"),
        }
    }
    // An error answer, retried by the SDK, then records.
    answers.push(
        500,
        r#"{"__type": "InternalFailure", "message": "try again"}"#,
    );
    answers.push(200, DECODED[1]);
    let decoded = by_transport(&api, "s", "it", "shapes")
        .await
        .expect("the retried call's records");
    assert_eq!(decoded.records.len(), 1);
    assert_eq!(decoded.next.as_deref(), Some("n"));

    let events = events_of("GetRecords answer decoded", "shapes");
    assert_eq!(
        events.len(),
        DECODED.len() + 1,
        "the transport decoded them: {events:#?}"
    );
    let left = events_of("GetRecords answer left to the SDK's decoder", "shapes");
    assert_eq!(left.len(), LEFT.len(), "left to the SDK: {left:?}");
}
