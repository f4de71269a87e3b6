//! This instance's worker row: the other instances count it when they share the shards, and
//! watch it (see [`super::roster`]) to learn within a second of the worker timeout that the
//! instance is gone. It is kept (created, renewed) while the instance can do the work,
//! deleted while it cannot, and deleted at a graceful stop.
//!
//! Another instance that saw the row unchanged for the worker timeout *declares* this one
//! gone by releasing the row (its owner removed) and then takes its shards without waiting for
//! each of their leases to expire. That is safe because every reader here stops once the row
//! has not been renewed for two thirds of the worker timeout ([`WorkerGate`]). Once the row was
//! released or deleted by someone else, this instance forgets every shard it held (they may be
//! another's already) and starts over with a row of its own.
//!
//! [`WorkerGate`]: crate::subscription::gate::WorkerGate

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
    Held(Lease, Instant, Held),
    /// Someone else wrote the row.
    Lost,
    /// The table failed.
    Failed(LeaseError),
    /// The row is gone.
    Deleted,
}

/// What became of the worker row at a graceful stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AtStop {
    /// Deleted here (or this instance never made one, or deleted it while it could not work).
    Deleted,
    /// Another instance had written it (declared this one gone) or removed it.
    Lost,
    /// The delete failed, or the row was given up on after failed writes: it may stay until
    /// it is stale.
    Kept,
}

/// How the worker row came to be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Held {
    /// Renewed as held before.
    Renewed,
    /// Created or taken again. `kept` when nobody else wrote or removed it since this instance
    /// last held it (or this instance never had one, or deleted it itself); otherwise the
    /// instance was declared gone meanwhile.
    Again { kept: bool },
}

/// The worker row as this instance last wrote it.
#[derive(Debug, Default)]
pub(crate) struct WorkerRow {
    row: Option<Lease>,
    /// A job on the row is under way.
    busy: bool,
    /// When the last successful write was sent.
    renewed: Option<Instant>,
    /// The row is gone because this instance deleted it (while it could not work).
    withdrawn: bool,
    /// The row was this instance's at some point.
    ever_held: bool,
    /// The liveness group the row in the table names, as far as this instance wrote it
    /// (`None`: no row of this instance's making is there, or it names none): kept while the
    /// row is lost, given up on or being made anew, until a write replaces it.
    written_group: Option<String>,
    /// What became of the row when it stopped being held: lost to another instance, or given
    /// up on after failed writes (`None` while held, or deleted here, or never made).
    gone: Option<AtStop>,
}

impl WorkerRow {
    /// True while this instance holds its worker row (as last written).
    pub(crate) fn holds(&self) -> bool {
        self.row.is_some()
    }

    /// True when the row as last written names a liveness group other than `current` (the
    /// group dissolved since): it is to be made anew before the instance takes anything.
    pub(crate) fn names_another_group(&self, current: Option<&str>) -> bool {
        (self.written_group.as_deref()).is_some_and(|group| Some(group) != current)
    }

    /// Makes the row anew at the next job (as when its limits changed), unless a job runs.
    pub(crate) fn remake(&mut self) {
        if !self.busy {
            self.row = None;
        }
    }

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
            // A row missing is news only when this instance had one and did not delete it.
            (None, true) => Box::pin(ensure(shared, self.withdrawn || !self.ever_held)),
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
    pub(crate) fn done(&mut self, done: &WorkerDone, give_up_after: Duration) {
        self.busy = false;
        match done {
            WorkerDone::Held(row, sent, _) => {
                self.row = Some(row.clone());
                self.renewed = Some(*sent);
                self.withdrawn = false;
                self.ever_held = true;
                self.written_group.clone_from(&row.liveness_group);
                self.gone = None;
            }
            WorkerDone::Lost => {
                self.row = None;
                self.gone = Some(AtStop::Lost);
            }
            WorkerDone::Deleted => {
                self.row = None;
                self.withdrawn = true;
                self.written_group = None;
                self.gone = None;
            }
            WorkerDone::Failed(e) => {
                tracing::debug!(error = %e, "worker row write failed; retried at the next renewal");
                if self.renewed.is_some_and(|at| at.elapsed() >= give_up_after) {
                    self.row = None;
                    self.gone.get_or_insert(AtStop::Kept);
                }
            }
        }
    }

    /// Deletes the row at a graceful stop. The row as last renewed may be stale (a renewal
    /// that timed out here but was written), so a lost condition is tried once more against
    /// the row as it is now, if it is still this instance's.
    pub(crate) async fn delete_at_stop(&mut self, shared: &Shared) -> AtStop {
        let Some(row) = self.row.take() else {
            // Not held: lost to another, given up on (it may still be there), or none made.
            return self.gone.unwrap_or(AtStop::Deleted);
        };
        let mut lost = false;
        let mut result = shared.store.delete(&row).await;
        if result.as_ref().is_err_and(LeaseError::is_lost) {
            let owner = shared.config.owner.as_str();
            let ids = [row.shard_id.clone()];
            let current = shared
                .store
                .get(&shared.stream, &ids)
                .await
                .map(|rows| rows.into_iter().find(|l| l.owner.as_deref() == Some(owner)));
            result = match current {
                Ok(Some(row)) => shared.store.delete(&row).await,
                Ok(None) => {
                    lost = true;
                    Ok(())
                }
                Err(e) => Err(e),
            };
        }
        match result {
            Ok(()) if lost => AtStop::Lost,
            Ok(()) => AtStop::Deleted,
            Err(e) => {
                tracing::warn!(error = %e, "could not delete this instance's worker row; the other instances delete it once it is not renewed for the lease duration");
                AtStop::Kept
            }
        }
    }
}

async fn renew(shared: Arc<Shared>, row: Lease) -> WorkerDone {
    let mut sent = Instant::now();
    let mut result = shared.store.renew(&row).await;
    if result.as_ref().is_err_and(LeaseError::is_lost) {
        // A renewal whose answer was lost may have been applied: a row that still names this
        // instance was written by it, so it is renewed as it is (see `outcome`).
        let owner = shared.config.owner.as_str();
        if let Some(current) = super::outcome::still_ours(&shared.store, &row, owner).await {
            tracing::info!(
                "a worker-row write whose outcome was unknown had been applied; renewing the row as written"
            );
            sent = Instant::now();
            result = shared.store.renew(&current).await;
        }
    }
    match result {
        Ok(row) => WorkerDone::Held(row, sent, Held::Renewed),
        Err(e) if e.is_lost() => WorkerDone::Lost,
        Err(e) => WorkerDone::Failed(e),
    }
}

/// What [`ensure`] found of the worker row.
enum Found {
    Created,
    /// A row with other limits was deleted and the row created anew; `ours`: it was held by
    /// this instance.
    Replaced {
        ours: bool,
    },
    Existing(Box<Lease>),
    Vanished,
}

/// The id of `owner`'s worker row.
pub(crate) fn worker_row_id(owner: &str) -> String {
    format!("{WORKER_PREFIX}{owner}")
}

/// Makes the row this instance's: created already held (never unowned, which would read as
/// "declared gone"), or, when it exists, renewed if it is still this instance's and taken
/// otherwise. `expected_missing`: this instance never had the row, or deleted it itself, so a
/// missing row is no news.
async fn ensure(shared: Arc<Shared>, expected_missing: bool) -> WorkerDone {
    let owner = shared.config.owner.clone();
    let mut row = Lease::new(shared.stream.to_string(), worker_row_id(&owner), Vec::new());
    row.owner = Some(owner.clone());
    row.limits = Some(shared.config.limits);
    row.liveness_group = (shared.config.group.as_ref())
        .and_then(|group| group.id())
        .map(str::to_owned);
    let sent = Instant::now();
    // A row deleted between the create and the read is created again.
    let found = async {
        let ids = [row.shard_id.clone()];
        for _ in 0..2 {
            if shared.store.create(&row).await? {
                return Ok(Found::Created);
            }
            match shared.store.get(&shared.stream, &ids).await?.pop() {
                // Limits or group set differently (a restart with other settings, or of
                // another process with the same owner): the row is made anew, conditional on
                // it being as read.
                Some(current)
                    if current.limits != row.limits
                        || current.liveness_group != row.liveness_group =>
                {
                    let ours = current.owner.as_deref() == Some(owner.as_str());
                    shared.store.delete(&current).await?;
                    if shared.store.create(&row).await? {
                        return Ok(Found::Replaced { ours });
                    }
                }
                Some(current) => return Ok(Found::Existing(Box::new(current))),
                None => {}
            }
        }
        Ok::<_, LeaseError>(Found::Vanished)
    };
    let current = match found.await {
        Ok(Found::Created) => {
            let kept = expected_missing;
            return WorkerDone::Held(row, sent, Held::Again { kept });
        }
        Ok(Found::Replaced { ours }) => {
            let kept = ours || expected_missing;
            return WorkerDone::Held(row, sent, Held::Again { kept });
        }
        Ok(Found::Existing(current)) => *current,
        // Created and deleted by others twice over: tried again at the next renewal.
        Ok(Found::Vanished) => return WorkerDone::Lost,
        Err(e) if e.is_lost() => return WorkerDone::Lost,
        Err(e) => return WorkerDone::Failed(e),
    };
    let sent = Instant::now();
    let (written, kept) = if current.owner.as_deref() == Some(owner.as_str()) {
        (shared.store.renew(&current).await, true)
    } else {
        (shared.store.take(&current, &owner).await, false)
    };
    match written {
        Ok(row) => WorkerDone::Held(row, sent, Held::Again { kept }),
        // Written or deleted meanwhile: the next try sees how it is now.
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
