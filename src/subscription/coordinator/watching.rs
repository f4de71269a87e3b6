//! The coordinator's side of the watch (see [`roster`]): reading the watched worker rows and
//! the roster row, declaring an instance gone, and moving the roster row when others should
//! list at once.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::roster::{self, WatchPlan, WatchRead};
use super::worker::worker_row_id;
use super::{Coordinator, Done};
use crate::lease::{Lease, LeaseError};
use crate::subscription::group::{LivenessGroup, anchor_of};

impl Coordinator {
    /// Moves the roster row (one move at a time; a move asked for meanwhile follows it), so
    /// the other instances list at once.
    pub(super) fn move_roster(&mut self) {
        if self.instance.watch.moving {
            self.instance.watch.move_again = true;
            return;
        }
        self.instance.watch.moving = true;
        let shared = self.shared.clone();
        self.inbox.jobs.push(Box::pin(async move {
            roster::bump_roster(&shared).await;
            Done::RosterMoved
        }));
    }

    pub(super) fn on_roster_moved(&mut self) {
        self.instance.watch.moving = false;
        if std::mem::take(&mut self.instance.watch.move_again) {
            self.move_roster();
        }
    }

    /// Reads the watched worker rows and the roster row (in a liveness group, only what the
    /// group needs of this stream; see [`crate::subscription::group`]).
    pub(super) fn start_watch(&mut self) {
        let plan = match self.shared.config.group.clone() {
            None => WatchPlan {
                rows: self.instance.watch.ring.clone(),
                roster: true,
                ..WatchPlan::default()
            },
            Some(group) => self.group_watch_plan(&group),
        };
        if plan.is_empty() {
            let interval = roster::watch_interval(self.config().lease_duration);
            self.instance.watch.next = Instant::now() + interval;
            return;
        }
        self.instance.watch.busy = true;
        let shared = self.shared.clone();
        self.inbox.jobs.push(Box::pin(async move {
            Done::Watched(roster::read(shared, plan).await)
        }));
    }

    /// What this stream reads for its liveness group: its ring's rows that no other stream
    /// watches for the group, the rows it watches for the group, the table-wide roster row
    /// when it leads, its own roster row when the table-wide one moved, and the rows of
    /// groups declared gone.
    fn group_watch_plan(&mut self, group: &LivenessGroup) -> WatchPlan {
        let stream = &*self.shared.stream;
        let now = Instant::now();
        let interval = roster::watch_interval(self.config().lease_duration);
        let groups = &self.instance.watch.groups;
        let rows: Vec<String> = (self.instance.watch.ring.iter())
            .filter(|id| {
                groups
                    .get(*id)
                    .is_none_or(|key| !group.covered(key, stream, now, interval * 3))
            })
            .cloned()
            .collect();
        let for_group: Vec<String> = (group.watched_by(stream).iter())
            .map(|(owner, _)| worker_row_id(owner))
            .filter(|id| !rows.contains(id))
            .collect();
        let table_roster = group.roster();
        WatchPlan {
            rows,
            for_group,
            roster: table_roster.is_none() || self.instance.watch.table_roster_seen != table_roster,
            table_roster: group.is_lead(stream),
            release: group.gone_in(stream, now, self.config().lease_duration * 3),
            table_roster_known: table_roster,
        }
    }

    pub(super) fn on_watched(&mut self, read: Result<WatchRead, LeaseError>) {
        let lease_duration = self.config().lease_duration;
        let interval = roster::watch_interval(lease_duration);
        self.instance.watch.busy = false;
        self.instance.watch.next = Instant::now() + interval;
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!(error = %e, "reading the watched worker rows failed; retried shortly");
                return;
            }
        };
        if let Some(group) = self.shared.config.group.clone() {
            self.on_group_read(&group, &read);
        }
        let now = self.config().clock.now();
        let rows: BTreeMap<String, Lease> = (read.rows.iter())
            .filter(|(id, _)| read.asked.contains(id))
            .map(|(id, row)| (id.clone(), row.clone()))
            .collect();
        self.instance.liveness.observe_some(&rows, now);
        // This stream's roster row, when it was not read, is judged at a later read.
        let roster_seen = self.instance.watch.roster.filter(|_| read.roster_read);
        let verdict = roster::judge(
            &read.asked,
            &read.rows,
            roster_seen,
            &self.instance.liveness,
            now,
            self.config().expiry(),
        );
        if read.roster_read {
            self.instance.watch.roster = Some(verdict.roster);
        }
        if verdict.list {
            self.list_soon();
        }
        if let Some(left) = verdict.first_expiry {
            // Read again right when the first watched row would expire.
            self.instance.watch.next = self.instance.watch.next.min(Instant::now() + left);
        }
        if let Some(row) = verdict.declare.into_iter().next() {
            self.instance.watch.busy = true;
            let shared = self.shared.clone();
            self.inbox.jobs.push(Box::pin(async move {
                let result = roster::declare(shared, row.clone()).await;
                Done::Declared(row, result)
            }));
        }
    }

    /// The liveness group's part of a watch read: the table-wide roster counter, the rows
    /// watched for the group (fresh: confirmed; released: the group is gone), and the rows
    /// released for groups declared gone.
    fn on_group_read(&mut self, group: &LivenessGroup, read: &WatchRead) {
        let stream = &*self.shared.stream;
        let now = Instant::now();
        if let Some(counter) = read.table_roster {
            group.set_roster(counter);
        }
        if read.roster_read {
            self.instance.watch.table_roster_seen = read.table_roster_known;
        }
        for key in group.watched_by(stream) {
            match read.rows.get(&worker_row_id(&key.0)) {
                Some(row) if row.liveness_group.as_deref() != Some(key.1.as_str()) => {}
                Some(row) if row.owner.is_none() => group.gone(key, stream, now),
                Some(row) if row.owner.as_deref() == Some(key.0.as_str()) => {
                    let expired = (self.instance.liveness).is_expired(
                        row,
                        self.config().clock.now(),
                        self.config().expiry(),
                    );
                    if !expired {
                        group.confirm(key, now);
                    }
                }
                _ => {}
            }
        }
        let mut released = false;
        for (key, done) in &read.released {
            group.released(key, stream);
            released |= done;
        }
        if released {
            tracing::warn!(
                "another instance reading several streams was declared gone: its worker row of \
                 this stream is released and its shards are taken now"
            );
            self.list_soon();
            self.move_roster();
        }
    }

    pub(super) fn on_declared(&mut self, row: &Lease, result: Result<(), LeaseError>) {
        self.instance.watch.busy = false;
        let owner = super::plan::worker_owner(&row.shard_id).unwrap_or_default();
        match result {
            Ok(()) => {
                // An anchor's row declared gone: that instance's readers of every stream have
                // stopped, and its rows of the other streams are released too.
                let anchored_here = (row.liveness_group.as_deref())
                    .and_then(anchor_of)
                    .is_some_and(|anchor| anchor == &*self.shared.stream);
                if let (Some(group), true) = (&self.shared.config.group, anchored_here) {
                    let key = (
                        owner.to_owned(),
                        row.liveness_group.clone().unwrap_or_default(),
                    );
                    group.gone(key, &self.shared.stream, Instant::now());
                }
                tracing::warn!(
                    instance = owner,
                    "another instance's worker row was not renewed for the lease duration: \
                     declared it gone; its shards are taken now"
                );
            }
            Err(e) if e.is_lost() => {
                tracing::debug!(
                    instance = owner,
                    "the watched instance wrote its row meanwhile (or another declared it gone)"
                );
            }
            Err(e) => {
                tracing::debug!(instance = owner, error = %e, "declaring an instance gone failed; retried at the next read");
            }
        }
        self.instance.watch.ring.retain(|id| *id != row.shard_id);
        self.list_soon();
    }
}
