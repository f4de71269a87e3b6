//! Edge cases of where shards begin, on the in-memory transport and lease store: rows another
//! instance created at its start, a fresh start at the tip of a resharded stream, a seek that
//! a crash interrupts, a stream recreated under the same name, a seek racing a lost lease, a
//! take under way when the instance is declared gone; and a pipeline that spent the runtime's
//! budget before waiting for the next record.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{Lease, LeaseFuture, LeaseStore};
use kinesis_dataflow::{
    AckSink, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription, SubscriptionBuilder,
};

const STREAM: &str = "edges";

fn builder(api: &SharedKinesis, store: &MemoryLeaseStore, owner: &str) -> SubscriptionBuilder {
    support::reading::fast(api, Arc::new(store.clone()), STREAM, owner)
}

fn write(memory: &MemoryKinesis, tag: &str, count: usize) -> BTreeSet<String> {
    support::reading::write_tagged(memory, STREAM, tag, 0, count, count)
        .into_iter()
        .collect()
}

/// Reads and acks until `expected` all came; returns every payload delivered, in order.
async fn read_until(
    sub: &mut Subscription,
    expected: &BTreeSet<String>,
    what: &str,
) -> Vec<String> {
    support::reading::read_until(sub, expected, what, Duration::from_secs(15))
        .await
        .into_iter()
        .map(|(_, payload)| payload)
        .collect()
}

/// Another instance that started a moment earlier created the rows of every shard and opened
/// its share; this instance opens the rest at its own start. Records written after the
/// first instance's `start` returned, before this one started, are not missed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shards_whose_rows_another_instance_created_open_where_it_started() {
    support::init_tracing();
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 4).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let store = MemoryLeaseStore::new();
    // "b" is registered as live, so "a" opens only half of the shards.
    let row = Lease::new(STREAM.to_owned(), "worker:b".to_owned(), Vec::new());
    store.create(&row).await.unwrap();
    store.take(&row, "b").await.unwrap();

    let mut a = builder(&api, &store, "a").start().await.unwrap();
    let between = write(&memory, "between", 40);
    let mut b = builder(&api, &store, "b").start().await.unwrap();
    let after = write(&memory, "after", 40);

    let mut expected = between;
    expected.extend(after);
    let mut got: BTreeSet<String> = BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    while !expected.is_subset(&got) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never delivered: {:?}",
            expected.difference(&got).collect::<Vec<_>>()
        );
        tokio::select! {
            Some(Ok(d)) = a.next() => { got.insert(String::from_utf8_lossy(d.data()).into_owned()); d.ack(); }
            Some(Ok(d)) = b.next() => { got.insert(String::from_utf8_lossy(d.data()).into_owned()); d.ack(); }
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A first start at the tip of a stream that was resharded twice before: no closed shard is
/// read (nothing written before the start is delivered), every open shard starts at the tip,
/// and what is written after the start comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_start_at_the_tip_of_a_resharded_stream_reads_no_closed_shard() {
    support::init_tracing();
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 2).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let store = MemoryLeaseStore::new();
    let half = u128::MAX / 2;
    let mut before = write(&memory, "old", 24);
    memory
        .split_shard(STREAM, "shardId-000000000000", &(half / 2).to_string())
        .await
        .unwrap();
    before.extend(write(&memory, "older", 24));
    memory
        .split_shard(STREAM, "shardId-000000000002", &(half / 4).to_string())
        .await
        .unwrap();
    before.extend(write(&memory, "oldest", 24));

    let mut sub = builder(&api, &store, "a").start().await.unwrap();
    let after = write(&memory, "new", 48);
    let got = read_until(&mut sub, &after, "a tip start").await;
    // Give any closed shard that would be read time to show up.
    let more = tokio::time::timeout(Duration::from_millis(1500), sub.next()).await;
    assert!(more.is_err(), "nothing else comes: {more:?}");
    let replayed: Vec<&String> = got.iter().filter(|g| before.contains(*g)).collect();
    assert!(
        replayed.is_empty(),
        "records written before the start: {replayed:?}"
    );
    sub.shutdown().await;
}

/// A seek back is recorded in the lease table before anything is settled after it: an
/// instance that takes the shard over after a crash replays from the seek's position, not
/// from the checkpoint written before the seek.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_seek_back_survives_a_crash_before_anything_is_settled() {
    support::init_tracing();
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let store = MemoryLeaseStore::new();
    let first = write(&memory, "r", 20);
    let mut a = builder(&api, &store, "a")
        .start_at(KinesisPosition::horizon())
        .start()
        .await
        .unwrap();
    read_until(&mut a, &first, "the first reading").await;
    // The checkpoint reaches the last record.
    tokio::time::sleep(Duration::from_millis(400)).await;
    a.seeker().seek(KinesisPosition::horizon()).await.unwrap();
    // Something is delivered again after the seek, but nothing is settled: then a crash.
    let again = tokio::time::timeout(Duration::from_secs(5), a.next()).await;
    assert!(matches!(again, Ok(Some(Ok(_)))), "{again:?}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.abort();

    let mut b = builder(&api, &store, "b").start().await.unwrap();
    let got = read_until(&mut b, &first, "the instance taking over").await;
    assert_eq!(got.len(), first.len(), "each record once: {got:?}");
    b.shutdown().await;
}

/// A pipeline run the way `#[tokio::main]` runs its main future (a multi-thread runtime's
/// `block_on`) that spent the task's coop budget (as any tokio channel, lock or socket
/// spends it) waits for the next record as usual. With the budget spent, a caught-up shard
/// reader's timer answers `Pending` and wakes itself during the poll; the merge of shards must
/// hand that back to the task instead of polling the reader again at once, forever.
#[test]
fn a_pipeline_that_spent_the_runtime_budget_waits_for_the_next_record() {
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    // Its own thread, so a merge that never returns fails the test instead of hanging it.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let all_read = runtime.block_on(async {
            let memory = MemoryKinesis::new();
            memory.add_stream(STREAM, 1).unwrap();
            let mut expected = write(&memory, "before", 20);
            let api: SharedKinesis = Arc::new(memory.clone());
            let store = MemoryLeaseStore::new();
            let mut sub = builder(&api, &store, "a")
                .start_at(KinesisPosition::horizon())
                .start()
                .await
                .unwrap();
            let mut seen = BTreeSet::new();
            for round in 0..5 {
                while seen.len() < expected.len() {
                    let delivery = sub.next().await.expect("open").expect("no error item");
                    seen.insert(String::from_utf8_lossy(delivery.data()).into_owned());
                    delivery.ack();
                }
                // Caught up: the budget is spent, and the next record comes a moment later.
                while tokio::task::coop::has_budget_remaining() {
                    tokio::task::coop::consume_budget().await;
                }
                let later = memory.clone();
                let tag = format!("after-{round}");
                expected.insert(format!("{tag}:00000"));
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    write(&later, &tag, 1)
                });
            }
            while seen.len() < expected.len() {
                let delivery = sub.next().await.expect("open").expect("no error item");
                seen.insert(String::from_utf8_lossy(delivery.data()).into_owned());
                delivery.ack();
            }
            sub.shutdown().await;
            seen == expected
        });
        let _ = done_tx.send(all_read);
    });
    let all_read = done_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the pipeline read every record without hanging");
    assert!(all_read);
}

/// Holds the first renewal of `SHARD0` after it is armed until told to go on.
#[derive(Default)]
struct HeldRenewal {
    armed: std::sync::atomic::AtomicBool,
    started: tokio::sync::Notify,
    go: tokio::sync::Notify,
}

impl LeaseLayer for HeldRenewal {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        use std::sync::atomic::Ordering;
        Box::pin(async move {
            if let LeaseCall::Renew { lease } = &call
                && lease.shard_id == SHARD0
                && self.armed.swap(false, Ordering::SeqCst)
            {
                self.started.notify_one();
                self.go.notified().await;
            }
            next.await
        })
    }
}

const SHARD0: &str = "shardId-000000000000";

/// A seek that moves a shard's reader while its keeper is losing the lease (another owner
/// took the row during a renewal): the loss must still end the shard here. Before, the
/// loss was ignored as a report of the old reader, and the new reader went on with no keeper:
/// nothing renewed or checkpointed it, and a sink's close over its deliveries waited for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_while_a_seek_moves_the_reader_ends_the_shard_here() {
    use futures::SinkExt;
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    write(&memory, "r", 20);
    let api: SharedKinesis = Arc::new(memory);
    let raw = MemoryLeaseStore::new();
    let hold = Arc::new(HeldRenewal::default());
    let store = LayeredStore::new(Arc::new(raw.clone()), hold.clone());
    let mut sub = support::reading::fast(&api, Arc::new(store), STREAM, "a")
        .initial_position(KinesisPosition::horizon())
        .list_interval(Duration::from_secs(60))
        .start()
        .await
        .unwrap();
    for _ in 0..20 {
        sub.next().await.unwrap().unwrap().ack();
    }
    hold.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(10), hold.started.notified())
        .await
        .expect("a renewal started");
    // While the renewal is on its way, another owner takes the row, and a seek comes.
    let ids = [SHARD0.to_owned()];
    let row = raw.get(STREAM, &ids).await.unwrap().pop().unwrap();
    raw.take(&row, "other").await.unwrap();
    let seeker = sub.seeker();
    let seek = tokio::spawn(async move { seeker.seek(KinesisPosition::horizon()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    hold.go.notify_one();
    let _ = tokio::time::timeout(Duration::from_secs(10), seek).await;
    let mut after = Vec::new();
    support::eventually("the shard is let go", Duration::from_secs(10), async || {
        while let Ok(Some(Ok(d))) =
            tokio::time::timeout(Duration::from_millis(50), sub.next()).await
        {
            after.push(d);
        }
        sub.shards().is_empty()
    })
    .await;
    if let Some(delivery) = after.pop() {
        let mut sink = AckSink::new();
        sink.feed(delivery).await.unwrap();
        let close =
            SinkExt::<kinesis_dataflow::Delivery<kinesis_dataflow::Record>>::close(&mut sink);
        let closed = tokio::time::timeout(Duration::from_secs(15), close)
            .await
            .expect("the close does not wait for a checkpoint nobody will write");
        assert!(closed.is_err(), "no checkpoint covers it: {closed:?}");
    }
    drop(after);
    sub.shutdown().await;
}

/// An instance whose take of a shard is still under way (here, waiting on its position
/// source) when another declares it gone (releases its worker row) and takes the shard at
/// once must not read the shard when its own take completes: the lease is the other's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_under_way_when_the_instance_is_declared_gone_is_not_read() {
    use kinesis_dataflow::subscription::{PositionSourceError, position_source_fn};
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 1).unwrap();
    let first = memory.put(STREAM, "k", "r0").unwrap().1;
    write(&memory, "r", 5);
    let api: SharedKinesis = Arc::new(memory);
    let store = MemoryLeaseStore::new();
    // Read before: the take records no start of its own (which would find the lease moved).
    let mut row = Lease::new(STREAM.to_owned(), SHARD0.to_owned(), Vec::new());
    row.checkpoint = Some(kinesis_dataflow::position::Checkpoint::Sequence(first));
    store.create(&row).await.unwrap();
    let asked = Arc::new(tokio::sync::Notify::new());
    let go = Arc::new(tokio::sync::Notify::new());
    let source = position_source_fn({
        let (asked, go) = (asked.clone(), go.clone());
        move |_stream: String, _shard: String| {
            let (asked, go) = (asked.clone(), go.clone());
            async move {
                asked.notify_one();
                go.notified().await;
                Ok::<_, PositionSourceError>(None)
            }
        }
    });
    let starting = tokio::spawn(
        builder(&api, &store, "b")
            .initial_position(KinesisPosition::horizon())
            .lease_duration(Duration::from_secs(30))
            .position_source(source)
            .start(),
    );
    tokio::time::timeout(Duration::from_secs(10), asked.notified())
        .await
        .expect("the shard is taken and its source asked");
    // Another instance declares "b" gone, and "b" makes its worker row anew.
    let worker = |rows: &[Lease]| rows.iter().find(|r| r.shard_id == "worker:b").cloned();
    let row = worker(&store.list(STREAM).await.unwrap()).expect("b's worker row");
    store.release(&row).await.unwrap();
    support::eventually(
        "b makes its worker row anew",
        Duration::from_secs(10),
        async || {
            let rows = store.list(STREAM).await.unwrap();
            worker(&rows)
                .is_some_and(|r| r.owner.as_deref() == Some("b") && r.counter > row.counter)
        },
    )
    .await;
    // The other takes the shard at once, then "b"'s take completes.
    let ids = [SHARD0.to_owned()];
    let shard = store.get(STREAM, &ids).await.unwrap().pop().unwrap();
    assert_eq!(shard.owner.as_deref(), Some("b"));
    store.take(&shard, "a").await.unwrap();
    go.notify_one();
    let mut sub = tokio::time::timeout(Duration::from_secs(10), starting)
        .await
        .expect("b started")
        .unwrap()
        .unwrap();
    let read = tokio::time::timeout(Duration::from_secs(2), sub.next()).await;
    assert!(
        !matches!(read, Ok(Some(Ok(_)))),
        "b read a shard whose lease is a's: {read:?}"
    );
    sub.shutdown().await;
}
