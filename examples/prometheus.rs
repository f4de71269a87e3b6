// A consumer whose metrics a Prometheus server scrapes: the `metrics-exporter-prometheus`
// recorder is installed first (every handle is registered when a shard opens), it serves
// `/metrics` over HTTP, and each handler's work runs inside its delivery's shard span, so its
// log lines name their stream and shard.
//
// Configured by the standard AWS environment (region, credentials, endpoints):
//
// ```sh
// AWS_REGION=us-east-1 AWS_ENDPOINT_URL_KINESIS=http://localhost:4567 \
// AWS_ENDPOINT_URL_DYNAMODB=http://localhost:4568 AWS_ACCESS_KEY_ID=test \
// AWS_SECRET_ACCESS_KEY=test RUST_LOG=info cargo run --example prometheus -- orders billing 9000
// curl -s localhost:9000/metrics | grep kinesis_dataflow_
// ```
//
// Arguments: the stream (default `orders`), the application (default `billing`: it names the
// lease table and the `application` label), the metrics port (default 9000). It publishes
// `PUBLISH` records (default 0) through the library's publisher first, then reads until
// Ctrl-C or SIGTERM.
//
// No `//!` docs here: `tests/metrics.rs` runs the built binary.

use std::net::SocketAddr;
use std::process::ExitCode;

use futures::StreamExt;
use kinesis_dataflow::{AwsKinesis, KinesisError, KinesisPosition, Publisher, Subscription};
use metrics_exporter_prometheus::PrometheusBuilder;
use tracing::Instrument;

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
    let application = args.next().unwrap_or_else(|| "billing".to_owned());
    let port: u16 = match args.next().map(|p| p.parse()) {
        None => 9000,
        Some(Ok(port)) => port,
        Some(Err(e)) => {
            eprintln!("error: the port must be a number from 0 to 65535: {e}");
            std::process::exit(2);
        }
    };
    let publish: usize = std::env::var("PUBLISH")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);

    // First the recorder: handles registered before it would count nowhere.
    let listen = SocketAddr::from(([127, 0, 0, 1], port));
    if let Err(e) = PrometheusBuilder::new()
        .with_http_listener(listen)
        .install()
    {
        eprintln!("error: cannot serve metrics on {listen}: {e}");
        std::process::exit(1);
    }
    println!("metrics on http://{listen}/metrics");

    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    if publish > 0 {
        let publisher = Publisher::new(
            std::sync::Arc::new(AwsKinesis::from_conf(&config)),
            stream.as_str(),
        );
        let records = (0..publish)
            .map(|i| {
                kinesis_dataflow::OutgoingRecord::new(
                    format!("customer-{}", i % 10),
                    format!("order {i}"),
                )
            })
            .collect();
        publisher.publish_batch(records).await?;
        println!("published {publish}");
    }

    let mut subscription = Subscription::aws(&config, &application, stream.as_str())?
        .initial_position(KinesisPosition::horizon())
        .start()
        .await?;
    println!(
        "reading {stream} as {application}: shards {:?}",
        subscription.shards()
    );

    // SIGINT or SIGTERM: stop; the stream ends once the stop is complete.
    subscription.shutdown_handle().stop_on_signal();
    let mut handled = 0u64;
    while let Some(item) = subscription.next().await {
        match item {
            Ok(delivery) => {
                let span = delivery.span();
                async {
                    tracing::debug!(bytes = delivery.data().len(), "handling a record");
                    delivery.ack();
                }
                .instrument(span)
                .await;
                handled += 1;
                if handled.is_multiple_of(100) {
                    println!("handled {handled}");
                }
            }
            Err(e) => eprintln!("read error: {e}"),
        }
    }
    println!("stopped after {handled} records");
    Ok(())
}
