//! Settling deliveries: tokens, the ack sink, and the per-shard ledger behind checkpoints.
//!
//! | item | what it is |
//! |---|---|
//! | [`Delivery`] | a value and the [`AckToken`] that settles it; keeps it through `map`, `filter`, `.chunks()` |
//! | [`AckToken`] | settles one record: `ack`, `skip`, or dropped; a `Delivery<Record>` can also be sent back with `retry` / `retry_after` |
//! | [`AckSink`] | a `Sink` that acknowledges deliveries or batches of them |
//! | [`Settle`] | what the sink accepts: a delivery, or a `Vec` of them |
//! | [`Settlement`] | acked, skipped, or dropped |
//! | (the ledger, private) | per shard: settles out of order, checkpoints the contiguous prefix |
//!
//! Settlement semantics: acks may arrive in any order (after `buffer_unordered`, say). Per
//! shard, the checkpoint advances only over the contiguous prefix of settled records, so it
//! never passes a record still in flight. A delivery dropped without being settled is
//! settled as *dropped*: counted, logged at debug level, and passed by the checkpoint. Keep the
//! token for as long as the record may still need to be redelivered.

mod delivery;
mod sink;
pub(crate) mod tracker;

pub use delivery::{AckToken, Delivery};
pub use sink::{AckSink, Settle};
pub use tracker::Settlement;
pub(crate) use tracker::ShardAcks;
