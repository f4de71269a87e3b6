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
/// Default worker timeout: how long an instance's worker row may go unchanged before the
/// others declare the instance gone and take all its shards (4 s; at most the lease duration).
pub const DEFAULT_WORKER_TIMEOUT: Duration = Duration::from_secs(4);
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
    pub(crate) worker_timeout: Duration,
    pub(crate) checkpoint_interval: Duration,
    pub(crate) shutdown_timeout: Duration,
    pub(crate) max_in_flight: usize,
    pub(crate) max_in_flight_bytes: usize,
    pub(crate) redeliver_dropped: bool,
    pub(crate) max_attempts: Option<u32>,
    pub(crate) settle_within: Option<Duration>,
    pub(crate) dead_letters: Option<Arc<dyn crate::ack::DeadLetters>>,
    /// Asked for a shard's position when it is taken.
    pub(crate) position_source: Option<Arc<dyn super::PositionSource>>,
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
    /// The liveness group of a [`MultiSubscription`](crate::MultiSubscription)'s streams.
    pub(crate) group: Option<Arc<super::group::LivenessGroup>>,
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
            worker_timeout: DEFAULT_WORKER_TIMEOUT,
            checkpoint_interval: DEFAULT_CHECKPOINT_INTERVAL,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            max_in_flight_bytes: DEFAULT_MAX_IN_FLIGHT_BYTES,
            redeliver_dropped: false,
            max_attempts: None,
            settle_within: None,
            dead_letters: None,
            position_source: None,
            clock: Arc::new(TokioClock),
            consumer_arn: None,
            limits: WorkerLimits::default(),
            end_when_deleted: false,
            application: Arc::from(crate::telemetry::DEFAULT_APPLICATION),
            group: None,
        }
    }

    /// The lease holder renews every third of the lease duration.
    pub(crate) fn renew_interval(&self) -> Duration {
        self.lease_duration / 3
    }

    /// How long this instance's worker row may go unchanged before the others declare the
    /// instance gone: the worker timeout, at most the lease duration.
    pub(crate) fn worker_expiry(&self) -> Duration {
        self.worker_timeout.min(self.lease_duration)
    }

    /// The worker row is renewed every third of its expiry.
    pub(crate) fn worker_renew_interval(&self) -> Duration {
        self.worker_expiry() / 3
    }

    /// Every reader stops once the worker row has not been renewed for two thirds of its
    /// expiry, before others may declare the instance gone.
    pub(crate) fn worker_give_up_after(&self) -> Duration {
        self.worker_expiry() * 2 / 3
    }

    /// How long each kind of row may stay unchanged before it has expired.
    pub(crate) fn expiry(&self) -> super::coordinator::Expiry {
        super::coordinator::Expiry {
            lease: self.lease_duration,
            worker: self.worker_expiry(),
        }
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
        let refused = self
            .rules()
            .into_iter()
            .find_map(|(setting, value, reason)| {
                reason.map(|reason| KinesisError::InvalidConfig {
                    setting,
                    value,
                    reason,
                })
            });
        refused.map_or(Ok(()), Err)
    }

    /// Every rule over the settings, in the order they are checked: the setting, its value
    /// rendered, and why it is refused (`None` when it is not).
    fn rules(&self) -> Vec<Rule> {
        let lease = self.lease_duration;
        let weight = self.limits.weight;
        let mut rules = vec![
            self.attempts_rule(),
            duration_rule("list_interval", self.list_interval, false),
            duration_rule("lease_duration", lease, false),
            duration_rule("checkpoint_interval", self.checkpoint_interval, false),
        ];
        rules.extend(
            self.settle_within
                .map(|d| duration_rule("settle_within", d, false)),
        );
        rules.extend([
            duration_rule("shutdown_timeout", self.shutdown_timeout, true),
            rule(
                "lease_duration",
                format!("{lease:?}"),
                lease < Duration::from_millis(300),
                "must be at least 300 ms (renewals run every third of it)",
            ),
            duration_rule("worker_timeout", self.worker_timeout, false),
            rule(
                "worker_timeout",
                format!("{:?}", self.worker_timeout),
                self.worker_timeout < Duration::from_millis(300),
                "must be at least 300 ms (the worker row is renewed every third of it)",
            ),
            rule(
                "capacity",
                weight.to_string(),
                !(1..=MAX_CAPACITY).contains(&weight),
                format!("must be 1 to {MAX_CAPACITY}"),
            ),
            rule(
                "max_leases",
                optional(self.limits.max_leases),
                self.limits.max_leases == Some(0),
                "must be at least 1 (an instance that should read nothing need not run)",
            ),
            rule(
                "owner",
                format!("{:?}", self.owner),
                self.owner.is_empty() || self.owner.len() > 256,
                "must be 1 to 256 characters",
            ),
            rule(
                "max_in_flight_bytes",
                self.max_in_flight_bytes.to_string(),
                self.max_in_flight_bytes == 0,
                "must be at least 1 (a record always passes when nothing is in flight)",
            ),
            rule(
                "max_in_flight",
                self.max_in_flight.to_string(),
                self.max_in_flight == 0,
                "must be at least 1",
            ),
            position_rule("start_at", self.start_at.as_ref()),
            position_rule("initial_position", self.initial_position.as_ref()),
        ]);
        rules
    }

    /// `max_attempts`: at least one delivery, and a dead-letter destination for what runs out.
    fn attempts_rule(&self) -> Rule {
        let value = optional(self.max_attempts);
        let reason = match (self.max_attempts, &self.dead_letters) {
            (Some(0), _) => Some("a record is delivered at least once: use 1 or more"),
            (Some(_), None) => Some(
                "a record past its attempts goes to the dead-letter destination: set \
                 `dead_letters` too",
            ),
            _ => None,
        };
        ("max_attempts", value, reason.map(str::to_owned))
    }
}

/// A setting, its value rendered, and why it is refused (`None` when it is not).
type Rule = (&'static str, String, Option<String>);

fn rule(setting: &'static str, value: String, refused: bool, reason: impl Into<String>) -> Rule {
    (setting, value, refused.then(|| reason.into()))
}

/// An optional count as a message shows it: the number, or `none`.
fn optional(count: Option<impl ToString>) -> String {
    count.map_or_else(|| "none".to_owned(), |n| n.to_string())
}

/// A position setting: one the service would accept (see [`KinesisPosition::refusal`]).
fn position_rule(setting: &'static str, position: Option<&KinesisPosition>) -> Rule {
    let value = position.map_or_else(|| "none".to_owned(), |p| format!("{p:?}"));
    (setting, value, position.and_then(KinesisPosition::refusal))
}

/// A duration setting: more than zero (unless `zero_allowed`) and at most [`MAX_DURATION`].
fn duration_rule(setting: &'static str, value: Duration, zero_allowed: bool) -> Rule {
    let reason = if value.is_zero() && !zero_allowed {
        Some("must be more than zero".to_owned())
    } else if value > MAX_DURATION {
        Some(format!("must be at most {MAX_DURATION:?}"))
    } else {
        None
    };
    (setting, format!("{value:?}"), reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(change: impl FnOnce(&mut SubscriptionConfig)) -> Option<(&'static str, String)> {
        let mut config = SubscriptionConfig::new("instance-a".into());
        change(&mut config);
        match config.validate() {
            Ok(()) => None,
            Err(KinesisError::InvalidConfig { setting, value, .. }) => Some((setting, value)),
            Err(other) => panic!("expected InvalidConfig, got {other:?}"),
        }
    }

    #[test]
    fn the_defaults_pass() {
        assert_eq!(refused(|_| {}), None);
    }

    #[test]
    fn each_rule_names_its_setting_and_the_refused_value() {
        let second = Duration::from_secs(1);
        let day_and_more = MAX_DURATION + second;
        type Change = Box<dyn FnOnce(&mut SubscriptionConfig)>;
        let cases: Vec<(Change, &str, &str)> = vec![
            (Box::new(|c| c.max_attempts = Some(0)), "max_attempts", "0"),
            (Box::new(|c| c.max_attempts = Some(3)), "max_attempts", "3"),
            (
                Box::new(|c| c.list_interval = Duration::ZERO),
                "list_interval",
                "0ns",
            ),
            (
                Box::new(move |c| c.checkpoint_interval = day_and_more),
                "checkpoint_interval",
                "86401s",
            ),
            (
                Box::new(|c| c.settle_within = Some(Duration::ZERO)),
                "settle_within",
                "0ns",
            ),
            (
                Box::new(move |c| c.shutdown_timeout = day_and_more),
                "shutdown_timeout",
                "86401s",
            ),
            (
                Box::new(|c| c.lease_duration = Duration::from_millis(299)),
                "lease_duration",
                "299ms",
            ),
            (Box::new(|c| c.limits.weight = 0), "capacity", "0"),
            (
                Box::new(|c| c.limits.weight = MAX_CAPACITY + 1),
                "capacity",
                "1001",
            ),
            (
                Box::new(|c| c.limits.max_leases = Some(0)),
                "max_leases",
                "0",
            ),
            (Box::new(|c| c.owner = String::new()), "owner", "\"\""),
            (Box::new(|c| c.owner = "o".repeat(257)), "owner", ""),
            (
                Box::new(|c| c.max_in_flight_bytes = 0),
                "max_in_flight_bytes",
                "0",
            ),
            (Box::new(|c| c.max_in_flight = 0), "max_in_flight", "0"),
            (
                Box::new(|c| c.start_at = Some(KinesisPosition::sequence("s", "4959 "))),
                "start_at",
                "Sequence",
            ),
            (
                Box::new(|c| c.initial_position = Some(KinesisPosition::sequence("", "4959"))),
                "initial_position",
                "Sequence",
            ),
        ];
        for (change, setting, value) in cases {
            let (named, shown) = refused(change).unwrap_or_else(|| panic!("{setting}: accepted"));
            assert_eq!(named, setting);
            assert!(shown.starts_with(value), "{setting}: shown as {shown}");
        }
        assert_eq!(refused(|c| c.shutdown_timeout = Duration::ZERO), None);
    }
}
