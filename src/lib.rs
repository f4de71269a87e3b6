//! # kinesis-dataflow
//!
//! Amazon Kinesis Data Streams as Rust `Stream`s.
//!
//! The crate reads top to bottom like the data flows:
//!
//! | module | what it holds |
//! |---|---|
//! | [`api`] | the seam: a trait over the Kinesis calls, with the AWS SDK and in-memory implementations |
//! | [`shard`] | one shard as a `Stream<Item = Result<Record, KinesisError>>` |
//! | [`subscription`] | the shards this instance holds, merged, children gated on parents; several streams in one |
//! | [`ack`] | deliveries, the ack sink, and the per-shard ledger behind checkpoints |
//! | [`lease`] | leases and checkpoints in DynamoDB (or in memory) |
//! | [`position`] | where a reader opens: positions, checkpoints, and the rule combining them |
//! | [`record`] | the [`Record`] a reader yields |
//! | [`error`] | [`KinesisError`], the crate's one error |
//! | `broker` | the RustStream broker face over all of the above (`KinesisBroker`, `KinesisStream`); the default feature `broker` |
//!
//! How to use it, chapter by chapter: the [`guide`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), kinesis_dataflow::KinesisError> {
//! use std::sync::Arc;
//! use futures::StreamExt;
//! use kinesis_dataflow::{MemoryKinesis, ShardStream, StartingPoint};
//!
//! let kinesis = MemoryKinesis::new();
//! kinesis.add_stream("events", 1)?;
//! for i in 0..3 {
//!     kinesis.put("events", "key", format!("event {i}"))?;
//! }
//! let shard = ShardStream::builder(Arc::new(kinesis), "events", "shardId-000000000000")
//!     .open(StartingPoint::TrimHorizon)?;
//! let events: Vec<_> = shard.take(3).map(|r| r.unwrap().into_data()).collect().await;
//! assert_eq!(&events[2][..], b"event 2");
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(
    missing_docs,
    missing_debug_implementations,
    rust_2018_idioms,
    unreachable_pub
)]

pub mod ack;
pub mod api;
#[cfg(feature = "broker")]
pub mod broker;
pub mod error;
pub mod guide;
mod jitter;
pub mod kcl;
pub mod kpl;
pub mod lease;
pub mod position;
pub mod publish;
pub mod record;
pub mod shard;
pub mod subscription;
mod telemetry;

// The names a pipeline author touches. What a transport or lease-store implementer needs
// (the `KinesisApi` and `LeaseStore` traits, rows, checkpoints) lives in its module.
pub use ack::{AckSink, Delivery, DeliveryStreamExt, Settlement};
pub use api::{AwsKinesis, MemoryKinesis};
pub use error::KinesisError;
pub use lease::{DynamoLeaseStore, MemoryLeaseStore};
pub use position::{KinesisPosition, StartingPoint};
pub use publish::{OutgoingRecord, PublishSink, Publishable, Publisher};
pub use record::Record;
pub use shard::{ReadSettings, ShardStream};
pub use subscription::{
    MultiSubscription, MultiSubscriptionBuilder, StopSignal, StreamSet, Subscription,
    SubscriptionBuilder, shutdown_signal,
};

/// The README's code, compiled as doctests so it cannot drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
