//! Names, streams and tables: unique names, stream creation, and the waits for `ACTIVE`.
//!
//! The functions without a `Result` are for tests: they panic with a message that names this
//! process's [`logs_dir`]. [`create_stream_shards`] and [`list_shards`] return errors instead,
//! for the benches.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::TableStatus;
use aws_sdk_kinesis::error::DisplayErrorContext;
use aws_sdk_kinesis::types::{Shard, StreamStatus};

use crate::paths::logs_dir;

/// How long a stream or a table may take to become `ACTIVE`.
const ACTIVE_TIMEOUT: Duration = Duration::from_secs(30);

/// A name unique within this process and across concurrent processes: `<prefix>-<pid>-<n>`.
/// Valid as a Kinesis stream, consumer or DynamoDB table name when `prefix` uses only
/// `[A-Za-z0-9_.-]`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// Panics with `what`, pointing at this process's emulator logs.
fn fail(what: &str) -> ! {
    panic!("test harness: {what} (logs: {})", logs_dir().display())
}

/// Creates stream `name` with `shards` shards and waits until `DescribeStreamSummary` reports
/// it `ACTIVE`. Returns the stream ARN.
pub async fn create_stream(client: &aws_sdk_kinesis::Client, name: &str, shards: i32) -> String {
    match try_create_stream(client, name, shards).await {
        Ok(arn) => arn,
        Err(what) => fail(&what),
    }
}

/// Waits (polling `DescribeStreamSummary` every 50 ms, up to 30 s) until stream `name` is
/// `ACTIVE`, e.g. after `CreateStream`, `SplitShard`, `MergeShards` or `UpdateShardCount`.
/// Returns the stream ARN.
pub async fn wait_active(client: &aws_sdk_kinesis::Client, name: &str) -> String {
    match try_wait_active(client, name).await {
        Ok(arn) => arn,
        Err(what) => fail(&what),
    }
}

/// Creates stream `name` with `shards` shards, waits until it is `ACTIVE`, and returns its
/// shards as `ListShards` lists them.
///
/// # Errors
///
/// A failed call, a stream not `ACTIVE` within 30 s, or a shard count other than asked.
pub async fn create_stream_shards(
    client: &aws_sdk_kinesis::Client,
    name: &str,
    shards: usize,
) -> Result<Vec<Shard>, String> {
    let count = i32::try_from(shards).map_err(|_| format!("{shards} shards: too many"))?;
    try_create_stream(client, name, count).await?;
    let listed = list_shards(client, name).await?;
    if listed.len() != shards {
        let ids: Vec<&str> = listed.iter().map(Shard::shard_id).collect();
        return Err(format!(
            "expected {shards} shards in {name}, the emulator lists {ids:?}"
        ));
    }
    Ok(listed)
}

/// Every shard of stream `name`, following `ListShards` pages.
///
/// # Errors
///
/// A failed `ListShards` call.
pub async fn list_shards(
    client: &aws_sdk_kinesis::Client,
    name: &str,
) -> Result<Vec<Shard>, String> {
    let mut shards = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let call = match token.take() {
            Some(token) => client.list_shards().next_token(token),
            None => client.list_shards().stream_name(name),
        };
        let page = call
            .send()
            .await
            .map_err(|e| format!("ListShards {name} failed: {}", DisplayErrorContext(e)))?;
        shards.extend(page.shards.unwrap_or_default());
        match page.next_token {
            Some(next) => token = Some(next),
            None => return Ok(shards),
        }
    }
}

async fn try_create_stream(
    client: &aws_sdk_kinesis::Client,
    name: &str,
    shards: i32,
) -> Result<String, String> {
    client
        .create_stream()
        .stream_name(name)
        .shard_count(shards)
        .send()
        .await
        .map_err(|err| {
            format!(
                "CreateStream {name} ({shards} shards) failed: {}",
                DisplayErrorContext(err)
            )
        })?;
    try_wait_active(client, name).await
}

async fn try_wait_active(client: &aws_sdk_kinesis::Client, name: &str) -> Result<String, String> {
    let started = Instant::now();
    loop {
        let summary = client
            .describe_stream_summary()
            .stream_name(name)
            .send()
            .await
            .map_err(|err| {
                format!(
                    "DescribeStreamSummary {name} failed: {}",
                    DisplayErrorContext(err)
                )
            })?;
        if let Some(description) = summary.stream_description_summary()
            && description.stream_status() == &StreamStatus::Active
        {
            return Ok(description.stream_arn().to_owned());
        }
        if started.elapsed() > ACTIVE_TIMEOUT {
            return Err(format!(
                "stream {name} not ACTIVE after {ACTIVE_TIMEOUT:?}: {summary:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (polling `DescribeTable` every 20 ms, up to 30 s) until DynamoDB table `table` is
/// `ACTIVE`. dynalite answers `CreateTable` while the table is still `CREATING` (even with
/// `--createTableMs 0`), and item operations on it fail with `ResourceNotFoundException` until
/// then.
pub async fn wait_table_active(client: &aws_sdk_dynamodb::Client, table: &str) {
    let started = Instant::now();
    loop {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .unwrap_or_else(|err| {
                fail(&format!(
                    "DescribeTable {table} failed: {}",
                    aws_sdk_dynamodb::error::DisplayErrorContext(err)
                ))
            });
        if described
            .table()
            .and_then(|t| t.table_status())
            .is_some_and(|status| status == &TableStatus::Active)
        {
            return;
        }
        if started.elapsed() > ACTIVE_TIMEOUT {
            fail(&format!(
                "table {table} not ACTIVE after {ACTIVE_TIMEOUT:?}: {described:?}"
            ));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Creates DynamoDB table `table` keyed by a single string attribute `key` (another schema
/// than a lease table's) and waits until it is `ACTIVE`: what a lease store must refuse.
pub async fn create_table_keyed_by(client: &aws_sdk_dynamodb::Client, table: &str, key: &str) {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let definition = AttributeDefinition::builder()
        .attribute_name(key)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .expect("an attribute definition with a name and a type");
    let schema = KeySchemaElement::builder()
        .attribute_name(key)
        .key_type(KeyType::Hash)
        .build()
        .expect("a key schema element with a name and a type");
    client
        .create_table()
        .table_name(table)
        .attribute_definitions(definition)
        .key_schema(schema)
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap_or_else(|err| {
            fail(&format!(
                "CreateTable {table} failed: {}",
                aws_sdk_dynamodb::error::DisplayErrorContext(err)
            ))
        });
    wait_table_active(client, table).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_names_differ_and_carry_the_pid() {
        let (a, b) = (unique_name("s"), unique_name("s"));
        assert_ne!(a, b);
        let pid = std::process::id().to_string();
        assert!(a.starts_with(&format!("s-{pid}-")), "{a}");
    }
}
