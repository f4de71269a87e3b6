//! [`ShardStream`]: one shard as a `Stream` of records.

use crate::telemetry::ShardMetrics;
use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures::future::BoxFuture;
use futures::stream::{FusedStream, Stream};
use tokio::task::JoinHandle;
use tracing::{Instrument, Span};

use super::ShardEnd;
use super::first_reads::FirstReads;
use super::reader::{ReadProbe, Reader, Step};
use super::settings::ReadSettings;
use crate::api::SharedKinesis;
use crate::error::KinesisError;
use crate::position::SettledPosition;
use crate::position::StartingPoint;
use crate::record::Record;

/// Builds a [`ShardStream`]: which shard, how to read it, and where it opens.
///
/// ```
/// # async fn demo() -> Result<(), kinesis_dataflow::KinesisError> {
/// use std::sync::Arc;
/// use futures::StreamExt;
/// use kinesis_dataflow::api::{KinesisApi, MemoryKinesis};
/// use kinesis_dataflow::{ShardStream, StartingPoint};
///
/// let kinesis = MemoryKinesis::new();
/// kinesis.add_stream("orders", 1)?;
/// kinesis.put("orders", "customer-1", "hello")?;
///
/// let mut shard = ShardStream::builder(Arc::new(kinesis), "orders", "shardId-000000000000")
///     .open(StartingPoint::TrimHorizon)?;
/// let record = shard.next().await.unwrap()?;
/// assert_eq!(&record.data()[..], b"hello");
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a reader does nothing until it is opened and polled"]
pub struct ShardStreamBuilder {
    api: SharedKinesis,
    stream: Arc<str>,
    shard: Arc<str>,
    settings: ReadSettings,
    settled: Option<SettledPosition>,
    probe: Option<Arc<ReadProbe>>,
    first_reads: Option<Arc<FirstReads>>,
    hash_range: Option<crate::kpl::HashRange>,
    consumer_arn: Option<String>,
    metrics: Option<ShardMetrics>,
    span: Option<Span>,
}

impl fmt::Debug for ShardStreamBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardStreamBuilder")
            .field("stream", &self.stream)
            .field("shard", &self.shard)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl ShardStreamBuilder {
    /// A reader of `shard` in `stream`, with the default [`ReadSettings`].
    pub fn new(
        api: SharedKinesis,
        stream: impl Into<Arc<str>>,
        shard: impl Into<Arc<str>>,
    ) -> Self {
        Self {
            api,
            stream: stream.into(),
            shard: shard.into(),
            settings: ReadSettings::default(),
            settled: None,
            probe: None,
            first_reads: None,
            hash_range: None,
            consumer_arn: None,
            metrics: None,
            span: None,
        }
    }

    /// Reads with these settings.
    pub fn settings(mut self, settings: ReadSettings) -> Self {
        self.settings = settings;
        self
    }

    /// Shares the shard's settled position with whoever settles its records; an expired
    /// iterator is then renewed right after it when it is further on than the last record
    /// the reader read (else right after that record, as without one).
    pub fn settled(mut self, settled: SettledPosition) -> Self {
        self.settled = Some(settled);
        self
    }

    /// The shard's hash key range, as ListShards gives it (decimal strings), so that user
    /// records of aggregates put against a stale shard map are recognised (see
    /// [`ReadSettings::discard_misplaced_user_records`]). A range that does not parse is
    /// ignored.
    pub fn hash_key_range(mut self, starting: &str, ending: &str) -> Self {
        self.hash_range = crate::kpl::HashRange::parse(starting, ending);
        self
    }

    /// Counts this reader's reads in a subscription's metric handles (a reader on its own
    /// registers its own, under the default application label).
    pub(crate) fn metrics(mut self, metrics: ShardMetrics) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// Reads inside this span (a subscription's shard span) instead of one of its own.
    pub(crate) fn span(mut self, span: Span) -> Self {
        self.span = Some(span);
        self
    }

    /// Counts this reader's successful GetRecords calls in `probe`.
    pub(crate) fn probe(mut self, probe: Arc<ReadProbe>) -> Self {
        self.probe = Some(probe);
        self
    }

    /// Takes the slot of this reader's first GetRecords from `first_reads`, shared with the
    /// readers opened beside it (see [`FirstReads`]).
    pub(crate) fn first_reads(mut self, first_reads: Arc<FirstReads>) -> Self {
        self.first_reads = Some(first_reads);
        self
    }

    /// With [`ReadSettings::fan_out`]: the consumer's ARN, known ACTIVE (a subscription
    /// registers the consumer once for all its readers).
    pub(crate) fn consumer_arn(mut self, arn: Option<String>) -> Self {
        self.consumer_arn = arn;
        self
    }

    /// Opens the shard at `start`. Nothing is read until the stream is polled.
    ///
    /// # Errors
    ///
    /// [`KinesisError::InvalidConfig`] when a setting is out of range.
    pub fn open(mut self, start: StartingPoint) -> Result<ShardStream, KinesisError> {
        self.settings.validate()?;
        let span = (self.span.take()).unwrap_or_else(
            || tracing::info_span!("shard", stream = %self.stream, shard = %self.shard),
        );
        let deaggregating = self.settings.deaggregate;
        let mut reader = Reader::new(
            self.api,
            self.stream.clone(),
            self.shard.clone(),
            self.settings,
            start,
            self.settled,
        );
        reader.probe = self.probe;
        reader.first_reads = self.first_reads;
        reader.hash_range = self.hash_range;
        reader.metrics = self.metrics.unwrap_or_else(|| {
            ShardMetrics::new(
                crate::telemetry::DEFAULT_APPLICATION,
                &self.stream,
                &self.shard,
            )
        });
        if let Some(arn) = self.consumer_arn {
            reader.known_consumer(arn);
        }
        let hang_up = reader.hang_up();
        Ok(ShardStream {
            hang_up,
            state: State::Idle(Box::new(reader)),
            buffer: VecDeque::new(),
            errors: VecDeque::new(),
            taken: 0,
            deaggregating,
            pending_end: None,
            end: None,
            // A name of this shard's own: every record counts references to it, and a count
            // shared with the other shards' records would bounce between threads.
            stream: Arc::from(&*self.stream),
            shard: self.shard,
            span,
        })
    }
}

/// A step in flight: on a tokio runtime it runs as a task of its own, so decoding one
/// shard's answer uses any worker thread while the consumer handles other shards; elsewhere it
/// is polled in place.
enum InFlight {
    Spawned(JoinHandle<(Box<Reader>, Step)>),
    Inline(BoxFuture<'static, (Box<Reader>, Step)>),
}

impl InFlight {
    fn start(
        step: impl Future<Output = (Box<Reader>, Step)> + Send + 'static,
        background: bool,
    ) -> Self {
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) if background => Self::Spawned(runtime.spawn(step)),
            _ => Self::Inline(Box::pin(step)),
        }
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<(Box<Reader>, Step)> {
        match self {
            Self::Inline(future) => future.as_mut().poll(cx),
            Self::Spawned(handle) => match ready!(Pin::new(handle).poll(cx)) {
                Ok(done) => Poll::Ready(done),
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(e) => panic!("shard read task ended unexpectedly: {e}"),
            },
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // A stream dropped mid-read takes its read with it.
        if let Self::Spawned(handle) = self {
            handle.abort();
        }
    }
}

enum State {
    /// Waiting to be polled before the next step.
    Idle(Box<Reader>),
    /// A step in flight.
    Reading(InFlight),
    /// Finished: the shard ended or the reader stopped.
    Done,
}

/// One shard as a `Stream` of records, unfolded from GetShardIterator and GetRecords.
///
/// * Each GetRecords asks for the batch size (1,000 by default) and the next call uses the
///   answer's next iterator.
/// * Pull-driven: a GetRecords call is only made while the stream is polled and everything
///   the previous call returned has been taken. At most one answer, so at most `batch_size`
///   records, is buffered.
/// * A read with no records waits the poll interval before the next one; reads are spaced to
///   stay under the read-rate cap (5 a second by default).
/// * A throttled read waits one poll interval and retries the same iterator; it is not
///   reported. An expired iterator (one unused for five minutes, e.g. while the consumer did
///   not poll) is renewed right after the last record this reader read, which was handed on
///   already (a step only starts once the previous answer was taken; an aggregate, with
///   de-aggregation, is read whole), or after the [settled](ShardStreamBuilder::settled)
///   position when that one is further on. With nothing read yet it is renewed where the
///   reader opened (a LATEST start becomes the time its first iterator was issued, a start
///   inside an aggregate still skips its user records up to the opening one); never at
///   LATEST. Nothing already read is read again, and no record is repeated or skipped.
/// * Any other failed read is yielded as an `Err` item and retried with the same iterator after
///   the failure backoff (1 s). After 11 failures in a row the stream yields
///   [`KinesisError::ReaderStopped`] and ends. A shard that cannot be opened at all (unknown
///   stream or shard, a sequence number the shard refuses) yields that error and ends.
/// * A KPL-aggregated record is yielded as [`KinesisError::AggregatedRecord`], in its place in
///   the order, and the stream goes on; with [`ReadSettings::deaggregate`] its user records
///   are yielded instead (a user record that cannot be read as
///   [`KinesisError::InvalidUserRecord`], in its place).
/// * At the end of a closed shard the stream ends; [`ShardStream::shard_end`] then names the
///   child shards.
#[must_use = "streams do nothing unless polled"]
pub struct ShardStream {
    state: State,
    buffer: VecDeque<Record>,
    /// Errors about single user records of the buffered answer, each with the number of its
    /// records to hand on before it.
    errors: VecDeque<(usize, KinesisError)>,
    /// Records of the buffered answer handed on so far.
    taken: usize,
    /// Aggregates are taken apart by the reader: a record that still starts with the magic
    /// bytes is no valid aggregate and is handed on as it is.
    deaggregating: bool,
    pending_end: Option<ShardEnd>,
    end: Option<ShardEnd>,
    stream: Arc<str>,
    shard: Arc<str>,
    span: Span,
    /// Ends the reader's fan-out subscription from outside.
    hang_up: Option<crate::shard::HangUp>,
}

impl fmt::Debug for ShardStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardStream")
            .field("stream", &self.stream)
            .field("shard", &self.shard)
            .field("buffered", &self.buffer.len())
            .field("end", &self.end)
            .finish_non_exhaustive()
    }
}

impl ShardStream {
    /// Starts building the stream of `shard` in `stream`, read through `api` (see
    /// [`ShardStreamBuilder`]).
    pub fn builder(
        api: SharedKinesis,
        stream: impl Into<Arc<str>>,
        shard: impl Into<Arc<str>>,
    ) -> ShardStreamBuilder {
        ShardStreamBuilder::new(api, stream, shard)
    }

    /// The stream name.
    #[must_use]
    pub fn stream_name(&self) -> &str {
        &self.stream
    }

    /// The shard id.
    #[must_use]
    pub fn shard_id(&self) -> &str {
        &self.shard
    }

    /// Set once the stream ended because the shard is closed and fully read: the shard's last
    /// record and its children.
    #[must_use]
    pub fn shard_end(&self) -> Option<&ShardEnd> {
        self.end.as_ref()
    }

    /// Fixes the starting position now: fetches the first shard iterator before the stream is
    /// first polled, so that a LATEST reader sees every record written after this returns.
    /// Without it the iterator is fetched at the first poll. A failure is not reported here:
    /// the first poll retries it and reports it by the usual rules, and calling `prime` again
    /// tries again (a LATEST start asked again opens at the time of the first attempt, so
    /// nothing written after that is skipped).
    ///
    /// Returns true when the position is fixed (or the stream already started reading).
    pub async fn prime(&mut self) -> bool {
        let span = self.span.clone();
        match &mut self.state {
            State::Idle(reader) => reader.prime().instrument(span).await,
            _ => true,
        }
    }

    /// Opens with `iterator`, a LATEST iterator requested at `asked`, instead of fetching the
    /// first one (a stream that has not started reading yet).
    /// The handle that ends this stream's fan-out subscription at once and for good, even
    /// while nobody polls the stream; `None` when it polls.
    pub(crate) fn hang_up(&self) -> Option<crate::shard::HangUp> {
        self.hang_up.clone()
    }

    pub(crate) fn open_with(&mut self, iterator: String, asked: std::time::SystemTime) {
        if let State::Idle(reader) = &mut self.state {
            reader.open_with(iterator, asked);
        }
    }

    /// With enhanced fan-out: opens with `events`, a subscription at LATEST requested at
    /// `asked`, instead of subscribing (a stream that has not started reading yet). Without
    /// them, it opens at `asked` (with the clock allowance).
    pub(crate) fn open_subscribed(
        &mut self,
        events: Option<crate::api::ShardEvents>,
        asked: std::time::SystemTime,
    ) {
        if let State::Idle(reader) = &mut self.state {
            reader.open_subscribed(events, asked);
        }
    }

    /// [`prime`](Self::prime), saying why the position could not be fixed.
    pub(crate) async fn try_prime(&mut self) -> Result<(), KinesisError> {
        let span = self.span.clone();
        match &mut self.state {
            State::Idle(reader) => reader.try_prime().instrument(span).await,
            _ => Ok(()),
        }
    }

    /// How many records are read but not yet taken.
    #[must_use]
    pub fn buffered_len(&self) -> usize {
        self.buffer.len()
    }

    /// Hands a record on as it is, or, without de-aggregation, reports a KPL-aggregated one as
    /// its error.
    fn pass_or_refuse_aggregated(&self, record: Record) -> Result<Record, KinesisError> {
        if !self.deaggregating && record.data().starts_with(&crate::kpl::MAGIC) {
            tracing::warn!(
                parent: &self.span,
                sequence_number = record.sequence_number(),
                "KPL-aggregated record reported as an error"
            );
            return Err(KinesisError::AggregatedRecord {
                stream: self.stream.to_string(),
                shard: self.shard.to_string(),
                sequence_number: record.sequence_number().to_owned(),
            });
        }
        Ok(record)
    }
}

impl Stream for ShardStream {
    type Item = Result<Record, KinesisError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if this
                .errors
                .front()
                .is_some_and(|(before, _)| *before <= this.taken)
            {
                let (_, error) = this.errors.pop_front().expect("front exists");
                return Poll::Ready(Some(Err(error)));
            }
            if let Some(record) = this.buffer.pop_front() {
                this.taken += 1;
                let record = record.in_stream(&this.stream);
                return Poll::Ready(Some(this.pass_or_refuse_aggregated(record)));
            }
            if let Some(end) = this.pending_end.take() {
                tracing::info!(
                    parent: &this.span,
                    children = ?end.child_shards.iter().map(|c| c.shard_id.as_str()).collect::<Vec<_>>(),
                    "shard end reached"
                );
                this.end = Some(end);
                this.state = State::Done;
                return Poll::Ready(None);
            }
            match &mut this.state {
                State::Done => return Poll::Ready(None),
                State::Idle(_) => {
                    let State::Idle(reader) = std::mem::replace(&mut this.state, State::Done)
                    else {
                        unreachable!("matched Idle above")
                    };
                    let background = reader.settings.background_reads;
                    let step = reader.step().instrument(this.span.clone());
                    this.state = State::Reading(InFlight::start(step, background));
                }
                State::Reading(future) => {
                    let (reader, step) = ready!(future.poll(cx));
                    match step {
                        Step::Batch(records, errors, end) => {
                            this.state = State::Idle(reader);
                            this.buffer.extend(records);
                            this.errors.extend(errors);
                            this.taken = 0;
                            this.pending_end = end;
                        }
                        Step::Failed(e) => {
                            this.state = State::Idle(reader);
                            return Poll::Ready(Some(Err(e)));
                        }
                        Step::Stopped(e) => {
                            this.state = State::Done;
                            return Poll::Ready(Some(Err(e)));
                        }
                    }
                }
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match self.state {
            State::Done if self.pending_end.is_none() => {
                (self.buffer.len(), Some(self.buffer.len()))
            }
            _ => (self.buffer.len(), None),
        }
    }
}

impl FusedStream for ShardStream {
    fn is_terminated(&self) -> bool {
        matches!(self.state, State::Done) && self.buffer.is_empty() && self.pending_end.is_none()
    }
}
