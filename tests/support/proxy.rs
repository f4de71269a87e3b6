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
//! * Plain HTTP/1.1 only (both emulators' plain ports), on hyper: a server for the clients and
//!   a client connection per client connection to the emulator, opened on its first request
//!   and kept alive with it (re-opened when the emulator closed it while idle).
//! * Requests are forwarded with their method, URI and headers (so SigV4 signatures are those
//!   the client computed for the proxy's address; neither emulator checks them), after they
//!   were read whole. A request is forwarded even when the client gives up waiting (a
//!   [`Fault::Latency`] past its timeout): the emulator sees it late.
//! * Answers are read whole before they are handed on, except a successful (2xx) answer to
//!   `Kinesis_20131202.SubscribeToShard`: an event stream (a chunked body of
//!   `application/vnd.amazon.eventstream` messages that lasts up to five minutes), relayed as
//!   it arrives until upstream ends it. A client that closes the connection meanwhile ends
//!   the relay and the upstream connection with it. [`Fault::CutStreamAfter`] cuts such a
//!   stream inside an event.
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
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Frame, Incoming, SizeHint};
use hyper::client::conn::http1::SendRequest;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

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
    /// the client's once the bytes relayed went out (no further byte, no terminating chunk:
    /// the client sees the connection drop inside an event it never receives whole), the
    /// emulator's with a reset, so that it ends the subscription soon (such a request goes on
    /// an upstream connection of its own, closed with a reset whether it was cut or not).
    /// With kinesis-local each message is one `SubscribeToShardEvent`, about one a second (it
    /// sends no `initial-response` message; a service that does has it counted as the
    /// first). Nothing is cut when the stream ends first, nor when the answer is not streamed
    /// (another target, an error answer): those are forwarded as they are. Counted as
    /// injected when the rule fires, like every fault.
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
    fn answer(&self, target: &str, request_id: u64) -> Option<Response<Bytes>> {
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
        Response::builder()
            .status(status)
            .header("Content-Type", content_type)
            .header("x-amzn-RequestId", format!("fault-proxy-{request_id:08}"))
            .body(Bytes::from(body))
            .ok()
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
// HTTP, on hyper

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A client connection to the emulator: its request sender, and the task driving it.
struct Upstream {
    sender: SendRequest<Full<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
}

impl Upstream {
    /// Connects to `addr`; with `reset`, the connection closes with a reset (RST) rather than
    /// a FIN, so the emulator sees its stream fail at once (kinesis-local then ends the
    /// subscription within about one event interval, instead of two after a FIN).
    async fn connect(addr: &str, reset: bool) -> Result<Self, BoxError> {
        let stream = TcpStream::connect(addr).await?;
        let _ = stream.set_nodelay(true);
        if reset {
            // A zero linger never blocks on drop (the deprecation is about the others);
            // `set_zero_linger` needs a newer tokio than the manifest asks for.
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(Duration::ZERO));
        }
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        let driver = tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(Self { sender, driver })
    }
}

/// Marks a request as being handled until dropped (with the answer, once it went out).
struct Pending {
    inner: Arc<Inner>,
    id: u64,
}

impl Pending {
    fn new(inner: &Arc<Inner>, id: u64, target: &str) -> Self {
        inner.lock().pending.insert(id, target.to_owned());
        Self {
            inner: inner.clone(),
            id,
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.inner.lock().pending.remove(&self.id);
    }
}

/// One client connection: its upstream connection, opened on the first request.
struct Connection {
    inner: Arc<Inner>,
    upstream: tokio::sync::Mutex<Option<Upstream>>,
}

/// Serves one client connection until it closes or a fault drops it. Each request is handled
/// by a task of its own, so that it is forwarded even when the client gives up on it.
async fn serve(inner: Arc<Inner>, client: TcpStream) {
    let connection = Arc::new(Connection {
        inner,
        upstream: tokio::sync::Mutex::new(None),
    });
    let service = hyper::service::service_fn(move |request| {
        let (connection, tasks) = (connection.clone(), &connection.inner.tasks);
        let (tx, rx) = tokio::sync::oneshot::channel();
        tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .spawn(async move {
                let _ = tx.send(connection.exchange(request).await.map_err(io::Error::other));
            });
        async move {
            rx.await
                .unwrap_or_else(|_| Err(io::Error::other("the fault proxy stopped")))
        }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(TokioIo::new(client), service)
        .await;
}

impl Connection {
    /// Handles one request: decides its fault, forwards it and makes the answer. An error
    /// closes the client connection without an answer.
    async fn exchange(&self, request: Request<Incoming>) -> Result<Response<Relay>, BoxError> {
        let (head, body) = request.into_parts();
        let body = body.collect().await?.to_bytes();
        let inner = &self.inner;
        let request_id = inner.requests.fetch_add(1, Ordering::Relaxed);
        let target = head
            .headers
            .get("x-amz-target")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("(none)")
            .to_owned();
        let pending = Pending::new(inner, request_id, &target);
        let fault = inner.decide(&target);
        if let Some(answer) = fault.as_ref().and_then(|f| f.answer(&target, request_id)) {
            return Ok(answer.map(|body| Relay::whole(body, pending)));
        }
        let cut_after = match fault {
            Some(Fault::Drop) => return Err("dropped by the fault proxy".into()),
            Some(Fault::Latency(wait)) => {
                tokio::time::sleep(wait).await;
                None
            }
            Some(Fault::CutStreamAfter(n)) => Some(n),
            _ => None,
        };
        let answer = match self.forward(&head, body, cut_after).await {
            Ok((response, cut)) => read(response, target == STREAMED_TARGET)
                .await
                .map(|answer| (answer, cut)),
            Err(e) => Err(e),
        };
        let (answer, cut) = match answer {
            Ok(answer) => answer,
            Err(e) => return Ok(bad_gateway(inner, &e, pending)),
        };
        if fault == Some(Fault::DropAfterForward) {
            return Err("answer dropped by the fault proxy".into());
        }
        Ok(answer.map(|source| Relay::new(source, cut, pending)))
    }

    /// Sends the request upstream and returns the answer's head, its body to come. A request
    /// to cut goes on a connection of its own (returned in the [`Cut`]); the others on the
    /// client connection's, re-opened when the emulator closed it while idle.
    async fn forward(
        &self,
        head: &http::request::Parts,
        body: Bytes,
        cut_after: Option<u64>,
    ) -> Result<(Response<Incoming>, Option<Cut>), BoxError> {
        let request = || {
            let mut request = Request::new(Full::new(body.clone()));
            *request.method_mut() = head.method.clone();
            *request.uri_mut() = head.uri.clone();
            *request.version_mut() = head.version;
            *request.headers_mut() = head.headers.clone();
            request
        };
        if let Some(after) = cut_after {
            let mut upstream = Upstream::connect(&self.inner.upstream, true).await?;
            let response = upstream.sender.send_request(request()).await?;
            return Ok((response, Some(Cut::new(after, upstream))));
        }
        let mut slot = self.upstream.lock().await;
        for attempt in 0..2 {
            if slot.as_ref().is_some_and(|u| u.sender.is_closed()) {
                *slot = None;
            }
            let reused = slot.is_some();
            let upstream = match &mut *slot {
                Some(upstream) => upstream,
                None => slot.insert(Upstream::connect(&self.inner.upstream, false).await?),
            };
            let sent = match upstream.sender.ready().await {
                Ok(()) => upstream.sender.send_request(request()).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(response) => return Ok((response, None)),
                // A kept-alive connection the emulator closed just as the request went out:
                // the request was not processed; send it once more on a new connection.
                Err(e)
                    if reused
                        && attempt == 0
                        && (e.is_canceled() || e.is_closed() || e.is_incomplete_message()) =>
                {
                    *slot = None;
                }
                Err(e) => {
                    *slot = None;
                    return Err(e.into());
                }
            }
        }
        unreachable!("the second attempt always returns")
    }
}

/// Answers 502 for a forward that failed for a reason of the proxy's own, and counts it.
fn bad_gateway(inner: &Inner, e: &BoxError, pending: Pending) -> Response<Relay> {
    inner.upstream_errors.fetch_add(1, Ordering::Relaxed);
    let body = format!(
        "{{\"__type\":\"FaultProxyUpstreamError\",\"message\":\"{}\"}}",
        json_escape(&format!(
            "fault proxy: forwarding to the emulator failed: {e}"
        ))
    );
    let mut response = Response::new(Relay::whole(Bytes::from(body), pending));
    *response.status_mut() = StatusCode::BAD_GATEWAY;
    let headers = response.headers_mut();
    headers.insert(
        "content-type",
        "application/json".parse().expect("a header"),
    );
    headers.insert("connection", "close".parse().expect("a header"));
    response
}

/// The answer handed to the client: read whole, or (a successful streamed answer) relayed as
/// it arrives, perhaps cut. The request stays in flight until it is dropped.
struct Relay {
    source: Source,
    cut: Option<Cut>,
    pending: Pending,
}

enum Source {
    Whole(Option<Bytes>),
    Streamed(Incoming),
}

impl Relay {
    fn whole(body: Bytes, pending: Pending) -> Self {
        Self::new(Source::Whole(Some(body)), None, pending)
    }

    /// A streamed source keeps its cut; a whole one has nothing to cut.
    fn new(source: Source, cut: Option<Cut>, pending: Pending) -> Self {
        let cut = cut.filter(|_| matches!(source, Source::Streamed(_)));
        Self {
            source,
            cut,
            pending,
        }
    }
}

/// Reads the answer's body whole, or leaves it to be relayed as a stream when `streamed` and
/// the answer is successful.
async fn read(response: Response<Incoming>, streamed: bool) -> Result<Response<Source>, BoxError> {
    let (mut head, body) = response.into_parts();
    if streamed && head.status.is_success() {
        return Ok(Response::from_parts(head, Source::Streamed(body)));
    }
    let body = body.collect().await?.to_bytes();
    head.headers.remove("transfer-encoding");
    head.headers.remove("content-length");
    Ok(Response::from_parts(head, Source::Whole(Some(body))))
}

/// Cuts a streamed body inside an event-stream message: after `after` whole messages and
/// [`CUT_INSIDE`] bytes of the next, the bytes relayed are left to go out, then the client
/// connection fails and the upstream one is reset.
struct Cut {
    after: u64,
    events: EventCounter,
    /// The bytes relayed of the message the cut falls in.
    inside: usize,
    stage: Stage,
    /// The request's own upstream connection, which closes with a reset.
    upstream: Option<Upstream>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    Relaying,
    /// The last bytes before the cut were handed on: the client connection writes them out
    /// before it polls the body again.
    Flushing,
    Cut,
}

impl Cut {
    fn new(after: u64, upstream: Upstream) -> Self {
        Self {
            after,
            events: EventCounter::default(),
            inside: 0,
            stage: Stage::Relaying,
            upstream: Some(upstream),
        }
    }

    /// How many of `data`'s bytes go through before the cut: the whole messages up to
    /// `after`, then [`CUT_INSIDE`] bytes of the next one.
    fn take(&mut self, data: &[u8]) -> usize {
        let whole = self.events.take(data, Some(self.after));
        if self.events.complete < self.after {
            return whole;
        }
        let inside = (data.len() - whole).min(CUT_INSIDE - self.inside);
        self.inside += inside;
        if self.inside >= CUT_INSIDE {
            self.stage = Stage::Flushing;
        }
        whole + inside
    }

    /// Resets the upstream connection: its task is stopped, its socket closed with a zero
    /// linger.
    fn reset_upstream(&mut self) {
        if let Some(upstream) = self.upstream.take() {
            upstream.driver.abort();
        }
    }
}

impl Body for Relay {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        let incoming = match &mut this.source {
            Source::Whole(body) => return Poll::Ready(body.take().map(|b| Ok(Frame::data(b)))),
            Source::Streamed(incoming) => incoming,
        };
        match this.cut.as_mut().map(|cut| cut.stage) {
            Some(Stage::Flushing) => {
                // hyper flushes what it was handed before polling the body again.
                this.cut.as_mut().expect("a cut").stage = Stage::Cut;
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            Some(Stage::Cut) => {
                this.cut.as_mut().expect("a cut").reset_upstream();
                let cut = io::Error::other("stream cut by the fault proxy");
                return Poll::Ready(Some(Err(cut)));
            }
            Some(Stage::Relaying) | None => {}
        }
        loop {
            let frame = match ready!(Pin::new(&mut *incoming).poll_frame(cx)) {
                Some(Ok(frame)) => frame,
                Some(Err(e)) => return Poll::Ready(Some(Err(io::Error::other(e)))),
                None => return Poll::Ready(None),
            };
            let Some(cut) = this.cut.as_mut() else {
                return Poll::Ready(Some(Ok(frame)));
            };
            let data = match frame.into_data() {
                Ok(data) => data,
                Err(frame) => return Poll::Ready(Some(Ok(frame))),
            };
            let take = cut.take(&data);
            if take > 0 {
                return Poll::Ready(Some(Ok(Frame::data(data.slice(..take)))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.source {
            Source::Whole(body) => body.is_none(),
            Source::Streamed(incoming) => self.cut.is_none() && incoming.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.source {
            Source::Whole(body) => {
                SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64))
            }
            Source::Streamed(_) => SizeHint::default(),
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
