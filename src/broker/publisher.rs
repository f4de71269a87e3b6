//! Publishing: [`KinesisPublish`] (the policy), [`KinesisPublisher`] (the live publisher) and
//! [`KinesisOptions`] (per-publish settings).

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ruststream::runtime::MapPublisher;
use ruststream::{DefaultPublish, Lend, OutgoingMessage, PairError, PublishPolicy};

use super::connection::{ConnectedKinesis, Connection};
use crate::error::KinesisError;
use crate::publish::{Aggregate, Collect, Publisher as CorePublisher};

impl ConnectedKinesis {
    /// A publisher with the default policy (random partition keys unless a publish names one).
    #[must_use]
    pub fn publisher(&self) -> KinesisPublisher {
        KinesisPublisher::new(self.inner.clone(), KinesisPublish::default())
    }
}

/// The header a publish may name its partition key in, when neither the publish's options
/// nor the policy name one (the framework's retry copies keep their original's key this way).
pub const PARTITION_KEY_HEADER: &str = "partition-key";

/// Per-publish settings (`None` on replies and on the framework's retry copies).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KinesisOptions {
    /// The record's partition key: it picks the shard, and records of one key keep their
    /// order.
    pub partition_key: Option<String>,
}

impl KinesisOptions {
    /// Options naming `key` as the partition key.
    #[must_use]
    pub fn partition_key(key: impl Into<String>) -> Self {
        Self {
            partition_key: Some(key.into()),
        }
    }
}

/// The publish policy: what a publisher of this broker is paired with. Holds configuration
/// only; the framework pairs it with a connection.
///
/// ```
/// use kinesis_dataflow::broker::KinesisPublish;
///
/// use kinesis_dataflow::publish::{Aggregate, Collect};
///
/// // Every record of this publisher goes to one shard, in order.
/// let policy = KinesisPublish::default().partition_key("audit");
/// # let _ = policy;
/// // Publishes from many handlers share PutRecords calls, packed into KPL aggregates.
/// let policy = KinesisPublish::default()
///     .collect(Collect::default())
///     .aggregate(Aggregate::default());
/// # let _ = policy;
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[must_use]
pub struct KinesisPublish {
    partition_key: Option<String>,
    collect: Option<Collect>,
    without_collect: bool,
    aggregate: Option<Aggregate>,
}

impl KinesisPublish {
    /// Uses `key` as the partition key of every publish that does not name its own.
    pub fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.partition_key = Some(key.into());
        self
    }

    /// How the publishes of this publisher (from every handler and task using it) are
    /// collected into shared PutRecords calls (on by default, with [`Collect::default`]):
    /// see [`Publisher::collect`](crate::Publisher::collect).
    pub fn collect(mut self, settings: Collect) -> Self {
        self.collect = Some(settings);
        self.without_collect = false;
        self
    }

    /// Each publish makes its own PutRecords calls: see
    /// [`Publisher::without_collect`](crate::Publisher::without_collect).
    pub fn without_collect(mut self) -> Self {
        self.collect = None;
        self.without_collect = true;
        self
    }

    /// Packs the publishes of this publisher into KPL aggregates per shard (collecting them
    /// too): see [`Publisher::aggregate`](crate::Publisher::aggregate). Subscribers must
    /// de-aggregate ([`KinesisStream::deaggregate`](super::KinesisStream::deaggregate)).
    pub fn aggregate(mut self, settings: Aggregate) -> Self {
        self.aggregate = Some(settings);
        self
    }

    /// The core publisher of `stream` under this policy.
    fn core(&self, api: crate::api::SharedKinesis, stream: &str) -> CorePublisher {
        let mut publisher = CorePublisher::new(api, stream);
        if self.without_collect {
            publisher = publisher.without_collect();
        }
        if let Some(collect) = self.collect {
            publisher = publisher.collect(collect);
        }
        if let Some(aggregate) = self.aggregate {
            publisher = publisher.aggregate(aggregate);
        }
        publisher
    }
}

impl PublishPolicy<ConnectedKinesis> for KinesisPublish {
    type Live = KinesisPublisher;

    async fn pair(self, connected: &ConnectedKinesis) -> Result<KinesisPublisher, PairError> {
        if connected.inner.is_closed() {
            return Err(PairError::new(KinesisError::ShutDown));
        }
        Ok(KinesisPublisher::new(connected.inner.clone(), self))
    }
}

impl DefaultPublish for ConnectedKinesis {
    type Policy = KinesisPublish;
}

/// Mount-site settings of a publisher of this broker (`.out(..)`, replies, broker scopes).
pub trait KinesisPublishSettings {
    /// Fixes the partition key of every publish through this position that does not name
    /// its own.
    fn fixed_partition_key(self, key: impl Into<String>) -> Self;

    /// Collects the publishes through this position into shared PutRecords calls
    /// ([`KinesisPublish::collect`]).
    fn collected(self, settings: Collect) -> Self;

    /// Packs the publishes through this position into KPL aggregates
    /// ([`KinesisPublish::aggregate`]).
    fn aggregated(self, settings: Aggregate) -> Self;
}

impl<T: MapPublisher<Policy = KinesisPublish>> KinesisPublishSettings for T {
    fn fixed_partition_key(self, key: impl Into<String>) -> Self {
        let key = key.into();
        self.map_publisher(move |policy| policy.partition_key(key))
    }

    fn collected(self, settings: Collect) -> Self {
        self.map_publisher(move |policy| policy.collect(settings))
    }

    fn aggregated(self, settings: Aggregate) -> Self {
        self.map_publisher(move |policy| policy.aggregate(settings))
    }
}

/// The per-publish step of a publish builder: `.partition_key("customer-1")`.
pub trait KinesisPublishSteps {
    /// Names this publish's partition key.
    #[must_use]
    fn partition_key(self, key: impl Into<String>) -> Self;
}

impl<Sink, Body, Enc, Hdrs, Dest> KinesisPublishSteps
    for ruststream::runtime::PublishBuilder<Sink, Body, Enc, Hdrs, Dest>
where
    Sink: ruststream::runtime::PublishSink<Options = KinesisOptions>,
{
    fn partition_key(mut self, key: impl Into<String>) -> Self {
        self.options_mut()
            .get_or_insert_with(KinesisOptions::default)
            .partition_key = Some(key.into());
        self
    }
}

/// A live publisher: each publish is one record written through the core
/// [`Publisher`](crate::Publisher) (PutRecords with retries of failed entries), on the
/// connection's runtime; one core publisher per stream, kept for the next publish, so that a
/// collecting or aggregating policy shares calls across publishes.
pub struct KinesisPublisher {
    inner: Arc<Connection>,
    policy: KinesisPublish,
    publishers: Mutex<HashMap<String, CorePublisher>>,
}

impl fmt::Debug for KinesisPublisher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KinesisPublisher")
            .field("policy", &self.policy)
            .field("closed", &self.inner.is_closed())
            .finish()
    }
}

impl KinesisPublisher {
    pub(crate) fn new(inner: Arc<Connection>, policy: KinesisPublish) -> Self {
        Self {
            inner,
            policy,
            publishers: Mutex::new(HashMap::new()),
        }
    }

    /// The core publisher of `stream`, made at its first publish.
    fn core(&self, stream: &str) -> CorePublisher {
        let mut publishers = self.publishers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(publisher) = publishers.get(stream) {
            return publisher.clone();
        }
        let publisher = self.policy.core(self.inner.api.clone(), stream);
        publishers.insert(stream.to_owned(), publisher.clone());
        publisher
    }

    /// The partition key of one publish: options, then the header, then the policy, then a
    /// random one.
    fn key_for(&self, options: Option<&KinesisOptions>, header: Option<&[u8]>) -> String {
        options
            .and_then(|o| o.partition_key.clone())
            .or_else(|| header.map(|h| String::from_utf8_lossy(h).into_owned()))
            .or_else(|| self.policy.partition_key.clone())
            .unwrap_or_else(random_key)
    }
}

/// A random partition key (the records then spread over the shards).
pub(crate) fn random_key() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    format!("{:016x}", hasher.finish())
}

impl ruststream::Publisher for KinesisPublisher {
    type Payload = Lend;
    type Error = KinesisError;
    type Options = KinesisOptions;

    /// Writes the message's payload as one record of the stream the message names.
    ///
    /// # Errors
    ///
    /// [`KinesisError::ShutDown`] after the connection was shut down; otherwise as
    /// [`Publisher::publish`](crate::Publisher::publish) (an empty key or one over 256
    /// characters, a record over 1 MiB, an unknown stream, ...).
    async fn publish(
        &self,
        msg: OutgoingMessage<'_, &[u8]>,
        options: Option<&KinesisOptions>,
    ) -> Result<(), KinesisError> {
        self.inner.check_open()?;
        let key = self.key_for(options, msg.headers().get(PARTITION_KEY_HEADER));
        let (name, payload, headers) = msg.into_parts();
        if let Err(reason) = super::envelope::check(&headers) {
            return Err(KinesisError::InvalidRecord {
                stream: name.to_owned(),
                index: 0,
                size: payload.len() + key.len(),
                partition_key: key,
                reason,
            });
        }
        let data = super::envelope::encode(&headers, payload);
        let publisher = self.core(name);
        let inner = self.inner.clone();
        let stream = name.to_owned();
        let publish = async move {
            match publisher.publish(key.clone(), data.clone()).await {
                // With `create_missing_streams`, a publish may come first and create the
                // stream, as a subscription would.
                Err(KinesisError::StreamNotFound { .. })
                    if inner.create_missing_streams.is_some() =>
                {
                    let shards = inner.create_missing_streams.unwrap_or(1);
                    inner.ensure_stream(&stream, shards).await?;
                    publisher.publish(key, data).await
                }
                other => other,
            }
        };
        // On the connection's runtime: the caller's may be short-lived, and the SDK's
        // connections belong to the runtime that opened them. A caller already there (a
        // handler, the app's own tasks) publishes without the hop.
        let here = tokio::runtime::Handle::try_current()
            .is_ok_and(|current| current.id() == self.inner.runtime.id());
        if here {
            publish.await.map(|_| ())
        } else {
            self.inner
                .runtime
                .spawn(publish)
                .await
                .map_err(|_| KinesisError::ShutDown)?
                .map(|_| ())
        }
    }
}
