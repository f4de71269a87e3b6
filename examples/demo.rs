//! The main job: publish records to a four-shard stream on the in-memory transport and read
//! them back, one shard stream per shard, merged.
//!
//! ```text
//! cargo run --example demo
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::select_all;
use kinesis_dataflow::api::{KinesisApi, list_all_shards};
use kinesis_dataflow::{
    KinesisError, MemoryKinesis, OutgoingRecord, Publisher, ReadSettings, ShardReader,
    StartingPoint,
};

const STREAM: &str = "shipments";
const SHARDS: u32 = 4;
const CUSTOMERS: [&str; 8] = [
    "ada", "grace", "linus", "margaret", "dennis", "barbara", "ken", "frances",
];

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), KinesisError> {
    let kinesis = MemoryKinesis::new();
    let api: Arc<dyn KinesisApi> = Arc::new(kinesis.clone());
    api.create_stream(STREAM, SHARDS).await?;
    println!("created stream `{STREAM}` with {SHARDS} shards (in memory)\n");

    // Publish: each customer's shipments carry the customer as partition key.
    let publisher = Publisher::new(api.clone(), STREAM);
    let records: Vec<OutgoingRecord> = (0..32)
        .map(|seq| {
            let customer = CUSTOMERS[seq % CUSTOMERS.len()];
            let json = format!("{{\"customer\":\"{customer}\",\"seq\":{seq}}}");
            OutgoingRecord::new(customer, json)
        })
        .collect();
    let published = records.len();
    let mut per_shard: BTreeMap<String, usize> = BTreeMap::new();
    for stored in publisher.publish_batch(records).await? {
        *per_shard.entry(stored.shard_id).or_default() += 1;
    }
    println!("published {published} records:");
    for (shard, n) in &per_shard {
        println!("  {shard}: {n} records");
    }

    // Consume: one shard stream per shard, read side by side.
    let shards = list_all_shards(api.as_ref(), STREAM).await?;
    let settings = ReadSettings::default().poll_interval(std::time::Duration::from_millis(100));
    let readers = shards
        .iter()
        .map(|s| {
            ShardReader::new(api.clone(), STREAM, s.shard_id.as_str())
                .settings(settings.clone())
                .open(StartingPoint::TrimHorizon)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut merged = select_all(readers);
    println!("\nreading every shard from TRIM_HORIZON:");
    let mut received = 0;
    while received < published {
        let record = merged
            .next()
            .await
            .expect("shard streams never end on open shards")?;
        received += 1;
        println!(
            "  {} #{}  key={:<9} {}",
            record.shard_id(),
            &record.sequence_number()[record.sequence_number().len() - 6..],
            record.partition_key(),
            String::from_utf8_lossy(record.data())
        );
    }
    println!("\nread back {received} of {published} records; each customer's shipments in order");
    Ok(())
}
