//! End-to-end drain benchmark: kinesis-dataflow over the AWS SDK against ferrokinesis.
//!
//! ```text
//! cargo run --release --manifest-path benches/e2e/Cargo.toml -- [--quick] [--records N] [--rounds R] [--diagnose]
//! ```
//!
//! The binary starts ferrokinesis (embedded as a library) in a child process of its own (itself,
//! run as `drain --serve-emulator`), so the CPU time read from `/proc/self/stat` is the
//! client's alone. It creates a 4-shard stream, loads a backlog of N 100-byte records with
//! PutRecords (500 a call, several calls in flight, spread over the shards by partition key),
//! then drains the backlog from TRIM_HORIZON five ways (seven with `--diagnose`), in a rotating
//! order over the rounds:
//!
//! * (a) baseline: the raw SDK, one tokio task per shard, GetShardIterator then GetRecords
//!   (Limit 10,000) along NextShardIterator until the shard's share of the backlog is read;
//! * (b) `Subscription` over `AwsKinesis` with a fresh `MemoryLeaseStore` and owner each round
//!   (with `--dynamodb`, a `DynamoLeaseStore` table of its own in dynalite), every delivery
//!   acknowledged through the `AckSink`;
//! * (c) four `ShardStream`s merged with `futures::stream::select_all`;
//! * (d) only with `--diagnose`: four `ShardStream`s, each drained on a tokio task of its own
//!   (the shape of (a)), which separates the reader's own cost from that of one task driving
//!   every shard;
//! * (e) the RustStream broker face: an app on `KinesisBroker` (the SDK configuration of the
//!   others, in-memory leases, a fresh broker each round) with one trivial handler that counts
//!   each record's bytes and acks it, timed from `start()` to the N-th handled record;
//! * (f) (b) reading with enhanced fan-out (`ReadSettings::fan_out`): the records are pushed
//!   through SubscribeToShard instead of polled;
//! * (g) only with `--diagnose`: (b) with `ReadSettings::background_reads(false)`, every
//!   GetRecords polled by the consuming task instead of a task of its own;
//! * (h) only with `--diagnose`: (b) consumed by a plain loop, `next().await` then
//!   `Delivery::ack`, without the combinators and the `AckSink`: what the subscription
//!   itself costs, apart from the pipeline a user builds on it.
//!
//! It prints, per way, the median records/s, the median of the per-round ratios to (a), and
//! the CPU seconds per 100,000 records of this process and of the emulator process. Times are
//! reported, never asserted on. While a load or a drain runs, a progress line goes to stderr
//! every few seconds (records so far against the target, the round).

use std::collections::BTreeMap;
use std::future::{Future, ready};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_config::SdkConfig;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::ShardIteratorType;
use futures::{StreamExt, TryStreamExt};
use kinesis_dataflow::api::SharedKinesis;
use kinesis_dataflow::broker::{KinesisBroker, KinesisStream};
use kinesis_dataflow::lease::SharedLeaseStore;
use kinesis_dataflow::publish::Aggregate;
use kinesis_dataflow::{
    AckSink, AwsKinesis, DeliveryStreamExt, DynamoLeaseStore, KinesisPosition, MemoryLeaseStore,
    ReadSettings, ShardStream, StartingPoint, Subscription,
};
use kinesis_dataflow::{OutgoingRecord, Publisher};
use kinesis_dataflow_e2e::{
    BoxError, CpuClock, Emulator, Frame, PUT_BATCH, Progress, RECORD_BYTES, Result, SERVE_EMULATOR,
    entry, median, monotonic_ns, put_entries, serve_emulator,
};
use kinesis_dataflow_test_support::{
    Kind, create_stream_shards, dynamodb_client_at, ensure_npm_packages, sdk_config_at,
};
use ruststream::runtime::{AppInfo, Context, Handle, HandlerOutcome, RustStream, subscriber};

const STREAM: &str = "e2e-drain";
const SHARDS: usize = 4;
const PUTS_IN_FLIGHT: usize = 4;
const GET_LIMIT: u32 = 10_000;
const DEFAULT_RECORDS: usize = 200_000;
/// As many rounds as the default ways: each way runs once in each position of the order.
const DEFAULT_ROUNDS: usize = 5;
const QUICK_RECORDS: usize = 20_000;
/// A drain that takes longer than this has stalled (the emulator serves 200,000 records in
/// a few seconds).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == SERVE_EMULATOR) {
        return serve_emulator();
    }
    // The library's tracing on stdout when RUST_LOG asks for it (to see why a drain stalls);
    // without it no subscriber is installed, so the measured ways pay nothing for it.
    if std::env::var_os("RUST_LOG").is_some() {
        kinesis_dataflow_test_support::init_tracing();
    }
    let options = match Options::parse(&args) {
        Ok(options) => options,
        Err(message) => {
            eprintln!("{message}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    if options.help {
        println!("{USAGE}");
        return Ok(());
    }
    // The same runtime for every way: 2 workers, the machine's core count.
    kinesis_dataflow_e2e::runtime()?.block_on(run(options))
}

const USAGE: &str = "\
drain: end-to-end drain benchmark of kinesis-dataflow against ferrokinesis

usage: cargo run --release --manifest-path benches/e2e/Cargo.toml -- [options]

  --records N   backlog size, 100-byte records (default 200000)
  --rounds R    timed rounds; each round drains the backlog once per way (default 5)
  --quick       smoke run: --records 20000 --rounds 1
  --diagnose    also time (d): 4 ShardReaders, each drained on a task of its own,
                (g): (b) with every read polled by the consuming task, and (h): (b)
                consumed by a loop of next() and ack(), without combinators or AckSink
  --ways LETTERS
                only these ways (e.g. `b`, for a profile); the baseline (a) always runs
  --aggregated  load the backlog as KPL aggregates of up to 100 user records (this crate's
                aggregating publisher, packed per shard); the library's ways de-aggregate,
                the raw loop reads the aggregates as they are
  --endpoint URL
                drain a Kinesis already running at URL (e.g. kinesis-local, see
                benches/e2e/kinesis-local.sh) instead of starting ferrokinesis
  --emulator-pid PID
                with --endpoint: the emulator's process, for its CPU column
  --lease-duration SECS
                the lease duration and worker timeout of ways (b), (f), (g) and (h) (default the
                library's, 10 s and 4 s); under valgrind, where the client runs some 50 times
                slower than the clock, longer ones keep a lease or the worker row from lapsing
                mid-drain and its shards' records from being read twice
  --dynamodb    the leases of ways (b), (f), (g) and (h) in DynamoDB (dynalite, started from
                harness/'s npm lockfile, a table per drain) instead of in memory
  --windows     print each timed window on CLOCK_MONOTONIC (`window (b) FROM TO`, in ns), to
                cut a `perf record -k CLOCK_MONOTONIC` profile by way (benches/e2e/perf-ways.sh)
  --help        this text

ways: (a) raw SDK loop (the baseline), (b) Subscription + AckSink, (c) 4 ShardReaders merged
with select_all, (e) a RustStream app on KinesisBroker, (f) (b) reading with enhanced fan-out;
(d), (g) and (h) with --diagnose.";

#[derive(Debug)]
struct Options {
    records: usize,
    rounds: usize,
    help: bool,
    /// Only these ways (letters), the baseline (a) always among them.
    only: Option<String>,
    /// Adds way (d).
    diagnose: bool,
    /// The backlog is KPL aggregates of up to 100 user records.
    aggregated: bool,
    /// A Kinesis already running there, instead of a ferrokinesis child.
    endpoint: Option<String>,
    /// That Kinesis's process id, for its CPU.
    emulator_pid: Option<String>,
    /// The subscription ways' lease duration and worker timeout, when not the library's
    /// defaults.
    lease_duration: Option<Duration>,
    /// Print each timed window on `CLOCK_MONOTONIC` (for cutting a `perf` profile by way).
    windows: bool,
    /// The subscription ways keep their leases in DynamoDB (dynalite) instead of in memory.
    dynamodb: bool,
    /// The arguments as given, for the command line the report repeats.
    given: Vec<String>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut options = Options {
            records: DEFAULT_RECORDS,
            rounds: DEFAULT_ROUNDS,
            help: false,
            only: None,
            diagnose: false,
            aggregated: false,
            endpoint: None,
            emulator_pid: None,
            lease_duration: None,
            windows: false,
            dynamodb: false,
            given: args.to_vec(),
        };
        let (mut records, mut rounds) = (None, None);
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut number = |name: &str| -> Result<usize, String> {
                let value = it.next().ok_or_else(|| format!("{name} needs a value"))?;
                match value.replace('_', "").parse::<usize>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!("{name}: `{value}` is not a positive number")),
                }
            };
            match arg.as_str() {
                "--records" => records = Some(number("--records")?),
                "--rounds" => rounds = Some(number("--rounds")?),
                "--quick" => {
                    options.records = QUICK_RECORDS;
                    options.rounds = 1;
                }
                "--diagnose" => options.diagnose = true,
                "--ways" => {
                    let letters = it.next().ok_or("--ways needs letters, e.g. ab")?;
                    if let Some(bad) = letters.chars().find(|c| !"abcdefgh".contains(*c)) {
                        return Err(format!("--ways: `{bad}` is not one of a b c d e f g h"));
                    }
                    options.only = Some(letters.to_owned());
                }
                "--aggregated" => options.aggregated = true,
                "--windows" => options.windows = true,
                "--dynamodb" => options.dynamodb = true,
                "--endpoint" => {
                    options.endpoint = Some(it.next().ok_or("--endpoint needs a URL")?.to_owned());
                }
                "--emulator-pid" => {
                    options.emulator_pid =
                        Some(it.next().ok_or("--emulator-pid needs a pid")?.to_owned());
                }
                "--lease-duration" => {
                    options.lease_duration =
                        Some(Duration::from_secs(number("--lease-duration")? as u64));
                }
                "--help" | "-h" => options.help = true,
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        options.records = records.unwrap_or(options.records);
        options.rounds = rounds.unwrap_or(options.rounds);
        Ok(options)
    }
}

// ---------------------------------------------------------------------------------------------
// The run
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Way {
    Sdk,
    Subscription,
    SelectAll,
    TaskPerReader,
    BrokerFace,
    FanOut,
    InlineReads,
    AckLoop,
}

impl Way {
    const ALL: [Way; 8] = [
        Way::Sdk,
        Way::Subscription,
        Way::SelectAll,
        Way::TaskPerReader,
        Way::BrokerFace,
        Way::FanOut,
        Way::InlineReads,
        Way::AckLoop,
    ];
    /// The ways of a run without `--diagnose`, in the first round's order.
    const DEFAULT: [Way; 5] = [
        Way::Sdk,
        Way::Subscription,
        Way::SelectAll,
        Way::BrokerFace,
        Way::FanOut,
    ];
    /// The ways of a `--diagnose` run, in the first round's order.
    const DIAGNOSE: [Way; 8] = [
        Way::Sdk,
        Way::Subscription,
        Way::SelectAll,
        Way::TaskPerReader,
        Way::BrokerFace,
        Way::FanOut,
        Way::InlineReads,
        Way::AckLoop,
    ];

    /// The way's letter, as `--ways` names it.
    fn letter(self) -> char {
        match self {
            Way::Sdk => 'a',
            Way::Subscription => 'b',
            Way::SelectAll => 'c',
            Way::TaskPerReader => 'd',
            Way::BrokerFace => 'e',
            Way::FanOut => 'f',
            Way::InlineReads => 'g',
            Way::AckLoop => 'h',
        }
    }

    fn label(self) -> &'static str {
        match self {
            Way::Sdk => "(a) raw SDK, a task per shard",
            Way::Subscription => "(b) Subscription + AckSink",
            Way::SelectAll => "(c) 4 ShardReaders, select_all",
            Way::TaskPerReader => "(d) 4 ShardReaders, a task each",
            Way::BrokerFace => "(e) RustStream app, KinesisBroker",
            Way::FanOut => "(f) Subscription + AckSink, enhanced fan-out",
            Way::InlineReads => "(g) Subscription + AckSink, reads polled inline",
            Way::AckLoop => "(h) Subscription, next() + ack()",
        }
    }
}

/// One timed drain.
#[derive(Debug, Clone, Copy)]
struct Sample {
    seconds: f64,
    /// The timed window on `CLOCK_MONOTONIC`, nanoseconds from and to.
    window: (u64, u64),
    records: usize,
    client_cpu: f64,
    emulator_cpu: f64,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.records as f64 / self.seconds
    }
}

/// What a drain read: records, their bytes, and error items seen on the way.
#[derive(Debug, Default)]
struct Drained {
    records: usize,
    bytes: usize,
    errors: usize,
    /// When the last record was taken, if untimed clean-up followed it.
    end: Option<Mark>,
}

/// A point on the wall clock and on both processes' CPU clocks.
#[derive(Debug, Clone, Copy)]
struct Mark {
    at: Instant,
    /// `CLOCK_MONOTONIC` in nanoseconds, for `--windows`.
    monotonic: u64,
    client_cpu: f64,
    emulator_cpu: f64,
}

struct Bench {
    client: Client,
    /// The SDK configuration of `client`, for the broker face's own clients.
    config: SdkConfig,
    endpoint: String,
    api: SharedKinesis,
    /// Each shard's share of the backlog in Kinesis records (aggregates, with
    /// `--aggregated`), by shard id.
    backlog: BTreeMap<String, usize>,
    /// The backlog in (user) records.
    records: usize,
    /// The backlog is aggregated: the library's ways de-aggregate.
    aggregated: bool,
    cpu: CpuClock,
    emulator_pid: String,
    /// The records the running drain has read so far, for its progress line (reset by every
    /// drain; ways (b) and (e) count into it directly).
    seen: Arc<AtomicUsize>,
    /// Timed rounds, for the progress lines.
    rounds: usize,
    /// The subscription ways' lease duration and worker timeout, when not the library's
    /// defaults.
    lease_duration: Option<Duration>,
    /// With `--dynamodb`: the lease tables' DynamoDB (dynalite) and the emulator, kept running.
    dynamodb: Option<(
        aws_sdk_dynamodb::Client,
        kinesis_dataflow_test_support::Emulator,
    )>,
}

async fn run(options: Options) -> Result<()> {
    let cpu = CpuClock::new();
    let (emulator, endpoint, emulator_pid) = match &options.endpoint {
        Some(endpoint) => {
            println!(
                "Kinesis at {endpoint} (pid {}); client runtime: tokio multi-thread, 2 workers",
                options.emulator_pid.as_deref().unwrap_or("unknown")
            );
            (
                None,
                endpoint.clone(),
                options.emulator_pid.clone().unwrap_or_default(),
            )
        }
        None => {
            let emulator = Emulator::start()?;
            println!(
                "ferrokinesis 0.7 in a child process (pid {}, port {}); client runtime: tokio multi-thread, 2 workers",
                emulator.pid(),
                emulator.port
            );
            let (endpoint, pid) = (emulator.endpoint(), emulator.pid().to_string());
            (Some(emulator), endpoint, pid)
        }
    };
    let config = sdk_config_at(&endpoint);
    let client = Client::new(&config);
    let dynamodb = match options.dynamodb {
        true => {
            ensure_npm_packages()?;
            let logs = std::env::temp_dir().join(format!("e2e-drain-{}", std::process::id()));
            std::fs::create_dir_all(&logs)?;
            let dynalite =
                kinesis_dataflow_test_support::Emulator::start(Kind::DynamoDb, &logs).await?;
            println!(
                "leases of ways (b), (f), (g), (h) in DynamoDB: dynalite at {}",
                dynalite.endpoint()
            );
            Some((dynamodb_client_at(dynalite.endpoint()), dynalite))
        }
        false => None,
    };

    let shards = create_stream_shards(&client, STREAM, SHARDS).await?;
    let started = Instant::now();
    let backlog = if options.aggregated {
        load_aggregated(&client, options.records).await?
    } else {
        load(&client, options.records).await?
    };
    let load_seconds = started.elapsed().as_secs_f64();
    println!(
        "loaded {} records of {RECORD_BYTES} bytes{} in {load_seconds:.1} s ({:.0} records/s); Kinesis records per shard: {}",
        options.records,
        if options.aggregated {
            " in KPL aggregates"
        } else {
            ""
        },
        options.records as f64 / load_seconds,
        shards
            .iter()
            .map(|s| {
                let id = s.shard_id();
                format!("{id} {}", backlog.get(id).copied().unwrap_or(0))
            })
            .collect::<Vec<_>>()
            .join(", ")
    );

    let bench = Bench {
        api: Arc::new(AwsKinesis::new(client.clone())),
        client,
        config,
        endpoint,
        backlog,
        records: options.records,
        aggregated: options.aggregated,
        cpu,
        emulator_pid,
        seen: Arc::new(AtomicUsize::new(0)),
        rounds: options.rounds,
        lease_duration: options.lease_duration,
        dynamodb,
    };

    // One untimed drain first, so connection set-up and the emulator's first touches of its
    // store land on no way's account.
    bench.drain(Way::Sdk, 0).await?;

    let diagnostic = |o: &str| o.contains(['d', 'g', 'h']);
    let all = if options.diagnose || options.only.as_deref().is_some_and(diagnostic) {
        &Way::DIAGNOSE[..]
    } else {
        &Way::DEFAULT[..]
    };
    let ways: Vec<Way> = all
        .iter()
        .copied()
        .filter(|way| match &options.only {
            Some(only) => *way == Way::Sdk || only.contains(way.letter()),
            None => true,
        })
        .collect();
    let mut samples: BTreeMap<Way, Vec<Sample>> = BTreeMap::new();
    let mut ratios: BTreeMap<Way, Vec<f64>> = BTreeMap::new();
    for round in 0..options.rounds {
        // Rotate the order: over as many rounds as there are ways, each way runs once in
        // each position.
        let order: Vec<Way> = (0..ways.len())
            .map(|i| ways[(round + i) % ways.len()])
            .collect();
        let mut this_round = BTreeMap::new();
        for &way in &order {
            let sample = bench.drain(way, round + 1).await?;
            println!(
                "  round {} {:<34} {:>9.0} records/s  {:>6.2} s  client CPU {:>6.3} s  emulator CPU {:>6.3} s",
                round + 1,
                way.label(),
                sample.rate(),
                sample.seconds,
                sample.client_cpu,
                sample.emulator_cpu
            );
            if options.windows {
                let (from, to) = sample.window;
                println!("      window ({}) {from} {to}", way.letter());
            }
            this_round.insert(way, sample);
            samples.entry(way).or_default().push(sample);
        }
        let baseline = this_round[&Way::Sdk].rate();
        for (way, sample) in this_round {
            ratios
                .entry(way)
                .or_default()
                .push(sample.rate() / baseline);
        }
    }

    report(&options, &samples, &ratios);
    drop(emulator);
    Ok(())
}

/// Loads `records` 100-byte records, PutRecords of 500 with several calls in flight, and
/// returns how many landed on each shard.
async fn load(client: &Client, records: usize) -> Result<BTreeMap<String, usize>> {
    let batches: Vec<std::ops::Range<usize>> = (0..records)
        .step_by(PUT_BATCH)
        .map(|start| start..(start + PUT_BATCH).min(records))
        .collect();
    let loaded = Arc::new(AtomicUsize::new(0));
    let _progress = Progress::count("load", records as u64, "records", {
        let loaded = loaded.clone();
        move || loaded.load(Ordering::Relaxed) as u64
    });
    let loaded = &*loaded;
    let counts: Vec<BTreeMap<String, usize>> = futures::stream::iter(batches)
        .map(|range| async move {
            let len = range.len();
            // 100 bytes: the record's index, zero-padded, so every record differs.
            let entries = range
                .map(|i| {
                    let data = format!("{i:0>width$}", width = RECORD_BYTES);
                    entry(format!("pk-{i}"), data.into_bytes())
                })
                .collect::<Result<Vec<_>>>()?;
            let landed = put_entries(client, STREAM, entries).await;
            loaded.fetch_add(len, Ordering::Relaxed);
            landed
        })
        .buffer_unordered(PUTS_IN_FLIGHT)
        .try_collect()
        .await?;
    let mut backlog = BTreeMap::new();
    for count in counts {
        for (shard, n) in count {
            *backlog.entry(shard).or_default() += n;
        }
    }
    let stored: usize = backlog.values().sum();
    if stored != records {
        return Err(format!("stored {stored} records, wanted {records}").into());
    }
    Ok(backlog)
}

/// Loads `records` 100-byte user records in KPL aggregates of up to 100, packed per shard by
/// this crate's aggregating publisher, and returns how many aggregates landed on each shard.
async fn load_aggregated(client: &Client, records: usize) -> Result<BTreeMap<String, usize>> {
    let publisher = Publisher::new(Arc::new(AwsKinesis::new(client.clone())), STREAM)
        .aggregate(Aggregate::default().max_records(100));
    let mut aggregates = std::collections::BTreeSet::new();
    let loaded = Arc::new(AtomicUsize::new(0));
    let _progress = Progress::count("load (aggregated)", records as u64, "records", {
        let loaded = loaded.clone();
        move || loaded.load(Ordering::Relaxed) as u64
    });
    for start in (0..records).step_by(10_000) {
        let batch = (start..(start + 10_000).min(records))
            .map(|i| {
                let data = format!("{i:0>width$}", width = RECORD_BYTES);
                OutgoingRecord::new(format!("pk-{i}"), data)
            })
            .collect();
        for place in publisher.publish_batch(batch).await? {
            aggregates.insert((place.shard_id, place.sequence_number));
        }
        loaded.store((start + 10_000).min(records), Ordering::Relaxed);
    }
    let mut backlog = BTreeMap::new();
    for (shard, _) in aggregates {
        *backlog.entry(shard).or_default() += 1;
    }
    Ok(backlog)
}

/// What the broker face's handler counted, and the mark it took at the N-th record.
struct Tally {
    /// The bench's `seen` counter, so the progress line reads it.
    records: Arc<AtomicUsize>,
    bytes: AtomicUsize,
    target: usize,
    end: Mutex<Option<Mark>>,
    reached: tokio::sync::Notify,
    cpu: CpuClock,
    emulator_pid: String,
}

/// Way (e)'s handler: counts the record and its bytes, and acks it (`Ok(())`).
struct CountHandler(Arc<Tally>);

impl<'p> Handle<Frame<'p>> for CountHandler {
    fn handle(
        &self,
        frame: &Frame<'p>,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> + Send {
        let tally = &self.0;
        tally.bytes.fetch_add(frame.0.len(), Ordering::Relaxed);
        if tally.records.fetch_add(1, Ordering::Relaxed) + 1 == tally.target {
            let mark = Mark {
                at: Instant::now(),
                monotonic: monotonic_ns(),
                client_cpu: tally.cpu.seconds("self"),
                emulator_cpu: tally.cpu.seconds(&tally.emulator_pid),
            };
            *tally
                .end
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(mark);
            tally.reached.notify_one();
        }
        ready(Ok(()))
    }
}

impl Bench {
    fn read_settings(&self) -> ReadSettings {
        ReadSettings::default()
            .batch_size(GET_LIMIT)
            .unlimited_reads()
            .deaggregate(self.aggregated)
    }

    fn mark(&self) -> Mark {
        Mark {
            at: Instant::now(),
            monotonic: monotonic_ns(),
            client_cpu: self.cpu.seconds("self"),
            emulator_cpu: self.cpu.seconds(&self.emulator_pid),
        }
    }

    /// Drains the backlog once, `way`, and times it. `round` 0 is the warm-up.
    async fn drain(&self, way: Way, round: usize) -> Result<Sample> {
        self.seen.store(0, Ordering::Relaxed);
        let (target, unit) = if self.aggregated && way == Way::Sdk {
            (self.backlog.values().sum::<usize>(), "aggregates")
        } else {
            (self.records, "records")
        };
        let label = if round == 0 {
            format!("drain, warm-up, {}", way.label())
        } else {
            format!("drain, round {round}/{}, {}", self.rounds, way.label())
        };
        let seen = self.seen.clone();
        let _progress = Progress::count(label, target as u64, unit, move || {
            seen.load(Ordering::Relaxed) as u64
        });
        let start = self.mark();
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            match way {
                Way::Sdk => self.drain_sdk().await,
                Way::Subscription | Way::FanOut | Way::InlineReads | Way::AckLoop => {
                    self.drain_subscription(round, way).await
                }
                Way::SelectAll => self.drain_select_all().await,
                Way::TaskPerReader => self.drain_task_per_reader().await,
                Way::BrokerFace => self.drain_broker_face().await,
            }
        })
        .await
        .map_err(|_| {
            format!(
                "{} stalled: no full drain in {DRAIN_TIMEOUT:?}",
                way.label()
            )
        })??;
        let end = drained.end.unwrap_or_else(|| self.mark());
        let mut drained = drained;
        if self.aggregated && way == Way::Sdk {
            // It read every aggregate (`drain_sdk` counts them against the backlog): that is
            // every user record, in the raw loop's terms.
            drained.records = self.records;
            drained.bytes = self.records * RECORD_BYTES;
        }
        let sample = Sample {
            seconds: (end.at - start.at).as_secs_f64(),
            window: (start.monotonic, end.monotonic),
            records: drained.records,
            client_cpu: end.client_cpu - start.client_cpu,
            emulator_cpu: end.emulator_cpu - start.emulator_cpu,
        };
        if drained.records != self.records || drained.bytes != self.records * RECORD_BYTES {
            return Err(format!(
                "{} read {} records ({} bytes), the backlog holds {} ({} bytes)",
                way.label(),
                drained.records,
                drained.bytes,
                self.records,
                self.records * RECORD_BYTES
            )
            .into());
        }
        if drained.errors > 0 {
            eprintln!(
                "  note: {} saw {} error items (retried by the reader)",
                way.label(),
                drained.errors
            );
        }
        Ok(sample)
    }

    /// (a) The baseline: the SDK alone, one task per shard.
    async fn drain_sdk(&self) -> Result<Drained> {
        let tasks: Vec<_> = self
            .backlog
            .iter()
            .map(|(shard, &want)| {
                let client = self.client.clone();
                let shard = shard.clone();
                let seen = self.seen.clone();
                tokio::spawn(async move {
                    let mut iterator = client
                        .get_shard_iterator()
                        .stream_name(STREAM)
                        .shard_id(&shard)
                        .shard_iterator_type(ShardIteratorType::TrimHorizon)
                        .send()
                        .await?
                        .shard_iterator
                        .ok_or("GetShardIterator returned no iterator")?;
                    let mut drained = Drained::default();
                    while drained.records < want {
                        let out = client
                            .get_records()
                            .shard_iterator(iterator)
                            .limit(GET_LIMIT as i32)
                            .send()
                            .await?;
                        drained.records += out.records.len();
                        seen.fetch_add(out.records.len(), Ordering::Relaxed);
                        drained.bytes += out
                            .records
                            .iter()
                            .map(|r| r.data.as_ref().len())
                            .sum::<usize>();
                        iterator = out
                            .next_shard_iterator
                            .ok_or_else(|| format!("{shard} ended before its backlog was read"))?;
                    }
                    Ok::<_, BoxError>(drained)
                })
            })
            .collect();
        let mut total = Drained::default();
        for task in tasks {
            let drained = task.await??;
            total.records += drained.records;
            total.bytes += drained.bytes;
            total.errors += drained.errors;
        }
        Ok(total)
    }

    /// (b) The core: a subscription with in-memory leases (in DynamoDB with `--dynamodb`, a
    /// table per drain), every delivery acked; (f) the same reading with enhanced fan-out;
    /// (g) the same with every read polled by the consuming task instead of a task of its own.
    async fn drain_subscription(&self, round: usize, way: Way) -> Result<Drained> {
        let memory = MemoryLeaseStore::new();
        let leases: SharedLeaseStore = match &self.dynamodb {
            Some((client, _)) => Arc::new(DynamoLeaseStore::new(
                client.clone(),
                format!("e2e-drain-{round}-{}", way.letter()),
            )?),
            None => Arc::new(memory.clone()),
        };
        let settings = match way {
            Way::FanOut => self.read_settings().fan_out("e2e-drain"),
            Way::InlineReads => self.read_settings().background_reads(false),
            _ => self.read_settings(),
        };
        let mut builder = Subscription::builder(self.api.clone(), leases, STREAM)
            .owner(format!("e2e-drain-{round}"))
            .start_at(KinesisPosition::horizon())
            .read_settings(settings);
        if let Some(duration) = self.lease_duration {
            builder = builder.lease_duration(duration).worker_timeout(duration);
        }
        // Says where a drain that takes far longer than it should is stuck.
        let stage = Arc::new(AtomicUsize::new(STARTING));
        let watchdog = tokio::spawn(watch_stage(stage.clone(), way, self.seen.clone()));
        let _watchdog = AbortOnDrop(watchdog);
        let mut subscription = builder.start().await?;
        stage.store(READING, Ordering::Relaxed);
        // The pipeline a user writes (the README's, without the batches): errors counted
        // through `errors_to`, deliveries acked through `AckSink`. Counted in plain integers,
        // as the raw loop counts; the progress line's shared counter every 1,000 records.
        let seen = &*self.seen;
        let (mut records, mut bytes, mut errors) = (0usize, 0usize, 0usize);
        let target = self.records;
        let mut closed = Ok(());
        if way == Way::AckLoop {
            // The same counting, in a loop of the subscription's own calls.
            while records < self.records {
                match subscription.next().await {
                    Some(Ok(delivery)) => {
                        records += 1;
                        if records.is_multiple_of(1_000) {
                            seen.fetch_add(1_000, Ordering::Relaxed);
                        }
                        bytes += delivery.data().len();
                        delivery.ack();
                    }
                    Some(Err(_)) => errors += 1,
                    None => break,
                }
            }
        } else {
            closed = (&mut subscription)
                .errors_to(|_| errors += 1)
                .take(self.records)
                .inspect(|delivery| {
                    records += 1;
                    if records.is_multiple_of(1_000) {
                        seen.fetch_add(1_000, Ordering::Relaxed);
                    }
                    if records == target {
                        // The last one: `take` ends the stream, `forward` closes the sink.
                        stage.store(CLOSING, Ordering::Relaxed);
                    }
                    bytes += delivery.data().len();
                })
                .map(Ok)
                .forward(AckSink::new())
                .await;
        }
        // Timed up to the last delivery's ack; the graceful stop (final checkpoints, lease
        // release) that follows is not part of the drain.
        let end = self.mark();
        if let Err(e) = closed {
            // The acks are counted, but their checkpoints were not confirmed: say so.
            println!("      {} AckSink: {e}", &way.label()[..3]);
        }
        stage.store(STOPPING, Ordering::Relaxed);
        subscription.shutdown().await;
        // Checkpoint writes per shard over the drain and its final flush (the lease table's
        // cost; the default interval is 5 s, so a sub-second drain writes the start position,
        // at most one interval's checkpoint, and the final one).
        if self.dynamodb.is_none() {
            let writes: Vec<u64> = self
                .backlog
                .keys()
                .map(|shard| memory.checkpoint_writes(STREAM, shard))
                .collect();
            let way = &way.label()[..3];
            println!("      {way} checkpoint writes per shard: {writes:?}");
        }
        Ok(Drained {
            records,
            bytes,
            errors,
            end: Some(end),
        })
    }

    /// (e) The broker face: a RustStream app on `KinesisBroker`, one trivial handler.
    async fn drain_broker_face(&self) -> Result<Drained> {
        let tally = Arc::new(Tally {
            records: self.seen.clone(),
            bytes: AtomicUsize::new(0),
            target: self.records,
            end: Mutex::new(None),
            reached: tokio::sync::Notify::new(),
            cpu: self.cpu,
            emulator_pid: self.emulator_pid.clone(),
        });
        // A fresh broker, so fresh in-memory leases and owner: every drain starts at
        // TRIM_HORIZON with nothing checkpointed.
        let broker = KinesisBroker::new()
            .sdk_config(self.config.clone())
            .kinesis_endpoint(self.endpoint.clone())
            .in_memory_leases();
        let source = KinesisStream::new(STREAM)
            .start_at(KinesisPosition::horizon())
            .read_settings(self.read_settings())
            .deaggregate(self.aggregated);
        let handler = CountHandler(tally.clone());
        let app = RustStream::new(AppInfo::new("e2e-drain", "0.0.0")).with_broker(broker, |b| {
            b.include(subscriber(source, handler).build());
        });
        let running = app.start().await?;
        // `notify_one` keeps its permit when nobody waits yet.
        tally.reached.notified().await;
        let end = tally
            .end
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        // Timed up to the N-th handled record; the app's graceful stop is not.
        running.shutdown().await?;
        Ok(Drained {
            records: tally.records.load(Ordering::Relaxed),
            bytes: tally.bytes.load(Ordering::Relaxed),
            errors: 0,
            end,
        })
    }

    /// (d) Diagnostic: the shard readers of (c), each drained on a task of its own as in (a).
    async fn drain_task_per_reader(&self) -> Result<Drained> {
        let mut tasks = Vec::new();
        for (shard, &want) in &self.backlog {
            let mut reader = ShardStream::builder(self.api.clone(), STREAM, shard.as_str())
                .settings(self.read_settings())
                .open(StartingPoint::TrimHorizon)?;
            let seen = self.seen.clone();
            tasks.push(tokio::spawn(async move {
                let mut drained = Drained::default();
                while drained.records < want {
                    match reader.next().await {
                        Some(Ok(record)) => {
                            drained.records += 1;
                            if drained.records.is_multiple_of(1_000) {
                                // For the progress line; a shared counter, so not per record.
                                seen.fetch_add(1_000, Ordering::Relaxed);
                            }
                            drained.bytes += record.data().len();
                        }
                        Some(Err(_)) => drained.errors += 1,
                        None => break,
                    }
                }
                drained
            }));
        }
        let mut total = Drained::default();
        for task in tasks {
            let drained = task.await?;
            total.records += drained.records;
            total.bytes += drained.bytes;
            total.errors += drained.errors;
        }
        Ok(total)
    }

    /// (c) The single-shard-stream layer: four shard readers, merged.
    async fn drain_select_all(&self) -> Result<Drained> {
        let readers = self
            .backlog
            .keys()
            .map(|shard| {
                ShardStream::builder(self.api.clone(), STREAM, shard.as_str())
                    .settings(self.read_settings())
                    .open(StartingPoint::TrimHorizon)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut merged = futures::stream::select_all(readers);
        let mut drained = Drained::default();
        while drained.records < self.records {
            match merged.next().await {
                Some(Ok(record)) => {
                    drained.records += 1;
                    self.seen.store(drained.records, Ordering::Relaxed);
                    drained.bytes += record.data().len();
                }
                Some(Err(_)) => drained.errors += 1,
                None => break,
            }
        }
        Ok(drained)
    }
}

// ---------------------------------------------------------------------------------------------
// The report
// ---------------------------------------------------------------------------------------------

fn report(
    options: &Options,
    samples: &BTreeMap<Way, Vec<Sample>>,
    ratios: &BTreeMap<Way, Vec<f64>>,
) {
    println!();
    println!(
        "drain of {} records x {RECORD_BYTES} B over {SHARDS} shards, median of {} round(s)",
        options.records, options.rounds
    );
    println!(
        "| way | records/s | ratio to (a) | client CPU s / 100k records | emulator CPU s / 100k records |"
    );
    println!("|---|---:|---:|---:|---:|");
    for way in Way::ALL {
        let Some(samples) = samples.get(&way) else {
            continue;
        };
        let per_100k = |cpu: fn(&Sample) -> f64| {
            median(
                samples
                    .iter()
                    .map(|s| cpu(s) * 100_000.0 / s.records as f64)
                    .collect(),
            )
        };
        println!(
            "| {} | {:.0} | {:.2} | {:.3} | {:.3} |",
            way.label(),
            median(samples.iter().map(Sample::rate).collect()),
            median(ratios.get(&way).cloned().unwrap_or_default()),
            per_100k(|s| s.client_cpu),
            per_100k(|s| s.emulator_cpu),
        );
    }
    println!();
    println!(
        "ratio: the median over rounds of (way's records/s / baseline's records/s in the same round)"
    );
    let given = if options.given.is_empty() {
        String::new()
    } else {
        format!(" -- {}", options.given.join(" "))
    };
    println!("command: cargo run --release --manifest-path benches/e2e/Cargo.toml{given}");
}

/// Where a subscription drain is: [`watch_stage`] names it when the drain takes too long.
const STARTING: usize = 0;
const READING: usize = 1;
const CLOSING: usize = 2;
const STOPPING: usize = 3;

/// How long a drain may take before [`watch_stage`] says where it is (a drain takes seconds).
const STAGE_REPORT_EVERY: Duration = Duration::from_secs(30);

/// Every [`STAGE_REPORT_EVERY`] while a subscription drain runs, prints its stage and the
/// records seen so far to stderr: a drain that stalls says whether it stalled starting,
/// reading, closing the ack sink (its wait for the checkpoints) or stopping.
async fn watch_stage(stage: Arc<AtomicUsize>, way: Way, seen: Arc<AtomicUsize>) {
    let mut waited = Duration::ZERO;
    loop {
        tokio::time::sleep(STAGE_REPORT_EVERY).await;
        waited += STAGE_REPORT_EVERY;
        let at = match stage.load(Ordering::Relaxed) {
            STARTING => "starting the subscription",
            READING => "reading",
            CLOSING => "closing the AckSink (waiting for the checkpoints to cover its acks)",
            _ => "stopping the subscription (Subscription::shutdown)",
        };
        eprintln!(
            "{} still running after {waited:?}: {at}; {} records seen",
            way.label(),
            seen.load(Ordering::Relaxed)
        );
    }
}

/// Aborts the task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
