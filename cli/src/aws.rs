//! The AWS side: the SDK configuration from the standard environment, the lease table (checked,
//! never created), the stream's shards and the lease rows.

use std::time::Duration;

use aws_sdk_kinesis::error::{DisplayErrorContext, ProvideErrorMetadata};
use kinesis_dataflow::DynamoLeaseStore;
use kinesis_dataflow::lease::{KeyLayout, Lease, LeaseError, LeaseRow};

use crate::Failure;
use crate::args::Target;

/// The clients of one run.
pub struct Aws {
    /// Kinesis.
    pub kinesis: aws_sdk_kinesis::Client,
    /// The lease table.
    pub store: DynamoLeaseStore,
    /// How the lease table is keyed.
    pub layout: KeyLayout,
    /// The region, for messages.
    pub region: String,
}

/// One shard as ListShards gives it.
#[derive(Debug, Clone)]
pub struct Shard {
    /// The shard id.
    pub id: String,
    /// Its parents (none, one after a split, two after a merge).
    pub parents: Vec<String>,
    /// The first sequence number.
    pub starting_sequence_number: String,
    /// The last sequence number, for a closed shard.
    pub ending_sequence_number: Option<String>,
}

impl Shard {
    /// True when the stream lists an ending sequence number: nothing more arrives in it.
    pub fn is_closed(&self) -> bool {
        self.ending_sequence_number.is_some()
    }
}

/// True when `row` was written for a shard of an earlier stream of the same name (deleted and
/// created again): it records a starting sequence number other than the listed shard's. The
/// library's rule (a row written before the number was recorded counts as this stream's):
/// such a row is replaced once nobody holds it (at a listing after its lease lapsed, or
/// after its holder let it go) and the shard read from its beginning.
pub fn is_earlier_stream(row: &Lease, shard: &Shard) -> bool {
    row.is_other_generation(&shard.starting_sequence_number)
}

/// How long one call's attempt may go unanswered, and one call with its retries.
pub const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(10);
/// See [`ATTEMPT_TIMEOUT`].
pub const CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// Loads the SDK configuration, with its region (required) and credentials (checked). Every
/// call is bounded ([`ATTEMPT_TIMEOUT`], [`CALL_TIMEOUT`]): the SDK's defaults bound only
/// the connection, and an endpoint that accepts and never answers would hang the tool.
pub async fn config() -> Result<(aws_config::SdkConfig, String), Failure> {
    let timeouts = aws_config::timeout::TimeoutConfig::builder()
        .operation_attempt_timeout(ATTEMPT_TIMEOUT)
        .operation_timeout(CALL_TIMEOUT)
        .build();
    let config = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .timeout_config(timeouts)
        .load()
        .await;
    let Some(region) = config.region().map(ToString::to_string) else {
        return Err(Failure::usage(
            "no AWS region configured: set AWS_REGION (or a region in your AWS profile)".to_owned(),
        ));
    };
    check_credentials(&config).await?;
    Ok((config, region))
}

/// Loads the SDK configuration and checks the lease table (exists, a lease table's key).
pub async fn connect(target: &Target) -> Result<Aws, Failure> {
    let (config, region) = config().await?;
    let store = DynamoLeaseStore::from_conf(&config, target.table.clone())
        .map_err(|e| Failure::usage(format!("--table: {e}")))?;
    store
        .check_table()
        .await
        .map_err(|e| table_error(&target.table, &region, &e))?;
    let layout = store
        .key_layout()
        .await
        .map_err(|e| table_error(&target.table, &region, &e))?;
    Ok(Aws {
        kinesis: aws_sdk_kinesis::Client::new(&config),
        store,
        layout,
        region,
    })
}

/// Fails with exit status 2 when no credentials can be found, before any call: the SDK would
/// otherwise try every source (the instance metadata service last) and print its own
/// complaints about each.
pub async fn check_credentials(config: &aws_config::SdkConfig) -> Result<(), Failure> {
    use aws_sdk_dynamodb::config::ProvideCredentials;
    let none = |why: String| {
        Failure::usage(format!(
            "no credentials found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or \
             AWS_PROFILE, or run where a role provides them ({why})"
        ))
    };
    let Some(provider) = config.credentials_provider() else {
        return Err(none("no credentials provider configured".to_owned()));
    };
    provider
        .provide_credentials()
        .await
        .map(drop)
        .map_err(|e| none(e.to_string()))
}

/// The failure of checking the lease table: missing or not a lease table (bad input, exit
/// status 2), or the call failed (1).
pub fn table_error(table: &str, region: &str, error: &LeaseError) -> Failure {
    match error {
        LeaseError::TableNotFound { .. } => Failure::usage(format!(
            "lease table `{table}` does not exist in region {region}; check --table / \
             --application (this tool never creates a table)"
        )),
        LeaseError::Invalid { message, .. } => Failure::usage(format!(
            "table `{table}` is not a lease table of kinesis-dataflow: {message}"
        )),
        other => Failure::failed(format!("checking lease table `{table}`: {other}")),
    }
}

impl Aws {
    /// Every shard of `stream` (ListShards, all pages).
    pub async fn shards(&self, stream: &str) -> Result<Vec<Shard>, Failure> {
        let mut shards = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let request = match &token {
                Some(token) => self.kinesis.list_shards().next_token(token),
                None => self.kinesis.list_shards().stream_name(stream),
            };
            let page = request.send().await.map_err(|err| {
                if err.code() == Some("ResourceNotFoundException") {
                    Failure::usage(format!(
                        "stream `{stream}` does not exist in region {}; check --stream",
                        self.region
                    ))
                } else {
                    Failure::failed(format!(
                        "ListShards of stream `{stream}` failed: {}",
                        DisplayErrorContext(&err)
                    ))
                }
            })?;
            for shard in page.shards() {
                let range = shard.sequence_number_range();
                shards.push(Shard {
                    id: shard.shard_id().to_owned(),
                    parents: shard
                        .parent_shard_id()
                        .into_iter()
                        .chain(shard.adjacent_parent_shard_id())
                        .map(str::to_owned)
                        .collect(),
                    starting_sequence_number: range
                        .map(|r| r.starting_sequence_number().to_owned())
                        .unwrap_or_default(),
                    ending_sequence_number: range
                        .and_then(|r| r.ending_sequence_number())
                        .map(str::to_owned),
                });
            }
            match page.next_token() {
                Some(next) if !next.is_empty() => token = Some(next.to_owned()),
                _ => break,
            }
        }
        shards.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(shards)
    }

    /// Every row of `stream` in the lease table, with the time of its last write.
    pub async fn rows(&self, stream: &str) -> Result<Vec<LeaseRow>, Failure> {
        self.store.list_with_write_times(stream).await.map_err(|e| {
            Failure::failed(format!(
                "reading lease table `{}` failed: {e}",
                self.store.table()
            ))
        })
    }
}

/// The prefix of worker rows (`worker:<owner>`); the row `worker:` alone is the roster row.
pub const WORKER_PREFIX: &str = "worker:";

/// The owner a worker row stands for; `None` for shard rows and the roster row.
pub fn worker_owner(id: &str) -> Option<&str> {
    id.strip_prefix(WORKER_PREFIX).filter(|o| !o.is_empty())
}

/// True for a worker row or the roster row.
pub fn is_worker_or_roster(id: &str) -> bool {
    id.starts_with(WORKER_PREFIX)
}
