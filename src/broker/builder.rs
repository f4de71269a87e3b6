//! [`KinesisBroker`] (configuration) and [`ConnectedKinesis`] (the live connection).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use ruststream::{Broker, ConnectedBroker};

use super::connection::{ConnectedKinesis, Connection};
use super::in_process::Harness;
use crate::api::{AwsKinesis, KinesisAdmin, MemoryKinesis};
use crate::error::KinesisError;
use crate::lease::{DynamoLeaseStore, MemoryLeaseStore, SharedLeaseStore};

/// How long [`ConnectedBroker::shutdown`] waits for the subscriptions to flush their
/// checkpoints and release their leases, by default.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Where the records live.
#[derive(Clone)]
enum Transport {
    /// The AWS SDK, configured at `connect`.
    Aws(AwsTransport),
    /// An in-memory Kinesis (demos, tests); clones of the broker share it.
    Memory(MemoryKinesis),
}

/// The AWS transport's settings, resolved at `connect`.
#[derive(Clone, Default)]
struct AwsTransport {
    sdk_config: Option<Box<aws_config::SdkConfig>>,
    endpoint: Option<String>,
    kinesis_endpoint: Option<String>,
    dynamodb_endpoint: Option<String>,
    region: Option<String>,
}

/// Where the leases and checkpoints live.
#[derive(Clone)]
enum LeaseChoice {
    /// A DynamoDB table named after the application (the default with the AWS transport).
    Dynamo { table: Option<String> },
    /// A store given ready (an in-memory one, or any [`LeaseStore`](crate::LeaseStore)).
    Ready(SharedLeaseStore),
}

/// Kinesis as a RustStream broker.
///
/// Construction is synchronous and does no I/O: it only records settings. [`Broker::connect`]
/// resolves them. With the AWS transport (the default) that is the standard AWS configuration
/// (credential chain, `AWS_REGION`, `AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_KINESIS`,
/// `AWS_ENDPOINT_URL_DYNAMODB`) unless a ready [`SdkConfig`](aws_config::SdkConfig) is given,
/// and the leases go to a DynamoDB table named after the [application](Self::application).
///
/// `connect` also asks the credential chain for credentials (at most
/// [`CREDENTIALS_TIMEOUT`]), so missing or expired credentials fail there with
/// [`KinesisError::Credentials`] instead of on every later call.
///
/// Clones share the in-memory transport and lease store when those were chosen.
///
/// ```
/// use std::time::Duration;
/// use kinesis_dataflow::broker::KinesisBroker;
///
/// let broker = KinesisBroker::new()
///     .application("shipping")
///     .region("eu-west-1")
///     .create_missing_streams(2)
///     .shutdown_grace(Duration::from_secs(1));
/// # let _ = broker;
/// ```
#[derive(Clone)]
#[must_use]
pub struct KinesisBroker {
    transport: Transport,
    leases: LeaseChoice,
    application: Option<String>,
    owner: Option<String>,
    create_missing_streams: Option<u32>,
    shutdown_grace: Duration,
    /// The in-process world, created on first `connect_in_process` and shared by clones.
    #[cfg(feature = "testing")]
    world: Arc<std::sync::OnceLock<Arc<super::in_process::World>>>,
}

impl fmt::Debug for KinesisBroker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let transport = match &self.transport {
            Transport::Aws(AwsTransport {
                sdk_config,
                endpoint,
                kinesis_endpoint,
                dynamodb_endpoint,
                region,
            }) => format!(
                "aws(config: {}, endpoint: {endpoint:?}, kinesis_endpoint: \
                 {kinesis_endpoint:?}, dynamodb_endpoint: {dynamodb_endpoint:?}, region: \
                 {region:?})",
                if sdk_config.is_some() {
                    "given"
                } else {
                    "from environment"
                }
            ),
            Transport::Memory(_) => "memory".to_owned(),
        };
        let leases = match &self.leases {
            LeaseChoice::Dynamo { table } => format!("dynamodb(table: {table:?})"),
            LeaseChoice::Ready(_) => "given".to_owned(),
        };
        f.debug_struct("KinesisBroker")
            .field("transport", &transport)
            .field("leases", &leases)
            .field("application", &self.application)
            .field("owner", &self.owner)
            .field("create_missing_streams", &self.create_missing_streams)
            .field("shutdown_grace", &self.shutdown_grace)
            .finish()
    }
}

impl Default for KinesisBroker {
    fn default() -> Self {
        Self::new()
    }
}

impl KinesisBroker {
    /// A broker on AWS, configured from the environment at `connect`, with leases in DynamoDB.
    pub fn new() -> Self {
        Self {
            transport: Transport::Aws(AwsTransport::default()),
            leases: LeaseChoice::Dynamo { table: None },
            application: None,
            owner: None,
            create_missing_streams: None,
            shutdown_grace: DEFAULT_SHUTDOWN_GRACE,
            #[cfg(feature = "testing")]
            world: Arc::default(),
        }
    }

    /// A broker on an in-memory Kinesis, with leases in memory (for demos and tests). Clones
    /// of the broker (and of `kinesis`) share the streams and the leases.
    pub fn in_memory(kinesis: MemoryKinesis) -> Self {
        Self {
            transport: Transport::Memory(kinesis),
            leases: LeaseChoice::Ready(Arc::new(MemoryLeaseStore::new())),
            ..Self::new()
        }
    }

    /// Uses a ready SDK configuration instead of the environment's (AWS transport only).
    pub fn sdk_config(mut self, config: aws_config::SdkConfig) -> Self {
        if let Transport::Aws(aws) = &mut self.transport {
            aws.sdk_config = Some(Box::new(config));
        }
        self
    }

    /// Sends every Kinesis and DynamoDB call to `url` (LocalStack, emulators). AWS transport
    /// only; it overrides the endpoint of a given SDK configuration and the environment's
    /// (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_KINESIS`, ...) too.
    pub fn endpoint(mut self, url: impl Into<String>) -> Self {
        if let Transport::Aws(aws) = &mut self.transport {
            aws.endpoint = Some(url.into());
        }
        self
    }

    /// Sends the Kinesis calls to `url` (ahead of [`endpoint`](Self::endpoint) and
    /// `AWS_ENDPOINT_URL_KINESIS`). AWS transport only.
    pub fn kinesis_endpoint(mut self, url: impl Into<String>) -> Self {
        if let Transport::Aws(aws) = &mut self.transport {
            aws.kinesis_endpoint = Some(url.into());
        }
        self
    }

    /// Sends the lease table's DynamoDB calls to `url` (ahead of
    /// [`endpoint`](Self::endpoint) and `AWS_ENDPOINT_URL_DYNAMODB`). AWS transport only.
    pub fn dynamodb_endpoint(mut self, url: impl Into<String>) -> Self {
        if let Transport::Aws(aws) = &mut self.transport {
            aws.dynamodb_endpoint = Some(url.into());
        }
        self
    }

    /// The AWS region (default: the environment's). AWS transport only.
    pub fn region(mut self, name: impl Into<String>) -> Self {
        if let Transport::Aws(aws) = &mut self.transport {
            aws.region = Some(name.into());
        }
        self
    }

    /// The application name: it names the DynamoDB lease table
    /// (`kinesis-dataflow-<application>`). Instances of one application share the stream's
    /// shards through that table; different applications each read every record.
    ///
    /// Default: the file name of the running executable, so copies of one program share the
    /// shards and two different programs never compete for them.
    pub fn application(mut self, name: impl Into<String>) -> Self {
        self.application = Some(name.into());
        self
    }

    /// The DynamoDB lease table, instead of the one derived from the application name.
    pub fn lease_table(mut self, table: impl Into<String>) -> Self {
        self.leases = LeaseChoice::Dynamo {
            table: Some(table.into()),
        };
        self
    }

    /// Keeps leases and checkpoints in memory: nothing survives the process, and instances
    /// cannot share shards. Clones of the broker share the store.
    pub fn in_memory_leases(mut self) -> Self {
        self.leases = LeaseChoice::Ready(Arc::new(MemoryLeaseStore::new()));
        self
    }

    /// Keeps leases and checkpoints in `store`.
    pub fn lease_store(mut self, store: SharedLeaseStore) -> Self {
        self.leases = LeaseChoice::Ready(store);
        self
    }

    /// The id this instance holds leases as (default: host, process id and a random suffix,
    /// fresh for each subscription).
    pub fn owner(mut self, owner: impl Into<String>) -> Self {
        self.owner = Some(owner.into());
        self
    }

    /// Creates a missing stream with `shards` shards when a subscription opens it (the
    /// by-name form `#[subscriber("name")]`, and descriptors that do not say
    /// [`create_if_missing`](super::KinesisStream::create_if_missing) themselves) or when a
    /// publish of this connection writes to it, whichever comes first. Without it, both refuse
    /// a missing stream ([`KinesisError::StreamNotFound`]).
    pub fn create_missing_streams(mut self, shards: u32) -> Self {
        self.create_missing_streams = Some(shards);
        self
    }

    /// How long shutdown waits for the subscriptions to flush their checkpoints and release
    /// their leases (default 2 s; the framework has settled the handlers before). Half of it
    /// goes to deliveries still held unsettled, the rest to the flush and the release.
    pub fn shutdown_grace(mut self, grace: Duration) -> Self {
        self.shutdown_grace = grace;
        self
    }

    fn application_name(&self) -> String {
        if let Some(name) = &self.application {
            return name.clone();
        }
        std::env::current_exe()
            .ok()
            .and_then(|path| path.file_stem().map(|s| s.to_string_lossy().into_owned()))
            .unwrap_or_default()
    }

    /// The in-process world of this broker and its clones.
    #[cfg(feature = "testing")]
    pub(crate) fn world(&self) -> Arc<super::in_process::World> {
        self.world
            .get_or_init(|| {
                let kinesis = match &self.transport {
                    Transport::Memory(kinesis) => kinesis.clone(),
                    Transport::Aws(_) => MemoryKinesis::new(),
                };
                let store = match &self.leases {
                    LeaseChoice::Ready(store) => Some(store.clone()),
                    LeaseChoice::Dynamo { .. } => None,
                };
                Arc::new(super::in_process::World::new(kinesis, store))
            })
            .clone()
    }

    /// Connects to `world` in process, with this broker's settings.
    #[cfg(feature = "testing")]
    pub(crate) async fn connect_to_world(
        mut self,
        world: Arc<super::in_process::World>,
    ) -> Result<ConnectedKinesis, KinesisError> {
        self.transport = Transport::Memory(world.kinesis.clone());
        self.leases = LeaseChoice::Ready(world.store.clone());
        let mut connection = self.resolve().await?;
        connection.harness.accounting = Some(world.accounting.clone());
        Ok(ConnectedKinesis {
            inner: Arc::new(connection),
        })
    }

    /// Checks the settings and builds the connection: the clients and the lease store.
    async fn resolve(self) -> Result<Connection, KinesisError> {
        self.check_settings()?;
        let application = self.application_name();
        let memory = match &self.transport {
            Transport::Memory(kinesis) => Some(kinesis.clone()),
            Transport::Aws(_) => None,
        };
        let (api, dynamo): (Arc<dyn KinesisAdmin>, Option<aws_sdk_dynamodb::Client>) =
            match &self.transport {
                Transport::Memory(kinesis) => (Arc::new(kinesis.clone()), None),
                Transport::Aws(aws) => {
                    let (kinesis, dynamo) = aws.clients().await?;
                    (Arc::new(AwsKinesis::from_builder(kinesis)), Some(dynamo))
                }
            };
        let store = self.leases_to_use(dynamo, &application)?;
        let mut connection = Connection::new(
            api,
            store,
            Harness::on(memory),
            self.owner,
            self.create_missing_streams,
            self.shutdown_grace,
        );
        connection.application = application;
        Ok(connection)
    }

    /// Refuses the settings that cannot work, before any call.
    fn check_settings(&self) -> Result<(), KinesisError> {
        if let Some(0) = self.create_missing_streams {
            return Err(KinesisError::InvalidConfig {
                setting: "create_missing_streams",
                value: "0".into(),
                reason: "a stream has at least one shard".into(),
            });
        }
        if self.shutdown_grace > Duration::from_secs(60) {
            return Err(KinesisError::InvalidConfig {
                setting: "shutdown_grace",
                value: format!("{:?}", self.shutdown_grace),
                reason: "must be at most 60 s".into(),
            });
        }
        Ok(())
    }

    /// The lease store to use: the one given, or the DynamoDB table of the application.
    fn leases_to_use(
        &self,
        dynamo: Option<aws_sdk_dynamodb::Client>,
        application: &str,
    ) -> Result<SharedLeaseStore, KinesisError> {
        match &self.leases {
            LeaseChoice::Ready(store) => Ok(store.clone()),
            LeaseChoice::Dynamo { table } => {
                let Some(client) = dynamo else {
                    return Err(KinesisError::InvalidConfig {
                        setting: "lease_table",
                        value: format!("{table:?}"),
                        reason: "a DynamoDB lease store needs the AWS transport; use \
                                 `in_memory_leases()` with the in-memory transport"
                            .into(),
                    });
                };
                let table = table
                    .clone()
                    .unwrap_or_else(|| DynamoLeaseStore::default_table_name(application));
                Ok(Arc::new(DynamoLeaseStore::new(client, table)?))
            }
        }
    }
}

impl AwsTransport {
    /// The SDK configuration: the one given, or the standard environment, with the broker's
    /// endpoint and region on top.
    async fn sdk_config(&self) -> aws_config::SdkConfig {
        match &self.sdk_config {
            Some(config) => {
                let mut builder = config.to_builder();
                if let Some(url) = &self.endpoint {
                    builder.set_endpoint_url(Some(url.clone()));
                }
                if let Some(region) = &self.region {
                    builder.set_region(Some(aws_config::Region::new(region.clone())));
                }
                builder.build()
            }
            None => {
                let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
                if let Some(url) = &self.endpoint {
                    loader = loader.endpoint_url(url.clone());
                }
                if let Some(region) = &self.region {
                    loader = loader.region(aws_config::Region::new(region.clone()));
                }
                loader.load().await
            }
        }
    }

    /// The Kinesis client's configuration (the transport builds its client from it) and the
    /// DynamoDB client, once the credentials are checked. Endpoints set on the broker are set
    /// on each, so they win over the environment's
    /// (`AWS_ENDPOINT_URL_KINESIS`, ...), which the SDK would otherwise prefer to the
    /// configuration's.
    async fn clients(
        &self,
    ) -> Result<(aws_sdk_kinesis::config::Builder, aws_sdk_dynamodb::Client), KinesisError> {
        let config = self.sdk_config().await;
        crate::api::aws::require_region(&config)?;
        check_credentials(&config).await?;
        let mut kinesis = aws_sdk_kinesis::config::Builder::from(&config);
        if let Some(url) = self.kinesis_endpoint.as_ref().or(self.endpoint.as_ref()) {
            kinesis = kinesis.endpoint_url(url.clone());
        }
        let mut dynamo = aws_sdk_dynamodb::config::Builder::from(&config);
        if let Some(url) = self.dynamodb_endpoint.as_ref().or(self.endpoint.as_ref()) {
            dynamo = dynamo.endpoint_url(url.clone());
        }
        Ok((kinesis, aws_sdk_dynamodb::Client::from_conf(dynamo.build())))
    }
}

/// How long `connect` waits for the credential chain (which may ask the instance metadata
/// service) before it says there are none.
pub const CREDENTIALS_TIMEOUT: Duration = Duration::from_secs(10);

/// Fails `connect` with a clear error when no credentials can be had, or the ones there are
/// have expired, rather than letting every later call fail (or hang on retries).
async fn check_credentials(config: &aws_config::SdkConfig) -> Result<(), KinesisError> {
    use aws_sdk_kinesis::config::ProvideCredentials;
    let Some(provider) = config.credentials_provider() else {
        return Err(KinesisError::Credentials {
            reason: "the SDK configuration has no credentials provider".into(),
        });
    };
    let credentials =
        match tokio::time::timeout(CREDENTIALS_TIMEOUT, provider.provide_credentials()).await {
            Err(_) => {
                return Err(KinesisError::Credentials {
                    reason: format!(
                        "the credential chain gave none within {CREDENTIALS_TIMEOUT:?}"
                    ),
                });
            }
            Ok(Err(e)) => {
                return Err(KinesisError::Credentials {
                    reason: format!(
                        "the credential provider failed: {}",
                        crate::error::brief(&e)
                    ),
                });
            }
            Ok(Ok(credentials)) => credentials,
        };
    if let Some(expiry) = credentials.expiry()
        && expiry <= std::time::SystemTime::now()
    {
        let ago = std::time::SystemTime::now()
            .duration_since(expiry)
            .unwrap_or_default();
        return Err(KinesisError::Credentials {
            reason: format!(
                "the credentials expired {}s ago (access key id ending in ...{})",
                ago.as_secs(),
                credentials
                    .access_key_id()
                    .chars()
                    .rev()
                    .take(4)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<String>()
            ),
        });
    }
    Ok(())
}

impl Broker for KinesisBroker {
    type Error = KinesisError;
    type Connected = ConnectedKinesis;

    /// Resolves the configuration (with the AWS transport: the SDK configuration and the
    /// lease table's client) on the runtime `connect` runs on; every task the broker starts
    /// later runs on that runtime.
    async fn connect(self) -> Result<ConnectedKinesis, KinesisError> {
        Ok(ConnectedKinesis {
            inner: Arc::new(self.resolve().await?),
        })
    }
}

/// The protocol name in the service's AsyncAPI document.
const PROTOCOL: &str = "kinesis";

/// The Kinesis endpoint this broker is set to reach, for the `servers` section of the service's
/// AsyncAPI document: lets a service register it under a label
/// (`RustStream::with_broker_labeled("orders", KinesisBroker::new(), ..)`).
///
/// Resolved without I/O in the order `connect` uses: `kinesis_endpoint`, then `endpoint`,
/// then `AWS_ENDPOINT_URL_KINESIS` and `AWS_ENDPOINT_URL` (unless a hand-built `SdkConfig`
/// was given, or `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`), then the given `SdkConfig`'s
/// endpoint; without any, the regional endpoint `kinesis.<region>.amazonaws.com`
/// (`.amazonaws.com.cn` in China; the region from `region`, the given `SdkConfig`,
/// `AWS_REGION` or `AWS_DEFAULT_REGION`). A region only a profile file names is resolved at `connect`; the
/// description then has no host. The in-memory transport has no host either. Only the host
/// and port of an endpoint are described: credentials in an endpoint URL never reach the
/// document.
impl ruststream::DescribeServer for KinesisBroker {
    fn describe_server(&self) -> ruststream::ServerSpec {
        self.describe_with(|name| std::env::var(name).ok())
    }
}

impl KinesisBroker {
    /// [`describe_server`](ruststream::DescribeServer::describe_server) with `env` for the
    /// process environment.
    fn describe_with(&self, env: impl Fn(&str) -> Option<String>) -> ruststream::ServerSpec {
        let without_host = |description: String| {
            let mut spec = ruststream::ServerSpec::new("", PROTOCOL);
            spec.host = None;
            spec.description = Some(description);
            spec
        };
        let Transport::Aws(aws) = &self.transport else {
            return without_host("the in-memory Kinesis transport, in this process".to_owned());
        };
        let env = |name: &str| env(name).filter(|v| !v.is_empty());
        let url = aws.kinesis_url(&env);
        let region = aws
            .region
            .clone()
            .or_else(|| Some(aws.sdk_config.as_ref()?.region()?.to_string()))
            .or_else(|| env("AWS_REGION"))
            .or_else(|| env("AWS_DEFAULT_REGION"));
        let description = match &region {
            Some(region) => format!("Amazon Kinesis Data Streams, region {region}"),
            None => "Amazon Kinesis Data Streams, region resolved at connect".to_owned(),
        };
        let mut spec = match (url, region) {
            (Some(url), _) => ruststream::ServerSpec::from_url(&url, PROTOCOL),
            (None, Some(region)) => {
                let suffix = if region.starts_with("cn-") {
                    "amazonaws.com.cn"
                } else {
                    "amazonaws.com"
                };
                ruststream::ServerSpec::new(format!("kinesis.{region}.{suffix}"), PROTOCOL)
            }
            (None, None) => return without_host(description),
        };
        spec.description = Some(description);
        spec
    }
}

impl AwsTransport {
    /// The Kinesis endpoint in the SDK's order: one set on the broker (set on the client
    /// itself), then the environment's, then the configuration's. The environment is read
    /// when the SDK configuration is loaded from it (not for a hand-built SdkConfig), and not
    /// at all with `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`.
    fn kinesis_url(&self, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        let reads_env = self
            .sdk_config
            .as_ref()
            .is_none_or(|c| c.service_config().is_some())
            && !env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let from_env = || {
            reads_env
                .then(|| env("AWS_ENDPOINT_URL_KINESIS").or_else(|| env("AWS_ENDPOINT_URL")))
                .flatten()
        };
        self.kinesis_endpoint
            .clone()
            .or_else(|| self.endpoint.clone())
            .or_else(from_env)
            .or_else(|| self.sdk_config.as_ref()?.endpoint_url().map(str::to_owned))
    }
}

/// What a shutdown did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClosedKinesis {
    /// Subscriptions stopped (checkpoints flushed, leases released) within the grace period.
    pub subscriptions_stopped: usize,
    /// Subscriptions still stopping when the grace period ended: their leases expire on their
    /// own, and another instance resumes from their last written checkpoint.
    pub subscriptions_unfinished: usize,
}

impl ConnectedBroker for ConnectedKinesis {
    type Error = KinesisError;
    type Closed = ClosedKinesis;

    /// Stops every subscription gracefully: reading stops, settled progress is checkpointed
    /// and the leases are released, within the shutdown grace. Afterwards every handle of this
    /// connection (publishers, subscribers, unsettled deliveries) answers
    /// [`KinesisError::ShutDown`].
    async fn shutdown(self) -> Result<ClosedKinesis, KinesisError> {
        let (stopped, unfinished) = self.inner.close().await;
        Ok(ClosedKinesis {
            subscriptions_stopped: stopped,
            subscriptions_unfinished: unfinished,
        })
    }
}

#[cfg(test)]
mod tests {
    use ruststream::DescribeServer;

    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn the_server_is_the_endpoint_host_without_credentials() {
        let broker = KinesisBroker::new()
            .endpoint("http://other:4566")
            .kinesis_endpoint("https://AKIDEXAMPLE:hunter2@kinesis.internal:8443/base?x=1")
            .region("eu-west-1");
        let spec = broker.describe_with(no_env);
        assert_eq!(spec.host.as_deref(), Some("kinesis.internal:8443"));
        assert_eq!(spec.protocol, "kinesis");
        assert!(!format!("{spec:?}").contains("hunter2"), "{spec:?}");
        assert!(!format!("{spec:?}").contains("AKIDEXAMPLE"), "{spec:?}");
        assert_eq!(
            spec.description.as_deref(),
            Some("Amazon Kinesis Data Streams, region eu-west-1")
        );
        // `endpoint` when there is no Kinesis one; the environment after both.
        let env = |name: &str| (name == "AWS_ENDPOINT_URL_KINESIS").then(|| "http://env:1".into());
        let spec = KinesisBroker::new()
            .endpoint("http://other:4566")
            .describe_with(env);
        assert_eq!(spec.host.as_deref(), Some("other:4566"));
        let spec = KinesisBroker::new().describe_with(env);
        assert_eq!(spec.host.as_deref(), Some("env:1"));
        // The Kinesis variable first; a hand-built SdkConfig is not read with the environment,
        // so its endpoint is used; the environment's endpoints are skipped when it says so.
        let both = |name: &str| match name {
            "AWS_ENDPOINT_URL_KINESIS" => Some("http://kinesis-env:1".into()),
            "AWS_ENDPOINT_URL" => Some("http://global-env:2".into()),
            _ => None,
        };
        let config = aws_config::SdkConfig::builder()
            .endpoint_url("http://config:3")
            .build();
        let spec = KinesisBroker::new().describe_with(both);
        assert_eq!(spec.host.as_deref(), Some("kinesis-env:1"));
        let spec = KinesisBroker::new()
            .sdk_config(config.clone())
            .describe_with(both);
        assert_eq!(spec.host.as_deref(), Some("config:3"));
        let spec = KinesisBroker::new()
            .sdk_config(config)
            .describe_with(no_env);
        assert_eq!(spec.host.as_deref(), Some("config:3"));
        let ignoring = |name: &str| match name {
            "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS" => Some("true".into()),
            "AWS_REGION" => Some("eu-west-1".into()),
            other => both(other),
        };
        let spec = KinesisBroker::new().describe_with(ignoring);
        assert_eq!(
            spec.host.as_deref(),
            Some("kinesis.eu-west-1.amazonaws.com")
        );
    }

    #[test]
    fn without_an_endpoint_the_server_is_the_regional_one() {
        let spec = KinesisBroker::new()
            .region("us-east-2")
            .describe_with(no_env);
        assert_eq!(
            spec.host.as_deref(),
            Some("kinesis.us-east-2.amazonaws.com")
        );
        let config = aws_config::SdkConfig::builder()
            .region(aws_config::Region::new("ap-south-1"))
            .build();
        let spec = KinesisBroker::new()
            .sdk_config(config)
            .describe_with(no_env);
        assert_eq!(
            spec.host.as_deref(),
            Some("kinesis.ap-south-1.amazonaws.com")
        );
        let env = |name: &str| (name == "AWS_DEFAULT_REGION").then(|| "sa-east-1".into());
        let spec = KinesisBroker::new().describe_with(env);
        assert_eq!(
            spec.host.as_deref(),
            Some("kinesis.sa-east-1.amazonaws.com")
        );
        let spec = KinesisBroker::new()
            .region("cn-north-1")
            .describe_with(no_env);
        assert_eq!(
            spec.host.as_deref(),
            Some("kinesis.cn-north-1.amazonaws.com.cn")
        );
        // Nothing known before connect: no host, and the description says why.
        let spec = KinesisBroker::new().describe_with(no_env);
        assert_eq!(spec.host, None);
        assert_eq!(
            spec.description.as_deref(),
            Some("Amazon Kinesis Data Streams, region resolved at connect")
        );
    }

    #[test]
    fn the_in_memory_transport_has_no_host() {
        let spec = KinesisBroker::in_memory(MemoryKinesis::new()).describe_server();
        assert_eq!(spec.host, None);
        assert_eq!(spec.protocol, "kinesis");
    }
}
