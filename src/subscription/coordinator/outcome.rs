//! Writes whose outcome is unknown. A conditional write that timed out, or that answered a
//! 5xx, may still have been applied; so may a write the SDK retried after such an answer,
//! which then fails its own condition and reads as lost. Either way the next write
//! conditional on the counter this instance last saw answers [`LeaseError::Lost`] while the
//! row still names this instance.
//!
//! Such a write is settled by reading the row back: a row that names this instance was last
//! written by this instance (another instance's take names that instance, and declaring this
//! one gone removes the owner), so its write landed, and the holder carries on from the row as
//! it is. Anything else is a real loss.

use crate::lease::{Lease, LeaseError, SharedLeaseStore};

/// Reads `lease`'s row again; `Some(row)` when it still names `owner`, so the write that
/// answered lost (or failed) was preceded by one of `owner`'s own that landed.
pub(crate) async fn read_back(
    store: &SharedLeaseStore,
    lease: &Lease,
    owner: &str,
) -> Option<Lease> {
    let ids = [lease.shard_id.clone()];
    match store.get(&lease.stream, &ids).await {
        Ok(rows) => rows
            .into_iter()
            .find(|row| row.shard_id == lease.shard_id && row.owner.as_deref() == Some(owner)),
        Err(e) => {
            tracing::debug!(row = %lease.shard_id, error = %e, "could not read the row back after a write whose outcome is unknown");
            None
        }
    }
}

/// True for an answer after which the write may or may not have been applied: a lost
/// condition (an earlier write of ours may have moved the counter) or a transient failure
/// (a timeout, a 5xx).
pub(crate) fn maybe_applied(error: &LeaseError) -> bool {
    error.is_lost() || error.is_retryable()
}
