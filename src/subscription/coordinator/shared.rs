//! [`Shared`]: what the coordinator's jobs and keepers share.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tokio::sync::Semaphore;

use crate::api::SharedKinesis;
use crate::lease::SharedLeaseStore;
use crate::shard::{FirstReads, ReadProbe};
use crate::subscription::config::SubscriptionConfig;
use crate::subscription::gate::WorkerGate;
use crate::telemetry::{LeaseMetrics, ShardMetrics};

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
    /// The slots of every reader's first GetRecords, so that shards taken together are not
    /// all read at the same moment.
    pub(crate) first_reads: Arc<FirstReads>,
    /// What deliveries dropped unsettled become, for every shard's ledger.
    pub(crate) policy: crate::ack::AckPolicy,
    /// How hand-backs went, for the stop log.
    pub(crate) releases: Arc<ReleaseTally>,
    /// Whether this instance's worker row is fresh (every reader's gate asks it); the
    /// liveness group's own gate for its anchor stream.
    pub(crate) worker_gate: Arc<WorkerGate>,
    /// The stream's lease metrics.
    pub(crate) leases: LeaseMetrics,
}

impl Shared {
    /// What the jobs of a subscription of `stream` share, with `config`; `stopping` is set
    /// when the subscription is asked to stop.
    pub(crate) fn new(
        api: SharedKinesis,
        store: SharedLeaseStore,
        stream: Arc<str>,
        config: SubscriptionConfig,
        stopping: Arc<AtomicBool>,
    ) -> Self {
        let policy = crate::ack::AckPolicy {
            redeliver_dropped: config.redeliver_dropped,
            stopping,
            max_attempts: config.max_attempts,
            dead_letters: config.dead_letters.clone(),
            max_in_flight_bytes: Some(config.max_in_flight_bytes),
            settle_within: config.settle_within,
        };
        Self {
            permits: Arc::new(Semaphore::new(super::MAX_WORK)),
            probe: Arc::new(ReadProbe::default()),
            first_reads: Arc::default(),
            policy,
            releases: Arc::default(),
            worker_gate: match &config.group {
                Some(group) if group.is_anchor(&stream) => group.gate().clone(),
                _ => Arc::new(WorkerGate::new(config.worker_give_up_after())),
            },
            leases: LeaseMetrics::new(&config.application, &stream),
            api,
            store,
            stream,
            config,
        }
    }

    /// The span of one shard's reader, inside the subscription's (the current span of the
    /// coordinator's jobs).
    pub(crate) fn shard_span(&self, shard: &str) -> tracing::Span {
        tracing::info_span!("shard", stream = %self.stream, shard = %shard)
    }

    /// Registers the metric handles of one shard.
    pub(crate) fn shard_metrics(&self, shard: &str) -> ShardMetrics {
        ShardMetrics::new(&self.config.application, &self.stream, shard)
    }
}

/// How the hand-backs of a subscription went: final checkpoint written and lease released, or
/// not.
#[derive(Debug, Default)]
pub(crate) struct ReleaseTally {
    released: std::sync::atomic::AtomicUsize,
    failed: std::sync::atomic::AtomicUsize,
}

impl ReleaseTally {
    pub(crate) fn count(&self, released: bool) {
        let counter = if released {
            &self.released
        } else {
            &self.failed
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// (released, failed) so far.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (
            self.released.load(std::sync::atomic::Ordering::Relaxed),
            self.failed.load(std::sync::atomic::Ordering::Relaxed),
        )
    }
}
