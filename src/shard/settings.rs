//! How a shard reader paces and sizes its reads.

use std::time::Duration;

use crate::api::MAX_GET_RECORDS_LIMIT;
use crate::error::KinesisError;

/// The default wait after a read that returned no records.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(1);
/// The default number of records one GetRecords call asks for.
pub const DEFAULT_BATCH_SIZE: u32 = 1_000;
/// The service's limit of GetRecords calls per shard and second, shared by every consumer.
pub const SERVICE_READS_PER_SECOND: u32 = 5;
/// The wait after a failed call before the same call is tried again.
pub const DEFAULT_FAILURE_BACKOFF: Duration = Duration::from_secs(1);
/// The longest wait a setting may ask for (one hour): longer than any iterator lives.
pub const MAX_WAIT: Duration = Duration::from_secs(60 * 60);
/// How many calls may fail in a row before the reader stops.
pub const DEFAULT_MAX_FAILURES: u32 = 11;
/// The longest a reader waits for the answer to one of its calls: GetShardIterator and
/// GetRecords, and with enhanced fan-out SubscribeToShard and the consumer's
/// DescribeStreamConsumer and RegisterStreamConsumer. A call still unanswered then (a
/// connection gone half-open, which the SDK's default timeouts do not bound) is given up and
/// counts as a failed call, retried after the failure backoff, so it cannot hold its shard
/// unread while the lease is renewed.
pub const READ_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest an enhanced fan-out reader waits for its subscription's next event (two
/// minutes). The service sends an event every few seconds on an open subscription, with no
/// records when none arrive (its continuation sequence number records the progress even then),
/// so a subscription silent this long has lost its connection without an error (one gone
/// half-open: the SDK does not bound an event stream's silence). The reader drops it and
/// subscribes again after the last event's continuation: reported as a lost connection, as
/// one cut mid-stream is, when it had sent events; quietly when it had sent none, since a
/// transport may send none on an idle shard (the in-memory one from a shard's first position
/// until a record arrives). The wait runs only while the reader waits for an event: a consumer
/// that does not take its records is not timed.
pub const SUBSCRIPTION_IDLE_LIMIT: Duration = Duration::from_secs(120);

/// The pacing and sizing of one shard reader.
///
/// ```
/// use std::time::Duration;
/// use kinesis_dataflow::ReadSettings;
///
/// // Two applications read this stream: keep this one to half the shard's read budget.
/// let settings = ReadSettings::default()
///     .poll_interval(Duration::from_millis(500))
///     .max_reads_per_second(2)
///     .batch_size(500);
/// assert!(settings.validate().is_ok());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadSettings {
    pub(crate) poll_interval: Duration,
    pub(crate) max_reads_per_second: Option<u32>,
    pub(crate) batch_size: u32,
    pub(crate) failure_backoff: Duration,
    pub(crate) max_failures: u32,
    pub(crate) background_reads: bool,
    pub(crate) deaggregate: bool,
    pub(crate) discard_misplaced: bool,
    /// Enhanced fan-out with this consumer name; `None` for polling.
    pub(crate) fan_out: Option<String>,
}

impl Default for ReadSettings {
    fn default() -> Self {
        Self {
            poll_interval: DEFAULT_POLL_INTERVAL,
            max_reads_per_second: Some(SERVICE_READS_PER_SECOND),
            batch_size: DEFAULT_BATCH_SIZE,
            failure_backoff: DEFAULT_FAILURE_BACKOFF,
            max_failures: DEFAULT_MAX_FAILURES,
            background_reads: true,
            deaggregate: false,
            discard_misplaced: false,
            fan_out: None,
        }
    }
}

impl ReadSettings {
    /// The wait after a read that returned no records, and after a throttled read
    /// (default 1 s).
    #[must_use]
    pub fn poll_interval(mut self, interval: Duration) -> Self {
        self.poll_interval = interval;
        self
    }

    /// The most GetRecords calls per second on one shard (default 5, the service's limit,
    /// which every consumer of the shard shares). Lower it when several applications read the
    /// stream.
    #[must_use]
    pub fn max_reads_per_second(mut self, reads: u32) -> Self {
        self.max_reads_per_second = Some(reads);
        self
    }

    /// Lifts the read-rate cap, for an emulator that does not enforce the service's limit
    /// (benchmarks). Against AWS the service then throttles instead.
    #[must_use]
    pub fn unlimited_reads(mut self) -> Self {
        self.max_reads_per_second = None;
        self
    }

    /// How many records one GetRecords call asks for (default 1,000; at most 10,000).
    #[must_use]
    pub fn batch_size(mut self, records: u32) -> Self {
        self.batch_size = records;
        self
    }

    /// The wait after a failed call before it is tried again (default 1 s).
    #[must_use]
    pub fn failure_backoff(mut self, wait: Duration) -> Self {
        self.failure_backoff = wait;
        self
    }

    /// How many calls may fail in a row before the reader stops (default 11).
    #[must_use]
    pub fn max_failures(mut self, failures: u32) -> Self {
        self.max_failures = failures;
        self
    }

    /// Whether a read runs as a tokio task of its own (default: on, when the stream is polled
    /// on a tokio runtime). Decoding an answer then uses any worker thread while the consumer
    /// handles other shards, and a reader started by a poll keeps going through empty reads
    /// until it has records to hand on (still at most one answer buffered). Off, the read only
    /// makes progress while the stream is polled, and each answer is decoded by the task that
    /// consumes it, in line with the consumer's own work. In the project's drain benchmark
    /// the two cost the same CPU per record within what the machine can tell (BENCHMARKS.md,
    /// *User and kernel time*); on suits a consumer whose own work per record is heavy, off
    /// one that wants every answer decoded on its own task.
    #[must_use]
    pub fn background_reads(mut self, on: bool) -> Self {
        self.background_reads = on;
        self
    }

    /// Whether KPL-aggregated records are taken apart into their user records (default: off,
    /// and an aggregate is reported as [`KinesisError::AggregatedRecord`] and skipped). On,
    /// each user record is a [`Record`](crate::Record) of its own, with its partition key,
    /// explicit hash key, data (a slice of the aggregate's buffer), the aggregate's sequence
    /// number and its [sub-sequence number](crate::Record::sub_sequence_number); other records
    /// pass unchanged. A subscription then checkpoints user by user record, so a restart in
    /// the middle of an aggregate resumes after its last settled user record. See
    /// [`crate::kpl`] for what happens to broken aggregates.
    #[must_use]
    pub fn deaggregate(mut self, on: bool) -> Self {
        self.deaggregate = on;
        self
    }

    /// With [`deaggregate`](Self::deaggregate): what happens to an aggregate holding user
    /// records whose hash key lies outside the range of the shard it was read from (put
    /// against a stale shard map). Off (the default), they are delivered with a warning: a
    /// record is never lost. On, the whole aggregate is dropped, as the KCL does, because the
    /// KPL puts such user records again to the right shard; turn it on only when every
    /// producer of the stream is the KPL (see [`crate::kpl`]). Applies where the shard's hash
    /// range is known: in a subscription, and on a [`ShardStream`](crate::ShardStream) given
    /// one with [`ShardStreamBuilder::hash_key_range`](crate::shard::ShardStreamBuilder::hash_key_range).
    #[must_use]
    pub fn discard_misplaced_user_records(mut self, on: bool) -> Self {
        self.discard_misplaced = on;
        self
    }

    /// Reads with enhanced fan-out as the stream consumer `consumer` instead of polling
    /// (default: polling). The consumer is registered when missing (never deregistered by the
    /// reader: other instances use it; see [`crate::shard::deregister_consumer`]), and each
    /// shard is read through SubscribeToShard: the service pushes records as they arrive, with
    /// a read budget of its own for this consumer (2 MB/s per shard), and no GetRecords
    /// polling. The starting rules, the records and the failure rules are those of polling;
    /// see [`crate::shard`] for what differs.
    #[must_use]
    pub fn fan_out(mut self, consumer: impl Into<String>) -> Self {
        self.fan_out = Some(consumer.into());
        self
    }

    /// Reads by polling GetRecords (the default; undoes [`fan_out`](Self::fan_out)).
    #[must_use]
    pub fn polling(mut self) -> Self {
        self.fan_out = None;
        self
    }

    /// The fan-out consumer name, when reading with enhanced fan-out.
    #[must_use]
    pub fn fan_out_consumer(&self) -> Option<&str> {
        self.fan_out.as_deref()
    }

    /// The shortest gap between two GetRecords calls that the read-rate cap allows.
    pub(crate) fn min_gap(&self) -> Option<Duration> {
        self.max_reads_per_second
            .map(|n| Duration::from_secs(1) / n.max(1))
    }

    /// Checks every setting; the error names the setting and the refused value.
    ///
    /// # Errors
    ///
    /// [`KinesisError::InvalidConfig`] for a zero poll interval, a zero read rate, a batch
    /// size outside 1..=10,000, or zero allowed failures.
    pub fn validate(&self) -> Result<(), KinesisError> {
        if self.poll_interval.is_zero() {
            return Err(KinesisError::InvalidConfig {
                setting: "poll_interval",
                value: format!("{:?}", self.poll_interval),
                reason: "must be more than zero, or an idle shard is read in a busy loop".into(),
            });
        }
        for (setting, value) in [
            ("poll_interval", self.poll_interval),
            ("failure_backoff", self.failure_backoff),
        ] {
            if value > MAX_WAIT {
                return Err(KinesisError::InvalidConfig {
                    setting,
                    value: format!("{value:?}"),
                    reason: format!("must be at most {MAX_WAIT:?}"),
                });
            }
        }
        if self.max_reads_per_second == Some(0) {
            return Err(KinesisError::InvalidConfig {
                setting: "max_reads_per_second",
                value: "0".into(),
                reason: "must be at least 1 (use `unlimited_reads()` to lift the cap)".into(),
            });
        }
        if !(1..=MAX_GET_RECORDS_LIMIT).contains(&self.batch_size) {
            return Err(KinesisError::InvalidConfig {
                setting: "batch_size",
                value: self.batch_size.to_string(),
                reason: format!("GetRecords takes 1 to {MAX_GET_RECORDS_LIMIT} records per call"),
            });
        }
        if self.max_failures == 0 {
            return Err(KinesisError::InvalidConfig {
                setting: "max_failures",
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        if let Some(consumer) = &self.fan_out
            && let Err(reason) = crate::api::check_consumer_name(consumer)
        {
            return Err(KinesisError::InvalidConfig {
                setting: "fan_out",
                value: consumer.clone(),
                reason,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_settings_name_themselves() {
        let e = ReadSettings::default()
            .batch_size(0)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("batch_size"), "{e}");
        let e = ReadSettings::default()
            .batch_size(10_001)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("10001"), "{e}");
        let e = ReadSettings::default()
            .poll_interval(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("poll_interval"), "{e}");
        let e = ReadSettings::default()
            .max_reads_per_second(0)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("max_reads_per_second"), "{e}");
        let e = ReadSettings::default()
            .poll_interval(Duration::MAX)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("poll_interval"), "{e}");
        assert_eq!(
            ReadSettings::default().min_gap(),
            Some(Duration::from_millis(200))
        );
        assert_eq!(ReadSettings::default().unlimited_reads().min_gap(), None);
        let e = ReadSettings::default()
            .fan_out("my app")
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("my app"), "{e}");
        assert!(
            ReadSettings::default()
                .fan_out("my-app.v2")
                .validate()
                .is_ok()
        );
    }
}
