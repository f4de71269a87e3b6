//! Failover benchmark: two kinesis-dataflow consumer instances as separate OS processes.
//!
//! ```text
//! cargo run --release --manifest-path benches/failover/Cargo.toml -- [--quick] [--reps N] [--rate R] [--start-together]
//! ```
//!
//! The binary starts kinesis-local and dynalite (the npm packages pinned in `harness/`, through
//! `harness/launch.js`, installed with `npm ci` in `harness/` when missing: the
//! `kinesis-dataflow-test-support` crate the tests use too). Each trial then
//! creates a fresh 4-shard stream and lease table and starts instance `a` as a child process
//! (this binary re-run with `--instance NAME`, see `instance.rs`): a core `Subscription` over
//! the AWS SDK, leases in the table on dynalite, `start_at(horizon)`. Once it has started, a
//! producer writes records at a steady rate (200 a second by default, one PutRecords call of
//! one record per shard every 20 ms, each record carrying a counter and its send time). Once
//! `a` holds every shard, instance `b` starts the same way and `a` hands it two shards (a
//! graceful hand-off). With `--start-together` both start at once instead. Once each holds
//! two shards and they have run for a few seconds, one of them is stopped:
//!
//! * **crash**: SIGKILL; the other instance takes its shards once their leases expire in its
//!   view (`lease_duration` without the counter moving) at its next listing, and resumes from
//!   the last checkpoint, redelivering what was handled after it;
//! * **graceful**: SIGTERM, which the child turns into `ShutdownHandle::shutdown` (reading
//!   stops, in-flight deliveries are settled, checkpoints flushed, leases released); the other
//!   instance takes the released shards at its next listing;
//! * **freeze** (`--freeze`): SIGSTOP for 25 s, then SIGCONT (the process goes on, finds its
//!   leases taken and must hand on nothing the other one handled), then SIGKILL 3 s later. With
//!   `--fan-out` its subscriptions stay open while it is frozen, as on the service.
//!
//! Measured per trial: the time from the signal until every shard the stopped instance held
//! delivers again on the other one (the takeover gap, max over its shards), the longest a
//! record of those shards waited between its send and its first handling, the records handled
//! twice, and the records never handled. Times come from the children's own clock readings
//! (`SystemTime`, the same host clock as the parent's), printed with each handled record.
//! Nothing is asserted on time; a lost record, a duplicate the takeover does not explain, or a
//! takeover that never happens fails the run (exit code 1).
//!
//! Every line the instances printed, and the records written, go to
//! `target/emulator-logs/<pid>/trial-<n>.log` beside the emulators' logs; `RUST_LOG` (e.g.
//! `kinesis_dataflow=debug`) turns on the instances' tracing, on stderr. While a trial runs, a
//! progress line goes to stderr every few seconds (the trial, its phase, records written and
//! handled); stdout carries only the figures.

mod instance;
// The e2e package's progress ticker, the same file (this package uses part of it).
#[allow(dead_code)]
#[path = "../../e2e/src/progress.rs"]
mod progress;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use kinesis_dataflow_test_support::{
    Emulator, Kind, create_stream_shards, ensure_npm_packages, kinesis_client_at, wait_for,
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Result<T, E = BoxError> = std::result::Result<T, E>;

/// The subscription settings both instances use.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    pub list_interval: Duration,
    pub lease_duration: Duration,
    pub checkpoint_interval: Duration,
    pub poll_interval: Duration,
    pub shutdown_timeout: Duration,
}

/// Short settings, as in `tests/subscription_local.rs` (except the checkpoint interval, 1 s
/// here, 200 ms there).
pub const SETTINGS: Settings = Settings {
    list_interval: Duration::from_millis(500),
    lease_duration: Duration::from_secs(3),
    checkpoint_interval: Duration::from_secs(1),
    poll_interval: Duration::from_millis(100),
    shutdown_timeout: Duration::from_secs(5),
};

const SHARDS: usize = 4;
const INSTANCES: [&str; 2] = ["a", "b"];
/// How long a step (start, balance, takeover, catching up) may take before the trial fails.
const PATIENCE: Duration = Duration::from_secs(60);
/// Pause between two looks at what the instances printed, while waiting for a step.
const POLL: Duration = Duration::from_millis(10);

const USAGE: &str = "\
usage: failover [--quick] [--reps N] [--rate R] [--defaults] [--start-together] [--fan-out] [--freeze] [--only-freeze]

  --quick    one trial of each kind, short phases (a CI smoke run)
  --reps N   trials of each kind (default 3)
  --rate R   records written a second, over the 4 shards (default 200)
  --defaults the instances run with the library's default settings (lease duration and
             listing interval 10 s, checkpoints every 5 s, one read a second) instead of the
             short ones below
  --start-together
             start both instances at once (by default the second one starts once the
             first holds every shard); shows the start-up race described in BENCHMARKS.md
  --fan-out  the instances read with enhanced fan-out (one consumer, `failover`)
  --worker-timeout-ms N
             the instances' worker timeout (default: the library's)
  --freeze   also a frozen instance: SIGSTOP for 25 s, then SIGCONT
  --only-freeze
             only the crash and the frozen instance (no graceful stop)
  --help     this text";

#[derive(Debug, Clone)]
struct Options {
    reps: usize,
    rate: f64,
    /// Steady running with both instances before the stop.
    warm: Duration,
    /// Writing goes on this long after the takeover.
    after: Duration,
    quick: bool,
    /// Start both instances at once instead of one after the other.
    start_together: bool,
    /// The instances run with the library's defaults.
    defaults: bool,
    /// The instances read with enhanced fan-out.
    fan_out: bool,
    /// The instances' worker timeout in ms, when not the library's.
    worker_timeout_ms: Option<u64>,
    /// The ways one instance is stopped, in each repetition.
    stops: Vec<Stop>,
}

impl Options {
    fn parse(args: &[String]) -> Result<Option<Self>, String> {
        let mut options = Self {
            reps: 3,
            rate: 200.0,
            warm: Duration::from_secs(4),
            after: Duration::from_secs(2),
            quick: false,
            start_together: false,
            defaults: false,
            fan_out: false,
            worker_timeout_ms: None,
            stops: vec![Stop::Crash, Stop::Graceful],
        };
        let mut reps = None;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            match arg.as_str() {
                "--help" | "-h" => return Ok(None),
                "--quick" => options.quick = true,
                "--start-together" => options.start_together = true,
                "--defaults" => options.defaults = true,
                "--fan-out" => options.fan_out = true,
                "--worker-timeout-ms" => {
                    options.worker_timeout_ms = Some(
                        it.next()
                            .and_then(|v| v.parse::<u64>().ok())
                            .filter(|n| *n >= 300)
                            .ok_or("--worker-timeout-ms needs a number of ms, at least 300")?,
                    );
                }
                "--freeze" => options.stops.push(Stop::Freeze),
                "--only-freeze" => options.stops = vec![Stop::Crash, Stop::Freeze],
                "--reps" => {
                    reps = Some(
                        it.next()
                            .and_then(|v| v.parse::<usize>().ok())
                            .filter(|n| *n > 0)
                            .ok_or("--reps needs a positive number")?,
                    );
                }
                "--rate" => {
                    options.rate = it
                        .next()
                        .and_then(|v| v.parse::<f64>().ok())
                        .filter(|r| *r >= 4.0 && *r <= 4000.0)
                        .ok_or("--rate needs a number from 4 to 4000")?;
                }
                other => return Err(format!("unknown argument {other}")),
            }
        }
        if options.quick {
            options.reps = 1;
            options.warm = Duration::from_secs(2);
            options.after = Duration::from_secs(1);
        }
        if let Some(reps) = reps {
            options.reps = reps;
        }
        Ok(Some(options))
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "--instance") {
        if let Err(e) = instance::run(&args) {
            eprintln!("instance: {e}");
            std::process::exit(1);
        }
        return;
    }
    let options = match Options::parse(&args) {
        Ok(Some(options)) => options,
        Ok(None) => {
            println!("{USAGE}");
            return;
        }
        Err(message) => {
            eprintln!("{message}\n\n{USAGE}");
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Err(e) = runtime.block_on(bench(options)) {
        eprintln!("failover: {e}");
        std::process::exit(1);
    }
}

// ---------------------------------------------------------------------------------------------
// Shared helpers

/// Now, in nanoseconds since the Unix epoch (the clock every timestamp of the run uses).
pub fn unix_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn secs(nanos: u64) -> String {
    format!("{:.2} s", nanos as f64 / 1e9)
}

// ---------------------------------------------------------------------------------------------
// The run

async fn bench(options: Options) -> Result<()> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    ensure_npm_packages()?;
    let logs = manifest
        .join("target/emulator-logs")
        .join(std::process::id().to_string());
    std::fs::create_dir_all(&logs)?;
    let (kinesis, dynamodb) = tokio::join!(
        Emulator::start(Kind::Kinesis, &logs),
        Emulator::start(Kind::DynamoDb, &logs)
    );
    let (kinesis, dynamodb) = (kinesis?, dynamodb?);
    println!(
        "emulators: kinesis-local at {}, dynalite at {} (logs in {})",
        kinesis.endpoint(),
        dynamodb.endpoint(),
        logs.display()
    );
    if !options.defaults {
        println!(
            "settings: {SHARDS} shards, {} records/s, list_interval {:?}, lease_duration {:?} \
         (renewed every {:?}), checkpoint_interval {:?}, poll_interval {:?} (read-rate cap \
         lifted), shutdown_timeout {:?}; {} trial(s) of each kind, {:?} steady before the stop",
            options.rate,
            SETTINGS.list_interval,
            SETTINGS.lease_duration,
            SETTINGS.lease_duration / 3,
            SETTINGS.checkpoint_interval,
            SETTINGS.poll_interval,
            SETTINGS.shutdown_timeout,
            options.reps,
            options.warm
        );
    } else {
        println!(
            "settings: {SHARDS} shards, {} records/s, the library's defaults (list_interval \
             10 s, lease_duration 10 s, checkpoint_interval 5 s, one read a second per shard); \
             {} trial(s) of each kind, {:?} steady before the stop",
            options.rate, options.reps, options.warm
        );
    }
    let env = Env {
        defaults: options.defaults,
        fan_out: options.fan_out,
        worker_timeout_ms: options.worker_timeout_ms,
        kinesis: kinesis.endpoint().to_owned(),
        dynamodb: dynamodb.endpoint().to_owned(),
        logs: logs.clone(),
    };
    let mut results = Vec::new();
    let mut failures = Vec::new();
    let mut n = 0;
    for rep in 0..options.reps {
        for &kind in &options.stops {
            n += 1;
            // Alternate the stopped instance between repetitions.
            let victim = INSTANCES[rep % 2];
            match trial(&env, &options, n, kind, victim).await {
                Ok(result) => {
                    println!("{}", result.line(n));
                    results.push(result);
                }
                Err(e) => {
                    println!("trial {n} ({kind:?}, stopping {victim}) FAILED: {e}");
                    failures.push(format!("trial {n}: {e}"));
                }
            }
        }
    }
    kinesis.stop();
    dynamodb.stop();
    summary(&results);
    let problems: Vec<String> = results
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            r.problem()
                .map(|p| format!("{} ({:?}): {p}", i + 1, r.kind))
        })
        .collect();
    if !failures.is_empty() || !problems.is_empty() {
        return Err(format!(
            "{} trial(s) failed, {} with lost or unexpected records: {}",
            failures.len(),
            problems.len(),
            failures
                .iter()
                .chain(problems.iter())
                .cloned()
                .collect::<Vec<_>>()
                .join("; ")
        )
        .into());
    }
    Ok(())
}

struct Env {
    /// The instances run with the library's defaults.
    defaults: bool,
    /// The instances read with enhanced fan-out.
    fan_out: bool,
    /// The instances' worker timeout in ms, when not the library's.
    worker_timeout_ms: Option<u64>,
    kinesis: String,
    dynamodb: String,
    logs: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// SIGKILL.
    Crash,
    /// SIGTERM, handled by a graceful `Subscription` shutdown.
    Graceful,
    /// SIGSTOP for [`FROZEN_FOR`], then SIGCONT, then SIGKILL.
    Freeze,
}

/// How long a frozen instance stays stopped.
const FROZEN_FOR: Duration = Duration::from_secs(25);

/// One record as an instance handled it.
#[derive(Debug, Clone)]
struct Handled {
    instance: String,
    shard: String,
    counter: u64,
    received: u64,
}

/// What the children printed.
#[derive(Debug, Default)]
struct Observed {
    handled: Vec<Handled>,
    shards: HashMap<String, Vec<String>>,
    started: HashSet<String>,
    /// Every line the children printed, with the parent's time of reading it, and the
    /// parent's own events: written to the trial's log file for diagnosis.
    log: Vec<String>,
}

type Shared = Arc<Mutex<Observed>>;

/// One instance's child process.
struct Instance {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    reader: Option<JoinHandle<()>>,
}

impl Instance {
    fn spawn(env: &Env, name: &str, stream: &str, table: &str, seen: &Shared) -> Result<Self> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--instance", name, "--kinesis", &env.kinesis])
            .args(["--dynamodb", &env.dynamodb, "--stream", stream])
            .args(["--table", table])
            .args([
                "--settings",
                if env.defaults { "defaults" } else { "short" },
            ])
            .args(if env.fan_out {
                &["--fan-out", "failover"][..]
            } else {
                &[]
            })
            .args(
                env.worker_timeout_ms
                    .map(|ms| ["--worker-timeout-ms".to_owned(), ms.to_string()])
                    .into_iter()
                    .flatten(),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let seen = seen.clone();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                note(&seen, &line);
            }
        });
        Ok(Self {
            name: name.to_owned(),
            child,
            stdin,
            reader: Some(reader),
        })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    fn terminate(&self) -> Result<()> {
        self.signal(libc::SIGTERM)
    }

    fn signal(&self, signal: libc::c_int) -> Result<()> {
        // SAFETY: kill(2) on the pid of a child we have not reaped yet.
        if unsafe { libc::kill(self.pid(), signal) } != 0 {
            return Err(format!(
                "kill -{signal} {}: {}",
                self.pid(),
                std::io::Error::last_os_error()
            )
            .into());
        }
        Ok(())
    }

    /// Waits up to `patience` for the process to exit, then kills it; joins the reader.
    async fn finish(&mut self, patience: Duration) {
        let deadline = Instant::now() + patience;
        while !self.exited() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !self.exited() {
            eprintln!(
                "instance {} did not exit within {patience:?}: killed",
                self.name
            );
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        drop(self.stdin.take());
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Records one line of a child's output.
fn note(seen: &Shared, line: &str) {
    let mut parts = line.split(' ');
    let mut seen = lock(seen);
    seen.log.push(format!("{} {line}", unix_nanos()));
    match parts.next() {
        Some("@started") => {
            seen.started
                .insert(parts.next().unwrap_or_default().to_owned());
        }
        Some("@stopped") => {}
        Some("@shards") => {
            let name = parts.next().unwrap_or_default().to_owned();
            let shards = parts
                .next()
                .unwrap_or_default()
                .split(',')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect();
            seen.shards.insert(name, shards);
        }
        Some(instance) => {
            let (shard, counter, received) = (parts.next(), parts.next(), parts.next());
            if let (Some(shard), Some(Ok(counter)), Some(Ok(received))) = (
                shard,
                counter.map(str::parse::<u64>),
                received.map(str::parse::<u64>),
            ) {
                seen.handled.push(Handled {
                    instance: instance.to_owned(),
                    shard: shard.to_owned(),
                    counter,
                    received,
                });
            } else {
                eprintln!("unexpected line from an instance: {line:?}");
            }
        }
        None => {}
    }
}

// ---------------------------------------------------------------------------------------------
// The producer

/// One record written.
#[derive(Debug, Clone)]
struct Produced {
    shard: String,
    sent: u64,
}

#[derive(Debug, Default)]
struct Production {
    records: BTreeMap<u64, Produced>,
    failed: usize,
}

/// Writes one record to every shard (ExplicitHashKey = the shard's first hash key) every
/// `shards / rate` seconds until `stop`.
async fn produce(
    client: aws_sdk_kinesis::Client,
    stream: String,
    hash_keys: Vec<String>,
    rate: f64,
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
) -> Production {
    let mut production = Production::default();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(hash_keys.len() as f64 / rate));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut counter = 0u64;
    while !stop.load(Ordering::Acquire) {
        tick.tick().await;
        let sent = unix_nanos();
        let first = counter;
        let entries: Vec<PutRecordsRequestEntry> = hash_keys
            .iter()
            .map(|hash_key| {
                let entry = PutRecordsRequestEntry::builder()
                    .data(Blob::new(format!("{counter} {sent}")))
                    .partition_key(format!("k{counter}"))
                    .explicit_hash_key(hash_key)
                    .build()
                    .expect("a complete entry");
                counter += 1;
                entry
            })
            .collect();
        match client
            .put_records()
            .stream_name(&stream)
            .set_records(Some(entries))
            .send()
            .await
        {
            Ok(out) => {
                for (i, result) in out.records().iter().enumerate() {
                    match result.shard_id() {
                        Some(shard) if result.error_code().is_none() => {
                            production.records.insert(
                                first + i as u64,
                                Produced {
                                    shard: shard.to_owned(),
                                    sent,
                                },
                            );
                        }
                        _ => production.failed += 1,
                    }
                }
            }
            Err(e) => {
                eprintln!(
                    "PutRecords failed: {}",
                    aws_sdk_kinesis::error::DisplayErrorContext(e)
                );
                production.failed += hash_keys.len();
            }
        }
        written.store(counter, Ordering::Relaxed);
    }
    production
}

// ---------------------------------------------------------------------------------------------
// One trial

async fn trial(env: &Env, options: &Options, n: usize, kind: Stop, victim: &str) -> Result<Trial> {
    let client = kinesis_client_at(&env.kinesis);
    let stream = format!("failover-{}-{n}", std::process::id());
    let table = format!("failover-leases-{}-{n}", std::process::id());
    let hash_keys = create_stream(&client, &stream).await?;

    let seen = Shared::default();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let phase = Arc::new(Mutex::new("starting the instances"));
    let _progress = progress::Progress::start(
        format!(
            "failover, trial {n}/{}, {kind:?}, stopping {victim}",
            options.reps * 2
        ),
        {
            let (seen, written, phase) = (seen.clone(), written.clone(), phase.clone());
            move || {
                format!(
                    "{}; {} records written, {} handled",
                    lock(&phase),
                    progress::thousands(written.load(Ordering::Relaxed)),
                    progress::thousands(lock(&seen).handled.len() as u64)
                )
            }
        },
    );
    let mut instances = Vec::new();
    let ctx = TrialContext {
        env,
        options,
        kind,
        victim_name: victim,
        client: &client,
        stream: &stream,
        table: &table,
        hash_keys,
        seen: &seen,
        stop: stop.clone(),
        written,
        phase: &phase,
    };
    let result = run_trial(ctx, &mut instances).await;
    // The producer stops (also when the trial failed half-way).
    stop.store(true, Ordering::Release);
    for instance in &mut instances {
        if !instance.exited() {
            let _ = instance.terminate();
        }
        instance.finish(Duration::from_secs(20)).await;
    }
    let _ = client.delete_stream().stream_name(&stream).send().await;
    let file = env.logs.join(format!("trial-{n}.log"));
    let _ = std::fs::write(&file, lock(&seen).log.join("\n") + "\n");
    result.map_err(|e| format!("{e} (trial log: {})", file.display()).into())
}

struct TrialContext<'a> {
    env: &'a Env,
    options: &'a Options,
    kind: Stop,
    victim_name: &'a str,
    client: &'a aws_sdk_kinesis::Client,
    stream: &'a str,
    table: &'a str,
    hash_keys: Vec<String>,
    seen: &'a Shared,
    /// Stops the producer.
    stop: Arc<AtomicBool>,
    /// Records the producer has written, for the progress line.
    written: Arc<AtomicU64>,
    /// The step the trial is at, for the progress line.
    phase: &'a Mutex<&'static str>,
}

async fn run_trial(ctx: TrialContext<'_>, instances: &mut Vec<Instance>) -> Result<Trial> {
    let TrialContext {
        env,
        options,
        kind,
        victim_name,
        client,
        stream,
        table,
        hash_keys,
        seen,
        stop,
        written,
        phase,
    } = ctx;
    let step = |now: &'static str| *lock(phase) = now;
    let logs = || format!(" (emulator logs: {})", env.logs.display());
    let total = hash_keys.len();
    let producing = || {
        tokio::spawn(produce(
            client.clone(),
            stream.to_owned(),
            hash_keys.clone(),
            options.rate,
            stop.clone(),
            written.clone(),
        ))
    };
    let producer = if options.start_together {
        // Both at once: they race for the first leases (see `--start-together`).
        for name in INSTANCES {
            instances.push(Instance::spawn(env, name, stream, table, seen)?);
        }
        wait_for("both instances started", PATIENCE, POLL, || {
            lock(seen).started.len() == INSTANCES.len()
        })
        .await
        .map_err(|e| format!("{e}{}", logs()))?;
        producing()
    } else {
        // The first instance alone: it opens with every shard (at TRIM_HORIZON, so the
        // producer may start as soon as it has started). The second one joins, and the first
        // hands it half the shards gracefully.
        let (first, second) = (INSTANCES[0], INSTANCES[1]);
        instances.push(Instance::spawn(env, first, stream, table, seen)?);
        wait_for("the first instance started", PATIENCE, POLL, || {
            lock(seen).started.contains(first)
        })
        .await
        .map_err(|e| format!("{e}{}", logs()))?;
        let producer = producing();
        wait_for(
            "the first instance holding every shard",
            PATIENCE,
            POLL,
            || {
                lock(seen)
                    .shards
                    .get(first)
                    .is_some_and(|s| s.len() == total)
            },
        )
        .await
        .map_err(|e| format!("{e}{}", logs()))?;
        instances.push(Instance::spawn(env, second, stream, table, seen)?);
        producer
    };

    step("waiting for two shards each");
    wait_for("two shards each", PATIENCE, POLL, || {
        let seen = lock(seen);
        let held: Vec<&Vec<String>> = INSTANCES
            .iter()
            .filter_map(|name| seen.shards.get(*name))
            .collect();
        let all: BTreeSet<&String> = held.iter().flat_map(|s| s.iter()).collect();
        held.len() == INSTANCES.len()
            && held.iter().all(|s| s.len() == total / INSTANCES.len())
            && all.len() == total
    })
    .await
    .map_err(|e| format!("{e}{}", logs()))?;
    let balanced_at = unix_nanos();
    lock(seen).log.push(format!("{balanced_at} # balanced"));
    step("running steady before the stop");
    tokio::time::sleep(options.warm).await;

    let (victim_shards, handled_before) = {
        let seen = lock(seen);
        (
            seen.shards.get(victim_name).cloned().unwrap_or_default(),
            seen.handled.len(),
        )
    };
    let survivor_name = INSTANCES
        .iter()
        .find(|name| **name != victim_name)
        .copied()
        .unwrap_or_default();
    let victim = instances
        .iter_mut()
        .find(|i| i.name == victim_name)
        .ok_or("no such instance")?;
    let acted = unix_nanos();
    lock(seen).log.push(format!(
        "{acted} # {kind:?}: signal to {victim_name} holding {victim_shards:?}"
    ));
    match kind {
        Stop::Crash => victim.child.kill()?,
        Stop::Graceful => victim.terminate()?,
        Stop::Freeze => victim.signal(libc::SIGSTOP)?,
    }
    step("stopped one, waiting for the takeover");
    let mut victim_exit = None;
    let resumed = |seen: &Observed| -> bool {
        victim_shards.iter().all(|shard| {
            seen.handled[handled_before..]
                .iter()
                .any(|h| h.instance == survivor_name && &h.shard == shard && h.received > acted)
        })
    };
    let deadline = Instant::now() + PATIENCE;
    loop {
        if victim_exit.is_none() && (kind == Stop::Freeze || victim.exited()) {
            victim_exit = Some(unix_nanos());
        }
        if victim_exit.is_some() && resumed(&lock(seen)) {
            break;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{survivor_name} did not take over {victim_shards:?} of {victim_name} within \
                 {PATIENCE:?}{}",
                logs()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    if kind == Stop::Graceful
        && let Ok(Some(status)) = victim.child.try_wait()
        && !status.success()
    {
        return Err(format!("{victim_name} did not stop cleanly after SIGTERM: {status}").into());
    }
    // A frozen instance resumes, finds its leases taken, and is killed a moment later: what
    // it handled after resuming is counted below.
    let mut resumed_at = None;
    if kind == Stop::Freeze {
        let frozen = Duration::from_nanos(unix_nanos().saturating_sub(acted));
        tokio::time::sleep(FROZEN_FOR.saturating_sub(frozen)).await;
        resumed_at = Some(unix_nanos());
        lock(seen)
            .log
            .push(format!("{} # SIGCONT to {victim_name}", unix_nanos()));
        victim.signal(libc::SIGCONT)?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        victim.child.kill()?;
    }
    victim.finish(Duration::from_secs(1)).await;

    step("taken over, writing on");
    tokio::time::sleep(options.after).await;
    stop.store(true, Ordering::Release);
    let production = producer.await?;
    {
        let mut seen = lock(seen);
        for (counter, p) in &production.records {
            let line = format!("{} # produced {counter} on {}", p.sent, p.shard);
            seen.log.push(line);
        }
    }
    step("waiting for every record to be handled");
    wait_for(
        "every record handled",
        Duration::from_secs(20),
        POLL,
        || {
            let seen = lock(seen);
            let handled: HashSet<u64> = seen.handled.iter().map(|h| h.counter).collect();
            production.records.keys().all(|c| handled.contains(c))
        },
    )
    .await
    .or_else(|e| {
        // Analysed (and reported as lost) below.
        eprintln!("{e}");
        Ok::<(), BoxError>(())
    })?;
    let survivor = instances
        .iter_mut()
        .find(|i| i.name == survivor_name)
        .ok_or("no such instance")?;
    step("stopping the survivor");
    survivor.terminate()?;
    survivor.finish(Duration::from_secs(20)).await;

    let seen = lock(seen);
    // After it resumes, a frozen instance may join again and be handed shards, until the
    // SIGKILL that follows; the other one then reads them again from its last checkpoint.
    // Those duplicates are explained; a record it handled after resuming that the other had
    // handled before is not (a stale delivery: the fencing failed).
    let (stale_after_resume, redelivered_after_resume) = resumed_at.map_or((0, 0), |at| {
        let mut by_counter: HashMap<u64, Vec<&Handled>> = HashMap::new();
        for h in &seen.handled {
            by_counter.entry(h.counter).or_default().push(h);
        }
        let mut stale = 0;
        let mut again = 0;
        for hs in by_counter.values() {
            for h in hs
                .iter()
                .filter(|h| h.instance == victim_name && h.received > at)
            {
                if hs
                    .iter()
                    .any(|o| o.instance == survivor_name && o.received < h.received)
                {
                    stale += 1;
                } else if hs.len() == 2
                    && hs
                        .iter()
                        .any(|o| o.instance == survivor_name && o.received > h.received)
                {
                    again += 1;
                }
            }
        }
        (stale, again)
    });
    let mut trial = Trial::analyse(
        kind,
        victim_name,
        survivor_name,
        victim_shards,
        balanced_at,
        acted,
        victim_exit.unwrap_or(acted),
        &production,
        &seen.handled,
    );
    trial.after_resume = stale_after_resume;
    trial.redelivered_after_resume = redelivered_after_resume;
    trial.other_duplicates = trial
        .other_duplicates
        .saturating_sub(redelivered_after_resume);
    Ok(trial)
}

/// Creates the stream, waits for ACTIVE, returns each shard's first hash key (shard order).
async fn create_stream(client: &aws_sdk_kinesis::Client, stream: &str) -> Result<Vec<String>> {
    let mut shards: Vec<(String, String)> = create_stream_shards(client, stream, SHARDS)
        .await?
        .into_iter()
        .map(|s| {
            let first = s.hash_key_range().map(|r| r.starting_hash_key().to_owned());
            (s.shard_id, first.unwrap_or_default())
        })
        .collect();
    shards.sort();
    Ok(shards.into_iter().map(|(_, hash_key)| hash_key).collect())
}

// ---------------------------------------------------------------------------------------------
// Analysis

/// What one trial measured.
#[derive(Debug, Clone)]
struct Trial {
    kind: Stop,
    victim: String,
    /// The shards the stopped instance held, with the time from the signal until each
    /// delivered again on the other instance.
    resumed: Vec<(String, u64)>,
    /// Max of `resumed`.
    takeover: u64,
    /// The time from the signal until the stopped process had exited.
    exited: u64,
    /// The longest a record of the stopped instance's shards, sent from 1 s before the signal
    /// on, waited from its send to its first handling.
    worst_delay: u64,
    /// The median of that wait over every record sent while both instances ran.
    typical_delay: u64,
    produced: usize,
    put_failed: usize,
    handlings: usize,
    /// Records handled by the stopped instance and again by the other one after the signal,
    /// on the stopped instance's shards.
    redelivered: usize,
    /// How long before the signal the stopped instance had handled the first of them: how far
    /// behind its last checkpoint was.
    redelivered_span: Option<u64>,
    /// Shards where the redelivered records were not a tail of what the stopped instance had
    /// handled there (a redelivery that skipped some).
    not_a_tail: Vec<String>,
    /// Records handled more than once in any other way.
    other_duplicates: usize,
    /// Records written and never handled.
    lost: Vec<u64>,
    /// How many of them were written before the instances held two shards each.
    lost_before_balance: usize,
    /// Records a frozen instance handled after it resumed that the other instance had
    /// handled before (none may be).
    after_resume: usize,
    /// Records a frozen instance handled after it resumed (shards handed back to it) and the
    /// other instance again after its SIGKILL.
    redelivered_after_resume: usize,
}

impl Trial {
    #[allow(clippy::too_many_arguments)]
    fn analyse(
        kind: Stop,
        victim: &str,
        survivor: &str,
        victim_shards: Vec<String>,
        balanced_at: u64,
        acted: u64,
        victim_exit: u64,
        production: &Production,
        handled: &[Handled],
    ) -> Self {
        let mut by_counter: HashMap<u64, Vec<&Handled>> = HashMap::new();
        for h in handled {
            by_counter.entry(h.counter).or_default().push(h);
        }
        let lost: Vec<u64> = production
            .records
            .keys()
            .filter(|c| !by_counter.contains_key(c))
            .copied()
            .collect();

        let lost_before_balance = lost
            .iter()
            .filter(|c| production.records[*c].sent < balanced_at)
            .count();

        let resumed: Vec<(String, u64)> = victim_shards
            .iter()
            .map(|shard| {
                let first = handled
                    .iter()
                    .filter(|h| h.instance == survivor && &h.shard == shard && h.received > acted)
                    .map(|h| h.received)
                    .min()
                    .unwrap_or(acted);
                (shard.clone(), first - acted)
            })
            .collect();
        let takeover = resumed.iter().map(|(_, d)| *d).max().unwrap_or(0);

        let first_handling = |counter: &u64| {
            by_counter
                .get(counter)
                .and_then(|hs| hs.iter().map(|h| h.received).min())
        };
        let worst_delay = production
            .records
            .iter()
            .filter(|(_, p)| victim_shards.contains(&p.shard) && p.sent + 1_000_000_000 >= acted)
            .filter_map(|(c, p)| first_handling(c).map(|r| r.saturating_sub(p.sent)))
            .max()
            .unwrap_or(0);
        let mut steady: Vec<u64> = production
            .records
            .iter()
            .filter(|(_, p)| p.sent >= balanced_at && p.sent < acted)
            .filter_map(|(c, p)| first_handling(c).map(|r| r.saturating_sub(p.sent)))
            .collect();
        steady.sort_unstable();
        let typical_delay = steady.get(steady.len() / 2).copied().unwrap_or(0);

        // Duplicates: those the takeover explains (the stopped instance handled the record,
        // the other one handled it again after the signal, on one of the stopped instance's
        // shards) and any other.
        let mut redelivered: BTreeMap<&str, BTreeSet<u64>> = BTreeMap::new();
        let mut redelivered_first: Option<u64> = None;
        let mut other_duplicates = 0;
        for (counter, hs) in &by_counter {
            if hs.len() < 2 {
                continue;
            }
            let by_victim = hs.iter().filter(|h| h.instance == victim).count();
            let again = hs
                .iter()
                .filter(|h| h.instance == survivor && h.received > acted)
                .count();
            if by_victim == 1 && again == 1 && hs.len() == 2 && victim_shards.contains(&hs[0].shard)
            {
                redelivered
                    .entry(&hs[0].shard)
                    .or_default()
                    .insert(*counter);
                let at = hs
                    .iter()
                    .find(|h| h.instance == victim)
                    .map_or(acted, |h| h.received);
                redelivered_first = Some(redelivered_first.map_or(at, |f: u64| f.min(at)));
            } else {
                other_duplicates += hs.len() - 1;
            }
        }
        let not_a_tail = redelivered
            .iter()
            .filter(|(shard, again)| {
                let from = again.iter().next().copied().unwrap_or(u64::MAX);
                handled
                    .iter()
                    .filter(|h| h.instance == victim && &h.shard == *shard && h.counter >= from)
                    .any(|h| !again.contains(&h.counter))
            })
            .map(|(shard, _)| (*shard).to_owned())
            .collect();

        Self {
            kind,
            victim: victim.to_owned(),
            resumed,
            takeover,
            exited: victim_exit.saturating_sub(acted),
            worst_delay,
            typical_delay,
            produced: production.records.len(),
            put_failed: production.failed,
            handlings: handled.len(),
            redelivered: redelivered.values().map(BTreeSet::len).sum(),
            redelivered_span: redelivered_first.map(|f| acted.saturating_sub(f)),
            not_a_tail,
            other_duplicates,
            lost,
            lost_before_balance,
            after_resume: 0,
            redelivered_after_resume: 0,
        }
    }

    fn line(&self, n: usize) -> String {
        let resumed: Vec<String> = self
            .resumed
            .iter()
            .map(|(shard, d)| format!("{} after {}", short(shard), secs(*d)))
            .collect();
        format!(
            "trial {n}: {} of {}: exited after {}; its shards resumed on the other instance: {} \
             -> takeover {}; worst record delay {} (typical {:.0} ms); {} records written \
             ({} failed puts), {} handlings, {} redelivered{}, {} other duplicates, {} lost \
             ({} of them written before the balance){}{}",
            match self.kind {
                Stop::Crash => "SIGKILL",
                Stop::Graceful => "SIGTERM",
                Stop::Freeze => "SIGSTOP 25 s",
            },
            self.victim,
            secs(self.exited),
            resumed.join(", "),
            secs(self.takeover),
            secs(self.worst_delay),
            self.typical_delay as f64 / 1e6,
            self.produced,
            self.put_failed,
            self.handlings,
            self.redelivered,
            self.redelivered_span
                .map(|s| format!(" (handled up to {} before the signal)", secs(s)))
                .unwrap_or_default(),
            self.other_duplicates,
            self.lost.len(),
            self.lost_before_balance,
            if self.not_a_tail.is_empty() {
                String::new()
            } else {
                format!("; redelivered records NOT a tail on {:?}", self.not_a_tail)
            },
            if self.kind == Stop::Freeze {
                format!(
                    "; after resuming: {} handled that the other had (must be 0), {} handed \
                     back to it and read again after its SIGKILL",
                    self.after_resume, self.redelivered_after_resume
                )
            } else {
                String::new()
            }
        )
    }

    /// A correctness problem: lost records, duplicates the takeover does not explain, a
    /// redelivery that is not the stopped instance's tail, or any redelivery after a graceful
    /// stop.
    fn problem(&self) -> Option<String> {
        let mut problems = Vec::new();
        if !self.lost.is_empty() {
            let shown: Vec<String> = self.lost.iter().take(10).map(u64::to_string).collect();
            problems.push(format!(
                "{} lost, {} of them written before the balance (counters {})",
                self.lost.len(),
                self.lost_before_balance,
                shown.join(" ")
            ));
        }
        if self.other_duplicates > 0 {
            problems.push(format!("{} unexplained duplicates", self.other_duplicates));
        }
        if !self.not_a_tail.is_empty() {
            problems.push(format!("redelivery not a tail on {:?}", self.not_a_tail));
        }
        if self.after_resume > 0 {
            problems.push(format!(
                "{} handled by the frozen instance after it resumed, after the other had",
                self.after_resume
            ));
        }
        if self.kind == Stop::Graceful && self.redelivered > 0 {
            problems.push(format!(
                "{} redelivered after a graceful stop",
                self.redelivered
            ));
        }
        (!problems.is_empty()).then(|| problems.join(", "))
    }
}

/// `shardId-000000000002` -> `shard 2`.
fn short(shard: &str) -> String {
    shard
        .strip_prefix("shardId-")
        .and_then(|n| n.parse::<u64>().ok())
        .map_or_else(|| shard.to_owned(), |n| format!("shard {n}"))
}

fn median_max(values: &mut [u64]) -> (u64, u64) {
    values.sort_unstable();
    let n = values.len();
    if n == 0 {
        return (0, 0);
    }
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2
    };
    (median, values[n - 1])
}

fn summary(results: &[Trial]) {
    println!();
    println!(
        "| stop | trials | takeover gap, median (max) | worst record delay, median (max) | \
         process exit after the signal, median (max) | redelivered, median (max) | other \
         duplicates | lost |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for kind in [Stop::Crash, Stop::Graceful, Stop::Freeze] {
        let trials: Vec<&Trial> = results.iter().filter(|t| t.kind == kind).collect();
        if trials.is_empty() {
            continue;
        }
        let pick = |f: fn(&Trial) -> u64| {
            let mut values: Vec<u64> = trials.iter().map(|t| f(t)).collect();
            median_max(&mut values)
        };
        let (takeover, takeover_max) = pick(|t| t.takeover);
        let (delay, delay_max) = pick(|t| t.worst_delay);
        let (exit, exit_max) = pick(|t| t.exited);
        let (again, again_max) = pick(|t| t.redelivered as u64);
        println!(
            "| {} | {} | {} ({}) | {} ({}) | {} ({}) | {again} ({again_max}) | {} | {} |",
            match kind {
                Stop::Crash => "crash (SIGKILL)",
                Stop::Graceful => "graceful (SIGTERM)",
                Stop::Freeze => "frozen (SIGSTOP 25 s)",
            },
            trials.len(),
            secs(takeover),
            secs(takeover_max),
            secs(delay),
            secs(delay_max),
            secs(exit),
            secs(exit_max),
            trials.iter().map(|t| t.other_duplicates).sum::<usize>(),
            trials.iter().map(|t| t.lost.len()).sum::<usize>(),
        );
    }
}
