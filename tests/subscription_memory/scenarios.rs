// The scenarios of `subscription_memory.rs` (polling) and `subscription_memory_fan_out.rs`
// (enhanced fan-out), included by both: the same tests in both read modes.

use std::sync::Arc;
use std::time::Duration;

use futures::{SinkExt, StreamExt};
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::{Lease, LeaseStore, SharedLeaseStore};
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::subscription::Clock;
use kinesis_dataflow::{
    AckSink, Delivery, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore,
    ReadSettings, Record, Subscription, SubscriptionBuilder,
};
use support::cutoff::CutOff;

const STREAM: &str = "orders";

/// A clock ahead of the tokio clock by a fixed amount, as a host whose clock is off would be.
#[derive(Debug)]
struct ShiftedClock(Duration);

impl Clock for ShiftedClock {
    fn now(&self) -> tokio::time::Instant {
        tokio::time::Instant::now() + self.0
    }
}
const SHARD0: &str = "shardId-000000000000";

fn setup(shards: u32, records: usize) -> (MemoryKinesis, SharedKinesis, MemoryLeaseStore) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, shards).unwrap();
    for i in 0..records {
        memory
            .put(STREAM, &format!("key-{}", i % 7), format!("{i:05}"))
            .unwrap();
    }
    let api: SharedKinesis = Arc::new(memory.clone());
    (memory, api, MemoryLeaseStore::new())
}

fn builder(api: &SharedKinesis, store: &MemoryLeaseStore, owner: &str) -> SubscriptionBuilder {
    builder_on(api, Arc::new(store.clone()), owner)
}

/// The test settings over any lease store, from the oldest record.
fn builder_on(api: &SharedKinesis, store: SharedLeaseStore, owner: &str) -> SubscriptionBuilder {
    fast(api, store, owner).start_at(KinesisPosition::horizon())
}

/// Fast listings, short leases, frequent checkpoints; the default start position; the read
/// mode of [`FAN_OUT`].
fn fast(api: &SharedKinesis, store: SharedLeaseStore, owner: &str) -> SubscriptionBuilder {
    support::reading::fast(api, store, STREAM, owner).read_settings(mode(
        ReadSettings::default()
            .poll_interval(kinesis_dataflow_test_support::timings::POLL_INTERVAL)
            .unlimited_reads(),
    ))
}

/// `settings` in the read mode of [`FAN_OUT`].
fn mode(settings: ReadSettings) -> ReadSettings {
    match FAN_OUT {
        Some(consumer) => settings.fan_out(consumer),
        None => settings,
    }
}

/// Splits shard 0 in the middle of the key space: shards 1 and 2 are its children.
async fn split_shard0(memory: &MemoryKinesis) {
    memory
        .split_shard(STREAM, SHARD0, &(u128::MAX / 2).to_string())
        .await
        .unwrap();
}

async fn take(sub: &mut Subscription, n: usize) -> Vec<Delivery<Record>> {
    let mut out = Vec::new();
    while out.len() < n {
        match tokio::time::timeout(Duration::from_secs(20), sub.next()).await {
            Ok(Some(Ok(d))) => out.push(d),
            other => panic!("expected a delivery, got {other:?}"),
        }
    }
    out
}

async fn stored_checkpoint(store: &MemoryLeaseStore, shard: &str) -> Option<Checkpoint> {
    store
        .list(STREAM)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.shard_id == shard)
        .and_then(|l| l.checkpoint)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_order_acks_never_move_the_checkpoint_past_an_unsettled_record() {
    let (_memory, api, store) = setup(1, 50);
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let mut deliveries = take(&mut sub, 50).await;
    let seqs: Vec<String> = deliveries
        .iter()
        .map(|d| d.sequence_number().to_owned())
        .collect();
    let held_back = deliveries.remove(10);
    // Settle the rest in reverse order.
    while let Some(d) = deliveries.pop() {
        d.ack();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        stored_checkpoint(&store, SHARD0).await,
        Some(Checkpoint::Sequence(seqs[9].clone())),
        "the checkpoint stops before the unsettled record"
    );
    held_back.ack();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        stored_checkpoint(&store, SHARD0).await,
        Some(Checkpoint::Sequence(seqs[49].clone()))
    );
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoint_writes_are_coalesced_per_interval() {
    let (memory, api, store) = setup(1, 0);
    let sub = builder(&api, &store, "a")
        .checkpoint_interval(Duration::from_millis(250))
        .start()
        .await
        .unwrap();
    let handle = sub.shutdown_handle();
    // A producer writing steadily while the pipeline acks everything at once.
    let producer = tokio::spawn(async move {
        for i in 0..2_000 {
            memory.put(STREAM, &format!("k{i}"), "x").unwrap();
            if i % 100 == 0 {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let pipeline = tokio::spawn(
        sub.filter_map(|item| async move { item.ok() })
            .chunks(64)
            .map(Ok)
            .forward(AckSink::new()),
    );
    let started = tokio::time::Instant::now();
    producer.await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    handle.shutdown().await;
    let elapsed = started.elapsed();
    let _ = pipeline.await;
    let writes = store.checkpoint_writes(STREAM, SHARD0);
    let allowed = (elapsed.as_millis() / 250) as u64 + 2;
    assert!(writes >= 2, "checkpoints were written ({writes})");
    assert!(
        writes <= allowed,
        "{writes} checkpoint writes in {elapsed:?} (at most {allowed})"
    );
    let last = store
        .list(STREAM)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.shard_id == SHARD0)
        .unwrap();
    assert!(last.owner.is_none(), "released on shutdown");
    assert!(matches!(last.checkpoint, Some(Checkpoint::Sequence(_))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_delivery_is_counted_and_does_not_stall_the_shard() {
    let (_memory, api, store) = setup(1, 20);
    let sub = builder(&api, &store, "a").start().await.unwrap();
    let handle = sub.shutdown_handle();
    // `filter` drops the odd records without settling them.
    let kept: Vec<Delivery<Record>> = sub
        .filter_map(|item| async move { item.ok() })
        .filter(|d| futures::future::ready(d.data()[4] % 2 == 0))
        .take(10)
        .collect()
        .await;
    let last_seq = kept.last().unwrap().sequence_number().to_owned();
    let mut sink = AckSink::new();
    sink.send_all(&mut futures::stream::iter(kept.into_iter().map(Ok)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Record 19 (odd) was never delivered past `take`, so the checkpoint is record 18.
    assert_eq!(
        stored_checkpoint(&store, SHARD0).await,
        Some(Checkpoint::Sequence(last_seq))
    );
    handle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_cut_off_from_the_lease_store_stops_reading_and_cannot_checkpoint() {
    let (memory, api, store) = setup(1, 10);
    let a_view = CutOff::new(Arc::new(store.clone()));
    let mut a = builder_on(&api, a_view.store(), "a").start().await.unwrap();
    for d in take(&mut a, 10).await {
        d.ack();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(a.shards(), [SHARD0]);
    let checkpoint_before = stored_checkpoint(&store, SHARD0).await;
    assert!(checkpoint_before.is_some());

    // A loses the lease table; B still reaches it and starts right away, so it takes the
    // lease as soon as the lease expires in its own view.
    a_view.set_down(true);
    memory.put(STREAM, "k", "after-cut").unwrap();
    let b_task = {
        let (api, store) = (api.clone(), store.clone());
        tokio::spawn(async move {
            let mut b = builder(&api, &store, "b").start().await.unwrap();
            let got = take(&mut b, 1).await;
            (tokio::time::Instant::now(), got, b)
        })
    };
    let mut late = Vec::new();
    let guard = tokio::time::Instant::now();
    while !a.shards().is_empty() {
        assert!(
            guard.elapsed() < Duration::from_secs(10),
            "A keeps reading without a lease"
        );
        if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(20), a.next()).await {
            late.push(d);
        }
    }
    let a_stopped = tokio::time::Instant::now();

    let (b_first, got, mut b) = b_task.await.unwrap();
    assert!(
        b_first > a_stopped,
        "B reads only after A stopped ({:?} before)",
        a_stopped - b_first
    );
    assert_eq!(
        &got[0].data()[..],
        b"after-cut",
        "B resumes from A's checkpoint"
    );
    got.into_iter().for_each(|d| drop(d.ack()));

    // A comes back and settles what it still had: none of it reaches the lease table.
    let a_writes = a_view.checkpoints();
    a_view.set_down(false);
    for d in late {
        d.ack();
    }
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(a_view.checkpoints(), a_writes, "no checkpoint from A");
    let lease = store
        .list(STREAM)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.shard_id == SHARD0)
        .unwrap();
    assert_eq!(lease.owner.as_deref(), Some("b"));
    assert!(a.shards().is_empty(), "A did not take the live lease back");
    b.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_clock_does_not_steal_a_live_lease() {
    let (_memory, api, store) = setup(1, 0);
    let mut a = builder(&api, &store, "a").start().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), async {
        while a.shards().is_empty() {
            let _ = tokio::time::timeout(Duration::from_millis(50), a.next()).await;
        }
    })
    .await
    .unwrap();
    // B's clock runs ten minutes ahead.
    let mut b = builder(&api, &store, "b")
        .clock(Arc::new(ShiftedClock(Duration::from_secs(600))))
        .start()
        .await
        .unwrap();
    let until = tokio::time::Instant::now() + Duration::from_secs(3);
    while tokio::time::Instant::now() < until {
        let _ = tokio::time::timeout(Duration::from_millis(50), a.next()).await;
        let _ = tokio::time::timeout(Duration::from_millis(50), b.next()).await;
    }
    assert_eq!(a.shards(), [SHARD0], "A keeps its live lease");
    assert!(b.shards().is_empty(), "B took nothing");
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_reader_releases_its_lease_and_the_shard_is_read_again_from_the_checkpoint() {
    use kinesis_dataflow::KinesisError;
    use kinesis_dataflow::api::memory::Fault;
    use kinesis_dataflow::error::Operation;

    let (memory, api, store) = setup(1, 5);
    let mut sub = builder(&api, &store, "a")
        .read_settings(mode(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(50))
                .failure_backoff(Duration::from_millis(10))
                .unlimited_reads(),
        ))
        .start()
        .await
        .unwrap();
    let first = take(&mut sub, 5).await;
    let last_settled = first.last().unwrap().sequence_number().to_owned();
    first.into_iter().for_each(|d| drop(d.ack()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        stored_checkpoint(&store, SHARD0).await,
        Some(Checkpoint::Sequence(last_settled))
    );

    // The call that reads fails eleven times in a row: GetRecords, or with enhanced fan-out
    // the live subscription (its connection cut) and then ten SubscribeToShard calls.
    if FAN_OUT.is_some() {
        memory.inject(Fault::fail(Operation::SubscribeToShard, "injected outage").times(10));
        memory.cut_subscriptions();
    } else {
        memory.inject(Fault::fail(Operation::GetRecords, "injected outage").times(11));
    }
    memory.put(STREAM, "k", "after-outage").unwrap();
    let mut failures = 0;
    let mut stopped = false;
    let next = loop {
        match tokio::time::timeout(Duration::from_secs(20), sub.next()).await {
            Ok(Some(Err(KinesisError::ReaderStopped { failures: n, .. }))) => {
                assert_eq!(n, 11);
                stopped = true;
            }
            Ok(Some(Err(_))) => failures += 1,
            Ok(Some(Ok(d))) => break d,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(stopped, "the eleventh failure stops the reader");
    assert_eq!(failures, 10, "ten failures reported before the stop");
    assert_eq!(
        &next.data()[..],
        b"after-outage",
        "read again from the checkpoint, nothing repeated"
    );
    next.ack();
    sub.shutdown().await;
}

#[test]
fn subscriptions_and_deliveries_drop_into_any_tokio_pipeline() {
    fn send_static<T: Send + 'static>() {}
    send_static::<Subscription>();
    send_static::<Delivery<Record>>();
    send_static::<Vec<Delivery<Record>>>();
    send_static::<AckSink>();
    send_static::<kinesis_dataflow::subscription::ShutdownHandle>();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_written_right_after_start_is_delivered_from_latest() {
    let (memory, api, store) = setup(2, 10);
    // No start position: the shards open at LATEST, fixed before `start` returns.
    let mut sub = Subscription::builder(api.clone(), Arc::new(store.clone()), STREAM)
        .owner("a")
        .read_settings(mode(ReadSettings::default().poll_interval(Duration::from_millis(50))))
        .start()
        .await
        .unwrap();
    assert_eq!(sub.shards().len(), 2, "held as soon as `start` returned");
    memory
        .put(STREAM, "key-after-start", "after-start")
        .unwrap();
    let got = take(&mut sub, 1).await;
    assert_eq!(
        &got[0].data()[..],
        b"after-start",
        "nothing older, nothing missed"
    );
    drop(got);
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_record_comes_back_before_later_records_of_its_shard() {
    let (memory, api, store) = setup(1, 3);
    let mut sub = builder(&api, &store, "a")
        .max_in_flight(10)
        .start()
        .await
        .unwrap();
    let first = take(&mut sub, 3).await;
    let seqs: Vec<String> = first
        .iter()
        .map(|d| d.sequence_number().to_owned())
        .collect();
    let mut first = first.into_iter();
    first.next().unwrap().ack();
    let second = first.next().unwrap();
    first.next().unwrap().ack();
    // Record 1 is sent back with a delay; records written meanwhile must wait for it.
    second.retry_after(Duration::from_millis(300));
    memory.put(STREAM, "k", "later").unwrap();
    let sent_back_at = tokio::time::Instant::now();
    let again = take(&mut sub, 1).await;
    assert_eq!(
        again[0].sequence_number(),
        seqs[1],
        "the retried record comes first"
    );
    assert!(
        sent_back_at.elapsed() >= Duration::from_millis(250),
        "after its delay"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        stored_checkpoint(&store, SHARD0).await,
        Some(Checkpoint::Sequence(seqs[0].clone())),
        "the checkpoint waits for the retried record"
    );
    again.into_iter().next().unwrap().retry();
    let third = take(&mut sub, 2).await;
    assert_eq!(
        third[0].sequence_number(),
        seqs[1],
        "retried again, at once"
    );
    assert_eq!(&third[1].data()[..], b"later");
    third.into_iter().for_each(|d| drop(d.ack()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        matches!(stored_checkpoint(&store, SHARD0).await, Some(Checkpoint::Sequence(s)) if s > seqs[2])
    );
    sub.shutdown().await;
}

#[test]
fn a_subscription_started_on_a_short_lived_runtime_runs_on_the_one_it_was_given() {
    let main = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let (memory, api, store) = main.block_on(async { setup(1, 3) });
    let sub = {
        let short = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let start = builder(&api, &store, "a")
            .runtime(main.handle().clone())
            .start();
        short.block_on(start).unwrap()
        // The short-lived runtime stops here.
    };
    main.block_on(async move {
        let mut sub = sub;
        for d in take(&mut sub, 3).await {
            d.ack();
        }
        // Longer than a lease: renewals keep running on the main runtime.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(sub.shards(), [SHARD0]);
        memory.put(STREAM, "k", "later").unwrap();
        assert_eq!(&take(&mut sub, 1).await[0].data()[..], b"later");
        sub.shutdown().await;
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_fails_with_a_clear_error_for_a_stream_that_does_not_exist() {
    let (_memory, api, store) = setup(1, 0);
    let started = Subscription::builder(api, Arc::new(store), "no-such-stream")
        .start()
        .await;
    match started {
        Err(kinesis_dataflow::KinesisError::StreamNotFound { stream, .. }) => {
            assert_eq!(stream, "no-such-stream");
        }
        other => panic!("expected StreamNotFound, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_of_a_closed_shards_last_record_is_served_before_its_children_start() {
    let (memory, api, store) = setup(1, 3);
    split_shard0(&memory).await;
    memory.put(STREAM, "key-child", "child").unwrap();
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let parent = take(&mut sub, 3).await;
    let last_seq = parent[2].sequence_number().to_owned();
    let mut parent = parent.into_iter();
    parent.next().unwrap().ack();
    parent.next().unwrap().ack();
    // The parent's reader has reached the shard's end by now; its last record comes back.
    let _ = tokio::time::timeout(Duration::from_millis(300), sub.next()).await;
    parent.next().unwrap().retry();
    let again = take(&mut sub, 1).await;
    assert_eq!(
        again[0].sequence_number(),
        last_seq,
        "redelivered after the shard's end"
    );
    again.into_iter().for_each(|d| drop(d.ack()));
    let child = take(&mut sub, 1).await;
    assert_eq!(
        &child[0].data()[..],
        b"child",
        "the child starts once the parent is finished"
    );
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_with_start_at_over_a_stored_checkpoint_never_jumps_ahead() {
    use kinesis_dataflow::api::memory::Fault;
    use kinesis_dataflow::lease::Lease;

    let (memory, api, store) = setup(1, 40);
    let seqs: Vec<String> = memory
        .records(STREAM, SHARD0)
        .unwrap()
        .iter()
        .map(|r| r.sequence_number().to_owned())
        .collect();
    let mut lease = Lease::new(STREAM, SHARD0, Vec::new());
    lease.checkpoint = Some(Checkpoint::Sequence(seqs[30].clone()));
    assert!(store.create(&lease).await.unwrap());
    // Replay from the oldest record, ahead of the stored checkpoint.
    let mut sub = builder(&api, &store, "a")
        .read_settings(mode(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(50))
                .batch_size(10)
                .unlimited_reads(),
        ))
        .start()
        .await
        .unwrap();
    for d in take(&mut sub, 10).await {
        d.ack();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    memory.inject(Fault::expire_iterator());
    let next = take(&mut sub, 1).await;
    assert_eq!(
        next[0].sequence_number(),
        seqs[10],
        "the replay goes on where it was"
    );
    sub.shutdown().await;
}

/// Waits until the stored checkpoint of shard 0 is `expected`.
async fn checkpoint_becomes(store: &MemoryLeaseStore, expected: Checkpoint) {
    tokio::time::timeout(Duration::from_secs(10), async {
        while stored_checkpoint(store, SHARD0).await.as_ref() != Some(&expected) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the checkpoint never became {expected:?}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seek_moves_the_shard_and_the_checkpoint_follows_what_is_settled_after_it() {
    let (memory, api, store) = setup(1, 10);
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let seeker = sub.seeker();
    let mut first = take(&mut sub, 10).await;
    let seqs: Vec<String> = first
        .iter()
        .map(|d| d.sequence_number().to_owned())
        .collect();
    let held_back = first.split_off(8);
    first.into_iter().for_each(|d| drop(d.ack()));
    checkpoint_becomes(&store, Checkpoint::Sequence(seqs[7].clone())).await;

    // Back to record 3: it comes again, then the rest of the shard.
    seeker
        .seek(KinesisPosition::sequence(SHARD0, &seqs[3]))
        .await
        .unwrap();
    let again = take(&mut sub, 7).await;
    let again_seqs: Vec<&str> = again.iter().map(|d| d.sequence_number()).collect();
    assert_eq!(
        again_seqs,
        seqs[3..].iter().map(String::as_str).collect::<Vec<_>>()
    );
    // What was handed out before the seek is stale: settling it moves nothing.
    assert!(held_back.iter().all(Delivery::is_stale));
    held_back.into_iter().for_each(|d| drop(d.ack()));
    // The checkpoint follows the new ledger, back to record 3 once it is settled.
    let mut again = again.into_iter();
    drop(again.next().unwrap().ack());
    checkpoint_becomes(&store, Checkpoint::Sequence(seqs[3].clone())).await;

    // Refused seeks move nothing: a shard the stream does not have, a sequence number the
    // service does not know.
    let foreign = seeker
        .seek(KinesisPosition::sequence("shardId-000000000099", &seqs[0]))
        .await;
    assert!(
        matches!(foreign, Err(KinesisError::SeekRefused { .. })),
        "{foreign:?}"
    );
    let unknown = seeker.seek(KinesisPosition::sequence(SHARD0, "1")).await;
    assert!(unknown.is_err(), "{unknown:?}");
    drop(again);

    // To the tip: only what is written afterwards comes, not even what was written a moment
    // before. With fan-out, once the service's five-second rule lets the new reader subscribe
    // at LATEST: a LATEST subscription refused for now opens at the time it was asked for,
    // less the clock allowance, and may read that margin again (at least once, never a
    // skip). The old reader's subscription, still open, must not be what refuses it.
    if FAN_OUT.is_some() {
        // The reader subscribes (since the last seek it read by GetRecords, its subscription
        // refused for now), then the five seconds pass.
        let until = tokio::time::Instant::now() + Duration::from_secs(10);
        while memory.active_subscriptions() == 0 && tokio::time::Instant::now() < until {
            let _ = tokio::time::timeout(Duration::from_millis(100), sub.next()).await;
        }
        assert_eq!(memory.active_subscriptions(), 1);
        tokio::time::sleep(Duration::from_millis(5_100)).await;
    }
    memory.put(STREAM, "k", "before-latest").unwrap();
    seeker.seek(KinesisPosition::latest()).await.unwrap();
    memory.put(STREAM, "k", "after-latest").unwrap();
    let next = take(&mut sub, 1).await;
    assert_eq!(&next[0].data()[..], b"after-latest");
    next.into_iter().for_each(|d| drop(d.ack()));

    sub.shutdown().await;
    let stopped = seeker.seek(KinesisPosition::horizon()).await;
    assert!(
        matches!(stopped, Err(KinesisError::Stopped { .. })),
        "{stopped:?}"
    );
}

/// An instance that starts while another counts as live opens only its share of the shards
/// and takes the rest at a later listing (here: once the other's worker row expires, as when
/// two instances start together and one dies). Those shards still start where their lease
/// rows were created, so nothing written after `start` returned is missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_taken_after_startup_miss_nothing_written_after_start() {
    let (memory, api, store) = setup(4, 0);
    // Another instance, "b", is registered as live (its worker row), then never renews.
    let row = Lease::new(STREAM.to_owned(), "worker:b".to_owned(), Vec::new());
    store.create(&row).await.unwrap();
    store.take(&row, "b").await.unwrap();

    let mut a = fast(&api, Arc::new(store.clone()), "a")
        .start()
        .await
        .unwrap();
    let written: Vec<String> = (0..40).map(|i| format!("after-start-{i}")).collect();
    for (i, data) in written.iter().enumerate() {
        memory
            .put(STREAM, &format!("key-{i}"), data.clone())
            .unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    tokio::time::timeout(Duration::from_secs(20), async {
        while seen.len() < written.len() {
            if let Some(Ok(d)) = a.next().await {
                seen.insert(String::from_utf8_lossy(d.data()).into_owned());
                d.ack();
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{} of {} records delivered; missing {:?}",
            seen.len(),
            written.len(),
            written
                .iter()
                .filter(|w| !seen.contains(*w))
                .collect::<Vec<_>>()
        )
    });
    assert_eq!(a.shards().len(), 4, "a took b's share once b's row expired");
    a.shutdown().await;
}

/// The rows of the lease table, by id.
async fn rows(store: &MemoryLeaseStore) -> Vec<String> {
    let leases = store.list(STREAM).await.unwrap();
    leases.into_iter().map(|l| l.shard_id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_past_the_retention_period_loses_its_row_and_its_children_go_on() {
    support::init_tracing();
    let (memory, api, store) = setup(1, 5);
    split_shard0(&memory).await;
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    take(&mut sub, 5)
        .await
        .into_iter()
        .for_each(|d| drop(d.ack()));
    // The stream is pulled meanwhile (the readers only read when it is): nothing else comes.
    let mut pull_until = async |what: &str, done: &dyn Fn(Vec<Lease>) -> bool| {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !done(store.list(STREAM).await.unwrap()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what} never happened"
            );
            let next = tokio::time::timeout(Duration::from_millis(20), sub.next()).await;
            assert!(next.is_err(), "no record is left to deliver: {next:?}");
        }
    };
    pull_until("the parent's end checkpoint", &|rows| {
        rows.iter()
            .any(|l| l.shard_id == SHARD0 && l.checkpoint == Some(Checkpoint::ShardEnd))
    })
    .await;

    // The retention period passes over the parent: it leaves the listing, and its row goes.
    memory.trim(STREAM, std::time::SystemTime::now());
    pull_until("deleting the expired shard's row", &|rows| {
        rows.iter().all(|l| l.shard_id != SHARD0)
    })
    .await;
    assert_eq!(
        rows(&store).await,
        vec![
            "shardId-000000000001",
            "shardId-000000000002",
            "worker:",
            "worker:a"
        ],
        "the children's rows, the roster row and the live worker row are kept"
    );

    sub.shutdown().await;
    assert_eq!(
        rows(&store).await,
        vec!["shardId-000000000001", "shardId-000000000002", "worker:"],
        "a graceful stop deletes the worker row (the stream's one roster row stays)"
    );

    // A new instance takes the children: a parent with no row that the stream no longer lists
    // does not hold them back, and gets no row again.
    let mut b = builder(&api, &store, "b").start().await.unwrap();
    memory.put(STREAM, "key-after", "after").unwrap();
    let after = take(&mut b, 1).await;
    assert_eq!(&after[0].data()[..], b"after");
    after.into_iter().for_each(|d| drop(d.ack()));
    assert!(
        rows(&store).await.iter().all(|r| r != SHARD0),
        "the expired shard has no row again"
    );
    b.shutdown().await;
}

/// A shard whose row is gone while the stream still lists it (a listing that lagged behind
/// another instance's cleanup) is not read again once its children have read past it: its row
/// comes back as finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listed_shard_whose_row_vanished_after_its_children_read_past_it_is_not_read_again() {
    let (memory, api, store) = setup(1, 5);
    split_shard0(&memory).await;
    memory.put(STREAM, "key-child", "child").unwrap();
    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    take(&mut sub, 5)
        .await
        .into_iter()
        .for_each(|d| drop(d.ack()));
    let child = take(&mut sub, 1).await;
    let child_seq = child[0].sequence_number().to_owned();
    assert_eq!(
        &child[0].data()[..],
        b"child",
        "the child's record comes last"
    );
    child.into_iter().for_each(|d| drop(d.ack()));
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let leases = store.list(STREAM).await.unwrap();
            if leases
                .iter()
                .any(|l| l.checkpoint == Some(Checkpoint::Sequence(child_seq.clone())))
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the child's checkpoint is written");

    // The parent's row goes while the stream still lists the parent.
    let parent = store
        .list(STREAM)
        .await
        .unwrap()
        .into_iter()
        .find(|l| l.shard_id == SHARD0)
        .expect("the parent's row");
    store.delete(&parent).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let again = store.list(STREAM).await.unwrap();
        if let Some(row) = again.iter().find(|l| l.shard_id == SHARD0) {
            assert_eq!(row.checkpoint, Some(Checkpoint::ShardEnd), "{row:?}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no row came back");
        let next = tokio::time::timeout(Duration::from_millis(20), sub.next()).await;
        assert!(next.is_err(), "nothing is read again: {next:?}");
    }
    // Nothing of the parent comes again after its row is back either.
    let next = tokio::time::timeout(Duration::from_millis(500), sub.next()).await;
    assert!(next.is_err(), "nothing is read again: {next:?}");
    sub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_lists_what_the_first_listing_took_as_soon_as_start_returns() {
    let (_memory, api, store) = setup(3, 0);
    let sub = builder(&api, &store, "a").start().await.unwrap();
    assert_eq!(
        sub.shards(),
        [
            "shardId-000000000000",
            "shardId-000000000001",
            "shardId-000000000002"
        ]
    );
    drop(sub);
}
