//! A graceful stop, bounded: no more reading, every held shard handed back (in-flight
//! deliveries get the shutdown timeout, then the checkpoint is written and the lease
//! released), takes still under way released unread, the worker row kept alive until all of
//! that is done and then deleted, and the others told. The anchor stream of a liveness group
//! whose other streams go on keeps its worker row until they end (see [`hold_anchor_row`]).
//!
//! [`hold_anchor_row`]: Coordinator::hold_anchor_row The whole stop takes at most
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
        let wound_down = tokio::time::timeout_at(began + bound, self.wind_down(&mut pending)).await;
        let anchor = self.holds_the_anchor_row();
        if anchor {
            self.hold_anchor_row().await;
        }
        if wound_down.is_ok() || anchor {
            self.leave_table().await;
        } else {
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
        self.log_stopped(before, wound_down.is_ok());
    }

    /// Waits for every hand-back and job, renewing the worker row meanwhile (so no other
    /// instance declares this one gone while its handlers finish), then deletes the worker
    /// row and tells the others. `pending` names the shards not handed back yet.
    async fn wind_down(&mut self, pending: &mut BTreeSet<String>) {
        let mut hand_backs: HandBacks = std::mem::take(&mut self.shards.releasing)
            .into_iter()
            .map(|(shard, task)| {
                pending.insert(shard.clone());
                task.map(move |_| shard).boxed()
            })
            .collect();
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

    /// Deletes the worker row (unless the anchor stream was inserted again, whose new
    /// coordinator keeps it), leaves the group, and tells the others.
    async fn leave_table(&mut self) {
        let back = (self.shared.config.group.as_ref())
            .is_some_and(|group| group.is_anchor(&self.shared.stream) && group.anchor_back());
        if back {
            if let Some(group) = &self.shared.config.group {
                group.leave(&self.shared.stream);
            }
            return;
        }
        let row = self.instance.worker.delete_at_stop(&self.shared).await;
        self.leave_group(row);
        // The others list at once and take what was released.
        roster::bump_roster(&self.shared).await;
    }

    /// True for the anchor stream of a liveness group whose other streams go on: its worker
    /// row stands for theirs, and every reader of theirs stops once it is stale.
    fn holds_the_anchor_row(&self) -> bool {
        (self.shared.config.group.as_ref()).is_some_and(|group| {
            group.is_anchor(&self.shared.stream) && !group.is_closing() && group.has_others()
        })
    }

    /// The anchor stream left the set (or ended) while the group's other streams go on: its
    /// worker row is kept as it was while reading (renewed, made again if lost, the gate's
    /// epoch moving on a loss), until the whole subscription stops, the other streams have
    /// all ended, or the anchor stream is inserted again (its new coordinator then keeps the
    /// row).
    async fn hold_anchor_row(&mut self) {
        let Some(group) = self.shared.config.group.clone() else {
            return;
        };
        tracing::info!(
            "the anchor stream of this instance's streams stopped: its worker row is kept \
             while the other streams are read, and they watch the other instances themselves"
        );
        group.stop_covering();
        let mut renew = interval(self.config().worker_renew_interval());
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let (mut none, mut pending) = (HandBacks::new(), BTreeSet::new());
        while !group.is_closing() && group.has_others() && !group.anchor_back() {
            tokio::select! {
                Some(done) = self.inbox.jobs.next() => self.on_done_stopping(done, &mut none, &mut pending),
                _ = renew.tick() => {
                    if let Some(job) = self.instance.worker.next_job(self.shared.clone(), true) {
                        self.inbox.jobs.push(Box::pin(async move { Done::Worker(job.await) }));
                    }
                }
            }
        }
        // A write under way is applied before the row is deleted or left to the next one.
        while let Some(done) = self.inbox.jobs.next().await {
            self.on_done_stopping(done, &mut none, &mut pending);
        }
    }

    /// Leaves the liveness group. The anchor's row deleted, the other streams still running
    /// answer to their leases and their own worker rows; found written by another (declared
    /// gone), their readers close for good; not deleted, it goes stale and closes them.
    fn leave_group(&self, row: AtStop) {
        let Some(group) = &self.shared.config.group else {
            return;
        };
        if group.is_anchor(&self.shared.stream) {
            match row {
                AtStop::Deleted => group.gate().unbind(),
                AtStop::Lost => group.gate().lost(),
                AtStop::Kept => {}
            }
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
    fn log_stopped(&self, before: (usize, usize), complete: bool) {
        let (all_released, all_failed) = self.shared.releases.counts();
        let (released, failed) = (all_released - before.0, all_failed - before.1);
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
