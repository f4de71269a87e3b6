//! The background task of a subscription. It lists shards and leases, takes its share, hands
//! off the excess, deletes rows nobody needs, and keeps this instance's worker row; each held
//! shard has a [`Keeper`] of its own that renews the lease, writes checkpoints and releases.
//!
//! The decisions are pure functions over data ([`lineage`], [`plan`], [`opening`], [`health`],
//! [`liveness`]); this module only carries them out. Nothing here waits on a slow call: the
//! listing, takes, deletes and the worker row run as jobs beside the loop (takes, row
//! creation, first iterators and checkpoint writes within a bound of [`MAX_WORK`] at once), so
//! events are handled and renewals go on whatever the table's latency.

mod health;
mod keeper;
mod lineage;
mod listing;
mod liveness;
mod opening;
mod plan;
mod seek;
mod take;
mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::{Semaphore, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior, interval, sleep_until};

use self::health::Health;
use self::keeper::{Keeper, Report};
use self::listing::{Listing, ListingFailure, NewRowRule};
use self::liveness::Liveness;
use self::opening::{StartContext, opening};
use self::plan::{Holdings, WORKER_PREFIX};
use self::take::{TakeOutcome, Taken};
use self::worker::WorkerDone;
use super::config::SubscriptionConfig;
use super::gate::LeaseGate;
use super::pump::{PumpEnd, PumpEvent, ShardPump};
use crate::ack::ShardAcks;
use crate::api::SharedKinesis;
use crate::error::KinesisError;
use crate::lease::{Lease, LeaseError, SharedLeaseStore};
use crate::position::StartingPoint;
use crate::shard::ReadProbe;

/// How many takes, row creations, first iterators and checkpoint writes run at once.
pub(crate) const MAX_WORK: usize = 32;

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
        oneshot::Sender<Result<(), KinesisError>>,
    ),
}

/// The channels between a coordinator and its subscription.
pub(crate) struct Links {
    /// To the subscription's stream.
    pub(crate) commands: UnboundedSender<Command>,
    /// Set to stop gracefully.
    pub(crate) shutdown: watch::Receiver<bool>,
    /// Set once stopped.
    pub(crate) done: watch::Sender<bool>,
    /// Told once the first listing took its shards (or failed in a way retrying cannot fix).
    pub(crate) first_sync: oneshot::Sender<Option<KinesisError>>,
    /// Requests from seekers.
    pub(crate) control: UnboundedReceiver<Control>,
}

/// What the coordinator's jobs share.
pub(crate) struct Shared {
    pub(crate) api: SharedKinesis,
    pub(crate) store: SharedLeaseStore,
    pub(crate) stream: Arc<str>,
    pub(crate) config: SubscriptionConfig,
    /// Bounds the work that runs beside the loop (never renewals).
    pub(crate) permits: Arc<Semaphore>,
    /// Counts the successful reads of every reader here.
    pub(crate) probe: Arc<ReadProbe>,
}

/// A shard being read.
struct Held {
    gate: Arc<LeaseGate>,
    acks: Arc<ShardAcks>,
    keeper: Keeper,
}

/// A job that finished.
enum Done {
    Listing(Result<Listing, ListingFailure>),
    Take(String, TakeOutcome),
    Worker(WorkerDone),
    Deleted(Vec<(Lease, Result<(), LeaseError>)>),
}

/// Where the subscription stands with its start.
struct Startup {
    /// The time `start` was called, as an AT_TIMESTAMP (with the clock allowance).
    started: StartingPoint,
    /// The shards the subscription opens with and has not opened yet; `None` until the first
    /// listing that succeeded.
    shards: Option<HashSet<String>>,
    /// Told once the first listing's takes are done; `None` once told.
    tell: Option<oneshot::Sender<Option<KinesisError>>>,
    /// The first listing's takes still under way.
    pending: HashSet<String>,
}

pub(crate) struct Coordinator {
    shared: Arc<Shared>,
    commands: UnboundedSender<Command>,
    shutdown: watch::Receiver<bool>,
    done: watch::Sender<bool>,
    control: UnboundedReceiver<Control>,
    startup: Startup,
    held: BTreeMap<String, Held>,
    taking: BTreeSet<String>,
    releasing: Vec<(String, JoinHandle<()>)>,
    liveness: Liveness,
    /// Rows of shards the listing lacks, with when each was first found missing.
    unlisted: HashMap<String, Instant>,
    /// A delete was refused in a way retrying cannot fix (already said at warn level).
    delete_refused: bool,
    worker: worker::WorkerRow,
    health: Health,
    /// A listing job is running.
    listing: bool,
    /// When the next listing starts.
    next_listing: Instant,
    /// Rows nobody held at the last listing (see [`NewRowRule::replaceable`]).
    replaceable: HashSet<String>,
    jobs: FuturesUnordered<BoxFuture<'static, Done>>,
    events_tx: UnboundedSender<PumpEvent>,
    events: UnboundedReceiver<PumpEvent>,
    reports_tx: UnboundedSender<Report>,
    reports: UnboundedReceiver<Report>,
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
        let (events_tx, events) = unbounded_channel();
        let (reports_tx, reports) = unbounded_channel();
        let health = Health::new(config.lease_duration * 3);
        Self {
            shared: Arc::new(Shared {
                api,
                store,
                stream,
                config,
                permits: Arc::new(Semaphore::new(MAX_WORK)),
                probe: Arc::new(ReadProbe::default()),
            }),
            commands,
            shutdown,
            done,
            control,
            startup: Startup {
                started: StartingPoint::since(SystemTime::now()),
                shards: None,
                tell: Some(first_sync),
                pending: HashSet::new(),
            },
            held: BTreeMap::new(),
            taking: BTreeSet::new(),
            releasing: Vec::new(),
            liveness: Liveness::default(),
            unlisted: HashMap::new(),
            delete_refused: false,
            worker: worker::WorkerRow::default(),
            health,
            listing: false,
            next_listing: Instant::now(),
            replaceable: HashSet::new(),
            jobs: FuturesUnordered::new(),
            events_tx,
            events,
            reports_tx,
            reports,
        }
    }

    fn config(&self) -> &SubscriptionConfig {
        &self.shared.config
    }

    pub(crate) async fn run(mut self) {
        let mut renew = interval(self.config().renew_interval());
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let next_listing = self.next_listing;
            tokio::select! {
                biased;
                changed = self.shutdown.changed() => {
                    if changed.is_err() || *self.shutdown.borrow() {
                        break;
                    }
                }
                Some(report) = self.reports.recv() => self.on_report(report),
                Some(event) = self.events.recv() => self.on_pump_end(event),
                Some(done) = self.jobs.next() => self.on_done(done),
                Some(control) = self.control.recv() => self.on_control(control).await,
                _ = renew.tick() => self.keep_worker_row(),
                _ = sleep_until(next_listing), if !self.listing => self.start_listing(),
            }
        }
        self.stop().await;
        let _ = self.done.send(true);
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Listing(Ok(listing)) => self.on_listing(listing),
            Done::Listing(Err(failure)) => self.on_listing_failed(failure),
            Done::Take(shard, outcome) => self.on_take(shard, outcome),
            Done::Worker(done) => self.on_worker(done),
            Done::Deleted(results) => self.on_deleted(results),
        }
    }

    // --- listing ---------------------------------------------------------------------------

    fn start_listing(&mut self) {
        self.listing = true;
        self.next_listing = Instant::now() + self.config().list_interval;
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
            replaceable: self.replaceable.clone(),
        };
        let shared = self.shared.clone();
        self.jobs.push(Box::pin(async move {
            Done::Listing(listing::list(shared, rule).await)
        }));
    }

    /// Lists again as soon as the running listing (if any) is done.
    fn list_soon(&mut self) {
        self.next_listing = Instant::now();
    }

    fn on_listing_failed(&mut self, failure: ListingFailure) {
        self.listing = false;
        // Try again soon, rather than a whole listing interval later.
        self.next_listing =
            Instant::now() + self.config().list_interval.min(Duration::from_secs(1));
        let error = match failure {
            ListingFailure::Kinesis(e) => {
                self.health.listed(false);
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
        };
        // `start` returns; the shards it opens with open at its start time when they can.
        self.tell_started();
        let _ = self.commands.send(Command::Error(error));
    }

    fn on_listing(&mut self, listing: Listing) {
        self.listing = false;
        self.health.listed(true);
        let now = self.config().clock.now();
        let lease_duration = self.config().lease_duration;
        self.liveness.observe(&listing.rows, now);
        self.note_unlisted(&listing, now);
        let holdings = self.holdings();
        let liveness = &self.liveness;
        let expired = |row: &Lease| liveness.is_expired(row, now, lease_duration);
        let view = plan::View {
            rows: &listing.rows,
            shards: &listing.shards,
            owner: &self.shared.config.owner,
            holdings: &holdings,
            expired: &expired,
        };
        let unlisted_for = lease_duration + self.shared.config.list_interval;
        let stale = plan::stale_rows(&view, &self.unlisted, now, unlisted_for);
        let replaceable = listing
            .rows
            .values()
            .filter(|row| row.owner.is_none() || expired(row))
            .filter(|row| !holdings.has(&row.shard_id))
            .map(|row| row.shard_id.clone())
            .collect();
        let eligible = lineage::eligible(&listing.shards, &listing.rows);
        let can_work = self
            .health
            .can_work(self.shared.probe.count(), Instant::now());
        let shares = plan::shares(&view, &eligible, can_work);
        self.replaceable = replaceable;
        tracing::debug!(
            shards = listing.shards.len(),
            eligible = eligible.len(),
            live_workers = shares.live_workers,
            target = shares.target,
            held = self.held.len(),
            can_work,
            "shards listed"
        );
        self.delete(stale);
        let first = self.startup.shards.is_none();
        if first {
            self.startup.shards = Some(shares.take.iter().map(|l| l.shard_id.clone()).collect());
        }
        for lease in shares.take {
            self.start_take(lease, first);
        }
        for shard in shares.hand_off {
            tracing::info!(shard = %shard, target = shares.target, live_workers = shares.live_workers, "handing the shard off to balance");
            self.hand_off(&shard);
        }
        if self.startup.pending.is_empty() {
            self.tell_started();
        }
    }

    /// Tracks since when each row's shard is missing from the listing.
    fn note_unlisted(&mut self, listing: &Listing, now: Instant) {
        let listed: HashSet<&str> = listing.shards.iter().map(|s| s.shard_id.as_str()).collect();
        let unlisted = |id: &str| !id.starts_with(WORKER_PREFIX) && !listed.contains(id);
        self.unlisted
            .retain(|id, _| listing.rows.contains_key(id) && unlisted(id));
        for id in listing.rows.keys().filter(|id| unlisted(id)) {
            self.unlisted.entry(id.clone()).or_insert(now);
        }
    }

    fn holdings(&mut self) -> Holdings {
        self.releasing.retain(|(_, task)| !task.is_finished());
        Holdings {
            held: self.held.keys().cloned().collect(),
            taking: self.taking.clone(),
            releasing: self.releasing.iter().map(|(s, _)| s.clone()).collect(),
        }
    }

    /// Tells `start` to return (once).
    fn tell_started(&mut self) {
        if let Some(tell) = self.startup.tell.take() {
            let _ = tell.send(None);
        }
    }

    // --- takes -----------------------------------------------------------------------------

    fn start_take(&mut self, lease: Lease, first: bool) {
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
        };
        let Some(opening) = opening(&shard, lease.checkpoint.as_ref(), at_startup, &context) else {
            return;
        };
        self.taking.insert(shard.clone());
        if first {
            self.startup.pending.insert(shard.clone());
        }
        let shared = self.shared.clone();
        self.jobs.push(Box::pin(async move {
            let outcome = take::take(shared, lease, opening).await;
            Done::Take(shard, outcome)
        }));
    }

    fn on_take(&mut self, shard: String, outcome: TakeOutcome) {
        self.taking.remove(&shard);
        match outcome {
            TakeOutcome::Taken(taken) => {
                self.opened(&shard);
                self.install(shard.clone(), *taken);
            }
            TakeOutcome::Lost => {
                tracing::debug!(shard = %shard, "another instance took the lease first");
                self.opened(&shard);
            }
            TakeOutcome::Failed(e) => {
                // Still one of the shards this subscription opens with, at the next listing.
                tracing::warn!(shard = %shard, error = %e, "taking the lease failed");
            }
            TakeOutcome::Unopenable(e) => {
                let _ = self.commands.send(Command::Error(e));
            }
        }
        if self.startup.pending.remove(&shard) && self.startup.pending.is_empty() {
            self.tell_started();
        }
    }

    /// `shard` is no longer one this subscription opens with.
    fn opened(&mut self, shard: &str) {
        if let Some(startup) = &mut self.startup.shards {
            startup.remove(shard);
        }
    }

    /// Starts reading a taken shard: its pump goes to the subscription's stream, its keeper
    /// keeps the lease.
    fn install(&mut self, shard: String, taken: Taken) {
        let Taken {
            lease,
            reader,
            acks,
            sent,
            written,
            start,
        } = taken;
        if lease.parents.is_empty() {
            tracing::info!(shard = %shard, position = ?start, "lease taken, reading");
        } else {
            tracing::info!(shard = %shard, parents = ?lease.parents, position = ?start, "lease taken; child started after its parents");
        }
        let gate = Arc::new(LeaseGate::new(sent, self.config().give_up_after()));
        self.start_reading(shard, lease, written, acks, reader, gate);
    }

    fn start_reading(
        &mut self,
        shard: String,
        lease: Lease,
        written: Option<crate::position::Checkpoint>,
        acks: Arc<ShardAcks>,
        reader: crate::shard::ShardStream,
        gate: Arc<LeaseGate>,
    ) {
        let keeper = Keeper::spawn(
            &self.shared,
            lease,
            written,
            acks.clone(),
            gate.clone(),
            self.reports_tx.clone(),
        );
        let pump = self.pump(reader, &acks, &gate);
        self.held.insert(shard.clone(), Held { gate, acks, keeper });
        let _ = self.commands.send(Command::Add(shard, pump));
    }

    /// The stream of deliveries of a shard's reader, behind its gate.
    fn pump(
        &self,
        reader: crate::shard::ShardStream,
        acks: &Arc<ShardAcks>,
        gate: &Arc<LeaseGate>,
    ) -> Box<ShardPump> {
        Box::new(ShardPump::new(
            reader,
            acks.clone(),
            gate.clone(),
            self.config().max_in_flight,
            self.events_tx.clone(),
        ))
    }

    /// A seek's new reader of a held shard takes the old one's place in the stream.
    fn replace_reader(
        &mut self,
        shard: &str,
        acks: Arc<ShardAcks>,
        reader: crate::shard::ShardStream,
        gate: Arc<LeaseGate>,
    ) {
        let pump = self.pump(reader, &acks, &gate);
        if let Some(held) = self.held.get_mut(shard) {
            held.gate = gate;
            held.acks = acks;
        }
        let _ = self.commands.send(Command::Add(shard.to_owned(), pump));
    }

    // --- held shards -----------------------------------------------------------------------

    /// Stops reading a shard: its gate closes and its pump leaves the stream. The one place a
    /// held shard is torn down; the caller decides what becomes of its lease.
    fn detach(&mut self, shard: &str) -> Option<Held> {
        let held = self.held.remove(shard)?;
        held.gate.revoke();
        let _ = self.commands.send(Command::Remove(shard.to_owned()));
        Some(held)
    }

    /// Stops reading a shard and hands its lease back once in-flight deliveries settle (up to
    /// `wait`), with the checkpoint written first.
    fn give_back(&mut self, shard: &str, wait: Duration) {
        if let Some(held) = self.detach(shard) {
            let task = held.keeper.release(wait);
            self.releasing.push((shard.to_owned(), task));
        }
    }

    /// Graceful hand-off: in-flight deliveries get the shutdown timeout.
    fn hand_off(&mut self, shard: &str) {
        let wait = self.config().shutdown_timeout;
        self.give_back(shard, wait);
    }

    /// True when `gate` is the one of the shard's current reader.
    fn is_current(&self, shard: &str, gate: &Arc<LeaseGate>) -> bool {
        self.held
            .get(shard)
            .is_some_and(|held| Arc::ptr_eq(&held.gate, gate))
    }

    fn on_report(&mut self, report: Report) {
        match report {
            Report::Lost(shard, gate) => {
                if self.is_current(&shard, &gate)
                    && let Some(held) = self.detach(&shard)
                {
                    held.keeper.forget();
                }
            }
            Report::Expired(shard, gate) => {
                if self.is_current(&shard, &gate) {
                    tracing::error!(shard = %shard, "cannot renew the lease; stopped reading before it can expire for others");
                    self.give_back(&shard, Duration::ZERO);
                }
            }
            Report::Finished(shard, gate) => {
                if self.is_current(&shard, &gate)
                    && let Some(held) = self.detach(&shard)
                {
                    held.keeper.forget();
                }
                // Its children may be eligible now.
                self.list_soon();
            }
        }
    }

    fn on_pump_end(&mut self, event: PumpEvent) {
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
                // since: the shard goes back and is taken again from its checkpoint.
                if self.is_current(&shard, &gate) {
                    tracing::error!(shard = %shard, "the lease was not renewed in time; stopped reading before it could expire for others");
                    self.give_back(&shard, Duration::ZERO);
                }
            }
            PumpEnd::Stopped { gate, gave_up } => {
                if !self.is_current(&shard, &gate) {
                    return;
                }
                tracing::warn!(shard = %shard, "reader stopped; releasing the lease so the shard is taken again");
                if gave_up {
                    self.health
                        .reader_gave_up(self.shared.probe.count(), Instant::now());
                }
                self.give_back(&shard, Duration::ZERO);
            }
        }
    }

    // --- the worker row and deletes --------------------------------------------------------

    /// Keeps this instance's worker row while it can do the work, and deletes it while it
    /// cannot, so the other instances count it exactly then.
    fn keep_worker_row(&mut self) {
        let can_work = self
            .health
            .can_work(self.shared.probe.count(), Instant::now());
        if let Some(job) = self.worker.next_job(self.shared.clone(), can_work) {
            self.jobs
                .push(Box::pin(async move { Done::Worker(job.await) }));
        }
    }

    fn on_worker(&mut self, done: WorkerDone) {
        let give_up_after = self.config().give_up_after();
        self.worker.done(done, give_up_after);
    }

    fn delete(&mut self, stale: Vec<Lease>) {
        if stale.is_empty() {
            return;
        }
        let store = self.shared.store.clone();
        self.jobs.push(Box::pin(async move {
            let results = futures::future::join_all(stale.iter().map(|l| store.delete(l))).await;
            Done::Deleted(stale.into_iter().zip(results).collect())
        }));
    }

    fn on_deleted(&mut self, results: Vec<(Lease, Result<(), LeaseError>)>) {
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

    // --- stopping --------------------------------------------------------------------------

    /// Graceful stop: no more reading, in-flight deliveries get a bounded time, checkpoints
    /// are flushed and leases released; takes still under way are released unread.
    async fn stop(&mut self) {
        let _ = self.commands.send(Command::Close);
        let shards: Vec<String> = self.held.keys().cloned().collect();
        for shard in shards {
            self.hand_off(&shard);
        }
        while let Some(done) = self.jobs.next().await {
            match done {
                Done::Take(_, TakeOutcome::Taken(taken)) => {
                    let _ = self.shared.store.release(&taken.lease).await;
                }
                Done::Worker(done) => self.on_worker(done),
                _ => {}
            }
        }
        for (_, task) in std::mem::take(&mut self.releasing) {
            let _ = task.await;
        }
        self.worker.delete_at_stop(&self.shared).await;
        tracing::info!("subscription stopped; checkpoints flushed, leases released");
    }
}
