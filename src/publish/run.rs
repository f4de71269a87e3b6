//! One publish in progress ([`Run`]): rounds of PutRecords calls over the records not stored
//! yet, with backoff, until every record is stored or a failure retrying cannot fix stops it.

use super::*;
use crate::api::{PutRecordsEntry, PutRecordsOutput};
use crate::error::Operation;
use crate::jitter::{Jitter, fnv1a};

/// What one call's answer did to its records.
#[derive(Default)]
struct Tally {
    /// How many failed.
    failed: usize,
    /// The first failure retrying cannot fix, if any.
    fatal: Option<EntryError>,
    /// The first record stored ahead of an earlier record of its key that failed.
    overtaker: Option<usize>,
    /// How many such records.
    overtakers: usize,
}

/// A failure retrying cannot fix, which stops a publish.
enum Stop {
    /// A whole call failed with this error.
    Call(KinesisError),
    /// An entry failed with one of the [`FATAL_ENTRY_CODES`].
    Entry(EntryError),
}

/// One publish in progress.
pub(super) struct Run<'p> {
    publisher: &'p Publisher,
    records: Vec<OutgoingRecord>,
    plan: Plan,
    published: Vec<Option<Published>>,
    last_error: Vec<Option<EntryError>>,
    /// Per record: a call that carried it failed as a whole (no answer, a dropped
    /// connection, a server error, throttled), or an answer held no result for it, so it may
    /// have been stored.
    maybe_stored: Vec<bool>,
    last: Option<EntryError>,
    started: Instant,
    calls: u64,
    /// The answer of the first call, already made (a single `publish`'s fast path).
    pub(super) answered: Option<Result<crate::api::PutRecordsOutput, KinesisError>>,
    /// Whether a failure of the current round was anything but an entry over its shard's
    /// write limit (`ProvisionedThroughputExceededException`).
    round_failed_otherwise: bool,
}

impl<'p> Run<'p> {
    pub(super) fn new(publisher: &'p Publisher, records: Vec<OutgoingRecord>, plan: Plan) -> Self {
        let n = records.len();
        Self {
            publisher,
            records,
            plan,
            published: vec![None; n],
            last_error: vec![None; n],
            maybe_stored: vec![false; n],
            last: None,
            started: Instant::now(),
            calls: 0,
            answered: None,
            round_failed_otherwise: false,
        }
    }

    fn stream(&self) -> &str {
        &self.publisher.stream
    }

    pub(super) async fn run_to_the_end(mut self) -> Result<Vec<Published>, KinesisError> {
        let policy = self.publisher.retry;
        let mut jitter: Option<Jitter> = None;
        let mut round = 0u32;
        // Rounds that count against `max_attempts`: all but those turned away only by the
        // shards' write limits, which wait for the limit's time instead (`patience`).
        let mut attempts = 0u32;
        // Counted rounds in a row that stored nothing: the backoff doubles with these only.
        let mut stalled = 0u32;
        loop {
            round += 1;
            let before = self.plan.unstored();
            self.round_failed_otherwise = false;
            let failed = match self.round(round).await {
                Ok(failed) => failed,
                Err(Stop::Call(error))
                    if self.plan.unstored() == self.published.len()
                        && !self.maybe_stored.contains(&true) =>
                {
                    // Nothing was written, and nothing may have been (no call failed as a whole,
                    // no entry went without a result): the call's own error says it best.
                    return Err(error);
                }
                Err(Stop::Call(error)) => {
                    self.last = Some(EntryError {
                        code: error_kind(&error).to_owned(),
                        message: error.to_string(),
                    });
                    return Err(self.give_up(round, true));
                }
                Err(Stop::Entry(cause)) => {
                    self.last = Some(cause);
                    return Err(self.give_up(round, true));
                }
            };
            let left = self.plan.unstored();
            if left == 0 {
                return Ok(self.published.into_iter().flatten().collect());
            }
            let rate_limited = !self.round_failed_otherwise;
            if rate_limited {
                // Only write limits turned records away: the shard takes more within the
                // second, so retry after the first backoff, for as long as the counted rounds
                // would have waited in all.
                stalled = 0;
                if self.started.elapsed() >= policy.patience() {
                    return Err(self.give_up(round, false));
                }
            } else {
                attempts += 1;
                if attempts >= policy.max_attempts {
                    return Err(self.give_up(round, false));
                }
                stalled = if left < before { 0 } else { stalled + 1 };
            }
            // Seeded from the stream name and the tokio clock: nanosecond noise spreads real
            // producers apart, while paused test time gives the same waits every run.
            let jitter = jitter.get_or_insert_with(|| {
                let elapsed = self.started.elapsed().as_nanos();
                Jitter::new(fnv1a(self.stream()) ^ (elapsed as u64)) // truncation is fine here
            });
            let wait = policy.backoff(stalled.max(1), jitter);
            self.say_retrying(round, before - left, failed, left, wait);
            tokio::time::sleep(wait).await;
        }
    }

    /// Says, before waiting `wait`, that `left` records are not written yet after `round`.
    fn say_retrying(&self, round: u32, stored: usize, failed: usize, left: usize, wait: Duration) {
        let last = self.last.clone().unwrap_or_else(|| EntryError {
            code: "Unknown".into(),
            message: String::new(),
        });
        tracing::warn!(
            stream = self.stream(),
            round,
            max_attempts = self.publisher.retry.max_attempts,
            stored,
            failed,
            held_back = left.saturating_sub(failed),
            left,
            written = self.published.len() - left,
            total = self.published.len(),
            last_code = %last.code,
            last_message = %last.message,
            retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
            "PutRecords: {left} records not written yet ({failed} failed, {} held back \
             behind them); retrying",
            left.saturating_sub(failed),
        );
    }

    /// Sends one round; returns how many records failed in it.
    async fn round(&mut self, round: u32) -> Result<usize, Stop> {
        self.plan.start_round();
        let mut failed = 0;
        while let Some(call) = self.plan.next_call() {
            failed += self.call(round, &call).await?;
        }
        Ok(failed)
    }

    /// Makes one PutRecords call with the records at `call`; returns how many failed.
    async fn call(&mut self, round: u32, call: &[usize]) -> Result<usize, Stop> {
        self.calls += 1;
        let bytes: usize = call.iter().map(|&i| self.records[i].size()).sum();
        let answer = match self.answered.take() {
            Some(answer) => {
                self.publisher.metrics.call(call.len());
                answer
            }
            None => {
                let entries = call
                    .iter()
                    .map(|&i| check::entry(&self.records[i]))
                    .collect();
                // Its own call, or one shared with other publishes' (collection).
                self.publisher.put(entries, bytes).await
            }
        };
        let out = match answer {
            Ok(out) => out,
            Err(error) => return self.call_failed(round, call, bytes, error),
        };
        let tally = self.apply(call, out.results);
        self.publisher.metrics.stored(call.len() - tally.failed);
        tracing::debug!(
            stream = self.stream(),
            round,
            call = self.calls,
            records = call.len(),
            bytes,
            stored = call.len() - tally.failed,
            failed = tally.failed,
            "PutRecords"
        );
        if let Some(index) = tally.overtaker {
            self.warn_overtaken(index, tally.overtakers);
        }
        match tally.fatal {
            Some(cause) => Err(Stop::Entry(cause)),
            None => Ok(tally.failed),
        }
    }

    /// A whole call failed: retried when retrying can help (every record of it failed),
    /// else the publish stops.
    fn call_failed(
        &mut self,
        round: u32,
        call: &[usize],
        bytes: usize,
        error: KinesisError,
    ) -> Result<usize, Stop> {
        let cause = EntryError {
            code: error_kind(&error).to_owned(),
            message: error.to_string(),
        };
        tracing::debug!(
            stream = self.stream(),
            round,
            call = self.calls,
            records = call.len(),
            bytes,
            retryable = error.is_retryable(),
            %error,
            "PutRecords call failed"
        );
        self.round_failed_otherwise = true;
        if !error.is_retryable() {
            // The collecting publisher stopped before it answered (a panic in the task that
            // carried the call, or its runtime shutting down): the call may have been made,
            // and the publish cannot tell. Its records are handed back as possibly stored.
            let maybe_sent = matches!(error, KinesisError::PublisherStopped { .. });
            for &i in call {
                self.last_error[i] = Some(cause.clone());
                self.maybe_stored[i] |= maybe_sent;
            }
            return Err(Stop::Call(error));
        }
        // No answer in time, a dropped connection, a server error: the records may be
        // stored. Even a whole call throttled counts, since the transport's own attempts
        // inside the call (the SDK's retries) may have met one of those first.
        for &i in call {
            self.maybe_stored[i] = true;
            self.fail(i, cause.clone());
        }
        Ok(call.len())
    }

    /// Records the answer's result for each record of `call`, in order.
    fn apply(&mut self, call: &[usize], results: Vec<PutRecordResult>) -> Tally {
        let mut results = results.into_iter();
        let mut tally = Tally::default();
        // Keys with a failed entry earlier in this call, to spot the service storing a later
        // entry of such a key ahead of it.
        let mut failed_keys: HashSet<usize> = HashSet::new();
        for &i in call {
            let key = self.plan.key_of(i);
            match results.next() {
                Some(PutRecordResult::Stored {
                    shard_id,
                    sequence_number,
                }) => {
                    if failed_keys.contains(&key) {
                        tally.overtakers += 1;
                        tally.overtaker.get_or_insert(i);
                    }
                    self.published[i] = Some(Published {
                        shard_id,
                        sequence_number,
                        sub_sequence_number: None,
                    });
                    self.last_error[i] = None;
                    self.plan.stored(i);
                }
                other => {
                    let cause = match other {
                        Some(PutRecordResult::Failed { code, message }) => {
                            EntryError { code, message }
                        }
                        _ => {
                            // No result says what became of the entry: it may be stored.
                            self.maybe_stored[i] = true;
                            EntryError {
                                code: "MissingResult".into(),
                                message: "the PutRecords answer had fewer results than entries"
                                    .into(),
                            }
                        }
                    };
                    tally.failed += 1;
                    failed_keys.insert(key);
                    if cause.code != THROUGHPUT_EXCEEDED {
                        self.round_failed_otherwise = true;
                    }
                    if FATAL_ENTRY_CODES.contains(&cause.code.as_str()) {
                        tally.fatal.get_or_insert_with(|| cause.clone());
                    }
                    self.fail(i, cause);
                }
            }
        }
        tally
    }

    /// Says that the service stored records of a key ahead of an earlier record of that key
    /// that failed in the same call.
    fn warn_overtaken(&self, index: usize, overtakers: usize) {
        tracing::warn!(
            stream = self.stream(),
            partition_key = %self.records[index].partition_key,
            record = index,
            records = overtakers,
            "PutRecords stored {overtakers} records ahead of an earlier record of the same \
             partition key that failed in the same call; the failed one is resent and lands \
             after them (use KeyOrder::Strict to rule this out)"
        );
    }

    /// Notes that record `index` failed with `cause`.
    fn fail(&mut self, index: usize, cause: EntryError) {
        let throttled = matches!(
            cause.code.as_str(),
            THROUGHPUT_EXCEEDED | "ThrottlingException" | "Throttled"
        );
        self.publisher.metrics.turned_away(throttled);
        self.plan.failed(index);
        self.last_error[index] = Some(cause.clone());
        self.last = Some(cause);
    }

    /// The [`PublishFailure`] for the records not written.
    fn give_up(self, attempts: u32, stopped_early: bool) -> KinesisError {
        let last = self.last.unwrap_or_else(|| EntryError {
            code: "Unknown".into(),
            message: "no error was recorded".into(),
        });
        let mut first_of_key = FirstOfKey::new();
        let mut failed = Vec::new();
        let unwritten = self.published.iter().filter(|p| p.is_none()).count();
        self.publisher.metrics.failed(unwritten);
        let records = self.records.into_iter().zip(self.last_error);
        for (index, ((record, last_error), maybe_stored)) in
            records.zip(self.maybe_stored).enumerate()
        {
            if self.published[index].is_some() {
                continue;
            }
            let behind = first_of_key.behind(self.plan.key_of(index), index);
            failed.push(FailedRecord {
                index,
                record,
                last_error,
                behind,
                maybe_stored,
            });
        }
        let failure = PublishFailure {
            stream: self.publisher.stream.to_string(),
            attempts,
            published: self.published,
            failed,
            last_code: last.code,
            last_message: last.message,
            stopped_early,
        };
        tracing::warn!(
            stream = %failure.stream,
            attempts,
            written = failure.written(),
            failed = failure.failed.len(),
            last_code = %failure.last_code,
            "publish failed"
        );
        KinesisError::PublishFailed(Box::new(failure))
    }
}

/// The code a whole failed call gives its entries: the kind of error.
pub(super) fn error_kind(error: &KinesisError) -> &'static str {
    match error {
        KinesisError::Throttled { .. } => "Throttled",
        KinesisError::Service { .. } => "ServiceError",
        KinesisError::StreamNotFound { .. } => "StreamNotFound",
        KinesisError::AccessDenied { .. } => "AccessDenied",
        KinesisError::InvalidArgument { .. } => "InvalidArgument",
        KinesisError::PublisherStopped { .. } => "PublisherStopped",
        _ => "Error",
    }
}

/// One PutRecords call, or a retryable failure of unknown outcome once [`PUT_CALL_TIMEOUT`]
/// passed without an answer.
pub(super) async fn put_within(
    api: &SharedKinesis,
    stream: &str,
    entries: Vec<PutRecordsEntry>,
) -> Result<PutRecordsOutput, KinesisError> {
    tokio::time::timeout(PUT_CALL_TIMEOUT, api.put_records(stream, entries))
        .await
        .unwrap_or_else(|_| {
            Err(KinesisError::Service {
                operation: Operation::PutRecords,
                stream: stream.to_owned(),
                message: format!(
                    "no answer within {PUT_CALL_TIMEOUT:?}: whether the records were stored \
                     is unknown; they are sent again"
                ),
                source: None,
            })
        })
}
