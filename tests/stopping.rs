//! The life cycle's end on the in-memory transport and lease store: a graceful stop that the
//! stream's end stands for (nothing left to write once it ends), a stop with slow handlers
//! while another instance waits, and waits on durability that must end when the lease is
//! gone instead of hanging, and say why.

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{Lease, LeaseError, LeaseFuture, LeaseStore, SharedLeaseStore};
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    AckSink, Delivery, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore,
    OutgoingRecord, Publisher, Record, Subscription, SubscriptionBuilder,
};

const STREAM: &str = "life";
/// Enough for any step here; a hang is reported instead of waited for.
const PATIENCE: Duration = Duration::from_secs(30);

fn setup(shards: u32, records: usize) -> (MemoryKinesis, SharedKinesis, MemoryLeaseStore) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, shards).unwrap();
    support::reading::write_tagged(&memory, STREAM, "r", 0, records, 8);
    (memory.clone(), Arc::new(memory), MemoryLeaseStore::new())
}

fn builder(api: &SharedKinesis, store: &MemoryLeaseStore, owner: &str) -> SubscriptionBuilder {
    support::reading::fast(api, Arc::new(store.clone()), STREAM, owner)
        .initial_position(KinesisPosition::horizon())
}

async fn next(sub: &mut Subscription) -> Delivery<Record> {
    loop {
        match tokio::time::timeout(PATIENCE, sub.next()).await {
            Ok(Some(Ok(d))) => return d,
            Ok(Some(Err(e))) => eprintln!("read error (retried): {e}"),
            other => panic!("expected a delivery, got {other:?}"),
        }
    }
}

fn payload(d: &Record) -> String {
    String::from_utf8_lossy(d.data()).into_owned()
}

async fn rows(store: &MemoryLeaseStore) -> Vec<Lease> {
    store.list(STREAM).await.unwrap()
}

/// The rows `owner` left behind: shard leases it owns and its worker row (the roster row,
/// `worker:`, names whoever moved it last and stays).
async fn left_behind(store: &MemoryLeaseStore, owner: &str) -> Vec<String> {
    rows(store)
        .await
        .into_iter()
        .filter(|l| {
            let owned_shard =
                l.shard_id.starts_with("shardId-") && l.owner.as_deref() == Some(owner);
            owned_shard || l.shard_id == format!("worker:{owner}")
        })
        .map(|l| l.shard_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stream_ends_only_once_the_stop_is_complete() {
    let (_memory, api, store) = setup(2, 12);
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let mut held = Vec::new();
    while held.len() < 12 {
        held.push(next(&mut sub).await);
    }
    let last: BTreeSet<(String, String)> = held
        .iter()
        .map(|d| (d.shard_id().to_owned(), d.sequence_number().to_owned()))
        .collect();
    let stop = sub.shutdown_handle();
    tokio::spawn(async move { stop.shutdown().await });
    // The handlers finish a while after the stop began.
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        for d in held {
            d.ack();
        }
    });
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Some(item) = sub.next().await {
            assert!(item.is_err(), "nothing is delivered once the stop began");
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream ends");
    // The moment the stream ended, nothing is left to write.
    assert_eq!(
        left_behind(&store, "a").await,
        Vec::<String>::new(),
        "no lease owned and no worker row once the stream ended"
    );
    for row in rows(&store).await {
        if row.shard_id.starts_with("shardId-") {
            let Some(Checkpoint::Sequence(at)) = row.checkpoint else {
                panic!("no final checkpoint in {row:?}");
            };
            let highest = last
                .iter()
                .filter(|(shard, _)| *shard == row.shard_id)
                .map(|(_, seq)| seq.clone())
                .max_by(|a, b| a.len().cmp(&b.len()).then(a.cmp(b)));
            assert_eq!(
                Some(at),
                highest,
                "the final checkpoint of {}",
                row.shard_id
            );
        }
    }
}

/// Five deliveries of a shard the instance (`owner`) then dropped, because another declared
/// it gone (released its worker row): no checkpoint can cover them any more. Background
/// checkpoints are far apart, so only a sink's close would write one.
async fn deliveries_of_a_dropped_shard(
    api: &SharedKinesis,
    store: &MemoryLeaseStore,
    owner: &str,
) -> (Subscription, Vec<Delivery<Record>>) {
    support::events::record_events();
    let mut sub = builder(api, store, owner)
        .checkpoint_interval(Duration::from_secs(600))
        .start()
        .await
        .unwrap();
    let mut held = Vec::new();
    while held.len() < 5 {
        held.push(next(&mut sub).await);
    }
    // This instance drops its shards at its next worker-row renewal, their leases being
    // possibly another's now.
    for row in rows(store).await {
        if row.shard_id == format!("worker:{owner}") {
            store.release(&row).await.unwrap();
        }
    }
    let dropped = "this instance's worker row was released or removed by another instance (it \
                   was not renewed for the lease duration): its shards may be another's now and \
                   are dropped; their unsettled records are read again";
    // Other tests of this binary run beside this one: keep to this instance's lines.
    support::eventually("the instance drops its shards", PATIENCE, async || {
        (support::events::events(dropped).iter())
            .any(|fields| fields.get("owner").map(String::as_str) == Some(owner))
    })
    .await;
    (sub, held)
}

/// The close of `sink` fails (naming the lost lease) without hanging, and so does a second
/// close: the deliveries are still not covered.
async fn closes_fail_twice<S: futures::Sink<Delivery<T>, Error = KinesisError> + Unpin, T>(
    mut sink: S,
    deliveries: Vec<Delivery<T>>,
) {
    for delivery in deliveries {
        sink.feed(delivery).await.unwrap();
    }
    for close in ["the first", "a second"] {
        let closed = tokio::time::timeout(PATIENCE, sink.close())
            .await
            .unwrap_or_else(|_| panic!("{close} close hung on a shard the instance dropped"));
        let Err(error) = closed else {
            panic!("{close} close succeeded: no checkpoint can cover what was settled");
        };
        assert!(
            matches!(error, KinesisError::LeaseStore(_)) && error.to_string().contains(STREAM),
            "{close} close names the lost lease: {error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_sink_waiting_on_a_shard_dropped_with_the_worker_row_fails_instead_of_hanging() {
    let (_memory, api, store) = setup(1, 5);
    let (mut sub, held) = deliveries_of_a_dropped_shard(&api, &store, "gone").await;
    closes_fail_twice(AckSink::new(), held).await;
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publishing_sink_closing_on_a_dropped_shard_fails_every_time() {
    let (memory, api, store) = setup(1, 5);
    memory.add_stream("copy", 1).unwrap();
    let (mut sub, held) = deliveries_of_a_dropped_shard(&api, &store, "gone-publishing").await;
    let copies = held
        .into_iter()
        .map(|d| d.map(|r| OutgoingRecord::new(r.partition_key(), r.data().clone())))
        .collect();
    closes_fail_twice(Publisher::new(api, "copy").delivery_sink(), copies).await;
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_back_that_finds_its_lease_taken_fails_the_waiters_instead_of_hanging() {
    let (_memory, api, store) = setup(1, 3);
    let mut sub = builder(&api, &store, "a")
        .checkpoint_interval(Duration::from_secs(600))
        .shutdown_timeout(Duration::from_secs(20))
        .start()
        .await
        .unwrap();
    let mut held = Vec::new();
    while held.len() < 3 {
        held.push(next(&mut sub).await);
    }
    // The stop waits for the deliveries, renewing the lease, which another instance takes.
    let stop = sub.shutdown_handle();
    let stopped = tokio::spawn(async move { stop.shutdown().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let shard = rows(&store)
        .await
        .into_iter()
        .find(|l| l.shard_id.starts_with("shardId-"))
        .unwrap();
    store.take(&shard, "other").await.unwrap();
    tokio::time::timeout(PATIENCE, stopped)
        .await
        .expect("the stop ends once the lease is found lost")
        .unwrap();
    let closed = ack_and_close(held).await;
    assert!(closed.is_err(), "no checkpoint covers them: {closed:?}");
}

/// What a [`FaultyCheckpoints`] store does to checkpoint writes once armed.
#[derive(Clone, Copy)]
enum Fault {
    /// Every write panics (a bug in a store the user wrote): the keeper's task dies in it.
    Panic,
    /// The next write fails (a passing fault of the table); the ones after it succeed.
    FailOnce,
}

/// A lease store over `store` whose checkpoint writes meet `fault` once the returned flag is
/// set.
fn faulty_checkpoints(
    store: &MemoryLeaseStore,
    fault: Fault,
) -> (SharedLeaseStore, Arc<AtomicBool>) {
    let armed = Arc::new(AtomicBool::new(false));
    let layer = FaultyCheckpoints {
        armed: armed.clone(),
        fault,
    };
    (
        Arc::new(LayeredStore::new(Arc::new(store.clone()), layer)),
        armed,
    )
}

struct FaultyCheckpoints {
    armed: Arc<AtomicBool>,
    fault: Fault,
}

impl LeaseLayer for FaultyCheckpoints {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        if !matches!(call, LeaseCall::Checkpoint { .. }) {
            return next;
        }
        match self.fault {
            Fault::Panic if self.armed.load(Ordering::SeqCst) => {
                Box::pin(async { panic!("the store's checkpoint write panicked") })
            }
            Fault::FailOnce if self.armed.swap(false, Ordering::SeqCst) => Box::pin(async move {
                Err(LeaseError::Invalid {
                    table: "leases".into(),
                    operation: call.operation(),
                    message: "a passing fault".into(),
                    source: None,
                })
            }),
            _ => next,
        }
    }
}

/// Acks `held` through an [`AckSink`] and closes it, within [`PATIENCE`].
async fn ack_and_close(held: Vec<Delivery<Record>>) -> Result<(), KinesisError> {
    tokio::time::timeout(
        PATIENCE,
        futures::stream::iter(held.into_iter().map(Ok)).forward(AckSink::new()),
    )
    .await
    .expect("the ack sink's close does not hang")
}

/// The keeper that would write the checkpoint covering an ack sink's deliveries dies (here a
/// panic in the store's write): the sink's close fails, saying nothing will be checkpointed,
/// instead of asking for a write for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_sink_whose_checkpoint_writer_died_fails_instead_of_hanging() {
    support::events::record_events();
    let (_memory, api, store) = setup(1, 3);
    let (faulty, armed) = faulty_checkpoints(&store, Fault::Panic);
    let mut sub = support::reading::fast(&api, faulty, STREAM, "panicky")
        .initial_position(KinesisPosition::horizon())
        .checkpoint_interval(Duration::from_secs(600))
        .start()
        .await
        .unwrap();
    let mut held = Vec::new();
    while held.len() < 3 {
        held.push(next(&mut sub).await);
    }
    armed.store(true, Ordering::SeqCst);
    let closed = ack_and_close(held).await;
    assert!(
        matches!(closed, Err(KinesisError::Stopped { .. })),
        "nothing checkpoints them: {closed:?}"
    );
    tokio::time::timeout(PATIENCE, sub.shutdown())
        .await
        .expect("the stop ends");
    // The stop's summary does not say the shard was handed back. (Other tests of this binary
    // run beside this one: keep to this instance's lines.)
    let mine = |message: &str| {
        (support::events::events_starting(message).into_iter())
            .filter(|fields| fields.get("owner").map(String::as_str) == Some("panicky"))
            .collect::<Vec<_>>()
    };
    assert!(mine("subscription stopped; final checkpoints written").is_empty());
    let summary = mine("subscription stopped; some shards could not");
    assert_eq!(summary.len(), 1, "{summary:?}");
    assert_eq!(summary[0].get("failed").map(String::as_str), Some("1"));
}

/// A checkpoint write failed once, long before the stop, and the next ones succeeded: what
/// is acked after the stop is not covered because the stop came first, not because of that
/// old failure, and the sink's close says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_close_after_the_stop_names_the_stop_not_an_old_passing_failure() {
    let (_memory, api, store) = setup(1, 3);
    let (faulty, armed) = faulty_checkpoints(&store, Fault::FailOnce);
    let mut sub = support::reading::fast(&api, faulty, STREAM, "passing")
        .initial_position(KinesisPosition::horizon())
        .checkpoint_interval(Duration::from_millis(100))
        .shutdown_timeout(Duration::from_millis(200))
        .start()
        .await
        .unwrap();
    let first = next(&mut sub).await;
    let sequence = Checkpoint::Sequence(first.sequence_number().to_owned());
    armed.store(true, Ordering::SeqCst);
    first.ack();
    let covered = async || {
        let rows = rows(&store).await;
        !armed.load(Ordering::SeqCst)
            && rows
                .iter()
                .any(|r| r.checkpoint.as_ref() == Some(&sequence))
    };
    support::eventually(
        "the failed write, then one that covers it",
        PATIENCE,
        covered,
    )
    .await;
    let held = vec![next(&mut sub).await, next(&mut sub).await];
    sub.shutdown().await;
    let closed = ack_and_close(held).await;
    assert!(
        matches!(closed, Err(KinesisError::Stopped { .. })),
        "the stop is why: {closed:?}"
    );
}

/// What each instance's handlers finished, by payload.
type Finished = Arc<Mutex<Vec<String>>>;

/// Runs `sub` with handlers that take `slow` each (all at once), recording what they
/// finished and acking it; returns when the stream ends.
async fn run_handlers(sub: Subscription, slow: Duration, finished: Finished) {
    sub.filter_map(|item| async move { item.ok() })
        .map(|d| {
            let finished = finished.clone();
            async move {
                tokio::time::sleep(slow).await;
                finished.lock().unwrap().push(payload(&d));
                d
            }
        })
        .buffer_unordered(10_000)
        .map(Ok)
        .forward(AckSink::new())
        .await
        .expect("every checkpoint written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_handlers_at_a_stop_are_not_delivered_again_by_the_instance_that_stays() {
    let lease = kinesis_dataflow_test_support::timings::LEASE_DURATION;
    // Handlers slower than the lease duration, within the shutdown timeout.
    let slow = lease * 3;
    let (memory, api, store) = setup(2, 0);
    let a = builder(&api, &store, "a")
        .shutdown_timeout(lease * 6)
        .start()
        .await
        .unwrap();
    let stop_a = a.shutdown_handle();
    let a_done: Finished = Arc::default();
    let a_run = tokio::spawn(run_handlers(a, slow, a_done.clone()));
    let b = builder(&api, &store, "b").start().await.unwrap();
    let stop_b = b.shutdown_handle();
    let b_done: Finished = Arc::default();
    let b_run = tokio::spawn(run_handlers(b, Duration::ZERO, b_done.clone()));
    // Both hold a shard before anything is written.
    support::eventually("each instance holds one shard", PATIENCE, async || {
        let owners: BTreeSet<Option<String>> = rows(&store)
            .await
            .into_iter()
            .filter(|l| l.shard_id.starts_with("shardId-"))
            .map(|l| l.owner)
            .collect();
        owners == BTreeSet::from([Some("a".to_owned()), Some("b".to_owned())])
    })
    .await;
    let written: BTreeSet<String> = support::reading::write_tagged(&memory, STREAM, "w", 0, 40, 8)
        .into_iter()
        .collect();
    // A stops while its handlers are busy with what it read.
    tokio::time::sleep(lease / 2).await;
    tokio::time::timeout(PATIENCE, stop_a.shutdown())
        .await
        .expect("A's stop ends");
    tokio::time::timeout(PATIENCE, a_run)
        .await
        .expect("A's pipeline ends with its stream")
        .unwrap();
    let finished_by_a: BTreeSet<String> = a_done.lock().unwrap().iter().cloned().collect();
    assert!(
        !finished_by_a.is_empty(),
        "A's handlers finished records during its stop"
    );
    support::eventually("B reads every record", PATIENCE, async || {
        let seen: BTreeSet<String> = (a_done.lock().unwrap().iter())
            .chain(b_done.lock().unwrap().iter())
            .cloned()
            .collect();
        written.is_subset(&seen)
    })
    .await;
    let again: Vec<String> = (b_done.lock().unwrap().iter())
        .filter(|p| finished_by_a.contains(*p))
        .cloned()
        .collect();
    assert!(
        again.is_empty(),
        "records A's handlers finished during its stop were delivered again by B: {again:?}"
    );
    tokio::time::timeout(PATIENCE, stop_b.shutdown())
        .await
        .expect("B's stop ends");
    b_run.await.unwrap();
}

/// Counts the writes to worker rows that answered lost.
#[derive(Debug, Default)]
struct WorkerRowLosses(std::sync::atomic::AtomicU64);

impl kinesis_dataflow::lease::layer::LeaseLayer for WorkerRowLosses {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: kinesis_dataflow::lease::layer::LeaseCall<'a>,
        next: kinesis_dataflow::lease::LeaseFuture<'a, T>,
    ) -> kinesis_dataflow::lease::LeaseFuture<'a, T> {
        use kinesis_dataflow::lease::layer::LeaseCall;
        let worker = match call {
            LeaseCall::Renew { lease }
            | LeaseCall::Take { lease, .. }
            | LeaseCall::Delete { lease } => {
                lease.shard_id.starts_with("worker:") && lease.shard_id != "worker:"
            }
            _ => false,
        };
        Box::pin(async move {
            let result = next.await;
            if worker && result.as_ref().is_err_and(|e| e.is_lost()) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            result
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_inserted_again_while_its_stop_runs_is_started_once_that_is_done() {
    use kinesis_dataflow::lease::layer::LayeredStore;
    use kinesis_dataflow::{MultiSubscription, StreamSet};
    let (memory, api, store) = setup(1, 3);
    let losses = Arc::new(WorkerRowLosses::default());
    let layered = Arc::new(LayeredStore::new(Arc::new(store.clone()), losses.clone()));
    let streams = StreamSet::new([STREAM]);
    let mut all = MultiSubscription::builder(api.clone(), layered, streams.clone())
        .configure(|each| {
            support::timings::with_fast_timings(each)
                .owner("m")
                .initial_position(KinesisPosition::horizon())
                .shutdown_timeout(kinesis_dataflow_test_support::timings::LEASE_DURATION * 4)
        })
        .start()
        .await
        .unwrap();
    // One delivery held: the removed stream's stop waits for it.
    let held = loop {
        match tokio::time::timeout(PATIENCE, all.next()).await {
            Ok(Some(Ok(d))) => break d,
            Ok(Some(Err(e))) => eprintln!("read error (retried): {e}"),
            other => panic!("expected a delivery, got {other:?}"),
        }
    };
    assert!(streams.remove(STREAM));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(streams.insert(STREAM));
    let all_stop = all.shutdown_handle();
    let reader = tokio::spawn(async move {
        let mut payloads = Vec::new();
        while let Some(item) = all.next().await {
            if let Ok(d) = item {
                payloads.push(payload(&d));
                d.ack();
            }
        }
        payloads
    });
    // The handler finishes a while later; the stop then completes.
    tokio::time::sleep(kinesis_dataflow_test_support::timings::LEASE_DURATION * 2).await;
    held.ack();
    support::reading::write_tagged(&memory, STREAM, "after", 0, 5, 2);
    support::eventually(
        "the stream read again after its stop",
        PATIENCE,
        async || {
            rows(&store).await.iter().any(|row| {
                row.shard_id.starts_with("shardId-") && row.owner.as_deref() == Some("m")
            })
        },
    )
    .await;
    tokio::time::sleep(kinesis_dataflow_test_support::timings::LEASE_DURATION * 2).await;
    tokio::time::timeout(PATIENCE, all_stop.shutdown())
        .await
        .expect("the stop ends");
    let payloads = reader.await.unwrap();
    assert!(
        payloads.iter().filter(|p| p.starts_with("after:")).count() >= 5,
        "the stream is read again: {payloads:?}"
    );
    assert_eq!(
        losses.0.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no worker-row write answered lost: one subscription of the stream at a time writes it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_after_a_crash_says_that_it_started_and_whom_it_waits_for() {
    support::events::record_events();
    let (_memory, api, store) = setup(2, 4);
    let crashed = builder(&api, &store, "crashed-x").start().await.unwrap();
    crashed.abort();
    let mut again = builder(&api, &store, "restarted-y").start().await.unwrap();
    assert!(
        !support::events::events(
            "subscription started (shards held now; others follow as the instances balance)"
        )
        .is_empty(),
        "the start is said at info"
    );
    support::eventually(
        "the wait for the crashed instance is said",
        PATIENCE,
        async || {
            support::events::events_starting("waiting up to ")
                .iter()
                .any(|fields| fields.get("instance").map(String::as_str) == Some("crashed-x"))
        },
    )
    .await;
    // Then its shards are taken once its leases expire.
    let mut read = 0;
    while read < 4 {
        next(&mut again).await.ack();
        read += 1;
    }
    again.shutdown().await;
}

/// A record sent back and waiting for its redelivery is not out: a stop does not wait for it
/// (nobody can settle it once the shard is let go); the checkpoint stops before it, so the next
/// reader reads it.
#[tokio::test(start_paused = true)]
async fn a_stop_does_not_wait_for_a_record_waiting_for_its_redelivery() {
    let (_memory, api, store) = setup(1, 1);
    let mut sub = builder(&api, &store, "a")
        .shutdown_timeout(Duration::from_secs(60))
        .start()
        .await
        .unwrap();
    let delivery = next(&mut sub).await;
    delivery.retry_after(Duration::from_secs(3600));
    let began = tokio::time::Instant::now();
    sub.shutdown().await;
    assert!(
        began.elapsed() < Duration::from_secs(5),
        "the stop waited {:?} for a record nobody holds",
        began.elapsed()
    );
    let row = rows(&store)
        .await
        .into_iter()
        .find(|l| l.shard_id.starts_with("shardId-"))
        .unwrap();
    assert!(
        !matches!(row.checkpoint, Some(Checkpoint::Sequence(_))),
        "the checkpoint stops before the record: {:?}",
        row.checkpoint
    );
    assert_eq!(row.owner, None, "released");
}

/// A `MultiSubscription` starting a stream whose first call never answers still stops at
/// once when asked: the start is given up, and the running stream's stop goes on as usual.
#[tokio::test(start_paused = true)]
async fn a_multi_subscription_stops_while_a_stream_it_starts_hangs() {
    use kinesis_dataflow::api::memory::Fault;
    use kinesis_dataflow::error::Operation;
    use kinesis_dataflow::{MultiSubscription, StreamSet};
    let (memory, api, store) = setup(1, 1);
    memory.add_stream("other", 1).unwrap();
    let streams = StreamSet::new([STREAM]);
    let mut all = MultiSubscription::builder(api.clone(), Arc::new(store.clone()), streams.clone())
        .configure(|each| {
            support::timings::with_fast_timings(each)
                .owner("m")
                .initial_position(KinesisPosition::horizon())
        })
        .start()
        .await
        .unwrap();
    let first = loop {
        match tokio::time::timeout(PATIENCE, all.next()).await {
            Ok(Some(Ok(d))) => break d,
            Ok(Some(Err(e))) => eprintln!("read error (retried): {e}"),
            other => panic!("expected a delivery, got {other:?}"),
        }
    };
    first.ack();
    memory.inject(
        Fault::latency(Operation::DescribeStreamSummary, Duration::from_secs(3600)).times(u32::MAX),
    );
    assert!(streams.insert("other"));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stop = all.shutdown_handle();
    let stopping = tokio::spawn(async move { stop.shutdown().await });
    let drained = tokio::spawn(async move { while all.next().await.is_some() {} });
    tokio::time::timeout(Duration::from_secs(60), stopping)
        .await
        .expect("the stop does not wait for the hung start")
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), drained)
        .await
        .expect("the merged stream ends")
        .unwrap();
    let held: Vec<_> = rows(&store)
        .await
        .into_iter()
        // (The roster row, `worker:`, names whoever moved it last; it is no lease.)
        .filter(|row| row.owner.is_some() && row.shard_id != "worker:")
        .collect();
    assert!(held.is_empty(), "nothing left held: {held:?}");
}

/// A start that fails at its first listing (the stream does not exist) returns only once the
/// instance's own rows are gone: a program that gives up right after leaves nothing held.
#[tokio::test(start_paused = true)]
async fn a_failed_start_leaves_no_row_held() {
    let (_memory, api, store) = setup(1, 1);
    let error = support::reading::fast(&api, Arc::new(store.clone()), "missing", "a")
        .start()
        .await
        .unwrap_err();
    assert!(
        matches!(error, KinesisError::StreamNotFound { .. }),
        "{error:?}"
    );
    let held: Vec<Lease> = store
        .list("missing")
        .await
        .unwrap()
        .into_iter()
        .filter(|row| row.owner.is_some() && row.shard_id != "worker:")
        .collect();
    assert!(held.is_empty(), "left held: {held:?}");
}
