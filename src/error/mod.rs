//! The crate's error type.
//!
//! [`KinesisError`] is the one error of the public API. Each message says what failed, on which
//! resource, and what to do next. The predicates ([`KinesisError::is_retryable`] and friends) are
//! how the reader decides between waiting, retrying and stopping.
//!
//! Three variants belong to the broker face (`ShutDown`, `AlreadySubscribed`, `Credentials`).
//! They stay in this one error because the framework's contract makes the broker's error the
//! error of its publishers, subscribers and seekers alike, and the spec names `KinesisError`
//! as that error: one type keeps `?` working across the core and the face.

mod kcl;
mod lease;
mod operation;
mod publish_failure;

pub use kcl::{KclError, KclErrorKind};
pub use lease::LeaseError;
pub(crate) use operation::brief;
pub use operation::{ErrorSource, Operation};
pub(crate) use publish_failure::FirstOfKey;
pub use publish_failure::{EntryError, FailedRecord, PublishFailure};

use crate::record::quote_key;

/// Everything that can go wrong while reading from or writing to Kinesis.
///
/// The enum is `#[non_exhaustive]`: later versions add variants. Match on the ones you handle
/// and keep a fallback arm.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum KinesisError {
    /// The stream does not exist in the region the client talks to.
    #[error(
        "{operation}: stream `{stream}` was not found in region `{region}`; check the name and \
         the region (AWS_REGION), or create it (CreateStream / `create_if_missing`)"
    )]
    StreamNotFound {
        /// The call that failed.
        operation: Operation,
        /// The stream name.
        stream: String,
        /// The region the client was configured for.
        region: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// The shard does not exist in the stream (a typo, or it left the retention period).
    #[error(
        "{operation}: shard `{shard}` was not found in stream `{stream}`; list the stream's \
         shards (ListShards) for the ids that exist"
    )]
    ShardNotFound {
        /// The call that failed.
        operation: Operation,
        /// The stream name.
        stream: String,
        /// The shard id.
        shard: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// The service refused an argument: a malformed name, a sequence number of another shard,
    /// an out-of-range hash key.
    #[error("{operation} on stream `{stream}`: invalid argument: {message}")]
    InvalidArgument {
        /// The call that failed.
        operation: Operation,
        /// The stream name.
        stream: String,
        /// The service's explanation.
        message: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// The resource is in a state that refuses the call: the stream exists already
    /// (CreateStream), or it is being created, updated or deleted.
    #[error("{operation} on stream `{stream}`: the resource is in use: {message}")]
    ResourceInUse {
        /// The call that failed.
        operation: Operation,
        /// The stream name.
        stream: String,
        /// The service's explanation.
        message: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// The caller lacks permission for the call.
    #[error(
        "{operation} on stream `{stream}` was denied: {message}; grant the IAM action `{}` on \
         the stream's ARN", operation.iam_action()
    )]
    AccessDenied {
        /// The call that failed.
        operation: Operation,
        /// The stream name.
        stream: String,
        /// The service's explanation.
        message: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// The shard's read or write limit was exceeded; the reader waits and retries on its own.
    #[error(
        "{operation} on stream `{stream}` was throttled; the reader waits one poll interval and \
         retries (lower the read rate if several applications read this stream)"
    )]
    Throttled {
        /// The call that failed.
        operation: Operation,
        /// The stream name.
        stream: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// A shard iterator was older than five minutes; the reader fetches a new one on its own.
    #[error(
        "{operation} on stream `{stream}`: the shard iterator expired (they live five minutes); \
         a new one is fetched from the checkpoint"
    )]
    ExpiredIterator {
        /// The call that failed.
        operation: Operation,
        /// The stream name.
        stream: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// A call failed in a way that may succeed when retried: a 5xx answer, a dropped connection,
    /// a timeout, a KMS hiccup.
    #[error("{operation} on stream `{stream}` failed: {message}; it is retried")]
    Service {
        /// The call that failed.
        operation: Operation,
        /// The stream name.
        stream: String,
        /// What the service or the transport said.
        message: String,
        /// The error underneath (the SDK's), when the call reached one.
        #[source]
        source: Option<ErrorSource>,
    },

    /// The shard reader gave up after too many failed calls in a row. The subscription releases
    /// the shard's lease; the next shard listing takes it again and resumes from the checkpoint.
    #[error(
        "reader of shard `{shard}` in stream `{stream}` stopped after {failures} failures in a \
         row (the last is this error's source)"
    )]
    ReaderStopped {
        /// The stream name.
        stream: String,
        /// The shard id.
        shard: String,
        /// How many calls failed in a row.
        failures: u32,
        /// The last failure.
        #[source]
        last: Box<KinesisError>,
    },

    /// A record aggregated by the Kinesis Producer Library, read with de-aggregation off (the
    /// default). It is reported instead of being handed on as a [`Record`](crate::Record), and
    /// the checkpoint passes it.
    #[error(
        "record {sequence_number} of shard `{shard}` in stream `{stream}` is a KPL-aggregated \
         record and de-aggregation is off: turn it on with `ReadSettings::deaggregate(true)` \
         (`KinesisStream::deaggregate(true)` on the broker face) to read its user records. \
         The record is skipped"
    )]
    AggregatedRecord {
        /// The stream name.
        stream: String,
        /// The shard id.
        shard: String,
        /// The record's sequence number.
        sequence_number: String,
    },

    /// A user record of a KPL aggregate that cannot be read (it names a key its aggregate's
    /// tables do not have). The aggregate's other user records are handed on; this one is
    /// skipped (see [`crate::kpl`]).
    #[error(
        "user record {sub_sequence_number} of the KPL aggregate {sequence_number} of shard \
         `{shard}` in stream `{stream}` cannot be read: {reason}. It is skipped"
    )]
    InvalidUserRecord {
        /// The stream name.
        stream: String,
        /// The shard id.
        shard: String,
        /// The aggregate's sequence number.
        sequence_number: String,
        /// The user record's place in the aggregate.
        sub_sequence_number: u64,
        /// What is wrong with it.
        reason: String,
    },

    /// A record's data did not decode (see [`Delivery::decode`](crate::Delivery::decode)).
    #[error(
        "record {sequence_number} (partition key `{partition_key}`) of shard `{shard}` in \
         stream `{stream}` does not decode (the decoder's error is this error's source). Skip it \
         to let the checkpoint pass it, or retry it once the decoder is fixed"
    )]
    Decode {
        /// The stream name.
        stream: String,
        /// The shard id.
        shard: String,
        /// The record's sequence number.
        sequence_number: String,
        /// The record's partition key.
        partition_key: String,
        /// The decoder's error.
        #[source]
        source: std::sync::Arc<dyn std::error::Error + Send + Sync>,
    },

    /// The lease table answered with an error (see [`LeaseError`]).
    #[error(transparent)]
    LeaseStore(#[from] LeaseError),

    /// A setting was refused: before any call was made, or, for a `start_at` naming a shard
    /// the stream does not list, at `start`'s first listing, before any shard row is written.
    #[error("invalid setting `{setting}` = {value}: {reason}")]
    InvalidConfig {
        /// The setting's name, as the builder method spells it.
        setting: &'static str,
        /// The refused value, rendered.
        value: String,
        /// What is allowed.
        reason: String,
    },

    /// A record the service would refuse was found before any call was made: an empty
    /// partition key, one over 256 characters, a record over 1 MiB, or a malformed explicit
    /// hash key. Nothing of its batch was sent.
    #[error(
        "record {index} of a publish to stream `{stream}` (partition key {}, {size} bytes \
         of data and key) was refused before sending: {reason}; nothing of the batch was sent",
        quote_key(partition_key)
    )]
    InvalidRecord {
        /// The stream name.
        stream: String,
        /// The record's position in the batch (0 for a single `publish`).
        index: usize,
        /// The record's partition key.
        partition_key: String,
        /// The record's size as the service counts it: data plus partition key, in bytes.
        size: usize,
        /// What is wrong and what the limit is.
        reason: String,
    },

    /// A publish ended with records not written: the retries were used up, or a failure that
    /// retrying cannot fix stopped it. The failure says how many records were written (they
    /// stay written), hands back every record that was not, and names the last error.
    #[error("{0}")]
    PublishFailed(Box<PublishFailure>),

    /// A collecting publisher's background task stopped before it answered (the tokio
    /// runtime it ran on shut down): whether the publish's records were written is unknown.
    ///
    /// Only an aggregating publisher (whose task packs the records) answers a publish with
    /// this error, and cannot hand the records back. Otherwise only the publish's calls go
    /// through the task, and the publish ends in [`PublishFailed`](Self::PublishFailed),
    /// which hands back every record not written (those of the unanswered call as possibly
    /// stored), with this error's kind, `PublisherStopped`, as the last code.
    #[error(
        "the collecting publisher of stream `{stream}` stopped before it answered (its tokio \
         runtime shut down); its records may or may not be written: publish them again"
    )]
    PublisherStopped {
        /// The stream.
        stream: String,
    },

    /// The RustStream broker face was shut down: handles kept from before the shutdown
    /// (publishers, subscriptions, deliveries) refuse to work rather than silently succeed.
    #[error(
        "the Kinesis broker was shut down; connect a new one to publish, subscribe or settle again"
    )]
    ShutDown,

    /// A connection of the RustStream broker face already has a subscription of this stream.
    /// One subscription reads every shard the instance holds, so a second one would only
    /// compete with it for the same shards.
    #[error(
        "this connection already has a subscription of stream {stream}; drop that one first, \
         or connect another broker to share the shards with it"
    )]
    AlreadySubscribed {
        /// The stream.
        stream: String,
    },

    /// No usable AWS credentials at `connect`: none configured, the provider failed, or the
    /// ones it gave have expired.
    #[error(
        "no usable AWS credentials: {reason}; set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (and \
         AWS_SESSION_TOKEN), a profile (AWS_PROFILE), or a role, or give a ready SdkConfig"
    )]
    Credentials {
        /// What was wrong (never the credentials themselves).
        reason: String,
    },

    /// A seek was refused; the subscription did not move.
    #[error("seek to {position} on stream `{stream}` refused: {reason}")]
    SeekRefused {
        /// The stream.
        stream: String,
        /// The position asked for.
        position: String,
        /// Why, and what to do instead.
        reason: String,
    },

    /// Deliveries handed out before a seek moved their shard: settling them no longer moves
    /// the shard's checkpoint, so waiting for it to cover them cannot succeed.
    #[error(
        "deliveries of shard `{shard}` in stream `{stream}` were handed out before a seek moved \
         the shard; their settlement no longer moves its checkpoint"
    )]
    Superseded {
        /// The stream.
        stream: String,
        /// The shard.
        shard: String,
    },

    /// A shard's checkpoint could not be written to the lease table before this instance
    /// stopped holding the shard (the table unreachable or refusing writes until the lease
    /// ran out, or the subscription stopped). What was settled and not covered is delivered
    /// again by the shard's next reader.
    #[error(
        "the checkpoint of shard `{shard}` in stream `{stream}` could not be written (the last \
         failed write is this error's source)"
    )]
    NotCheckpointed {
        /// The stream.
        stream: String,
        /// The shard.
        shard: String,
        /// The last failed write.
        #[source]
        source: Box<LeaseError>,
    },

    /// The subscription has stopped (shut down, dropped, or ended on an error).
    #[error("the subscription of stream `{stream}` has stopped; start a new one to read again")]
    Stopped {
        /// The stream.
        stream: String,
    },

    /// The application's [`PositionSource`](crate::subscription::PositionSource) failed when
    /// the shard was taken: the lease was released, and the shard is taken again at a later
    /// listing. Retryable.
    #[error(
        "the position source failed for shard `{shard}` of stream `{stream}`; the lease was \
         released and the shard is taken again at a later listing"
    )]
    PositionSource {
        /// The stream.
        stream: String,
        /// The shard.
        shard: String,
        /// The source's error.
        #[source]
        source: ErrorSource,
    },
}

impl KinesisError {
    /// This error and its causes on one line (`error: cause: cause`), each said once: for a
    /// log line or a message to a person. A cause is either in an error's message or its
    /// [`source`](std::error::Error::source), never both, so `Display` alone leaves the
    /// causes out.
    ///
    /// ```
    /// use kinesis_dataflow::KinesisError;
    ///
    /// let decode = KinesisError::Decode {
    ///     stream: "orders".into(),
    ///     shard: "shardId-000000000000".into(),
    ///     sequence_number: "1".into(),
    ///     partition_key: "k".into(),
    ///     source: std::sync::Arc::new(std::io::Error::other("expected a JSON object")),
    /// };
    /// assert!(!decode.to_string().contains("expected a JSON object"));
    /// assert!(decode.report().ends_with(": expected a JSON object"));
    /// ```
    #[must_use]
    pub fn report(&self) -> String {
        operation::chain(self, None)
    }

    /// The same error, said of `operation` (for a call carried out through another one's
    /// steps). Errors that name no operation stay as they are.
    #[must_use]
    pub(crate) fn with_operation(mut self, operation: Operation) -> Self {
        match &mut self {
            Self::StreamNotFound { operation: op, .. }
            | Self::ShardNotFound { operation: op, .. }
            | Self::InvalidArgument { operation: op, .. }
            | Self::ResourceInUse { operation: op, .. }
            | Self::AccessDenied { operation: op, .. }
            | Self::Throttled { operation: op, .. }
            | Self::ExpiredIterator { operation: op, .. }
            | Self::Service { operation: op, .. } => *op = operation,
            _ => {}
        }
        self
    }

    /// True for a throttled call ([`KinesisError::Throttled`]).
    #[must_use]
    pub fn is_throttle(&self) -> bool {
        matches!(self, Self::Throttled { .. })
    }

    /// True for an expired shard iterator ([`KinesisError::ExpiredIterator`]).
    #[must_use]
    pub fn is_expired_iterator(&self) -> bool {
        matches!(self, Self::ExpiredIterator { .. })
    }

    /// True when retrying the same call can succeed (throttles, expired iterators after
    /// renewal, transient service failures). Missing resources, refused arguments, denied
    /// permissions and bad settings are not retryable: retrying cannot fix them.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Throttled { .. }
            | Self::ExpiredIterator { .. }
            | Self::Service { .. }
            | Self::PositionSource { .. } => true,
            Self::LeaseStore(e) => e.is_retryable(),
            _ => false,
        }
    }

    /// True for the error that ends a shard stream because the shard cannot be read any more
    /// by this reader ([`KinesisError::ReaderStopped`], or any non-retryable call failure).
    /// An error about one record ([`AggregatedRecord`](Self::AggregatedRecord),
    /// [`Decode`](Self::Decode)) is not: the shard goes on after it.
    #[must_use]
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::ReaderStopped { .. })
            || !(self.is_retryable()
                || matches!(
                    self,
                    Self::AggregatedRecord { .. }
                        | Self::InvalidUserRecord { .. }
                        | Self::Decode { .. }
                ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_about_one_record_is_not_terminal() {
        let source = std::io::Error::other("not a valid payload");
        let decode = KinesisError::Decode {
            stream: "s".into(),
            shard: "shardId-000000000000".into(),
            sequence_number: "1".into(),
            partition_key: "k".into(),
            source: std::sync::Arc::new(source),
        };
        let aggregated = KinesisError::AggregatedRecord {
            stream: "s".into(),
            shard: "shardId-000000000000".into(),
            sequence_number: "1".into(),
        };
        for error in [decode, aggregated] {
            assert!(!error.is_terminal(), "{error}");
            assert!(!error.is_retryable(), "{error}");
        }
    }
}
