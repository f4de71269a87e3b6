//! `kcl import` and `kcl export`: their flags, help texts and checks.

use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Subcommand};
use kinesis_dataflow::kcl::{Direction, Unprocessed};

use crate::Failure;
use crate::args::{self, Position, Target, TargetFlags};

/// `kcl import --help` / `kcl export --help`, after the options.
pub const KCL_AFTER_HELP: &str = "\
How positions cross: the KCL's checkpoint is the last record it processed (a sequence number
and, inside a KPL aggregate, a sub-sequence number); the application resumes right after it,
inside the aggregate when only part of it was processed, and the other way round. SHARD_END is
finished both ways, TRIM_HORIZON is nothing processed, from the oldest record. The record at
each sequence-number checkpoint is read once (GetShardIterator and GetRecords) to tell a whole
aggregate from part of one.

Shards without a position (the KCL's LATEST and AT_TIMESTAMP, which take their position from
the KCL application's configuration; the application's `nothing settled, unread from a time`)
are refused unless --unprocessed-from says where their unprocessed records begin: horizon
(nothing is lost), latest (records from now on) or timestamp:<RFC 3339>.

Refused, writing nothing (exit 3): while a KCL worker renews a lease of the stream (its
counter moves within --kcl-failover-ms; --force overrides) and while an instance of the
application renews a row (its counter moves within --lease-duration; always). The tables are
watched that long only when some row has an owner.";

/// `kcl`'s commands.
#[derive(Debug, Subcommand)]
pub enum KclCommand {
    /// carry a KCL application's checkpoints into this application's lease table
    #[command(after_help = KCL_AFTER_HELP)]
    Import(ImportFlags),
    /// write this application's checkpoints into a KCL lease table, for a KCL application
    /// to resume from
    #[command(after_help = KCL_AFTER_HELP)]
    Export(ExportFlags),
}

/// What both commands take.
#[derive(Debug, Args)]
pub struct CommonFlags {
    /// The application's lease table and the stream.
    #[command(flatten)]
    target: TargetFlags,
    /// the KCL application's lease table (the KCL names it after the application)
    #[arg(long, value_name = "TABLE", value_parser = NonEmptyStringValueParser::new())]
    kcl_table: String,
    /// where the unprocessed records of shards without a position begin: horizon, latest or
    /// timestamp:<TIME>
    #[arg(long, value_name = "POSITION")]
    unprocessed_from: Option<String>,
    /// the KCL's failover time: a lease written within it (renewed, taken or created) belongs
    /// to a live KCL worker
    #[arg(long, value_name = "MS", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    kcl_failover_ms: u64,
    /// the application's lease duration (the library's default is 10): a row written within
    /// it belongs to a live instance
    #[arg(long = "lease-duration", value_name = "SECONDS", value_parser = args::lease_duration_ms, default_value = "10")]
    lease_duration_ms: u64,
    /// print the plan and stop
    #[arg(long)]
    dry_run: bool,
    /// write even while KCL workers write leases of the stream
    #[arg(long)]
    force: bool,
    /// print the plan as one JSON document
    #[arg(long)]
    json: bool,
}

/// `kcl import`'s flags.
#[derive(Debug, Args)]
pub struct ImportFlags {
    /// What both commands take.
    #[command(flatten)]
    common: CommonFlags,
}

/// `kcl export`'s flags.
#[derive(Debug, Args)]
pub struct ExportFlags {
    /// What both commands take.
    #[command(flatten)]
    common: CommonFlags,
    /// create the KCL table (the KCL's key, on-demand billing) when it is missing
    #[arg(long)]
    create: bool,
    /// write multi-stream rows (`ACCOUNT:STREAM:EPOCH:SHARD`) for this account id and the
    /// stream's creation time in epoch seconds; default: as the table's rows of the stream,
    /// else single-stream rows
    #[arg(long, value_name = "ACCOUNT:EPOCH", value_parser = multi_stream)]
    multi_stream: Option<(String, u64)>,
}

/// A `kcl import` or `kcl export`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KclArgs {
    /// Which way.
    pub direction: Direction,
    /// The application's lease table and the stream.
    pub target: Target,
    /// The KCL table.
    pub kcl_table: String,
    /// Where the unprocessed records of shards without a position begin.
    pub unprocessed_from: Option<Unprocessed>,
    /// The KCL's failover time, in milliseconds.
    pub kcl_failover_ms: u64,
    /// The application's lease duration, in milliseconds.
    pub lease_duration_ms: u64,
    /// Print and stop.
    pub dry_run: bool,
    /// Write while KCL workers are live.
    pub force: bool,
    /// JSON output.
    pub json: bool,
    /// Export: create the KCL table.
    pub create: bool,
    /// Export: multi-stream rows for this account and creation time.
    pub multi_stream: Option<(String, u64)>,
}

/// Checks `kcl`'s flags.
pub fn kcl(command: KclCommand, now_ms: u64) -> Result<KclArgs, Failure> {
    let (direction, common, create, multi_stream) = match command {
        KclCommand::Import(flags) => (Direction::Import, flags.common, false, None),
        KclCommand::Export(flags) => (
            Direction::Export,
            flags.common,
            flags.create,
            flags.multi_stream,
        ),
    };
    let unprocessed_from = common
        .unprocessed_from
        .as_deref()
        .map(|text| unprocessed(text, now_ms))
        .transpose()?;
    Ok(KclArgs {
        direction,
        target: common.target.into(),
        kcl_table: common.kcl_table,
        unprocessed_from,
        kcl_failover_ms: common.kcl_failover_ms,
        lease_duration_ms: common.lease_duration_ms,
        dry_run: common.dry_run,
        force: common.force,
        json: common.json,
        create,
        multi_stream,
    })
}

/// `--unprocessed-from`: a position without a sequence number.
fn unprocessed(text: &str, now_ms: u64) -> Result<Unprocessed, Failure> {
    let position = args::position(text, now_ms).map_err(|f| Failure {
        message: f.message.replacen("--to", "--unprocessed-from", 1),
        ..f
    })?;
    match position {
        Position::Horizon => Ok(Unprocessed::Horizon),
        Position::Latest => Ok(Unprocessed::Latest),
        Position::Timestamp(ms) => Ok(Unprocessed::Timestamp(ms)),
        Position::Sequence(_) => Err(Failure::usage(format!(
            "--unprocessed-from `{text}`: a sequence number is one shard's; the choices are \
             horizon, latest and timestamp:<TIME>"
        ))),
    }
}

/// `--multi-stream ACCOUNT:EPOCH`.
fn multi_stream(text: &str) -> Result<(String, u64), String> {
    let bad = || {
        format!(
            "`{text}` is not ACCOUNT:EPOCH (the account id and the stream's creation time in \
             seconds since the Unix epoch, digits both, e.g. 123456789012:1700000000)"
        )
    };
    let (account, epoch) = text.split_once(':').ok_or_else(bad)?;
    if account.is_empty() || !account.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    Ok((account.to_owned(), epoch.parse().map_err(|_| bad())?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Command, ParseError, parse};

    const NOW: u64 = 1_800_000_000_000;

    fn parsed(line: &str) -> Result<KclArgs, String> {
        let argv = std::iter::once("kinesis-dataflow").chain(line.split_whitespace());
        match parse(argv, NOW) {
            Ok(Command::Kcl(args)) => Ok(args),
            Ok(other) => Err(format!("not kcl: {other:?}")),
            Err(ParseError::Clap(e)) => Err(e.to_string()),
            Err(ParseError::Invalid(f)) => Err(f.message),
        }
    }

    #[test]
    fn import_and_export_parse() {
        let import = parsed(
            "kcl import --kcl-table k --application billing --stream s --unprocessed-from \
             horizon --kcl-failover-ms 500 --dry-run",
        )
        .unwrap();
        assert_eq!(import.direction, Direction::Import);
        assert_eq!(import.target.table, "kinesis-dataflow-billing");
        assert_eq!(import.unprocessed_from, Some(Unprocessed::Horizon));
        assert_eq!((import.kcl_failover_ms, import.dry_run), (500, true));
        let export = parsed(
            "kcl export --kcl-table k --table t --stream s --create --multi-stream \
             123456789012:1700000000",
        )
        .unwrap();
        assert_eq!(export.direction, Direction::Export);
        assert_eq!(
            export.multi_stream,
            Some(("123456789012".to_owned(), 1_700_000_000))
        );
        assert!(export.create);
    }

    #[test]
    fn bad_flags_name_what_is_wrong() {
        for (line, needle) in [
            ("kcl import --table t --stream s", "--kcl-table"),
            ("kcl import --kcl-table k --stream s", "--table"),
            (
                "kcl import --kcl-table k --table t --stream s --unprocessed-from sequence:4",
                "a sequence number is one shard's",
            ),
            (
                "kcl import --kcl-table k --table t --stream s --unprocessed-from sideways",
                "--unprocessed-from `sideways`",
            ),
            (
                "kcl export --kcl-table k --table t --stream s --multi-stream 12",
                "`12` is not ACCOUNT:EPOCH",
            ),
            (
                "kcl import --kcl-table k --table t --stream s --create",
                "'--create'",
            ),
            (
                "kcl import --kcl-table k --table t --stream s --kcl-failover-ms 0",
                "--kcl-failover-ms",
            ),
            ("kcl frobnicate", "'frobnicate'"),
        ] {
            let err = parsed(line).unwrap_err();
            assert!(err.contains(needle), "{line}: {err}");
        }
    }
}
