//! Lease-table writes whose outcome is unknown, as a matrix: every kind of write (take, renew,
//! checkpoint, SHARD_END, release, worker-row write and delete, roster move) is applied and
//! then answered with a timeout, a 5xx, the lost condition of the SDK's retry, or late, while
//! two instances share a stream that records flow into, that is split, and that one instance
//! leaves gracefully. In every cell: nothing is lost, no shard is read by two instances at
//! once, no record waits longer than the lease duration plus the listing interval (with an
//! allowance for a loaded machine) to be read, and no stop or sink close hangs. On the
//! in-memory transport and lease store, whose writes the layer of `support::unknown` answers.
//!
//! One test per kind of write, each running the four answers.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::subscription::ShutdownHandle;
use kinesis_dataflow::{KinesisPosition, MemoryKinesis, MemoryLeaseStore};
use kinesis_dataflow_test_support::timings::{LEASE_DURATION, LIST_INTERVAL};
use support::reading::{Log, Seen, log_until_end as run};
use support::unknown::{Answer, Takes, Unknown, Write};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const STREAM: &str = "uncertain";
const RECORDS: usize = 240;
/// A hang guard for each step.
const PATIENCE: Duration = Duration::from_secs(30);

/// How often a write of `kind` is answered badly: every one for the writes that happen a few
/// times in a run, every third for the periodic ones (answering every renewal badly would be
/// a lease table that never works, another fault).
fn every(kind: Write) -> u64 {
    match kind {
        Write::Renew | Write::Checkpoint | Write::WorkerRow => 3,
        _ => 1,
    }
}

/// Holder changes of each shard: the runs of one instance in the time order of deliveries.
fn runs(log: &[Seen]) -> BTreeMap<String, u64> {
    let mut by_shard: BTreeMap<String, Vec<&Seen>> = BTreeMap::new();
    for seen in log {
        by_shard.entry(seen.shard.clone()).or_default().push(seen);
    }
    by_shard
        .into_iter()
        .map(|(shard, mut seen)| {
            seen.sort_by_key(|s| s.at);
            let changes = seen
                .windows(2)
                .filter(|w| w[0].instance != w[1].instance)
                .count();
            (shard, changes as u64 + 1)
        })
        .collect()
}

/// When each record was written, by payload.
type Written = Arc<Mutex<BTreeMap<String, Instant>>>;

/// The stream, lease table and layers of one cell.
struct Cell {
    what: String,
    memory: MemoryKinesis,
    api: SharedKinesis,
    table: MemoryLeaseStore,
    takes: Takes,
    layer_a: Arc<Unknown>,
    layer_b: Arc<Unknown>,
    log: Log,
}

impl Cell {
    /// A 2-shard in-memory stream and lease table; each instance's writes of `kind` answered
    /// with `answer` by a layer of its own.
    fn new(kind: Write, answer: Answer) -> Self {
        let memory = MemoryKinesis::new();
        memory.add_stream(STREAM, 2).unwrap();
        let api: SharedKinesis = Arc::new(memory.clone());
        let takes: Takes = Arc::default();
        let layer = |_: &str| Arc::new(Unknown::new(kind, answer, every(kind), takes.clone()));
        let (layer_a, layer_b) = (layer("a"), layer("b"));
        Self {
            what: format!("{kind:?} answered {answer:?}"),
            memory,
            api,
            table: MemoryLeaseStore::new(),
            takes,
            layer_a,
            layer_b,
            log: Arc::default(),
        }
    }

    /// Starts an instance through `layer` and reads it into the log until it ends.
    async fn start(
        &self,
        owner: &'static str,
        layer: &Arc<Unknown>,
    ) -> (ShutdownHandle, JoinHandle<()>) {
        let sub = support::reading::fast(
            &self.api,
            layer.store(Arc::new(self.table.clone())),
            STREAM,
            owner,
        )
        .initial_position(KinesisPosition::horizon())
        .shutdown_timeout(LEASE_DURATION * 2)
        .start()
        .await
        .unwrap();
        let stop = sub.shutdown_handle();
        (stop, tokio::spawn(run(sub, owner, self.log.clone())))
    }

    /// Records flow from here on, each noted with when it was written; the stream is split a
    /// third of the way through.
    fn start_producer(&self, written: Written) -> JoinHandle<()> {
        let memory = self.memory.clone();
        tokio::spawn(async move {
            for i in 0..RECORDS {
                let payload = format!("p{i:04}");
                written
                    .lock()
                    .unwrap()
                    .insert(payload.clone(), Instant::now());
                memory
                    .put(STREAM, &format!("key-{}", i % 8), payload)
                    .unwrap();
                if i == RECORDS / 3 {
                    let middle = (u128::MAX / 4).to_string();
                    memory
                        .split_shard(STREAM, "shardId-000000000000", &middle)
                        .await
                        .unwrap();
                }
                tokio::time::sleep(Duration::from_millis(6)).await;
            }
        })
    }

    /// Stops an instance; neither its stop nor its stream's end hangs.
    async fn stop(&self, name: &str, (stop, run): (ShutdownHandle, JoinHandle<()>)) {
        let what = &self.what;
        tokio::time::timeout(PATIENCE, stop.shutdown())
            .await
            .unwrap_or_else(|_| panic!("{what}: {name}'s stop hangs"));
        tokio::time::timeout(PATIENCE, run)
            .await
            .unwrap_or_else(|_| panic!("{what}: {name}'s stream does not end"))
            .unwrap();
    }

    /// Nothing lost: every written record is read (within [`PATIENCE`]). Returns the log.
    async fn every_record_is_read(&self, written: &Written) -> Vec<Seen> {
        let all: BTreeSet<String> = written.lock().unwrap().keys().cloned().collect();
        let done = tokio::time::timeout(PATIENCE, async {
            loop {
                let seen: BTreeSet<String> = self
                    .log
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|s| s.payload.clone())
                    .collect();
                if all.is_subset(&seen) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        let log_now = self.log.lock().unwrap().clone();
        let seen: BTreeSet<String> = log_now.iter().map(|s| s.payload.clone()).collect();
        let missing: Vec<&String> = all.difference(&seen).collect();
        assert!(
            done.is_ok(),
            "{}: records never read: {missing:?}",
            self.what
        );
        log_now
    }

    /// No shard read by two instances at once: each holder change needs a take.
    fn assert_no_shard_read_by_two_at_once(&self, log: &[Seen]) {
        let what = &self.what;
        let takes = self.takes.lock().unwrap().clone();
        for (shard, runs) in runs(log) {
            let taken = takes.get(&shard).copied().unwrap_or(0);
            assert!(
                runs <= taken,
                "{what}: {shard} changed hands {runs} times in the deliveries but was taken {taken} times: read by two at once"
            );
        }
    }
}

/// No record waited longer than the lease duration plus the listing interval to be read
/// (twice that, for a loaded machine). Returns the slowest wait.
fn assert_no_record_waits_too_long(what: &str, written: &Written, log: &[Seen]) -> Duration {
    let bound = (LEASE_DURATION + LIST_INTERVAL) * 2;
    let written = written.lock().unwrap().clone();
    let mut first: BTreeMap<&str, Instant> = BTreeMap::new();
    for s in log {
        first.entry(&s.payload).or_insert(s.at);
    }
    let slowest = written
        .iter()
        .map(|(payload, at)| {
            (
                first[payload.as_str()].saturating_duration_since(*at),
                payload,
            )
        })
        .max()
        .unwrap();
    assert!(
        slowest.0 <= bound,
        "{what}: {} waited {:?} to be read (bound {bound:?})",
        slowest.1,
        slowest.0
    );
    slowest.0
}

/// One cell: two instances, records flowing, a split, one instance leaving.
async fn cell(kind: Write, answer: Answer) {
    let cell = Cell::new(kind, answer);
    let a = cell.start("a", &cell.layer_a).await;
    let written: Written = Arc::default();
    let producer = cell.start_producer(written.clone());
    tokio::time::sleep(LIST_INTERVAL).await;
    let b = cell.start("b", &cell.layer_b).await;

    // A leaves while records flow.
    tokio::time::sleep(Duration::from_millis(RECORDS as u64 * 4)).await;
    cell.stop("A", a).await;
    producer.await.unwrap();

    // B reads the rest.
    let log = cell.every_record_is_read(&written).await;
    let what = &cell.what;
    let (stop_b, run_b) = b;
    tokio::time::timeout(PATIENCE, stop_b.shutdown())
        .await
        .unwrap_or_else(|_| panic!("{what}: B's stop hangs"));
    run_b.await.unwrap();

    let injected = cell.layer_a.injected() + cell.layer_b.injected();
    assert!(injected > 0, "{what}: the fault never happened");
    cell.assert_no_shard_read_by_two_at_once(&log);
    let slowest = assert_no_record_waits_too_long(what, &written, &log);
    eprintln!(
        "{what}: {injected} answers lost or late, {} deliveries of {RECORDS} records, slowest read {:?}",
        log.len(),
        slowest
    );
}

async fn every_answer(kind: Write) {
    // Late within the call timeout (a third of the lease duration); later is a timeout.
    for answer in Answer::all(LEASE_DURATION / 6) {
        cell(kind, answer).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takes_whose_outcome_is_unknown() {
    every_answer(Write::Take).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_whose_outcome_is_unknown() {
    every_answer(Write::Renew).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_whose_outcome_is_unknown() {
    every_answer(Write::Checkpoint).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_ends_whose_outcome_is_unknown() {
    every_answer(Write::ShardEnd).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_whose_outcome_is_unknown() {
    every_answer(Write::Release).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_row_writes_whose_outcome_is_unknown() {
    every_answer(Write::WorkerRow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_row_deletes_whose_outcome_is_unknown() {
    every_answer(Write::WorkerDelete).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn roster_moves_whose_outcome_is_unknown() {
    every_answer(Write::RosterMove).await;
}

/// One instance whose `kind` writes are answered with `answer` now and then keeps every lease
/// it took: the next write finds the row still naming it and carries on, instead of reading
/// the lost answer as another instance's take and dropping the shard. Returns the takes of
/// each shard.
async fn keeps_its_leases(kind: Write, answer: Answer) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 2).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let takes: Takes = Arc::default();
    let layer = Arc::new(Unknown::new(kind, answer, 3, takes.clone()));
    let sub = support::reading::fast(
        &api,
        layer.store(Arc::new(MemoryLeaseStore::new())),
        STREAM,
        "a",
    )
    .initial_position(KinesisPosition::horizon())
    .start()
    .await
    .unwrap();
    let stop = sub.shutdown_handle();
    let log: Log = Arc::default();
    let running = tokio::spawn(run(sub, "a", log.clone()));
    for i in 0..100 {
        memory
            .put(STREAM, &format!("key-{}", i % 8), format!("p{i:04}"))
            .unwrap();
        tokio::time::sleep(LEASE_DURATION / 30).await;
    }
    let what = format!("{kind:?} answered {answer:?}");
    // Every record read (a hang guard, not a timing).
    let all_read = tokio::time::timeout(PATIENCE, async {
        while log.lock().unwrap().len() < 100 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(all_read.is_ok(), "{what}: records never read");
    tokio::time::timeout(PATIENCE, stop.shutdown())
        .await
        .expect("the stop ends");
    running.await.unwrap();
    assert!(
        layer.injected() >= 2,
        "{what}: the fault happened only {} times",
        layer.injected()
    );
    let takes = takes.lock().unwrap().clone();
    assert_eq!(
        takes.values().copied().collect::<Vec<_>>(),
        vec![1, 1],
        "{what}: each shard taken once and kept: {takes:?}"
    );
    assert_eq!(log.lock().unwrap().len(), 100, "{what}: each record once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_write_outcome_was_unknown_keeps_its_leases() {
    for kind in [Write::Renew, Write::Checkpoint, Write::WorkerRow] {
        for answer in [Answer::Timeout, Answer::RetriedLost] {
            keeps_its_leases(kind, answer).await;
        }
    }
}
