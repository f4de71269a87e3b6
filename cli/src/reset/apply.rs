//! Carrying the plan out: take every lease to change, write the checkpoints, release the
//! leases, move the roster row.

use std::time::Duration;

use kinesis_dataflow::lease::{Lease, LeaseStore};
use tokio::time::Instant;

use super::outcome::{Applied, StepFailure, outcome, released, take_failed};
use super::plan::Change;
use super::replace::replace;
use super::report::written_text;
use super::take::take;
use crate::Failure;
use crate::args::ResetArgs;
use crate::aws::WORKER_PREFIX;
use crate::time;

/// Takes every lease to change, writes the checkpoints, releases the leases, moves the roster.
pub(super) async fn apply(store: &dyn LeaseStore, args: &ResetArgs, changes: &[Change]) -> Applied {
    let me = format!(
        "{}{}-{}",
        kinesis_dataflow::lease::RESET_OWNER_PREFIX,
        std::process::id(),
        time::now_ms()
    );
    let (held, hold_until) = match take_all(store, args, changes, &me).await {
        Ok(taken) => taken,
        Err((failure, failures)) => {
            return Applied {
                written: Vec::new(),
                failures,
                failure: Some(failure),
            };
        }
    };
    let writes = write_all(store, held, args.json).await;
    if let Some(until) = hold_until {
        let left = until.saturating_duration_since(Instant::now());
        if !args.json && !left.is_zero() {
            println!(
                "holding the leases taken from instances for {:.1} s: they stop reading those \
                 shards within two thirds of the lease duration, so no shard has two readers",
                left.as_secs_f64()
            );
        }
        tokio::time::sleep_until(until).await;
    }
    let unreleased = release_all(store, writes.to_release).await;
    bump_roster(store, &args.target.stream, &me).await;
    let failed = writes.failed.as_ref().map(|f| f.error.clone());
    let failure = outcome(failed, &writes.written, released(&unreleased)).err();
    Applied {
        written: writes.written,
        failures: writes.failed.into_iter().chain(unreleased).collect(),
        failure,
    }
}

/// Takes every lease to change; when one cannot be taken, releases those taken and fails.
/// Also says until when the leases taken from instances are to be held: an instance's reader
/// stops two thirds of the lease duration after its last renewal, which was sent before the
/// take that succeeded (or that take would have failed its condition). Whether a lease is
/// taken from an instance is judged by the row the successful take was conditioned on, not
/// by the row as first read: an instance may take a free lease, or renew its own, between the
/// reading and the take.
async fn take_all<'c>(
    store: &dyn LeaseStore,
    args: &ResetArgs,
    changes: &'c [Change],
    me: &str,
) -> Result<(Vec<(Lease, &'c Change)>, Option<Instant>), (Failure, Vec<StepFailure>)> {
    let hold = Duration::from_millis(args.lease_duration_ms * 2 / 3);
    let mut held: Vec<(Lease, &Change)> = Vec::new();
    let mut hold_until: Option<Instant> = None;
    for change in changes.iter().filter(|c| c.changed) {
        match take(
            store,
            &args.target.stream,
            &change.row.lease,
            me,
            args.force,
        )
        .await
        {
            Ok(took) => {
                if took.from.is_some() {
                    hold_until = hold_until.max(Some(took.sent + hold));
                }
                held.push((took.lease, change));
            }
            Err(failure) => {
                let unreleased = release_all(store, held.into_iter().map(|(l, _)| l)).await;
                let took = StepFailure {
                    shard_id: change.shard.id.clone(),
                    step: "take",
                    error: failure.message.clone(),
                };
                let failure = take_failed(failure, released(&unreleased));
                return Err((failure, std::iter::once(took).chain(unreleased).collect()));
            }
        }
    }
    Ok((held, hold_until))
}

/// What the checkpoint writes did.
struct Writes {
    /// The shards written.
    written: Vec<String>,
    /// The first write that failed (none is tried after it).
    failed: Option<StepFailure>,
    /// Every lease held, to release.
    to_release: Vec<Lease>,
}

/// Writes the new checkpoints under the leases held, stopping at the first failure. A row of
/// an earlier stream is replaced instead (see [`replace`]).
async fn write_all(store: &dyn LeaseStore, held: Vec<(Lease, &Change)>, json: bool) -> Writes {
    let mut writes = Writes {
        written: Vec::new(),
        failed: None,
        to_release: Vec::new(),
    };
    for (lease, change) in held {
        if writes.failed.is_some() {
            writes.to_release.push(lease);
            continue;
        }
        match write(store, lease, change).await {
            Ok(lease) => {
                if !json {
                    println!("{}", written_text(change));
                }
                writes.written.push(change.shard.id.clone());
                writes.to_release.push(lease);
            }
            Err((error, still_held)) => {
                writes.failed = Some(StepFailure {
                    shard_id: change.shard.id.clone(),
                    step: "write",
                    error,
                });
                writes.to_release.extend(still_held);
            }
        }
    }
    writes
}

/// Writes the new checkpoint of `change` under `lease`, or replaces a row of an earlier stream
/// (see [`replace`]): the lease as now held, or what went wrong and the lease still held.
async fn write(
    store: &dyn LeaseStore,
    lease: Lease,
    change: &Change,
) -> Result<Lease, (String, Option<Lease>)> {
    if change.earlier_stream {
        return replace(store, &lease, change).await;
    }
    store.checkpoint(&lease, &change.to).await.map_err(|e| {
        let message = format!(
            "writing the checkpoint of `{}` failed: {e}",
            change.shard.id
        );
        (message, Some(lease))
    })
}

/// Releases every lease; the releases that failed.
async fn release_all(
    store: &dyn LeaseStore,
    leases: impl IntoIterator<Item = Lease>,
) -> Vec<StepFailure> {
    let mut failures = Vec::new();
    for lease in leases {
        if let Err(e) = store.release(&lease).await {
            eprintln!(
                "kinesis-dataflow: releasing the lease of `{}` failed: {e}",
                lease.shard_id
            );
            failures.push(StepFailure {
                shard_id: lease.shard_id.clone(),
                step: "release",
                error: e.to_string(),
            });
        }
    }
    failures
}

/// Moves the roster row (when there is one), so running instances list at once and take the
/// released leases within about a second. Failure only delays that to their next listing.
async fn bump_roster(store: &dyn LeaseStore, stream: &str, me: &str) {
    let ids = [WORKER_PREFIX.to_owned()];
    if let Ok(Some(roster)) = store
        .get(stream, &ids)
        .await
        .map(|rows| rows.into_iter().next())
        && let Err(e) = store.take(&roster, me).await
        && !e.is_lost()
    {
        eprintln!(
            "kinesis-dataflow: could not move the roster row ({e}); running instances take the \
             leases at their next listing"
        );
    }
}
