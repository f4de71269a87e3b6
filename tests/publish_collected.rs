//! Collecting and aggregating publishers on kinesis-local: single publishes from many tasks
//! share PutRecords calls (counted by the fault proxy) and keep each task's order; aggregated
//! user records are stored as KPL aggregates that AWS's own `aws-kinesis-agg` (npm, pinned in
//! `harness/package.json`) takes apart into exactly the records published, at the places the
//! publisher answered; and after a split, user records the stale shard map misplaced are put
//! again on the child that takes them.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ShardIteratorType;
use kinesis_dataflow::publish::{Aggregate, Collect, Published};
use kinesis_dataflow::{AwsKinesis, OutgoingRecord, Publisher};
use kinesis_dataflow_test_support::kpl::{ReferenceUserRecord, reference_deaggregate};
use support::proxy::{FaultProxy, kinesis_config_builder};

/// Every Kinesis record of `stream` as stored (data, partition key, sequence number), per
/// shard in order, read with the SDK directly.
async fn stored(client: &Client, stream: &str) -> Vec<(String, Vec<(Vec<u8>, String, String)>)> {
    let shards = client
        .list_shards()
        .stream_name(stream)
        .send()
        .await
        .unwrap()
        .shards
        .unwrap_or_default();
    let mut out = Vec::new();
    for shard in shards {
        let mut iterator = client
            .get_shard_iterator()
            .stream_name(stream)
            .shard_id(&shard.shard_id)
            .shard_iterator_type(ShardIteratorType::TrimHorizon)
            .send()
            .await
            .unwrap()
            .shard_iterator;
        let mut records = Vec::new();
        while let Some(at) = iterator {
            let page = client
                .get_records()
                .shard_iterator(at)
                .send()
                .await
                .unwrap();
            let empty = page.records.is_empty();
            records.extend(page.records.into_iter().map(|r| {
                (
                    r.data.into_inner(),
                    r.partition_key.unwrap_or_default(),
                    r.sequence_number,
                )
            }));
            // An open shard's iterator never ends: stop at its tip.
            iterator = if empty && page.millis_behind_latest == Some(0) {
                None
            } else {
                page.next_shard_iterator
            };
        }
        out.push((shard.shard_id, records));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_publishes_from_many_tasks_share_calls_and_keep_each_tasks_order() {
    let proxy = FaultProxy::start(&support::kinesis_endpoint()).await;
    let client = Client::from_conf(kinesis_config_builder(&proxy).build());
    let stream = support::unique_name("collected");
    support::create_stream(&client, &stream, 2).await;
    let publisher = Publisher::new(Arc::new(AwsKinesis::new(client.clone())), stream.as_str())
        .collect(Collect::default().linger(Duration::from_millis(20)));
    proxy.clear_calls();
    const TASKS: usize = 32;
    const EACH: usize = 10;
    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let publisher = publisher.clone();
        tasks.push(tokio::spawn(async move {
            for n in 0..EACH {
                publisher
                    .publish(format!("task-{task}"), format!("{task}:{n}"))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let calls = proxy.count("PutRecords");
    assert!(
        calls * 4 <= TASKS * EACH,
        "{calls} PutRecords calls for {} single publishes",
        TASKS * EACH
    );
    let mut next: HashMap<String, usize> = HashMap::new();
    let mut total = 0;
    for (shard, records) in stored(&client, &stream).await {
        for (data, key, _) in records {
            let data = String::from_utf8(data).unwrap();
            let n: usize = data.split_once(':').unwrap().1.parse().unwrap();
            let expected = next.entry(key.clone()).or_default();
            assert_eq!(n, *expected, "{key} in order on {shard}");
            *expected += 1;
            total += 1;
        }
    }
    assert_eq!(total, TASKS * EACH);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregated_user_records_are_read_back_by_the_reference_library_where_answered() {
    let client = support::kinesis_client();
    let stream = support::unique_name("aggregated");
    support::create_stream(&client, &stream, 2).await;
    let publisher = Publisher::new(Arc::new(AwsKinesis::new(client.clone())), stream.as_str())
        .aggregate(Aggregate::default().max_bytes(8_192));
    let records: Vec<OutgoingRecord> = (0..600)
        .map(|i| {
            let record =
                OutgoingRecord::new(format!("customer-{}", i % 13), format!("payload {i:05}"));
            if i % 5 == 0 {
                record.with_explicit_hash_key(format!("{}", u128::from(i as u32) * 7_919))
            } else {
                record
            }
        })
        .collect();
    let places = publisher.publish_batch(records.clone()).await.unwrap();
    let stored = stored(&client, &stream).await;
    let kinesis_records: usize = stored.iter().map(|(_, r)| r.len()).sum();
    assert!(
        kinesis_records <= 10,
        "600 user records in {kinesis_records} Kinesis records"
    );
    let mut by_place: HashMap<(String, u64), ReferenceUserRecord> = HashMap::new();
    for (_, records) in &stored {
        for user in reference_deaggregate(records) {
            by_place.insert(
                (user.sequence_number.clone(), user.sub_sequence_number),
                user,
            );
        }
    }
    assert_eq!(by_place.len(), records.len(), "every user record, once");
    for (record, place) in records.iter().zip(&places) {
        let Published {
            sequence_number,
            sub_sequence_number,
            ..
        } = place;
        let sub = sub_sequence_number.expect("put inside an aggregate");
        let found = &by_place[&(sequence_number.clone(), sub)];
        assert_eq!(
            (found.partition_key.as_str(), &found.data[..]),
            (record.partition_key.as_str(), &record.data[..])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_split_misplaced_user_records_are_put_again_on_their_child() {
    let client = support::kinesis_client();
    let stream = support::unique_name("agg-split");
    support::create_stream(&client, &stream, 1).await;
    let publisher = Publisher::new(Arc::new(AwsKinesis::new(client.clone())), stream.as_str())
        .aggregate(Aggregate::default());
    // Lists the one shard.
    publisher.publish("warm-up", "x").await.unwrap();
    client
        .split_shard()
        .stream_name(&stream)
        .shard_to_split("shardId-000000000000")
        .new_starting_hash_key("170141183460469231731687303715884105728")
        .send()
        .await
        .unwrap();
    support::wait_active(&client, &stream).await;
    let records: Vec<OutgoingRecord> = (0..40)
        .map(|i| OutgoingRecord::new(format!("key-{i}"), format!("{i:04}")))
        .collect();
    let places = publisher.publish_batch(records.clone()).await.unwrap();
    let children = client
        .list_shards()
        .stream_name(&stream)
        .send()
        .await
        .unwrap()
        .shards
        .unwrap_or_default();
    for (record, place) in records.iter().zip(&places) {
        let hash = u128::from_be_bytes(md5_of(&record.partition_key));
        let shard = children
            .iter()
            .filter(|s| {
                s.sequence_number_range
                    .as_ref()
                    .unwrap()
                    .ending_sequence_number
                    .is_none()
            })
            .find(|s| {
                let range = s.hash_key_range.as_ref().unwrap();
                let (start, end): (u128, u128) = (
                    range.starting_hash_key.parse().unwrap(),
                    range.ending_hash_key.parse().unwrap(),
                );
                (start..=end).contains(&hash)
            })
            .unwrap();
        assert_eq!(
            place.shard_id, shard.shard_id,
            "{} where it belongs",
            record.partition_key
        );
    }
}

fn md5_of(key: &str) -> [u8; 16] {
    use md5::{Digest, Md5};
    Md5::digest(key.as_bytes()).into()
}
