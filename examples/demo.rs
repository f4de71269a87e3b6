//! The main job: a RustStream app on the Kinesis broker, run on the in-memory transport. It
//! publishes shipments to a four-shard stream with each customer as the partition key, and a
//! handler consumes them: the shards are read side by side, each customer's shipments in order.
//!
//! ```text
//! cargo run --example demo
//! ```
//!
//! The same app runs against AWS by building the broker with `KinesisBroker::new()` instead
//! (see `examples/kinesis_subscriptions_shards.rs`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use kinesis_dataflow::broker::prelude::*;
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher};
use serde::Deserialize;

const STREAM: &str = "shipments";
const CUSTOMERS: [&str; 6] = ["ada", "grace", "linus", "margaret", "dennis", "barbara"];
const PER_CUSTOMER: u64 = 5;

#[derive(Debug, Deserialize)]
struct Shipment {
    customer: String,
    seq: u64,
}

/// What the handler saw: (shard, customer, seq), in handling order.
static HANDLED: Mutex<Vec<(String, String, u64)>> = Mutex::new(Vec::new());

#[subscriber(
    KinesisStream::new(STREAM)
        .create_if_missing(4)
        .poll_interval(Duration::from_millis(100))
)]
async fn ship(shipment: &Shipment, Ctx(shard): Ctx<ShardId>) -> HandlerOutcome {
    println!(
        "  handled  {shard}  {:<9} #{}",
        shipment.customer, shipment.seq
    );
    HANDLED
        .lock()
        .unwrap()
        .push((shard.to_string(), shipment.customer.clone(), shipment.seq));
    HandlerOutcome::ack()
}

fn service(broker: KinesisBroker) -> RustStream {
    RustStream::new(AppInfo::new("demo", "0.1.0")).with_broker(broker, |b| {
        b.include(ship);
    })
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // One in-memory Kinesis (and lease store) shared by the app and the producer.
    let broker = KinesisBroker::in_memory(MemoryKinesis::new());
    let running = service(broker.clone()).start().await?;
    println!("app started: subscribed to `{STREAM}` (4 shards, in memory)\n");

    let producer = broker.connect().await?;
    let publisher = producer.publisher();
    println!(
        "publishing {} shipments, the customer as partition key:",
        CUSTOMERS.len() as u64 * PER_CUSTOMER
    );
    for seq in 1..=PER_CUSTOMER {
        for customer in CUSTOMERS {
            let body = format!(r#"{{"customer":"{customer}","seq":{seq}}}"#);
            publisher
                .publish(
                    OutgoingMessage::new(STREAM, body.as_bytes()),
                    Some(&KinesisOptions::partition_key(customer)),
                )
                .await?;
        }
    }
    println!("  done\n\nhandling:");

    let expected = CUSTOMERS.len() * PER_CUSTOMER as usize;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while HANDLED.lock().unwrap().len() < expected {
        if tokio::time::Instant::now() > deadline {
            return Err(format!(
                "only {} of {expected} shipments handled in 30 s",
                HANDLED.lock().unwrap().len()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let handled = HANDLED.lock().unwrap().clone();
    let mut by_customer: BTreeMap<&str, (String, Vec<u64>)> = BTreeMap::new();
    for (shard, customer, seq) in &handled {
        let entry = by_customer
            .entry(customer.as_str())
            .or_insert_with(|| (shard.clone(), Vec::new()));
        entry.1.push(*seq);
    }
    println!("\n{} shipments handled; per customer:", handled.len());
    for (customer, (shard, seqs)) in &by_customer {
        let in_order = seqs.windows(2).all(|w| w[0] < w[1]);
        println!(
            "  {customer:<9} on {shard}: {seqs:?} {}",
            if in_order { "in order" } else { "OUT OF ORDER" }
        );
        if !in_order {
            return Err(format!("{customer}'s shipments came out of order").into());
        }
    }

    producer.shutdown().await?;
    running.shutdown().await?;
    println!("\nshut down: checkpoints flushed, leases released");
    Ok(())
}
