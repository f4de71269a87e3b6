//! Replacing a row of an earlier stream of the same name by a row of the listed shard.

use kinesis_dataflow::lease::{Lease, LeaseError, LeaseStore};

use super::plan::Change;

/// Replaces `held`, a row of an earlier stream of the same name that the reset holds, by a row
/// of the listed shard (its parents and starting sequence number) at the new checkpoint, held
/// by the reset like the rows it writes, in one write conditional on the reset's hold. On
/// failure, the lease still held, if any.
pub(super) async fn replace(
    store: &dyn LeaseStore,
    held: &Lease,
    change: &Change,
) -> Result<Lease, (String, Option<Lease>)> {
    let id = &change.shard.id;
    let row = replacement(held, change);
    let failed =
        format!("replacing the row of `{id}` written for an earlier stream of the same name");
    match store.replace(held, &row).await {
        Ok(written) => Ok(written),
        // The write may have landed all the same (an answer lost; a retry of a write that
        // landed is refused as Lost): the row read back says.
        Err(e) => match read_back(store, &row).await {
            Ok(Some(found)) if is_written(&found, &row) => Ok(found),
            found => {
                let why = if e.is_lost() {
                    format!("the row changed while the reset held it ({e}); run the reset again")
                } else {
                    e.to_string()
                };
                // Still the reset's when it reads back as held, or cannot be read (a release
                // of a row that changed is fenced and refused).
                let still_held = match found {
                    Ok(Some(found)) => (found == *held).then(|| held.clone()),
                    Ok(None) => None,
                    Err(_) => Some(held.clone()),
                };
                Err((format!("{failed} failed: {why}"), still_held))
            }
        },
    }
}

/// True when `found` is `row` as the reset wrote it: its owner, its shard's starting sequence
/// number, and the counter the write gave it (the reset never renews its hold, so nobody else
/// writes that counter with that owner).
fn is_written(found: &Lease, row: &Lease) -> bool {
    found.owner == row.owner
        && found.counter == row.counter
        && found.starting_sequence_number == row.starting_sequence_number
}

/// The row of the listed shard that replaces `held`: held by the reset, at the new checkpoint,
/// with the shard's parents and starting sequence number.
fn replacement(held: &Lease, change: &Change) -> Lease {
    Lease {
        stream: held.stream.clone(),
        shard_id: held.shard_id.clone(),
        owner: held.owner.clone(),
        counter: held.counter.saturating_add(1),
        checkpoint: Some(change.to.clone()),
        parents: change.shard.parents.clone(),
        starting_sequence_number: Some(change.shard.starting_sequence_number.clone()),
        limits: None,
        liveness_group: None,
    }
}

/// The row of `row`'s shard as the table holds it now (`None`: there is none).
async fn read_back(store: &dyn LeaseStore, row: &Lease) -> Result<Option<Lease>, LeaseError> {
    let ids = [row.shard_id.clone()];
    Ok(store.get(&row.stream, &ids).await?.into_iter().next())
}
