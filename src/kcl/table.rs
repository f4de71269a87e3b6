//! A KCL lease table in DynamoDB: read whole, written row by row, created with the KCL's key.

use std::collections::HashMap;

use aws_sdk_dynamodb::Client;
use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::AttributeValue;

use crate::error::{KclError, LeaseError, Operation};
use crate::lease::{DynamoLeaseStore, KeyLayout};

use super::row::{self, KclItem, KclLease, KclStreamId, LEASE_KEY};

/// A KCL application's lease table.
///
/// Its key is the KCL's (a string partition key `leaseKey`, no sort key), the same as the
/// library's own lease table, so the table-level calls are [`DynamoLeaseStore`]'s. The IAM
/// actions it needs on the table: `dynamodb:DescribeTable`, `dynamodb:Scan`, and for an
/// export `dynamodb:PutItem` (and `dynamodb:CreateTable` to create it).
#[derive(Debug, Clone)]
pub struct KclTable {
    store: DynamoLeaseStore,
}

/// Everything a KCL table holds, read.
#[derive(Debug, Clone, Default)]
pub struct KclContents {
    /// Its leases, of every stream it serves.
    pub leases: Vec<KclLease>,
    /// How many rows of other kinds (KCL 3.5 coordinator and worker rows) were skipped.
    pub other_rows: usize,
}

impl KclContents {
    /// The leases of `stream`, and in multi-stream mode the stream's identifier. In a
    /// single-stream table every lease counts (the table names no stream: the plan then
    /// checks that its shard ids are the stream's). Where a multi-stream table holds the
    /// stream under several creation times (it was deleted and created again), the newest
    /// counts.
    ///
    /// # Errors
    ///
    /// [`KclError::NoRows`] when the table holds no lease of the stream.
    pub fn of_stream(
        &self,
        table: &str,
        stream: &str,
    ) -> Result<(Vec<KclLease>, Option<KclStreamId>), KclError> {
        let no_rows = |detail: String| KclError::NoRows {
            table: table.to_owned(),
            stream: stream.to_owned(),
            detail,
        };
        if self.leases.is_empty() {
            return Err(no_rows(format!(
                "it holds no lease at all ({} other rows)",
                self.other_rows
            )));
        }
        let ids: Vec<&KclStreamId> = self
            .leases
            .iter()
            .filter_map(|l| l.stream.as_ref())
            .collect();
        if ids.is_empty() {
            return Ok((self.leases.clone(), None));
        }
        let Some(newest) = ids
            .iter()
            .filter(|id| id.stream == stream)
            .max_by_key(|id| id.creation_epoch)
        else {
            let mut streams: Vec<String> = ids.iter().map(|id| id.stream.clone()).collect();
            streams.sort();
            streams.dedup();
            return Err(no_rows(format!(
                "it is a multi-stream table of the streams {}",
                streams.join(", ")
            )));
        };
        let newest = (*newest).clone();
        let leases = self
            .leases
            .iter()
            .filter(|l| l.stream.as_ref() == Some(&newest))
            .cloned()
            .collect();
        Ok((leases, Some(newest)))
    }
}

impl KclTable {
    /// The KCL table `table`, reached through `client`.
    ///
    /// # Errors
    ///
    /// [`KclError::Lease`] when `table` is no valid DynamoDB table name.
    pub fn new(client: Client, table: impl Into<String>) -> Result<Self, KclError> {
        Ok(Self {
            store: DynamoLeaseStore::new(client, table)?,
        })
    }

    /// The table name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.store.table()
    }

    /// Whether the table exists (DescribeTable).
    ///
    /// # Errors
    ///
    /// [`KclError::NotKclTable`] when it exists with another key; the call's error.
    pub async fn exists(&self) -> Result<bool, KclError> {
        match self.store.check_table().await {
            Ok(()) => match self.store.key_layout().await? {
                KeyLayout::SingleKey => Ok(true),
                _ => Err(KclError::NotKclTable {
                    table: self.name().to_owned(),
                    why: "it is keyed by `streamName` and `shardId`, as the kinesis-dataflow \
                          lease table is, where the KCL's is keyed by `leaseKey` alone: name \
                          the KCL application's table with --kcl-table"
                        .to_owned(),
                }),
            },
            Err(LeaseError::TableNotFound { .. }) => Ok(false),
            Err(LeaseError::Invalid { message, .. }) => Err(KclError::NotKclTable {
                table: self.name().to_owned(),
                why: message,
            }),
            Err(other) => Err(other.into()),
        }
    }

    /// Creates the table with the KCL's key and on-demand billing, as the KCL does, and
    /// waits until it is active. KCL 3.x adds its owner index itself when it starts.
    ///
    /// # Errors
    ///
    /// The calls' errors.
    pub async fn create(&self) -> Result<(), KclError> {
        Ok(self.store.prepare_as(KeyLayout::SingleKey).await?)
    }

    /// Reads every row (a consistent Scan of all pages).
    ///
    /// # Errors
    ///
    /// [`KclError::MalformedRow`] for a lease row the KCL could not have written;
    /// [`KclError::NotKclTable`] when the rows are not KCL leases (for example the library's
    /// own lease table); the call's error.
    pub async fn read(&self) -> Result<KclContents, KclError> {
        let mut contents = KclContents::default();
        let mut foreign: Vec<String> = Vec::new();
        let mut start: Option<HashMap<String, AttributeValue>> = None;
        loop {
            let page = self
                .store
                .client()
                .scan()
                .table_name(self.name())
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|err| self.store.error(Operation::Scan, err))?;
            for item in page.items() {
                self.sort_item(item, &mut contents, &mut foreign)?;
            }
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        if let Some(first) = foreign.first() {
            return Err(self.foreign(first, foreign.len(), contents.leases.is_empty()));
        }
        contents
            .leases
            .sort_by(|a, b| a.lease_key.cmp(&b.lease_key));
        Ok(contents)
    }

    fn sort_item(
        &self,
        item: &HashMap<String, AttributeValue>,
        contents: &mut KclContents,
        foreign: &mut Vec<String>,
    ) -> Result<(), KclError> {
        if !row::is_other_entity(item) && !row::has_kcl_attributes(item) {
            foreign.push(match item.get(LEASE_KEY) {
                Some(AttributeValue::S(key)) => key.clone(),
                _ => String::new(),
            });
            return Ok(());
        }
        match row::parse_item(self.name(), item)? {
            KclItem::Other { .. } => contents.other_rows += 1,
            KclItem::Lease(lease) => contents.leases.push(*lease),
        }
        Ok(())
    }

    /// The error for rows without the attributes every KCL lease row has.
    fn foreign(&self, first: &str, count: usize, no_lease: bool) -> KclError {
        if no_lease {
            let ours = if first.contains('#') {
                " (a key `<stream>#<shard>` is the kinesis-dataflow lease table's: name the \
                 KCL application's table with --kcl-table)"
            } else {
                ""
            };
            return KclError::NotKclTable {
                table: self.name().to_owned(),
                why: format!(
                    "its {count} rows (the first: `{first}`) carry neither \
                     `checkpointSubSequenceNumber` nor `ownerSwitchesSinceCheckpoint`, which \
                     every KCL version writes{ours}"
                ),
            };
        }
        KclError::MalformedRow {
            table: self.name().to_owned(),
            row: first.to_owned(),
            attribute: "checkpointSubSequenceNumber".to_owned(),
            problem: "is missing, as is `ownerSwitchesSinceCheckpoint`: every KCL lease row \
                      holds both"
                .to_owned(),
        }
    }

    /// Writes `lease` as the KCL writes it, on condition that the row is still as read: its
    /// counter `expected`, or no row at all.
    ///
    /// # Errors
    ///
    /// [`KclError::RowChanged`] when the row changed since it was read; the call's error.
    pub(crate) async fn put(
        &self,
        lease: &KclLease,
        expected: Option<u64>,
    ) -> Result<(), KclError> {
        let request = self
            .store
            .client()
            .put_item()
            .table_name(self.name())
            .set_item(Some(row::to_item(lease)));
        let request = match expected {
            Some(counter) => request
                .condition_expression("#counter = :counter")
                .expression_attribute_names("#counter", "leaseCounter")
                .expression_attribute_values(":counter", AttributeValue::N(counter.to_string())),
            None => request
                .condition_expression("attribute_not_exists(#key)")
                .expression_attribute_names("#key", LEASE_KEY),
        };
        match request.send().await {
            Ok(_) => Ok(()),
            Err(err) if err.code() == Some("ConditionalCheckFailedException") => {
                Err(KclError::RowChanged {
                    table: self.name().to_owned(),
                    row: lease.lease_key.clone(),
                })
            }
            Err(err) => Err(self.store.error(Operation::PutItem, err).into()),
        }
    }
}
