//! The coordinator's side of the watch (see [`roster`]): reading the watched worker rows and
//! the roster row, declaring an instance gone, and moving the roster row when others should
//! list at once.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::roster;
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

    /// Reads the watched worker rows and the roster row.
    pub(super) fn start_watch(&mut self) {
        self.instance.watch.busy = true;
        let shared = self.shared.clone();
        let ring = self.instance.watch.ring.clone();
        self.inbox.jobs.push(Box::pin(async move {
            Done::Watched(roster::read(shared, ring).await)
        }));
    }

    pub(super) fn on_watched(&mut self, read: Result<BTreeMap<String, Lease>, LeaseError>) {
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
        let now = self.config().clock.now();
        let ring: BTreeMap<String, Lease> = read
            .iter()
            .filter(|(id, _)| self.instance.watch.ring.contains(id))
            .map(|(id, row)| (id.clone(), row.clone()))
            .collect();
        self.instance.liveness.observe_some(&ring, now);
        let verdict = roster::judge(
            &self.instance.watch.ring,
            &read,
            self.instance.watch.roster,
            &self.instance.liveness,
            now,
            self.config().expiry(),
        );
        self.instance.watch.roster = Some(verdict.roster);
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
