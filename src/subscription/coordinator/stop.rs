//! A graceful stop, bounded: no more reading, every held shard handed back (in-flight
//! deliveries get the shutdown timeout, then the checkpoint is written and the lease
//! released), takes still under way released unread, the worker row kept alive until all of
//! that is done and then deleted, and the others told. The whole stop takes at most
//! `shutdown_timeout` plus one call timeout; past that it says what it abandoned and ends.

use std::collections::BTreeSet;

use futures::future::{BoxFuture, FutureExt};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::{Instant, MissedTickBehavior, interval};

use super::take::TakeOutcome;
use super::worker::AtStop;
use super::{Command, Coordinator, Done, roster};
use crate::error::KinesisError;

/// Hand-backs under way at a stop: each ends with its shard's id.
type HandBacks = FuturesUnordered<BoxFuture<'static, String>>;

impl Coordinator {
    /// Stops gracefully (see the module's docs). The subscription's stream yields nothing
    /// from the start of the stop, and ends once the caller sends [`Command::Close`].
    pub(super) async fn stop(&mut self) {
        let began = Instant::now();
        let before = self.shared.releases.counts();
        let _ = self.outbox.commands.send(Command::Stop);
        let shards: Vec<String> = self.shards.held.keys().cloned().collect();
        for shard in shards {
            self.hand_off(&shard);
        }
        let bound = self.config().shutdown_timeout + self.config().call_timeout();
        let mut pending = BTreeSet::new();
        let mut keepers = 0;
        let wind_down = self.wind_down(&mut pending, &mut keepers);
        let wound_down = tokio::time::timeout_at(began + bound, wind_down).await;
        if wound_down.is_ok() {
            let row = self.instance.worker.delete_at_stop(&self.shared).await;
            self.leave_group(row);
            // The others list at once and take what was released.
            roster::bump_roster(&self.shared).await;
        } else {
            // The row is left to go stale (the others then declare this instance gone).
            self.leave_group(AtStop::Kept);
        }
        if wound_down.is_err() {
            tracing::warn!(
                bound = ?bound,
                abandoned = ?pending,
                worker_row_deleted = !self.instance.worker.holds(),
                "the stop took longer than shutdown_timeout plus one call timeout and was cut \
                 short: the shards not handed back expire for the others after the lease \
                 duration, and their unsettled records are read again"
            );
        }
        self.log_stopped(before, keepers, wound_down.is_ok());
    }

    /// Waits for every hand-back and job, renewing the worker row meanwhile (so no other
    /// instance declares this one gone while its handlers finish); the caller then deletes
    /// the worker row and tells the others. `pending` names the shards not handed back yet;
    /// `keepers` counts the shard keepers waited for.
    async fn wind_down(&mut self, pending: &mut BTreeSet<String>, keepers: &mut usize) {
        let mut hand_backs: HandBacks = std::mem::take(&mut self.shards.releasing)
            .into_iter()
            .map(|(shard, task)| {
                pending.insert(shard.clone());
                task.map(move |_| shard).boxed()
            })
            .collect();
        *keepers = hand_backs.len();
        let mut renew = interval(self.config().worker_renew_interval());
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        while !(hand_backs.is_empty() && self.inbox.jobs.is_empty()) {
            tokio::select! {
                Some(shard) = hand_backs.next() => {
                    pending.remove(&shard);
                }
                Some(done) = self.inbox.jobs.next() => self.on_done_stopping(done, &mut hand_backs, pending),
                // Renewed, never created again: a row lost meanwhile stays lost.
                _ = renew.tick(), if !hand_backs.is_empty() && self.instance.worker.holds() => {
                    self.keep_worker_row();
                }
            }
        }
    }

    /// Leaves the liveness group; the anchor's stop dissolves it (see
    /// [`LivenessGroup::dissolve`](crate::subscription::group::LivenessGroup::dissolve)): the
    /// other streams, if they go on, answer to their leases and their own worker rows, and
    /// when the anchor row was not deleted here (found written by another, or the delete
    /// failed) their readers of the group's epoch stop for good first.
    fn leave_group(&self, row: AtStop) {
        let Some(group) = &self.shared.config.group else {
            return;
        };
        if group.is_anchor(&self.shared.stream) {
            group.dissolve(row == AtStop::Deleted);
        }
        group.leave(&self.shared.stream);
    }

    /// A job that finished while stopping: a take is released unread, a worker-row write is
    /// applied, the rest is of no use any more.
    fn on_done_stopping(
        &mut self,
        done: Done,
        hand_backs: &mut HandBacks,
        pending: &mut BTreeSet<String>,
    ) {
        match done {
            Done::Take(shard, TakeOutcome::Taken(taken), _) => {
                let store = self.shared.store.clone();
                pending.insert(shard.clone());
                hand_backs.push(
                    async move {
                        let _ = store.release(&taken.lease).await;
                        shard
                    }
                    .boxed(),
                );
            }
            Done::Worker(done) => self.on_worker(done),
            Done::Seek(opened) => opened.refuse(KinesisError::Stopped {
                stream: self.shared.stream.to_string(),
            }),
            _ => {}
        }
    }

    /// The stop's last line: how many shards were handed back, and whether any could not be.
    /// A keeper of the `keepers` waited for that said nothing (it died: a panic; or it had
    /// stopped before, its lease lost) did not hand its shard back.
    fn log_stopped(&self, before: (usize, usize), keepers: usize, complete: bool) {
        let (all_released, all_failed) = self.shared.releases.counts();
        let (released, failed) = (all_released - before.0, all_failed - before.1);
        let failed = failed.max(keepers.saturating_sub(released));
        if failed == 0 && complete {
            tracing::info!(
                released,
                "subscription stopped; final checkpoints written, leases released"
            );
        } else {
            tracing::warn!(
                released,
                failed,
                "subscription stopped; some shards could not write their final checkpoint or release \
                 their lease (they expire, and their unsettled records are read again)"
            );
        }
    }
}
