//! [`ShardPump`]: one shard stream turned into deliveries, with back-pressure and revocation.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use futures::{Future, Stream};
use pin_project_lite::pin_project;
use tokio::sync::mpsc::UnboundedSender;
use tokio::time::{Sleep, sleep_until};

use super::gate::LeaseGate;
use crate::ack::tracker::RetryPoll;
use crate::ack::{AckToken, Delivery, Settlement, ShardAcks, write_until_stored};
use crate::error::KinesisError;
use crate::record::Record;
use crate::shard::{ShardEnd, ShardStream};

/// Why a shard's reader finished.
#[derive(Debug)]
pub(crate) enum PumpEnd {
    /// The shard is closed and fully read.
    ShardEnd(ShardEnd),
    /// The reader (the one behind this gate) stopped: it gave up after failing over and over
    /// (`gave_up`), or the shard cannot be opened.
    Stopped { gate: Arc<LeaseGate>, gave_up: bool },
    /// The lease was not renewed in time: the pump (the one behind this gate) stopped handing
    /// out records for good.
    LeaseExpired(Arc<LeaseGate>),
}

/// A message from a pump to the coordinator.
#[derive(Debug)]
pub(crate) struct PumpEvent {
    pub(crate) shard: Arc<str>,
    pub(crate) end: PumpEnd,
}

pin_project! {
    /// A shard stream whose records become [`Delivery`]s registered with the shard's ledger.
    ///
    /// * Back-pressure: while `max_in_flight` deliveries (or `max_in_flight_bytes` of data) of
    ///   this shard are unsettled, the pump
    ///   yields nothing (and so its reader reads nothing) until one is settled.
    /// * Revocation: once the gate is revoked (the lease is lost or being handed off) or the
    ///   lease runs out without a renewal, the pump ends at once and drops whatever it had
    ///   read. The gate is checked before every delivery is handed out.
    /// * A KPL-aggregated record is reported as its error and settled as skipped at once.
    #[must_use = "streams do nothing unless polled"]
    #[project = Projection]
    pub(crate) struct ShardPump {
        #[pin]
        inner: ShardStream,
        acks: Arc<ShardAcks>,
        gate: Arc<LeaseGate>,
        max_in_flight: usize,
        events: UnboundedSender<PumpEvent>,
        done: bool,
        // The shard was read to its end; records sent back are still served until the shard
        // is finished and the subscription removes this pump.
        drained: bool,
        // The last error the reader reported was its giving up after repeated failures.
        gave_up: bool,
        retry_timer: Option<Pin<Box<Sleep>>>,
        // A dead letter being written (the ledger index it settles): the shard waits for it.
        dead_letter: Option<(u64, BoxFuture<'static, ()>)>,
    }
}

impl ShardPump {
    pub(crate) fn new(
        inner: ShardStream,
        acks: Arc<ShardAcks>,
        gate: Arc<LeaseGate>,
        max_in_flight: usize,
        events: UnboundedSender<PumpEvent>,
    ) -> Self {
        Self {
            inner,
            acks,
            gate,
            max_in_flight,
            events,
            done: false,
            drained: false,
            gave_up: false,
            retry_timer: None,
            dead_letter: None,
        }
    }
}

/// Ends a pump whose gate closed; tells the coordinator when the lease ran out on its own
/// (a revocation came from the coordinator, which knows already).
fn close(
    done: &mut bool,
    gate: &Arc<LeaseGate>,
    acks: &ShardAcks,
    events: &UnboundedSender<PumpEvent>,
) -> Option<Result<Delivery<Record>, KinesisError>> {
    *done = true;
    if !gate.is_revoked() {
        let _ = events.send(PumpEvent {
            shard: acks.shard().clone(),
            end: PumpEnd::LeaseExpired(gate.clone()),
        });
    }
    None
}

type Item = Result<Delivery<Record>, KinesisError>;

impl Stream for ShardPump {
    type Item = Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        if !this.gate.is_open() {
            return Poll::Ready(close(this.done, this.gate, this.acks, this.events));
        }
        // Records sent back go first; the ledger says cheaply when there are none.
        if (this.dead_letter.is_some() || this.acks.may_retry())
            && let Some(retried) = poll_retries(&mut this, cx)
        {
            return retried;
        }
        if *this.drained || !this.acks.has_room(*this.max_in_flight, cx.waker()) {
            return before_waiting(&mut this, cx);
        }
        match this.inner.as_mut().poll_next(cx) {
            Poll::Pending => before_waiting(&mut this, cx),
            // The gate was asked at the start of this poll, microseconds ago: a gate closes
            // a third of the lease duration before anyone else may read the shard.
            Poll::Ready(Some(Ok(record))) => {
                let index = this.acks.register_delivery(&record);
                let token = AckToken::new(this.acks.clone(), index, Some(record.clone()));
                Poll::Ready(Some(Ok(Delivery::new(record, token))))
            }
            Poll::Ready(Some(Err(e))) => {
                *this.gave_up = matches!(e, KinesisError::ReaderStopped { .. });
                if let KinesisError::AggregatedRecord {
                    sequence_number, ..
                } = &e
                {
                    this.acks
                        .register_settled(sequence_number, Settlement::Skipped);
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => reader_ended(&mut this, cx),
        }
    }
}

/// The pump has nothing to hand out: asks the ledger for a record sent back meanwhile, which
/// also registers the task to be woken by the next one sent back.
fn before_waiting(this: &mut Projection<'_>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
    poll_retries(this, cx).unwrap_or(Poll::Pending)
}

/// Serves a record sent back for redelivery, when one is due; `None` when the queue lets
/// the reader's next record through. Later records of the shard wait for one sent back.
fn poll_retries(this: &mut Projection<'_>, cx: &mut Context<'_>) -> Option<Poll<Option<Item>>> {
    loop {
        if let Some((index, writing)) = this.dead_letter.as_mut() {
            if writing.as_mut().poll(cx).is_pending() {
                return Some(Poll::Pending);
            }
            this.acks.settle(*index, Settlement::DeadLettered);
            *this.dead_letter = None;
        }
        match this.acks.next_retry(cx.waker()) {
            RetryPoll::Nothing(None) => {
                *this.retry_timer = None;
                return None;
            }
            RetryPoll::Nothing(Some(deadline)) => {
                // A settlement deadline: wake then, and let the reader's records through now.
                if poll_timer(this.retry_timer, deadline, cx).is_pending() {
                    return None;
                }
            }
            RetryPoll::DeadLetter(index, letter, destination) => {
                *this.retry_timer = None;
                tracing::warn!(
                    shard = %letter.shard,
                    sequence_number = %letter.sequence_number,
                    attempts = letter.attempts,
                    "writing a dead letter; the shard waits for it"
                );
                *this.dead_letter =
                    Some((index, Box::pin(write_until_stored(destination, letter))));
            }
            RetryPoll::Ready(index, record, attempt) => {
                *this.retry_timer = None;
                if !this.gate.is_open() {
                    // Stays unsettled: whoever reads the shard next delivers it again.
                    return Some(Poll::Ready(close(
                        this.done,
                        this.gate,
                        this.acks,
                        this.events,
                    )));
                }
                let token = AckToken::new(this.acks.clone(), index, Some(record.clone()))
                    .with_attempt(attempt);
                return Some(Poll::Ready(Some(Ok(Delivery::new(record, token)))));
            }
            RetryPoll::Waiting(at) => {
                if poll_timer(this.retry_timer, at, cx).is_pending() {
                    return Some(Poll::Pending);
                }
            }
        }
    }
}

/// Polls the pump's one timer, set to fire at `at`.
fn poll_timer(
    timer: &mut Option<Pin<Box<Sleep>>>,
    at: tokio::time::Instant,
    cx: &mut Context<'_>,
) -> Poll<()> {
    let timer = timer.get_or_insert_with(|| Box::pin(sleep_until(at)));
    if timer.deadline() != at {
        timer.as_mut().reset(at);
    }
    timer.as_mut().poll(cx)
}

/// The reader's stream ended: at the shard's end (the pump stays, serving records sent back,
/// until the shard is finished), or because the reader stopped.
fn reader_ended(this: &mut Projection<'_>, cx: &mut Context<'_>) -> Poll<Option<Item>> {
    let end = match this.inner.shard_end() {
        Some(end) => {
            this.acks.mark_ended();
            *this.drained = true;
            PumpEnd::ShardEnd(end.clone())
        }
        None => {
            *this.done = true;
            PumpEnd::Stopped {
                gate: this.gate.clone(),
                gave_up: *this.gave_up,
            }
        }
    };
    let _ = this.events.send(PumpEvent {
        shard: this.acks.shard().clone(),
        end,
    });
    if *this.drained {
        // The next poll serves the retry queue and registers for it.
        cx.waker().wake_by_ref();
        return Poll::Pending;
    }
    Poll::Ready(None)
}
