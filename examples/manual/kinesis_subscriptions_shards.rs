// The "Shards" page's example (manual form), as an app: shipments of a two-shard stream,
// each customer's shipments in order. Runs like the macro form
// (`cargo run --example manual_kinesis_subscriptions_shards`, same AWS environment).
use std::future::{Future, ready};

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
struct Ship;

impl Handle<Shipment> for Ship {
    fn handle(
        &self,
        shipment: &Shipment,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        tracing::info!(shipment.customer, shipment.seq, "shipped");
        ready(Ok(()))
    }
}

fn service(broker: KinesisBroker) -> RustStream {
    RustStream::new(AppInfo::new("shipping", "0.1.0")).with_broker(broker, |b| {
        let shipments = KinesisStream::new("shipments").create_if_missing(2);
        b.include(subscriber(shipments, Ship).build());
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
