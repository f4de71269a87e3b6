//! The machinery of `tests/fleet_simulation.rs` (included there with `#[path]`, so the other
//! tests' `support` module does not carry it): a fleet of subscription instances on one
//! in-memory stream and one in-memory lease table, each instance with a lease store of its own
//! that counts what it asks of the shared table, and a journal of every record written, every
//! delivery and every successful take of a shard lease.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::{ShardDescription, SharedKinesis};
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{Lease, LeaseFuture, LeaseStore};
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::subscription::ShutdownHandle;
use kinesis_dataflow::{KinesisPosition, MemoryKinesis, MemoryLeaseStore, Record, Subscription};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::table_cost::{item_bytes, neighbour, units};

/// The stream every instance reads.
pub const STREAM: &str = "fleet";

/// The lease-store operations, in the report's order.
pub const OPERATIONS: [&str; 9] = [
    "prepare",
    "list",
    "get",
    "create",
    "take",
    "renew",
    "checkpoint",
    "release",
    "delete",
];

/// The prefix of the rows that stand for instances rather than shards.
const WORKER_PREFIX: &str = "worker:";

// ------------------------------------------------------------------------------------------
// Counting
// ------------------------------------------------------------------------------------------

/// What one instance asked of the lease table, at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct Counts {
    /// Calls, by operation ([`OPERATIONS`]).
    pub calls: [u64; 9],
    /// Rows returned by `list` and `get`.
    pub rows_read: u64,
    /// Rows written: successful creates, takes, renewals, checkpoints, releases, deletes.
    pub rows_written: u64,
    /// Read units (thousandths) the listings would cost in a table keyed by stream (a Query).
    pub query_units: u64,
    /// The same in a single-key table, whose listing scans every stream's rows.
    pub scan_units: u64,
    /// Read units (thousandths) of `get` (the watch), the same in either layout.
    pub get_units: u64,
}

impl Counts {
    /// Every call.
    pub fn total_calls(&self) -> u64 {
        self.calls.iter().sum()
    }

    /// What was asked between `before` and `self`.
    pub fn since(&self, before: &Counts) -> Counts {
        Counts {
            calls: std::array::from_fn(|i| self.calls[i] - before.calls[i]),
            rows_read: self.rows_read - before.rows_read,
            rows_written: self.rows_written - before.rows_written,
            query_units: self.query_units - before.query_units,
            scan_units: self.scan_units - before.scan_units,
            get_units: self.get_units - before.get_units,
        }
    }
}

/// The live counters behind [`Counts`].
#[derive(Debug, Default)]
pub struct Tally {
    calls: [AtomicU64; 9],
    rows_read: AtomicU64,
    rows_written: AtomicU64,
    query_units: AtomicU64,
    scan_units: AtomicU64,
    get_units: AtomicU64,
}

impl Tally {
    /// The counts now.
    pub fn counts(&self) -> Counts {
        Counts {
            calls: std::array::from_fn(|i| self.calls[i].load(Ordering::Relaxed)),
            rows_read: self.rows_read.load(Ordering::Relaxed),
            rows_written: self.rows_written.load(Ordering::Relaxed),
            query_units: self.query_units.load(Ordering::Relaxed),
            scan_units: self.scan_units.load(Ordering::Relaxed),
            get_units: self.get_units.load(Ordering::Relaxed),
        }
    }
}

fn bump(counter: &AtomicU64, by: usize) {
    counter.fetch_add(by as u64, Ordering::Relaxed);
}

/// The layer in front of one instance's store: counts every call, every successful write
/// (but creates, whose answer it cannot read: see [`RowCounter`]), and journals every
/// successful take of a shard lease with the holder it was taken from.
struct Counter {
    instance: u16,
    tally: Arc<Tally>,
    journal: Arc<Journal>,
}

impl LeaseLayer for Counter {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let operation = OPERATIONS.iter().position(|o| *o == call.name());
        bump(&self.tally.calls[operation.unwrap_or(0)], 1);
        let take = match call {
            LeaseCall::Take { lease, .. } if !lease.shard_id.starts_with(WORKER_PREFIX) => {
                Some((lease.shard_id.clone(), lease.owner.clone()))
            }
            LeaseCall::Take { .. }
            | LeaseCall::Renew { .. }
            | LeaseCall::Checkpoint { .. }
            | LeaseCall::Release { .. }
            | LeaseCall::Delete { .. } => None,
            _ => return next,
        };
        Box::pin(async move {
            let answer = next.await;
            if answer.is_ok() {
                bump(&self.tally.rows_written, 1);
                if let Some((shard, from)) = take {
                    self.journal.taken(self.instance, &shard, from);
                }
            }
            answer
        })
    }
}

/// Between the layer and the shared table: counts what a layer cannot see, as it only knows
/// that an answer is `Ok` and not what it holds: the rows `list` and `get` return (and what
/// they would cost in DynamoDB), and whether a `create` added a row.
struct RowCounter {
    table: MemoryLeaseStore,
    tally: Arc<Tally>,
    /// The size of the other streams' rows in a single-key table, which its Scan reads too.
    neighbour_bytes: usize,
}

impl RowCounter {
    fn listed<'a>(&'a self, rows: LeaseFuture<'a, Vec<Lease>>) -> LeaseFuture<'a, Vec<Lease>> {
        Box::pin(async move {
            let rows = rows.await?;
            bump(&self.tally.rows_read, rows.len());
            let bytes = |single_key| rows.iter().map(|r| item_bytes(r, single_key)).sum();
            let scanned: usize = bytes(true) + self.neighbour_bytes;
            self.tally
                .query_units
                .fetch_add(units(bytes(false)), Ordering::Relaxed);
            self.tally
                .scan_units
                .fetch_add(units(scanned), Ordering::Relaxed);
            Ok(rows)
        })
    }

    fn got<'a>(&'a self, rows: LeaseFuture<'a, Vec<Lease>>) -> LeaseFuture<'a, Vec<Lease>> {
        Box::pin(async move {
            let rows = rows.await?;
            bump(&self.tally.rows_read, rows.len());
            // Each item is charged on its own, rounded up to 4 KB: a unit in either layout.
            let cost: u64 = rows.iter().map(|r| units(item_bytes(r, true))).sum();
            self.tally.get_units.fetch_add(cost, Ordering::Relaxed);
            Ok(rows)
        })
    }
}

impl LeaseStore for RowCounter {
    fn prepare(&self) -> LeaseFuture<'_, ()> {
        self.table.prepare()
    }

    fn list<'a>(&'a self, stream: &'a str) -> LeaseFuture<'a, Vec<Lease>> {
        self.listed(self.table.list(stream))
    }

    fn get<'a>(&'a self, stream: &'a str, ids: &'a [String]) -> LeaseFuture<'a, Vec<Lease>> {
        self.got(self.table.get(stream, ids))
    }

    fn create<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, bool> {
        Box::pin(async move {
            let created = self.table.create(lease).await?;
            bump(&self.tally.rows_written, usize::from(created));
            Ok(created)
        })
    }

    fn take<'a>(&'a self, lease: &'a Lease, owner: &'a str) -> LeaseFuture<'a, Lease> {
        self.table.take(lease, owner)
    }

    fn renew<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        self.table.renew(lease)
    }

    fn checkpoint<'a>(
        &'a self,
        lease: &'a Lease,
        checkpoint: &'a Checkpoint,
    ) -> LeaseFuture<'a, Lease> {
        self.table.checkpoint(lease, checkpoint)
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        self.table.release(lease)
    }

    fn delete<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, ()> {
        self.table.delete(lease)
    }

    fn replace<'a>(&'a self, old: &'a Lease, new: &'a Lease) -> LeaseFuture<'a, Lease> {
        self.table.replace(old, new)
    }
}

// ------------------------------------------------------------------------------------------
// The journal
// ------------------------------------------------------------------------------------------

/// One record written, as `put` answered. Its data is its index in [`Log::written`].
#[derive(Debug)]
pub struct Written {
    /// The shard it went to.
    pub shard: Arc<str>,
    /// Its sequence number (every one has the same length, so they compare as strings).
    pub sequence_number: Box<str>,
    /// Its partition key is `pk-{key}`.
    pub key: u32,
}

/// One delivery, acked at once.
#[derive(Debug, Clone, Copy)]
pub struct Delivered {
    /// When (virtual time).
    pub at: Instant,
    /// Which instance delivered it.
    pub instance: u16,
    /// Which record ([`Log::written`]), and so which shard, sequence number and key.
    pub record: u32,
}

/// One successful take of a shard lease.
#[derive(Debug, Clone)]
pub struct Taken {
    /// When (virtual time).
    pub at: Instant,
    /// Who took it.
    pub instance: u16,
    /// The shard.
    pub shard: Arc<str>,
    /// Its holder as the taker saw it (the take is conditional on it), `None` when free.
    pub from: Option<String>,
    /// How many deliveries were journaled before it: it came after `delivered[..after]` and
    /// before `delivered[after..]`.
    pub after: usize,
}

/// Everything journaled, in the order it happened (one thread runs the whole fleet).
#[derive(Debug, Default)]
pub struct Log {
    /// The records written.
    pub written: Vec<Written>,
    /// The deliveries.
    pub delivered: Vec<Delivered>,
    /// The successful takes of shard leases.
    pub taken: Vec<Taken>,
    /// When each shard was first delivered from.
    pub first_read: HashMap<Arc<str>, Instant>,
    /// How many times each record was delivered.
    pub times: Vec<u8>,
    /// How many records were delivered at least once.
    pub distinct: usize,
    /// Deliveries whose shard or sequence number differ from what `put` answered.
    pub mismatched: u64,
    /// Errors the subscriptions yielded.
    pub errors: u64,
    shards: HashMap<String, Arc<str>>,
}

/// The shared journal.
#[derive(Debug, Default)]
pub struct Journal(Mutex<Log>);

impl Journal {
    /// The log.
    pub fn lock(&self) -> MutexGuard<'_, Log> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn written(&self, shard: String, sequence_number: String, key: u32) {
        let mut log = self.lock();
        let shard = match log.shards.get(&shard) {
            Some(interned) => interned.clone(),
            None => {
                let interned: Arc<str> = shard.clone().into();
                log.shards.insert(shard, interned.clone());
                interned
            }
        };
        let sequence_number = sequence_number.into_boxed_str();
        log.written.push(Written {
            shard,
            sequence_number,
            key,
        });
        log.times.push(0);
    }

    fn delivered(&self, instance: u16, record: &Record) {
        let index = std::str::from_utf8(record.data())
            .ok()
            .and_then(|d| d.parse::<u32>().ok());
        let mut log = self.lock();
        let at = Instant::now();
        let written = index.and_then(|i| log.written.get(i as usize));
        let matches = written.is_some_and(|w| {
            *w.shard == *record.shard_id() && *w.sequence_number == *record.sequence_number()
        });
        let (Some(index), true) = (index, matches) else {
            log.mismatched += 1;
            return;
        };
        let times = &mut log.times[index as usize];
        *times = times.saturating_add(1);
        if *times == 1 {
            log.distinct += 1;
        }
        log.delivered.push(Delivered {
            at,
            instance,
            record: index,
        });
        if !log.first_read.contains_key(record.shard_id()) {
            log.first_read.insert(record.shard_id_shared().clone(), at);
        }
    }

    fn taken(&self, instance: u16, shard: &str, from: Option<String>) {
        let mut log = self.lock();
        let after = log.delivered.len();
        let shard = log
            .shards
            .get(shard)
            .cloned()
            .unwrap_or_else(|| shard.into());
        log.taken.push(Taken {
            at: Instant::now(),
            instance,
            shard,
            from,
            after,
        });
    }
}

// ------------------------------------------------------------------------------------------
// Instances
// ------------------------------------------------------------------------------------------

/// The owner id of instance `index`.
pub fn owner(index: u16) -> String {
    format!("i{index:02}")
}

/// The instance index of an owner id.
pub fn index_of(owner: &str) -> Option<u16> {
    owner.strip_prefix('i')?.parse().ok()
}

/// One running subscription, with a task acking every delivery at once.
pub struct Instance {
    /// Its owner id.
    pub owner: String,
    /// What it asked of the lease table.
    pub tally: Arc<Tally>,
    /// False once crashed or asked to leave.
    pub live: bool,
    /// The takes journaled while it started ([`Log::taken`] indices): its own among them are
    /// the shards it opened with, which `start_at` reads from the start position whatever
    /// their checkpoints say.
    pub start_takes: Range<usize>,
    handle: ShutdownHandle,
    crash: Option<oneshot::Sender<()>>,
    reader: Option<JoinHandle<()>>,
    leaving: Option<JoinHandle<()>>,
}

impl Instance {
    /// Starts instance `index` with the default settings, every shard from the oldest record.
    async fn start(
        api: &SharedKinesis,
        (table, neighbour_bytes): (&MemoryLeaseStore, usize),
        journal: &Arc<Journal>,
        index: u16,
    ) -> Instance {
        let tally = Arc::new(Tally::default());
        let rows = RowCounter {
            table: table.clone(),
            tally: tally.clone(),
            neighbour_bytes,
        };
        let counter = Counter {
            instance: index,
            tally: tally.clone(),
            journal: journal.clone(),
        };
        let store = Arc::new(LayeredStore::new(Arc::new(rows), counter));
        let owner = owner(index);
        let sub = Subscription::builder(api.clone(), store, STREAM)
            .owner(owner.clone())
            .start_at(KinesisPosition::horizon())
            .start()
            .await
            .expect("an instance starts");
        let handle = sub.shutdown_handle();
        let (crash, crashed) = oneshot::channel();
        let reader = tokio::spawn(read(sub, crashed, journal.clone(), index));
        Instance {
            owner,
            tally,
            live: true,
            start_takes: 0..0,
            handle,
            crash: Some(crash),
            reader: Some(reader),
            leaving: None,
        }
    }

    /// Stops as a killed process would (`Subscription::abort`).
    pub async fn crash(&mut self) {
        self.live = false;
        if let Some(crash) = self.crash.take() {
            let _ = crash.send(());
        }
        if let Some(reader) = self.reader.take() {
            reader.await.expect("the reader ends");
        }
    }

    /// Starts a graceful stop (`ShutdownHandle::shutdown`) and returns at once; the reader
    /// goes on acking until its stream ends.
    pub fn leave(&mut self) {
        self.live = false;
        let handle = self.handle.clone();
        self.leaving = Some(tokio::spawn(async move { handle.shutdown().await }));
    }

    /// True once a graceful stop finished (its checkpoints flushed, its leases released).
    pub fn has_left(&self) -> bool {
        self.leaving.as_ref().is_some_and(JoinHandle::is_finished) && self.handle.is_stopped()
    }
}

/// Reads and acks every delivery until the stream ends or the instance crashes.
async fn read(
    mut sub: Subscription,
    mut crashed: oneshot::Receiver<()>,
    journal: Arc<Journal>,
    index: u16,
) {
    loop {
        tokio::select! {
            item = sub.next() => match item {
                Some(Ok(delivery)) => {
                    journal.delivered(index, &delivery);
                    delivery.ack();
                }
                Some(Err(_)) => journal.lock().errors += 1,
                None => return,
            },
            _ = &mut crashed => {
                sub.abort();
                return;
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// The fleet
// ------------------------------------------------------------------------------------------

/// Who holds what, as the lease table says.
#[derive(Debug)]
pub struct Holdings {
    /// The shards to share: rows not finished whose parents are finished (or gone).
    pub eligible: usize,
    /// Eligible shards no live instance holds.
    pub unheld: usize,
    /// Eligible shards held, per live instance.
    pub held: BTreeMap<String, usize>,
}

impl Holdings {
    /// The mean share.
    pub fn mean(&self) -> f64 {
        self.eligible as f64 / self.held.len().max(1) as f64
    }

    /// Every eligible shard held by a live instance, and every share the mean rounded down or
    /// up (within one of it: the largest and the smallest share differ by one at most).
    pub fn is_fair(&self) -> bool {
        let mean = self.mean();
        let (low, high) = (mean.floor() as usize, mean.ceil() as usize);
        self.unheld == 0 && self.held.values().all(|h| (low..=high).contains(h))
    }

    /// `fair` or what is not, with the shares.
    pub fn describe(&self) -> String {
        let shares: Vec<usize> = self.held.values().copied().collect();
        let (min, max) = (
            shares.iter().min().copied().unwrap_or(0),
            shares.iter().max().copied().unwrap_or(0),
        );
        format!(
            "{} eligible, mean {:.2}, shares {min}..{max}, {} unheld",
            self.eligible,
            self.mean(),
            self.unheld
        )
    }

    /// Every share, by owner.
    pub fn shares(&self) -> String {
        let shares: Vec<String> = self.held.iter().map(|(o, h)| format!("{o}:{h}")).collect();
        shares.join(" ")
    }
}

/// The stream, the lease table, the instances and the writer.
pub struct Fleet {
    /// The stream's store, for writing and resharding.
    pub memory: MemoryKinesis,
    /// The same store as every instance sees it.
    pub api: SharedKinesis,
    /// The shared lease table, read here without counting.
    pub table: MemoryLeaseStore,
    /// Writes, deliveries, takes.
    pub journal: Arc<Journal>,
    /// Every instance started, crashed and left ones included.
    pub instances: Vec<Instance>,
    /// When the simulation began.
    pub began: Instant,
    /// The size of the other streams' rows in the table, as single-key rows.
    pub neighbour_bytes: usize,
    writer: Option<JoinHandle<()>>,
}

impl Fleet {
    /// A stream of `shards` shards and an empty lease table.
    pub fn new(shards: u32) -> Fleet {
        let memory = MemoryKinesis::new();
        memory.add_stream(STREAM, shards).expect("the stream");
        Fleet {
            api: Arc::new(memory.clone()),
            memory,
            table: MemoryLeaseStore::new(),
            journal: Arc::default(),
            instances: Vec::new(),
            began: Instant::now(),
            neighbour_bytes: 0,
            writer: None,
        }
    }

    /// Fills the table with `streams` other streams of `shards` idle, held rows each, as other
    /// streams of the same application share it: a listing of the fleet's stream must not see
    /// them, and a single-key table's Scan would read them all.
    pub async fn add_neighbours(&mut self, streams: u32, shards: u32) {
        for s in 0..streams {
            for shard in 0..shards {
                let row = neighbour(&format!("neighbour-{s:02}"), shard);
                assert!(self.table.create(&row).await.expect("a neighbour row"));
                self.neighbour_bytes += item_bytes(&row, true);
            }
        }
    }

    /// Writes `per_second` records a second, ten times a second, with `keys` partition keys
    /// taken in turn, until [`stop_writing`](Self::stop_writing).
    pub fn write_steadily(&mut self, per_second: u32, keys: u32) {
        let memory = self.memory.clone();
        let journal = self.journal.clone();
        self.writer = Some(tokio::spawn(async move {
            let mut ticks = tokio::time::interval(Duration::from_millis(100));
            ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut next: u32 = 0;
            loop {
                ticks.tick().await;
                for _ in 0..per_second.div_ceil(10) {
                    let key = next % keys;
                    let (shard, sequence_number) = memory
                        .put(STREAM, &format!("pk-{key}"), next.to_string())
                        .expect("a record is written");
                    journal.written(shard, sequence_number, key);
                    next += 1;
                }
            }
        }));
    }

    /// Stops the writer.
    pub fn stop_writing(&mut self) {
        if let Some(writer) = self.writer.take() {
            writer.abort();
        }
    }

    /// Starts one more instance; returns its index.
    pub async fn join(&mut self) -> usize {
        let index = u16::try_from(self.instances.len()).expect("a few instances");
        let before = self.journal.lock().taken.len();
        let table = (&self.table, self.neighbour_bytes);
        let mut instance = Instance::start(&self.api, table, &self.journal, index).await;
        instance.start_takes = before..self.journal.lock().taken.len();
        self.instances.push(instance);
        usize::from(index)
    }

    /// The owner ids of the live instances.
    pub fn live(&self) -> BTreeSet<String> {
        self.instances
            .iter()
            .filter(|i| i.live)
            .map(|i| i.owner.clone())
            .collect()
    }

    /// Every instance's counts now, by index.
    pub fn counts(&self) -> Vec<Counts> {
        self.instances.iter().map(|i| i.tally.counts()).collect()
    }

    /// Who holds what now (read from the table directly, so not counted).
    pub async fn holdings(&self) -> Holdings {
        let rows = self.table.list(STREAM).await.expect("the table lists");
        let finished: BTreeSet<&str> = rows
            .iter()
            .filter(|r| r.is_finished())
            .map(|r| r.shard_id.as_str())
            .collect();
        let present: BTreeSet<&str> = rows.iter().map(|r| r.shard_id.as_str()).collect();
        let eligible = rows.iter().filter(|r| {
            !r.shard_id.starts_with(WORKER_PREFIX)
                && !r.is_finished()
                && r.parents
                    .iter()
                    .all(|p| finished.contains(p.as_str()) || !present.contains(p.as_str()))
        });
        let live = self.live();
        let mut held: BTreeMap<String, usize> = live.iter().map(|o| (o.clone(), 0)).collect();
        let (mut count, mut unheld) = (0, 0);
        for row in eligible {
            count += 1;
            match row.owner.as_ref().and_then(|o| held.get_mut(o)) {
                Some(share) => *share += 1,
                None => unheld += 1,
            }
        }
        Holdings {
            eligible: count,
            unheld,
            held,
        }
    }

    /// Every shard of the stream, as ListShards gives them.
    pub async fn shards(&self) -> Vec<ShardDescription> {
        let mut shards = Vec::new();
        let mut token = None;
        loop {
            let page = self
                .api
                .list_shards(STREAM, token)
                .await
                .expect("the shards list");
            shards.extend(page.shards);
            token = page.next_token;
            if token.is_none() {
                return shards;
            }
        }
    }
}

/// Waits (checking every quarter of a second) until `done`; how long it took, or `None` after
/// `within`.
pub async fn until(within: Duration, done: impl Fn() -> bool) -> Option<Duration> {
    let began = Instant::now();
    while !done() {
        if began.elapsed() >= within {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Some(began.elapsed())
}

/// A shard id's short form for messages (`shardId-000000000042` is `s42`).
pub fn short(shard: &str) -> String {
    let digits = shard.trim_start_matches("shardId-").trim_start_matches('0');
    format!("s{}", if digits.is_empty() { "0" } else { digits })
}
