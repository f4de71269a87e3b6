//! Test harness shared by the integration tests: real wire-protocol emulators
//! for Kinesis (`kinesis-local`) and DynamoDB (`dynalite`), started once per
//! test process.
//!
//! Use it from an integration test with `mod support;`. Every public function
//! may be called from plain `#[test]`s and from `#[tokio::test]`s of any flavor.
//!
//! * The npm packages pinned in `harness/package.json` are installed on first
//!   use (`npm ci` in `harness/`, under a cross-process lock) when missing.
//! * The emulators start lazily, one of each per test process, on free ports,
//!   through `harness/launch.js`, which kills the emulator as soon as this
//!   process goes away (its stdin pipe reaches EOF), however it ends.
//! * Their output goes to [`logs_dir()`]
//!   (`target/emulator-logs/<test-binary>-<pid>/{kinesis,dynamodb}.log`).
//!
//! SDK clients hold connection pools bound to the tokio runtime that first uses
//! them: make a fresh client in each test (they are cheap) rather than caching
//! one in a static shared by tests with different runtimes.
#![allow(dead_code)]

pub mod cutoff;
pub mod events;
pub mod outage;
pub mod proxy;
pub mod reading;
pub mod shipped;
pub mod suites;

use std::fs;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_kinesis::config::retry::RetryConfig;
use aws_sdk_kinesis::config::timeout::TimeoutConfig;
use aws_sdk_kinesis::config::{Credentials, SharedCredentialsProvider};

/// How long an emulator may take to answer its first API call.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two readiness probes.
const READY_POLL: Duration = Duration::from_millis(100);
/// How long to wait for another process's `npm ci` before giving up.
const NPM_LOCK_TIMEOUT: Duration = Duration::from_secs(600);
/// A lock directory older than this is considered abandoned.
const NPM_LOCK_STALE_AFTER: Duration = Duration::from_secs(900);
/// How many times to start an emulator that exits before answering.
const START_ATTEMPTS: u32 = 3;
/// How many trailing log lines a panic message shows.
const LOG_TAIL_LINES: usize = 40;

/// The region every client and the Kinesis emulator use.
pub const REGION: &str = "us-east-1";

// ---------------------------------------------------------------------------
// Paths

/// The crate root (where `Cargo.toml` and `harness/` are).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `harness/` folder holding `launch.js` and the npm packages.
pub fn harness_dir() -> PathBuf {
    repo_root().join("harness")
}

/// Cargo's target directory (`$CARGO_TARGET_DIR` if set, else `target/`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root().join(dir)
            }
        }
        _ => repo_root().join("target"),
    }
}

/// Name of the running test binary without Cargo's `-<hash>` suffix.
fn test_binary_name() -> String {
    let stem = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "tests".to_owned());
    match stem.rsplit_once('-') {
        Some((name, hash))
            if !name.is_empty()
                && hash.len() >= 8
                && hash.chars().all(|c| c.is_ascii_hexdigit()) =>
        {
            name.to_owned()
        }
        _ => stem,
    }
}

/// This test process's log folder:
/// `target/emulator-logs/<test-binary-name>-<pid>/`. Created on first call.
/// Print it from a failing test to point at the emulators' output.
pub fn logs_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = target_dir().join("emulator-logs").join(format!(
            "{}-{}",
            test_binary_name(),
            std::process::id()
        ));
        if let Err(err) = fs::create_dir_all(&dir) {
            panic!(
                "test harness: cannot create the emulator log folder {}: {err}",
                dir.display()
            );
        }
        dir
    })
    .clone()
}

/// The last `n` lines of a log file, or a note saying why there are none.
pub fn log_tail(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(n);
            if lines.is_empty() {
                "(log is empty)".to_owned()
            } else {
                lines[start..].join("\n")
            }
        }
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}

// ---------------------------------------------------------------------------
// npm packages

/// Makes sure `harness/node_modules` holds the pinned emulators, running
/// `npm ci` under a cross-process lock when they are missing. Called by the
/// emulator start-up; idempotent and cheap once installed.
pub fn ensure_npm_packages() {
    static DONE: OnceLock<()> = OnceLock::new();
    DONE.get_or_init(install_npm_packages);
}

fn npm_packages_present(harness: &Path) -> bool {
    harness.join("node_modules/kinesis-local/main.js").is_file()
        && harness.join("node_modules/dynalite/cli.js").is_file()
}

/// Removes the lock directory when dropped.
struct LockGuard(PathBuf);

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Whether the lock at `lock` was left behind by a process that is gone, or
/// is older than any install could take.
fn lock_is_stale(lock: &Path) -> bool {
    if let Ok(owner) = fs::read_to_string(lock.join("owner"))
        && let Some(pid) = owner.split_whitespace().next()
        && Path::new("/proc/self").exists()
        && !Path::new("/proc").join(pid).exists()
    {
        return true;
    }
    fs::metadata(lock)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age > NPM_LOCK_STALE_AFTER)
}

fn install_npm_packages() {
    let harness = harness_dir();
    let lock = target_dir().join("emulator-npm-ci.lock");
    let started = Instant::now();
    loop {
        // Files first, lock second: if the files exist and nobody holds the
        // lock afterwards, whoever created them has finished.
        if npm_packages_present(&harness) && !lock.exists() {
            return;
        }
        if let Some(parent) = lock.parent() {
            let _ = fs::create_dir_all(parent);
        }
        match fs::create_dir(&lock) {
            Ok(()) => {
                let guard = LockGuard(lock.clone());
                let _ = fs::write(
                    lock.join("owner"),
                    format!("{} {}\n", std::process::id(), test_binary_name()),
                );
                if !npm_packages_present(&harness) {
                    run_npm_ci(&harness);
                }
                drop(guard);
                return;
            }
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                if lock_is_stale(&lock) {
                    eprintln!("test harness: removing stale npm lock {}", lock.display());
                    let _ = fs::remove_dir_all(&lock);
                    continue;
                }
                if started.elapsed() > NPM_LOCK_TIMEOUT {
                    panic!(
                        "test harness: waited {:?} for another process's `npm ci` (lock {}); \
                         remove the lock if no test is running (logs: {})",
                        NPM_LOCK_TIMEOUT,
                        lock.display(),
                        logs_dir().display()
                    );
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            Err(err) => panic!(
                "test harness: cannot create the npm lock {}: {err} (logs: {})",
                lock.display(),
                logs_dir().display()
            ),
        }
    }
}

fn run_npm_ci(harness: &Path) {
    let command = format!("npm ci --no-audit --no-fund (in {})", harness.display());
    eprintln!("test harness: emulators not installed; running {command}");
    let output = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(harness)
        .stdin(Stdio::null())
        .output();
    match output {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "test harness: `{command}` failed with {}:\n--- stdout ---\n{}\n--- stderr ---\n{}\n\
             (Node.js and npm are needed to run the emulators; logs: {})",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            logs_dir().display()
        ),
        Err(err) => panic!(
            "test harness: cannot run `{command}`: {err}. Node.js (with npm) must be on \
             PATH to run the Kinesis and DynamoDB emulators (logs: {})",
            logs_dir().display()
        ),
    }
    if !npm_packages_present(harness) {
        panic!(
            "test harness: `{command}` succeeded but harness/node_modules/kinesis-local/main.js \
             or harness/node_modules/dynalite/cli.js is still missing (logs: {})",
            logs_dir().display()
        );
    }
}

// ---------------------------------------------------------------------------
// Emulators

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Kinesis,
    DynamoDb,
}

impl Kind {
    fn arg(self) -> &'static str {
        match self {
            Kind::Kinesis => "kinesis",
            Kind::DynamoDb => "dynamodb",
        }
    }
}

/// A running emulator. Lives in a static for the whole test process: the
/// launcher's stdin pipe stays open until the process exits, which is what
/// keeps the emulator alive.
struct Emulator {
    kind: Kind,
    port: u16,
    tls_port: u16,
    endpoint: String,
    log: PathBuf,
    child: Mutex<Child>,
    stdin: Mutex<Option<ChildStdin>>,
}

impl Emulator {
    /// `Err` if the launcher (and so the emulator) has exited.
    fn check_alive(&self) -> Result<(), String> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        match child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "the {} emulator exited ({status})",
                self.kind.arg()
            )),
            Err(err) => Err(format!(
                "cannot poll the {} emulator's launcher: {err}",
                self.kind.arg()
            )),
        }
    }

    fn kill(&self) {
        // Closing stdin makes launch.js stop the emulator; kill the launcher
        // too in case it is wedged.
        drop(self.stdin.lock().unwrap_or_else(|e| e.into_inner()).take());
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        std::thread::sleep(Duration::from_millis(200));
        if let Ok(None) = child.try_wait() {
            let _ = child.kill();
        }
        let _ = child.wait();
    }

    fn failure(&self, what: &str) -> String {
        format!(
            "test harness: {what}\n  endpoint: {}\n  log: {}\n  logs dir: {}\n--- last lines of {} ---\n{}",
            self.endpoint,
            self.log.display(),
            logs_dir().display(),
            self.log.display(),
            log_tail(&self.log, LOG_TAIL_LINES)
        )
    }
}

/// A free TCP port on 127.0.0.1 (bound, read, released).
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|err| {
        panic!(
            "test harness: cannot bind 127.0.0.1:0 to find a free port: {err} (logs: {})",
            logs_dir().display()
        )
    });
    listener
        .local_addr()
        .expect("test harness: local_addr of a bound listener")
        .port()
}

fn spawn_emulator(kind: Kind) -> Emulator {
    ensure_npm_packages();
    let port = free_port();
    let tls_port = match kind {
        Kind::Kinesis => loop {
            let p = free_port();
            if p != port {
                break p;
            }
        },
        Kind::DynamoDb => 0,
    };
    let log = logs_dir().join(format!("{}.log", kind.arg()));
    let open_log = || {
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap_or_else(|err| {
                panic!(
                    "test harness: cannot open {}: {err} (logs: {})",
                    log.display(),
                    logs_dir().display()
                )
            })
    };
    let launcher = harness_dir().join("launch.js");
    let mut child = Command::new("node")
        .arg(&launcher)
        .arg(kind.arg())
        .arg(port.to_string())
        .arg(tls_port.to_string())
        .arg(&log)
        .current_dir(repo_root())
        .stdin(Stdio::piped())
        .stdout(open_log())
        .stderr(open_log())
        .spawn()
        .unwrap_or_else(|err| {
            panic!(
                "test harness: cannot run `node {} {} {port} {tls_port} {}`: {err}. \
                 Node.js must be on PATH to run the emulators (logs: {})",
                launcher.display(),
                kind.arg(),
                log.display(),
                logs_dir().display()
            )
        });
    let stdin = child.stdin.take();
    Emulator {
        kind,
        port,
        tls_port,
        endpoint: format!("http://127.0.0.1:{port}"),
        log,
        child: Mutex::new(child),
        stdin: Mutex::new(stdin),
    }
}

/// One API call against the emulator; `Ok` once it answers successfully.
async fn probe(kind: Kind, endpoint: &str) -> Result<(), String> {
    let timeouts = TimeoutConfig::builder()
        .connect_timeout(Duration::from_secs(1))
        .operation_timeout(Duration::from_secs(3))
        .build();
    let config = sdk_config();
    match kind {
        Kind::Kinesis => {
            let conf = aws_sdk_kinesis::config::Builder::from(&config)
                .endpoint_url(endpoint)
                .retry_config(RetryConfig::disabled())
                .timeout_config(timeouts)
                .build();
            aws_sdk_kinesis::Client::from_conf(conf)
                .list_streams()
                .send()
                .await
                .map(drop)
                .map_err(|e| format!("{:?}", aws_sdk_kinesis::error::DisplayErrorContext(e)))
        }
        Kind::DynamoDb => {
            let conf = aws_sdk_dynamodb::config::Builder::from(&config)
                .endpoint_url(endpoint)
                .retry_config(RetryConfig::disabled())
                .timeout_config(timeouts)
                .build();
            aws_sdk_dynamodb::Client::from_conf(conf)
                .list_tables()
                .send()
                .await
                .map(drop)
                .map_err(|e| format!("{:?}", aws_sdk_dynamodb::error::DisplayErrorContext(e)))
        }
    }
}

/// Polls `probe` every [`READY_POLL`] until it succeeds, the emulator dies, or
/// [`READY_TIMEOUT`] passes. Runs its own current-thread runtime, so call it
/// from a plain thread.
fn wait_ready(emulator: &Emulator) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot build a tokio runtime for the readiness probe: {e}"))?;
    let started = Instant::now();
    loop {
        emulator.check_alive()?;
        let last_error = match runtime.block_on(probe(emulator.kind, &emulator.endpoint)) {
            Ok(()) => return Ok(()),
            Err(err) => err,
        };
        if started.elapsed() > READY_TIMEOUT {
            return Err(format!(
                "the {} emulator did not answer within {:?}; last error: {last_error}",
                emulator.kind.arg(),
                READY_TIMEOUT
            ));
        }
        std::thread::sleep(READY_POLL);
    }
}

/// Starts an emulator and waits until it answers. The readiness check runs on
/// its own std thread so this works from inside any tokio runtime.
fn start(kind: Kind) -> Result<Emulator, String> {
    let emulator = std::thread::Builder::new()
        .name(format!("{}-emulator-start", kind.arg()))
        .spawn(move || {
            let mut attempt = 1;
            loop {
                let emulator = spawn_emulator(kind);
                let Err(err) = wait_ready(&emulator) else {
                    return Ok(emulator);
                };
                // An emulator that exited before answering most likely lost
                // its free port to another process: try again on new ports.
                let exited = emulator.check_alive().is_err();
                let message = emulator.failure(&err);
                emulator.kill();
                if !exited || attempt == START_ATTEMPTS {
                    return Err(message);
                }
                eprintln!(
                    "test harness: {} emulator exited during start-up (attempt {attempt}); \
                     retrying on new ports (log: {})",
                    kind.arg(),
                    emulator.log.display()
                );
                attempt += 1;
            }
        })
        .map_err(|e| format!("test harness: cannot spawn a thread: {e}"))?
        .join();
    match emulator {
        Ok(result) => result,
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "unknown panic".to_owned());
            let logs = logs_dir().display().to_string();
            if what.contains(&logs) {
                Err(format!(
                    "starting the {} emulator failed: {what}",
                    kind.arg()
                ))
            } else {
                Err(format!(
                    "test harness: starting the {} emulator panicked: {what} (logs: {logs})",
                    kind.arg()
                ))
            }
        }
    }
}

/// The emulator of `kind`, started on first use. A failed start is remembered
/// so later tests fail fast with the same message instead of starting again.
fn emulator(kind: Kind) -> &'static Emulator {
    static KINESIS: OnceLock<Result<Emulator, String>> = OnceLock::new();
    static DYNAMODB: OnceLock<Result<Emulator, String>> = OnceLock::new();
    let cell = match kind {
        Kind::Kinesis => &KINESIS,
        Kind::DynamoDb => &DYNAMODB,
    };
    match cell.get_or_init(|| start(kind)) {
        Ok(emulator) => emulator,
        Err(message) => panic!("{message}"),
    }
}

/// `http://127.0.0.1:PORT` of this process's Kinesis emulator (started on
/// first use).
pub fn kinesis_endpoint() -> String {
    emulator(Kind::Kinesis).endpoint.clone()
}

/// Port of the Kinesis emulator's TLS (HTTP/2) listener, which serves a
/// self-signed certificate.
pub fn kinesis_tls_port() -> u16 {
    emulator(Kind::Kinesis).tls_port
}

/// `http://127.0.0.1:PORT` of this process's DynamoDB emulator (started on
/// first use).
pub fn dynamodb_endpoint() -> String {
    emulator(Kind::DynamoDb).endpoint.clone()
}

/// Path of the Kinesis emulator's log file.
pub fn kinesis_log() -> PathBuf {
    emulator(Kind::Kinesis).log.clone()
}

/// Path of the DynamoDB emulator's log file.
pub fn dynamodb_log() -> PathBuf {
    emulator(Kind::DynamoDb).log.clone()
}

/// Panics (with the log tail) if an emulator that was started has died since.
pub fn assert_emulators_alive() {
    for kind in [Kind::Kinesis, Kind::DynamoDb] {
        let emulator = emulator(kind);
        if let Err(err) = emulator.check_alive() {
            panic!("{}", emulator.failure(&err));
        }
    }
}

// ---------------------------------------------------------------------------
// SDK configuration and clients

/// Shared SDK config: region `us-east-1`, static dummy credentials, latest
/// behavior version. Has no endpoint: use [`kinesis_client`] /
/// [`dynamodb_client`], or set `endpoint_url` on the service config yourself.
pub fn sdk_config() -> SdkConfig {
    SdkConfig::builder()
        .region(Region::new(REGION))
        .credentials_provider(SharedCredentialsProvider::new(Credentials::new(
            "test",
            "test",
            None,
            None,
            "kinesis-dataflow-tests",
        )))
        .behavior_version(BehaviorVersion::latest())
        .build()
}

/// Kinesis service config builder pointed at the emulator (starts it if
/// needed); tweak it (retries, timeouts) before `build()`.
pub fn kinesis_config_builder() -> aws_sdk_kinesis::config::Builder {
    aws_sdk_kinesis::config::Builder::from(&sdk_config()).endpoint_url(kinesis_endpoint())
}

/// DynamoDB service config builder pointed at the emulator (starts it if
/// needed).
pub fn dynamodb_config_builder() -> aws_sdk_dynamodb::config::Builder {
    aws_sdk_dynamodb::config::Builder::from(&sdk_config()).endpoint_url(dynamodb_endpoint())
}

/// A fresh Kinesis client for this process's emulator (starts it if needed).
pub fn kinesis_client() -> aws_sdk_kinesis::Client {
    aws_sdk_kinesis::Client::from_conf(kinesis_config_builder().build())
}

/// A fresh DynamoDB client for this process's emulator (starts it if needed).
pub fn dynamodb_client() -> aws_sdk_dynamodb::Client {
    aws_sdk_dynamodb::Client::from_conf(dynamodb_config_builder().build())
}

// ---------------------------------------------------------------------------
// Helpers

/// A name unique within this test process and across concurrent test
/// processes: `<prefix>-<pid>-<n>`. Valid as a Kinesis stream, consumer or
/// DynamoDB table name when `prefix` uses only `[A-Za-z0-9_.-]`.
pub fn unique_name(prefix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// Creates stream `name` with `shards` shards and waits until
/// `DescribeStreamSummary` reports it `ACTIVE`. Returns the stream ARN.
pub async fn create_stream(client: &aws_sdk_kinesis::Client, name: &str, shards: i32) -> String {
    if let Err(err) = client
        .create_stream()
        .stream_name(name)
        .shard_count(shards)
        .send()
        .await
    {
        panic!(
            "test harness: CreateStream {name} ({shards} shards) failed: {} (logs: {})",
            aws_sdk_kinesis::error::DisplayErrorContext(err),
            logs_dir().display()
        );
    }
    wait_active(client, name).await
}

/// Waits (polling `DescribeStreamSummary` every 50 ms, up to 30 s) until stream
/// `name` is `ACTIVE`, e.g. after `CreateStream`, `SplitShard`, `MergeShards` or
/// `UpdateShardCount`. Returns the stream ARN.
pub async fn wait_active(client: &aws_sdk_kinesis::Client, name: &str) -> String {
    use aws_sdk_kinesis::types::StreamStatus;

    let started = Instant::now();
    loop {
        let summary = client
            .describe_stream_summary()
            .stream_name(name)
            .send()
            .await
            .unwrap_or_else(|err| {
                panic!(
                    "test harness: DescribeStreamSummary {name} failed: {} (logs: {})",
                    aws_sdk_kinesis::error::DisplayErrorContext(err),
                    logs_dir().display()
                )
            });
        if let Some(description) = summary.stream_description_summary()
            && description.stream_status() == &StreamStatus::Active
        {
            return description.stream_arn().to_owned();
        }
        if started.elapsed() > Duration::from_secs(30) {
            panic!(
                "test harness: stream {name} not ACTIVE after 30s: {summary:?} (logs: {})",
                logs_dir().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (polling `DescribeTable` every 20 ms, up to 30 s) until DynamoDB table
/// `table` is `ACTIVE`. dynalite answers `CreateTable` while the table is still
/// `CREATING` (even with `--createTableMs 0`), and item operations on it fail
/// with `ResourceNotFoundException` until then.
pub async fn wait_table_active(client: &aws_sdk_dynamodb::Client, table: &str) {
    use aws_sdk_dynamodb::types::TableStatus;

    let started = Instant::now();
    loop {
        let described = client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .unwrap_or_else(|err| {
                panic!(
                    "test harness: DescribeTable {table} failed: {} (logs: {})",
                    aws_sdk_dynamodb::error::DisplayErrorContext(err),
                    logs_dir().display()
                )
            });
        if described
            .table()
            .and_then(|t| t.table_status())
            .is_some_and(|status| status == &TableStatus::Active)
        {
            return;
        }
        if started.elapsed() > Duration::from_secs(30) {
            panic!(
                "test harness: table {table} not ACTIVE after 30s: {described:?} (logs: {})",
                logs_dir().display()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends the library's tracing to the test output, filtered by `RUST_LOG` (nothing when it is
/// unset). Safe to call from every test.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// The broker face on this process's emulators, with a lease table of its own application.
pub fn live_broker(application: &str) -> kinesis_dataflow::broker::KinesisBroker {
    kinesis_dataflow::broker::KinesisBroker::new()
        .sdk_config(sdk_config())
        .kinesis_endpoint(kinesis_endpoint())
        .dynamodb_endpoint(dynamodb_endpoint())
        .application(application)
}
