//! How a position crosses between the KCL's table and the library's: pure functions.
//!
//! The KCL's checkpoint is the last record processed, as (sequence, sub-sequence), and it
//! resumes after it: it opens the shard at the sequence number and drops every record at or
//! below the pair, a plain record counting as sub-sequence 0. The library's checkpoint says
//! the same thing in two forms: [`Checkpoint::Sequence`] (the whole record is settled) and
//! [`Checkpoint::SubSequence`] (part of a KPL aggregate is). Which form is right depends on
//! the record at that sequence number, so both directions are given its [`RecordShape`].

use std::time::{Duration, UNIX_EPOCH};

use crate::position::Checkpoint;
use crate::position::StartingPoint;

use super::row::KclCheckpoint;

/// What the record at a checkpoint's sequence number is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordShape {
    /// A record that is not a KPL aggregate.
    Plain,
    /// A KPL aggregate of this many user records.
    Aggregate {
        /// How many user records it holds.
        user_records: u64,
    },
    /// The record is no longer in the shard (past the retention period): nothing at that
    /// sequence number is read again either way.
    Gone,
}

/// Where the unprocessed records of a shard begin, when the table being read does not say
/// (the KCL's `LATEST` and `AT_TIMESTAMP` carry no position; the library's "unread from a
/// time" is nothing the KCL can hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unprocessed {
    /// From the oldest record kept: nothing is lost; records older than the application's
    /// start may be read.
    Horizon,
    /// From the tip when the command runs: records written between the old application's
    /// stop and that moment are skipped. An import records that time less the library's
    /// clock-skew allowance, as the library takes the tip.
    Latest,
    /// From the first record at or after this time (milliseconds since the Unix epoch).
    Timestamp(u64),
}

/// The library checkpoint that resumes exactly where the KCL would: `None` when the KCL's
/// checkpoint holds no position (`LATEST`, `AT_TIMESTAMP`) and `unprocessed` does not say.
/// `now_ms` (milliseconds since the Unix epoch) stands for `latest`: the library never
/// records LATEST; it records the time, less its clock-skew allowance
/// ([`CLOCK_SKEW_ALLOWANCE`](crate::position::CLOCK_SKEW_ALLOWANCE)), as
/// [`StartingPoint::since`] does.
#[must_use]
pub fn from_kcl(
    kcl: &KclCheckpoint,
    shape: Option<RecordShape>,
    closed: bool,
    unprocessed: Option<Unprocessed>,
    now_ms: u64,
) -> Option<Checkpoint> {
    Some(match kcl {
        KclCheckpoint::Sequence {
            sequence,
            sub_sequence,
        } => match shape {
            Some(RecordShape::Aggregate { user_records }) if sub_sequence + 1 < user_records => {
                Checkpoint::SubSequence(sequence.clone(), *sub_sequence)
            }
            Some(RecordShape::Aggregate { .. } | RecordShape::Plain) => {
                Checkpoint::Sequence(sequence.clone())
            }
            // Unseen: the KCL writes a sub-sequence above 0 only inside an aggregate.
            None | Some(RecordShape::Gone) if *sub_sequence > 0 => {
                Checkpoint::SubSequence(sequence.clone(), *sub_sequence)
            }
            None | Some(RecordShape::Gone) => Checkpoint::Sequence(sequence.clone()),
        },
        KclCheckpoint::ShardEnd => Checkpoint::ShardEnd,
        KclCheckpoint::TrimHorizon => Checkpoint::Start(StartingPoint::TrimHorizon),
        KclCheckpoint::Latest | KclCheckpoint::AtTimestamp => match unprocessed? {
            Unprocessed::Horizon => Checkpoint::Start(StartingPoint::TrimHorizon),
            // Nothing arrives in a closed shard any more: from its tip it is finished.
            Unprocessed::Latest if closed => Checkpoint::ShardEnd,
            // As the library takes the tip: from the time, less its clock-skew allowance.
            Unprocessed::Latest => Checkpoint::Start(StartingPoint::since(
                UNIX_EPOCH + Duration::from_millis(now_ms),
            )),
            Unprocessed::Timestamp(ms) => Checkpoint::Start(StartingPoint::AtTimestamp(ms)),
        },
    })
}

/// The KCL checkpoint that resumes exactly where the library would: `None` when the
/// library's position is "unread from here" at a point the KCL cannot hold (a time, a
/// sequence number to read from) and `unprocessed` does not say.
#[must_use]
pub fn to_kcl(
    checkpoint: Option<&Checkpoint>,
    shape: Option<RecordShape>,
    is_child: bool,
    unprocessed: Option<Unprocessed>,
) -> Option<KclCheckpoint> {
    let settled_through = |sequence: &String| KclCheckpoint::Sequence {
        sequence: sequence.clone(),
        sub_sequence: match shape {
            Some(RecordShape::Aggregate { user_records }) => user_records.saturating_sub(1),
            _ => 0,
        },
    };
    let unread = || {
        Some(match unprocessed? {
            Unprocessed::Horizon => KclCheckpoint::TrimHorizon,
            Unprocessed::Latest => KclCheckpoint::Latest,
            Unprocessed::Timestamp(_) => KclCheckpoint::AtTimestamp,
        })
    };
    match checkpoint {
        Some(Checkpoint::Sequence(seq)) => Some(settled_through(seq)),
        Some(Checkpoint::SubSequence(seq, sub)) => Some(KclCheckpoint::Sequence {
            sequence: seq.clone(),
            sub_sequence: *sub,
        }),
        Some(Checkpoint::ShardEnd) => Some(KclCheckpoint::ShardEnd),
        Some(Checkpoint::Start(point) | Checkpoint::Initial(point)) => match point {
            StartingPoint::TrimHorizon => Some(KclCheckpoint::TrimHorizon),
            StartingPoint::AfterSequence(seq) => Some(settled_through(seq)),
            StartingPoint::AfterSubSequence(seq, sub) => Some(KclCheckpoint::Sequence {
                sequence: seq.clone(),
                sub_sequence: *sub,
            }),
            StartingPoint::Latest
            | StartingPoint::AtTimestamp(_)
            | StartingPoint::AtSequence(_) => unread(),
        },
        // A child without a checkpoint is read from its start, once its parents are done.
        None if is_child => Some(KclCheckpoint::TrimHorizon),
        None => unread(),
    }
}

/// Why a library position needs `--unprocessed-from` to be exported, for messages.
#[must_use]
pub(super) fn unread_reason(checkpoint: Option<&Checkpoint>) -> String {
    match checkpoint {
        Some(checkpoint) => format!(
            "nothing settled; the application reads it from `{}`, which a KCL table cannot hold",
            checkpoint.encode()
        ),
        None => {
            "no checkpoint, and no parent: the application's initial position applies".to_owned()
        }
    }
}

/// The sequence number whose record decides the form of a KCL checkpoint's import.
#[must_use]
pub(super) fn import_peek(kcl: &KclCheckpoint) -> Option<&str> {
    match kcl {
        KclCheckpoint::Sequence { sequence, .. } => Some(sequence),
        _ => None,
    }
}

/// The sequence number whose record decides the sub-sequence of a library checkpoint's
/// export: the last whole record settled.
#[must_use]
pub(super) fn export_peek(checkpoint: Option<&Checkpoint>) -> Option<&str> {
    match checkpoint {
        Some(
            Checkpoint::Sequence(seq)
            | Checkpoint::Start(StartingPoint::AfterSequence(seq))
            | Checkpoint::Initial(StartingPoint::AfterSequence(seq)),
        ) => Some(seq),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::position::CLOCK_SKEW_ALLOWANCE;

    fn seq(sequence: &str, sub_sequence: u64) -> KclCheckpoint {
        KclCheckpoint::Sequence {
            sequence: sequence.to_owned(),
            sub_sequence,
        }
    }

    #[test]
    fn a_kcl_sequence_resumes_after_that_record_or_user_record() {
        let plain = Some(RecordShape::Plain);
        let of_four = Some(RecordShape::Aggregate { user_records: 4 });
        let cases = [
            (seq("7", 0), plain, Checkpoint::Sequence("7".into())),
            (
                seq("7", 0),
                Some(RecordShape::Gone),
                Checkpoint::Sequence("7".into()),
            ),
            (
                seq("7", 2),
                Some(RecordShape::Gone),
                Checkpoint::SubSequence("7".into(), 2),
            ),
            (seq("7", 0), of_four, Checkpoint::SubSequence("7".into(), 0)),
            (seq("7", 2), of_four, Checkpoint::SubSequence("7".into(), 2)),
            // The last user record settled: the whole aggregate is.
            (seq("7", 3), of_four, Checkpoint::Sequence("7".into())),
            (KclCheckpoint::ShardEnd, None, Checkpoint::ShardEnd),
            (
                KclCheckpoint::TrimHorizon,
                None,
                Checkpoint::Start(StartingPoint::TrimHorizon),
            ),
        ];
        for (kcl, shape, expected) in cases {
            assert_eq!(
                from_kcl(&kcl, shape, false, None, 5),
                Some(expected),
                "{kcl:?}"
            );
        }
    }

    #[test]
    fn latest_and_at_timestamp_need_to_be_told_and_never_become_latest() {
        for kcl in [KclCheckpoint::Latest, KclCheckpoint::AtTimestamp] {
            assert_eq!(from_kcl(&kcl, None, false, None, 5), None);
            // Less the clock-skew allowance, never before the epoch.
            assert_eq!(
                from_kcl(&kcl, None, false, Some(Unprocessed::Latest), 5),
                Some(Checkpoint::Start(StartingPoint::AtTimestamp(0)))
            );
            assert_eq!(
                from_kcl(&kcl, None, true, Some(Unprocessed::Latest), 5),
                Some(Checkpoint::ShardEnd)
            );
            assert_eq!(
                from_kcl(&kcl, None, false, Some(Unprocessed::Timestamp(3)), 5),
                Some(Checkpoint::Start(StartingPoint::AtTimestamp(3)))
            );
        }
    }

    #[test]
    fn latest_is_now_less_the_clock_skew_allowance() {
        let now_ms = 1_700_000_000_000;
        let allowance = u64::try_from(CLOCK_SKEW_ALLOWANCE.as_millis()).expect("small");
        assert_eq!(
            from_kcl(
                &KclCheckpoint::Latest,
                None,
                false,
                Some(Unprocessed::Latest),
                now_ms
            ),
            Some(Checkpoint::Start(StartingPoint::AtTimestamp(
                now_ms - allowance
            )))
        );
    }

    #[test]
    fn a_library_checkpoint_becomes_the_kcl_s_last_processed_record() {
        let of_four = Some(RecordShape::Aggregate { user_records: 4 });
        let whole = Checkpoint::Sequence("7".into());
        assert_eq!(
            to_kcl(Some(&whole), of_four, false, None),
            Some(seq("7", 3))
        );
        assert_eq!(
            to_kcl(Some(&whole), Some(RecordShape::Plain), false, None),
            Some(seq("7", 0))
        );
        let part = Checkpoint::SubSequence("7".into(), 1);
        assert_eq!(to_kcl(Some(&part), of_four, false, None), Some(seq("7", 1)));
        assert_eq!(
            to_kcl(Some(&Checkpoint::ShardEnd), None, false, None),
            Some(KclCheckpoint::ShardEnd)
        );
        assert_eq!(
            to_kcl(None, None, true, None),
            Some(KclCheckpoint::TrimHorizon)
        );
        let unread = Checkpoint::Initial(StartingPoint::AtTimestamp(9));
        assert_eq!(to_kcl(Some(&unread), None, false, None), None);
        assert_eq!(
            to_kcl(Some(&unread), None, false, Some(Unprocessed::Horizon)),
            Some(KclCheckpoint::TrimHorizon)
        );
    }

    #[test]
    fn import_after_export_gives_the_same_checkpoint() {
        let shapes = [
            Some(RecordShape::Plain),
            Some(RecordShape::Aggregate { user_records: 1 }),
            Some(RecordShape::Aggregate { user_records: 5 }),
        ];
        for shape in shapes {
            let mut checkpoints = vec![
                Checkpoint::Sequence("42".into()),
                Checkpoint::ShardEnd,
                Checkpoint::Start(StartingPoint::TrimHorizon),
            ];
            if let Some(RecordShape::Aggregate { user_records }) = shape {
                checkpoints.extend(
                    (0..user_records - 1).map(|sub| Checkpoint::SubSequence("42".into(), sub)),
                );
            }
            for checkpoint in checkpoints {
                let kcl = to_kcl(Some(&checkpoint), shape, false, None).expect("exportable");
                assert_eq!(
                    from_kcl(&kcl, shape, false, None, 0),
                    Some(checkpoint.clone()),
                    "{checkpoint:?} through {kcl:?} with {shape:?}"
                );
            }
        }
    }
}
