// A batch subscription: the handler takes a slice of shipments (`&[Shipment]`) and packs them
// in one call, settled together.
//
// The batch size is the mount site's `.batch(n)`: a call gets at most `n` records. A batch
// closes when it is full, when the next record comes from another shard, or the descriptor's
// `max_wait` after its first record (one GetRecords answer usually fills it at once). A batch
// holds the records of one shard, in order, and a shard's batches come in order; the stream's
// two shards are read side by side. A customer's shipments carry the customer as their
// partition key, so they share a shard and reach the handler in order.
//
// The handler's one outcome settles every record of its batch: `ack()` lets each shard's
// checkpoint pass them, `retry()` sends all of them back (each is delivered again before the
// later records of its shard). A handler returning `Vec<HandlerOutcome>` settles them one by
// one instead.
//
// The broker comes from the standard AWS environment, so this runs against AWS, LocalStack,
// or kinesis-local + dynalite:
//
// ```sh
// AWS_REGION=us-east-1 AWS_ENDPOINT_URL_KINESIS=http://localhost:4567 \
// AWS_ENDPOINT_URL_DYNAMODB=http://localhost:4568 AWS_ACCESS_KEY_ID=test \
// AWS_SECRET_ACCESS_KEY=test cargo run --example batch
// ```
//
// or on the in-memory transport, with no service at all:
//
// ```sh
// cargo run --example batch -- --in-memory
// ```
//
// It starts the app, publishes a few shipments per customer, prints the batches the handler
// was called with, and stops.

use std::num::NonZeroUsize;
use std::sync::Mutex;
use std::time::Duration;

use kinesis_dataflow::broker::prelude::*;
use ruststream::{Broker, ConnectedBroker, OutgoingMessage, Publisher};
use serde::Deserialize;

/// The stream the shipments arrive on (two shards, created when missing).
pub const STREAM: &str = "shipments";

/// The most shipments one handler call gets: the mount site's `.batch(..)`.
///
/// This is the handler's batch, not the descriptor's
/// [`batch_size`](KinesisStream::batch_size), which is how many records one GetRecords call asks
/// for (1,000 by default): one read may fill several handler batches.
pub const BATCH_SIZE: NonZeroUsize = nonzero!(10);

/// A shipment to pack: the customer is the partition key.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Shipment {
    /// Who it goes to.
    pub customer: String,
    /// The customer's running number.
    pub seq: u64,
}

/// Every batch the handler packed, in call order: what `main` prints (and what the live test
/// reads back).
pub static PACKED: Mutex<Vec<Vec<Shipment>>> = Mutex::new(Vec::new());

/// Packs a batch of shipments in one call. The one outcome settles the whole batch.
#[subscriber(
    KinesisStream::new(STREAM)
        .create_if_missing(2)
        .poll_interval(Duration::from_millis(200))
        .max_wait(Duration::from_millis(50))
)]
async fn pack(shipments: &[Shipment]) -> HandlerOutcome {
    tracing::info!(count = shipments.len(), "packed a batch");
    PACKED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(shipments.to_vec());
    HandlerOutcome::ack()
}

/// The packing service on `broker`: `pack`, mounted with batches of at most [`BATCH_SIZE`].
pub fn service(broker: KinesisBroker) -> RustStream {
    RustStream::new(AppInfo::new("packing", "0.1.0")).with_broker(broker, |b| {
        b.include(pack.batch(BATCH_SIZE));
    })
}

/// The customers `main` publishes for.
const CUSTOMERS: [&str; 3] = ["ada", "grace", "linus"];
/// How many shipments `main` publishes per customer.
const PER_CUSTOMER: u64 = 8;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let broker = if std::env::args().any(|arg| arg == "--in-memory") {
        KinesisBroker::in_memory(MemoryKinesis::new())
    } else {
        KinesisBroker::new().application("packing")
    };
    let running = service(broker.clone()).start().await?;
    println!("subscribed to `{STREAM}`, batches of at most {BATCH_SIZE}");

    // A producer: its own connection to the same streams.
    let producer = broker.connect().await?;
    let publisher = producer.publisher();
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
    let expected = CUSTOMERS.len() * PER_CUSTOMER as usize;
    println!("published {expected} shipments, the customer as partition key");

    let packed = || -> usize {
        PACKED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .map(Vec::len)
            .sum()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while packed() < expected {
        if tokio::time::Instant::now() > deadline {
            return Err(format!("only {} of {expected} shipments packed in 60 s", packed()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    println!("\nbatches in call order, [size] shipments:");
    let batches = PACKED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    for (n, batch) in batches.iter().enumerate() {
        let items: Vec<String> = batch
            .iter()
            .map(|s| format!("{}#{}", s.customer, s.seq))
            .collect();
        println!("  {:>2}. [{:>2}] {}", n + 1, batch.len(), items.join(" "));
    }

    producer.shutdown().await?;
    running.shutdown().await?;
    println!("\nshut down: checkpoints flushed, leases released");
    Ok(())
}
