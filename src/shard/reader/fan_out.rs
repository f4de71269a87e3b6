//! The reader's enhanced fan-out mode: one step takes the next event of the shard's
//! SubscribeToShard subscription (subscribing first when there is none), and hands its records
//! on as a GetRecords answer's (see [`crate::shard`] for the rules).

use std::time::SystemTime;

use futures::StreamExt;
use tokio::time::Instant;

use super::{Reader, Step};
use crate::api::{ChildShard, ShardEvent, ShardEvents};
use crate::error::KinesisError;
use crate::position::StartingPoint;
use crate::shard::consumer::register_consumer;

/// What the fan-out mode keeps between steps.
pub(super) struct FanOut {
    consumer: String,
    /// The consumer's ARN once it is known to be ACTIVE.
    arn: Option<String>,
    events: Option<ShardEvents>,
    /// Where the next subscription goes on (after this sequence number).
    continuation: Option<String>,
    last_end_probe: Option<Instant>,
    /// The wait before the next end probe: ten poll intervals, doubling while the shard stays
    /// idle, at most eighty; back to ten once records arrive.
    probe_every: Option<std::time::Duration>,
}

impl FanOut {
    pub(super) fn new(consumer: String) -> Self {
        Self {
            consumer,
            arn: None,
            events: None,
            continuation: None,
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
            (Some(fan_out), Some(events)) => fan_out.events = Some(events),
            _ => self.reopen_at = StartingPoint::since(asked),
        }
    }

    fn fan(&mut self) -> &mut FanOut {
        self.fan_out.as_mut().expect("a fan-out reader")
    }

    /// One fan-out step: `None` when there is nothing to hand on yet (step again).
    pub(super) async fn fan_out_step(&mut self) -> Option<Step> {
        if self.fan().events.is_none()
            && let Err(step) = self.subscribe().await
        {
            return step;
        }
        let next = self.fan().events.as_mut()?.next().await;
        match next {
            Some(Ok(event)) => self.event(event).await,
            Some(Err(e)) => {
                self.fan().events = None;
                self.refused_or_failed(e).err().flatten()
            }
            None => {
                self.fan().events = None;
                tracing::debug!("the subscription ended; subscribing again after its last event");
                None
            }
        }
    }

    /// Fixes where the reader starts (see [`Reader::try_prime`]): a LATEST start subscribes
    /// now; any other position is fixed already (a sequence number is checked with one
    /// GetShardIterator) and subscribes at the first step. A LATEST
    /// subscription refused for now (the five-second rule, after a seek) or throttled opens at
    /// the time it was asked for instead.
    pub(super) async fn prime_fan_out(&mut self) -> Result<(), KinesisError> {
        if self.fan().events.is_some() || self.fan().continuation.is_some() {
            return Ok(());
        }
        if self.reopen_at != StartingPoint::Latest {
            // Fixed already; a sequence number the shard does not have is refused here, as
            // when polling (a subscription might be refused for now by the five-second rule).
            return match &self.reopen_at {
                StartingPoint::AtSequence(_)
                | StartingPoint::AfterSequence(_)
                | StartingPoint::AfterSubSequence(..) => self
                    .api
                    .get_shard_iterator(&self.stream, &self.shard, &self.reopen_at)
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
        let subscribed = self
            .api
            .subscribe_to_shard(&self.stream, &arn, &self.shard, &at)
            .await;
        match subscribed {
            Ok(events) => {
                tracing::debug!(position = ?at, "subscribed");
                self.fan().events = Some(events);
                Ok(())
            }
            Err(e) if e.is_throttle() => {
                tracing::debug!("SubscribeToShard throttled, retrying after one poll interval");
                self.not_before = Some(Instant::now() + self.settings.poll_interval);
                Err(None)
            }
            Err(e) => self.refused_or_failed(e),
        }
    }

    /// A subscription that failed, at the call or in its event stream. Refused for now
    /// (ResourceInUse: another subscription of this consumer to the shard, the previous
    /// owner's, or this reader's own within five seconds): waited out like a throttle, not
    /// reported (`Err(None)`), but counted, so a conflict that lasts stops the reader. Any
    /// other failure is `Err(Some(step))` to report; a deleted consumer is registered again
    /// at the next try.
    fn refused_or_failed(&mut self, e: KinesisError) -> Result<(), Option<Step>> {
        if matches!(e, KinesisError::ResourceInUse { .. }) {
            tracing::debug!(error = %e, "subscription refused for now, retrying after the failure backoff");
            return match self.failed(e) {
                Step::Failed(_) => Err(None),
                stopped => Err(Some(stopped)),
            };
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
            self.fan().events = None;
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
        let iterator = self
            .api
            .get_shard_iterator(&self.stream, &self.shard, &at)
            .await
            .ok()?;
        let out = self
            .api
            .get_records(&self.stream, &self.shard, iterator, 1)
            .await
            .ok()?;
        (out.records.is_empty() && out.next_shard_iterator.is_none()).then_some(out.child_shards)
    }
}
