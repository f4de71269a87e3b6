//! [`BatchesByShard`]: deliveries gathered per shard, handed on when a batch is full or its
//! first delivery has waited long enough.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::{Future, Stream};
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::ack::Delivery;

/// One shard's batch being gathered.
struct Open<T> {
    items: Vec<Delivery<T>>,
    since: Instant,
}

pin_project! {
    /// The stream of [`batches_by_shard`](super::DeliveryStreamExt::batches_by_shard).
    #[must_use = "streams do nothing unless polled"]
    pub struct BatchesByShard<S, T> {
        #[pin]
        stream: S,
        // Keyed by the shard's ledger: one per shard a subscription reads.
        open: HashMap<usize, Open<T>>,
        ready: VecDeque<Vec<Delivery<T>>>,
        // Made at the first wait, inside the runtime.
        timer: Option<Pin<Box<Sleep>>>,
        max: usize,
        linger: Duration,
        done: bool,
    }
}

impl<S, T> fmt::Debug for BatchesByShard<S, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BatchesByShard")
            .field("open", &self.open.len())
            .field("ready", &self.ready.len())
            .field("max", &self.max)
            .field("linger", &self.linger)
            .finish_non_exhaustive()
    }
}

impl<S, T> BatchesByShard<S, T> {
    pub(super) fn new(stream: S, max: usize, linger: Duration) -> Self {
        assert!(max > 0, "batches_by_shard: `max` must be at least 1");
        Self {
            stream,
            open: HashMap::new(),
            ready: VecDeque::new(),
            timer: None,
            max,
            linger,
            done: false,
        }
    }
}

/// Adds `delivery` to its shard's batch; a batch that is full moves to `ready`.
fn gather<T>(
    open: &mut HashMap<usize, Open<T>>,
    ready: &mut VecDeque<Vec<Delivery<T>>>,
    max: usize,
    delivery: Delivery<T>,
) {
    let key = delivery.ledger_key();
    let batch = open.entry(key).or_insert_with(|| Open {
        items: Vec::with_capacity(max.min(1024)),
        since: Instant::now(),
    });
    batch.items.push(delivery);
    if batch.items.len() >= max {
        let full = open.remove(&key).expect("just used");
        ready.push_back(full.items);
    }
}

/// Moves every open batch to `ready`, oldest first.
fn close_all<T>(open: &mut HashMap<usize, Open<T>>, ready: &mut VecDeque<Vec<Delivery<T>>>) {
    let mut all: Vec<Open<T>> = open.drain().map(|(_, batch)| batch).collect();
    all.sort_by_key(|batch| batch.since);
    ready.extend(all.into_iter().map(|batch| batch.items));
}

/// The batch that has waited longest, and when it is due.
fn oldest<T>(open: &HashMap<usize, Open<T>>, linger: Duration) -> Option<(usize, Instant)> {
    open.iter()
        .min_by_key(|(_, batch)| batch.since)
        .map(|(key, batch)| (*key, batch.since + linger))
}

impl<S, T> Stream for BatchesByShard<S, T>
where
    S: Stream<Item = Delivery<T>>,
{
    type Item = Vec<Delivery<T>>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut this = self.project();
        loop {
            if let Some(batch) = this.ready.pop_front() {
                return Poll::Ready(Some(batch));
            }
            if !*this.done {
                match this.stream.as_mut().poll_next(cx) {
                    Poll::Ready(Some(delivery)) => {
                        gather(this.open, this.ready, *this.max, delivery);
                        continue;
                    }
                    Poll::Ready(None) => {
                        *this.done = true;
                        close_all(this.open, this.ready);
                        continue;
                    }
                    Poll::Pending => {}
                }
            }
            let Some((key, due)) = oldest(this.open, *this.linger) else {
                return if *this.done {
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                };
            };
            if due <= Instant::now() {
                let batch = this.open.remove(&key).expect("listed");
                return Poll::Ready(Some(batch.items));
            }
            let timer = this
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            timer.as_mut().reset(due);
            if timer.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
        }
    }
}
