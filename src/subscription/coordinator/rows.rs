//! The lease table rows that are not shards being read: this instance's worker row,
//! and rows nobody needs any more.

use std::collections::HashMap;

use tokio::time::Instant;

use super::plan::WORKER_PREFIX;
use super::shared::Shared;
use super::worker::{Held, WorkerDone};
use super::{Coordinator, Done};
use crate::lease::{Lease, LeaseError};

impl Coordinator {
    /// Keeps this instance's worker row while it can do the work, and deletes it while it
    /// cannot, so the other instances count it exactly then.
    pub(super) fn keep_worker_row(&mut self) {
        self.follow_group_epoch();
        let stopping = (self.shared.policy.stopping).load(std::sync::atomic::Ordering::Acquire);
        if !self.worker_row_current() && !stopping {
            // The group dissolved: the row is made anew without it (not while stopping: a
            // stop makes no row, it deletes it).
            self.instance.worker.remake();
        }
        let can_work = self
            .instance
            .health
            .can_work(self.shared.probe.count(), Instant::now());
        if let Some(job) = self.instance.worker.next_job(self.shared.clone(), can_work) {
            self.inbox
                .jobs
                .push(Box::pin(async move { Done::Worker(job.await) }));
        }
    }

    pub(super) fn on_worker(&mut self, done: WorkerDone) {
        let give_up_after = self.config().worker_give_up_after();
        let forget = match &done {
            WorkerDone::Held(_, _, how) => *how == Held::Again { kept: false },
            WorkerDone::Lost => true,
            WorkerDone::Deleted | WorkerDone::Failed(_) => false,
        };
        if forget {
            // Takes under way are not installed either.
            self.shards.epoch += 1;
            if (self.shared.config.group.as_ref())
                .is_some_and(|group| group.is_anchor(&self.shared.stream))
            {
                // Every stream's readers close for good; they drop their shards next.
                self.shared.worker_gate.lost();
                self.instance.group_epoch = self.shared.worker_gate.epoch();
            }
        }
        if forget && !self.shards.held.is_empty() {
            tracing::warn!(
                held = self.shards.held.len(),
                owner = %self.config().owner,
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
        let failed = matches!(done, WorkerDone::Failed(_));
        self.instance.worker.done(&done, give_up_after);
        if failed {
            self.retry_worker_row();
        }
    }

    /// In a liveness group whose anchor row was lost since this stream's shards were taken:
    /// their readers are closed for good, and the shards may be another's. They are dropped
    /// (and takes under way not installed) before anything is read again.
    fn follow_group_epoch(&mut self) {
        let Some(group) = &self.shared.config.group else {
            return;
        };
        let epoch = group.gate().epoch();
        if epoch == self.instance.group_epoch {
            return;
        }
        self.instance.group_epoch = epoch;
        self.shards.epoch += 1;
        if !self.shards.held.is_empty() {
            tracing::warn!(
                held = self.shards.held.len(),
                owner = %self.config().owner,
                "this instance's worker row of the anchor stream was released by another \
                 instance (it was not renewed for the worker timeout): this stream's shards \
                 may be another's now and are dropped; their unsettled records are read again"
            );
            self.forget_all();
        }
    }

    /// False while this instance's worker row still names a liveness group that dissolved:
    /// another instance could find the old anchor row released under that group and free
    /// whatever this stream takes now, which no anchor gate guards any more. Nothing is taken
    /// until the row is made anew.
    pub(super) fn worker_row_current(&self) -> bool {
        let current = (self.shared.config.group.as_ref()).and_then(|group| group.id());
        !self.instance.worker.names_another_group(current)
    }

    /// Tries the worker row again after half a renewal interval, not a whole one: every
    /// reader's gate closes two renewal intervals after the last success, so a single failed
    /// renewal must not leave the next try at that very moment.
    fn retry_worker_row(&mut self) {
        if !self.instance.worker.holds() {
            // Given up on (or gone): the next renewal tick makes the row anew, if it should.
            return;
        }
        let can_work = self
            .instance
            .health
            .can_work(self.shared.probe.count(), Instant::now());
        let wait = self.config().worker_renew_interval() / 2;
        if let Some(job) = self.instance.worker.next_job(self.shared.clone(), can_work) {
            self.inbox.jobs.push(Box::pin(async move {
                tokio::time::sleep(wait).await;
                Done::Worker(job.await)
            }));
        }
    }

    /// Stops reading every held shard without writing anything: their leases may be
    /// another's already.
    fn forget_all(&mut self) {
        let shards: Vec<String> = self.shards.held.keys().cloned().collect();
        for shard in shards {
            self.forget(&shard);
        }
    }

    pub(super) fn delete(&mut self, stale: Vec<Lease>) {
        if stale.is_empty() {
            return;
        }
        let store = self.shared.store.clone();
        self.inbox.jobs.push(Box::pin(async move {
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
                    self.instance.liveness.forget(&lease.shard_id);
                    self.listings.unlisted.remove(&lease.shard_id);
                }
                Err(e) if e.is_lost() => {
                    tracing::debug!(row = %lease.shard_id, "row written meanwhile; kept");
                }
                Err(e) if e.is_retryable() || self.listings.delete_refused => {
                    tracing::debug!(row = %lease.shard_id, error = %e, "deleting a row failed; retried at the next listing");
                }
                Err(e) => {
                    // Said once: a policy without dynamodb:DeleteItem refuses every delete.
                    self.listings.delete_refused = true;
                    tracing::warn!(row = %lease.shard_id, error = %e, "deleting a stale lease table row failed; rows of stopped instances and expired shards stay until it works");
                }
            }
        }
    }
}

/// Which rows of a deleted stream to remove, given `generation` (each shard's starting
/// sequence number at the last listing before the deletion):
///
/// * the shard rows of that generation (and rows from before rows recorded one); rows of
///   another generation are the stream's created again in its name, and stay;
/// * worker rows that nobody holds (instances declared gone); a held worker row is its
///   owner's to delete when it stops (it finds the stream deleted too, or it reads the stream
///   created again), so a deletion never removes a live instance's row;
/// * the roster row, once no other worker row is left.
pub(super) fn rows_to_forget(rows: Vec<Lease>, generation: &HashMap<String, String>) -> Vec<Lease> {
    let is_worker = |row: &Lease| row.shard_id.starts_with(WORKER_PREFIX);
    let is_roster = |row: &Lease| row.shard_id == WORKER_PREFIX;
    let of_another = |row: &Lease| {
        row.starting_sequence_number
            .as_ref()
            .is_some_and(|seq| generation.get(&row.shard_id) != Some(seq))
    };
    let workers_left = rows
        .iter()
        .any(|row| is_worker(row) && !is_roster(row) && row.owner.is_some());
    rows.into_iter()
        .filter(|row| match () {
            () if is_roster(row) => !workers_left,
            () if is_worker(row) => row.owner.is_none(),
            () => !of_another(row),
        })
        .collect()
}

/// Removes the rows of a deleted stream (see [`rows_to_forget`]). Rows written meanwhile
/// (another instance releasing what it held) are read again, a few times; whatever is left is
/// removed by the other instances, which find the stream deleted too.
pub(super) async fn forget_stream(shared: &Shared, generation: &HashMap<String, String>) {
    for _ in 0..3 {
        let rows = match shared.store.list(&shared.stream).await {
            Ok(rows) => rows_to_forget(rows, generation),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, start: Option<&str>) -> Lease {
        let mut row = Lease::new("s", id, vec![]);
        row.starting_sequence_number = start.map(str::to_owned);
        row
    }

    fn ids(rows: Vec<Lease>) -> Vec<String> {
        rows.into_iter().map(|r| r.shard_id).collect()
    }

    #[test]
    fn a_deleted_streams_rows_go_but_a_recreated_streams_and_live_workers_stay() {
        let generation: HashMap<String, String> = [("shard-0".to_owned(), "100".to_owned())].into();
        let mut gone = row("worker:gone", None);
        gone.owner = None;
        let mut live = row("worker:live", None);
        live.owner = Some("live".to_owned());
        let old = vec![
            row("shard-0", Some("100")),
            row("shard-legacy", None),
            gone,
            row(WORKER_PREFIX, None),
        ];
        assert_eq!(
            ids(rows_to_forget(old.clone(), &generation)),
            vec!["shard-0", "shard-legacy", "worker:gone", WORKER_PREFIX]
        );
        // Created again meanwhile and read by a live instance: its shard rows, its worker row
        // and the roster stay.
        let mut both = old;
        both.push(row("shard-1", Some("900")));
        both[0] = row("shard-0", Some("900"));
        both.push(live);
        assert_eq!(
            ids(rows_to_forget(both, &generation)),
            vec!["shard-legacy", "worker:gone"]
        );
    }
}
