//! [`ReadyMap`]: keyed streams merged so that a poll touches only streams that can make
//! progress.
//!
//! A merge that polls every stream until one yields (as `tokio_stream::StreamMap` does) pays
//! for each idle stream on every item: a subscription holding 64 shards of which one has a
//! backlog polled some 32 idle readers per record. Here each stream is polled with a waker
//! of its own; a stream is polled again only after it yielded (it may have more) or after its
//! waker fired. Streams that yield take turns in the order they became ready.

use std::borrow::Borrow;
use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use futures::Stream;
use futures::task::AtomicWaker;

/// Where entries' wakers report, shared with every waker handed out.
#[derive(Debug, Default)]
struct Woken {
    /// (slot, generation) of entries whose waker fired since the map last looked.
    slots: Mutex<Vec<(usize, u64)>>,
    /// Set with every push to `slots`: a poll looks at the mutex only when it is set.
    any: AtomicBool,
    /// The task polling the map.
    parent: AtomicWaker,
}

/// An entry's waker: records the entry as ready and wakes the map's task.
#[derive(Debug)]
struct EntryWaker {
    slot: usize,
    generation: u64,
    /// Already reported and not yet looked at: a second wake adds nothing.
    reported: AtomicBool,
    woken: Arc<Woken>,
}

impl Wake for EntryWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if !self.reported.swap(true, Ordering::AcqRel) {
            let mut slots = self
                .woken
                .slots
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            slots.push((self.slot, self.generation));
            self.woken.any.store(true, Ordering::Release);
        }
        self.woken.parent.wake();
    }
}

#[derive(Debug)]
struct Entry<K, S> {
    key: K,
    stream: S,
    generation: u64,
    /// In the local ready queue now.
    queued: bool,
    notify: Arc<EntryWaker>,
    waker: Waker,
}

/// Streams keyed by `K`, polled as one stream of their items through
/// [`poll_next_item`](Self::poll_next_item); a stream that ends is removed.
#[must_use = "streams do nothing unless polled"]
pub(crate) struct ReadyMap<K, S> {
    slots: Vec<Option<Entry<K, S>>>,
    free: Vec<usize>,
    by_key: HashMap<K, usize>,
    /// Entries to poll, in turn: (slot, generation), so a stale turn of a removed entry is
    /// passed over.
    ready: VecDeque<(usize, u64)>,
    woken: Arc<Woken>,
    next_generation: u64,
}

impl<K, S> Default for ReadyMap<K, S> {
    fn default() -> Self {
        Self {
            slots: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            ready: VecDeque::new(),
            woken: Arc::default(),
            next_generation: 0,
        }
    }
}

impl<K: std::fmt::Debug, S> std::fmt::Debug for ReadyMap<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadyMap")
            .field("keys", &self.by_key.keys().collect::<Vec<_>>())
            .field("ready", &self.ready.len())
            .finish_non_exhaustive()
    }
}

impl<K, S> ReadyMap<K, S>
where
    K: Hash + Eq + Clone,
    S: Stream + Unpin,
{
    /// An empty map.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// How many streams the map holds.
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }

    /// The keys, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.by_key.keys()
    }

    /// Adds `stream` under `key` (replacing and dropping a stream held under it); it is
    /// polled at the next poll of the map.
    pub(crate) fn insert(&mut self, key: K, stream: S) {
        self.remove(&key);
        let generation = self.next_generation;
        self.next_generation += 1;
        let slot = self.free.pop().unwrap_or(self.slots.len());
        let notify = Arc::new(EntryWaker {
            slot,
            generation,
            reported: AtomicBool::new(false),
            woken: self.woken.clone(),
        });
        let entry = Entry {
            key: key.clone(),
            stream,
            generation,
            queued: true,
            waker: Waker::from(notify.clone()),
            notify,
        };
        if slot == self.slots.len() {
            self.slots.push(Some(entry));
        } else {
            self.slots[slot] = Some(entry);
        }
        self.by_key.insert(key, slot);
        // Polled at the map's next poll (insertions happen before the first poll or while
        // the map's owner is being polled).
        self.ready.push_back((slot, generation));
    }

    /// The keys and their streams, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &S)> {
        (self.slots.iter().flatten()).map(|entry| (&entry.key, &entry.stream))
    }

    /// Removes and drops the stream under `key`, if any.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.take(key).is_some()
    }

    /// Removes the stream under `key` and hands it back, if any.
    pub(crate) fn take<Q>(&mut self, key: &Q) -> Option<S>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let slot = self.by_key.remove(key)?;
        self.free.push(slot);
        self.slots[slot].take().map(|entry| entry.stream)
    }

    /// Removes and drops every stream.
    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.free.clear();
        self.by_key.clear();
        self.ready.clear();
    }

    /// Moves the entries whose waker fired into the ready queue.
    fn take_woken(&mut self) {
        let woken = {
            let mut slots = (self.woken.slots.lock()).unwrap_or_else(PoisonError::into_inner);
            self.woken.any.store(false, Ordering::Release);
            std::mem::take(&mut *slots)
        };
        for (slot, generation) in woken {
            let Some(Some(entry)) = self.slots.get_mut(slot) else {
                continue;
            };
            if entry.generation != generation {
                continue;
            }
            entry.notify.reported.store(false, Ordering::Release);
            if !entry.queued {
                entry.queued = true;
                self.ready.push_back((slot, generation));
            }
        }
    }

    /// The next item of any stream: `Ready(None)` when the map is empty, `Pending` when no
    /// stream has an item now (a stream's waker wakes the task then).
    ///
    /// Each call polls a stream at most twice. The streams woken so far are queued at the
    /// start; a stream woken during the call (one that wakes itself while polled, as a tokio
    /// resource does when the task's budget is spent) waits until nothing else is ready.
    /// Only then, about to answer `Pending`, does the call register the task's waker and look
    /// at the wakes once more, so one that came before the registration is not lost; a wake
    /// after it asks the task for the next call. An item is handed back without touching the
    /// task's waker at all. Re-polling a self-waking stream until it yields could never end.
    pub(crate) fn poll_next_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        if self.woken.any.load(Ordering::Acquire) {
            self.take_woken();
        }
        let mut registered = false;
        loop {
            let Some((slot, generation)) = self.ready.pop_front() else {
                if self.by_key.is_empty() {
                    return Poll::Ready(None);
                }
                if registered {
                    return Poll::Pending;
                }
                self.woken.parent.register(cx.waker());
                registered = true;
                if self.woken.any.load(Ordering::Acquire) {
                    self.take_woken();
                }
                continue;
            };
            let Some(Some(entry)) = self.slots.get_mut(slot) else {
                continue;
            };
            if entry.generation != generation {
                continue;
            }
            entry.queued = false;
            let mut own = Context::from_waker(&entry.waker);
            match Pin::new(&mut entry.stream).poll_next(&mut own) {
                Poll::Ready(Some(item)) => {
                    // It may have more: its next turn comes after the others ready now.
                    entry.queued = true;
                    self.ready.push_back((slot, generation));
                    return Poll::Ready(Some(item));
                }
                Poll::Ready(None) => {
                    let key = entry.key.clone();
                    self.remove(&key);
                }
                Poll::Pending => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::sync::atomic::AtomicUsize;

    /// A stream that counts its polls and yields what is pushed into its channel.
    struct Counted {
        polls: Arc<AtomicUsize>,
        inner: futures::channel::mpsc::UnboundedReceiver<u32>,
    }

    impl Stream for Counted {
        type Item = u32;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<u32>> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            self.inner.poll_next_unpin(cx)
        }
    }

    fn counted() -> (
        Counted,
        Arc<AtomicUsize>,
        futures::channel::mpsc::UnboundedSender<u32>,
    ) {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let polls = Arc::new(AtomicUsize::new(0));
        (
            Counted {
                polls: polls.clone(),
                inner: rx,
            },
            polls,
            tx,
        )
    }

    fn poll_now<K: Hash + Eq + Clone, S: Stream + Unpin>(
        map: &mut ReadyMap<K, S>,
    ) -> Poll<Option<S::Item>> {
        map.poll_next_item(&mut Context::from_waker(Waker::noop()))
    }

    #[test]
    fn idle_streams_are_not_polled_again_until_woken() {
        let mut map = ReadyMap::new();
        let mut idle = Vec::new();
        for i in 0..16 {
            let (stream, polls, tx) = counted();
            map.insert(i, stream);
            idle.push((polls, tx));
        }
        let (busy, busy_polls, busy_tx) = counted();
        map.insert(99, busy);
        for n in 0..100 {
            busy_tx.unbounded_send(n).unwrap();
        }
        let mut got = Vec::new();
        while let Poll::Ready(Some(n)) = poll_now(&mut map) {
            got.push(n);
        }
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        // Each idle stream was polled once, when it was added; the busy one once per item
        // and once more to find it empty.
        for (polls, _) in &idle {
            assert_eq!(polls.load(Ordering::Relaxed), 1);
        }
        assert_eq!(busy_polls.load(Ordering::Relaxed), 101);
        // A woken idle stream is polled and yields.
        idle[3].1.unbounded_send(7).unwrap();
        assert_eq!(poll_now(&mut map), Poll::Ready(Some(7)));
        assert_eq!(idle[3].0.load(Ordering::Relaxed), 2);
        assert_eq!(idle[4].0.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn ready_streams_take_turns_and_ended_ones_leave() {
        let mut map = ReadyMap::new();
        let mut senders = Vec::new();
        for key in ["a", "b", "c"] {
            let (stream, _, tx) = counted();
            for n in 0..3 {
                tx.unbounded_send(n).unwrap();
            }
            map.insert(key, stream);
            senders.push(tx);
        }
        let mut order = Vec::new();
        for _ in 0..9 {
            match poll_now(&mut map) {
                Poll::Ready(Some(n)) => order.push(n),
                other => panic!("expected an item, got {other:?}"),
            }
        }
        assert_eq!(order, [0, 0, 0, 1, 1, 1, 2, 2, 2]);
        // "b" ends: it leaves the map; the others wait.
        senders.remove(1);
        assert_eq!(poll_now(&mut map), Poll::Pending);
        assert_eq!(map.len(), 2);
        assert!(!map.keys().any(|k| *k == "b"));
        senders.clear();
        assert_eq!(poll_now(&mut map), Poll::Ready(None));
    }

    /// A stream that never yields and keeps the waker it was last polled with.
    struct Parked(Arc<Mutex<Option<Waker>>>);

    impl Stream for Parked {
        type Item = u32;
        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<u32>> {
            *self.0.lock().unwrap() = Some(cx.waker().clone());
            Poll::Pending
        }
    }

    #[test]
    fn a_removed_or_replaced_stream_is_never_polled_again() {
        let mut map: ReadyMap<&str, Box<dyn Stream<Item = u32> + Unpin>> = ReadyMap::new();
        let parked = Arc::new(Mutex::new(None));
        map.insert("k", Box::new(Parked(parked.clone())));
        assert_eq!(poll_now(&mut map), Poll::Pending);
        let old_waker = parked.lock().unwrap().take().expect("polled once");
        let (new, new_polls, new_tx) = counted();
        map.insert("k", Box::new(new));
        assert_eq!(poll_now(&mut map), Poll::Pending);
        assert_eq!(new_polls.load(Ordering::Relaxed), 1);
        // The replaced stream's waker fires: the stream now in its slot is not polled for it.
        old_waker.wake();
        assert_eq!(poll_now(&mut map), Poll::Pending);
        assert_eq!(new_polls.load(Ordering::Relaxed), 1);
        new_tx.unbounded_send(2).unwrap();
        assert_eq!(poll_now(&mut map), Poll::Ready(Some(2)));
        assert!(map.remove("k"));
        assert!(
            new_tx.unbounded_send(3).is_err(),
            "a removed stream is dropped"
        );
        assert_eq!(poll_now(&mut map), Poll::Ready(None));
        assert_eq!(new_polls.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_taken_stream_comes_back_unpolled_and_leaves_the_map() {
        let mut map = ReadyMap::new();
        let (a, a_polls, _a_tx) = counted();
        let (b, _, b_tx) = counted();
        map.insert("a", a);
        map.insert("b", b);
        let mut keys: Vec<_> = map.iter().map(|(key, _)| *key).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["a", "b"]);
        let taken = map.take("a").expect("held");
        assert_eq!(a_polls.load(Ordering::Relaxed), 0);
        assert!(map.take("a").is_none());
        assert_eq!(map.iter().map(|(key, _)| *key).collect::<Vec<_>>(), ["b"]);
        // Its turn in the ready queue is passed over; the other stream still yields.
        b_tx.unbounded_send(5).unwrap();
        assert_eq!(poll_now(&mut map), Poll::Ready(Some(5)));
        assert_eq!(a_polls.load(Ordering::Relaxed), 0);
        drop(taken);
    }

    /// A tokio channel as a stream: each receive spends the task's coop budget.
    struct Budgeted(tokio::sync::mpsc::UnboundedReceiver<u32>);

    impl Stream for Budgeted {
        type Item = u32;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<u32>> {
            self.0.poll_recv(cx)
        }
    }

    /// In a multi-thread runtime's `block_on` (what `#[tokio::main]` runs the main future
    /// in), a tokio resource polled with the task's budget spent answers `Pending` and wakes
    /// its waker at once, during the poll. The map must hand that back to the task rather
    /// than poll the stream again in the same call, or it never returns.
    #[test]
    fn a_stream_that_wakes_itself_while_polled_does_not_hold_the_map() {
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // Its own thread, so a map that never returns fails the test instead of hanging it.
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .build()
                .expect("a runtime");
            let got = runtime.block_on(async {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                for i in 0..1_000 {
                    tx.send(i).expect("open");
                }
                drop(tx);
                let mut map = ReadyMap::new();
                map.insert("k", Budgeted(rx));
                let mut got = 0;
                while std::future::poll_fn(|cx| map.poll_next_item(cx))
                    .await
                    .is_some()
                {
                    got += 1;
                }
                got
            });
            let _ = done_tx.send(got);
        });
        let got = done_rx
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("the map returned to its task and read every item");
        assert_eq!(got, 1_000);
    }

    /// Answers `Pending` and wakes its own waker at its first poll, then yields `7`.
    struct WakesOnce(bool);

    impl Stream for WakesOnce {
        type Item = u32;
        fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<u32>> {
            if std::mem::replace(&mut self.0, true) {
                return Poll::Ready(Some(7));
            }
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    /// A waker that counts its wakes.
    struct CountingWaker(AtomicUsize);

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The map registers the task's waker only when it is about to answer `Pending`: a
    /// stream woken before that (here, during its own poll) must still be seen, either in
    /// the same call or through a wake of the task.
    #[test]
    fn a_wake_before_the_task_registers_is_not_lost() {
        let mut map = ReadyMap::new();
        map.insert("k", WakesOnce(false));
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        let got = map.poll_next_item(&mut Context::from_waker(&waker));
        assert!(
            got == Poll::Ready(Some(7)) || task.0.load(Ordering::Relaxed) > 0,
            "answered {got:?} and never woke the task"
        );
    }

    /// An item is handed back without the task's waker being registered (no atomic work
    /// on the path of every record); answering `Pending` registers it.
    #[test]
    fn the_task_is_registered_only_before_pending() {
        let mut map = ReadyMap::new();
        let (stream, _, tx) = counted();
        map.insert("k", stream);
        tx.unbounded_send(1).unwrap();
        let task = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let waker = Waker::from(task.clone());
        assert_eq!(
            map.poll_next_item(&mut Context::from_waker(&waker)),
            Poll::Ready(Some(1))
        );
        assert!(map.woken.parent.take().is_none(), "registered for an item");
        assert_eq!(
            map.poll_next_item(&mut Context::from_waker(&waker)),
            Poll::Pending
        );
        tx.unbounded_send(2).unwrap();
        assert_eq!(
            task.0.load(Ordering::Relaxed),
            1,
            "the task is woken by the stream"
        );
    }

    #[tokio::test]
    async fn a_wake_from_another_task_reaches_the_map() {
        let mut map = ReadyMap::new();
        let (stream, _, tx) = counted();
        map.insert("k", stream);
        let sender = tokio::spawn(async move {
            tokio::task::yield_now().await;
            tx.unbounded_send(5).unwrap();
            tx
        });
        let got = futures::future::poll_fn(|cx| map.poll_next_item(cx)).await;
        assert_eq!(got, Some(5));
        drop(sender.await.unwrap());
        let ended = futures::future::poll_fn(|cx| map.poll_next_item(cx)).await;
        assert_eq!(ended, None);
    }
}
