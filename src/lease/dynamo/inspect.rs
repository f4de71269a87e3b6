//! Read-only calls for operators' tools (the `kinesis-dataflow` command): check that the lease
//! table is there without creating it, and read rows with the time of their last write.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};

use aws_sdk_dynamodb::types::{AttributeValue, ReturnConsumedCapacity, TableStatus};

use super::DynamoLeaseStore;
use super::layout::KeyLayout;
use super::row::{STREAM, WRITTEN, parse_row};
use crate::error::Operation;
use crate::lease::{Lease, LeaseError};

/// One item as the SDK gives it.
type Item = HashMap<String, AttributeValue>;

/// The most segments a single-key table's Scan is read in at once.
const MAX_SEGMENTS: u32 = 16;

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
            Some((TableStatus::Creating | TableStatus::Deleting | TableStatus::Archived, _)) => {
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
    /// consistent Query of the stream's rows; on a single-key table a consistent Scan of the
    /// whole table), in id order, each with the wall-clock time of its last write.
    ///
    /// # Errors
    ///
    /// As [`list`](crate::lease::LeaseStore::list).
    pub async fn list_with_write_times(&self, stream: &str) -> Result<Vec<LeaseRow>, LeaseError> {
        let items = match self.key_layout().await? {
            KeyLayout::ByStream => self.query_stream(stream).await?,
            KeyLayout::SingleKey => self.scan_for_stream(stream).await?,
        };
        let call = self.list_call();
        let mut rows = items
            .iter()
            .map(|item| row_with_write_time(&self.table, call, item))
            .collect::<Result<Vec<_>, LeaseError>>()?;
        rows.sort_by(|a, b| a.lease.shard_id.cmp(&b.lease.shard_id));
        Ok(rows)
    }

    /// Every row of the table, of every stream (worker and roster rows included), by a
    /// consistent Scan, in (stream, id) order, each with the wall-clock time of its last write:
    /// what `kinesis-dataflow lease-table copy` reads. Needs `dynamodb:Scan`.
    ///
    /// # Errors
    ///
    /// As [`list`](crate::lease::LeaseStore::list).
    pub async fn list_every_stream(&self) -> Result<Vec<LeaseRow>, LeaseError> {
        self.key_layout().await?;
        let (items, _) = self.scan_segment(None, 0, 1, None).await?;
        let mut rows = items
            .iter()
            .map(|item| row_with_write_time(&self.table, Operation::Scan, item))
            .collect::<Result<Vec<_>, LeaseError>>()?;
        rows.sort_by(|a, b| {
            (&a.lease.stream, &a.lease.shard_id).cmp(&(&b.lease.stream, &b.lease.shard_id))
        });
        Ok(rows)
    }

    /// The call a listing makes on this table: Query, or Scan on a single-key table (once the
    /// layout is known).
    pub(super) fn list_call(&self) -> Operation {
        match self.layout.get() {
            Some(KeyLayout::SingleKey) => Operation::Scan,
            _ => Operation::Query,
        }
    }

    /// The stream's items, by a consistent Query of its partition.
    async fn query_stream(&self, stream: &str) -> Result<Vec<Item>, LeaseError> {
        let call = Operation::Query;
        let mut items = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&*self.table)
                .key_condition_expression("#stream = :stream")
                .expression_attribute_names("#stream", STREAM)
                .expression_attribute_values(":stream", AttributeValue::S(stream.to_owned()))
                .consistent_read(true)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .set_limit(self.scan_page_size)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|err| self.error(call, err))?;
            self.count_read(page.consumed_capacity(), page.scanned_count);
            items.extend(page.items.unwrap_or_default());
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => start = Some(key),
                _ => return Ok(items),
            }
        }
    }

    /// The stream's items from a single-key table: a consistent Scan of the whole table,
    /// filtered on the stream, in as many parallel segments as the last Scan read pages (at
    /// most [`MAX_SEGMENTS`]), so a large table is still read within the call's time limit.
    /// The count grows as pages arrive, not only once a Scan completes: a Scan given up
    /// because it took too long (the caller's time limit) still sizes the next one.
    async fn scan_for_stream(&self, stream: &str) -> Result<Vec<Item>, LeaseError> {
        let segments = self
            .scan_segments
            .load(Ordering::Relaxed)
            .clamp(1, MAX_SEGMENTS);
        let pages_read = AtomicU32::new(0);
        let reads = (0..segments)
            .map(|segment| self.scan_segment(Some(stream), segment, segments, Some(&pages_read)));
        let read = futures::future::try_join_all(reads).await?;
        let pages: u32 = read.iter().map(|(_, pages)| pages).sum();
        self.scan_segments
            .store(pages.clamp(1, MAX_SEGMENTS), Ordering::Relaxed);
        Ok(read.into_iter().flat_map(|(items, _)| items).collect())
    }

    /// One segment of a Scan (of `stream`'s rows only, or of every row): its items and its
    /// pages. With `pages_read` (the pages every segment of this Scan read so far), a page
    /// followed by another raises the segment count of the next Scan to at least the pages
    /// this one read so far and one more.
    async fn scan_segment(
        &self,
        stream: Option<&str>,
        segment: u32,
        segments: u32,
        pages_read: Option<&AtomicU32>,
    ) -> Result<(Vec<Item>, u32), LeaseError> {
        let call = Operation::Scan;
        let parallel = segments > 1;
        let as_i32 = |n: u32| i32::try_from(n).unwrap_or(i32::MAX);
        let mut items = Vec::new();
        let mut pages = 0;
        let mut start: Option<Item> = None;
        loop {
            let mut scan = self.client.scan().table_name(&*self.table);
            if let Some(stream) = stream {
                scan = scan
                    .filter_expression("#stream = :stream")
                    .expression_attribute_names("#stream", STREAM)
                    .expression_attribute_values(":stream", AttributeValue::S(stream.to_owned()));
            }
            let page = scan
                .consistent_read(true)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .set_segment(parallel.then(|| as_i32(segment)))
                .set_total_segments(parallel.then(|| as_i32(segments)))
                .set_limit(self.scan_page_size)
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|err| self.error(call, err))?;
            pages += 1;
            self.count_read(page.consumed_capacity(), page.scanned_count);
            items.extend(page.items.unwrap_or_default());
            let read = pages_read.map(|read| read.fetch_add(1, Ordering::Relaxed) + 1);
            match page.last_evaluated_key {
                Some(key) if !key.is_empty() => {
                    if let Some(read) = read {
                        let at_least = read.saturating_add(1).min(MAX_SEGMENTS);
                        self.scan_segments.fetch_max(at_least, Ordering::Relaxed);
                    }
                    start = Some(key);
                }
                _ => return Ok((items, pages)),
            }
        }
    }
}

/// One item as a [`LeaseRow`].
fn row_with_write_time(table: &str, call: Operation, item: &Item) -> Result<LeaseRow, LeaseError> {
    let last_written_ms = match item.get(WRITTEN) {
        Some(AttributeValue::N(n)) => n.parse().ok(),
        _ => None,
    };
    Ok(LeaseRow {
        lease: parse_row(table, call, item)?,
        last_written_ms,
    })
}
