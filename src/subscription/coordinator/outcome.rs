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

/// What reading a row back found.
#[derive(Debug)]
pub(crate) enum ReadBack {
    /// The row still names this instance: its earlier write landed; carry on from this row.
    Ours(Lease),
    /// The row names another owner (or none, or is gone): the lease is lost.
    Theirs(Option<String>),
    /// The row could not be read.
    Unknown,
}

/// Reads `lease`'s row again, to settle a write that answered lost (or failed) for `owner`.
pub(crate) async fn read_back(store: &SharedLeaseStore, lease: &Lease, owner: &str) -> ReadBack {
    let ids = [lease.shard_id.clone()];
    match store.get(&lease.stream, &ids).await {
        Ok(rows) => match rows.into_iter().find(|row| row.shard_id == lease.shard_id) {
            Some(row) if row.owner.as_deref() == Some(owner) => ReadBack::Ours(row),
            Some(row) => ReadBack::Theirs(row.owner),
            None => ReadBack::Theirs(None),
        },
        Err(e) => {
            tracing::debug!(row = %lease.shard_id, error = %e, "could not read the row back after a write whose outcome is unknown");
            ReadBack::Unknown
        }
    }
}

/// `Some(row)` when the row read back still names this instance (see [`read_back`]).
pub(crate) async fn still_ours(
    store: &SharedLeaseStore,
    lease: &Lease,
    owner: &str,
) -> Option<Lease> {
    match read_back(store, lease, owner).await {
        ReadBack::Ours(row) => Some(row),
        ReadBack::Theirs(_) | ReadBack::Unknown => None,
    }
}

/// True for an answer after which the write may or may not have been applied: a lost
/// condition (an earlier write of ours may have moved the counter) or a transient failure
/// (a timeout, a 5xx).
pub(crate) fn maybe_applied(error: &LeaseError) -> bool {
    error.is_lost() || error.is_retryable()
}
