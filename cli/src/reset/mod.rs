//! `reset`: moves an application's checkpoints on a stream, fenced like every other write.
//!
//! The steps: read the shards and the rows; decide each shard's new checkpoint and print the
//! plan; refuse while live instances hold leases to change (unless `--force`); then take every
//! lease to change (conditional on its owner and counter), write the new checkpoints, release
//! the leases, and move the roster row so running instances take them again at once.
//!
//! A row written for an earlier stream of the same name (deleted and created again) is not the
//! listed shard's: the library would replace it at its next listing, and a checkpoint written
//! into it would be lost. The reset replaces it itself, while it holds it, by a row of the
//! listed shard at the new position.
//!
//! The parts: [`plan`] decides from what was read, without I/O ([`checks`] its notes and
//! refusals); [`sequence`] checks `--to sequence:N` with Kinesis; [`apply`] carries the plan
//! out ([`take`], [`replace`]); [`outcome`] decides how it ended; [`report`] says it all, as a
//! table or as one JSON document.

mod apply;
mod checks;
mod outcome;
mod plan;
#[cfg(test)]
mod races;
mod replace;
mod report;
mod sequence;
mod take;

use std::time::SystemTime;

use kinesis_dataflow::StartingPoint;

use self::apply::apply;
use self::outcome::{Applied, Ending};
use self::plan::{Plan, Reading, plan, with_rows};
use self::report::{add_outcome, done_text, plan_json, plan_text};
use self::sequence::check_sequence;
use crate::Failure;
use crate::args::{Position, ResetArgs};
use crate::aws::{self, Aws};
use crate::output;
use crate::time;

/// Runs `reset`: reads, plans, prints the plan, then refuses, stops, or applies it.
pub async fn run(args: &ResetArgs) -> Result<(), Failure> {
    let aws = aws::connect(&args.target).await?;
    let plan = read_and_plan(args, &aws).await?;
    if !args.json {
        print!("{}", plan_text(args, &aws, &plan));
    }
    let (ending, applied) = carry_out(args, &aws, &plan).await;
    if args.json {
        let mut doc = plan_json(args, &aws.region, &plan);
        add_outcome(&mut doc, ending, &applied);
        output::print_json(&doc, false);
    }
    applied.result()
}

/// Reads the shards and the rows, checks the sequence number of `--to sequence:N`, and
/// decides the plan.
async fn read_and_plan(args: &ResetArgs, aws: &Aws) -> Result<Plan, Failure> {
    let stream = &args.target.stream;
    let reading = Reading::new(
        aws.shards(stream).await?,
        aws.rows(stream).await?,
        time::now_ms(),
    );
    let (with_rows, skipped) = with_rows(args, &reading)?;
    if let Position::Sequence(seq) = &args.to {
        check_sequence(aws, stream, &with_rows[0].0, seq).await?;
    }
    let latest = StartingPoint::since(SystemTime::now());
    plan(args, &reading, with_rows, skipped, &latest)
}

/// Stops, refuses or applies the plan, as [`next_step`] says: how the reset ended, and what
/// it did.
async fn carry_out(args: &ResetArgs, aws: &Aws, plan: &Plan) -> (Ending, Applied) {
    match next_step(args, plan) {
        Step::Stop(said) => {
            if !args.json {
                println!("\n{said}");
            }
            let ending = if args.dry_run {
                Ending::DryRun
            } else {
                Ending::NothingToChange
            };
            (ending, Applied::default())
        }
        Step::Refuse(message) => (
            Ending::Refused,
            Applied {
                failure: Some(Failure::refused(message)),
                ..Applied::default()
            },
        ),
        Step::Apply => {
            let applied = apply(&aws.store, args, &plan.changes).await;
            if !args.json && applied.failure.is_none() {
                println!("\n{}", done_text(&args.target.stream, plan.to_change()));
            }
            (applied.ending(), applied)
        }
    }
}

/// What `reset` does once the plan is printed.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    /// Stop, saying this (in the table form), exit status 0.
    Stop(String),
    /// Refuse: live instances hold leases to change; exit status 3.
    Refuse(String),
    /// Take the leases and write the checkpoints.
    Apply,
}

/// The step after the plan: a refusal (only said under `--dry-run`), a dry run, nothing to
/// change, or the reset.
fn next_step(args: &ResetArgs, plan: &Plan) -> Step {
    match (&plan.refusal, args.dry_run) {
        (Some(message), true) => Step::Stop(format!(
            "without --force this reset would be refused: {message}"
        )),
        (Some(message), false) => Step::Refuse(message.clone()),
        (None, true) => Step::Stop("dry run: nothing written".to_owned()),
        (None, false) if plan.to_change() == 0 => Step::Stop("nothing to change".to_owned()),
        (None, false) => Step::Apply,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_stops_a_dry_run_and_refuses_a_reset() {
        let args = |dry_run| ResetArgs {
            target: crate::args::Target {
                table: "t".into(),
                stream: "s".into(),
            },
            to: Position::Horizon,
            shards: vec![],
            dry_run,
            force: false,
            lease_duration_ms: 10_000,
            json: false,
        };
        let plan = |refusal: Option<&str>| Plan {
            changes: vec![],
            skipped: vec![],
            notes: vec![],
            refusal: refusal.map(str::to_owned),
        };
        assert_eq!(
            next_step(&args(true), &plan(Some("held"))),
            Step::Stop("without --force this reset would be refused: held".into())
        );
        assert_eq!(
            next_step(&args(false), &plan(Some("held"))),
            Step::Refuse("held".into())
        );
        assert_eq!(
            next_step(&args(true), &plan(None)),
            Step::Stop("dry run: nothing written".into())
        );
        assert_eq!(
            next_step(&args(false), &plan(None)),
            Step::Stop("nothing to change".into())
        );
    }
}
