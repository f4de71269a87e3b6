//! One consumer instance, run as a child process of the benchmark:
//!
//! ```text
//! failover --instance NAME --kinesis URL --dynamodb URL --stream STREAM --table TABLE
//! ```
//!
//! A core `Subscription` over the AWS SDK (pointed at the emulators), its leases in the DynamoDB
//! table TABLE, owner id NAME. It prints to stdout, one line each:
//!
//! * `@started NAME` once `start()` returned;
//! * `@shards NAME s1,s2,...` whenever the shards it reads change (checked every 50 ms);
//! * `NAME SHARD COUNTER RECEIVE_UNIX_NANOS` for every record it handles (the line is written,
//!   and flushed, before the record is acknowledged, so an acknowledged record has its line);
//! * `@stopped NAME` when the subscription's stream has ended.
//!
//! SIGTERM starts a graceful shutdown (reading stops, checkpoints are flushed and the leases
//! released), and the process exits once it has finished. SIGKILL is a crash. EOF on stdin (the parent is gone) ends the process at once.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kinesis_dataflow::{AwsKinesis, DynamoLeaseStore, KinesisPosition, ReadSettings, Subscription};
use tokio::signal::unix::{SignalKind, signal};

use kinesis_dataflow_test_support::{dynamodb_client_at, kinesis_client_at};

use crate::{Result, SETTINGS, unix_nanos};

/// What the parent passes to an instance.
#[derive(Debug, Default)]
pub struct InstanceArgs {
    pub name: String,
    pub kinesis: String,
    pub dynamodb: String,
    pub stream: String,
    pub table: String,
    /// Run with the library's default settings instead of [`SETTINGS`].
    pub defaults: bool,
    /// Read with enhanced fan-out, as this consumer.
    pub fan_out: Option<String>,
    /// The worker timeout, when not the library's.
    pub worker_timeout: Option<Duration>,
}

impl InstanceArgs {
    pub fn parse(args: &[String]) -> Result<Self> {
        let mut parsed = Self::default();
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let value = it
                .next()
                .ok_or_else(|| format!("{flag} needs a value"))?
                .clone();
            match flag.as_str() {
                "--instance" => parsed.name = value,
                "--kinesis" => parsed.kinesis = value,
                "--dynamodb" => parsed.dynamodb = value,
                "--stream" => parsed.stream = value,
                "--table" => parsed.table = value,
                "--settings" => parsed.defaults = value == "defaults",
                "--fan-out" => parsed.fan_out = Some(value),
                "--worker-timeout-ms" => {
                    let ms = value
                        .parse()
                        .map_err(|_| format!("--worker-timeout-ms {value}: not a number"))?;
                    parsed.worker_timeout = Some(Duration::from_millis(ms));
                }
                other => return Err(format!("unknown instance argument {other}").into()),
            }
        }
        for (what, value) in [
            ("--instance", &parsed.name),
            ("--kinesis", &parsed.kinesis),
            ("--dynamodb", &parsed.dynamodb),
            ("--stream", &parsed.stream),
            ("--table", &parsed.table),
        ] {
            if value.is_empty() {
                return Err(format!("{what} is missing").into());
            }
        }
        Ok(parsed)
    }
}

/// Writes one line to stdout and flushes it; a parent that stopped reading ends the process.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        std::process::exit(3);
    }
}

pub fn run(args: &[String]) -> Result<()> {
    let args = InstanceArgs::parse(args)?;
    // The parent holds our stdin's write end: EOF means it is gone, and so should we be.
    std::thread::spawn(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
        std::process::exit(4);
    });
    // The library's tracing on stderr, filtered by RUST_LOG (nothing when it is unset).
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_default_env() {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(consume(args))
}

async fn consume(args: InstanceArgs) -> Result<()> {
    let name = args.name.clone();
    let kinesis = kinesis_client_at(&args.kinesis);
    let dynamodb = dynamodb_client_at(&args.dynamodb);
    let store = DynamoLeaseStore::new(dynamodb, args.table.clone())?;
    // SIGTERM is caught from here on (before `start`, so an early one is not fatal).
    let mut term = signal(SignalKind::terminate())?;
    let builder = Subscription::builder(
        Arc::new(AwsKinesis::new(kinesis)),
        Arc::new(store),
        args.stream.as_str(),
    )
    .owner(name.clone())
    .start_at(KinesisPosition::horizon());
    let read = match &args.fan_out {
        Some(consumer) => ReadSettings::default().fan_out(consumer.as_str()),
        None => ReadSettings::default(),
    };
    let builder = if args.defaults {
        builder.read_settings(read)
    } else {
        builder
            .read_settings(read.poll_interval(SETTINGS.poll_interval).unlimited_reads())
            .list_interval(SETTINGS.list_interval)
            .lease_duration(SETTINGS.lease_duration)
            .checkpoint_interval(SETTINGS.checkpoint_interval)
            .shutdown_timeout(SETTINGS.shutdown_timeout)
    };
    let builder = match args.worker_timeout {
        Some(timeout) => builder.worker_timeout(timeout),
        None => builder,
    };
    let mut sub = builder.start().await?;
    say(&format!("@started {name}"));

    let handle = sub.shutdown_handle();
    let who = name.clone();
    tokio::spawn(async move {
        term.recv().await;
        eprintln!("[{who}] SIGTERM: stopping gracefully");
        // The stream below ends as soon as this starts (every delivery handed out has been
        // acknowledged by then); the flush and the releases follow, awaited before exiting.
        handle.shutdown().await;
    });

    let mut shards: Vec<String> = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    loop {
        tokio::select! {
            item = sub.next() => match item {
                Some(Ok(delivery)) => {
                    let received = unix_nanos();
                    let counter = std::str::from_utf8(delivery.data())
                        .ok()
                        .and_then(|text| text.split(' ').next())
                        .and_then(|counter| counter.parse::<u64>().ok());
                    match counter {
                        Some(counter) => say(&format!(
                            "{name} {} {counter} {received}",
                            delivery.shard_id()
                        )),
                        None => eprintln!(
                            "[{name}] unexpected payload {:?}",
                            String::from_utf8_lossy(delivery.data())
                        ),
                    }
                    delivery.ack();
                }
                Some(Err(e)) => eprintln!("[{name}] {e}"),
                None => break,
            },
            _ = tick.tick() => {
                let now = sub.shards();
                if now != shards {
                    say(&format!("@shards {name} {}", now.join(",")));
                    shards = now;
                }
            }
        }
    }
    // The stream ends as soon as the shutdown starts (reading stops); the checkpoints are
    // flushed and the leases released after that, by the subscription's background task.
    // Returning now would drop the runtime and cut that short, so wait for it to finish.
    say(&format!("@shards {name} "));
    sub.shutdown_handle().shutdown().await;
    say(&format!("@stopped {name}"));
    Ok(())
}
