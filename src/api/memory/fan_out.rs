//! Enhanced fan-out in memory: registered consumers and SubscribeToShard subscriptions that
//! push each shard's records as they arrive.
//!
//! The rules modelled: a consumer name is unique within its stream; a consumer is CREATING for
//! [`MemoryKinesis::with_consumer_activation`] after its registration (0 by default) and cannot
//! subscribe until ACTIVE; a consumer has at most one active subscription to a shard, and may
//! subscribe to it once every five seconds (ResourceInUse otherwise); a subscription is active
//! until its event stream is dropped (its connection closed), ends or fails: a holder that
//! stops reading without dropping it (a frozen process) keeps it. A subscription ends after
//! [`MemoryKinesis::with_subscription_lifetime`]
//! (five minutes by default, like the service), after the event that reaches a closed shard's
//! end (which names the children), or with an error once its consumer is deregistered or its
//! connection is cut ([`MemoryKinesis::cut_subscriptions`]). Events
//! carry every record that arrived since the previous one (checked every 10 ms of the tokio
//! clock), or none once a second while nothing arrives, with the continuation sequence number
//! of the last record before the next one to read, as the service's do; from a shard's first
//! position ever (no record before it, so no number to continue after) there is no event until
//! a record arrives.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

#[cfg(feature = "test-util")]
use super::Call;
use super::{MemoryKinesis, State};
use crate::api::{ConsumerStatus, GetRecordsOutput, ShardEvent, ShardEvents, StreamConsumer};
use crate::error::{KinesisError, Operation};
use crate::position::StartingPoint;

/// How long a subscription lasts unless [`MemoryKinesis::with_subscription_lifetime`] says
/// otherwise (five minutes, like the service).
pub const DEFAULT_SUBSCRIPTION_LIFETIME: Duration = Duration::from_secs(300);

/// How soon a consumer may subscribe to the same shard again (the service's five seconds).
const RESUBSCRIBE_AFTER: Duration = Duration::from_secs(5);
/// How often a subscription looks for new records.
const CHECK_EVERY: Duration = Duration::from_millis(10);
/// How often a subscription sends an event while nothing arrives.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// The most records one event carries.
const EVENT_RECORDS: u32 = 10_000;

/// A registered consumer.
#[derive(Debug, Clone)]
pub(super) struct Consumer {
    stream: String,
    name: String,
    arn: String,
    active_at: Instant,
}

impl Consumer {
    fn describe(&self) -> StreamConsumer {
        StreamConsumer {
            consumer_name: self.name.clone(),
            consumer_arn: self.arn.clone(),
            status: if Instant::now() >= self.active_at {
                ConsumerStatus::Active
            } else {
                ConsumerStatus::Creating
            },
        }
    }
}

/// The fan-out part of the store's state.
#[derive(Debug)]
pub(super) struct FanOut {
    pub(super) consumers: Vec<Consumer>,
    /// When each (consumer ARN, shard) last subscribed successfully.
    pub(super) subscribed: std::collections::HashMap<(String, String), Instant>,
    /// The active subscription of each (consumer ARN, shard), until it is dropped or ends.
    pub(super) active: std::collections::HashMap<(String, String), ActiveEntry>,
    pub(super) next_subscription: u64,
    pub(super) lifetime: Duration,
    pub(super) activation: Duration,
    pub(super) next_consumer: u64,
    /// Moved on by [`MemoryKinesis::cut_subscriptions`]: a subscription of an older
    /// generation fails at its next event.
    pub(super) generation: u64,
}

impl Default for FanOut {
    fn default() -> Self {
        Self {
            consumers: Vec::new(),
            subscribed: std::collections::HashMap::new(),
            active: std::collections::HashMap::new(),
            next_subscription: 1,
            lifetime: DEFAULT_SUBSCRIPTION_LIFETIME,
            activation: Duration::ZERO,
            next_consumer: 1,
            generation: 0,
        }
    }
}

fn not_found(operation: Operation, stream: &str, region: &str) -> KinesisError {
    KinesisError::StreamNotFound {
        operation,
        stream: stream.to_owned(),
        region: region.to_owned(),
        source: None,
    }
}

fn in_use(operation: Operation, stream: &str, message: String) -> KinesisError {
    KinesisError::ResourceInUse {
        operation,
        stream: stream.to_owned(),
        message,
        source: None,
    }
}

impl MemoryKinesis {
    /// Makes a registered consumer CREATING for `activation` (by the tokio clock) before it is
    /// ACTIVE and may subscribe.
    #[must_use]
    pub fn with_consumer_activation(self, activation: Duration) -> Self {
        self.lock().fan_out.activation = activation;
        self
    }

    /// Ends every SubscribeToShard subscription `lifetime` after it began (by the tokio
    /// clock), instead of the service's five minutes.
    #[must_use]
    pub fn with_subscription_lifetime(self, lifetime: Duration) -> Self {
        self.lock().fan_out.lifetime = lifetime;
        self
    }

    /// Cuts every live subscription, as a dropped connection would: each fails at its next
    /// event with a service error ("connection reset") and ends.
    pub fn cut_subscriptions(&self) {
        self.lock().fan_out.generation += 1;
    }

    /// How many SubscribeToShard subscriptions are active now: begun, and not dropped, ended
    /// (their lifetime over) or cut.
    pub fn active_subscriptions(&self) -> usize {
        let state = self.lock();
        let fan_out = &state.fan_out;
        let now = Instant::now();
        fan_out
            .active
            .values()
            .filter(|a| a.generation == fan_out.generation && now < a.ends_at)
            .count()
    }

    fn generation(&self) -> u64 {
        self.lock().fan_out.generation
    }

    #[cfg(feature = "test-util")]
    fn consumer_call(&self, operation: Operation, stream: &str) -> Call {
        self.call(operation, stream)
    }

    pub(super) async fn register(
        &self,
        stream: &str,
        name: &str,
    ) -> Result<StreamConsumer, KinesisError> {
        let op = Operation::RegisterStreamConsumer;
        #[cfg(feature = "test-util")]
        self.gate(self.consumer_call(op, stream), &[]).await?;
        crate::api::check_consumer_name(name).map_err(|m| super::ops::invalid(op, stream, m))?;
        let mut state = self.lock();
        self.stream_mut(&mut state, op, stream)?;
        let fan_out = &mut state.fan_out;
        if fan_out
            .consumers
            .iter()
            .any(|c| c.stream == stream && c.name == name)
        {
            return Err(in_use(
                op,
                stream,
                format!("consumer `{name}` exists already"),
            ));
        }
        let number = fan_out.next_consumer;
        fan_out.next_consumer += 1;
        let consumer = Consumer {
            stream: stream.to_owned(),
            name: name.to_owned(),
            arn: format!(
                "arn:aws:kinesis:{}:000000000000:stream/{stream}/consumer/{name}:{number}",
                self.region
            ),
            active_at: Instant::now() + fan_out.activation,
        };
        let described = consumer.describe();
        fan_out.consumers.push(consumer);
        Ok(described)
    }

    pub(super) async fn describe_consumer(
        &self,
        stream: &str,
        name: &str,
    ) -> Result<StreamConsumer, KinesisError> {
        let op = Operation::DescribeStreamConsumer;
        #[cfg(feature = "test-util")]
        self.gate(self.consumer_call(op, stream), &[]).await?;
        let mut state = self.lock();
        self.stream_mut(&mut state, op, stream)?;
        state
            .fan_out
            .consumers
            .iter()
            .find(|c| c.stream == stream && c.name == name)
            .map(Consumer::describe)
            .ok_or_else(|| not_found(op, stream, &self.region))
    }

    pub(super) async fn deregister(&self, stream: &str, name: &str) -> Result<(), KinesisError> {
        let op = Operation::DeregisterStreamConsumer;
        #[cfg(feature = "test-util")]
        self.gate(self.consumer_call(op, stream), &[]).await?;
        let mut state = self.lock();
        self.stream_mut(&mut state, op, stream)?;
        let consumers = &mut state.fan_out.consumers;
        let before = consumers.len();
        consumers.retain(|c| !(c.stream == stream && c.name == name));
        if consumers.len() == before {
            return Err(not_found(op, stream, &self.region));
        }
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
        #[cfg(feature = "test-util")]
        {
            let call = Call {
                shard: Some(shard.to_string()),
                starting_point: Some(start.clone()),
                ..self.call(op, stream)
            };
            self.gate(call, &[&**shard]).await?;
        }
        let iterator = self
            .shard_iterator(stream, shard, start)
            .map_err(|e| e.with_operation(op))?;
        let active = self.admit(stream, consumer_arn, shard)?;
        let continuation = self.continuation_before(stream, &iterator);
        let lifetime = self.lock().fan_out.lifetime;
        let subscription = Subscription {
            _active: active,
            kinesis: self.clone(),
            stream: stream.into(),
            shard: shard.clone(),
            consumer_arn: consumer_arn.into(),
            iterator: Some(iterator),
            ends_at: Instant::now() + lifetime,
            last_event: Instant::now(),
            continuation,
            generation: self.generation(),
        };
        Ok(futures::stream::unfold(subscription, |mut s| async move {
            let event = s.next_event().await?;
            Some((event, s))
        })
        .boxed())
    }

    /// Lets a subscription of `consumer_arn` to `shard` begin, by the consumer's state, the
    /// rule of one active subscription and the five-second rule; it is active while the
    /// returned mark lives.
    fn admit(&self, stream: &str, consumer_arn: &str, shard: &str) -> Result<Active, KinesisError> {
        let op = Operation::SubscribeToShard;
        let mut state = self.lock();
        self.stream_mut(&mut state, op, stream)?;
        let State { fan_out, .. } = &mut *state;
        let consumer = fan_out
            .consumers
            .iter()
            .find(|c| c.arn == consumer_arn && c.stream == stream)
            .ok_or_else(|| not_found(op, stream, &self.region))?;
        if consumer.describe().status != ConsumerStatus::Active {
            let name = &consumer.name;
            return Err(in_use(
                op,
                stream,
                format!("consumer `{name}` is not ACTIVE yet"),
            ));
        }
        let key = (consumer_arn.to_owned(), shard.to_owned());
        let generation = fan_out.generation;
        if fan_out
            .active
            .get(&key)
            .is_some_and(|a| a.generation == generation && Instant::now() < a.ends_at)
        {
            let name = &consumer.name;
            return Err(in_use(
                op,
                stream,
                format!(
                    "Another active subscription exists for consumer `{name}` on shard `{shard}`"
                ),
            ));
        }
        let now = Instant::now();
        if let Some(&last) = fan_out.subscribed.get(&key)
            && now.saturating_duration_since(last) < RESUBSCRIBE_AFTER
        {
            return Err(in_use(
                op,
                stream,
                format!("shard `{shard}`: this consumer subscribed to it less than 5 s ago"),
            ));
        }
        fan_out.subscribed.insert(key.clone(), now);
        let number = fan_out.next_subscription;
        fan_out.next_subscription += 1;
        let entry = ActiveEntry {
            number,
            ends_at: now + fan_out.lifetime,
            generation,
        };
        fan_out.active.insert(key.clone(), entry);
        Ok(Active {
            kinesis: self.clone(),
            key,
            number,
        })
    }

    /// The sequence number of the position just before where `iterator` reads: where a
    /// subscription starting there has got to before its first record. `None` at the shard's
    /// first position ever.
    fn continuation_before(&self, stream: &str, iterator: &str) -> Option<String> {
        let token = super::token::IteratorToken::decode(iterator)?;
        let before = token.position.checked_sub(1)?;
        let mut state = self.lock();
        let number = self
            .stream_mut(&mut state, Operation::SubscribeToShard, stream)
            .ok()?
            .number;
        Some(super::sequence::encode(number, token.shard, before))
    }

    fn consumer_exists(&self, consumer_arn: &str) -> bool {
        self.lock()
            .fan_out
            .consumers
            .iter()
            .any(|c| c.arn == consumer_arn)
    }
}

/// An active subscription, as the store's state keeps it: it stops counting once its lifetime
/// is over or its connection was cut, even while its holder does not read it.
#[derive(Debug)]
pub(super) struct ActiveEntry {
    number: u64,
    ends_at: Instant,
    generation: u64,
}

/// Marks a subscription active until it is dropped: its event stream dropped (the connection
/// closed) or ended.
struct Active {
    kinesis: MemoryKinesis,
    key: (String, String),
    number: u64,
}

impl Drop for Active {
    fn drop(&mut self) {
        let mut state = self.kinesis.lock();
        if state
            .fan_out
            .active
            .get(&self.key)
            .is_some_and(|a| a.number == self.number)
        {
            state.fan_out.active.remove(&self.key);
        }
    }
}

/// One subscription's state between events.
struct Subscription {
    _active: Active,
    kinesis: MemoryKinesis,
    stream: Arc<str>,
    shard: Arc<str>,
    consumer_arn: Arc<str>,
    /// Where the next check reads; `None` once the subscription ended.
    iterator: Option<String>,
    ends_at: Instant,
    last_event: Instant,
    continuation: Option<String>,
    generation: u64,
}

impl Subscription {
    /// The next event; `None` once the subscription ended.
    async fn next_event(&mut self) -> Option<Result<ShardEvent, KinesisError>> {
        loop {
            let iterator = self.iterator.take()?;
            if !self.kinesis.consumer_exists(&self.consumer_arn) {
                let region = self.kinesis.region.to_string();
                return Some(Err(not_found(
                    Operation::SubscribeToShard,
                    &self.stream,
                    &region,
                )));
            }
            if self.kinesis.generation() != self.generation {
                return Some(Err(KinesisError::Service {
                    operation: Operation::SubscribeToShard,
                    stream: self.stream.to_string(),
                    message: format!("shard `{}`: connection reset", self.shard),
                    source: None,
                }));
            }
            if Instant::now() >= self.ends_at {
                return None;
            }
            let out = match self
                .kinesis
                .read(&self.stream, &self.shard, &iterator, EVENT_RECORDS)
            {
                Ok(out) => out,
                Err(e) => return Some(Err(e.with_operation(Operation::SubscribeToShard))),
            };
            if let Some(event) = self.event(out) {
                return Some(Ok(event));
            }
            tokio::time::sleep(CHECK_EVERY).await;
        }
    }

    /// The event a check makes, if it is time for one (records, the shard's end, or a
    /// heartbeat); notes where the next check reads.
    fn event(&mut self, out: GetRecordsOutput) -> Option<ShardEvent> {
        let GetRecordsOutput {
            records,
            next_shard_iterator,
            millis_behind_latest,
            child_shards,
        } = out;
        if let Some(last) = records.last() {
            self.continuation = Some(last.sequence_number().to_owned());
        }
        let ends = next_shard_iterator.is_none();
        let heartbeat = self.continuation.is_some() && self.last_event.elapsed() >= HEARTBEAT;
        self.iterator = next_shard_iterator;
        if records.is_empty() && !ends && !heartbeat {
            return None;
        }
        self.last_event = Instant::now();
        Some(ShardEvent {
            records,
            continuation_sequence_number: if ends {
                None
            } else {
                self.continuation.clone()
            },
            millis_behind_latest,
            child_shards,
        })
    }
}
