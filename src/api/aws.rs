//! The AWS SDK client behind [`KinesisApi`] and [`KinesisAdmin`].

mod decode;
mod fan_out;
mod lanes;

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_kinesis::primitives::{Blob, DateTime};
use aws_sdk_kinesis::types::{PutRecordsRequestEntry, ShardIteratorType};

use super::{
    ApiFuture, ChildShard, GetRecordsOutput, KinesisAdmin, KinesisApi, ListShardsPage,
    PutRecordResult, PutRecordsEntry, PutRecordsOutput, ShardDescription, ShardEvents,
    StreamConsumer, StreamStatus, StreamSummary,
};
use crate::error::{ErrorSource, KinesisError, Operation};
use crate::position::StartingPoint;
use crate::record::{Graveyard, Read, Record};

/// Kinesis through the AWS SDK: AWS itself, LocalStack, or an emulator.
///
/// The endpoint, region and credentials come from the SDK configuration, so the standard
/// settings apply: `AWS_REGION`, the credential chain, `AWS_ENDPOINT_URL` and
/// `AWS_ENDPOINT_URL_KINESIS`.
///
/// ```no_run
/// # async fn demo() {
/// use kinesis_dataflow::api::AwsKinesis;
///
/// let kinesis = AwsKinesis::from_env().await;
/// # let _ = kinesis;
/// # }
/// ```
#[derive(Clone)]
pub struct AwsKinesis {
    client: Client,
    /// The clients enhanced fan-out subscriptions are spread over.
    lanes: Arc<lanes::Lanes>,
    region: Arc<str>,
    /// Stream ARNs by name, for the enhanced fan-out calls that name a stream by its ARN.
    arns: Arc<Mutex<HashMap<String, String>>>,
    /// The fields of records read through GetRecords and dropped since, freed when the next
    /// GetRecords answer arrives (of any shard read through this client).
    graveyard: Arc<Graveyard>,
}

impl fmt::Debug for AwsKinesis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The SDK client's own Debug output is long; credentials are never printed either way.
        f.debug_struct("AwsKinesis")
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// Refuses an SDK configuration without a region before any call is made: without one every
/// call fails later with a transport error that does not say why.
///
/// # Errors
///
/// [`KinesisError::InvalidConfig`] naming `AWS_REGION`.
pub(crate) fn require_region(config: &aws_config::SdkConfig) -> Result<(), KinesisError> {
    match config.region() {
        Some(_) => Ok(()),
        None => Err(KinesisError::InvalidConfig {
            setting: "region",
            value: "(none)".into(),
            reason: "no AWS region is configured: set AWS_REGION (or `region` in the AWS \
                     profile, or the region of the SdkConfig)"
                .into(),
        }),
    }
}

impl AwsKinesis {
    /// Wraps a ready SDK client.
    ///
    /// The transport calls through a copy of the client with one interceptor added: it
    /// decodes the transport's own GetRecords answers straight into records, which costs less
    /// than the SDK's decoding and its conversion (see the guide, [*Reading one
    /// shard*](crate::guide::reading)). Every other call, and any answer it does not decode,
    /// is the SDK's as configured; interceptors of the application's see those answers' SDK
    /// output without its records.
    ///
    /// The copy is a client of its own: unless the configuration names its HTTP client and
    /// identity cache, it has its own connections and credentials cache, beside those of the
    /// client given here. [`from_conf`](Self::from_conf) and [`from_env`](Self::from_env)
    /// build one client only.
    #[must_use]
    pub fn new(client: Client) -> Self {
        Self::calling(decode::with_decoder(&client))
    }

    /// The transport over `client`, which has the decoder already.
    fn calling(client: Client) -> Self {
        let region = client
            .config()
            .region()
            .map_or_else(|| "(no region configured)".to_owned(), ToString::to_string);
        Self {
            lanes: Arc::new(lanes::Lanes::new(
                client.clone(),
                lanes::DEFAULT_PER_CONNECTION,
            )),
            client,
            region: region.into(),
            arns: Arc::default(),
            graveyard: Arc::default(),
        }
    }

    /// Caps the enhanced fan-out subscriptions one HTTP/2 connection carries (default 100,
    /// which RFC 9113 recommends every server allow at once); past it a subscription opens on
    /// another connection, so a server's cap on concurrent streams never queues one behind
    /// the others. Over HTTP/1.1 every subscription has a connection of its own anyway.
    ///
    /// The connections are those of the SDK configuration's HTTP client: its default (and any
    /// client built with `aws-smithy-http-client`) opens one per lane; an HTTP client of
    /// the application's own that ignores the connector settings carries every lane on one
    /// connection. `0` counts as 1.
    ///
    /// ```no_run
    /// # async fn demo() {
    /// use kinesis_dataflow::AwsKinesis;
    ///
    /// let kinesis = AwsKinesis::from_env().await.subscriptions_per_connection(50);
    /// assert_eq!(kinesis.fan_out_connections(), 1);
    /// # }
    /// ```
    #[must_use]
    pub fn subscriptions_per_connection(mut self, subscriptions: usize) -> Self {
        self.lanes = Arc::new(lanes::Lanes::new(self.client.clone(), subscriptions));
        self
    }

    /// How many clients (connections, over HTTP/2) enhanced fan-out subscriptions are spread
    /// over now: 1 until more than [`subscriptions_per_connection`] are open at once.
    ///
    /// [`subscriptions_per_connection`]: Self::subscriptions_per_connection
    #[must_use]
    pub fn fan_out_connections(&self) -> usize {
        self.lanes.count()
    }

    fn lock_arns(&self) -> MutexGuard<'_, HashMap<String, String>> {
        self.arns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Builds a client from a shared SDK configuration.
    #[must_use]
    pub fn from_conf(config: &aws_config::SdkConfig) -> Self {
        Self::from_builder(aws_sdk_kinesis::config::Builder::from(config))
    }

    /// The transport over the one client `config` makes (with the decoder).
    pub(crate) fn from_builder(config: aws_sdk_kinesis::config::Builder) -> Self {
        Self::calling(decode::client_with_decoder(config))
    }

    /// Builds a client from the standard AWS environment (region, credential chain, endpoint
    /// overrides such as `AWS_ENDPOINT_URL_KINESIS`).
    pub async fn from_env() -> Self {
        let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
        Self::from_conf(&config)
    }

    /// The SDK client the transport calls through: the one given to [`new`](Self::new) (or
    /// built from the configuration) with the transport's GetRecords decoder among its
    /// interceptors, which does nothing for calls made through it directly.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn error<E, R>(
        &self,
        operation: Operation,
        stream: &str,
        shard: Option<&str>,
        err: SdkError<E, R>,
    ) -> KinesisError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: fmt::Debug + Send + Sync + 'static,
    {
        let (code, message) = match &err {
            SdkError::ServiceError(service) => (
                service.err().code().map(str::to_owned),
                service
                    .err()
                    .message()
                    .map_or_else(|| crate::error::brief(&err), str::to_owned),
            ),
            _ => (None, crate::error::brief(&err)),
        };
        let source: ErrorSource = std::sync::Arc::new(err);
        classify(
            operation,
            stream,
            shard,
            &self.region,
            code.as_deref(),
            message,
            Some(source),
        )
    }
}

/// What a service error code means, before it becomes a [`KinesisError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NotFound,
    Throttled,
    Expired,
    InUse,
    Invalid,
    Denied,
    Other,
}

/// The meaning of a service error `code` answered to `operation`.
fn kind(code: &str, operation: Operation) -> Kind {
    match code {
        "ResourceNotFoundException" => Kind::NotFound,
        "ProvisionedThroughputExceededException"
        | "ThrottlingException"
        | "KMSThrottlingException"
        | "RequestLimitExceeded" => Kind::Throttled,
        // The control-plane calls answer their rate limit with LimitExceeded (registration
        // also while five consumers are being created): it clears on its own.
        "LimitExceededException"
            if matches!(
                operation,
                Operation::ListShards
                    | Operation::DescribeStreamSummary
                    | Operation::DescribeStreamConsumer
                    | Operation::RegisterStreamConsumer
                    | Operation::DeregisterStreamConsumer
                    | Operation::SubscribeToShard
            ) =>
        {
            Kind::Throttled
        }
        "ExpiredIteratorException" => Kind::Expired,
        "ResourceInUseException" => Kind::InUse,
        "InvalidArgumentException"
        | "ValidationException"
        | "LimitExceededException"
        | "ExpiredNextTokenException" => Kind::Invalid,
        "AccessDeniedException"
        | "UnrecognizedClientException"
        | "InvalidSignatureException"
        | "IncompleteSignature"
        | "ExpiredTokenException"
        | "KMSAccessDeniedException"
        | "KMSDisabledException"
        | "KMSNotFoundException"
        | "KMSInvalidStateException"
        | "KMSOptInRequired" => Kind::Denied,
        _ => Kind::Other,
    }
}

/// Maps a service error code onto the crate's error, keeping the SDK's error as its source.
pub(crate) fn classify(
    operation: Operation,
    stream: &str,
    shard: Option<&str>,
    region: &str,
    code: Option<&str>,
    message: String,
    source: Option<ErrorSource>,
) -> KinesisError {
    let stream = stream.to_owned();
    let raw = message.to_lowercase();
    let message = match shard {
        Some(shard) if !message.contains(shard) => format!("shard `{shard}`: {message}"),
        _ => message,
    };
    #[rustfmt::skip]
    let error = match kind(code.unwrap_or_default(), operation) {
        // Some emulators answer a sequence number the shard never issued with "not found";
        // the service calls it an invalid argument, and so does this crate.
        Kind::NotFound if raw.contains("sequencenumber") => {
            KinesisError::InvalidArgument { operation, stream, message, source }
        }
        Kind::NotFound => match shard {
            Some(shard) if raw.contains(&shard.to_lowercase()) || raw.contains("shard") => {
                KinesisError::ShardNotFound { operation, stream, shard: shard.to_owned(), source }
            }
            _ => KinesisError::StreamNotFound { operation, stream, region: region.to_owned(), source },
        },
        Kind::Throttled => KinesisError::Throttled { operation, stream, source },
        Kind::Expired => KinesisError::ExpiredIterator { operation, stream, source },
        Kind::InUse => KinesisError::ResourceInUse { operation, stream, message, source },
        Kind::Invalid => KinesisError::InvalidArgument { operation, stream, message, source },
        Kind::Denied => KinesisError::AccessDenied { operation, stream, message, source },
        Kind::Other => KinesisError::Service { operation, stream, message, source },
    };
    error
}

fn to_system_time(time: Option<&DateTime>) -> Option<SystemTime> {
    time.and_then(|t| SystemTime::try_from(*t).ok())
}

/// The SDK's records of `shard` of `stream` as the seam's (their strings moved, not copied;
/// their fields allocated in groups, see [`Record::answer`]).
fn records(
    records: Vec<aws_sdk_kinesis::types::Record>,
    stream: &str,
    shard: &Arc<str>,
    millis_behind_latest: Option<u64>,
    grave: Option<&Arc<Graveyard>>,
) -> Vec<Record> {
    Record::answer(
        stream,
        shard,
        millis_behind_latest,
        records.into_iter().map(|r| Read {
            approximate_arrival: to_system_time(r.approximate_arrival_timestamp.as_ref()),
            sequence_number: r.sequence_number.into(),
            partition_key: r.partition_key.unwrap_or_default().into(),
            data: r.data.into_bytes(),
        }),
        grave,
    )
}

/// The SDK's child shards as the seam's.
fn child_shards(children: Option<Vec<aws_sdk_kinesis::types::ChildShard>>) -> Vec<ChildShard> {
    children
        .unwrap_or_default()
        .into_iter()
        .map(|c| ChildShard {
            shard_id: c.shard_id,
            parent_shards: c.parent_shards,
        })
        .collect()
}

fn not_negative(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl KinesisApi for AwsKinesis {
    fn region(&self) -> &str {
        &self.region
    }

    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
        next_token: Option<String>,
    ) -> ApiFuture<'a, ListShardsPage> {
        Box::pin(async move {
            // The service refuses a stream name together with a continuation token.
            let request = match next_token {
                Some(token) => self.client.list_shards().next_token(token),
                None => self.client.list_shards().stream_name(stream),
            };
            let out = request
                .send()
                .await
                .map_err(|e| self.error(Operation::ListShards, stream, None, e))?;
            let shards = out
                .shards
                .unwrap_or_default()
                .into_iter()
                .map(|s| {
                    let (starting_hash_key, ending_hash_key) = s
                        .hash_key_range
                        .map(|r| (r.starting_hash_key, r.ending_hash_key))
                        .unwrap_or_default();
                    let (starting_sequence_number, ending_sequence_number) = s
                        .sequence_number_range
                        .map(|r| (r.starting_sequence_number, r.ending_sequence_number))
                        .unwrap_or_default();
                    ShardDescription {
                        shard_id: s.shard_id,
                        parent_shard_id: s.parent_shard_id,
                        adjacent_parent_shard_id: s.adjacent_parent_shard_id,
                        starting_hash_key,
                        ending_hash_key,
                        starting_sequence_number,
                        ending_sequence_number,
                    }
                })
                .collect();
            Ok(ListShardsPage {
                shards,
                next_token: out.next_token,
            })
        })
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, String> {
        Box::pin(async move {
            let request = self
                .client
                .get_shard_iterator()
                .stream_name(stream)
                .shard_id(shard);
            let request = match start {
                StartingPoint::TrimHorizon => {
                    request.shard_iterator_type(ShardIteratorType::TrimHorizon)
                }
                StartingPoint::Latest => request.shard_iterator_type(ShardIteratorType::Latest),
                StartingPoint::AtTimestamp(ms) => request
                    .shard_iterator_type(ShardIteratorType::AtTimestamp)
                    .timestamp(DateTime::from_millis(
                        i64::try_from(*ms).unwrap_or(i64::MAX),
                    )),
                // The user records of the aggregate up to the sub-sequence number are left
                // out by the reader.
                StartingPoint::AtSequence(seq) | StartingPoint::AfterSubSequence(seq, _) => request
                    .shard_iterator_type(ShardIteratorType::AtSequenceNumber)
                    .starting_sequence_number(seq),
                StartingPoint::AfterSequence(seq) => request
                    .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                    .starting_sequence_number(seq),
            };
            let out = request
                .send()
                .await
                .map_err(|e| self.error(Operation::GetShardIterator, stream, Some(shard), e))?;
            out.shard_iterator.ok_or_else(|| KinesisError::Service {
                operation: Operation::GetShardIterator,
                stream: stream.to_owned(),
                message: format!("the answer for shard `{shard}` carried no iterator"),
                source: None,
            })
        })
    }

    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: String,
        limit: u32,
    ) -> ApiFuture<'a, GetRecordsOutput> {
        Box::pin(async move {
            let call = self
                .client
                .get_records()
                .shard_iterator(iterator)
                .limit(i32::try_from(limit).unwrap_or(i32::MAX))
                .send();
            let (out, decoded) = decode::decoding(call).await;
            // On a read task's thread, where answers are decoded: the records dropped since
            // the last answer are freed here rather than on the consumer's thread.
            self.graveyard.clear();
            let out = out.map_err(|e| self.error(Operation::GetRecords, stream, Some(shard), e))?;
            if let Some(answer) = decoded {
                let millis_behind_latest = answer.millis_behind_latest.map(not_negative);
                return Ok(GetRecordsOutput {
                    records: Record::answer(
                        stream,
                        shard,
                        millis_behind_latest,
                        answer.reads,
                        Some(&self.graveyard),
                    ),
                    next_shard_iterator: answer.next_shard_iterator,
                    millis_behind_latest,
                    child_shards: answer.child_shards,
                });
            }
            let millis_behind_latest = out.millis_behind_latest.map(not_negative);
            let records = records(
                out.records,
                stream,
                shard,
                millis_behind_latest,
                Some(&self.graveyard),
            );
            let child_shards = child_shards(out.child_shards);
            Ok(GetRecordsOutput {
                records,
                next_shard_iterator: out.next_shard_iterator,
                millis_behind_latest,
                child_shards,
            })
        })
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        Box::pin(async move {
            let mut request = self.client.put_records().stream_name(stream);
            for entry in entries {
                let built = PutRecordsRequestEntry::builder()
                    .data(Blob::new(Vec::from(entry.data)))
                    .partition_key(entry.partition_key)
                    .set_explicit_hash_key(entry.explicit_hash_key)
                    .build()
                    .map_err(|e| KinesisError::InvalidArgument {
                        operation: Operation::PutRecords,
                        stream: stream.to_owned(),
                        message: e.to_string(),
                        source: None,
                    })?;
                request = request.records(built);
            }
            let out = request
                .send()
                .await
                .map_err(|e| self.error(Operation::PutRecords, stream, None, e))?;
            let results = out
                .records
                .into_iter()
                .map(|r| match (r.shard_id, r.sequence_number, r.error_code) {
                    (Some(shard_id), Some(sequence_number), None) => PutRecordResult::Stored {
                        shard_id,
                        sequence_number,
                    },
                    (_, _, code) => PutRecordResult::Failed {
                        code: code.unwrap_or_else(|| "Unknown".to_owned()),
                        message: r.error_message.unwrap_or_default(),
                    },
                })
                .collect();
            Ok(PutRecordsOutput { results })
        })
    }

    fn describe_stream_summary<'a>(&'a self, stream: &'a str) -> ApiFuture<'a, StreamSummary> {
        Box::pin(async move {
            let out = self
                .client
                .describe_stream_summary()
                .stream_name(stream)
                .send()
                .await
                .map_err(|e| self.error(Operation::DescribeStreamSummary, stream, None, e))?;
            let summary = out
                .stream_description_summary
                .ok_or_else(|| KinesisError::Service {
                    operation: Operation::DescribeStreamSummary,
                    stream: stream.to_owned(),
                    message: "the answer carried no stream description".to_owned(),
                    source: None,
                })?;
            use aws_sdk_kinesis::types::StreamStatus as S;
            let status = match summary.stream_status {
                S::Creating => StreamStatus::Creating,
                S::Deleting => StreamStatus::Deleting,
                S::Updating => StreamStatus::Updating,
                _ => StreamStatus::Active,
            };
            Ok(StreamSummary {
                stream_name: summary.stream_name,
                status,
                open_shard_count: u32::try_from(summary.open_shard_count).unwrap_or(0),
                retention_period_hours: u32::try_from(summary.retention_period_hours).unwrap_or(0),
            })
        })
    }

    fn register_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        Box::pin(self.register(stream, consumer))
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        Box::pin(self.describe(stream, consumer))
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, ()> {
        Box::pin(self.deregister(stream, consumer))
    }

    fn subscribe_to_shard<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, ShardEvents> {
        Box::pin(self.subscribe(stream, consumer_arn, shard, start))
    }
}

impl KinesisAdmin for AwsKinesis {
    fn create_stream<'a>(&'a self, stream: &'a str, shard_count: u32) -> ApiFuture<'a, ()> {
        Box::pin(async move {
            self.client
                .create_stream()
                .stream_name(stream)
                .shard_count(i32::try_from(shard_count).unwrap_or(i32::MAX))
                .send()
                .await
                .map_err(|e| self.error(Operation::CreateStream, stream, None, e))?;
            Ok(())
        })
    }

    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        new_starting_hash_key: &'a str,
    ) -> ApiFuture<'a, ()> {
        Box::pin(async move {
            self.client
                .split_shard()
                .stream_name(stream)
                .shard_to_split(shard)
                .new_starting_hash_key(new_starting_hash_key)
                .send()
                .await
                .map_err(|e| self.error(Operation::SplitShard, stream, Some(shard), e))?;
            Ok(())
        })
    }

    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        adjacent: &'a str,
    ) -> ApiFuture<'a, ()> {
        Box::pin(async move {
            self.client
                .merge_shards()
                .stream_name(stream)
                .shard_to_merge(shard)
                .adjacent_shard_to_merge(adjacent)
                .send()
                .await
                .map_err(|e| self.error(Operation::MergeShards, stream, Some(shard), e))?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_exceeded_is_a_throttle_of_the_consumer_calls() {
        // Their rate limits (and the five consumers CREATING at once) clear on their own.
        for operation in [
            Operation::RegisterStreamConsumer,
            Operation::DeregisterStreamConsumer,
        ] {
            assert!(
                matches!(kind("LimitExceededException", operation), Kind::Throttled),
                "{operation:?}"
            );
        }
    }

    #[test]
    fn a_service_error_keeps_the_sdk_error_as_its_source() {
        let sdk: ErrorSource = Arc::new(std::io::Error::other("the SDK's error"));
        let classified = |code: &str| {
            classify(
                Operation::CreateStream,
                "orders",
                None,
                "eu-west-1",
                Some(code),
                "the service said no".to_owned(),
                Some(sdk.clone()),
            )
        };
        let in_use = classified("ResourceInUseException");
        assert!(
            matches!(&in_use, KinesisError::ResourceInUse { operation: Operation::CreateStream, stream, .. } if stream == "orders"),
            "{in_use:?}"
        );
        for error in [
            in_use,
            classified("AccessDeniedException"),
            classified("Whatever"),
        ] {
            let source = std::error::Error::source(&error).map(ToString::to_string);
            assert_eq!(source.as_deref(), Some("the SDK's error"), "{error:?}");
        }
    }
}

#[cfg(test)]
mod region_tests {
    #[test]
    fn a_configuration_without_a_region_is_refused_naming_aws_region() {
        let config = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build();
        let error = crate::Subscription::aws(&config, "billing", "payments").unwrap_err();
        assert!(error.to_string().contains("AWS_REGION"), "{error}");
        let with_region = config
            .to_builder()
            .region(aws_config::Region::new("eu-west-1"))
            .build();
        assert!(super::require_region(&with_region).is_ok());
    }
}
