//! Publishing benchmark: kinesis-dataflow's `Publisher` over the AWS SDK against ferrokinesis.
//!
//! ```text
//! cargo run --release --manifest-path benches/e2e/Cargo.toml --bin publish -- [--quick] [--records N] [--rounds R] [--linger-ms L]
//! ```
//!
//! The binary starts ferrokinesis (embedded, in a child process of its own, as the drain
//! does) and publishes N records of 100 bytes under 1,000 partition keys into a fresh 4-shard
//! stream per way and round, in a rotating order over the rounds:
//!
//! * (a) baseline: the raw SDK, PutRecords calls of 500 entries, 4 calls in flight (a task
//!   each), refused entries sent again;
//! * (b) `Publisher::publish_batch` of 500 records, 4 in flight;
//! * (c) `Publisher::publish`, one record per call, from 64 tasks, each awaiting its publish
//!   before the next (the shape of a handler that publishes what it handles);
//! * (d) the same through a collecting publisher (`Publisher::collect`, its defaults unless
//!   `--linger-ms` is given): the 64 tasks' publishes share PutRecords calls.
//!
//! It prints, per way, the median records/s, the median of the per-round ratios to (a), the
//! PutRecords calls made, and the CPU seconds per 100,000 records of this process and of the
//! emulator. Times are reported, never asserted on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use kinesis_dataflow::publish::Collect;
use kinesis_dataflow::{AwsKinesis, OutgoingRecord, Publisher};
use kinesis_dataflow_e2e::{
    CpuClock, Emulator, PUT_BATCH, RECORD_BYTES, Result, SERVE_EMULATOR, counting_kinesis,
    entry, median, put_entries, serve_emulator,
};
use kinesis_dataflow_test_support::{create_stream_shards, sdk_config_at};

const SHARDS: usize = 4;
const KEYS: usize = 1_000;
const BATCHES_IN_FLIGHT: usize = 4;
const TASKS: usize = 64;
const DEFAULT_RECORDS: usize = 100_000;
const DEFAULT_ROUNDS: usize = 3;
const QUICK_RECORDS: usize = 10_000;

const USAGE: &str =
    "usage: publish [--quick] [--records N] [--rounds R] [--linger-ms L] [--ways abcd]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Raw,
    Batch,
    Single,
    Collected,
}

impl Way {
    const ALL: [Way; 4] = [Way::Raw, Way::Batch, Way::Single, Way::Collected];

    fn letter(self) -> char {
        match self {
            Way::Raw => 'a',
            Way::Batch => 'b',
            Way::Single => 'c',
            Way::Collected => 'd',
        }
    }

    fn label(self) -> &'static str {
        match self {
            Way::Raw => "(a) raw SDK PutRecords, 500 a call, 4 in flight",
            Way::Batch => "(b) publish_batch of 500, 4 in flight",
            Way::Single => "(c) publish, one record, 64 tasks",
            Way::Collected => "(d) publish, one record, 64 tasks, collected",
        }
    }
}

struct Options {
    records: usize,
    rounds: usize,
    linger: Option<Duration>,
    /// The letters of the ways to run ((a), the baseline, always runs).
    ways: String,
}

impl Options {
    fn parse(args: &[String]) -> std::result::Result<Self, String> {
        let mut options = Self {
            records: DEFAULT_RECORDS,
            rounds: DEFAULT_ROUNDS,
            linger: None,
            ways: "abcd".into(),
        };
        let mut args = args.iter();
        while let Some(arg) = args.next() {
            let mut number = |name: &str| -> std::result::Result<usize, String> {
                args.next()
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("{name} needs a number"))
            };
            match arg.as_str() {
                "--quick" => {
                    options.records = QUICK_RECORDS;
                    options.rounds = 1;
                }
                "--records" => options.records = number("--records")?.max(1),
                "--rounds" => options.rounds = number("--rounds")?.max(1),
                "--linger-ms" => {
                    options.linger = Some(Duration::from_millis(number("--linger-ms")? as u64));
                }
                "--ways" => {
                    options.ways = args.next().cloned().ok_or("--ways needs letters")?;
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(options)
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == SERVE_EMULATOR) {
        return serve_emulator();
    }
    if args.iter().any(|a| a == "--help") {
        println!("{USAGE}");
        return Ok(());
    }
    let options = match Options::parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    kinesis_dataflow_e2e::runtime()?.block_on(run(options))
}

/// One way's figures in one round.
struct Sample {
    records_per_second: f64,
    client_cpu: f64,
    emulator_cpu: f64,
    calls: usize,
}

async fn run(options: Options) -> Result<()> {
    let emulator = Emulator::start()?;
    let endpoint = emulator.endpoint();
    let config = sdk_config_at(&endpoint);
    let client = Client::new(&config);
    let cpu = CpuClock::new();
    let pid = emulator.pid().to_string();
    println!(
        "publishing {} records of {RECORD_BYTES} bytes, {KEYS} keys, {SHARDS} shards, {} rounds",
        options.records, options.rounds
    );
    let mut samples: Vec<Vec<Sample>> = Way::ALL.iter().map(|_| Vec::new()).collect();
    for round in 0..options.rounds {
        for offset in 0..Way::ALL.len() {
            let index = (round + offset) % Way::ALL.len();
            let way = Way::ALL[index];
            if way != Way::Raw && !options.ways.contains(way.letter()) {
                continue;
            }
            let stream = format!("e2e-publish-{round}-{index}");
            create_stream_shards(&client, &stream, SHARDS).await?;
            let calls = Arc::new(AtomicUsize::new(0));
            let (client_before, emulator_before) = (cpu.seconds("self"), cpu.seconds(&pid));
            let started = Instant::now();
            publish(way, &client, &stream, &options, &calls).await?;
            let elapsed = started.elapsed().as_secs_f64();
            let per_100k = 100_000.0 / options.records as f64;
            let sample = Sample {
                records_per_second: options.records as f64 / elapsed,
                client_cpu: (cpu.seconds("self") - client_before) * per_100k,
                emulator_cpu: (cpu.seconds(&pid) - emulator_before) * per_100k,
                calls: calls.load(Ordering::Relaxed),
            };
            println!(
                "round {round}: {:<48} {:>9.0} records/s",
                way.label(),
                sample.records_per_second
            );
            samples[index].push(sample);
        }
    }
    report(&samples, options.rounds);
    Ok(())
}

fn report(samples: &[Vec<Sample>], rounds: usize) {
    println!(
        "\n| way | records/s (median) | ratio to (a) (median of rounds) | PutRecords calls | client CPU s / 100k | emulator CPU s / 100k |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (index, way) in Way::ALL.iter().enumerate() {
        let mine = &samples[index];
        if mine.is_empty() {
            continue;
        }
        let ratios: Vec<f64> = (0..rounds)
            .map(|r| mine[r].records_per_second / samples[0][r].records_per_second)
            .collect();
        println!(
            "| {} | {:.0} | {:.2} | {} | {:.3} | {:.3} |",
            way.label(),
            median(mine.iter().map(|s| s.records_per_second).collect()),
            median(ratios),
            median(mine.iter().map(|s| s.calls as f64).collect()),
            median(mine.iter().map(|s| s.client_cpu).collect()),
            median(mine.iter().map(|s| s.emulator_cpu).collect()),
        );
    }
}

fn payload(i: usize) -> Vec<u8> {
    let mut data = format!("record {i:012}:").into_bytes();
    data.resize(RECORD_BYTES, b'.');
    data
}

fn key(i: usize) -> String {
    format!("key-{}", i % KEYS)
}

async fn publish(
    way: Way,
    client: &Client,
    stream: &str,
    options: &Options,
    calls: &Arc<AtomicUsize>,
) -> Result<()> {
    let n = options.records;
    let counting = counting_kinesis(Arc::new(AwsKinesis::new(client.clone())));
    let publisher = Publisher::new(counting.clone(), stream);
    let mut tasks = tokio::task::JoinSet::new();
    match way {
        Way::Raw | Way::Batch => {
            let batches: Vec<std::ops::Range<usize>> = (0..n)
                .step_by(PUT_BATCH)
                .map(|start| start..(start + PUT_BATCH).min(n))
                .collect();
            let next = Arc::new(AtomicUsize::new(0));
            let batches = Arc::new(batches);
            for _ in 0..BATCHES_IN_FLIGHT {
                let (client, stream, publisher) =
                    (client.clone(), stream.to_owned(), publisher.clone());
                let (next, batches, calls) = (next.clone(), batches.clone(), calls.clone());
                tasks.spawn(async move {
                    loop {
                        let Some(range) = batches.get(next.fetch_add(1, Ordering::Relaxed))
                        else {
                            return Ok::<(), String>(());
                        };
                        if way == Way::Raw {
                            calls.fetch_add(1, Ordering::Relaxed);
                            let entries = range
                                .clone()
                                .map(|i| entry(key(i), payload(i)))
                                .collect::<Result<Vec<_>>>()
                                .map_err(|e| e.to_string())?;
                            put_entries(&client, &stream, entries)
                                .await
                                .map_err(|e| e.to_string())?;
                        } else {
                            let records = range
                                .clone()
                                .map(|i| OutgoingRecord::new(key(i), payload(i)))
                                .collect();
                            publisher
                                .publish_batch(records)
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                    }
                });
            }
        }
        Way::Single | Way::Collected => {
            let publisher = if way == Way::Collected {
                let settings = options
                    .linger
                    .map_or_else(Collect::default, |l| Collect::default().linger(l));
                publisher.collect(settings)
            } else {
                publisher
            };
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..TASKS {
                let (publisher, next) = (publisher.clone(), next.clone());
                tasks.spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok::<(), String>(());
                        }
                        publisher
                            .publish(key(i), payload(i))
                            .await
                            .map_err(|e| e.to_string())?;
                    }
                });
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    if way != Way::Raw {
        let made = counting.layer().counts().put_records;
        calls.store(usize::try_from(made).unwrap_or(usize::MAX), Ordering::Relaxed);
    }
    Ok(())
}
