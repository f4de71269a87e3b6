//! [`MultiSubscription`]: several streams read as one, their leases in one table.
//!
//! Each stream of the [`StreamSet`] gets a [`Subscription`] of its own (its leases, worker
//! rows and balancing are the stream's, keyed by stream and shard in the shared table); a
//! background task keeps them in step with the set, and the merged stream interleaves their
//! deliveries. Every record names its stream ([`Record::stream`]).
//!
//! | the set changes | what happens |
//! |---|---|
//! | a stream is inserted | it is started at once (within a listing interval when it does not exist yet) |
//! | a stream is removed | it stops gracefully: checkpoints flushed, leases released, rows kept |
//! | a stream is deleted in Kinesis | two listings in a row find it gone: its readers stop and its rows are removed |

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::group::LivenessGroup;
use super::ready::ReadyMap;
use super::{ShutdownHandle, Subscription, SubscriptionBuilder};
use crate::ack::Delivery;
use crate::api::SharedKinesis;
use crate::error::KinesisError;
use crate::lease::SharedLeaseStore;
use crate::position::KinesisPosition;
use crate::record::Record;

/// The streams a [`MultiSubscription`] reads: a shared, cloneable set. Inserting or removing
/// a name while the subscription runs starts or stops that stream.
#[derive(Clone)]
pub struct StreamSet {
    names: Arc<watch::Sender<BTreeSet<Arc<str>>>>,
}

impl fmt::Debug for StreamSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names.borrow().iter()).finish()
    }
}

impl StreamSet {
    /// A set of these stream names.
    pub fn new<S: Into<Arc<str>>>(names: impl IntoIterator<Item = S>) -> Self {
        let names = names.into_iter().map(Into::into).collect();
        Self {
            names: Arc::new(watch::Sender::new(names)),
        }
    }

    /// Adds a stream; false when it was in the set already.
    pub fn insert(&self, name: impl Into<Arc<str>>) -> bool {
        let name = name.into();
        self.names.send_if_modified(|names| names.insert(name))
    }

    /// Removes a stream; false when it was not in the set.
    pub fn remove(&self, name: &str) -> bool {
        self.names.send_if_modified(|names| names.remove(name))
    }

    /// The names in the set, in order.
    #[must_use]
    pub fn names(&self) -> Vec<String> {
        self.names.borrow().iter().map(|n| n.to_string()).collect()
    }
}

/// Builds a [`MultiSubscription`]: every setting of a [`SubscriptionBuilder`] applies to each
/// of its streams, except a position of one record
/// ([`KinesisPosition::sequence`], [`KinesisPosition::sub_sequence`]), which names a shard but
/// not its stream while the streams share shard ids: give it for its stream with
/// [`start_at_for`](Self::start_at_for) or
/// [`initial_position_for`](Self::initial_position_for).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
/// use std::sync::Arc;
/// use futures::StreamExt;
/// use kinesis_dataflow::{
///     KinesisPosition, MemoryKinesis, MemoryLeaseStore, MultiSubscription, StreamSet,
/// };
///
/// let kinesis = MemoryKinesis::new();
/// kinesis.add_stream("orders", 1)?;
/// kinesis.add_stream("payments", 1)?;
/// kinesis.put("payments", "customer-1", "paid")?;
///
/// let streams = StreamSet::new(["orders", "payments"]);
/// let mut all = MultiSubscription::builder(Arc::new(kinesis), Arc::new(MemoryLeaseStore::new()), streams)
///     .configure(|each| each.start_at(KinesisPosition::horizon()))
///     .start()
///     .await?;
/// let delivery = all.next().await.unwrap()?;
/// assert_eq!(delivery.stream(), Some("payments"));
/// delivery.ack();
/// all.shutdown().await;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until started"]
pub struct MultiSubscriptionBuilder {
    each: SubscriptionBuilder,
    streams: StreamSet,
    own: OwnPositions,
}

impl fmt::Debug for MultiSubscriptionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiSubscriptionBuilder")
            .field("streams", &self.streams)
            .field("each", &self.each.config)
            .field("own", &self.own)
            .finish()
    }
}

/// The positions given for one stream of the set, by stream name.
type OwnPositions = BTreeMap<Arc<str>, StreamPositions>;

/// The positions of one stream, in place of those every stream is configured with.
#[derive(Debug, Clone, Default)]
struct StreamPositions {
    start_at: Option<KinesisPosition>,
    initial_position: Option<KinesisPosition>,
}

impl MultiSubscriptionBuilder {
    /// Sets what every stream's subscription uses (owner, positions, intervals, limits, ...).
    /// `max_leases` and `capacity` apply to each stream on its own. A position of one record
    /// is refused here at [`start`](Self::start): give it with
    /// [`start_at_for`](Self::start_at_for) or
    /// [`initial_position_for`](Self::initial_position_for).
    pub fn configure(
        self,
        settings: impl FnOnce(SubscriptionBuilder) -> SubscriptionBuilder,
    ) -> Self {
        Self {
            each: settings(self.each),
            ..self
        }
    }

    /// [`start_at`](SubscriptionBuilder::start_at) for one stream of the set, in place of the
    /// one [`configure`](Self::configure) gives every stream: how a replay from one record
    /// ([`KinesisPosition::sequence`]) names its stream. It applies at each start of that
    /// stream, as `start_at` does (also once it is inserted into the set later, or created
    /// again).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
    /// use std::sync::Arc;
    /// use futures::StreamExt;
    /// use kinesis_dataflow::{
    ///     KinesisPosition, MemoryKinesis, MemoryLeaseStore, MultiSubscription, StreamSet,
    /// };
    ///
    /// let kinesis = MemoryKinesis::new();
    /// kinesis.add_stream("orders", 1)?;
    /// kinesis.add_stream("payments", 1)?;
    /// kinesis.put("payments", "customer-1", "paid")?;
    /// let (shard, seq) = kinesis.put("payments", "customer-1", "refunded")?;
    ///
    /// let streams = StreamSet::new(["orders", "payments"]);
    /// let mut all = MultiSubscription::builder(Arc::new(kinesis), Arc::new(MemoryLeaseStore::new()), streams)
    ///     // Both streams have a shard of this id: the position names the one of `payments`.
    ///     .start_at_for("payments", KinesisPosition::sequence(shard, seq))
    ///     .start()
    ///     .await?;
    /// let delivery = all.next().await.unwrap()?;
    /// assert_eq!(&delivery.data()[..], b"refunded");
    /// delivery.ack();
    /// all.shutdown().await;
    /// # Ok(()) }
    /// ```
    pub fn start_at_for(mut self, stream: impl Into<Arc<str>>, position: KinesisPosition) -> Self {
        self.own.entry(stream.into()).or_default().start_at = Some(position);
        self
    }

    /// [`initial_position`](SubscriptionBuilder::initial_position) for one stream of the set,
    /// in place of the one [`configure`](Self::configure) gives every stream: where that
    /// stream's shards that have no checkpoint yet begin, a record of it
    /// ([`KinesisPosition::sequence`]) included.
    pub fn initial_position_for(
        mut self,
        stream: impl Into<Arc<str>>,
        position: KinesisPosition,
    ) -> Self {
        self.own.entry(stream.into()).or_default().initial_position = Some(position);
        self
    }

    /// Refuses a position of one record among the settings every stream shares, and a
    /// position for one stream that the service would refuse.
    fn check_positions(&self) -> Result<(), KinesisError> {
        let shared = [
            ("start_at", &self.each.config.start_at),
            ("initial_position", &self.each.config.initial_position),
        ];
        for (setting, position) in shared {
            if let Some(position) = position.as_ref().filter(|p| p.shard().is_some()) {
                return Err(KinesisError::InvalidConfig {
                    setting,
                    value: format!("{position:?}"),
                    reason: format!(
                        "a position of one record names a shard but not its stream, and the \
                         streams of a MultiSubscription have shards of the same ids (every \
                         stream's first is shardId-000000000000): give it for its stream with \
                         `MultiSubscriptionBuilder::{setting}_for(stream, position)`"
                    ),
                });
            }
        }
        for (stream, own) in &self.own {
            let given = [
                ("start_at_for", &own.start_at),
                ("initial_position_for", &own.initial_position),
            ];
            for (setting, position) in given {
                if let Some((position, reason)) = position
                    .as_ref()
                    .and_then(|p| p.refusal().map(|reason| (p, reason)))
                {
                    return Err(KinesisError::InvalidConfig {
                        setting,
                        value: format!("{stream}: {position:?}"),
                        reason,
                    });
                }
            }
        }
        Ok(())
    }

    /// Starts a subscription for every stream in the set, and returns once each has taken its
    /// first shards (as [`SubscriptionBuilder::start`] does).
    ///
    /// # Errors
    ///
    /// A refused setting ([`KinesisError::InvalidConfig`]), and the first error of a stream
    /// that cannot be started (e.g. [`KinesisError::StreamNotFound`], naming it). Streams
    /// inserted later that do not exist yet are not errors: they start once they exist.
    pub async fn start(mut self) -> Result<MultiSubscription, KinesisError> {
        self.each.config.validate()?;
        self.check_positions()?;
        let names: Vec<Arc<str>> = self.streams.names.borrow().iter().cloned().collect();
        // One liveness group for every stream, anchored on the first (see `group`).
        if let Some(anchor) = names.first() {
            let give_up_after = self.each.config.worker_give_up_after();
            let group = LivenessGroup::new(anchor.clone(), give_up_after);
            self.each.config.group = Some(Arc::new(group));
        }
        let started = futures::future::join_all(
            names
                .iter()
                .map(|name| self.each.for_stream(name.clone(), &self.own).start()),
        )
        .await;
        let mut members = ReadyMap::new();
        let mut running = HashMap::new();
        let mut failed = None;
        for (name, result) in names.into_iter().zip(started) {
            match result {
                Ok(subscription) => {
                    running.insert(name.clone(), Member::of(&subscription));
                    members.insert(name, subscription);
                }
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        if let Some(e) = failed {
            for (_, member) in running {
                member.handle.shutdown().await;
            }
            return Err(e);
        }
        let (arrivals_tx, arrivals) = mpsc::unbounded_channel();
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let (done_tx, done_rx) = watch::channel(false);
        let owner = self.each.config.owner.clone();
        let keeper = Keeper {
            each: self.each,
            own: self.own,
            set: self.streams.names.subscribe(),
            running,
            reported: BTreeSet::new(),
            arrivals: arrivals_tx,
            shutdown: shutdown_rx,
            stopping: HashMap::new(),
        };
        let task = match keeper.each.runtime.clone() {
            Some(runtime) => runtime.spawn(keeper.run(done_tx)),
            None => tokio::spawn(keeper.run(done_tx)),
        };
        Ok(MultiSubscription {
            members,
            arrivals,
            closing: false,
            task: Some(task),
            handle: ShutdownHandle {
                shutdown: Arc::new(shutdown_tx),
                done: done_rx,
                stopping: Arc::new(AtomicBool::new(false)),
            },
            streams: self.streams,
            owner,
        })
    }
}

impl SubscriptionBuilder {
    /// This builder's settings for one stream of a [`MultiSubscription`], with the positions
    /// given for that stream (`own`) in place of the shared ones.
    fn for_stream(&self, stream: Arc<str>, own: &OwnPositions) -> Self {
        let mut each = self.clone();
        if let Some(own) = own.get(&stream) {
            if let Some(position) = &own.start_at {
                each.config.start_at = Some(position.clone());
            }
            if let Some(position) = &own.initial_position {
                each.config.initial_position = Some(position.clone());
            }
        }
        each.stream = stream;
        each.config.end_when_deleted = true;
        each
    }
}

/// What the background task tells the merged stream.
enum Arrival {
    /// A stream's subscription started.
    Started(Arc<str>, Box<Subscription>),
    /// An error to yield.
    Error(KinesisError),
}

/// A running stream, as the background task sees it.
struct Member {
    handle: ShutdownHandle,
    deleted: Arc<AtomicBool>,
}

impl Member {
    fn of(subscription: &Subscription) -> Self {
        Self {
            handle: subscription.shutdown_handle(),
            deleted: subscription.deleted.clone(),
        }
    }
}

/// The background task: keeps one subscription per stream of the set.
struct Keeper {
    each: SubscriptionBuilder,
    /// The positions given for one stream.
    own: OwnPositions,
    set: watch::Receiver<BTreeSet<Arc<str>>>,
    running: HashMap<Arc<str>, Member>,
    /// Streams whose failure to start was reported (once each).
    reported: BTreeSet<Arc<str>>,
    arrivals: mpsc::UnboundedSender<Arrival>,
    shutdown: watch::Receiver<bool>,
    /// Streams removed from the set whose stop is still under way. One is started again only
    /// once its stop is complete: two subscriptions of one stream with one owner id would
    /// write the same worker row, and the old one's stop would delete the new one's row.
    stopping: HashMap<Arc<str>, JoinHandle<()>>,
}

impl Keeper {
    async fn run(mut self, done: watch::Sender<bool>) {
        let every = self.each.config.list_interval;
        loop {
            tokio::select! {
                biased;
                changed = self.shutdown.changed() => {
                    if changed.is_err() || *self.shutdown.borrow() {
                        break;
                    }
                }
                () = self.arrivals.closed() => break,
                changed = self.set.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
                // A removed stream's stop ended: start it again at once if it is back.
                // (In a block: `select_all` of nothing panics, and a disabled branch's future
                // is still made.)
                _ = async { futures::future::select_all(self.stopping.values_mut()).await },
                    if !self.stopping.is_empty() => {}
                () = tokio::time::sleep(every) => {}
            }
            self.reconcile().await;
        }
        let members = std::mem::take(&mut self.running);
        futures::future::join_all(members.values().map(|m| m.handle.shutdown())).await;
        // Streams removed earlier finish their stops too before the merged stream ends.
        futures::future::join_all(self.stopping.drain().map(|(_, task)| task)).await;
        let _ = done.send(true);
    }

    /// Starts the streams of the set that are not running, and stops those that left it.
    async fn reconcile(&mut self) {
        let wanted: BTreeSet<Arc<str>> = self.set.borrow_and_update().clone();
        let deleted: Vec<Arc<str>> = (self.running.iter())
            .filter(|(_, member)| member.deleted.load(Ordering::Acquire))
            .map(|(name, _)| name.clone())
            .collect();
        for name in deleted {
            tracing::warn!(stream = %name, "stream deleted: its lease rows were removed; it is read again if created anew while in the set");
            // Said here; not reported again as a stream that cannot start.
            self.reported.insert(name);
        }
        self.running.retain(|_, member| !member.handle.is_stopped());
        let leaving: Vec<Arc<str>> = (self.running.keys())
            .filter(|name| !wanted.contains(*name))
            .cloned()
            .collect();
        for name in leaving {
            if let Some(member) = self.running.remove(&name) {
                tracing::info!(stream = %name, "stream removed from the set: stopping its readers");
                let stop = tokio::spawn(async move { member.handle.shutdown().await });
                self.stopping.insert(name, stop);
            }
        }
        self.stopping.retain(|_, stop| !stop.is_finished());
        self.reported.retain(|name| wanted.contains(name));
        for name in wanted {
            if *self.shutdown.borrow() {
                // Asked to stop meanwhile: start nothing more.
                return;
            }
            if self.stopping.contains_key(&name) {
                tracing::debug!(stream = %name, "stream inserted again while its stop runs: started once that is done");
            } else if !self.running.contains_key(&name) {
                self.start(name).await;
            }
        }
    }

    /// Starts one stream, when it exists; a failure is reported once, and tried again at the
    /// next round.
    ///
    /// A stop asked for meanwhile ends the start (its half-made subscription stops as a
    /// dropped start does), so a start that hangs cannot hold the stop; the existence check
    /// is bounded by the call timeout.
    async fn start(&mut self, name: Arc<str>) {
        let mut shutdown = self.shutdown.clone();
        let (each, own) = (&self.each, &self.own);
        let starting = async {
            let limit = each.config.call_timeout();
            match tokio::time::timeout(limit, each.api.describe_stream_summary(&name)).await {
                Ok(Ok(_)) => each.for_stream(name.clone(), own).start().await,
                Ok(Err(e)) => Err(e),
                Err(_) => Err(KinesisError::Service {
                    operation: crate::error::Operation::DescribeStreamSummary,
                    stream: name.to_string(),
                    message: format!("no answer within {limit:?}"),
                    source: None,
                }),
            }
        };
        let result = tokio::select! {
            biased;
            () = stop_asked(&mut shutdown) => return,
            result = starting => result,
        };
        match result {
            Ok(subscription) => {
                tracing::info!(stream = %name, "stream started");
                self.reported.remove(&name);
                self.running.insert(name.clone(), Member::of(&subscription));
                let _ = self
                    .arrivals
                    .send(Arrival::Started(name, Box::new(subscription)));
            }
            Err(e) => {
                tracing::debug!(stream = %name, error = %e, "stream not started; tried again at the next listing interval");
                if self.reported.insert(name) {
                    let _ = self.arrivals.send(Arrival::Error(e));
                }
            }
        }
    }
}

/// Resolves once a stop is asked for (or its sender is gone).
async fn stop_asked(shutdown: &mut watch::Receiver<bool>) {
    while !*shutdown.borrow_and_update() {
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}

/// Several streams' deliveries as one `Stream`, their leases in one table.
///
/// Each shard's records come in order; streams and shards are interleaved, and
/// [`Record::stream`] tells them apart. Items are `Err` as on a [`Subscription`], and when a
/// stream inserted into the set cannot be started (once per stream, until it starts). The
/// stream ends once a graceful stop of every stream is complete, as a [`Subscription`]'s does.
#[must_use = "streams do nothing unless polled"]
pub struct MultiSubscription {
    members: ReadyMap<Arc<str>, Subscription>,
    arrivals: mpsc::UnboundedReceiver<Arrival>,
    closing: bool,
    task: Option<JoinHandle<()>>,
    handle: ShutdownHandle,
    streams: StreamSet,
    owner: String,
}

impl fmt::Debug for MultiSubscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiSubscription")
            .field("owner", &self.owner)
            .field("streams", &self.streams)
            .field("running", &self.members.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl MultiSubscription {
    /// Starts building a subscription to every stream of `streams`, with leases in `store`.
    pub fn builder(
        api: SharedKinesis,
        store: SharedLeaseStore,
        streams: StreamSet,
    ) -> MultiSubscriptionBuilder {
        MultiSubscriptionBuilder {
            each: Subscription::builder(api, store, ""),
            streams,
            own: OwnPositions::new(),
        }
    }

    /// The owner id this instance holds leases as (the same for every stream).
    #[must_use]
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The set of streams: insert or remove names to start or stop streams.
    #[must_use]
    pub fn streams(&self) -> &StreamSet {
        &self.streams
    }

    /// The shards being read right now, as (stream, shard) pairs in order.
    #[must_use]
    pub fn shards(&self) -> Vec<(String, String)> {
        let mut shards: Vec<(String, String)> = (self.members.iter())
            .flat_map(|(stream, member)| {
                member
                    .shards()
                    .into_iter()
                    .map(move |shard| (stream.to_string(), shard))
            })
            .collect();
        shards.sort();
        shards
    }

    /// A handle that stops every stream gracefully from elsewhere.
    #[must_use]
    pub fn shutdown_handle(&self) -> ShutdownHandle {
        self.handle.clone()
    }

    /// Stops every stream gracefully (see [`ShutdownHandle::shutdown`]); deliveries already
    /// handed out can still be settled while this runs.
    pub async fn shutdown(&mut self) {
        self.handle.shutdown().await;
        self.members.clear();
        self.closing = true;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }

    /// Stops every stream at once, as a crashed process would (see [`Subscription::abort`]).
    pub fn abort(mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        let names: Vec<Arc<str>> = self.members.keys().cloned().collect();
        for name in names {
            if let Some(member) = self.members.take(&name) {
                member.abort();
            }
        }
        while let Ok(arrival) = self.arrivals.try_recv() {
            if let Arrival::Started(_, member) = arrival {
                member.abort();
            }
        }
    }
}

impl Drop for MultiSubscription {
    /// Dropping stops every stream gracefully in the background, as dropping a
    /// [`Subscription`] does.
    fn drop(&mut self) {
        if self.task.take().is_some() {
            let _ = self.handle.shutdown.send(true);
        }
    }
}

impl MultiSubscription {
    /// Takes every arrival so far, the waker registered with the channel once it is empty.
    /// `Err` carries what to yield now (an error, or the end); `Ok` tells whether any arrival
    /// was taken.
    fn take_arrivals(&mut self, cx: &mut Context<'_>) -> Result<bool, Option<DeliveryItem>> {
        let mut taken = false;
        loop {
            match self.arrivals.poll_recv(cx) {
                Poll::Ready(Some(Arrival::Started(name, member))) => {
                    self.members.insert(name, *member);
                    taken = true;
                }
                Poll::Ready(Some(Arrival::Error(e))) => return Err(Some(Err(e))),
                Poll::Ready(None) => {
                    self.closing = true;
                    self.members.clear();
                    return Err(None);
                }
                Poll::Pending => return Ok(taken),
            }
        }
    }
}

type DeliveryItem = Result<Delivery<Record>, KinesisError>;

impl Stream for MultiSubscription {
    type Item = DeliveryItem;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.closing {
            return Poll::Ready(None);
        }
        // Arrivals first when there are any. An empty channel is told apart cheaply; the
        // waker is registered with it only when no member has anything to yield, which is
        // when an arrival must wake this stream.
        if !this.arrivals.is_empty()
            && let Err(now) = this.take_arrivals(cx)
        {
            return Poll::Ready(now);
        }
        loop {
            // Once a stop began, the members yield nothing more and end as each one's stop
            // completes; this stream ends when the background task has stopped them all (the
            // arrivals channel closes).
            if let Poll::Ready(Some(item)) = this.members.poll_next_item(cx) {
                return Poll::Ready(Some(item));
            }
            // No member right now, or none with an item: an arrival wakes this stream too.
            match this.take_arrivals(cx) {
                Err(now) => return Poll::Ready(now),
                Ok(false) => return Poll::Pending,
                Ok(true) => {}
            }
        }
    }
}
