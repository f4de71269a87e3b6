//! What the reset says: the plan as a table or as one JSON document, each row written, the
//! outcome.

use std::collections::HashSet;

use kinesis_dataflow::position::Checkpoint;
use serde_json::{Value, json};

use super::outcome::{Applied, Ending};
use super::plan::{Change, Plan};
use crate::args::{Position, ResetArgs};
use crate::aws::{Aws, Shard};
use crate::output;
use crate::time;

/// `--to` as the plan says it.
fn position_text(to: &Position) -> String {
    match to {
        Position::Horizon => "horizon".to_owned(),
        Position::Latest => "latest".to_owned(),
        Position::Timestamp(ms) => format!("timestamp:{}", time::format(*ms)),
        Position::Sequence(seq) => format!("sequence:{seq}"),
    }
}

/// The plan in the table form: a header, per shard from -> to, the shards skipped, the notes.
pub(super) fn plan_text(args: &ResetArgs, aws: &Aws, plan: &Plan) -> String {
    let mut out = format!(
        "reset stream `{}` (region {}), lease table `{}`, to {}{}\n\n",
        args.target.stream,
        aws.region,
        args.target.table,
        position_text(&args.to),
        if args.dry_run { " (dry run)" } else { "" }
    );
    let lines: Vec<Vec<String>> = plan.changes.iter().map(change_cells).collect();
    out.push_str(&output::table(
        &["SHARD", "STATE", "OWNER", "FROM", "TO"],
        &lines,
    ));
    for (shard, why) in &plan.skipped {
        out.push_str(&format!("skipped {shard}: {why}\n"));
    }
    for note in &plan.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

/// One shard's line of the plan.
fn change_cells(c: &Change) -> Vec<String> {
    let owner = match (&c.row.lease.owner, c.live_owner) {
        (None, _) => "-".to_owned(),
        (Some(o), true) => format!("{o} (live)"),
        (Some(o), false) => format!("{o} (silent)"),
    };
    vec![
        c.shard.id.clone(),
        shard_state(&c.shard).to_owned(),
        owner,
        from_text(c),
        if c.changed {
            output::checkpoint(Some(&c.to))
        } else {
            "(unchanged)".to_owned()
        },
    ]
}

/// The checkpoint a change moves from, in words: none for a row of an earlier stream.
pub(super) fn from_text(c: &Change) -> String {
    if c.earlier_stream {
        EARLIER_STREAM_ROW.to_owned()
    } else {
        output::checkpoint(c.row.lease.checkpoint.as_ref())
    }
}

/// What the plan says in place of the checkpoint of a row of an earlier stream.
pub(super) const EARLIER_STREAM_ROW: &str = "- (row of an earlier stream of the same name)";

/// `open` or `closed`.
fn shard_state(shard: &Shard) -> &'static str {
    if shard.is_closed() { "closed" } else { "open" }
}

/// The plan as one JSON document.
pub(super) fn plan_json(args: &ResetArgs, region: &str, plan: &Plan) -> Value {
    let shards: Vec<Value> = plan
        .changes
        .iter()
        .map(|c| {
            json!({
                "shard_id": c.shard.id,
                "state": shard_state(&c.shard),
                "owner": c.row.lease.owner,
                "owner_live": c.live_owner,
                "counter": c.row.lease.counter,
                "from": c.row.lease.checkpoint.as_ref().map(Checkpoint::encode),
                "to": c.to.encode(),
                "changed": c.changed,
                "earlier_stream_row": c.earlier_stream,
            })
        })
        .collect();
    let skipped: Vec<Value> = plan
        .skipped
        .iter()
        .map(|(shard, why)| json!({"shard_id": shard, "reason": why}))
        .collect();
    json!({
        "table": args.target.table,
        "stream": args.target.stream,
        "region": region,
        "to": position_text(&args.to),
        "dry_run": args.dry_run,
        "force": args.force,
        "refused": plan.refusal,
        "shards": shards,
        "skipped": skipped,
        "notes": plan.notes,
    })
}

/// Adds the outcome to the plan's JSON document: `outcome`, `applied`, `exit_status`,
/// `written`, `failures`, `error`, and `written` per shard.
pub(super) fn add_outcome(doc: &mut Value, ending: Ending, applied: &Applied) {
    let written: HashSet<&str> = applied.written.iter().map(String::as_str).collect();
    if let Some(shards) = doc["shards"].as_array_mut() {
        for shard in shards {
            let id = shard["shard_id"].as_str().unwrap_or_default();
            shard["written"] = Value::Bool(written.contains(id));
        }
    }
    let failures: Vec<Value> = applied
        .failures
        .iter()
        .map(|f| json!({"shard_id": f.shard_id, "step": f.step, "error": f.error}))
        .collect();
    doc["outcome"] = json!(ending.word());
    doc["applied"] = json!(ending == Ending::Applied);
    doc["exit_status"] = json!(applied.failure.as_ref().map_or(0, |f| f.code));
    doc["written"] = json!(applied.written);
    doc["failures"] = json!(failures);
    doc["error"] = json!(applied.failure.as_ref().map(|f| &f.message));
}

/// What a reset done says.
pub(super) fn done_text(stream: &str, changed: usize) -> String {
    format!(
        "reset {} of stream `{stream}`. Running instances take the leases again within about a \
         second (the roster row was moved) and read from the new positions: after a forced \
         reset, within two thirds of the lease duration and a second of its start (measured \
         with 10 s leases: 7.8 s). Stopped instances read from there when they start.",
        output::count(changed, "shard")
    )
}

/// What is said of a row written: the shard, from -> to.
pub(super) fn written_text(change: &Change) -> String {
    format!(
        "{}: {} -> {}",
        change.shard.id,
        from_text(change),
        output::checkpoint(Some(&change.to))
    )
}
