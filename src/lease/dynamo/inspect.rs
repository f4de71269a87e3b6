//! Read-only calls for operators' tools (the `kinesis-dataflow` command): check that the lease
//! table is there without creating it, and read rows with the time of their last write.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, TableStatus};

use super::DynamoLeaseStore;
use super::row::{STREAM, WRITTEN, parse_row};
use crate::error::Operation;
use crate::lease::{Lease, LeaseError};

/// One row of the lease table as [`DynamoLeaseStore::list_with_write_times`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseRow {
    /// The row.
    pub lease: Lease,
    /// The wall-clock milliseconds since the Unix epoch of its last write (`lastWrittenAt`), by
    /// the writer's clock; `None` when the row does not hold it. Informational: the library
    /// never judges liveness by it (hosts' clocks differ), but it tells a person how long ago
    /// a row was written.
    pub last_written_ms: Option<u64>,
}

impl DynamoLeaseStore {
    /// Checks that the lease table exists with a lease table's key (a string partition key
    /// `leaseKey`, no sort key) and is usable, **without creating it** (unlike
    /// [`prepare`](crate::lease::LeaseStore::prepare)). Needs only `dynamodb:DescribeTable`.
    ///
    /// # Errors
    ///
    /// [`LeaseError::TableNotFound`] when the table does not exist; [`LeaseError::Invalid`]
    /// when it exists with another key; [`LeaseError::Unavailable`] while it is being created
    /// or deleted; any error of the DescribeTable call.
    pub async fn check_table(&self) -> Result<(), LeaseError> {
        match self.describe_table().await? {
            None => Err(LeaseError::TableNotFound {
                table: self.table.to_string(),
                operation: Operation::DescribeTable,
            }),
            Some(TableStatus::Creating | TableStatus::Deleting) | Some(TableStatus::Archived) => {
                Err(LeaseError::Unavailable {
                    table: self.table.to_string(),
                    operation: Operation::DescribeTable,
                    message: "the table is not ACTIVE (being created, deleted or archived)"
                        .to_owned(),
                    source: None,
                })
            }
            Some(_) => Ok(()),
        }
    }

    /// Every row of `stream`, as [`list`](crate::lease::LeaseStore::list) reads them (one
    /// consistent Scan, in id order), each with the wall-clock time of its last write.
    ///
    /// # Errors
    ///
    /// As [`list`](crate::lease::LeaseStore::list).
    pub async fn list_with_write_times(&self, stream: &str) -> Result<Vec<LeaseRow>, LeaseError> {
        let call = Operation::Scan;
        let mut rows = Vec::new();
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
                let last_written_ms = match item.get(WRITTEN) {
                    Some(AttributeValue::N(n)) => n.parse().ok(),
                    _ => None,
                };
                rows.push(LeaseRow {
                    lease: parse_row(&self.table, call, item)?,
                    last_written_ms,
                });
            }
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => break,
            }
        }
        rows.sort_by(|a, b| a.lease.shard_id.cmp(&b.lease.shard_id));
        Ok(rows)
    }
}
