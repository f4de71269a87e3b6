//! Takeover with the default settings (in memory, paused time): a crashed instance's shards
//! are read again within 5 s, because the others judge an instance by its worker row, which
//! goes stale after the worker timeout (4 s), not by each lease (10 s). And it stays safe: an
//! instance cut off from the lease table (as a frozen one is) hands out nothing once its
//! successor may read, a slow but alive instance keeps its shards, and a clock that is off
//! changes nothing.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::api::memory::hash_key;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{LeaseFuture, SharedLeaseStore};
use kinesis_dataflow::subscription::{Clock, DEFAULT_WORKER_TIMEOUT};
use kinesis_dataflow::{
    KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription, SubscriptionBuilder,
};
use support::cutoff::CutOff;
use support::slow::{Slow, SlowGets};
use tokio::time::Instant;

const STREAM: &str = "orders";
const SHARDS: u32 = 4;

fn setup() -> (MemoryKinesis, SharedKinesis, MemoryLeaseStore) {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, SHARDS).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    (memory, api, MemoryLeaseStore::new())
}

/// The library's defaults; only the owner and the first position are set.
fn defaults(api: &SharedKinesis, store: SharedLeaseStore, owner: &str) -> SubscriptionBuilder {
    Subscription::builder(api.clone(), store, STREAM)
        .owner(owner)
        .initial_position(KinesisPosition::horizon())
}

/// Puts one record on every shard, its payload naming the shard and `tag` (each key picked
/// so that it hashes into its shard's quarter of the key space).
fn put_everywhere(memory: &MemoryKinesis, tag: &str) {
    let quarter = u128::MAX / u128::from(SHARDS) + 1;
    for shard in 0..SHARDS {
        let key = (0..)
            .map(|i| format!("k{i}"))
            .find(|k| hash_key(k) / quarter == u128::from(shard))
            .unwrap();
        memory.put(STREAM, &key, format!("{tag}-{shard}")).unwrap();
    }
}

/// Polls each of `subs` once (for up to 20 ms), acking what comes.
async fn drive(subs: &mut [&mut Subscription]) {
    for sub in subs.iter_mut() {
        if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(20), sub.next()).await {
            d.ack();
        }
    }
}

/// Drives `subs` until each holds `shares[i]` shards.
async fn balance(subs: &mut [&mut Subscription], shares: &[usize]) {
    let until = Instant::now() + Duration::from_secs(120);
    while subs
        .iter()
        .zip(shares)
        .any(|(sub, share)| sub.shards().len() != *share)
    {
        assert!(Instant::now() < until, "not balanced in 120 s");
        drive(subs).await;
    }
}

/// A crashes (nothing flushed or released, its worker row and leases left as they were) and
/// a record is put on every shard; `b` is read (acking) until it delivered one of each of A's
/// shards. The longest time to that, and when each of A's shards was first read on `b`,
/// counted from the crash (90 s at most).
async fn crash_and_take_over(
    memory: &MemoryKinesis,
    a: Subscription,
    b: &mut Subscription,
) -> (Duration, BTreeMap<String, Duration>) {
    let a_shards: BTreeSet<String> = a.shards().into_iter().collect();
    a.abort();
    let crashed = Instant::now();
    put_everywhere(memory, "after");
    let mut resumed: BTreeMap<String, Duration> = BTreeMap::new();
    while resumed.len() < a_shards.len() {
        let delivery = tokio::time::timeout(Duration::from_secs(90), b.next())
            .await
            .expect("A's shards taken over")
            .expect("running")
            .expect("a delivery");
        let shard = delivery.shard_id().to_owned();
        if a_shards.contains(&shard) {
            resumed.entry(shard).or_insert_with(|| crashed.elapsed());
        }
        delivery.ack();
    }
    (resumed.values().max().copied().unwrap(), resumed)
}

/// Instances `a` and `b` on their lease-table views, holding two shards each.
async fn two_instances(
    api: &SharedKinesis,
    a_store: SharedLeaseStore,
    b_store: SharedLeaseStore,
) -> (Subscription, Subscription) {
    let mut a = defaults(api, a_store, "a").start().await.unwrap();
    let mut b = defaults(api, b_store, "b").start().await.unwrap();
    balance(&mut [&mut a, &mut b], &[2, 2]).await;
    (a, b)
}

/// A lease far longer than the worker timeout (60 s against 4 s) with frequent listings: the
/// worker timeout still governs a crash's takeover. The crashed instance's worker row must be
/// declared gone (which frees its leases), not deleted as stale by a listing first (which
/// leaves its leases to their 60 s), and the watch reads it at the worker timeout's pace.
#[tokio::test(start_paused = true)]
async fn a_long_lease_still_hands_a_crashed_instances_shards_over_within_the_worker_timeout() {
    let (memory, api, store) = setup();
    let long = |store: SharedLeaseStore, owner: &str| {
        defaults(&api, store, owner)
            .lease_duration(Duration::from_secs(60))
            .list_interval(Duration::from_millis(300))
    };
    // B's single-row reads (the watch's) answer in a second, its listings at once: a listing
    // sees A's worker row stale before the watch's read of it comes back.
    let b_store: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        SlowGets(Duration::from_secs(1)),
    ));
    let mut a = long(Arc::new(store.clone()), "a").start().await.unwrap();
    let mut b = long(b_store, "b").start().await.unwrap();
    balance(&mut [&mut a, &mut b], &[2, 2]).await;
    let (takeover, resumed) = crash_and_take_over(&memory, a, &mut b).await;
    // The worker timeout, the watch's slow read, and a second.
    assert!(
        takeover <= DEFAULT_WORKER_TIMEOUT + Duration::from_secs(2),
        "A's shards resumed on B after {resumed:?}"
    );
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_crashed_instance_is_taken_over_within_five_seconds_with_the_defaults() {
    let (memory, api, store) = setup();
    let (a, mut b) = two_instances(&api, Arc::new(store.clone()), Arc::new(store.clone())).await;
    let (takeover, resumed) = crash_and_take_over(&memory, a, &mut b).await;
    assert!(
        takeover <= Duration::from_secs(5),
        "A's shards resumed on B after {resumed:?}"
    );
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn an_instance_cut_off_from_the_lease_table_hands_out_nothing_once_it_may_be_taken_over() {
    let (memory, api, store) = setup();
    let a_view = CutOff::new(Arc::new(store.clone()));
    let (mut a, mut b) = two_instances(&api, a_view.store(), Arc::new(store.clone())).await;
    let a_shards: BTreeSet<String> = a.shards().into_iter().collect();

    // A loses the table and is not read (as a frozen process is not); what it read meanwhile
    // waits in it. B takes A's shards once A's worker row is stale.
    a_view.set_down(true);
    let cut = Instant::now();
    put_everywhere(&memory, "during");
    let mut b_first: Option<Duration> = None;
    let mut b_got = Vec::new();
    while b_got.len() < a_shards.len() {
        assert!(
            cut.elapsed() < Duration::from_secs(30),
            "B did not take A's shards"
        );
        if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(50), b.next()).await {
            if a_shards.contains(d.shard_id()) {
                b_first.get_or_insert_with(|| cut.elapsed());
                b_got.push(String::from_utf8_lossy(d.data()).into_owned());
            }
            d.ack();
        }
    }
    let b_first = b_first.unwrap();
    assert!(
        b_first <= Duration::from_secs(5),
        "B read A's shards after {b_first:?}"
    );

    // A is read again at once, still cut off, then once the table is back: nothing it hands
    // out is one of the records B read.
    for down in [true, false] {
        a_view.set_down(down);
        let until = Instant::now() + Duration::from_secs(10);
        while Instant::now() < until {
            if let Ok(Some(Ok(d))) = tokio::time::timeout(Duration::from_millis(50), a.next()).await
            {
                let payload = String::from_utf8_lossy(d.data()).into_owned();
                assert!(
                    !b_got.contains(&payload),
                    "A handed out {payload} after B read it"
                );
                d.ack();
            }
        }
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_instance_that_still_renews_keeps_its_shards() {
    let (_memory, api, store) = setup();
    // Each of A's calls takes 1.2 s: more than a third of the worker timeout.
    let slow: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        Slow(DEFAULT_WORKER_TIMEOUT * 3 / 10),
    ));
    let (mut a, mut b) = two_instances(&api, slow, Arc::new(store.clone())).await;
    let a_shards = a.shards();
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        drive(&mut [&mut a, &mut b]).await;
        assert_eq!(a.shards(), a_shards, "A was declared gone");
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A clock ahead of the tokio clock by a fixed amount.
#[derive(Debug)]
struct Ahead(Duration);

impl Clock for Ahead {
    fn now(&self) -> Instant {
        Instant::now() + self.0
    }
}

#[tokio::test(start_paused = true)]
async fn a_clock_ten_minutes_ahead_takes_nothing_from_a_live_instance() {
    let (_memory, api, store) = setup();
    let mut a = defaults(&api, Arc::new(store.clone()), "a")
        .start()
        .await
        .unwrap();
    balance(&mut [&mut a], &[SHARDS as usize]).await;
    let mut b = defaults(&api, Arc::new(store.clone()), "b")
        .clock(Arc::new(Ahead(Duration::from_secs(600))))
        .start()
        .await
        .unwrap();
    // B gets its share by hand-off only; it never declares A gone.
    balance(&mut [&mut a, &mut b], &[2, 2]).await;
    let until = Instant::now() + Duration::from_secs(60);
    while Instant::now() < until {
        drive(&mut [&mut a, &mut b]).await;
        assert_eq!(a.shards().len(), 2, "A lost a shard to B's clock");
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// Counts one instance's writes: renewals and checkpoints of shard rows, and of its worker row.
#[derive(Default)]
struct Writes {
    shard_rows: std::sync::atomic::AtomicU64,
    worker_row: std::sync::atomic::AtomicU64,
}

struct Counting(Arc<Writes>);

impl LeaseLayer for Counting {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        use std::sync::atomic::Ordering::Relaxed;
        if let LeaseCall::Renew { lease } | LeaseCall::Checkpoint { lease, .. } = call {
            if lease.shard_id.starts_with("worker") {
                self.0.worker_row.fetch_add(1, Relaxed);
            } else {
                self.0.shard_rows.fetch_add(1, Relaxed);
            }
        }
        next
    }
}

/// Writes a second over 5 minutes of two idle instances holding two shards each, with a
/// worker timeout of `worker_timeout`: (per shard, per instance's worker row).
async fn writes_per_second(worker_timeout: Duration) -> (f64, f64) {
    let (_memory, api, store) = setup();
    let writes = Arc::new(Writes::default());
    let counted: SharedLeaseStore = Arc::new(LayeredStore::new(
        Arc::new(store.clone()),
        Counting(writes.clone()),
    ));
    let start = |owner: &str, store: SharedLeaseStore| {
        defaults(&api, store, owner)
            .worker_timeout(worker_timeout)
            .start()
    };
    let mut a = start("a", counted).await.unwrap();
    let mut b = start("b", Arc::new(store.clone())).await.unwrap();
    balance(&mut [&mut a, &mut b], &[2, 2]).await;
    use std::sync::atomic::Ordering::Relaxed;
    let (shards_before, worker_before) = (
        writes.shard_rows.load(Relaxed),
        writes.worker_row.load(Relaxed),
    );
    let span = Duration::from_secs(300);
    let until = Instant::now() + span;
    while Instant::now() < until {
        drive(&mut [&mut a, &mut b]).await;
    }
    let per_shard = (writes.shard_rows.load(Relaxed) - shards_before) as f64 / 2.0;
    let worker = (writes.worker_row.load(Relaxed) - worker_before) as f64;
    a.shutdown().await;
    b.shutdown().await;
    (per_shard / span.as_secs_f64(), worker / span.as_secs_f64())
}

#[tokio::test(start_paused = true)]
async fn the_shorter_worker_timeout_adds_worker_row_writes_only() {
    let (shard_before, worker_before) = writes_per_second(Duration::from_secs(10)).await;
    let (shard_after, worker_after) = writes_per_second(DEFAULT_WORKER_TIMEOUT).await;
    eprintln!(
        "writes a second: per shard {shard_before:.3} -> {shard_after:.3}, worker row per \
         instance {worker_before:.3} -> {worker_after:.3}"
    );
    assert_eq!(shard_before, shard_after, "per shard");
    assert!(worker_after > worker_before && worker_after <= 1.0);
}
