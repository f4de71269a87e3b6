//! Where a shard reader starts: positions, checkpoints, and the one rule that combines them.
//!
//! | item | what it is |
//! |---|---|
//! | [`KinesisPosition`] | a position a user names: `horizon()`, `latest()`, `timestamp(ms)`, `sequence(shard, seq)`, `sub_sequence(shard, seq, sub)` |
//! | [`StartingPoint`] | one iterator request: the five GetShardIterator types |
//! | [`Checkpoint`] | what the lease store keeps per shard: a sequence number, or the shard's end |
//!
//! The rule a subscription opens a shard by (`starting_point`, unit-tested here), in order:
//!
//! 1. A reader started at startup with a position from `start_at(..)` opens there, ahead of any
//!    checkpoint. A `sequence(shard, seq)` position names one shard; the other shards are
//!    treated as if no position had been given. A finished shard (its checkpoint is
//!    SHARD_END) is never started, at startup neither: a `start_at` does not read it again.
//! 2. Otherwise a stored checkpoint opens the shard right AFTER the record it names. A
//!    checkpoint that only records where an earlier reader began (nothing settled yet,
//!    [`Checkpoint::Start`]), or where a shard nobody has read yet begins
//!    ([`Checkpoint::Initial`]), opens the shard there.
//! 3. Otherwise a child shard (one created by a split or a merge) opens at TRIM_HORIZON, so
//!    none of its records is missed.
//! 4. Otherwise the shard opens at LATEST.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::record::cmp_sequence;

/// How far this host's clock may run ahead of the service's before a position recorded from
/// it ([`StartingPoint::since`]) could skip a record.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5);

/// A position in a stream that a subscription can open at.
///
/// ```
/// use kinesis_dataflow::KinesisPosition;
///
/// let everything = KinesisPosition::horizon();
/// let from_now = KinesisPosition::latest();
/// let since = KinesisPosition::timestamp(1_700_000_000_000);
/// let one = KinesisPosition::sequence("shardId-000000000000", "49590338271490256608559692538361571095921575989136588898");
/// # let _ = (everything, from_now, since, one);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum KinesisPosition {
    /// The oldest record each shard still holds (TRIM_HORIZON).
    Horizon,
    /// After the newest record: only what arrives next (LATEST).
    Latest,
    /// The first record that arrived at or after this time, in milliseconds since the Unix
    /// epoch (AT_TIMESTAMP).
    Timestamp(u64),
    /// One record of one shard, which is read first (AT_SEQUENCE_NUMBER).
    Sequence {
        /// The shard the sequence number belongs to.
        shard: String,
        /// The record's sequence number.
        sequence_number: String,
    },
    /// One user record of a KPL aggregate, which is read first: the aggregate's earlier user
    /// records are left out (AT_SEQUENCE_NUMBER, then skipping them).
    SubSequence {
        /// The shard the sequence number belongs to.
        shard: String,
        /// The aggregate's sequence number.
        sequence_number: String,
        /// The user record's sub-sequence number (0 for the aggregate's first).
        sub_sequence_number: u64,
    },
}

impl KinesisPosition {
    /// TRIM_HORIZON: the oldest record each shard still holds.
    #[must_use]
    pub fn horizon() -> Self {
        Self::Horizon
    }

    /// LATEST: only records that arrive after the reader opens.
    #[must_use]
    pub fn latest() -> Self {
        Self::Latest
    }

    /// AT_TIMESTAMP: the first record that arrived at or after `ms` (milliseconds since the
    /// Unix epoch, by the service's arrival clock).
    #[must_use]
    pub fn timestamp(ms: u64) -> Self {
        Self::Timestamp(ms)
    }

    /// AT_SEQUENCE_NUMBER: the record `seq` of `shard`, read first.
    #[must_use]
    pub fn sequence(shard: impl Into<String>, seq: impl Into<String>) -> Self {
        Self::Sequence {
            shard: shard.into(),
            sequence_number: seq.into(),
        }
    }

    /// AT_SEQUENCE_NUMBER inside a KPL aggregate: its user record `sub` (0 for the first) of
    /// the aggregate `seq` of `shard`, read first.
    ///
    /// ```
    /// use kinesis_dataflow::{KinesisPosition, StartingPoint};
    ///
    /// let third = KinesisPosition::sub_sequence("shardId-000000000000", "4959", 2);
    /// assert_eq!(
    ///     third.for_shard("shardId-000000000000"),
    ///     Some(StartingPoint::AfterSubSequence("4959".into(), 1))
    /// );
    /// ```
    #[must_use]
    pub fn sub_sequence(shard: impl Into<String>, seq: impl Into<String>, sub: u64) -> Self {
        Self::SubSequence {
            shard: shard.into(),
            sequence_number: seq.into(),
            sub_sequence_number: sub,
        }
    }

    /// The shard a position of one record names; `None` for a position of every shard.
    #[must_use]
    pub fn shard(&self) -> Option<&str> {
        match self {
            Self::Sequence { shard, .. } | Self::SubSequence { shard, .. } => Some(shard),
            Self::Horizon | Self::Latest | Self::Timestamp(_) => None,
        }
    }

    /// Why the service would refuse this position, or `None` when it would not: a sequence
    /// number must be `0` or 1 to 129 decimal digits without a leading zero (the service's
    /// `0|([1-9]\d{0,128})`), a shard id 1 to 128 letters, digits, `_`, `.` or `-`. A position
    /// refused so at the service would fail every take of its shard, so a subscription refuses
    /// it at `start` instead.
    pub(crate) fn refusal(&self) -> Option<String> {
        let (shard, sequence_number) = match self {
            Self::Sequence {
                shard,
                sequence_number,
            }
            | Self::SubSequence {
                shard,
                sequence_number,
                ..
            } => (shard, sequence_number),
            Self::Horizon | Self::Latest | Self::Timestamp(_) => return None,
        };
        let shard_ok = (1..=128).contains(&shard.len())
            && shard
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if !shard_ok {
            return Some(format!(
                "the shard id {shard:?} must be 1 to 128 letters, digits, `_`, `.` or `-`"
            ));
        }
        if !is_sequence_number(sequence_number) {
            return Some(format!(
                "the sequence number {sequence_number:?} must be 0 or 1 to 129 decimal digits \
                 without a leading zero, as the service issues them"
            ));
        }
        None
    }

    /// Where this position opens `shard`, or `None` when it names another shard.
    #[must_use]
    pub fn for_shard(&self, shard: &str) -> Option<StartingPoint> {
        Some(match self {
            Self::Horizon => StartingPoint::TrimHorizon,
            Self::Latest => StartingPoint::Latest,
            Self::Timestamp(ms) => StartingPoint::AtTimestamp(*ms),
            Self::Sequence {
                shard: named,
                sequence_number,
            } => {
                if named != shard {
                    return None;
                }
                StartingPoint::AtSequence(sequence_number.clone())
            }
            Self::SubSequence {
                shard: named,
                sequence_number,
                sub_sequence_number,
            } => {
                if named != shard {
                    return None;
                }
                match sub_sequence_number.checked_sub(1) {
                    Some(before) => {
                        StartingPoint::AfterSubSequence(sequence_number.clone(), before)
                    }
                    None => StartingPoint::AtSequence(sequence_number.clone()),
                }
            }
        })
    }
}

/// True for a sequence number as the service issues and accepts them:
/// `0|([1-9]\d{0,128})`.
fn is_sequence_number(text: &str) -> bool {
    let digits = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit());
    digits && (text == "0" || (!text.starts_with('0') && text.len() <= 129))
}

/// One GetShardIterator request: the five iterator types and their arguments.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum StartingPoint {
    /// `TRIM_HORIZON`.
    TrimHorizon,
    /// `LATEST`.
    Latest,
    /// `AT_TIMESTAMP`, milliseconds since the Unix epoch.
    AtTimestamp(u64),
    /// `AT_SEQUENCE_NUMBER`.
    AtSequence(String),
    /// `AFTER_SEQUENCE_NUMBER`.
    AfterSequence(String),
    /// After the user record with this sub-sequence number of the KPL aggregate at this
    /// sequence number: the shard opens `AT_SEQUENCE_NUMBER` and the aggregate's user records up
    /// to and including that one are left out (see [`crate::kpl`]).
    AfterSubSequence(String, u64),
}

impl StartingPoint {
    /// The iterator type's name as the service spells it.
    #[must_use]
    pub fn iterator_type(&self) -> &'static str {
        match self {
            Self::TrimHorizon => "TRIM_HORIZON",
            Self::Latest => "LATEST",
            Self::AtTimestamp(_) => "AT_TIMESTAMP",
            Self::AtSequence(_) | Self::AfterSubSequence(..) => "AT_SEQUENCE_NUMBER",
            Self::AfterSequence(_) => "AFTER_SEQUENCE_NUMBER",
        }
    }

    /// `AT_TIMESTAMP` a little before a time read off this host's clock
    /// ([`CLOCK_SKEW_ALLOWANCE`] earlier): arrival times are the service's clock, and a host
    /// whose clock runs ahead must not skip records by asking for a time that has not come yet
    /// on the service's. Records of that margin may be read in addition.
    #[must_use]
    pub fn since(local_time: SystemTime) -> Self {
        Self::at_time(
            local_time
                .checked_sub(CLOCK_SKEW_ALLOWANCE)
                .unwrap_or(UNIX_EPOCH),
        )
    }

    /// `AT_TIMESTAMP` at a wall-clock time.
    #[must_use]
    pub fn at_time(time: SystemTime) -> Self {
        let ms = time
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis();
        Self::AtTimestamp(u64::try_from(ms).unwrap_or(u64::MAX))
    }
}

/// What the lease store keeps for a shard.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Checkpoint {
    /// A reader opened the shard here and has settled nothing yet. Written when a lease is
    /// taken without a checkpoint, so that whoever takes the shard over after a crash resumes
    /// where that reader began instead of skipping to the tip. Never `LATEST`: a reader that
    /// opens at LATEST records the time it opened (AT_TIMESTAMP).
    Start(StartingPoint),
    /// Nobody has read the shard yet, and it begins here: written when the lease row of a
    /// shard on the frontier of what the application reads is created (no parent of it is
    /// read). The position is the subscription's `initial_position`, else its `start_at`, else
    /// the tip, recorded as the time the creating instance started (AT_TIMESTAMP), so nothing
    /// written after any instance's `start` returned is missed. Only a `start_at` position
    /// at startup goes ahead of it.
    Initial(StartingPoint),
    /// Every record up to and including this sequence number is settled.
    Sequence(String),
    /// Every record before this sequence number is settled, and of the KPL aggregate at it,
    /// the user records up to and including this sub-sequence number: a reader resumes with
    /// the aggregate's next user record.
    SubSequence(String, u64),
    /// The shard is closed and every record of it is settled (SHARD_END).
    ShardEnd,
}

/// How far a checkpoint says a shard is settled, for comparing two of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Settled<'a> {
    /// Nothing settled: a start position, or no checkpoint.
    Nothing,
    /// Everything before this sequence number passed over: a start at it (a seek to it, say).
    Before(&'a str),
    /// Through the KPL aggregate at this sequence number's user record (`Some`), or the whole
    /// record (`None`).
    Through(&'a str, Option<u64>),
    /// The shard is finished.
    End,
}

impl Settled<'_> {
    fn cmp(self, other: Self) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        match (self, other) {
            (Self::Nothing, Self::Nothing) | (Self::End, Self::End) => Ordering::Equal,
            (Self::Nothing, _) | (_, Self::End) => Ordering::Less,
            (_, Self::Nothing) | (Self::End, _) => Ordering::Greater,
            (Self::Through(a, a_sub), Self::Through(b, b_sub)) => {
                // A whole record is past any of its user records.
                let rank = |sub: Option<u64>| sub.map_or((1, 0), |k| (0, k));
                cmp_sequence(a, b).then(rank(a_sub).cmp(&rank(b_sub)))
            }
            (Self::Before(a), Self::Before(b)) => cmp_sequence(a, b),
            // Any part of the record at the start (or past it) is past the start.
            (Self::Through(a, _), Self::Before(b)) => {
                if cmp_sequence(a, b).is_lt() {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            }
            (Self::Before(_), Self::Through(..)) => other.cmp(self).reverse(),
        }
    }
}

impl Checkpoint {
    /// How far it says the shard is settled.
    fn settled(&self) -> Settled<'_> {
        match self {
            Self::Sequence(seq)
            | Self::Start(StartingPoint::AfterSequence(seq))
            | Self::Initial(StartingPoint::AfterSequence(seq)) => Settled::Through(seq, None),
            Self::SubSequence(seq, sub)
            | Self::Start(StartingPoint::AfterSubSequence(seq, sub))
            | Self::Initial(StartingPoint::AfterSubSequence(seq, sub)) => {
                Settled::Through(seq, Some(*sub))
            }
            Self::Start(StartingPoint::AtSequence(seq))
            | Self::Initial(StartingPoint::AtSequence(seq)) => Settled::Before(seq),
            Self::ShardEnd => Settled::End,
            Self::Start(_) | Self::Initial(_) => Settled::Nothing,
        }
    }

    /// Whether this checkpoint settles more of the shard than `other` (nothing settled when
    /// `None`). Sequence numbers compare as numbers; within one KPL aggregate a higher
    /// sub-sequence number is further, and the whole record further than any of its user
    /// records; a finished shard is furthest; a start at a sequence number passed over every
    /// record before it (so a record at or past it is ahead of it, one before it is not); any
    /// other start position (nothing settled yet) is behind every settled record.
    ///
    /// ```
    /// use kinesis_dataflow::position::Checkpoint;
    ///
    /// let whole = Checkpoint::Sequence("100".into());
    /// let part = Checkpoint::SubSequence("100".into(), 3);
    /// assert!(whole.is_ahead_of(Some(&part)));
    /// assert!(part.is_ahead_of(Some(&Checkpoint::Sequence("99".into()))));
    /// assert!(part.is_ahead_of(None));
    /// assert!(!part.is_ahead_of(Some(&part)));
    /// ```
    #[must_use]
    pub fn is_ahead_of(&self, other: Option<&Checkpoint>) -> bool {
        let other = other.map_or(Settled::Nothing, Checkpoint::settled);
        self.settled().cmp(other).is_gt()
    }

    /// The text form a lease store keeps: a sequence number, `<sequence>:<sub-sequence>`,
    /// `SHARD_END`, `TRIM_HORIZON`,
    /// `AT_TIMESTAMP:<ms>`, `AT_SEQUENCE_NUMBER:<seq>` or `AFTER_SEQUENCE_NUMBER:<seq>`, and
    /// for [`Initial`](Self::Initial) the start's form after `INITIAL:`.
    ///
    /// ```
    /// use kinesis_dataflow::StartingPoint;
    /// use kinesis_dataflow::position::Checkpoint;
    ///
    /// for cp in [
    ///     Checkpoint::Sequence("4959".into()),
    ///     Checkpoint::ShardEnd,
    ///     Checkpoint::Start(StartingPoint::TrimHorizon),
    ///     Checkpoint::Start(StartingPoint::AtTimestamp(1_700_000_000_000)),
    ///     Checkpoint::Initial(StartingPoint::AtTimestamp(1_700_000_000_000)),
    ///     Checkpoint::Initial(StartingPoint::TrimHorizon),
    ///     Checkpoint::SubSequence("4959".into(), 3),
    ///     Checkpoint::Start(StartingPoint::AfterSubSequence("4959".into(), 3)),
    /// ] {
    ///     assert_eq!(Checkpoint::decode(&cp.encode()), Some(cp));
    /// }
    /// ```
    #[must_use]
    pub fn encode(&self) -> String {
        match self {
            Self::Initial(point) => format!("INITIAL:{}", Self::Start(point.clone()).encode()),
            Self::Sequence(seq) => seq.clone(),
            Self::SubSequence(seq, sub) => format!("{seq}:{sub}"),
            Self::ShardEnd => "SHARD_END".to_owned(),
            Self::Start(StartingPoint::TrimHorizon) => "TRIM_HORIZON".to_owned(),
            Self::Start(StartingPoint::Latest) => "LATEST".to_owned(),
            Self::Start(StartingPoint::AtTimestamp(ms)) => format!("AT_TIMESTAMP:{ms}"),
            Self::Start(StartingPoint::AtSequence(seq)) => format!("AT_SEQUENCE_NUMBER:{seq}"),
            Self::Start(StartingPoint::AfterSequence(seq)) => {
                format!("AFTER_SEQUENCE_NUMBER:{seq}")
            }
            Self::Start(StartingPoint::AfterSubSequence(seq, sub)) => {
                format!("AFTER_SUB_SEQUENCE_NUMBER:{seq}:{sub}")
            }
        }
    }

    /// Parses [`encode`](Self::encode)'s form; `None` for anything else.
    #[must_use]
    pub fn decode(text: &str) -> Option<Self> {
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if let Some(start) = text.strip_prefix("INITIAL:") {
            // One level only: a chain of prefixes is corrupt, and must not recurse.
            if start.starts_with("INITIAL:") {
                return None;
            }
            return match Self::decode(start)? {
                Self::Start(point) => Some(Self::Initial(point)),
                _ => None,
            };
        }
        Some(match text {
            "SHARD_END" => Self::ShardEnd,
            "TRIM_HORIZON" => Self::Start(StartingPoint::TrimHorizon),
            "LATEST" => Self::Start(StartingPoint::Latest),
            seq if digits(seq) => Self::Sequence(seq.to_owned()),
            other => {
                let (kind, value) = other.split_once(':')?;
                if let Some((seq, sub)) = value.split_once(':') {
                    return (kind == "AFTER_SUB_SEQUENCE_NUMBER" && digits(seq) && digits(sub))
                        .then(|| {
                            let sub = sub.parse().ok()?;
                            Some(Self::Start(StartingPoint::AfterSubSequence(
                                seq.to_owned(),
                                sub,
                            )))
                        })
                        .flatten();
                }
                if !digits(value) {
                    return None;
                }
                if digits(kind) {
                    return Some(Self::SubSequence(kind.to_owned(), value.parse().ok()?));
                }
                Self::Start(match kind {
                    "AT_TIMESTAMP" => StartingPoint::AtTimestamp(value.parse().ok()?),
                    "AT_SEQUENCE_NUMBER" => StartingPoint::AtSequence(value.to_owned()),
                    "AFTER_SEQUENCE_NUMBER" => StartingPoint::AfterSequence(value.to_owned()),
                    _ => return None,
                })
            }
        })
    }
}

/// Why a reader is being started; it decides the fallback when there is no checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum ShardOrigin {
    /// One of the shards the subscription opened with.
    Startup,
    /// A child of a split or a merge, started after its parents finished.
    Child,
    /// A shard taken over later (from another instance, or after a reader stopped).
    Takeover,
}

/// Where a reader of `shard` opens, by the rule in this module's docs. `None` when the
/// checkpoint says the shard is finished (SHARD_END): there is nothing left to read.
#[must_use]
pub(crate) fn starting_point(
    shard: &str,
    origin: ShardOrigin,
    start_at: Option<&KinesisPosition>,
    checkpoint: Option<&Checkpoint>,
) -> Option<StartingPoint> {
    if origin == ShardOrigin::Startup
        && let Some(point) = start_at.and_then(|p| p.for_shard(shard))
    {
        return Some(point);
    }
    match checkpoint {
        Some(Checkpoint::Initial(point)) => Some(point.clone()),
        Some(Checkpoint::ShardEnd) => None,
        Some(Checkpoint::Sequence(seq)) => Some(StartingPoint::AfterSequence(seq.clone())),
        Some(Checkpoint::SubSequence(seq, sub)) => {
            Some(StartingPoint::AfterSubSequence(seq.clone(), *sub))
        }
        Some(Checkpoint::Start(point)) => Some(point.clone()),
        None if origin == ShardOrigin::Child => Some(StartingPoint::TrimHorizon),
        None => Some(StartingPoint::Latest),
    }
}

/// The highest sequence number of a shard that is settled (checkpointed), shared between
/// whoever settles records and the shard's reader.
///
/// The reader consults it only when its iterator expired: the new iterator then opens right
/// after this record when it is further on than the last record the reader read, else right
/// after the last record read (as for a reader without one). The acknowledgement layer
/// advances it.
#[derive(Debug, Clone, Default)]
pub struct SettledPosition(Arc<Mutex<Option<String>>>);

impl SettledPosition {
    /// A position with nothing settled yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// A position that starts at a stored checkpoint.
    #[must_use]
    pub fn at(sequence_number: impl Into<String>) -> Self {
        Self(Arc::new(Mutex::new(Some(sequence_number.into()))))
    }

    /// Records that every record up to and including `sequence_number` is settled. A
    /// sequence number lower than the current one is ignored: the position never moves back.
    pub fn advance(&self, sequence_number: &str) {
        let mut current = self.lock();
        let newer = current
            .as_deref()
            .is_none_or(|c| cmp_sequence(sequence_number, c).is_gt());
        if newer {
            *current = Some(sequence_number.to_owned());
        }
    }

    /// The highest settled sequence number, if any.
    #[must_use]
    pub fn get(&self) -> Option<String> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // A poisoned lock still holds a valid sequence number.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_at_a_sequence_number_passed_over_everything_before_it() {
        let at = |seq: &str| Checkpoint::Start(StartingPoint::AtSequence(seq.into()));
        let through = |seq: &str| Checkpoint::Sequence(seq.into());
        let inside = |seq: &str, sub| Checkpoint::SubSequence(seq.into(), sub);
        let start = at("70");
        assert!(!through("20").is_ahead_of(Some(&start)));
        assert!(!through("69").is_ahead_of(Some(&start)));
        assert!(through("70").is_ahead_of(Some(&start)));
        assert!(inside("70", 0).is_ahead_of(Some(&start)));
        assert!(through("71").is_ahead_of(Some(&start)));
        assert!(start.is_ahead_of(Some(&through("69"))));
        assert!(!start.is_ahead_of(Some(&through("70"))));
        assert!(start.is_ahead_of(None));
        assert!(at("71").is_ahead_of(Some(&start)) && !start.is_ahead_of(Some(&start)));
        assert!(!start.is_ahead_of(Some(&Checkpoint::ShardEnd)));
        let initial = Checkpoint::Initial(StartingPoint::AtSequence("70".into()));
        assert!(!through("20").is_ahead_of(Some(&initial)));
        // A start at a time or at the horizon settles nothing comparable.
        let horizon = Checkpoint::Start(StartingPoint::TrimHorizon);
        assert!(through("20").is_ahead_of(Some(&horizon)));
    }

    #[test]
    fn positions_the_service_would_refuse_say_why() {
        let seq = |shard: &str, seq: &str| KinesisPosition::sequence(shard, seq).refusal();
        let shard = "shardId-000000000000";
        for accepted in ["0", "1", "4959", &"9".repeat(129)] {
            assert_eq!(seq(shard, accepted), None, "{accepted}");
        }
        for refused in [
            "",
            " 1",
            "1 ",
            "01",
            "00",
            "1.5",
            "-1",
            "+1",
            &"9".repeat(130),
        ] {
            let why = seq(shard, refused).unwrap_or_else(|| panic!("{refused:?} accepted"));
            assert!(why.contains("sequence number"), "{why}");
        }
        for refused in ["", "shard 0", "shard/0", &"s".repeat(129)] {
            let why = seq(refused, "1").unwrap_or_else(|| panic!("{refused:?} accepted"));
            assert!(why.contains("shard id"), "{why}");
        }
        assert_eq!(seq(&"s".repeat(128), "1"), None);
        assert!(
            KinesisPosition::sub_sequence(shard, "01", 0)
                .refusal()
                .is_some()
        );
        for every in [
            KinesisPosition::horizon(),
            KinesisPosition::latest(),
            KinesisPosition::timestamp(0),
        ] {
            assert_eq!(every.refusal(), None);
        }
    }

    #[test]
    fn sequence_position_applies_to_its_own_shard_only() {
        let p = KinesisPosition::sequence("shardId-1", "7");
        assert_eq!(
            starting_point("shardId-1", ShardOrigin::Startup, Some(&p), None),
            Some(StartingPoint::AtSequence("7".into()))
        );
        assert_eq!(
            starting_point("shardId-2", ShardOrigin::Startup, Some(&p), None),
            Some(StartingPoint::Latest)
        );
    }

    #[test]
    fn a_shard_nobody_read_opens_where_its_row_was_created_unless_start_at_applies() {
        let created = Checkpoint::Initial(StartingPoint::AtTimestamp(1_000));
        assert_eq!(
            starting_point("s", ShardOrigin::Takeover, None, Some(&created)),
            Some(StartingPoint::AtTimestamp(1_000))
        );
        assert_eq!(
            starting_point("s", ShardOrigin::Startup, None, Some(&created)),
            Some(StartingPoint::AtTimestamp(1_000))
        );
        assert_eq!(
            starting_point(
                "s",
                ShardOrigin::Startup,
                Some(&KinesisPosition::horizon()),
                Some(&created)
            ),
            Some(StartingPoint::TrimHorizon)
        );
        assert_eq!(Checkpoint::decode("INITIAL:SHARD_END"), None);
        assert_eq!(Checkpoint::decode("INITIAL:42"), None);
    }

    #[test]
    fn a_corrupt_chain_of_initial_prefixes_is_refused_without_recursing() {
        assert_eq!(Checkpoint::decode("INITIAL:INITIAL:TRIM_HORIZON"), None);
        // A lease row may hold up to 400 KB; a corrupt one must not overflow the stack.
        let chain = "INITIAL:".repeat(50_000) + "TRIM_HORIZON";
        assert_eq!(Checkpoint::decode(&chain), None);
    }

    #[test]
    fn start_at_does_not_apply_to_later_readers() {
        let p = KinesisPosition::horizon();
        let cp = Checkpoint::Sequence("9".into());
        assert_eq!(
            starting_point("s", ShardOrigin::Takeover, Some(&p), Some(&cp)),
            Some(StartingPoint::AfterSequence("9".into()))
        );
        assert_eq!(
            starting_point("s", ShardOrigin::Takeover, Some(&p), None),
            Some(StartingPoint::Latest)
        );
        assert_eq!(
            starting_point("s", ShardOrigin::Child, Some(&p), None),
            Some(StartingPoint::TrimHorizon)
        );
        assert_eq!(
            starting_point("s", ShardOrigin::Startup, None, Some(&Checkpoint::ShardEnd)),
            None
        );
    }
}
