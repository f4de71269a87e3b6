//! SubscribeToShard through the AWS SDK over both of kinesis-local's listeners, with the
//! protocol each connection used observed, not assumed.
//!
//! * Plain port, the SDK's default HTTP client (`support::kinesis_client_at`): a byte-level
//!   relay between the client and the emulator records what each connection carries. Every
//!   connection that carries anything opens with an HTTP/1.1 request line (hyper's pool may
//!   open one it never uses; no byte crosses it), the SubscribeToShard request is one of
//!   them, its answer is `HTTP/1.1 200` with a chunked event stream, and no connection offers
//!   HTTP/2 (no `PRI * HTTP/2.0` preface, no `Upgrade: h2c`).
//! * TLS port (`https://localhost:<support::kinesis_tls_port()>`): kinesis-local serves the
//!   self-signed certificate bundled in `harness/node_modules/kinesis-local/server.json`
//!   (`CN=Unknown`, `OU=FS2 Tests`, no subjectAltName, valid until 2118) and selects `h2` when
//!   a client offers it by ALPN (`openssl s_client -alpn h2,http/1.1` says `ALPN protocol:
//!   h2`). The SDK's own way to trust a certificate, a [`TrustStore`] in the TLS context of
//!   `aws-smithy-http-client`, cannot trust this one: rustls (webpki) matches the host name
//!   against subjectAltNames only, and the certificate has none, so the handshake fails with
//!   a name error whatever host name is used (the third test pins that down). So the TLS test
//!   gives the SDK a client built the way its default HTTPS client is built (hyper-util's
//!   client over hyper-rustls, rustls with aws-lc, ALPN offer `h2, http/1.1`; see
//!   `aws-smithy-runtime`'s `default_https_client` and `aws-smithy-http-client`'s
//!   `wrap_connector`) whose only difference is the certificate check: it accepts exactly the
//!   certificate from `server.json` (pinned by its DER bytes, the handshake signature still
//!   verified against its key) in place of the chain and name checks. Through it a
//!   SubscribeToShard subscription delivers the records, and every exchange of the test
//!   (CreateStream through SubscribeToShard) ran on a connection whose ALPN negotiated `h2`
//!   (hyper-util's `Connected::is_negotiated_h2`, set by hyper-rustls from the TLS session)
//!   and came back as an `HTTP/2.0` response, the version hyper gives only to answers read
//!   from an HTTP/2 connection; the pinned certificate was checked on each TLS handshake.
//!
//! Against AWS none of the trust part is needed: the SDK's default HTTPS client (feature
//! `default-https-client`) trusts the platform's roots, offers `h2, http/1.1` by ALPN, and
//! speaks HTTP/2 where the endpoint selects it, which Kinesis does.
//!
//! Every wait has a timeout; nothing is asserted about how long anything took.

mod support;

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aws_sdk_kinesis::config::retry::RetryConfig;
use aws_smithy_http_client::tls::rustls_provider::CryptoMode;
use aws_smithy_http_client::tls::{Provider, TlsContext, TrustStore};
use aws_smithy_runtime_api::client::http::{
    HttpConnector, HttpConnectorFuture, SharedHttpClient, SharedHttpConnector, http_client_fn,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_types::body::SdkBody;
use futures::StreamExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::{Connected, HttpConnector as TcpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kinesis_dataflow::api::{ConsumerStatus, PutRecordsEntry, ShardEvent, SharedKinesis};
use kinesis_dataflow::{AwsKinesis, StartingPoint};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const SHARD: &str = "shardId-000000000000";
const SUBSCRIBE: &str = "Kinesis_20131202.SubscribeToShard";
const PAYLOADS: [&str; 3] = ["a", "b", "c"];
/// Patience for a whole scenario (stream, consumer, records, subscription).
const SCENARIO_PATIENCE: Duration = Duration::from_secs(120);
/// Patience for the records of a subscription.
const EVENTS_PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The scenario, the same over both listeners

/// Creates a one-shard stream, registers a consumer, puts [`PAYLOADS`], subscribes from
/// TRIM_HORIZON and gives the payloads the subscription delivered.
async fn fan_out(client: aws_sdk_kinesis::Client, stream: &str) -> Vec<String> {
    support::create_stream(&client, stream, 1).await;
    let api: SharedKinesis = Arc::new(AwsKinesis::new(client));
    api.register_stream_consumer(stream, "h2-app")
        .await
        .expect("RegisterStreamConsumer");
    let mut arn = None;
    for _ in 0..300 {
        let consumer = api
            .describe_stream_consumer(stream, "h2-app")
            .await
            .expect("DescribeStreamConsumer");
        if consumer.status == ConsumerStatus::Active {
            arn = Some(consumer.consumer_arn);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let arn = arn.expect("the consumer ACTIVE within 300 polls");
    let entries = PAYLOADS
        .iter()
        .map(|p| PutRecordsEntry {
            data: bytes::Bytes::from_static(p.as_bytes()),
            partition_key: "k".into(),
            explicit_hash_key: None,
        })
        .collect();
    let put = api.put_records(stream, entries).await.expect("PutRecords");
    assert_eq!(put.failed_count(), 0);

    let shard: Arc<str> = SHARD.into();
    let mut events = api
        .subscribe_to_shard(stream, &arn, &shard, &StartingPoint::TrimHorizon)
        .await
        .expect("SubscribeToShard");
    let mut got: Vec<ShardEvent> = Vec::new();
    let collect = async {
        while got.iter().map(|e| e.records.len()).sum::<usize>() < PAYLOADS.len() {
            match events.next().await {
                Some(Ok(event)) => got.push(event),
                Some(Err(e)) => panic!("the subscription failed: {e}"),
                None => break,
            }
        }
    };
    tokio::time::timeout(EVENTS_PATIENCE, collect)
        .await
        .expect("the records within the patience");
    got.iter()
        .flat_map(|e| &e.records)
        .map(|r| String::from_utf8_lossy(r.data()).into_owned())
        .collect()
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(SCENARIO_PATIENCE, future)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{what}: not done within {SCENARIO_PATIENCE:?} (emulator logs: {})",
                support::logs_dir().display()
            )
        })
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------------
// Plain port: a relay that records the bytes of each connection

/// The two directions of one relayed connection, as sent.
#[derive(Default)]
struct Conversation {
    request_bytes: Vec<u8>,
    response_bytes: Vec<u8>,
}

impl Conversation {
    /// No byte either way: a connection opened and never used.
    fn is_unused(&self) -> bool {
        self.request_bytes.is_empty() && self.response_bytes.is_empty()
    }
    fn requests(&self) -> String {
        String::from_utf8_lossy(&self.request_bytes).into_owned()
    }
    fn responses(&self) -> String {
        String::from_utf8_lossy(&self.response_bytes).into_owned()
    }
}

impl fmt::Debug for Conversation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let head = |text: String| text.lines().next().unwrap_or_default().to_owned();
        f.debug_struct("Conversation")
            .field("first request line", &head(self.requests()))
            .field("first response line", &head(self.responses()))
            .finish()
    }
}

/// A TCP relay in front of `upstream` that keeps every byte each way, per connection.
struct Relay {
    url: String,
    conversations: Arc<Mutex<Vec<Arc<Mutex<Conversation>>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Relay {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("address"));
        let conversations: Arc<Mutex<Vec<Arc<Mutex<Conversation>>>>> = Arc::default();
        let all = Arc::clone(&conversations);
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let conversation = Arc::new(Mutex::new(Conversation::default()));
                lock(&all).push(Arc::clone(&conversation));
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let up = pipe(client_read, server_write, Arc::clone(&conversation), true);
                    let down = pipe(server_read, client_write, conversation, false);
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Self {
            url,
            conversations,
            accept,
        }
    }

    fn conversations(&self) -> Vec<Arc<Mutex<Conversation>>> {
        lock(&self.conversations).clone()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Copies `from` to `to`, keeping a copy of the bytes in the conversation.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    conversation: Arc<Mutex<Conversation>>,
    request: bool,
) -> std::io::Result<()> {
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        let n = from.read(&mut buffer).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        {
            let mut conversation = lock(&conversation);
            let kept = if request {
                &mut conversation.request_bytes
            } else {
                &mut conversation.response_bytes
            };
            kept.extend_from_slice(&buffer[..n]);
        }
        to.write_all(&buffer[..n]).await?;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_client_subscribes_over_http1_on_the_plain_port() {
    let upstream = support::kinesis_endpoint()
        .strip_prefix("http://")
        .expect("an http:// endpoint")
        .to_owned();
    let relay = Relay::start(upstream).await;
    // The SDK's default HTTP client, as every other test uses it, only pointed at the relay.
    let client = support::kinesis_client_at(&relay.url);
    let stream = support::unique_name("h1-plain");

    let payloads = within("fan-out over the plain port", fan_out(client, &stream)).await;

    assert_eq!(payloads, PAYLOADS);
    let conversations = relay.conversations();
    assert!(!conversations.is_empty());
    let mut subscribed = false;
    for conversation in &conversations {
        let conversation = lock(conversation);
        if conversation.is_unused() {
            // hyper's pool starts a connection when a request finds no idle one; when another
            // connection turns idle first, the request takes that one and the new connection
            // goes to the pool unused (hyper-util's `connection_for`). No protocol was spoken
            // on it, so there is nothing to judge.
            continue;
        }
        let requests = conversation.requests();
        let first = requests.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("POST ") && first.ends_with(" HTTP/1.1"),
            "an HTTP/1.1 request line first: {conversation:?}"
        );
        assert!(
            !requests.contains("PRI * HTTP/2.0"),
            "no HTTP/2 preface: {conversation:?}"
        );
        assert!(
            !requests.to_ascii_lowercase().contains("upgrade:"),
            "no protocol upgrade: {conversation:?}"
        );
        let responses = conversation.responses();
        assert!(
            responses.starts_with("HTTP/1.1 "),
            "an HTTP/1.1 status line first: {conversation:?}"
        );
        if requests.contains(SUBSCRIBE) {
            subscribed = true;
            let lower = responses.to_ascii_lowercase();
            assert!(
                lower.contains("application/vnd.amazon.eventstream")
                    && lower.contains("transfer-encoding: chunked"),
                "the event stream as an HTTP/1.1 chunked body: {conversation:?}"
            );
        }
    }
    assert!(subscribed, "a relayed SubscribeToShard: {conversations:?}");
}

// ---------------------------------------------------------------------------------------------
// TLS port: an SDK HTTP client that pins the emulator's certificate and records each exchange

/// kinesis-local's certificate (PEM), from the `server.json` it serves on its TLS port.
fn emulator_certificate_pem() -> String {
    let path = support::harness_dir().join("node_modules/kinesis-local/server.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let json: serde_json::Value = serde_json::from_str(&text).expect("server.json is JSON");
    json["server"]["cert"]
        .as_str()
        .expect("server.json has server.cert")
        .to_owned()
}

/// One request/response exchange of the TLS client.
#[derive(Clone, Debug)]
struct Exchange {
    target: String,
    version: http::Version,
    /// `Some(true)` when the connection's ALPN negotiated `h2`.
    negotiated_h2: Option<bool>,
}

#[derive(Debug, Default)]
struct Observed {
    /// Handshakes in which the server presented the pinned certificate.
    handshakes: AtomicUsize,
    exchanges: Mutex<Vec<Exchange>>,
}

/// Accepts the one certificate it pins (by its DER bytes) in place of the chain and name
/// checks, and verifies the handshake's signature against that certificate's key as usual.
#[derive(Debug)]
struct PinnedCertificate {
    pinned: CertificateDer<'static>,
    algorithms: WebPkiSupportedAlgorithms,
    observed: Arc<Observed>,
}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() != self.pinned.as_ref() {
            return Err(rustls::Error::InvalidCertificate(
                CertificateError::UnknownIssuer,
            ));
        }
        self.observed.handshakes.fetch_add(1, Ordering::SeqCst);
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The SDK's side of the client: hands each request to hyper-util's client and records the
/// version of the response and what the connection negotiated.
#[derive(Clone, Debug)]
struct RecordingConnector {
    client: HyperClient<HttpsConnector<TcpConnector>, SdkBody>,
    observed: Arc<Observed>,
}

impl HttpConnector for RecordingConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let mut request = match request.try_into_http1x() {
            Ok(request) => request,
            Err(e) => return HttpConnectorFuture::ready(Err(ConnectorError::user(e.into()))),
        };
        let target = request
            .headers()
            .get("x-amz-target")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let connection = hyper_util::client::legacy::connect::capture_connection(&mut request);
        let client = self.client.clone();
        let observed = Arc::clone(&self.observed);
        HttpConnectorFuture::new(async move {
            let response = client
                .request(request)
                .await
                .map_err(|e| ConnectorError::io(e.into()))?;
            let negotiated_h2 = connection
                .connection_metadata()
                .as_ref()
                .map(Connected::is_negotiated_h2);
            lock(&observed.exchanges).push(Exchange {
                target,
                version: response.version(),
                negotiated_h2,
            });
            HttpResponse::try_from(response.map(SdkBody::from_body_1_x))
                .map_err(|e| ConnectorError::other(e.into(), None))
        })
    }
}

/// An SDK HTTP client built like the SDK's default HTTPS client (hyper-util's legacy client,
/// hyper-rustls, rustls on aws-lc, ALPN `h2, http/1.1`), trusting exactly the emulator's
/// certificate.
fn pinned_client(observed: &Arc<Observed>) -> SharedHttpClient {
    let pem = emulator_certificate_pem();
    let pinned = CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate");
    let provider: Arc<CryptoProvider> = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let verifier = PinnedCertificate {
        pinned,
        algorithms: provider.signature_verification_algorithms,
        observed: Arc::clone(observed),
    };
    let mut tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the default protocol versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    // The SDK's default client offers exactly this (aws-smithy-http-client's wrap_connector).
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let mut tcp = TcpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let https = HttpsConnector::from((tcp, tls));
    let client = HyperClient::builder(TokioExecutor::new())
        .pool_timer(TokioTimer::new())
        .build(https);
    let connector = SharedHttpConnector::new(RecordingConnector {
        client,
        observed: Arc::clone(observed),
    });
    http_client_fn(move |_settings, _components| connector.clone())
}

fn tls_endpoint() -> String {
    format!("https://localhost:{}", support::kinesis_tls_port())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_to_shard_delivers_records_over_http2_with_tls() {
    let observed = Arc::new(Observed::default());
    let config = support::kinesis_config_at(&tls_endpoint())
        .http_client(pinned_client(&observed))
        .build();
    let client = aws_sdk_kinesis::Client::from_conf(config);
    let stream = support::unique_name("h2-tls");

    let payloads = within("fan-out over TLS", fan_out(client, &stream)).await;

    assert_eq!(payloads, PAYLOADS);
    let exchanges = lock(&observed.exchanges).clone();
    assert!(
        exchanges.iter().any(|e| e.target == SUBSCRIBE),
        "SubscribeToShard went through the TLS client: {exchanges:?}"
    );
    for exchange in &exchanges {
        assert_eq!(
            (exchange.version, exchange.negotiated_h2),
            (http::Version::HTTP_2, Some(true)),
            "{} over HTTP/2 negotiated by ALPN: {exchanges:?}",
            exchange.target
        );
    }
    assert!(
        observed.handshakes.load(Ordering::SeqCst) >= 1,
        "the server presented the pinned certificate"
    );
}

// ---------------------------------------------------------------------------------------------
// TLS port: why the SDK's trust store is not enough for this certificate

/// The errors of `error`'s chain, looking inside `io::Error`s (whose `source` skips their
/// payload).
fn chain<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(error), |&error| {
        match error.downcast_ref::<std::io::Error>() {
            Some(io) => io
                .get_ref()
                .map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => error.source(),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_trust_store_cannot_trust_the_emulator_certificate() {
    // The SDK's default HTTPS client with the emulator's certificate as the only root.
    let trust = TrustStore::empty().with_pem_certificate(emulator_certificate_pem().into_bytes());
    let http_client = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::AwsLc))
        .tls_context(
            TlsContext::builder()
                .with_trust_store(trust)
                .build()
                .expect("a TLS context"),
        )
        .build_https();
    let config = support::kinesis_config_at(&tls_endpoint())
        .http_client(http_client)
        .retry_config(RetryConfig::disabled())
        .build();
    let client = aws_sdk_kinesis::Client::from_conf(config);

    let result = within("ListStreams over TLS", client.list_streams().send()).await;

    let error = result.expect_err("the handshake fails");
    let rustls_error = chain(&error)
        .find_map(|e| e.downcast_ref::<rustls::Error>())
        .unwrap_or_else(|| panic!("a rustls error in the chain: {error:?}"));
    assert!(
        matches!(
            rustls_error,
            rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
            )
        ),
        "the certificate is trusted, but has no name for the host: {rustls_error:?}"
    );
}
