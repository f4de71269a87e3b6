//! What the `drain` and `probes` binaries share: the ferrokinesis child process, the CPU and
//! memory readings from `/proc`, loading records, counting decorators over the library's two
//! seams (`KinesisApi`, `LeaseStore`), the byte-lane input the RustStream apps take, small
//! statistics, and the progress lines long phases print on stderr ([`Progress`]). The SDK
//! configuration, stream creation and waits come from the `kinesis-dataflow-test-support`
//! crate the tests use too.
//!
//! Every binary of this package serves the emulator when re-run with `--serve-emulator`
//! ([`SERVE_EMULATOR`]): its `main` must call [`serve_emulator`] first thing when it sees it.

use std::collections::BTreeMap;
use std::error::Error;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use kinesis_dataflow::api::layer::{ApiCall, KinesisLayer, Layered};
use kinesis_dataflow::api::{ApiFuture, SharedKinesis};
use kinesis_dataflow::lease::layer::{LayeredStore, LeaseCall, LeaseLayer};
use kinesis_dataflow::lease::{LeaseFuture, SharedLeaseStore};
use ruststream::runtime::{Deserialized, Input, SoloDeserialized};

pub mod progress;
pub use progress::{Progress, thousands};

/// The error every function here returns.
pub type BoxError = Box<dyn Error + Send + Sync>;
/// A result with [`BoxError`].
pub type Result<T, E = BoxError> = std::result::Result<T, E>;

/// The size of every record the harness writes.
pub const RECORD_BYTES: usize = 100;
/// Records per PutRecords call when loading a backlog (the service's maximum).
pub const PUT_BATCH: usize = 500;
/// The argument that turns any binary of this package into the emulator process.
pub const SERVE_EMULATOR: &str = "--serve-emulator";
/// Set (to anything) in the emulator child's environment to apply the write limits.
const ENFORCE_LIMITS_ENV: &str = "E2E_ENFORCE_LIMITS";
/// Set in the emulator child's environment (to a certificate's PEM, with [`TLS_KEY_ENV`]) to
/// serve over TLS.
const TLS_CERT_ENV: &str = "E2E_TLS_CERT";
/// The private key (PEM) of [`TLS_CERT_ENV`]'s certificate.
const TLS_KEY_ENV: &str = "E2E_TLS_KEY";
/// The emulator's open-shard limit across all its streams (ferrokinesis's default is 10): room
/// for the idle probe's two streams (polling and fan-out) of up to 2,000 shards each.
pub const SHARD_LIMIT: u32 = 4_000;
/// The line the emulator process prints once it listens.
const READY_PREFIX: &str = "ferrokinesis listening on port ";

/// The client runtime of every measurement: tokio multi-thread with 2 workers, the machine's
/// core count.
///
/// # Errors
///
/// When the runtime cannot be built.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

// ---------------------------------------------------------------------------------------------
// The emulator process
// ---------------------------------------------------------------------------------------------

/// `<binary> --serve-emulator`: ferrokinesis on a free port of 127.0.0.1, until stdin closes
/// (the parent exited or dropped its end).
///
/// # Errors
///
/// When the runtime cannot be built or the port cannot be bound.
pub fn serve_emulator() -> Result<()> {
    runtime()?.block_on(async {
        let options = ferrokinesis::store::StoreOptions {
            // CreateStream completes in 10 ms instead of the simulated 500 ms.
            create_stream_ms: 10,
            delete_stream_ms: 10,
            update_stream_ms: 10,
            // The default caps open shards at 10 across all streams.
            shard_limit: SHARD_LIMIT,
            // The default 300 s (the service's) is enough for one drain; a slow machine is
            // given slack so an expiry never lands inside a timed drain or a probe.
            iterator_ttl_seconds: 3_600,
            // Write throttling (1 MB/s, 1,000 records/s per shard) stays off unless the parent
            // asks for it (`Emulator::start_enforcing_limits`, the publishing benchmark's
            // limited ways): a backlog is loaded as fast as the emulator takes it. Reads are
            // never rate-limited.
            enforce_limits: std::env::var_os(ENFORCE_LIMITS_ENV).is_some(),
            ..ferrokinesis::store::StoreOptions::default()
        };
        let (app, _store) = ferrokinesis::create_app(options);
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        std::thread::spawn(|| {
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            std::process::exit(0);
        });
        let tls = std::env::var(TLS_CERT_ENV)
            .ok()
            .zip(std::env::var(TLS_KEY_ENV).ok());
        if let Some((cert, key)) = tls {
            // ALPN `h2, http/1.1` (axum-server's rustls configuration); HTTP/1.1 and HTTP/2
            // are both served (hyper-util's auto builder).
            let config = axum_server::tls_rustls::RustlsConfig::from_pem(
                cert.into_bytes(),
                key.into_bytes(),
            )
            .await?;
            println!("{READY_PREFIX}{port}");
            axum_server::from_tcp_rustls(listener, config)?
                .serve(app.into_make_service())
                .await?;
        } else {
            println!("{READY_PREFIX}{port}");
            axum::serve(tokio::net::TcpListener::from_std(listener)?, app).await?;
        }
        Ok(())
    })
}

/// A self-signed certificate for `localhost` and `127.0.0.1`, made for one run: the emulator
/// serves it ([`Emulator::start_tls`]) and the client trusts exactly it ([`Self::https_client`]).
#[derive(Clone)]
pub struct TlsIdentity {
    /// The certificate, PEM.
    pub cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").finish_non_exhaustive()
    }
}

impl TlsIdentity {
    /// Makes a key pair and a certificate for `localhost` and `127.0.0.1`.
    ///
    /// # Errors
    ///
    /// When rcgen cannot make them.
    pub fn generate() -> Result<Self> {
        let made =
            rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])?;
        Ok(Self {
            cert_pem: made.cert.pem(),
            key_pem: made.signing_key.serialize_pem(),
        })
    }

    /// The SDK's HTTPS client as its default is built (hyper over rustls with aws-lc, ALPN
    /// `h2, http/1.1`), with this certificate as its only trusted root.
    ///
    /// # Errors
    ///
    /// When the TLS context cannot be built.
    pub fn https_client(&self) -> Result<aws_sdk_kinesis::config::SharedHttpClient> {
        use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
        use aws_smithy_http_client::tls::{Provider, TlsContext, TrustStore};
        let trust = TrustStore::empty().with_pem_certificate(self.cert_pem.clone().into_bytes());
        Ok(aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
            .tls_context(TlsContext::builder().with_trust_store(trust).build()?)
            .build_https())
    }
}

/// The emulator child process (this binary re-run with [`SERVE_EMULATOR`]); killed when
/// dropped.
#[derive(Debug)]
pub struct Emulator {
    child: Child,
    /// Held open: the child exits when it closes.
    _stdin: ChildStdin,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    /// Whether it serves over TLS.
    tls: bool,
}

impl Emulator {
    /// Starts the child and waits until it listens.
    ///
    /// # Errors
    ///
    /// When the child cannot be started or does not report its port.
    pub fn start() -> Result<Self> {
        Self::start_child(false, None)
    }

    /// Starts the child serving over TLS with `identity` (ALPN `h2, http/1.1`, as Kinesis
    /// serves) and waits until it listens; [`Self::endpoint`] is then `https://localhost:<port>`.
    ///
    /// # Errors
    ///
    /// When the child cannot be started or does not report its port.
    pub fn start_tls(identity: &TlsIdentity) -> Result<Self> {
        Self::start_child(false, Some(identity))
    }

    /// Starts the child with the service's per-shard write limits applied (1,000 records/s
    /// and 1 MiB/s per shard; ferrokinesis's `--enforce-limits`) and waits until it listens.
    ///
    /// # Errors
    ///
    /// When the child cannot be started or does not report its port.
    pub fn start_enforcing_limits() -> Result<Self> {
        Self::start_child(true, None)
    }

    fn start_child(enforce_limits: bool, tls: Option<&TlsIdentity>) -> Result<Self> {
        let mut command = Command::new(std::env::current_exe()?);
        if enforce_limits {
            command.env(ENFORCE_LIMITS_ENV, "1");
        } else {
            command.env_remove(ENFORCE_LIMITS_ENV);
        }
        match tls {
            Some(identity) => command
                .env(TLS_CERT_ENV, &identity.cert_pem)
                .env(TLS_KEY_ENV, &identity.key_pem),
            None => command.env_remove(TLS_CERT_ENV).env_remove(TLS_KEY_ENV),
        };
        let mut child = command
            .arg(SERVE_EMULATOR)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()?;
        let stdin = child.stdin.take().ok_or("no stdin pipe to the emulator")?;
        let stdout = child
            .stdout
            .take()
            .ok_or("no stdout pipe from the emulator")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let port = line
            .trim()
            .strip_prefix(READY_PREFIX)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("the emulator did not start: {line:?}"))?;
        Ok(Self {
            child,
            _stdin: stdin,
            port,
            tls: tls.is_some(),
        })
    }

    /// The child's process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `http://127.0.0.1:<port>`, or `https://localhost:<port>` over TLS.
    #[must_use]
    pub fn endpoint(&self) -> String {
        if self.tls {
            format!("https://localhost:{}", self.port)
        } else {
            format!("http://127.0.0.1:{}", self.port)
        }
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// CPU time and memory
// ---------------------------------------------------------------------------------------------

/// Reads the CPU time (user + system) of a process: its kernel CPU-time clock, in nanoseconds
/// (`clock_getcpuclockid`), or `/proc/<pid>/stat` in clock ticks when that clock is not there.
#[derive(Debug, Clone, Copy)]
pub struct CpuClock {
    /// Clock ticks per second (`getconf CLK_TCK`), for the fallback.
    pub ticks_per_second: f64,
}

impl Default for CpuClock {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuClock {
    /// Asks `getconf CLK_TCK` for the tick length (100 a second when that fails).
    #[must_use]
    pub fn new() -> Self {
        let ticks = Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|t| *t > 0.0)
            .unwrap_or(100.0);
        Self {
            ticks_per_second: ticks,
        }
    }

    /// CPU seconds of `pid` ("self" for this process), its threads that ended included; 0
    /// when unreadable.
    #[must_use]
    pub fn seconds(&self, pid: &str) -> f64 {
        Self::precise(pid).unwrap_or_else(|| self.in_ticks(pid))
    }

    /// The process's CPU-time clock (counted by the scheduler in nanoseconds).
    fn precise(pid: &str) -> Option<f64> {
        use nix::time::{ClockId, clock_getcpuclockid, clock_gettime};
        let clock = if pid == "self" {
            ClockId::CLOCK_PROCESS_CPUTIME_ID
        } else {
            let pid = nix::unistd::Pid::from_raw(pid.parse().ok()?);
            clock_getcpuclockid(pid).ok()?
        };
        let now = clock_gettime(clock).ok()?;
        Some(now.tv_sec() as f64 + now.tv_nsec() as f64 / 1e9)
    }

    /// utime + stime from `/proc/<pid>/stat`, in clock ticks (10 ms on most systems).
    fn in_ticks(&self, pid: &str) -> f64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            return 0.0;
        };
        // The command name (field 2) is in parentheses and may hold spaces: count from the
        // last `)`. Fields 14 and 15 (utime, stime) are then the 12th and 13th.
        let rest = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = [11, 12]
            .iter()
            .filter_map(|&i| fields.get(i).and_then(|f| f.parse::<u64>().ok()))
            .sum();
        ticks as f64 / self.ticks_per_second
    }
}

/// Now on `CLOCK_MONOTONIC`, in nanoseconds (0 when unreadable): the clock `perf record -k
/// CLOCK_MONOTONIC` stamps its samples with, so a profile can be cut at the drain's windows.
#[must_use]
pub fn monotonic_ns() -> u64 {
    use nix::time::{ClockId, clock_gettime};
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |t| {
        u64::try_from(t.tv_sec()).unwrap_or(0) * 1_000_000_000
            + u64::try_from(t.tv_nsec()).unwrap_or(0)
    })
}

/// This process's resident memory in bytes (`VmRSS` of `/proc/self/status`); 0 when
/// unreadable.
#[must_use]
pub fn rss_bytes() -> u64 {
    status_bytes("VmRSS")
}

/// A size field of `/proc/self/status` in bytes (`VmRSS`, `RssAnon`, `RssFile`, ...); 0 when
/// unreadable.
#[must_use]
pub fn status_bytes(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let kib = line
                    .strip_prefix(field)?
                    .strip_prefix(':')?
                    .trim()
                    .strip_suffix("kB")?;
                kib.trim().parse::<u64>().ok()
            })
        })
        .map_or(0, |kib| kib * 1024)
}

/// The C allocator's own account of the heap (glibc's `mallinfo2`, summed over its arenas).
#[derive(Debug, Clone, Copy, Default)]
pub struct HeapInfo {
    /// Bytes in live allocations (`uordblks` + `hblkhd`, the latter the large blocks mapped
    /// on their own).
    pub in_use: u64,
    /// Bytes the allocator holds free in its arenas (`fordblks`): freed, not given back to the
    /// system, resident once touched.
    pub free: u64,
}

/// The heap as glibc's malloc sees it; `None` on other C libraries.
#[must_use]
pub fn heap_info() -> Option<HeapInfo> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        #[repr(C)]
        struct Mallinfo2 {
            arena: usize,
            ordblks: usize,
            smblks: usize,
            hblks: usize,
            hblkhd: usize,
            usmblks: usize,
            fsmblks: usize,
            uordblks: usize,
            fordblks: usize,
            keepcost: usize,
        }
        unsafe extern "C" {
            fn mallinfo2() -> Mallinfo2;
        }
        // SAFETY: `mallinfo2` (glibc 2.33 and later) takes nothing and returns a plain struct
        // of `size_t` fields, laid out as above.
        let m = unsafe { mallinfo2() };
        Some(HeapInfo {
            in_use: (m.uordblks + m.hblkhd) as u64,
            free: m.fordblks as u64,
        })
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// Gives the free memory of glibc's malloc arenas back to the system (`malloc_trim(0)`); true
/// when it did (false, and nothing done, on other C libraries). For readings only: what RSS
/// falls to afterwards is what the allocator held free.
pub fn trim_heap() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: `malloc_trim` takes a byte count and only releases free memory.
        unsafe { malloc_trim(0) != 0 }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// Bytes as MiB, for printing.
#[must_use]
pub fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

// ---------------------------------------------------------------------------------------------
// Streams and records
// ---------------------------------------------------------------------------------------------

/// A record entry: `data` under partition key `key`.
///
/// # Errors
///
/// Never for a non-empty key (the SDK's builder checks the required fields).
pub fn entry(key: String, data: Vec<u8>) -> Result<PutRecordsRequestEntry> {
    Ok(PutRecordsRequestEntry::builder()
        .data(aws_sdk_kinesis::primitives::Blob::new(data))
        .partition_key(key)
        .build()?)
}

/// One PutRecords call of at most 500 entries, retrying the entries it refused; the landed
/// records per shard.
///
/// # Errors
///
/// A failed call, or entries refused ten times.
pub async fn put_entries(
    client: &Client,
    stream: &str,
    mut pending: Vec<PutRecordsRequestEntry>,
) -> Result<BTreeMap<String, usize>> {
    let mut landed = BTreeMap::new();
    for _attempt in 0..10 {
        let out = client
            .put_records()
            .stream_name(stream)
            .set_records(Some(pending.clone()))
            .send()
            .await?;
        let mut refused = Vec::new();
        for (entry, result) in pending.into_iter().zip(out.records) {
            match (result.shard_id, result.error_code) {
                (Some(shard), None) => *landed.entry(shard).or_default() += 1,
                _ => refused.push(entry),
            }
        }
        if refused.is_empty() {
            return Ok(landed);
        }
        pending = refused;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("{} records refused ten times by PutRecords", pending.len()).into())
}

/// Microseconds since the first call in this process, on the monotonic clock: the stamp the
/// probes embed in a record when they send it and compare when it is handled.
#[must_use]
pub fn now_micros() -> u64 {
    static BASE: OnceLock<Instant> = OnceLock::new();
    u64::try_from(BASE.get_or_init(Instant::now).elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// A 100-byte record carrying its send stamp and index: `<stamp µs, 20 digits>:<index, 12
/// digits>:` padded with `.`.
#[must_use]
pub fn stamped_record(stamp_micros: u64, index: u64) -> Vec<u8> {
    let mut data = format!("{stamp_micros:020}:{index:012}:").into_bytes();
    data.resize(RECORD_BYTES, b'.');
    data
}

/// The send stamp of a [`stamped_record`].
#[must_use]
pub fn record_stamp(data: &[u8]) -> Option<u64> {
    std::str::from_utf8(data.get(..20)?).ok()?.parse().ok()
}

// ---------------------------------------------------------------------------------------------
// The byte lane of the RustStream apps
// ---------------------------------------------------------------------------------------------

/// A record's payload as it arrived: the framework's self-deserializing input lane, so no
/// codec runs (the harness's records are not JSON).
#[derive(Debug)]
pub struct Frame<'a>(pub &'a [u8]);

impl Deserialized for Frame<'_> {
    type Output<'a> = Frame<'a>;
    type Error = std::convert::Infallible;

    fn from_payload(payload: &[u8]) -> Result<Frame<'_>, Self::Error> {
        Ok(Frame(payload))
    }
}

impl Input for Frame<'_> {
    type Axis = SoloDeserialized<Frame<'static>>;
}

// ---------------------------------------------------------------------------------------------
// Counting decorators
// ---------------------------------------------------------------------------------------------

/// How many calls of each kind a [`CountingKinesis`] passed on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApiCounts {
    /// ListShards pages.
    pub list_shards: u64,
    /// GetShardIterator calls.
    pub get_shard_iterator: u64,
    /// GetRecords calls.
    pub get_records: u64,
    /// PutRecords calls.
    pub put_records: u64,
    /// SubscribeToShard calls (enhanced fan-out).
    pub subscribe_to_shard: u64,
    /// Every other call (CreateStream, DescribeStreamSummary, SplitShard, MergeShards, the
    /// stream consumer calls).
    pub other: u64,
}

impl std::ops::Sub for ApiCounts {
    type Output = Self;

    fn sub(self, earlier: Self) -> Self {
        Self {
            list_shards: self.list_shards - earlier.list_shards,
            get_shard_iterator: self.get_shard_iterator - earlier.get_shard_iterator,
            get_records: self.get_records - earlier.get_records,
            put_records: self.put_records - earlier.put_records,
            subscribe_to_shard: self.subscribe_to_shard - earlier.subscribe_to_shard,
            other: self.other - earlier.other,
        }
    }
}

#[derive(Debug, Default)]
struct ApiCounters {
    list_shards: AtomicU64,
    get_shard_iterator: AtomicU64,
    get_records: AtomicU64,
    put_records: AtomicU64,
    subscribe_to_shard: AtomicU64,
    other: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A Kinesis layer that counts every call by kind (see [`counting_kinesis`]).
#[derive(Debug, Default)]
pub struct CallCounter {
    counts: ApiCounters,
}

impl CallCounter {
    /// The counts so far.
    #[must_use]
    pub fn counts(&self) -> ApiCounts {
        let c = &self.counts;
        ApiCounts {
            list_shards: c.list_shards.load(Ordering::Relaxed),
            get_shard_iterator: c.get_shard_iterator.load(Ordering::Relaxed),
            get_records: c.get_records.load(Ordering::Relaxed),
            put_records: c.put_records.load(Ordering::Relaxed),
            subscribe_to_shard: c.subscribe_to_shard.load(Ordering::Relaxed),
            other: c.other.load(Ordering::Relaxed),
        }
    }
}

impl KinesisLayer for CallCounter {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: ApiCall<'a>,
        next: ApiFuture<'a, T>,
    ) -> ApiFuture<'a, T> {
        let c = &self.counts;
        bump(match call {
            ApiCall::ListShards { .. } => &c.list_shards,
            ApiCall::GetShardIterator { .. } => &c.get_shard_iterator,
            ApiCall::GetRecords { .. } => &c.get_records,
            ApiCall::PutRecords { .. } => &c.put_records,
            ApiCall::SubscribeToShard { .. } => &c.subscribe_to_shard,
            _ => &c.other,
        });
        next
    }
}

/// A [`KinesisApi`] that counts every call it passes on to the one it wraps.
pub type CountingKinesis = Layered<CallCounter>;

/// Counts the calls made to `inner` (read them with `.layer().counts()`).
#[must_use]
pub fn counting_kinesis(inner: SharedKinesis) -> Arc<CountingKinesis> {
    Layered::new(inner, CallCounter::default()).shared()
}

/// How many calls of each kind a [`CountingLeaseStore`] passed on. Against DynamoDB, `list`
/// is a consistent Scan (one page per 1 MB of table), `prepare` a DescribeTable, and every
/// other call one conditional write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseCounts {
    /// `prepare` (table check).
    pub prepare: u64,
    /// `list` (reads).
    pub list: u64,
    /// `create` (conditional puts).
    pub create: u64,
    /// `take` (conditional updates).
    pub take: u64,
    /// `renew` (conditional updates).
    pub renew: u64,
    /// `checkpoint` (conditional updates).
    pub checkpoint: u64,
    /// `release` (conditional updates).
    pub release: u64,
    /// `delete` (conditional deletes of rows nobody needs).
    pub delete: u64,
}

impl LeaseCounts {
    /// Every call.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.prepare
            + self.list
            + self.create
            + self.take
            + self.renew
            + self.checkpoint
            + self.release
            + self.delete
    }

    /// The calls that write a row.
    #[must_use]
    pub fn writes(&self) -> u64 {
        self.create + self.take + self.renew + self.checkpoint + self.release + self.delete
    }
}

impl std::ops::Sub for LeaseCounts {
    type Output = Self;

    fn sub(self, earlier: Self) -> Self {
        Self {
            prepare: self.prepare - earlier.prepare,
            list: self.list - earlier.list,
            create: self.create - earlier.create,
            take: self.take - earlier.take,
            renew: self.renew - earlier.renew,
            checkpoint: self.checkpoint - earlier.checkpoint,
            release: self.release - earlier.release,
            delete: self.delete - earlier.delete,
        }
    }
}

#[derive(Debug, Default)]
struct LeaseCounters {
    prepare: AtomicU64,
    list: AtomicU64,
    create: AtomicU64,
    take: AtomicU64,
    renew: AtomicU64,
    checkpoint: AtomicU64,
    release: AtomicU64,
    delete: AtomicU64,
}

/// A lease-store layer that counts every call by kind, and the checkpoint writes per shard
/// (see [`counting_lease_store`]). Wrapped around a `MemoryLeaseStore`, its counts are the
/// calls a `DynamoLeaseStore` would have made to DynamoDB.
#[derive(Debug, Default)]
pub struct LeaseCallCounter {
    counts: LeaseCounters,
    checkpoints: Mutex<BTreeMap<String, u64>>,
}

impl LeaseCallCounter {
    /// The counts so far.
    #[must_use]
    pub fn counts(&self) -> LeaseCounts {
        let c = &self.counts;
        LeaseCounts {
            prepare: c.prepare.load(Ordering::Relaxed),
            list: c.list.load(Ordering::Relaxed),
            create: c.create.load(Ordering::Relaxed),
            take: c.take.load(Ordering::Relaxed),
            renew: c.renew.load(Ordering::Relaxed),
            checkpoint: c.checkpoint.load(Ordering::Relaxed),
            release: c.release.load(Ordering::Relaxed),
            delete: c.delete.load(Ordering::Relaxed),
        }
    }

    /// The `checkpoint` calls so far, per shard id.
    #[must_use]
    pub fn checkpoints_per_shard(&self) -> BTreeMap<String, u64> {
        self.checkpoints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl LeaseLayer for LeaseCallCounter {
    fn around<'a, T: Send + 'a>(
        &'a self,
        call: LeaseCall<'a>,
        next: LeaseFuture<'a, T>,
    ) -> LeaseFuture<'a, T> {
        let c = &self.counts;
        bump(match call {
            LeaseCall::Prepare => &c.prepare,
            LeaseCall::List { .. } => &c.list,
            LeaseCall::Create { .. } => &c.create,
            LeaseCall::Take { .. } => &c.take,
            LeaseCall::Renew { .. } => &c.renew,
            LeaseCall::Release { .. } => &c.release,
            LeaseCall::Delete { .. } => &c.delete,
            LeaseCall::Checkpoint { lease, .. } => {
                *self
                    .checkpoints
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .entry(lease.shard_id.clone())
                    .or_default() += 1;
                &c.checkpoint
            }
            _ => &c.prepare,
        });
        next
    }
}

/// A [`LeaseStore`] that counts every call it passes on to the one it wraps.
pub type CountingLeaseStore = LayeredStore<LeaseCallCounter>;

/// Counts the calls made to `inner` (read them with `.layer().counts()`).
#[must_use]
pub fn counting_lease_store(inner: SharedLeaseStore) -> Arc<CountingLeaseStore> {
    Arc::new(LayeredStore::new(inner, LeaseCallCounter::default()))
}

// ---------------------------------------------------------------------------------------------
// Statistics
// ---------------------------------------------------------------------------------------------

/// The median (the mean of the two middle values for an even count); NaN when empty.
#[must_use]
pub fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The `p`-th percentile (0 to 100) of sorted values, nearest rank; 0 when empty.
#[must_use]
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
