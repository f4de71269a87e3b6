// Stream A to stream B: every record of A is transformed, re-keyed and published to B, and
// acknowledged on A only once B stored its copy; a graceful stop returns once A's checkpoints
// cover everything stored. Killed at any moment and started again, it loses nothing: every
// record of A is in B (those stored but not yet checkpointed when it died, twice), each key's
// records in A's order.
//
// Configured by the standard AWS environment:
//
// ```sh
// AWS_REGION=us-east-1 AWS_ENDPOINT_URL_KINESIS=http://localhost:4567 \
// AWS_ENDPOINT_URL_DYNAMODB=http://localhost:4568 AWS_ACCESS_KEY_ID=test \
// AWS_SECRET_ACCESS_KEY=test RUST_LOG=info cargo run --example relay -- orders orders-audit
// ```
//
// Arguments: the source stream, the destination stream, and the application name that names
// the lease table (default `relay`). SIGINT (Ctrl-C) or SIGTERM stops it gracefully.
//
// No `//!` docs here: `tests/example_relay.rs` runs the built binary.

use std::process::ExitCode;
use std::sync::Arc;

use futures::StreamExt;
use kinesis_dataflow::{
    AwsKinesis, DeliveryStreamExt, KinesisError, KinesisPosition, OutgoingRecord, Publisher,
    Subscription,
};

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
    let (Some(source), Some(destination)) = (args.next(), args.next()) else {
        eprintln!("usage: relay <source stream> <destination stream> [application]");
        std::process::exit(2);
    };
    let application = args.next().unwrap_or_else(|| "relay".to_owned());

    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    let subscription = Subscription::aws(&config, &application, source.as_str())?
        .initial_position(KinesisPosition::horizon())
        .start()
        .await?;
    let publisher = Publisher::new(
        Arc::new(AwsKinesis::from_conf(&config)),
        destination.as_str(),
    );
    println!("relaying {source} to {destination}");

    // SIGINT or SIGTERM: stop reading; the stream ends once the stop is complete.
    subscription.shutdown_handle().stop_on_signal();

    let result = subscription
        .errors_to(|error| eprintln!("read error (retried): {}", error.report()))
        // The transformation: B gets `relayed:<A's data>`, re-keyed by the data's first field
        // (say, a customer id: the text before the first `:`; A's key when there is none).
        // Each B key keeps A's order as long as its records come from one A key.
        .map(|delivery| {
            delivery.map(|record| {
                let key = match record.data().iter().position(|b| *b == b':') {
                    Some(end) => format!(
                        "customer-{}",
                        String::from_utf8_lossy(&record.data()[..end])
                    ),
                    None => record.partition_key().to_owned(),
                };
                let mut data = b"relayed:".to_vec();
                data.extend_from_slice(record.data());
                OutgoingRecord::new(key, data)
            })
        })
        .map(Ok)
        // Batches PutRecords across records and shards; acks each delivery on A once B
        // stored its copy; its close (the end of `forward`) waits for A's checkpoints.
        .forward(publisher.delivery_sink())
        .await;
    if result.is_ok() {
        println!("stopped");
    }
    result
}
