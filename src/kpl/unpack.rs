//! [`unpack`]: one Kinesis record into the user records it aggregates, as a pure function.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use md5::{Digest, Md5};
use prost::Message;

use super::MAGIC;
use super::message::AggregatedRecord;
use crate::record::{InAggregate, Record};

/// The MD5 trailer's length.
const DIGEST_LEN: usize = 16;

/// What a record turned out to be.
#[derive(Debug)]
pub(crate) enum Unpacked {
    /// Not an aggregate: hand it on as it is.
    Plain,
    /// It starts with the magic bytes but is no valid aggregate (the reason says why): handed
    /// on as it is, as the KCL does, with a warning.
    Malformed(String),
    /// An aggregate: its user records in order (possibly none). An entry is `Err` for a user
    /// record that names a key the aggregate's tables do not have; it still takes its
    /// sub-sequence number.
    Users(Vec<Result<Record, String>>),
}

/// Unpacks `record`: the magic bytes, a protobuf `AggregatedRecord`, an MD5 of that protobuf.
/// Each user record shares the aggregate's buffer, its sequence number and arrival, and gets
/// its place in the aggregate (the sub-sequence number, counting from 0).
pub(crate) fn unpack(record: &Record) -> Unpacked {
    let data = record.data();
    if !data.starts_with(&MAGIC) {
        return Unpacked::Plain;
    }
    if data.len() < MAGIC.len() + DIGEST_LEN {
        return Unpacked::Malformed(format!(
            "{} bytes: too short for an aggregate (magic, message, 16-byte MD5)",
            data.len()
        ));
    }
    let body = data.slice(MAGIC.len()..data.len() - DIGEST_LEN);
    let digest = &data[data.len() - DIGEST_LEN..];
    if Md5::digest(&body).as_slice() != digest {
        return Unpacked::Malformed("the MD5 trailer does not match the message".into());
    }
    match AggregatedRecord::decode(body) {
        Ok(aggregate) => Unpacked::Users(users(record, aggregate)),
        Err(e) => Unpacked::Malformed(format!("the message does not decode: {e}")),
    }
}

/// The user records of `aggregate`, read from `record`.
fn users(record: &Record, aggregate: AggregatedRecord) -> Vec<Result<Record, String>> {
    let keys: Vec<Arc<str>> = aggregate
        .partition_key_table
        .into_iter()
        .map(Arc::from)
        .collect();
    let sequence_number: Arc<str> = Arc::from(record.sequence_number());
    let hash_keys: Vec<Arc<str>> = aggregate
        .explicit_hash_key_table
        .into_iter()
        .map(Arc::from)
        .collect();
    let count = aggregate.records.len();
    let mut users: Vec<Result<Record, String>> = aggregate
        .records
        .into_iter()
        .enumerate()
        .map(|(sub, user)| {
            let key = table_entry(&keys, user.partition_key_index, "partition key")?;
            let hash_key = user
                .explicit_hash_key_index
                .map(|i| table_entry(&hash_keys, i, "explicit hash key"))
                .transpose()?;
            Ok(record.user_record(
                &sequence_number,
                key,
                hash_key,
                user.data,
                InAggregate {
                    sub: sub as u64,
                    last: sub + 1 == count,
                },
            ))
        })
        .collect();
    // The last readable user record closes the aggregate for the checkpoint: the ones after
    // it are skipped.
    if let Some(Ok(last)) = users.iter_mut().rev().find(|u| u.is_ok()) {
        last.mark_last_of_aggregate();
    }
    users
}

fn table_entry(table: &[Arc<str>], index: u64, what: &str) -> Result<Arc<str>, String> {
    usize::try_from(index)
        .ok()
        .and_then(|i| table.get(i))
        .cloned()
        .ok_or_else(|| {
            format!(
                "its {what} index {index} is out of range (the aggregate's table has {} entries)",
                table.len()
            )
        })
}

/// The data of one aggregate record holding `records`, each a partition key, an optional
/// explicit hash key and data, in order: the magic bytes, the protobuf message, its MD5. Keys
/// repeated across records are stored once (found by hash, so building the tables takes time
/// in proportion to the records). Nothing is checked: keep the result, with the
/// aggregate's own partition key, under the service's 1 MiB record limit, and put it with
/// the explicit hash key (or partition key) of the shard its user records belong to.
///
/// ```
/// use kinesis_dataflow::kpl::aggregate;
///
/// let data = aggregate([("user-1", None, &b"{\"n\":1}"[..]), ("user-2", None, b"{\"n\":2}")]);
/// assert!(data.starts_with(&[0xF3, 0x89, 0x9A, 0xC2]));
/// ```
pub fn aggregate<'a>(
    records: impl IntoIterator<Item = (&'a str, Option<&'a str>, &'a [u8])>,
) -> Bytes {
    let mut aggregate = AggregatedRecord::default();
    // Each table's entries by value, to their index.
    let mut key_at: HashMap<&str, u64> = HashMap::new();
    let mut hash_key_at: HashMap<&str, u64> = HashMap::new();
    let index = |table: &mut Vec<String>, at: &mut HashMap<&'a str, u64>, value: &'a str| {
        *at.entry(value).or_insert_with(|| {
            table.push(value.to_owned());
            (table.len() - 1) as u64
        })
    };
    for (key, hash_key, data) in records {
        let partition_key_index = index(&mut aggregate.partition_key_table, &mut key_at, key);
        let explicit_hash_key_index =
            hash_key.map(|h| index(&mut aggregate.explicit_hash_key_table, &mut hash_key_at, h));
        aggregate.records.push(super::message::UserRecord {
            partition_key_index,
            explicit_hash_key_index,
            data: Bytes::copy_from_slice(data),
            tags: Vec::new(),
        });
    }
    let body = aggregate.encode_to_vec();
    let mut out = Vec::with_capacity(MAGIC.len() + body.len() + DIGEST_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&body);
    out.extend_from_slice(&Md5::digest(&body));
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn record(data: Bytes) -> Record {
        Record::new("shardId-0".into(), "49", "outer", data, None)
    }

    fn users_of(data: Bytes) -> Vec<Result<Record, String>> {
        match unpack(&record(data)) {
            Unpacked::Users(users) => users,
            other => panic!("an aggregate, not {other:?}"),
        }
    }

    #[test]
    fn an_aggregate_yields_its_user_records_in_order_sharing_its_buffer() {
        let data = aggregate([
            ("a", None, &b"one"[..]),
            (
                "b",
                Some("170141183460469231731687303715884105728"),
                &b"two"[..],
            ),
            ("a", None, &b"three"[..]),
        ]);
        let users: Vec<Record> = users_of(data.clone())
            .into_iter()
            .map(Result::unwrap)
            .collect();
        let view: Vec<_> = users
            .iter()
            .map(|r| {
                (
                    r.partition_key(),
                    r.explicit_hash_key(),
                    &r.data()[..],
                    r.sub_sequence_number(),
                    r.sequence_number(),
                )
            })
            .collect();
        assert_eq!(
            view,
            [
                ("a", None, &b"one"[..], Some(0), "49"),
                (
                    "b",
                    Some("170141183460469231731687303715884105728"),
                    &b"two"[..],
                    Some(1),
                    "49"
                ),
                ("a", None, &b"three"[..], Some(2), "49"),
            ]
        );
        let range = data.as_ptr_range();
        assert!(
            users.iter().all(|r| range.contains(&r.data().as_ptr())),
            "no copy per user record"
        );
        assert_eq!(
            users
                .iter()
                .map(Record::is_last_of_aggregate)
                .collect::<Vec<_>>(),
            [false, false, true]
        );
    }

    #[test]
    fn a_plain_record_stays_plain_and_a_broken_aggregate_is_malformed() {
        assert!(matches!(
            unpack(&record(Bytes::from_static(b"plain"))),
            Unpacked::Plain
        ));
        let good = aggregate([("a", None, &b"x"[..])]);
        let mut bad_digest = good.to_vec();
        *bad_digest.last_mut().unwrap() ^= 1;
        let mut bad_body = good.to_vec();
        bad_body.truncate(MAGIC.len() + 2);
        bad_body.extend_from_slice(&Md5::digest(&bad_body[MAGIC.len()..]));
        for (data, says) in [
            (bad_digest, "MD5"),
            (MAGIC.to_vec(), "too short"),
            (bad_body, "does not decode"),
        ] {
            match unpack(&record(Bytes::from(data))) {
                Unpacked::Malformed(reason) => assert!(reason.contains(says), "{reason}"),
                other => panic!("malformed ({says}), not {other:?}"),
            }
        }
    }

    #[test]
    fn an_index_out_of_range_fails_that_user_record_only() {
        let mut aggregate = AggregatedRecord {
            partition_key_table: vec!["a".into()],
            ..AggregatedRecord::default()
        };
        for index in [0, 5, 0] {
            aggregate.records.push(super::super::message::UserRecord {
                partition_key_index: index,
                explicit_hash_key_index: None,
                data: Bytes::from_static(b"d"),
                tags: Vec::new(),
            });
        }
        let body = aggregate.encode_to_vec();
        let mut data = MAGIC.to_vec();
        data.extend_from_slice(&body);
        data.extend_from_slice(&Md5::digest(&body));
        let users = users_of(Bytes::from(data.clone()));
        assert!(users[0].is_ok() && users[2].is_ok());
        // With the bad one last, the readable one before it closes the aggregate.
        let mut aggregate =
            AggregatedRecord::decode(&data[MAGIC.len()..data.len() - DIGEST_LEN]).unwrap();
        aggregate.records.swap(1, 2);
        let body = aggregate.encode_to_vec();
        let mut swapped = MAGIC.to_vec();
        swapped.extend_from_slice(&body);
        swapped.extend_from_slice(&Md5::digest(&body));
        let closing: Vec<bool> = users_of(Bytes::from(swapped))
            .iter()
            .map(|u| u.as_ref().is_ok_and(Record::is_last_of_aggregate))
            .collect();
        assert_eq!(closing, [false, true, false]);
        let error = users[1].as_ref().unwrap_err();
        assert!(
            error.contains("partition key index 5 is out of range"),
            "{error}"
        );
        assert_eq!(users[2].as_ref().unwrap().sub_sequence_number(), Some(2));
    }

    #[test]
    fn an_aggregate_of_many_distinct_keys_round_trips_with_each_key_stored_once() {
        // 20,000 distinct partition keys, with one key and one hash key repeated in between.
        let users: Vec<(String, Option<&str>, Vec<u8>)> = (0..20_000)
            .map(|i| {
                let key = if i % 7 == 0 {
                    "same".to_owned()
                } else {
                    format!("key-{i}")
                };
                let hash_key = (i % 3 == 0).then_some(if i % 2 == 0 { "0" } else { "42" });
                (key, hash_key, vec![(i % 251) as u8])
            })
            .collect();
        let data = aggregate(
            users
                .iter()
                .map(|(k, h, d)| (k.as_str(), h.as_deref(), d.as_slice())),
        );
        let message =
            AggregatedRecord::decode(&data[MAGIC.len()..data.len() - DIGEST_LEN]).unwrap();
        let distinct: HashSet<&str> = users.iter().map(|(k, _, _)| k.as_str()).collect();
        assert_eq!(message.partition_key_table.len(), distinct.len());
        assert_eq!(message.explicit_hash_key_table, ["0", "42"]);
        let read: Vec<(String, Option<String>, Vec<u8>)> = users_of(data)
            .into_iter()
            .map(|u| {
                let u = u.unwrap();
                (
                    u.partition_key().to_owned(),
                    u.explicit_hash_key().map(str::to_owned),
                    u.data().to_vec(),
                )
            })
            .collect();
        let written: Vec<(String, Option<String>, Vec<u8>)> = users
            .into_iter()
            .map(|(k, h, d)| (k, h.map(str::to_owned), d))
            .collect();
        assert_eq!(read, written);
    }

    #[test]
    fn an_aggregate_of_no_user_records_yields_none() {
        assert!(users_of(aggregate([])).is_empty());
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn record(data: Bytes) -> Record {
        Record::new("shardId-0".into(), "7", "outer", data, None)
    }

    fn user_record() -> impl Strategy<Value = (String, Option<String>, Vec<u8>)> {
        (
            "[a-z0-9]{1,8}",
            proptest::option::of("[0-9]{1,39}"),
            proptest::collection::vec(any::<u8>(), 0..64),
        )
    }

    proptest! {
        #[test]
        fn an_aggregate_round_trips(users in proptest::collection::vec(user_record(), 0..40)) {
            let data = aggregate(
                users.iter().map(|(k, h, d)| (k.as_str(), h.as_deref(), d.as_slice())),
            );
            let Unpacked::Users(read) = unpack(&record(data)) else {
                return Err(TestCaseError::fail("an aggregate"));
            };
            let read: Vec<(String, Option<String>, Vec<u8>)> = read
                .into_iter()
                .map(|u| {
                    let u = u.expect("every index is in range");
                    (
                        u.partition_key().to_owned(),
                        u.explicit_hash_key().map(str::to_owned),
                        u.data().to_vec(),
                    )
                })
                .collect();
            prop_assert_eq!(read, users);
        }

        #[test]
        fn any_bytes_after_the_magic_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256), sign in any::<bool>()) {
            let mut data = MAGIC.to_vec();
            data.extend_from_slice(&body);
            if sign {
                // With a matching MD5, so the protobuf decoder sees the bytes.
                data.extend_from_slice(&Md5::digest(&body));
            }
            let _ = unpack(&record(Bytes::from(data)));
        }
    }
}
