//! The settings of a subscription.

use std::sync::Arc;
use std::time::Duration;

use super::clock::{Clock, TokioClock};

use crate::error::KinesisError;
use crate::lease::WorkerLimits;
use crate::position::KinesisPosition;
use crate::shard::ReadSettings;

/// How often the stream's shards are listed.
pub const DEFAULT_LIST_INTERVAL: Duration = Duration::from_secs(10);
/// How long a lease lives without its counter moving before others may take it.
pub const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(10);
/// How often settled progress is written to the lease table, per shard at most.
pub const DEFAULT_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(5);
/// How long a graceful stop or hand-off waits for in-flight deliveries.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest any duration setting may be (one day).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 60 * 60);
/// How many deliveries of one shard may be unsettled before its reader pauses.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 10_000;

/// The largest relative capacity an instance may have.
pub const MAX_CAPACITY: u32 = 1_000;

/// Default bound on the data of a shard's unsettled deliveries: 64 MiB.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 64 << 20;

/// Every setting of a subscription, with the defaults above.
#[derive(Debug, Clone)]
pub(crate) struct SubscriptionConfig {
    pub(crate) owner: String,
    pub(crate) start_at: Option<KinesisPosition>,
    pub(crate) initial_position: Option<KinesisPosition>,
    pub(crate) read: ReadSettings,
    pub(crate) list_interval: Duration,
    pub(crate) lease_duration: Duration,
    pub(crate) checkpoint_interval: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) max_in_flight_bytes: usize,
    pub(crate) redeliver_dropped: bool,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) settle_within: Option<Duration>,
    pub(crate) dead_letters: Option<Arc<dyn crate::ack::DeadLetters>>,
    pub(crate) clock: Arc<dyn Clock>,
    /// With [`ReadSettings::fan_out`]: the consumer's ARN, registered at `start`.
    pub(crate) consumer_arn: Option<String>,
    /// This instance's share relative to the others', and its bound.
    pub(crate) limits: WorkerLimits,
    /// A stream found deleted while running ends the subscription and removes its rows (a
    /// [`MultiSubscription`](crate::MultiSubscription)'s streams); otherwise the listing
    /// reports it and tries again.
    pub(crate) end_when_deleted: bool,
    /// The `application` label of every metric.
    pub(crate) application: Arc<str>,
}

impl SubscriptionConfig {
    pub(crate) fn new(owner: String) -> Self {
        Self {
            owner,
            start_at: None,
            initial_position: None,
            read: ReadSettings::default(),
            list_interval: DEFAULT_LIST_INTERVAL,
            lease_duration: DEFAULT_LEASE_DURATION,
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            redeliver_dropped: false,
            max_attempts: None,
            settle_within: None,
            dead_letters: None,
            clock: Arc::new(TokioClock),
            consumer_arn: None,
            limits: WorkerLimits::default(),
            end_when_deleted: false,
            application: Arc::from(crate::telemetry::DEFAULT_APPLICATION),
        }
    }

    /// The lease holder renews every third of the lease duration.
    pub(crate) fn renew_interval(&self) -> Duration {
        self.lease_duration / 3
    }

    /// The longest a single call to the lease store or to Kinesis may take inside the
    /// background loop: a call that hangs counts as failed, so renewals and the give-up rule
    /// keep their timing.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.renew_interval()
    }

    /// A holder that could not renew for this long stops reading, before others may take
    /// the lease.
    pub(crate) fn give_up_after(&self) -> Duration {
        self.lease_duration * 2 / 3
    }

    pub(crate) fn validate(&self) -> Result<(), KinesisError> {
        self.read.validate()?;
        match (self.max_attempts, &self.dead_letters) {
            (Some(0), _) => {
                return Err(KinesisError::InvalidConfig {
                    setting: "max_attempts",
                    value: "0".into(),
                    reason: "a record is delivered at least once: use 1 or more".into(),
                });
            }
            (Some(n), None) => {
                return Err(KinesisError::InvalidConfig {
                    setting: "max_attempts",
                    value: n.to_string(),
                    reason: "a record past its attempts goes to the dead-letter destination: \
                             set `dead_letters` too"
                        .into(),
                });
            }
            _ => {}
        }
        let positive = [
            ("list_interval", self.list_interval),
            ("lease_duration", self.lease_duration),
            ("checkpoint_interval", self.checkpoint_interval),
        ];
        let optional = self.settle_within.map(|d| ("settle_within", d));
        for (setting, value) in positive
            .into_iter()
            .chain(optional)
            .chain([("shutdown_timeout", self.shutdown_timeout)])
        {
            if value.is_zero() && setting != "shutdown_timeout" {
                return Err(KinesisError::InvalidConfig {
                    setting,
                    value: format!("{value:?}"),
                    reason: "must be more than zero".into(),
                });
            }
            if value > MAX_DURATION {
                return Err(KinesisError::InvalidConfig {
                    setting,
                    value: format!("{value:?}"),
                    reason: format!("must be at most {MAX_DURATION:?}"),
                });
            }
        }
        if self.lease_duration < Duration::from_millis(300) {
            return Err(KinesisError::InvalidConfig {
                setting: "lease_duration",
                value: format!("{:?}", self.lease_duration),
                reason: "must be at least 300 ms (renewals run every third of it)".into(),
            });
        }
        if !(1..=MAX_CAPACITY).contains(&self.limits.weight) {
            return Err(KinesisError::InvalidConfig {
                setting: "capacity",
                value: self.limits.weight.to_string(),
                reason: format!("must be 1 to {MAX_CAPACITY}"),
            });
        }
        if self.limits.max_leases == Some(0) {
            return Err(KinesisError::InvalidConfig {
                setting: "max_leases",
                value: "0".into(),
                reason: "must be at least 1 (an instance that should read nothing need not run)"
                    .into(),
            });
        }
        if self.owner.is_empty() || self.owner.len() > 256 {
            return Err(KinesisError::InvalidConfig {
                setting: "owner",
                value: format!("{:?}", self.owner),
                reason: "must be 1 to 256 characters".into(),
            });
        }
        if self.max_in_flight_bytes == 0 {
            return Err(KinesisError::InvalidConfig {
                setting: "max_in_flight_bytes",
                value: "0".into(),
                reason: "must be at least 1 (a record always passes when nothing is in flight)"
                    .into(),
            });
        }
        if self.max_in_flight == 0 {
            return Err(KinesisError::InvalidConfig {
                setting: "max_in_flight",
                value: "0".into(),
                reason: "must be at least 1".into(),
            });
        }
        Ok(())
    }
}
