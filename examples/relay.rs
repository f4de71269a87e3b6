// Stream A to stream B: every record of A is transformed and published to B, and acknowledged
// on A only once B stored its copy. Killed at any moment and started again, it loses nothing:
// every record of A is in B (some perhaps twice), each key's records in A's order.
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
// the lease table (default `relay`). Ctrl-C stops it gracefully.
//
// No `//!` docs here: `tests/example_relay.rs` runs the built binary.

use std::sync::Arc;

use futures::StreamExt;
use kinesis_dataflow::{
    AwsKinesis, DeliveryStreamExt, KinesisError, KinesisPosition, OutgoingRecord, Publisher,
    Subscription,
};

#[tokio::main]
async fn main() -> Result<(), KinesisError> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
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

    let stop = subscription.shutdown_handle();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            stop.shutdown().await;
        }
    });

    let result = subscription
        .errors_to(|error| eprintln!("read error (retried): {error}"))
        // The transformation: B gets `relayed:<A's data>` under A's partition key, so each
        // key keeps its order.
        .map(|delivery| {
            delivery.map(|record| {
                let mut data = b"relayed:".to_vec();
                data.extend_from_slice(record.data());
                OutgoingRecord::new(record.partition_key(), data)
            })
        })
        .map(Ok)
        // Batches into PutRecords; acks each delivery on A once B stored its copy.
        .forward(publisher.delivery_sink())
        .await;
    match &result {
        Ok(()) => println!("stopped"),
        Err(e) => eprintln!("stopped: {e}"),
    }
    result
}
