// The "Shards" page's example (macro form) reading with enhanced fan-out: the same stream,
// handler and log line, one line changed. Each shard's records are pushed to the consumer
// "shipping" through SubscribeToShard, with a read budget of its own (2 MB/s per shard);
// the consumer is registered at the first start and stays registered.
//
// The broker comes from the standard AWS environment, so this runs against AWS, LocalStack,
// or kinesis-local + dynalite:
//
// ```sh
// AWS_REGION=us-east-1 AWS_ENDPOINT_URL_KINESIS=http://localhost:4567 \
// AWS_ENDPOINT_URL_DYNAMODB=http://localhost:4568 AWS_ACCESS_KEY_ID=test \
// AWS_SECRET_ACCESS_KEY=test RUST_LOG=info cargo run --example kinesis_subscriptions_shards_fan_out
// ```
//
// Several copies share the stream's shards through the lease table (named after the
// executable). Stop with Ctrl-C.
use kinesis_dataflow::broker::prelude::*;
use serde::Deserialize;

/// A shipment to send: the customer is the partition key.
#[derive(Debug, Deserialize)]
pub struct Shipment {
    /// Who it goes to.
    pub customer: String,
    /// The customer's running number.
    pub seq: u64,
}

/// Ships each shipment. The stream has two shards, read side by side; a customer's shipments
/// carry the customer as their partition key, so they share a shard and arrive in order.
#[subscriber(KinesisStream::new("shipments").create_if_missing(2).fan_out("shipping"))]
async fn ship(shipment: &Shipment) -> HandlerOutcome {
    tracing::info!(shipment.customer, shipment.seq, "shipped");
    HandlerOutcome::ack()
}

fn service(broker: KinesisBroker) -> RustStream {
    RustStream::new(AppInfo::new("shipping", "0.1.0")).with_broker(broker, |b| {
        b.include(ship);
    })
}

#[tokio::main]
async fn main() -> Result<(), ruststream::runtime::RustStreamError> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    service(KinesisBroker::new()).run().await
}
