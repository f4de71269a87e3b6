//! Replacing a row of an earlier stream of the same name by a row of the listed shard.

use kinesis_dataflow::lease::{Lease, LeaseStore};

use super::plan::Change;

/// Replaces `held`, a row of an earlier stream of the same name that the reset holds, by a row
/// of the listed shard (its parents and starting sequence number) at the new checkpoint, held
/// by the reset like the rows it writes: the old row is deleted (conditional on the reset's
/// hold), then the new one created (conditional on there being none). Between the two an
/// instance's listing may create the shard's row itself (at the application's position): the
/// reset then fails, saying to run it again. On failure, the lease still held, if any.
pub(super) async fn replace(
    store: &dyn LeaseStore,
    held: &Lease,
    change: &Change,
) -> Result<Lease, (String, Option<Lease>)> {
    let id = &change.shard.id;
    if let Err(e) = store.delete(held).await {
        let message = format!(
            "deleting the row of `{id}` written for an earlier stream of the same name failed: \
             {e}"
        );
        return Err((message, Some(held.clone())));
    }
    let row = replacement(held, change);
    let deleted = format!(
        "the row of `{id}` written for an earlier stream of the same name was deleted, but"
    );
    let again = "run the reset again";
    match store.create(&row).await {
        Ok(true) => Ok(row),
        Ok(false) => Err((
            format!(
                "{deleted} an instance created the row of this stream's shard meanwhile (at the \
                 application's position); {again}"
            ),
            None,
        )),
        Err(e) => created_all_the_same(store, &row).await.ok_or_else(|| {
            (
                format!(
                    "{deleted} creating the row of this stream's shard failed: {e}; an \
                     instance creates it at its next listing (at the application's \
                     position): {again}"
                ),
                None,
            )
        }),
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

/// The create of `row` failed, but may have landed all the same (a timeout): the row read
/// back says. The row as created, if it was.
async fn created_all_the_same(store: &dyn LeaseStore, row: &Lease) -> Option<Lease> {
    let ids = [row.shard_id.clone()];
    match store
        .get(&row.stream, &ids)
        .await
        .map(|rows| rows.into_iter().next())
    {
        Ok(Some(found)) if found.owner == row.owner => Some(found),
        _ => None,
    }
}
