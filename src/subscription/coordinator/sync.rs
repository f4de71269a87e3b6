//! What the coordinator does with a listing: carry out its plan (takes, hand-offs,
//! deletes), and tell `start` when the first one is done.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::listing::{self, Listing, ListingFailure, NewRowRule};
use super::opening::{self, StartContext, opening};
use super::plan::{self, Holdings, WORKER_PREFIX};
use super::take::{self, TakeOutcome};
use super::{Command, Coordinator, Done, lineage, liveness, roster, worker};
use crate::error::KinesisError;
use crate::lease::Lease;
use crate::position::StartingPoint;

impl Coordinator {
    pub(super) fn start_listing(&mut self) {
        self.listings.running = true;
        let now = Instant::now();
        self.listings.next = now + self.config().list_interval;
        let unless_shards = self
            .listings
            .scans
            .skip_unless_changed(now, self.config().list_interval);
        let config = self.config();
        let rule = NewRowRule {
            position: config
                .initial_position
                .clone()
                .or_else(|| config.start_at.clone()),
            // Until the subscription has opened, the tip is the time it started.
            tip: if self.startup.shards.is_none() {
                self.startup.started.clone()
            } else {
                StartingPoint::since(SystemTime::now())
            },
            replaceable: self.listings.replaceable.clone(),
            known: self.listings.generation.clone(),
            fetch_tips: self.startup.tell.is_some(),
            unless_shards,
            refuse_unlisted: (config.start_at.clone())
                .filter(|p| p.shard().is_some() && self.startup.tell.is_some()),
        };
        let shared = self.shared.clone();
        self.inbox.jobs.push(Box::pin(async move {
            Done::Listing(listing::list(shared, rule).await)
        }));
    }

    /// Lists again, reading the table, as soon as the running listing (if any) is done, but
    /// no sooner than [`listing::MIN_SCAN_GAP`] after the last read of the table.
    pub(super) fn list_soon(&mut self) {
        let at = self
            .listings
            .scans
            .earliest_next(Instant::now(), self.config().list_interval);
        self.scan_at(at);
    }

    /// Lists again at `at` at the latest, reading the table.
    pub(super) fn scan_at(&mut self, at: Instant) {
        self.listings.scans.forced = true;
        self.listings.next = self.listings.next.min(at);
    }

    pub(super) fn on_listing_failed(&mut self, failure: ListingFailure) {
        self.listings.running = false;
        self.listings.scans.forced = true;
        // Try again soon, rather than a whole listing interval later.
        self.listings.next =
            Instant::now() + self.config().list_interval.min(Duration::from_secs(1));
        let error = match failure {
            ListingFailure::Kinesis(e) => {
                self.instance.health.listed(false);
                if self.found_deleted(&e) {
                    return;
                }
                tracing::warn!(error = %e, "listing shards failed; retried shortly");
                if !e.is_retryable()
                    && let Some(tell) = self.startup.tell.take()
                {
                    // A first listing that retrying cannot fix (no such stream, no
                    // permission) fails `start` itself.
                    let _ = tell.send(Some(e));
                    return;
                }
                e
            }
            ListingFailure::Table(e) => {
                tracing::warn!(error = %e, "lease table unavailable during the listing; retried shortly");
                e.into()
            }
            ListingFailure::Refused(e) => {
                // Only asked for while `start` runs: it fails `start`.
                if let Some(tell) = self.startup.tell.take() {
                    let _ = tell.send(Some(e));
                    return;
                }
                e
            }
        };
        // `start` returns; the shards it opens with open at its start time when they can.
        self.tell_started();
        let _ = self.outbox.commands.send(Command::Error(error));
    }

    /// Counts the listings in a row that found the stream deleted after the start; with
    /// [`end_when_deleted`](crate::subscription::SubscriptionConfig::end_when_deleted), the
    /// second one ends the subscription (one answer could come from a moment of the
    /// service's own inconsistency).
    fn found_deleted(&mut self, e: &KinesisError) -> bool {
        let started = self.startup.tell.is_none();
        if !(started && matches!(e, KinesisError::StreamNotFound { .. })) {
            self.listings.not_found = 0;
            return false;
        }
        self.listings.not_found += 1;
        if !self.config().end_when_deleted || self.listings.not_found < 2 {
            return false;
        }
        tracing::warn!("the stream was deleted: its readers stop and its lease rows are removed");
        self.outbox
            .deleted
            .store(true, std::sync::atomic::Ordering::Release);
        true
    }

    pub(super) fn on_listing(&mut self, mut listing: Listing) {
        self.listings.running = false;
        self.listings.not_found = 0;
        self.instance.health.listed(true);
        if !listing.scanned {
            // The shards are as they were: the table is read at the next safety scan, or
            // when the roster row moves.
            return;
        }
        self.listings.generation = Arc::new(listing::generation_after(
            &self.listings.generation,
            &listing.shards,
            &listing.rows,
        ));
        if self.startup.tell.is_some() {
            self.startup.tips.extend(std::mem::take(&mut listing.tips));
        }
        let now = self.config().clock.now();
        self.instance.liveness.observe(&listing.rows, now);
        self.note_unlisted(&listing, now);
        let (shares, stale) = self.plan_listing(&listing, now);
        self.delete(stale);
        self.act_on_shares(&listing, shares, now);
    }

    /// Decides over a listing that read the table: this instance's share, and the rows
    /// nobody needs. Remembers what the next listings and the roster watch use.
    fn plan_listing(&mut self, listing: &Listing, now: Instant) -> (plan::Shares, Vec<Lease>) {
        let lease_duration = self.config().lease_duration;
        let expiry = self.config().expiry();
        let holdings = self.holdings();
        let liveness = &self.instance.liveness;
        // An instance declared gone through its liveness group's anchor row counts as gone
        // here at once: its rows as expired.
        let declared = &listing.declared;
        let expired = |row: &Lease| {
            liveness.is_expired(row, now, expiry)
                || row.owner.as_ref().is_some_and(|o| declared.contains(o))
        };
        let view = plan::View {
            rows: &listing.rows,
            shards: &listing.shards,
            owner: &self.shared.config.owner,
            holdings: &holdings,
            expired: &expired,
            limits: self.shared.config.limits,
        };
        let unlisted_for = lease_duration + self.shared.config.list_interval;
        // A row is deleted only once nobody wrote it for the lease duration: a worker row
        // stale for the worker timeout is declared gone by the watch (which frees its leases
        // at once); deleted first, its leases would wait for their own expiry.
        let unwritten = |row: &Lease| liveness.is_expired(row, now, lease_duration);
        let stale_view = plan::View {
            expired: &unwritten,
            ..view
        };
        let stale = plan::stale_rows(&stale_view, &self.listings.unlisted, now, unlisted_for);
        let replaceable = (listing.rows.values())
            .filter(|row| row.owner.is_none() || expired(row))
            .filter(|row| !holdings.has(&row.shard_id))
            .map(|row| row.shard_id.clone())
            .collect();
        let eligible = lineage::eligible(&listing.shards, &listing.rows);
        let probed = self.shared.probe.count();
        let can_work =
            self.instance.health.can_work(probed, Instant::now()) && self.worker_row_current();
        let shares = plan::shares(&view, &eligible, can_work);
        let shard_set = listing::shard_set(&listing.shards);
        (self.listings.scans).scanned(Instant::now(), shard_set, shares.live_workers);
        self.instance.watch.ring = self.watch_ring(&listing.rows, &expired);
        self.instance.watch.ring_rows = (self.instance.watch.ring.iter())
            .filter_map(|id| Some((id.clone(), listing.rows.get(id)?.clone())))
            .collect();
        self.listings.replaceable = replaceable;
        tracing::debug!(
            shards = listing.shards.len(),
            eligible = eligible.len(),
            live_workers = shares.live_workers,
            target = shares.target,
            held = self.shards.held.len(),
            can_work,
            "shards listed"
        );
        (shares, stale)
    }

    /// The worker rows this stream watches (see [`roster::ring`]). In a liveness group the
    /// anchor stream's listing tells the group which instances its watch covers, and another
    /// stream leaves those out (see [`crate::subscription::group`]).
    fn watch_ring(
        &self,
        rows: &BTreeMap<String, Lease>,
        expired: &dyn Fn(&Lease) -> bool,
    ) -> Vec<String> {
        let owner = &self.shared.config.owner;
        match &self.shared.config.group {
            None => roster::ring(rows, owner, expired),
            Some(group) if group.is_anchor(&self.shared.stream) => {
                group.anchor_listed(rows, expired);
                roster::ring(rows, owner, expired)
            }
            Some(group) => roster::ring(rows, owner, &|row| expired(row) || group.covers(row)),
        }
    }

    /// Carries out this instance's share: takes, hand-offs, and the first listing's answer.
    fn act_on_shares(&mut self, listing: &Listing, shares: plan::Shares, now: Instant) {
        if shares.beyond_bounds > 0 {
            tracing::warn!(
                unread = shares.beyond_bounds,
                live_workers = shares.live_workers,
                "more shards than the instances may hold together (their max_leases): some stay unread until an instance with room joins"
            );
        }
        let short = shares
            .target
            .saturating_sub(self.shards.held.len() + self.shards.taking.len() + shares.take.len());
        self.say_waits(&listing.rows, short, now);
        let first = self.startup.shards.is_none();
        if first {
            let opened = shares.take.iter().map(|l| l.shard_id.clone()).collect();
            self.say_not_applied(listing, &opened);
            self.startup.shards = Some(opened);
        }
        for lease in shares.take {
            let range = (listing.shards.iter())
                .find(|s| s.shard_id == lease.shard_id)
                .map(|s| (s.starting_hash_key.clone(), s.ending_hash_key.clone()));
            self.start_take(lease, first, range);
        }
        self.balance(shares.hand_off, shares.target, shares.live_workers);
        if self.startup.pending.is_empty() {
            self.tell_started();
        }
    }

    /// Says, at the first listing, each position naming one shard that does not apply at
    /// this start (see [`opening::not_applied`]), as a warning naming the setting and the
    /// shard; and the finished shards a `start_at` of every shard does not read again (see
    /// [`opening::finished_not_replayed`]).
    fn say_not_applied(&self, listing: &Listing, opened: &HashSet<String>) {
        let config = self.config();
        if let Some(start_at) = &config.start_at {
            let finished = opening::finished_not_replayed(start_at, &listing.shards, &listing.rows);
            if !finished.is_empty() {
                tracing::warn!(
                    setting = "start_at",
                    finished = finished.len(),
                    shards = %opening::some_of(&finished, 8),
                    "start_at does not read finished shards again: their records are not replayed (the command-line tool's `reset` replays them)"
                );
            }
        }
        let settings = [
            ("start_at", config.start_at.as_ref()),
            ("initial_position", config.initial_position.as_ref()),
        ];
        for (setting, position) in settings {
            let Some(position) = position else { continue };
            if let Some((shard, why)) =
                opening::not_applied(setting, position, &listing.shards, &listing.rows, opened)
            {
                tracing::warn!(
                    setting,
                    shard,
                    why,
                    "a position naming one shard does not apply at this start"
                );
            }
        }
    }

    /// Says once at info, per instance, what this one waits for: leases another instance holds
    /// that have not expired, while this instance is `short` of its share, or while that
    /// instance has no worker row (it crashed before writing one, or withdrew it: its shards
    /// are not shared until its leases expire). Says how long it may wait for them (should
    /// that instance be gone, say after a crash, they are taken once they expire).
    fn say_waits(&mut self, rows: &BTreeMap<String, Lease>, short: usize, now: Instant) {
        let lease_duration = self.config().lease_duration;
        let me = self.config().owner.clone();
        let waits = liveness::waiting_on(rows, &me, &self.instance.liveness, now, lease_duration);
        let no_worker_row = |owner: &str| {
            rows.get(&worker::worker_row_id(owner))
                .is_none_or(|row| row.owner.is_none())
        };
        let waited: Vec<(String, usize, Duration)> = waits
            .into_iter()
            .filter(|(owner, _)| short > 0 || no_worker_row(owner))
            .map(|(owner, (shards, left))| (owner, shards, left))
            .collect();
        self.instance
            .waiting_on
            .retain(|owner| waited.iter().any(|(o, _, _)| o == owner));
        for (owner, shards, left) in waited {
            if self.instance.waiting_on.insert(owner.clone()) {
                tracing::info!(
                    instance = %owner,
                    shards,
                    "waiting up to {} s for instance {owner}'s leases (taken when they expire, \
                     should it be gone; handed over sooner if it is alive)",
                    left.as_secs_f64().ceil()
                );
            }
        }
    }

    /// Hands off shards to balance, at most [`plan::hand_off_budget`] per listing interval; the
    /// rest at a listing once the budget allows.
    fn balance(&mut self, hand_off: Vec<String>, target: usize, live_workers: usize) {
        let excess = self.shards.held.len().saturating_sub(target);
        let now = Instant::now();
        let window = self.config().list_interval;
        let handed = &mut self.shards.handed_off;
        while handed
            .front()
            .is_some_and(|at| now.duration_since(*at) >= window)
        {
            handed.pop_front();
        }
        let budget = plan::hand_off_budget(target, excess).saturating_sub(handed.len());
        if hand_off.len() > budget
            && let Some(oldest) = handed.front().copied().or(Some(now))
        {
            self.scan_at(oldest + window);
        }
        for shard in hand_off.into_iter().take(budget) {
            tracing::info!(shard = %shard, target, live_workers, "handing the shard off to balance");
            self.shards.handed_off.push_back(now);
            self.hand_off(&shard);
        }
    }

    /// Tracks since when each row's shard is missing from the listing.
    pub(super) fn note_unlisted(&mut self, listing: &Listing, now: Instant) {
        let listed: HashSet<&str> = listing.shards.iter().map(|s| s.shard_id.as_str()).collect();
        let unlisted = |id: &str| !id.starts_with(WORKER_PREFIX) && !listed.contains(id);
        self.listings
            .unlisted
            .retain(|id, _| listing.rows.contains_key(id) && unlisted(id));
        for id in listing.rows.keys().filter(|id| unlisted(id)) {
            self.listings.unlisted.entry(id.clone()).or_insert(now);
        }
    }

    pub(super) fn holdings(&mut self) -> Holdings {
        self.shards
            .releasing
            .retain(|(_, task)| !task.is_finished());
        Holdings {
            held: self.shards.held.keys().cloned().collect(),
            taking: self.shards.taking.clone(),
            releasing: self
                .shards
                .releasing
                .iter()
                .map(|(s, _)| s.clone())
                .collect(),
        }
    }

    /// Tells `start` to return (once).
    pub(super) fn tell_started(&mut self) {
        self.startup.tips.clear();
        if let Some(tell) = self.startup.tell.take() {
            let _ = tell.send(None);
        }
    }

    pub(super) fn start_take(
        &mut self,
        lease: Lease,
        first: bool,
        hash_range: Option<(String, String)>,
    ) {
        let shard = lease.shard_id.clone();
        let at_startup = self
            .startup
            .shards
            .as_ref()
            .is_some_and(|s| s.contains(&shard));
        let context = StartContext {
            start_at: self.config().start_at.as_ref(),
            started: &self.startup.started,
            starting: self.startup.tell.is_some(),
            fetched_tip: self.startup.tips.contains_key(&shard),
        };
        let Some(mut opening) = opening(&shard, lease.checkpoint.as_ref(), at_startup, &context)
        else {
            return;
        };
        opening.hash_range = hash_range;
        if opening.start == StartingPoint::Latest {
            opening.tip = self.startup.tips.remove(&shard);
        }
        self.shards.taking.insert(shard.clone());
        if first {
            self.startup.pending.insert(shard.clone());
        }
        let shared = self.shared.clone();
        let epoch = self.shards.epoch;
        self.inbox.jobs.push(Box::pin(async move {
            let outcome = take::take(shared, lease, opening).await;
            Done::Take(shard, outcome, epoch)
        }));
    }

    pub(super) fn on_take(&mut self, shard: String, outcome: TakeOutcome, epoch: u64) {
        self.shards.taking.remove(&shard);
        match outcome {
            TakeOutcome::Taken(_) if epoch != self.shards.epoch => {
                // Begun before this instance's shards were dropped (its worker row was taken
                // away): another may have taken the lease since, at once. Not read; the lease
                // is the others' to take when it expires, or this instance's again at a listing.
                tracing::warn!(shard = %shard, "a take begun before this instance's shards were dropped is not read; the shard may be another's now");
                self.no_longer_starting(&shard);
                self.list_soon();
            }
            TakeOutcome::Taken(taken) => {
                self.shared.leases.taken(taken.sent.elapsed());
                self.no_longer_starting(&shard);
                self.install(shard.clone(), *taken);
            }
            TakeOutcome::Lost => {
                tracing::debug!(shard = %shard, "another instance took the lease first");
                self.no_longer_starting(&shard);
            }
            TakeOutcome::Failed(e) => {
                // Still one of the shards this subscription opens with, at the next listing,
                // which reads the table soon.
                tracing::warn!(shard = %shard, error = %e, "taking the lease failed; tried again at the next listing");
                self.list_soon();
            }
            TakeOutcome::Unopenable(e) => {
                let _ = self.outbox.commands.send(Command::Error(e));
            }
        }
        if self.startup.pending.remove(&shard) && self.startup.pending.is_empty() {
            self.tell_started();
        }
    }

    /// `shard` is no longer one this subscription opens with.
    pub(super) fn no_longer_starting(&mut self, shard: &str) {
        if let Some(startup) = &mut self.startup.shards {
            startup.remove(shard);
        }
    }
}
