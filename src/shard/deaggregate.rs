//! A read's records with KPL aggregates taken apart ([`ReadSettings::deaggregate`]).
//!
//! [`ReadSettings::deaggregate`]: super::ReadSettings::deaggregate

use crate::error::KinesisError;
use crate::kpl::{HashRange, Unpacked, unpack};
use crate::record::{Record, cmp_sequence};

/// What to do with user records whose hash key lies outside the shard's range.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Misplaced {
    /// The shard's range, when known (else nothing is checked).
    pub(crate) range: Option<HashRange>,
    /// Drop the whole aggregate holding one (the KCL's rule), instead of delivering it.
    pub(crate) discard: bool,
}

/// The user records of `records` in order (plain records unchanged), and errors about single
/// user records, each with the number of records handed on before it. User records up to
/// `skip` (an aggregate's sequence number and a sub-sequence number: where a reader opened in
/// the middle of an aggregate) are left out; `skip` is cleared once passed. An aggregate with
/// user records outside the shard's hash range is delivered or dropped as `misplaced` says,
/// with a warning.
pub(crate) fn unpack_all(
    records: Vec<Record>,
    skip: &mut Option<(String, u64)>,
    misplaced: Misplaced,
    stream: &str,
    shard: &str,
) -> (Vec<Record>, Vec<(usize, KinesisError)>) {
    let mut out = Vec::with_capacity(records.len());
    let mut errors = Vec::new();
    for record in records {
        let skip_through = match skip.take() {
            Some((seq, sub)) if seq == record.sequence_number() => Some(sub),
            Some((seq, sub)) if cmp_sequence(&seq, record.sequence_number()).is_gt() => {
                *skip = Some((seq, sub));
                None
            }
            _ => None,
        };
        match unpack(&record) {
            Unpacked::Plain => out.push(record),
            Unpacked::Malformed(reason) => {
                tracing::warn!(
                    sequence_number = record.sequence_number(),
                    reason,
                    "a record starts with the KPL magic bytes but is no valid aggregate; \
                     handed on as it is"
                );
                out.push(record);
            }
            Unpacked::Users(users) => {
                if !keep(&record, &users, misplaced) {
                    continue;
                }
                for (sub, user) in (0u64..).zip(users) {
                    if skip_through.is_some_and(|through| sub <= through) {
                        continue;
                    }
                    match user {
                        Ok(user) => out.push(user),
                        Err(reason) => errors.push((
                            out.len(),
                            KinesisError::InvalidUserRecord {
                                stream: stream.to_owned(),
                                shard: shard.to_owned(),
                                sequence_number: record.sequence_number().to_owned(),
                                sub_sequence_number: sub,
                                reason,
                            },
                        )),
                    }
                }
            }
        }
    }
    (out, errors)
}

/// Whether the user records of the aggregate `record` are handed on: yes unless some lie
/// outside the shard's hash range and the setting drops such aggregates. Warns either way.
fn keep(record: &Record, users: &[Result<Record, String>], misplaced: Misplaced) -> bool {
    let Some(range) = misplaced.range else {
        return true;
    };
    let outside = users
        .iter()
        .flatten()
        .filter(|u| !range.contains(u.partition_key(), u.explicit_hash_key()))
        .count();
    if outside == 0 {
        return true;
    }
    if misplaced.discard {
        tracing::warn!(
            sequence_number = record.sequence_number(),
            outside,
            user_records = users.len(),
            "aggregate holds user records of other shards' hash ranges (put against a stale \
             shard map); dropped, as `discard_misplaced_user_records` says"
        );
        false
    } else {
        tracing::warn!(
            sequence_number = record.sequence_number(),
            outside,
            user_records = users.len(),
            "aggregate holds user records of other shards' hash ranges (put against a stale \
             shard map); delivered (a KPL producer also puts them again to their shard)"
        );
        true
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::kpl::aggregate as pack;

    fn record(seq: &str, data: Bytes) -> Record {
        Record::new("shardId-0".into(), seq, "outer", data, None)
    }

    fn view(records: &[Record]) -> Vec<(String, Option<u64>, String)> {
        records
            .iter()
            .map(|r| {
                (
                    r.sequence_number().to_owned(),
                    r.sub_sequence_number(),
                    String::from_utf8_lossy(r.data()).into_owned(),
                )
            })
            .collect()
    }

    #[test]
    fn aggregates_open_in_place_and_a_reader_opened_mid_aggregate_skips_what_was_settled() {
        let records = vec![
            record(
                "10",
                pack([
                    ("a", None, &b"a0"[..]),
                    ("a", None, b"a1"),
                    ("a", None, b"a2"),
                ]),
            ),
            record("11", Bytes::from_static(b"plain")),
            record("12", pack([("b", None, &b"b0"[..])])),
        ];
        let mut skip = Some(("10".to_owned(), 1));
        let (out, errors) = unpack_all(records, &mut skip, Misplaced::default(), "s", "shardId-0");
        assert!(errors.is_empty());
        assert_eq!(skip, None, "passed");
        let expect =
            |seq: &str, sub: Option<u64>, data: &str| (seq.to_owned(), sub, data.to_owned());
        assert_eq!(
            view(&out),
            [
                expect("10", Some(2), "a2"),
                expect("11", None, "plain"),
                expect("12", Some(0), "b0"),
            ]
        );
    }

    #[test]
    fn a_skip_ahead_of_the_records_is_kept_for_the_next_read() {
        let mut skip = Some(("20".to_owned(), 0));
        let (out, _) = unpack_all(
            vec![record("19", Bytes::from_static(b"x"))],
            &mut skip,
            Misplaced::default(),
            "s",
            "shardId-0",
        );
        assert_eq!(out.len(), 1);
        assert_eq!(skip, Some(("20".to_owned(), 0)));
    }

    #[test]
    fn an_aggregate_with_user_records_of_another_shard_is_delivered_or_dropped_as_set() {
        // Shard of the lower half of the hash keys; "5" belongs, the upper half does not.
        let range = HashRange::parse("0", "170141183460469231731687303715884105727");
        let upper = "200000000000000000000000000000000000000";
        let records = || {
            vec![
                record(
                    "1",
                    pack([
                        ("a", Some("5"), &b"mine"[..]),
                        ("b", Some(upper), b"theirs"),
                    ]),
                ),
                record("2", pack([("a", Some("6"), &b"next"[..])])),
            ]
        };
        let deliver = Misplaced {
            range,
            discard: false,
        };
        let (out, _) = unpack_all(records(), &mut None, deliver, "s", "shardId-0");
        assert_eq!(out.len(), 3, "nothing lost by default");
        let discard = Misplaced {
            range,
            discard: true,
        };
        let (out, _) = unpack_all(records(), &mut None, discard, "s", "shardId-0");
        assert_eq!(
            view(&out),
            [("2".to_owned(), Some(0), "next".to_owned())],
            "the KCL's rule"
        );
    }

    #[test]
    fn a_broken_aggregate_is_handed_on_as_it_is() {
        let mut data = pack([("a", None, &b"x"[..])]).to_vec();
        *data.last_mut().unwrap() ^= 0xff;
        let (out, errors) = unpack_all(
            vec![record("1", Bytes::from(data.clone()))],
            &mut None,
            Misplaced::default(),
            "s",
            "shardId-0",
        );
        assert!(errors.is_empty());
        assert_eq!(&out[0].data()[..], &data[..]);
        assert_eq!(out[0].sub_sequence_number(), None);
    }
}
