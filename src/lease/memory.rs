//! The in-process lease table.

use std::collections::{BTreeMap, HashMap};
#[cfg(feature = "test-util")]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
#[cfg(feature = "test-util")]
use std::time::Duration;

use super::{Lease, LeaseError, LeaseFuture, LeaseStore};
use crate::error::Operation;
use crate::position::Checkpoint;

/// The table name [`MemoryLeaseStore`] reports in its errors.
const TABLE: &str = "(in-memory)";

/// The operation name of a checkpoint write (counted per shard).
const CHECKPOINT: &str = "checkpoint";

/// The owner named in [`LeaseError::Lost`] when the caller's lease had no owner at all.
const NO_OWNER: &str = "(no owner)";

/// The DynamoDB call a store operation stands for, for errors (the same operation on
/// [`DynamoLeaseStore`](super::DynamoLeaseStore) makes that call).
fn call_of(operation: &str) -> Operation {
    match operation {
        "prepare" => Operation::DescribeTable,
        "list" => Operation::Query,
        "get" => Operation::BatchGetItem,
        "create" | "replace" => Operation::PutItem,
        "delete" => Operation::DeleteItem,
        _ => Operation::UpdateItem,
    }
}

/// Refuses a checkpoint the DynamoDB table could not read back, as that store does.
fn check_storable(
    operation: &'static str,
    lease: &Lease,
    checkpoint: &Checkpoint,
) -> Result<(), LeaseError> {
    match super::unstorable(lease, checkpoint) {
        None => Ok(()),
        Some(message) => Err(LeaseError::Invalid {
            table: TABLE.to_owned(),
            operation: call_of(operation),
            message,
            source: None,
        }),
    }
}

/// An in-process lease table: the same conditional semantics as the DynamoDB table, for one
/// process (several consumers sharing one store) and for tests.
///
/// Clones share the table. Every write is conditional on the owner and counter the caller last
/// saw, exactly like [`DynamoLeaseStore`](super::DynamoLeaseStore), so a stale view fails with
/// [`LeaseError::Lost`].
///
/// [`writes`](Self::writes) and [`checkpoint_writes`](Self::checkpoint_writes) count
/// successful writes. With the `test-util` feature, fault settings let other layers exercise
/// their failure paths: `set_unavailable` makes every call fail with
/// [`LeaseError::Unavailable`], and `set_latency` makes every call answer late.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_dataflow::lease::LeaseError> {
/// use kinesis_dataflow::MemoryLeaseStore;
/// use kinesis_dataflow::lease::{Lease, LeaseStore};
/// use kinesis_dataflow::position::Checkpoint;
///
/// let store = MemoryLeaseStore::new();
/// store.prepare().await?;
/// store.create(&Lease::new("events", "shardId-000000000000", vec![])).await?;
///
/// let seen = store.list("events").await?.remove(0);
/// let held = store.take(&seen, "worker-a").await?;
/// assert_eq!(held.owner.as_deref(), Some("worker-a"));
///
/// // Another instance working from the same (now stale) view loses the race.
/// assert!(store.take(&seen, "worker-b").await.unwrap_err().is_lost());
///
/// let held = store.checkpoint(&held, &Checkpoint::Sequence("42".into())).await?;
/// assert_eq!(held.checkpoint, Some(Checkpoint::Sequence("42".into())));
/// assert_eq!(store.checkpoint_writes("events", "shardId-000000000000"), 1);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryLeaseStore {
    state: Arc<Mutex<State>>,
    /// Set: every call fails (`set_unavailable`).
    #[cfg(feature = "test-util")]
    unavailable: Arc<AtomicBool>,
    /// Nanoseconds every call waits before it is carried out (`set_latency`).
    #[cfg(feature = "test-util")]
    latency: Arc<AtomicU64>,
}

/// Everything behind the lock.
#[derive(Debug, Default)]
struct State {
    rows: BTreeMap<(String, String), Lease>,
    writes: u64,
    checkpoint_writes: HashMap<(String, String), u64>,
}

impl MemoryLeaseStore {
    /// An empty table.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes every call fail with [`LeaseError::Unavailable`] while `unavailable` is true, as
    /// if the table could not be reached. The rows are kept and are served again once it is
    /// set back to false.
    ///
    /// A test hook: only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    pub fn set_unavailable(&self, unavailable: bool) {
        self.unavailable.store(unavailable, Ordering::SeqCst);
    }

    /// Makes every call wait `latency` (on the tokio clock, so paused time applies) before it
    /// is carried out, as a slow or distant table would. `Duration::ZERO` turns it off.
    ///
    /// A test hook: only with the `test-util` feature.
    #[cfg(feature = "test-util")]
    pub fn set_latency(&self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.latency.store(nanos, Ordering::SeqCst);
    }

    /// Waits the latency `set_latency` configured, if any (nothing without the `test-util`
    /// feature).
    async fn delay(&self) {
        #[cfg(feature = "test-util")]
        {
            let nanos = self.latency.load(Ordering::SeqCst);
            if nanos > 0 {
                tokio::time::sleep(Duration::from_nanos(nanos)).await;
            }
        }
    }

    /// How many writes succeeded so far (a `create` that added a row, and every successful
    /// `take`, `renew`, `checkpoint`, `release`, `delete` and `replace`), across all streams.
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.lock().writes
    }

    /// How many checkpoints were written successfully for one shard of one stream.
    #[must_use]
    pub fn checkpoint_writes(&self, stream: &str, shard: &str) -> u64 {
        self.lock()
            .checkpoint_writes
            .get(&(stream.to_owned(), shard.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// The table. A panic while the lock was held cannot leave a row half-written (every
    /// write replaces whole values), so a poisoned lock is simply taken over.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Fails `operation` while `set_unavailable(true)` holds (never without the `test-util`
    /// feature).
    #[cfg_attr(not(feature = "test-util"), allow(unused_variables))]
    fn check_available(&self, operation: &'static str) -> Result<(), LeaseError> {
        #[cfg(feature = "test-util")]
        if self.unavailable.load(Ordering::SeqCst) {
            return Err(LeaseError::Unavailable {
                table: TABLE.to_owned(),
                operation: call_of(operation),
                message: "the in-memory lease store is set unavailable (set_unavailable(true))"
                    .to_owned(),
                source: None,
            });
        }
        Ok(())
    }

    fn do_list(&self, stream: &str) -> Result<Vec<Lease>, LeaseError> {
        self.check_available("list")?;
        let state = self.lock();
        Ok(state
            .rows
            .range((stream.to_owned(), String::new())..)
            .take_while(|((s, _), _)| s == stream)
            .map(|(_, lease)| lease.clone())
            .collect())
    }

    fn do_get(&self, stream: &str, ids: &[String]) -> Result<Vec<Lease>, LeaseError> {
        self.check_available("get")?;
        let state = self.lock();
        let mut rows: Vec<Lease> = ids
            .iter()
            .filter_map(|id| state.rows.get(&(stream.to_owned(), id.clone())).cloned())
            .collect();
        rows.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        rows.dedup_by(|a, b| a.shard_id == b.shard_id);
        Ok(rows)
    }

    fn do_create(&self, lease: &Lease) -> Result<bool, LeaseError> {
        self.check_available("create")?;
        if let Some(checkpoint) = &lease.checkpoint {
            check_storable("create", lease, checkpoint)?;
        }
        let mut state = self.lock();
        let key = (lease.stream.clone(), lease.shard_id.clone());
        if state.rows.contains_key(&key) {
            return Ok(false);
        }
        state.rows.insert(key, lease.clone());
        state.writes += 1;
        Ok(true)
    }

    /// Applies `write` to the stored row when its owner and counter are those in `lease`
    /// (`expected_owner` is the owner the row must have), bumping the counter, all under one
    /// lock. `writer` is the owner named in [`LeaseError::Lost`].
    fn write(
        &self,
        operation: &'static str,
        lease: &Lease,
        expected_owner: Option<&str>,
        writer: &str,
        write: impl FnOnce(&mut Lease),
    ) -> Result<Lease, LeaseError> {
        self.check_available(operation)?;
        let lost = || LeaseError::Lost {
            stream: lease.stream.clone(),
            shard: lease.shard_id.clone(),
            owner: writer.to_owned(),
        };
        let mut state = self.lock();
        let key = (lease.stream.clone(), lease.shard_id.clone());
        let row = state.rows.get_mut(&key).ok_or_else(lost)?;
        if row.owner.as_deref() != expected_owner || row.counter != lease.counter {
            return Err(lost());
        }
        let counter = row
            .counter
            .checked_add(1)
            .ok_or_else(|| LeaseError::Invalid {
                table: TABLE.to_owned(),
                operation: call_of(operation),
                message: format!(
                    "the counter of shard `{}` of stream `{}` cannot grow past u64::MAX",
                    lease.shard_id, lease.stream
                ),
                source: None,
            })?;
        write(row);
        row.counter = counter;
        let written = row.clone();
        state.writes += 1;
        if operation == CHECKPOINT {
            *state.checkpoint_writes.entry(key).or_default() += 1;
        }
        Ok(written)
    }

    /// The same as [`write`](Self::write) for the holder's own operations: the row must be
    /// held by `lease.owner`, which must be set.
    fn write_held(
        &self,
        operation: &'static str,
        lease: &Lease,
        write: impl FnOnce(&mut Lease),
    ) -> Result<Lease, LeaseError> {
        let Some(owner) = lease.owner.as_deref() else {
            self.check_available(operation)?;
            return Err(LeaseError::Lost {
                stream: lease.stream.clone(),
                shard: lease.shard_id.clone(),
                owner: NO_OWNER.to_owned(),
            });
        };
        self.write(operation, lease, Some(owner), owner, write)
    }
}

impl LeaseStore for MemoryLeaseStore {
    fn prepare(&self) -> LeaseFuture<'_, ()> {
        Box::pin(async move {
            self.delay().await;
            self.check_available("prepare")
        })
    }

    fn list<'a>(&'a self, stream: &'a str) -> LeaseFuture<'a, Vec<Lease>> {
        Box::pin(async move {
            self.delay().await;
            self.do_list(stream)
        })
    }

    fn get<'a>(&'a self, stream: &'a str, ids: &'a [String]) -> LeaseFuture<'a, Vec<Lease>> {
        Box::pin(async move {
            self.delay().await;
            self.do_get(stream, ids)
        })
    }

    fn create<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, bool> {
        Box::pin(async move {
            self.delay().await;
            self.do_create(lease)
        })
    }

    fn take<'a>(&'a self, lease: &'a Lease, owner: &'a str) -> LeaseFuture<'a, Lease> {
        Box::pin(async move {
            self.delay().await;
            self.write("take", lease, lease.owner.as_deref(), owner, |row| {
                row.owner = Some(owner.to_owned());
            })
        })
    }

    fn renew<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        Box::pin(async move {
            self.delay().await;
            self.write_held("renew", lease, |_| {})
        })
    }

    fn checkpoint<'a>(
        &'a self,
        lease: &'a Lease,
        checkpoint: &'a Checkpoint,
    ) -> LeaseFuture<'a, Lease> {
        Box::pin(async move {
            self.delay().await;
            self.check_available(CHECKPOINT)?;
            check_storable(CHECKPOINT, lease, checkpoint)?;
            self.write_held(CHECKPOINT, lease, |row| {
                row.checkpoint = Some(checkpoint.clone());
            })
        })
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        Box::pin(async move {
            self.delay().await;
            self.write_held("release", lease, |row| {
                row.owner = None;
            })
        })
    }

    fn delete<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, ()> {
        Box::pin(async move {
            self.delay().await;
            self.check_available("delete")?;
            let mut state = self.lock();
            let key = (lease.stream.clone(), lease.shard_id.clone());
            match state.rows.get(&key) {
                Some(row) if row.owner == lease.owner && row.counter == lease.counter => {
                    state.rows.remove(&key);
                    state.writes += 1;
                    Ok(())
                }
                _ => Err(LeaseError::Lost {
                    stream: lease.stream.clone(),
                    shard: lease.shard_id.clone(),
                    owner: lease.owner.clone().unwrap_or_else(|| NO_OWNER.to_owned()),
                }),
            }
        })
    }

    fn replace<'a>(&'a self, old: &'a Lease, new: &'a Lease) -> LeaseFuture<'a, Lease> {
        Box::pin(async move {
            self.delay().await;
            let operation = "replace";
            if let Some(checkpoint) = &new.checkpoint {
                check_storable(operation, new, checkpoint)?;
            }
            let writer = old.owner.as_deref().unwrap_or(NO_OWNER);
            self.write(operation, old, old.owner.as_deref(), writer, |row| {
                *row = Lease {
                    stream: row.stream.clone(),
                    shard_id: row.shard_id.clone(),
                    ..new.clone()
                };
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block<T>(future: LeaseFuture<'_, T>) -> Result<T, LeaseError> {
        futures::executor::block_on(future)
    }

    fn seeded() -> (MemoryLeaseStore, Lease) {
        let store = MemoryLeaseStore::new();
        let lease = Lease::new("s", "shardId-0", vec![]);
        assert!(block(store.create(&lease)).unwrap());
        (store, lease)
    }

    #[test]
    fn create_inserts_once_and_keeps_the_first_row() {
        let (store, lease) = seeded();
        let mut other = lease.clone();
        other.parents = vec!["p".into()];
        assert!(!block(store.create(&other)).unwrap());
        assert_eq!(block(store.list("s")).unwrap(), vec![lease]);
        assert_eq!(store.writes(), 1);
    }

    #[test]
    fn take_bumps_the_counter_and_fences_a_stale_view() {
        let (store, free) = seeded();
        let held = block(store.take(&free, "a")).unwrap();
        assert_eq!((held.owner.as_deref(), held.counter), (Some("a"), 1));
        let err = block(store.take(&free, "b")).unwrap_err();
        assert!(
            matches!(&err, LeaseError::Lost { owner, shard, stream }
                if owner == "b" && shard == "shardId-0" && stream == "s"),
            "{err:?}"
        );
        // Taking over from the current view works (an expired lease).
        let stolen = block(store.take(&held, "b")).unwrap();
        assert_eq!((stolen.owner.as_deref(), stolen.counter), (Some("b"), 2));
        assert_eq!(store.writes(), 3);
    }

    #[test]
    fn replace_is_one_write() {
        let (store, free) = seeded();
        let mut new = Lease::new("s", "shardId-0", vec![]);
        new.starting_sequence_number = Some("2".into());
        let written = block(store.replace(&free, &new)).unwrap();
        assert_eq!(written.counter, 1);
        assert_eq!(store.writes(), 2, "the create, then one write");
    }

    #[test]
    fn take_of_a_missing_row_is_lost() {
        let store = MemoryLeaseStore::new();
        let err = block(store.take(&Lease::new("s", "x", vec![]), "a")).unwrap_err();
        assert!(err.is_lost(), "{err:?}");
    }

    #[test]
    fn holder_operations_require_owner_and_counter() {
        let (store, free) = seeded();
        // Not held at all.
        let err = block(store.renew(&free)).unwrap_err();
        assert!(matches!(&err, LeaseError::Lost { owner, .. } if owner == NO_OWNER));
        let held = block(store.take(&free, "a")).unwrap();
        let renewed = block(store.renew(&held)).unwrap();
        assert_eq!(renewed.counter, 2);
        // The old view's counter is stale now.
        assert!(block(store.renew(&held)).unwrap_err().is_lost());
        // A view claiming another owner with the right counter is refused too.
        let mut impostor = renewed.clone();
        impostor.owner = Some("b".into());
        let err = block(store.release(&impostor)).unwrap_err();
        assert!(matches!(&err, LeaseError::Lost { owner, .. } if owner == "b"));
        let released = block(store.release(&renewed)).unwrap();
        assert_eq!((released.owner, released.counter), (None, 3));
    }

    #[test]
    fn checkpoint_is_fenced_and_counted() {
        let (store, free) = seeded();
        let held = block(store.take(&free, "a")).unwrap();
        let cp = Checkpoint::Sequence("10".into());
        let held = block(store.checkpoint(&held, &cp)).unwrap();
        assert_eq!(held.checkpoint, Some(cp.clone()));
        let _stolen = block(store.take(&held, "b")).unwrap();
        let err = block(store.checkpoint(&held, &Checkpoint::ShardEnd)).unwrap_err();
        assert!(matches!(&err, LeaseError::Lost { owner, .. } if owner == "a"));
        assert_eq!(block(store.list("s")).unwrap()[0].checkpoint, Some(cp));
        assert_eq!(store.checkpoint_writes("s", "shardId-0"), 1);
        assert_eq!(store.checkpoint_writes("s", "other"), 0);
    }

    #[test]
    fn list_is_per_stream_and_ordered_by_shard() {
        let store = MemoryLeaseStore::new();
        for (stream, shard) in [("b", "2"), ("a", "3"), ("b", "1"), ("a", "1"), ("ab", "0")] {
            assert!(block(store.create(&Lease::new(stream, shard, vec![]))).unwrap());
        }
        let shards = |stream| {
            block(store.list(stream))
                .unwrap()
                .into_iter()
                .map(|l| l.shard_id)
                .collect::<Vec<_>>()
        };
        assert_eq!(shards("a"), ["1", "3"]);
        assert_eq!(shards("b"), ["1", "2"]);
        assert_eq!(shards("ab"), ["0"]);
        assert!(shards("c").is_empty());
    }

    #[test]
    fn unavailable_fails_every_call_and_keeps_rows() {
        let (store, free) = seeded();
        let shared = store.clone();
        shared.set_unavailable(true);
        let errors = [
            block(store.prepare()).unwrap_err(),
            block(store.list("s")).unwrap_err(),
            block(store.create(&free)).unwrap_err(),
            block(store.take(&free, "a")).unwrap_err(),
            block(store.renew(&free)).unwrap_err(),
            block(store.checkpoint(&free, &Checkpoint::ShardEnd)).unwrap_err(),
            block(store.release(&free)).unwrap_err(),
        ];
        for err in errors {
            assert!(err.is_retryable(), "{err:?}");
        }
        assert_eq!(store.writes(), 1);
        shared.set_unavailable(false);
        assert_eq!(block(store.list("s")).unwrap(), vec![free]);
    }

    #[test]
    fn futures_are_lazy() {
        let (store, free) = seeded();
        let pending = store.take(&free, "a");
        assert_eq!(store.writes(), 1);
        drop(pending);
        assert_eq!(block(store.list("s")).unwrap()[0].owner, None);
    }
}
