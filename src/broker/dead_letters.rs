//! The mount site's `max_attempts(n)` and `dead_letter(name)`, applied by the core: a message
//! spent on its attempts is written to the dead-letter stream as the message it was (its
//! payload and headers, under its partition key) with its origin in headers, before the
//! checkpoint passes it.

use std::fmt;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use bytes::Bytes;
use futures::future::BoxFuture;
use ruststream::{DeclareRetryError, OutgoingMessage, Publisher as _, RetryDeclaration};

use super::connection::Connection;
use super::publisher::{KinesisOptions, KinesisPublish, KinesisPublisher};
use crate::ack::{DeadLetter, DeadLetters};
use crate::error::KinesisError;

/// The header naming the stream a dead letter was read from.
pub const ORIGIN_STREAM_HEADER: &str = "x-dead-letter-stream";
/// The header naming the shard a dead letter was read from.
pub const ORIGIN_SHARD_HEADER: &str = "x-dead-letter-shard";
/// The header with a dead letter's sequence number in its stream of origin.
pub const ORIGIN_SEQUENCE_HEADER: &str = "x-dead-letter-sequence-number";
/// The header with how many times a dead letter was delivered before it was given up on.
pub const ATTEMPTS_HEADER: &str = "x-dead-letter-attempts";
/// The header with what the last failure of a dead letter said (absent when nothing was said).
pub const LAST_ERROR_HEADER: &str = "x-dead-letter-last-error";
/// The header with when a dead letter was given up on, in milliseconds since the Unix epoch.
pub const DEAD_LETTERED_AT_HEADER: &str = "x-dead-letter-at-ms";
/// The header present when a dead letter's payload was left out, with the payload's size in
/// bytes: the message with it would not fit in a Kinesis record (1 MiB). Read the original at
/// its origin while the stream retains it.
pub const OMITTED_BYTES_HEADER: &str = "x-dead-letter-omitted-bytes";

/// A registration's retry declaration, as a subscription takes it: both halves or none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Spent {
    /// Deliveries a record gets.
    pub(crate) max_attempts: u32,
    /// The stream spent records are written to.
    pub(crate) destination: String,
}

impl Spent {
    /// Reads a declaration: nothing, or both halves; half a declaration is refused, since a
    /// cap without a destination would have to drop records and a destination without a cap
    /// would move every retry there.
    pub(crate) fn from_declaration(
        declaration: &RetryDeclaration,
    ) -> Result<Option<Self>, KinesisError> {
        match (declaration.max_attempts(), declaration.dead_letter()) {
            (None, None) => Ok(None),
            (Some(n), Some(destination)) => Ok(Some(Self {
                max_attempts: n.get(),
                destination: destination.to_owned(),
            })),
            (Some(n), None) => Err(KinesisError::InvalidConfig {
                setting: "max_attempts",
                value: n.to_string(),
                reason: "a record past its attempts goes to a dead-letter stream: declare \
                         `dead_letter(name)` too (a Kinesis consumer cannot drop a record)"
                    .into(),
            }),
            (None, Some(destination)) => Err(KinesisError::InvalidConfig {
                setting: "dead_letter",
                value: destination.to_owned(),
                reason: "declare `max_attempts(n)` too: it says when a record goes there".into(),
            }),
        }
    }

    /// [`from_declaration`](Self::from_declaration) as the framework's startup error.
    pub(crate) fn declared(
        declaration: &RetryDeclaration,
    ) -> Result<Option<Self>, DeclareRetryError> {
        Self::from_declaration(declaration).map_err(|e| DeclareRetryError::Broker(Box::new(e)))
    }
}

/// Writes dead letters to a stream through the connection's publisher.
pub(crate) struct StreamDeadLetters {
    inner: Arc<Connection>,
    destination: String,
}

impl StreamDeadLetters {
    pub(crate) fn new(inner: Arc<Connection>, destination: String) -> Self {
        Self { inner, destination }
    }
}

impl fmt::Debug for StreamDeadLetters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamDeadLetters")
            .field("destination", &self.destination)
            .finish_non_exhaustive()
    }
}

impl DeadLetters for StreamDeadLetters {
    fn send(&self, letter: DeadLetter) -> BoxFuture<'static, Result<(), KinesisError>> {
        let publisher = KinesisPublisher::new(self.inner.clone(), KinesisPublish::default());
        let destination = self.destination.clone();
        Box::pin(async move {
            let (mut headers, offset) = super::envelope::decode(&letter.data);
            let origin = [
                (ORIGIN_STREAM_HEADER, letter.stream.to_string()),
                (ORIGIN_SHARD_HEADER, letter.shard.to_string()),
                (ORIGIN_SEQUENCE_HEADER, letter.sequence_number.to_string()),
                (ATTEMPTS_HEADER, letter.attempts.to_string()),
                (DEAD_LETTERED_AT_HEADER, millis(letter.dead_lettered_at)),
            ];
            for (name, value) in origin {
                headers.insert(name, Bytes::from(value));
            }
            if let Some(error) = &letter.last_error {
                headers.insert(LAST_ERROR_HEADER, Bytes::from(error.clone()));
            }
            let options = KinesisOptions::partition_key(letter.destination_key().to_owned());
            let payload = &letter.data[offset..];
            let message =
                OutgoingMessage::new(destination.as_str(), payload).with_headers(headers.clone());
            match publisher.publish(message, Some(&options)).await {
                // Too big with the origin headers: a write that can never succeed would hold
                // the shard for good, so the payload is left out and its size named.
                Err(KinesisError::InvalidRecord { reason, .. }) => {
                    tracing::warn!(
                        stream = %letter.stream,
                        shard = %letter.shard,
                        sequence_number = %letter.sequence_number,
                        bytes = payload.len(),
                        %reason,
                        "dead letter written without its payload: it does not fit in a record"
                    );
                    headers.insert(OMITTED_BYTES_HEADER, Bytes::from(payload.len().to_string()));
                    let message =
                        OutgoingMessage::new(destination.as_str(), &[][..]).with_headers(headers);
                    publisher.publish(message, Some(&options)).await
                }
                other => other,
            }
        })
    }
}

fn millis(time: std::time::SystemTime) -> String {
    time.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroU32;

    use super::*;

    #[test]
    fn half_a_declaration_is_refused_naming_the_missing_half() {
        let three = NonZeroU32::new(3).unwrap();
        let cap = RetryDeclaration::new().with_max_attempts(three);
        let place = RetryDeclaration::new().with_dead_letter("dead");
        assert!(matches!(
            Spent::from_declaration(&cap),
            Err(KinesisError::InvalidConfig {
                setting: "max_attempts",
                ..
            })
        ));
        assert!(matches!(
            Spent::from_declaration(&place),
            Err(KinesisError::InvalidConfig {
                setting: "dead_letter",
                ..
            })
        ));
        let both = cap.with_dead_letter("dead");
        assert_eq!(
            Spent::from_declaration(&both).unwrap(),
            Some(Spent {
                max_attempts: 3,
                destination: "dead".into()
            })
        );
        assert_eq!(
            Spent::from_declaration(&RetryDeclaration::new()).unwrap(),
            None
        );
    }
}
