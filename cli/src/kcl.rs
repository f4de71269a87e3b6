//! `kcl import` / `kcl export`: the plan printed first, then refused, stopped or written. The
//! work is the library's [`Migration`].

use std::sync::Arc;
use std::time::Duration;

use kinesis_dataflow::kcl::{
    Action, Direction, KclCheckpoint, KclError, KclErrorKind, KclTable, Migration,
    MigrationOptions, Plan, ShardPlan,
};
use kinesis_dataflow::position::Checkpoint;
use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore};
use serde_json::{Value, json};

use crate::Failure;
use crate::aws;
use crate::kcl_args::KclArgs;
use crate::output;

/// Runs `kcl import` or `kcl export`.
pub async fn run(args: &KclArgs) -> Result<(), Failure> {
    let migration = connect(args).await?;
    if !args.json {
        eprintln!(
            "reading stream `{}`, KCL table `{}` and lease table `{}` (both tables are \
             watched up to {:.1} s to see whether a KCL worker or an instance writes them)",
            args.target.stream,
            args.kcl_table,
            args.target.table,
            args.kcl_failover_ms.max(args.lease_duration_ms) as f64 / 1000.0
        );
    }
    let plan = match args.direction {
        Direction::Import => migration.plan_import().await,
        Direction::Export => migration.plan_export().await,
    }
    .map_err(failure)?;
    if args.json {
        output::print_json(&plan_json(args, &plan), false);
    } else {
        print!("{}", plan_text(args, &plan));
    }
    match (&plan.refusal, args.dry_run) {
        (Some(refusal), true) => say(args, &format!("this would be refused: {refusal}")),
        (Some(refusal), false) => return Err(failure(refusal.clone())),
        (None, true) => say(args, "dry run: nothing written"),
        (None, false) if plan.writes() == 0 => say(args, "nothing to change"),
        (None, false) => {
            migration.apply(&plan).await.map_err(failure)?;
            say(args, &done_text(&plan));
        }
    }
    Ok(())
}

/// Prints a closing line (not under --json).
fn say(args: &KclArgs, text: &str) {
    if !args.json {
        println!("\n{text}");
    }
}

/// The SDK clients of one run: the KCL table must exist (or be created by an export with
/// --create); the application's table is created by an import when missing.
async fn connect(args: &KclArgs) -> Result<Migration, Failure> {
    let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
    if config.region().is_none() {
        return Err(Failure::usage(
            "no AWS region configured: set AWS_REGION (or a region in your AWS profile)".to_owned(),
        ));
    }
    aws::check_credentials(&config).await?;
    let dynamodb = aws_sdk_dynamodb::Client::new(&config);
    let kcl = KclTable::new(dynamodb.clone(), args.kcl_table.clone())
        .map_err(|e| Failure::usage(format!("--kcl-table: {e}")))?;
    let app = DynamoLeaseStore::new(dynamodb, args.target.table.clone())
        .map_err(|e| Failure::usage(format!("--table: {e}")))?;
    let options = MigrationOptions {
        unprocessed_from: args.unprocessed_from,
        kcl_failover: Duration::from_millis(args.kcl_failover_ms),
        lease_duration: Duration::from_millis(args.lease_duration_ms),
        force: args.force,
        multi_stream: args.multi_stream.clone(),
        create: args.create,
    };
    Ok(Migration::new(
        Arc::new(AwsKinesis::from_conf(&config)),
        kcl,
        app,
        args.target.stream.clone(),
        options,
    ))
}

/// The exit status of a migration's error: 2 bad input, 3 refused, 1 a failed call.
fn failure(error: KclError) -> Failure {
    let message = error.to_string();
    match error.kind() {
        KclErrorKind::Input => Failure::usage(message),
        KclErrorKind::Refused => Failure::refused(message),
        _ => Failure::failed(error.report()),
    }
}

/// What a migration done says.
fn done_text(plan: &Plan) -> String {
    let shards = output::count(plan.writes(), "shard");
    match plan.direction {
        Direction::Import => format!(
            "imported {shards} into lease table `{}`: start the application; each shard \
             resumes right after the KCL's checkpoint",
            plan.app_table
        ),
        Direction::Export => format!(
            "exported {shards} into KCL table `{}`, without owners: start the KCL \
             application; its workers take the leases at once and resume right after this \
             application's checkpoints",
            plan.kcl_table
        ),
    }
}

/// The plan as a table: a header, a line per shard, the notes.
fn plan_text(args: &KclArgs, plan: &Plan) -> String {
    let dry = if args.dry_run { " (dry run)" } else { "" };
    let mut out = match plan.direction {
        Direction::Import => format!(
            "import stream `{}` from KCL table `{}` into lease table `{}`{dry}\n\n",
            plan.stream, plan.kcl_table, plan.app_table
        ),
        Direction::Export => format!(
            "export stream `{}` from lease table `{}` into KCL table `{}`{}{dry}\n\n",
            plan.stream,
            plan.app_table,
            plan.kcl_table,
            plan.kcl_stream
                .as_ref()
                .map(|id| format!(" (multi-stream `{id}`)"))
                .unwrap_or_default()
        ),
    };
    let lines: Vec<Vec<String>> = plan
        .shards
        .iter()
        .map(|s| cells(plan.direction, s))
        .collect();
    let headers = match plan.direction {
        Direction::Import => [
            "SHARD",
            "STATE",
            "KCL OWNER",
            "KCL CHECKPOINT",
            "NOW",
            "NEW",
        ],
        Direction::Export => [
            "SHARD",
            "STATE",
            "CHECKPOINT",
            "KCL OWNER",
            "KCL NOW",
            "KCL NEW",
        ],
    };
    out.push_str(&output::table(&headers, &lines));
    for note in &plan.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out
}

/// One shard's line.
fn cells(direction: Direction, shard: &ShardPlan) -> Vec<String> {
    let state = if shard.closed { "closed" } else { "open" }.to_owned();
    let kcl_owner = shard
        .kcl
        .as_ref()
        .and_then(|k| k.owner.clone())
        .unwrap_or_else(|| "-".to_owned());
    let kcl_now = shard
        .kcl
        .as_ref()
        .map_or_else(|| "- (no lease)".to_owned(), |k| k.checkpoint.to_string());
    let app_now = match &shard.app {
        Some(row) => output::checkpoint(row.checkpoint.as_ref()),
        None => "- (no row)".to_owned(),
    };
    let new = match &shard.action {
        Action::Import(to) => output::checkpoint(Some(to)),
        Action::Export(row) => row.checkpoint.to_string(),
        Action::Unchanged => "(unchanged)".to_owned(),
        Action::Leave(why) => format!("(left) {why}"),
    };
    match direction {
        Direction::Import => vec![
            shard.shard_id.clone(),
            state,
            kcl_owner,
            kcl_now,
            app_now,
            new,
        ],
        Direction::Export => vec![
            shard.shard_id.clone(),
            state,
            app_now,
            kcl_owner,
            kcl_now,
            new,
        ],
    }
}

/// A KCL checkpoint as JSON: `{"checkpoint": ..., "sub_sequence": ...}`.
fn kcl_json(checkpoint: &KclCheckpoint) -> Value {
    let (text, sub) = checkpoint.encode();
    json!({"checkpoint": text, "sub_sequence": sub})
}

/// The plan as one JSON document.
fn plan_json(args: &KclArgs, plan: &Plan) -> Value {
    let shards: Vec<Value> = plan
        .shards
        .iter()
        .map(|s| {
            let (action, to) = match &s.action {
                Action::Import(to) => ("write", Some(json!(to.encode()))),
                Action::Export(row) => ("write", Some(kcl_json(&row.checkpoint))),
                Action::Unchanged => ("unchanged", None),
                Action::Leave(_) => ("leave", None),
            };
            json!({
                "shard_id": s.shard_id,
                "state": if s.closed { "closed" } else { "open" },
                "kcl_owner": s.kcl.as_ref().and_then(|k| k.owner.clone()),
                "kcl_counter": s.kcl.as_ref().map(|k| k.counter),
                "kcl": s.kcl.as_ref().map(|k| kcl_json(&k.checkpoint)),
                "checkpoint": s.app.as_ref().and_then(|a| a.checkpoint.as_ref()).map(Checkpoint::encode),
                "action": action,
                "to": to,
                "reason": match &s.action { Action::Leave(why) => Some(why.clone()), _ => None },
            })
        })
        .collect();
    json!({
        "direction": match plan.direction { Direction::Import => "import", Direction::Export => "export" },
        "stream": plan.stream,
        "kcl_table": plan.kcl_table,
        "table": plan.app_table,
        "kcl_stream": plan.kcl_stream.as_ref().map(ToString::to_string),
        "dry_run": args.dry_run,
        "force": args.force,
        "refused": plan.refusal.as_ref().map(ToString::to_string),
        "writes": plan.writes(),
        "shards": shards,
        "notes": plan.notes,
    })
}
