//! [`PositionSource`]: the application's own record of where each shard stands, consulted
//! when a shard is taken.

use std::fmt;
use std::future::Future;

use futures::future::BoxFuture;

use crate::position::Checkpoint;

/// The error a [`PositionSource`] may answer with.
pub type PositionSourceError = Box<dyn std::error::Error + Send + Sync>;

/// Where the application's own store says a shard stands: for a sink that writes each
/// record's effect and the record's [`position`](crate::Delivery::position) in one
/// transaction, so that its store, not the lease table, is the truth about what was done.
///
/// When the subscription takes a shard (at startup, after a crash, in a hand-off) it asks the
/// source for the shard's position. When that position is ahead of the lease table's
/// checkpoint ([`Checkpoint::is_ahead_of`]), the shard opens right after it, and its
/// checkpoint in the lease table catches up at the next write. So no record whose effect was
/// committed is delivered again after a crash, however far the lease table's checkpoint lags.
///
/// The contract, for effects that happen exactly once:
///
/// 1. Process a shard's deliveries in order, one at a time.
/// 2. For each, in **one transaction**: read the shard's stored position; if the delivery's
///    position is not ahead of it, the effect is already there (a delivery a frozen instance
///    was still processing): commit nothing. Otherwise write the effect and store the
///    delivery's position for (stream, shard). Then ack the delivery.
/// 3. The source returns the stored position, or `None` for a shard never written.
///
/// Step 2's check keeps the effects exactly once even when two instances briefly hold one
/// shard (one frozen past its lease); the source makes a restart open where the effects end,
/// so nothing is delivered again in the usual case. A `start_at(..)` position given at
/// startup goes ahead of both; a start position (nothing settled) or a finished shard from
/// the source is ignored. A row that records a start at a sequence number (a seek to it, or a
/// `start_at` one, with nothing settled since) counts every record before it as passed over,
/// so an older stored position does not undo the seek; a seek to a time cannot be compared
/// and does not hold against the source (see the settling guide). An error of the source releases the lease with a
/// [`KinesisError::PositionSource`](crate::KinesisError::PositionSource) item on the stream;
/// the shard is taken again at a later listing.
pub trait PositionSource: Send + Sync + fmt::Debug {
    /// The stored position of `shard` of `stream`: the last record whose effect was
    /// committed, as [`Delivery::position`](crate::Delivery::position) gave it.
    fn position(
        &self,
        stream: &str,
        shard: &str,
    ) -> BoxFuture<'static, Result<Option<Checkpoint>, PositionSourceError>>;
}

/// A [`PositionSource`] calling a function with the stream and shard.
pub struct PositionSourceFn<F>(F);

impl<F> fmt::Debug for PositionSourceFn<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PositionSourceFn")
    }
}

/// A [`PositionSource`] that calls `f(stream, shard)`.
///
/// ```
/// use kinesis_dataflow::position::Checkpoint;
/// use kinesis_dataflow::subscription::position_source_fn;
///
/// let source = position_source_fn(|stream: String, shard: String| async move {
///     // Read the position stored with the effects, in your database.
///     let _ = (stream, shard);
///     Ok(Some(Checkpoint::Sequence("49590338271490256608559692538361571095921575989136588898".into())))
/// });
/// # let _ = source;
/// ```
pub fn position_source_fn<F, Fut>(f: F) -> PositionSourceFn<F>
where
    F: Fn(String, String) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Option<Checkpoint>, PositionSourceError>> + Send + 'static,
{
    PositionSourceFn(f)
}

impl<F, Fut> PositionSource for PositionSourceFn<F>
where
    F: Fn(String, String) -> Fut + Send + Sync,
    Fut: Future<Output = Result<Option<Checkpoint>, PositionSourceError>> + Send + 'static,
{
    fn position(
        &self,
        stream: &str,
        shard: &str,
    ) -> BoxFuture<'static, Result<Option<Checkpoint>, PositionSourceError>> {
        Box::pin((self.0)(stream.to_owned(), shard.to_owned()))
    }
}
