//! Aggregation: user records packed into KPL aggregates per predicted shard
//! ([`Publisher::aggregate`](super::Publisher::aggregate)).
//!
//! A collected batch of user records is packed by [`pack`], a pure function: each record
//! goes to the shard its hash key falls in (from the last listing of the stream's open
//! shards), into that shard's open aggregate, which is closed when the next record would take
//! it over [`Aggregate::max_bytes`] or [`Aggregate::max_records`]. A record too big to share
//! an aggregate, and an aggregate that ends up with one record, go out as plain records.
//! Every aggregate is put with the starting hash key of its shard as its explicit hash key (and
//! its first user record's partition key), so it lands on the predicted shard while the
//! listing is current.
//!
//! After a reshard the listing is stale: an aggregate put with a closed parent's starting hash
//! key lands on the child holding that key, and its user records of the other child's range
//! are *misplaced* (the KCL drops such an aggregate whole; this crate's readers deliver it, see
//! [`crate::kpl`]). When a record (an aggregate, or a user record put alone) lands elsewhere
//! than predicted, the publisher lists the shards again, so later batches are packed by the new
//! listing; and if an aggregate's user records lie outside the range of the shard it landed
//! on, it publishes all of them again, packed by the new listing, as the KPL does, and with
//! them every later record of the same predicted shard from that call, so that each key's
//! copies put last are in order: each of those user records' answer is its second place.
//! Readers see the records put again twice (at-least-once, as after any retried put). Such an
//! aggregate is never counted as written unchecked: when the new listing fails, it is put
//! again once the shards are listed (failing with the listing's error if they cannot be), and
//! when the put ends in a failure, its user records are handed back as not written.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use bytes::Bytes;

use crate::api::{SharedKinesis, list_all_shards};
use crate::error::KinesisError;
use crate::kpl::hash::effective_hash_key;
use crate::record::{OutgoingRecord, Published};

/// The default [`Aggregate::max_bytes`]: 50 KiB, as the KPL's `AggregationMaxSize`.
pub const DEFAULT_AGGREGATE_BYTES: usize = 51_200;
/// The most [`Aggregate::max_bytes`] may be: 1 MiB less room for the aggregate's partition
/// key (256 bytes) and its framing.
pub const MAX_AGGREGATE_BYTES: usize = 1_048_576 - 1_024;

/// Bytes of protobuf framing counted per user record on top of its data (field tags, lengths,
/// indexes: at most 12 for any record under 1 MiB).
const PER_RECORD_FRAMING: usize = 12;
/// The magic bytes, the MD5 trailer, and the key table's framing per entry.
const AGGREGATE_FRAMING: usize = 4 + 16;
const PER_KEY_FRAMING: usize = 4;

/// How a publisher packs user records into aggregates (see
/// [`Publisher::aggregate`](super::Publisher::aggregate)).
///
/// | setting | default |
/// |---|---|
/// | [`max_bytes`](Self::max_bytes) | 50 KiB (the KPL's `AggregationMaxSize`) |
/// | [`max_records`](Self::max_records) | no limit but the size (the KPL's `AggregationMaxCount`) |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aggregate {
    max_bytes: usize,
    max_records: usize,
}

impl Default for Aggregate {
    fn default() -> Self {
        Self {
            max_bytes: DEFAULT_AGGREGATE_BYTES,
            max_records: usize::MAX,
        }
    }
}

impl Aggregate {
    /// The most bytes one aggregate's data takes (user records' data and keys, with the
    /// format's framing): 1 KiB to [`MAX_AGGREGATE_BYTES`]. Bigger aggregates make fewer,
    /// fuller records (a shard takes 1,000 records and 1 MiB a second); smaller ones spread
    /// a reader's work.
    #[must_use]
    pub fn max_bytes(mut self, bytes: usize) -> Self {
        self.max_bytes = bytes;
        self
    }

    /// The most user records one aggregate holds (at least 1).
    #[must_use]
    pub fn max_records(mut self, records: usize) -> Self {
        self.max_records = records;
        self
    }

    /// Checks both settings; the error names the setting and the refused value.
    pub(crate) fn validate(&self) -> Result<(), KinesisError> {
        if !(1_024..=MAX_AGGREGATE_BYTES).contains(&self.max_bytes) {
            return Err(KinesisError::InvalidConfig {
                setting: "Aggregate::max_bytes",
                value: self.max_bytes.to_string(),
                reason: format!(
                    "1024 to {MAX_AGGREGATE_BYTES} (an aggregate is one record: 1 MiB with its \
                     partition key)"
                ),
            });
        }
        if self.max_records == 0 {
            return Err(KinesisError::InvalidConfig {
                setting: "Aggregate::max_records",
                value: "0".into(),
                reason: "at least 1 user record per aggregate".into(),
            });
        }
        Ok(())
    }
}

/// The open shards of a stream by hash-key range, as last listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShardMap {
    /// (first hash key, last hash key, shard id), sorted by first hash key.
    shards: Vec<(u128, u128, Arc<str>)>,
}

impl ShardMap {
    /// The map of the open shards among `listed` (id, starting and ending hash key).
    pub(crate) fn new<'a>(listed: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Self {
        let mut shards: Vec<(u128, u128, Arc<str>)> = listed
            .into_iter()
            .filter_map(|(id, start, end)| {
                Some((start.parse().ok()?, end.parse().ok()?, id.into()))
            })
            .collect();
        shards.sort_by_key(|s| s.0);
        Self { shards }
    }

    /// The open shards of `stream`, listed now.
    pub(crate) async fn list(api: &SharedKinesis, stream: &str) -> Result<Self, KinesisError> {
        let listed = list_all_shards(api.as_ref(), stream).await?;
        Ok(Self::new(
            listed
                .iter()
                .filter(|s| s.ending_sequence_number.is_none())
                .map(|s| {
                    (
                        s.shard_id.as_str(),
                        s.starting_hash_key.as_str(),
                        s.ending_hash_key.as_str(),
                    )
                }),
        ))
    }

    /// The index of the shard `record` goes to; `None` when its explicit hash key does not
    /// parse (the service refuses it) or no listed shard takes it.
    fn predict(&self, record: &OutgoingRecord) -> Option<usize> {
        let key = effective_hash_key(&record.partition_key, record.explicit_hash_key.as_deref())?;
        let at = self.shards.partition_point(|s| s.0 <= key).checked_sub(1)?;
        (key <= self.shards[at].1).then_some(at)
    }

    /// The shard id at `index`.
    pub(crate) fn id(&self, index: usize) -> &Arc<str> {
        &self.shards[index].2
    }

    /// Whether `record` lies in the range of shard `id` (false for a shard not listed).
    pub(crate) fn takes(&self, id: &str, record: &OutgoingRecord) -> bool {
        self.predict(record)
            .is_some_and(|at| &*self.shards[at].2 == id)
    }
}

/// One record to put: an aggregate of several user records, or one user record as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Packed {
    /// The predicted shard's index in the map; `None` for a record sent as it is that no
    /// listed shard takes (the service then decides).
    pub(crate) shard: Option<usize>,
    /// The user records it holds (their indexes in the batch), in order.
    pub(crate) members: Vec<usize>,
}

/// Packs `records` (a batch, in order) into aggregates per predicted shard. Aggregates of one
/// shard come out in the order of their user records.
pub(crate) fn pack(records: &[OutgoingRecord], map: &ShardMap, settings: Aggregate) -> Vec<Packed> {
    // Per shard: the open aggregate (its members, estimated bytes, its partition keys, looked
    // up by hash: an aggregate can hold tens of thousands of tiny records of distinct keys).
    struct Open<'r> {
        members: Vec<usize>,
        bytes: usize,
        keys: HashSet<&'r str>,
    }
    let mut open: Vec<Option<Open<'_>>> = (0..map.shards.len()).map(|_| None).collect();
    let mut out = Vec::new();
    let close = |open: &mut Option<Open<'_>>, shard: usize, out: &mut Vec<Packed>| {
        if let Some(done) = open.take() {
            out.push(Packed {
                shard: Some(shard),
                members: done.members,
            });
        }
    };
    for (index, record) in records.iter().enumerate() {
        let Some(shard) = map.predict(record) else {
            out.push(Packed {
                shard: None,
                members: vec![index],
            });
            continue;
        };
        let alone = AGGREGATE_FRAMING + user_bytes(record) + key_bytes(record);
        if alone > settings.max_bytes {
            // Too big to share: as it is, after the shard's open aggregate.
            close(&mut open[shard], shard, &mut out);
            out.push(Packed {
                shard: Some(shard),
                members: vec![index],
            });
            continue;
        }
        let slot = &mut open[shard];
        if let Some(current) = slot {
            let new_key = !current.keys.contains(record.partition_key.as_str());
            let grows = user_bytes(record) + if new_key { key_bytes(record) } else { 0 };
            if current.bytes + grows > settings.max_bytes
                || current.members.len() >= settings.max_records
            {
                close(slot, shard, &mut out);
            } else {
                current.bytes += grows;
                current.members.push(index);
                if new_key {
                    current.keys.insert(&record.partition_key);
                }
                continue;
            }
        }
        *slot = Some(Open {
            members: vec![index],
            bytes: alone,
            keys: HashSet::from([record.partition_key.as_str()]),
        });
    }
    for (shard, slot) in open.iter_mut().enumerate() {
        close(slot, shard, &mut out);
    }
    out
}

fn user_bytes(record: &OutgoingRecord) -> usize {
    record.data.len()
        + PER_RECORD_FRAMING
        + record
            .explicit_hash_key
            .as_ref()
            .map_or(0, |k| k.len() + PER_KEY_FRAMING)
}

fn key_bytes(record: &OutgoingRecord) -> usize {
    record.partition_key.len() + PER_KEY_FRAMING
}

/// The record to put for `packed`: a user record as it is, or an aggregate of its members put
/// with its first member's partition key and its shard's starting hash key.
pub(crate) fn outgoing(
    packed: &Packed,
    records: &[OutgoingRecord],
    map: &ShardMap,
) -> OutgoingRecord {
    if let [only] = packed.members[..] {
        return records[only].clone();
    }
    let first = &records[packed.members[0]];
    let data: Bytes = crate::kpl::aggregate(packed.members.iter().map(|&i| {
        let r = &records[i];
        (
            r.partition_key.as_str(),
            r.explicit_hash_key.as_deref(),
            &r.data[..],
        )
    }));
    OutgoingRecord {
        partition_key: first.partition_key.clone(),
        data,
        explicit_hash_key: packed.shard.map(|s| map.shards[s].0.to_string()),
    }
}

/// The places of a packed record's members, from where it was stored: with sub-sequence
/// numbers for an aggregate, as it is for a record sent alone.
pub(crate) fn member_places(packed: &Packed, place: &Published) -> Vec<Published> {
    if packed.members.len() == 1 {
        return vec![place.clone()];
    }
    (0..packed.members.len() as u64)
        .map(|sub| Published {
            sub_sequence_number: Some(sub),
            ..place.clone()
        })
        .collect()
}

/// The map shared by a publisher's sends, listed at first use and again when a put lands
/// elsewhere than predicted.
#[derive(Debug, Default)]
pub(crate) struct SharedMap(Mutex<Option<Arc<ShardMap>>>);

impl SharedMap {
    /// The current map, listing the shards when there is none.
    pub(crate) async fn get(
        &self,
        api: &SharedKinesis,
        stream: &str,
    ) -> Result<Arc<ShardMap>, KinesisError> {
        if let Some(map) = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone() {
            return Ok(map);
        }
        self.refresh(api, stream).await
    }

    /// Lists the shards again.
    pub(crate) async fn refresh(
        &self,
        api: &SharedKinesis,
        stream: &str,
    ) -> Result<Arc<ShardMap>, KinesisError> {
        let map = Arc::new(ShardMap::list(api, stream).await?);
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(map.clone());
        Ok(map)
    }

    /// Drops the map (a listing failed after a put showed it stale): the next use lists the
    /// shards again.
    pub(crate) fn forget(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two shards splitting the hash-key space in half.
    fn halves() -> ShardMap {
        ShardMap::new([
            (
                "shardId-000000000001",
                "170141183460469231731687303715884105728",
                "340282366920938463463374607431768211455",
            ),
            (
                "shardId-000000000000",
                "0",
                "170141183460469231731687303715884105727",
            ),
        ])
    }

    fn record(key: &str, hash_key: Option<&str>, size: usize) -> OutgoingRecord {
        let record = OutgoingRecord::new(key.to_owned(), vec![b'x'; size]);
        match hash_key {
            Some(k) => record.with_explicit_hash_key(k.to_owned()),
            None => record,
        }
    }

    #[test]
    fn records_are_packed_per_shard_in_order() {
        let map = halves();
        let low = Some("5");
        let high = Some("200000000000000000000000000000000000000");
        let records = vec![
            record("a", low, 10),
            record("b", high, 10),
            record("a", low, 10),
            record("c", high, 10),
        ];
        let packed = pack(&records, &map, Aggregate::default());
        assert_eq!(
            packed,
            [
                Packed {
                    shard: Some(0),
                    members: vec![0, 2]
                },
                Packed {
                    shard: Some(1),
                    members: vec![1, 3]
                },
            ]
        );
        assert_eq!(&**map.id(0), "shardId-000000000000");
        let out = outgoing(&packed[1], &records, &map);
        assert_eq!(out.partition_key, "b");
        assert_eq!(
            out.explicit_hash_key.as_deref(),
            Some("170141183460469231731687303715884105728")
        );
        assert!(out.data.starts_with(&crate::kpl::MAGIC));
    }

    #[test]
    fn an_aggregate_closes_at_its_size_or_count_and_a_big_record_goes_alone() {
        let map = halves();
        let low = Some("5");
        let records: Vec<OutgoingRecord> = (0..10).map(|_| record("k", low, 300)).collect();
        // 1,024 bytes hold three records of 300 (with their framing), not four.
        let sizes: Vec<usize> = pack(&records, &map, Aggregate::default().max_bytes(1_024))
            .iter()
            .map(|p| p.members.len())
            .collect();
        assert_eq!(sizes, [3, 3, 3, 1]);
        let counts: Vec<usize> = pack(&records, &map, Aggregate::default().max_records(4))
            .iter()
            .map(|p| p.members.len())
            .collect();
        assert_eq!(counts, [4, 4, 2]);
        let mixed = vec![
            record("k", low, 10),
            record("k", low, 2_000),
            record("k", low, 10),
        ];
        let packed = pack(&mixed, &map, Aggregate::default().max_bytes(1_024));
        let members: Vec<Vec<usize>> = packed.into_iter().map(|p| p.members).collect();
        assert_eq!(
            members,
            [vec![0], vec![1], vec![2]],
            "in order, the big one alone"
        );
    }

    #[test]
    fn many_tiny_records_of_distinct_keys_pack_into_one_aggregate_that_round_trips() {
        let map = halves();
        let records: Vec<OutgoingRecord> = (0..20_000)
            .map(|i| {
                let key = if i % 5 == 0 {
                    "same".to_owned()
                } else {
                    format!("k{i}")
                };
                record(&key, Some("5"), 1)
            })
            .collect();
        let packed = pack(
            &records,
            &map,
            Aggregate::default().max_bytes(MAX_AGGREGATE_BYTES),
        );
        assert_eq!(packed.len(), 1, "all fit in one aggregate");
        assert_eq!(packed[0].members, (0..records.len()).collect::<Vec<_>>());
        let out = outgoing(&packed[0], &records, &map);
        assert!(out.data.len() <= MAX_AGGREGATE_BYTES, "{}", out.data.len());
        let wrapped = crate::record::Record::new("shardId-0".into(), "49", "k1", out.data, None);
        let crate::kpl::Unpacked::Users(users) = crate::kpl::unpack(&wrapped) else {
            panic!("an aggregate");
        };
        let read: Vec<(String, Option<String>)> = users
            .into_iter()
            .map(|u| {
                let u = u.unwrap();
                (
                    u.partition_key().to_owned(),
                    u.explicit_hash_key().map(str::to_owned),
                )
            })
            .collect();
        let written: Vec<(String, Option<String>)> = records
            .iter()
            .map(|r| (r.partition_key.clone(), r.explicit_hash_key.clone()))
            .collect();
        assert_eq!(read, written);
    }

    #[test]
    fn a_record_no_listed_shard_takes_goes_as_it_is() {
        let map = ShardMap::new([("shardId-000000000000", "0", "100")]);
        let records = vec![
            record("k", Some("500"), 10),
            record("k", Some("not a number"), 10),
        ];
        let packed = pack(&records, &map, Aggregate::default());
        assert!(
            packed
                .iter()
                .all(|p| p.shard.is_none() && p.members.len() == 1)
        );
        assert!(!map.takes("shardId-000000000000", &records[0]));
    }

    #[test]
    fn settings_out_of_range_are_refused_by_name() {
        for (settings, name) in [
            (Aggregate::default().max_bytes(100), "Aggregate::max_bytes"),
            (
                Aggregate::default().max_bytes(2 << 20),
                "Aggregate::max_bytes",
            ),
            (
                Aggregate::default().max_records(0),
                "Aggregate::max_records",
            ),
        ] {
            let error = settings.validate().unwrap_err();
            assert!(
                matches!(error, KinesisError::InvalidConfig { setting, .. } if setting == name)
            );
        }
    }
}
