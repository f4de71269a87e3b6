//! An HTTP/1.1 fault proxy for the emulators: it sits between an SDK client and kinesis-local
//! or dynalite, records every request's `X-Amz-Target`, and injects faults by rule.
//!
//! ```ignore
//! let proxy = FaultProxy::start(&support::kinesis_endpoint()).await;
//! let client = aws_sdk_kinesis::Client::from_conf(proxy::kinesis_config_builder(&proxy).build());
//! let rule = proxy.add(Rule::on("GetRecords", Fault::Throttled).rate(0.3));
//! // ... run the workload ...
//! proxy.remove(rule);
//! println!("{} throttles injected, {} GetRecords calls", proxy.injected(rule), proxy.count("GetRecords"));
//! ```
//!
//! * Plain HTTP only (both emulators' plain ports). Keep-alive connections, `Content-Length`
//!   and chunked bodies in both directions, and a response delimited by the connection's end.
//!   Each client connection gets its own upstream connection, opened on its first request and
//!   kept alive with it (re-opened when the emulator closed it while idle).
//! * Requests are forwarded byte for byte (headers included, so SigV4 signatures are those
//!   the client computed for the proxy's address; neither emulator checks them).
//! * Answers are read whole before they are handed on, except a successful (2xx) answer to
//!   `Kinesis_20131202.SubscribeToShard`: an event stream (a chunked body of
//!   `application/vnd.amazon.eventstream` messages that lasts up to five minutes), relayed as
//!   it arrives: its head, then its body bytes, chunked framing included, until upstream ends
//!   it. A client that closes the connection meanwhile ends the relay and the upstream
//!   connection with it. [`Fault::CutStreamAfter`] cuts such a stream inside an event.
//! * Rules are consulted in the order they were added; the first one that matches the target
//!   and fires decides the request's fate. A rule fires with its probability (a seeded RNG
//!   per rule, so a given sequence of requests always meets the same faults), at most its
//!   maximum number of times, after letting its first `after` matching requests through.
//! * Error answers use the services' JSON error shapes (`__type` bare for Kinesis, with the
//!   `com.amazonaws.dynamodb.v20120810#` prefix for DynamoDB, as the services send them; the
//!   SDK strips any `namespace#` prefix either way).
//! * The proxy lives on the tokio runtime it was started on; dropping it stops the listener
//!   and every connection.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// The largest request or response head the proxy accepts.
const MAX_HEAD: usize = 64 * 1024;
/// The `__type` prefix DynamoDB puts on its error codes.
const DYNAMODB_ERROR_PREFIX: &str = "com.amazonaws.dynamodb.v20120810#";
/// The target whose successful answers are relayed as a stream (an event stream).
const STREAMED_TARGET: &str = "Kinesis_20131202.SubscribeToShard";
/// How much of the message a stream cut falls in is relayed: its prelude (total length,
/// headers length, prelude CRC), so the client sees a message begin, then the connection drop.
const CUT_INSIDE: usize = 12;

// ---------------------------------------------------------------------------------------------
// Faults and rules

/// What the proxy does instead of (or on top of) forwarding a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    /// Answers with this 5xx status without forwarding: 500 `InternalFailure` (Kinesis) /
    /// `InternalServerError` (DynamoDB), 503 `ServiceUnavailable`, any other 5xx
    /// `InternalFailure`.
    Status(u16),
    /// Waits this long, then forwards (the emulator sees the request late; a client that gave
    /// up meanwhile does not stop it).
    Latency(Duration),
    /// Closes the connection after reading the request, without forwarding or answering.
    Drop,
    /// Forwards the request (it takes effect), then closes the connection without answering:
    /// the answer is lost (a streamed answer's once its head came back: the subscription was
    /// made, then the connection closes).
    DropAfterForward,
    /// Forwards the request; when its answer is relayed as a stream (see the module docs),
    /// relays the head, the body's first `n` event-stream messages whole, then the prelude
    /// (the first 12 bytes) of the next message as it arrives, and closes both connections:
    /// the client's with a FIN after the bytes relayed (no further byte, no terminating
    /// chunk: the client sees the connection drop inside an event it never receives whole),
    /// the emulator's with a reset, so that it ends the subscription soon. With kinesis-local
    /// each message is one `SubscribeToShardEvent`, about one a second (it sends no
    /// `initial-response` message; a service that does has it counted as the first). Nothing
    /// is cut when the stream ends first, nor when the answer is not streamed (another target,
    /// an error answer): those are forwarded as they are. Counted as injected when the rule
    /// fires, like every fault.
    CutStreamAfter(u64),
    /// 400 `ProvisionedThroughputExceededException` (Kinesis or DynamoDB by the target).
    Throttled,
    /// 400 `ExpiredIteratorException` (Kinesis).
    ExpiredIterator,
    /// 400 `ConditionalCheckFailedException` (DynamoDB), not forwarded: the conditional write
    /// lost a race, the row is left as it was.
    ConditionalCheckFailed,
    /// Any other error answer, not forwarded. `error_type` is sent as given in `__type`.
    Error {
        /// The HTTP status.
        status: u16,
        /// The `__type` value.
        error_type: String,
        /// The `message` value.
        message: String,
    },
}

impl Fault {
    /// A short name for logs and figures.
    pub fn name(&self) -> String {
        match self {
            Self::Status(status) => format!("http-{status}"),
            Self::Latency(d) => format!("latency-{}ms", d.as_millis()),
            Self::Drop => "drop".into(),
            Self::DropAfterForward => "drop-after-forward".into(),
            Self::CutStreamAfter(n) => format!("cut-stream-after-{n}"),
            Self::Throttled => "throttled".into(),
            Self::ExpiredIterator => "expired-iterator".into(),
            Self::ConditionalCheckFailed => "conditional-check-failed".into(),
            Self::Error { error_type, .. } => error_type.clone(),
        }
    }

    /// The canned answer of an error fault for `target`, `None` for the others.
    fn answer(&self, target: &str, request_id: u64) -> Option<Vec<u8>> {
        let dynamodb = target.starts_with("DynamoDB_");
        let qualify = |code: &str| {
            if dynamodb {
                format!("{DYNAMODB_ERROR_PREFIX}{code}")
            } else {
                code.to_owned()
            }
        };
        let (status, error_type, message) = match self {
            Self::Status(500) if dynamodb => (
                500,
                qualify("InternalServerError"),
                "Internal server error (injected by the fault proxy)".to_owned(),
            ),
            Self::Status(503) => (
                503,
                qualify("ServiceUnavailable"),
                "Service unavailable (injected by the fault proxy)".to_owned(),
            ),
            Self::Status(status) => (
                *status,
                qualify("InternalFailure"),
                "Internal service failure (injected by the fault proxy)".to_owned(),
            ),
            Self::Throttled if dynamodb => (
                400,
                qualify("ProvisionedThroughputExceededException"),
                "The level of configured provisioned throughput for the table was exceeded. \
                 Consider increasing your provisioning level with the UpdateTable API. \
                 (injected by the fault proxy)"
                    .to_owned(),
            ),
            Self::Throttled => (
                400,
                qualify("ProvisionedThroughputExceededException"),
                "Rate exceeded for shard in stream under account 000000000000. \
                 (injected by the fault proxy)"
                    .to_owned(),
            ),
            Self::ExpiredIterator => (
                400,
                qualify("ExpiredIteratorException"),
                "Iterator expired. The iterator was created at a time further in the past than \
                 the tolerated delay of 300000 milliseconds. (injected by the fault proxy)"
                    .to_owned(),
            ),
            Self::ConditionalCheckFailed => (
                400,
                qualify("ConditionalCheckFailedException"),
                "The conditional request failed".to_owned(),
            ),
            Self::Error {
                status,
                error_type,
                message,
            } => (*status, error_type.clone(), message.clone()),
            Self::Latency(_) | Self::Drop | Self::DropAfterForward | Self::CutStreamAfter(_) => {
                return None;
            }
        };
        let body = format!(
            "{{\"__type\":\"{}\",\"message\":\"{}\"}}",
            json_escape(&error_type),
            json_escape(&message)
        );
        let content_type = if dynamodb {
            "application/x-amz-json-1.0"
        } else {
            "application/x-amz-json-1.1"
        };
        Some(
            format!(
                "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
                 x-amzn-RequestId: fault-proxy-{request_id:08}\r\n\r\n{body}",
                reason(status),
                body.len()
            )
            .into_bytes(),
        )
    }
}

/// When a rule injects its fault.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// `*` (any request), an operation name (`GetRecords`), or a full target
    /// (`DynamoDB_20120810.UpdateItem`).
    target: String,
    fault: Fault,
    probability: f64,
    max: Option<u64>,
    after: u64,
}

impl Rule {
    /// A rule injecting `fault` into every request for `target`: `*` for any, an operation
    /// name such as `GetRecords`, or a full `X-Amz-Target` value.
    pub fn on(target: impl Into<String>, fault: Fault) -> Self {
        Self {
            target: target.into(),
            fault,
            probability: 1.0,
            max: None,
            after: 0,
        }
    }

    /// A rule for any request.
    pub fn any(fault: Fault) -> Self {
        Self::on("*", fault)
    }

    /// Fires for this share of the matching requests (seeded, deterministic).
    pub fn rate(mut self, probability: f64) -> Self {
        self.probability = probability.clamp(0.0, 1.0);
        self
    }

    /// Fires at most `n` times, then lets everything through.
    pub fn times(mut self, n: u64) -> Self {
        self.max = Some(n);
        self
    }

    /// Lets the first `n` matching requests through before it may fire.
    pub fn after(mut self, n: u64) -> Self {
        self.after = n;
        self
    }

    fn matches(&self, target: &str) -> bool {
        self.target == "*"
            || self.target == target
            || target
                .rsplit_once('.')
                .is_some_and(|(_, operation)| operation == self.target)
    }
}

/// Names a rule added to a proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(u64);

/// One request the proxy saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The `X-Amz-Target` header (`(none)` when absent).
    pub target: String,
    /// The fault injected into it, if any.
    pub fault: Option<String>,
}

impl Call {
    /// The operation: the part of the target after the last `.`.
    pub fn operation(&self) -> &str {
        self.target
            .rsplit_once('.')
            .map_or(self.target.as_str(), |(_, op)| op)
    }
}

// ---------------------------------------------------------------------------------------------
// The proxy

/// A SplitMix64 generator: small, seeded, good enough to pick faults.
#[derive(Debug, Clone)]
struct SplitMix(u64);

impl SplitMix {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct RuleState {
    id: RuleId,
    rule: Rule,
    enabled: bool,
    rng: SplitMix,
    matched: u64,
    injected: u64,
}

struct State {
    seed: u64,
    rules: Vec<RuleState>,
    next_rule: u64,
    calls: Vec<Call>,
    /// Requests read but not yet answered (or dropped), by request number.
    pending: BTreeMap<u64, String>,
}

struct Inner {
    upstream: String,
    state: Mutex<State>,
    requests: AtomicU64,
    upstream_errors: AtomicU64,
    connections: AtomicU64,
    tasks: Mutex<JoinSet<()>>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records the call and picks its fault.
    fn decide(&self, target: &str) -> Option<Fault> {
        let mut state = self.lock();
        let mut chosen = None;
        for rule in state.rules.iter_mut().filter(|r| r.enabled) {
            if !rule.rule.matches(target) {
                continue;
            }
            rule.matched += 1;
            if rule.matched <= rule.rule.after {
                continue;
            }
            if rule.rule.max.is_some_and(|max| rule.injected >= max) {
                continue;
            }
            // Always draw, so a rule's decisions depend only on how many requests it saw.
            let draw = rule.rng.next_f64();
            if draw < rule.rule.probability {
                rule.injected += 1;
                chosen = Some(rule.rule.fault.clone());
                break;
            }
        }
        state.calls.push(Call {
            target: target.to_owned(),
            fault: chosen.as_ref().map(Fault::name),
        });
        chosen
    }
}

/// A running fault proxy; see the module docs.
pub struct FaultProxy {
    url: String,
    inner: Arc<Inner>,
    accept: tokio::task::JoinHandle<()>,
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("url", &self.url)
            .field("upstream", &self.inner.upstream)
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.inner
            .tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .abort_all();
    }
}

impl FaultProxy {
    /// Starts a proxy on a free 127.0.0.1 port forwarding to `upstream`
    /// (`http://127.0.0.1:PORT`), with RNG seed 0. Runs on the current tokio runtime.
    pub async fn start(upstream: &str) -> Self {
        Self::start_seeded(upstream, 0).await
    }

    /// [`start`](Self::start) with the rules' RNGs derived from `seed`.
    pub async fn start_seeded(upstream: &str, seed: u64) -> Self {
        let authority = upstream
            .strip_prefix("http://")
            .unwrap_or_else(|| panic!("fault proxy: upstream {upstream:?} is not http://HOST:PORT"))
            .trim_end_matches('/')
            .to_owned();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("fault proxy: cannot bind 127.0.0.1:0: {e}"));
        let port = listener
            .local_addr()
            .expect("fault proxy: local_addr of a bound listener")
            .port();
        let inner = Arc::new(Inner {
            upstream: authority,
            state: Mutex::new(State {
                seed,
                rules: Vec::new(),
                next_rule: 0,
                calls: Vec::new(),
                pending: BTreeMap::new(),
            }),
            requests: AtomicU64::new(0),
            upstream_errors: AtomicU64::new(0),
            connections: AtomicU64::new(0),
            tasks: Mutex::new(JoinSet::new()),
        });
        let accept = {
            let inner = inner.clone();
            tokio::spawn(async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else {
                        // Out of descriptors or similar: wait a little and go on.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    };
                    let _ = client.set_nodelay(true);
                    inner.connections.fetch_add(1, Ordering::Relaxed);
                    let mut tasks = inner.tasks.lock().unwrap_or_else(|e| e.into_inner());
                    while tasks.try_join_next().is_some() {}
                    tasks.spawn(serve(inner.clone(), client));
                }
            })
        };
        Self {
            url: format!("http://127.0.0.1:{port}"),
            inner,
            accept,
        }
    }

    /// `http://127.0.0.1:PORT`: give it to an SDK client as its endpoint.
    pub fn url(&self) -> String {
        self.url.clone()
    }

    /// The emulator the proxy forwards to (`127.0.0.1:PORT`).
    pub fn upstream(&self) -> &str {
        &self.inner.upstream
    }

    /// Adds a rule (after the existing ones) and returns its id.
    pub fn add(&self, rule: Rule) -> RuleId {
        let mut state = self.inner.lock();
        let id = RuleId(state.next_rule);
        state.next_rule += 1;
        let rng = SplitMix(state.seed ^ (id.0 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
        state.rules.push(RuleState {
            id,
            rule,
            enabled: true,
            rng,
            matched: 0,
            injected: 0,
        });
        id
    }

    /// Stops a rule (its figures stay readable).
    pub fn remove(&self, id: RuleId) {
        for rule in self.inner.lock().rules.iter_mut().filter(|r| r.id == id) {
            rule.enabled = false;
        }
    }

    /// Stops every rule: the proxy forwards everything from now on.
    pub fn clear(&self) {
        for rule in &mut self.inner.lock().rules {
            rule.enabled = false;
        }
    }

    /// How many times a rule injected its fault.
    pub fn injected(&self, id: RuleId) -> u64 {
        self.inner
            .lock()
            .rules
            .iter()
            .find(|r| r.id == id)
            .map_or(0, |r| r.injected)
    }

    /// How many faults every rule together injected.
    pub fn total_injected(&self) -> u64 {
        self.inner.lock().rules.iter().map(|r| r.injected).sum()
    }

    /// How many requests a rule matched (whether it fired or not).
    pub fn matched(&self, id: RuleId) -> u64 {
        self.inner
            .lock()
            .rules
            .iter()
            .find(|r| r.id == id)
            .map_or(0, |r| r.matched)
    }

    /// Every request seen so far, in arrival order.
    pub fn calls(&self) -> Vec<Call> {
        self.inner.lock().calls.clone()
    }

    /// Every request's target, in arrival order.
    pub fn targets(&self) -> Vec<String> {
        self.inner
            .lock()
            .calls
            .iter()
            .map(|c| c.target.clone())
            .collect()
    }

    /// The distinct targets seen (e.g. `Kinesis_20131202.GetRecords`).
    pub fn distinct_targets(&self) -> BTreeSet<String> {
        self.inner
            .lock()
            .calls
            .iter()
            .map(|c| c.target.clone())
            .collect()
    }

    /// How many requests had this operation (`GetRecords`) or full target.
    pub fn count(&self, target: &str) -> usize {
        self.inner
            .lock()
            .calls
            .iter()
            .filter(|c| c.target == target || c.operation() == target)
            .count()
    }

    /// Forgets the call log (the rules' figures stay).
    pub fn clear_calls(&self) {
        self.inner.lock().calls.clear();
    }

    /// How many requests arrived.
    pub fn requests(&self) -> u64 {
        self.inner.requests.load(Ordering::Relaxed)
    }

    /// The targets of the requests being handled right now (read, not yet answered; a streamed
    /// answer until its end).
    pub fn in_flight(&self) -> Vec<String> {
        self.inner.lock().pending.values().cloned().collect()
    }

    /// How many client connections were accepted.
    pub fn connections(&self) -> u64 {
        self.inner.connections.load(Ordering::Relaxed)
    }

    /// How many forwards failed for a reason of the proxy's own (the emulator unreachable,
    /// a malformed answer); each was answered 502. Should stay 0.
    pub fn upstream_errors(&self) -> u64 {
        self.inner.upstream_errors.load(Ordering::Relaxed)
    }

    /// One line of figures: requests, connections, faults by rule.
    pub fn summary(&self) -> String {
        let state = self.inner.lock();
        let rules: Vec<String> = state
            .rules
            .iter()
            .map(|r| {
                format!(
                    "{} on {}: {}/{}",
                    r.rule.fault.name(),
                    r.rule.target,
                    r.injected,
                    r.matched
                )
            })
            .collect();
        format!(
            "{} requests on {} connections, {} faults [{}], {} upstream errors, {} in flight",
            state.calls.len(),
            self.connections(),
            state.rules.iter().map(|r| r.injected).sum::<u64>(),
            rules.join("; "),
            self.upstream_errors(),
            state.pending.len()
        )
    }
}

/// A Kinesis service config builder pointed at `proxy` (region, credentials as
/// [`super::sdk_config`]); tweak retries or timeouts before `build()`.
pub fn kinesis_config_builder(proxy: &FaultProxy) -> aws_sdk_kinesis::config::Builder {
    super::kinesis_config_at(&proxy.url())
}

/// A DynamoDB service config builder pointed at `proxy`.
pub fn dynamodb_config_builder(proxy: &FaultProxy) -> aws_sdk_dynamodb::config::Builder {
    super::dynamodb_config_at(&proxy.url())
}

// ---------------------------------------------------------------------------------------------
// HTTP/1.1

/// One side of a connection, with the bytes read but not yet consumed.
struct Wire {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Whether a message went through this connection already (for the stale check).
    used: bool,
}

impl Wire {
    fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            buf: Vec::new(),
            used: false,
        }
    }

    /// Reads more bytes; false at the end of the stream.
    async fn fill(&mut self) -> io::Result<bool> {
        let mut chunk = [0u8; 16 * 1024];
        let n = self.stream.read(&mut chunk).await?;
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n > 0)
    }

    /// A message head through its blank line; `None` at a clean end of the stream (nothing
    /// read).
    async fn read_head(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if let Some(at) = find(&self.buf, b"\r\n\r\n") {
                return Ok(Some(self.buf.drain(..at + 4).collect()));
            }
            if self.buf.len() > MAX_HEAD {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "message head too long",
                ));
            }
            if !self.fill().await? {
                return if self.buf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::ErrorKind::UnexpectedEof.into())
                };
            }
        }
    }

    /// Exactly `n` bytes.
    async fn read_exact(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            if !self.fill().await? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// One line through its CRLF.
    async fn read_line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(at) = find(&self.buf, b"\r\n") {
                return Ok(self.buf.drain(..at + 2).collect());
            }
            if self.buf.len() > MAX_HEAD {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
            if !self.fill().await? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// A chunked body, framing included, through its last chunk and trailers.
    async fn read_chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut raw = Vec::new();
        loop {
            let line = self.read_line().await?;
            let size = chunk_size(&line)?;
            raw.extend_from_slice(&line);
            if size == 0 {
                // Trailers, through the blank line.
                loop {
                    let trailer = self.read_line().await?;
                    raw.extend_from_slice(&trailer);
                    if trailer == b"\r\n" {
                        return Ok(raw);
                    }
                }
            }
            raw.extend_from_slice(&self.read_exact(size + 2).await?);
        }
    }

    /// Everything up to the end of the stream.
    async fn read_to_end(&mut self) -> io::Result<Vec<u8>> {
        while self.fill().await? {}
        Ok(std::mem::take(&mut self.buf))
    }

    /// True when the peer closed this idle connection (or sent something unasked).
    fn is_stale(&mut self) -> bool {
        if !self.buf.is_empty() {
            return true;
        }
        let mut probe = [0u8; 1];
        !matches!(
            self.stream.try_read(&mut probe),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock
        )
    }
}

/// The size of a chunk, from its size line (CRLF included; extensions ignored).
fn chunk_size(line: &[u8]) -> io::Result<usize> {
    let text = String::from_utf8_lossy(&line[..line.len().saturating_sub(2)]).into_owned();
    let text = text.split(';').next().unwrap_or("").trim();
    usize::from_str_radix(text, 16).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad chunk size {text:?}"),
        )
    })
}

/// A parsed message head.
struct Head {
    raw: Vec<u8>,
    start_line: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn parse(raw: Vec<u8>) -> io::Result<Self> {
        let text = String::from_utf8_lossy(&raw).into_owned();
        let mut lines = text.split("\r\n");
        let start_line = lines.next().unwrap_or_default().to_owned();
        let headers = lines
            .filter(|l| !l.is_empty())
            .map(|l| match l.split_once(':') {
                Some((name, value)) => Ok((name.trim().to_ascii_lowercase(), value.trim().into())),
                None => Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad header line {l:?}"),
                )),
            })
            .collect::<io::Result<_>>()?;
        Ok(Self {
            raw,
            start_line,
            headers,
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn has_token(&self, name: &str, token: &str) -> bool {
        self.headers
            .iter()
            .filter(|(n, _)| n == name)
            .flat_map(|(_, v)| v.split(','))
            .any(|t| t.trim().eq_ignore_ascii_case(token))
    }

    fn is_chunked(&self) -> bool {
        self.has_token("transfer-encoding", "chunked")
    }

    fn content_length(&self) -> io::Result<Option<usize>> {
        self.header("content-length")
            .map(|v| {
                v.parse::<usize>().map_err(|_| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("bad content-length {v:?}"),
                    )
                })
            })
            .transpose()
    }

    fn is_http10(&self) -> bool {
        self.start_line.starts_with("HTTP/1.0") || self.start_line.ends_with("HTTP/1.0")
    }

    /// Whether the connection ends after this message.
    fn closes(&self) -> bool {
        self.has_token("connection", "close")
            || (self.is_http10() && !self.has_token("connection", "keep-alive"))
    }

    /// The status code of a response head.
    fn status(&self) -> io::Result<u16> {
        self.start_line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad status line {:?}", self.start_line),
                )
            })
    }
}

/// A request as read from the client: head and raw body.
struct Request {
    head: Head,
    body: Vec<u8>,
}

impl Request {
    fn bytes(&self) -> Vec<u8> {
        let mut out = self.head.raw.clone();
        out.extend_from_slice(&self.body);
        out
    }
}

async fn read_request(client: &mut Wire) -> io::Result<Option<Request>> {
    let Some(raw) = client.read_head().await? else {
        return Ok(None);
    };
    let head = Head::parse(raw)?;
    let body = if head.is_chunked() {
        client.read_chunked().await?
    } else {
        match head.content_length()? {
            Some(n) => client.read_exact(n).await?,
            None => Vec::new(),
        }
    };
    Ok(Some(Request { head, body }))
}

/// How a response body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// Chunked, through its last chunk and trailers.
    Chunked,
    /// `Content-Length` bytes.
    Length(usize),
    /// Up to the end of the connection.
    ToEnd,
}

impl Framing {
    /// How the body of the final response `head` is delimited; `None` when it has none.
    fn of(head: &Head, status: u16) -> io::Result<Option<Self>> {
        if status == 204 || status == 304 || (100..200).contains(&status) {
            return Ok(None);
        }
        if head.is_chunked() {
            return Ok(Some(Self::Chunked));
        }
        Ok(Some(
            head.content_length()?.map_or(Self::ToEnd, Self::Length),
        ))
    }
}

/// A response as read from upstream: every byte to hand on (interim 1xx answers included),
/// and whether the connection ends after it.
struct Response {
    bytes: Vec<u8>,
    closes: bool,
    /// A body left upstream to be relayed as it arrives ([`Relay`]); `bytes` holds the heads
    /// only then.
    streamed: Option<Framing>,
}

/// The response heads through the final one (interim 1xx answers first, all in the bytes);
/// `Ok(None)` when the connection ended before the first byte.
async fn read_final_head(upstream: &mut Wire) -> io::Result<Option<(Vec<u8>, Head, u16)>> {
    let mut bytes = Vec::new();
    loop {
        let Some(raw) = upstream.read_head().await? else {
            return if bytes.is_empty() {
                Ok(None)
            } else {
                Err(io::ErrorKind::UnexpectedEof.into())
            };
        };
        let head = Head::parse(raw)?;
        let status = head.status()?;
        bytes.extend_from_slice(&head.raw);
        // The final answer; an interim one (100 Continue) is followed by the real one.
        if !(100..200).contains(&status) || status == 101 {
            return Ok(Some((bytes, head, status)));
        }
    }
}

/// Reads one response, leaving a successful answer's body upstream when `stream`;
/// `Ok(None)` when the connection ended before its first byte.
async fn read_response(upstream: &mut Wire, stream: bool) -> io::Result<Option<Response>> {
    let Some((mut bytes, head, status)) = read_final_head(upstream).await? else {
        return Ok(None);
    };
    let framing = Framing::of(&head, status)?;
    let closes = head.closes() || framing == Some(Framing::ToEnd);
    if stream && (200..300).contains(&status) && framing.is_some() {
        return Ok(Some(Response {
            bytes,
            closes,
            streamed: framing,
        }));
    }
    match framing {
        Some(Framing::Chunked) => bytes.extend_from_slice(&upstream.read_chunked().await?),
        Some(Framing::Length(n)) => bytes.extend_from_slice(&upstream.read_exact(n).await?),
        Some(Framing::ToEnd) => bytes.extend_from_slice(&upstream.read_to_end().await?),
        None => {}
    }
    Ok(Some(Response {
        bytes,
        closes,
        streamed: None,
    }))
}

/// Sends `request` upstream (re-opening a connection the emulator closed while idle) and
/// reads the answer (its head only when it is to be streamed: see [`read_response`]).
async fn forward(
    upstream_addr: &str,
    upstream: &mut Option<Wire>,
    request: &Request,
    stream: bool,
) -> io::Result<Response> {
    let bytes = request.bytes();
    for attempt in 0..2 {
        if upstream.as_mut().is_some_and(Wire::is_stale) {
            *upstream = None;
        }
        let wire = match upstream {
            Some(wire) => wire,
            None => {
                let stream = TcpStream::connect(upstream_addr).await?;
                let _ = stream.set_nodelay(true);
                upstream.insert(Wire::new(stream))
            }
        };
        let reused = wire.used;
        wire.used = true;
        let sent = wire.stream.write_all(&bytes).await;
        let answer = match sent {
            Ok(()) => read_response(wire, stream).await,
            Err(e) => Err(e),
        };
        match answer {
            Ok(Some(response)) => {
                // A streamed body still needs the connection (dropped after the relay).
                if response.closes && response.streamed.is_none() {
                    *upstream = None;
                }
                return Ok(response);
            }
            // A kept-alive connection the emulator closed just as the request went out: the
            // request was not processed; send it once more on a new connection.
            Ok(None) if reused && attempt == 0 => *upstream = None,
            Err(e) if reused && attempt == 0 && is_closed_under_us(&e) => *upstream = None,
            Ok(None) => {
                *upstream = None;
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the emulator closed the connection without answering",
                ));
            }
            Err(e) => {
                *upstream = None;
                return Err(e);
            }
        }
    }
    unreachable!("the second attempt always returns")
}

/// Marks a request as being handled until dropped.
struct Pending<'a> {
    inner: &'a Inner,
    id: u64,
}

impl<'a> Pending<'a> {
    fn new(inner: &'a Inner, id: u64, target: &str) -> Self {
        inner.lock().pending.insert(id, target.to_owned());
        Self { inner, id }
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.inner.lock().pending.remove(&self.id);
    }
}

/// Serves one client connection until it closes or a fault drops it.
async fn serve(inner: Arc<Inner>, client: TcpStream) {
    let mut client = Wire::new(client);
    let mut upstream: Option<Wire> = None;
    // Ends when the client closed the connection, or sent something unreadable.
    while let Ok(Some(request)) = read_request(&mut client).await {
        if !exchange(&inner, &mut client, &mut upstream, &request).await {
            return;
        }
    }
}

/// Handles one request: decides its fault, forwards it and hands the answer on. False when
/// the client connection ends with it (dropping both connections).
async fn exchange(
    inner: &Inner,
    client: &mut Wire,
    upstream: &mut Option<Wire>,
    request: &Request,
) -> bool {
    let request_id = inner.requests.fetch_add(1, Ordering::Relaxed);
    let target = request
        .head
        .header("x-amz-target")
        .unwrap_or("(none)")
        .to_owned();
    let client_closes = request.head.closes();
    let _pending = Pending::new(inner, request_id, &target);
    let fault = inner.decide(&target);
    if let Some(answer) = fault.as_ref().and_then(|f| f.answer(&target, request_id)) {
        return client.stream.write_all(&answer).await.is_ok() && !client_closes;
    }
    match fault {
        Some(Fault::Drop) => return false,
        Some(Fault::Latency(wait)) => tokio::time::sleep(wait).await,
        _ => {}
    }
    let stream = target == STREAMED_TARGET;
    let response = match forward(&inner.upstream, upstream, request, stream).await {
        Ok(response) => response,
        Err(e) => {
            bad_gateway(inner, client, &e).await;
            return false;
        }
    };
    if fault == Some(Fault::DropAfterForward) || !hand_on(client, upstream, &response, fault).await
    {
        return false;
    }
    if response.closes || client_closes {
        let _ = client.stream.shutdown().await;
        return false;
    }
    true
}

/// Answers 502 for a forward that failed for a reason of the proxy's own, and counts it.
async fn bad_gateway(inner: &Inner, client: &mut Wire, e: &io::Error) {
    inner.upstream_errors.fetch_add(1, Ordering::Relaxed);
    let body = format!(
        "{{\"__type\":\"FaultProxyUpstreamError\",\"message\":\"{}\"}}",
        json_escape(&format!(
            "fault proxy: forwarding to the emulator failed: {e}"
        ))
    );
    let answer = format!(
        "HTTP/1.1 502 Bad Gateway\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.stream.write_all(answer.as_bytes()).await;
}

/// Writes `response` to the client, relaying its streamed body (cut when `fault` says so).
/// False when the connections are to be dropped: a write failed, the stream broke or was cut.
async fn hand_on(
    client: &mut Wire,
    upstream: &mut Option<Wire>,
    response: &Response,
    fault: Option<Fault>,
) -> bool {
    if client.stream.write_all(&response.bytes).await.is_err() {
        return false;
    }
    let (Some(framing), Some(upstream)) = (response.streamed, upstream.as_mut()) else {
        return response.streamed.is_none();
    };
    let cut_after = match fault {
        Some(Fault::CutStreamAfter(n)) => Some(n),
        _ => None,
    };
    let mut relay = Relay {
        upstream,
        client,
        events: EventCounter::default(),
        cut_after,
        inside: 0,
    };
    let relayed = relay.body(framing).await;
    if matches!(relayed, Ok(false)) {
        relay.reset_upstream();
    }
    matches!(relayed, Ok(true))
}

/// Copies a streamed body from upstream to the client as its bytes arrive, chunked framing
/// included, and cuts it inside an event-stream message when asked.
struct Relay<'a> {
    upstream: &'a mut Wire,
    client: &'a mut Wire,
    /// The event-stream messages of the body relayed whole so far.
    events: EventCounter,
    /// Cut the body inside the message after this many.
    cut_after: Option<u64>,
    /// The bytes relayed of the message the cut falls in.
    inside: usize,
}

impl Relay<'_> {
    /// Relays the body: `Ok(true)` when it ended, `Ok(false)` when it was cut.
    async fn body(&mut self, framing: Framing) -> io::Result<bool> {
        match framing {
            Framing::Chunked => self.chunked().await,
            Framing::Length(n) => self.data(Some(n)).await,
            Framing::ToEnd => self.data(None).await,
        }
    }

    /// A chunked body: size lines, CRLFs and trailers relayed as they are, chunk data through
    /// [`data`](Self::data).
    async fn chunked(&mut self) -> io::Result<bool> {
        loop {
            let size = chunk_size(&self.line().await?)?;
            if size == 0 {
                // Trailers, through the blank line.
                while self.line().await? != b"\r\n" {}
                return Ok(true);
            }
            if !self.data(Some(size)).await? {
                return Ok(false);
            }
            if self.line().await? != b"\r\n" {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "chunk data not followed by CRLF",
                ));
            }
        }
    }

    /// Relays `n` body bytes (`None`: up to upstream's end) as they arrive; `Ok(false)` when
    /// the cut falls among them (the bytes after it are not relayed).
    async fn data(&mut self, mut left: Option<usize>) -> io::Result<bool> {
        loop {
            if self.is_cut() {
                return Ok(false);
            }
            if left == Some(0) {
                return Ok(true);
            }
            if self.upstream.buf.is_empty() {
                if !self.more().await? {
                    return left.map_or(Ok(true), |_| Err(io::ErrorKind::UnexpectedEof.into()));
                }
                continue;
            }
            let ready = left.map_or(self.upstream.buf.len(), |n| n.min(self.upstream.buf.len()));
            let take = self.take(ready);
            self.client
                .stream
                .write_all(&self.upstream.buf[..take])
                .await?;
            self.upstream.buf.drain(..take);
            left = left.map(|n| n - take);
        }
    }

    /// How many of the first `ready` buffered bytes go through before the cut: the whole
    /// messages up to `cut_after`, then [`CUT_INSIDE`] bytes of the next one.
    fn take(&mut self, ready: usize) -> usize {
        let whole = self
            .events
            .take(&self.upstream.buf[..ready], self.cut_after);
        if self.cut_after.is_none_or(|n| self.events.complete < n) {
            return whole;
        }
        let inside = (ready - whole).min(CUT_INSIDE - self.inside);
        self.inside += inside;
        whole + inside
    }

    fn is_cut(&self) -> bool {
        self.cut_after
            .is_some_and(|n| self.events.complete >= n && self.inside >= CUT_INSIDE)
    }

    /// Makes the upstream connection close with a reset (RST) rather than a FIN, so the
    /// emulator sees its stream fail at once (kinesis-local then ends the subscription within
    /// about one event interval, instead of two after a FIN).
    fn reset_upstream(&self) {
        // A zero linger never blocks on drop (the deprecation is about the others);
        // `set_zero_linger` needs a newer tokio than the manifest asks for.
        #[allow(deprecated)]
        let _ = self.upstream.stream.set_linger(Some(Duration::ZERO));
    }

    /// One line through its CRLF, relayed.
    async fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(at) = find(&self.upstream.buf, b"\r\n") {
                let line: Vec<u8> = self.upstream.buf.drain(..at + 2).collect();
                self.client.stream.write_all(&line).await?;
                return Ok(line);
            }
            if self.upstream.buf.len() > MAX_HEAD {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "line too long"));
            }
            if !self.more().await? {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
    }

    /// Waits for more bytes from upstream (false at its end), watching the client meanwhile:
    /// a client that closed the connection (gave up on the stream) ends the relay with an
    /// error; bytes it sends stay buffered.
    async fn more(&mut self) -> io::Result<bool> {
        loop {
            tokio::select! {
                more = self.upstream.fill() => return more,
                read = self.client.fill() => {
                    if !read? {
                        return Err(io::Error::new(
                            io::ErrorKind::ConnectionAborted,
                            "the client closed the connection during the stream",
                        ));
                    }
                }
            }
        }
    }
}

/// Counts the event-stream messages of a body as its bytes go by. Each message begins with
/// its total length (a big-endian `u32`, these four bytes included).
#[derive(Debug, Default)]
struct EventCounter {
    /// The first bytes of the message under way, while its length is not known yet.
    prelude: Vec<u8>,
    /// The bytes of the message under way still to come, once its length is known.
    left: usize,
    /// The messages complete so far.
    complete: u64,
}

impl EventCounter {
    /// Counts the messages in `data`, the body's next bytes; returns how many of those bytes
    /// go through: all of them, or those through the end of message number `limit`.
    fn take(&mut self, data: &[u8], limit: Option<u64>) -> usize {
        let mut at = 0;
        while at < data.len() && limit.is_none_or(|n| self.complete < n) {
            at += if self.left == 0 {
                self.prelude(&data[at..])
            } else {
                self.rest(data.len() - at)
            };
        }
        at
    }

    /// Reads (part of) the next message's length from the start of `data`; returns the bytes
    /// used.
    fn prelude(&mut self, data: &[u8]) -> usize {
        let used = (4 - self.prelude.len()).min(data.len());
        self.prelude.extend_from_slice(&data[..used]);
        if let Ok(length) = <[u8; 4]>::try_from(self.prelude.as_slice()) {
            self.prelude.clear();
            self.left = (u32::from_be_bytes(length) as usize).saturating_sub(4);
            if self.left == 0 {
                self.complete += 1;
            }
        }
        used
    }

    /// Goes through up to `available` bytes of the message under way; returns the bytes used.
    fn rest(&mut self, available: usize) -> usize {
        let used = self.left.min(available);
        self.left -= used;
        if self.left == 0 {
            self.complete += 1;
        }
        used
    }
}

/// An error saying the peer closed the connection before answering anything.
fn is_closed_under_us(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
    )
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

fn json_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out
}

fn reason(status: u16) -> &'static str {
    match status {
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Error",
    }
}
