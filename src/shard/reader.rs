//! The read loop of one shard: one step is "wait as the rules say, then read once".
//!
//! [`Reader::step`] takes the reader by value and gives it back with the outcome, which is
//! what lets [`ShardStream`](super::ShardStream) unfold it: the stream only starts the next
//! step once its consumer has taken everything the previous step returned.

mod fan_out;
mod hang_up;

pub(crate) use hang_up::HangUp;

use crate::telemetry::Read;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::{Instant, sleep_until};

use super::ShardEnd;
use super::settings::{READ_CALL_TIMEOUT, ReadSettings};
use crate::api::{ChildShard, GetRecordsOutput, SharedKinesis};
use crate::error::{KinesisError, Operation};
use crate::position::{SettledPosition, StartingPoint};
use crate::record::{Record, cmp_sequence};

/// Counts the successful GetRecords calls of every reader it is given to: a subscription
/// learns from it whether its instance can still read.
#[derive(Debug, Default)]
pub(crate) struct ReadProbe(std::sync::atomic::AtomicU64);

impl ReadProbe {
    fn succeeded(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many GetRecords calls succeeded so far.
    pub(crate) fn count(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// What one step of the reader produced.
pub(crate) enum Step {
    /// Records to hand on (possibly none), errors about single user records (each with the
    /// number of records handed on before it), and the shard's end when this read reached it.
    Batch(Vec<Record>, Vec<(usize, KinesisError)>, Option<ShardEnd>),
    /// A failed call; the reader retries after the failure backoff.
    Failed(KinesisError),
    /// The reader gave up; the stream ends after reporting this.
    Stopped(KinesisError),
}

pub(crate) struct Reader {
    pub(crate) api: SharedKinesis,
    pub(crate) stream: Arc<str>,
    pub(crate) shard: Arc<str>,
    pub(crate) settings: ReadSettings,
    /// Where the reader was asked to open.
    pub(crate) start: StartingPoint,
    pub(crate) settled: Option<SettledPosition>,
    /// Told of every successful GetRecords.
    pub(crate) probe: Option<Arc<ReadProbe>>,
    /// Where the first GetRecords takes its slot, when opened beside others.
    pub(crate) first_reads: Option<Arc<super::FirstReads>>,
    /// The shard's hash key range, when known (for user records put against a stale map).
    pub(crate) hash_range: Option<crate::kpl::HashRange>,
    /// Counts reads by outcome, and how far behind the tip they were.
    pub(crate) metrics: crate::telemetry::ShardMetrics,
    /// The iterator of the next GetRecords; `None` when a new one must be fetched.
    iterator: Option<String>,
    /// The last read found nothing: the reader is in the idle rhythm (a read, then
    /// `poll_interval`).
    idle: bool,
    /// Where the next GetShardIterator opens; `start` until an iterator expires.
    reopen_at: StartingPoint,
    /// When the first GetShardIterator was sent (answered or not). A LATEST start asked again
    /// (the first request failed, or its iterator expired unread) opens at this time, so the
    /// iterator obtained and every later one start there.
    first_iterator_at: Option<SystemTime>,
    /// The last record read (an aggregate read whole, with de-aggregation): the stream
    /// starts a step only once everything the previous one returned was taken, so when a
    /// step runs, every record up to this one was handed on (or passed over).
    last_read: Option<String>,
    /// Opened in the middle of an aggregate: its user records up to this sub-sequence number
    /// are dropped.
    skip_users: Option<(String, u64)>,
    failures: u32,
    expiries_in_row: u32,
    /// No call before this instant (poll interval after an empty read, failure backoff).
    not_before: Option<Instant>,
    last_get_records: Option<Instant>,
    /// Set when the shard is read with enhanced fan-out.
    fan_out: Option<fan_out::FanOut>,
}

impl Reader {
    pub(crate) fn new(
        api: SharedKinesis,
        stream: Arc<str>,
        shard: Arc<str>,
        settings: ReadSettings,
        start: StartingPoint,
        settled: Option<SettledPosition>,
    ) -> Self {
        Self {
            fan_out: settings.fan_out.clone().map(fan_out::FanOut::new),
            api,
            stream,
            shard,
            settings,
            reopen_at: start.clone(),
            skip_users: match &start {
                StartingPoint::AfterSubSequence(seq, sub) => Some((seq.clone(), *sub)),
                _ => None,
            },
            start,
            settled,
            probe: None,
            first_reads: None,
            hash_range: None,
            metrics: crate::telemetry::ShardMetrics::default(),
            iterator: None,
            first_iterator_at: None,
            last_read: None,
            failures: 0,
            expiries_in_row: 0,
            not_before: None,
            last_get_records: None,
            idle: false,
        }
    }

    /// The wait after an empty read. Entering the idle rhythm (the first empty read after
    /// opening or after records), the wait is shortened by a fraction of `poll_interval` fixed
    /// by the shard id, so the idle readers of many shards, opened together or drained
    /// together, poll at different moments of the interval instead of all at once (each call
    /// in flight at once holds a connection of its own over HTTP/1.1). No read comes later for
    /// it; one comes sooner.
    fn idle_wait(&mut self) -> Duration {
        let interval = self.settings.poll_interval;
        if std::mem::replace(&mut self.idle, true) {
            return interval;
        }
        let phase = (crate::jitter::fnv1a(&self.shard) % 1_000) as f64 / 1_000.0;
        // Within the last four fifths of the interval: at the default 1 s, never under the
        // 200 ms the read-rate cap keeps between two reads, where the phases would bunch up.
        interval.mul_f64(1.0 - 0.8 * phase)
    }

    /// The handle that ends this reader's fan-out subscription from outside; `None` when it
    /// polls.
    pub(crate) fn hang_up(&self) -> Option<HangUp> {
        self.fan_out.as_ref().map(|f| f.events.clone())
    }

    /// Opens with `iterator`, a LATEST iterator requested at `asked`, when no iterator was
    /// fetched yet. An expiry before the first read re-opens at `asked`.
    pub(crate) fn open_with(&mut self, iterator: String, asked: SystemTime) {
        if self.fan_out.is_some() {
            // A subscription cannot take an iterator: it opens at the time the iterator was
            // asked for (with the clock allowance), so nothing after it is missed.
            return self.open_subscribed(None, asked);
        }
        if self.first_iterator_at.is_none() && self.start == StartingPoint::Latest {
            self.iterator = Some(iterator);
            self.first_iterator_at = Some(asked);
        }
    }

    /// Fetches the first iterator now, fixing where the reader starts. A failure is left to
    /// the first step, which retries and reports it by the usual rules; asked again, it tries
    /// again.
    pub(crate) async fn prime(&mut self) -> bool {
        self.try_prime().await.is_ok()
    }

    /// [`prime`](Self::prime), saying why the position could not be fixed.
    pub(crate) async fn try_prime(&mut self) -> Result<(), KinesisError> {
        if self.fan_out.is_some() {
            return self.prime_fan_out().await;
        }
        if self.iterator.is_some() {
            return Ok(());
        }
        // No iterator, also after a failed attempt: fetched where the next step would fetch
        // it (a LATEST start asked again opens at the time of the first request).
        match self.fetch_iterator().await {
            Ok(iterator) => {
                self.iterator = Some(iterator);
                Ok(())
            }
            Err(Some(Step::Failed(e) | Step::Stopped(e))) => Err(e),
            Err(_) => Err(KinesisError::Throttled {
                operation: crate::error::Operation::GetShardIterator,
                stream: self.stream.to_string(),
                source: None,
            }),
        }
    }

    /// Runs one step and gives the reader back with its outcome.
    pub(crate) async fn step(mut self: Box<Self>) -> (Box<Self>, Step) {
        let step = self.step_inner().await;
        (self, step)
    }

    async fn step_inner(&mut self) -> Step {
        loop {
            if let Some(at) = self.not_before.take() {
                sleep_until(at).await;
            }
            let step = if self.fan_out.is_some() {
                self.fan_out_step().await
            } else {
                self.poll().await
            };
            if let Some(step) = step {
                return step;
            }
        }
    }

    /// One GetRecords (fetching an iterator first when there is none): `None` when there is
    /// nothing to hand on yet (step again).
    async fn poll(&mut self) -> Option<Step> {
        let iterator = match self.iterator.take() {
            Some(iterator) => iterator,
            None => match self.fetch_iterator().await {
                Ok(iterator) => iterator,
                Err(step) => return step,
            },
        };
        match (
            self.settings.min_gap(),
            self.last_get_records,
            &self.first_reads,
        ) {
            (Some(gap), Some(last), _) => sleep_until(last + gap).await,
            (_, None, Some(first_reads)) => {
                let spacing = super::first_reads::spacing(self.settings.poll_interval);
                sleep_until(first_reads.take(spacing)).await;
            }
            _ => {}
        }
        self.last_get_records = Some(Instant::now());
        let answer = within_timeout(
            Operation::GetRecords,
            &self.stream,
            self.api.get_records(
                &self.stream,
                &self.shard,
                iterator.clone(),
                self.settings.batch_size,
            ),
        )
        .await;
        match answer {
            Ok(out) => self.answered(out),
            Err(e) => self.read_failed(iterator, e),
        }
    }

    /// A GetRecords answer: the records not handed on yet, and the shard's end when it came.
    /// `None` when there is nothing to hand on (read again).
    fn answered(&mut self, out: GetRecordsOutput) -> Option<Step> {
        let ended = out.next_shard_iterator.is_none();
        let outcome = if out.records.is_empty() {
            Read::Empty
        } else {
            Read::Records
        };
        self.metrics.read(outcome, out.millis_behind_latest);
        if !out.records.is_empty() {
            self.idle = false;
        }
        if !ended && out.records.is_empty() {
            self.not_before = Some(Instant::now() + self.idle_wait());
            tracing::trace!(
                millis_behind_latest = out.millis_behind_latest,
                "empty read, waiting one poll interval"
            );
        }
        self.iterator = out.next_shard_iterator;
        self.hand_on(out.records, ended.then_some(out.child_shards))
    }

    /// Records read (by GetRecords or in a fan-out event), to hand on, and the shard's end
    /// when `ended` (with its children). `None` when there is nothing to hand on.
    fn hand_on(&mut self, records: Vec<Record>, ended: Option<Vec<ChildShard>>) -> Option<Step> {
        if let Some(probe) = &self.probe {
            probe.succeeded();
        }
        self.failures = 0;
        self.expiries_in_row = 0;
        if let Some(last) = records.last() {
            self.last_read = Some(last.sequence_number().to_owned());
        }
        let (records, errors) = if self.settings.deaggregate {
            self.unpack_all(records)
        } else {
            (records, Vec::new())
        };
        let end = ended.map(|child_shards| ShardEnd {
            shard_id: self.shard.to_string(),
            child_shards,
            last_sequence_number: self.last_read.clone(),
        });
        if records.is_empty() && errors.is_empty() && end.is_none() {
            return None;
        }
        Some(Step::Batch(records, errors, end))
    }

    /// A failed GetRecords with `iterator`: throttled (wait, same iterator), expired (a new
    /// iterator next), or a failure to report. `None` when the reader just reads again.
    fn read_failed(&mut self, iterator: String, e: KinesisError) -> Option<Step> {
        let outcome = if e.is_throttle() {
            Read::Throttled
        } else if e.is_expired_iterator() {
            Read::ExpiredIterator
        } else {
            Read::Failed
        };
        self.metrics.read(outcome, None);
        if e.is_throttle() {
            tracing::debug!("read throttled, retrying the same iterator after one poll interval");
            self.iterator = Some(iterator);
            self.not_before = Some(Instant::now() + self.settings.poll_interval);
            return None;
        }
        if e.is_expired_iterator() {
            // The iterator is dead: the next step opens a new one. A fresh iterator that
            // expires again counts as a failure, so this cannot loop forever.
            self.expiries_in_row += 1;
            self.reopen_after_expiry();
            return (self.expiries_in_row > 1).then(|| self.failed(e));
        }
        self.iterator = Some(iterator);
        Some(self.failed(e))
    }

    /// Fetches an iterator at `reopen_at`. `Err(None)` means "loop again" (throttled),
    /// `Err(Some(step))` is a step to report.
    async fn fetch_iterator(&mut self) -> Result<String, Option<Step>> {
        match self.first_iterator_at {
            None => self.first_iterator_at = Some(SystemTime::now()),
            // LATEST is asked for once: a retry after a failed first request asks for the time
            // of that request, so nothing written since is skipped.
            Some(first) if self.reopen_at == StartingPoint::Latest => {
                self.reopen_at = StartingPoint::since(first);
            }
            Some(_) => {}
        }
        let at = self.reopen_at.clone();
        match within_timeout(
            Operation::GetShardIterator,
            &self.stream,
            self.api.get_shard_iterator(&self.stream, &self.shard, &at),
        )
        .await
        {
            Ok(iterator) => {
                tracing::debug!(iterator_type = at.iterator_type(), position = ?at, "new shard iterator");
                Ok(iterator)
            }
            Err(e) if e.is_throttle() => {
                tracing::debug!("GetShardIterator throttled, retrying after one poll interval");
                self.not_before = Some(Instant::now() + self.settings.poll_interval);
                Err(None)
            }
            Err(e) if e.is_retryable() => Err(Some(self.failed(e))),
            Err(e) => {
                tracing::error!(error = %e, "cannot open the shard");
                Err(Some(Step::Stopped(e)))
            }
        }
    }

    /// Chooses where to re-open after an expired iterator: after the last record read, or
    /// after the settled record when that one is further on; with neither, where it first
    /// opened (a LATEST start becomes the time its first iterator was issued, a start inside
    /// an aggregate stays there and still skips its user records up to the opening one).
    /// Never LATEST.
    ///
    /// A step only runs once everything the previous one returned was taken, so every record
    /// up to the last one read was handed on (an aggregate, with de-aggregation, is read whole
    /// and all its user records were handed on): nothing before it is needed again. A settled
    /// position behind it (records in flight, not settled yet) would only make the reader
    /// read those records again to discard them; their redelivery, when they fail, is the
    /// business of whoever settles them.
    fn reopen_after_expiry(&mut self) {
        let settled = self.settled.as_ref().and_then(SettledPosition::get);
        let after = match (settled, &self.last_read) {
            (Some(settled), Some(last)) if cmp_sequence(&settled, last).is_le() => {
                Some(last.clone())
            }
            (Some(settled), _) => Some(settled),
            (None, last) => last.clone(),
        };
        self.reopen_at = match after {
            Some(seq) => StartingPoint::AfterSequence(seq),
            None => match &self.start {
                StartingPoint::Latest => {
                    StartingPoint::since(self.first_iterator_at.unwrap_or_else(SystemTime::now))
                }
                other => other.clone(),
            },
        };
        tracing::info!(
            reopen_at = ?self.reopen_at,
            "shard iterator expired, fetching a new one"
        );
    }

    /// Takes KPL aggregates apart (see [`super::deaggregate`]).
    fn unpack_all(&mut self, records: Vec<Record>) -> (Vec<Record>, Vec<(usize, KinesisError)>) {
        let misplaced = super::deaggregate::Misplaced {
            range: self.hash_range,
            discard: self.settings.discard_misplaced,
        };
        super::deaggregate::unpack_all(
            records,
            &mut self.skip_users,
            misplaced,
            &self.stream,
            &self.shard,
        )
    }

    fn failed(&mut self, e: KinesisError) -> Step {
        self.failures += 1;
        if self.failures >= self.settings.max_failures {
            tracing::error!(failures = self.failures, error = %e, "reader stopped");
            return Step::Stopped(KinesisError::ReaderStopped {
                stream: self.stream.to_string(),
                shard: self.shard.to_string(),
                failures: self.failures,
                last: Box::new(e),
            });
        }
        tracing::warn!(failures = self.failures, error = %e, "read failed, retrying");
        self.not_before = Some(Instant::now() + self.settings.failure_backoff);
        Step::Failed(e)
    }
}

/// `call`'s answer, or a retryable failure ([`KinesisError::Service`] naming `operation`) once
/// [`READ_CALL_TIMEOUT`] passed without one. Every call a reader makes goes through it, so no
/// call that never answers holds the shard unread.
pub(super) async fn within_timeout<T>(
    operation: Operation,
    stream: &str,
    call: impl Future<Output = Result<T, KinesisError>>,
) -> Result<T, KinesisError> {
    tokio::time::timeout(READ_CALL_TIMEOUT, call)
        .await
        .unwrap_or_else(|_| {
            Err(KinesisError::Service {
                operation,
                stream: stream.to_owned(),
                message: format!("no answer within {READ_CALL_TIMEOUT:?}"),
                source: None,
            })
        })
}
