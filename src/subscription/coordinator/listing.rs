//! The listing job: the stream's shards, the lease rows, and the rows of new shards created
//! (parents before children, as [`lineage::new_rows`] decides them).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use futures::future::join_all;

use super::lineage::{self, Frontier};
use super::shared::Shared;
use crate::api::{ShardDescription, ShardEvents, list_all_shards};
use crate::error::{KinesisError, Operation};
use crate::lease::{Lease, LeaseError};
use crate::position::{Checkpoint, KinesisPosition, StartingPoint};

/// How many times one listing reads the table again after another instance created some of
/// the same rows first.
const CREATE_ROUNDS: usize = 3;

/// The stream and the table, as one listing saw them.
#[derive(Debug)]
pub(crate) struct Listing {
    pub(crate) shards: Vec<ShardDescription>,
    /// Every row of the stream (shards and workers), by id.
    pub(crate) rows: BTreeMap<String, Lease>,
    /// The tips fetched for the rows this listing created (see [`NewRowRule::fetch_tips`]).
    pub(crate) tips: HashMap<String, Tip>,
}

/// The tip of a shard fixed right before this instance created the shard's row: a LATEST
/// iterator, or with enhanced fan-out a subscription at LATEST.
///
/// Any other instance learns of the shard from that row (it reads it, or fails to create it),
/// so the position was fixed before any other instance's `start` could return counting the
/// shard: a reader opened there misses nothing another instance promised. LATEST asked for at
/// the take instead could come after another instance returned and records were written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tip {
    pub(crate) at: TipAt,
    /// When the request was sent.
    pub(crate) asked: SystemTime,
}

/// What fixes a [`Tip`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TipAt {
    Iterator(String),
    Subscription(SharedEvents),
}

/// A subscription's events, handed over once (to the reader of the shard).
#[derive(Clone)]
pub(crate) struct SharedEvents(Arc<Mutex<Option<ShardEvents>>>);

impl SharedEvents {
    fn new(events: ShardEvents) -> Self {
        Self(Arc::new(Mutex::new(Some(events))))
    }

    /// The events, unless they were taken already.
    pub(crate) fn take(&self) -> Option<ShardEvents> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl PartialEq for SharedEvents {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedEvents {}

impl fmt::Debug for SharedEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedEvents")
    }
}

/// Why a listing failed.
#[derive(Debug)]
pub(crate) enum ListingFailure {
    /// ListShards failed.
    Kinesis(KinesisError),
    /// The lease table could not be read or written.
    Table(LeaseError),
}

impl From<LeaseError> for ListingFailure {
    fn from(e: LeaseError) -> Self {
        Self::Table(e)
    }
}

/// Where new frontier shards begin, owned so the job can run on its own.
#[derive(Debug, Clone)]
pub(crate) struct NewRowRule {
    pub(crate) position: Option<KinesisPosition>,
    pub(crate) tip: StartingPoint,
    /// Rows nobody held at the previous listing (free, or not written for the lease
    /// duration): a row of an earlier stream of the same name among them may be replaced.
    pub(crate) replaceable: HashSet<String>,
    /// Fetch a [`Tip`] for each new row that begins at `tip` before creating it (while
    /// `start` runs).
    pub(crate) fetch_tips: bool,
}

/// Lists the shards and the rows, and creates the rows of shards that have none.
pub(crate) async fn list(shared: Arc<Shared>, rule: NewRowRule) -> Result<Listing, ListingFailure> {
    let shards = list_shards(&shared)
        .await
        .map_err(ListingFailure::Kinesis)?;
    let mut rows = scan(&shared).await?;
    let recreated = replace_other_generations(&shared, &shards, &mut rows, &rule).await;
    let frontier = Frontier {
        position: rule.position.as_ref(),
        tip: rule.tip.clone(),
        recreated: &recreated,
    };
    let mut tips = HashMap::new();
    let mut created = HashSet::new();
    for _ in 0..CREATE_ROUNDS {
        let new = lineage::new_rows(&shared.stream, &shards, &rows, &frontier);
        if new.is_empty() {
            break;
        }
        if rule.fetch_tips {
            fetch_tips(&shared, &new, &rule.tip, &mut tips).await;
        }
        if create_all(&shared, new, &mut rows, &mut created).await? {
            break;
        }
        // Another instance created some first: its rows are the ones to go by.
        rows = scan(&shared).await?;
    }
    tips.retain(|shard, _| created.contains(shard));
    Ok(Listing { shards, rows, tips })
}

/// Fetches a LATEST iterator for each of the `new` rows that begin at `tip` and have none yet,
/// side by side within the work bound. A failed request leaves the shard without one: it then
/// opens at the time the subscription started.
async fn fetch_tips(
    shared: &Shared,
    new: &[Lease],
    tip: &StartingPoint,
    tips: &mut HashMap<String, Tip>,
) {
    let begins_at_tip = Some(Checkpoint::Initial(tip.clone()));
    let wanted: Vec<&str> = new
        .iter()
        .filter(|row| row.checkpoint == begins_at_tip && !tips.contains_key(&row.shard_id))
        .map(|row| row.shard_id.as_str())
        .collect();
    let fetched = join_all(wanted.iter().map(|&shard| async move {
        let _permit = shared.permits.acquire().await;
        let asked = SystemTime::now();
        match tokio::time::timeout(shared.config.call_timeout(), fix_tip(shared, shard)).await {
            Ok(Ok(at)) => Some(Tip { at, asked }),
            Ok(Err(e)) => {
                tracing::debug!(shard, error = %e, "no tip fixed; the shard opens at the start time");
                None
            }
            Err(_) => None,
        }
    }))
    .await;
    for (shard, tip) in wanted.into_iter().zip(fetched) {
        if let Some(tip) = tip {
            tips.insert(shard.to_owned(), tip);
        }
    }
}

/// Deletes the rows of listed shards that were written for an earlier stream of the same name,
/// when nobody holds them; returns those shards (their rows are created anew).
async fn replace_other_generations(
    shared: &Shared,
    shards: &[ShardDescription],
    rows: &mut BTreeMap<String, Lease>,
    rule: &NewRowRule,
) -> HashSet<String> {
    let old: Vec<Lease> = shards
        .iter()
        .filter_map(|shard| {
            rows.get(&shard.shard_id)
                .filter(|row| lineage::is_other_generation(row, shard))
                .filter(|row| row.owner.is_none() || rule.replaceable.contains(&row.shard_id))
                .cloned()
        })
        .collect();
    let results = join_all(old.iter().map(|row| shared.store.delete(row))).await;
    let mut recreated = HashSet::new();
    for (row, result) in old.into_iter().zip(results) {
        match result {
            Ok(()) => {
                tracing::info!(shard = %row.shard_id, "the row of a shard of an earlier stream of the same name was removed; the new shard is read from its beginning");
                rows.remove(&row.shard_id);
                recreated.insert(row.shard_id);
            }
            Err(e) => {
                tracing::debug!(shard = %row.shard_id, error = %e, "a row of an earlier stream of the same name stays for now");
            }
        }
    }
    recreated
}

async fn list_shards(shared: &Shared) -> Result<Vec<ShardDescription>, KinesisError> {
    let timeout = shared.config.call_timeout();
    match tokio::time::timeout(
        timeout,
        list_all_shards(shared.api.as_ref(), &shared.stream),
    )
    .await
    {
        Ok(result) => result,
        Err(_) => Err(KinesisError::Service {
            operation: Operation::ListShards,
            stream: shared.stream.to_string(),
            message: format!("no answer within {timeout:?}"),
            source: None,
        }),
    }
}

async fn scan(shared: &Shared) -> Result<BTreeMap<String, Lease>, LeaseError> {
    Ok(shared
        .store
        .list(&shared.stream)
        .await?
        .into_iter()
        .map(|l| (l.shard_id.clone(), l))
        .collect())
}

/// Fixes the tip of `shard`: a LATEST iterator, or with enhanced fan-out a subscription.
async fn fix_tip(shared: &Shared, shard: &str) -> Result<TipAt, KinesisError> {
    let latest = StartingPoint::Latest;
    match &shared.config.consumer_arn {
        Some(arn) => {
            let shard: Arc<str> = shard.into();
            let events = shared
                .api
                .subscribe_to_shard(&shared.stream, arn, &shard, &latest)
                .await?;
            Ok(TipAt::Subscription(SharedEvents::new(events)))
        }
        None => {
            let iterator = shared
                .api
                .get_shard_iterator(&shared.stream, shard, &latest)
                .await?;
            Ok(TipAt::Iterator(iterator))
        }
    }
}

/// Creates `new` level by level (a row only once the rows of its new parents exist), each
/// level side by side within the work bound; notes the rows it created in `created`. Returns
/// false when another instance created one of them first.
async fn create_all(
    shared: &Shared,
    new: Vec<Lease>,
    rows: &mut BTreeMap<String, Lease>,
    created: &mut HashSet<String>,
) -> Result<bool, LeaseError> {
    let mut depth: HashMap<String, usize> = HashMap::new();
    for lease in &new {
        let d = lease
            .parents
            .iter()
            .filter_map(|p| depth.get(p))
            .map(|d| d + 1)
            .max()
            .unwrap_or(0);
        depth.insert(lease.shard_id.clone(), d);
    }
    let deepest = depth.values().copied().max().unwrap_or(0);
    for level in 0..=deepest {
        let batch: Vec<&Lease> = new.iter().filter(|l| depth[&l.shard_id] == level).collect();
        let results = join_all(batch.iter().map(|lease| async {
            let _permit = shared.permits.acquire().await;
            shared.store.create(lease).await
        }))
        .await;
        let mut raced = false;
        for (lease, result) in batch.into_iter().zip(results) {
            if result? {
                if lease.checkpoint == Some(Checkpoint::ShardEnd) {
                    tracing::info!(shard = %lease.shard_id, "a closed shard nothing will read (the subscription began after it): recorded as finished");
                }
                rows.insert(lease.shard_id.clone(), lease.clone());
                created.insert(lease.shard_id.clone());
            } else {
                raced = true;
            }
        }
        if raced {
            return Ok(false);
        }
    }
    Ok(true)
}
