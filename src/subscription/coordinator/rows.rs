//! The lease table rows that are not shards being read: this instance's worker row,
//! and rows nobody needs any more.

use tokio::time::Instant;

use super::worker::WorkerDone;
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
        self.worker.done(done, give_up_after);
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
