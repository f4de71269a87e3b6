// Where a subscription starts, chosen on the command line: every record a stream still holds
// (`horizon`), only what arrives from now on (`latest`), what arrived at or after a time
// (`timestamp:<unix-ms>`), or one record of one shard and the rest of that shard
// (`sequence:<shard-id>:<sequence-number>`).
//
// ```sh
// cargo run --example start_positions -- [POSITION] [STREAM]
//
// cargo run --example start_positions                                  # horizon, `events`
// cargo run --example start_positions -- latest orders
// cargo run --example start_positions -- timestamp:1700000000000 orders
// cargo run --example start_positions -- \
//     sequence:shardId-000000000001:49590338271490256608559692538361571095921575989136588898 orders
// ```
//
// The broker comes from the standard AWS environment, as in `kinesis_subscriptions_shards.rs`
// (`AWS_REGION`, `AWS_ENDPOINT_URL_KINESIS`, `AWS_ENDPOINT_URL_DYNAMODB`, credentials), and
// the stream must exist. Each record is logged with its shard and sequence number; stop with
// Ctrl-C.
//
// The position is chosen at run time, so the subscription is mounted in the manual form
// (`subscriber(descriptor, handler).build()`) with the position set on the descriptor
// (`KinesisStream::start_at`). It applies when the subscription starts, ahead of any
// checkpoint in the lease table; a `sequence` position applies to its own shard only, and the
// other shards open where they would without a position (their checkpoint, or the tip).
//
// No `//!` docs or `#![..]` attributes here: `tests/example_start_positions.rs` includes this
// file with `include!`, where inner attributes are not allowed.

use std::future::{Future, ready};
use std::time::Duration;

use kinesis_dataflow::broker::prelude::*;

/// The stream read when the command line names none.
pub const DEFAULT_STREAM: &str = "events";

/// How the command line is written.
pub const USAGE: &str = "usage: start_positions [POSITION] [STREAM]

POSITION (default `horizon`):
  horizon                        every record the stream still holds (TRIM_HORIZON)
  latest                         only records that arrive after the start (LATEST)
  timestamp:<unix-ms>            records that arrived at or after this time (AT_TIMESTAMP)
  sequence:<shard-id>:<seq>      this record of this shard and the rest of the shard
                                 (AT_SEQUENCE_NUMBER); other shards open at their checkpoint
                                 or the tip
STREAM (default `events`): the stream to read; it must exist";

/// What the command line asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// Where the subscription starts.
    pub start: KinesisPosition,
    /// The stream to read.
    pub stream: String,
}

impl Args {
    /// Reads `[POSITION] [STREAM]` (the program name left out).
    ///
    /// # Errors
    ///
    /// A message naming what is wrong: a position [`parse_position`] refuses, or a third
    /// argument.
    pub fn parse<I, S>(args: I) -> Result<Self, String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut args = args.into_iter();
        let start = match args.next() {
            Some(position) => parse_position(position.as_ref())?,
            None => KinesisPosition::horizon(),
        };
        let stream = args
            .next()
            .map_or_else(|| DEFAULT_STREAM.to_owned(), |s| s.as_ref().to_owned());
        if let Some(extra) = args.next() {
            return Err(format!("unexpected argument `{}`", extra.as_ref()));
        }
        Ok(Self { start, stream })
    }
}

/// Reads one position: `horizon`, `latest`, `timestamp:<unix-ms>` or
/// `sequence:<shard-id>:<sequence-number>`.
///
/// ```text
/// parse_position("timestamp:1700000000000") == Ok(KinesisPosition::timestamp(1_700_000_000_000))
/// ```
///
/// # Errors
///
/// A message naming the position and what is wrong with it.
pub fn parse_position(text: &str) -> Result<KinesisPosition, String> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match text.split_once(':') {
        None if text == "horizon" => Ok(KinesisPosition::horizon()),
        None if text == "latest" => Ok(KinesisPosition::latest()),
        Some(("timestamp", ms)) => ms.parse().map(KinesisPosition::timestamp).map_err(|_| {
            format!("`{text}`: a timestamp is milliseconds since the Unix epoch, like `timestamp:1700000000000`")
        }),
        Some(("sequence", rest)) => match rest.split_once(':') {
            Some((shard, seq)) if !shard.is_empty() && digits(seq) => {
                Ok(KinesisPosition::sequence(shard, seq))
            }
            _ => Err(format!(
                "`{text}`: a sequence position is `sequence:<shard-id>:<sequence-number>`, \
                 like `sequence:shardId-000000000000:4959..`"
            )),
        },
        _ => Err(format!(
            "`{text}` is not a position: horizon, latest, timestamp:<unix-ms> or \
             sequence:<shard-id>:<seq>"
        )),
    }
}

/// A record's data as it arrived: any bytes, no codec (the stream may hold anything).
#[derive(Deserialized)]
pub struct Data<'a>(
    /// The record's data (the payload, with any header envelope taken off).
    pub &'a [u8],
);

/// Logs each record (`record`, with its stream, shard, sequence number and data as text) and
/// acks it.
pub struct Show;

impl<'p> Handle<Data<'p>, (), (), KinesisContext> for Show {
    fn handle(
        &self,
        data: &Data<'p>,
        _outs: &(),
        ctx: &mut Context<'_, KinesisContext>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> {
        tracing::info!(
            stream = ctx.context(StreamName),
            shard = ctx.context(ShardId),
            sequence_number = ctx.context(SequenceNumber),
            data = %String::from_utf8_lossy(data.0),
            "record"
        );
        ready(Ok(()))
    }
}

/// The app: one subscription of `stream`, starting at `start`, handled by [`Show`].
pub fn service(broker: KinesisBroker, stream: &str, start: KinesisPosition) -> RustStream {
    let source = KinesisStream::new(stream)
        // An empty read waits 200 ms before the next (1 s by default).
        .poll_interval(Duration::from_millis(200))
        .start_at(start);
    RustStream::new(AppInfo::new("start-positions", "0.1.0")).with_broker(broker, |b| {
        b.include(subscriber(source, Show).build());
    })
}

#[tokio::main]
async fn main() -> Result<(), ruststream::runtime::RustStreamError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    let args = match Args::parse(&args) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    tracing::info!(stream = %args.stream, start = ?args.start, "starting");
    service(KinesisBroker::new(), &args.stream, args.start)
        .run()
        .await
}
