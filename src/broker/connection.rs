//! The live state of a connection of the broker face: the clients, the lease store, the
//! subscriptions opened through it and what they hold. Every other file of the broker
//! imports it; the builder ([`KinesisBroker`](super::KinesisBroker)) sits above it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Handle as RuntimeHandle;

use super::in_process::Harness;
use crate::api::{KinesisAdmin, SharedKinesis, StreamStatus};
use crate::error::{KinesisError, Operation};
use crate::lease::SharedLeaseStore;
use crate::subscription::ShutdownHandle;

/// How long `create_if_missing` (or `create_missing_streams`) waits for a new stream to become
/// ACTIVE.
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(300);

/// The shared state of a connection.
pub(crate) struct Connection {
    pub(crate) api: SharedKinesis,
    /// The same transport, for the one admin call the broker makes: creating a missing stream
    /// (`create_if_missing`, `create_missing_streams`).
    admin: Arc<dyn KinesisAdmin>,
    pub(crate) store: SharedLeaseStore,
    /// The runtime `connect` ran on: subscriptions and SDK calls run there.
    pub(crate) runtime: RuntimeHandle,
    pub(crate) closed: AtomicBool,
    subscriptions: Mutex<Vec<ShutdownHandle>>,
    /// The streams a subscription of this connection reads now (one each).
    streams: Mutex<HashSet<String>>,
    /// Subscriptions dropped and still stopping (handing their leases back), by stream.
    stopping: Mutex<HashMap<String, ShutdownHandle>>,
    /// What the in-process test harness needs (nothing without the `testing` feature).
    pub(crate) harness: Harness,
    pub(crate) owner: Option<String>,
    /// The application: the `application` label of the subscriptions' metrics.
    pub(crate) application: String,
    pub(crate) create_missing_streams: Option<u32>,
    pub(crate) shutdown_grace: Duration,
    /// What registrations mounted by a bare stream name declared about their retries.
    /// (Checked when declared; applied by `descriptor.rs` when the subscription opens.)
    pub(crate) declared: Mutex<HashMap<String, ruststream::RetryDeclaration>>,
}

impl Connection {
    /// A connection over `admin` (which reads and publishes too) and `store`, opened on the
    /// current runtime.
    pub(crate) fn new(
        admin: Arc<dyn KinesisAdmin>,
        store: SharedLeaseStore,
        harness: Harness,
        owner: Option<String>,
        create_missing_streams: Option<u32>,
        shutdown_grace: Duration,
    ) -> Self {
        Self {
            api: admin.clone(),
            admin,
            store,
            runtime: RuntimeHandle::current(),
            closed: AtomicBool::new(false),
            subscriptions: Mutex::new(Vec::new()),
            streams: Mutex::new(HashSet::new()),
            stopping: Mutex::default(),
            harness,
            owner,
            application: crate::telemetry::DEFAULT_APPLICATION.to_owned(),
            create_missing_streams,
            shutdown_grace,
            declared: Mutex::default(),
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// `Err(ShutDown)` once the connection is shut down.
    pub(crate) fn check_open(&self) -> Result<(), KinesisError> {
        if self.is_closed() {
            Err(KinesisError::ShutDown)
        } else {
            Ok(())
        }
    }

    /// Closes the connection: every subscription stops gracefully within the shutdown grace,
    /// and every handle answers [`KinesisError::ShutDown`] from now on. Returns how many
    /// subscriptions stopped in time and how many did not.
    pub(crate) async fn close(&self) -> (usize, usize) {
        self.closed.store(true, Ordering::Release);
        let handles = std::mem::take(
            &mut *self
                .subscriptions
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let total = handles.len();
        let grace = self.shutdown_grace;
        let stops: Vec<_> = handles
            .into_iter()
            .map(|handle| {
                self.runtime.spawn(async move {
                    tokio::time::timeout(grace, handle.shutdown()).await.is_ok()
                })
            })
            .collect();
        let mut stopped = 0;
        for stop in stops {
            // A bound on top of the task's own: the runtime may be winding down.
            if let Ok(Ok(true)) =
                tokio::time::timeout(grace + Duration::from_millis(500), stop).await
            {
                stopped += 1;
            }
        }
        tracing::info!(
            stopped,
            unfinished = total - stopped,
            "Kinesis broker shut down"
        );
        (stopped, total - stopped)
    }

    /// Claims `stream` for one subscription of this connection: a second one would only
    /// compete with the first for the same shards, so it is refused until the first closes.
    pub(crate) fn claim(self: &Arc<Self>, stream: &str) -> Result<StreamClaim, KinesisError> {
        let mut streams = self
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !streams.insert(stream.to_owned()) {
            return Err(KinesisError::AlreadySubscribed {
                stream: stream.to_owned(),
            });
        }
        Ok(StreamClaim {
            inner: self.clone(),
            stream: stream.to_owned(),
        })
    }

    /// A subscription of `stream` was dropped and stops in the background.
    pub(crate) fn stopping(&self, stream: &str, handle: ShutdownHandle) {
        self.stopping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(stream.to_owned(), handle);
    }

    /// Waits (at most the shutdown grace) until a dropped subscription of `stream` handed its
    /// leases back, so that a new one takes the shards at once rather than at a later listing.
    pub(crate) async fn wait_stopped(&self, stream: &str) {
        let handle = self
            .stopping
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(stream);
        if let Some(handle) = handle {
            let _ = tokio::time::timeout(self.shutdown_grace, handle.shutdown()).await;
        }
    }

    /// Creates `stream` with `shards` shards when it does not exist, then waits until it is ACTIVE.
    pub(crate) async fn ensure_stream(
        &self,
        stream: &str,
        shards: u32,
    ) -> Result<(), KinesisError> {
        // In process a stream has one shard (see `in_process`).
        let shards = if self.harness.in_process() { 1 } else { shards };
        let started = Instant::now();
        let mut created = false;
        loop {
            match self.api.describe_stream_summary(stream).await {
                Ok(summary) => match summary.status {
                    StreamStatus::Active | StreamStatus::Updating => return Ok(()),
                    StreamStatus::Creating => {}
                    StreamStatus::Deleting => {
                        return Err(KinesisError::InvalidArgument {
                            operation: Operation::DescribeStreamSummary,
                            stream: stream.to_owned(),
                            message: "the stream is being deleted; create it again once it is gone"
                                .into(),
                            source: None,
                        });
                    }
                },
                Err(KinesisError::StreamNotFound { .. }) if !created => {
                    tracing::info!(stream, shards, "creating missing stream");
                    match self.admin.create_stream(stream, shards).await {
                        Ok(()) => {}
                        // Another instance created it meanwhile: wait for it like for ours.
                        Err(KinesisError::ResourceInUse { .. }) => {}
                        Err(e) => return Err(e),
                    }
                    created = true;
                }
                Err(KinesisError::StreamNotFound { .. }) => {}
                Err(e) if e.is_retryable() => {}
                Err(e) => return Err(e),
            }
            if started.elapsed() > ACTIVE_TIMEOUT {
                return Err(KinesisError::Service {
                    operation: Operation::DescribeStreamSummary,
                    stream: stream.to_owned(),
                    message: format!("the stream was not ACTIVE after {ACTIVE_TIMEOUT:?}"),
                    source: None,
                });
            }
            tokio::time::sleep(Duration::from_millis(if created { 200 } else { 100 })).await;
        }
    }

    /// Records a subscription so shutdown stops it. Refused (and the subscription stopped)
    /// when the connection closed meanwhile.
    pub(crate) fn register(&self, handle: ShutdownHandle) -> Result<(), KinesisError> {
        let mut subscriptions = self
            .subscriptions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.is_closed() {
            drop(subscriptions);
            self.runtime.spawn(async move { handle.shutdown().await });
            return Err(KinesisError::ShutDown);
        }
        // Keep the list to the subscriptions still running.
        subscriptions.retain(|h| !h.is_stopped());
        subscriptions.push(handle);
        Ok(())
    }
}

/// One subscription's hold on its stream within a connection (see [`Connection::claim`]).
pub(crate) struct StreamClaim {
    inner: Arc<Connection>,
    stream: String,
}

impl Drop for StreamClaim {
    fn drop(&mut self) {
        self.inner
            .streams
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.stream);
    }
}

/// A connected [`KinesisBroker`](super::KinesisBroker): the clients, the lease store, and the subscriptions opened
/// through it. Clones share one connection; shutting one down shuts down all.
#[derive(Clone)]
pub struct ConnectedKinesis {
    pub(crate) inner: Arc<Connection>,
}

impl fmt::Debug for ConnectedKinesis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectedKinesis")
            .field("region", &self.inner.api.region())
            .field("closed", &self.inner.is_closed())
            .finish_non_exhaustive()
    }
}

impl ConnectedKinesis {
    /// The Kinesis client behind this connection.
    #[must_use]
    pub fn kinesis(&self) -> SharedKinesis {
        self.inner.api.clone()
    }

    /// True once [`shutdown`](ruststream::ConnectedBroker::shutdown) was called on this connection or a
    /// clone of it.
    #[must_use]
    pub fn is_shut_down(&self) -> bool {
        self.inner.is_closed()
    }
}
