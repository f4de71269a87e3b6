//! Probes of kinesis-dataflow against ferrokinesis: latency, an idle instance, memory under a
//! stalled consumer, and checkpoint writes.
//!
//! ```text
//! cargo run --release --manifest-path benches/e2e/Cargo.toml --bin probes -- <probe|all> [--quick]
//! ```
//!
//! Each probe starts ferrokinesis in a child process of its own (this binary re-run as
//! `probes --serve-emulator`), creates its streams, prints its figures and ends with one line
//! starting `summary:`. `all` runs every probe, each in a process of its own (so one probe's
//! memory does not weigh on the next one's readings). `--quick` shortens every phase to a few
//! seconds (a CI smoke run: it checks that the probes work, its figures mean little).
//!
//! * `latency`: put-to-handler latency at 10 records/s on a 1-shard stream and at 1,000
//!   records/s on a 4-shard stream, through a core `Subscription` and through the RustStream
//!   broker face, with the default `poll_interval` (1 s) and with 100 ms. Each record carries
//!   its send time; the handler compares it with its own clock.
//! * `idle`: one instance holding the 100 shards (`--shards N`) of an idle stream: CPU share,
//!   resident memory and its growth per held shard, GetRecords calls per second, lease-store
//!   calls per second. `--in-memory`: the same on the in-memory transport (`MemoryKinesis`)
//!   instead of the SDK's, to tell the library's own memory from the SDK's; `--stagger`: each
//!   shard's first GetRecords delayed by an offset in [0, 1 s), so idle shards poll out of
//!   phase (an experiment).
//! * `memory`: a consumer that takes one record and then stalls while records arrive; resident
//!   memory every second, then everything must be delivered once it resumes. `--hold`: the
//!   consumer keeps taking records during the stall but settles none (`max_in_flight` bounds
//!   it).
//! * `checkpoints`: checkpoint writes per shard per minute at 10 and at 1,000 records/s, every
//!   delivery acked, the default `checkpoint_interval` (5 s).
//!
//! Times are reported, never asserted on; a probe fails only when records go missing. While a
//! phase runs (a latency or checkpoint run, the idle window, the stall, the drain after it), a
//! progress line goes to stderr every few seconds; stdout carries only the figures.

use std::future::{Future, ready};
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_config::SdkConfig;
use aws_sdk_kinesis::Client;
use futures::StreamExt;
use kinesis_dataflow::api::layer::{ApiCall, KinesisLayer, Layered};
use kinesis_dataflow::api::{ApiFuture, SharedKinesis};
use kinesis_dataflow::broker::{KinesisBroker, KinesisStream};
use kinesis_dataflow::lease::LeaseStore;
use kinesis_dataflow::{
    AwsKinesis, Delivery, MemoryLeaseStore, ReadSettings, Record, Subscription,
};
use kinesis_dataflow_e2e::{
    ApiCounts, CpuClock, Emulator, Frame, HeapInfo, LeaseCounts, PUT_BATCH, Progress, Result,
    SERVE_EMULATOR, SHARD_LIMIT, TlsIdentity, counting_kinesis, counting_lease_store, entry,
    heap_info, mib, now_micros, percentile, put_entries, record_stamp, rss_bytes, serve_emulator,
    stamped_record, status_bytes, thousands, trim_heap,
};
use kinesis_dataflow_test_support::{create_stream_shards, sdk_config_at, wait_for};
use ruststream::runtime::{AppInfo, Context, Handle, HandlerOutcome, RustStream, subscriber};

const USAGE: &str = "\
probes: latency, idle, memory and checkpoint probes of kinesis-dataflow against ferrokinesis

usage: cargo run --release --manifest-path benches/e2e/Cargo.toml --bin probes -- <probe> [options]

probes:
  latency       put-to-handler latency: 10/s on 1 shard, 1,000/s on 4 shards; core and broker
                face; poll_interval 1 s and 100 ms (30 s each; quick: 3 s)
  idle          one instance holding 100 idle shards, polling then enhanced fan-out; resident
                memory per held shard (60 s; quick: 5 s)
  memory        a consumer stalled while 100,000 records arrive (60 s; quick: 5 s, 10,000)
  checkpoints   checkpoint writes per shard per minute at 10/s and 1,000/s (60 s each; quick: 5 s)
  all           every probe (memory twice: stalled, then --hold), each in a process of its own

options:
  --quick       the CI smoke run: a few seconds per phase
  --seconds S   the length of each phase (latency run, idle window, stall, checkpoint run)
  --records N   memory: records arriving during the stall
  --hold        memory: the consumer keeps taking records during the stall but settles none
  --shards N    idle: the shards held (default 100; at most 2,000)
  --in-memory   idle: the in-memory transport (MemoryKinesis) instead of the SDK's, for
                comparison (the lease store is in memory either way)
  --broker      idle: the broker face (an app with one subscriber, as the spec's example runs)
                instead of a core Subscription; polling only
  --stagger     idle: delays each shard's first GetRecords by an offset in [0, 1 s) hashed from
                its id, so the idle shards poll out of phase (an experiment)
  --tls         the emulator over TLS with ALPN `h2, http/1.1` (a certificate made for the run,
                trusted by the client), so the SDK's client speaks HTTP/2 as it does to Kinesis
  --per-connection N
                idle: the fan-out subscriptions one connection carries (the library's default
                is 100; a number above --shards keeps them all on one connection)
  --only-fan-out
                idle: the enhanced fan-out run only
  --help        this text";

/// The idle probe's largest `--shards`: its two streams (polling, fan-out) must fit in the
/// emulator's open-shard limit.
const MAX_IDLE_SHARDS: usize = SHARD_LIMIT as usize / 2;

/// Pause between two looks at the handled count while waiting for the last records.
const HANDLED_POLL: Duration = Duration::from_millis(5);

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == SERVE_EMULATOR) {
        return serve_emulator();
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
    if options.probe == Probe::All {
        return run_all(&args);
    }
    kinesis_dataflow_e2e::runtime()?.block_on(async {
        let env = Env::start(options.tls).await?;
        match options.probe {
            Probe::Latency => latency(&env, &options).await,
            Probe::Idle => idle(&env, &options).await,
            Probe::Memory => memory(&env, &options).await,
            Probe::Checkpoints => checkpoints(&env, &options).await,
            Probe::All => unreachable!("run above"),
        }
    })?;
    let given = args.join(" ");
    println!(
        "command: cargo run --release --manifest-path benches/e2e/Cargo.toml --bin probes -- {given}"
    );
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Probe {
    Latency,
    Idle,
    Memory,
    Checkpoints,
    All,
}

#[derive(Debug)]
struct Options {
    probe: Probe,
    quick: bool,
    seconds: Option<u64>,
    records: Option<usize>,
    hold: bool,
    shards: Option<usize>,
    in_memory: bool,
    stagger: bool,
    broker: bool,
    tls: bool,
    /// Idle: the fan-out subscriptions one connection carries (the library's default: 100).
    per_connection: Option<usize>,
    /// Idle: the enhanced fan-out run only.
    only_fan_out: bool,
    help: bool,
}

impl Options {
    fn parse(args: &[String]) -> Result<Self, String> {
        let mut probe = None;
        let mut options = Options {
            probe: Probe::All,
            quick: false,
            seconds: None,
            records: None,
            hold: false,
            shards: None,
            in_memory: false,
            stagger: false,
            broker: false,
            tls: false,
            per_connection: None,
            only_fan_out: false,
            help: false,
        };
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let mut number = |name: &str| -> Result<u64, String> {
                let value = it.next().ok_or_else(|| format!("{name} needs a value"))?;
                match value.replace('_', "").parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!("{name}: `{value}` is not a positive number")),
                }
            };
            match arg.as_str() {
                "--quick" => options.quick = true,
                "--seconds" => options.seconds = Some(number("--seconds")?),
                "--records" => options.records = Some(number("--records")? as usize),
                "--hold" => options.hold = true,
                "--shards" => options.shards = Some(number("--shards")? as usize),
                "--in-memory" => options.in_memory = true,
                "--stagger" => options.stagger = true,
                "--broker" => options.broker = true,
                "--tls" => options.tls = true,
                "--per-connection" => {
                    options.per_connection = Some(number("--per-connection")? as usize)
                }
                "--only-fan-out" => options.only_fan_out = true,
                "--help" | "-h" => options.help = true,
                name if !name.starts_with('-') && probe.is_none() => {
                    probe = Some(match name {
                        "latency" => Probe::Latency,
                        "idle" => Probe::Idle,
                        "memory" => Probe::Memory,
                        "checkpoints" => Probe::Checkpoints,
                        "all" => Probe::All,
                        other => return Err(format!("unknown probe `{other}`")),
                    });
                }
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        match probe {
            Some(probe) => options.probe = probe,
            None if options.help => {}
            None => return Err("name a probe".into()),
        }
        if options.shards.is_some_and(|n| n > MAX_IDLE_SHARDS) {
            return Err(format!(
                "--shards: at most {MAX_IDLE_SHARDS} (the emulator's open-shard limit is \
                 {SHARD_LIMIT}, and the idle probe creates two streams)"
            ));
        }
        Ok(options)
    }

    /// The length of a phase: `--seconds`, else `full` (`quick` with `--quick`).
    fn phase(&self, full: u64, quick: u64) -> Duration {
        Duration::from_secs(
            self.seconds
                .unwrap_or(if self.quick { quick } else { full }),
        )
    }
}

/// `all`: every probe in a child process of its own, one after the other.
fn run_all(args: &[String]) -> Result<()> {
    let flags: Vec<&String> = args
        .iter()
        .filter(|a| *a != "all" && *a != "--hold")
        .collect();
    let runs: [&[&str]; 5] = [
        &["latency"],
        &["idle"],
        &["memory"],
        &["memory", "--hold"],
        &["checkpoints"],
    ];
    for (i, run) in runs.iter().enumerate() {
        eprintln!("probes all: {}/{}: {}", i + 1, runs.len(), run.join(" "));
        println!("\n=== probes {} ===", run.join(" "));
        let status = std::process::Command::new(std::env::current_exe()?)
            .args(*run)
            .args(&flags)
            .status()?;
        if !status.success() {
            return Err(format!("probes {} failed: {status}", run.join(" ")).into());
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The environment: the emulator and the clients
// ---------------------------------------------------------------------------------------------

struct Env {
    emulator: Emulator,
    endpoint: String,
    config: SdkConfig,
    client: Client,
    /// The library's SDK transport over `client`.
    aws: SharedKinesis,
    cpu: CpuClock,
    /// The emulator serves over TLS (ALPN `h2, http/1.1`).
    tls: bool,
}

impl Env {
    /// The emulator and a client of it; over TLS (ALPN `h2, http/1.1`) with `tls`.
    async fn start(tls: bool) -> Result<Self> {
        let (emulator, config) = if tls {
            let identity = TlsIdentity::generate()?;
            let emulator = Emulator::start_tls(&identity)?;
            let config = sdk_config_at(&emulator.endpoint())
                .into_builder()
                .http_client(identity.https_client()?)
                .build();
            (emulator, config)
        } else {
            let emulator = Emulator::start()?;
            let config = sdk_config_at(&emulator.endpoint());
            (emulator, config)
        };
        let endpoint = emulator.endpoint();
        let client = Client::new(&config);
        println!(
            "ferrokinesis 0.7 in a child process (pid {}, {endpoint}{}); client runtime: tokio \
             multi-thread, 2 workers",
            emulator.pid(),
            if tls {
                ", TLS with ALPN h2, http/1.1"
            } else {
                ""
            }
        );
        Ok(Self {
            aws: Arc::new(AwsKinesis::new(client.clone())),
            emulator,
            endpoint,
            config,
            client,
            cpu: CpuClock::new(),
            tls,
        })
    }

    /// CPU seconds of this process and of the emulator.
    fn cpu(&self) -> (f64, f64) {
        (
            self.cpu.seconds("self"),
            self.cpu.seconds(&self.emulator.pid().to_string()),
        )
    }

    /// A broker on the emulator with in-memory leases (fresh ones: a new store per broker).
    fn broker(&self) -> KinesisBroker {
        KinesisBroker::new()
            .sdk_config(self.config.clone())
            .kinesis_endpoint(self.endpoint.clone())
            .in_memory_leases()
    }
}

/// Puts stamped records on `stream` at `rate` a second for `duration` (PutRecords of the
/// records due at each tick: every 10 ms from 100 a second up, else one record a tick).
/// Returns how many it sent; `progress` follows the count as it goes.
async fn produce(
    client: Client,
    stream: String,
    rate: f64,
    duration: Duration,
    progress: Arc<AtomicU64>,
) -> Result<u64> {
    let tick = if rate >= 100.0 {
        Duration::from_millis(10)
    } else {
        Duration::from_secs_f64(1.0 / rate)
    };
    let total = (rate * duration.as_secs_f64()).round() as u64;
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let started = Instant::now();
    let mut sent = 0_u64;
    while sent < total {
        interval.tick().await;
        let due = ((started.elapsed().as_secs_f64() * rate).round() as u64 + 1).min(total);
        while sent < due {
            let batch = (due - sent).min(PUT_BATCH as u64);
            let stamp = now_micros();
            let entries = (sent..sent + batch)
                .map(|i| entry(format!("pk-{i}"), stamped_record(stamp, i)))
                .collect::<Result<Vec<_>>>()?;
            put_entries(&client, &stream, entries).await?;
            sent += batch;
            progress.store(sent, Ordering::Relaxed);
        }
    }
    Ok(sent)
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

// ---------------------------------------------------------------------------------------------
// latency
// ---------------------------------------------------------------------------------------------

/// The latency runs' first seconds: records sent while the subscription still paces itself
/// as on an idle stream (empty reads, each followed by a `poll_interval` wait). Reported
/// apart from the steady state that follows.
const WARM_UP: Duration = Duration::from_secs(2);

/// Send-to-handler latencies, in microseconds, with each record's send stamp.
#[derive(Debug, Default)]
struct Latencies {
    samples: Mutex<Vec<(u64, u64)>>,
    count: AtomicUsize,
}

impl Latencies {
    fn record(&self, data: &[u8]) {
        if let Some(stamp) = record_stamp(data) {
            let latency = now_micros().saturating_sub(stamp);
            self.samples
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push((stamp, latency));
        }
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// The latencies of records sent before `stamp` and of those sent from it on, each sorted.
    fn split_at(&self, stamp: u64) -> (Vec<u64>, Vec<u64>) {
        let samples = self
            .samples
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (mut before, mut after): (Vec<u64>, Vec<u64>) = (Vec::new(), Vec::new());
        for &(sent, latency) in samples.iter() {
            if sent < stamp {
                before.push(latency);
            } else {
                after.push(latency);
            }
        }
        before.sort_unstable();
        after.sort_unstable();
        (before, after)
    }
}

/// The broker face's handler: records the latency, acks (`Ok(())`).
struct LatencyHandler(Arc<Latencies>);

impl<'p> Handle<Frame<'p>> for LatencyHandler {
    fn handle(
        &self,
        frame: &Frame<'p>,
        _outs: &(),
        _ctx: &mut Context<'_>,
    ) -> impl Future<Output = Result<(), HandlerOutcome>> + Send {
        self.0.record(frame.0);
        ready(Ok(()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Face {
    Core,
    Broker,
}

impl Face {
    fn label(self) -> &'static str {
        match self {
            Face::Core => "core Subscription",
            Face::Broker => "broker face (app)",
        }
    }
}

/// One latency run's figures.
struct LatencyRun {
    sent: u64,
    handled: usize,
    /// Sorted latencies of the records sent in the first [`WARM_UP`].
    first: Vec<u64>,
    /// Sorted latencies of the records sent after it.
    steady: Vec<u64>,
    /// GetRecords calls a second (core only: the broker builds its own client).
    get_records_per_second: Option<f64>,
    client_cpu_share: f64,
}

/// Consumes a core subscription until it ends: records each delivery's latency, acks it.
async fn consume_core(
    mut subscription: Subscription,
    sink: Arc<Latencies>,
) -> (Subscription, usize) {
    let mut errors = 0;
    while let Some(item) = subscription.next().await {
        match item {
            Ok(delivery) => {
                sink.record(delivery.data());
                delivery.ack();
            }
            Err(e) => {
                // The first few, so that a count in a summary can be told apart.
                if errors < 3 {
                    eprintln!("  error item: {e}");
                }
                errors += 1;
            }
        }
    }
    (subscription, errors)
}

/// How a latency run reads: polling with this `poll_interval`, or enhanced fan-out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReadMode {
    Polling(Duration),
    FanOut,
}

impl ReadMode {
    fn settings(self) -> ReadSettings {
        match self {
            ReadMode::Polling(poll) => ReadSettings::default().poll_interval(poll),
            ReadMode::FanOut => ReadSettings::default().fan_out("latency-probe"),
        }
    }

    fn label(self) -> String {
        match self {
            ReadMode::Polling(poll) => format!("polling, poll_interval {} ms", poll.as_millis()),
            ReadMode::FanOut => "enhanced fan-out".to_owned(),
        }
    }

    /// How long the last records may take after the producer stopped.
    fn patience(self) -> Duration {
        match self {
            ReadMode::Polling(poll) => poll + Duration::from_secs(3),
            ReadMode::FanOut => Duration::from_secs(4),
        }
    }
}

async fn latency_run(
    env: &Env,
    face: Face,
    stream: &str,
    rate: f64,
    mode: ReadMode,
    duration: Duration,
    progress: String,
) -> Result<LatencyRun> {
    let sink = Arc::new(Latencies::default());
    let settings = mode.settings();
    // Opens at the tip (LATEST; no checkpoint in the fresh lease store): earlier runs' records
    // are not read.
    let api = counting_kinesis(env.aws.clone());
    enum Running {
        Core(
            kinesis_dataflow::subscription::ShutdownHandle,
            tokio::task::JoinHandle<(Subscription, usize)>,
        ),
        Broker(ruststream::runtime::RunningApp),
    }
    let running = match face {
        Face::Core => {
            let subscription =
                Subscription::builder(api.clone(), Arc::new(MemoryLeaseStore::new()), stream)
                    .read_settings(settings)
                    .start()
                    .await?;
            let handle = subscription.shutdown_handle();
            Running::Core(
                handle,
                tokio::spawn(consume_core(subscription, sink.clone())),
            )
        }
        Face::Broker => {
            let source = KinesisStream::new(stream).read_settings(settings);
            let handler = LatencyHandler(sink.clone());
            let app = RustStream::new(AppInfo::new("e2e-latency", "0.0.0")).with_broker(
                env.broker(),
                |b| {
                    b.include(subscriber(source, handler).build());
                },
            );
            Running::Broker(app.start().await?)
        }
    };
    let counts = api.layer().counts();
    let (cpu, _) = env.cpu();
    let started = Instant::now();
    let warm_until = now_micros() + u64::try_from(WARM_UP.as_micros())?;
    let sending = Arc::new(AtomicU64::new(0));
    let _progress = sent_handled(progress, rate, duration, &sending, &sink);
    let sent = produce(
        env.client.clone(),
        stream.to_owned(),
        rate,
        duration,
        sending,
    )
    .await?;
    // The last records get one poll interval and a margin to arrive (missing ones are counted
    // below).
    let patience = mode.patience();
    let _ = wait_for("every record handled", patience, HANDLED_POLL, || {
        sink.count() >= sent as usize
    })
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let reads = (api.layer().counts() - counts).get_records;
    let client_cpu_share = (env.cpu().0 - cpu) / elapsed;
    let mut errors = 0;
    match running {
        Running::Core(handle, consumer) => {
            handle.shutdown().await;
            errors = consumer.await?.1;
        }
        Running::Broker(app) => app.shutdown().await?,
    }
    if errors > 0 {
        eprintln!("  note: {errors} error items (retried by the reader)");
    }
    let (first, steady) = sink.split_at(warm_until);
    Ok(LatencyRun {
        sent,
        handled: sink.count(),
        first,
        steady,
        get_records_per_second: (face == Face::Core).then_some(reads as f64 / elapsed),
        client_cpu_share,
    })
}

/// The progress line of a run putting records at `rate` for `duration`: sent against the
/// target, handled.
fn sent_handled(
    label: String,
    rate: f64,
    duration: Duration,
    sent: &Arc<AtomicU64>,
    sink: &Arc<Latencies>,
) -> Progress {
    let target = (rate * duration.as_secs_f64()).round() as u64;
    let (sent, sink) = (sent.clone(), sink.clone());
    Progress::window(label, duration, move || {
        format!(
            "sent {} / {} records, handled {}",
            thousands(sent.load(Ordering::Relaxed)),
            thousands(target),
            thousands(sink.count() as u64)
        )
    })
}

async fn latency(env: &Env, options: &Options) -> Result<()> {
    let duration = options.phase(30, 3);
    let one = "latency-1";
    let four = "latency-4";
    create_stream_shards(&env.client, one, 1).await?;
    create_stream_shards(&env.client, four, 4).await?;
    println!(
        "latency: records stamped with their send time, put at a steady rate for {} s per run; \
         default ReadSettings (batch 1,000, at most 5 GetRecords/s per shard) but for \
         poll_interval; every record acked",
        duration.as_secs()
    );
    println!(
        "p50/p99/max: records sent after the first {} s; first {} s: the largest latency of the \
         records sent before (the subscription waking from an idle stream)",
        WARM_UP.as_secs(),
        WARM_UP.as_secs()
    );
    println!(
        "| path | stream | rate | read mode | sent | handled | p50 ms | p99 ms | max ms | \
         first {} s: max ms | GetRecords/s | client CPU share |",
        WARM_UP.as_secs()
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut summary = Vec::new();
    let mut missing = 0;
    let (mut run_number, runs) = (0, 2 * 3 * 2);
    for (stream, shards, rate) in [(one, 1, 10.0), (four, 4, 1_000.0)] {
        let modes = [
            ReadMode::Polling(Duration::from_secs(1)),
            ReadMode::Polling(Duration::from_millis(100)),
            ReadMode::FanOut,
        ];
        for mode in modes {
            for face in [Face::Core, Face::Broker] {
                run_number += 1;
                let label = format!(
                    "latency, run {run_number}/{runs}, {}, {rate:.0}/s on {shards} shard(s), {}",
                    face.label(),
                    mode.label()
                );
                let run = latency_run(env, face, stream, rate, mode, duration, label).await?;
                let (p50, p99, max) = (
                    percentile(&run.steady, 50.0),
                    percentile(&run.steady, 99.0),
                    run.steady.last().copied().unwrap_or(0),
                );
                println!(
                    "| {} | {shards} shard(s) | {rate:.0}/s | {} | {} | {} | {:.0} | {:.0} | \
                     {:.0} | {:.0} | {} | {:.1}% |",
                    face.label(),
                    mode.label(),
                    run.sent,
                    run.handled,
                    ms(p50),
                    ms(p99),
                    ms(max),
                    ms(run.first.last().copied().unwrap_or(0)),
                    run.get_records_per_second
                        .map_or_else(|| "-".to_owned(), |r| format!("{r:.1}")),
                    run.client_cpu_share * 100.0,
                );
                missing += (run.sent as usize).saturating_sub(run.handled);
                summary.push(format!(
                    "{} {rate:.0}/s {} {:.0}/{:.0}",
                    if face == Face::Core { "core" } else { "broker" },
                    mode.label(),
                    ms(p50),
                    ms(p99)
                ));
            }
        }
    }
    println!("summary: latency p50/p99 ms: {}", summary.join("; "));
    if missing > 0 {
        return Err(format!("{missing} records sent were not handled").into());
    }
    latency_in_memory(duration).await
}

/// The same comparison on the in-memory transport, whose subscriptions look for new records
/// every 10 ms: what the library's own two read paths add, without an emulator's push cadence
/// (ferrokinesis pushes every 200 ms, kinesis-local about every second). Polling keeps the
/// service's 5 reads a second per shard.
async fn latency_in_memory(duration: Duration) -> Result<()> {
    println!(
        "in memory (MemoryKinesis, subscriptions checked every 10 ms), core Subscription, 1 \
         shard, 100 records/s, {} s per run:",
        duration.as_secs()
    );
    println!("| read mode | sent | handled | p50 ms | p99 ms | max ms |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut summary = Vec::new();
    let modes = [
        ReadMode::Polling(Duration::from_millis(100)),
        ReadMode::FanOut,
    ];
    for (i, mode) in modes.into_iter().enumerate() {
        let memory = kinesis_dataflow::MemoryKinesis::new();
        memory.add_stream("latency-memory", 1)?;
        let api: SharedKinesis = Arc::new(memory.clone());
        let sink = Arc::new(Latencies::default());
        let subscription =
            Subscription::builder(api, Arc::new(MemoryLeaseStore::new()), "latency-memory")
                .read_settings(mode.settings())
                .start()
                .await?;
        let handle = subscription.shutdown_handle();
        let consumer = tokio::spawn(consume_core(subscription, sink.clone()));
        let sending = Arc::new(AtomicU64::new(0));
        let label = format!(
            "latency in memory, run {}/{}, {}",
            i + 1,
            modes.len(),
            mode.label()
        );
        let progress = sent_handled(label, 100.0, duration, &sending, &sink);
        let mut sent = 0_u64;
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        let until = Instant::now() + duration;
        while Instant::now() < until {
            tick.tick().await;
            memory.put("latency-memory", "k", stamped_record(now_micros(), sent))?;
            sent += 1;
            sending.store(sent, Ordering::Relaxed);
        }
        let _ = wait_for(
            "every record handled",
            mode.patience(),
            HANDLED_POLL,
            || sink.count() >= sent as usize,
        )
        .await;
        drop(progress);
        handle.shutdown().await;
        let (_subscription, _errors) = consumer.await?;
        let (_, all) = sink.split_at(0);
        let (p50, p99) = (percentile(&all, 50.0), percentile(&all, 99.0));
        println!(
            "| {} | {sent} | {} | {:.1} | {:.1} | {:.1} |",
            mode.label(),
            sink.count(),
            ms(p50),
            ms(p99),
            ms(all.last().copied().unwrap_or(0))
        );
        summary.push(format!("{} {:.1}/{:.1}", mode.label(), ms(p50), ms(p99)));
    }
    println!(
        "summary: in-memory latency p50/p99 ms: {}",
        summary.join("; ")
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// idle
// ---------------------------------------------------------------------------------------------

/// One reading of this process's resident memory.
#[derive(Debug, Clone, Copy)]
struct RssSample {
    /// Seconds since the sampler started.
    at: f64,
    /// The phase the probe was in.
    phase: u8,
    /// `VmRSS` in bytes.
    rss: u64,
}

/// Reads this process's resident memory every second, with the phase current at each reading.
struct RssSampler {
    task: tokio::task::JoinHandle<Vec<RssSample>>,
    stop: Arc<AtomicU8>,
}

impl RssSampler {
    fn start(phase: Arc<AtomicU8>) -> Self {
        let stop = Arc::new(AtomicU8::new(0));
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut samples = Vec::new();
            let mut every = tokio::time::interval(Duration::from_secs(1));
            while stopped.load(Ordering::Relaxed) == 0 {
                every.tick().await;
                samples.push(RssSample {
                    at: started.elapsed().as_secs_f64(),
                    phase: phase.load(Ordering::Relaxed),
                    rss: rss_bytes(),
                });
            }
            samples
        });
        Self { task, stop }
    }

    /// Stops after the next reading; every reading taken.
    async fn stop(self) -> Result<Vec<RssSample>> {
        self.stop.store(1, Ordering::Relaxed);
        Ok(self.task.await?)
    }
}

fn per_second(calls: u64, seconds: f64) -> f64 {
    calls as f64 / seconds
}

fn lease_line(counts: LeaseCounts, seconds: f64) -> String {
    format!(
        "list {:.2}/s, renew {:.2}/s, checkpoint {:.2}/s, create {:.2}/s, take {:.2}/s, release \
         {:.2}/s (writes {:.2}/s, all calls {:.2}/s)",
        per_second(counts.list, seconds),
        per_second(counts.renew, seconds),
        per_second(counts.checkpoint, seconds),
        per_second(counts.create, seconds),
        per_second(counts.take, seconds),
        per_second(counts.release, seconds),
        per_second(counts.writes(), seconds),
        per_second(counts.total(), seconds),
    )
}

fn api_line(counts: ApiCounts, seconds: f64) -> String {
    format!(
        "GetRecords {:.1}/s, GetShardIterator {:.2}/s, ListShards {:.2}/s, SubscribeToShard \
         {:.2}/s",
        per_second(counts.get_records, seconds),
        per_second(counts.get_shard_iterator, seconds),
        per_second(counts.list_shards, seconds),
        per_second(counts.subscribe_to_shard, seconds),
    )
}

/// This process's established TCP connections to `port` (from `/proc/net/tcp` and `tcp6`).
fn connections_to(port: u16) -> usize {
    let remote = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|table| {
            table
                .lines()
                .skip(1)
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    // rem_address ends with the port; state 01 is ESTABLISHED.
                    fields.len() > 3 && fields[2].ends_with(&remote) && fields[3] == "01"
                })
                .count()
        })
        .sum()
}

/// `idle --stagger`: delays each shard's first GetRecords by an offset in [0, 1 s) hashed from
/// its id. An idle shard's reader reads, then waits `poll_interval` (1 s), so readers started
/// together poll in phase: every shard's GetRecords in flight at once, once a second, and the
/// SDK's HTTP/1.1 pool holds a connection per shard. Offset, they stay out of phase.
#[derive(Debug, Default)]
struct Stagger {
    started: Mutex<std::collections::HashSet<String>>,
}

impl KinesisLayer for Stagger {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: ApiCall<'a>,
        next: ApiFuture<'a, T>,
    ) -> ApiFuture<'a, T> {
        let ApiCall::GetRecords { shard, .. } = call else {
            return next;
        };
        let first = self
            .started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(shard.to_owned());
        if !first {
            return next;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        std::hash::Hash::hash(shard, &mut hasher);
        let offset = Duration::from_millis(std::hash::Hasher::finish(&hasher) % 1000);
        Box::pin(async move {
            tokio::time::sleep(offset).await;
            next.await
        })
    }
}

/// The process's memory at one moment: RSS, its split, and the heap's own account.
struct Footprint {
    rss: u64,
    anon: u64,
    file: u64,
    heap: Option<HeapInfo>,
}

impl Footprint {
    fn now() -> Self {
        Self {
            rss: rss_bytes(),
            anon: status_bytes("RssAnon"),
            file: status_bytes("RssFile"),
            heap: heap_info(),
        }
    }

    /// RSS once malloc gives back the memory it holds free (every shard still held); the last
    /// reading of a run, so the next run starts from there. `None` without glibc.
    fn trimmed(&self) -> Option<u64> {
        (self.heap.is_some() && trim_heap()).then(rss_bytes)
    }

    /// Prints the RSS split and the heap's account from this reading (before `start()`) to
    /// `end`, with the RSS after the trim, per shard of `shards`.
    fn print_change(&self, end: &Footprint, trimmed: Option<u64>, shards: usize) {
        println!(
            "  RSS split: anonymous {:.1} -> {:.1} MiB, file-backed (code) {:.1} -> {:.1} MiB \
             (before start() -> the window's end)",
            mib(self.anon),
            mib(end.anon),
            mib(self.file),
            mib(end.file)
        );
        if let (Some(before), Some(heap), Some(trimmed)) = (self.heap, end.heap, trimmed) {
            println!(
                "  malloc: {:.1} MiB in live allocations before start(), {:.1} MiB at the \
                 window's end, {:.1} MiB held free then; RSS after malloc_trim(0), every shard \
                 still held: {:.1} MiB ({:.3} MiB per shard)",
                mib(before.in_use),
                mib(heap.in_use),
                mib(heap.free),
                mib(trimmed),
                mib(trimmed.saturating_sub(self.rss)) / shards as f64
            );
        }
    }
}

/// The idle probe, polling and then with enhanced fan-out.
async fn idle(env: &Env, options: &Options) -> Result<()> {
    if options.broker {
        return idle_broker(env, options).await;
    }
    if !options.only_fan_out {
        idle_run(env, options, false).await?;
    }
    idle_run(env, options, true).await
}

async fn idle_run(env: &Env, options: &Options, fan_out: bool) -> Result<()> {
    let shards = options.shards.unwrap_or(100);
    let window = options.phase(60, 5);
    let stream = if fan_out {
        format!("idle-{shards}-fan-out")
    } else {
        format!("idle-{shards}")
    };
    let stream = stream.as_str();
    let mode = match (fan_out, options.in_memory) {
        (false, false) => "polling",
        (true, false) => "enhanced fan-out",
        (false, true) => "polling, in-memory transport",
        (true, true) => "enhanced fan-out, in-memory transport",
    };
    let mut mode = mode.to_owned();
    if options.stagger {
        mode.push_str(", first reads staggered");
    }
    if env.tls && !options.in_memory {
        mode.push_str(", TLS");
    }
    let transport: SharedKinesis = if options.in_memory {
        let memory = kinesis_dataflow::MemoryKinesis::new();
        // Without the library's `test-util` feature (off here), MemoryKinesis keeps no call
        // log: the counting decorator below counts the calls.
        memory.add_stream(stream, u32::try_from(shards)?)?;
        Arc::new(memory)
    } else {
        create_stream_shards(&env.client, stream, shards).await?;
        match options.per_connection {
            Some(n) => {
                Arc::new(AwsKinesis::new(env.client.clone()).subscriptions_per_connection(n))
            }
            None => env.aws.clone(),
        }
    };
    let transport: SharedKinesis = if options.stagger {
        Layered::new(transport, Stagger::default()).shared()
    } else {
        transport
    };
    let api = counting_kinesis(transport);
    let table = Arc::new(MemoryLeaseStore::new());
    let leases = counting_lease_store(table.clone());
    let before = Footprint::now();
    let rss_before = before.rss;
    let started = Instant::now();
    let settings = if fan_out {
        ReadSettings::default().fan_out("idle-probe")
    } else {
        ReadSettings::default()
    };
    let subscription = Subscription::builder(api.clone(), leases.clone(), stream)
        .read_settings(settings)
        .start()
        .await?;
    let startup = started.elapsed().as_secs_f64();
    let owner = subscription.owner().to_owned();
    let handle = subscription.shutdown_handle();
    // The consumer awaits records like any idle consumer: polling the subscription starts the
    // shards' readers.
    let sink = Arc::new(Latencies::default());
    let consumer = tokio::spawn(consume_core(subscription, sink.clone()));
    let (api0, leases0, (cpu0, emu0)) = (api.layer().counts(), leases.layer().counts(), env.cpu());
    let rss_start = rss_bytes();
    let t0 = Instant::now();
    let phase = Arc::new(AtomicU8::new(0));
    let sampler = RssSampler::start(phase);
    let progress = Progress::window(format!("idle ({mode}), {shards} shards"), window, {
        let api = api.clone();
        move || {
            let reads = (api.layer().counts() - api0).get_records;
            format!("{} GetRecords in the window", thousands(reads))
        }
    });
    tokio::time::sleep(window).await;
    drop(progress);
    let seconds = t0.elapsed().as_secs_f64();
    let (api1, leases1, (cpu1, emu1)) = (api.layer().counts(), leases.layer().counts(), env.cpu());
    let end = Footprint::now();
    let rss_end = end.rss;
    let connections = connections_to(env.emulator.port);
    let samples = sampler.stop().await?;
    // Every shard still held: what RSS falls to once malloc gives back the memory it holds
    // free (the next run starts from there).
    let rss_trimmed = end.trimmed();
    // Read from the table itself, past the counting decorator.
    let held = table
        .list(stream)
        .await?
        .iter()
        .filter(|lease| lease.owner.as_deref() == Some(owner.as_str()))
        .filter(|lease| !lease.shard_id.starts_with("worker:"))
        .count();
    handle.shutdown().await;
    let (subscription, errors) = consumer.await?;
    drop(subscription);
    let (api_run, leases_run) = (api1 - api0, leases1 - leases0);
    let rss_min = samples.iter().map(|s| s.rss).min().unwrap_or(0);
    let rss_max = samples.iter().map(|s| s.rss).max().unwrap_or(0);
    println!(
        "idle ({mode}): one core Subscription (default settings) holding {held} of {shards} \
         shards of an idle stream (leases held at the window's end); window {seconds:.1} s \
         after start() returned"
    );
    let per_shard = mib(rss_end.saturating_sub(rss_before)) / shards as f64;
    println!("  open connections to the emulator at the window's end: {connections}");
    println!(
        "  start(): {startup:.2} s; before the window: {} (lease store: {})",
        api_line(api0, 1.0).replace("/s", ""),
        lease_line(leases0, 1.0).replace("/s", "")
    );
    println!(
        "  client CPU {:.3} s = {:.2}% of one core (emulator: {:.2}%)",
        cpu1 - cpu0,
        (cpu1 - cpu0) / seconds * 100.0,
        (emu1 - emu0) / seconds * 100.0
    );
    println!(
        "  resident memory: {:.1} MiB before start(), {:.1} MiB at the window's start, {:.1} \
         MiB at its end (per-second samples {:.1} to {:.1} MiB)",
        mib(rss_before),
        mib(rss_start),
        mib(rss_end),
        mib(rss_min),
        mib(rss_max)
    );
    println!(
        "  per held shard: {per_shard:.3} MiB ((RSS at the window's end - RSS before start()) / \
         {shards} shards)"
    );
    before.print_change(&end, rss_trimmed, shards);
    let series: Vec<String> = samples
        .iter()
        .map(|s| format!("{:.1}", mib(s.rss)))
        .collect();
    println!("  RSS every second (MiB): {}", series.join(" "));
    println!("  Kinesis calls: {}", api_line(api_run, seconds));
    println!(
        "  lease-store calls (= DynamoDB requests): {}",
        lease_line(leases_run, seconds)
    );
    println!(
        "  records delivered: {} (none expected); error items: {errors}",
        sink.count()
    );
    println!(
        "summary: idle, {shards} shards, {mode}: CPU {:.2}% of a core, RSS {:.1} -> {:.1} MiB \
         ({:.1} before start(); {per_shard:.3} MiB per shard), GetRecords {:.1}/s, lease-store \
         calls {:.1}/s ({:.1} writes/s), {connections} connections",
        (cpu1 - cpu0) / seconds * 100.0,
        mib(rss_start),
        mib(rss_end),
        mib(rss_before),
        per_second(api_run.get_records, seconds),
        per_second(leases_run.total(), seconds),
        per_second(leases_run.writes(), seconds),
    );
    Ok(())
}

/// `idle --broker`: an app of the broker face with one subscriber on an idle stream (the default
/// `KinesisStream` settings, in-memory leases), as the spec's example runs, holding every shard.
/// The broker builds its own transport, so no call is counted here: memory and connections only.
async fn idle_broker(env: &Env, options: &Options) -> Result<()> {
    let shards = options.shards.unwrap_or(100);
    let window = options.phase(60, 5);
    let stream = format!("idle-{shards}-broker");
    create_stream_shards(&env.client, &stream, shards).await?;
    let before = Footprint::now();
    let rss_before = before.rss;
    let started = Instant::now();
    let sink = Arc::new(Latencies::default());
    let source = KinesisStream::new(stream.as_str());
    let handler = LatencyHandler(sink.clone());
    let app = RustStream::new(AppInfo::new("e2e-idle", "0.0.0")).with_broker(env.broker(), |b| {
        b.include(subscriber(source, handler).build());
    });
    let running = app.start().await?;
    let startup = started.elapsed().as_secs_f64();
    let rss_start = rss_bytes();
    let progress = Progress::window(
        format!("idle (broker face), {shards} shards"),
        window,
        || "waiting".to_owned(),
    );
    tokio::time::sleep(window).await;
    drop(progress);
    let end = Footprint::now();
    let rss_end = end.rss;
    let connections = connections_to(env.emulator.port);
    let rss_trimmed = end.trimmed();
    running.shutdown().await?;
    let per_shard = mib(rss_end.saturating_sub(rss_before)) / shards as f64;
    println!(
        "idle (broker face): an app with one subscriber (default settings) on an idle stream of \
         {shards} shards; window {:.1} s after start() returned (start(): {startup:.2} s)",
        window.as_secs_f64()
    );
    println!("  open connections to the emulator at the window's end: {connections}");
    println!(
        "  resident memory: {:.1} MiB before start(), {:.1} MiB at the window's start, {:.1} \
         MiB at its end; per held shard: {per_shard:.3} MiB",
        mib(rss_before),
        mib(rss_start),
        mib(rss_end)
    );
    before.print_change(&end, rss_trimmed, shards);
    println!("  records delivered: {} (none expected)", sink.count());
    println!(
        "summary: idle, {shards} shards, broker face{}: RSS {:.1} -> {:.1} MiB ({:.1} before \
         start(); {per_shard:.3} MiB per shard), {connections} connections",
        if env.tls { ", TLS" } else { "" },
        mib(rss_start),
        mib(rss_end),
        mib(rss_before),
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// memory
// ---------------------------------------------------------------------------------------------

const BEFORE: u8 = 0;
const STALLED: u8 = 1;
const DRAINING: u8 = 2;
const DONE: u8 = 3;

async fn memory(env: &Env, options: &Options) -> Result<()> {
    const SHARDS: usize = 4;
    let stall = options.phase(60, 5);
    let records = options
        .records
        .unwrap_or(if options.quick { 10_000 } else { 100_000 });
    let stream = if options.hold {
        "memory-hold"
    } else {
        "memory"
    };
    create_stream_shards(&env.client, stream, SHARDS).await?;
    let api = counting_kinesis(env.aws.clone());
    let phase = Arc::new(AtomicU8::new(BEFORE));
    let sampler = RssSampler::start(phase.clone());
    let rss_before = rss_bytes();
    // Default settings: batch 1,000, 5 GetRecords/s per shard, max_in_flight 10,000 per shard.
    let mut subscription =
        Subscription::builder(api.clone(), Arc::new(MemoryLeaseStore::new()), stream)
            .start()
            .await?;
    // The records arrive over the stall, at an even rate.
    let rate = records as f64 / stall.as_secs_f64();
    let sending = Arc::new(AtomicU64::new(0));
    let producer = tokio::spawn(produce(
        env.client.clone(),
        stream.to_owned(),
        rate,
        stall,
        sending.clone(),
    ));
    let name = if options.hold {
        "memory --hold"
    } else {
        "memory"
    };
    let mut delivered = 0_usize;
    let mut errors = 0_usize;
    // The consumer takes the first record, then stalls.
    let first_by = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::time::timeout_at(first_by, subscription.next()).await {
            Ok(Some(Ok(delivery))) => {
                delivery.ack();
                delivered += 1;
                break;
            }
            Ok(Some(Err(_))) => errors += 1,
            Ok(None) => return Err("the subscription ended".into()),
            Err(_) => return Err("no record within 30 s".into()),
        }
    }
    phase.store(STALLED, Ordering::Relaxed);
    let stall_start = Instant::now();
    let rss_stall_start = rss_bytes();
    let api_stall = api.layer().counts();
    let progress = Progress::window(format!("{name}: stall"), stall, move || {
        format!(
            "sent {} / {} records, RSS {:.1} MiB",
            thousands(sending.load(Ordering::Relaxed)),
            thousands(records as u64),
            mib(rss_bytes())
        )
    });
    let mut held: Vec<Delivery<Record>> = Vec::new();
    if options.hold {
        // Takes whatever the subscription hands out, settles nothing.
        let until = tokio::time::Instant::now() + stall;
        loop {
            tokio::select! {
                () = tokio::time::sleep_until(until) => break,
                item = subscription.next() => match item {
                    Some(Ok(delivery)) => held.push(delivery),
                    Some(Err(_)) => errors += 1,
                    None => return Err("the subscription ended".into()),
                },
            }
        }
    } else {
        // Takes nothing: the subscription is not polled.
        tokio::time::sleep(stall).await;
    }
    let reads_in_stall = (api.layer().counts() - api_stall).get_records;
    let stall_seconds = stall_start.elapsed().as_secs_f64();
    let rss_stall_end = rss_bytes();
    let held_at_end = held.len();
    phase.store(DRAINING, Ordering::Relaxed);
    let sent = producer.await?? as usize;
    drop(progress);
    let resumed = Instant::now();
    delivered += held.len();
    for delivery in held.drain(..) {
        delivery.ack();
    }
    let so_far = Arc::new(AtomicUsize::new(delivered));
    let progress = Progress::count(
        format!("{name}: draining after the stall"),
        sent as u64,
        "records delivered",
        {
            let so_far = so_far.clone();
            move || so_far.load(Ordering::Relaxed) as u64
        },
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    while delivered < sent && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(5), subscription.next()).await {
            Ok(Some(Ok(delivery))) => {
                delivery.ack();
                delivered += 1;
                so_far.store(delivered, Ordering::Relaxed);
            }
            Ok(Some(Err(_))) => errors += 1,
            Ok(None) => break,
            Err(_) => {}
        }
    }
    let drain_seconds = resumed.elapsed().as_secs_f64();
    drop(progress);
    phase.store(DONE, Ordering::Relaxed);
    let rss_drained = rss_bytes();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let samples = sampler.stop().await?;
    subscription.shutdown().await;

    let range = |which: u8| {
        let in_phase: Vec<u64> = samples
            .iter()
            .filter(|s| s.phase == which)
            .map(|s| s.rss)
            .collect();
        (
            in_phase.iter().copied().min().unwrap_or(0),
            in_phase.iter().copied().max().unwrap_or(0),
            in_phase.len(),
        )
    };
    let (stall_min, stall_max, stall_n) = range(STALLED);
    let draining = match range(DRAINING) {
        (_, _, 0) => "no sample (under a second)".to_owned(),
        (min, max, n) => format!("min {:.1} / max {:.1} ({n} samples)", mib(min), mib(max)),
    };
    println!(
        "memory{}: a core Subscription (default settings: batch 1,000, max_in_flight 10,000 \
         per shard) on {SHARDS} shards; the consumer takes one record, then {} for {} s while \
         {sent} records of 100 bytes arrive ({rate:.0}/s), then acks everything",
        if options.hold { " --hold" } else { "" },
        if options.hold {
            "takes every record handed out but settles none"
        } else {
            "stops polling"
        },
        stall.as_secs()
    );
    let series: Vec<String> = samples
        .iter()
        .map(|s| {
            let tag = match s.phase {
                BEFORE => "b",
                STALLED => "s",
                DRAINING => "d",
                _ => "e",
            };
            format!("{:.0}{tag}:{:.1}", s.at, mib(s.rss))
        })
        .collect();
    println!(
        "  RSS every second (s since start, b before / s stalled / d draining / e done, MiB): {}",
        series.join(" ")
    );
    println!(
        "  RSS: {:.1} MiB before start(); stall: {:.1} at its start, {:.1} at its end, per-second \
         min {:.1} / max {:.1} ({stall_n} samples); draining: {draining}; {:.1} after",
        mib(rss_before),
        mib(rss_stall_start),
        mib(rss_stall_end),
        mib(stall_min),
        mib(stall_max),
        mib(rss_drained),
    );
    println!(
        "  GetRecords during the stall: {reads_in_stall} ({:.2}/s per shard); deliveries held \
         unsettled at its end: {held_at_end}",
        reads_in_stall as f64 / stall_seconds / SHARDS as f64
    );
    println!(
        "  delivered {delivered} of {sent} sent; drained {:.1} s after resuming; error items: \
         {errors}",
        drain_seconds
    );
    println!(
        "summary: memory{}: RSS during the stall {:.1} to {:.1} MiB (grew {:.1} MiB), {} \
         GetRecords in it, delivered {delivered}/{sent} in {:.1} s after resuming",
        if options.hold { " --hold" } else { "" },
        mib(stall_min),
        mib(stall_max),
        mib(stall_max.saturating_sub(rss_stall_start)),
        reads_in_stall,
        drain_seconds
    );
    if delivered != sent {
        return Err(format!("delivered {delivered} of {sent} records").into());
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// checkpoints
// ---------------------------------------------------------------------------------------------

async fn checkpoints(env: &Env, options: &Options) -> Result<()> {
    const SHARDS: usize = 4;
    let duration = options.phase(60, 5);
    let stream = "checkpoints";
    create_stream_shards(&env.client, stream, SHARDS).await?;
    println!(
        "checkpoints: a core Subscription (default settings, checkpoint_interval 5 s) on \
         {SHARDS} shards, every delivery acked at once, records put for {} s per rate",
        duration.as_secs()
    );
    println!(
        "| rate | sent | handled | window s | checkpoint writes per shard in the window | per \
         shard per minute | at start | final flush | renewals/s |"
    );
    println!("|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    let mut summary = Vec::new();
    let mut missing = 0;
    let rates = [10.0, 1_000.0];
    for (i, rate) in rates.into_iter().enumerate() {
        let leases = counting_lease_store(Arc::new(MemoryLeaseStore::new()));
        let subscription = Subscription::builder(env.aws.clone(), leases.clone(), stream)
            .start()
            .await?;
        let handle = subscription.shutdown_handle();
        let sink = Arc::new(Latencies::default());
        let consumer = tokio::spawn(consume_core(subscription, sink.clone()));
        let (at_start, per_shard0) = (
            leases.layer().counts(),
            leases.layer().checkpoints_per_shard(),
        );
        let t0 = Instant::now();
        let sending = Arc::new(AtomicU64::new(0));
        let label = format!("checkpoints, run {}/{}, {rate:.0}/s", i + 1, rates.len());
        let progress = sent_handled(label, rate, duration, &sending, &sink);
        let sent = produce(
            env.client.clone(),
            stream.to_owned(),
            rate,
            duration,
            sending,
        )
        .await?;
        // Missing records are counted below.
        let patience = Duration::from_secs(5);
        let _ = wait_for("every record handled", patience, HANDLED_POLL, || {
            sink.count() >= sent as usize
        })
        .await;
        drop(progress);
        let seconds = t0.elapsed().as_secs_f64();
        let (in_window, per_shard1) = (
            leases.layer().counts(),
            leases.layer().checkpoints_per_shard(),
        );
        handle.shutdown().await;
        let _ = consumer.await?;
        let after = leases.layer().counts();
        let writes: Vec<u64> = per_shard1
            .iter()
            .filter(|(shard, _)| !shard.starts_with("worker:"))
            .map(|(shard, n)| n - per_shard0.get(shard).copied().unwrap_or(0))
            .collect();
        let mean = writes.iter().sum::<u64>() as f64 / writes.len().max(1) as f64;
        let per_minute = mean / seconds * 60.0;
        println!(
            "| {rate:.0}/s | {sent} | {} | {seconds:.1} | {writes:?} | {per_minute:.1} | {} | {} \
             | {:.2} |",
            sink.count(),
            at_start.checkpoint,
            after.checkpoint - in_window.checkpoint,
            per_second((in_window - at_start).renew, seconds),
        );
        missing += (sent as usize).saturating_sub(sink.count());
        summary.push(format!("{rate:.0}/s: {per_minute:.1}"));
    }
    println!(
        "summary: checkpoint writes per shard per minute (default 5 s interval): {}",
        summary.join(", ")
    );
    if missing > 0 {
        return Err(format!("{missing} records sent were not handled").into());
    }
    Ok(())
}
