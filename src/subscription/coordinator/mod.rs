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
mod held;
mod keeper;
mod lineage;
mod listing;
mod liveness;
mod opening;
mod outcome;
mod plan;
mod roster;
mod rows;
mod seek;
mod shared;
mod stop;
mod sync;
mod take;
mod watching;
mod worker;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::SystemTime;

use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior, interval, sleep_until};

use self::health::Health;
use self::keeper::{Keeper, Report};
use self::listing::{Listing, ListingFailure};
pub(crate) use self::liveness::Expiry;
use self::liveness::Liveness;
pub(crate) use self::shared::Shared;
use self::take::TakeOutcome;
use self::worker::WorkerDone;
use super::config::SubscriptionConfig;
use super::gate::LeaseGate;
use super::pump::{PumpEvent, ShardPump};
use super::seeker::SeekRequest;
use crate::ack::ShardAcks;
use crate::api::SharedKinesis;
use crate::error::KinesisError;
use crate::lease::{Lease, LeaseError, SharedLeaseStore};
use crate::position::StartingPoint;

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
    /// A graceful stop began: no more deliveries, but the stream goes on until [`Close`].
    ///
    /// [`Close`]: Command::Close
    Stop,
    /// The stop is complete (final checkpoints written, leases released, worker row
    /// deleted) or the task ended: the stream ends.
    Close,
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
    pub(crate) seeks: UnboundedReceiver<SeekRequest>,
    /// Set when the subscription is asked to stop (shared with its handle).
    pub(crate) stopping: Arc<std::sync::atomic::AtomicBool>,
    /// Set when the stream was found deleted and the subscription ended for it.
    pub(crate) deleted: Arc<std::sync::atomic::AtomicBool>,
}

/// The subscription's ends of the channels to its coordinator.
pub(crate) struct Ends {
    /// From the coordinator.
    pub(crate) commands: UnboundedReceiver<Command>,
    /// Set to stop gracefully.
    pub(crate) shutdown: watch::Sender<bool>,
    /// Set once stopped.
    pub(crate) done: watch::Receiver<bool>,
    /// Told once the first listing took its shards.
    pub(crate) first_sync: oneshot::Receiver<Option<KinesisError>>,
    /// To the coordinator, from seekers.
    pub(crate) seeks: UnboundedSender<SeekRequest>,
    /// Set when the subscription is asked to stop.
    pub(crate) stopping: Arc<std::sync::atomic::AtomicBool>,
    /// Set when the stream was found deleted and the subscription ended for it.
    pub(crate) deleted: Arc<std::sync::atomic::AtomicBool>,
}

impl Links {
    /// The channels between a coordinator and its subscription: the coordinator's ends and
    /// the subscription's.
    pub(crate) fn new() -> (Self, Ends) {
        let (commands_tx, commands) = unbounded_channel();
        let (shutdown_tx, shutdown) = watch::channel(false);
        let (done, done_rx) = watch::channel(false);
        let (first_sync, first_sync_rx) = oneshot::channel();
        let (seeks_tx, seeks) = unbounded_channel();
        let stopping = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let deleted = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let links = Self {
            commands: commands_tx,
            shutdown,
            done,
            first_sync,
            seeks,
            stopping: stopping.clone(),
            deleted: deleted.clone(),
        };
        let ends = Ends {
            commands,
            shutdown: shutdown_tx,
            done: done_rx,
            first_sync: first_sync_rx,
            seeks: seeks_tx,
            stopping,
            deleted,
        };
        (links, ends)
    }
}

/// A shard being read.
struct Held {
    gate: Arc<LeaseGate>,
    acks: Arc<ShardAcks>,
    keeper: Keeper,
    /// Ends the reader's fan-out subscription when the shard is let go.
    hang_up: Option<crate::shard::HangUp>,
}

/// A job that finished.
enum Done {
    Listing(Result<Listing, ListingFailure>),
    Take(String, TakeOutcome, u64),
    Worker(WorkerDone),
    Deleted(Vec<(Lease, Result<(), LeaseError>)>),
    Watched(Result<roster::WatchRead, LeaseError>),
    Declared(Lease, Result<(), LeaseError>),
    RosterMoved,
    Seek(Box<seek::Opened>),
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
    /// The tips fetched for the rows this instance created while `start` runs (see
    /// [`listing::Tip`]); dropped once `start` returned.
    tips: HashMap<String, listing::Tip>,
}

/// The background task of one subscription, its state grouped by concern.
pub(crate) struct Coordinator {
    /// What every job and keeper shares: the clients, the settings, the bounds.
    shared: Arc<Shared>,
    /// What the loop waits on.
    inbox: Inbox,
    /// What the loop tells the subscription's stream.
    outbox: Outbox,
    /// Where the subscription stands with its start.
    startup: Startup,
    /// The shards this instance reads, takes and hands back.
    shards: Shards,
    /// The listings of shards and leases, and what they remember between runs.
    listings: Listings,
    /// This instance among the others: its worker row, the roster, their liveness.
    instance: Instance,
}

/// What the coordinator's loop waits on.
struct Inbox {
    /// Set to stop gracefully.
    shutdown: watch::Receiver<bool>,
    /// Requests from seekers.
    seeks: UnboundedReceiver<SeekRequest>,
    /// The jobs running beside the loop.
    jobs: FuturesUnordered<BoxFuture<'static, Done>>,
    events_tx: UnboundedSender<PumpEvent>,
    /// Shard pumps that ended.
    events: UnboundedReceiver<PumpEvent>,
    reports_tx: UnboundedSender<Report>,
    /// What the keepers report.
    reports: UnboundedReceiver<Report>,
}

impl Inbox {
    fn new(shutdown: watch::Receiver<bool>, seeks: UnboundedReceiver<SeekRequest>) -> Self {
        let (events_tx, events) = unbounded_channel();
        let (reports_tx, reports) = unbounded_channel();
        Self {
            shutdown,
            seeks,
            jobs: FuturesUnordered::new(),
            events_tx,
            events,
            reports_tx,
            reports,
        }
    }
}

/// What the coordinator tells the subscription's stream and handle.
struct Outbox {
    /// To the subscription's stream.
    commands: UnboundedSender<Command>,
    /// Set once stopped.
    done: watch::Sender<bool>,
    /// Set (with [`SubscriptionConfig::end_when_deleted`]) once the stream is gone for good.
    deleted: Arc<std::sync::atomic::AtomicBool>,
}

/// The shards this instance reads, and those on their way in or out.
#[derive(Default)]
struct Shards {
    held: BTreeMap<String, Held>,
    taking: BTreeSet<String>,
    /// Moves each time this instance learns its shards may be another's (its worker row was
    /// taken away): a take begun before is not installed when it completes.
    epoch: u64,
    releasing: Vec<(String, JoinHandle<()>)>,
    /// When this instance handed shards off to balance, within the last listing interval.
    handed_off: VecDeque<Instant>,
}

impl Default for Listings {
    fn default() -> Self {
        Self {
            running: false,
            scans: listing::Scans::default(),
            next: Instant::now(),
            replaceable: HashSet::new(),
            not_found: 0,
            unlisted: HashMap::new(),
            delete_refused: false,
            generation: Arc::default(),
        }
    }
}

/// The listings, and what they remember from one to the next.
struct Listings {
    /// A listing job is running.
    running: bool,
    /// When the listings read the table.
    scans: listing::Scans,
    /// When the next listing starts.
    next: Instant,
    /// Rows nobody held at the last listing (see [`NewRowRule::replaceable`]).
    replaceable: HashSet<String>,
    /// Listings in a row that found the stream deleted, once started.
    not_found: u32,
    /// Rows of shards the listing lacks, with when each was first found missing.
    unlisted: HashMap<String, Instant>,
    /// A delete was refused in a way retrying cannot fix (already said at warn level).
    delete_refused: bool,
    /// Each shard's starting sequence number as the last listing that read the table knew it
    /// ([`listing::generation_after`]; the shards are the same at a listing that did not):
    /// the stream's generation, which tells a deleted stream's rows from those of a stream
    /// created again in its name, and a shard created again after its rows were removed.
    generation: Arc<HashMap<String, String>>,
}

/// This instance among the others.
struct Instance {
    liveness: Liveness,
    worker: worker::WorkerRow,
    watch: roster::Watch,
    health: Health,
    /// The instances this one said it waits on (once each, until its share is full).
    waiting_on: HashSet<String>,
    /// In a liveness group: the epoch of the anchor gate this stream's shards are read in
    /// (the anchor row lost since, they are dropped before any is read again).
    group_epoch: u64,
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
            seeks,
            stopping,
            deleted,
        } = links;
        let health = Health::new(config.lease_duration * 3);
        let group_epoch = (config.group.as_ref()).map_or(0, |group| {
            group.join(&stream);
            group.gate().epoch()
        });
        Self {
            shared: Arc::new(Shared::new(api, store, stream, config, stopping)),
            inbox: Inbox::new(shutdown, seeks),
            outbox: Outbox {
                commands,
                done,
                deleted,
            },
            startup: Startup {
                started: StartingPoint::since(SystemTime::now()),
                shards: None,
                tell: Some(first_sync),
                pending: HashSet::new(),
                tips: HashMap::new(),
            },
            shards: Shards::default(),
            listings: Listings::default(),
            instance: Instance {
                liveness: Liveness::default(),
                worker: worker::WorkerRow::default(),
                watch: roster::Watch::default(),
                health,
                waiting_on: HashSet::new(),
                group_epoch,
            },
        }
    }

    fn config(&self) -> &SubscriptionConfig {
        &self.shared.config
    }

    pub(crate) async fn run(mut self) {
        let mut renew = interval(self.config().worker_renew_interval());
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            let next_listing = self.listings.next;
            let next_watch = self.instance.watch.next;
            tokio::select! {
                biased;
                changed = self.inbox.shutdown.changed() => {
                    if changed.is_err() || *self.inbox.shutdown.borrow() {
                        break;
                    }
                }
                Some(report) = self.inbox.reports.recv() => self.on_report(report),
                Some(event) = self.inbox.events.recv() => self.on_pump_end(event),
                Some(done) = self.inbox.jobs.next() => self.on_done(done),
                Some(request) = self.inbox.seeks.recv() => self.on_seek(request),
                _ = renew.tick() => self.keep_worker_row(),
                _ = sleep_until(next_listing), if !self.listings.running => self.start_listing(),
                _ = sleep_until(next_watch), if !self.instance.watch.busy => self.start_watch(),
            }
            if self
                .outbox
                .deleted
                .load(std::sync::atomic::Ordering::Acquire)
            {
                break;
            }
        }
        self.stop().await;
        if self
            .outbox
            .deleted
            .load(std::sync::atomic::Ordering::Acquire)
        {
            rows::forget_stream(&self.shared, &self.listings.generation).await;
        }
        // Only now does the subscription's stream end: a program that exits when its
        // pipeline ends has nothing left to write.
        let _ = self.outbox.commands.send(Command::Close);
        let _ = self.outbox.done.send(true);
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Listing(Ok(listing)) => self.on_listing(listing),
            Done::Listing(Err(failure)) => self.on_listing_failed(failure),
            Done::Take(shard, outcome, epoch) => self.on_take(shard, outcome, epoch),
            Done::Worker(done) => self.on_worker(done),
            Done::Deleted(results) => self.on_deleted(results),
            Done::Watched(read) => self.on_watched(read),
            Done::Declared(row, result) => self.on_declared(&row, result),
            Done::RosterMoved => self.on_roster_moved(),
            Done::Seek(opened) => self.on_seek_opened(*opened),
        }
    }
}
