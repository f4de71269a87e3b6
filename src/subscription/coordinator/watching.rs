//! The coordinator's side of the watch (see [`roster`]): reading the watched worker rows and
//! the roster row, declaring an instance gone, and moving the roster row when others should
//! list at once.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::roster::{self, WatchPlan, WatchRead};
use super::{Coordinator, Done};
use crate::lease::{Lease, LeaseError};

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

    /// Reads the watched worker rows and the roster row; in a liveness group, what the
    /// group needs of this stream (see [`crate::subscription::group`]).
    pub(super) fn start_watch(&mut self) {
        let plan = self.watch_plan();
        if plan.is_empty() {
            let interval = roster::watch_interval(self.config().expiry());
            self.instance.watch.next = Instant::now() + interval;
            return;
        }
        self.instance.watch.busy = true;
        let shared = self.shared.clone();
        self.inbox.jobs.push(Box::pin(async move {
            Done::Watched(roster::read(shared, plan).await)
        }));
    }

    /// The ring and the roster row. In a liveness group of several streams the anchor reads
    /// the table-wide roster row (which every roster move moves) in place of its own; every
    /// stream reads its own roster row when the table-wide row moved, and another stream also
    /// while its ring is not empty (instances the anchor's watch does not cover); a stream
    /// other than the anchor lists (and moves its roster row) once this instance declared
    /// another gone.
    fn watch_plan(&mut self) -> WatchPlan {
        let ring = self.instance.watch.ring.clone();
        let plain = |ring| WatchPlan {
            ring,
            roster: true,
            ..WatchPlan::default()
        };
        let Some(group) = self.shared.config.group.clone() else {
            return plain(ring);
        };
        let anchor = group.is_anchor(&self.shared.stream);
        if !anchor {
            let (declarations, observed) = (group.declarations(), group.observed());
            if declarations != self.instance.watch.declarations_seen {
                // This instance declared another gone (or the group dissolved): the others
                // hear of it through this stream's roster row too.
                self.list_soon();
                self.move_roster();
            } else if observed != self.instance.watch.observed_seen {
                self.list_soon();
            }
            self.instance.watch.declarations_seen = declarations;
            self.instance.watch.observed_seen = observed;
        }
        if group.is_dissolved() || (anchor && !group.has_others()) {
            return plain(ring);
        }
        let news = group.news();
        let mut ring = ring;
        if !anchor {
            // Rows the anchor's watch came to cover since the listing are left to it.
            let rows = &self.instance.watch.ring_rows;
            ring.retain(|id| rows.get(id).is_none_or(|row| !group.covers(row)));
        }
        WatchPlan {
            roster: (!anchor && !ring.is_empty()) || self.instance.watch.news_seen != Some(news),
            ring,
            table_roster: anchor,
            news: Some(news),
        }
    }

    pub(super) fn on_watched(&mut self, read: Result<WatchRead, LeaseError>) {
        let interval = roster::watch_interval(self.config().expiry());
        self.instance.watch.busy = false;
        self.instance.watch.next = Instant::now() + interval;
        let read = match read {
            Ok(read) => read,
            Err(e) => {
                tracing::debug!(error = %e, "reading the watched worker rows failed; retried shortly");
                return;
            }
        };
        if let (Some(group), Some(counter)) = (&self.shared.config.group, read.table_roster) {
            group.table_roster_read(counter);
            if read.plan.news != Some(group.news()) {
                // It moved: this stream's own roster row is read at once.
                self.instance.watch.next = Instant::now();
            }
        }
        if read.plan.roster && read.plan.news.is_some() {
            self.instance.watch.news_seen = read.plan.news;
        }
        let now = self.config().clock.now();
        let ring: BTreeMap<String, Lease> = (read.rows.iter())
            .filter(|(id, _)| read.plan.ring.contains(id))
            .map(|(id, row)| (id.clone(), row.clone()))
            .collect();
        self.instance.liveness.observe_some(&ring, now);
        // A roster row not read this time is judged at a later read.
        let roster_seen = self.instance.watch.roster.filter(|_| read.plan.roster);
        let verdict = roster::judge(
            &read.plan.ring,
            &read.rows,
            roster_seen,
            &self.instance.liveness,
            now,
            self.config().expiry(),
        );
        if read.plan.roster {
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

    pub(super) fn on_declared(&mut self, row: &Lease, result: Result<(), LeaseError>) {
        self.instance.watch.busy = false;
        let owner = super::plan::worker_owner(&row.shard_id).unwrap_or_default();
        match result {
            Ok(()) => {
                if let Some(group) = &self.shared.config.group {
                    // Every stream lists, so that instance's shards of each are taken now.
                    group.declared_one();
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
