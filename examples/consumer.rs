// A consumer as a service team writes one with the dataflow core: JSON orders decoded, the
// paid ones kept, handled in per-shard batches of up to 50 (or whatever a shard gathered in a
// second), acknowledged through the ack sink, stopped gracefully on SIGINT (Ctrl-C) or SIGTERM
// (what Kubernetes, ECS and systemd send). Errors are shown, never dropped.
//
// Configured by the standard AWS environment (region, credentials, endpoints), so it runs
// against AWS, LocalStack, or kinesis-local + dynalite:
//
// ```sh
// AWS_REGION=us-east-1 AWS_ENDPOINT_URL_KINESIS=http://localhost:4567 \
// AWS_ENDPOINT_URL_DYNAMODB=http://localhost:4568 AWS_ACCESS_KEY_ID=test \
// AWS_SECRET_ACCESS_KEY=test RUST_LOG=info cargo run --example consumer -- orders
// ```
//
// The first argument is the stream (default `orders`), the second the application name that
// names the lease table (default `order-consumer`).
//
// No `//!` docs here: `tests/example_consumer.rs` runs the built binary.

use std::process::ExitCode;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::{AckSink, DeliveryStreamExt, KinesisError, KinesisPosition, Subscription};
use serde::Deserialize;

/// An order as the producer writes it.
#[derive(Debug, Deserialize)]
struct Order {
    id: String,
    amount_cents: u64,
    status: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    // Errors as their messages, not as `Debug` dumps.
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<(), KinesisError> {
    let mut args = std::env::args().skip(1);
    let stream = args.next().unwrap_or_else(|| "orders".to_owned());
    let application = args.next().unwrap_or_else(|| "order-consumer".to_owned());

    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let subscription = Subscription::aws(&config, &application, stream.as_str())?
        .initial_position(KinesisPosition::horizon())
        .start()
        .await?;
    println!(
        "reading {stream} as {application}: shards {:?}",
        subscription.shards()
    );

    // SIGINT or SIGTERM: stop reading. The stream then ends once the stop is complete
    // (what the pipeline holds settled, final checkpoints written, leases released), so when
    // `forward` returns there is nothing left to do but exit.
    subscription.shutdown_handle().stop_on_signal();

    let mut errors = 0u64;
    let mut handled = 0u64;
    let result = subscription
        .errors_to(|error| {
            errors += 1;
            eprintln!("read error (retried): {}", error.report());
        })
        .filter_map_or_skip(
            |record| match serde_json::from_slice::<Order>(record.data()) {
                Ok(order) => Some(order),
                Err(e) => {
                    eprintln!(
                        "skipping record {} of {}: not an order: {e}",
                        record.sequence_number(),
                        record.shard_id()
                    );
                    None
                }
            },
        )
        .filter_or_skip(|order| order.status == "paid")
        .batches_by_shard(50, Duration::from_secs(1))
        .map(|batch| {
            let total: u64 = batch.iter().map(|order| order.amount_cents).sum();
            let last = batch.last().map_or("", |order| order.id.as_str());
            println!(
                "batch of {} paid orders from {}: {total} cents, up to {last}",
                batch.len(),
                batch[0].shard_id()
            );
            handled += batch.len() as u64;
            Ok(batch)
        })
        .forward(AckSink::new())
        .await;
    match result {
        Ok(()) => {
            println!(
                "stopped: {handled} paid orders handled, {errors} read errors; checkpoints written"
            );
            Ok(())
        }
        Err(e) => {
            eprintln!("stopped: {handled} paid orders handled, but: {e}");
            Err(e)
        }
    }
}
