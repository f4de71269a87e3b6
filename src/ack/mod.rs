//! Settling deliveries: tokens, the ack sink, stream adaptors, and the per-shard ledger behind
//! checkpoints.
//!
//! | item | what it is |
//! |---|---|
//! | [`Delivery`] | a value and the [`AckToken`] that settles it; keeps it through `map`, `filter`, batching |
//! | [`AckToken`] | settles one record: `ack`, `skip`, `retry` / `retry_after`, or dropped |
//! | [`AckSink`] | a `Sink` that acknowledges deliveries or batches of them; its close waits for a written checkpoint |
//! | [`DeliveryStreamExt`] | `errors_to`, `filter_or_skip`, `filter_map_or_skip`, `batches_by_shard` |
//! | [`Settle`] | what the sink accepts: a delivery, or a `Vec` of them |
//! | [`Settlement`] | acked, skipped, dropped, abandoned, or dead-lettered |
//! | [`DeadLetter`], [`DeadLetters`] | a record given up on, and where it goes (a [`Publisher`](crate::Publisher), or [`dead_letters_fn`]) |
//! | (the ledger, private) | per shard: settles out of order, checkpoints the contiguous prefix |
//!
//! # The rules
//!
//! Acks may arrive in any order (after `buffer_unordered`, say). Per shard, the checkpoint
//! advances only over the contiguous prefix of settled records, so it never passes a record
//! still in flight.
//!
//! | what happens to a delivery | settled as | the checkpoint | the record |
//! |---|---|---|---|
//! | `ack()`, or sent into an [`AckSink`] | acked | passes it | done |
//! | `skip()`, or left out by `filter_or_skip` / `filter_map_or_skip` | skipped | passes it | done, counted as skipped |
//! | `retry()` / `retry_after(d)` (on any `Delivery<T>`, after `map` too) | not yet | waits for it | delivered again (the same bytes, no copy) before later records of its shard |
//! | `fail(error)` / a retry on its last attempt, with [`max_attempts(n)`](crate::SubscriptionBuilder::max_attempts) | dead-lettered | passes it once the dead letter is written; the shard waits for that write (retried until it succeeds) | in the [`DeadLetters`] destination, with its origin ([`DeadLetter`]) |
//! | `dead_letter(reason)` | dead-lettered (skipped, logged at error, without a destination) | as above | as above |
//! | not settled within [`settle_within(d)`](crate::SubscriptionBuilder::settle_within) of being handed out (forgotten in a buffer, a hung handler) | not yet; a failed attempt | waits for it | taken back and delivered again (past `max_attempts`, dead-lettered); what the timed-out delivery does later is ignored |
//! | dropped unsettled while the subscription runs (a `futures` `filter`) | dropped | passes it | counted and logged at debug |
//! | the same, with [`redeliver_dropped(true)`](crate::SubscriptionBuilder::redeliver_dropped) | not yet | waits for it | delivered again, as by `retry()` |
//! | dropped while its thread panics | not yet | waits for it | delivered again in this process; after a crash, by the next reader |
//! | dropped once its subscription was dropped or asked to stop, or its shard was handed off, lost, or moved by a seek | abandoned | never passes it | read again by the shard's next reader (another instance, or a restart) |
//! | settled after its shard was handed off or moved | (ignored) | — | the next reader's checkpoint decides |
//!
//! The [`AckSink`]'s close (so `forward(..)` completing) asks the shards it settled
//! deliveries of for a checkpoint now and waits until a written one covers them all; its
//! flush does the same only with [`durable_flush(true)`](AckSink::durable_flush), because
//! `forward` flushes whenever its source is pending and checkpoints are otherwise written at
//! most once per shard per checkpoint interval. When that cannot be reached the sink fails:
//! [`KinesisError::NotCheckpointed`](crate::KinesisError::NotCheckpointed) (the table
//! unreachable until the lease ran out), the lease lost to another instance (naming stream
//! and shard), [`Superseded`](crate::KinesisError::Superseded) after a seek, or
//! [`Stopped`](crate::KinesisError::Stopped).
//!
//! # At least once, exactly how
//!
//! Every record is handed out until a checkpoint passes it, and a checkpoint passes only acked,
//! skipped and (ordinary) dropped records. A record is delivered more than once when:
//! it was sent back (`retry`, a panic, `redeliver_dropped`, or taken back at its
//! `settle_within` deadline while its work still ran); or this instance stopped holding
//! its shard (crash, lost lease, hand-off, shutdown) after handing it out and before a
//! written checkpoint covered it. Then the next reader starts after the last written
//! checkpoint, so it redelivers at most what was handed out after that checkpoint: at most
//! `max_in_flight` records per shard plus what was settled within the last checkpoint interval
//! (with an [`AckSink`] close or durable flush, only what was not yet settled). A redelivery
//! has the same [`DedupeKey`] (stream, shard, sequence number), so a sink that records the
//! keys it applied can drop the repeats.
//!
//! Attempts ([`Delivery::attempt`]) are counted in this process: a record redelivered by a
//! new owner or after a restart starts again at 1. A dead-letter envelope is larger than
//! the record (base64), so a record above about 750 KiB cannot be dead-lettered to a stream;
//! use a [`dead_letters_fn`] destination for such streams.

mod dead_letter;
mod delivery;
mod durability;
mod ext;
mod sink;
pub(crate) mod tracker;

pub(crate) use crate::telemetry::AckCounts;
pub(crate) use dead_letter::write_until_stored;
pub use dead_letter::{DeadLetter, DeadLetters, DeadLettersFn, ENVELOPE_FORMAT, dead_letters_fn};
pub use delivery::{AckToken, DedupeKey, Delivery};
pub use ext::{BatchesByShard, DeliveryStreamExt, ErrorsTo, FilterMapOrSkip, FilterOrSkip};
pub use sink::{AckSink, Receipts, Settle};
pub use tracker::Settlement;
pub(crate) use tracker::{AckPolicy, ShardAcks};
