//! Deterministic fault injection and the call log: the test hooks of the `test-util` feature.
//!
//! A [`Fault`] names an operation, optionally a shard, what goes wrong ([`FaultKind`]) and how
//! many calls it hits. Every call of the [`KinesisApi`](crate::api::KinesisApi) and
//! [`KinesisAdmin`](crate::api::KinesisAdmin) traits consumes
//! at most one matching fault, the earliest injected one, so a test scripts exactly which call
//! fails and how. Every call, failed or not, is also written to the call log as a [`Call`].

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use crate::api::PutRecordResult;
use crate::error::{KinesisError, Operation};
use crate::position::StartingPoint;

/// How many calls [`MemoryKinesis::calls`](super::MemoryKinesis::calls) keeps: the oldest are
/// dropped past this (the counts of
/// [`MemoryKinesis::call_count`](super::MemoryKinesis::call_count) stay exact).
///
/// Only with the `test-util` feature.
pub const CALL_LOG_CAPACITY: usize = 100_000;

/// What an injected fault does to the call it hits.
///
/// Only with the `test-util` feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// The call is throttled: [`KinesisError::Throttled`]. On PutRecords with a shard set
    /// ([`Fault::on_shard`]), only the entries routed to that shard fail, each with
    /// `ProvisionedThroughputExceededException`, as the service does; the others are stored.
    Throttle,
    /// The call fails with [`KinesisError::Service`] carrying this message. On PutRecords with
    /// a shard set, only the entries routed to that shard fail, each with `InternalFailure`.
    Fail(String),
    /// The call fails with [`KinesisError::ExpiredIterator`] (meant for GetRecords).
    ExpireIterator,
    /// The answer is delayed by this long (a `tokio::time::sleep`), then given normally.
    Latency(Duration),
}

/// One injected fault: which calls it hits, what it does, and how many times
/// (see [`MemoryKinesis::inject`](super::MemoryKinesis::inject)).
///
/// Only with the `test-util` feature.
///
/// ```
/// use kinesis_dataflow::api::memory::{Fault, FaultKind};
/// use kinesis_dataflow::error::Operation;
///
/// // The next three GetRecords calls on shard 0 are throttled.
/// let fault = Fault::throttle(Operation::GetRecords)
///     .times(3)
///     .on_shard("shardId-000000000000");
/// assert_eq!(fault.kind, FaultKind::Throttle);
/// assert_eq!(fault.times, 3);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// The operation it hits.
    pub operation: Operation,
    /// The shard it hits; `None` hits every call of the operation. A call names its shard
    /// (GetShardIterator, GetRecords, SplitShard), both shards (MergeShards) or the shards its
    /// entries route to (PutRecords); a fault with a shard never hits ListShards, CreateStream
    /// or DescribeStreamSummary.
    pub shard: Option<String>,
    /// What it does.
    pub kind: FaultKind,
    /// How many calls it hits before it is used up (0: none).
    pub times: u32,
}

impl Fault {
    /// A fault of `kind` on the next call of `operation` (once, on any shard).
    #[must_use]
    pub fn new(operation: Operation, kind: FaultKind) -> Self {
        Self {
            operation,
            shard: None,
            kind,
            times: 1,
        }
    }

    /// Throttles the next call of `operation` ([`FaultKind::Throttle`]).
    #[must_use]
    pub fn throttle(operation: Operation) -> Self {
        Self::new(operation, FaultKind::Throttle)
    }

    /// Fails the next call of `operation` with a service error ([`FaultKind::Fail`]).
    #[must_use]
    pub fn fail(operation: Operation, message: impl Into<String>) -> Self {
        Self::new(operation, FaultKind::Fail(message.into()))
    }

    /// Expires the iterator of the next GetRecords call ([`FaultKind::ExpireIterator`]).
    #[must_use]
    pub fn expire_iterator() -> Self {
        Self::new(Operation::GetRecords, FaultKind::ExpireIterator)
    }

    /// Delays the next answer of `operation` by `delay` ([`FaultKind::Latency`]).
    #[must_use]
    pub fn latency(operation: Operation, delay: Duration) -> Self {
        Self::new(operation, FaultKind::Latency(delay))
    }

    /// Hits `times` calls instead of one (`u32::MAX` is as good as forever).
    #[must_use]
    pub fn times(mut self, times: u32) -> Self {
        self.times = times;
        self
    }

    /// Hits only calls on `shard`.
    #[must_use]
    pub fn on_shard(mut self, shard: impl Into<String>) -> Self {
        self.shard = Some(shard.into());
        self
    }

    /// Whether the fault hits a call of `operation` touching `shards`.
    fn matches(&self, operation: Operation, shards: &[&str]) -> bool {
        self.times > 0
            && self.operation == operation
            && self
                .shard
                .as_deref()
                .is_none_or(|wanted| shards.contains(&wanted))
    }

    /// The error the fault turns a whole call into, or `None` for latency (answer normally).
    pub(crate) fn error(&self, stream: &str) -> Option<KinesisError> {
        let operation = self.operation;
        let stream = stream.to_owned();
        match &self.kind {
            FaultKind::Throttle => Some(KinesisError::Throttled {
                operation,
                stream,
                source: None,
            }),
            FaultKind::Fail(message) => Some(KinesisError::Service {
                operation,
                stream,
                message: message.clone(),
                source: None,
            }),
            FaultKind::ExpireIterator => Some(KinesisError::ExpiredIterator {
                operation,
                stream,
                source: None,
            }),
            FaultKind::Latency(_) => None,
        }
    }

    /// The extra delay of a latency fault.
    pub(crate) fn delay(&self) -> Duration {
        match self.kind {
            FaultKind::Latency(delay) => delay,
            _ => Duration::ZERO,
        }
    }

    /// The result of a PutRecords entry routed to `shard` of `stream` when this per-entry
    /// fault fails it (entries routed elsewhere are stored: `None`).
    pub(crate) fn entry_failure(&self, stream: &str, shard: &str) -> Option<PutRecordResult> {
        if self.shard.as_deref() != Some(shard) {
            return None;
        }
        Some(match &self.kind {
            FaultKind::Fail(message) => PutRecordResult::Failed {
                code: "InternalFailure".to_owned(),
                message: message.clone(),
            },
            _ => PutRecordResult::Failed {
                code: "ProvisionedThroughputExceededException".to_owned(),
                message: format!("Rate exceeded for shard {shard} in stream {stream}."),
            },
        })
    }

    /// Whether the fault fails single PutRecords entries instead of the whole call.
    pub(crate) fn is_per_entry(&self) -> bool {
        self.operation == Operation::PutRecords
            && self.shard.is_some()
            && matches!(self.kind, FaultKind::Throttle | FaultKind::Fail(_))
    }
}

/// The injected faults, in injection order.
#[derive(Debug, Default)]
pub(crate) struct FaultQueue {
    faults: VecDeque<Fault>,
}

impl FaultQueue {
    /// Adds a fault behind the others (a fault that hits no call is dropped).
    pub(crate) fn push(&mut self, fault: Fault) {
        if fault.times > 0 {
            self.faults.push_back(fault);
        }
    }

    /// Consumes one hit of the earliest fault matching the call, and returns it.
    pub(crate) fn take(&mut self, operation: Operation, shards: &[&str]) -> Option<Fault> {
        let index = self
            .faults
            .iter()
            .position(|f| f.matches(operation, shards))?;
        let fault = &mut self.faults[index];
        fault.times -= 1;
        let hit = Fault {
            times: 1,
            ..fault.clone()
        };
        if fault.times == 0 {
            self.faults.remove(index);
        }
        Some(hit)
    }

    /// The faults not used up yet.
    pub(crate) fn pending(&self) -> Vec<Fault> {
        self.faults.iter().cloned().collect()
    }

    /// Drops every fault.
    pub(crate) fn clear(&mut self) {
        self.faults.clear();
    }
}

/// One call made through the [`KinesisApi`](crate::api::KinesisApi) or
/// [`KinesisAdmin`](crate::api::KinesisAdmin) traits, as the call log keeps it (see
/// [`MemoryKinesis::calls`](super::MemoryKinesis::calls)).
///
/// Only with the `test-util` feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The operation.
    pub operation: Operation,
    /// The stream it named.
    pub stream: String,
    /// The shard it named (the first one for MergeShards; `None` for calls without one).
    pub shard: Option<String>,
    /// The starting point of a GetShardIterator call.
    pub starting_point: Option<StartingPoint>,
    /// The limit of a GetRecords call.
    pub limit: Option<u32>,
    /// The shard iterator of a GetRecords call (to check which iterator a retry used).
    pub iterator: Option<String>,
    /// When it was made (by the tokio clock, so paused-time tests can check pacing).
    pub at: Instant,
}

/// The bounded call log with exact per-operation counts.
#[derive(Debug, Default)]
pub(crate) struct CallLog {
    calls: VecDeque<Call>,
    counts: HashMap<Operation, usize>,
}

impl CallLog {
    /// Records a call, dropping the oldest past [`CALL_LOG_CAPACITY`].
    pub(crate) fn record(&mut self, call: Call) {
        *self.counts.entry(call.operation).or_default() += 1;
        if self.calls.len() == CALL_LOG_CAPACITY {
            self.calls.pop_front();
        }
        self.calls.push_back(call);
    }

    /// The kept calls, oldest first.
    pub(crate) fn calls(&self) -> Vec<Call> {
        self.calls.iter().cloned().collect()
    }

    /// How many calls of `operation` were made since the last clear.
    pub(crate) fn count(&self, operation: Operation) -> usize {
        self.counts.get(&operation).copied().unwrap_or(0)
    }

    /// Forgets every call.
    pub(crate) fn clear(&mut self) {
        self.calls.clear();
        self.counts.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_consumed_in_injection_order() {
        let mut queue = FaultQueue::default();
        queue.push(Fault::throttle(Operation::GetRecords).times(2));
        queue.push(Fault::fail(Operation::GetRecords, "boom"));
        queue.push(Fault::throttle(Operation::ListShards).times(0));
        assert_eq!(
            queue.pending().len(),
            2,
            "a fault hitting no call is dropped"
        );

        let kinds: Vec<FaultKind> = (0..4)
            .filter_map(|_| queue.take(Operation::GetRecords, &["shardId-000000000000"]))
            .map(|f| f.kind)
            .collect();
        assert_eq!(
            kinds,
            vec![
                FaultKind::Throttle,
                FaultKind::Throttle,
                FaultKind::Fail("boom".into())
            ]
        );
        assert!(queue.pending().is_empty());
    }

    #[test]
    fn shard_faults_hit_only_their_shard() {
        let mut queue = FaultQueue::default();
        queue.push(Fault::throttle(Operation::GetRecords).on_shard("shardId-000000000001"));
        assert!(queue.take(Operation::GetRecords, &[]).is_none());
        assert!(
            queue
                .take(Operation::GetRecords, &["shardId-000000000000"])
                .is_none()
        );
        assert!(
            queue
                .take(Operation::GetShardIterator, &["shardId-000000000001"])
                .is_none()
        );
        assert!(
            queue
                .take(Operation::GetRecords, &["shardId-000000000001"])
                .is_some()
        );
        assert!(queue.pending().is_empty());
    }

    #[test]
    fn the_log_is_bounded_but_counts_stay_exact() {
        let mut log = CallLog::default();
        let at = Instant::now();
        for _ in 0..CALL_LOG_CAPACITY + 5 {
            log.record(Call {
                operation: Operation::GetRecords,
                stream: "s".into(),
                shard: None,
                starting_point: None,
                limit: Some(1),
                iterator: None,
                at,
            });
        }
        assert_eq!(log.calls().len(), CALL_LOG_CAPACITY);
        assert_eq!(log.count(Operation::GetRecords), CALL_LOG_CAPACITY + 5);
        assert_eq!(log.count(Operation::ListShards), 0);
        log.clear();
        assert_eq!(log.count(Operation::GetRecords), 0);
        assert!(log.calls().is_empty());
    }
}
