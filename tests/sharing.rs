//! How instances share a stream's shards, with the default settings (in-memory transport and
//! lease store, paused time, so the bounds are exact and a run takes no real time):
//!
//! * failover: a crashed instance's shards are taken within the lease duration and one second
//!   of its last write to the lease table;
//! * fair shares: shares end within one of each other (4 shards on 3 instances are 2/1/1);
//! * paced hand-offs: an instance joining a busy fleet gets its share a few shards at a time
//!   from each, every shard changing hands once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{LeaseFuture, LeaseStore, SharedLeaseStore};
use kinesis_dataflow::subscription::SubscriptionBuilder;
use kinesis_dataflow::{KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription};
use tokio::sync::oneshot;
use tokio::time::Instant;

const STREAM: &str = "orders";
const LEASE_DURATION: Duration = Duration::from_secs(10);

/// One successful write to the lease table.
#[derive(Debug, Clone)]
struct Write {
    sent: Instant,
    /// Who wrote it (the new holder, for a take).
    by: String,
    row: String,
    /// The row's holder as the writer saw it (for a take: whom it was taken from).
    from: Option<String>,
    take: bool,
    /// A release of a shard's lease (a hand-off).
    release: bool,
}

/// Records every successful take, renewal, checkpoint write and release of a shard's lease,
/// and when each read of the table (`list`: the whole stream; `get`: named rows) was sent.
#[derive(Default)]
struct Writes(Mutex<Vec<Write>>, Mutex<Vec<(Instant, &'static str)>>);

impl LeaseLayer for Writes {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let holder =
            |lease: &kinesis_dataflow::lease::Lease| lease.owner.clone().unwrap_or_default();
        let write = match call {
            LeaseCall::Take { lease, owner } => Some((owner.to_owned(), lease, true, false)),
            LeaseCall::Renew { lease } | LeaseCall::Checkpoint { lease, .. } => {
                Some((holder(lease), lease, false, false))
            }
            // (Worker rows are left out: another instance releases a crashed one's.)
            LeaseCall::Release { lease } if !lease.shard_id.starts_with("worker:") => {
                Some((holder(lease), lease, false, true))
            }
            _ => None,
        };
        if matches!(call, LeaseCall::List { .. } | LeaseCall::Get { .. }) {
            self.1.lock().unwrap().push((Instant::now(), call.name()));
        }
        let Some((by, lease, take, release)) = write else {
            return next;
        };
        let mut write = Write {
            sent: Instant::now(),
            by,
            row: lease.shard_id.clone(),
            from: lease.owner.clone(),
            take,
            release,
        };
        Box::pin(async move {
            let answer = next.await;
            if answer.is_ok() {
                if !write.take {
                    write.from = None;
                }
                self.0.lock().unwrap().push(write);
            }
            answer
        })
    }
}

/// An instance reading and acking everything; `crash` stops it as a killed process would.
struct Instance {
    crash: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    handle: kinesis_dataflow::subscription::ShutdownHandle,
}

async fn start(api: &SharedKinesis, store: &SharedLeaseStore, owner: &str) -> Instance {
    start_with(api, store, owner, |builder| builder).await
}

/// [`start`], with settings of its own.
async fn start_with(
    api: &SharedKinesis,
    store: &SharedLeaseStore,
    owner: &str,
    settings: impl FnOnce(SubscriptionBuilder) -> SubscriptionBuilder,
) -> Instance {
    let builder = Subscription::builder(api.clone(), store.clone(), STREAM)
        .owner(owner)
        .start_at(KinesisPosition::horizon());
    let sub = settings(builder).start().await.expect("starts");
    let (crash, crashed) = oneshot::channel();
    let handle = sub.shutdown_handle();
    let task = tokio::spawn(async move {
        let mut sub = sub;
        let mut crashed = crashed;
        loop {
            tokio::select! {
                item = sub.next() => match item {
                    Some(Ok(delivery)) => {
                        delivery.ack();
                    }
                    Some(Err(_)) => {}
                    None => break,
                },
                _ = &mut crashed => {
                    sub.abort();
                    break;
                }
            }
        }
    });
    Instance {
        crash,
        task,
        handle,
    }
}

/// Who holds each shard row now.
async fn holders(store: &MemoryLeaseStore) -> BTreeMap<String, Option<String>> {
    store
        .list(STREAM)
        .await
        .unwrap()
        .into_iter()
        .filter(|row| !row.shard_id.starts_with("worker:"))
        .map(|row| (row.shard_id, row.owner))
        .collect()
}

/// The pieces of a test fleet: the in-memory stream, the transport, the table, the layer
/// recording its writes, and the store every instance uses (the table behind the layer).
type Fleet = (
    MemoryKinesis,
    SharedKinesis,
    MemoryLeaseStore,
    Arc<Writes>,
    SharedLeaseStore,
);

/// A stream of `shards` shards, the table, and the layer recording its writes.
fn fleet(
    shards: u32,
) -> (
    SharedKinesis,
    MemoryLeaseStore,
    Arc<Writes>,
    SharedLeaseStore,
) {
    let (_, api, table, writes, store) = fleet_on(shards);
    (api, table, writes, store)
}

/// [`fleet`], with the in-memory stream to write to.
fn fleet_on(shards: u32) -> Fleet {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, shards).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let table = MemoryLeaseStore::new();
    let writes = Arc::new(Writes::default());
    let store: SharedLeaseStore =
        Arc::new(LayeredStore::new(Arc::new(table.clone()), writes.clone()));
    (memory, api, table, writes, store)
}

/// How many shards each of `owners` holds now.
async fn counts(table: &MemoryLeaseStore, owners: &[&str]) -> Vec<usize> {
    let held = holders(table).await;
    owners
        .iter()
        .map(|o| held.values().filter(|h| h.as_deref() == Some(*o)).count())
        .collect()
}

/// Waits (in virtual time) until the owners hold `expected` shards each.
async fn until_counts(table: &MemoryLeaseStore, owners: &[&str], expected: &[usize]) {
    let reached = tokio::time::timeout(Duration::from_secs(300), async {
        while counts(table, owners).await != expected {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    assert!(
        reached.is_ok(),
        "expected {expected:?}, held {:?}",
        counts(table, owners).await
    );
}

#[tokio::test(start_paused = true)]
async fn a_crashed_instances_shards_are_taken_within_the_worker_timeout_and_a_second() {
    let (api, table, writes, store) = fleet(6);
    let a = start(&api, &store, "a").await;
    let b = start(&api, &store, "b").await;
    let c = start(&api, &store, "c").await;
    until_counts(&table, &["a", "b", "c"], &[2, 2, 2]).await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let lost: BTreeSet<String> = holders(&table)
        .await
        .into_iter()
        .filter(|(_, h)| h.as_deref() == Some("c"))
        .map(|(shard, _)| shard)
        .collect();
    c.crash.send(()).unwrap();
    c.task.await.unwrap();
    let crashed = Instant::now();
    tokio::time::sleep(LEASE_DURATION * 3).await;

    let log = writes.0.lock().unwrap().clone();
    let last_write = log
        .iter()
        .filter(|w| w.by == "c")
        .map(|w| w.sent)
        .max()
        .expect("c wrote");
    let late: Vec<&Write> = log
        .iter()
        .filter(|w| w.by == "c" && w.sent > crashed)
        .collect();
    assert!(late.is_empty(), "written after the crash: {late:?}");
    for shard in &lost {
        let taken = log
            .iter()
            .find(|w| w.take && w.row == *shard && w.sent > last_write)
            .unwrap_or_else(|| panic!("{shard} of the crashed instance was never taken"));
        assert_ne!(taken.by, "c");
        let after = taken.sent - last_write;
        eprintln!(
            "{shard} taken by {} {after:?} after c's last write",
            taken.by
        );
        assert!(
            after
                <= kinesis_dataflow::subscription::DEFAULT_WORKER_TIMEOUT + Duration::from_secs(1),
            "{shard} taken {after:?} after the crashed instance's last write"
        );
    }
    let held = holders(&table).await;
    assert!(
        lost.iter()
            .all(|shard| matches!(held[shard].as_deref(), Some("a" | "b"))),
        "{held:?}"
    );
    for survivor in [a, b] {
        drop(survivor.crash);
        survivor.task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn four_shards_on_three_instances_end_two_one_one() {
    let (api, table, _, store) = fleet(4);
    let a = start(&api, &store, "a").await;
    let b = start(&api, &store, "b").await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    let c = start(&api, &store, "c").await;
    until_counts(&table, &["a", "b", "c"], &[2, 1, 1]).await;
    // And it stays so.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(counts(&table, &["a", "b", "c"]).await, [2, 1, 1]);
    for instance in [a, b, c] {
        instance.task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn a_joining_instance_gets_its_share_a_few_shards_at_a_time_each_moving_once() {
    let (api, table, writes, store) = fleet(40);
    let a = start(&api, &store, "a").await;
    let b = start(&api, &store, "b").await;
    until_counts(&table, &["a", "b"], &[20, 20]).await;
    let joined = Instant::now();
    let c = start(&api, &store, "c").await;
    until_counts(&table, &["a", "b", "c"], &[14, 13, 13]).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(counts(&table, &["a", "b", "c"]).await, [14, 13, 13]);

    let log = writes.0.lock().unwrap().clone();
    let after: Vec<&Write> = log.iter().filter(|w| w.sent >= joined).collect();
    // Paced: each instance hands off at most three shards (half its excess of 6 or 7) within
    // any listing interval.
    for owner in ["a", "b"] {
        let releases: Vec<Instant> = after
            .iter()
            .filter(|w| w.release && w.by == owner)
            .map(|w| w.sent)
            .collect();
        assert_eq!(releases.len(), if owner == "a" { 6 } else { 7 });
        for (i, at) in releases.iter().enumerate() {
            let within = releases[i..]
                .iter()
                .filter(|later| **later - *at < Duration::from_secs(10))
                .count();
            assert!(
                within <= 3,
                "{owner} handed off {within} shards within 10 s"
            );
        }
    }
    // Each shard changed hands once at most.
    let mut moves: BTreeMap<&str, usize> = BTreeMap::new();
    for w in after
        .iter()
        .filter(|w| w.take && !w.row.starts_with("worker:"))
    {
        *moves.entry(w.row.as_str()).or_default() += 1;
    }
    assert!(moves.values().all(|n| *n == 1), "{moves:?}");
    assert_eq!(moves.len(), 13);
    for instance in [a, b, c] {
        instance.task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn at_steady_state_the_fleet_reads_the_whole_table_about_once_per_listing_interval() {
    let (api, table, writes, store) = fleet(6);
    let instances = [
        start(&api, &store, "a").await,
        start(&api, &store, "b").await,
        start(&api, &store, "c").await,
    ];
    until_counts(&table, &["a", "b", "c"], &[2, 2, 2]).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(300)).await;
    let reads = writes.1.lock().unwrap().clone();
    let count = |name: &str| {
        reads
            .iter()
            .filter(|(at, call)| *at >= from && *call == name)
            .count()
    };
    let (lists, gets) = (count("list"), count("get"));
    eprintln!("in 300 s at steady state: {lists} whole-table reads, {gets} reads of named rows");
    // Three instances listing every 10 s would read the table 90 times; each reads it every
    // 30 s (the listing interval times the instances) instead.
    assert!((27..=33).contains(&lists), "{lists} whole-table reads");
    // The watch: three instances, three reads a second each.
    assert!(
        (2_600..=2_800).contains(&gets),
        "{gets} reads of named rows"
    );
    for instance in instances {
        instance.task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn a_graceful_leave_is_taken_up_within_about_a_second() {
    let (memory, api, table, _, store) = fleet_on(6);
    // Records flow all along.
    let writer = tokio::spawn(async move {
        for i in 0u64.. {
            for k in 0..12 {
                memory
                    .put(STREAM, &format!("k{k}"), format!("{i}"))
                    .unwrap();
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let a = start(&api, &store, "a").await;
    let b = start(&api, &store, "b").await;
    let c = start(&api, &store, "c").await;
    let d = start(&api, &store, "d").await;
    until_counts(&table, &["a", "b", "c", "d"], &[2, 2, 1, 1]).await;
    // After a crash, too.
    d.crash.send(()).unwrap();
    until_counts(&table, &["a", "b", "c", "d"], &[2, 2, 2, 0]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stop = c.handle.clone();
    let left = Instant::now();
    stop.shutdown().await;
    until_counts(&table, &["a", "b", "c"], &[3, 3, 0]).await;
    let after = left.elapsed();
    eprintln!("the leaver's shards were all held again {after:?} after its shutdown began");
    assert!(after <= Duration::from_secs(2), "{after:?}");
    writer.abort();
    for instance in [a, b, c] {
        instance.task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn capacities_and_bounds_set_on_one_instance_are_honoured_by_all() {
    let (api, table, _, store) = fleet(12);
    let a = start_with(&api, &store, "a", |b| b.capacity(2)).await;
    let b = start(&api, &store, "b").await;
    let c = start_with(&api, &store, "c", |b| b.max_leases(2)).await;
    // In proportion, 6/3/3; c is bounded at 2, so the other two split 10 by weight.
    until_counts(&table, &["a", "b", "c"], &[7, 3, 2]).await;
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(counts(&table, &["a", "b", "c"]).await, [7, 3, 2]);
    for instance in [a, b, c] {
        instance.task.abort();
    }
}

#[tokio::test(start_paused = true)]
async fn bad_capacities_and_bounds_are_refused_by_name() {
    let (api, _, _, store) = fleet(1);
    for (settings, name) in [
        (
            Box::new(|b: SubscriptionBuilder| b.capacity(0))
                as Box<dyn FnOnce(SubscriptionBuilder) -> SubscriptionBuilder>,
            "capacity",
        ),
        (
            Box::new(|b: SubscriptionBuilder| b.capacity(1_001)),
            "capacity",
        ),
        (
            Box::new(|b: SubscriptionBuilder| b.max_leases(0)),
            "max_leases",
        ),
    ] {
        let builder = Subscription::builder(api.clone(), store.clone(), STREAM).owner("a");
        let Err(error) = settings(builder).start().await else {
            panic!("{name}: accepted");
        };
        assert!(error.to_string().contains(name), "{error}");
    }
}
