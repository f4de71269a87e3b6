//! Metrics through the [`metrics`](https://docs.rs/metrics) facade: the application installs
//! the recorder (exporter) it wants; without one every handle is a no-op, and without the
//! `metrics` feature (on by default) nothing here is compiled in.
//!
//! Handles are registered once per shard (or stream, or publisher), when it is opened, and
//! only updated afterwards: a recorder must be installed before a subscription starts.
//! Every name and its labels are in the guide's "Metrics" table
//! (docs/guide/metrics_and_tracing.md).

#[cfg(feature = "metrics")]
use std::sync::Arc;
use std::time::Duration;

/// Counts of settlements on one shard, for logs and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct AckCounts {
    /// Deliveries acknowledged.
    pub(crate) acked: u64,
    /// Deliveries skipped.
    pub(crate) skipped: u64,
    /// Deliveries dropped without settlement.
    pub(crate) dropped: u64,
    /// Deliveries abandoned (dropped while panicking, or after the shard was closed).
    pub(crate) abandoned: u64,
    /// Records written to the dead-letter destination.
    pub(crate) dead_lettered: u64,
    /// Deliveries handed out and not settled yet.
    pub(crate) in_flight: u64,
    /// Deliveries sent back for redelivery.
    pub(crate) retried: u64,
    /// Deliveries taken back because they were not settled within the deadline.
    pub(crate) timed_out: u64,
    /// Records handed out for the first time.
    pub(crate) delivered: u64,
    /// Their payload bytes.
    pub(crate) delivered_bytes: u64,
}

/// Label value of `application` when none was set.
pub(crate) const DEFAULT_APPLICATION: &str = "kinesis-dataflow";

/// A GetRecords outcome, as counted.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Read {
    Records,
    Empty,
    Throttled,
    Failed,
    ExpiredIterator,
}

#[cfg(feature = "metrics")]
mod handles {
    use metrics::{Counter, Gauge, Histogram, counter, gauge, histogram};

    pub(super) struct Shard {
        pub(super) delivered_records: Counter,
        pub(super) delivered_bytes: Counter,
        pub(super) settled: [Counter; 6],
        pub(super) in_flight: Gauge,
        pub(super) behind: Gauge,
        pub(super) reads: [Counter; 5],
        pub(super) checkpoints_ok: Counter,
        pub(super) checkpoints_failed: Counter,
        pub(super) checkpoint_age: Gauge,
        pub(super) subscribe_refused: Counter,
    }

    impl Shard {
        pub(super) fn new(application: &str, stream: &str, shard: &str) -> Self {
            let labels = [
                ("application", application.to_owned()),
                ("stream", stream.to_owned()),
                ("shard", shard.to_owned()),
            ];
            let settled = |outcome: &'static str| {
                let mut l = labels.to_vec();
                l.push(("outcome", outcome.to_owned()));
                counter!("kinesis_dataflow_records_settled_total", &l)
            };
            let read = |outcome: &'static str| {
                let mut l = labels.to_vec();
                l.push(("outcome", outcome.to_owned()));
                counter!("kinesis_dataflow_get_records_total", &l)
            };
            let write = |outcome: &'static str| {
                let mut l = labels.to_vec();
                l.push(("outcome", outcome.to_owned()));
                counter!("kinesis_dataflow_checkpoint_writes_total", &l)
            };
            Self {
                delivered_records: counter!("kinesis_dataflow_records_delivered_total", &labels),
                delivered_bytes: counter!("kinesis_dataflow_bytes_delivered_total", &labels),
                settled: [
                    settled("acked"),
                    settled("skipped"),
                    settled("dropped"),
                    settled("abandoned"),
                    settled("dead_lettered"),
                    settled("retried"),
                ],
                in_flight: gauge!("kinesis_dataflow_records_in_flight", &labels),
                behind: gauge!("kinesis_dataflow_behind_latest_seconds", &labels),
                reads: [
                    read("records"),
                    read("empty"),
                    read("throttled"),
                    read("failed"),
                    read("expired_iterator"),
                ],
                checkpoints_ok: write("ok"),
                checkpoints_failed: write("failed"),
                checkpoint_age: gauge!("kinesis_dataflow_checkpoint_age_seconds", &labels),
                subscribe_refused: counter!("kinesis_dataflow_subscribe_refused_total", &labels),
            }
        }
    }

    pub(super) struct Leases {
        pub(super) held: Gauge,
        pub(super) taken: Counter,
        pub(super) lost: Counter,
        pub(super) handed_off: Counter,
        pub(super) take_seconds: Histogram,
        pub(super) hand_off_seconds: Histogram,
    }

    impl Leases {
        pub(super) fn new(application: &str, stream: &str) -> Self {
            let labels = [
                ("application", application.to_owned()),
                ("stream", stream.to_owned()),
            ];
            Self {
                held: gauge!("kinesis_dataflow_leases_held", &labels),
                taken: counter!("kinesis_dataflow_leases_taken_total", &labels),
                lost: counter!("kinesis_dataflow_leases_lost_total", &labels),
                handed_off: counter!("kinesis_dataflow_leases_handed_off_total", &labels),
                take_seconds: histogram!("kinesis_dataflow_lease_take_seconds", &labels),
                hand_off_seconds: histogram!("kinesis_dataflow_lease_hand_off_seconds", &labels),
            }
        }
    }

    pub(super) struct Publisher {
        pub(super) ok: Counter,
        pub(super) failed: Counter,
        pub(super) retries: Counter,
        pub(super) throttled: Counter,
        pub(super) batch_records: Histogram,
    }

    impl Publisher {
        pub(super) fn new(stream: &str) -> Self {
            let labels = [("stream", stream.to_owned())];
            let records = |outcome: &'static str| {
                let mut l = labels.to_vec();
                l.push(("outcome", outcome.to_owned()));
                counter!("kinesis_dataflow_published_records_total", &l)
            };
            Self {
                ok: records("ok"),
                failed: records("failed"),
                retries: counter!("kinesis_dataflow_publish_retries_total", &labels),
                throttled: counter!("kinesis_dataflow_publish_throttled_total", &labels),
                batch_records: histogram!("kinesis_dataflow_publish_batch_records", &labels),
            }
        }
    }
}

/// One shard's handles: what its reader, ledger and keeper count.
#[derive(Clone, Default)]
pub(crate) struct ShardMetrics {
    #[cfg(feature = "metrics")]
    handles: Option<Arc<handles::Shard>>,
}

impl std::fmt::Debug for ShardMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ShardMetrics")
    }
}

impl ShardMetrics {
    /// Registers the handles of one shard.
    #[allow(unused_variables)]
    pub(crate) fn new(application: &str, stream: &str, shard: &str) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            handles: Some(Arc::new(handles::Shard::new(application, stream, shard))),
        }
    }

    /// Adds what the ledger counted since `before` (deliveries, their bytes, settlements)
    /// and sets the records in flight. The ledger counts per record under its own lock; the
    /// shard's keeper reports here at every renewal and checkpoint, so recording costs
    /// nothing per record.
    #[allow(unused_variables)]
    pub(crate) fn ledger(&self, before: &AckCounts, now: &AckCounts) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            let delta = |now: u64, before: u64| now.saturating_sub(before);
            h.delivered_records
                .increment(delta(now.delivered, before.delivered));
            h.delivered_bytes
                .increment(delta(now.delivered_bytes, before.delivered_bytes));
            let settled = [
                delta(now.acked, before.acked),
                delta(now.skipped, before.skipped),
                delta(now.dropped, before.dropped),
                delta(now.abandoned, before.abandoned),
                delta(now.dead_lettered, before.dead_lettered),
                delta(now.retried, before.retried),
            ];
            for (counter, n) in h.settled.iter().zip(settled) {
                counter.increment(n);
            }
            h.in_flight.set(now.in_flight as f64);
        }
    }

    /// A GetRecords answer (or a fan-out event), with how far behind the tip it was.
    #[allow(unused_variables)]
    pub(crate) fn read(&self, outcome: Read, millis_behind_latest: Option<u64>) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.reads[outcome as usize].increment(1);
            if let Some(ms) = millis_behind_latest {
                h.behind.set(ms as f64 / 1000.0);
            }
        }
    }

    /// A SubscribeToShard refused for now (in use, or throttled): the shard is read by
    /// GetRecords meanwhile.
    pub(crate) fn subscribe_refused(&self) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.subscribe_refused.increment(1);
        }
    }

    /// A checkpoint write, and how long the settled progress has waited to be written (zero
    /// when the written checkpoint covers it).
    #[allow(unused_variables)]
    pub(crate) fn checkpoint(&self, wrote: Option<bool>, age: Duration) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            match wrote {
                Some(true) => h.checkpoints_ok.increment(1),
                Some(false) => h.checkpoints_failed.increment(1),
                None => {}
            }
            h.checkpoint_age.set(age.as_secs_f64());
        }
    }
}

/// One stream's lease handles, for a subscription.
#[derive(Clone, Default)]
pub(crate) struct LeaseMetrics {
    #[cfg(feature = "metrics")]
    handles: Option<Arc<handles::Leases>>,
}

impl std::fmt::Debug for LeaseMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseMetrics")
    }
}

impl LeaseMetrics {
    /// Registers the handles of one stream.
    #[allow(unused_variables)]
    pub(crate) fn new(application: &str, stream: &str) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            handles: Some(Arc::new(handles::Leases::new(application, stream))),
        }
    }

    /// How many shards this instance reads now.
    #[allow(unused_variables)]
    pub(crate) fn held(&self, shards: usize) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.held.set(shards as f64);
        }
    }

    /// A lease taken, and how long from the take's start until its reader was ready.
    #[allow(unused_variables)]
    pub(crate) fn taken(&self, took: Duration) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.taken.increment(1);
            h.take_seconds.record(took.as_secs_f64());
        }
    }

    /// A lease lost to another instance (or run out).
    pub(crate) fn lost(&self) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.lost.increment(1);
        }
    }

    /// A lease handed back (balancing, a stop), and how long from the order to the release.
    #[allow(unused_variables)]
    pub(crate) fn handed_off(&self, took: Duration) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.handed_off.increment(1);
            h.hand_off_seconds.record(took.as_secs_f64());
        }
    }
}

/// A publisher's handles.
#[derive(Clone, Default)]
pub(crate) struct PublishMetrics {
    #[cfg(feature = "metrics")]
    handles: Option<Arc<handles::Publisher>>,
}

impl std::fmt::Debug for PublishMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PublishMetrics")
    }
}

impl PublishMetrics {
    /// Registers the handles of a publisher to `stream`.
    #[allow(unused_variables)]
    pub(crate) fn new(stream: &str) -> Self {
        Self {
            #[cfg(feature = "metrics")]
            handles: Some(Arc::new(handles::Publisher::new(stream))),
        }
    }

    /// One PutRecords call of `size` records.
    #[allow(unused_variables)]
    pub(crate) fn call(&self, size: usize) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.batch_records.record(size as f64);
        }
    }

    /// Records stored.
    #[allow(unused_variables)]
    pub(crate) fn stored(&self, records: usize) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.ok.increment(records as u64);
        }
    }

    /// A record turned away (sent again, unless the publish gives up); `throttled` when by a
    /// shard's write limit or a throttled call.
    #[allow(unused_variables)]
    pub(crate) fn turned_away(&self, throttled: bool) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.retries.increment(1);
            if throttled {
                h.throttled.increment(1);
            }
        }
    }

    /// Records given up on: the publish failed for them.
    #[allow(unused_variables)]
    pub(crate) fn failed(&self, records: usize) {
        #[cfg(feature = "metrics")]
        if let Some(h) = &self.handles {
            h.failed.increment(records as u64);
        }
    }
}
