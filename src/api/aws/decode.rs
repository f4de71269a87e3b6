//! GetRecords answers decoded straight into the seam's records.
//!
//! The SDK decodes an answer through its generic, schema-driven deserializer into its own
//! record types, which the transport then converted: per record, a walk of the schema for
//! every member, a `String` for each of its strings and a `Blob`. Here a successful answer's
//! body is decoded by `serde_json` into the fields the seam keeps (each string copied once,
//! into the field kept; payloads decoded from the body's text in place by the SDK's own
//! base64 decoder; arrival times read as the SDK reads them) and left in a task-local slot
//! for the transport to take once the call returns; the SDK's output then carries no
//! records.
//!
//! An interceptor on the client the transport calls through ([`with_decoder`],
//! [`client_with_decoder`]) puts [`Decoder`] in front of the operation's own deserializer for
//! the calls made inside [`decoding`] (the transport's GetRecords calls) and for no other. One
//! interceptor on the client rather than one per call: a customised call has the SDK build a
//! configuration layer of its own.
//!
//! Everything else is the SDK's: the request, its signing, retries and their classification,
//! timeouts. An answer this module does not decode (an error status, a body of another
//! shape) goes to the SDK's deserializer unchanged, so errors, and any answer this module
//! does not know how to read, are as the SDK makes them.

use std::borrow::Cow;
use std::cell::RefCell;
use std::sync::LazyLock;
use std::time::SystemTime;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::operation::get_records::{GetRecords, GetRecordsOutput as SdkOutput};
use aws_sdk_kinesis::primitives::DateTime;
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeSerializationInterceptorContextRef, Error, Output,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpResponse, OrchestratorError};
use aws_smithy_runtime_api::client::runtime_plugin::RuntimePlugin;
use aws_smithy_runtime_api::client::ser_de::{DeserializeResponse, SharedResponseDeserializer};
use aws_smithy_types::config_bag::{ConfigBag, FrozenLayer};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::api::ChildShard;
use crate::record::Read;

/// A GetRecords answer as the transport uses it.
#[derive(Debug)]
pub(super) struct Decoded {
    pub(super) reads: Vec<Read>,
    pub(super) next_shard_iterator: Option<String>,
    pub(super) millis_behind_latest: Option<i64>,
    pub(super) child_shards: Vec<ChildShard>,
}

tokio::task_local! {
    /// Where the answer of the call in progress on this task waits for the transport.
    static ANSWER: RefCell<Option<Decoded>>;
}

/// Runs `call` (one GetRecords call through a client with [`DecodeHere`]), and takes what
/// it left: `None` when the SDK decoded the answer itself.
pub(super) async fn decoding<F: Future>(call: F) -> (F::Output, Option<Decoded>) {
    ANSWER
        .scope(RefCell::new(None), async {
            let output = call.await;
            (output, ANSWER.with(|answer| answer.borrow_mut().take()))
        })
        .await
}

/// A copy of `client` with [`DecodeHere`] among its interceptors.
pub(super) fn with_decoder(client: &Client) -> Client {
    Client::from_conf(client.config().to_builder().interceptor(DecodeHere).build())
}

/// The client `config` makes, with [`DecodeHere`] among its interceptors.
pub(super) fn client_with_decoder(config: aws_sdk_kinesis::config::Builder) -> Client {
    Client::from_conf(config.interceptor(DecodeHere).build())
}

/// The client's interceptor: a call made inside [`decoding`] (a GetRecords call of the
/// transport's) gets a [`Decoder`] in front of the operation's own deserializer; any other
/// call is left alone.
#[derive(Debug)]
struct DecodeHere;

impl Intercept for DecodeHere {
    fn name(&self) -> &'static str {
        "kinesis-dataflow GetRecords decoder"
    }

    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        // Once per call, not per attempt: every attempt of the call loads the deserializer
        // from the bag after this. Without the SDK's own to hand anything else to, the SDK
        // decodes every answer as it would without this module.
        if ANSWER.try_with(|_| ()).is_ok()
            && let Some(sdk) = SdkDeserializer::get()
        {
            cfg.interceptor_state()
                .store_put(SharedResponseDeserializer::new(Decoder { sdk }));
        }
        Ok(())
    }
}

/// The SDK's own GetRecords deserializer, in the operation's configuration layer (the
/// shared handle to it cannot be cloned out of a call's bag, the layer can be kept).
#[derive(Debug, Clone)]
struct SdkDeserializer(FrozenLayer);

impl SdkDeserializer {
    /// The layer, when it holds the deserializer (made once per process).
    fn get() -> Option<Self> {
        static LAYER: LazyLock<Option<FrozenLayer>> = LazyLock::new(|| {
            GetRecords::new()
                .config()
                .filter(|layer| layer.load::<SharedResponseDeserializer>().is_some())
        });
        LAYER.clone().map(Self)
    }

    fn deserializer(&self) -> Option<&SharedResponseDeserializer> {
        self.0.load::<SharedResponseDeserializer>()
    }
}

/// Decodes a successful answer into [`ANSWER`]; hands anything else to the SDK's
/// deserializer.
#[derive(Debug)]
struct Decoder {
    sdk: SdkDeserializer,
}

impl Decoder {
    fn sdk(&self) -> Result<&SharedResponseDeserializer, OrchestratorError<Error>> {
        self.sdk.deserializer().ok_or_else(|| {
            OrchestratorError::other(BoxError::from(
                "the SDK's GetRecords deserializer is missing from its layer",
            ))
        })
    }
}

impl DeserializeResponse for Decoder {
    fn deserialize_streaming_with_config(
        &self,
        response: &mut HttpResponse,
        cfg: &ConfigBag,
    ) -> Option<Result<Output, OrchestratorError<Error>>> {
        match self.sdk() {
            Ok(sdk) => sdk.deserialize_streaming_with_config(response, cfg),
            Err(e) => Some(Err(e)),
        }
    }

    fn deserialize_nonstreaming_with_config(
        &self,
        response: &HttpResponse,
        cfg: &ConfigBag,
    ) -> Result<Output, OrchestratorError<Error>> {
        // An earlier attempt's answer is not this one's (only a retry classifier of the
        // application's own retries a decoded answer).
        let _ = ANSWER.try_with(|answer| answer.borrow_mut().take());
        let body = match response.body().bytes() {
            Some(body) if response.status().is_success() && ANSWER.try_with(|_| ()).is_ok() => body,
            _ => {
                return self
                    .sdk()?
                    .deserialize_nonstreaming_with_config(response, cfg);
            }
        };
        let decoded = match decode(body) {
            Ok(decoded) => decoded,
            Err(reason) => {
                tracing::debug!(%reason, "GetRecords answer left to the SDK's decoder");
                return self
                    .sdk()?
                    .deserialize_nonstreaming_with_config(response, cfg);
            }
        };
        // The SDK's output of the call: no records, which the slot holds.
        let output = SdkOutput::builder()
            .set_records(Some(Vec::new()))
            .build()
            .map_err(|e| OrchestratorError::other(BoxError::from(e)))?;
        tracing::trace!(
            records = decoded.reads.len(),
            request_id = response.headers().get("x-amzn-RequestId"),
            "GetRecords answer decoded"
        );
        match ANSWER.try_with(|answer| *answer.borrow_mut() = Some(decoded)) {
            Ok(()) => Ok(Output::erase(output)),
            // Checked above: the call runs on the task that made it.
            Err(_) => self
                .sdk()?
                .deserialize_nonstreaming_with_config(response, cfg),
        }
    }
}

/// The body of a successful GetRecords answer. A record's sequence number and payload text
/// are borrowed from the body where they hold no escapes (the payload is then decoded from
/// it; the sequence number copied once, into the field kept); members it does not name are
/// skipped.
#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct Body<'a> {
    #[serde(borrow, default)]
    records: Option<Vec<BodyRecord<'a>>>,
    #[serde(default)]
    next_shard_iterator: Option<String>,
    #[serde(default)]
    millis_behind_latest: Option<i64>,
    #[serde(default)]
    child_shards: Option<Vec<BodyChild>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct BodyRecord<'a> {
    #[serde(borrow)]
    sequence_number: Cow<'a, str>,
    /// As written: the number is read as the SDK reads it ([`arrival`]).
    #[serde(borrow, default)]
    approximate_arrival_timestamp: Option<&'a RawValue>,
    #[serde(borrow)]
    data: Cow<'a, str>,
    #[serde(default)]
    partition_key: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct BodyChild {
    shard_id: String,
    #[serde(default)]
    parent_shards: Option<Vec<String>>,
}

/// Decodes a successful answer's body; the error says why the body is not of the shape this
/// module reads (the SDK then decodes it, and says what is wrong with it if anything is).
fn decode(body: &[u8]) -> Result<Decoded, String> {
    let body: Body<'_> = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let records = body.records.unwrap_or_default();
    let mut reads = Vec::with_capacity(records.len());
    for record in records {
        let data = aws_smithy_types::base64::decode(record.data.as_ref())
            .map_err(|e| format!("a record's Data is not base64: {e}"))?;
        reads.push(Read {
            sequence_number: record.sequence_number.into_owned().into(),
            partition_key: record.partition_key.unwrap_or_default().into(),
            data: Bytes::from(data),
            approximate_arrival: match record.approximate_arrival_timestamp {
                Some(raw) => arrival(raw.get())?,
                None => None,
            },
        });
    }
    let child_shards = body
        .child_shards
        .unwrap_or_default()
        .into_iter()
        .map(|c| ChildShard {
            shard_id: c.shard_id,
            parent_shards: c.parent_shards.unwrap_or_default(),
        })
        .collect();
    Ok(Decoded {
        reads,
        next_shard_iterator: body.next_shard_iterator,
        millis_behind_latest: body.millis_behind_latest,
        child_shards,
    })
}

/// An arrival timestamp, epoch seconds written as a JSON number, as the SDK reads it: an
/// integer exactly, a fraction or an exponent through the closest `f64` (serde_json's own
/// float parsing may differ from it in the last bit); `None` when the time is outside what a
/// `SystemTime` holds.
fn arrival(number: &str) -> Result<Option<SystemTime>, String> {
    let time = if number.contains(['.', 'e', 'E']) {
        number
            .parse::<f64>()
            .ok()
            .filter(|seconds| seconds.is_finite())
            .map(DateTime::from_secs_f64)
    } else {
        number.parse::<i64>().ok().map(DateTime::from_secs)
    };
    match time {
        Some(time) => Ok(SystemTime::try_from(time).ok()),
        None => Err(format!(
            "an ApproximateArrivalTimestamp of {number} is not a time"
        )),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, UNIX_EPOCH};

    use aws_smithy_runtime_api::http::StatusCode;
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::config_bag::Layer;

    use super::*;

    const ANSWER: &str = r#"{
        "Records": [
            {"SequenceNumber": "4960", "ApproximateArrivalTimestamp": 1.7332e9,
             "Data": "aGVsbG8=", "PartitionKey": "k\u00e9y \"1\"", "EncryptionType": "NONE"},
            {"SequenceNumber": "4961", "ApproximateArrivalTimestamp": 1733200001,
             "Data": "a\/8=", "PartitionKey": "k2"}
        ],
        "NextShardIterator": "AAAA",
        "MillisBehindLatest": 1500,
        "ChildShards": [{"ShardId": "shardId-2", "ParentShards": ["shardId-0", "shardId-1"],
                         "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "9"}}],
        "SomethingNew": {"nested": [1, 2]}
    }"#;

    #[test]
    fn an_answer_is_decoded_with_escapes_numbers_and_unknown_members() {
        let decoded = decode(ANSWER.as_bytes()).expect("decoded");
        assert_eq!(decoded.reads.len(), 2);
        let (first, second) = (&decoded.reads[0], &decoded.reads[1]);
        assert_eq!(&*first.sequence_number, "4960");
        assert_eq!(&*first.partition_key, "k\u{e9}y \"1\"");
        assert_eq!(first.data, Bytes::from_static(b"hello"));
        assert_eq!(
            first.approximate_arrival,
            Some(UNIX_EPOCH + Duration::from_secs(1_733_200_000))
        );
        assert_eq!(second.data, Bytes::from_static(&[0x6b, 0xff]));
        assert_eq!(
            second.approximate_arrival,
            Some(UNIX_EPOCH + Duration::from_secs(1_733_200_001))
        );
        assert_eq!(decoded.next_shard_iterator.as_deref(), Some("AAAA"));
        assert_eq!(decoded.millis_behind_latest, Some(1500));
        assert_eq!(
            decoded.child_shards,
            vec![ChildShard {
                shard_id: "shardId-2".into(),
                parent_shards: vec!["shardId-0".into(), "shardId-1".into()],
            }]
        );
    }

    #[test]
    fn arrival_times_are_read_as_the_sdk_reads_them() {
        for number in [
            "1733200000.123",
            "1.733200000123E9",
            "1733200000.0009765625",
            "0.5",
        ] {
            let expected = DateTime::from_secs_f64(number.parse().expect("a number"));
            assert_eq!(
                arrival(number),
                Ok(Some(SystemTime::try_from(expected).expect("a time"))),
                "{number}"
            );
        }
        assert_eq!(arrival("-5"), Ok(Some(UNIX_EPOCH - Duration::from_secs(5))));
        for not_a_time in ["\"1733200000\"", "true", "18446744073709551615"] {
            assert!(arrival(not_a_time).is_err(), "{not_a_time}");
        }
    }

    #[test]
    fn a_closed_shards_last_answer_has_no_iterator() {
        let decoded = decode(br#"{"Records": [], "MillisBehindLatest": 0}"#).expect("decoded");
        assert!(decoded.reads.is_empty());
        assert_eq!(decoded.next_shard_iterator, None);
        assert!(decoded.child_shards.is_empty());
        let decoded = decode(br#"{"NextShardIterator": null, "Records": null}"#).expect("decoded");
        assert!(decoded.reads.is_empty());
        let decoded = decode(
            br#"{"Records": [{"SequenceNumber": "1", "Data": "",
                 "ApproximateArrivalTimestamp": null}]}"#,
        )
        .expect("decoded");
        assert_eq!(decoded.reads[0].approximate_arrival, None);
        assert!(decoded.reads[0].data.is_empty());
    }

    #[test]
    fn a_body_of_another_shape_is_left_to_the_sdk() {
        for body in [
            &br#"{"Records": {"SequenceNumber": "1"}}"#[..],
            br#"{"Records": [{"SequenceNumber": "1", "Data": "not base64!"}]}"#,
            br#"{"Records": [{"Data": "aGVsbG8="}]}"#,
            br#"{"Records": [{"SequenceNumber": "1", "Data": "aGVsbG8=",
                 "ApproximateArrivalTimestamp": "2024-12-03T00:00:00Z"}]}"#,
            br#"{"Records": [], "MillisBehindLatest": "soon"}"#,
            b"<html>",
            b"",
        ] {
            assert!(decode(body).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    /// Stands in for the SDK's deserializer: counts its calls.
    #[derive(Debug, Default)]
    struct Sdk(Arc<AtomicUsize>);

    impl DeserializeResponse for Sdk {
        fn deserialize_nonstreaming(
            &self,
            _response: &HttpResponse,
        ) -> Result<Output, OrchestratorError<Error>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Ok(Output::erase(()))
        }
    }

    fn response(status: u16, body: &'static str) -> HttpResponse {
        HttpResponse::new(
            StatusCode::try_from(status).expect("status"),
            SdkBody::from(body),
        )
    }

    #[test]
    fn the_sdks_deserializer_is_found() {
        assert!(
            SdkDeserializer::get()
                .and_then(|l| l.deserializer().map(drop))
                .is_some()
        );
    }

    #[tokio::test]
    async fn the_decoder_keeps_the_answer_for_the_call_and_leaves_the_rest_to_the_sdk() {
        let calls = Arc::new(AtomicUsize::new(0));
        let mut layer = Layer::new("test");
        layer.store_put(SharedResponseDeserializer::new(Sdk(calls.clone())));
        let decoder = Decoder {
            sdk: SdkDeserializer(layer.freeze()),
        };
        let cfg = ConfigBag::base();
        let deserialize = |status, body| {
            decoder.deserialize_nonstreaming_with_config(&response(status, body), &cfg)
        };

        // A call of the transport's: decoded here, kept for it, the SDK not asked.
        let (output, kept) = decoding(async { deserialize(200, ANSWER) }).await;
        let output = output
            .expect("decoded")
            .downcast::<SdkOutput>()
            .expect("the SDK's type");
        assert!(output.records.is_empty());
        assert_eq!(kept.expect("kept for the call").reads.len(), 2);
        assert_eq!(calls.load(Ordering::SeqCst), 0);

        // An error status, a body of another shape: the SDK's.
        let error = r#"{"__type": "ExpiredIteratorException", "message": "expired"}"#;
        let (output, kept) = decoding(async { deserialize(400, error) }).await;
        assert!(output.is_ok() && kept.is_none());
        let (output, kept) = decoding(async { deserialize(200, "{\"Records\": 3}") }).await;
        assert!(output.is_ok() && kept.is_none());
        assert_eq!(calls.load(Ordering::SeqCst), 2);

        // Any other call through the client: the SDK's.
        deserialize(200, ANSWER).expect("the SDK's answer");
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }
}
