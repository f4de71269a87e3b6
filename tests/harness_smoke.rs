//! Smoke tests of the emulator harness (the `kinesis-dataflow-test-support` crate, through
//! `tests/support`): if these fail, every
//! integration test that talks to Kinesis or DynamoDB will too.

mod support;

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::ShardIteratorType;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_emulator_round_trips_a_record() {
    let client = support::kinesis_client();
    let name = support::unique_name("smoke");
    let arn = support::create_stream(&client, &name, 2).await;
    assert!(arn.contains(&name), "unexpected stream ARN {arn}");

    let shards = client
        .list_shards()
        .stream_name(&name)
        .send()
        .await
        .expect("ListShards")
        .shards
        .unwrap_or_default();
    assert_eq!(shards.len(), 2, "logs: {}", support::logs_dir().display());

    let put = client
        .put_record()
        .stream_name(&name)
        .partition_key("pk-1")
        .data(Blob::new(b"hello kinesis".to_vec()))
        .send()
        .await
        .expect("PutRecord");

    let iterator = client
        .get_shard_iterator()
        .stream_name(&name)
        .shard_id(put.shard_id())
        .shard_iterator_type(ShardIteratorType::TrimHorizon)
        .send()
        .await
        .expect("GetShardIterator")
        .shard_iterator
        .expect("a shard iterator");

    let records = client
        .get_records()
        .shard_iterator(iterator)
        .send()
        .await
        .expect("GetRecords")
        .records;
    assert_eq!(
        records.len(),
        1,
        "records: {records:?}; logs: {}",
        support::logs_dir().display()
    );
    let record = &records[0];
    assert_eq!(record.data().as_ref(), b"hello kinesis");
    assert_eq!(record.partition_key(), Some("pk-1"));
    assert_eq!(record.sequence_number(), put.sequence_number());
}

#[tokio::test]
async fn kinesis_stream_names_are_unique_and_streams_listed() {
    let client = support::kinesis_client();
    let a = support::unique_name("smoke-list");
    let b = support::unique_name("smoke-list");
    assert_ne!(a, b);
    support::create_stream(&client, &a, 1).await;
    support::create_stream(&client, &b, 1).await;
    let names = client
        .list_streams()
        .send()
        .await
        .expect("ListStreams")
        .stream_names;
    assert!(names.contains(&a) && names.contains(&b), "{names:?}");
}

#[tokio::test(flavor = "current_thread")]
async fn dynamodb_emulator_round_trips_an_item() {
    let client = support::dynamodb_client();
    let table = support::unique_name("smoke_table");
    client
        .create_table()
        .table_name(&table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("leaseKey")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .expect("attribute definition"),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("leaseKey")
                .key_type(KeyType::Hash)
                .build()
                .expect("key schema"),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .expect("CreateTable");
    support::wait_table_active(&client, &table).await;

    client
        .put_item()
        .table_name(&table)
        .item("leaseKey", AttributeValue::S("shardId-000000000000".into()))
        .item("checkpoint", AttributeValue::S("TRIM_HORIZON".into()))
        .item("leaseCounter", AttributeValue::N("1".into()))
        .send()
        .await
        .expect("PutItem");

    let item: HashMap<String, AttributeValue> = client
        .get_item()
        .table_name(&table)
        .key("leaseKey", AttributeValue::S("shardId-000000000000".into()))
        .consistent_read(true)
        .send()
        .await
        .expect("GetItem")
        .item
        .expect("the item we put");
    assert_eq!(
        item.get("checkpoint"),
        Some(&AttributeValue::S("TRIM_HORIZON".into()))
    );
    assert_eq!(
        item.get("leaseCounter"),
        Some(&AttributeValue::N("1".into()))
    );
}

#[test]
fn endpoints_and_logs_are_in_place() {
    // Plain #[test]: the harness must not need a runtime of its own.
    let kinesis = support::kinesis_endpoint();
    let dynamodb = support::dynamodb_endpoint();
    assert!(kinesis.starts_with("http://127.0.0.1:"), "{kinesis}");
    assert!(dynamodb.starts_with("http://127.0.0.1:"), "{dynamodb}");
    assert_ne!(kinesis, dynamodb);
    assert_ne!(
        support::kinesis_tls_port().to_string(),
        kinesis.rsplit(':').next().unwrap()
    );

    let dir = support::logs_dir();
    assert!(dir.is_dir(), "log dir {} missing", dir.display());
    assert!(dir.starts_with(support::target_dir().join("emulator-logs")));
    let dir_name = dir.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(
        dir_name,
        format!("harness_smoke-{}", std::process::id()),
        "log dir {}",
        dir.display()
    );
    assert!(support::kinesis_log().is_file());
    assert!(support::dynamodb_log().is_file());
    assert_eq!(support::kinesis_log().parent(), Some(dir.as_path()));
    support::assert_emulators_alive();
}
