//! Collection: publishes from many tasks share PutRecords calls ([`Publisher::collect`]).
//!
//! A collecting publisher shares *calls*, not publishes. Each publish runs its own rounds
//! (the retries, waits and ordering rule of the [module docs](super)) in the task that awaits
//! it, as without collection, and hands each call of its rounds (the records it chose for
//! the call, checked) to a background task: one per publisher and tokio runtime it publishes
//! from, started there at the runtime's first publish (a publish never waits on a runtime
//! that is not running). The task fills a *batch* with whole calls in arrival order until it
//! holds a call's worth ([`max_records_per_call`](Publisher::max_records_per_call) or
//! [`max_bytes_per_call`](Publisher::max_bytes_per_call)) or half of the records outstanding
//! (handed over and not answered yet; with two or more call slots), or the
//! [`Collect::linger`] time since the batch's first call has passed, then sends it as one
//! PutRecords call, up to [`Collect::max_calls_in_flight`] at once, and gives each publish
//! the results of its own entries. While every slot is taken the batch keeps filling. A call
//! that fills a PutRecords call by itself gains nothing from sharing one: it goes out from
//! the publish's own task.
//!
//! So a publish returns once its own records are stored (or it gives up on them), whatever
//! the other publishes of its calls wait for: records turned away by a shard over its write
//! limit wait in their own publish's rounds, and their retries go into later batches, while
//! the call slots keep going to whatever comes. Publishes running concurrently have no order
//! between them: with [`KeyOrder::Strict`](super::KeyOrder::Strict) one call may carry
//! records of one partition key from several publishes, and a record of one publish never
//! waits for (or fails with) a record of another. A publish whose future is dropped stops, as
//! without collection: it makes no more rounds, and a call of it whose batch has not gone yet
//! is not sent (a call already on its way cannot be called back).
//!
//! Why half: callers that each await their publish have only so many records outstanding. In
//! one call, all of them wait for its answer and nothing else moves; in two calls of half,
//! the second is in the service while the first one's callers publish again, which keeps both
//! sides busy.
//!
//! With an aggregating publisher the task collects whole publishes instead: their user
//! records are packed into aggregates together (an aggregate holds records of many
//! publishes), so the task runs the batch's rounds, as one publish, and each publish returns
//! when its batch is done (and a batch keeps its call slot until then), with its own records'
//! answer. A publish dropped before its batch goes is not sent, and a batch stops once every
//! publish of it is dropped; but while another publish of it waits, it goes on with the
//! records of a dropped one too, and a `warn` event says when some of them were stored. There the batch is bounded by a call's bytes only: fewer and fuller records are
//! the point.
//!
//! [`Publisher::collect`]: super::Publisher::collect
//! [`Publisher`]: super::Publisher

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};

use super::Publisher;
use super::aggregate::{Aggregate, SharedMap};
use super::plan::CallLimits;
use super::split::split;
use crate::api::{PutRecordsEntry, PutRecordsOutput};
use crate::error::KinesisError;
use crate::record::{OutgoingRecord, Published};

/// The default [`Collect::linger`]: none (a batch goes as soon as a call slot is free).
pub const DEFAULT_LINGER: Duration = Duration::ZERO;
/// The linger of an aggregating publisher without [`Collect`] settings of its own (see
/// [`Publisher::aggregate`](super::Publisher::aggregate)): 10 ms.
pub const DEFAULT_AGGREGATION_LINGER: Duration = Duration::from_millis(10);
/// The default [`Collect::max_calls_in_flight`]: 4.
pub const DEFAULT_CALLS_IN_FLIGHT: usize = 4;

/// How a publisher collects concurrent publishes into shared PutRecords calls (see
/// [`Publisher::collect`](super::Publisher::collect)).
///
/// | setting | default |
/// |---|---|
/// | [`linger`](Self::linger) | 0: publishes share calls while every call slot is taken |
/// | [`max_calls_in_flight`](Self::max_calls_in_flight) | 4 |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collect {
    linger: Duration,
    calls_in_flight: usize,
}

impl Default for Collect {
    fn default() -> Self {
        Self {
            linger: DEFAULT_LINGER,
            calls_in_flight: DEFAULT_CALLS_IN_FLIGHT,
        }
    }
}

impl Collect {
    /// How long a batch waits, from its first call (or publish, when aggregating), for more
    /// before it is sent (unless it fills first): the most each call of a publish is delayed
    /// by. At most 10 s.
    ///
    /// With 0 (the default) a batch takes the calls waiting (up to half of the records
    /// outstanding) and goes as soon as a call slot is free, so the load sets the batch size:
    /// a lone publish goes at once, and while every slot is taken the publishes arriving
    /// meanwhile fill the next call. Measured with 64 tasks each awaiting one publish after
    /// another (BENCHMARKS.md), a linger of 1 ms already cost a third of the throughput and
    /// 5 ms more than half: every round of the 64 waited it out. A linger pays off when
    /// publishes trickle in and fuller calls matter more than latency, e.g. when aggregating
    /// under a shard's limit of 1,000 records a second.
    #[must_use]
    pub fn linger(mut self, linger: Duration) -> Self {
        self.linger = linger;
        self
    }

    /// How many batches (PutRecords calls; with aggregation, batches of publishes until
    /// they are done) may be on their way at once (1 to 64): more keeps the stream busy under
    /// load, fewer makes bigger calls.
    #[must_use]
    pub fn max_calls_in_flight(mut self, calls: usize) -> Self {
        self.calls_in_flight = calls;
        self
    }

    /// Checks both settings; the error names the setting and the refused value.
    pub(crate) fn validate(&self) -> Result<(), KinesisError> {
        if self.linger > Duration::from_secs(10) {
            return Err(KinesisError::InvalidConfig {
                setting: "Collect::linger",
                value: format!("{:?}", self.linger),
                reason: "at most 10 s: every publish may wait this long".into(),
            });
        }
        if !(1..=64).contains(&self.calls_in_flight) {
            return Err(KinesisError::InvalidConfig {
                setting: "Collect::max_calls_in_flight",
                value: self.calls_in_flight.to_string(),
                reason: "1 to 64 batches at once".into(),
            });
        }
        Ok(())
    }
}

/// Work handed to the collector: one PutRecords call's worth of records.
struct Request {
    work: Work,
    /// How many records, and their bytes (data and partition keys).
    records: usize,
    bytes: usize,
    /// Its records counted as outstanding until it is answered or lost.
    _counted: Outstanding,
}

/// Where the results of a call's entries go.
type CallAnswer = oneshot::Sender<Result<PutRecordsOutput, KinesisError>>;
/// Where a whole publish's answer goes.
type PublishAnswer = oneshot::Sender<Result<Vec<Published>, KinesisError>>;

/// What a [`Request`] carries, and where its answer goes.
enum Work {
    /// The entries of one call of a publish's round (the publish runs its rounds itself):
    /// answered with the results of these entries, or the error of the shared call.
    Call {
        entries: Vec<PutRecordsEntry>,
        answer: CallAnswer,
    },
    /// A whole publish whose user records are packed into aggregates with those of the
    /// others (an aggregate mixes publishes, so the collector runs the rounds): answered with
    /// the places of its records, or an error about them.
    Publish {
        records: Vec<OutgoingRecord>,
        answer: PublishAnswer,
    },
}

impl Work {
    /// Whether the publish it belongs to was dropped (nothing awaits the answer).
    fn dropped(&self) -> bool {
        match self {
            Self::Call { answer, .. } => answer.is_closed(),
            Self::Publish { answer, .. } => answer.is_closed(),
        }
    }
}

/// Records counted in a collector's outstanding total while this lives: a request lost with
/// a runtime that shut down stops counting too.
struct Outstanding {
    total: Arc<AtomicUsize>,
    records: usize,
}

impl Outstanding {
    fn new(total: &Arc<AtomicUsize>, records: usize) -> Self {
        total.fetch_add(records, Ordering::Relaxed);
        Self {
            total: total.clone(),
            records,
        }
    }
}

impl Drop for Outstanding {
    fn drop(&mut self) {
        self.total.fetch_sub(self.records, Ordering::Relaxed);
    }
}

/// A publisher's way to its collecting task (shared by its clones).
pub(crate) struct Collector {
    settings: Collect,
    /// Set when user records are packed into aggregates: how, and the shard map.
    aggregation: Option<(Aggregate, Arc<SharedMap>)>,
    /// Records handed over and not answered yet (queued, batched or in a call on its way).
    outstanding: Arc<AtomicUsize>,
    /// The collecting task's queue on each tokio runtime publishes came from.
    queues: Mutex<Vec<(tokio::runtime::Id, mpsc::UnboundedSender<Request>)>>,
}

impl Collector {
    pub(crate) fn new(settings: Collect, aggregate: Option<Aggregate>) -> Self {
        Self {
            settings,
            aggregation: aggregate.map(|a| (a, Arc::default())),
            outstanding: Arc::default(),
            queues: Mutex::new(Vec::new()),
        }
    }

    pub(crate) fn settings(&self) -> Collect {
        self.settings
    }

    pub(crate) fn aggregate(&self) -> Option<Aggregate> {
        self.aggregation.as_ref().map(|(a, _)| *a)
    }

    /// Makes the PutRecords call of `entries` (of `bytes` bytes; one call's worth of a round
    /// of `publisher`, which collects) in the next batch, shared with the calls of other
    /// publishes; answers the results of these entries.
    pub(crate) async fn put(
        &self,
        publisher: &Publisher,
        entries: Vec<PutRecordsEntry>,
        bytes: usize,
    ) -> Result<PutRecordsOutput, KinesisError> {
        let (answer, answered) = oneshot::channel();
        let records = entries.len();
        self.hand_over(publisher, Work::Call { entries, answer }, records, bytes)?;
        answered.await.unwrap_or_else(|_| Err(stopped(publisher)))
    }

    /// Publishes checked `records` (of these `sizes`), packed into aggregates with the other
    /// publishes of the next batch of `publisher` (which collects and aggregates).
    pub(crate) async fn publish(
        &self,
        publisher: &Publisher,
        records: Vec<OutgoingRecord>,
        sizes: Vec<usize>,
    ) -> Result<Vec<Published>, KinesisError> {
        let (answer, answered) = oneshot::channel();
        let count = records.len();
        let bytes = sizes.iter().sum();
        self.hand_over(publisher, Work::Publish { records, answer }, count, bytes)?;
        answered.await.unwrap_or_else(|_| Err(stopped(publisher)))
    }

    /// Hands `work` (`records` records of `bytes` bytes) to the collecting task of the
    /// current runtime, starting it if none runs.
    fn hand_over(
        &self,
        publisher: &Publisher,
        work: Work,
        records: usize,
        bytes: usize,
    ) -> Result<(), KinesisError> {
        let mut request = Request {
            _counted: Outstanding::new(&self.outstanding, records),
            work,
            records,
            bytes,
        };
        // A publish goes to the task on its own runtime: a task on another one may not be
        // running (a runtime kept but not driven), and the publish would wait for ever.
        let runtime = tokio::runtime::Handle::current().id();
        let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        let mut started = false;
        loop {
            if let Some(at) = queues.iter().position(|(id, _)| *id == runtime) {
                match queues[at].1.send(request) {
                    Ok(()) => return Ok(()),
                    // The task stopped with its runtime's shutdown: start one again, once.
                    // A task started on a runtime that is shutting down is dropped at once.
                    Err(mpsc::error::SendError(back)) if !started => request = back,
                    Err(_) => return Err(stopped(publisher)),
                }
            }
            started = true;
            queues.retain(|(_, sender)| !sender.is_closed());
            let (sender, receiver) = mpsc::unbounded_channel();
            // The task sends directly: the publisher without its collector.
            let direct = Publisher {
                collector: None,
                ..publisher.clone()
            };
            tokio::spawn(collect(
                receiver,
                direct,
                self.settings,
                self.aggregation.clone(),
                self.outstanding.clone(),
            ));
            queues.push((runtime, sender));
        }
    }
}

/// The error of a publish whose collecting task is gone.
fn stopped(publisher: &Publisher) -> KinesisError {
    KinesisError::PublisherStopped {
        stream: publisher.stream().to_owned(),
    }
}

/// Requests, in arrival order, to send together.
struct Batch {
    requests: Vec<Request>,
    records: usize,
    bytes: usize,
}

impl Batch {
    fn new(first: Request) -> Self {
        Self {
            records: first.records,
            bytes: first.bytes,
            requests: vec![first],
        }
    }

    fn full(&self, limits: CallLimits) -> bool {
        self.records >= limits.records || self.bytes >= limits.bytes
    }

    /// Adds `request` if the batch stays within one call's limits; else hands it back.
    fn add(&mut self, request: Request, limits: CallLimits) -> Result<(), Request> {
        if self.records + request.records > limits.records
            || self.bytes + request.bytes > limits.bytes
        {
            return Err(request);
        }
        self.records += request.records;
        self.bytes += request.bytes;
        self.requests.push(request);
        Ok(())
    }
}

/// The collecting task: batches the queue's requests and sends them, until every publisher
/// handle is gone (batches on their way still finish).
async fn collect(
    queue: mpsc::UnboundedReceiver<Request>,
    publisher: Publisher,
    settings: Collect,
    aggregation: Option<(Aggregate, Arc<SharedMap>)>,
    outstanding: Arc<AtomicUsize>,
) {
    let aggregating = aggregation.is_some();
    let call = publisher.limits;
    // Plain records: at most a call's worth, and at most a share of what is outstanding, so
    // that the next call fills while one is answered (`batch_limits`). User records to
    // aggregate: a call's bytes, in as many as they take.
    let limits = || {
        if aggregating {
            CallLimits {
                records: usize::MAX,
                bytes: call.bytes,
            }
        } else {
            let outstanding = outstanding.load(Ordering::Relaxed);
            batch_limits(call, outstanding, settings.calls_in_flight)
        }
    };
    let slots = Arc::new(Semaphore::new(settings.calls_in_flight));
    let mut queue = Queue {
        rx: queue,
        held: None,
        open: true,
    };
    while let Some(first) = queue.first().await {
        let mut batch = Batch::new(first);
        queue.fill(&mut batch, settings.linger, &limits).await;
        // The semaphore is never closed.
        let Ok(slot) = queue.slot(&mut batch, &slots, &limits).await else {
            break;
        };
        tokio::spawn(send(publisher.clone(), batch, aggregation.clone(), slot));
    }
}

/// The queue as the collecting task reads it: a request held back for the next batch (it did
/// not fit), and whether any publisher handle is left.
struct Queue {
    rx: mpsc::UnboundedReceiver<Request>,
    held: Option<Request>,
    open: bool,
}

impl Queue {
    /// The first request of the next batch; `None` once every handle is gone and the queue
    /// is empty.
    async fn first(&mut self) -> Option<Request> {
        match self.held.take() {
            Some(request) => Some(request),
            None if !self.open => None,
            None => self.rx.recv().await,
        }
    }

    /// Adds what arrives to `batch` until it is full or `linger` is over.
    async fn fill(
        &mut self,
        batch: &mut Batch,
        linger: Duration,
        limits: &(dyn Fn() -> CallLimits + Sync),
    ) {
        let linger = tokio::time::sleep(linger);
        tokio::pin!(linger);
        while self.open && self.held.is_none() && !batch.full(limits()) {
            tokio::select! {
                biased;
                next = self.rx.recv() => match next {
                    Some(request) => self.held = batch.add(request, limits()).err(),
                    None => {
                        self.open = false;
                        break;
                    }
                },
                () = &mut linger => break,
            }
        }
    }

    /// Waits for a call slot, adding what arrives to `batch` meanwhile.
    async fn slot(
        &mut self,
        batch: &mut Batch,
        slots: &Arc<Semaphore>,
        limits: &(dyn Fn() -> CallLimits + Sync),
    ) -> Result<OwnedSemaphorePermit, tokio::sync::AcquireError> {
        loop {
            if self.held.is_some() || batch.full(limits()) || !self.open {
                return slots.clone().acquire_owned().await;
            }
            tokio::select! {
                biased;
                slot = slots.clone().acquire_owned() => return slot,
                next = self.rx.recv() => match next {
                    Some(request) => self.held = batch.add(request, limits()).err(),
                    None => self.open = false,
                },
            }
        }
    }
}

/// The limits of a batch of plain records: a call's, and at most half of the `outstanding`
/// records (rounded up) when two or more calls may be on their way. Publishers that each
/// await their publish have only so many records outstanding; put all of them in one call
/// and nothing happens until it is answered, while two calls of half keep both the client and
/// the service busy: measured with 64 tasks (BENCHMARKS.md), 3 to 4 times the records a
/// second of one call of 64.
fn batch_limits(call: CallLimits, outstanding: usize, calls_in_flight: usize) -> CallLimits {
    let share = if calls_in_flight >= 2 {
        outstanding.div_ceil(2).max(1)
    } else {
        usize::MAX
    };
    CallLimits {
        records: call.records.min(share),
        bytes: call.bytes,
    }
}

/// Sends one batch and answers each of its requests: the calls of publishes' rounds in one
/// PutRecords call, the publishes to aggregate as one publish.
async fn send(
    publisher: Publisher,
    batch: Batch,
    aggregation: Option<(Aggregate, Arc<SharedMap>)>,
    _slot: OwnedSemaphorePermit,
) {
    let mut calls = Vec::new();
    let mut publishes = Vec::new();
    // Answered (or dropped) with their batch: the records stop counting as outstanding.
    let mut counted = Vec::with_capacity(batch.requests.len());
    for request in batch.requests {
        counted.push(request._counted);
        // Dropped before its batch went: not sent, as a dropped publish stops without
        // collection (a sink dropped mid-batch sends its records back for redelivery, and a
        // copy sent now could land after their new copies).
        if request.work.dropped() {
            continue;
        }
        match request.work {
            Work::Call { entries, answer } => calls.push((entries, answer)),
            Work::Publish { records, answer } => publishes.push((records, answer)),
        }
    }
    // A collector aggregates or not: a batch holds one kind of work.
    if !calls.is_empty() {
        put_together(&publisher, calls).await;
    }
    if !publishes.is_empty() {
        match aggregation {
            Some((settings, map)) => {
                aggregate_together(&publisher, publishes, settings, &map).await;
            }
            // Never handed over without aggregation; sent as one publish all the same.
            None => publish_together(&publisher, publishes).await,
        }
    }
    drop(counted);
}

/// The calls of several publishes' rounds in one PutRecords call: each gets the results of
/// its own entries, or the call's error.
async fn put_together(publisher: &Publisher, calls: Vec<(Vec<PutRecordsEntry>, CallAnswer)>) {
    let mut lengths = Vec::with_capacity(calls.len());
    let mut answers = Vec::with_capacity(calls.len());
    let mut entries = Vec::new();
    for (mine, answer) in calls {
        lengths.push(mine.len());
        entries.extend(mine);
        answers.push(answer);
    }
    publisher.metrics.call(entries.len());
    let answer = super::run::put_within(&publisher.api, &publisher.stream, entries).await;
    match answer {
        Ok(out) => {
            // An answer with fewer results than entries leaves the last ones short: their
            // publishes count the missing results as failures.
            let mut results = out.results.into_iter();
            for (answer, n) in answers.into_iter().zip(lengths) {
                let results = results.by_ref().take(n).collect();
                // A publish dropped while its call was on its way: nothing to tell.
                let _ = answer.send(Ok(PutRecordsOutput { results }));
            }
        }
        Err(error) => {
            for answer in answers {
                let _ = answer.send(Err(error.clone()));
            }
        }
    }
}

/// Whole publishes sent as one, packed into aggregates; each gets its own records' answer.
/// The batch stops once every publish of it is dropped, as a dropped publish stops without
/// collection; while one still waits it goes on, and a `warn` event says when records of a
/// dropped one were stored.
async fn aggregate_together(
    publisher: &Publisher,
    publishes: Vec<(Vec<OutgoingRecord>, PublishAnswer)>,
    settings: Aggregate,
    map: &SharedMap,
) {
    let (records, lengths, mut answers) = joined(publishes);
    let outcome = tokio::select! {
        outcome = publisher.send_aggregated(records, settings, map) => outcome,
        () = async {
            for answer in &mut answers {
                answer.closed().await;
            }
        } => return,
    };
    for (answer, outcome) in answers.into_iter().zip(split(outcome, &lengths)) {
        if answer.is_closed() {
            let stored = match &outcome {
                Ok(places) => places.len(),
                Err(KinesisError::PublishFailed(failure)) => failure.written(),
                Err(_) => 0,
            };
            if stored > 0 {
                tracing::warn!(
                    stream = publisher.stream(),
                    stored,
                    "{stored} records of a publish dropped while its aggregated batch was on \
                     its way were stored all the same, possibly after records of the same keys \
                     published since (an aggregated batch goes on while another publish of it \
                     waits)"
                );
            }
        }
        let _ = answer.send(outcome);
    }
}

/// Whole publishes sent as one, as plain records; each gets its own records' answer.
async fn publish_together(
    publisher: &Publisher,
    publishes: Vec<(Vec<OutgoingRecord>, PublishAnswer)>,
) {
    let (records, lengths, answers) = joined(publishes);
    let sizes = records.iter().map(OutgoingRecord::size).collect();
    let outcome = publisher.send_checked(records, sizes).await;
    for (answer, outcome) in answers.into_iter().zip(split(outcome, &lengths)) {
        let _ = answer.send(outcome);
    }
}

/// The records of several publishes in one batch, how many each has, and their answers.
type Joined = (Vec<OutgoingRecord>, Vec<usize>, Vec<PublishAnswer>);

fn joined(publishes: Vec<(Vec<OutgoingRecord>, PublishAnswer)>) -> Joined {
    let mut records = Vec::new();
    let mut lengths = Vec::with_capacity(publishes.len());
    let mut answers = Vec::with_capacity(publishes.len());
    for (mine, answer) in publishes {
        lengths.push(mine.len());
        records.extend(mine);
        answers.push(answer);
    }
    (records, lengths, answers)
}

#[cfg(test)]
mod tests;
