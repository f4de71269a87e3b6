//! Layers: one way to wrap every call of the seam, in tower's spirit. A [`KinesisLayer`] sees
//! each call ([`ApiCall`]) and the wrapped API's answer before anyone awaits it, so it can
//! count, time, delay, refuse or record calls; [`Layered`] puts one in front of any
//! [`KinesisApi`], and of the [`KinesisAdmin`] calls too when the wrapped API has them. The
//! same shape wraps the lease store ([`crate::lease::layer`]).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use kinesis_dataflow::MemoryKinesis;
//! use kinesis_dataflow::api::layer::{ApiCall, KinesisLayer, Layered};
//! use kinesis_dataflow::api::{ApiFuture, KinesisApi};
//!
//! /// Counts the calls that name a stream.
//! #[derive(Default)]
//! struct Count(AtomicU64);
//!
//! impl KinesisLayer for Count {
//!     fn around<'a, T: Send + 'a>(&'a self, _call: ApiCall<'a>, next: ApiFuture<'a, T>) -> ApiFuture<'a, T> {
//!         self.0.fetch_add(1, Ordering::Relaxed);
//!         next
//!     }
//! }
//!
//! let memory = MemoryKinesis::new();
//! memory.add_stream("orders", 1)?;
//! let counted = Layered::new(Arc::new(memory), Count::default());
//! counted.list_shards("orders", None).await?;
//! assert_eq!(counted.layer().0.load(Ordering::Relaxed), 1);
//! # Ok(()) }
//! ```

use std::fmt;
use std::sync::Arc;

use super::{
    ApiFuture, GetRecordsOutput, KinesisAdmin, KinesisApi, ListShardsPage, PutRecordsEntry,
    PutRecordsOutput, ShardEvents, SharedKinesis, StreamConsumer, StreamSummary,
};
use crate::error::Operation;
use crate::position::StartingPoint;

/// One call of the seam, with what names it, as a layer sees it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub enum ApiCall<'a> {
    /// `ListShards` (one page).
    ListShards {
        /// The stream.
        stream: &'a str,
    },
    /// `GetShardIterator`.
    GetShardIterator {
        /// The stream.
        stream: &'a str,
        /// The shard.
        shard: &'a str,
        /// Where the iterator opens.
        start: &'a StartingPoint,
    },
    /// `GetRecords`.
    GetRecords {
        /// The stream.
        stream: &'a str,
        /// The shard.
        shard: &'a str,
        /// The most records asked for.
        limit: u32,
    },
    /// `PutRecords` (see [`KinesisLayer::put_records`] for the entries themselves).
    PutRecords {
        /// The stream.
        stream: &'a str,
        /// How many entries the call carries.
        records: usize,
    },
    /// `CreateStream` (a [`KinesisAdmin`] call).
    CreateStream {
        /// The stream.
        stream: &'a str,
        /// Its shard count.
        shard_count: u32,
    },
    /// `DescribeStreamSummary`.
    DescribeStreamSummary {
        /// The stream.
        stream: &'a str,
    },
    /// `SplitShard` (a [`KinesisAdmin`] call).
    SplitShard {
        /// The stream.
        stream: &'a str,
        /// The shard split.
        shard: &'a str,
    },
    /// `MergeShards` (a [`KinesisAdmin`] call).
    MergeShards {
        /// The stream.
        stream: &'a str,
        /// The first shard.
        shard: &'a str,
        /// The shard merged into it.
        adjacent: &'a str,
    },
    /// `RegisterStreamConsumer`, `DescribeStreamConsumer` or `DeregisterStreamConsumer`.
    Consumer {
        /// Which of the three.
        operation: Operation,
        /// The stream.
        stream: &'a str,
        /// The consumer's name.
        consumer: &'a str,
    },
    /// `SubscribeToShard` (the layer sees the call that opens the subscription, not its
    /// events).
    SubscribeToShard {
        /// The stream.
        stream: &'a str,
        /// The shard.
        shard: &'a str,
        /// Where the subscription starts.
        start: &'a StartingPoint,
    },
}

impl ApiCall<'_> {
    /// The operation.
    #[must_use]
    pub fn operation(&self) -> Operation {
        match self {
            Self::ListShards { .. } => Operation::ListShards,
            Self::GetShardIterator { .. } => Operation::GetShardIterator,
            Self::GetRecords { .. } => Operation::GetRecords,
            Self::PutRecords { .. } => Operation::PutRecords,
            Self::CreateStream { .. } => Operation::CreateStream,
            Self::DescribeStreamSummary { .. } => Operation::DescribeStreamSummary,
            Self::SplitShard { .. } => Operation::SplitShard,
            Self::MergeShards { .. } => Operation::MergeShards,
            Self::Consumer { operation, .. } => *operation,
            Self::SubscribeToShard { .. } => Operation::SubscribeToShard,
        }
    }

    /// The stream the call names.
    #[must_use]
    pub fn stream(&self) -> &str {
        match self {
            Self::ListShards { stream }
            | Self::GetShardIterator { stream, .. }
            | Self::GetRecords { stream, .. }
            | Self::PutRecords { stream, .. }
            | Self::CreateStream { stream, .. }
            | Self::DescribeStreamSummary { stream }
            | Self::SplitShard { stream, .. }
            | Self::MergeShards { stream, .. }
            | Self::Consumer { stream, .. }
            | Self::SubscribeToShard { stream, .. } => stream,
        }
    }
}

/// Wraps every call of a [`KinesisApi`] (see [`Layered`]).
pub trait KinesisLayer: Send + Sync + 'static {
    /// Wraps one call. `next` is the wrapped API's answer, not started yet: return it as it
    /// is, wrapped (timed, delayed, observed), or return something else instead.
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: ApiCall<'a>,
        next: ApiFuture<'a, T>,
    ) -> ApiFuture<'a, T> {
        let _ = call;
        next
    }

    /// Wraps a PutRecords call with its entries in hand, to look at them or change them
    /// before `inner` gets them. By default the call goes through [`around`](Self::around).
    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        let call = ApiCall::PutRecords {
            stream,
            records: entries.len(),
        };
        self.around(call, inner.put_records(stream, entries))
    }

    /// Wraps a GetRecords call with its arguments in hand, to change them (the limit, say)
    /// before `inner` gets them. By default the call goes through [`around`](Self::around).
    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: String,
        limit: u32,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, GetRecordsOutput> {
        let call = ApiCall::GetRecords {
            stream,
            shard,
            limit,
        };
        self.around(call, inner.get_records(stream, shard, iterator, limit))
    }

    /// Wraps a SubscribeToShard call with its arguments in hand; its answer is the
    /// subscription's event stream, which the layer may wrap too (to delay, count, end or
    /// silence its events). By default the call goes through [`around`](Self::around).
    fn subscribe_to_shard<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        start: &'a StartingPoint,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, ShardEvents> {
        let call = ApiCall::SubscribeToShard {
            stream,
            shard,
            start,
        };
        self.around(
            call,
            inner.subscribe_to_shard(stream, consumer_arn, shard, start),
        )
    }
}

/// A shared layer is a layer: the caller keeps a handle on its state.
impl<L: KinesisLayer> KinesisLayer for Arc<L> {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: ApiCall<'a>,
        next: ApiFuture<'a, T>,
    ) -> ApiFuture<'a, T> {
        L::around(self, call, next)
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        L::put_records(self, stream, entries, inner)
    }

    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: String,
        limit: u32,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, GetRecordsOutput> {
        L::get_records(self, stream, shard, iterator, limit, inner)
    }

    fn subscribe_to_shard<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        start: &'a StartingPoint,
        inner: &'a dyn KinesisApi,
    ) -> ApiFuture<'a, ShardEvents> {
        L::subscribe_to_shard(self, stream, consumer_arn, shard, start, inner)
    }
}

/// A [`KinesisApi`] whose every call goes through a [`KinesisLayer`]: `inner` behind `layer`.
///
/// `K` is the wrapped API: a [`SharedKinesis`] ([`new`](Self::new)), or any implementation of
/// [`KinesisApi`] kept as it is ([`over`](Self::over): a [`MemoryKinesis`](super::MemoryKinesis),
/// an `Arc<AwsKinesis>`). When `K` is also a [`KinesisAdmin`], so is the layered API, and its
/// admin calls go through the layer too.
pub struct Layered<L, K = SharedKinesis> {
    inner: K,
    layer: L,
}

impl<L, K: KinesisApi> fmt::Debug for Layered<L, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layered")
            .field("region", &self.inner.region())
            .finish_non_exhaustive()
    }
}

impl<L: KinesisLayer> Layered<L> {
    /// `inner` behind `layer`.
    pub fn new(inner: SharedKinesis, layer: L) -> Self {
        Self { inner, layer }
    }
}

impl<L: KinesisLayer, K: KinesisApi> Layered<L, K> {
    /// `inner` behind `layer`, keeping `inner`'s type: over a [`KinesisAdmin`] (an
    /// `Arc<AwsKinesis>`, a [`MemoryKinesis`](super::MemoryKinesis)), the layered API is one
    /// too.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
    /// use kinesis_dataflow::MemoryKinesis;
    /// use kinesis_dataflow::api::KinesisAdmin;
    /// use kinesis_dataflow::api::layer::{ApiCall, KinesisLayer, Layered};
    /// use kinesis_dataflow::api::ApiFuture;
    /// use kinesis_dataflow::error::Operation;
    ///
    /// /// Refuses to reshard.
    /// struct NoResharding;
    ///
    /// impl KinesisLayer for NoResharding {
    ///     fn around<'a, T: Send + 'a>(&'a self, call: ApiCall<'a>, next: ApiFuture<'a, T>) -> ApiFuture<'a, T> {
    ///         match call {
    ///             ApiCall::SplitShard { stream, .. } | ApiCall::MergeShards { stream, .. } => {
    ///                 let refused = kinesis_dataflow::KinesisError::InvalidArgument {
    ///                     operation: call.operation(),
    ///                     stream: stream.to_owned(),
    ///                     message: "no resharding here".into(),
    ///                     source: None,
    ///                 };
    ///                 Box::pin(async move { Err(refused) })
    ///             }
    ///             _ => next,
    ///         }
    ///     }
    /// }
    ///
    /// let guarded = Layered::over(MemoryKinesis::new(), NoResharding);
    /// guarded.create_stream("orders", 2).await?;
    /// let refused = guarded
    ///     .merge_shards("orders", "shardId-000000000000", "shardId-000000000001")
    ///     .await
    ///     .unwrap_err();
    /// assert!(matches!(refused, kinesis_dataflow::KinesisError::InvalidArgument { operation: Operation::MergeShards, .. }));
    /// # Ok(()) }
    /// ```
    pub fn over(inner: K, layer: L) -> Self {
        Self { inner, layer }
    }

    /// The layer.
    pub fn layer(&self) -> &L {
        &self.layer
    }

    /// The API behind the layer.
    pub fn inner(&self) -> &K {
        &self.inner
    }

    /// Shared, ready to hand to a reader, a subscription or a publisher.
    pub fn shared(self) -> Arc<Self> {
        Arc::new(self)
    }
}

impl<L: KinesisLayer, K: KinesisApi> KinesisApi for Layered<L, K> {
    fn region(&self) -> &str {
        self.inner.region()
    }

    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
        next_token: Option<String>,
    ) -> ApiFuture<'a, ListShardsPage> {
        let call = ApiCall::ListShards { stream };
        self.layer
            .around(call, self.inner.list_shards(stream, next_token))
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, String> {
        let call = ApiCall::GetShardIterator {
            stream,
            shard,
            start,
        };
        self.layer
            .around(call, self.inner.get_shard_iterator(stream, shard, start))
    }

    fn get_records<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a Arc<str>,
        iterator: String,
        limit: u32,
    ) -> ApiFuture<'a, GetRecordsOutput> {
        self.layer
            .get_records(stream, shard, iterator, limit, &self.inner)
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        entries: Vec<PutRecordsEntry>,
    ) -> ApiFuture<'a, PutRecordsOutput> {
        self.layer.put_records(stream, entries, &self.inner)
    }

    fn describe_stream_summary<'a>(&'a self, stream: &'a str) -> ApiFuture<'a, StreamSummary> {
        let call = ApiCall::DescribeStreamSummary { stream };
        self.layer
            .around(call, self.inner.describe_stream_summary(stream))
    }

    fn register_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        let call = ApiCall::Consumer {
            operation: Operation::RegisterStreamConsumer,
            stream,
            consumer,
        };
        let next = self.inner.register_stream_consumer(stream, consumer);
        self.layer.around(call, next)
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, StreamConsumer> {
        let call = ApiCall::Consumer {
            operation: Operation::DescribeStreamConsumer,
            stream,
            consumer,
        };
        let next = self.inner.describe_stream_consumer(stream, consumer);
        self.layer.around(call, next)
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        stream: &'a str,
        consumer: &'a str,
    ) -> ApiFuture<'a, ()> {
        let call = ApiCall::Consumer {
            operation: Operation::DeregisterStreamConsumer,
            stream,
            consumer,
        };
        let next = self.inner.deregister_stream_consumer(stream, consumer);
        self.layer.around(call, next)
    }

    fn subscribe_to_shard<'a>(
        &'a self,
        stream: &'a str,
        consumer_arn: &'a str,
        shard: &'a Arc<str>,
        start: &'a StartingPoint,
    ) -> ApiFuture<'a, ShardEvents> {
        (self.layer).subscribe_to_shard(stream, consumer_arn, shard, start, &self.inner)
    }
}

impl<L: KinesisLayer, K: KinesisAdmin> KinesisAdmin for Layered<L, K> {
    fn create_stream<'a>(&'a self, stream: &'a str, shard_count: u32) -> ApiFuture<'a, ()> {
        let call = ApiCall::CreateStream {
            stream,
            shard_count,
        };
        self.layer
            .around(call, self.inner.create_stream(stream, shard_count))
    }

    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        new_starting_hash_key: &'a str,
    ) -> ApiFuture<'a, ()> {
        let call = ApiCall::SplitShard { stream, shard };
        let next = self.inner.split_shard(stream, shard, new_starting_hash_key);
        self.layer.around(call, next)
    }

    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a str,
        adjacent: &'a str,
    ) -> ApiFuture<'a, ()> {
        let call = ApiCall::MergeShards {
            stream,
            shard,
            adjacent,
        };
        self.layer
            .around(call, self.inner.merge_shards(stream, shard, adjacent))
    }
}
