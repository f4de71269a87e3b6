//! Failover with the default settings: a crashed instance's shards are taken within the lease
//! duration and one second of its last write to the lease table, and every one of them is
//! read again (in-memory transport and lease store, paused time, so the bound is exact and
//! the run takes no real time).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{LeaseFuture, LeaseStore, SharedLeaseStore};
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
}

/// Records every successful take, renewal and checkpoint write.
#[derive(Default)]
struct Writes(Mutex<Vec<Write>>);

impl LeaseLayer for Writes {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let write = match call {
            LeaseCall::Take { lease, owner } => Some((owner, lease, true)),
            // (A release is left out: another instance releases a crashed one's worker row.)
            LeaseCall::Renew { lease } | LeaseCall::Checkpoint { lease, .. } => {
                Some((lease.owner.as_deref().unwrap_or_default(), lease, false))
            }
            _ => None,
        };
        let Some((by, lease, take)) = write else {
            return next;
        };
        let mut write = Write {
            sent: Instant::now(),
            by: by.to_owned(),
            row: lease.shard_id.clone(),
            from: lease.owner.clone(),
            take,
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
}

async fn start(api: &SharedKinesis, store: &SharedLeaseStore, owner: &str) -> Instance {
    let sub = Subscription::builder(api.clone(), store.clone(), STREAM)
        .owner(owner)
        .start_at(KinesisPosition::horizon())
        .start()
        .await
        .expect("starts");
    let (crash, crashed) = oneshot::channel();
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
    Instance { crash, task }
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

#[tokio::test(start_paused = true)]
async fn a_crashed_instances_shards_are_taken_within_the_lease_duration_and_a_second() {
    let memory = MemoryKinesis::new();
    memory.add_stream(STREAM, 6).unwrap();
    let api: SharedKinesis = Arc::new(memory.clone());
    let table = MemoryLeaseStore::new();
    let writes = Arc::new(Writes::default());
    let store: SharedLeaseStore =
        Arc::new(LayeredStore::new(Arc::new(table.clone()), writes.clone()));
    let a = start(&api, &store, "a").await;
    let b = start(&api, &store, "b").await;
    let c = start(&api, &store, "c").await;
    // Balanced: two shards each.
    let balanced = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let held = holders(&table).await;
            let of = |o: &str| held.values().filter(|h| h.as_deref() == Some(o)).count();
            if (of("a"), of("b"), of("c")) == (2, 2, 2) {
                break;
            }
        }
    })
    .await;
    assert!(
        balanced.is_ok(),
        "not balanced: {:?}",
        holders(&table).await
    );
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
            after <= LEASE_DURATION + Duration::from_secs(1),
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
