//! Enhanced fan-out through the AWS SDK: the stream consumer calls (which name the stream by
//! its ARN, looked up once per stream) and SubscribeToShard's event stream.

use std::sync::Arc;

use aws_sdk_kinesis::error::SdkError;
use aws_sdk_kinesis::primitives::DateTime;
use aws_sdk_kinesis::types::error::SubscribeToShardEventStreamError;
use aws_sdk_kinesis::types::{
    ConsumerStatus as SdkStatus, ShardIteratorType, StartingPosition, SubscribeToShardEventStream,
};
use aws_smithy_types::event_stream::RawMessage;
use futures::StreamExt;

use super::{AwsKinesis, child_shards, not_negative, records};
use crate::api::{ConsumerStatus, ShardEvent, ShardEvents, StreamConsumer};
use crate::error::{KinesisError, Operation};
use crate::position::StartingPoint;

impl AwsKinesis {
    /// The ARN of `stream` (DescribeStreamSummary at the first use, then remembered).
    async fn stream_arn(&self, stream: &str, operation: Operation) -> Result<String, KinesisError> {
        if let Some(arn) = self.lock_arns().get(stream) {
            return Ok(arn.clone());
        }
        let out = self
            .client
            .describe_stream_summary()
            .stream_name(stream)
            .send()
            .await
            .map_err(|e| self.error(operation, stream, None, e))?;
        let arn = out
            .stream_description_summary
            .map(|s| s.stream_arn)
            .ok_or_else(|| missing(operation, stream, "stream description"))?;
        self.lock_arns().insert(stream.to_owned(), arn.clone());
        Ok(arn)
    }

    pub(super) async fn register(
        &self,
        stream: &str,
        consumer: &str,
    ) -> Result<StreamConsumer, KinesisError> {
        let op = Operation::RegisterStreamConsumer;
        let arn = self.stream_arn(stream, op).await?;
        let out = self
            .client
            .register_stream_consumer()
            .stream_arn(arn)
            .consumer_name(consumer)
            .send()
            .await
            .map_err(|e| self.error(op, stream, None, e))?;
        let c = out
            .consumer
            .ok_or_else(|| missing(op, stream, "consumer"))?;
        Ok(StreamConsumer {
            consumer_name: c.consumer_name,
            consumer_arn: c.consumer_arn,
            status: status(&c.consumer_status),
        })
    }

    pub(super) async fn describe(
        &self,
        stream: &str,
        consumer: &str,
    ) -> Result<StreamConsumer, KinesisError> {
        let op = Operation::DescribeStreamConsumer;
        let arn = self.stream_arn(stream, op).await?;
        let out = self
            .client
            .describe_stream_consumer()
            .stream_arn(arn)
            .consumer_name(consumer)
            .send()
            .await
            .map_err(|e| self.error(op, stream, None, e))?;
        let c = out
            .consumer_description
            .ok_or_else(|| missing(op, stream, "consumer description"))?;
        Ok(StreamConsumer {
            consumer_name: c.consumer_name,
            consumer_arn: c.consumer_arn,
            status: status(&c.consumer_status),
        })
    }

    pub(super) async fn deregister(
        &self,
        stream: &str,
        consumer: &str,
    ) -> Result<(), KinesisError> {
        let op = Operation::DeregisterStreamConsumer;
        let arn = self.stream_arn(stream, op).await?;
        self.client
            .deregister_stream_consumer()
            .stream_arn(arn)
            .consumer_name(consumer)
            .send()
            .await
            .map_err(|e| self.error(op, stream, None, e))?;
        Ok(())
    }

    pub(super) async fn subscribe(
        &self,
        stream: &str,
        consumer_arn: &str,
        shard: &Arc<str>,
        start: &StartingPoint,
    ) -> Result<ShardEvents, KinesisError> {
        let op = Operation::SubscribeToShard;
        let position = starting_position(start).map_err(|e| KinesisError::InvalidArgument {
            operation: op,
            stream: stream.to_owned(),
            message: e.to_string(),
            source: None,
        })?;
        let (client, seat) = self.lanes.seat();
        let out = client
            .subscribe_to_shard()
            .consumer_arn(consumer_arn)
            .shard_id(&**shard)
            .starting_position(position)
            .send()
            .await
            .map_err(|e| self.error(op, stream, Some(shard), e))?;
        let this = self.clone();
        let (stream, shard) = (Arc::<str>::from(stream), shard.clone());
        let events = futures::stream::unfold(Some(out.event_stream), move |receiver| {
            let (this, stream, shard) = (this.clone(), stream.clone(), shard.clone());
            async move {
                let mut receiver = receiver?;
                loop {
                    match receiver.recv().await {
                        Ok(Some(SubscribeToShardEventStream::SubscribeToShardEvent(e))) => {
                            let event = event(e, &stream, &shard);
                            let next = (!event.ends_shard()).then_some(receiver);
                            return Some((Ok(event), next));
                        }
                        // A kind of event this SDK does not know: nothing to read in it.
                        Ok(Some(_)) => {}
                        Ok(None) => return None,
                        Err(e) => {
                            let error = this.event_error(&stream, &shard, e);
                            return Some((Err(error), None));
                        }
                    }
                }
            }
        });
        // The subscription keeps its seat on the lane while its event stream lives.
        Ok(events
            .map(move |event| {
                let _seat = &seat;
                event
            })
            .boxed())
    }
}

impl AwsKinesis {
    /// An error inside a subscription's event stream. The SDK knows its kind by the event's
    /// type, not by an error code (the payload carries none; kinesis-local's refusal of a
    /// second subscription neither): every modelled kind is taken from the type.
    fn event_error(
        &self,
        stream: &str,
        shard: &str,
        e: SdkError<SubscribeToShardEventStreamError, RawMessage>,
    ) -> KinesisError {
        let op = Operation::SubscribeToShard;
        let code = match &e {
            SdkError::ServiceError(service) => event_error_code(service.err()),
            _ => None,
        };
        match code {
            Some(code) => super::classify(
                op,
                stream,
                Some(shard),
                &self.region,
                Some(code),
                crate::error::brief(&e),
                Some(Arc::new(e)),
            ),
            None => self.error(op, stream, Some(shard), e),
        }
    }
}

/// The service's error code of an event-stream error, by its type.
fn event_error_code(error: &SubscribeToShardEventStreamError) -> Option<&'static str> {
    use SubscribeToShardEventStreamError as E;
    Some(match error {
        E::ResourceInUseException(_) => "ResourceInUseException",
        E::ResourceNotFoundException(_) => "ResourceNotFoundException",
        E::KmsDisabledException(_) => "KMSDisabledException",
        E::KmsInvalidStateException(_) => "KMSInvalidStateException",
        E::KmsAccessDeniedException(_) => "KMSAccessDeniedException",
        E::KmsNotFoundException(_) => "KMSNotFoundException",
        E::KmsOptInRequired(_) => "KMSOptInRequired",
        E::KmsThrottlingException(_) => "KMSThrottlingException",
        E::InternalFailureException(_) => "InternalFailureException",
        _ => return None,
    })
}

fn status(status: &SdkStatus) -> ConsumerStatus {
    match status {
        SdkStatus::Creating => ConsumerStatus::Creating,
        SdkStatus::Deleting => ConsumerStatus::Deleting,
        _ => ConsumerStatus::Active,
    }
}

fn missing(operation: Operation, stream: &str, what: &str) -> KinesisError {
    KinesisError::Service {
        operation,
        stream: stream.to_owned(),
        message: format!("the answer carried no {what}"),
        source: None,
    }
}

/// Where a subscription starts, as SubscribeToShard takes it.
fn starting_position(
    start: &StartingPoint,
) -> Result<StartingPosition, aws_sdk_kinesis::error::BuildError> {
    let builder = StartingPosition::builder();
    let builder =
        match start {
            StartingPoint::TrimHorizon => builder.r#type(ShardIteratorType::TrimHorizon),
            StartingPoint::Latest => builder.r#type(ShardIteratorType::Latest),
            StartingPoint::AtTimestamp(ms) => builder
                .r#type(ShardIteratorType::AtTimestamp)
                .timestamp(DateTime::from_millis(
                    i64::try_from(*ms).unwrap_or(i64::MAX),
                )),
            // The user records of the aggregate up to the sub-sequence number are left out by the
            // reader.
            StartingPoint::AtSequence(seq) | StartingPoint::AfterSubSequence(seq, _) => builder
                .r#type(ShardIteratorType::AtSequenceNumber)
                .sequence_number(seq),
            StartingPoint::AfterSequence(seq) => builder
                .r#type(ShardIteratorType::AfterSequenceNumber)
                .sequence_number(seq),
        };
    builder.build()
}

/// One SDK event as the seam's.
fn event(
    e: aws_sdk_kinesis::types::SubscribeToShardEvent,
    stream: &str,
    shard: &Arc<str>,
) -> ShardEvent {
    let millis_behind_latest = Some(not_negative(e.millis_behind_latest));
    let records = records(e.records, stream, shard, millis_behind_latest, None);
    let child_shards = child_shards(e.child_shards);
    // The event that reaches a closed shard's end names the children and no continuation.
    let continuation_sequence_number =
        Some(e.continuation_sequence_number).filter(|c| !c.is_empty() || child_shards.is_empty());
    ShardEvent {
        records,
        continuation_sequence_number,
        millis_behind_latest,
        child_shards,
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_kinesis::types::error::{
        InternalFailureException, KmsAccessDeniedException, KmsOptInRequired,
        KmsThrottlingException,
    };

    use super::*;

    fn kinesis() -> AwsKinesis {
        let conf = aws_sdk_kinesis::Config::builder()
            .behavior_version(aws_sdk_kinesis::config::BehaviorVersion::latest())
            .region(aws_sdk_kinesis::config::Region::new("eu-west-1"))
            .build();
        AwsKinesis::new(aws_sdk_kinesis::Client::from_conf(conf))
    }

    fn event(error: SubscribeToShardEventStreamError) -> KinesisError {
        kinesis().event_error(
            "s",
            "shardId-000000000000",
            SdkError::service_error(error, RawMessage::Invalid(None)),
        )
    }

    /// The SDK names an event-stream error by its type; its payload carries no code.
    #[test]
    fn an_event_streams_errors_keep_their_kind() {
        let throttled = event(SubscribeToShardEventStreamError::KmsThrottlingException(
            KmsThrottlingException::builder()
                .message("slow down")
                .build(),
        ));
        assert!(throttled.is_throttle(), "{throttled:?}");
        for denied in [
            SubscribeToShardEventStreamError::KmsAccessDeniedException(
                KmsAccessDeniedException::builder().message("no").build(),
            ),
            SubscribeToShardEventStreamError::KmsOptInRequired(
                KmsOptInRequired::builder().message("opt in").build(),
            ),
        ] {
            let e = event(denied);
            assert!(matches!(e, KinesisError::AccessDenied { .. }), "{e:?}");
            assert!(!e.is_retryable(), "{e:?}");
        }
        let internal = event(SubscribeToShardEventStreamError::InternalFailureException(
            InternalFailureException::builder().message("oops").build(),
        ));
        assert!(internal.is_retryable(), "{internal:?}");
    }
}
