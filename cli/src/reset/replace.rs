//! Replacing a row of an earlier stream of the same name by a row of the listed shard.

use kinesis_dataflow::lease::{Lease, LeaseStore};

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
        Err(e) if e.is_lost() => Err((
            format!(
                "{failed} failed: the row changed while the reset held it ({e}); run the reset \
                 again"
            ),
            None,
        )),
        Err(e) => match read_back(store, &row).await {
            // The write landed all the same (a timeout): the row read back says.
            Some(found) if found.owner == row.owner && found.counter == row.counter => Ok(found),
            found => {
                let still_held = found.filter(|found| found == held).map(|_| held.clone());
                Err((format!("{failed} failed: {e}"), still_held))
            }
        },
    }
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

/// The row of `row`'s shard as the table holds it now, if it could be read.
async fn read_back(store: &dyn LeaseStore, row: &Lease) -> Option<Lease> {
    let ids = [row.shard_id.clone()];
    match store.get(&row.stream, &ids).await {
        Ok(rows) => rows.into_iter().next(),
        Err(_) => None,
    }
}
