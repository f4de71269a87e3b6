//! Dead letters: records that failed every attempt (or were sent there explicitly), written to
//! a destination with their origin before the shard goes on.
//!
//! The envelope's fields are listed on [`DeadLetter`].

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use aws_smithy_types::DateTime;
use aws_smithy_types::date_time::Format;
use bytes::Bytes;
use futures::future::BoxFuture;

use crate::error::KinesisError;
use crate::record::Record;

/// The service's longest partition key, in characters (the publisher, a layer above, checks
/// it as `publish::MAX_PARTITION_KEY_CHARS`).
const PARTITION_KEY_CHARS: usize = 256;

/// The envelope format's name and version.
pub const ENVELOPE_FORMAT: &str = "kinesis-dataflow.dead-letter/v1";

/// A record given up on, with its origin.
///
/// The envelope (`kinesis-dataflow.dead-letter/v1`, JSON, one record):
///
/// | field | meaning |
/// |---|---|
/// | `format` | `"kinesis-dataflow.dead-letter/v1"` |
/// | `stream`, `shard`, `sequence_number`, `partition_key` | where the record was read |
/// | `attempts` | how many times it was delivered in this process |
/// | `last_error` | what the last failure said (`fail(..)`, `dead_letter(..)`), or `null` |
/// | `arrival` | the record's approximate arrival, RFC 3339 milliseconds, or `null` |
/// | `dead_lettered_at` | when this instance gave up on it, RFC 3339 milliseconds |
/// | `data_base64` | the record's data, standard base64 (empty when left out) |
/// | `data_omitted_bytes` | only when the data was left out, its size: the envelope with the data would not fit in one Kinesis record (1 MiB); read the record at `shard`/`sequence_number` of `stream` while it is retained |
///
/// A dead-letter stream's record is put under the original partition key, or under the
/// shard's id when the original's is not one PutRecords takes (a KPL user record may have an
/// empty key); the envelope keeps the original.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The stream it was read from.
    pub stream: Arc<str>,
    /// The shard it was read from.
    pub shard: Arc<str>,
    /// Its sequence number.
    pub sequence_number: Arc<str>,
    /// Its partition key (a dead letter written to a stream keeps it).
    pub partition_key: Arc<str>,
    /// Its data.
    pub data: Bytes,
    /// How many times it was delivered in this process.
    pub attempts: u32,
    /// What the last failure said, when one was given.
    pub last_error: Option<String>,
    /// The record's approximate arrival.
    pub arrival: Option<SystemTime>,
    /// When this instance gave up on it.
    pub dead_lettered_at: SystemTime,
    /// Set when the data was left out of the envelope (it would not fit in a Kinesis
    /// record): the data's size. [`data`](Self::data) is then empty.
    pub omitted_bytes: Option<usize>,
}

fn rfc3339(time: SystemTime) -> String {
    DateTime::from(time)
        .fmt(Format::DateTime)
        .unwrap_or_default()
}

impl DeadLetter {
    pub(crate) fn new(
        stream: Arc<str>,
        record: &Record,
        attempts: u32,
        last_error: Option<String>,
    ) -> Self {
        Self {
            stream,
            shard: record.shard_id_shared().clone(),
            sequence_number: Arc::from(record.sequence_number()),
            partition_key: Arc::from(record.partition_key()),
            data: record.data().clone(),
            attempts,
            last_error,
            arrival: record.approximate_arrival(),
            dead_lettered_at: SystemTime::now(),
            omitted_bytes: None,
        }
    }

    /// The same letter without its data, naming the data's size instead.
    #[must_use]
    pub fn without_data(&self) -> Self {
        Self {
            data: Bytes::new(),
            omitted_bytes: Some(self.omitted_bytes.unwrap_or(self.data.len())),
            ..self.clone()
        }
    }

    /// The partition key a dead-letter stream's record is put under: the original one, or
    /// the shard's id when the original is empty or longer than Kinesis takes.
    #[must_use]
    pub fn destination_key(&self) -> &str {
        let chars = self.partition_key.chars().count();
        if (1..=PARTITION_KEY_CHARS).contains(&chars) {
            &self.partition_key
        } else {
            &self.shard
        }
    }

    /// The envelope (see above), as JSON bytes.
    #[must_use]
    pub fn to_envelope(&self) -> Vec<u8> {
        let value = serde_json::json!({
            "format": ENVELOPE_FORMAT,
            "stream": &*self.stream,
            "shard": &*self.shard,
            "sequence_number": &*self.sequence_number,
            "partition_key": &*self.partition_key,
            "attempts": self.attempts,
            "last_error": self.last_error,
            "arrival": self.arrival.map(rfc3339),
            "dead_lettered_at": rfc3339(self.dead_lettered_at),
            "data_base64": aws_smithy_types::base64::encode(&self.data),
        });
        let mut value = value;
        if let Some(omitted) = self.omitted_bytes {
            value["data_omitted_bytes"] = omitted.into();
        }
        serde_json::to_vec(&value).expect("a JSON value serializes")
    }

    /// Reads an envelope back (for tools that replay dead letters).
    ///
    /// # Errors
    ///
    /// [`KinesisError::InvalidConfig`] naming the field that is missing or malformed.
    pub fn from_envelope(bytes: &[u8]) -> Result<Self, KinesisError> {
        let bad = |field: &'static str, reason: &str| KinesisError::InvalidConfig {
            setting: "dead-letter envelope",
            value: field.to_owned(),
            reason: reason.to_owned(),
        };
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| bad("(document)", &e.to_string()))?;
        if value["format"] != ENVELOPE_FORMAT {
            return Err(bad(
                "format",
                "not a kinesis-dataflow.dead-letter/v1 envelope",
            ));
        }
        let text = |field: &'static str| {
            value[field]
                .as_str()
                .map(Arc::<str>::from)
                .ok_or_else(|| bad(field, "missing, or not a string"))
        };
        let time = |field: &'static str| -> Result<Option<SystemTime>, KinesisError> {
            match value[field].as_str() {
                None => Ok(None),
                Some(s) => DateTime::from_str(s, Format::DateTime)
                    .ok()
                    .and_then(|t| SystemTime::try_from(t).ok())
                    .map(Some)
                    .ok_or_else(|| bad(field, "not an RFC 3339 time")),
            }
        };
        let data = aws_smithy_types::base64::decode(&*text("data_base64")?)
            .map_err(|e| bad("data_base64", &e.to_string()))?;
        Ok(Self {
            stream: text("stream")?,
            shard: text("shard")?,
            sequence_number: text("sequence_number")?,
            partition_key: text("partition_key")?,
            data: Bytes::from(data),
            attempts: value["attempts"]
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| bad("attempts", "missing, or not a count"))?,
            last_error: value["last_error"].as_str().map(str::to_owned),
            arrival: time("arrival")?,
            dead_lettered_at: time("dead_lettered_at")?
                .ok_or_else(|| bad("dead_lettered_at", "missing"))?,
            omitted_bytes: match &value["data_omitted_bytes"] {
                serde_json::Value::Null => None,
                n => Some(
                    n.as_u64()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| bad("data_omitted_bytes", "not a count"))?,
                ),
            },
        })
    }
}

/// Where dead letters go: another Kinesis stream (a [`Publisher`](crate::Publisher)), or
/// your own code through [`dead_letters_fn`].
///
/// A write that fails is retried with backoff (from 100 ms, doubling to 30 s) for as long as
/// the shard is held; meanwhile the shard waits, so nothing of it is handed out past the dead
/// letter and nothing is dropped.
///
/// So a destination should fail only for what time can mend. The library's own (a
/// [`Publisher`](crate::Publisher), the broker face's dead-letter streams) write a letter
/// that PutRecords would refuse in a form it takes: without the data, naming its size, and
/// under the shard's id when the original partition key is not one Kinesis takes.
pub trait DeadLetters: Send + Sync + fmt::Debug {
    /// Writes `letter`; resolves once it is stored.
    fn send(&self, letter: DeadLetter) -> BoxFuture<'static, Result<(), KinesisError>>;
}

/// Dead letters handed to a function returning a future.
pub struct DeadLettersFn<F>(F);

impl<F> fmt::Debug for DeadLettersFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DeadLettersFn")
    }
}

/// Dead letters handed to `f` (store them in a table, a queue, a file, ...).
///
/// ```
/// use kinesis_dataflow::ack::{DeadLetter, dead_letters_fn};
///
/// let destination = dead_letters_fn(|letter: DeadLetter| async move {
///     eprintln!("gave up on {} of {}", letter.sequence_number, letter.shard);
///     Ok(())
/// });
/// # let _ = destination;
/// ```
pub fn dead_letters_fn<F, Fut>(f: F) -> DeadLettersFn<F>
where
    F: Fn(DeadLetter) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), KinesisError>> + Send + 'static,
{
    DeadLettersFn(f)
}

impl<F, Fut> DeadLetters for DeadLettersFn<F>
where
    F: Fn(DeadLetter) -> Fut + Send + Sync,
    Fut: Future<Output = Result<(), KinesisError>> + Send + 'static,
{
    fn send(&self, letter: DeadLetter) -> BoxFuture<'static, Result<(), KinesisError>> {
        Box::pin((self.0)(letter))
    }
}

/// Writes `letter` to `destination`, retrying with backoff until it is stored.
pub(crate) async fn write_until_stored(destination: Arc<dyn DeadLetters>, letter: DeadLetter) {
    let mut backoff = std::time::Duration::from_millis(100);
    loop {
        match destination.send(letter.clone()).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(
                    stream = %letter.stream,
                    shard = %letter.shard,
                    sequence_number = %letter.sequence_number,
                    error = %e,
                    ?backoff,
                    "dead letter not written; retrying (the shard waits)"
                );
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(30));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_envelope_reads_back_as_it_was_written() {
        let record = Record::new(
            Arc::from("shardId-000000000001"),
            "49000000000000000000000000000000000000000000000000000001",
            "customer-7",
            Bytes::from_static(b"\x00binary\xff"),
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_700_000_000_123)),
        );
        let letter = DeadLetter::new(Arc::from("orders"), &record, 3, Some("bad total".into()));
        let envelope = letter.to_envelope();
        let json: serde_json::Value = serde_json::from_slice(&envelope).unwrap();
        assert_eq!(json["format"], ENVELOPE_FORMAT);
        assert_eq!(json["partition_key"], "customer-7");
        assert_eq!(json["arrival"], "2023-11-14T22:13:20.123Z");
        let back = DeadLetter::from_envelope(&envelope).unwrap();
        assert_eq!(back.data, letter.data);
        assert_eq!(back.attempts, 3);
        assert_eq!(back.last_error.as_deref(), Some("bad total"));
        assert_eq!(back.arrival, letter.arrival);
        let error = DeadLetter::from_envelope(br#"{"format":"other"}"#).unwrap_err();
        assert!(error.to_string().contains("format"), "{error}");
    }
}
