//! The lease table rows that are not shards being read: this instance's worker row,
//! and rows nobody needs any more.

use tokio::time::Instant;

use super::shared::Shared;
use super::worker::{Held, WorkerDone};
use super::{Coordinator, Done};
use crate::lease::{Lease, LeaseError};

impl Coordinator {
    /// Keeps this instance's worker row while it can do the work, and deletes it while it
    /// cannot, so the other instances count it exactly then.
    pub(super) fn keep_worker_row(&mut self) {
        let can_work = self
            .health
            .can_work(self.shared.probe.count(), Instant::now());
        if let Some(job) = self.worker.next_job(self.shared.clone(), can_work) {
            self.jobs
                .push(Box::pin(async move { Done::Worker(job.await) }));
        }
    }

    pub(super) fn on_worker(&mut self, done: WorkerDone) {
        let give_up_after = self.config().give_up_after();
        let forget = match &done {
            WorkerDone::Held(_, _, how) => *how == Held::Again { kept: false },
            WorkerDone::Lost => true,
            WorkerDone::Deleted | WorkerDone::Failed(_) => false,
        };
        if forget && !self.held.is_empty() {
            tracing::warn!(
                held = self.held.len(),
                "this instance's worker row was released or removed by another instance (it \
                 was not renewed for the lease duration): its shards may be another's now and \
                 are dropped; their unsettled records are read again"
            );
            self.forget_all();
        }
        match &done {
            WorkerDone::Held(_, sent, how) => {
                self.shared.worker_gate.renewed(*sent);
                if *how != Held::Renewed {
                    // Joined (or back): the others rebalance at once, and so does this one.
                    self.list_soon();
                    self.move_roster();
                }
            }
            WorkerDone::Deleted => self.shared.worker_gate.unbind(),
            WorkerDone::Lost | WorkerDone::Failed(_) => {}
        }
        self.worker.done(&done, give_up_after);
    }

    /// Stops reading every held shard without writing anything: their leases may be
    /// another's already.
    fn forget_all(&mut self) {
        let shards: Vec<String> = self.held.keys().cloned().collect();
        for shard in shards {
            self.forget(&shard);
        }
    }

    pub(super) fn delete(&mut self, stale: Vec<Lease>) {
        if stale.is_empty() {
            return;
        }
        let store = self.shared.store.clone();
        self.jobs.push(Box::pin(async move {
            let results = futures::future::join_all(stale.iter().map(|l| store.delete(l))).await;
            Done::Deleted(stale.into_iter().zip(results).collect())
        }));
    }

    pub(super) fn on_deleted(&mut self, results: Vec<(Lease, Result<(), LeaseError>)>) {
        for (lease, result) in results {
            match result {
                Ok(()) => {
                    tracing::info!(
                        row = %lease.shard_id,
                        owner = lease.owner.as_deref().unwrap_or("-"),
                        "deleted a lease table row nobody needs (a stopped instance, a shard \
                         past the retention period, or a shard of an earlier stream of the \
                         same name)"
                    );
                    self.liveness.forget(&lease.shard_id);
                    self.unlisted.remove(&lease.shard_id);
                }
                Err(e) if e.is_lost() => {
                    tracing::debug!(row = %lease.shard_id, "row written meanwhile; kept");
                }
                Err(e) if e.is_retryable() || self.delete_refused => {
                    tracing::debug!(row = %lease.shard_id, error = %e, "deleting a row failed; retried at the next listing");
                }
                Err(e) => {
                    // Said once: a policy without dynamodb:DeleteItem refuses every delete.
                    self.delete_refused = true;
                    tracing::warn!(row = %lease.shard_id, error = %e, "deleting a stale lease table row failed; rows of stopped instances and expired shards stay until it works");
                }
            }
        }
    }
}

/// Removes every row of a deleted stream: its shards' rows, worker rows and roster row. Rows
/// written meanwhile (another instance releasing what it held) are read again, a few times;
/// whatever is left is removed by the other instances, which find the stream deleted too.
pub(super) async fn forget_stream(shared: &Shared) {
    for _ in 0..3 {
        let rows = match shared.store.list(&shared.stream).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the deleted stream's lease rows to remove them");
                return;
            }
        };
        let mut changed = 0;
        for row in &rows {
            match shared.store.delete(row).await {
                Ok(()) => {}
                Err(e) if e.is_lost() => changed += 1,
                Err(e) => {
                    tracing::warn!(shard = %row.shard_id, error = %e, "could not remove a deleted stream's lease row")
                }
            }
        }
        tracing::info!(
            rows = rows.len() - changed,
            "removed the deleted stream's lease rows"
        );
        if changed == 0 {
            return;
        }
    }
}
