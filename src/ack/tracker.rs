//! Per-shard bookkeeping of delivered and settled records.
//!
//! Records are registered in shard order as they are handed out and settled in any order.
//! The checkpoint candidate is the last record of the contiguous settled prefix, so it never
//! passes a record that is still in flight.

use crate::telemetry::{AckCounts, ShardMetrics};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;

use tokio::sync::Notify;
use tokio::time::{Duration, Instant};

use crate::position::{Checkpoint, SettledPosition};
use crate::record::Record;

use super::durability::Durability;

/// How a delivery was settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Settlement {
    /// Processed: the checkpoint may pass it.
    Acked,
    /// Deliberately not processed (filtered out, undecodable, aggregated): the checkpoint may
    /// pass it.
    Skipped,
    /// Dropped without being settled, in the ordinary course of a running subscription (a
    /// `filter`). Counted and logged; the checkpoint may pass it.
    Dropped,
    /// Dropped when it cannot have been processed: while its thread was panicking, or after
    /// its subscription stopped reading the shard. The checkpoint never passes it, so the
    /// next reader of the shard (another instance, or a restart) delivers it again.
    Abandoned,
    /// Given up on after its attempts (or sent there explicitly) and written to the dead-letter
    /// destination: the checkpoint passes it.
    DeadLettered,
}

/// A subscription's rules for deliveries dropped without being settled, shared by the
/// ledgers of every shard it reads.
#[derive(Debug, Clone, Default)]
pub(crate) struct AckPolicy {
    /// A delivery dropped unsettled in the ordinary course is sent back for redelivery
    /// instead of being passed.
    pub(crate) redeliver_dropped: bool,
    /// Set, synchronously, once the subscription is asked to stop or is dropped: a delivery
    /// dropped from then on is abandoned.
    pub(crate) stopping: Arc<AtomicBool>,
    /// Deliveries a record gets before it is dead-lettered instead of delivered again.
    pub(crate) max_attempts: Option<u32>,
    /// Where dead letters go.
    pub(crate) dead_letters: Option<Arc<dyn super::dead_letter::DeadLetters>>,
    /// The reader pauses while this many bytes of the shard's records are unsettled.
    pub(crate) max_in_flight_bytes: Option<usize>,
    /// A delivery not settled this long after it was handed out is taken back and sent
    /// back as a failed attempt; what the timed-out delivery does later is ignored.
    pub(crate) settle_within: Option<Duration>,
}

/// A record's sequence number as the ledger keeps it: through the record itself (one
/// reference count, no copy: what every delivery registers), or on its own (a checkpoint the
/// ledger starts from, a record reported as an error).
#[derive(Debug, Clone)]
enum Seq {
    Record(Record),
    Text(Box<str>),
}

impl Seq {
    fn new(seq: &str) -> Self {
        Self::Text(seq.into())
    }

    fn as_str(&self) -> &str {
        match self {
            Self::Record(record) => record.sequence_number(),
            Self::Text(seq) => seq,
        }
    }
}

#[derive(Debug)]
struct Slot {
    sequence_number: Seq,
    settled: bool,
    /// Settled as [`Settlement::Abandoned`]: the prefix stops here for good.
    abandoned: bool,
    /// The record's data size, counted in flight until it is settled.
    bytes: usize,
    /// Which delivery of the record was handed out last (1 for the first).
    attempt: u32,
    /// For a user record of a KPL aggregate other than its last: its sub-sequence number (a
    /// checkpoint ending here names it; one ending on the last names the whole aggregate).
    open_sub: Option<u64>,
    /// A delivery of it is out (not sent back): only that delivery's settlement counts.
    out: bool,
}

/// When a delivery handed out with a settlement deadline is taken back.
#[derive(Debug)]
struct Deadline {
    at: Instant,
    index: u64,
    attempt: u32,
    /// What is delivered again when the deadline passes.
    record: Record,
}

#[derive(Debug, Default)]
struct State {
    /// Index of `pending[0]`.
    base: u64,
    pending: VecDeque<Slot>,
    /// The last record of the contiguous settled prefix, with its sub-sequence number when it
    /// is a user record that does not close its aggregate.
    settled_through: Option<(Seq, Option<u64>)>,
    /// The shard's reader reached the shard's end.
    ended: bool,
    acked: u64,
    skipped: u64,
    dropped: u64,
    abandoned: u64,
    dead_lettered: u64,
    /// Data bytes of the records handed out and not settled.
    in_flight_bytes: usize,
    /// Woken when in-flight records are settled (back-pressure).
    waiting_reader: Option<Waker>,
    /// Woken when a record is sent back for redelivery.
    retry_waker: Option<Waker>,
    /// Records sent back for redelivery, in shard order.
    retries: VecDeque<Retry>,
    retried: u64,
    /// Settlement deadlines of the deliveries out, in the order they were handed out (so by
    /// deadline); entries of deliveries settled or sent back since are skipped when met.
    deadlines: VecDeque<Deadline>,
    /// Deliveries taken back at their deadline.
    timed_out: u64,
    /// Records handed out for the first time, and their bytes (read by the metrics).
    delivered: u64,
    delivered_bytes: u64,
}

/// A record sent back for redelivery, or to be dead-lettered.
#[derive(Debug)]
struct Retry {
    ready_at: Instant,
    index: u64,
    record: Record,
    /// How many times it was delivered so far.
    attempts: u32,
    /// What its last failure said.
    last_error: Option<String>,
    /// Goes to the dead-letter destination instead of being delivered again.
    dead: bool,
}

/// Why a record is sent back (for [`ShardAcks::requeue`]).
#[derive(Debug, Default)]
pub(crate) struct SendBack {
    /// Wait this long before delivering it again.
    pub(crate) delay: Duration,
    /// How many times it was delivered so far.
    pub(crate) attempts: u32,
    /// What the failure said.
    pub(crate) last_error: Option<String>,
    /// Dead-letter it now, whatever its attempts.
    pub(crate) dead: bool,
}

/// What [`ShardAcks::next_retry`] found.
#[derive(Debug)]
pub(crate) enum RetryPoll {
    /// Nothing to redeliver; poll again at the instant given (the next settlement deadline),
    /// if any, without holding the shard's later records back meanwhile.
    Nothing(Option<Instant>),
    /// Redeliver this record now, under its original index, as attempt number `.2`.
    Ready(u64, Record, u32),
    /// Write this record's dead letter, then settle it as dead-lettered.
    DeadLetter(
        u64,
        super::dead_letter::DeadLetter,
        Arc<dyn super::dead_letter::DeadLetters>,
    ),
    /// A record waits for its delay; nothing later of this shard may go first.
    Waiting(Instant),
}

/// The settlement ledger of one shard reader.
#[derive(Debug)]
pub(crate) struct ShardAcks {
    stream: Arc<str>,
    shard: Arc<str>,
    state: Mutex<State>,
    settled: SettledPosition,
    /// Notified when the checkpoint candidate becomes SHARD_END.
    finished: Notify,
    /// Replaced by a new ledger (the subscription moved): its deliveries are stale.
    retired: AtomicBool,
    /// The subscription stopped reading the shard (handed off, lost, stopping): a delivery
    /// dropped from now on is abandoned, not passed.
    closed: AtomicBool,
    /// Records sent back wait in the retry queue (set and cleared under the state's lock):
    /// while it is false and no settlement deadline applies, the reader skips
    /// [`next_retry`](Self::next_retry) for a record it can hand out.
    retrying: AtomicBool,
    /// A copy of the ledger's length, written under the state's lock: the reader checks for
    /// room without the lock. Only the reader adds records, so what it reads is never below
    /// the truth, and a settlement it has not seen yet only sends it to the lock.
    pending_copy: AtomicUsize,
    /// A copy of the data bytes in flight, written the same way.
    bytes_copy: AtomicUsize,
    /// What drops become.
    policy: AckPolicy,
    /// How far a written checkpoint covers the ledger.
    durability: Durability,
    /// What the ledger counts: deliveries, settlements, records in flight.
    metrics: ShardMetrics,
    /// The span of the shard's reader, for the work on its records.
    span: tracing::Span,
}

impl ShardAcks {
    /// A ledger for `shard`, starting at the stored checkpoint (if any).
    #[must_use]
    pub(crate) fn new(
        stream: Arc<str>,
        shard: Arc<str>,
        checkpoint: Option<&Checkpoint>,
    ) -> Arc<Self> {
        let (settled, settled_through) = match checkpoint {
            Some(Checkpoint::Sequence(seq)) => (
                SettledPosition::at(seq.as_str()),
                Some((Seq::new(seq), None)),
            ),
            Some(Checkpoint::SubSequence(seq, sub)) => {
                (SettledPosition::new(), Some((Seq::new(seq), Some(*sub))))
            }
            _ => (SettledPosition::new(), None),
        };
        Arc::new(Self {
            stream,
            shard,
            state: Mutex::new(State {
                settled_through,
                ..State::default()
            }),
            settled,
            finished: Notify::new(),
            retired: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            retrying: AtomicBool::new(false),
            pending_copy: AtomicUsize::new(0),
            bytes_copy: AtomicUsize::new(0),
            policy: AckPolicy::default(),
            durability: Durability::default(),
            metrics: ShardMetrics::default(),
            span: tracing::Span::none(),
        })
    }

    /// The same, with the subscription's rules for dropped deliveries.
    #[must_use]
    pub(crate) fn with_policy(
        stream: Arc<str>,
        shard: Arc<str>,
        checkpoint: Option<&Checkpoint>,
        policy: AckPolicy,
        metrics: ShardMetrics,
        span: tracing::Span,
    ) -> Arc<Self> {
        let mut acks = Self::new(stream, shard, checkpoint);
        if let Some(ledger) = Arc::get_mut(&mut acks) {
            ledger.policy = policy;
            ledger.metrics = metrics;
            ledger.span = span;
        }
        acks
    }

    /// The span of the shard's reader.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The shard's metric handles.
    pub(crate) fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    /// The subscription stopped reading the shard: deliveries dropped from now on are
    /// abandoned (read again by the next reader), never passed.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    /// True once the subscription stopped reading the shard, or was asked to stop.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire) || self.policy.stopping.load(Ordering::Acquire)
    }

    /// True when deliveries dropped unsettled are sent back rather than passed.
    pub(crate) fn redelivers_dropped(&self) -> bool {
        self.policy.redeliver_dropped
    }

    /// How far a written checkpoint covers this ledger.
    pub(crate) fn durability(&self) -> &Durability {
        &self.durability
    }

    /// Marks the ledger as replaced (the subscription moved): its deliveries are stale.
    pub(crate) fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// True once the ledger was replaced.
    pub(crate) fn is_retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The stream name.
    #[must_use]
    pub(crate) fn stream(&self) -> &Arc<str> {
        &self.stream
    }

    /// The shard id.
    #[must_use]
    pub(crate) fn shard(&self) -> &Arc<str> {
        &self.shard
    }

    /// The settled position the shard's reader renews an expired iterator after (as of the
    /// last [`checkpoint_covering`](Self::checkpoint_covering) call).
    #[must_use]
    pub(crate) fn settled_position(&self) -> SettledPosition {
        self.settled.clone()
    }

    /// Registers the next record handed out; returns its index for settling.
    pub(crate) fn register(&self, sequence_number: &str) -> u64 {
        self.register_sized(sequence_number, 0)
    }

    /// [`register`](Self::register), counting `bytes` of data in flight until it is settled.
    pub(crate) fn register_sized(&self, sequence_number: &str, bytes: usize) -> u64 {
        let sequence_number = Seq::new(sequence_number);
        let mut state = self.lock();
        self.push_slot(&mut state, sequence_number, bytes, None)
    }

    /// Copies the ledger's length and bytes in flight for [`has_room`](Self::has_room).
    fn publish_room(&self, state: &State) {
        self.pending_copy
            .store(state.pending.len(), Ordering::Release);
        self.bytes_copy
            .store(state.in_flight_bytes, Ordering::Release);
    }

    fn push_slot(
        &self,
        state: &mut State,
        sequence_number: Seq,
        bytes: usize,
        open_sub: Option<u64>,
    ) -> u64 {
        let index = state.base + state.pending.len() as u64;
        state.pending.push_back(Slot {
            sequence_number,
            settled: false,
            abandoned: false,
            bytes,
            attempt: 1,
            out: true,
            open_sub,
        });
        state.in_flight_bytes += bytes;
        self.publish_room(state);
        index
    }

    /// Registers `record` as handed out for the first time (its data counted in flight), with
    /// its settlement deadline when the policy sets one; returns its index for settling.
    pub(crate) fn register_delivery(&self, record: &Record) -> u64 {
        let open_sub = if record.is_last_of_aggregate() {
            None
        } else {
            record.sub_sequence_number()
        };
        let bytes = record.data().len();
        let seq = Seq::Record(record.clone());
        let mut state = self.lock();
        let index = self.push_slot(&mut state, seq, bytes, open_sub);
        state.delivered += 1;
        state.delivered_bytes += bytes as u64;
        if let Some(within) = self.policy.settle_within {
            state.deadlines.push_back(Deadline {
                at: Instant::now() + within,
                index,
                attempt: 1,
                record: record.clone(),
            });
        }
        index
    }

    /// Settles the record at `index` (by the ledger itself: a dead letter written, an error
    /// item). Settling twice is harmless.
    pub(crate) fn settle(&self, index: u64, how: Settlement) {
        self.settle_slot(index, None, how);
    }

    /// Settles the record at `index` for its delivery number `attempt`: ignored unless that
    /// delivery is the one out (a delivery taken back at its deadline, or sent back, no
    /// longer settles anything).
    pub(crate) fn settle_attempt(&self, index: u64, attempt: u32, how: Settlement) {
        self.settle_slot(index, Some(attempt), how);
    }

    fn settle_slot(&self, index: u64, attempt: Option<u32>, how: Settlement) {
        // The record the checkpoint passes by (dropped once the lock is released: it may
        // be the last of its read, whose memory is freed with it).
        let passed;
        let (waker, finished) = {
            let mut state = self.lock();
            let Some(offset) = index.checked_sub(state.base) else {
                return;
            };
            let Some(slot) = state.pending.get_mut(offset as usize) else {
                return;
            };
            if slot.settled || attempt.is_some_and(|a| !slot.out || slot.attempt != a) {
                return;
            }
            slot.settled = true;
            slot.abandoned = how == Settlement::Abandoned;
            let bytes = slot.bytes;
            state.in_flight_bytes = state.in_flight_bytes.saturating_sub(bytes);
            match how {
                Settlement::Acked => state.acked += 1,
                Settlement::Skipped => state.skipped += 1,
                Settlement::Dropped => state.dropped += 1,
                Settlement::Abandoned => state.abandoned += 1,
                Settlement::DeadLettered => state.dead_lettered += 1,
            }
            let mut advanced = None;
            while state
                .pending
                .front()
                .is_some_and(|s| s.settled && !s.abandoned)
            {
                let slot = state.pending.pop_front().expect("front exists");
                state.base += 1;
                advanced = Some((slot.sequence_number, slot.open_sub));
            }
            passed = if advanced.is_some() {
                std::mem::replace(&mut state.settled_through, advanced)
            } else {
                None
            };
            self.publish_room(&state);
            (
                state.waiting_reader.take(),
                state.ended && state.pending.is_empty(),
            )
        };
        drop(passed);
        if let Some(waker) = waker {
            waker.wake();
        }
        if finished {
            self.finished.notify_waiters();
            self.finished.notify_one();
        }
    }

    /// Registers a record and settles it at once (a record reported as an error, such as a
    /// KPL-aggregated one, which no consumer will settle).
    pub(crate) fn register_settled(&self, sequence_number: &str, how: Settlement) {
        let index = self.register(sequence_number);
        self.settle(index, how);
    }

    /// Marks that the reader reached the shard's end: once everything in flight is settled,
    /// the checkpoint becomes SHARD_END.
    pub(crate) fn mark_ended(&self) {
        let finished = {
            let mut state = self.lock();
            state.ended = true;
            state.pending.is_empty()
        };
        if finished {
            self.finished.notify_waiters();
            self.finished.notify_one();
        }
    }

    /// [`checkpoint_covering`](Self::checkpoint_covering)'s checkpoint alone.
    #[cfg(test)]
    pub(crate) fn checkpoint(&self) -> Option<Checkpoint> {
        self.checkpoint_covering().map(|(checkpoint, _)| checkpoint)
    }

    /// The checkpoint to write now: SHARD_END once the shard ended and everything is settled,
    /// else the last record of the settled prefix; with the ledger index below which it covers
    /// every delivery (for [`Durability::written`]).
    ///
    /// Also brings the [`settled_position`](Self::settled_position) up to date; the
    /// subscription asks once per checkpoint interval, which keeps the per-record path free of
    /// allocations. The record the checkpoint ends on is let go (its sequence number kept on
    /// its own), so a shard that goes quiet keeps no record in memory past its next checkpoint
    /// write.
    #[must_use]
    pub(crate) fn checkpoint_covering(&self) -> Option<(Checkpoint, u64)> {
        let mut state = self.lock();
        if state.ended && state.pending.is_empty() {
            return Some((Checkpoint::ShardEnd, u64::MAX));
        }
        let (seq, open_sub) = state.settled_through.as_mut()?;
        let owned = seq.as_str().to_owned();
        let released = match seq {
            Seq::Record(_) => Some(std::mem::replace(seq, Seq::new(&owned))),
            Seq::Text(_) => None,
        };
        let checkpoint = match open_sub {
            // The rest of the aggregate is not settled: the reader's renewal point stays at
            // the last whole record.
            Some(sub) => Checkpoint::SubSequence(owned, *sub),
            None => {
                self.settled.advance(&owned);
                Checkpoint::Sequence(owned)
            }
        };
        let covering = Some((checkpoint, state.base));
        drop(state);
        drop(released);
        covering
    }

    /// True once the shard ended and every record of it is settled.
    #[must_use]
    pub(crate) fn is_finished(&self) -> bool {
        let state = self.lock();
        state.ended && state.pending.is_empty()
    }

    /// Waits until the shard is finished.
    pub(crate) async fn finished(&self) {
        loop {
            let notified = self.finished.notified();
            if self.is_finished() {
                return;
            }
            notified.await;
        }
    }

    /// How many records are handed out and not settled (abandoned ones are not waited for).
    /// A record sent back and waiting for its redelivery is not out: once the shard is let
    /// go nobody can settle it, so a stop does not wait for it (the checkpoint stops before
    /// it, and the next reader reads it).
    #[must_use]
    pub(crate) fn in_flight(&self) -> usize {
        self.lock()
            .pending
            .iter()
            .filter(|s| !s.settled && s.out)
            .count()
    }

    /// Returns true when fewer than `limit` records, and fewer bytes than the policy's
    /// byte bound, are in flight (a record always passes when none is); otherwise stores
    /// `waker` to be woken by the next settlement and returns false.
    pub(crate) fn has_room(&self, limit: usize, waker: &Waker) -> bool {
        let fits = |len: usize, bytes: usize| {
            len < limit
                && (self.policy.max_in_flight_bytes).is_none_or(|max| bytes < max || bytes == 0)
        };
        if fits(
            self.pending_copy.load(Ordering::Acquire),
            self.bytes_copy.load(Ordering::Acquire),
        ) {
            return true;
        }
        let mut state = self.lock();
        if fits(state.pending.len(), state.in_flight_bytes) {
            return true;
        }
        state.waiting_reader = Some(waker.clone());
        false
    }

    /// Sends the record at `index` back: it is delivered again (under the same index, still
    /// unsettled) once `delay` has passed, before any later record of this shard that has not
    /// been handed out yet. Past its attempts, or when asked, it is dead-lettered instead (in
    /// the same place of the queue); without a destination an explicit dead letter is logged
    /// and skipped.
    ///
    /// Ignored unless the delivery sending it back (number `back.attempts`) is the one out.
    pub(crate) fn requeue(&self, index: u64, record: Record, back: SendBack) {
        if self.take_back(index, back.attempts) {
            self.enqueue(index, record, back);
        }
    }

    /// Marks the delivery number `attempt` of the record at `index` as back in the ledger's
    /// hands; false when it is not the delivery out (settled, taken back, or superseded).
    fn take_back(&self, index: u64, attempt: u32) -> bool {
        let mut state = self.lock();
        let Some(offset) = index.checked_sub(state.base) else {
            return false;
        };
        match state.pending.get_mut(offset as usize) {
            Some(slot) if !slot.settled && slot.out && slot.attempt == attempt => {
                slot.out = false;
                true
            }
            _ => false,
        }
    }

    fn enqueue(&self, index: u64, record: Record, back: SendBack) {
        let dead = back.dead
            || self
                .policy
                .max_attempts
                .is_some_and(|max| back.attempts >= max);
        if dead && self.policy.dead_letters.is_none() {
            tracing::error!(
                stream = %self.stream,
                shard = %self.shard,
                sequence_number = record.sequence_number(),
                reason = back.last_error.as_deref().unwrap_or(""),
                "dead letter without a destination (set `dead_letters`); the record is skipped"
            );
            self.settle(index, Settlement::Skipped);
            return;
        }
        let waker = {
            let mut state = self.lock();
            let at = state
                .retries
                .iter()
                .position(|r| r.index > index)
                .unwrap_or(state.retries.len());
            state.retries.insert(
                at,
                Retry {
                    ready_at: Instant::now() + if dead { Duration::ZERO } else { back.delay },
                    index,
                    record,
                    attempts: back.attempts,
                    last_error: back.last_error,
                    dead,
                },
            );
            state.retried += 1;
            self.retrying.store(true, Ordering::Release);
            state.retry_waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// True when [`next_retry`](Self::next_retry) may have something to serve (a record sent
    /// back, or a settlement deadline to watch); when false, a reader with a record to hand
    /// out need not ask (it asks before it waits, which registers its waker).
    pub(crate) fn may_retry(&self) -> bool {
        self.policy.settle_within.is_some() || self.retrying.load(Ordering::Acquire)
    }

    /// The next record to redeliver, if any; registers `waker` for records sent back later.
    /// Deliveries past their settlement deadline are taken back first.
    pub(crate) fn next_retry(&self, waker: &Waker) -> RetryPoll {
        if let Some(within) = self.policy.settle_within {
            for (index, record, attempt) in self.overdue() {
                tracing::warn!(
                    stream = %self.stream,
                    shard = %self.shard,
                    sequence_number = record.sequence_number(),
                    attempt,
                    "delivery not settled within {within:?}; taken back and sent back"
                );
                self.enqueue(
                    index,
                    record,
                    SendBack {
                        attempts: attempt,
                        last_error: Some(format!("not settled within {within:?}")),
                        ..SendBack::default()
                    },
                );
            }
        }
        let mut state = self.lock();
        let front = state.retries.front().map(|r| r.ready_at);
        match front {
            None => {
                self.retrying.store(false, Ordering::Release);
                register(&mut state.retry_waker, waker);
                RetryPoll::Nothing(state.deadlines.front().map(|d| d.at))
            }
            Some(at) if at <= Instant::now() => {
                let retry = state.retries.pop_front().expect("front exists");
                if state.retries.is_empty() {
                    self.retrying.store(false, Ordering::Release);
                }
                if !retry.dead {
                    self.hand_out_again(&mut state, &retry);
                }
                match (&self.policy.dead_letters, retry.dead) {
                    (Some(destination), true) => RetryPoll::DeadLetter(
                        retry.index,
                        super::dead_letter::DeadLetter::new(
                            self.stream.clone(),
                            &retry.record,
                            retry.attempts,
                            retry.last_error,
                        ),
                        destination.clone(),
                    ),
                    _ => RetryPoll::Ready(retry.index, retry.record, retry.attempts + 1),
                }
            }
            Some(at) => {
                // A record sent back meanwhile may go ahead of the one waited for, with a
                // shorter delay: its send-back wakes the reader.
                register(&mut state.retry_waker, waker);
                RetryPoll::Waiting(at)
            }
        }
    }

    /// Takes back the deliveries whose settlement deadline passed (their later settlements
    /// are ignored) and drops the deadlines of deliveries settled or sent back since, so the
    /// front deadline is a live one.
    fn overdue(&self) -> Vec<(u64, Record, u32)> {
        let mut state = self.lock();
        let now = Instant::now();
        let mut taken = Vec::new();
        while let Some(front) = state.deadlines.front() {
            let (index, attempt, at) = (front.index, front.attempt, front.at);
            let live = index
                .checked_sub(state.base)
                .and_then(|offset| state.pending.get(offset as usize))
                .is_some_and(|s| !s.settled && s.out && s.attempt == attempt);
            if live && at > now {
                break;
            }
            let deadline = state.deadlines.pop_front().expect("front exists");
            if live {
                let offset = (index - state.base) as usize;
                state.pending[offset].out = false;
                state.timed_out += 1;
                taken.push((index, deadline.record, attempt));
            }
        }
        taken
    }

    /// Marks a record sent back as out again, for its next delivery, with a new deadline.
    fn hand_out_again(&self, state: &mut State, retry: &Retry) {
        let attempt = retry.attempts + 1;
        if let Some(slot) = retry
            .index
            .checked_sub(state.base)
            .and_then(|offset| state.pending.get_mut(offset as usize))
        {
            slot.out = true;
            slot.attempt = attempt;
        }
        if let Some(within) = self.policy.settle_within {
            state.deadlines.push_back(Deadline {
                at: Instant::now() + within,
                index: retry.index,
                attempt,
                record: retry.record.clone(),
            });
        }
    }

    /// Settlement counts so far.
    #[must_use]
    pub(crate) fn counts(&self) -> AckCounts {
        let state = self.lock();
        AckCounts {
            acked: state.acked,
            skipped: state.skipped,
            dropped: state.dropped,
            abandoned: state.abandoned,
            dead_lettered: state.dead_lettered,
            in_flight: state.pending.iter().filter(|s| !s.settled).count() as u64,
            retried: state.retried,
            timed_out: state.timed_out,
            delivered: state.delivered,
            delivered_bytes: state.delivered_bytes,
        }
    }
}

/// Keeps `waker` in `slot`, unless the one there wakes the same task.
fn register(slot: &mut Option<Waker>, waker: &Waker) {
    if !slot.as_ref().is_some_and(|w| w.will_wake(waker)) {
        *slot = Some(waker.clone());
    }
}

#[cfg(test)]
mod tests;
