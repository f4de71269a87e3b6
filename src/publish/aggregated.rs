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
    /// Every user record has its place, except these (batch indexes, in order), which
    /// landed outside the range of their shard and go out again.
    Placed(Vec<usize>),
    /// The put failed: the aggregates' failure, or an error about the whole put.
    Failed(KinesisError),
}

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
        let mut repacks = 0;
        loop {
            // Listed at the first use, and again (in `put_packed`) when a put landed elsewhere
            // than predicted.
            let shards = match map.get(&self.api, &self.stream).await {
                Ok(shards) => shards,
                Err(error) => return Err(self.whole_failure(records, places, &error)),
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
                Landed::Placed(again) if again.is_empty() => {
                    return Ok(places.into_iter().flatten().collect());
                }
                Landed::Placed(again) => {
                    repacks += 1;
                    todo = again;
                }
                Landed::Failed(error) => {
                    return Err(self.failed_put(records, places, &todo, &packed, error));
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
            Ok(stored) => Landed::Placed(self.place(put, &stored, map, places).await),
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

    /// Fills in the places of the user records whose aggregates `stored` says landed, and
    /// returns (sorted) those that go out again.
    async fn place(
        &self,
        put: Put<'_>,
        stored: &[Published],
        map: &SharedMap,
        places: &mut [Option<Published>],
    ) -> Vec<usize> {
        let Put {
            batch,
            packed,
            shards,
            todo,
            last_put,
        } = put;
        let mut again = Vec::new();
        // Predicted shards with a record going out again.
        let mut redone: HashSet<usize> = HashSet::new();
        let mut fresh: Option<Arc<ShardMap>> = None;
        for (p, place) in packed.iter().zip(stored) {
            let predicted = p.shard.map(|s| shards.id(s));
            // Landed elsewhere than predicted: the map is stale (a reshard), list again.
            let misplaced = predicted.is_some_and(|id| **id != *place.shard_id);
            if misplaced && fresh.is_none() {
                fresh = map.refresh(&self.api, &self.stream).await.ok();
            }
            // An aggregate put against a stale map with user records outside the range of the
            // shard it landed on goes out again whole by the new map (a reader that drops such
            // aggregates, as the KCL does, would lose its other user records), and with it
            // every later record of the same predicted shard, so each key's last copies are in
            // order. On the last put allowed, the places stand.
            let outside = match &fresh {
                Some(f) if misplaced && p.members.len() > 1 => (p.members.iter())
                    .filter(|&&m| !f.takes(&place.shard_id, &batch[m]))
                    .count(),
                _ => 0,
            };
            if outside > 0 {
                let predicted = predicted.map(|id| &**id);
                self.warn_outside(predicted, &place.shard_id, outside, last_put);
            }
            let behind_one = p.shard.is_some_and(|s| redone.contains(&s));
            if !last_put && (outside > 0 || behind_one) {
                redone.extend(p.shard);
                again.extend(p.members.iter().map(|&m| todo[m]));
                continue;
            }
            for (&m, member) in p.members.iter().zip(member_places(p, place)) {
                places[todo[m]] = Some(member);
            }
        }
        again.sort_unstable();
        again
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

    /// The failure of a publish whose put of `packed` (user records `todo`) failed with
    /// `error`, about its user records.
    fn failed_put(
        &self,
        records: Vec<OutgoingRecord>,
        mut places: Vec<Option<Published>>,
        todo: &[usize],
        packed: &[Packed],
        error: KinesisError,
    ) -> KinesisError {
        let KinesisError::PublishFailed(failure) = error else {
            return self.whole_failure(records, places, &error);
        };
        let mut errors: HashMap<usize, EntryError> = HashMap::new();
        for (p, place) in packed.iter().zip(&failure.published) {
            if let Some(place) = place {
                for (&m, member) in p.members.iter().zip(member_places(p, place)) {
                    places[todo[m]] = Some(member);
                }
            }
        }
        for failed in &failure.failed {
            if let Some(cause) = &failed.last_error {
                for &m in &packed[failed.index].members {
                    errors.insert(todo[m], cause.clone());
                }
            }
        }
        let last = EntryError {
            code: failure.last_code.clone(),
            message: failure.last_message.clone(),
        };
        self.user_failure(
            records,
            places,
            &last,
            &errors,
            failure.attempts,
            failure.stopped_early,
        )
    }

    /// `error` about a whole put: as it is when nothing of the publish was written, else a
    /// [`PublishFailure`] about the user records not written.
    fn whole_failure(
        &self,
        records: Vec<OutgoingRecord>,
        places: Vec<Option<Published>>,
        error: &KinesisError,
    ) -> KinesisError {
        if places.iter().all(Option::is_none) {
            return error.clone();
        }
        self.user_failure(
            records,
            places,
            &error_entry(error),
            &HashMap::new(),
            1,
            true,
        )
    }

    /// A [`PublishFailure`] about user records: `places` where written, the others handed
    /// back in order with their last error and the earlier unwritten record of their key.
    fn user_failure(
        &self,
        records: Vec<OutgoingRecord>,
        places: Vec<Option<Published>>,
        last: &EntryError,
        errors: &HashMap<usize, EntryError>,
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
                last_error: errors.get(&index).cloned(),
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

    use crate::api::layer::{ApiCall, KinesisLayer, Layered};
    use crate::api::{ApiFuture, list_all_shards};
    use crate::error::Operation;
    use crate::publish::{Aggregate, Collect, OutgoingRecord, Published, Publisher};
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
