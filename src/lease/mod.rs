//! Leases and checkpoints: which instance reads which shard, and how far it got.
//!
//! | item | what it is |
//! |---|---|
//! | [`LeaseStore`] | the conditional operations on the lease table |
//! | [`DynamoLeaseStore`] | the DynamoDB table (the default for the AWS transport) |
//! | [`KeyLayout`] | how a DynamoDB lease table is keyed: by stream and shard, or (older tables) by one key |
//! | [`MemoryLeaseStore`] | an in-process table (one instance, or the in-memory transport) |
//! | [`Lease`] | one row: stream, shard, owner, counter, checkpoint, parents |
//! | [`LeaseError`] | what the store can answer instead |
//! | [`layer`] | one way to wrap every call of a store (time limits, counting, faults) |
//!
//! Every write is conditional on the row being what the writer last saw (owner and counter),
//! so two instances can never both believe they hold a shard, and a checkpoint is only
//! written while its writer still holds the lease (fencing). Every successful write bumps the
//! counter; other instances decide a lease has expired when its counter has not moved for the
//! lease duration on their own monotonic clock, so clock skew between hosts cannot steal a
//! live lease.
//!
//! Besides one row per shard, a subscription keeps one row per instance (`worker:<owner>`,
//! renewed like a lease, which the others watch to declare a crashed instance gone) and one
//! roster row per stream (`worker:`, moved whenever the instances or free leases change).
//!
//! Rows do not pile up. An instance that stops gracefully deletes its own worker row; the
//! worker row of an instance that crashed is deleted by any running instance once nobody has
//! written it for the lease duration, and so is the row of a shard the stream has not listed
//! for a lease duration and a listing interval (a closed shard past the retention period). The
//! row of a finished shard is kept while the stream still lists the shard: it is what tells
//! every instance that the shard's children may start. Should a listed shard lose its row all
//! the same (an instance whose listing lagged behind another's cleanup), its row comes back as
//! finished once a child has started, so it is never read again.
//!
//! A shard's row is created by the first instance that lists the shard, and it records once
//! and for all whether the application reads the shard: a closed shard that nothing will read
//! (the application began at the tip after it closed) is created finished. Each row also
//! keeps the shard's starting sequence number, which tells it from a shard of the same id in
//! an earlier stream of the same name.

mod dynamo;
pub mod layer;
mod memory;

pub use crate::error::LeaseError;
pub(crate) use dynamo::type_name;
pub use dynamo::{DynamoLeaseStore, KeyLayout, LeaseRow};
pub use memory::MemoryLeaseStore;

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::error::Operation;
use crate::position::Checkpoint;

/// The future every lease store call returns.
pub type LeaseFuture<'a, T> = BoxFuture<'a, Result<T, LeaseError>>;

/// A shared handle to any lease store.
pub type SharedLeaseStore = Arc<dyn LeaseStore>;

/// The key prefix of an instance's worker row (`worker:<owner>`); the row `worker:` alone is
/// the roster row. Neither is a shard's row.
pub(crate) const WORKER_ROW_PREFIX: &str = "worker:";

/// The owner prefix the `kinesis-dataflow reset` tool writes leases as while it moves their
/// checkpoints: a holder that finds its lease taken by such an owner says that a reset took it.
pub const RESET_OWNER_PREFIX: &str = "kinesis-dataflow-reset-";

/// Why `checkpoint` cannot be written into `lease`'s row: its text ([`Checkpoint::encode`])
/// does not read back as the same checkpoint ([`Checkpoint::decode`]), so the row would fail
/// every later listing of its stream. `None` when it can be written.
pub(crate) fn unstorable(lease: &Lease, checkpoint: &Checkpoint) -> Option<String> {
    let text = checkpoint.encode();
    (Checkpoint::decode(&text).as_ref() != Some(checkpoint)).then(|| {
        format!(
            "the checkpoint {text:?} of shard `{}` of stream `{}` does not read back as a \
             checkpoint (sequence numbers are decimal digits); nothing was written",
            lease.shard_id, lease.stream
        )
    })
}

/// One row of the lease table: one shard of one stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The stream name.
    pub stream: String,
    /// The shard id.
    pub shard_id: String,
    /// The instance holding the lease, `None` when nobody does.
    pub owner: Option<String>,
    /// Bumped by every write; the fencing token and the liveness signal.
    pub counter: u64,
    /// How far the shard is settled.
    pub checkpoint: Option<Checkpoint>,
    /// The shard's parents (none, one for a split, two for a merge).
    pub parents: Vec<String>,
    /// The sequence number the shard began at, as ListShards gives it. It tells this shard
    /// from a shard of the same id in an earlier stream of the same name (a stream deleted
    /// and created again); `None` on rows written before it was recorded, and on worker rows.
    pub starting_sequence_number: Option<String>,
    /// On a worker row: the limits of the instance it stands for, which every instance uses
    /// to compute the same shares. `None` on shard rows (and on worker rows written before
    /// limits were recorded, which count as [`WorkerLimits::default`]).
    pub limits: Option<WorkerLimits>,
    /// On a worker row: the liveness group of the instance (`<anchor stream>/<id>`), when it
    /// reads several streams as one [`MultiSubscription`](crate::MultiSubscription). Every
    /// reader of such an instance also stops once its worker row of the anchor stream is
    /// stale, so the others judge all its streams by that one row: its leases in any stream
    /// are free at once when its anchor row, read after the listing, is released and names
    /// the same group. `None` on shard rows and on the worker rows of instances reading one
    /// stream.
    pub liveness_group: Option<String>,
}

/// How much of a stream one instance takes: its share relative to the others', and an upper
/// bound. Recorded in the instance's worker row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkerLimits {
    /// Its share relative to the others' (an instance of weight 2 reads twice as many shards
    /// as one of weight 1). At least 1.
    pub weight: u32,
    /// The most shards it reads at once; `None`: no bound.
    pub max_leases: Option<u32>,
}

impl Default for WorkerLimits {
    /// Weight 1, no bound.
    fn default() -> Self {
        Self {
            weight: 1,
            max_leases: None,
        }
    }
}

impl Lease {
    /// True when the row was written for a shard of an earlier stream of the same name: it
    /// records a starting sequence number other than `starting_sequence_number`, the listed
    /// shard's. A row without one (written before it was recorded) counts as the shard's.
    ///
    /// ```
    /// use kinesis_dataflow::lease::Lease;
    ///
    /// let mut row = Lease::new("orders", "shardId-000000000000", vec![]);
    /// assert!(!row.is_other_generation("49590"));
    /// row.starting_sequence_number = Some("49590".into());
    /// assert!(!row.is_other_generation("49590"));
    /// assert!(row.is_other_generation("49611"));
    /// ```
    #[must_use]
    pub fn is_other_generation(&self, starting_sequence_number: &str) -> bool {
        self.starting_sequence_number
            .as_deref()
            .is_some_and(|seq| seq != starting_sequence_number)
    }

    /// A new, unowned lease with no checkpoint.
    #[must_use]
    pub fn new(
        stream: impl Into<String>,
        shard_id: impl Into<String>,
        parents: Vec<String>,
    ) -> Self {
        Self {
            stream: stream.into(),
            shard_id: shard_id.into(),
            owner: None,
            counter: 0,
            checkpoint: None,
            parents,
            starting_sequence_number: None,
            limits: None,
            liveness_group: None,
        }
    }

    /// True once the shard is fully read and settled.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.checkpoint == Some(Checkpoint::ShardEnd)
    }
}

/// The lease table's operations. Each write is conditional and returns the row as written.
///
/// A condition that no longer holds (another instance wrote the row in between) is
/// [`LeaseError::Lost`]: the caller's view is stale and, for a holder, the lease is gone.
pub trait LeaseStore: Send + Sync + 'static {
    /// Makes the store usable: creates the table when it is missing and waits until it is
    /// ready. Idempotent.
    fn prepare(&self) -> LeaseFuture<'_, ()>;

    /// Every lease of `stream`.
    fn list<'a>(&'a self, stream: &'a str) -> LeaseFuture<'a, Vec<Lease>>;

    /// The call [`list`](Self::list) makes, as errors and [`layer`]s name it: a Query by
    /// default; [`DynamoLeaseStore`] on a single-key table (its layout known) makes a Scan.
    fn list_operation(&self) -> Operation {
        Operation::Query
    }

    /// The rows of `stream` with these ids, read consistently, in id order (rows that do not
    /// exist are left out). A subscription reads a few rows this way many times a second (the worker
    /// rows it watches), so a store should make it cheap: [`DynamoLeaseStore`] reads them with
    /// `BatchGetItem`, which costs the rows named, not the table. The default lists the whole
    /// stream and picks the rows out.
    fn get<'a>(&'a self, stream: &'a str, ids: &'a [String]) -> LeaseFuture<'a, Vec<Lease>> {
        Box::pin(async move {
            let rows = self.list(stream).await?;
            Ok(rows
                .into_iter()
                .filter(|row| ids.contains(&row.shard_id))
                .collect())
        })
    }

    /// Adds an unowned lease for a shard unless a row exists; `true` when it was added.
    fn create<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, bool>;

    /// Takes `lease` for `owner`, on condition that its owner and counter are still those in
    /// `lease`. Returns the lease as now held (owner set, counter bumped).
    fn take<'a>(&'a self, lease: &'a Lease, owner: &'a str) -> LeaseFuture<'a, Lease>;

    /// Renews a held lease: bumps the counter, on condition of owner and counter.
    fn renew<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease>;

    /// Writes a checkpoint into a held lease (bumping the counter), on condition of owner and
    /// counter: a checkpoint is never written by an instance that lost the lease.
    fn checkpoint<'a>(
        &'a self,
        lease: &'a Lease,
        checkpoint: &'a Checkpoint,
    ) -> LeaseFuture<'a, Lease>;

    /// Gives a held lease up (owner removed, counter bumped), on condition of owner and
    /// counter, so another instance can take it at once.
    fn release<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease>;

    /// Removes a row nobody needs any more (a shard past the stream's retention period, the
    /// worker row of an instance that stopped), on condition that its owner and counter are
    /// still those in `lease`: a row written since is kept ([`LeaseError::Lost`]).
    fn delete<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, ()>;

    /// Puts `new` in place of the row `old` in **one** conditional write: on condition that
    /// the row's owner and counter are still those in `old` ([`LeaseError::Lost`] otherwise).
    /// Returns the row as written: `new`'s fields, with a counter one past `old`'s, so a stale
    /// holder of `old` is fenced.
    ///
    /// A subscription replaces so the row of a shard of an earlier stream of the same name
    /// (a stream deleted and created again, see [`Lease::is_other_generation`]) with the new
    /// shard's row, which says the shard is read from its beginning. It must be one write: the
    /// row is the only record that the stream was created again, so a delete followed by a
    /// create that fails (or that another instance's listing comes between) would leave the
    /// shard with no row at all, taken for a new shard of a new application (read from the
    /// tip, or passed when closed), and its records would never be read.
    fn replace<'a>(&'a self, old: &'a Lease, new: &'a Lease) -> LeaseFuture<'a, Lease>;
}
