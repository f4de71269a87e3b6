//! The calls that manage streams rather than read or write them: CreateStream, SplitShard and
//! MergeShards, as a trait of their own ([`KinesisAdmin`]).

use std::sync::Arc;

use super::{ApiFuture, KinesisApi};

/// The Kinesis calls that create and reshard streams.
///
/// For tests, demos and tooling that manage streams: the library's reading (shard readers,
/// subscriptions) and publishing never call it, so a transport for those needs only
/// [`KinesisApi`]. The one caller inside the library is the broker face, which creates a
/// missing stream when the application asks it to (`create_if_missing`,
/// `create_missing_streams`).
///
/// It extends [`KinesisApi`]: a handle that changes a stream can also watch the change
/// (DescribeStreamSummary, ListShards), and an `Arc<dyn KinesisAdmin>` converts into a
/// [`SharedKinesis`](super::SharedKinesis) for the code that reads.
///
/// [`AwsKinesis`](super::AwsKinesis), [`MemoryKinesis`](super::MemoryKinesis), a
/// [`Layered`](super::layer::Layered) API over either, and an `Arc` of any of them implement
/// it. Failures map onto [`KinesisError`](crate::KinesisError) as described on
/// [`KinesisApi`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
/// use std::sync::Arc;
/// use kinesis_dataflow::MemoryKinesis;
/// use kinesis_dataflow::api::{KinesisAdmin, KinesisApi, SharedKinesis};
///
/// let admin: Arc<dyn KinesisAdmin> = Arc::new(MemoryKinesis::new());
/// admin.create_stream("orders", 1).await?;
/// admin
///     .split_shard("orders", "shardId-000000000000", &(u128::MAX / 2).to_string())
///     .await?;
/// assert_eq!(admin.describe_stream_summary("orders").await?.open_shard_count, 2);
///
/// // The same handle, for the code that only reads and publishes.
/// let api: SharedKinesis = admin;
/// # let _ = api;
/// # Ok(()) }
/// ```
pub trait KinesisAdmin: KinesisApi {
    /// CreateStream with `shard_count` shards (provisioned mode).
    fn create_stream<'a>(&'a self, stream: &'a str, shard_count: u32) -> ApiFuture<'a, ()>;

    /// SplitShard: closes `shard` and opens two children split at `new_starting_hash_key`
    /// (a decimal 128-bit hash key).
    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        new_starting_hash_key: &'a str,
    ) -> ApiFuture<'a, ()>;

    /// MergeShards: closes `shard` and its hash-adjacent `adjacent` and opens one child.
    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        adjacent: &'a str,
    ) -> ApiFuture<'a, ()>;
}

/// A shared admin is an admin: `Arc<MemoryKinesis>`, `Arc<dyn KinesisAdmin>`.
impl<T: KinesisAdmin + ?Sized> KinesisAdmin for Arc<T> {
    fn create_stream<'a>(&'a self, stream: &'a str, shard_count: u32) -> ApiFuture<'a, ()> {
        T::create_stream(self, stream, shard_count)
    }

    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        new_starting_hash_key: &'a str,
    ) -> ApiFuture<'a, ()> {
        T::split_shard(self, stream, shard, new_starting_hash_key)
    }

    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        adjacent: &'a str,
    ) -> ApiFuture<'a, ()> {
        T::merge_shards(self, stream, shard, adjacent)
    }
}
