//! The in-process world and the harness's delivery accounting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use bytes::Bytes;
use ruststream::testing::{Backlog, Coordinator, InProcess, TestableBroker};
use ruststream::{OutgoingMessage, RawMessage};

use super::super::builder::KinesisBroker;
use super::super::connection::ConnectedKinesis;
use super::super::publisher::{PARTITION_KEY_HEADER, random_key};
use super::Taken;
use crate::api::MemoryKinesis;
use crate::error::KinesisError;
use crate::kpl::Unpacked;
use crate::lease::{MemoryLeaseStore, SharedLeaseStore};
use crate::record::Record;

/// The streams and leases every clone of one broker reaches in process.
pub(crate) struct World {
    pub(crate) kinesis: MemoryKinesis,
    pub(crate) store: SharedLeaseStore,
    pub(crate) accounting: Arc<Accounting>,
}

impl World {
    /// A world over `kinesis` (a fresh one unless the broker was built on one) whose stored
    /// records are counted for the harness.
    pub(crate) fn new(kinesis: MemoryKinesis, store: Option<SharedLeaseStore>) -> Self {
        let accounting = Arc::new(Accounting::default());
        let observer = Arc::downgrade(&accounting);
        kinesis.on_put(move |stream, record| {
            if let Some(accounting) = observer.upgrade() {
                accounting.stored(stream, record);
            }
        });
        Self {
            kinesis,
            store: store.unwrap_or_else(|| Arc::new(MemoryLeaseStore::new())),
            accounting,
        }
    }
}

/// Which deliveries the harness waits for, and the publish log it reads.
#[derive(Default)]
pub(crate) struct Accounting {
    /// The coordinator of the harness run now driving this world (the latest installed).
    coordinator: Mutex<Option<Coordinator>>,
    ledger: Mutex<Ledger>,
}

impl std::fmt::Debug for Accounting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Accounting")
            .field("coordinator", &self.coordinator().is_some())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Ledger {
    streams: HashMap<String, StreamLedger>,
    log: Vec<RawMessage>,
}

/// One stream's open subscriptions and the deliveries they owe the harness.
#[derive(Default)]
struct StreamLedger {
    open: usize,
    /// The subscription opened last hands out the user records of KPL aggregates.
    deaggregate: bool,
    /// Counted deliveries not yet handed out, by (shard, sequence number).
    owed: HashMap<(Arc<str>, String), u32>,
    /// Delayed redeliveries whose time has not come, with the subscriptions waiting on them.
    awaiting: HashMap<(Arc<str>, String), Vec<Waker>>,
}

/// A counted delivery: released to the harness once, when dropped.
#[derive(Debug)]
pub(crate) struct Counted(Coordinator);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.consumed();
    }
}

impl Accounting {
    fn ledger(&self) -> MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn coordinator(&self) -> Option<Coordinator> {
        self.coordinator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Installs the coordinator of a harness run. A world outlives a run when a test starts
    /// the app again on a clone of the broker (a restart): the new run's coordinator replaces
    /// the old one, and counting starts over from what is stored from now on.
    pub(crate) fn install(&self, coordinator: Coordinator) {
        let mut ledger = self.ledger();
        for entry in ledger.streams.values_mut() {
            entry.owed.clear();
        }
        *self
            .coordinator
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(coordinator);
    }

    /// A record was stored: logged, and counted once when a subscription of its stream is
    /// open (the one that holds the shard delivers it).
    ///
    /// A KPL aggregate is logged as its user records and counted as the deliveries it makes:
    /// one per readable user record when the subscription de-aggregates, none when it skips
    /// the aggregate.
    fn stored(&self, stream: &str, record: &Record) {
        let users: Option<Vec<Record>> = match crate::kpl::unpack(record) {
            Unpacked::Users(users) => Some(users.into_iter().filter_map(Result::ok).collect()),
            Unpacked::Plain | Unpacked::Malformed(_) => None,
        };
        let mut ledger = self.ledger();
        match &users {
            Some(users) => {
                let messages = users.iter().map(|user| logged(stream, user));
                ledger.log.extend(messages);
            }
            None => ledger.log.push(logged(stream, record)),
        }
        let Some(coordinator) = self.coordinator() else {
            return;
        };
        if let Some(entry) = ledger.streams.get_mut(stream)
            && entry.open > 0
        {
            let deliveries = match &users {
                None => 1,
                Some(users) if entry.deaggregate => users.len(),
                Some(_) => 0,
            };
            if deliveries == 0 {
                return;
            }
            *entry
                .owed
                .entry((
                    record.shard_id_shared().clone(),
                    record.sequence_number().to_owned(),
                ))
                .or_default() += u32::try_from(deliveries).unwrap_or(u32::MAX);
            (0..deliveries).for_each(|_| coordinator.enqueued());
        }
    }

    /// What the record about to be handed out is for the harness.
    pub(crate) fn take(&self, stream: &str, shard: &Arc<str>, seq: &str, waker: &Waker) -> Taken {
        let Some(coordinator) = self.coordinator() else {
            return Taken::Uncounted;
        };
        let mut ledger = self.ledger();
        let Some(entry) = ledger.streams.get_mut(stream) else {
            return Taken::Uncounted;
        };
        let key = (shard.clone(), seq.to_owned());
        if let Some(waiting) = entry.awaiting.get_mut(&key) {
            if !waiting.iter().any(|w| w.will_wake(waker)) {
                waiting.push(waker.clone());
            }
            return Taken::Park;
        }
        match entry.owed.get_mut(&key) {
            Some(n) if *n > 0 => {
                *n -= 1;
                if *n == 0 {
                    entry.owed.remove(&key);
                }
                Taken::Counted(Counted(coordinator))
            }
            _ => Taken::Uncounted,
        }
    }

    /// A delivery was sent back for another try now: counted again before this returns.
    pub(crate) fn requeued(&self, stream: &str, shard: &Arc<str>, seq: &str) {
        let Some(coordinator) = self.coordinator() else {
            return;
        };
        let mut ledger = self.ledger();
        if let Some(entry) = ledger.streams.get_mut(stream)
            && entry.open > 0
        {
            *entry
                .owed
                .entry((shard.clone(), seq.to_owned()))
                .or_default() += 1;
            coordinator.enqueued();
        }
    }

    /// A delivery was sent back for another try after `delay`: counted when the harness's
    /// timer falls due, and held back until then.
    pub(crate) fn requeue_after(
        self: &Arc<Self>,
        stream: &str,
        shard: &Arc<str>,
        seq: &str,
        delay: Duration,
    ) {
        let Some(coordinator) = self.coordinator() else {
            return;
        };
        let key = (shard.clone(), seq.to_owned());
        {
            let mut ledger = self.ledger();
            let Some(entry) = ledger.streams.get_mut(stream) else {
                return;
            };
            if entry.open == 0 {
                return;
            }
            entry.awaiting.entry(key.clone()).or_default();
        }
        let this = Arc::clone(self);
        let stream = stream.to_owned();
        coordinator.schedule_redelivery(delay, move || {
            let wakers = {
                let mut ledger = this.ledger();
                let Some(entry) = ledger.streams.get_mut(&stream) else {
                    return;
                };
                let wakers = entry.awaiting.remove(&key).unwrap_or_default();
                if entry.open > 0 {
                    *entry.owed.entry(key).or_default() += 1;
                    if let Some(coordinator) = this.coordinator() {
                        coordinator.enqueued();
                    }
                }
                wakers
            };
            wakers.into_iter().for_each(Waker::wake);
        });
    }

    /// A subscription of `stream` opened: records stored from now on are counted.
    pub(crate) fn opened(&self, stream: &str, deaggregate: bool) {
        let mut ledger = self.ledger();
        let entry = ledger.streams.entry(stream.to_owned()).or_default();
        entry.open += 1;
        entry.deaggregate = deaggregate;
    }

    /// A subscription of `stream` closed. When it was the last, what it still owed is
    /// released: nobody will deliver it in this run.
    pub(crate) fn closed(&self, stream: &str) {
        let (owed, wakers) = {
            let mut ledger = self.ledger();
            let Some(entry) = ledger.streams.get_mut(stream) else {
                return;
            };
            entry.open = entry.open.saturating_sub(1);
            if entry.open > 0 {
                return;
            }
            let owed: u32 = entry.owed.drain().map(|(_, n)| n).sum();
            let wakers: Vec<Waker> = entry.awaiting.drain().flat_map(|(_, w)| w).collect();
            (owed, wakers)
        };
        if let Some(coordinator) = self.coordinator() {
            (0..owed).for_each(|_| coordinator.consumed());
        }
        wakers.into_iter().for_each(Waker::wake);
    }

    /// What was stored in `stream`, in order.
    fn published(&self, stream: &str) -> Vec<RawMessage> {
        self.ledger()
            .log
            .iter()
            .filter(|m| m.name() == stream)
            .cloned()
            .collect()
    }
}

impl InProcess for KinesisBroker {
    /// Connects to the in-process world of this broker (created on first use and shared by
    /// its clones): an in-memory Kinesis (the one the broker was built on, if any) and an
    /// in-memory lease store, with the broker's own settings. See the
    /// [module docs](super) for what differs from a live connection.
    async fn connect_in_process(self) -> Result<ConnectedKinesis, KinesisError> {
        let world = self.world();
        self.connect_to_world(world).await
    }
}

impl TestableBroker for ConnectedKinesis {
    fn install_coordinator(&self, coordinator: Coordinator) {
        if let Some(accounting) = &self.inner.harness.accounting {
            accounting.install(coordinator);
        }
    }

    /// Writes the message as one record, the way a publish does (headers in the envelope, the
    /// `partition-key` header or a random key). A record the service would refuse (unknown
    /// stream, bad key, too large) is refused here too: logged, not stored, not delivered.
    ///
    /// # Panics
    ///
    /// On a connection that is not on the in-memory transport: there is nothing to inject
    /// into synchronously.
    fn inject(&self, message: OutgoingMessage<'_>) {
        let Some(kinesis) = &self.inner.harness.memory else {
            panic!(
                "inject needs the in-memory transport: connect the broker in process \
                 (TestApp::start) or build it with KinesisBroker::in_memory"
            );
        };
        let key = message
            .headers()
            .get(PARTITION_KEY_HEADER)
            .map_or_else(random_key, |k| String::from_utf8_lossy(k).into_owned());
        let (name, payload, headers) = message.into_parts();
        if let Err(reason) = super::super::envelope::check(&headers) {
            tracing::warn!(stream = name, reason, "injected message refused");
            return;
        }
        let data: Bytes = super::super::envelope::encode(&headers, payload);
        let result = match kinesis.put(name, &key, data.clone()) {
            // With `create_missing_streams`, a write may come first and create the stream
            // (with one shard, in process), as a publish does.
            Err(KinesisError::StreamNotFound { .. })
                if self.inner.create_missing_streams.is_some() =>
            {
                let _ = kinesis.add_stream(name, 1);
                kinesis.put(name, &key, data)
            }
            other => other,
        };
        if let Err(e) = result {
            tracing::warn!(stream = name, error = %e, "injected message refused");
        }
    }

    fn published(&self, name: &str) -> Vec<RawMessage> {
        self.inner
            .harness
            .accounting
            .as_ref()
            .map(|a| a.published(name))
            .unwrap_or_default()
    }

    /// A subscription by name opens at LATEST: what was written before it is not delivered.
    fn backlog(&self) -> Backlog {
        Backlog::Missed
    }
}

ruststream::register_testable_broker!(KinesisBroker);

/// The message a stored record (or a KPL user record) carries, as the publish log lists it.
fn logged(stream: &str, record: &Record) -> RawMessage {
    let (headers, offset) = super::super::envelope::decode(record.data());
    RawMessage::new(stream.to_owned(), record.data().slice(offset..)).with_headers(headers)
}
