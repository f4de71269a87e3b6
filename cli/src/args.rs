//! The command line, parsed with clap: the commands, their flags and help texts, and the
//! checks clap cannot make (a position's syntax and time, `sequence:` with one shard).

use std::ffi::OsString;
use std::time::Duration;

use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Parser, Subcommand};
use kinesis_dataflow::DynamoLeaseStore;

use crate::Failure;
use crate::copy::{self, CopyArgs, LeaseTableCommand};
use crate::kcl_args::{self, KclArgs, KclCommand};
use crate::time;

/// The tool's help, after the list of commands.
const TOOL_AFTER_HELP: &str = "\
Every command but `lease-table copy` takes the lease table and the stream:
  --table <TABLE>        the lease table (DynamoDB)
  --application <NAME>   or the application name: the table `kinesis-dataflow-<NAME>`
  --stream <STREAM>      the Kinesis stream

Configured by the standard AWS environment: AWS_REGION, credentials (AWS_ACCESS_KEY_ID,
AWS_PROFILE, ...), AWS_ENDPOINT_URL_KINESIS / AWS_ENDPOINT_URL_DYNAMODB. The lease table is
never created, except by `kcl import` and `lease-table copy` (as the library would create it);
`kcl export --create` creates the KCL table.

Exit status: 0 done, 1 a call failed, 2 bad input (nothing written), 3 refused (live
instances hold the leases; nothing written).

`kinesis-dataflow <COMMAND> --help` for a command's options.";

/// `status --help`, after the options.
const STATUS_AFTER_HELP: &str = "\
Per shard: STATE (open, closed: the stream lists an ending sequence number), OWNER, the
CHECKPOINT as stored, the lease COUNTER, AGE (time since the row was last written, by the
writer's clock), and the lag from the checkpoint: BEHIND (MillisBehindLatest of the next
record) and RECORDS (Kinesis records between the checkpoint and the tip, counted with
GetRecords). The lag costs one GetShardIterator and one or more GetRecords per unfinished
shard, which share the shard's read limit (5 calls a second) with the application.

A row of an earlier stream of the same name (deleted and created again) shows
`- (earlier stream's row)` as its CHECKPOINT, with a note; its lag counts from the shard's
beginning, where an instance reads it once the row is replaced (when nobody holds it).";

/// `workers --help`, after the options.
const WORKERS_AFTER_HELP: &str = "\
One line per instance (its `worker:<owner>` row): STATE (active, or declared gone: another
instance saw its row unchanged for the worker timeout), LAST SEEN (time since it last wrote
its row, by its own clock), its row's COUNTER, its CAPACITY, its liveness GROUP (the anchor
stream and an id, when it reads several streams as one MultiSubscription; `-` otherwise), and
the LEASES it holds. Owners that hold leases without a worker row (an instance that stepped
aside because it cannot read, or a reset under way) are listed too.";

/// `reset --help`, after the options.
const RESET_AFTER_HELP: &str = "\
Positions:
  horizon                the oldest record each shard still holds (TRIM_HORIZON; also
                         `earliest` and `trim_horizon`)
  latest                 now: only what arrives from now on (closed shards are finished)
  timestamp:<TIME>       the first record that arrived at or after TIME: RFC 3339
                         (2026-12-01T09:30:00Z, 2026-12-01T10:30:00.250+01:00) or milliseconds
                         since the Unix epoch; not in the future
  sequence:<NUMBER>      this record of the one shard named with --shard, read first

It prints what changes first (per shard: from -> to). Without --force it refuses, writing
nothing, while a live instance holds a lease to reset: one whose worker row is there and not
declared gone, or whose lease row was written within the last 60 s. Each lease is taken first
(fenced on its owner and counter like every write, so an instance's later checkpoint write
fails and cannot overwrite the reset), then its checkpoint is written, then it is released;
the instances take the leases again within about a second and read from the new positions.
A lease taken from an instance (--force) is held two thirds of the lease duration first: the
instance stops reading that shard within that time of losing it (at its next renewal, or when
its lease would run out), so the shard never has two readers. A forced reset thus takes
effect within two thirds of the lease duration plus about a second (measured with the
defaults: the first record read again 7.8 s after the reset began).

Every shard of the stream is reset by default, parents and children alike: at horizon or a
timestamp the whole tree is read again, parents before children; a finished shard is read
again too. An application that starts with `start_at(..)` opens its first shards there, ahead
of any checkpoint.

The row of a shard of an earlier stream of the same name (deleted and created again) is
replaced by a row of the listed shard at the new position.";

/// The command line as clap reads it.
#[derive(Debug, Parser)]
#[command(
    name = "kinesis-dataflow",
    version,
    about = "kinesis-dataflow: see and move the checkpoints of a kinesis-dataflow application",
    // The command is not optional: none given is refused with a message of its own.
    override_usage = "kinesis-dataflow <COMMAND> [OPTIONS]",
    after_help = TOOL_AFTER_HELP
)]
struct Cli {
    /// The command; none given is refused with a message saying so.
    #[command(subcommand)]
    command: Option<CommandFlags>,
}

/// The commands as clap reads them.
#[derive(Debug, Subcommand)]
enum CommandFlags {
    /// the shard tree, and per shard its owner, checkpoint, lease counter, age and lag
    #[command(after_help = STATUS_AFTER_HELP)]
    Status(StatusFlags),
    /// the instances, when each was last seen, and how many leases each holds
    #[command(after_help = WORKERS_AFTER_HELP)]
    Workers(WorkersFlags),
    /// move the checkpoints of every shard (or of named shards) to a new position
    #[command(after_help = RESET_AFTER_HELP)]
    Reset(ResetFlags),
    /// import a KCL application's checkpoints, or export this application's to a KCL table
    #[command(subcommand)]
    Kcl(KclCommand),
    /// copy the lease table into a new one keyed by stream and shard
    #[command(subcommand)]
    LeaseTable(LeaseTableCommand),
}

/// The lease table, by name or by application: one of the two.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct TableFlags {
    /// the lease table (DynamoDB)
    #[arg(long, value_name = "TABLE")]
    table: Option<String>,
    /// or the application name: the table `kinesis-dataflow-<NAME>`
    #[arg(long, value_name = "NAME", value_parser = NonEmptyStringValueParser::new())]
    application: Option<String>,
}

/// The lease table and the stream, which every command takes.
#[derive(Debug, Args)]
pub struct TargetFlags {
    /// The lease table.
    #[command(flatten)]
    table: TableFlags,
    /// the Kinesis stream
    #[arg(long, value_name = "STREAM", value_parser = stream_name)]
    stream: String,
}

/// A Kinesis stream name as the service takes it: 1 to 128 of `a-z`, `A-Z`, `0-9`, `_`, `.`
/// and `-` (checked here, so a bad name is bad input, exit 2, not a failed call).
fn stream_name(name: &str) -> Result<String, String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-');
    match name.chars().count() {
        0 => Err("a stream name cannot be empty".to_owned()),
        n if n > 128 => Err(format!("a stream name has at most 128 characters, not {n}")),
        _ if !name.chars().all(allowed) => Err(
            "a stream name has only letters, digits, `_`, `.` and `-` (give the name, not an ARN)"
                .to_owned(),
        ),
        _ => Ok(name.to_owned()),
    }
}

/// `status`'s flags.
#[derive(Debug, Args)]
struct StatusFlags {
    /// Table and stream.
    #[command(flatten)]
    target: TargetFlags,
    /// one JSON document instead of a table (with --watch: one per line)
    #[arg(long)]
    json: bool,
    /// print again every SECONDS seconds until interrupted (Ctrl-C); the COUNTER column then
    /// shows how far each counter moved since the last round (a counter that moves is a live
    /// lease)
    #[arg(long, value_name = "SECONDS", value_parser = watch_interval)]
    watch: Option<Duration>,
    /// stop after N rounds of --watch (for tests)
    #[arg(long, value_name = "N", requires = "watch", hide = true)]
    watch_count: Option<u64>,
    /// count at most N records behind per shard (shown as `>=N` beyond); 0 skips the lag and
    /// reads nothing from the stream
    #[arg(long, value_name = "N", default_value_t = DEFAULT_RECORDS_CAP)]
    records_cap: u64,
}

/// `workers`'s flags.
#[derive(Debug, Args)]
struct WorkersFlags {
    /// Table and stream.
    #[command(flatten)]
    target: TargetFlags,
    /// one JSON document instead of a table
    #[arg(long)]
    json: bool,
}

/// `reset`'s flags.
#[derive(Debug, Args)]
struct ResetFlags {
    /// Table and stream.
    #[command(flatten)]
    target: TargetFlags,
    /// where to move the checkpoints: horizon, latest, timestamp:<TIME> or sequence:<NUMBER>
    /// (see Positions below)
    #[arg(long, value_name = "POSITION")]
    to: String,
    /// reset only this shard (repeatable); default: every shard
    #[arg(long = "shard", value_name = "SHARD_ID", value_parser = NonEmptyStringValueParser::new())]
    shards: Vec<String>,
    /// print what would change and stop
    #[arg(long)]
    dry_run: bool,
    /// take the leases from live instances (they stop reading those shards and resume from
    /// the new positions)
    #[arg(long)]
    force: bool,
    /// the application's lease duration (the library's default is 10): a lease taken from an
    /// instance is held two thirds of it before release
    #[arg(long = "lease-duration", value_name = "SECONDS", value_parser = lease_duration_ms, default_value = "10")]
    lease_duration_ms: u64,
    /// print the plan and what was done (outcome, written, failures) as one JSON document, once
    /// the reset is over
    #[arg(long)]
    json: bool,
}

/// The lease table and the stream every command names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The lease table's name.
    pub table: String,
    /// The stream's name.
    pub stream: String,
}

/// Where `reset` moves the checkpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Position {
    /// TRIM_HORIZON.
    Horizon,
    /// Now.
    Latest,
    /// AT_TIMESTAMP, milliseconds since the Unix epoch.
    Timestamp(u64),
    /// AT_SEQUENCE_NUMBER of one shard.
    Sequence(String),
}

/// `status`'s options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusArgs {
    /// Table and stream.
    pub target: Target,
    /// JSON output.
    pub json: bool,
    /// Print again at this interval.
    pub watch: Option<Duration>,
    /// Stop after this many rounds (tests; hidden).
    pub watch_count: Option<u64>,
    /// The most records counted behind per shard; 0: no lag at all.
    pub records_cap: u64,
}

/// `workers`'s options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkersArgs {
    /// Table and stream.
    pub target: Target,
    /// JSON output.
    pub json: bool,
}

/// `reset`'s options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetArgs {
    /// Table and stream.
    pub target: Target,
    /// The new position.
    pub to: Position,
    /// The shards named (empty: all).
    pub shards: Vec<String>,
    /// Print and stop.
    pub dry_run: bool,
    /// Take leases from live instances.
    pub force: bool,
    /// The application's lease duration, in milliseconds: how long a lease taken from an
    /// instance is held before it is released (two thirds of it), so that instance has
    /// stopped reading before any other may take the shard.
    pub lease_duration_ms: u64,
    /// JSON output.
    pub json: bool,
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `status`.
    Status(StatusArgs),
    /// `workers`.
    Workers(WorkersArgs),
    /// `reset`.
    Reset(ResetArgs),
    /// `kcl import` or `kcl export`.
    Kcl(KclArgs),
    /// `lease-table copy`.
    Copy(CopyArgs),
}

/// The default of `--records-cap`.
pub const DEFAULT_RECORDS_CAP: u64 = 10_000;

/// Why the command line was not taken.
#[derive(Debug)]
pub enum ParseError {
    /// clap's own: an unknown flag, a missing or bad value, or `--help` / `--version` (not an
    /// error; printed to standard output with exit status 0).
    Clap(clap::Error),
    /// A value clap took that is still wrong (a position, `sequence:` without one shard).
    Invalid(Failure),
}

/// Parses the arguments, the program name first. `now_ms` is the current time (for refusing a
/// timestamp in the future).
pub fn parse<I, T>(argv: I, now_ms: u64) -> Result<Command, ParseError>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let cli = Cli::try_parse_from(argv).map_err(ParseError::Clap)?;
    let Some(command) = cli.command else {
        return Err(ParseError::Invalid(Failure::usage(
            "no command given (status, workers, reset, kcl or lease-table)".to_owned(),
        )));
    };
    Ok(match command {
        CommandFlags::Status(flags) => Command::Status(StatusArgs {
            target: flags.target.into(),
            json: flags.json,
            watch: flags.watch,
            watch_count: flags.watch_count,
            records_cap: flags.records_cap,
        }),
        CommandFlags::Workers(flags) => Command::Workers(WorkersArgs {
            target: flags.target.into(),
            json: flags.json,
        }),
        CommandFlags::Reset(flags) => {
            Command::Reset(reset(flags, now_ms).map_err(ParseError::Invalid)?)
        }
        CommandFlags::Kcl(command) => {
            Command::Kcl(kcl_args::kcl(command, now_ms).map_err(ParseError::Invalid)?)
        }
        CommandFlags::LeaseTable(command) => {
            Command::Copy(copy::copy_args(command).map_err(ParseError::Invalid)?)
        }
    })
}

impl From<TargetFlags> for Target {
    fn from(flags: TargetFlags) -> Self {
        let table = match (flags.table.table, flags.table.application) {
            (Some(table), _) => table,
            (None, Some(app)) => DynamoLeaseStore::default_table_name(&app),
            // clap requires one of the two; an empty name would be refused as a table name.
            (None, None) => String::new(),
        };
        Target {
            table,
            stream: flags.stream,
        }
    }
}

/// `--watch`: seconds above 0, up to a day.
fn watch_interval(text: &str) -> Result<Duration, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("`{text}` is not a number of seconds above 0 (up to 86400)"))
}

/// `--lease-duration`: seconds from 0.1 to 3600, in milliseconds.
pub fn lease_duration_ms(text: &str) -> Result<u64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 3_600.0)
        .map(|s| (s * 1000.0).round() as u64)
        .ok_or_else(|| format!("`{text}` is not a number of seconds from 0.1 to 3600"))
}

/// `reset`'s flags checked: the position, and one shard for a sequence number.
fn reset(flags: ResetFlags, now_ms: u64) -> Result<ResetArgs, Failure> {
    let to = position(&flags.to, now_ms)?;
    let mut shards: Vec<String> = Vec::new();
    for shard in flags.shards {
        if !shards.contains(&shard) {
            shards.push(shard);
        }
    }
    if let Position::Sequence(seq) = &to
        && shards.len() != 1
    {
        return Err(Failure::usage(format!(
            "--to sequence:{seq} names a record of one shard; name that shard with exactly one \
             --shard (got {})",
            shards.len()
        )));
    }
    Ok(ResetArgs {
        target: flags.target.into(),
        to,
        shards,
        dry_run: flags.dry_run,
        force: flags.force,
        lease_duration_ms: flags.lease_duration_ms,
        json: flags.json,
    })
}

/// Milliseconds since the epoch below this are before 1973-03-03: a number that small is
/// almost surely seconds typed by mistake (a reset there replays everything).
const SECONDS_NOT_MILLISECONDS: u64 = 100_000_000_000;

/// The refusal of a timestamp given in digits that reads as seconds rather than milliseconds.
fn epoch_seconds_hint(value: &str, ms: u64) -> Option<String> {
    let digits = !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit());
    (digits && ms < SECONDS_NOT_MILLISECONDS).then(|| {
        format!(
            "{value} milliseconds since the epoch is {}, which looks like seconds typed by \
             mistake; the tool takes milliseconds: did you mean timestamp:{value}000? (or write \
             RFC 3339, 2026-12-01T09:30:00Z)",
            time::format(ms)
        )
    })
}

/// Parses `--to`'s value.
pub fn position(text: &str, now_ms: u64) -> Result<Position, Failure> {
    let bad = |why: &str| {
        Failure::usage(format!(
            "--to `{text}` {why}; the positions are horizon, latest, timestamp:<RFC 3339 or \
             epoch milliseconds> and sequence:<NUMBER>"
        ))
    };
    match text {
        // `earliest` is what other clients call it.
        "horizon" | "trim_horizon" | "TRIM_HORIZON" | "earliest" | "EARLIEST" => {
            return Ok(Position::Horizon);
        }
        "latest" | "LATEST" => return Ok(Position::Latest),
        _ => {}
    }
    let Some((kind, value)) = text.split_once(':') else {
        return Err(bad("is not a position"));
    };
    match kind {
        "timestamp" => {
            let ms = time::parse(value).map_err(|why| {
                Failure::usage(format!(
                    "--to `{text}`: `{value}` is not a time ({why}); write RFC 3339 \
                     (2026-12-01T09:30:00Z) or milliseconds since the Unix epoch"
                ))
            })?;
            if let Some(hint) = epoch_seconds_hint(value, ms) {
                return Err(Failure::usage(format!("--to `{text}`: {hint}")));
            }
            if ms > now_ms {
                return Err(Failure::usage(format!(
                    "--to `{text}`: {} is in the future (now is {}); nothing has arrived there \
                     yet",
                    time::format(ms),
                    time::format(now_ms)
                )));
            }
            Ok(Position::Timestamp(ms))
        }
        "sequence" => {
            if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad("holds no sequence number (digits only)"));
            }
            Ok(Position::Sequence(value.to_owned()))
        }
        _ => Err(bad("is not a position")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000_000;

    /// The command line `kinesis-dataflow <line>`, or the error as printed.
    fn parsed(line: &str) -> Result<Command, String> {
        let argv = std::iter::once("kinesis-dataflow").chain(line.split_whitespace());
        parse(argv, NOW).map_err(|e| match e {
            ParseError::Clap(e) => e.to_string(),
            ParseError::Invalid(f) => f.message,
        })
    }

    #[test]
    fn the_command_line_is_well_formed() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn commands_parse() {
        assert_eq!(
            parsed("status --table t1 --stream s --json --watch 0.5 --watch-count 2").unwrap(),
            Command::Status(StatusArgs {
                target: Target {
                    table: "t1".into(),
                    stream: "s".into()
                },
                json: true,
                watch: Some(Duration::from_millis(500)),
                watch_count: Some(2),
                records_cap: DEFAULT_RECORDS_CAP,
            })
        );
        assert_eq!(
            parsed("workers --application billing --stream=s").unwrap(),
            Command::Workers(WorkersArgs {
                target: Target {
                    table: "kinesis-dataflow-billing".into(),
                    stream: "s".into()
                },
                json: false,
            })
        );
        assert_eq!(
            parsed("reset --table t1 --stream s --to sequence:42 --shard a --shard a --dry-run")
                .unwrap(),
            Command::Reset(ResetArgs {
                target: Target {
                    table: "t1".into(),
                    stream: "s".into()
                },
                to: Position::Sequence("42".into()),
                shards: vec!["a".into()],
                dry_run: true,
                force: false,
                lease_duration_ms: 10_000,
                json: false,
            })
        );
        let Command::Reset(forced) =
            parsed("reset --table t --stream s --to latest --force --lease-duration 2.5").unwrap()
        else {
            panic!("not a reset");
        };
        assert_eq!((forced.force, forced.lease_duration_ms), (true, 2_500));
    }

    #[test]
    fn help_is_printed_not_refused() {
        for (line, usage) in [
            ("--help", "Usage: kinesis-dataflow <COMMAND>"),
            ("help", "Usage: kinesis-dataflow <COMMAND>"),
            ("status --help", "Usage: kinesis-dataflow status"),
            ("workers -h", "Usage: kinesis-dataflow workers"),
            ("reset --to x --help", "Usage: kinesis-dataflow reset"),
        ] {
            let argv = std::iter::once("kinesis-dataflow").chain(line.split_whitespace());
            let Err(ParseError::Clap(e)) = parse(argv, NOW) else {
                panic!("{line}: no help");
            };
            assert_eq!(e.exit_code(), 0, "{line}");
            assert!(e.to_string().contains(usage), "{line}: {e}");
        }
    }

    #[test]
    fn bad_command_lines_name_what_is_wrong() {
        for (line, needle) in [
            ("", "no command given"),
            ("frobnicate", "'frobnicate'"),
            ("status --table t --stream s --colour", "'--colour'"),
            ("status --table t", "--stream"),
            ("status --stream s", "--table"),
            ("status --stream s", "--application"),
            (
                "status --table t --application a --stream s",
                "cannot be used with",
            ),
            ("status --table t --stream s --watch 0", "`0`"),
            (
                "status --table t --stream s --watch-count 2",
                "--watch <SECONDS>",
            ),
            ("status --table t --stream s --records-cap -1", "'-1'"),
            (
                "status --table t --stream s --table u",
                "'--table <TABLE>' cannot be used multiple",
            ),
            ("status --application= --stream s", "--application <NAME>"),
            ("reset --table t --stream s", "--to <POSITION>"),
            ("reset --table t --stream s --to sideways", "`sideways`"),
            (
                "reset --table t --stream s --to sequence:12ab --shard x",
                "`sequence:12ab`",
            ),
            (
                "reset --table t --stream s --to sequence:12",
                "exactly one --shard",
            ),
            (
                "reset --table t --stream s --to timestamp:yesterday",
                "`yesterday`",
            ),
            ("reset --table t --stream s --to", "'--to <POSITION>'"),
            (
                "reset --table t --stream s --to latest --shard=",
                "--shard <SHARD_ID>",
            ),
            (
                "reset --table t --stream s --to latest --lease-duration 0",
                "`0`",
            ),
            ("workers --table t --stream s --json=yes", "'yes'"),
        ] {
            let err = parsed(line).unwrap_err();
            assert!(err.contains(needle), "{line}: {err}");
        }
    }

    #[test]
    fn epoch_seconds_and_aliases_of_horizon() {
        let err = position("timestamp:1796176860", NOW).unwrap_err();
        assert_eq!(err.code, 2);
        assert!(
            err.message.contains("looks like seconds")
                && err.message.contains("timestamp:1796176860000"),
            "{}",
            err.message
        );
        assert_eq!(
            position("timestamp:1796176860000", 1_796_176_860_001).unwrap(),
            Position::Timestamp(1_796_176_860_000)
        );
        for alias in [
            "earliest",
            "EARLIEST",
            "trim_horizon",
            "TRIM_HORIZON",
            "horizon",
        ] {
            assert_eq!(position(alias, NOW).unwrap(), Position::Horizon, "{alias}");
        }
    }

    #[test]
    fn timestamps_in_the_future_are_refused() {
        assert_eq!(
            position(&format!("timestamp:{NOW}"), NOW).unwrap(),
            Position::Timestamp(NOW)
        );
        let err = position(&format!("timestamp:{}", NOW + 1), NOW).unwrap_err();
        assert!(err.message.contains("in the future"), "{}", err.message);
        assert_eq!(
            position("timestamp:2026-12-01T09:30:00Z", NOW).unwrap(),
            Position::Timestamp(1_796_117_400_000)
        );
    }
}
