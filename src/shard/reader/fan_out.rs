//! The reader's enhanced fan-out mode: one step takes the next event of the shard's
//! SubscribeToShard subscription (subscribing first when there is none), and hands its records
//! on as a GetRecords answer's (see [`crate::shard`] for the rules).
//!
//! A subscription refused for now is not a failure. The service allows one active
//! subscription per consumer and shard (the previous holder's lasts until its connection
//! closes, up to five minutes when that holder is frozen), one subscription every five seconds
//! and one call a second. While SubscribeToShard is refused as in use, or throttled, the reader
//! *bridges*: it reads the shard with GetRecords from where the subscription would have
//! started, within the shard's read limit, and asks again once a second; once a subscription
//! is granted it starts after the last record handed on, so nothing is skipped or repeated
//! across the switch.

use std::time::SystemTime;

use tokio::time::Instant;

use super::hang_up::HangUp;
use super::{Reader, Step, within_timeout};
use crate::api::{ChildShard, ShardEvent, ShardEvents};
use crate::error::{KinesisError, Operation};
use crate::position::StartingPoint;
use crate::shard::consumer::register_consumer;
use crate::shard::settings::SUBSCRIPTION_IDLE_LIMIT;

/// How often a reader that bridges asks for a subscription again: the service's limit of one
/// SubscribeToShard call a second per consumer and shard.
const SUBSCRIBE_AGAIN_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a suspended reader does not subscribe (logged and counted as a refusal).
fn suspended(stream: &str) -> KinesisError {
    KinesisError::ResourceInUse {
        operation: Operation::SubscribeToShard,
        stream: stream.to_owned(),
        message: "suspended while a seek opens the shard's next reader".into(),
        source: None,
    }
}

/// While a subscription is refused for now: when to ask again, and what was read meanwhile.
#[derive(Debug, Clone, Copy)]
struct Bridge {
    ask_at: Instant,
    since: Instant,
    reads: u64,
}

/// What the fan-out mode keeps between steps.
pub(super) struct FanOut {
    /// Set while the shard is read by GetRecords because a subscription is refused for now.
    bridge: Option<Bridge>,
    consumer: String,
    /// The consumer's ARN once it is known to be ACTIVE.
    arn: Option<String>,
    /// The subscription, shared with whoever may end it from outside.
    pub(super) events: HangUp,
    /// Where the next subscription goes on (after this sequence number).
    continuation: Option<String>,
    /// The current subscription sent an event: the transport sends them on this shard, so
    /// a silence of [`SUBSCRIPTION_IDLE_LIMIT`] means a lost connection.
    heard: bool,
    last_end_probe: Option<Instant>,
    /// The wait before the next end probe: ten poll intervals, doubling while the shard stays
    /// idle, at most eighty; back to ten once records arrive.
    probe_every: Option<std::time::Duration>,
}

impl FanOut {
    pub(super) fn new(consumer: String) -> Self {
        Self {
            bridge: None,
            consumer,
            arn: None,
            events: HangUp::default(),
            continuation: None,
            heard: false,
            last_end_probe: None,
            probe_every: None,
        }
    }
}

impl Reader {
    /// The consumer's ARN, known ACTIVE: the reader does not register it.
    pub(crate) fn known_consumer(&mut self, arn: String) {
        if let Some(fan_out) = &mut self.fan_out {
            fan_out.arn = Some(arn);
        }
    }

    /// Opens with `events`, a subscription at LATEST requested at `asked`; without them (or
    /// with a reader that is not fanning out) at `asked`, with the clock allowance.
    pub(crate) fn open_subscribed(&mut self, events: Option<ShardEvents>, asked: SystemTime) {
        if self.first_iterator_at.is_some() {
            return;
        }
        self.first_iterator_at = Some(asked);
        match (&mut self.fan_out, events) {
            (Some(fan_out), Some(events)) => {
                fan_out.heard = false;
                fan_out.events.set(events);
            }
            _ => self.reopen_at = StartingPoint::since(asked),
        }
    }

    fn fan(&mut self) -> &mut FanOut {
        self.fan_out.as_mut().expect("a fan-out reader")
    }

    /// One fan-out step: `None` when there is nothing to hand on yet (step again).
    pub(super) async fn fan_out_step(&mut self) -> Option<Step> {
        if self.fan().events.is_hung_up() {
            // Handed back: the reader is dropped next, and subscribes no more meanwhile.
            return std::future::pending().await;
        }
        if !self.fan().events.is_open() {
            let ask = self.fan().bridge.is_none_or(|b| Instant::now() >= b.ask_at);
            if ask && self.fan().events.is_suspended() {
                self.refused_for_now(&suspended(&self.stream));
            } else if ask
                && let Err(step) = self.subscribe().await
                && (step.is_some() || self.fan().bridge.is_none())
            {
                return step;
            }
            if self.fan().bridge.is_some() {
                return self.bridge_step().await;
            }
        }
        let events = self.fan().events.clone();
        let Ok(next) = tokio::time::timeout(SUBSCRIPTION_IDLE_LIMIT, events.next()).await else {
            return self.silent();
        };
        match next? {
            Some(Ok(event)) => {
                self.fan().heard = true;
                self.event(event).await
            }
            Some(Err(e)) => {
                self.fan().events.clear();
                self.refused_or_failed(e).err().flatten()
            }
            None => {
                self.fan().events.clear();
                tracing::debug!("the subscription ended; subscribing again after its last event");
                None
            }
        }
    }

    /// No event came for [`SUBSCRIPTION_IDLE_LIMIT`]: the subscription is dropped and the reader
    /// subscribes again after the last event's continuation. After an event, the silence is a
    /// connection lost without an error (the service sends an event every few seconds, records
    /// or not): a failed subscription, reported and counted as a connection cut mid-stream is.
    /// With no event at all since subscribing it is replaced quietly (`None`: step again), as
    /// when the service ends a subscription: a transport may send no event on an idle shard
    /// (the in-memory one from a shard's first position until a record arrives), and a
    /// resubscription there every limit costs one call.
    fn silent(&mut self) -> Option<Step> {
        if self.fan().events.is_hung_up() {
            // Handed back meanwhile: the next step waits to be dropped.
            return None;
        }
        self.fan().events.clear();
        if !std::mem::take(&mut self.fan().heard) {
            tracing::debug!(
                limit = ?SUBSCRIPTION_IDLE_LIMIT,
                "no event since subscribing; subscribing again"
            );
            return None;
        }
        let e = KinesisError::Service {
            operation: Operation::SubscribeToShard,
            stream: self.stream.to_string(),
            message: format!(
                "shard `{}`: no event within {SUBSCRIPTION_IDLE_LIMIT:?}, the subscription's \
                 connection is taken for lost; subscribing again after its last event",
                self.shard
            ),
            source: None,
        };
        Some(self.subscription_failed(e))
    }

    /// Fixes where the reader starts (see [`Reader::try_prime`]): a LATEST start subscribes
    /// now; any other position is fixed already (a sequence number is checked with one
    /// GetShardIterator) and subscribes at the first step. A LATEST
    /// subscription refused for now (the five-second rule, after a seek) or throttled opens at
    /// the time it was asked for instead.
    pub(super) async fn prime_fan_out(&mut self) -> Result<(), KinesisError> {
        if self.fan().events.is_open() || self.fan().continuation.is_some() {
            return Ok(());
        }
        if self.reopen_at != StartingPoint::Latest {
            // Fixed already; a sequence number the shard does not have is refused here, as
            // when polling (a subscription might be refused for now by the five-second rule).
            return match &self.reopen_at {
                StartingPoint::AtSequence(_)
                | StartingPoint::AfterSequence(_)
                | StartingPoint::AfterSubSequence(..) => within_timeout(
                    Operation::GetShardIterator,
                    &self.stream,
                    self.api
                        .get_shard_iterator(&self.stream, &self.shard, &self.reopen_at),
                )
                .await
                .map(drop),
                _ => Ok(()),
            };
        }
        match self.subscribe().await {
            Ok(()) => Ok(()),
            // Refused for now (or throttled): it opens at the time it was asked for.
            Err(None) => {
                let asked = self.first_iterator_at.unwrap_or_else(SystemTime::now);
                self.reopen_at = StartingPoint::since(asked);
                Ok(())
            }
            Err(Some(Step::Failed(e) | Step::Stopped(e))) => Err(e),
            Err(Some(Step::Batch(..))) => Ok(()),
        }
    }

    /// Subscribes where the reader goes on. `Err(None)`: throttled, step again after the
    /// poll interval; `Err(Some(step))`: a failure to report.
    async fn subscribe(&mut self) -> Result<(), Option<Step>> {
        let arn = match self.fan().arn.clone() {
            Some(arn) => arn,
            None => {
                let consumer = self.fan().consumer.clone();
                match register_consumer(self.api.as_ref(), &self.stream, &consumer).await {
                    Ok(registered) => {
                        self.fan().arn = Some(registered.consumer_arn.clone());
                        registered.consumer_arn
                    }
                    Err(e) => return Err(Some(self.subscription_failed(e))),
                }
            }
        };
        let at = self.subscribe_at();
        let subscribed = within_timeout(
            Operation::SubscribeToShard,
            &self.stream,
            self.api
                .subscribe_to_shard(&self.stream, &arn, &self.shard, &at),
        )
        .await;
        match subscribed {
            Ok(events) => {
                self.fan().heard = false;
                if !self.fan().events.set(events) {
                    // Suspended meanwhile (a seek): dropped at once, read by GetRecords.
                    self.refused_for_now(&suspended(&self.stream));
                    return Err(None);
                }
                tracing::debug!(position = ?at, "subscribed");
                if let Some(bridge) = self.fan().bridge.take() {
                    tracing::info!(
                        position = ?at,
                        get_records = bridge.reads,
                        bridged_ms = bridge.since.elapsed().as_millis() as u64,
                        "subscribed: the shard is read by its subscription again"
                    );
                    self.iterator = None;
                }
                Ok(())
            }
            Err(e) => self.refused_or_failed(e),
        }
    }

    /// A subscription refused for now (in use, or throttled): the reader bridges, reading
    /// by GetRecords from where the subscription would have started, and asks again after
    /// [`SUBSCRIBE_AGAIN_AFTER`]. Logged once per refusal spell, counted each time.
    fn refused_for_now(&mut self, e: &KinesisError) {
        self.metrics.subscribe_refused();
        let ask_at = Instant::now() + SUBSCRIBE_AGAIN_AFTER;
        if let Some(bridge) = &mut self.fan().bridge {
            tracing::debug!(error = %e, "subscription still refused for now; reading by GetRecords");
            bridge.ask_at = ask_at;
            return;
        }
        let at = self.subscribe_at();
        tracing::info!(
            error = %e,
            position = ?at,
            "subscription refused for now (another subscription of this consumer may still be \
             active, e.g. the previous holder's): reading the shard by GetRecords until one is \
             granted"
        );
        self.fan().bridge = Some(Bridge {
            ask_at,
            since: Instant::now(),
            reads: 0,
        });
        self.iterator = None;
        self.reopen_at = at;
        // Read at once: the wait of a throttle or of the failure backoff does not apply.
        self.not_before = None;
    }

    /// One GetRecords while bridging; what it hands on moves where the next subscription
    /// starts.
    async fn bridge_step(&mut self) -> Option<Step> {
        let before = self.last_read.clone();
        let step = self.poll().await;
        if let Some(bridge) = &mut self.fan().bridge {
            bridge.reads += 1;
        }
        // Also when the read handed nothing on but passed over records (the user records of
        // an aggregate before the opening point): the subscription starts after them.
        if (matches!(step, Some(Step::Batch(..))) || self.last_read != before)
            && let Some(last) = self.last_read.clone()
        {
            self.fan().continuation = Some(last);
        }
        step
    }

    /// A subscription that failed, at the call or in its event stream. Refused for now
    /// (ResourceInUse: another active subscription of this consumer to the shard, the previous
    /// holder's, or one within five seconds; or throttled): the reader bridges, nothing is
    /// reported and nothing counts toward the stop rule (`Err(None)`). Any other failure is
    /// `Err(Some(step))` to report; a deleted consumer is registered again at the next try.
    fn refused_or_failed(&mut self, e: KinesisError) -> Result<(), Option<Step>> {
        if matches!(e, KinesisError::ResourceInUse { .. }) || e.is_throttle() {
            self.refused_for_now(&e);
            return Err(None);
        }
        if matches!(e, KinesisError::StreamNotFound { .. }) {
            self.fan().arn = None;
        }
        Err(Some(self.subscription_failed(e)))
    }

    /// Where a subscription starts: after the last event's continuation, else where the
    /// reader opens (a LATEST start asked again becomes the time it was first asked for).
    fn subscribe_at(&mut self) -> StartingPoint {
        if let Some(continuation) = &self.fan().continuation {
            return StartingPoint::AfterSequence(continuation.clone());
        }
        match self.first_iterator_at {
            None => self.first_iterator_at = Some(std::time::SystemTime::now()),
            Some(first) if self.reopen_at == StartingPoint::Latest => {
                self.reopen_at = StartingPoint::since(first);
            }
            Some(_) => {}
        }
        self.reopen_at.clone()
    }

    /// A failed subscription (or consumer registration): retried after the failure backoff
    /// with polling's stop rule when retrying can help, else the reader stops.
    fn subscription_failed(&mut self, e: KinesisError) -> Step {
        let retry = e.is_retryable()
            || matches!(
                e,
                KinesisError::ResourceInUse { .. } | KinesisError::StreamNotFound { .. }
            );
        if retry {
            self.failed(e)
        } else {
            tracing::error!(error = %e, "cannot subscribe to the shard");
            Step::Stopped(e)
        }
    }

    /// An event: its records, and the shard's end when it names the children (or, idle and
    /// caught up, when one GetRecords confirms it).
    async fn event(&mut self, event: ShardEvent) -> Option<Step> {
        let ends = event.ends_shard();
        let ShardEvent {
            records,
            continuation_sequence_number,
            millis_behind_latest,
            child_shards,
        } = event;
        if continuation_sequence_number.is_some() {
            self.fan().continuation = continuation_sequence_number;
        }
        if !records.is_empty() {
            self.fan().probe_every = None;
        }
        let idle = records.is_empty() && !ends && millis_behind_latest == Some(0);
        let end = if ends {
            Some(child_shards)
        } else if idle {
            self.probe_end().await
        } else {
            None
        };
        if end.is_some() {
            self.fan().events.clear();
        }
        self.hand_on(records, end)
    }

    /// Whether the shard ended, by one GetRecords right after the continuation, for services
    /// that do not send the closing event: at the first idle event, then after ten poll
    /// intervals, doubling while the shard stays idle up to eighty (100 idle shards at the
    /// default 1 s: fewer than 2 probes a second once settled).
    async fn probe_end(&mut self) -> Option<Vec<ChildShard>> {
        let poll = self.settings.poll_interval;
        let every = self.fan().probe_every.unwrap_or(poll * 10);
        if self
            .fan()
            .last_end_probe
            .is_some_and(|t| t.elapsed() < every)
        {
            return None;
        }
        if self.fan().last_end_probe.is_some() {
            self.fan().probe_every = Some((every * 2).min(poll * 80));
        }
        self.fan().last_end_probe = Some(Instant::now());
        let at = StartingPoint::AfterSequence(self.fan().continuation.clone()?);
        // A failed probe (one not answered in time too) is not reported: the reader goes back
        // to its subscription, and the next probe asks again.
        let iterator = within_timeout(
            Operation::GetShardIterator,
            &self.stream,
            self.api.get_shard_iterator(&self.stream, &self.shard, &at),
        )
        .await
        .ok()?;
        let out = within_timeout(
            Operation::GetRecords,
            &self.stream,
            self.api.get_records(&self.stream, &self.shard, iterator, 1),
        )
        .await
        .ok()?;
        (out.records.is_empty() && out.next_shard_iterator.is_none()).then_some(out.child_shards)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use futures::StreamExt;

    use crate::api::SharedKinesis;
    use crate::{MemoryKinesis, ReadSettings, ShardStream, StartingPoint};

    const SHARD: &str = "shardId-000000000000";

    fn open(api: SharedKinesis, start: StartingPoint) -> ShardStream {
        ShardStream::builder(api, "s", SHARD)
            .settings(
                ReadSettings::default()
                    .fan_out("app")
                    .deaggregate(true)
                    .poll_interval(Duration::from_millis(100)),
            )
            .open(start)
            .unwrap()
    }

    /// The next record's data, `None` when none comes within `secs`.
    async fn next_data(stream: &mut ShardStream, secs: u64) -> Option<String> {
        match tokio::time::timeout(Duration::from_secs(secs), stream.next()).await {
            Ok(Some(Ok(r))) => Some(String::from_utf8_lossy(r.data()).into_owned()),
            Ok(other) => panic!("unexpected {other:?}"),
            Err(_) => None,
        }
    }

    /// A reader that opens after the last user record of an aggregate, refused a subscription
    /// (another holder's is open), bridges by GetRecords and reads the aggregate only to pass
    /// over it. Its subscription, once granted, must start after the aggregate, not at it.
    #[tokio::test(start_paused = true)]
    async fn a_bridge_that_only_passed_over_an_aggregate_subscribes_after_it() {
        let memory = MemoryKinesis::new();
        memory.add_stream("s", 1).unwrap();
        let (_, before) = memory.put("s", "k", "zero").unwrap();
        let users = [
            ("k", None, &b"u0"[..]),
            ("k", None, b"u1"),
            ("k", None, b"u2"),
        ];
        let (_, aggregate) = memory.put("s", "k", crate::kpl::aggregate(users)).unwrap();
        let api: SharedKinesis = Arc::new(memory.clone());
        // Another holder's subscription is open.
        let mut holder = open(api.clone(), StartingPoint::AfterSequence(before));
        assert_eq!(next_data(&mut holder, 30).await.as_deref(), Some("u0"));
        let mut reader = open(api, StartingPoint::AfterSubSequence(aggregate, 2));
        assert_eq!(next_data(&mut reader, 3).await, None);
        drop(holder);
        assert_eq!(
            next_data(&mut reader, 10).await,
            None,
            "the aggregate's user records were all passed over already"
        );
        memory.put("s", "k", "after").unwrap();
        assert_eq!(next_data(&mut reader, 10).await.as_deref(), Some("after"));
    }

    /// A seek suspends an idle reader's subscription (its read task parked on the event
    /// stream) and, when the seek fails, resumes it. The parked read must be woken by both:
    /// otherwise nothing polls it again and the shard is read no more, with no error.
    #[tokio::test(start_paused = true)]
    async fn a_suspended_and_resumed_reader_reads_on() {
        let memory = MemoryKinesis::new();
        memory.add_stream("s", 1).unwrap();
        memory.put("s", "k", "a").unwrap();
        let api: SharedKinesis = Arc::new(memory.clone());
        // Reads run as a task of their own (the default), which only a wake brings back.
        let settings = ReadSettings::default()
            .fan_out("app")
            .deaggregate(true)
            .poll_interval(Duration::from_millis(100))
            .background_reads(true);
        let mut reader = ShardStream::builder(api, "s", SHARD)
            .settings(settings)
            .open(StartingPoint::TrimHorizon)
            .unwrap();
        assert_eq!(next_data(&mut reader, 30).await.as_deref(), Some("a"));
        // Caught up: the read task waits for the subscription's next event.
        let waited = tokio::time::timeout(Duration::from_millis(3_003), reader.next()).await;
        assert!(waited.is_err(), "{waited:?}");
        let hang_up = reader.hang_up().expect("a fan-out reader");
        hang_up.suspend();
        hang_up.resume();
        memory.put("s", "k", "b").unwrap();
        assert_eq!(next_data(&mut reader, 120).await.as_deref(), Some("b"));
    }
}
