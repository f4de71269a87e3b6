//! [`KinesisStream`]: the descriptor a subscriber is mounted on.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use ruststream::{
    BrokerMoves, DeclareRetryError, FromName, RetryDeclaration, Subscribe, SubscriptionSource,
};

use super::connection::{ConnectedKinesis, Connection};
use super::dead_letters::{Spent, StreamDeadLetters};
use super::read_limit::ReadLimit;
use super::subscriber::KinesisSubscriber;
use crate::api::SharedKinesis;
use crate::api::layer::Layered;
use crate::error::KinesisError;
use crate::position::KinesisPosition;
use crate::shard::ReadSettings;
use crate::subscription::Subscription;

/// The most shards `create_if_missing` asks for (the default account limit per region is
/// higher, but a descriptor asking for more is almost surely a typo).
const MAX_CREATE_SHARDS: u32 = 10_000;
/// How long a partial batch waits for more records, by default.
const DEFAULT_MAX_WAIT: Duration = Duration::from_millis(20);
/// The longest `max_wait` allowed.
const MAX_MAX_WAIT: Duration = Duration::from_secs(60);

/// A Kinesis stream to subscribe to, with how to read it.
///
/// ```
/// use std::time::Duration;
/// use kinesis_dataflow::KinesisPosition;
/// use kinesis_dataflow::broker::KinesisStream;
///
/// let shipments = KinesisStream::new("shipments")
///     .create_if_missing(2)
///     .poll_interval(Duration::from_millis(200))
///     .batch_size(500)
///     .start_at(KinesisPosition::horizon());
/// # let _ = shipments;
/// ```
///
/// Every setting is checked when the subscription starts, before any call: an invalid one
/// fails the startup with [`KinesisError::InvalidConfig`] naming the setting and the value.
#[derive(Debug, Clone)]
#[must_use]
pub struct KinesisStream {
    name: String,
    create_if_missing: Option<u32>,
    start_at: Option<KinesisPosition>,
    initial_position: Option<KinesisPosition>,
    read: ReadSettings,
    /// `batch_size` (or `read_settings`) was given: it outranks a batch subscription's size.
    batch_size_set: bool,
    list_interval: Option<Duration>,
    lease_duration: Option<Duration>,
    worker_timeout: Option<Duration>,
    checkpoint_interval: Option<Duration>,
    max_in_flight: Option<usize>,
    max_wait: Duration,
    settle_within: Option<Duration>,
    /// The mount site's `max_attempts` and `dead_letter`; refused at startup when half of it.
    retry: RetryDeclaration,
}

impl KinesisStream {
    /// The stream `name`, read from its checkpoints (or, without one, from the tip).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            create_if_missing: None,
            start_at: None,
            initial_position: None,
            read: ReadSettings::default(),
            batch_size_set: false,
            list_interval: None,
            lease_duration: None,
            worker_timeout: None,
            checkpoint_interval: None,
            max_in_flight: None,
            max_wait: DEFAULT_MAX_WAIT,
            settle_within: None,
            retry: RetryDeclaration::new(),
        }
    }

    /// Creates the stream with `shards` shards when it does not exist, and waits until it is
    /// ACTIVE before reading.
    pub fn create_if_missing(mut self, shards: u32) -> Self {
        self.create_if_missing = Some(shards);
        self
    }

    /// Where the unfinished shards this instance opens at startup start, ahead of their
    /// checkpoints (see [`KinesisPosition`] and
    /// [`SubscriptionBuilder::start_at`](crate::SubscriptionBuilder::start_at)). Shards taken
    /// later (children, takeovers) resume from their checkpoints; finished shards are not read
    /// again. A position the service would refuse is refused before anything is created.
    ///
    /// This is the descriptor's own setting, applied when the subscription starts. A running
    /// subscription moves with its [`KinesisSeeker`](super::KinesisSeeker).
    pub fn start_at(mut self, position: KinesisPosition) -> Self {
        self.start_at = Some(position);
        self
    }

    /// Where shards that have no checkpoint yet begin (the KCL's initial position): the
    /// application's first start reads from here, later starts resume from the checkpoints.
    /// Unlike [`start_at`](Self::start_at), a redeploy replays nothing. See
    /// [`SubscriptionBuilder::initial_position`](crate::SubscriptionBuilder::initial_position).
    pub fn initial_position(mut self, position: KinesisPosition) -> Self {
        self.initial_position = Some(position);
        self
    }

    /// How long a shard's reader waits after a read that returned no records (default 1 s).
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.read = self.read.poll_interval(interval);
        self
    }

    /// How many records one GetRecords call asks for: 1 to 10,000. Without it, 1,000, or
    /// the mount site's batch size for a batch subscription (`&[T]` bodies) from the moment
    /// its batches open; given, it holds for batch subscriptions too.
    pub fn batch_size(mut self, records: u32) -> Self {
        self.read = self.read.batch_size(records);
        self.batch_size_set = true;
        self
    }

    /// Takes KPL aggregates apart into their user records (default: off; an aggregate is then
    /// an error item and skipped). See [`ReadSettings::deaggregate`].
    pub fn deaggregate(mut self, on: bool) -> Self {
        self.read = self.read.deaggregate(on);
        self
    }

    /// Reads with enhanced fan-out as the stream consumer `consumer` instead of polling
    /// (default: polling): each shard's records are pushed through SubscribeToShard, with a
    /// read budget of their own. The consumer is registered when missing and never
    /// deregistered by the application. See [`ReadSettings::fan_out`].
    ///
    /// ```
    /// use kinesis_dataflow::broker::KinesisStream;
    ///
    /// let shipments = KinesisStream::new("shipments").fan_out("shipping-service");
    /// # let _ = shipments;
    /// ```
    pub fn fan_out(mut self, consumer: impl Into<String>) -> Self {
        self.read = self.read.fan_out(consumer);
        self
    }

    /// Every read setting at once (replaces `poll_interval`, `batch_size`, `deaggregate` and
    /// `fan_out`).
    pub fn read_settings(mut self, settings: ReadSettings) -> Self {
        self.read = settings;
        self.batch_size_set = true;
        self
    }

    /// How often the stream's shards are listed (default 10 s).
    pub fn list_interval(mut self, every: Duration) -> Self {
        self.list_interval = Some(every);
        self
    }

    /// How long a lease lives without renewal (default 10 s).
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = Some(duration);
        self
    }

    /// How long an instance's worker row may go unchanged before the others take all its
    /// shards (default 4 s, at most the lease duration): the takeover after a crash.
    pub fn worker_timeout(mut self, timeout: Duration) -> Self {
        self.worker_timeout = Some(timeout);
        self
    }

    /// The most frequent checkpoint write per shard (default 5 s).
    pub fn checkpoint_interval(mut self, every: Duration) -> Self {
        self.checkpoint_interval = Some(every);
        self
    }

    /// How many deliveries of one shard may be unsettled before its reader pauses.
    pub fn max_in_flight(mut self, deliveries: usize) -> Self {
        self.max_in_flight = Some(deliveries);
        self
    }

    /// For a batch subscription: how long a partial batch waits for more records after its
    /// first (default 20 ms; at most 60 s). A GetRecords answer fills a batch at once.
    pub fn max_wait(mut self, wait: Duration) -> Self {
        self.max_wait = wait;
        self
    }

    /// A deadline for settling each message (unset by default): one whose handler has not
    /// settled it `within` of its delivery is taken back and delivered again, counted as a
    /// failed attempt against the mount site's `max_attempts`. See
    /// [`SubscriptionBuilder::settle_within`](crate::SubscriptionBuilder::settle_within).
    pub fn settle_within(mut self, within: Duration) -> Self {
        self.settle_within = Some(within);
        self
    }

    /// The stream name.
    #[must_use]
    pub fn stream_name(&self) -> &str {
        &self.name
    }

    /// Checks what can be checked without a call: the name, the shard count, the reads.
    fn validate(&self, create: Option<u32>) -> Result<(), KinesisError> {
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 128
            && self
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
        if !name_ok {
            return Err(KinesisError::InvalidConfig {
                setting: "name",
                value: format!("{:?}", self.name),
                reason: "a stream name is 1 to 128 characters of a-z, A-Z, 0-9, `_`, `.` and `-`"
                    .into(),
            });
        }
        if let Some(shards) = create
            && !(1..=MAX_CREATE_SHARDS).contains(&shards)
        {
            return Err(KinesisError::InvalidConfig {
                setting: "create_if_missing",
                value: shards.to_string(),
                reason: format!("a stream is created with 1 to {MAX_CREATE_SHARDS} shards"),
            });
        }
        for (setting, position) in [
            ("start_at", &self.start_at),
            ("initial_position", &self.initial_position),
        ] {
            // Refused here, before a stream is created for a subscription that cannot start.
            if let Some(reason) = position.as_ref().and_then(KinesisPosition::refusal) {
                return Err(KinesisError::InvalidConfig {
                    setting,
                    value: format!("{position:?}"),
                    reason,
                });
            }
        }
        if self.max_wait > MAX_MAX_WAIT {
            return Err(KinesisError::InvalidConfig {
                setting: "max_wait",
                value: format!("{:?}", self.max_wait),
                reason: format!("must be at most {MAX_MAX_WAIT:?}"),
            });
        }
        self.read.validate()
    }

    /// Opens the subscription on the connection's runtime.
    pub(crate) async fn open(
        self,
        connected: &ConnectedKinesis,
    ) -> Result<KinesisSubscriber, KinesisError> {
        let inner = connected.inner.clone();
        inner.check_open()?;
        let create = self.create_if_missing.or(inner.create_missing_streams);
        self.validate(create)?;
        let declared = inner
            .declared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(&self.name)
            .map(Spent::from_declaration)
            .transpose()?
            .flatten();
        let spent = Spent::from_declaration(&self.retry)?.or(declared);
        let max_attempts = spent.as_ref().map(|s| s.max_attempts);
        let claim = inner.claim(&self.name)?;
        inner.wait_stopped(&self.name).await;
        let task_inner = inner.clone();
        let stream: std::sync::Arc<str> = std::sync::Arc::from(self.name.as_str());
        let max_wait = self.max_wait;
        let read_limit = ReadLimit::default();
        let limit = (!self.batch_size_set).then(|| read_limit.clone());
        let deaggregate = self.read.deaggregate;
        // Every call (and the subscription's background task) runs on the connection's
        // runtime: the caller's may be a short-lived one.
        let subscription = inner
            .runtime
            .spawn(async move { self.start(&task_inner, create, spent, limit).await })
            .await
            .map_err(|_| KinesisError::ShutDown)??;
        inner.register(subscription.shutdown_handle())?;
        // Closed when the subscriber is dropped.
        inner.harness.opened(&stream, deaggregate);
        Ok(KinesisSubscriber::new(
            subscription,
            stream,
            inner,
            max_wait,
            claim,
            max_attempts,
            read_limit,
        ))
    }

    async fn start(
        self,
        inner: &Arc<Connection>,
        create: Option<u32>,
        spent: Option<Spent>,
        limit: Option<ReadLimit>,
    ) -> Result<Subscription, KinesisError> {
        if let Some(shards) = create {
            inner.ensure_stream(&self.name, shards).await?;
        }
        if let Some(spent) = &spent {
            dead_letter_stream(inner, &spent.destination, create).await?;
        }
        // A batch subscription's size becomes the GetRecords limit once its batches open.
        let api: SharedKinesis = match limit {
            Some(limit) => Arc::new(Layered::new(inner.api.clone(), limit)),
            None => inner.api.clone(),
        };
        let mut builder = Subscription::builder(api, inner.store.clone(), self.name)
            .read_settings(self.read)
            .runtime(inner.runtime.clone())
            .application(inner.application.as_str())
            // Half the grace waits for deliveries still held; the other half is for the
            // checkpoint flush and the lease release.
            .shutdown_timeout(inner.shutdown_grace / 2);
        if let Some(owner) = &inner.owner {
            builder = builder.owner(owner.clone());
        }
        if let Some(position) = self.start_at {
            builder = builder.start_at(position);
        }
        if let Some(position) = self.initial_position {
            builder = builder.initial_position(position);
        }
        if let Some(every) = self.list_interval {
            builder = builder.list_interval(every);
        }
        if let Some(duration) = self.lease_duration {
            builder = builder.lease_duration(duration);
        }
        if let Some(timeout) = self.worker_timeout {
            builder = builder.worker_timeout(timeout);
        }
        if inner.harness.in_process() {
            // A jump of the paused test clock must not look like a frozen process.
            builder = builder
                .lease_duration(IN_PROCESS_LEASE_DURATION)
                .worker_timeout(IN_PROCESS_LEASE_DURATION);
        }
        if let Some(every) = self.checkpoint_interval {
            builder = builder.checkpoint_interval(every);
        }
        if let Some(n) = self.max_in_flight {
            builder = builder.max_in_flight(n);
        }
        if let Some(within) = self.settle_within {
            builder = builder.settle_within(within);
        }
        if let Some(spent) = spent {
            builder = builder
                .max_attempts(spent.max_attempts)
                .dead_letters(StreamDeadLetters::new(inner.clone(), spent.destination));
        }
        builder.start().await
    }
}

/// Makes sure the dead-letter stream is there before the first record may need it: created
/// like the subscription's own stream when that is created, else it must exist.
async fn dead_letter_stream(
    inner: &Connection,
    destination: &str,
    create: Option<u32>,
) -> Result<(), KinesisError> {
    if let Some(shards) = create {
        return inner.ensure_stream(destination, shards).await;
    }
    match inner.api.describe_stream_summary(destination).await {
        Err(KinesisError::StreamNotFound { .. }) => Err(KinesisError::InvalidConfig {
            setting: "dead_letter",
            value: destination.to_owned(),
            reason: "the dead-letter stream does not exist: create it, or let the subscription \
                     create it (`create_if_missing`, `create_missing_streams`)"
                .into(),
        }),
        Err(e) => Err(e),
        Ok(_) => Ok(()),
    }
}

/// The lease duration in process: longer than any jump a test makes on its paused clock.
const IN_PROCESS_LEASE_DURATION: Duration = Duration::from_secs(24 * 3600);

impl FromName for KinesisStream {
    fn from_name(name: impl Into<Cow<'static, str>>) -> Self {
        Self::new(name.into().into_owned())
    }
}

impl ruststream::runtime::IntoSource for KinesisStream {
    type Source = Self;

    fn into_source(self) -> Self {
        self
    }
}

impl SubscriptionSource<ConnectedKinesis> for KinesisStream {
    type Subscriber = KinesisSubscriber;
    /// The core applies the mount site's `max_attempts` and `dead_letter` itself (see
    /// [`declare_retry`](Self::declare_retry)) and redelivers in process.
    type Copies = BrokerMoves;

    fn name(&self) -> &str {
        &self.name
    }

    /// Takes the mount site's `max_attempts(n)` and `dead_letter(stream)`: both or neither
    /// (half is refused when the subscription opens). A record sent back on its `n`-th
    /// delivery is written to the dead-letter stream, and only then passed by the checkpoint.
    fn declare_retry(mut self, declaration: &RetryDeclaration) -> Self {
        self.retry = declaration.clone();
        self
    }

    async fn subscribe(
        self,
        connected: &ConnectedKinesis,
    ) -> Result<KinesisSubscriber, KinesisError> {
        self.open(connected).await
    }
}

impl Subscribe for ConnectedKinesis {
    type Subscriber = KinesisSubscriber;
    type Copies = BrokerMoves;

    /// Takes what a registration by bare stream name declared, as
    /// [`KinesisStream::declare_retry`](SubscriptionSource::declare_retry) does: both halves
    /// or none; half is refused here, at startup.
    fn declare_retry(
        &self,
        name: &str,
        declaration: &RetryDeclaration,
    ) -> Result<(), DeclareRetryError> {
        let mut declared = self
            .inner
            .declared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match Spent::declared(declaration)? {
            Some(_) => declared.insert(name.to_owned(), declaration.clone()),
            None => declared.remove(name),
        };
        Ok(())
    }

    /// Subscribes by name with the broker's defaults (a missing stream is created only with
    /// [`create_missing_streams`](super::KinesisBroker::create_missing_streams)).
    async fn subscribe(&self, name: &str) -> Result<KinesisSubscriber, KinesisError> {
        KinesisStream::new(name).open(self).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_bad_settings_naming_them() {
        let cases = [
            (KinesisStream::new(""), None, "name"),
            (KinesisStream::new("a".repeat(129)), None, "name"),
            (KinesisStream::new("bad name"), None, "name"),
            (KinesisStream::new("ok"), Some(0), "create_if_missing"),
            (
                KinesisStream::new("ok").poll_interval(Duration::ZERO),
                None,
                "poll_interval",
            ),
            (KinesisStream::new("ok").batch_size(0), None, "batch_size"),
            (
                KinesisStream::new("ok")
                    .start_at(KinesisPosition::sequence("shardId-000000000000", "4959 ")),
                None,
                "start_at",
            ),
            (
                KinesisStream::new("ok").initial_position(KinesisPosition::sequence("", "1")),
                None,
                "initial_position",
            ),
            (
                KinesisStream::new("ok").batch_size(10_001),
                None,
                "batch_size",
            ),
        ];
        for (stream, create, expected) in cases {
            match stream.validate(create) {
                Err(KinesisError::InvalidConfig { setting, .. }) => assert_eq!(setting, expected),
                other => panic!("{stream:?}: expected {expected} refused, got {other:?}"),
            }
        }
        KinesisStream::new("shipments.v2_x-y")
            .validate(Some(2))
            .unwrap();
    }
}
