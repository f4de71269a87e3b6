// The dataflow core without any framework: a subscription over every shard, composed with
// `map`, `filter` and `.chunks()`, ending in the ack sink that checkpoints. Runs on the
// in-memory transport and lease store:
//
// ```text
// cargo run --example core_pipeline
// ```
//
// `pipeline` takes any subscription, so the same code runs on AWS with
// `Subscription::aws(&config, "payments-app", "payments")`.
//
// No `//!` docs here: `tests/example_core_pipeline.rs` includes this file with `include!`.

use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, future};
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    AckSink, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore, ReadSettings,
    Subscription,
};

/// Payments below this amount are filtered out (settled as dropped).
pub const LARGE: u32 = 20;

/// Parses `id:amount` payloads, keeps the large payments, hands them on in chunks of 8 to
/// `on_batch`, and settles every delivery through the ack sink, which checkpoints. Ends when
/// the subscription stops.
pub async fn pipeline(
    subscription: Subscription,
    mut on_batch: impl FnMut(Vec<(String, u32)>) + Send + 'static,
) {
    // The ack sink cannot fail (its error type is `Infallible`).
    let Ok(()) = subscription
        // Read failures are retried by the reader; here they are only logged.
        .filter_map(|item| future::ready(item.map_err(|e| eprintln!("read error: {e}")).ok()))
        // Parse the payload, keeping the delivery's ack token.
        .map(|delivery| {
            delivery.map(|record| {
                let text = String::from_utf8_lossy(record.data()).into_owned();
                let (id, amount) = text.split_once(':').unwrap_or(("?", "0"));
                (id.to_owned(), amount.parse::<u32>().unwrap_or(0))
            })
        })
        // Small payments are not interesting: a filtered-out delivery is settled as dropped.
        .filter(|delivery| future::ready(delivery.1 >= LARGE))
        .chunks(8)
        .inspect(move |batch| on_batch(batch.iter().map(|d| (**d).clone()).collect()))
        .map(Ok)
        .forward(AckSink::new())
        .await;
}

#[tokio::main]
async fn main() -> Result<(), KinesisError> {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream("payments", 2)?;
    for i in 0..40u32 {
        let amount = (i * 37) % 100;
        kinesis.put(
            "payments",
            &format!("account-{}", i % 5),
            format!("{i}:{amount}"),
        )?;
    }
    let leases = MemoryLeaseStore::new();

    let subscription =
        Subscription::builder(Arc::new(kinesis), Arc::new(leases.clone()), "payments")
            .start_at(KinesisPosition::horizon())
            .read_settings(ReadSettings::default().poll_interval(Duration::from_millis(100)))
            .checkpoint_interval(Duration::from_millis(200))
            .start()
            .await?;
    let stop = subscription.shutdown_handle();
    let running = tokio::spawn(pipeline(subscription, |batch| {
        let ids: Vec<&str> = batch.iter().map(|(id, _)| id.as_str()).collect();
        println!("batch of {} large payments: {ids:?}", batch.len());
    }));

    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.shutdown().await;
    let _ = running.await;

    for lease in leases.list("payments").await? {
        if let Some(Checkpoint::Sequence(seq)) = lease.checkpoint {
            println!(
                "{} checkpointed at …{}",
                lease.shard_id,
                &seq[seq.len() - 6..]
            );
        }
    }
    Ok(())
}
