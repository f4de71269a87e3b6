//! The background task of a subscription: lists shards, takes and renews leases, writes
//! checkpoints, gates children on their parents, balances shards between instances, and
//! hands shards over gracefully.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior, interval, sleep, sleep_until};

use super::config::SubscriptionConfig;
use super::gate::LeaseGate;
use super::pump::{PumpEnd, PumpEvent, ShardPump};
use crate::ack::ShardAcks;
use crate::api::{ShardDescription, SharedKinesis, list_all_shards};
use crate::error::KinesisError;
use crate::lease::{Lease, LeaseError, SharedLeaseStore};
use crate::position::{Checkpoint, ShardOrigin, StartingPoint, starting_point};
use crate::shard::ShardReader;

/// The prefix of the lease rows that record live instances (one per owner).
pub(crate) const WORKER_PREFIX: &str = "worker:";

/// How many stale rows one listing deletes at most.
const MAX_DELETES_PER_LISTING: usize = 16;

/// What the coordinator tells the subscription's stream.
pub(crate) enum Command {
    /// Start yielding this shard's deliveries.
    Add(String, Box<ShardPump>),
    /// Stop yielding this shard's deliveries.
    Remove(String),
    /// Report an error on the stream.
    Error(KinesisError),
    /// Stop reading: the stream ends.
    Close,
}

/// A request to the running coordinator.
pub(crate) enum Control {
    /// Move the subscription; answered once the new readers are in place.
    Seek(
        crate::position::KinesisPosition,
        tokio::sync::oneshot::Sender<Result<(), KinesisError>>,
    ),
}

mod seek;

/// The channels between a coordinator and its subscription.
pub(crate) struct Links {
    /// To the subscription's stream.
    pub(crate) commands: UnboundedSender<Command>,
    /// Set to stop gracefully.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Set once stopped.
    pub(crate) done: watch::Sender<bool>,
    /// Told once the first listing took its shards (or failed in a way retrying cannot fix).
    pub(crate) first_sync: tokio::sync::oneshot::Sender<Option<KinesisError>>,
    /// Requests from seekers.
    pub(crate) control: UnboundedReceiver<Control>,
}

struct Held {
    lease: Lease,
    acks: Arc<ShardAcks>,
    gate: Arc<LeaseGate>,
    written: Option<Checkpoint>,
    finish_watch: JoinHandle<()>,
}

struct Seen {
    counter: u64,
    owner: Option<String>,
    since: Instant,
}

pub(crate) struct Coordinator {
    pub(crate) api: SharedKinesis,
    pub(crate) store: SharedLeaseStore,
    pub(crate) stream: Arc<str>,
    pub(crate) config: SubscriptionConfig,
    pub(crate) commands: UnboundedSender<Command>,
    pub(crate) shutdown: watch::Receiver<bool>,
    pub(crate) done: watch::Sender<bool>,
    held: BTreeMap<String, Held>,
    seen: HashMap<String, Seen>,
    /// Rows of shards the listing lacks, with when each was first found missing.
    unlisted: HashMap<String, Instant>,
    /// A delete was refused in a way retrying cannot fix (already said at warn level).
    delete_refused: bool,
    worker: Option<Lease>,
    worker_renewed: Instant,
    /// The shards this subscription opens with (those it set out to take at its first
    /// complete listing) and has not opened yet: `start_at` applies to them only. `None` until
    /// that listing.
    startup: Option<HashSet<String>>,
    events_tx: UnboundedSender<PumpEvent>,
    events: UnboundedReceiver<PumpEvent>,
    finished_tx: UnboundedSender<String>,
    finished: UnboundedReceiver<String>,
    /// Told once the first listing has taken its shards and fixed their positions.
    first_sync: Option<tokio::sync::oneshot::Sender<Option<KinesisError>>>,
    /// Shards being handed off (waiting for in-flight deliveries before the release).
    handoffs: Vec<(String, JoinHandle<()>)>,
    control: UnboundedReceiver<Control>,
}

impl Coordinator {
    pub(crate) fn new(
        api: SharedKinesis,
        store: SharedLeaseStore,
        stream: Arc<str>,
        config: SubscriptionConfig,
        links: Links,
    ) -> Self {
        let Links {
            commands,
            shutdown,
            done,
            first_sync,
            control,
        } = links;
        let (events_tx, events) = tokio::sync::mpsc::unbounded_channel();
        let (finished_tx, finished) = tokio::sync::mpsc::unbounded_channel();
        Self {
            api,
            store,
            stream,
            config,
            commands,
            shutdown,
            done,
            held: BTreeMap::new(),
            seen: HashMap::new(),
            unlisted: HashMap::new(),
            delete_refused: false,
            worker: None,
            worker_renewed: Instant::now(),
            startup: None,
            events_tx,
            events,
            finished_tx,
            finished,
            first_sync: Some(first_sync),
            handoffs: Vec::new(),
            control,
        }
    }

    fn owner(&self) -> &str {
        &self.config.owner
    }

    pub(crate) async fn run(mut self) {
        let mut list = interval(self.config.list_interval);
        let mut renew = interval(self.config.renew_interval());
        let mut checkpoint = interval(self.config.checkpoint_interval);
        for timer in [&mut list, &mut renew, &mut checkpoint] {
            timer.set_missed_tick_behavior(MissedTickBehavior::Delay);
        }
        loop {
            let expiry = self.next_expiry();
            tokio::select! {
                biased;
                changed = self.shutdown.changed() => {
                    if changed.is_err() || *self.shutdown.borrow() {
                        break;
                    }
                }
                _ = renew.tick() => self.renew_all().await,
                _ = sleep_until(expiry.unwrap_or_else(Instant::now)), if expiry.is_some() => self.expire(),
                Some(event) = self.events.recv() => self.on_pump_end(event).await,
                Some(control) = self.control.recv() => self.on_control(control).await,
                Some(shard) = self.finished.recv() => self.on_finished(shard).await,
                _ = checkpoint.tick() => self.checkpoint_all().await,
                _ = list.tick() => self.sync().await,
            }
        }
        self.stop().await;
        let _ = self.done.send(true);
    }

    /// Lists shards and leases, creates missing leases, and takes or hands off shards.
    async fn sync(&mut self) {
        let shards = match self.list_shards().await {
            Ok(shards) => shards,
            Err(e) => {
                tracing::warn!(error = %e, "listing shards failed; retried at the next listing");
                match self.first_sync.take() {
                    // A first listing that retrying cannot fix (no such stream, no permission)
                    // fails `start` itself.
                    Some(tell) if !e.is_retryable() => {
                        let _ = tell.send(Some(e));
                    }
                    Some(tell) => {
                        let _ = tell.send(None);
                        let _ = self.commands.send(Command::Error(e));
                    }
                    None => {
                        let _ = self.commands.send(Command::Error(e));
                    }
                }
                return;
            }
        };
        if let Err(e) = self.sync_with(&shards).await {
            tracing::warn!(error = %e, "lease table unavailable during the listing");
            let _ = self.commands.send(Command::Error(e.into()));
        }
        if let Some(tell) = self.first_sync.take() {
            let _ = tell.send(None);
        }
    }

    async fn list_shards(&self) -> Result<Vec<ShardDescription>, KinesisError> {
        let listing = list_all_shards(self.api.as_ref(), &self.stream);
        match tokio::time::timeout(self.config.call_timeout(), listing).await {
            Ok(result) => result,
            Err(_) => Err(KinesisError::Service {
                operation: crate::error::Operation::ListShards,
                stream: self.stream.to_string(),
                message: format!("no answer within {:?}", self.config.call_timeout()),
            }),
        }
    }

    async fn sync_with(&mut self, shards: &[ShardDescription]) -> Result<(), LeaseError> {
        self.ensure_worker().await?;
        let mut leases: BTreeMap<String, Lease> = self
            .store
            .list(&self.stream)
            .await?
            .into_iter()
            .map(|l| (l.shard_id.clone(), l))
            .collect();
        // Shards whose children were started (a child's row records where its reader began,
        // or how far it got): finished, whatever their own rows say.
        let read_past: HashSet<String> = shards
            .iter()
            .filter(|s| {
                leases.get(&s.shard_id).is_some_and(|l| {
                    matches!(
                        l.checkpoint,
                        Some(Checkpoint::Start(_) | Checkpoint::Sequence(_) | Checkpoint::ShardEnd)
                    )
                })
            })
            .flat_map(|s| s.parents().map(str::to_owned))
            .collect();
        let mut raced = false;
        for shard in shards {
            if !leases.contains_key(&shard.shard_id) {
                let mut lease = Lease::new(
                    self.stream.to_string(),
                    shard.shard_id.clone(),
                    shard.parents().map(str::to_owned).collect(),
                );
                // Where a reader that takes the shard later opens (children: the child rule).
                // A shard whose row went while it is still listed (a listing that lagged
                // behind another instance's cleanup) is not read again once a child has read
                // past it.
                if read_past.contains(&shard.shard_id) {
                    tracing::info!(shard = %shard.shard_id, "a listed shard with no row whose children read past it: recorded as finished");
                    lease.checkpoint = Some(Checkpoint::ShardEnd);
                } else if lease.parents.is_empty() {
                    let point = self
                        .config
                        .start_at
                        .as_ref()
                        .and_then(|p| p.for_shard(&lease.shard_id))
                        .filter(|p| *p != StartingPoint::Latest)
                        .unwrap_or_else(|| StartingPoint::since(std::time::SystemTime::now()));
                    lease.checkpoint = Some(Checkpoint::Initial(point));
                }
                if self.store.create(&lease).await? {
                    leases.insert(shard.shard_id.clone(), lease);
                } else {
                    // Another instance created it first: its row is the one to go by.
                    raced = true;
                }
            }
        }
        if raced {
            for lease in self.store.list(&self.stream).await? {
                leases.entry(lease.shard_id.clone()).or_insert(lease);
            }
        }
        let now = self.config.clock.now();
        for lease in leases.values() {
            let seen = self.seen.entry(lease.shard_id.clone()).or_insert(Seen {
                counter: lease.counter,
                owner: lease.owner.clone(),
                since: now,
            });
            if seen.counter != lease.counter || seen.owner != lease.owner {
                *seen = Seen {
                    counter: lease.counter,
                    owner: lease.owner.clone(),
                    since: now,
                };
            }
        }

        self.seen.retain(|id, _| leases.contains_key(id));
        let listed: HashSet<&str> = shards.iter().map(|s| s.shard_id.as_str()).collect();
        self.delete_stale_rows(&listed, &mut leases).await;
        let live_workers = leases
            .values()
            .filter(|l| l.shard_id.starts_with(WORKER_PREFIX))
            .filter(|l| l.owner.as_deref() == Some(self.owner()) || self.is_live(l))
            .count()
            .max(1);
        let finished = |id: &str| -> bool {
            // A shard no longer listed has left the retention period: nothing to read.
            !listed.contains(id) || leases.get(id).is_some_and(Lease::is_finished)
        };
        let gates = |parent: &str| -> bool {
            if finished(parent) {
                return false;
            }
            let Some(lease) = leases.get(parent) else {
                return false;
            };
            // A parent nobody read, while this subscription opens at the tip, does not hold its
            // children back.
            lease.checkpoint.is_some() || lease.owner.is_some() || !self.config.opens_at_tip()
        };
        let eligible: Vec<&Lease> = shards
            .iter()
            .filter(|s| !finished(&s.shard_id))
            .filter(|s| s.parents().all(|p| !gates(p)))
            .filter_map(|s| leases.get(&s.shard_id))
            .collect();
        let target = eligible.len().div_ceil(live_workers);
        tracing::debug!(
            shards = shards.len(),
            eligible = eligible.len(),
            live_workers,
            target,
            held = self.held.len(),
            startup = self.startup.as_ref().map_or(0, HashSet::len),
            "shards listed"
        );

        let mut to_take = Vec::new();
        for lease in &eligible {
            if self.held.len() + to_take.len() >= target {
                break;
            }
            if self.held.contains_key(&lease.shard_id) || self.handing_off(&lease.shard_id) {
                continue;
            }
            let free = match lease.owner.as_deref() {
                None => true,
                Some(owner) if owner == self.owner() => true,
                Some(_) => self.is_expired(lease),
            };
            if free {
                let parents_read = lease.parents.iter().any(|p| {
                    leases
                        .get(p)
                        .is_some_and(|pl| pl.checkpoint.is_some() || pl.owner.is_some())
                });
                to_take.push(((*lease).clone(), parents_read));
            }
        }
        if self.startup.is_none() {
            self.startup = Some(to_take.iter().map(|(l, _)| l.shard_id.clone()).collect());
        }
        for (lease, parents_read) in to_take {
            self.take(lease, parents_read).await;
        }

        // Hand shards off when this instance holds more than its share.
        let excess = self.held.len().saturating_sub(target);
        if excess > 0 && live_workers > 1 {
            let give: Vec<String> = self.held.keys().rev().take(excess).cloned().collect();
            for shard in give {
                tracing::info!(shard = %shard, target, live_workers, "handing the shard off to balance");
                self.hand_off(&shard);
            }
        }
        Ok(())
    }

    /// Deletes the rows nobody needs any more, once nobody wrote them for the lease duration:
    /// the worker row of another instance (it stopped without deleting it, or crashed), and
    /// the row of a shard the stream has not listed for a lease duration and a listing (it
    /// left the retention period, so there is nothing to read and no child waits for it). A
    /// row written meanwhile is kept: the delete is conditional on the owner and counter seen.
    /// At most [`MAX_DELETES_PER_LISTING`] go per listing, side by side, so a long backlog of
    /// stale rows cannot hold up renewals.
    async fn delete_stale_rows(
        &mut self,
        listed: &HashSet<&str>,
        leases: &mut BTreeMap<String, Lease>,
    ) {
        let now = self.config.clock.now();
        let is_unlisted = |id: &str| !id.starts_with(WORKER_PREFIX) && !listed.contains(id);
        self.unlisted
            .retain(|id, _| leases.contains_key(id) && is_unlisted(id));
        for id in leases.keys().filter(|id| is_unlisted(id)) {
            self.unlisted.entry(id.clone()).or_insert(now);
        }
        let unlisted_long_enough = self.config.lease_duration + self.config.list_interval;
        let own_worker = format!("{WORKER_PREFIX}{}", self.owner());
        let stale: Vec<Lease> = leases
            .values()
            .filter(|l| {
                let unneeded = if l.shard_id.starts_with(WORKER_PREFIX) {
                    l.shard_id != own_worker
                } else {
                    !self.held.contains_key(&l.shard_id)
                        && self.unlisted.get(&l.shard_id).is_some_and(|since| {
                            now.saturating_duration_since(*since) >= unlisted_long_enough
                        })
                };
                unneeded && self.is_expired(l)
            })
            .take(MAX_DELETES_PER_LISTING)
            .cloned()
            .collect();
        let results =
            futures::future::join_all(stale.iter().map(|lease| self.store.delete(lease))).await;
        for (lease, result) in stale.iter().zip(results) {
            match result {
                Ok(()) => {
                    tracing::info!(
                        row = %lease.shard_id,
                        owner = lease.owner.as_deref().unwrap_or("-"),
                        "deleted a lease table row nobody needs (a stopped instance, or a shard \
                         past the retention period)"
                    );
                    leases.remove(&lease.shard_id);
                    self.seen.remove(&lease.shard_id);
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

    /// Deletes this instance's worker row at a graceful stop. The row as last renewed may be
    /// stale (a renewal that timed out here but was written), so a lost condition is tried
    /// once more against the row as it is now, if it is still this instance's.
    async fn delete_own_worker(&mut self) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        let mut result = self.store.delete(&worker).await;
        if result.as_ref().is_err_and(LeaseError::is_lost) {
            let current = self.store.list(&self.stream).await.map(|rows| {
                rows.into_iter().find(|l| {
                    l.shard_id == worker.shard_id && l.owner.as_deref() == Some(self.owner())
                })
            });
            result = match current {
                Ok(Some(row)) => self.store.delete(&row).await,
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            };
        }
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not delete this instance's worker row; the other instances delete it once it is not renewed for the lease duration");
        }
    }

    /// True while a hand-off of `shard` is still settling; the shard is not taken back
    /// meanwhile.
    fn handing_off(&self, shard: &str) -> bool {
        self.handoffs
            .iter()
            .any(|(s, task)| s == shard && !task.is_finished())
    }

    fn is_live(&self, lease: &Lease) -> bool {
        lease.owner.is_some() && !self.is_expired(lease)
    }

    fn is_expired(&self, lease: &Lease) -> bool {
        self.seen.get(&lease.shard_id).is_some_and(|s| {
            self.config.clock.now().saturating_duration_since(s.since) >= self.config.lease_duration
        })
    }

    /// Keeps this instance's worker row held, so the others count it when balancing.
    async fn ensure_worker(&mut self) -> Result<(), LeaseError> {
        if self.worker.is_some() {
            return Ok(());
        }
        let row = Lease::new(
            self.stream.to_string(),
            format!("{WORKER_PREFIX}{}", self.owner()),
            Vec::new(),
        );
        self.store.create(&row).await?;
        let current = self
            .store
            .list(&self.stream)
            .await?
            .into_iter()
            .find(|l| l.shard_id == row.shard_id)
            .unwrap_or(row);
        let sent = Instant::now();
        self.worker = Some(self.store.take(&current, &self.config.owner).await?);
        self.worker_renewed = sent;
        Ok(())
    }

    /// `shard` is no longer one this subscription opens with.
    fn opened(&mut self, shard: &str) {
        if let Some(startup) = &mut self.startup {
            startup.remove(shard);
        }
    }

    async fn take(&mut self, lease: Lease, parents_read: bool) {
        let shard = lease.shard_id.clone();
        let opening = self.startup.as_ref().is_some_and(|s| s.contains(&shard));
        // The lease is timed from when the write that took it was sent (see `LeaseGate`).
        let mut renewed_at = Instant::now();
        let taken = match self.store.take(&lease, &self.config.owner).await {
            Ok(taken) => taken,
            Err(e) if e.is_lost() => {
                tracing::debug!(shard = %shard, "another instance took the lease first");
                self.opened(&shard);
                return;
            }
            Err(e) => {
                // Still one of the shards this subscription opens with, at the next listing.
                tracing::warn!(shard = %shard, error = %e, "taking the lease failed");
                return;
            }
        };
        self.opened(&shard);
        let origin = if taken.checkpoint.is_none() && parents_read {
            ShardOrigin::Child
        } else if opening {
            ShardOrigin::Startup
        } else if !taken.parents.is_empty() && taken.checkpoint.is_none() {
            ShardOrigin::Child
        } else {
            ShardOrigin::Takeover
        };
        let Some(start) = starting_point(
            &shard,
            origin,
            self.config.start_at.as_ref(),
            taken.checkpoint.as_ref(),
        ) else {
            // Finished already: give the lease back.
            let _ = self.store.release(&taken).await;
            return;
        };
        // A start position given at startup wins over the stored checkpoint: the shard is
        // replayed from there, as if it had none.
        let overridden = origin == ShardOrigin::Startup
            && self
                .config
                .start_at
                .as_ref()
                .is_some_and(|p| p.for_shard(&shard).is_some());
        let checkpoint_seq = match &taken.checkpoint {
            Some(Checkpoint::Sequence(seq)) if !overridden => Some(seq.as_str()),
            _ => None,
        };
        let acks = ShardAcks::new(
            self.stream.clone(),
            Arc::from(shard.as_str()),
            checkpoint_seq,
        );
        let reader = ShardReader::new(self.api.clone(), self.stream.clone(), shard.as_str())
            .settings(self.config.read.clone())
            .settled(acks.settled_position())
            .open(start.clone());
        let mut reader = match reader {
            Ok(reader) => reader,
            Err(e) => {
                let _ = self.store.release(&taken).await;
                let _ = self.commands.send(Command::Error(e));
                return;
            }
        };
        // Fix the position now, so that nothing written after this listing is missed, and
        // record where this reader begins before it reads anything, so that a takeover after
        // a crash resumes there (never at the tip, which would skip what arrived meanwhile).
        // Only a position the service accepted is recorded.
        let primed = tokio::time::timeout(self.config.call_timeout(), reader.prime())
            .await
            .unwrap_or(false);
        let mut taken = taken;
        if primed && (overridden || !matches!(taken.checkpoint, Some(Checkpoint::Sequence(_)))) {
            let begins = match &start {
                StartingPoint::Latest => StartingPoint::since(std::time::SystemTime::now()),
                other => other.clone(),
            };
            let begins = Checkpoint::Start(begins);
            if taken.checkpoint.as_ref() != Some(&begins) {
                let sent = Instant::now();
                match self.store.checkpoint(&taken, &begins).await {
                    Ok(lease) => {
                        taken = lease;
                        renewed_at = sent;
                    }
                    Err(e) => {
                        tracing::warn!(shard = %shard, error = %e, "could not record the start position; leaving the shard");
                        if !e.is_lost() {
                            let _ = self.store.release(&taken).await;
                        }
                        return;
                    }
                }
            }
        }
        let gate = Arc::new(LeaseGate::new(renewed_at, self.config.give_up_after()));
        if taken.parents.is_empty() {
            tracing::info!(shard = %shard, ?origin, position = ?start, "lease taken, reading");
        } else {
            tracing::info!(
                shard = %shard,
                parents = ?taken.parents,
                ?origin,
                position = ?start,
                "lease taken; child started after its parents"
            );
        }
        let written = if overridden && !primed {
            None
        } else {
            taken.checkpoint.clone()
        };
        self.install(shard, taken, acks, reader, gate, written);
    }

    /// Starts reading a held shard: its pump goes to the subscription's stream, and the
    /// ledger is watched for the shard's end.
    fn install(
        &mut self,
        shard: String,
        lease: Lease,
        acks: Arc<ShardAcks>,
        reader: crate::shard::ShardStream,
        gate: Arc<LeaseGate>,
        written: Option<Checkpoint>,
    ) {
        let pump = ShardPump::new(
            reader,
            acks.clone(),
            gate.clone(),
            self.config.max_in_flight,
            self.events_tx.clone(),
        );
        let finish_watch = {
            let acks = acks.clone();
            let tx = self.finished_tx.clone();
            let shard = shard.clone();
            tokio::spawn(async move {
                acks.finished().await;
                let _ = tx.send(shard);
            })
        };
        self.held.insert(
            shard.clone(),
            Held {
                lease,
                acks,
                gate,
                written,
                finish_watch,
            },
        );
        let _ = self.commands.send(Command::Add(shard, Box::new(pump)));
    }

    async fn renew_all(&mut self) {
        // All renewals at once (each bounded by the call timeout), so that many held shards
        // cannot push the last renewal past the lease duration.
        let store = self.store.clone();
        let sent = Instant::now();
        let calls: Vec<_> = self
            .held
            .iter()
            .map(|(shard, held)| {
                let (shard, lease, since) =
                    (shard.clone(), held.lease.clone(), held.gate.since_renewed());
                let store = store.clone();
                async move { (shard, since, store.renew(&lease).await) }
            })
            .collect();
        // The worker row is renewed alongside, not after: a slow table must not double the
        // time a round of renewals takes.
        let worker = self.worker.clone();
        let worker_call = async {
            match &worker {
                Some(worker) => Some(store.renew(worker).await),
                None => None,
            }
        };
        let (results, worker_result) =
            futures::join!(futures::future::join_all(calls), worker_call);
        for (shard, since, result) in results {
            if !self.held.contains_key(&shard) {
                continue;
            }
            match result {
                Ok(lease) => {
                    if since > self.config.renew_interval() * 3 / 2 {
                        tracing::warn!(shard = %shard, late_by = ?since, "lease renewed late");
                    }
                    let held = self.held.get_mut(&shard).expect("held");
                    held.lease = lease;
                    held.gate.renewed(sent);
                }
                Err(e) if e.is_lost() => {
                    tracing::warn!(shard = %shard, "lease lost to another instance; stopped reading");
                    self.drop_shard(&shard);
                }
                Err(e) => {
                    if self.held.get(&shard).is_some_and(|h| h.gate.is_expired()) {
                        tracing::error!(
                            shard = %shard,
                            error = %e,
                            "cannot renew the lease; stopped reading before it can expire for others"
                        );
                        self.drop_shard(&shard);
                    } else {
                        tracing::warn!(shard = %shard, error = %e, "lease renewal failed; retrying");
                    }
                }
            }
        }
        if let Some(result) = worker_result {
            match result {
                Ok(w) => {
                    self.worker = Some(w);
                    self.worker_renewed = sent;
                }
                Err(e) if e.is_lost() => self.worker = None,
                Err(_) if self.worker_renewed.elapsed() >= self.config.give_up_after() => {
                    self.worker = None;
                }
                Err(_) => {}
            }
        }
    }

    async fn checkpoint_all(&mut self) {
        let shards: Vec<String> = self.held.keys().cloned().collect();
        for shard in shards {
            let finished = self.held.get(&shard).is_some_and(|h| h.acks.is_finished());
            if finished {
                self.on_finished(shard).await;
            } else {
                self.flush(&shard).await;
            }
        }
    }

    /// Writes the shard's checkpoint when it moved. Returns false when the lease is gone.
    async fn flush(&mut self, shard: &str) -> bool {
        let Some(held) = self.held.get(shard) else {
            return false;
        };
        let Some(checkpoint) = held.acks.checkpoint() else {
            return true;
        };
        if held.written.as_ref() == Some(&checkpoint) {
            return true;
        }
        let sent = Instant::now();
        match self.store.checkpoint(&held.lease, &checkpoint).await {
            Ok(lease) => {
                tracing::debug!(shard = %shard, ?checkpoint, "checkpoint written");
                let held = self.held.get_mut(shard).expect("held");
                held.lease = lease;
                held.written = Some(checkpoint);
                held.gate.renewed(sent);
                true
            }
            Err(e) if e.is_lost() => {
                tracing::warn!(shard = %shard, "lease lost before the checkpoint was written; stopped reading");
                self.drop_shard(shard);
                false
            }
            Err(e) => {
                tracing::warn!(shard = %shard, error = %e, "checkpoint write failed; retried at the next interval");
                true
            }
        }
    }

    /// The earliest instant at which a held lease runs out unless renewed.
    fn next_expiry(&self) -> Option<Instant> {
        self.held.values().map(|h| h.gate.deadline()).min()
    }

    /// Drops every held shard whose lease ran out without a renewal. Their pumps stopped
    /// handing out records at the deadline already.
    fn expire(&mut self) {
        let expired: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| h.gate.is_expired())
            .map(|(shard, _)| shard.clone())
            .collect();
        for shard in expired {
            tracing::error!(
                shard = %shard,
                "cannot renew the lease; stopped reading before it can expire for others"
            );
            self.drop_shard(&shard);
        }
    }

    /// Stops reading a shard whose lease is gone (no release: it is not ours any more).
    fn drop_shard(&mut self, shard: &str) {
        if let Some(held) = self.held.remove(shard) {
            held.gate.revoke();
            held.finish_watch.abort();
            let _ = self.commands.send(Command::Remove(shard.to_owned()));
        }
    }

    async fn on_pump_end(&mut self, event: PumpEvent) {
        let shard = event.shard.to_string();
        match event.end {
            PumpEnd::ShardEnd(end) => {
                tracing::info!(
                    shard = %shard,
                    children = ?end.child_shards.iter().map(|c| c.shard_id.as_str()).collect::<Vec<_>>(),
                    "shard read to its end; SHARD_END once everything is settled"
                );
            }
            PumpEnd::LeaseExpired(gate) => {
                // That pump is gone for good, even if a late renewal has reopened the gate
                // since: without a pump the shard would be held (and renewed) but never read.
                let Some(held) = self.held.get(&shard) else {
                    return;
                };
                if !Arc::ptr_eq(&held.gate, &gate) {
                    // A reader installed since (a seek, a new take) is not this one.
                    return;
                }
                let renewed_since = !held.gate.is_expired();
                tracing::error!(
                    shard = %shard,
                    renewed_since,
                    "the lease was not renewed in time; stopped reading before it could expire \
                     for others"
                );
                if renewed_since {
                    // Still ours: hand it back so that the next listing takes it again and a
                    // new reader resumes from the checkpoint.
                    self.release(&shard).await;
                } else {
                    self.drop_shard(&shard);
                }
            }
            PumpEnd::Stopped => {
                tracing::warn!(shard = %shard, "reader stopped; releasing the lease so the shard is taken again");
                self.release(&shard).await;
            }
        }
    }

    async fn on_finished(&mut self, shard: String) {
        if !self.held.contains_key(&shard) {
            return;
        }
        // Released only once SHARD_END is in the table; a failed write is retried at the next
        // checkpoint interval.
        if self.flush(&shard).await
            && self
                .held
                .get(&shard)
                .is_some_and(|h| h.written == Some(Checkpoint::ShardEnd))
        {
            tracing::info!(shard = %shard, "shard finished (SHARD_END checkpointed)");
            self.release(&shard).await;
            // Its children may be eligible now.
            self.sync().await;
        }
    }

    /// Flushes and releases a held lease now.
    async fn release(&mut self, shard: &str) {
        if !self.held.contains_key(shard) {
            return;
        }
        self.flush(shard).await;
        if let Some(held) = self.held.remove(shard) {
            held.gate.revoke();
            held.finish_watch.abort();
            let _ = self.commands.send(Command::Remove(shard.to_owned()));
            match self.store.release(&held.lease).await {
                Ok(_) => tracing::info!(shard = %shard, "lease released"),
                Err(e) => {
                    tracing::warn!(shard = %shard, error = %e, "lease release failed; it expires instead")
                }
            }
        }
    }

    /// Stops reading a shard, then, in the background, waits for its in-flight deliveries,
    /// flushes its checkpoint and releases its lease.
    fn hand_off(&mut self, shard: &str) {
        let Some(held) = self.held.remove(shard) else {
            return;
        };
        held.gate.revoke();
        held.finish_watch.abort();
        let _ = self.commands.send(Command::Remove(shard.to_owned()));
        let task = tokio::spawn(settle_and_release(
            self.store.clone(),
            held,
            self.config.shutdown_timeout,
            self.config.renew_interval(),
        ));
        self.handoffs.retain(|(_, task)| !task.is_finished());
        self.handoffs.push((shard.to_owned(), task));
    }

    /// Graceful stop: no more reading, in-flight deliveries get a bounded time, checkpoints
    /// are flushed and leases released.
    async fn stop(&mut self) {
        let _ = self.commands.send(Command::Close);
        let shards: Vec<String> = self.held.keys().cloned().collect();
        for shard in shards {
            self.hand_off(&shard);
        }
        for (_, task) in std::mem::take(&mut self.handoffs) {
            let _ = task.await;
        }
        self.delete_own_worker().await;
        tracing::info!("subscription stopped; checkpoints flushed, leases released");
    }
}

async fn settle_and_release(
    store: SharedLeaseStore,
    mut held: Held,
    timeout: std::time::Duration,
    renew_every: std::time::Duration,
) {
    let shard = held.lease.shard_id.clone();
    let deadline = Instant::now() + timeout;
    while held.acks.in_flight() > 0 && Instant::now() < deadline {
        sleep(std::time::Duration::from_millis(20)).await;
        if held.gate.since_renewed() >= renew_every {
            let sent = Instant::now();
            match store.renew(&held.lease).await {
                Ok(lease) => {
                    held.lease = lease;
                    held.gate.renewed(sent);
                }
                Err(e) if e.is_lost() => return,
                Err(_) => {}
            }
        }
    }
    let in_flight = held.acks.in_flight();
    if in_flight > 0 {
        tracing::warn!(shard = %shard, in_flight, "in-flight deliveries not settled in time; they will be redelivered");
    }
    if let Some(checkpoint) = held.acks.checkpoint()
        && held.written.as_ref() != Some(&checkpoint)
    {
        match store.checkpoint(&held.lease, &checkpoint).await {
            Ok(lease) => held.lease = lease,
            Err(e) => {
                tracing::warn!(shard = %shard, error = %e, "final checkpoint failed");
                return;
            }
        }
    }
    match store.release(&held.lease).await {
        Ok(_) => tracing::info!(shard = %shard, "lease released"),
        Err(e) => {
            tracing::warn!(shard = %shard, error = %e, "lease release failed; it expires instead")
        }
    }
}
