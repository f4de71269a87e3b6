//! The streams of a `MultiSubscription` are judged alive by one worker row, their anchor
//! stream's (in memory, paused time, default timings): the watch reads of an instance do not
//! grow with its streams, a frozen instance of several streams is taken over in every stream
//! within 5 s through that one row and hands out nothing its successor read (also once it
//! comes back, and when it is declared gone twice), a slow but alive one keeps its shards, and
//! an instance whose anchor row alone cannot be written stops every stream.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{Lease, LeaseError, LeaseFuture, LeaseStore, SharedLeaseStore};
use kinesis_dataflow::subscription::{DEFAULT_WORKER_TIMEOUT, SubscriptionBuilder};
use kinesis_dataflow::{
    KinesisPosition, MemoryKinesis, MemoryLeaseStore, MultiSubscription, StreamSet,
};
use support::cutoff::CutOff;
use support::slow::Slow;
use tokio::time::Instant;

const SHARDS: u32 = 2;

fn names(streams: usize) -> Vec<String> {
    (0..streams).map(|i| format!("s{i}")).collect()
}

fn setup(streams: usize) -> (MemoryKinesis, SharedKinesis, MemoryLeaseStore) {
    let memory = MemoryKinesis::new();
    for name in names(streams) {
        memory.add_stream(&name, SHARDS).unwrap();
    }
    let api: SharedKinesis = Arc::new(memory.clone());
    (memory, api, MemoryLeaseStore::new())
}

/// An instance reading every stream, with the library's defaults.
async fn start(
    api: &SharedKinesis,
    store: SharedLeaseStore,
    streams: usize,
    owner: &str,
) -> MultiSubscription {
    start_with(api, store, streams, owner, |each| each).await
}

/// An instance reading every stream, with the library's defaults changed by `tweak`.
async fn start_with(
    api: &SharedKinesis,
    store: SharedLeaseStore,
    streams: usize,
    owner: &str,
    tweak: impl FnOnce(SubscriptionBuilder) -> SubscriptionBuilder,
) -> MultiSubscription {
    start_set(api, store, StreamSet::new(names(streams)), owner, tweak).await
}

/// An instance reading the streams of `set` (a handle the test keeps), with the library's
/// defaults changed by `tweak`.
async fn start_set(
    api: &SharedKinesis,
    store: SharedLeaseStore,
    set: StreamSet,
    owner: &str,
    tweak: impl FnOnce(SubscriptionBuilder) -> SubscriptionBuilder,
) -> MultiSubscription {
    let owner = owner.to_owned();
    MultiSubscription::builder(api.clone(), store, set)
        .configure(|each| {
            tweak(
                each.owner(owner)
                    .initial_position(KinesisPosition::horizon()),
            )
        })
        .start()
        .await
        .unwrap()
}

/// Polls each of `subs` once (for up to 20 ms), acking what comes.
async fn drive(subs: &mut [&mut MultiSubscription]) {
    for sub in subs.iter_mut() {
        if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(20), sub.next()).await {
            d.ack();
        }
    }
}

/// Drives `subs` until each holds `share` shards.
async fn balance(subs: &mut [&mut MultiSubscription], share: usize) {
    let until = Instant::now() + Duration::from_secs(120);
    while subs.iter().any(|sub| sub.shards().len() != share) {
        assert!(Instant::now() < until, "not balanced in 120 s");
        drive(subs).await;
    }
}

/// Shard rows of a `MultiSubscription`: (stream, shard).
type At = (String, String);

/// One delivery of `sub` within `wait`, acked: where it came from and its payload.
async fn next_of(sub: &mut MultiSubscription, wait: Duration) -> Option<(At, String)> {
    let Ok(Some(Ok(d))) = tokio::time::timeout(wait, sub.next()).await else {
        return None;
    };
    let at = (
        d.stream().unwrap_or_default().to_owned(),
        d.shard_id().to_owned(),
    );
    let payload = String::from_utf8_lossy(d.data()).into_owned();
    d.ack();
    Some((at, payload))
}

/// Writes a round of 8 records to each of `streams` streams every `every` (when due).
struct Feed {
    streams: usize,
    every: Duration,
    round: usize,
    next: Instant,
}

impl Feed {
    fn new(streams: usize, every: Duration) -> Self {
        Self {
            streams,
            every,
            round: 0,
            next: Instant::now(),
        }
    }

    fn tick(&mut self, memory: &MemoryKinesis) {
        if Instant::now() < self.next {
            return;
        }
        for stream in names(self.streams) {
            for i in 0..8 {
                let payload = format!("{stream}-{}-{i}", self.round);
                memory.put(&stream, &format!("k{i}"), payload).unwrap();
            }
        }
        self.round += 1;
        self.next += self.every;
    }
}

/// Counts the rows one instance reads one at a time (`get`): worker and roster rows.
struct Reads(Arc<AtomicU64>);

impl LeaseLayer for Reads {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        if let LeaseCall::Get { ids, .. } = call {
            self.0.fetch_add(ids.len() as u64, Relaxed);
        }
        next
    }
}

/// Rows read a second by one of two idle instances reading `streams` streams, over two
/// minutes once they are balanced.
async fn watch_reads_per_second(streams: usize) -> f64 {
    let (_memory, api, store) = setup(streams);
    let reads = Arc::new(AtomicU64::new(0));
    let counted: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        Reads(reads.clone()),
    ));
    let mut a = start(&api, counted, streams, "a").await;
    let mut b = start(&api, Arc::new(store.clone()), streams, "b").await;
    balance(&mut [&mut a, &mut b], streams).await;
    let before = reads.load(Relaxed);
    let span = Duration::from_secs(120);
    let until = Instant::now() + span;
    while Instant::now() < until {
        drive(&mut [&mut a, &mut b]).await;
    }
    let per_second = (reads.load(Relaxed) - before) as f64 / span.as_secs_f64();
    a.shutdown().await;
    b.shutdown().await;
    per_second
}

#[tokio::test(start_paused = true)]
async fn the_watch_reads_of_an_instance_do_not_grow_with_its_streams() {
    let one = watch_reads_per_second(1).await;
    let two = watch_reads_per_second(2).await;
    let five = watch_reads_per_second(5).await;
    eprintln!(
        "rows read a second by one instance: 1 stream {one:.2}, 2 streams {two:.2}, 5 streams {five:.2}"
    );
    assert!(one > 0.0);
    // With several streams the anchor reads the table-wide roster row in place of its own,
    // and nothing is read for each stream added (a stream's own roster row is read only when
    // the table-wide one moved).
    for (streams, reads) in [(2, two), (5, five)] {
        assert!(
            reads <= one * 1.05,
            "1 stream: {one:.2}/s, {streams} streams: {reads:.2}/s"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_frozen_instance_of_several_streams_is_taken_over_everywhere_through_its_anchor() {
    const STREAMS: usize = 3;
    let (memory, api, store) = setup(STREAMS);
    let a_view = CutOff::new(Arc::new(store.clone()));
    let mut a = start(&api, a_view.store(), STREAMS, "a").await;
    let mut b = start(&api, Arc::new(store.clone()), STREAMS, "b").await;
    balance(&mut [&mut a, &mut b], STREAMS).await;
    let a_shards: BTreeSet<At> = a.shards().into_iter().collect();

    // A loses the table and is not read (as a frozen process is not); what it read meanwhile
    // waits in it. B takes A's shards of every stream once A's anchor row is stale.
    a_view.set_down(true);
    let cut = Instant::now();
    for stream in names(STREAMS) {
        for i in 0..8 {
            memory
                .put(&stream, &format!("k{i}"), format!("{stream}-{i}"))
                .unwrap();
        }
    }
    let mut resumed: BTreeMap<At, Duration> = BTreeMap::new();
    let mut b_got = BTreeSet::new();
    while resumed.len() < a_shards.len() {
        assert!(
            cut.elapsed() < Duration::from_secs(30),
            "B did not take A's shards: {resumed:?} of {a_shards:?}"
        );
        if let Some((at, payload)) = next_of(&mut b, Duration::from_millis(50)).await {
            if a_shards.contains(&at) {
                resumed.entry(at).or_insert_with(|| cut.elapsed());
            }
            b_got.insert(payload);
        }
    }
    let takeover = resumed.values().max().copied().unwrap();
    assert!(
        takeover <= Duration::from_secs(5),
        "A's shards resumed on B after {resumed:?}"
    );
    // A comes back: it hands out nothing B read.
    a_view.set_down(false);
    let until = Instant::now() + Duration::from_secs(20);
    while Instant::now() < until {
        if let Some((_, payload)) = next_of(&mut a, Duration::from_millis(50)).await {
            assert!(
                !b_got.contains(&payload),
                "A handed out {payload} after B read it"
            );
        }
        if let Some((_, payload)) = next_of(&mut b, Duration::from_millis(50)).await {
            b_got.insert(payload);
        }
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_instance_of_several_streams_keeps_its_shards() {
    const STREAMS: usize = 3;
    let (_memory, api, store) = setup(STREAMS);
    // Each of A's calls takes 1.2 s: more than a third of the worker timeout.
    let slow: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        Slow(DEFAULT_WORKER_TIMEOUT * 3 / 10),
    ));
    let mut a = start(&api, slow, STREAMS, "a").await;
    let mut b = start(&api, Arc::new(store.clone()), STREAMS, "b").await;
    balance(&mut [&mut a, &mut b], STREAMS).await;
    let a_shards = a.shards();
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        drive(&mut [&mut a, &mut b]).await;
        assert_eq!(a.shards(), a_shards, "A was declared gone");
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// Once armed, writes of one worker row (`row` of `stream`) never answer; everything else
/// does.
struct StuckRow {
    stream: &'static str,
    row: &'static str,
    armed: Arc<std::sync::atomic::AtomicBool>,
}

impl LeaseLayer for StuckRow {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let lease = match call {
            LeaseCall::Renew { lease } | LeaseCall::Take { lease, .. } => Some(lease),
            LeaseCall::Create { lease } => Some(lease),
            _ => None,
        };
        let stuck = lease.is_some_and(|l| l.stream == self.stream && l.shard_id == self.row);
        if stuck && self.armed.load(Relaxed) {
            Box::pin(futures::future::pending())
        } else {
            next
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_instance_whose_anchor_row_is_stale_stops_every_stream_and_is_taken_over_in_each() {
    const STREAMS: usize = 3;
    let (memory, api, store) = setup(STREAMS);
    support::init_tracing();
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a_store: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        StuckRow {
            stream: "s0",
            row: "worker:a",
            armed: armed.clone(),
        },
    ));
    let mut a = start(&api, a_store, STREAMS, "a").await;
    let mut b = start(&api, Arc::new(store.clone()), STREAMS, "b").await;
    balance(&mut [&mut a, &mut b], STREAMS).await;
    let a_shards: BTreeSet<At> = a.shards().into_iter().collect();
    // From now on only A's worker row of its anchor stream (the first) cannot be written:
    // its other rows and its leases stay fresh.
    armed.store(true, Relaxed);
    let cut = Instant::now();
    let mut feed = Feed::new(STREAMS, Duration::from_millis(250));
    // When B first handed out a record of each of A's shards, and when A last did.
    let mut resumed: BTreeMap<At, Duration> = BTreeMap::new();
    let mut a_last: BTreeMap<At, Duration> = BTreeMap::new();
    // Driven 10 s past B's takeover, so a reader of A still open then would show.
    let mut done_at = None;
    while done_at.is_none_or(|at| cut.elapsed() < at) {
        assert!(
            cut.elapsed() < Duration::from_secs(40),
            "B did not take A's shards: {resumed:?} of {a_shards:?}"
        );
        // Records keep coming on every shard, so whoever reads a shard has something to show.
        feed.tick(&memory);
        if let Some((at, _)) = next_of(&mut a, Duration::from_millis(20)).await {
            a_last.insert(at, cut.elapsed());
        }
        if let Some((at, _)) = next_of(&mut b, Duration::from_millis(20)).await
            && a_shards.contains(&at)
        {
            resumed.entry(at).or_insert_with(|| cut.elapsed());
        }
        if done_at.is_none() && resumed.len() == a_shards.len() {
            done_at = Some(cut.elapsed() + Duration::from_secs(10));
        }
    }
    let takeover = resumed.values().max().copied().unwrap();
    assert!(
        takeover <= Duration::from_secs(5),
        "A's shards resumed on B after {resumed:?}"
    );
    for (shard, b_first) in &resumed {
        let a_then = a_last.get(shard).copied().unwrap_or_default();
        assert!(
            a_then < *b_first,
            "A handed out a record of {shard:?} at {a_then:?}, after B began reading it at {b_first:?}"
        );
    }
    a.abort();
    b.shutdown().await;
}

/// Rows read a second by one of `instances` idle instances, each reading `streams` streams
/// of `shards` shards, over two minutes once balanced: with one `MultiSubscription` each
/// (`grouped`), or with one `Subscription` per stream (how the streams were read before they
/// formed a liveness group).
async fn reads_per_instance(instances: usize, streams: usize, shards: u32, grouped: bool) -> f64 {
    let memory = MemoryKinesis::new();
    for name in names(streams) {
        memory.add_stream(&name, shards).unwrap();
    }
    let api: SharedKinesis = Arc::new(memory.clone());
    let store = MemoryLeaseStore::new();
    let reads = Arc::new(AtomicU64::new(0));
    let counted: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        Reads(reads.clone()),
    ));
    let mut subs: Vec<futures::stream::BoxStream<'static, ()>> = Vec::new();
    let mut stops = Vec::new();
    for i in 0..instances {
        let store: SharedLeaseStore = if i == 0 {
            counted.clone()
        } else {
            Arc::new(store.clone())
        };
        let owner = format!("i{i}");
        if grouped {
            let sub = start(&api, store, streams, &owner).await;
            stops.push(sub.shutdown_handle());
            subs.push(Box::pin(sub.map(|item| drop(item.map(|d| d.ack())))));
        } else {
            for name in names(streams) {
                let sub = kinesis_dataflow::Subscription::builder(api.clone(), store.clone(), name)
                    .owner(owner.clone())
                    .initial_position(KinesisPosition::horizon())
                    .start()
                    .await
                    .unwrap();
                stops.push(sub.shutdown_handle());
                subs.push(Box::pin(sub.map(|item| drop(item.map(|d| d.ack())))));
            }
        }
    }
    let mut all = futures::stream::select_all(subs);
    // Balanced well before this; then two minutes are counted.
    let settle = Instant::now() + Duration::from_secs(60);
    while Instant::now() < settle {
        let _ = tokio::time::timeout(Duration::from_millis(100), all.next()).await;
    }
    let before = reads.load(Relaxed);
    let span = Duration::from_secs(120);
    let until = Instant::now() + span;
    while Instant::now() < until {
        let _ = tokio::time::timeout(Duration::from_millis(100), all.next()).await;
    }
    let per_second = (reads.load(Relaxed) - before) as f64 / span.as_secs_f64();
    for stop in stops {
        stop.shutdown().await;
    }
    per_second
}

/// The figures of BENCHMARKS.md's "Watch reads by number of streams": run with
/// `cargo test --test liveness_group -- --ignored --nocapture`.
#[tokio::test(start_paused = true)]
#[ignore = "a measurement; prints its table"]
async fn watch_reads_by_number_of_streams() {
    const INSTANCES: usize = 4;
    println!(
        "rows read a second by one of {INSTANCES} idle instances (each row one consistent read \
         unit), 4 shards a stream"
    );
    println!(
        "{:>8} {:>22} {:>18} {:>8}",
        "streams", "a Subscription each", "MultiSubscription", "ratio"
    );
    for streams in [1, 5, 20] {
        let apart = reads_per_instance(INSTANCES, streams, 4, false).await;
        let grouped = reads_per_instance(INSTANCES, streams, 4, true).await;
        println!(
            "{streams:>8} {apart:>22.2} {grouped:>18.2} {:>8.3}",
            grouped / apart
        );
    }
}

/// Once armed: writes of A's worker row of the anchor stream wait until disarmed, then go
/// through (as calls the network held up land late); renewals of A's shard leases of the
/// other streams, and its listings of them, never answer from then on (so A cannot learn
/// there that those leases are gone: only its gates can stop its readers).
struct HeldUp {
    armed: tokio::sync::watch::Receiver<bool>,
    stuck: std::sync::atomic::AtomicBool,
}

impl LeaseLayer for HeldUp {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let armed = *self.armed.borrow();
        if armed {
            self.stuck.store(true, Relaxed);
        }
        let (stuck, anchor_row) = match call {
            LeaseCall::List { stream, .. } => (stream != "s0", false),
            LeaseCall::Renew { lease } => (
                lease.stream != "s0" && lease.shard_id.starts_with("shardId"),
                lease.stream == "s0" && lease.shard_id == "worker:a",
            ),
            LeaseCall::Take { lease, .. } | LeaseCall::Create { lease } => {
                (false, lease.stream == "s0" && lease.shard_id == "worker:a")
            }
            _ => (false, false),
        };
        if stuck && self.stuck.load(Relaxed) {
            return Box::pin(futures::future::pending());
        }
        if !(armed && anchor_row) {
            return next;
        }
        let mut armed = self.armed.clone();
        Box::pin(async move {
            let _ = armed.wait_for(|armed| !*armed).await;
            next.await
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_declared_instance_reads_nothing_in_parallel_with_its_successor_once_its_anchor_row_is_back()
 {
    const STREAMS: usize = 3;
    let (memory, api, store) = setup(STREAMS);
    let (arm, armed) = tokio::sync::watch::channel(false);
    let a_store: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        HeldUp {
            armed,
            stuck: Default::default(),
        },
    ));
    // Long leases: A's readers of the other streams stay open by their leases alone for 40 s,
    // while a declaration frees them for B at once.
    let long = |each: SubscriptionBuilder| each.lease_duration(Duration::from_secs(60));
    let mut a = start_with(&api, a_store, STREAMS, "a", long).await;
    let mut b = start_with(&api, Arc::new(store.clone()), STREAMS, "b", long).await;
    balance(&mut [&mut a, &mut b], STREAMS).await;
    let a_shards: BTreeSet<At> = a.shards().into_iter().collect();
    // A's anchor row writes are held up: B declares A gone and takes its shards; the moment
    // it has, the held write lands (refused) and A takes its anchor row again. A is not read
    // from meanwhile, nor for 1.5 s after (a consumer that did not poll, as a frozen process
    // does not), so its readers of the other streams meet their gates only then.
    arm.send_replace(true);
    let cut = Instant::now();
    let mut feed = Feed::new(STREAMS, Duration::from_millis(100));
    let mut b_first: BTreeMap<At, Duration> = BTreeMap::new();
    let mut by_a: BTreeMap<String, (At, Duration)> = BTreeMap::new();
    let mut by_b: BTreeSet<String> = BTreeSet::new();
    let mut released_at: Option<Duration> = None;
    while released_at.is_none_or(|at| cut.elapsed() < at + Duration::from_secs(15)) {
        assert!(
            cut.elapsed() < Duration::from_secs(60),
            "B did not take A's shards: {b_first:?} of {a_shards:?}"
        );
        feed.tick(&memory);
        let read_a =
            released_at.is_some_and(|at| cut.elapsed() >= at + Duration::from_millis(1500));
        if read_a && let Some((at, payload)) = next_of(&mut a, Duration::from_millis(10)).await {
            by_a.insert(payload, (at, cut.elapsed()));
        }
        if let Some((at, payload)) = next_of(&mut b, Duration::from_millis(10)).await {
            if a_shards.contains(&at) {
                b_first.entry(at).or_insert_with(|| cut.elapsed());
            }
            by_b.insert(payload);
        }
        if released_at.is_none() && b_first.len() == a_shards.len() {
            arm.send_replace(false);
            released_at = Some(cut.elapsed());
        }
    }
    // A record both handed out is a redelivery when A had it before B began reading its
    // shard (B starts at A's last checkpoint); after that, the two read in parallel.
    for payload in &by_b {
        let Some((shard, a_at)) = by_a.get(payload) else {
            continue;
        };
        if let Some(b_at) = b_first.get(shard) {
            assert!(
                a_at < b_at,
                "A handed out {payload} of {shard:?} at {a_at:?}, after B began reading that shard at {b_at:?}"
            );
        }
    }
    // A's renewals that never answer would hold its stop up to its shutdown timeout.
    a.abort();
    b.shutdown().await;
}

/// Once armed, deletes of A's worker row of the anchor stream fail (a throttled DeleteItem).
struct FailDelete(Arc<std::sync::atomic::AtomicBool>);

impl LeaseLayer for FailDelete {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        if let LeaseCall::Delete { lease } = call
            && lease.stream == "s0"
            && lease.shard_id == "worker:a"
            && self.0.load(Relaxed)
        {
            let operation = call.operation();
            return Box::pin(async move {
                Err(LeaseError::Unavailable {
                    table: "leases".into(),
                    operation,
                    message: "throttled".into(),
                    source: None,
                })
            });
        }
        next
    }
}

/// Drives `subs` with `feed` running for `span`, counting the deliveries of each shard from
/// `counted_after` on.
async fn read_for(
    subs: &mut [&mut MultiSubscription],
    memory: &MemoryKinesis,
    feed: &mut Feed,
    span: Duration,
    counted_after: Duration,
) -> BTreeMap<At, usize> {
    let start = Instant::now();
    let mut read: BTreeMap<At, usize> = BTreeMap::new();
    while start.elapsed() < span {
        feed.tick(memory);
        for sub in subs.iter_mut() {
            if let Some((at, _)) = next_of(sub, Duration::from_millis(20)).await
                && start.elapsed() >= counted_after
            {
                *read.entry(at).or_default() += 1;
            }
        }
    }
    read
}

/// The anchor stream leaves A's set (its worker row's delete would fail): the other streams'
/// readers answer to that row, which A keeps while they run, so every shard of theirs is still
/// read long after; inserted again, the anchor stream takes its row back and is read too.
#[tokio::test(start_paused = true)]
async fn the_anchor_stream_leaving_the_set_and_coming_back_leaves_every_shard_read() {
    const STREAMS: usize = 3;
    let (memory, api, store) = setup(STREAMS);
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a_store: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        FailDelete(armed.clone()),
    ));
    let a_set = StreamSet::new(names(STREAMS));
    let mut a = start_set(&api, a_store, a_set.clone(), "a", |each| each).await;
    let mut b = start(&api, Arc::new(store.clone()), STREAMS, "b").await;
    balance(&mut [&mut a, &mut b], STREAMS).await;
    armed.store(true, Relaxed);
    assert!(a_set.remove("s0"));
    let mut feed = Feed::new(STREAMS, Duration::from_millis(250));
    let minute = Duration::from_secs(60);
    let read = read_for(
        &mut [&mut a, &mut b],
        &memory,
        &mut feed,
        5 * minute,
        4 * minute,
    )
    .await;
    let others: Vec<&At> = read.keys().filter(|(stream, _)| stream != "s0").collect();
    assert_eq!(
        others.len(),
        2 * (STREAMS - 1),
        "shards of the other streams read 4 to 5 minutes after the anchor left: {read:?}"
    );
    armed.store(false, Relaxed);
    assert!(a_set.insert("s0".to_owned()));
    let read = read_for(
        &mut [&mut a, &mut b],
        &memory,
        &mut feed,
        2 * minute,
        minute,
    )
    .await;
    assert_eq!(
        read.len(),
        2 * STREAMS,
        "every shard read a minute after the anchor came back: {read:?}"
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A mixed fleet on the anchor stream: two plain `Subscription`s read s0 only; `x` and `y`
/// read {s0, s1} as `MultiSubscription`s. In s0's ring x is watched by the plain ones only,
/// and y's s1 leaves x out (its anchor's watch covers it). x freezes: a plain one declares it
/// gone through s0, and y takes x's shard of s1 as promptly.
#[tokio::test(start_paused = true)]
async fn a_declaration_by_an_instance_outside_the_group_reaches_its_other_streams() {
    let memory = MemoryKinesis::new();
    memory.add_stream("s0", 4).unwrap();
    memory.add_stream("s1", 2).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let store = MemoryLeaseStore::new();
    let two = || StreamSet::new(["s0", "s1"]);
    let mut plain = Vec::new();
    for owner in ["p1", "p2"] {
        let sub =
            kinesis_dataflow::Subscription::builder(api.clone(), Arc::new(store.clone()), "s0")
                .owner(owner)
                .initial_position(KinesisPosition::horizon())
                .start()
                .await
                .unwrap();
        plain.push(sub);
    }
    let drive_plain = async |plain: &mut Vec<kinesis_dataflow::Subscription>| {
        for sub in plain.iter_mut() {
            if let Ok(Some(Ok(d))) =
                tokio::time::timeout(Duration::from_millis(10), sub.next()).await
            {
                d.ack();
            }
        }
    };
    let x_view = CutOff::new(Arc::new(store.clone()));
    let mut x = start_set(&api, x_view.store(), two(), "x", |each| each).await;
    let mut y = start_set(&api, Arc::new(store.clone()), two(), "y", |each| each).await;
    let in_s1 = |sub: &MultiSubscription| -> Vec<At> {
        sub.shards()
            .into_iter()
            .filter(|(s, _)| s == "s1")
            .collect()
    };
    let until = Instant::now() + Duration::from_secs(120);
    while !(in_s1(&x).len() == 1 && in_s1(&y).len() == 1 && x.shards().len() == 2) {
        assert!(
            Instant::now() < until,
            "not balanced: x {:?} y {:?}",
            x.shards(),
            y.shards()
        );
        drive(&mut [&mut x, &mut y]).await;
        drive_plain(&mut plain).await;
    }
    let x_s1 = in_s1(&x);
    x_view.set_down(true);
    let cut = Instant::now();
    let mut feed = Feed::new(2, Duration::from_millis(250));
    let took = loop {
        assert!(cut.elapsed() < Duration::from_secs(120), "never taken over");
        feed.tick(&memory);
        if let Some((at, _)) = next_of(&mut y, Duration::from_millis(10)).await
            && x_s1.contains(&at)
        {
            break cut.elapsed();
        }
        drive_plain(&mut plain).await;
    };
    assert!(
        took <= Duration::from_secs(5),
        "x's shard of s1 resumed on y after {took:?}"
    );
    x.abort();
    y.shutdown().await;
    for mut sub in plain {
        sub.shutdown().await;
    }
}

/// Drives `subs` for three minutes and asserts that `shards` shards were read in the last one.
async fn every_shard_read(
    subs: &mut [&mut MultiSubscription],
    memory: &MemoryKinesis,
    feed: &mut Feed,
    shards: usize,
) {
    let minute = Duration::from_secs(60);
    let read = read_for(subs, memory, feed, 3 * minute, 2 * minute).await;
    assert_eq!(
        read.len(),
        shards,
        "every shard read 2 to 3 minutes after: {read:?}"
    );
}

/// The worker row of `owner` in `stream`, if any.
async fn worker_row(store: &MemoryLeaseStore, stream: &str, owner: &str) -> Option<Lease> {
    let rows = store.list(stream).await.unwrap();
    rows.into_iter()
        .find(|row| row.shard_id == format!("worker:{owner}"))
}

/// The anchor stream leaves A's set only (B still reads it): A keeps nothing of it, so B reads
/// both its shards; and the anchor stream removed, inserted and removed again in quick
/// succession leaves A's other streams read (the group dissolves at the anchor's first stop).
#[tokio::test(start_paused = true)]
async fn the_anchor_stream_leaving_one_instance_is_read_by_the_others_and_its_streams_go_on() {
    const STREAMS: usize = 3;
    let (memory, api, store) = setup(STREAMS);
    let a_set = StreamSet::new(names(STREAMS));
    let mut a = start_set(&api, Arc::new(store.clone()), a_set.clone(), "a", |each| {
        each
    })
    .await;
    let mut b = start(&api, Arc::new(store.clone()), STREAMS, "b").await;
    balance(&mut [&mut a, &mut b], STREAMS).await;
    assert!(a_set.remove("s0"));
    let mut feed = Feed::new(STREAMS, Duration::from_millis(250));
    every_shard_read(&mut [&mut a, &mut b], &memory, &mut feed, 2 * STREAMS).await;
    assert!(a.shards().iter().all(|(stream, _)| stream != "s0"));
    assert!(a_set.insert("s0".to_owned()));
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(a_set.remove("s0"));
    every_shard_read(&mut [&mut a, &mut b], &memory, &mut feed, 2 * STREAMS).await;
    a.shutdown().await;
    b.shutdown().await;
    for stream in names(STREAMS) {
        assert_eq!(worker_row(&store, &stream, "a").await, None, "{stream}");
        assert_eq!(worker_row(&store, &stream, "b").await, None, "{stream}");
    }
}

/// The anchor stream removed and at once inserted again, then the whole subscription stopped:
/// no worker row of the instance is left behind.
#[tokio::test(start_paused = true)]
async fn a_full_stop_right_after_the_anchor_came_back_leaves_no_worker_row() {
    const STREAMS: usize = 3;
    let (memory, api, store) = setup(STREAMS);
    let a_set = StreamSet::new(names(STREAMS));
    let mut a = start_set(&api, Arc::new(store.clone()), a_set.clone(), "a", |each| {
        each
    })
    .await;
    let mut feed = Feed::new(STREAMS, Duration::from_millis(250));
    let span = Duration::from_secs(20);
    read_for(&mut [&mut a], &memory, &mut feed, span, span).await;
    assert!(worker_row(&store, "s0", "a").await.is_some());
    assert!(a_set.remove("s0"));
    tokio::time::sleep(Duration::from_millis(5)).await;
    assert!(a_set.insert("s0".to_owned()));
    tokio::time::sleep(Duration::from_millis(5)).await;
    a.shutdown().await;
    for stream in names(STREAMS) {
        assert_eq!(worker_row(&store, &stream, "a").await, None, "{stream}");
    }
}

/// Once armed, A's checkpoints and releases of the anchor stream's shards, and the delete of
/// its worker row there, answer just inside the call timeout (3 s of its 3.3 s): with a
/// shutdown timeout of 100 ms, the anchor stream's stop outlasts its bound (the two summed).
struct SlowHandBack(Arc<std::sync::atomic::AtomicBool>);

impl LeaseLayer for SlowHandBack {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let slow = match call {
            LeaseCall::Release { lease } | LeaseCall::Checkpoint { lease, .. } => {
                lease.stream == "s0" && !lease.shard_id.starts_with("worker:")
            }
            LeaseCall::Delete { lease } => lease.stream == "s0" && lease.shard_id == "worker:a",
            _ => false,
        };
        if !(slow && self.0.load(Relaxed)) {
            return next;
        }
        Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(3)).await;
            next.await
        })
    }
}

/// The anchor stream leaves the set and its stop is cut short: the group dissolves all the
/// same, so the other streams go on being read.
#[tokio::test(start_paused = true)]
async fn a_cut_short_stop_of_the_anchor_stream_leaves_the_other_streams_read() {
    const STREAMS: usize = 3;
    let (memory, api, store) = setup(STREAMS);
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let a_store: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        SlowHandBack(armed.clone()),
    ));
    let a_set = StreamSet::new(names(STREAMS));
    let quick_stop = |each: SubscriptionBuilder| each.shutdown_timeout(Duration::from_millis(100));
    let mut a = start_set(&api, a_store, a_set.clone(), "a", quick_stop).await;
    let mut feed = Feed::new(STREAMS, Duration::from_millis(250));
    let span = Duration::from_secs(20);
    read_for(&mut [&mut a], &memory, &mut feed, span, span).await;
    armed.store(true, Relaxed);
    assert!(a_set.remove("s0"));
    let minute = Duration::from_secs(60);
    let read = read_for(&mut [&mut a], &memory, &mut feed, 3 * minute, 2 * minute).await;
    let others = read.keys().filter(|(stream, _)| stream != "s0").count();
    assert_eq!(
        others,
        2 * (STREAMS - 1),
        "the other streams' shards read 2 to 3 minutes after: {read:?}"
    );
    a.abort();
}
