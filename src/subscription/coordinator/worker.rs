//! This instance's worker row: the other instances count it when they share the shards. It is
//! kept (created, taken, renewed) while the instance can do the work, deleted while it cannot,
//! and deleted at a graceful stop.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::plan::WORKER_PREFIX;
use super::shared::Shared;
use crate::lease::{Lease, LeaseError};

/// How a job on the worker row went.
#[derive(Debug)]
pub(crate) enum WorkerDone {
    /// The row is held, as written by a call sent at that instant.
    Held(Lease, Instant),
    /// Someone else wrote the row.
    Lost,
    /// The table failed.
    Failed(LeaseError),
    /// The row is gone.
    Deleted,
}

/// The worker row as this instance last wrote it.
#[derive(Debug, Default)]
pub(crate) struct WorkerRow {
    row: Option<Lease>,
    /// A job on the row is under way.
    busy: bool,
    /// When the last successful write was sent.
    renewed: Option<Instant>,
}

impl WorkerRow {
    /// The next job: renew the row, create and take it, or delete it while the instance
    /// cannot work. `None` while a job runs or when there is nothing to do.
    pub(crate) fn next_job(
        &mut self,
        shared: Arc<Shared>,
        can_work: bool,
    ) -> Option<BoxFuture<'static, WorkerDone>> {
        if self.busy {
            return None;
        }
        let job: BoxFuture<'static, WorkerDone> = match (self.row.clone(), can_work) {
            (Some(row), true) => Box::pin(renew(shared, row)),
            (None, true) => Box::pin(ensure(shared)),
            (Some(row), false) => {
                tracing::warn!(
                    "this instance cannot read the stream now: it stops counting towards the shares, so the others take what it cannot read"
                );
                Box::pin(delete(shared, row))
            }
            (None, false) => return None,
        };
        self.busy = true;
        Some(job)
    }

    /// Applies a job's outcome.
    pub(crate) fn done(&mut self, done: WorkerDone, give_up_after: Duration) {
        self.busy = false;
        match done {
            WorkerDone::Held(row, sent) => {
                self.row = Some(row);
                self.renewed = Some(sent);
            }
            WorkerDone::Lost | WorkerDone::Deleted => self.row = None,
            WorkerDone::Failed(e) => {
                tracing::debug!(error = %e, "worker row write failed; retried at the next renewal");
                if self.renewed.is_some_and(|at| at.elapsed() >= give_up_after) {
                    self.row = None;
                }
            }
        }
    }

    /// Deletes the row at a graceful stop. The row as last renewed may be stale (a renewal
    /// that timed out here but was written), so a lost condition is tried once more against
    /// the row as it is now, if it is still this instance's.
    pub(crate) async fn delete_at_stop(&mut self, shared: &Shared) {
        let Some(row) = self.row.take() else {
            return;
        };
        let mut result = shared.store.delete(&row).await;
        if result.as_ref().is_err_and(LeaseError::is_lost) {
            let owner = shared.config.owner.as_str();
            let current = shared.store.list(&shared.stream).await.map(|rows| {
                rows.into_iter()
                    .find(|l| l.shard_id == row.shard_id && l.owner.as_deref() == Some(owner))
            });
            result = match current {
                Ok(Some(row)) => shared.store.delete(&row).await,
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not delete this instance's worker row; the other instances delete it once it is not renewed for the lease duration");
        }
    }
}

async fn renew(shared: Arc<Shared>, row: Lease) -> WorkerDone {
    let sent = Instant::now();
    match shared.store.renew(&row).await {
        Ok(row) => WorkerDone::Held(row, sent),
        Err(e) if e.is_lost() => WorkerDone::Lost,
        Err(e) => WorkerDone::Failed(e),
    }
}

async fn ensure(shared: Arc<Shared>) -> WorkerDone {
    let row = Lease::new(
        shared.stream.to_string(),
        format!("{WORKER_PREFIX}{}", shared.config.owner),
        Vec::new(),
    );
    let current = async {
        shared.store.create(&row).await?;
        let rows = shared.store.list(&shared.stream).await?;
        Ok::<_, LeaseError>(
            rows.into_iter()
                .find(|l| l.shard_id == row.shard_id)
                .unwrap_or(row.clone()),
        )
    };
    let current = match current.await {
        Ok(current) => current,
        Err(e) => return WorkerDone::Failed(e),
    };
    let sent = Instant::now();
    match shared.store.take(&current, &shared.config.owner).await {
        Ok(row) => WorkerDone::Held(row, sent),
        Err(e) if e.is_lost() => WorkerDone::Lost,
        Err(e) => WorkerDone::Failed(e),
    }
}

async fn delete(shared: Arc<Shared>, row: Lease) -> WorkerDone {
    match shared.store.delete(&row).await {
        Ok(()) => WorkerDone::Deleted,
        Err(e) if e.is_lost() => WorkerDone::Lost,
        Err(e) => WorkerDone::Failed(e),
    }
}
