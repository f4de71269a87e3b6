//! The DynamoDB lease table.
//!
//! One table serves several streams. Each row is one shard of one stream:
//!
//! | attribute | type | what it holds |
//! |---|---|---|
//! | `leaseKey` | S, partition key | `<stream>#<shard>` |
//! | `streamName` | S | the stream name |
//! | `shardId` | S | the shard id |
//! | `leaseOwner` | S | the holder; absent while nobody holds the lease |
//! | `leaseCounter` | N | bumped by every write |
//! | `checkpoint` | S | a sequence number, `SHARD_END`, where a reader began (`TRIM_HORIZON`, `AT_TIMESTAMP:<ms>`, ...), or where a shard nobody has read yet starts (`INITIAL:<start>`); see [`Checkpoint::encode`]; absent when none |
//! | `parentShardIds` | L of S | the shard's parents; absent when none |
//! | `lastWrittenAt` | N | wall-clock milliseconds of the last write (informational only) |

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::config::http::HttpResponse;
use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType, ReturnValue,
    ScalarAttributeType, TableDescription, TableStatus,
};

use super::{Lease, LeaseError, LeaseFuture, LeaseStore};
use crate::error::{ErrorSource, Operation};
use crate::position::Checkpoint;

/// The partition key: `<stream>#<shard>`.
const KEY: &str = "leaseKey";
/// The stream name.
const STREAM: &str = "streamName";
/// The shard id.
const SHARD: &str = "shardId";
/// The holder, absent while the lease is free.
const OWNER: &str = "leaseOwner";
/// The fencing token, bumped by every write.
const COUNTER: &str = "leaseCounter";
/// A sequence number or [`SHARD_END`].
const CHECKPOINT: &str = "checkpoint";
/// The parent shard ids.
const PARENTS: &str = "parentShardIds";
/// Wall-clock milliseconds of the last write; informational only.
const WRITTEN: &str = "lastWrittenAt";
/// The shard's starting sequence number (tells the generations of a stream name apart).
const STARTING_SEQUENCE: &str = "startingSequenceNumber";
/// How a [`Checkpoint::ShardEnd`] is stored.
const SHARD_END: &str = "SHARD_END";

/// The prefix of [`DynamoLeaseStore::default_table_name`].
const DEFAULT_TABLE_PREFIX: &str = "kinesis-dataflow";
/// How long [`LeaseStore::prepare`] waits for a table to become ACTIVE.
const TABLE_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// The first pause between two DescribeTable polls; it doubles up to [`TABLE_POLL_MAX`].
const TABLE_POLL_FIRST: Duration = Duration::from_millis(20);
/// The longest pause between two DescribeTable polls.
const TABLE_POLL_MAX: Duration = Duration::from_secs(1);
/// The owner named in [`LeaseError::Lost`] when the caller's lease had no owner at all.
const NO_OWNER: &str = "(no owner)";

/// The lease table in DynamoDB (AWS itself, DynamoDB Local, or an emulator).
///
/// Every write is a conditional `PutItem` / `UpdateItem` / `DeleteItem` on the owner and
/// counter the caller last saw, so a stale view fails with [`LeaseError::Lost`].
/// [`prepare`](LeaseStore::prepare) creates the table (on-demand billing, string partition key
/// `leaseKey`) when it is missing.
///
/// The IAM actions it needs on the table: `dynamodb:DescribeTable`, `dynamodb:CreateTable`
/// (unless the table already exists), `dynamodb:Scan`, `dynamodb:PutItem`,
/// `dynamodb:UpdateItem` and `dynamodb:DeleteItem`.
///
/// ```no_run
/// # async fn demo() -> Result<(), kinesis_dataflow::lease::LeaseError> {
/// use kinesis_dataflow::DynamoLeaseStore;
/// use kinesis_dataflow::lease::{Lease, LeaseStore};
///
/// let config = aws_config::load_defaults(aws_config::BehaviorVersion::latest()).await;
/// let table = DynamoLeaseStore::default_table_name("billing");
/// let store = DynamoLeaseStore::from_conf(&config, table)?;
/// store.prepare().await?;
/// store.create(&Lease::new("events", "shardId-000000000000", vec![])).await?;
/// for lease in store.list("events").await? {
///     println!("{} held by {:?}", lease.shard_id, lease.owner);
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DynamoLeaseStore {
    client: Client,
    table: Arc<str>,
    scan_page_size: Option<i32>,
}

impl fmt::Debug for DynamoLeaseStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The SDK client's configuration is long and holds the credentials provider.
        f.debug_struct("DynamoLeaseStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl DynamoLeaseStore {
    /// A store on table `table` through a ready SDK client.
    ///
    /// # Errors
    ///
    /// [`LeaseError::InvalidConfig`] (setting `lease_table`) when `table` is not a valid
    /// DynamoDB table name: 3 to 255 characters of `a-z`, `A-Z`, `0-9`, `_`, `-` and `.`.
    ///
    /// ```no_run
    /// # fn demo(client: aws_sdk_dynamodb::Client) -> Result<(), kinesis_dataflow::lease::LeaseError> {
    /// use kinesis_dataflow::DynamoLeaseStore;
    ///
    /// let store = DynamoLeaseStore::new(client.clone(), "my-app-leases")?;
    /// assert_eq!(store.table(), "my-app-leases");
    /// assert!(DynamoLeaseStore::new(client, "no spaces").is_err());
    /// # Ok(()) }
    /// ```
    pub fn new(client: Client, table: impl Into<String>) -> Result<Self, LeaseError> {
        let table = table.into();
        validate_table_name(&table)?;
        Ok(Self {
            client,
            table: table.into(),
            scan_page_size: None,
        })
    }

    /// A store on table `table` with a client built from a shared SDK configuration (region,
    /// credentials, endpoint overrides such as `AWS_ENDPOINT_URL_DYNAMODB`).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn from_conf(
        conf: &aws_config::SdkConfig,
        table: impl Into<String>,
    ) -> Result<Self, LeaseError> {
        Self::new(Client::new(conf), table)
    }

    /// The table name used when none is configured: `kinesis-dataflow-<application>`, with
    /// every character DynamoDB does not allow in a table name replaced by `-`, cut to 255
    /// characters.
    ///
    /// ```
    /// use kinesis_dataflow::DynamoLeaseStore;
    ///
    /// assert_eq!(DynamoLeaseStore::default_table_name("billing"), "kinesis-dataflow-billing");
    /// assert_eq!(DynamoLeaseStore::default_table_name("my app/v2"), "kinesis-dataflow-my-app-v2");
    /// assert_eq!(DynamoLeaseStore::default_table_name(""), "kinesis-dataflow");
    /// ```
    #[must_use]
    pub fn default_table_name(application: &str) -> String {
        let mut name = DEFAULT_TABLE_PREFIX.to_owned();
        if !application.is_empty() {
            name.push('-');
            name.extend(
                application
                    .chars()
                    .map(|c| if is_table_name_char(c) { c } else { '-' }),
            );
        }
        // Every character is ASCII now, so any byte index is a character boundary.
        name.truncate(255);
        name
    }

    /// The table name.
    #[must_use]
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The SDK client underneath.
    #[must_use]
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Reads [`list`](LeaseStore::list)'s Scan in pages of at most `items` rows (the Scan
    /// `Limit`) instead of the service's pages of up to 1 MB. Mostly a test knob for the
    /// pagination; `0` restores the default.
    #[must_use]
    pub fn with_scan_page_size(mut self, items: u32) -> Self {
        self.scan_page_size = match items {
            0 => None,
            n => Some(i32::try_from(n).unwrap_or(i32::MAX)),
        };
        self
    }

    // -----------------------------------------------------------------------------------------
    // prepare

    async fn do_prepare(&self) -> Result<(), LeaseError> {
        let started = tokio::time::Instant::now();
        let mut pause = TABLE_POLL_FIRST;
        let mut created = false;
        loop {
            let status = self.describe_table().await?;
            match &status {
                Some(TableStatus::Active) => return Ok(()),
                // Missing: create it once, then wait for it (it may take a moment to show up
                // in DescribeTable, or another instance may be creating it too).
                None if !created => {
                    self.create_table().await?;
                    created = true;
                    continue;
                }
                _ => {}
            }
            if started.elapsed() >= TABLE_READY_TIMEOUT {
                let status = status.as_ref().map_or("missing", TableStatus::as_str);
                return Err(LeaseError::Unavailable {
                    table: self.table.to_string(),
                    operation: Operation::DescribeTable,
                    message: format!(
                        "the table is not ACTIVE after {} s (status: {status})",
                        TABLE_READY_TIMEOUT.as_secs()
                    ),
                    source: None,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(TABLE_POLL_MAX);
        }
    }

    /// The table's status, `None` when it does not exist. Refuses a table whose key is not
    /// the lease table's.
    async fn describe_table(&self) -> Result<Option<TableStatus>, LeaseError> {
        let call = Operation::DescribeTable;
        match self
            .client
            .describe_table()
            .table_name(&*self.table)
            .send()
            .await
        {
            Ok(out) => {
                let Some(table) = out.table() else {
                    return Err(self.invalid(call, "the answer holds no table description"));
                };
                self.check_key_schema(table)?;
                Ok(Some(
                    table
                        .table_status()
                        .cloned()
                        .unwrap_or_else(|| TableStatus::from("(no status)")),
                ))
            }
            Err(err) if err.code() == Some("ResourceNotFoundException") => Ok(None),
            Err(err) => Err(self.error(call, err)),
        }
    }

    fn check_key_schema(&self, table: &TableDescription) -> Result<(), LeaseError> {
        let keys = table.key_schema();
        let hash_key_is_ours = matches!(
            keys,
            [key] if key.attribute_name() == KEY && key.key_type() == &KeyType::Hash
        );
        let key_is_string = table.attribute_definitions().iter().any(|def| {
            def.attribute_name() == KEY && def.attribute_type() == &ScalarAttributeType::S
        });
        // An answer without key details (a minimal emulator) is given the benefit of the doubt.
        if keys.is_empty() || (hash_key_is_ours && key_is_string) {
            return Ok(());
        }
        let found: Vec<String> = keys
            .iter()
            .map(|k| format!("{} ({})", k.attribute_name(), k.key_type().as_str()))
            .collect();
        Err(self.invalid(
            Operation::DescribeTable,
            &format!(
                "the table exists with key [{}], but a lease table needs a string partition key \
                 `{KEY}` and no sort key; name another table",
                found.join(", ")
            ),
        ))
    }

    async fn create_table(&self) -> Result<(), LeaseError> {
        let call = Operation::CreateTable;
        let definition = AttributeDefinition::builder()
            .attribute_name(KEY)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(|err| self.invalid(call, &err.to_string()))?;
        let key = KeySchemaElement::builder()
            .attribute_name(KEY)
            .key_type(KeyType::Hash)
            .build()
            .map_err(|err| self.invalid(call, &err.to_string()))?;
        let created = self
            .client
            .create_table()
            .table_name(&*self.table)
            .attribute_definitions(definition)
            .key_schema(key)
            .billing_mode(BillingMode::PayPerRequest)
            .send()
            .await;
        match created {
            Ok(_) => {
                tracing::info!(table = %self.table, "created the lease table");
                Ok(())
            }
            // Another instance created it (or is creating it) first.
            Err(err) if err.code() == Some("ResourceInUseException") => Ok(()),
            Err(err) => Err(self.error(call, err)),
        }
    }

    // -----------------------------------------------------------------------------------------
    // reads and writes

    async fn do_list(&self, stream: &str) -> Result<Vec<Lease>, LeaseError> {
        let call = Operation::Scan;
        let mut leases = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(&*self.table)
                .filter_expression("#stream = :stream")
                .expression_attribute_names("#stream", STREAM)
                .expression_attribute_values(":stream", AttributeValue::S(stream.to_owned()))
                .consistent_read(true)
                .set_limit(self.scan_page_size)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|err| self.error(call, err))?;
            for item in page.items() {
                leases.push(parse_row(&self.table, call, item)?);
            }
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        leases.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        Ok(leases)
    }

    async fn do_create(&self, lease: &Lease) -> Result<bool, LeaseError> {
        let call = Operation::PutItem;
        let put = self
            .client
            .put_item()
            .table_name(&*self.table)
            .set_item(Some(to_item(lease)))
            .condition_expression("attribute_not_exists(#key)")
            .expression_attribute_names("#key", KEY)
            .send()
            .await;
        match put {
            Ok(_) => Ok(true),
            Err(err) if is_condition_failure(&err) => Ok(false),
            Err(err) => Err(self.error(call, err)),
        }
    }

    async fn do_take(&self, lease: &Lease, owner: &str) -> Result<Lease, LeaseError> {
        let mut values = self.counter_values(lease, owner)?;
        values.push((":owner", AttributeValue::S(owner.to_owned())));
        let condition = match &lease.owner {
            None => "#counter = :expected AND attribute_not_exists(#owner)",
            Some(old) => {
                values.push((":old_owner", AttributeValue::S(old.clone())));
                "#counter = :expected AND #owner = :old_owner"
            }
        };
        self.update(
            lease,
            owner,
            "SET #owner = :owner, #counter = :counter, #written = :now",
            condition,
            &[
                ("#owner", OWNER),
                ("#counter", COUNTER),
                ("#written", WRITTEN),
            ],
            values,
        )
        .await
    }

    async fn do_delete(&self, lease: &Lease) -> Result<(), LeaseError> {
        let call = Operation::DeleteItem;
        let mut delete = self
            .client
            .delete_item()
            .table_name(&*self.table)
            .key(KEY, key_value(lease))
            .expression_attribute_names("#counter", COUNTER)
            .expression_attribute_names("#owner", OWNER)
            .expression_attribute_values(":expected", number(lease.counter));
        delete = match &lease.owner {
            None => {
                delete.condition_expression("#counter = :expected AND attribute_not_exists(#owner)")
            }
            Some(owner) => delete
                .condition_expression("#counter = :expected AND #owner = :owner")
                .expression_attribute_values(":owner", AttributeValue::S(owner.clone())),
        };
        match delete.send().await {
            Ok(_) => Ok(()),
            Err(err) if is_condition_failure(&err) => Err(LeaseError::Lost {
                stream: lease.stream.clone(),
                shard: lease.shard_id.clone(),
                owner: lease.owner.clone().unwrap_or_else(|| NO_OWNER.to_owned()),
            }),
            Err(err) => Err(self.error(call, err)),
        }
    }

    /// A write by the holder: conditional on `lease.owner` (which must be set) and the counter.
    async fn update_held(
        &self,
        lease: &Lease,
        expression: &str,
        extra_name: Option<(&'static str, &'static str)>,
        extra_value: Option<(&'static str, AttributeValue)>,
    ) -> Result<Lease, LeaseError> {
        let Some(me) = lease.owner.as_deref() else {
            return Err(LeaseError::Lost {
                stream: lease.stream.clone(),
                shard: lease.shard_id.clone(),
                owner: NO_OWNER.to_owned(),
            });
        };
        let mut values = self.counter_values(lease, me)?;
        values.push((":me", AttributeValue::S(me.to_owned())));
        values.extend(extra_value);
        let mut names = vec![
            ("#owner", OWNER),
            ("#counter", COUNTER),
            ("#written", WRITTEN),
        ];
        names.extend(extra_name);
        self.update(
            lease,
            me,
            expression,
            "#owner = :me AND #counter = :expected",
            &names,
            values,
        )
        .await
    }

    /// `:expected` (the caller's counter), `:counter` (the next one) and `:now`.
    fn counter_values(
        &self,
        lease: &Lease,
        writer: &str,
    ) -> Result<Vec<(&'static str, AttributeValue)>, LeaseError> {
        let Some(next) = lease.counter.checked_add(1) else {
            return Err(self.invalid(
                Operation::UpdateItem,
                &format!(
                    "the counter of shard `{}` of stream `{}` cannot grow past u64::MAX (writer \
                     `{writer}`)",
                    lease.shard_id, lease.stream
                ),
            ));
        };
        Ok(vec![
            (":expected", number(lease.counter)),
            (":counter", number(next)),
            (":now", number(now_ms())),
        ])
    }

    /// One conditional UpdateItem returning the row as written; a failed condition is
    /// [`LeaseError::Lost`] naming `writer`.
    async fn update(
        &self,
        lease: &Lease,
        writer: &str,
        expression: &str,
        condition: &str,
        names: &[(&'static str, &'static str)],
        values: Vec<(&'static str, AttributeValue)>,
    ) -> Result<Lease, LeaseError> {
        let call = Operation::UpdateItem;
        let names = names
            .iter()
            .map(|(alias, name)| ((*alias).to_owned(), (*name).to_owned()))
            .collect();
        let values = values
            .into_iter()
            .map(|(alias, value)| (alias.to_owned(), value))
            .collect();
        let updated = self
            .client
            .update_item()
            .table_name(&*self.table)
            .key(KEY, key_value(lease))
            .update_expression(expression)
            .condition_expression(condition)
            .set_expression_attribute_names(Some(names))
            .set_expression_attribute_values(Some(values))
            .return_values(ReturnValue::AllNew)
            .send()
            .await;
        match updated {
            Ok(out) => match out.attributes() {
                Some(row) => parse_row(&self.table, call, row),
                None => Err(self.invalid(call, "the answer holds no attributes (ALL_NEW)")),
            },
            Err(err) if is_condition_failure(&err) => Err(LeaseError::Lost {
                stream: lease.stream.clone(),
                shard: lease.shard_id.clone(),
                owner: writer.to_owned(),
            }),
            Err(err) => Err(self.error(call, err)),
        }
    }

    // -----------------------------------------------------------------------------------------
    // errors

    fn invalid(&self, call: Operation, message: &str) -> LeaseError {
        LeaseError::Invalid {
            table: self.table.to_string(),
            operation: call,
            message: message.to_owned(),
            source: None,
        }
    }

    fn error<E>(&self, call: Operation, err: SdkError<E, HttpResponse>) -> LeaseError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let failure = match &err {
            SdkError::ServiceError(service) => Failure::Service {
                code: service.err().code().map(str::to_owned),
                status: service.raw().status().as_u16(),
                message: service
                    .err()
                    .message()
                    .filter(|m| !m.is_empty())
                    .map_or_else(|| crate::error::brief(&err), str::to_owned),
            },
            SdkError::ConstructionFailure(_) => Failure::Request(crate::error::brief(&err)),
            _ => Failure::Transport(crate::error::brief(&err)),
        };
        let source: ErrorSource = Arc::new(err);
        classify(&self.table, call, failure, Some(source))
    }
}

impl LeaseStore for DynamoLeaseStore {
    fn prepare(&self) -> LeaseFuture<'_, ()> {
        Box::pin(self.do_prepare())
    }

    fn list<'a>(&'a self, stream: &'a str) -> LeaseFuture<'a, Vec<Lease>> {
        Box::pin(self.do_list(stream))
    }

    fn create<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, bool> {
        Box::pin(self.do_create(lease))
    }

    fn take<'a>(&'a self, lease: &'a Lease, owner: &'a str) -> LeaseFuture<'a, Lease> {
        Box::pin(self.do_take(lease, owner))
    }

    fn renew<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        Box::pin(self.update_held(
            lease,
            "SET #counter = :counter, #written = :now",
            None,
            None,
        ))
    }

    fn checkpoint<'a>(
        &'a self,
        lease: &'a Lease,
        checkpoint: &'a Checkpoint,
    ) -> LeaseFuture<'a, Lease> {
        Box::pin(self.update_held(
            lease,
            "SET #counter = :counter, #written = :now, #checkpoint = :checkpoint",
            Some(("#checkpoint", CHECKPOINT)),
            Some((":checkpoint", checkpoint_value(checkpoint))),
        ))
    }

    fn release<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, Lease> {
        Box::pin(self.update_held(
            lease,
            "SET #counter = :counter, #written = :now REMOVE #owner",
            None,
            None,
        ))
    }

    fn delete<'a>(&'a self, lease: &'a Lease) -> LeaseFuture<'a, ()> {
        Box::pin(self.do_delete(lease))
    }
}

// ---------------------------------------------------------------------------------------------
// calls and errors

/// The DynamoDB calls the store makes.
/// How a call failed, before it is mapped onto [`LeaseError`].
#[derive(Debug)]
enum Failure {
    /// The service answered with an error.
    Service {
        code: Option<String>,
        status: u16,
        message: String,
    },
    /// The request could not be built (nothing was sent).
    Request(String),
    /// Nothing usable came back: a dispatch failure, a timeout, an unreadable answer.
    Transport(String),
}

fn is_condition_failure<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> bool {
    err.code() == Some("ConditionalCheckFailedException")
}

/// What a DynamoDB error code means for the lease store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    NoTable,
    Denied,
    Transient,
    Refused,
}

/// The meaning of an error `code` answered with HTTP `status`.
fn kind(code: &str, status: u16) -> Kind {
    match code {
        "ResourceNotFoundException" => Kind::NoTable,
        "AccessDeniedException"
        | "AccessDenied"
        | "UnrecognizedClientException"
        | "InvalidClientTokenId"
        | "InvalidSignatureException"
        | "IncompleteSignatureException"
        | "MissingAuthenticationTokenException"
        | "ExpiredTokenException"
        | "ExpiredToken" => Kind::Denied,
        "ProvisionedThroughputExceededException"
        | "ThrottlingException"
        | "Throttling"
        | "RequestLimitExceeded"
        | "LimitExceededException"
        | "InternalServerError"
        | "InternalFailure"
        | "ServiceUnavailable"
        | "ServiceUnavailableException"
        | "TransactionConflictException"
        | "ResourceInUseException"
        | "RequestTimeout"
        | "RequestTimeoutException" => Kind::Transient,
        _ if status >= 500 => Kind::Transient,
        // ValidationException (a bad table name, a reserved word in an expression), a
        // SerializationException, or anything else the service refused for good.
        _ => Kind::Refused,
    }
}

/// Maps a failed call onto the store's error.
fn classify(
    table: &str,
    operation: Operation,
    failure: Failure,
    source: Option<ErrorSource>,
) -> LeaseError {
    let table = table.to_owned();
    let (kind, message) = match failure {
        Failure::Service {
            code,
            status,
            message,
        } => {
            let code = code.unwrap_or_default();
            let described = if code.is_empty() {
                format!("HTTP {status}: {message}")
            } else {
                format!("{code}: {message}")
            };
            (kind(&code, status), described)
        }
        Failure::Request(message) => (Kind::Refused, message),
        Failure::Transport(message) => (Kind::Transient, message),
    };
    #[rustfmt::skip]
    let error = match kind {
        Kind::NoTable => LeaseError::TableNotFound { table, operation },
        Kind::Denied => LeaseError::AccessDenied { table, operation, message, source },
        Kind::Transient => LeaseError::Unavailable { table, operation, message, source },
        Kind::Refused => LeaseError::Invalid { table, operation, message, source },
    };
    error
}

// ---------------------------------------------------------------------------------------------
// rows

/// Whether DynamoDB allows `c` in a table name.
fn is_table_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// DynamoDB's rule for table names: 3 to 255 characters of `[a-zA-Z0-9_.-]`.
fn validate_table_name(table: &str) -> Result<(), LeaseError> {
    let refuse = |reason: String| LeaseError::InvalidConfig {
        setting: "lease_table",
        value: format!("{table:?}"),
        reason,
    };
    if let Some(bad) = table.chars().find(|c| !is_table_name_char(*c)) {
        return Err(refuse(format!(
            "a DynamoDB table name may only hold a-z, A-Z, 0-9, `_`, `-` and `.`, not {bad:?}"
        )));
    }
    let len = table.len();
    if !(3..=255).contains(&len) {
        return Err(refuse(format!(
            "a DynamoDB table name is 3 to 255 characters long, not {len}"
        )));
    }
    Ok(())
}

/// The partition key of one shard of one stream.
fn lease_key(stream: &str, shard: &str) -> String {
    format!("{stream}#{shard}")
}

/// The table key of `lease`'s row.
fn key_value(lease: &Lease) -> AttributeValue {
    AttributeValue::S(lease_key(&lease.stream, &lease.shard_id))
}

fn number(n: u64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

fn now_ms() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

fn checkpoint_value(checkpoint: &Checkpoint) -> AttributeValue {
    AttributeValue::S(checkpoint.encode())
}

/// The row `create` writes: the lease as given.
fn to_item(lease: &Lease) -> HashMap<String, AttributeValue> {
    let mut item = HashMap::from([
        (KEY.to_owned(), key_value(lease)),
        (STREAM.to_owned(), AttributeValue::S(lease.stream.clone())),
        (SHARD.to_owned(), AttributeValue::S(lease.shard_id.clone())),
        (COUNTER.to_owned(), number(lease.counter)),
        (WRITTEN.to_owned(), number(now_ms())),
    ]);
    if let Some(owner) = &lease.owner {
        item.insert(OWNER.to_owned(), AttributeValue::S(owner.clone()));
    }
    if let Some(checkpoint) = &lease.checkpoint {
        item.insert(CHECKPOINT.to_owned(), checkpoint_value(checkpoint));
    }
    if let Some(seq) = &lease.starting_sequence_number {
        item.insert(STARTING_SEQUENCE.to_owned(), AttributeValue::S(seq.clone()));
    }
    if !lease.parents.is_empty() {
        let parents = lease
            .parents
            .iter()
            .cloned()
            .map(AttributeValue::S)
            .collect();
        item.insert(PARENTS.to_owned(), AttributeValue::L(parents));
    }
    item
}

/// The DynamoDB type letter(s) of a value, for error messages.
fn type_name(value: &AttributeValue) -> &'static str {
    match value {
        AttributeValue::B(_) => "B",
        AttributeValue::Bool(_) => "BOOL",
        AttributeValue::Bs(_) => "BS",
        AttributeValue::L(_) => "L",
        AttributeValue::M(_) => "M",
        AttributeValue::N(_) => "N",
        AttributeValue::Ns(_) => "NS",
        AttributeValue::Null(_) => "NULL",
        AttributeValue::S(_) => "S",
        AttributeValue::Ss(_) => "SS",
        _ => "an unknown type",
    }
}

/// Reads one row back into a [`Lease`].
fn parse_row(
    table: &str,
    call: Operation,
    item: &HashMap<String, AttributeValue>,
) -> Result<Lease, LeaseError> {
    let row = Row::new(table, call, item);
    let stream = row.required(STREAM)?;
    let shard_id = row.required(SHARD)?;
    if item.contains_key(KEY) && row.key != lease_key(&stream, &shard_id) {
        return Err(row.bad(
            KEY,
            format!("does not match `{STREAM}` `{stream}` and `{SHARD}` `{shard_id}`"),
        ));
    }
    Ok(Lease {
        stream,
        shard_id,
        owner: row.string(OWNER)?,
        counter: row.counter()?,
        checkpoint: row.checkpoint()?,
        parents: row.parents()?,
        starting_sequence_number: row.string(STARTING_SEQUENCE)?,
    })
}

/// One row read back, with the errors that name it.
struct Row<'a> {
    table: &'a str,
    call: Operation,
    key: &'a str,
    item: &'a HashMap<String, AttributeValue>,
}

impl<'a> Row<'a> {
    fn new(table: &'a str, call: Operation, item: &'a HashMap<String, AttributeValue>) -> Self {
        let key = match item.get(KEY) {
            Some(AttributeValue::S(key)) => key.as_str(),
            _ => "(no leaseKey)",
        };
        Self {
            table,
            call,
            key,
            item,
        }
    }

    fn bad(&self, attribute: &str, what: String) -> LeaseError {
        LeaseError::Invalid {
            table: self.table.to_owned(),
            operation: self.call,
            message: format!("lease row `{}`: attribute `{attribute}` {what}", self.key),
            source: None,
        }
    }

    fn string(&self, attribute: &str) -> Result<Option<String>, LeaseError> {
        match self.item.get(attribute) {
            None => Ok(None),
            Some(AttributeValue::S(s)) => Ok(Some(s.clone())),
            Some(other) => Err(self.bad(
                attribute,
                format!("has type {}, expected S", type_name(other)),
            )),
        }
    }

    fn required(&self, attribute: &str) -> Result<String, LeaseError> {
        self.string(attribute)?
            .ok_or_else(|| self.bad(attribute, "is missing".to_owned()))
    }

    fn counter(&self) -> Result<u64, LeaseError> {
        match self.item.get(COUNTER) {
            Some(AttributeValue::N(n)) => n
                .parse::<u64>()
                .map_err(|_| self.bad(COUNTER, format!("is {n}, not a whole number >= 0"))),
            Some(other) => Err(self.bad(
                COUNTER,
                format!("has type {}, expected N", type_name(other)),
            )),
            None => Err(self.bad(COUNTER, "is missing".to_owned())),
        }
    }

    fn checkpoint(&self) -> Result<Option<Checkpoint>, LeaseError> {
        let Some(text) = self.string(CHECKPOINT)? else {
            return Ok(None);
        };
        Checkpoint::decode(&text).map(Some).ok_or_else(|| {
            self.bad(
                CHECKPOINT,
                format!("is {text:?}, not a sequence number, {SHARD_END} or a start position"),
            )
        })
    }

    fn parents(&self) -> Result<Vec<String>, LeaseError> {
        match self.item.get(PARENTS) {
            None => Ok(Vec::new()),
            Some(AttributeValue::L(list)) => list
                .iter()
                .map(|v| match v {
                    AttributeValue::S(s) => Ok(s.clone()),
                    other => Err(self.bad(
                        PARENTS,
                        format!("holds a value of type {}, expected S", type_name(other)),
                    )),
                })
                .collect(),
            Some(AttributeValue::Ss(set)) => Ok(set.clone()),
            Some(other) => Err(self.bad(
                PARENTS,
                format!("has type {}, expected L", type_name(other)),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(code: &str, status: u16) -> Failure {
        Failure::Service {
            code: Some(code.to_owned()),
            status,
            message: "the service said no".to_owned(),
        }
    }

    #[test]
    fn table_names_follow_dynamodb_rules() {
        for ok in ["abc", "a.b-c_D9", &"x".repeat(255)] {
            validate_table_name(ok).unwrap();
        }
        for (bad, hint) in [
            ("ab", "not 2"),
            ("a b c", "' '"),
            ("tablé", "'é'"),
            ("", "not 0"),
            (&"x".repeat(256), "not 256"),
        ] {
            let err = validate_table_name(bad).unwrap_err();
            let text = err.to_string();
            assert!(
                matches!(&err, LeaseError::InvalidConfig { setting: "lease_table", value, .. }
                    if *value == format!("{bad:?}")),
                "{err:?}"
            );
            assert!(text.contains(hint), "{text}");
        }
    }

    #[test]
    fn default_table_names_are_valid() {
        assert_eq!(
            DynamoLeaseStore::default_table_name("app"),
            "kinesis-dataflow-app"
        );
        assert_eq!(
            DynamoLeaseStore::default_table_name("é app#1"),
            "kinesis-dataflow---app-1"
        );
        let long = DynamoLeaseStore::default_table_name(&"ü".repeat(400));
        assert_eq!(long.len(), 255);
        for name in [long, DynamoLeaseStore::default_table_name("")] {
            validate_table_name(&name).unwrap();
        }
    }

    #[test]
    fn errors_are_classified() {
        let t = "leases";
        let cases = [
            (service("ResourceNotFoundException", 400), "TableNotFound"),
            (service("AccessDeniedException", 400), "AccessDenied"),
            (service("UnrecognizedClientException", 400), "AccessDenied"),
            (service("ExpiredTokenException", 400), "AccessDenied"),
            (service("ValidationException", 400), "Invalid"),
            (service("SerializationException", 400), "Invalid"),
            (
                service("ProvisionedThroughputExceededException", 400),
                "Unavailable",
            ),
            (service("ThrottlingException", 400), "Unavailable"),
            (service("RequestLimitExceeded", 400), "Unavailable"),
            (service("InternalServerError", 500), "Unavailable"),
            (service("SomethingNew", 503), "Unavailable"),
            (service("SomethingNew", 400), "Invalid"),
            (
                Failure::Transport("connection refused".into()),
                "Unavailable",
            ),
            (Failure::Request("bad input".into()), "Invalid"),
        ];
        for (failure, expected) in cases {
            let described = format!("{failure:?}");
            let err = classify(t, Operation::UpdateItem, failure, None);
            let kind = format!("{err:?}");
            assert!(kind.starts_with(expected), "{described} -> {kind}");
            let text = err.to_string();
            assert!(text.contains("`leases`"), "{text}");
            assert!(text.contains("UpdateItem"), "{text}");
        }
        let cause: ErrorSource = Arc::new(std::io::Error::other("the SDK's error"));
        let denied = classify(
            t,
            Operation::Scan,
            service("AccessDeniedException", 400),
            Some(cause),
        );
        assert!(
            matches!(&denied, LeaseError::AccessDenied { operation: Operation::Scan, message, .. }
                if message.contains("the service said no")),
            "{denied:?}"
        );
        assert!(denied.to_string().contains("dynamodb:Scan"), "{denied}");
        let source = std::error::Error::source(&denied).map(ToString::to_string);
        assert_eq!(
            source.as_deref(),
            Some("the SDK's error"),
            "the cause is kept"
        );
        let invalid = classify(
            t,
            Operation::CreateTable,
            service("ValidationException", 400),
            None,
        );
        let text = invalid.to_string();
        assert!(
            text.contains("CreateTable")
                && text.contains("ValidationException: the service said no"),
            "{text}"
        );
    }

    fn row(pairs: &[(&str, AttributeValue)]) -> HashMap<String, AttributeValue> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    #[test]
    fn rows_round_trip() {
        let mut lease = Lease::new("s", "shardId-1", vec!["shardId-0".into()]);
        lease.owner = Some("me".into());
        lease.counter = 7;
        for checkpoint in [
            None,
            Some(Checkpoint::ShardEnd),
            Some(Checkpoint::Sequence("123".into())),
        ] {
            lease.checkpoint = checkpoint;
            let item = to_item(&lease);
            assert_eq!(item[KEY], AttributeValue::S("s#shardId-1".into()));
            assert_eq!(parse_row("t", Operation::Scan, &item).unwrap(), lease);
        }
        let free = Lease::new("s", "shardId-1", vec![]);
        let item = to_item(&free);
        assert!(!item.contains_key(OWNER) && !item.contains_key(CHECKPOINT));
        assert!(!item.contains_key(PARENTS));
        assert_eq!(parse_row("t", Operation::Scan, &item).unwrap(), free);
    }

    #[test]
    fn bad_rows_name_the_key_and_attribute() {
        let base = [
            (KEY, AttributeValue::S("s#x".into())),
            (STREAM, AttributeValue::S("s".into())),
            (SHARD, AttributeValue::S("x".into())),
        ];
        let cases = [
            (vec![(COUNTER, AttributeValue::S("1".into()))], COUNTER),
            (vec![(COUNTER, AttributeValue::N("-1".into()))], COUNTER),
            (vec![], COUNTER),
            (
                vec![(COUNTER, number(1)), (OWNER, AttributeValue::Bool(true))],
                OWNER,
            ),
            (
                vec![
                    (COUNTER, number(1)),
                    (PARENTS, AttributeValue::L(vec![number(3)])),
                ],
                PARENTS,
            ),
        ];
        for (extra, attribute) in cases {
            let mut pairs = base.to_vec();
            pairs.extend(extra);
            let err = parse_row("t", Operation::Scan, &row(&pairs)).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains("`s#x`") && text.contains(&format!("`{attribute}`")),
                "{text}"
            );
            assert!(text.contains("Scan") && text.contains("`t`"), "{text}");
        }
        let mismatched = row(&[
            (KEY, AttributeValue::S("other#x".into())),
            (STREAM, AttributeValue::S("s".into())),
            (SHARD, AttributeValue::S("x".into())),
            (COUNTER, number(0)),
        ]);
        assert!(parse_row("t", Operation::Scan, &mismatched).is_err());
    }

    #[test]
    fn debug_shows_the_table_only() {
        let conf = aws_sdk_dynamodb::Config::builder()
            .behavior_version(aws_sdk_dynamodb::config::BehaviorVersion::latest())
            .build();
        let store = DynamoLeaseStore::new(Client::from_conf(conf), "leases")
            .unwrap()
            .with_scan_page_size(5);
        assert_eq!(
            format!("{store:?}"),
            r#"DynamoLeaseStore { table: "leases", .. }"#
        );
        assert_eq!(store.table(), "leases");
    }
}
