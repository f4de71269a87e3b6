//! The listing job: the stream's shards, the lease rows, and the rows of new shards created
//! (parents before children, as [`lineage::new_rows`] decides them).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use futures::future::join_all;

use super::lineage::{self, Frontier};
use super::shared::Shared;
use crate::api::{ShardDescription, list_all_shards};
use crate::error::{KinesisError, Operation};
use crate::lease::{Lease, LeaseError};
use crate::position::{KinesisPosition, StartingPoint};

/// How many times one listing reads the table again after another instance created some of
/// the same rows first.
const CREATE_ROUNDS: usize = 3;

/// The stream and the table, as one listing saw them.
#[derive(Debug)]
pub(crate) struct Listing {
    pub(crate) shards: Vec<ShardDescription>,
    /// Every row of the stream (shards and workers), by id.
    pub(crate) rows: BTreeMap<String, Lease>,
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
    for _ in 0..CREATE_ROUNDS {
        let new = lineage::new_rows(&shared.stream, &shards, &rows, &frontier);
        if new.is_empty() {
            break;
        }
        if create_all(&shared, new, &mut rows).await? {
            break;
        }
        // Another instance created some first: its rows are the ones to go by.
        rows = scan(&shared).await?;
    }
    Ok(Listing { shards, rows })
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

/// Creates `new` level by level (a row only once the rows of its new parents exist), each
/// level side by side within the work bound. Returns false when another instance created one
/// of them first.
async fn create_all(
    shared: &Shared,
    new: Vec<Lease>,
    rows: &mut BTreeMap<String, Lease>,
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
                if lease.checkpoint == Some(crate::position::Checkpoint::ShardEnd) {
                    tracing::info!(shard = %lease.shard_id, "a closed shard nothing will read (the subscription began after it): recorded as finished");
                }
                rows.insert(lease.shard_id.clone(), lease.clone());
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
