//! Publishing benchmark: kinesis-dataflow's `Publisher` over the AWS SDK against ferrokinesis.
//!
//! ```text
//! cargo run --release --manifest-path benches/e2e/Cargo.toml --bin publish -- [--quick] [--records N] [--limited-records M] [--rounds R] [--linger-ms L] [--tasks T] [--lone L] [--ways abcdefghi]
//! ```
//!
//! The binary starts ferrokinesis (embedded, in a child process of its own, as the drain
//! does) and publishes records of 100 bytes under 1,000 partition keys into a fresh 4-shard
//! stream per way and round, in a rotating order over the rounds. Without write limits
//! (N records a way, default 100,000):
//!
//! * (a) baseline: the raw SDK, PutRecords calls of 500 entries, 4 calls in flight (a task
//!   each), refused entries sent again after 100 ms;
//! * (b) `Publisher::publish_batch` of 500 records, 4 in flight;
//! * (c) `Publisher::publish`, one record per call, from 64 tasks (`--tasks`), each awaiting its
//!   publish before the next (the shape of a handler that publishes what it handles), with
//!   collection off (`Publisher::without_collect`): one PutRecords call per record;
//! * (d) the same with the default publisher, which collects (`Collect` defaults unless
//!   `--linger-ms` is given): the 64 tasks' publishes share PutRecords calls;
//! * (i) the raw SDK in (c)'s shape: T tasks, one record per PutRecords call (what a call
//!   costs the SDK alone).
//!
//! And (h), a lone publisher's latency: one task publishing one record at a time, awaiting
//! each (L publishes each, default 2,000), the default publisher against one without
//! collection, interleaved in blocks of 50; it prints each one's p50 and p99 and their ratio.
//!
//! Then against a second emulator with the service's per-shard write limits (ferrokinesis's
//! `--enforce-limits`: 1,000 records and 1 MiB a second per shard), 16 batches in flight, M
//! records a way (default 20,000):
//!
//! * (e) baseline: the raw SDK loop;
//! * (f) `publish_batch` of 500 plain records;
//! * (g) `publish_batch` of 500 through an aggregating publisher (`Publisher::aggregate`,
//!   defaults: aggregates of up to 50 KiB per predicted shard), 10 M user records.
//!
//! It prints, per group, each way's median records/s (user records for (g)), the median of the
//! per-round ratios to the group's baseline, the PutRecords calls made, and the CPU seconds per
//! 100,000 records of this process and of the emulator. Times are reported, never asserted on.
//! While a way publishes, a progress line goes to stderr every few seconds (records so far
//! against the way's count, the round).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use kinesis_dataflow::publish::{Aggregate, Collect};
use kinesis_dataflow::{AwsKinesis, OutgoingRecord, Publisher};
use kinesis_dataflow_e2e::{
    CpuClock, Emulator, PUT_BATCH, Progress, RECORD_BYTES, Result, SERVE_EMULATOR,
    counting_kinesis, entry, median, serve_emulator,
};
use kinesis_dataflow_test_support::{create_stream_shards, sdk_config_at};

const SHARDS: usize = 4;
const KEYS: usize = 1_000;
const BATCHES_IN_FLIGHT: usize = 4;
/// Batches in flight against the write limits: enough records on their way to keep 4 shards
/// at their limit through the backoffs of throttled entries.
const LIMITED_IN_FLIGHT: usize = 16;
const DEFAULT_TASKS: usize = 64;
const DEFAULT_RECORDS: usize = 100_000;
const DEFAULT_LIMITED_RECORDS: usize = 20_000;
/// The aggregated way against the limits publishes this many times the plain ways' records
/// (it stores about that many times as fast).
const AGGREGATED_FACTOR: usize = 10;
const DEFAULT_ROUNDS: usize = 3;
const QUICK_RECORDS: usize = 10_000;
const QUICK_LIMITED_RECORDS: usize = 2_000;

const DEFAULT_LONE: usize = 2_000;
const QUICK_LONE: usize = 200;

const USAGE: &str = "usage: publish [--quick] [--records N] [--limited-records M] [--rounds R] \
                     [--linger-ms L] [--tasks T] [--lone L] [--ways abcdefghi]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Way {
    Raw,
    Batch,
    Single,
    Collected,
    RawSingle,
    RawLimited,
    BatchLimited,
    AggregatedLimited,
}

impl Way {
    /// The ways against the emulator without write limits, (a) first: their baseline.
    const FREE: [Way; 5] = [
        Way::Raw,
        Way::Batch,
        Way::Single,
        Way::Collected,
        Way::RawSingle,
    ];
    /// The ways against the emulator with the per-shard write limits, (e) first.
    const LIMITED: [Way; 3] = [Way::RawLimited, Way::BatchLimited, Way::AggregatedLimited];

    fn letter(self) -> char {
        match self {
            Way::Raw => 'a',
            Way::Batch => 'b',
            Way::Single => 'c',
            Way::Collected => 'd',
            Way::RawSingle => 'i',
            Way::RawLimited => 'e',
            Way::BatchLimited => 'f',
            Way::AggregatedLimited => 'g',
        }
    }

    fn label(self) -> &'static str {
        match self {
            Way::Raw => "(a) raw SDK PutRecords, 500 a call, 4 in flight",
            Way::Batch => "(b) publish_batch of 500, 4 in flight",
            Way::Single => "(c) publish, one record each, T tasks, without_collect",
            Way::Collected => "(d) publish, one record each, T tasks, collected (default)",
            Way::RawSingle => "(i) raw SDK PutRecords, one record a call, T tasks",
            Way::RawLimited => "(e) limits: raw SDK PutRecords, 500 a call, 16 in flight",
            Way::BatchLimited => "(f) limits: publish_batch of 500, 16 in flight",
            Way::AggregatedLimited => "(g) limits: publish_batch of 500, 16 in flight, aggregated",
        }
    }

    fn records(self, options: &Options) -> usize {
        match self {
            Way::Raw | Way::Batch | Way::Single | Way::Collected | Way::RawSingle => {
                options.records
            }
            Way::RawLimited | Way::BatchLimited => options.limited_records,
            Way::AggregatedLimited => options.limited_records * AGGREGATED_FACTOR,
        }
    }
}

struct Options {
    records: usize,
    limited_records: usize,
    rounds: usize,
    linger: Option<Duration>,
    /// Tasks publishing one record at a time in (c) and (d).
    tasks: usize,
    /// Records per PutRecords call in (d) (default: the service's 500).
    call_records: Option<usize>,
    /// The letters of the ways to run (each group's baseline, (a) or (e), runs with its group).
    ways: String,
    /// Publishes of each publisher in (h).
    lone: usize,
}

impl Options {
    fn parse(args: &[String]) -> std::result::Result<Self, String> {
        let mut options = Self {
            records: DEFAULT_RECORDS,
            limited_records: DEFAULT_LIMITED_RECORDS,
            rounds: DEFAULT_ROUNDS,
            linger: None,
            tasks: DEFAULT_TASKS,
            call_records: None,
            ways: "abcdefghi".into(),
            lone: DEFAULT_LONE,
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
                    options.limited_records = QUICK_LIMITED_RECORDS;
                    options.rounds = 1;
                    options.lone = QUICK_LONE;
                }
                "--lone" => options.lone = number("--lone")?.max(50),
                "--records" => options.records = number("--records")?.max(1),
                "--limited-records" => {
                    options.limited_records = number("--limited-records")?.max(1);
                }
                "--rounds" => options.rounds = number("--rounds")?.max(1),
                "--linger-ms" => {
                    options.linger = Some(Duration::from_millis(number("--linger-ms")? as u64));
                }
                "--tasks" => options.tasks = number("--tasks")?.max(1),
                "--call-records" => options.call_records = Some(number("--call-records")?),
                "--ways" => {
                    options.ways = args.next().cloned().ok_or("--ways needs letters")?;
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        Ok(options)
    }

    /// The ways of `group` to run: its baseline, and the others asked for (none at all
    /// when none of them is).
    fn selected(&self, group: &[Way]) -> Vec<Way> {
        if !group.iter().any(|w| self.ways.contains(w.letter())) {
            return Vec::new();
        }
        group
            .iter()
            .enumerate()
            .filter(|(i, w)| *i == 0 || self.ways.contains(w.letter()))
            .map(|(_, w)| *w)
            .collect()
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
    println!(
        "publishing records of {RECORD_BYTES} bytes under {KEYS} keys to {SHARDS} shards, {} \
         rounds, T = {} tasks: {} records a way without write limits, {} with them ({} \
         aggregated)",
        options.rounds,
        options.tasks,
        options.records,
        options.limited_records,
        options.limited_records * AGGREGATED_FACTOR
    );
    for (group, limited) in [(&Way::FREE[..], false), (&Way::LIMITED[..], true)] {
        let ways = options.selected(group);
        if ways.is_empty() {
            continue;
        }
        let emulator = if limited {
            Emulator::start_enforcing_limits()?
        } else {
            Emulator::start()?
        };
        let samples = run_group(&emulator, &ways, &options).await?;
        report(&ways, &samples, options.rounds, &options);
    }
    if options.ways.contains('h') {
        lone(&Emulator::start()?, options.lone).await?;
    }
    Ok(())
}

/// (h): one task publishing one record at a time, `count` publishes with the default
/// (collecting) publisher and `count` without collection, interleaved in blocks of 50 after
/// a warm-up; prints each one's p50 and p99 and the ratio of the p50s.
async fn lone(emulator: &Emulator, count: usize) -> Result<()> {
    let client = Client::new(&sdk_config_at(&emulator.endpoint()));
    let stream = "e2e-publish-lone";
    create_stream_shards(&client, stream, SHARDS).await?;
    let api: kinesis_dataflow::api::SharedKinesis = Arc::new(AwsKinesis::new(client));
    let publishers = [
        Publisher::new(api.clone(), stream),
        Publisher::new(api, stream).without_collect(),
    ];
    for publisher in &publishers {
        for i in 0..50 {
            publisher.publish(key(i), payload(i)).await?;
        }
    }
    let mut times: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut i = 0;
    while times[0].len() < count {
        for (which, publisher) in publishers.iter().enumerate() {
            for _ in 0..50 {
                let started = Instant::now();
                publisher.publish(key(i), payload(i)).await?;
                times[which].push(started.elapsed().as_secs_f64() * 1e6);
                i += 1;
            }
        }
    }
    let quantile = |values: &[f64], q: f64| {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[((sorted.len() - 1) as f64 * q).round() as usize]
    };
    println!(
        "\n| (h) a lone publish, {} each | p50 µs | p99 µs |",
        times[0].len()
    );
    println!("|---|---:|---:|");
    for (name, values) in [
        ("default (collected)", &times[0]),
        ("without_collect", &times[1]),
    ] {
        println!(
            "| {name} | {:.0} | {:.0} |",
            quantile(values, 0.5),
            quantile(values, 0.99)
        );
    }
    println!(
        "p50 ratio, collected / without_collect: {:.2}",
        quantile(&times[0], 0.5) / quantile(&times[1], 0.5)
    );
    Ok(())
}

/// Runs `ways` (the baseline first) for every round against `emulator`, in a rotating order.
async fn run_group(
    emulator: &Emulator,
    ways: &[Way],
    options: &Options,
) -> Result<Vec<Vec<Sample>>> {
    let config = sdk_config_at(&emulator.endpoint());
    let client = Client::new(&config);
    let cpu = CpuClock::new();
    let pid = emulator.pid().to_string();
    let mut samples: Vec<Vec<Sample>> = ways.iter().map(|_| Vec::new()).collect();
    for round in 0..options.rounds {
        for offset in 0..ways.len() {
            let index = (round + offset) % ways.len();
            let way = ways[index];
            let stream = format!("e2e-publish-{}-{round}", way.letter());
            create_stream_shards(&client, &stream, SHARDS).await?;
            let calls = Arc::new(AtomicUsize::new(0));
            let records = way.records(options);
            let (client_before, emulator_before) = (cpu.seconds("self"), cpu.seconds(&pid));
            let started = Instant::now();
            // Rounds counted from 0, as the figures above name them.
            let label = format!(
                "publish, round {round} ({}/{}), {}",
                round + 1,
                options.rounds,
                way.label()
            );
            publish(way, &client, &stream, records, options, &calls, label).await?;
            let elapsed = started.elapsed().as_secs_f64();
            let per_100k = 100_000.0 / records as f64;
            let sample = Sample {
                records_per_second: records as f64 / elapsed,
                client_cpu: (cpu.seconds("self") - client_before) * per_100k,
                emulator_cpu: (cpu.seconds(&pid) - emulator_before) * per_100k,
                calls: calls.load(Ordering::Relaxed),
            };
            println!(
                "round {round}: {:<62} {:>9.0} records/s",
                way.label(),
                sample.records_per_second
            );
            samples[index].push(sample);
        }
    }
    Ok(samples)
}

fn report(ways: &[Way], samples: &[Vec<Sample>], rounds: usize, options: &Options) {
    println!(
        "\n| way | records | records/s (median) | ratio to {} (median of rounds) | PutRecords calls | client CPU s / 100k | emulator CPU s / 100k |",
        ways[0].label().split(' ').next().unwrap_or_default()
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for (index, way) in ways.iter().enumerate() {
        let mine = &samples[index];
        let ratios: Vec<f64> = (0..rounds)
            .map(|r| mine[r].records_per_second / samples[0][r].records_per_second)
            .collect();
        println!(
            "| {} | {} | {:.0} | {:.2} | {} | {:.3} | {:.3} |",
            way.label(),
            way.records(options),
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
    n: usize,
    options: &Options,
    calls: &Arc<AtomicUsize>,
    progress: String,
) -> Result<()> {
    let counting = counting_kinesis(Arc::new(AwsKinesis::new(client.clone())));
    let mut publisher = Publisher::new(counting.clone(), stream);
    let limited = Way::LIMITED.contains(&way);
    if way == Way::AggregatedLimited {
        if let Some(linger) = options.linger {
            publisher = publisher.collect(Collect::default().linger(linger));
        }
        publisher = publisher.aggregate(Aggregate::default());
    }
    let mut tasks = tokio::task::JoinSet::new();
    // Records published so far, for the progress line: the single ways' shared index (records
    // taken, at most one a task ahead of those stored), the batch ways' finished batches.
    let done = Arc::new(AtomicUsize::new(0));
    let _progress = Progress::count(progress, n as u64, "records", {
        let done = done.clone();
        move || done.load(Ordering::Relaxed).min(n) as u64
    });
    match way {
        Way::RawSingle => {
            let next = done.clone();
            for _ in 0..options.tasks {
                let (client, stream, next, calls) = (
                    client.clone(),
                    stream.to_owned(),
                    next.clone(),
                    calls.clone(),
                );
                tasks.spawn(async move {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= n {
                            return Ok::<(), String>(());
                        }
                        let one = entry(key(i), payload(i)).map_err(|e| e.to_string())?;
                        put_until_stored(&client, &stream, vec![one], &calls).await?;
                    }
                });
            }
        }
        Way::Single | Way::Collected => {
            let publisher = if way == Way::Collected {
                let publisher = match options.call_records {
                    Some(records) => publisher.max_records_per_call(records),
                    None => publisher,
                };
                match options.linger {
                    Some(linger) => publisher.collect(Collect::default().linger(linger)),
                    None => publisher,
                }
            } else {
                publisher.without_collect()
            };
            let next = done.clone();
            for _ in 0..options.tasks {
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
        _ => {
            let batches: Arc<Vec<std::ops::Range<usize>>> = Arc::new(
                (0..n)
                    .step_by(PUT_BATCH)
                    .map(|start| start..(start + PUT_BATCH).min(n))
                    .collect(),
            );
            let next = Arc::new(AtomicUsize::new(0));
            let raw = matches!(way, Way::Raw | Way::RawLimited);
            let in_flight = if limited {
                LIMITED_IN_FLIGHT
            } else {
                BATCHES_IN_FLIGHT
            };
            for _ in 0..in_flight {
                let (client, stream, publisher) =
                    (client.clone(), stream.to_owned(), publisher.clone());
                let (next, batches, calls) = (next.clone(), batches.clone(), calls.clone());
                let done = done.clone();
                tasks.spawn(async move {
                    loop {
                        let Some(range) = batches.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return Ok::<(), String>(());
                        };
                        if raw {
                            let entries = range
                                .clone()
                                .map(|i| entry(key(i), payload(i)))
                                .collect::<Result<Vec<_>>>()
                                .map_err(|e| e.to_string())?;
                            put_until_stored(&client, &stream, entries, &calls).await?;
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
                        done.fetch_add(range.len(), Ordering::Relaxed);
                    }
                });
            }
        }
    }
    while let Some(done) = tasks.join_next().await {
        done??;
    }
    if !matches!(way, Way::Raw | Way::RawLimited | Way::RawSingle) {
        let made = counting.layer().counts().put_records;
        calls.store(
            usize::try_from(made).unwrap_or(usize::MAX),
            Ordering::Relaxed,
        );
    }
    Ok(())
}

/// The raw loop's PutRecords: refused entries are sent again after 100 ms (the publisher's
/// first backoff) until every one is stored.
async fn put_until_stored(
    client: &Client,
    stream: &str,
    mut pending: Vec<PutRecordsRequestEntry>,
    calls: &AtomicUsize,
) -> std::result::Result<(), String> {
    loop {
        calls.fetch_add(1, Ordering::Relaxed);
        let out = client
            .put_records()
            .stream_name(stream)
            .set_records(Some(pending.clone()))
            .send()
            .await
            .map_err(|e| format!("PutRecords: {e:?}"))?;
        pending = pending
            .into_iter()
            .zip(out.records)
            .filter(|(_, result)| result.error_code.is_some())
            .map(|(entry, _)| entry)
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
