//! The KPL aggregation format against an independent implementation, AWS's `aws-kinesis-agg`
//! (npm, pinned in `harness/package.json`), on kinesis-local: aggregates it produces are read
//! by this crate with every key and payload intact and in order; aggregates this crate
//! produces are de-aggregated by it identically.

mod support;

use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::primitives::Blob;
use futures::StreamExt;
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::kpl::aggregate;
use kinesis_dataflow::{AwsKinesis, ReadSettings, Record, ShardStream, StartingPoint};
use kinesis_dataflow_test_support::kpl::{
    ReferenceUserRecord, UserRecord, reference_aggregate, reference_deaggregate,
};

/// 240 user records over 12 keys, a third with an explicit hash key, sizes from 0 to 2 KiB.
fn workload() -> Vec<UserRecord> {
    (0..240u32)
        .map(|i| {
            let key = format!("customer-{}", i % 12);
            let hash_key = (i % 3 == 0).then(|| format!("{}", u128::from(i) * 1_000_003));
            let size = (i as usize * 37) % 2048;
            let data: Vec<u8> = (0..size).map(|b| (b as u32 ^ i) as u8).collect();
            (key, hash_key, data)
        })
        .collect()
}

/// Reads every record of the stream's one shard from the horizon, de-aggregating.
async fn read_all(api: &SharedKinesis, stream: &str, expected: usize) -> Vec<Record> {
    let mut reader = ShardStream::builder(api.clone(), stream, "shardId-000000000000")
        .settings(
            ReadSettings::default()
                .poll_interval(Duration::from_millis(50))
                .unlimited_reads()
                .deaggregate(true),
        )
        .open(StartingPoint::TrimHorizon)
        .unwrap();
    let mut out = Vec::new();
    while out.len() < expected {
        let record = tokio::time::timeout(Duration::from_secs(30), reader.next())
            .await
            .expect("records in time")
            .expect("the shard is open")
            .expect("no error");
        out.push(record);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_of_the_reference_library_are_read_intact_and_in_order() {
    let client = support::kinesis_client();
    let stream = support::unique_name("kpl-in");
    support::create_stream(&client, &stream, 1).await;
    let users = workload();
    // Five aggregates of 48 user records, then a plain record.
    let mut puts = Vec::new();
    for chunk in users.chunks(48) {
        puts.extend(reference_aggregate(chunk));
    }
    puts.push(("plain-key".to_owned(), b"not aggregated".to_vec()));
    let mut stored = Vec::new();
    for (key, data) in &puts {
        let out = client
            .put_record()
            .stream_name(&stream)
            .partition_key(key)
            .data(Blob::new(data.clone()))
            .send()
            .await
            .unwrap();
        stored.push((data.clone(), key.clone(), out.sequence_number));
    }
    let api: SharedKinesis = Arc::new(AwsKinesis::new(client.clone()));
    let read = read_all(&api, &stream, users.len() + 1).await;

    let got: Vec<UserRecord> = read[..users.len()]
        .iter()
        .map(|r| {
            (
                r.partition_key().to_owned(),
                r.explicit_hash_key().map(str::to_owned),
                r.data().to_vec(),
            )
        })
        .collect();
    assert_eq!(got, users, "every key, hash key and payload, in order");
    let plain = &read[users.len()];
    assert_eq!(
        (
            plain.partition_key(),
            &plain.data()[..],
            plain.sub_sequence_number()
        ),
        ("plain-key", &b"not aggregated"[..], None)
    );

    // The same Kinesis records through the reference reader: the same user records, with the
    // same sequence and sub-sequence numbers.
    let reference = reference_deaggregate(&stored[..stored.len() - 1]);
    let ours: Vec<ReferenceUserRecord> = read[..users.len()]
        .iter()
        .map(|r| ReferenceUserRecord {
            partition_key: r.partition_key().to_owned(),
            sequence_number: r.sequence_number().to_owned(),
            sub_sequence_number: r.sub_sequence_number().expect("a user record"),
            data: r.data().to_vec(),
        })
        .collect();
    assert_eq!(ours, reference);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aggregates_of_this_crate_are_read_by_the_reference_library() {
    let users = workload();
    let mut records = Vec::new();
    for (n, chunk) in users.chunks(48).enumerate() {
        let data = aggregate(
            chunk
                .iter()
                .map(|(key, hash_key, data)| (key.as_str(), hash_key.as_deref(), data.as_slice())),
        );
        records.push((
            data.to_vec(),
            format!("aggregate-{n}"),
            format!("{}", 1000 + n),
        ));
    }
    let reference = reference_deaggregate(&records);
    let expected: Vec<ReferenceUserRecord> = users
        .chunks(48)
        .enumerate()
        .flat_map(|(n, chunk)| {
            chunk
                .iter()
                .enumerate()
                .map(move |(sub, (key, _, data))| ReferenceUserRecord {
                    partition_key: key.clone(),
                    sequence_number: format!("{}", 1000 + n),
                    sub_sequence_number: sub as u64,
                    data: data.clone(),
                })
        })
        .collect();
    assert_eq!(reference, expected);
}
