//! Subscriptions: every shard this instance holds, merged into one `Stream` of deliveries.
//!
//! | item | what it is |
//! |---|---|
//! | [`Subscription`] | the merged `Stream<Item = Result<Delivery<Record>, KinesisError>>` |
//! | [`SubscriptionBuilder`] | stream, lease store, owner, position, intervals |
//! | [`ShutdownHandle`] | stops a subscription gracefully from anywhere; [`ShutdownHandle::stop_on_signal`] on SIGINT or SIGTERM |
//! | [`MultiSubscription`] | several streams as one `Stream`, their leases in one table; [`StreamSet`] changes them while it runs |
//! | the `DEFAULT_*` constants | the settings' defaults |
//!
//! A background task (spawned on the current tokio runtime) lists the stream's shards every
//! `list_interval`, keeps one lease row per shard in the lease store, takes the leases nobody
//! holds (or whose holder stopped renewing), and starts a shard only after every parent is
//! read to its end and checkpointed as SHARD_END, at any depth of splits and merges. Each held
//! shard has a task of its own that renews its lease every third of `lease_duration` and
//! writes its checkpoint at most once per `checkpoint_interval`, so no other work (a long
//! listing, many takes, a slow lease table) can delay a renewal.
//!
//! Instances balance shards between them: each one records itself in the lease table, and an
//! instance holding more than its share hands the excess off gracefully (it stops reading,
//! waits for in-flight deliveries, writes the checkpoint, releases), so a shard is never read
//! by two instances at once while both are healthy.
//!
//! Stopping: [`Subscription::shutdown`] (or a [`ShutdownHandle`]) stops reading, waits up to
//! `shutdown_timeout` for in-flight deliveries to be settled, flushes checkpoints and releases
//! the leases, so another instance resumes exactly where this one stopped; the stream ends
//! once that is done. Dropping a
//! subscription starts the same graceful stop in the background (so `take(n)` and other
//! pipelines that drop the stream behave). [`Subscription::abort`] stops the way a crashed
//! process does: nothing is flushed or released, and the leases are taken over once they
//! expire.

mod bounded;
mod clock;
mod config;
mod coordinator;
mod gate;
mod group;
mod multi;
mod position_source;
mod pump;
mod ready;
mod seeker;
mod signal;

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use ready::ReadyMap;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

pub use clock::{Clock, TokioClock};
pub(crate) use config::SubscriptionConfig;
pub use config::{
    DEFAULT_CHECKPOINT_INTERVAL, DEFAULT_LEASE_DURATION, DEFAULT_LIST_INTERVAL,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_MAX_IN_FLIGHT_BYTES, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_WORKER_TIMEOUT, MAX_CAPACITY, MAX_DURATION,
};
pub use multi::{MultiSubscription, MultiSubscriptionBuilder, StreamSet};
pub use position_source::{
    PositionSource, PositionSourceError, PositionSourceFn, position_source_fn,
};
pub use seeker::SubscriptionSeeker;
pub use signal::{StopSignal, shutdown_signal};

use self::coordinator::{Command, Coordinator, Ends, Links};
use self::pump::ShardPump;
use crate::ack::Delivery;
use crate::api::SharedKinesis;
use crate::error::KinesisError;
use crate::lease::SharedLeaseStore;
use crate::lease::layer::LayeredStore;
use crate::position::KinesisPosition;
use crate::record::Record;
use crate::shard::ReadSettings;

/// Builds a [`Subscription`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
/// use std::sync::Arc;
/// use std::time::Duration;
/// use futures::StreamExt;
/// use kinesis_dataflow::{KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription};
///
/// let kinesis = MemoryKinesis::new();
/// kinesis.add_stream("orders", 2)?;
/// kinesis.put("orders", "customer-1", "first order")?;
///
/// let mut orders = Subscription::builder(Arc::new(kinesis), Arc::new(MemoryLeaseStore::new()), "orders")
///     .start_at(KinesisPosition::horizon())
///     .start()
///     .await?;
/// let delivery = orders.next().await.unwrap()?;
/// assert_eq!(&delivery.data()[..], b"first order");
/// delivery.ack();
/// orders.shutdown().await;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until started"]
#[derive(Clone)]
pub struct SubscriptionBuilder {
    api: SharedKinesis,
    store: SharedLeaseStore,
    stream: Arc<str>,
    config: SubscriptionConfig,
    runtime: Option<tokio::runtime::Handle>,
}

impl fmt::Debug for SubscriptionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SubscriptionBuilder")
            .field("stream", &self.stream)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A fresh owner id: host name, process id and a random suffix.
fn default_owner() -> String {
    let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_owned());
    format!(
        "{host}-{}-{:08x}",
        std::process::id(),
        crate::jitter::unpredictable() as u32
    )
}

impl SubscriptionBuilder {
    /// The `application` label of this subscription's metrics and a field of its tracing
    /// span (default `kinesis-dataflow`; [`Subscription::aws`] sets the application it is
    /// given). Names what the dashboards and logs group by; it changes nothing else.
    pub fn application(mut self, name: impl Into<Arc<str>>) -> Self {
        self.config.application = name.into();
        self
    }

    /// The id this instance holds leases as (default: host, pid and a random suffix). Give
    /// each instance its own.
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.config.owner = owner.into();
        self
    }

    /// Where the shards the subscription opens with start, ahead of their checkpoints: every
    /// start replays from here what those shards hold (the spec's `start_at`). The shards a
    /// start opens with are the unfinished ones this instance takes at its first listing; a
    /// shard already read to its end (its row says SHARD_END) is not read again, so after a
    /// finished split `horizon()` replays the children from their beginning but not their
    /// parent (a warning at the start names such shards; the command-line tool's `reset`
    /// replays a whole tree). Shards opened later (children, takeovers, shards another
    /// instance held) resume from their checkpoints. Also where shards nobody has read yet
    /// begin, unless [`initial_position`](Self::initial_position) says otherwise. A position of one
    /// record the service would refuse (a malformed sequence number or shard id) fails
    /// [`start`](Self::start) with [`KinesisError::InvalidConfig`], as it does for
    /// `initial_position`, and so does one naming a shard the stream does not list; one
    /// naming a shard this start does not open (another instance reads it, it is finished, a
    /// parent of it is not) is said in a warning.
    pub fn start_at(mut self, position: KinesisPosition) -> Self {
        self.config.start_at = Some(position);
        self
    }

    /// Where shards that have no checkpoint yet begin (the KCL's initial position): the first
    /// start of an application reads from here, and every later start resumes from the
    /// checkpoints, so a redeploy replays nothing. Without it (and without `start_at`), shards
    /// nobody has read begin at the tip.
    ///
    /// | setting | shards with a checkpoint | shards without one |
    /// |---|---|---|
    /// | neither | resume after it | the tip (LATEST) |
    /// | `initial_position(p)` | resume after it | `p` |
    /// | `start_at(p)` | `p`, at every start (the unfinished shards it opens with) | `p` |
    pub fn initial_position(mut self, position: KinesisPosition) -> Self {
        self.config.initial_position = Some(position);
        self
    }

    /// How each shard is read.
    pub fn read_settings(mut self, settings: ReadSettings) -> Self {
        self.config.read = settings;
        self
    }

    /// How often the shards are listed (default 10 s).
    pub fn list_interval(mut self, every: Duration) -> Self {
        self.config.list_interval = every;
        self
    }

    /// How long a lease lives without renewal before others may take it (default 10 s).
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.config.lease_duration = duration;
        self
    }

    /// How long this instance's worker row may go unchanged before the other instances
    /// declare it gone and take all its shards at once (default 4 s; at most the lease
    /// duration, which a longer value is cut to). It bounds the takeover after a crash: about
    /// this long, plus a watch read. The worker row is renewed every third of it (one write
    /// per instance, whatever its shards), and every reader of the instance stops handing out
    /// records once the row has gone unrenewed for two thirds of it, before anyone may take
    /// its shards: a frozen instance that resumes ships nothing another already took. Shard
    /// leases keep `lease_duration`; an instance without a worker row is judged by its leases.
    pub fn worker_timeout(mut self, timeout: Duration) -> Self {
        self.config.worker_timeout = timeout;
        self
    }

    /// The most shards this instance reads at once (default: no bound). The other instances
    /// read the rest: shares are computed from every instance's bounds and capacities, which
    /// each records in its worker row. Shards beyond what the whole fleet may hold are left
    /// unread (a warning says so) until an instance with room joins.
    pub fn max_leases(mut self, shards: u32) -> Self {
        self.config.limits.max_leases = Some(shards);
        self
    }

    /// This instance's share relative to the others' (default 1, at most
    /// [`MAX_CAPACITY`]): an instance of capacity 2 reads
    /// about twice as many shards as one of capacity 1, say on a host with twice the cores.
    pub fn capacity(mut self, weight: u32) -> Self {
        self.config.limits.weight = weight;
        self
    }

    /// The most frequent checkpoint write per shard (default 5 s).
    pub fn checkpoint_interval(mut self, every: Duration) -> Self {
        self.config.checkpoint_interval = every;
        self
    }

    /// How long a graceful stop or hand-off waits for in-flight deliveries (default 10 s).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.config.shutdown_timeout = timeout;
        self
    }

    /// How many deliveries of one shard may be unsettled before its reader pauses
    /// (default 10,000).
    pub fn max_in_flight(mut self, deliveries: usize) -> Self {
        self.config.max_in_flight = deliveries;
        self
    }

    /// How many bytes of record data of one shard may be unsettled before its reader pauses
    /// (default 64 MiB), beside [`max_in_flight`](Self::max_in_flight). A record always
    /// passes when nothing of its shard is in flight, so a record larger than the bound is
    /// still delivered, alone.
    pub fn max_in_flight_bytes(mut self, bytes: usize) -> Self {
        self.config.max_in_flight_bytes = bytes;
        self
    }

    /// What a delivery dropped unsettled in the ordinary course becomes: passed by the
    /// checkpoint as dropped (the default: what makes `filter` work), or, with `true`, sent
    /// back for redelivery like [`Delivery::retry`](crate::Delivery::retry), so nothing is
    /// ever skipped without an explicit [`skip`](crate::Delivery::skip). With it on, filter
    /// with [`DeliveryStreamExt`](crate::ack::DeliveryStreamExt), whose adaptors skip what
    /// they filter out. Drops by a panic or after the subscription stopped are never passed,
    /// whatever this says (see the [`ack`](crate::ack) module).
    pub fn redeliver_dropped(mut self, on: bool) -> Self {
        self.config.redeliver_dropped = on;
        self
    }

    /// How many times a record is delivered before it is dead-lettered: a record sent back
    /// (`retry`, `fail`, a panic, a redelivered drop, a [`settle_within`](Self::settle_within)
    /// deadline) on its `n`-th delivery goes to the
    /// [`dead_letters`](Self::dead_letters) destination instead of being delivered again. The
    /// shard waits until the dead letter is written (retried until it is), then the
    /// checkpoint passes the record, so a key's later records still come after it. Attempts
    /// are counted in this process: a hand-off or a restart starts over. Needs
    /// `dead_letters`; unset (the default), records are delivered again without limit.
    pub fn max_attempts(mut self, n: u32) -> Self {
        self.config.max_attempts = Some(n);
        self
    }

    /// A deadline for settling each delivery (unset by default: a delivery may stay out as
    /// long as it likes). A delivery not settled `within` of being handed out is taken back:
    /// it counts as a failed attempt ("not settled within ..") and is delivered again before
    /// any later record of its shard, or past [`max_attempts`](Self::max_attempts)
    /// dead-lettered. Whatever the timed-out delivery does afterwards (an `ack`, a `retry`, a
    /// drop) is ignored, so a record forgotten in a buffer cannot stall its shard for good,
    /// and one whose handler hangs cannot settle it after it was taken back. Choose it well
    /// above the slowest normal processing time: a delivery taken back while its work is
    /// still running is processed twice.
    pub fn settle_within(mut self, within: Duration) -> Self {
        self.config.settle_within = Some(within);
        self
    }

    /// Where dead letters go (see [`max_attempts`](Self::max_attempts) and
    /// [`Delivery::dead_letter`](crate::Delivery::dead_letter)): another stream through a
    /// [`Publisher`](crate::Publisher), or your code through
    /// [`dead_letters_fn`](crate::ack::dead_letters_fn).
    pub fn dead_letters(mut self, destination: impl crate::ack::DeadLetters + 'static) -> Self {
        self.config.dead_letters = Some(Arc::new(destination));
        self
    }

    /// The application's own record of where each shard stands, asked when a shard is
    /// taken: a shard opens right after the source's position when that is ahead of the
    /// lease table's checkpoint. For sinks that store each record's effect and its
    /// [`position`](crate::Delivery::position) in one transaction: see [`PositionSource`]
    /// for the contract.
    pub fn position_source(mut self, source: impl PositionSource + 'static) -> Self {
        self.config.position_source = Some(Arc::new(source));
        self
    }

    /// The runtime the background task runs on (default: the runtime `start` is called on).
    /// Give the runtime that outlives the caller when `start` runs on a short-lived one.
    pub fn runtime(mut self, handle: tokio::runtime::Handle) -> Self {
        self.runtime = Some(handle);
        self
    }

    /// The clock lease expiry is judged by (default: the tokio clock). Only differences on
    /// this clock matter, so a host whose clock is off cannot steal live leases.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.config.clock = clock;
        self
    }

    /// Checks the settings, prepares the lease store (creating its table when missing),
    /// starts the background task on the current tokio runtime, and returns once the first
    /// listing has taken this instance's shards and fixed where each starts (their first
    /// iterators are fetched), so a record written after `start` returns is not missed.
    ///
    /// A first listing that fails in a way retrying cannot fix (the stream does not exist,
    /// ListShards is denied) fails `start`. A transient failure (of ListShards, the lease
    /// table, a take) is reported on the stream and retried within a second; `start` returns
    /// meanwhile, and the shards it opens later begin at the time `start` was called, so
    /// nothing written after it returned is missed either way.
    ///
    /// # Errors
    ///
    /// [`KinesisError::InvalidConfig`] for a refused setting,
    /// [`KinesisError::LeaseStore`] when the lease table cannot be prepared, and the first
    /// listing's error when it cannot succeed (e.g. [`KinesisError::StreamNotFound`]).
    pub async fn start(mut self) -> Result<Subscription, KinesisError> {
        self.config.validate()?;
        self.store.prepare().await?;
        if let Some(consumer) = self.config.read.fan_out_consumer() {
            // Registered (or found) once, for every reader of the subscription.
            let registered =
                crate::shard::register_consumer(self.api.as_ref(), &self.stream, consumer).await?;
            self.config.consumer_arn = Some(registered.consumer_arn);
        }
        let (links, ends) = Links::new();
        let owner = self.config.owner.clone();
        let span = tracing::info_span!(
            "subscription",
            application = %self.config.application,
            stream = %self.stream,
            owner = %owner
        );
        let aborted = Arc::new(AtomicBool::new(false));
        let timeout = bounded::CallTimeout {
            limit: self.config.call_timeout(),
            aborted: aborted.clone(),
        };
        let store: SharedLeaseStore = Arc::new(LayeredStore::new(self.store, timeout));
        let stream = self.stream.clone();
        let stop_within = self.config.call_timeout() * 3;
        let coordinator = Coordinator::new(self.api, store, stream, self.config, links);
        let run = tracing::Instrument::instrument(coordinator.run(), span.clone());
        let task = match &self.runtime {
            Some(runtime) => runtime.spawn(run),
            None => tokio::spawn(run),
        };
        let started = Started {
            task,
            stream: self.stream,
            owner,
            aborted,
            stop_within,
        };
        let subscription = Subscription::started(ends, started).await?;
        let held = subscription.shards.len();
        span.in_scope(|| {
            tracing::info!(
                shards = held,
                "subscription started (shards held now; others follow as the instances balance)"
            );
        });
        Ok(subscription)
    }
}

/// What [`SubscriptionBuilder::start`] started, for the subscription to hold.
struct Started {
    task: JoinHandle<()>,
    stream: Arc<str>,
    owner: String,
    aborted: Arc<AtomicBool>,
    /// How long a start that failed waits for the stop it began (the instance's rows
    /// removed) before it returns its error.
    stop_within: Duration,
}

/// Stops a subscription gracefully; cloneable, usable from any task.
#[derive(Debug, Clone)]
pub struct ShutdownHandle {
    shutdown: Arc<watch::Sender<bool>>,
    done: watch::Receiver<bool>,
    /// Read by every shard's ledger: drops from now on are abandoned.
    stopping: Arc<AtomicBool>,
}

impl ShutdownHandle {
    /// Stops reading, waits (up to the shutdown timeout) for in-flight deliveries to be
    /// settled, flushes checkpoints and releases the leases. Returns when that is done.
    /// Deliveries must keep being settled meanwhile, so run it beside the pipeline.
    ///
    /// From the moment it is called, a delivery dropped without being settled is abandoned
    /// (read again by the shard's next reader), not passed: settle what the pipeline filters
    /// out explicitly, or the records after it are delivered again after a restart.
    pub async fn shutdown(&self) {
        self.request();
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }

    /// Asks the subscription to stop, without waiting.
    fn request(&self) {
        self.stopping.store(true, Ordering::Release);
        let _ = self.shutdown.send(true);
    }

    /// True once the subscription has stopped (its checkpoints flushed and leases released,
    /// or its task ended).
    #[must_use]
    pub fn is_stopped(&self) -> bool {
        *self.done.borrow() || self.shutdown.is_closed()
    }
}

/// Every shard this instance holds, as one `Stream` of deliveries.
///
/// Each shard's records come in order; shards are interleaved. Items are `Err` when a read
/// failed (the reader retries on its own) or a shard listing failed, and for KPL-aggregated
/// records (settled as skipped automatically).
///
/// **Stopping.** Once a graceful stop begins ([`ShutdownHandle::shutdown`], a dropped
/// subscription, or a signal through [`ShutdownHandle::stop_on_signal`]), the stream
/// yields nothing more but keeps running until the stop is complete: the deliveries already
/// handed out are settled (up to the shutdown timeout), the final checkpoints written, the
/// leases released and this instance's worker row deleted. Only then does it end. So a program
/// that exits when its pipeline ends leaves nothing behind, whatever sits in between. The stop
/// takes at most the shutdown timeout plus one lease-store call timeout (a third of the lease
/// duration); past that it logs what it abandoned and ends anyway. An adaptor that holds
/// deliveries until its source ends (`chunks(n)` with a part-filled chunk) holds them past that
/// wait: they are redelivered after the restart, so batch with a time bound instead
/// ([`DeliveryStreamExt::batches_by_shard`](crate::ack::DeliveryStreamExt::batches_by_shard),
/// `ready_chunks`).
#[must_use = "streams do nothing unless polled"]
pub struct Subscription {
    // Polls only the shards that can yield: an idle shard costs nothing per record.
    shards: ReadyMap<Arc<str>, ShardPump>,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Errors announced before the stream was first polled, yielded first.
    early: VecDeque<KinesisError>,
    closing: bool,
    task: Option<JoinHandle<()>>,
    handle: ShutdownHandle,
    seeker: SubscriptionSeeker,
    stream: Arc<str>,
    owner: String,
    /// Set when the stream was found deleted and the subscription ended for it.
    deleted: Arc<AtomicBool>,
    /// Set by [`abort`](Self::abort): the lease store refuses every call from then on.
    aborted: Arc<AtomicBool>,
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("stream", &self.stream)
            .field("owner", &self.owner)
            .field("shards", &self.shards.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl Subscription {
    /// The subscription over a coordinator that was `started`, once its first listing has
    /// taken its shards and fixed where each starts: a record written after `start` returns
    /// is then never missed by a LATEST start.
    async fn started(ends: Ends, started: Started) -> Result<Self, KinesisError> {
        let Ends {
            commands,
            shutdown,
            done,
            first_sync,
            seeks,
            stopping,
            deleted,
        } = ends;
        let shutdown = Arc::new(shutdown);
        if let Ok(Some(e)) = first_sync.await {
            // The first listing failed in a way retrying cannot fix: stop and say why, once
            // the stop removed this instance's rows (a program that gives up at once leaves
            // nothing held), or after a few call timeouts.
            let _ = shutdown.send(true);
            let _ = tokio::time::timeout(started.stop_within, started.task).await;
            return Err(e);
        }
        let mut subscription = Subscription {
            shards: ReadyMap::new(),
            commands,
            early: VecDeque::new(),
            closing: false,
            task: Some(started.task),
            handle: ShutdownHandle {
                shutdown,
                done,
                stopping,
            },
            seeker: SubscriptionSeeker::new(seeks, started.stream.clone()),
            stream: started.stream,
            owner: started.owner,
            deleted,
            aborted: started.aborted,
        };
        // The shards the first listing took are announced already: hold them now, so
        // `shards()` lists them as soon as `start` returns.
        subscription.apply_announced();
        Ok(subscription)
    }

    /// Starts building a subscription to `stream`, with leases in `store`.
    pub fn builder(
        api: SharedKinesis,
        store: SharedLeaseStore,
        stream: impl Into<Arc<str>>,
    ) -> SubscriptionBuilder {
        SubscriptionBuilder {
            api,
            store,
            stream: stream.into(),
            config: SubscriptionConfig::new(default_owner()),
            runtime: None,
        }
    }

    /// Starts building a subscription on AWS (or whatever the SDK configuration points at),
    /// with the default lease store: a DynamoDB table named after `application`
    /// ([`DynamoLeaseStore::default_table_name`](crate::lease::DynamoLeaseStore::default_table_name)),
    /// created when missing. Several streams may share one table.
    ///
    /// # Errors
    ///
    /// [`KinesisError::LeaseStore`] when the derived table name is refused.
    pub fn aws(
        config: &aws_config::SdkConfig,
        application: &str,
        stream: impl Into<Arc<str>>,
    ) -> Result<SubscriptionBuilder, KinesisError> {
        crate::api::aws::require_region(config)?;
        let table = crate::lease::DynamoLeaseStore::default_table_name(application);
        let store = crate::lease::DynamoLeaseStore::from_conf(config, table)?;
        Ok(Self::builder(
            Arc::new(crate::api::AwsKinesis::from_conf(config)),
            Arc::new(store),
            stream,
        )
        .application(application))
    }

    /// The owner id this instance holds leases as.
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The shards being read right now.
    #[must_use]
    pub fn shards(&self) -> Vec<String> {
        let mut shards: Vec<String> = self.shards.keys().map(|k| k.to_string()).collect();
        shards.sort();
        shards
    }

    /// A handle that moves this subscription to another position while it runs.
    #[must_use]
    pub fn seeker(&self) -> SubscriptionSeeker {
        self.seeker.clone()
    }

    /// A handle that stops this subscription gracefully from elsewhere.
    #[must_use]
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Stops gracefully: see [`ShutdownHandle::shutdown`]. Deliveries already handed out can
    /// still be settled while this runs.
    pub async fn shutdown(&mut self) {
        self.handle.shutdown().await;
        self.shards.clear();
        self.closing = true;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Stops at once, as a crashed process would: nothing is flushed or released, and the
    /// leases are taken over by other instances once they expire. Deliveries already handed out
    /// are redelivered from the last written checkpoint.
    pub fn abort(mut self) {
        // First: whatever still runs a moment (the keepers, a job, the loop until it is
        // cancelled, which the pumps dropped next would wake) writes nothing more.
        self.aborted.store(true, Ordering::Release);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Applies the commands already sent, keeping their errors for the stream.
    fn apply_announced(&mut self) {
        while let Ok(command) = self.commands.try_recv() {
            if let Some(e) = self.apply(command) {
                self.early.push_back(e);
            }
        }
    }

    /// Applies every command sent so far, the waker registered with the channel once it is
    /// empty. Returns the first error to yield, and whether any command was applied (or the
    /// channel found closed).
    fn apply_commands(&mut self, cx: &mut Context<'_>) -> (Option<KinesisError>, bool) {
        let mut applied = false;
        loop {
            match self.commands.poll_recv(cx) {
                Poll::Ready(Some(command)) => {
                    applied = true;
                    if let Some(e) = self.apply(command) {
                        return (Some(e), true);
                    }
                }
                Poll::Ready(None) => {
                    self.closing = true;
                    return (None, true);
                }
                Poll::Pending => return (None, applied),
            }
        }
    }

    fn apply(&mut self, command: Command) -> Option<KinesisError> {
        match command {
            Command::Add(shard, pump) => {
                self.shards.insert(Arc::from(shard), *pump);
            }
            Command::Remove(shard) => {
                self.shards.remove(shard.as_str());
            }
            Command::Error(e) => return Some(e),
            // The stop began: nothing more is read, but the stream ends only once the stop
            // is complete, so a pipeline (and a program) ending with it has nothing left to do.
            Command::Stop => self.shards.clear(),
            Command::Close => {
                self.closing = true;
                self.shards.clear();
            }
        }
        None
    }
}

impl Drop for Subscription {
    /// Dropping a running subscription stops it gracefully in the background: reading stops,
    /// in-flight deliveries get up to the shutdown timeout, checkpoints are flushed and the
    /// leases released. Await [`ShutdownHandle::shutdown`] to know when that is done.
    fn drop(&mut self) {
        // Whatever the pipeline still holds is dropped next: abandon it, never pass it.
        self.handle.stopping.store(true, Ordering::Release);
        if self.task.take().is_some() {
            let _ = self.handle.shutdown.send(true);
        }
    }
}

impl Stream for Subscription {
    type Item = Result<Delivery<Record>, KinesisError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(e) = this.early.pop_front() {
            return Poll::Ready(Some(Err(e)));
        }
        // Commands first, so none is passed by a delivery. An empty channel is told apart
        // cheaply; the waker is registered with it only when this stream has nothing to
        // yield, which is when a command must wake it.
        if !this.commands.is_empty()
            && let (Some(e), _) = this.apply_commands(cx)
        {
            return Poll::Ready(Some(Err(e)));
        }
        loop {
            if this.closing {
                return Poll::Ready(None);
            }
            if let Poll::Ready(Some(item)) = this.shards.poll_next_item(cx) {
                return Poll::Ready(Some(item));
            }
            // No shard right now, or none with a record: a command wakes this stream too.
            match this.apply_commands(cx) {
                (Some(e), _) => return Poll::Ready(Some(Err(e))),
                (None, false) => return Poll::Pending,
                (None, true) => {}
            }
        }
    }
}
