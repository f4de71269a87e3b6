//! The RustStream broker face: Kinesis as a [`ruststream`] broker.
//!
//! This module translates; the [dataflow core](crate) does the work. A subscription here is a
//! core [`Subscription`](crate::Subscription) (leases, checkpoints, shard order), a publish is a
//! core [`Publisher`](crate::Publisher) call (PutRecords batching, per-key order), and a
//! handler's outcome settles the core [`Delivery`](crate::Delivery) it came from. The core never
//! imports this module.
//!
//! | file | what it holds |
//! |---|---|
//! | `builder.rs` | [`KinesisBroker`] (configuration, sync, no I/O; describes its server for `with_broker_labeled` and the AsyncAPI document), `connect` and `shutdown` |
//! | `connection.rs` | the live state of a connection, [`ConnectedKinesis`]; every other file imports it |
//! | `descriptor.rs` | [`KinesisStream`], the subscription descriptor (`#[subscriber(KinesisStream::new(..))]`) |
//! | `subscriber.rs` | [`KinesisSubscriber`] over a core subscription |
//! | `message.rs` | [`KinesisMessage`] (settlement) and the per-delivery [`KinesisContext`] with its keys |
//! | [`envelope`] | how headers ride in a record (data and a key only) |
//! | `publisher.rs` | [`KinesisPublish`] (the policy), [`KinesisPublisher`], [`KinesisOptions`] |
//! | [`in_process`] | the framework's in-process mode (feature `testing`): `TestApp` with no server |
//!
//! ```no_run
//! use kinesis_dataflow::broker::prelude::*;
//!
//! #[derive(Debug, serde::Deserialize)]
//! pub struct Shipment {
//!     pub customer: String,
//!     pub seq: u64,
//! }
//!
//! #[subscriber(KinesisStream::new("shipments").create_if_missing(2))]
//! async fn ship(shipment: &Shipment) -> HandlerOutcome {
//!     tracing::info!(shipment.customer, shipment.seq, "shipped");
//!     HandlerOutcome::ack()
//! }
//!
//! fn service(broker: KinesisBroker) -> RustStream {
//!     RustStream::new(AppInfo::new("shipping", "0.1.0")).with_broker(broker, |b| {
//!         b.include(ship);
//!     })
//! }
//! ```
//!
//! # Settlement on a log
//!
//! Kinesis keeps no per-record state: a consumer only moves its checkpoint. The outcome of a
//! handler maps onto the core's settlement of the delivery:
//!
//! | handler outcome | broker call | what happens on the shard |
//! |---|---|---|
//! | `HandlerOutcome::ack()` / `Ok(..)` | `ack` | settled as acked; the checkpoint may pass it |
//! | `HandlerOutcome::drop()` | `nack(false)` | settled as skipped (logged at `info`); the checkpoint may pass it |
//! | `HandlerOutcome::retry()` | `nack(true)` | redelivered in this process, before any later record of its shard, after a backoff that doubles per attempt from [`RETRY_BACKOFF_FIRST`] (50 ms) up to [`RETRY_BACKOFF_MAX`] (5 s); the checkpoint holds meanwhile |
//! | `HandlerOutcome::retry_after(d)` | `nack_after(d)` | the same, after `d`; later records of the shard wait for it |
//! | a message dropped unsettled | `Drop` | redelivered like `retry()` (same backoff) while the subscription runs |
//! | the handler panics, with `on_failure(panic = retry / retry_after(d) / drop / skip)` | the matching row above | the shard goes on after the redelivery or the skip |
//! | the handler panics, under the framework's default (fail fast) | none: the app shuts down gracefully | the record is unsettled, so the checkpoint stops before it and the restarted service reads it again; nothing is lost and nothing is wedged |
//! | the body does not decode (framework default: drop; `on_failure(decode = ...)` chooses retry or fail-fast instead) | `nack(false)` | settled as skipped; the shard goes on |
//! | `retry()` / `retry_after(d)` / a drop on the `n`-th delivery, under the mount site's `max_attempts(n)` and `dead_letter("stream")` | `nack(true)` | written to the dead-letter stream as the message it was (payload, headers, partition key) plus its origin in [`dead_letters`] headers; the shard waits for that write (retried until it succeeds), then the checkpoint passes it |
//! | not settled within [`KinesisStream::settle_within`] of its delivery | none | taken back and delivered again, counted as an attempt |
//!
//! A body that does not decode is decoded, and its failure logged, by the framework, which
//! knows the handler's type but not the record: its warning names the stream (as the
//! subscription), the type and the decoder's error. The skip that follows is logged by this
//! broker at once, in the same task, naming the stream, shard, sequence number and partition
//! key. A handler that wants one error naming all of it takes the raw bytes and decodes them
//! itself; in the core, [`Delivery::decode`](crate::Delivery::decode) returns
//! [`KinesisError::Decode`](crate::KinesisError::Decode), which names the record and carries the
//! decoder's error.
//!
//! Kinesis has no delivery limit or dead-letter queue of its own, so this broker is one that
//! "moves spent deliveries itself" (`Copies = BrokerMoves`): the framework hands the mount
//! site's `max_attempts(n)` and `dead_letter(stream)` to the subscription, by descriptor or by
//! bare name, and the core applies them, keeping the shard's order and losing nothing (the
//! framework's own copy path would pass the record before its copy was stored). Both halves
//! are needed: half a declaration, or a dead-letter stream that does not exist (and is not
//! created with `create_if_missing` / `create_missing_streams`), fails the startup naming it.
//! `.out(Retry, ..)` does not apply to this broker: a retry is redelivered in process.
//!
//! The redelivery count (`redelivery_count()`, 1 on the first delivery) is kept by the
//! subscriber in memory: it starts over after a restart or a lease hand-over, where the record
//! is read again from the checkpoint. After [`ConnectedBroker::shutdown`](ruststream::ConnectedBroker::shutdown)
//! every settlement answers an error ([`KinesisError::ShutDown`](crate::KinesisError::ShutDown)):
//! the record will be read again from the checkpoint, so an `Ok` would be a lie.
//!
//! # One subscription per stream and connection
//!
//! One subscription reads every shard the instance holds, so a second subscription of the same
//! stream on the same connection could only compete with the first for those shards. It is
//! refused with [`KinesisError::AlreadySubscribed`](crate::KinesisError::AlreadySubscribed)
//! until the first is dropped. To share a stream's shards, run several instances (or connect
//! several brokers): they share them through the lease table.
//!
//! # Testing in process
//!
//! With the `testing` feature (enable it in a service's `[dev-dependencies]`), the framework's
//! `TestApp::start(service(KinesisBroker::new()))` runs the production broker on the in-memory
//! transport with no server: one shard per stream, so every record is ordered against every
//! other, and the same settlement as live. Use a paused clock
//! (`#[tokio::test(start_paused = true)]`): a retry after a delay, and the records held behind
//! it, are delivered when the test moves the clock. See [`in_process`] for the details and
//! the two differences from a live run.
//!
//! # Partition keys
//!
//! A publish names its record's partition key, first match wins: the per-publish
//! [`KinesisOptions::partition_key`] (the `.partition_key(..)` step of a publish builder), the
//! `partition-key` header, the key fixed on the policy ([`KinesisPublish::partition_key`] or
//! the mount-site step [`KinesisPublishSettings::fixed_partition_key`]), and otherwise a random key
//! per record (records then spread over the shards and keep no order between them).

mod builder;
mod connection;
pub mod dead_letters;
mod descriptor;
pub mod envelope;
pub mod in_process;
mod message;
mod publisher;
mod read_limit;
mod seeker;
mod subscriber;

pub use builder::{CREDENTIALS_TIMEOUT, ClosedKinesis, DEFAULT_SHUTDOWN_GRACE, KinesisBroker};
pub use connection::ConnectedKinesis;
pub use descriptor::KinesisStream;
pub use message::{
    ArrivalTime, KinesisBatchContext, KinesisContext, KinesisMessage, MillisBehindLatest,
    PartitionKey, Position, RETRY_BACKOFF_FIRST, RETRY_BACKOFF_MAX, SeekHandle, SequenceNumber,
    ShardId, StreamName,
};
pub use publisher::{
    KinesisOptions, KinesisPublish, KinesisPublishSettings, KinesisPublishSteps, KinesisPublisher,
    PARTITION_KEY_HEADER,
};
pub use seeker::KinesisSeeker;
pub use subscriber::KinesisSubscriber;

/// Everything an application built on this broker needs: the framework's prelude plus the
/// Kinesis names.
///
/// The core [`Publisher`](crate::Publisher) is deliberately left out: the framework's
/// `Publisher` trait (from the glob) keeps its name.
pub mod prelude {
    pub use ruststream::prelude::*;

    pub use super::KinesisPublish as Publish;
    pub use super::{
        ArrivalTime, KinesisBatchContext, KinesisBroker, KinesisContext, KinesisOptions,
        KinesisPublish, KinesisPublishSettings, KinesisPublishSteps, KinesisSeeker, KinesisStream,
        MillisBehindLatest, PartitionKey, Position, SeekHandle, SequenceNumber, ShardId,
        StreamName,
    };
    pub use crate::api::MemoryKinesis;
    pub use crate::error::KinesisError;
    pub use crate::position::KinesisPosition;
}
