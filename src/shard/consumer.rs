//! The enhanced fan-out consumer a reader subscribes as: registered when missing, waited for
//! until ACTIVE, never deregistered implicitly.

use std::time::Duration;

use super::reader::within_timeout;
use crate::api::{ConsumerStatus, KinesisApi, StreamConsumer};
use crate::error::{KinesisError, Operation};

/// How long [`register_consumer`] waits for a consumer to become ACTIVE.
pub const CONSUMER_ACTIVATION_TIMEOUT: Duration = Duration::from_secs(120);
/// How often [`register_consumer`] asks whether the consumer is ACTIVE.
const CHECK_EVERY: Duration = Duration::from_secs(1);

/// The consumer `name` of `stream`, ACTIVE: registered first when it does not exist (another
/// instance registering it at the same time is fine), then described once a second until it
/// is ACTIVE (the service takes a few seconds), at most [`CONSUMER_ACTIVATION_TIMEOUT`]. Each
/// call is given up after [`READ_CALL_TIMEOUT`](super::READ_CALL_TIMEOUT) without an answer
/// (a connection gone half-open), so this never hangs.
///
/// # Errors
///
/// The failed call's error (a missing stream, missing permissions, throttling; a call not
/// answered in time is a retryable [`KinesisError::Service`]), or [`KinesisError::Service`]
/// naming the consumer when it did not become ACTIVE in time.
pub async fn register_consumer(
    api: &dyn KinesisApi,
    stream: &str,
    name: &str,
) -> Result<StreamConsumer, KinesisError> {
    let deadline = tokio::time::Instant::now() + CONSUMER_ACTIVATION_TIMEOUT;
    loop {
        let describe = api.describe_stream_consumer(stream, name);
        let described = match within_timeout(Operation::DescribeStreamConsumer, stream, describe)
            .await
        {
            Ok(consumer) => consumer,
            Err(KinesisError::StreamNotFound { .. }) => {
                let register = api.register_stream_consumer(stream, name);
                match within_timeout(Operation::RegisterStreamConsumer, stream, register).await {
                    Ok(consumer) => {
                        tracing::info!(stream, consumer = name, "registered the fan-out consumer");
                        consumer
                    }
                    // Registered meanwhile by another instance, or the stream is not ACTIVE
                    // (it is being resharded, say): asked again a moment later.
                    Err(KinesisError::ResourceInUse { .. }) => {
                        wait_or_give_up(deadline, stream, name, "refused registration").await?;
                        continue;
                    }
                    // The account's rate of registrations (five a second), or five consumers
                    // being created at once.
                    Err(e) if e.is_throttle() => {
                        wait_or_give_up(deadline, stream, name, "throttled").await?;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            Err(e) if e.is_throttle() => {
                wait_or_give_up(deadline, stream, name, "throttled").await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        if described.status == ConsumerStatus::Active {
            return Ok(described);
        }
        wait_or_give_up(deadline, stream, name, "not ACTIVE").await?;
    }
}

async fn wait_or_give_up(
    deadline: tokio::time::Instant,
    stream: &str,
    name: &str,
    why: &str,
) -> Result<(), KinesisError> {
    if tokio::time::Instant::now() + CHECK_EVERY > deadline {
        return Err(KinesisError::Service {
            operation: Operation::DescribeStreamConsumer,
            stream: stream.to_owned(),
            message: format!(
                "the fan-out consumer `{name}` was still {why} after {CONSUMER_ACTIVATION_TIMEOUT:?}"
            ),
            source: None,
        });
    }
    tokio::time::sleep(CHECK_EVERY).await;
    Ok(())
}

/// Deregisters the fan-out consumer `name` of `stream`: every subscription of it ends, in
/// every instance. Readers never do this on their own (other instances of the application use
/// the consumer); call it when the application is retired. A consumer that does not exist is
/// fine.
///
/// # Errors
///
/// The failed call's error.
pub async fn deregister_consumer(
    api: &dyn KinesisApi,
    stream: &str,
    name: &str,
) -> Result<(), KinesisError> {
    match api.deregister_stream_consumer(stream, name).await {
        Ok(()) | Err(KinesisError::StreamNotFound { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryKinesis;

    #[tokio::test(start_paused = true)]
    async fn a_missing_consumer_is_registered_and_waited_for() {
        let kinesis = MemoryKinesis::new().with_consumer_activation(Duration::from_secs(4));
        kinesis.add_stream("s", 1).unwrap();
        let consumer = register_consumer(&kinesis, "s", "app").await.unwrap();
        assert_eq!(consumer.status, ConsumerStatus::Active);
        // Again: found, not registered twice.
        let again = register_consumer(&kinesis, "s", "app").await.unwrap();
        assert_eq!(again.consumer_arn, consumer.consumer_arn);
        deregister_consumer(&kinesis, "s", "app").await.unwrap();
        deregister_consumer(&kinesis, "s", "app").await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_throttled_registration_is_asked_again() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("s", 1).unwrap();
        kinesis.inject(
            crate::api::memory::Fault::throttle(Operation::RegisterStreamConsumer).times(2),
        );
        let consumer = register_consumer(&kinesis, "s", "app").await.unwrap();
        assert_eq!(consumer.status, ConsumerStatus::Active);
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_stream_is_its_error() {
        let kinesis = MemoryKinesis::new();
        let e = register_consumer(&kinesis, "nope", "app")
            .await
            .unwrap_err();
        assert!(matches!(e, KinesisError::StreamNotFound { .. }), "{e:?}");
    }

    /// Answers every consumer registration with ResourceInUse and every description with
    /// "not found", as the service does while the stream is not ACTIVE; counts the calls, and
    /// after 10,000 refuses with another error so a loop that never waits still ends.
    #[derive(Default)]
    struct NotActive(std::sync::atomic::AtomicUsize);

    impl crate::api::layer::KinesisLayer for NotActive {
        fn around<'a, T: Send + 'a>(
            &'a self,
            call: crate::api::layer::ApiCall<'a>,
            next: crate::api::ApiFuture<'a, T>,
        ) -> crate::api::ApiFuture<'a, T> {
            let crate::api::layer::ApiCall::Consumer { operation, .. } = call else {
                return next;
            };
            let calls = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let (stream, message) = ("s".to_owned(), "stream UPDATING".to_owned());
            Box::pin(async move {
                Err(match operation {
                    _ if calls >= 10_000 => KinesisError::AccessDenied {
                        operation,
                        stream,
                        message,
                        source: None,
                    },
                    Operation::RegisterStreamConsumer => KinesisError::ResourceInUse {
                        operation,
                        stream,
                        message,
                        source: None,
                    },
                    _ => KinesisError::StreamNotFound {
                        operation,
                        stream,
                        region: "memory".to_owned(),
                        source: None,
                    },
                })
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_registration_refused_while_the_stream_is_not_active_is_waited_for() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("s", 1).unwrap();
        let layered =
            crate::api::layer::Layered::new(std::sync::Arc::new(kinesis), NotActive::default());
        let e = register_consumer(&layered, "s", "app").await.unwrap_err();
        assert!(
            matches!(&e, KinesisError::Service { message, .. } if message.contains("app")),
            "gave up after the activation timeout, naming the consumer: {e:?}"
        );
        let calls = layered.layer().0.load(std::sync::atomic::Ordering::Relaxed);
        assert!(calls < 1_000, "{calls} calls: one pair a second at most");
    }
}
