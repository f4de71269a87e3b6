//! [`DeliveryStreamExt`]: adaptors for streams of deliveries that settle what they leave out,
//! batch per shard with a time limit, and take errors aside.
//!
//! `futures::StreamExt::filter` drops the deliveries it filters out, and a dropped delivery is
//! settled as *dropped* (or redelivered, with
//! [`redeliver_dropped`](crate::SubscriptionBuilder::redeliver_dropped)). These adaptors say
//! what they mean instead: [`filter_or_skip`](DeliveryStreamExt::filter_or_skip) settles the
//! deliveries it leaves out as *skipped*, which is what a pipeline that never skips by
//! accident wants.

mod batches;
mod errors_to;
mod skip_filter;

use std::time::Duration;

use futures::Stream;

pub use batches::BatchesByShard;
pub use errors_to::ErrorsTo;
pub use skip_filter::{FilterMapOrSkip, FilterOrSkip};

use super::Delivery;
use crate::error::KinesisError;

/// Adaptors for streams of [`Delivery`] values (and of `Result<Delivery<_>, KinesisError>`,
/// what a [`Subscription`](crate::Subscription) yields), in the style of `StreamExt`.
///
/// ```
/// # async fn demo() -> Result<(), kinesis_dataflow::KinesisError> {
/// use std::sync::Arc;
/// use std::time::Duration;
///
/// use futures::StreamExt;
/// use kinesis_dataflow::ack::DeliveryStreamExt;
/// use kinesis_dataflow::{
///     AckSink, KinesisPosition, MemoryKinesis, MemoryLeaseStore, Subscription,
/// };
///
/// let kinesis = MemoryKinesis::new();
/// kinesis.add_stream("orders", 2)?;
/// for i in 0..10 {
///     kinesis.put("orders", &format!("customer-{}", i % 3), format!("{i}"))?;
/// }
/// let orders = Subscription::builder(
///     Arc::new(kinesis),
///     Arc::new(MemoryLeaseStore::new()),
///     "orders",
/// )
/// .start_at(KinesisPosition::horizon())
/// .start()
/// .await?;
/// let stop = orders.shutdown_handle();
///
/// let pipeline = orders
///     // Errors go to the callback (the library has logged each with its stream and shard).
///     .errors_to(|error| eprintln!("read error: {error}"))
///     // Odd numbers are not ours: settled as skipped, never dropped by accident.
///     .filter_map_or_skip(|record| {
///         let n: u32 = std::str::from_utf8(record.data()).ok()?.parse().ok()?;
///         (n % 2 == 0).then_some(n)
///     })
///     // Up to 50 per shard, or whatever one shard gathered in 200 ms.
///     .batches_by_shard(50, Duration::from_millis(200))
///     .map(|batch| {
///         println!("{} even numbers", batch.len());
///         Ok(batch)
///     })
///     .forward(AckSink::new());
/// let running = tokio::spawn(pipeline);
/// tokio::time::sleep(Duration::from_millis(500)).await;
/// stop.shutdown().await;
/// running.await.expect("the pipeline ran")?;
/// # Ok(())
/// # }
/// # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
/// ```
pub trait DeliveryStreamExt: Stream + Sized {
    /// Keeps the deliveries for which `keep` returns true; settles the others as skipped (the
    /// checkpoint passes them, and they are counted as skipped, not dropped).
    fn filter_or_skip<T, F>(self, keep: F) -> FilterOrSkip<Self, F>
    where
        Self: Stream<Item = Delivery<T>>,
        F: FnMut(&T) -> bool,
    {
        FilterOrSkip::new(self, keep)
    }

    /// Transforms each delivery's value with `f`; a delivery for which `f` returns `None` is
    /// settled as skipped.
    fn filter_map_or_skip<T, U, F>(self, f: F) -> FilterMapOrSkip<Self, F>
    where
        Self: Stream<Item = Delivery<T>>,
        F: FnMut(T) -> Option<U>,
    {
        FilterMapOrSkip::new(self, f)
    }

    /// Gathers deliveries into batches per shard: a batch is handed on when it holds `max`
    /// deliveries, or when its first delivery has waited `linger`, so a quiet shard never
    /// holds a batch open. Deliveries keep their shard's order within and across batches.
    /// When the input ends, what is gathered is handed on.
    ///
    /// # Panics
    ///
    /// When `max` is 0.
    fn batches_by_shard<T>(self, max: usize, linger: Duration) -> BatchesByShard<Self, T>
    where
        Self: Stream<Item = Delivery<T>>,
    {
        BatchesByShard::new(self, max, linger)
    }

    /// Takes the deliveries of a stream of `Result`s and hands each error to `on_error`, so
    /// the rest of the pipeline deals with data only. The subscription's errors never end
    /// it (the reader retries, and a shard whose reader stops is taken again), so this keeps
    /// reading after each one.
    ///
    /// Every error a subscription yields is also logged once by the library, at `WARN`, with
    /// its stream and shard: `on_error` is the place to count or alert, not to log again.
    fn errors_to<D, F>(self, on_error: F) -> ErrorsTo<Self, F>
    where
        Self: Stream<Item = Result<D, KinesisError>>,
        F: FnMut(KinesisError),
    {
        ErrorsTo::new(self, on_error)
    }
}

impl<S: Stream> DeliveryStreamExt for S {}
