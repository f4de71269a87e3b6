//! How a publisher sizes its calls, retries failures and orders a key's records.

use std::time::Duration;

use crate::error::KinesisError;
use crate::jitter::Jitter;

/// The most records one PutRecords call takes (the service's limit, and the default).
pub const MAX_RECORDS_PER_CALL: usize = 500;
/// The most bytes of data and partition keys one PutRecords call takes (5 MiB, the service's
/// limit, and the default).
pub const MAX_BYTES_PER_CALL: usize = 5 * 1024 * 1024;
/// The most bytes of data and partition key one record may take (1 MiB).
pub const MAX_RECORD_BYTES: usize = 1024 * 1024;
/// The most Unicode characters a partition key may have.
pub const MAX_PARTITION_KEY_CHARS: usize = 256;

/// The default number of rounds a batch is sent in: the first send and up to seven resends.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 8;
/// The default wait before the first resend.
pub const DEFAULT_INITIAL_BACKOFF: Duration = Duration::from_millis(100);
/// The default cap on the wait between two rounds.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The longest a publisher waits for one PutRecords answer. A call still unanswered then (a
/// connection gone half-open after the request was sent, which the SDK's default timeouts do
/// not bound) is given up as a retryable failure whose outcome is unknown, and its records are
/// sent again in the next round: they may be stored twice, never lost, and a collected
/// publisher's call slot is not held for good.
pub const PUT_CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How the records of one partition key are spread over PutRecords calls.
///
/// See the [module docs](super) for the guarantee each mode gives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum KeyOrder {
    /// A call carries as many records of a key as fit (the default). A key's records are
    /// stored in publish order unless the service fails an entry and stores a later entry of
    /// the same key *from the same call*; the publisher cannot undo that, and reports it with
    /// a `warn` event.
    #[default]
    Batched,
    /// A call carries at most one record of each key, and a key's next record is sent only
    /// after the previous one is stored: a key's records are always stored in publish order.
    /// Many keys still share a call; a batch of one hot key takes one call per record.
    Strict,
}

/// How failed records are retried: how many rounds, and the backoff between them.
///
/// A round is followed, when records are left, by a wait of
/// `min(initial_backoff * 2^(n-1), max_backoff)`, where `n` counts the rounds in a row that
/// stored nothing and failed otherwise than on the shards' write limits (at least 1), of
/// which a random half is taken off ("equal jitter": the wait lies between half the step and
/// the whole step). Rounds whose only failures were write limits wait the first step, do not
/// count against [`max_attempts`](Self::max_attempts), and go on for
/// [`patience`](Self::patience); see the [module docs](super). The randomness
/// comes from a small xorshift generator seeded from the stream name and the tokio clock's
/// time since the publish began, so a test on paused tokio time sees the same waits every run.
///
/// ```
/// use std::time::Duration;
/// use kinesis_dataflow::publish::RetryPolicy;
///
/// let patient = RetryPolicy::default()
///     .max_attempts(20)
///     .initial_backoff(Duration::from_millis(50))
///     .max_backoff(Duration::from_secs(2));
/// assert!(patient.validate().is_ok());
/// assert_eq!(RetryPolicy::no_retries(), RetryPolicy::default().max_attempts(1));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RetryPolicy {
    pub(crate) max_attempts: u32,
    initial_backoff: Duration,
    max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            initial_backoff: DEFAULT_INITIAL_BACKOFF,
            max_backoff: DEFAULT_MAX_BACKOFF,
        }
    }
}

impl RetryPolicy {
    /// One round only: whatever fails is returned at once in
    /// [`KinesisError::PublishFailed`].
    #[must_use]
    pub fn no_retries() -> Self {
        Self::default().max_attempts(1)
    }

    /// How many rounds a batch is sent in, the first send included (default 8), not counting
    /// rounds whose only failures were the shards' write limits. Each round sends every
    /// record not yet stored once, except those held back behind an earlier record of their
    /// key that failed in the same round.
    #[must_use]
    pub fn max_attempts(mut self, attempts: u32) -> Self {
        self.max_attempts = attempts;
        self
    }

    /// The wait before the first resend (default 100 ms); it doubles with each round in a
    /// row that stored nothing, and a round that stored some records resets it.
    #[must_use]
    pub fn initial_backoff(mut self, wait: Duration) -> Self {
        self.initial_backoff = wait;
        self
    }

    /// How long a publish keeps retrying records turned away only by the shards' write
    /// limits: as long as `max_attempts` rounds wait in all, nominally (the steps without
    /// jitter: 11.3 s with the defaults). Such rounds do not count against `max_attempts`.
    #[must_use]
    pub fn patience(&self) -> Duration {
        let mut total = Duration::ZERO;
        let mut step = self.initial_backoff.min(self.max_backoff);
        for round in 1..self.max_attempts {
            if step >= self.max_backoff {
                // Capped from here on: the remaining rounds at once.
                let rest = self.max_attempts - round;
                return total.saturating_add(self.max_backoff.saturating_mul(rest));
            }
            total = total.saturating_add(step);
            step = step.saturating_mul(2).min(self.max_backoff);
        }
        total
    }

    /// The cap on the wait between two rounds (default 5 s).
    #[must_use]
    pub fn max_backoff(mut self, wait: Duration) -> Self {
        self.max_backoff = wait;
        self
    }

    /// Checks the policy; the error names the setting and the refused value.
    ///
    /// # Errors
    ///
    /// [`KinesisError::InvalidConfig`] for zero attempts, a zero first wait, or a cap below
    /// the first wait.
    pub fn validate(&self) -> Result<(), KinesisError> {
        if self.max_attempts == 0 {
            return Err(KinesisError::InvalidConfig {
                setting: "max_attempts",
                value: "0".into(),
                reason: "must be at least 1 (1 sends each record once and never retries)".into(),
            });
        }
        if self.initial_backoff.is_zero() {
            return Err(KinesisError::InvalidConfig {
                setting: "initial_backoff",
                value: format!("{:?}", self.initial_backoff),
                reason: "must be more than zero, or a throttled shard is retried in a busy loop"
                    .into(),
            });
        }
        if self.max_backoff < self.initial_backoff {
            return Err(KinesisError::InvalidConfig {
                setting: "max_backoff",
                value: format!("{:?}", self.max_backoff),
                reason: format!(
                    "must be at least the initial backoff ({:?})",
                    self.initial_backoff
                ),
            });
        }
        Ok(())
    }

    /// The wait after round `round` (1 for the first send), with jitter from `jitter`.
    pub(crate) fn backoff(&self, round: u32, jitter: &mut Jitter) -> Duration {
        let doublings = round.saturating_sub(1).min(63);
        let step = self
            .initial_backoff
            .checked_mul(1u32 << doublings.min(31))
            .unwrap_or(self.max_backoff)
            .min(self.max_backoff);
        let step_nanos = u64::try_from(step.as_nanos()).unwrap_or(u64::MAX);
        let half = step_nanos / 2;
        let spread = step_nanos - half;
        let extra = if spread == 0 {
            0
        } else {
            jitter.next() % (spread + 1)
        };
        Duration::from_nanos(half + extra)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patience_is_what_the_counted_rounds_would_wait_in_all() {
        let ms = Duration::from_millis;
        assert_eq!(RetryPolicy::default().patience(), ms(11_300));
        assert_eq!(RetryPolicy::no_retries().patience(), Duration::ZERO);
        assert_eq!(
            RetryPolicy::default().max_attempts(3).patience(),
            ms(100 + 200)
        );
        let capped = RetryPolicy::default()
            .max_attempts(u32::MAX)
            .max_backoff(Duration::from_secs(1));
        // 100 + 200 + 400 + 800, then 1 s for each of the other rounds: no overflow, no loop.
        assert!(capped.patience() > Duration::from_secs(4_000_000_000));
    }

    #[test]
    fn the_backoff_doubles_from_the_first_wait_up_to_the_cap_with_equal_jitter() {
        let policy = RetryPolicy::default();
        let mut jitter = Jitter::new(7);
        let steps_ms = [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000];
        for (i, step) in steps_ms.into_iter().enumerate() {
            let round = u32::try_from(i).unwrap() + 1;
            for _ in 0..50 {
                let wait = policy.backoff(round, &mut jitter);
                let step = Duration::from_millis(step);
                assert!(
                    wait >= step / 2 && wait <= step,
                    "round {round}: {wait:?} not within [{:?}, {step:?}]",
                    step / 2
                );
            }
        }
        let huge = policy.backoff(u32::MAX, &mut jitter);
        assert!(huge <= DEFAULT_MAX_BACKOFF && huge >= DEFAULT_MAX_BACKOFF / 2);
    }

    #[test]
    fn the_jitter_is_deterministic_per_seed_and_spreads() {
        let policy = RetryPolicy::default();
        let waits = |seed| {
            let mut jitter = Jitter::new(seed);
            (1..=6)
                .map(|round| policy.backoff(round, &mut jitter))
                .collect::<Vec<_>>()
        };
        assert_eq!(waits(1), waits(1));
        assert_ne!(waits(1), waits(2));
        let mut jitter = Jitter::new(0);
        let values: std::collections::HashSet<u64> = (0..100).map(|_| jitter.next()).collect();
        assert_eq!(
            values.len(),
            100,
            "a zero seed still yields a full sequence"
        );
    }

    #[test]
    fn bad_policies_are_refused_with_the_setting_named() {
        let named = |policy: RetryPolicy| match policy.validate() {
            Err(KinesisError::InvalidConfig { setting, .. }) => setting,
            other => panic!("expected InvalidConfig, got {other:?}"),
        };
        assert_eq!(
            named(RetryPolicy::default().max_attempts(0)),
            "max_attempts"
        );
        assert_eq!(
            named(RetryPolicy::default().initial_backoff(Duration::ZERO)),
            "initial_backoff"
        );
        assert_eq!(
            named(RetryPolicy::default().max_backoff(Duration::from_millis(1))),
            "max_backoff"
        );
        assert!(RetryPolicy::no_retries().validate().is_ok());
    }
}
