//! The DynamoDB lease table.
//!
//! One table serves several streams. Each row is one shard of one stream, keyed by stream
//! and shard ([`KeyLayout::ByStream`], so a stream's rows are read with one Query), or on
//! tables created before that layout by `leaseKey` alone ([`KeyLayout::SingleKey`], read with
//! a Scan of the whole table):
//!
//! | attribute | type | what it holds |
//! |---|---|---|
//! | `streamName` | S | the stream name; the partition key of a by-stream table |
//! | `shardId` | S | the shard id; the sort key of a by-stream table |
//! | `leaseKey` | S | `<stream>#<shard>`; the partition key of a single-key table, and only there |
//! | `leaseOwner` | S | the holder; absent while nobody holds the lease |
//! | `leaseCounter` | N | bumped by every write |
//! | `checkpoint` | S | a sequence number, `<sequence>:<sub-sequence>` (inside a KPL aggregate), `SHARD_END`, where a reader began (`TRIM_HORIZON`, `AT_TIMESTAMP:<ms>`, ...), or where a shard nobody has read yet starts (`INITIAL:<start>`); see [`Checkpoint::encode`]; absent when none |
//! | `parentShardIds` | L of S | the shard's parents; absent when none |
//! | `lastWrittenAt` | N | wall-clock milliseconds of the last write (informational only) |

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::types::ConsumedCapacity;

use super::{Lease, LeaseError, LeaseFuture, LeaseStore, unstorable};
use crate::position::Checkpoint;
pub use inspect::LeaseRow;
pub use layout::KeyLayout;
pub(crate) use row::type_name;
use row::{CHECKPOINT, checkpoint_value};
use table::{DEFAULT_TABLE_PREFIX, is_table_name_char, validate_table_name};

mod errors;
mod inspect;
mod layout;
mod row;
mod table;
mod writes;

/// The lease table in DynamoDB (AWS itself, DynamoDB Local, or an emulator).
///
/// Every write is a conditional `PutItem` / `UpdateItem` / `DeleteItem` on the owner and
/// counter the caller last saw, so a stale view fails with [`LeaseError::Lost`].
/// [`prepare`](LeaseStore::prepare) creates the table when it is missing: on-demand billing,
/// string partition key `streamName` and sort key `shardId` ([`KeyLayout::ByStream`]), so
/// [`list`](LeaseStore::list) reads one stream's rows with a consistent Query. A table created
/// before, keyed by `leaseKey` alone ([`KeyLayout::SingleKey`]), keeps working as it is: it is
/// listed with a consistent Scan of the whole table, in parallel segments once it is large.
/// The layout is read from the table's description on first use.
///
/// The IAM actions it needs on the table: `dynamodb:DescribeTable`, `dynamodb:CreateTable`
/// (unless the table already exists), `dynamodb:Query` (`dynamodb:Scan` on a single-key
/// table), `dynamodb:BatchGetItem`, `dynamodb:PutItem`, `dynamodb:UpdateItem` and
/// `dynamodb:DeleteItem`.
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
    /// The table's key layout, once read from its description.
    layout: Arc<OnceLock<KeyLayout>>,
    /// Read units the table reported for `list` and `get`, in thousandths.
    read_units: Arc<AtomicU64>,
    /// Rows the table read for `list` and `get`.
    rows_read: Arc<AtomicU64>,
    /// How many parallel segments the next Scan of a single-key table reads.
    scan_segments: Arc<std::sync::atomic::AtomicU32>,
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
            layout: Arc::new(OnceLock::new()),
            read_units: Arc::new(AtomicU64::new(0)),
            rows_read: Arc::new(AtomicU64::new(0)),
            scan_segments: Arc::new(std::sync::atomic::AtomicU32::new(1)),
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

    /// The table's key layout, read from its description (DescribeTable) the first time it is
    /// needed and kept.
    ///
    /// # Errors
    ///
    /// As [`check_table`](Self::check_table): [`LeaseError::TableNotFound`] when the table
    /// does not exist, [`LeaseError::Invalid`] when its key is neither layout's.
    pub async fn key_layout(&self) -> Result<KeyLayout, LeaseError> {
        if let Some(layout) = self.layout.get() {
            return Ok(*layout);
        }
        match self.describe_table().await? {
            Some((_, layout)) => Ok(layout),
            None => Err(LeaseError::TableNotFound {
                table: self.table.to_string(),
                operation: crate::error::Operation::DescribeTable,
            }),
        }
    }

    /// The read capacity units the table reported consuming for this store's
    /// [`list`](LeaseStore::list) and [`get`](LeaseStore::get) calls (and those of its
    /// clones) since it was built: what the listings and the watch cost. DynamoDB reports
    /// them when asked (`ReturnConsumedCapacity`), at no charge.
    #[must_use]
    pub fn consumed_read_units(&self) -> f64 {
        // Thousandths of a unit: exact for DynamoDB's half units.
        #[allow(clippy::cast_precision_loss)]
        let units = self.read_units.load(Ordering::Relaxed) as f64 / 1000.0;
        units
    }

    /// The rows the table read for this store's [`list`](LeaseStore::list) and
    /// [`get`](LeaseStore::get) calls (and those of its clones) since it was built: a Query
    /// reads the stream's rows, a Scan every row of the table, `BatchGetItem` the rows named.
    #[must_use]
    pub fn rows_read(&self) -> u64 {
        self.rows_read.load(Ordering::Relaxed)
    }

    /// Adds the read units the table reported, and the rows it read (`ScannedCount`).
    fn count_read(&self, consumed: Option<&ConsumedCapacity>, rows: i32) {
        if let Some(units) = consumed.and_then(ConsumedCapacity::capacity_units) {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let thousandths = (units * 1000.0).round().max(0.0) as u64;
            self.read_units.fetch_add(thousandths, Ordering::Relaxed);
        }
        self.rows_read
            .fetch_add(u64::try_from(rows).unwrap_or(0), Ordering::Relaxed);
    }

    /// Reads [`list`](LeaseStore::list)'s Query (or Scan) in pages of at most `items` rows
    /// (its `Limit`) instead of the service's pages of up to 1 MB. Mostly a test knob for the
    /// pagination; `0` restores the default.
    #[must_use]
    pub fn with_scan_page_size(mut self, items: u32) -> Self {
        self.scan_page_size = match items {
            0 => None,
            n => Some(i32::try_from(n).unwrap_or(i32::MAX)),
        };
        self
    }
}

impl LeaseStore for DynamoLeaseStore {
    fn prepare(&self) -> LeaseFuture<'_, ()> {
        Box::pin(async move {
            self.do_prepare(KeyLayout::ByStream).await?;
            if self.layout.get() == Some(&KeyLayout::SingleKey) {
                tracing::info!(
                    table = %self.table,
                    "the lease table is keyed by leaseKey alone (created before the by-stream \
                     layout): each listing scans every stream's rows; `kinesis-dataflow \
                     lease-table copy` moves a stopped application to a table keyed by stream"
                );
            }
            Ok(())
        })
    }

    fn list<'a>(&'a self, stream: &'a str) -> LeaseFuture<'a, Vec<Lease>> {
        Box::pin(self.do_list(stream))
    }

    fn list_operation(&self) -> crate::error::Operation {
        self.list_call()
    }

    fn get<'a>(&'a self, stream: &'a str, ids: &'a [String]) -> LeaseFuture<'a, Vec<Lease>> {
        Box::pin(self.do_get(stream, ids))
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
        Box::pin(async move {
            if let Some(why) = unstorable(lease, checkpoint) {
                return Err(self.invalid(crate::error::Operation::UpdateItem, &why));
            }
            self.update_held(
                lease,
                "SET #counter = :counter, #written = :now, #checkpoint = :checkpoint",
                Some(("#checkpoint", CHECKPOINT)),
                Some((":checkpoint", checkpoint_value(checkpoint))),
            )
            .await
        })
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

    fn replace<'a>(&'a self, old: &'a Lease, new: &'a Lease) -> LeaseFuture<'a, Lease> {
        Box::pin(self.do_replace(old, new))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
