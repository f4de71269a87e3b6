// The dataflow core without any framework: a subscription over every shard, composed with
// the crate's `DeliveryStreamExt` adaptors (errors aside, filters that skip, per-shard
// batches with a time limit), ending in the ack sink that checkpoints. Runs on the
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

use futures::StreamExt;
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{
    AckSink, DeliveryStreamExt, KinesisError, KinesisPosition, MemoryKinesis, MemoryLeaseStore,
    ReadSettings, Subscription,
};

/// Payments below this amount are filtered out (settled as skipped).
pub const LARGE: u32 = 20;

/// Parses `id:amount` payloads, keeps the large payments, hands them on in per-shard batches
/// of up to 8 (or what a shard gathered in 300 ms) to `on_batch`, and settles every delivery
/// through the ack sink. Ends when the subscription stops, once a written checkpoint covers
/// everything acked.
pub async fn pipeline(
    subscription: Subscription,
    mut on_batch: impl FnMut(Vec<(String, u32)>) + Send + 'static,
) -> Result<(), KinesisError> {
    subscription
        // Read failures are retried by the reader and logged with their shard; shown here too.
        .errors_to(|e| eprintln!("read error: {e}"))
        // Parse the payload; a malformed one is settled as skipped.
        .filter_map_or_skip(|record| {
            let text = std::str::from_utf8(record.data()).ok()?;
            let (id, amount) = text.split_once(':')?;
            Some((id.to_owned(), amount.parse::<u32>().ok()?))
        })
        // Small payments are not interesting: settled as skipped, so the checkpoint passes them.
        .filter_or_skip(|(_, amount)| *amount >= LARGE)
        .batches_by_shard(8, Duration::from_millis(300))
        .inspect(move |batch| on_batch(batch.iter().map(|d| (**d).clone()).collect()))
        .map(Ok)
        .forward(AckSink::new())
        .await
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
    if let Ok(Err(e)) = running.await {
        eprintln!("the pipeline's last checkpoints were not written: {e}");
    }

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
