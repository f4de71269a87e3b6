//! Sending a batch of user records as aggregates ([`super::aggregate`] packs them), mapping
//! the aggregates' answers back to each user record, and putting misplaced ones again.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::aggregate::{Aggregate, Packed, ShardMap, SharedMap, member_places, outgoing, pack};
use super::{Publisher, check, error_kind};
use crate::error::KinesisError;
use crate::error::{EntryError, FailedRecord, FirstOfKey, PublishFailure};
use crate::record::{OutgoingRecord, Published};

/// How many times user records that landed outside their shard are packed and put again
/// before their places are accepted as they are (a stream resharding again and again): the
/// last put answers every user record it carried.
const MAX_REPACKS: u32 = 3;

/// One put of packed records: the user records `batch` (which are `todo` of the publish),
/// packed by `shards`.
/// The records of a put, their sizes, and the key that orders each.
type Prepared = (Vec<OutgoingRecord>, Vec<usize>, Vec<Arc<str>>);

struct Put<'a> {
    batch: &'a [OutgoingRecord],
    packed: &'a [Packed],
    shards: &'a ShardMap,
    todo: &'a [usize],
    /// The last put allowed: user records outside the shard they landed on stay there.
    last_put: bool,
}

/// What one put of packed records did for the user records it carried.
enum Landed {
    /// Every user record has its place, except those in `again` (batch indexes, in order),
    /// which go out again, and those in `unchecked` (by batch index, with why), stored on the
    /// last put allowed in an aggregate that could not be checked: not written.
    Placed {
        again: Vec<usize>,
        unchecked: HashMap<usize, EntryError>,
    },
    /// The put failed: the aggregates' failure, or an error about the whole put.
    Failed(KinesisError),
}

/// How the user records of a stored record stand against the shard it landed on.
enum Landing {
    /// Where predicted, put alone (the service placed it by its own key), or every user
    /// record lies in the range of the shard it landed on.
    Fits,
    /// Landed elsewhere than predicted with this many user records outside the range of the
    /// shard it landed on.
    Outside(usize),
    /// Landed elsewhere than predicted, and the shards could not be listed to tell.
    Unknown(KinesisError),
}

/// What is known of the user records a publish did not write, by position: the last error
/// of each, and which may be stored all the same (sent in a call that failed as a whole, or
/// in an aggregate stored on a shard other than predicted).
#[derive(Default)]
struct Causes {
    errors: HashMap<usize, EntryError>,
    maybe_stored: HashSet<usize>,
}

/// The listing taken after a put that landed elsewhere than predicted (once per put).
type Fresh = Option<Result<Arc<ShardMap>, KinesisError>>;

impl Publisher {
    /// Publishes checked user `records` packed into aggregates per predicted shard; returns
    /// each user record's place, in input order.
    pub(super) async fn send_aggregated(
        &self,
        records: Vec<OutgoingRecord>,
        settings: Aggregate,
        map: &SharedMap,
    ) -> Result<Vec<Published>, KinesisError> {
        let mut places: Vec<Option<Published>> = vec![None; records.len()];
        let mut todo: Vec<usize> = (0..records.len()).collect();
        // User records of aggregates an earlier put stored (on a shard other than predicted,
        // or behind one that was) and that go out again: handed back, they may be stored.
        let mut stored_before: HashSet<usize> = HashSet::new();
        let mut repacks = 0;
        loop {
            // Listed at the first use, and again (in `put_packed`) when a put landed elsewhere
            // than predicted.
            let shards = match map.get(&self.api, &self.stream).await {
                Ok(shards) => shards,
                Err(error) => {
                    return Err(self.whole_failure(records, places, &error, &stored_before));
                }
            };
            let batch: Vec<OutgoingRecord> = todo.iter().map(|&i| records[i].clone()).collect();
            let packed = pack(&batch, &shards, settings);
            let last_put = repacks >= MAX_REPACKS;
            let put = Put {
                batch: &batch,
                packed: &packed,
                shards: &shards,
                todo: &todo,
                last_put,
            };
            match self.put_packed(put, map, &mut places).await {
                Landed::Placed { again, unchecked } if !unchecked.is_empty() => {
                    debug_assert!(again.is_empty(), "the last put puts nothing again");
                    let last = unchecked.values().next().cloned().unwrap_or(EntryError {
                        code: String::new(),
                        message: String::new(),
                    });
                    // Their aggregates were stored, unchecked.
                    stored_before.extend(unchecked.keys().copied());
                    let causes = Causes {
                        errors: unchecked,
                        maybe_stored: stored_before,
                    };
                    return Err(self.user_failure(records, places, &last, &causes, 1, false));
                }
                Landed::Placed { again, .. } if again.is_empty() => {
                    return Ok(places.into_iter().flatten().collect());
                }
                Landed::Placed { again, .. } => {
                    repacks += 1;
                    stored_before.extend(again.iter().copied());
                    todo = again;
                }
                Landed::Failed(error) => {
                    let put = Put {
                        batch: &batch,
                        packed: &packed,
                        shards: &shards,
                        todo: &todo,
                        last_put,
                    };
                    let failed = self.failed_put(records, places, put, map, error, stored_before);
                    return Err(failed.await);
                }
            }
        }
    }

    /// Carries out `put` and notes each user record's place in `places`.
    async fn put_packed(
        &self,
        put: Put<'_>,
        map: &SharedMap,
        places: &mut [Option<Published>],
    ) -> Landed {
        let (entries, sizes, keys) = match self.prepare(&put) {
            Ok(prepared) => prepared,
            Err(error) => return Landed::Failed(error),
        };
        match self.send_keyed(entries, sizes, &keys).await {
            Ok(stored) => self.place(put, &stored, map, places).await,
            Err(error) => Landed::Failed(error),
        }
    }

    /// The records of a put of aggregates, their sizes, and the key that orders each: its
    /// predicted shard (a shard's aggregates go in order), or its partition key.
    fn prepare(&self, put: &Put<'_>) -> Result<Prepared, KinesisError> {
        let entries: Vec<OutgoingRecord> = (put.packed.iter())
            .map(|p| outgoing(p, put.batch, put.shards))
            .collect();
        let sizes = (entries.iter().enumerate())
            .map(|(index, entry)| check::check(entry, &self.stream, index))
            .collect::<Result<Vec<_>, _>>()?;
        let keys = (put.packed.iter().zip(&entries))
            .map(|(p, e)| {
                p.shard.map_or_else(
                    || Arc::from(&*e.partition_key),
                    |s| put.shards.id(s).clone(),
                )
            })
            .collect();
        Ok((entries, sizes, keys))
    }

    /// How `p`'s user records, stored at `place`, stand against the shard it landed on. When
    /// it landed elsewhere than predicted the map is stale (a reshard): the shards are listed
    /// again, once per put (`fresh`); a listing that fails drops the map, so the next use
    /// lists again.
    async fn landing(
        &self,
        put: &Put<'_>,
        p: &Packed,
        place: &Published,
        map: &SharedMap,
        fresh: &mut Fresh,
    ) -> Landing {
        let predicted = p.shard.map(|s| put.shards.id(s));
        if predicted.is_none_or(|id| **id == *place.shard_id) {
            return Landing::Fits;
        }
        let listed = match fresh {
            Some(listed) => listed,
            None => {
                let listed = map.refresh(&self.api, &self.stream).await;
                if listed.is_err() {
                    map.forget();
                }
                fresh.insert(listed)
            }
        };
        if p.members.len() == 1 {
            return Landing::Fits;
        }
        match listed {
            Ok(listed) => match (p.members.iter())
                .filter(|&&m| !listed.takes(&place.shard_id, &put.batch[m]))
                .count()
            {
                0 => Landing::Fits,
                outside => Landing::Outside(outside),
            },
            Err(error) => {
                tracing::warn!(
                    stream = %self.stream,
                    landed = %place.shard_id,
                    %error,
                    "an aggregate landed on another shard than predicted (the stream was \
                     resharded) and the shards could not be listed to check its user records"
                );
                Landing::Unknown(error.clone())
            }
        }
    }

    /// Fills in the places of the user records whose aggregates `stored` says landed, and
    /// tells which go out again and which are not written.
    ///
    /// An aggregate put against a stale map with user records outside the range of the shard
    /// it landed on, or that could not be checked against a new listing, goes out again whole
    /// by the new map (a reader that drops such aggregates, as the KCL does, would lose its
    /// other user records), and with it every later record of the same predicted shard, so
    /// each key's last copies are in order. On the last put allowed, the places of the user
    /// records outside stand; an aggregate that could not be checked is not written, and
    /// neither is any later record of its predicted shard.
    async fn place(
        &self,
        put: Put<'_>,
        stored: &[Published],
        map: &SharedMap,
        places: &mut [Option<Published>],
    ) -> Landed {
        let mut again = Vec::new();
        let mut unchecked = HashMap::new();
        // Predicted shards with a record going out again, or not written.
        let mut redone: HashSet<usize> = HashSet::new();
        let mut fresh: Fresh = None;
        for (p, place) in put.packed.iter().zip(stored) {
            let landing = self.landing(&put, p, place, map, &mut fresh).await;
            if let Landing::Outside(outside) = landing {
                let predicted = p.shard.map(|s| &**put.shards.id(s));
                self.warn_outside(predicted, &place.shard_id, outside, put.last_put);
            }
            let behind_one = p.shard.is_some_and(|s| redone.contains(&s));
            if !put.last_put && (behind_one || !matches!(landing, Landing::Fits)) {
                redone.extend(p.shard);
                again.extend(p.members.iter().map(|&m| put.todo[m]));
                continue;
            }
            if let Landing::Unknown(error) = &landing {
                redone.extend(p.shard);
                let why = unchecked_entry(&place.shard_id, error);
                unchecked.extend(p.members.iter().map(|&m| (put.todo[m], why.clone())));
                continue;
            }
            if behind_one {
                let why = held_entry(&place.shard_id);
                unchecked.extend(p.members.iter().map(|&m| (put.todo[m], why.clone())));
                continue;
            }
            for (&m, member) in p.members.iter().zip(member_places(p, place)) {
                places[put.todo[m]] = Some(member);
            }
        }
        again.sort_unstable();
        Landed::Placed { again, unchecked }
    }

    fn warn_outside(&self, predicted: Option<&str>, landed: &str, outside: usize, last_put: bool) {
        if last_put {
            tracing::warn!(
                stream = %self.stream,
                landed,
                outside,
                "user records landed outside their shard's range {} times (the stream keeps \
                 resharding); their last places stand",
                MAX_REPACKS + 1
            );
        } else {
            tracing::warn!(
                stream = %self.stream,
                predicted,
                landed,
                outside,
                "an aggregate landed on another shard than predicted (the stream was \
                 resharded) with user records outside that shard's range; putting it and \
                 the later records of its predicted shard again by the new shard map"
            );
        }
    }

    /// The failure of a publish whose `put` failed with `error`, about its user records.
    ///
    /// A stored aggregate that landed elsewhere than predicted counts as written only when
    /// every user record it holds lies in the range of the shard it landed on (checked
    /// against a new listing); else its user records, and the later records of its predicted
    /// shard, are handed back as not written.
    async fn failed_put(
        &self,
        records: Vec<OutgoingRecord>,
        mut places: Vec<Option<Published>>,
        put: Put<'_>,
        map: &SharedMap,
        error: KinesisError,
        mut maybe_stored: HashSet<usize>,
    ) -> KinesisError {
        let KinesisError::PublishFailed(failure) = error else {
            return self.whole_failure(records, places, &error, &maybe_stored);
        };
        let todo = put.todo;
        let packed = put.packed;
        let mut errors: HashMap<usize, EntryError> = HashMap::new();
        // Predicted shards with an aggregate not counted as written.
        let mut held: HashSet<usize> = HashSet::new();
        let mut fresh: Fresh = None;
        for (p, place) in packed.iter().zip(&failure.published) {
            let Some(place) = place else { continue };
            let why = match self.landing(&put, p, place, map, &mut fresh).await {
                Landing::Outside(outside) => {
                    tracing::warn!(
                        stream = %self.stream,
                        landed = %place.shard_id,
                        outside,
                        "an aggregate landed on another shard than predicted (the stream was \
                         resharded) with user records outside that shard's range, and the \
                         publish failed: its user records are handed back as not written"
                    );
                    Some(outside_entry(&place.shard_id, outside))
                }
                Landing::Unknown(error) => Some(unchecked_entry(&place.shard_id, &error)),
                Landing::Fits if p.shard.is_some_and(|s| held.contains(&s)) => {
                    Some(held_entry(&place.shard_id))
                }
                Landing::Fits => None,
            };
            match why {
                Some(why) => {
                    // Stored, and handed back.
                    maybe_stored.extend(p.members.iter().map(|&m| todo[m]));
                    held.extend(p.shard);
                    errors.extend(p.members.iter().map(|&m| (todo[m], why.clone())));
                }
                None => {
                    for (&m, member) in p.members.iter().zip(member_places(p, place)) {
                        places[todo[m]] = Some(member);
                    }
                }
            }
        }
        for failed in &failure.failed {
            let members = packed[failed.index].members.iter().map(|&m| todo[m]);
            if failed.maybe_stored {
                maybe_stored.extend(members.clone());
            }
            if let Some(cause) = &failed.last_error {
                errors.extend(members.map(|m| (m, cause.clone())));
            }
        }
        let causes = Causes {
            errors,
            maybe_stored,
        };
        let last = EntryError {
            code: failure.last_code.clone(),
            message: failure.last_message.clone(),
        };
        self.user_failure(
            records,
            places,
            &last,
            &causes,
            failure.attempts,
            failure.stopped_early,
        )
    }

    /// `error` about a whole put: as it is when nothing of the publish was written or may be
    /// stored (`maybe_stored`, by position), else a [`PublishFailure`] about the user records
    /// not written.
    fn whole_failure(
        &self,
        records: Vec<OutgoingRecord>,
        places: Vec<Option<Published>>,
        error: &KinesisError,
        maybe_stored: &HashSet<usize>,
    ) -> KinesisError {
        if places.iter().all(Option::is_none) && maybe_stored.is_empty() {
            return error.clone();
        }
        let causes = Causes {
            maybe_stored: maybe_stored.clone(),
            ..Causes::default()
        };
        self.user_failure(records, places, &error_entry(error), &causes, 1, true)
    }

    /// A [`PublishFailure`] about user records: `places` where written, the others handed
    /// back in order with what `causes` knows of them and the earlier unwritten record of
    /// their key.
    fn user_failure(
        &self,
        records: Vec<OutgoingRecord>,
        places: Vec<Option<Published>>,
        last: &EntryError,
        causes: &Causes,
        attempts: u32,
        stopped_early: bool,
    ) -> KinesisError {
        let mut first_of_key = FirstOfKey::new();
        let mut failed = Vec::new();
        for (index, record) in records.into_iter().enumerate() {
            if places[index].is_some() {
                continue;
            }
            let behind = first_of_key.behind(record.partition_key.clone(), index);
            failed.push(FailedRecord {
                index,
                record,
                last_error: causes.errors.get(&index).cloned(),
                maybe_stored: causes.maybe_stored.contains(&index),
                behind,
            });
        }
        KinesisError::PublishFailed(Box::new(PublishFailure {
            stream: self.stream.to_string(),
            attempts,
            published: places,
            failed,
            last_code: last.code.clone(),
            last_message: last.message.clone(),
            stopped_early,
        }))
    }
}

/// Why a user record stored in an aggregate with user records outside the range of the shard
/// it landed on is not written.
fn outside_entry(landed: &str, outside: usize) -> EntryError {
    EntryError {
        code: "Error".into(),
        message: format!(
            "stored on shard {landed} in an aggregate put by a shard map the stream's \
             resharding made stale, with {outside} user records outside that shard's hash-key \
             range (a reader that drops such aggregates loses them); not counted as written"
        ),
    }
}

/// Why a user record stored in an aggregate that could not be checked is not written.
fn unchecked_entry(landed: &str, error: &KinesisError) -> EntryError {
    EntryError {
        message: format!(
            "stored on shard {landed} in an aggregate that landed elsewhere than predicted \
             (the stream was resharded), and the shards could not be listed to check that its \
             user records belong there; not counted as written: {error}"
        ),
        ..error_entry(error)
    }
}

/// Why a user record stored after an aggregate of its predicted shard that is not written is
/// not written either (its key's records would be out of order).
fn held_entry(landed: &str) -> EntryError {
    EntryError {
        code: "Error".into(),
        message: format!(
            "stored on shard {landed} after an aggregate of the same predicted shard that is \
             not counted as written; not counted as written either, to keep its key's order"
        ),
    }
}

/// An error about a whole call, as an entry's error.
fn error_entry(error: &KinesisError) -> EntryError {
    EntryError {
        code: error_kind(error).to_owned(),
        message: error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;
    use std::time::Duration;

    use futures::StreamExt;

    use crate::KinesisError;
    use crate::api::layer::{ApiCall, KinesisLayer, Layered};
    use crate::api::memory::Fault;
    use crate::api::{ApiFuture, list_all_shards};
    use crate::error::Operation;
    use crate::publish::{Aggregate, Collect, OutgoingRecord, Published, Publisher, RetryPolicy};
    use crate::{MemoryKinesis, ReadSettings, Record, ShardStream, StartingPoint};

    /// Every user record of `shard`, de-aggregated.
    async fn read(kinesis: &MemoryKinesis, shard: &str) -> Vec<Record> {
        let stored = kinesis.records("orders", shard).unwrap().len();
        let mut reader = ShardStream::builder(Arc::new(kinesis.clone()), "orders", shard)
            .settings(ReadSettings::default().deaggregate(true).unlimited_reads())
            .open(StartingPoint::TrimHorizon)
            .unwrap();
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        while seen.len() < stored || !out.last().is_some_and(Record::is_last_of_aggregate) {
            let record = tokio::time::timeout(Duration::from_secs(5), reader.next())
                .await
                .expect("records in time")
                .expect("open")
                .expect("no error");
            seen.insert(record.sequence_number().to_owned());
            out.push(record);
        }
        out
    }

    fn publisher(kinesis: &MemoryKinesis) -> Publisher {
        Publisher::new(Arc::new(kinesis.clone()), "orders")
            .collect(Collect::default().linger(Duration::from_millis(20)))
            .aggregate(Aggregate::default().max_bytes(4_096))
    }

    #[tokio::test(start_paused = true)]
    async fn user_records_are_packed_per_shard_and_read_back_in_key_order_where_answered() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("orders", 2).unwrap();
        let publisher = publisher(&kinesis);
        let records: Vec<OutgoingRecord> = (0..400)
            .map(|i| OutgoingRecord::new(format!("key-{}", i % 7), format!("{i:04}")))
            .collect();
        let places = publisher.publish_batch(records.clone()).await.unwrap();
        // 400 user records of about 20 bytes in aggregates of 4 KiB: a few per shard.
        let stored: usize = ["shardId-000000000000", "shardId-000000000001"]
            .iter()
            .map(|s| kinesis.records("orders", s).unwrap().len())
            .sum();
        assert!(stored <= 6, "{stored} Kinesis records for 400 user records");
        assert_eq!(kinesis.call_count(Operation::PutRecords), 1);
        let mut read_back: HashMap<(String, String, Option<u64>), Record> = HashMap::new();
        for shard in ["shardId-000000000000", "shardId-000000000001"] {
            let users = read(&kinesis, shard).await;
            let mut last: HashMap<String, Vec<u8>> = HashMap::new();
            for user in users {
                let before = last.insert(user.partition_key().to_owned(), user.data().to_vec());
                assert!(before.is_none_or(|b| b < user.data().to_vec()), "key order");
                read_back.insert(
                    (
                        user.shard_id().to_owned(),
                        user.sequence_number().to_owned(),
                        user.sub_sequence_number(),
                    ),
                    user,
                );
            }
        }
        assert_eq!(read_back.len(), 400);
        for (record, place) in records.iter().zip(&places) {
            let user = &read_back[&(
                place.shard_id.clone(),
                place.sequence_number.clone(),
                place.sub_sequence_number,
            )];
            assert_eq!(
                user.data(),
                &record.data,
                "the answer names where the reader finds it"
            );
            assert_eq!(user.partition_key(), record.partition_key);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_split_misplaced_user_records_are_put_again_where_they_belong() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("orders", 1).unwrap();
        let publisher = publisher(&kinesis);
        // The first publish lists the one shard.
        publisher.publish("warm-up", "x").await.unwrap();
        kinesis
            .split_shard(
                "orders",
                "shardId-000000000000",
                "170141183460469231731687303715884105728",
            )
            .await
            .unwrap();
        let records: Vec<OutgoingRecord> = (0..40)
            .map(|i| OutgoingRecord::new(format!("key-{i}"), format!("{i:04}")))
            .collect();
        let places = publisher.publish_batch(records.clone()).await.unwrap();
        let lower =
            crate::kpl::hash::HashRange::parse("0", "170141183460469231731687303715884105727")
                .unwrap();
        for (record, place) in records.iter().zip(&places) {
            let expected = if lower.contains(&record.partition_key, None) {
                "shardId-000000000001"
            } else {
                "shardId-000000000002"
            };
            assert_eq!(
                place.shard_id, expected,
                "{} answered where it belongs",
                record.partition_key
            );
        }
        // Listed at the first publish, and again when the aggregate landed on a child.
        assert_eq!(kinesis.call_count(Operation::ListShards), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_keeps_its_order_when_an_aggregate_it_shares_is_put_again() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("orders", 1).unwrap();
        let publisher = Publisher::new(Arc::new(kinesis.clone()), "orders")
            .aggregate(Aggregate::default().max_records(2));
        publisher.publish("warm-up", "x").await.unwrap();
        kinesis
            .split_shard(
                "orders",
                "shardId-000000000000",
                "170141183460469231731687303715884105728",
            )
            .await
            .unwrap();
        // By the stale map one shard: [j1, x1] and [j2, j3] are packed for it, both land on
        // the lower child, and x1 is outside it.
        let lower =
            |data: &str| OutgoingRecord::new("j", data.to_owned()).with_explicit_hash_key("1");
        let upper = OutgoingRecord::new("x", "x1")
            .with_explicit_hash_key("170141183460469231731687303715884105729");
        let records = vec![lower("j1"), upper, lower("j2"), lower("j3")];
        let places = publisher.publish_batch(records).await.unwrap();
        let at = |i: usize| {
            let p: &Published = &places[i];
            (
                p.shard_id.clone(),
                // Sequence numbers compare as numbers: by length, then digit by digit.
                (p.sequence_number.len(), p.sequence_number.clone()),
                p.sub_sequence_number.unwrap_or(0),
            )
        };
        assert_eq!(
            places[1].shard_id, "shardId-000000000002",
            "x1 where it belongs"
        );
        assert!(
            at(0) < at(2) && at(2) < at(3),
            "j's records read in the order published: {:?}",
            [at(0), at(2), at(3)]
        );
        // A de-aggregating reader of the lower child: j's first copies, then the copies put
        // again, each run in order (the misplaced aggregate was put again whole, and with it
        // the later one of the same predicted shard).
        let j: Vec<Vec<u8>> = read(&kinesis, "shardId-000000000001")
            .await
            .into_iter()
            .filter(|r| r.partition_key() == "j")
            .map(|r| r.data().to_vec())
            .collect();
        let run = [b"j1".to_vec(), b"j2".to_vec(), b"j3".to_vec()];
        assert_eq!(j, [run.clone(), run].concat());
    }

    /// Splits the open shard with the highest hash keys in two before every PutRecords.
    struct SplitBeforePut(MemoryKinesis);

    impl KinesisLayer for SplitBeforePut {
        fn around<'a, T: Send + 'a>(
            &'a self,
            call: ApiCall<'a>,
            next: ApiFuture<'a, T>,
        ) -> ApiFuture<'a, T> {
            if !matches!(call, ApiCall::PutRecords { .. }) {
                return next;
            }
            Box::pin(async move {
                let shards = list_all_shards(&self.0, "orders").await.unwrap();
                let key = |k: &str| k.parse::<u128>().unwrap();
                let highest = shards
                    .iter()
                    .filter(|s| s.ending_sequence_number.is_none())
                    .max_by_key(|s| key(&s.starting_hash_key))
                    .unwrap();
                let (low, high) = (
                    key(&highest.starting_hash_key),
                    key(&highest.ending_hash_key),
                );
                let middle = low + (high - low) / 2 + 1;
                self.0
                    .split_shard("orders", &highest.shard_id, &middle.to_string())
                    .await
                    .unwrap();
                next.await
            })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_resharding_before_every_put_still_answers_every_record() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("orders", 1).unwrap();
        let api = Layered::new(Arc::new(kinesis.clone()), SplitBeforePut(kinesis.clone()));
        let publisher = Publisher::new(Arc::new(api), "orders").aggregate(Aggregate::default());
        // Spread over the whole key space: after each split, the upper half of what was put
        // lands outside the shard the aggregate landed on, more times than it is put again.
        let records: Vec<OutgoingRecord> = (0..64u128)
            .map(|i| {
                OutgoingRecord::new(format!("key-{i}"), format!("{i:04}"))
                    .with_explicit_hash_key((i << 122).to_string())
            })
            .collect();
        let places = tokio::time::timeout(
            Duration::from_secs(60),
            publisher.publish_batch(records.clone()),
        )
        .await
        .expect("the publish is answered")
        .expect("every record written");
        assert_eq!(places.len(), records.len(), "one place per user record");
        // The last places stand: every user record is where its answer says.
        let mut stored = std::collections::HashSet::new();
        for place in &places {
            for user in read(&kinesis, &place.shard_id).await {
                stored.insert((
                    user.shard_id().to_owned(),
                    user.sequence_number().to_owned(),
                    user.sub_sequence_number(),
                ));
            }
        }
        for place in &places {
            let at = (
                place.shard_id.clone(),
                place.sequence_number.clone(),
                place.sub_sequence_number,
            );
            assert!(stored.contains(&at), "{at:?} holds a user record");
        }
    }

    /// A stream of one shard listed by `publisher`, then split in two halves behind its back.
    async fn split_after_listing(kinesis: &MemoryKinesis, publisher: &Publisher) {
        publisher.publish("warm-up", "x").await.unwrap();
        kinesis
            .split_shard(
                "orders",
                "shardId-000000000000",
                "170141183460469231731687303715884105728",
            )
            .await
            .unwrap();
    }

    /// `j` for the lower child and `x` for the upper one: packed together by the stale map,
    /// they land on the lower child, and `x` lies outside it.
    fn j_and_x() -> Vec<OutgoingRecord> {
        vec![
            OutgoingRecord::new("j", vec![b'j'; 10]).with_explicit_hash_key("1"),
            OutgoingRecord::new("x", vec![b'x'; 10])
                .with_explicit_hash_key("170141183460469231731687303715884105729"),
        ]
    }

    #[tokio::test(start_paused = true)]
    async fn a_misplaced_aggregate_of_a_failed_put_is_not_reported_written() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("orders", 1).unwrap();
        let publisher = Publisher::new(Arc::new(kinesis.clone()), "orders")
            .aggregate(Aggregate::default().max_bytes(1_024))
            .retry(RetryPolicy::no_retries());
        split_after_listing(&kinesis, &publisher).await;
        // `b` is too big to share an aggregate: put alone, it lands on the upper child, where
        // every entry fails; the aggregate [j, x] is stored on the lower child.
        kinesis.inject(
            Fault::fail(Operation::PutRecords, "down")
                .on_shard("shardId-000000000002")
                .times(u32::MAX),
        );
        let mut records = j_and_x();
        records.push(
            OutgoingRecord::new("b", vec![b'b'; 2_000])
                .with_explicit_hash_key("170141183460469231731687303715884105729"),
        );
        let outcome =
            tokio::time::timeout(Duration::from_secs(60), publisher.publish_batch(records))
                .await
                .expect("the publish is answered");
        let Err(KinesisError::PublishFailed(failure)) = outcome else {
            panic!("`b` is not written: {outcome:?}");
        };
        assert!(
            failure.published[1].is_none(),
            "`x` is reported written on a shard that does not take it: {:?}",
            failure.published[1]
        );
        // A reader that drops a misplaced aggregate drops `j` with it.
        assert!(failure.published[0].is_none(), "{:?}", failure.published[0]);
        let failed: Vec<&str> = (failure.failed.iter())
            .map(|f| f.record.partition_key.as_str())
            .collect();
        assert_eq!(failed, ["j", "x", "b"]);
        let maybe: Vec<bool> = failure.failed.iter().map(|f| f.maybe_stored).collect();
        assert_eq!(
            maybe,
            [true, true, false],
            "[j, x] is stored on the lower child"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_misplaced_aggregate_is_not_reported_written_when_the_shards_cannot_be_listed() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("orders", 1).unwrap();
        let publisher = publisher(&kinesis);
        split_after_listing(&kinesis, &publisher).await;
        kinesis.inject(Fault::throttle(Operation::ListShards).times(u32::MAX));
        let outcome =
            tokio::time::timeout(Duration::from_secs(60), publisher.publish_batch(j_and_x()))
                .await
                .expect("the publish is answered");
        match outcome {
            Ok(places) => panic!("reported written: {places:?}"),
            Err(KinesisError::PublishFailed(failure)) => {
                assert!(failure.published[1].is_none(), "{:?}", failure.published);
                assert!(
                    failure.failed.iter().all(|f| f.maybe_stored),
                    "[j, x] is stored, unchecked: {:?}",
                    failure.failed
                );
            }
            Err(error) => panic!("the listing's bare error, though [j, x] is stored: {error}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_misplaced_aggregate_is_put_again_when_a_listing_fails_once() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("orders", 1).unwrap();
        let publisher = publisher(&kinesis);
        split_after_listing(&kinesis, &publisher).await;
        kinesis.inject(Fault::throttle(Operation::ListShards));
        let places =
            tokio::time::timeout(Duration::from_secs(60), publisher.publish_batch(j_and_x()))
                .await
                .expect("the publish is answered")
                .expect("written");
        let shards: Vec<&str> = places.iter().map(|p| p.shard_id.as_str()).collect();
        assert_eq!(shards, ["shardId-000000000001", "shardId-000000000002"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_put_alone_that_lands_elsewhere_refreshes_the_map_too() {
        let kinesis = MemoryKinesis::new();
        kinesis.add_stream("orders", 1).unwrap();
        let publisher = publisher(&kinesis);
        publisher.publish("warm-up", "x").await.unwrap();
        kinesis
            .split_shard(
                "orders",
                "shardId-000000000000",
                "170141183460469231731687303715884105728",
            )
            .await
            .unwrap();
        // Alone, so put as it is: it lands on a child, and the map is listed again.
        publisher.publish("single", "y").await.unwrap();
        assert_eq!(kinesis.call_count(Operation::ListShards), 2);
        kinesis.clear_calls();
        let records: Vec<OutgoingRecord> = (0..40)
            .map(|i| OutgoingRecord::new(format!("key-{i}"), format!("{i:04}")))
            .collect();
        publisher.publish_batch(records).await.unwrap();
        // Packed by the new map: one call, nothing put again, no listing.
        assert_eq!(kinesis.call_count(Operation::PutRecords), 1);
        assert_eq!(kinesis.call_count(Operation::ListShards), 0);
    }
}
