//! Taking one lease for the reset, conditional on its owner and counter.

use kinesis_dataflow::lease::{Lease, LeaseError, LeaseStore};
use tokio::time::Instant;

use crate::Failure;

/// How many times a take is tried when the row changes between the read and the take.
const TAKE_ATTEMPTS: usize = 5;

/// A lease the reset took.
pub(super) struct Took {
    /// The lease as now held by the reset.
    pub(super) lease: Lease,
    /// Who held it just before (`None`: nobody).
    pub(super) from: Option<String>,
    /// When the take that succeeded was sent.
    pub(super) sent: Instant,
}

/// Takes `lease` for `me`, reading the row again when it changed meanwhile. Without `force` a
/// row that an instance took meanwhile refuses the reset. A take whose answer was lost (a
/// timeout, a 5xx, or a retry that found the reset's own write and so read as lost) is
/// settled by the row read back: when it names `me`, the take landed.
pub(super) async fn take(
    store: &dyn LeaseStore,
    stream: &str,
    lease: &Lease,
    me: &str,
    force: bool,
) -> Result<Took, Failure> {
    let mut current = lease.clone();
    for _ in 0..TAKE_ATTEMPTS {
        let sent = Instant::now();
        match store.take(&current, me).await {
            Ok(taken) => {
                return Ok(Took {
                    lease: taken,
                    from: current.owner,
                    sent,
                });
            }
            Err(e) if e.is_lost() || e.is_retryable() => {
                let fresh = read_back(store, stream, &current, &e).await?;
                if fresh.owner.as_deref() == Some(me) {
                    return Ok(Took {
                        lease: fresh,
                        from: current.owner,
                        sent,
                    });
                }
                if !e.is_lost() {
                    return Err(Failure::failed(format!(
                        "taking the lease of `{}` failed: {e}",
                        current.shard_id
                    )));
                }
                if !force && let Some(owner) = &fresh.owner {
                    return Err(Failure::refused(format!(
                        "`{owner}` wrote the lease of `{}` meanwhile (a live instance holds \
                         it); stop the instances or pass --force",
                        fresh.shard_id
                    )));
                }
                current = fresh;
            }
            Err(e) => {
                return Err(Failure::failed(format!(
                    "taking the lease of `{}` failed: {e}",
                    current.shard_id
                )));
            }
        }
    }
    Err(Failure::failed(format!(
        "the lease of `{}` changed under each of {TAKE_ATTEMPTS} takes",
        current.shard_id
    )))
}

/// The row of `lease` read again after its take failed with `error`; fails when the reading
/// fails or finds the row deleted.
async fn read_back(
    store: &dyn LeaseStore,
    stream: &str,
    lease: &Lease,
    error: &LeaseError,
) -> Result<Lease, Failure> {
    let ids = [lease.shard_id.clone()];
    let fresh = store.get(stream, &ids).await.map_err(|read| {
        Failure::failed(format!(
            "taking the lease of `{}` failed ({error}), and reading its row again failed: {read}",
            ids[0]
        ))
    })?;
    fresh.into_iter().next().ok_or_else(|| {
        Failure::failed(format!(
            "the row of `{}` was deleted meanwhile (the stream deleted?)",
            ids[0]
        ))
    })
}
