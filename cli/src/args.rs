//! The command line, parsed by hand: the commands, their flags, and the help texts.

use std::time::Duration;

use kinesis_dataflow::DynamoLeaseStore;

use crate::Failure;
use crate::time;

/// The tool's help.
pub const HELP: &str = "\
kinesis-dataflow: see and move the checkpoints of a kinesis-dataflow application

Usage: kinesis-dataflow <COMMAND> [OPTIONS]

Commands:
  status   the shard tree, and per shard its owner, checkpoint, lease counter, age and lag
  workers  the instances, when each was last seen, and how many leases each holds
  reset    move the checkpoints of every shard (or of named shards) to a new position

Every command takes the lease table and the stream:
  --table <TABLE>        the lease table (DynamoDB)
  --application <NAME>   or the application name: the table `kinesis-dataflow-<NAME>`
  --stream <STREAM>      the Kinesis stream

Configured by the standard AWS environment: AWS_REGION, credentials (AWS_ACCESS_KEY_ID,
AWS_PROFILE, ...), AWS_ENDPOINT_URL_KINESIS / AWS_ENDPOINT_URL_DYNAMODB. The lease table is
never created: a missing table is an error.

Exit status: 0 done, 1 a call failed, 2 bad input (nothing written), 3 refused (live
instances hold the leases; nothing written).

`kinesis-dataflow <COMMAND> --help` for a command's options.
";

/// `status --help`.
pub const STATUS_HELP: &str = "\
kinesis-dataflow status: the shard tree and where each shard is

Usage: kinesis-dataflow status (--table <TABLE> | --application <NAME>) --stream <STREAM> [OPTIONS]

Options:
  --json                 one JSON document instead of a table (with --watch: one per line)
  --watch <SECONDS>      print again every SECONDS seconds until interrupted (Ctrl-C); the
                         COUNTER column then shows how far each counter moved since the last
                         round (a counter that moves is a live lease)
  --records-cap <N>      count at most N records behind per shard (default 10000; shown as
                         `>=N` beyond); 0 skips the lag and reads nothing from the stream

Per shard: STATE (open, closed: the stream lists an ending sequence number), OWNER, the
CHECKPOINT as stored, the lease COUNTER, AGE (time since the row was last written, by the
writer's clock), and the lag from the checkpoint: BEHIND (MillisBehindLatest of the next
record) and RECORDS (Kinesis records between the checkpoint and the tip, counted with
GetRecords). The lag costs one GetShardIterator and one or more GetRecords per unfinished
shard, which share the shard's read limit (5 calls a second) with the application.
";

/// `workers --help`.
pub const WORKERS_HELP: &str = "\
kinesis-dataflow workers: the instances of an application on a stream

Usage: kinesis-dataflow workers (--table <TABLE> | --application <NAME>) --stream <STREAM> [--json]

Options:
  --json                 one JSON document instead of a table

One line per instance (its `worker:<owner>` row): STATE (active, or declared gone: another
instance saw its row unchanged for the lease duration), LAST SEEN (time since it last wrote
its row, by its own clock), its row's COUNTER, and the LEASES it holds. Owners that hold
leases without a worker row (an instance that stepped aside because it cannot read, or a
reset under way) are listed too.
";

/// `reset --help`.
pub const RESET_HELP: &str = "\
kinesis-dataflow reset: move an application's checkpoints on a stream

Usage: kinesis-dataflow reset (--table <TABLE> | --application <NAME>) --stream <STREAM> --to <POSITION> [OPTIONS]

Positions:
  horizon                the oldest record each shard still holds (TRIM_HORIZON; also
                         `earliest` and `trim_horizon`)
  latest                 now: only what arrives from now on (closed shards are finished)
  timestamp:<TIME>       the first record that arrived at or after TIME: RFC 3339
                         (2026-12-01T09:30:00Z, 2026-12-01T10:30:00.250+01:00) or milliseconds
                         since the Unix epoch; not in the future
  sequence:<NUMBER>      this record of the one shard named with --shard, read first

Options:
  --shard <SHARD_ID>     reset only this shard (repeatable); default: every shard
  --dry-run              print what would change and stop
  --force                take the leases from live instances (they stop reading those shards
                         and resume from the new positions)
  --lease-duration <SECONDS>
                         the application's lease duration (default 10, the library's): a
                         lease taken from an instance is held two thirds of it before release
  --json                 print the plan (and what was done) as one JSON document

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
";

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
    /// `--help` of the tool or of a command: print it and stop.
    Help(&'static str),
}

/// The default of `--records-cap`.
pub const DEFAULT_RECORDS_CAP: u64 = 10_000;

/// The flags a command accepts: (name, takes a value).
fn flags_of(command: &str) -> &'static [(&'static str, bool)] {
    const COMMON: [(&str, bool); 3] = [
        ("--table", true),
        ("--application", true),
        ("--stream", true),
    ];
    match command {
        "status" => &[
            COMMON[0],
            COMMON[1],
            COMMON[2],
            ("--json", false),
            ("--watch", true),
            ("--watch-count", true),
            ("--records-cap", true),
        ],
        "workers" => &[COMMON[0], COMMON[1], COMMON[2], ("--json", false)],
        "reset" => &[
            COMMON[0],
            COMMON[1],
            COMMON[2],
            ("--to", true),
            ("--shard", true),
            ("--dry-run", false),
            ("--force", false),
            ("--lease-duration", true),
            ("--json", false),
        ],
        _ => &[],
    }
}

/// The flags given, in order: (flag, value).
struct Given {
    command: &'static str,
    pairs: Vec<(&'static str, Option<String>)>,
}

impl Given {
    fn values(&self, flag: &str) -> Vec<&str> {
        self.pairs
            .iter()
            .filter(|(f, _)| *f == flag)
            .filter_map(|(_, v)| v.as_deref())
            .collect()
    }

    fn has(&self, flag: &str) -> bool {
        self.pairs.iter().any(|(f, _)| *f == flag)
    }

    fn one(&self, flag: &str) -> Result<Option<&str>, Failure> {
        match self.values(flag).as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one)),
            [first, second, ..] => Err(usage(format!(
                "{} given twice (`{first}` and `{second}`); give it once",
                flag
            ))),
        }
    }

    fn target(&self) -> Result<Target, Failure> {
        let table = match (self.one("--table")?, self.one("--application")?) {
            (Some(_), Some(_)) => {
                return Err(usage("give --table or --application, not both".to_owned()));
            }
            (Some(table), None) => table.to_owned(),
            (None, Some(app)) => {
                if app.is_empty() {
                    return Err(usage("--application is empty; name the application".into()));
                }
                DynamoLeaseStore::default_table_name(app)
            }
            (None, None) => {
                return Err(usage(format!(
                    "{} needs the lease table: --table <TABLE> or --application <NAME>",
                    self.command
                )));
            }
        };
        let stream = match self.one("--stream")? {
            Some(s) if !s.is_empty() => s.to_owned(),
            Some(_) => return Err(usage("--stream is empty; name the stream".into())),
            None => {
                return Err(usage(format!(
                    "{} needs the stream: --stream <STREAM>",
                    self.command
                )));
            }
        };
        Ok(Target { table, stream })
    }
}

fn usage(message: String) -> Failure {
    Failure::usage(message)
}

/// Parses the arguments after the program name. `now_ms` is the current time (for refusing a
/// timestamp in the future).
pub fn parse(args: &[String], now_ms: u64) -> Result<Command, Failure> {
    let Some(first) = args.first() else {
        return Err(usage(
            "no command given (status, workers or reset)".to_owned(),
        ));
    };
    let (command, help): (&'static str, &'static str) = match first.as_str() {
        "--help" | "-h" | "help" => return Ok(Command::Help(HELP)),
        "status" => ("status", STATUS_HELP),
        "workers" => ("workers", WORKERS_HELP),
        "reset" => ("reset", RESET_HELP),
        other if other.starts_with('-') => {
            return Err(usage(format!(
                "unknown option `{other}` before the command; the commands are status, workers \
                 and reset"
            )));
        }
        other => {
            return Err(usage(format!(
                "unknown command `{other}`; the commands are status, workers and reset"
            )));
        }
    };
    let rest = &args[1..];
    if rest.iter().any(|a| a == "--help" || a == "-h") {
        return Ok(Command::Help(help));
    }
    let given = split_flags(command, rest)?;
    Ok(match command {
        "status" => Command::Status(status(&given)?),
        "workers" => Command::Workers(WorkersArgs {
            target: given.target()?,
            json: given.has("--json"),
        }),
        _ => Command::Reset(reset(&given, now_ms)?),
    })
}

fn split_flags(command: &'static str, rest: &[String]) -> Result<Given, Failure> {
    let known = flags_of(command);
    let mut pairs = Vec::new();
    let mut iter = rest.iter();
    while let Some(arg) = iter.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_owned())),
            _ => (arg.as_str(), None),
        };
        let Some(&(flag, takes_value)) = known.iter().find(|(f, _)| *f == name) else {
            let what = if name.starts_with('-') {
                format!("unknown option `{name}` for `{command}`")
            } else {
                format!("unexpected argument `{arg}` for `{command}` (options start with --)")
            };
            return Err(Failure {
                message: format!("{what}; see `kinesis-dataflow {command} --help`"),
                code: 2,
                names_help: true,
            });
        };
        let value = match (takes_value, inline) {
            (true, Some(value)) => Some(value),
            (true, None) => match iter.next() {
                Some(value) if !value.starts_with("--") => Some(value.clone()),
                _ => return Err(usage(format!("{flag} needs a value"))),
            },
            (false, Some(value)) => {
                return Err(usage(format!("{flag} takes no value (got `{value}`)")));
            }
            (false, None) => None,
        };
        if !takes_value && pairs.iter().any(|(f, _)| *f == flag) {
            return Err(usage(format!("{flag} given twice")));
        }
        pairs.push((flag, value));
    }
    Ok(Given { command, pairs })
}

fn number(flag: &str, text: &str) -> Result<u64, Failure> {
    text.parse::<u64>()
        .map_err(|_| usage(format!("{flag} `{text}` is not a whole number >= 0")))
}

fn status(given: &Given) -> Result<StatusArgs, Failure> {
    let target = given.target()?;
    let watch = match given.one("--watch")? {
        None => None,
        Some(text) => {
            let seconds: f64 = text
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s <= 86_400.0)
                .ok_or_else(|| {
                    usage(format!(
                        "--watch `{text}` is not a number of seconds above 0 (up to 86400)"
                    ))
                })?;
            Some(Duration::from_secs_f64(seconds))
        }
    };
    let watch_count = given
        .one("--watch-count")?
        .map(|t| number("--watch-count", t))
        .transpose()?;
    if watch_count.is_some() && watch.is_none() {
        return Err(usage("--watch-count needs --watch".to_owned()));
    }
    let records_cap = given
        .one("--records-cap")?
        .map(|t| number("--records-cap", t))
        .transpose()?
        .unwrap_or(DEFAULT_RECORDS_CAP);
    Ok(StatusArgs {
        target,
        json: given.has("--json"),
        watch,
        watch_count,
        records_cap,
    })
}

fn reset(given: &Given, now_ms: u64) -> Result<ResetArgs, Failure> {
    let target = given.target()?;
    let Some(to) = given.one("--to")? else {
        return Err(usage(
            "reset needs --to <POSITION>: horizon, latest, timestamp:<TIME> or sequence:<NUMBER>"
                .to_owned(),
        ));
    };
    let to = position(to, now_ms)?;
    let mut shards: Vec<String> = Vec::new();
    for shard in given.values("--shard") {
        if shard.is_empty() {
            return Err(usage("--shard is empty; name a shard id".to_owned()));
        }
        if !shards.iter().any(|s| s == shard) {
            shards.push(shard.to_owned());
        }
    }
    if let Position::Sequence(seq) = &to
        && shards.len() != 1
    {
        return Err(usage(format!(
            "--to sequence:{seq} names a record of one shard; name that shard with exactly one \
             --shard (got {})",
            shards.len()
        )));
    }
    let lease_duration_ms = match given.one("--lease-duration")? {
        None => 10_000,
        Some(text) => text
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.1 && *s <= 3_600.0)
            .map(|s| (s * 1000.0).round() as u64)
            .ok_or_else(|| {
                usage(format!(
                    "--lease-duration `{text}` is not a number of seconds from 0.1 to 3600"
                ))
            })?,
    };
    Ok(ResetArgs {
        target,
        to,
        shards,
        lease_duration_ms,
        dry_run: given.has("--dry-run"),
        force: given.has("--force"),
        json: given.has("--json"),
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
        usage(format!(
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
                usage(format!(
                    "--to `{text}`: `{value}` is not a time ({why}); write RFC 3339 \
                     (2026-12-01T09:30:00Z) or milliseconds since the Unix epoch"
                ))
            })?;
            if let Some(hint) = epoch_seconds_hint(value, ms) {
                return Err(usage(format!("--to `{text}`: {hint}")));
            }
            if ms > now_ms {
                return Err(usage(format!(
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

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    fn parsed(line: &str) -> Result<Command, String> {
        parse(&args(line), NOW).map_err(|f| f.message)
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
        assert_eq!(parsed("reset --help").unwrap(), Command::Help(RESET_HELP));
        assert_eq!(parsed("--help").unwrap(), Command::Help(HELP));
    }

    #[test]
    fn bad_command_lines_name_what_is_wrong() {
        for (line, needle) in [
            ("", "no command"),
            ("frobnicate", "`frobnicate`"),
            ("status --table t --stream s --colour", "`--colour`"),
            ("status --table t", "--stream"),
            ("status --stream s", "--table"),
            ("status --table t --application a --stream s", "not both"),
            ("status --table t --stream s --watch 0", "`0`"),
            (
                "status --table t --stream s --watch-count 2",
                "needs --watch",
            ),
            ("status --table t --stream s --table u", "twice"),
            ("reset --table t --stream s", "--to"),
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
            ("reset --table t --stream s --to", "needs a value"),
            ("workers --table t --stream s --json=yes", "takes no value"),
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
        for alias in ["earliest", "trim_horizon", "horizon"] {
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
