//! The calls themselves, answered from the store under its lock.
//!
//! Each method here runs after the call passed the test hooks (with the `test-util` feature:
//! `MemoryKinesis::gate` logged it, consumed its fault and waited its latency), takes the lock
//! once, and never awaits.

use std::sync::Arc;
use std::time::SystemTime;

use super::hash;
use super::sequence;
use super::stream::{Refusal, StreamState, check_stream_name};
use super::token::{IteratorToken, PageToken};
use super::{
    MAX_PARTITION_KEY_CHARS, MAX_PUT_RECORDS_BYTES, MAX_PUT_RECORDS_ENTRIES, MAX_RECORD_BYTES,
    MAX_SHARDS_PER_STREAM, MemoryKinesis, RETENTION_PERIOD_HOURS,
};
use crate::api::{
    GetRecordsOutput, ListShardsPage, MAX_GET_RECORDS_LIMIT, PutRecordResult, PutRecordsEntry,
    PutRecordsOutput, StreamStatus, StreamSummary,
};
use crate::error::{KinesisError, Operation};
use crate::position::StartingPoint;
use crate::record::{Read, Record};

impl MemoryKinesis {
    /// CreateStream: checks the name and the shard count, then adds the stream.
    pub(super) fn create(
        &self,
        op: Operation,
        stream: &str,
        shard_count: u32,
    ) -> Result<(), KinesisError> {
        check_stream_name(stream).map_err(|message| invalid(op, stream, message))?;
        if shard_count == 0 || shard_count > MAX_SHARDS_PER_STREAM {
            return Err(invalid(
                op,
                stream,
                format!(
                    "ShardCount {shard_count} is out of range: a stream has 1 to \
                     {MAX_SHARDS_PER_STREAM} shards"
                ),
            ));
        }
        let mut state = self.lock();
        if state.streams.contains_key(stream) {
            return Err(KinesisError::ResourceInUse {
                operation: op,
                stream: stream.to_owned(),
                message: format!("stream {stream} already exists in region {}", self.region),
                source: None,
            });
        }
        let number = state.next_stream_number;
        if number > sequence::MAX_STREAM_NUMBER {
            return Err(invalid(
                op,
                stream,
                format!(
                    "this MemoryKinesis holds {} streams already, its limit",
                    sequence::MAX_STREAM_NUMBER
                ),
            ));
        }
        state.next_stream_number += 1;
        state
            .streams
            .insert(stream.to_owned(), StreamState::new(number, shard_count));
        tracing::debug!(stream, shard_count, "memory kinesis: created stream");
        Ok(())
    }

    /// One ListShards page, from the start or from `next_token`.
    pub(super) fn list_page(
        &self,
        stream: &str,
        next_token: Option<&str>,
    ) -> Result<ListShardsPage, KinesisError> {
        let op = Operation::ListShards;
        let mut state = self.lock();
        let page_size = state.list_page_size;
        let stream_state = self.stream_mut(&mut state, op, stream)?;
        let listed = stream_state.listed();
        let total = listed.len();
        // The token names the next shard itself, so shards expiring between pages never make
        // a page skip one.
        let start = match next_token {
            None => 0,
            Some(text) => PageToken::decode(text)
                .filter(|t| t.instance == self.instance && t.stream == stream)
                .map(|t| listed.partition_point(|&i| i < t.index))
                .ok_or_else(|| {
                    invalid(
                        op,
                        stream,
                        format!("NextToken {text} is not a ListShards token of this stream"),
                    )
                })?,
        };
        let end = start.saturating_add(page_size).min(total);
        Ok(ListShardsPage {
            shards: listed[start..end]
                .iter()
                .map(|&i| stream_state.describe(i))
                .collect(),
            next_token: (end < total).then(|| {
                PageToken {
                    instance: self.instance,
                    stream: stream.to_owned(),
                    index: listed[end],
                }
                .encode()
            }),
        })
    }

    /// GetShardIterator: where `start` points in `shard`, as a fresh iterator.
    pub(super) fn shard_iterator(
        &self,
        stream: &str,
        shard: &str,
        start: &StartingPoint,
    ) -> Result<String, KinesisError> {
        let op = Operation::GetShardIterator;
        let mut state = self.lock();
        let stream_state = self.stream_mut(&mut state, op, stream)?;
        let index = stream_state
            .index_of(shard)
            .map_err(|r| refused(op, stream, r))?;
        let position = stream_state
            .position_for(index, start)
            .map_err(|r| refused(op, stream, r))?;
        let number = stream_state.shards[index].number;
        drop(state);
        Ok(self.iterator(stream, number, position))
    }

    /// GetRecords: the records from the iterator's position, the next iterator (none at the
    /// end of a closed shard, with its children), and how far behind the tip the read is.
    pub(super) fn read(
        &self,
        stream: &str,
        shard: &Arc<str>,
        iterator: &str,
        limit: u32,
    ) -> Result<GetRecordsOutput, KinesisError> {
        let op = Operation::GetRecords;
        if limit == 0 || limit > MAX_GET_RECORDS_LIMIT {
            let message = format!(
                "Limit {limit} is out of range: GetRecords takes 1 to {MAX_GET_RECORDS_LIMIT} \
                 records"
            );
            return Err(invalid(op, stream, message));
        }
        let token = self.own_token(op, stream, iterator)?;
        let mut state = self.lock();
        let ttl = u64::try_from(state.iterator_ttl.as_nanos()).unwrap_or(u64::MAX);
        if self.clock_nanos().saturating_sub(token.issued_nanos) >= ttl {
            return Err(KinesisError::ExpiredIterator {
                operation: op,
                stream: stream.to_owned(),
                source: None,
            });
        }
        let stream_state = self.stream_mut(&mut state, op, stream)?;
        let index = token_shard(stream_state, op, stream, &token, shard)?;
        let shard_state = &stream_state.shards[index];
        let span =
            shard_state.read_span(token.position, usize::try_from(limit).unwrap_or(usize::MAX));
        let at_end = span.to == shard_state.end();
        let millis_behind = shard_state.millis_behind(span);
        let records = Record::answer(
            stream,
            shard,
            Some(millis_behind),
            shard_state.span_records(span).map(|r| Read {
                sequence_number: r.sequence_number.clone().into(),
                partition_key: r.partition_key.clone().into(),
                data: r.data.clone(),
                approximate_arrival: Some(r.arrival),
            }),
            None,
        );
        let finished = at_end && !shard_state.open;
        let child_shards = if finished {
            stream_state.child_shards(index)
        } else {
            Vec::new()
        };
        drop(state);
        Ok(GetRecordsOutput {
            records,
            next_shard_iterator: (!finished).then(|| self.iterator(stream, token.shard, span.to)),
            millis_behind_latest: Some(millis_behind),
            child_shards,
        })
    }

    /// The iterator `iterator` decoded, when this store issued it for `stream`.
    fn own_token(
        &self,
        op: Operation,
        stream: &str,
        iterator: &str,
    ) -> Result<IteratorToken, KinesisError> {
        let token = IteratorToken::decode(iterator)
            .filter(|t| t.instance == self.instance)
            .ok_or_else(|| {
                invalid(
                    op,
                    stream,
                    "ShardIterator is malformed: it is not a shard iterator this MemoryKinesis \
                     issued"
                        .to_owned(),
                )
            })?;
        if token.stream != stream {
            return Err(invalid(
                op,
                stream,
                format!(
                    "ShardIterator belongs to stream {}, not to this stream",
                    token.stream
                ),
            ));
        }
        Ok(token)
    }

    /// The ids of the shards `entries` route to (best effort, for matching faults).
    #[cfg(feature = "test-util")]
    pub(super) fn routed_shards(&self, stream: &str, entries: &[PutRecordsEntry]) -> Vec<String> {
        let state = self.lock();
        let Some(stream_state) = state.streams.get(stream) else {
            return Vec::new();
        };
        let mut ids: Vec<String> = entries
            .iter()
            .filter_map(entry_route_hash)
            .map(|hash| stream_state.shard_id(stream_state.route(hash)).to_string())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// PutRecords: checks the request like the service, then stores each entry on the open
    /// shard its hash key routes to, unless `failed` gives the entry's result for that shard
    /// (a per-entry fault of the `test-util` feature).
    pub(super) fn put_entries(
        &self,
        stream: &str,
        entries: Vec<PutRecordsEntry>,
        failed: impl Fn(&str) -> Option<PutRecordResult>,
    ) -> Result<PutRecordsOutput, KinesisError> {
        let op = Operation::PutRecords;
        let hashes = check_put(op, stream, &entries)?;
        let mut state = self.lock();
        let observer = state.observer.clone();
        let stream_state = self.stream_mut(&mut state, op, stream)?;
        let now = SystemTime::now();
        let mut stored = Vec::new();
        let results = entries
            .into_iter()
            .zip(hashes)
            .map(|(entry, hash)| {
                let index = stream_state.route(hash);
                let shard_id = stream_state.shard_id(index);
                if let Some(failure) = failed(&shard_id) {
                    return failure;
                }
                let sequence_number = if observer.is_some() {
                    let sequence_number = stream_state.append(
                        index,
                        entry.partition_key.clone(),
                        entry.data.clone(),
                        now,
                    );
                    stored.push(Record::new(
                        shard_id.clone(),
                        sequence_number.clone(),
                        entry.partition_key,
                        entry.data,
                        Some(now),
                    ));
                    sequence_number
                } else {
                    stream_state.append(index, entry.partition_key, entry.data, now)
                };
                PutRecordResult::Stored {
                    shard_id: shard_id.to_string(),
                    sequence_number,
                }
            })
            .collect();
        drop(state);
        self.observed(observer, stream, &stored);
        Ok(PutRecordsOutput { results })
    }

    /// DescribeStreamSummary.
    pub(super) fn summary(&self, stream: &str) -> Result<StreamSummary, KinesisError> {
        let mut state = self.lock();
        let stream_state = self.stream_mut(&mut state, Operation::DescribeStreamSummary, stream)?;
        Ok(StreamSummary {
            stream_name: stream.to_owned(),
            status: StreamStatus::Active,
            open_shard_count: u32::try_from(stream_state.open_shard_count()).unwrap_or(u32::MAX),
            retention_period_hours: RETENTION_PERIOD_HOURS,
        })
    }

    /// SplitShard.
    pub(super) fn split(&self, stream: &str, shard: &str, key: &str) -> Result<(), KinesisError> {
        let op = Operation::SplitShard;
        let mut state = self.lock();
        let stream_state = self.stream_mut(&mut state, op, stream)?;
        let index = stream_state
            .index_of(shard)
            .map_err(|r| refused(op, stream, r))?;
        let key = hash::parse_hash_key(key).ok_or_else(|| {
            invalid(
                op,
                stream,
                format!("NewStartingHashKey `{key}` is not a decimal 128-bit hash key"),
            )
        })?;
        stream_state
            .split(index, key)
            .map_err(|r| refused(op, stream, r))?;
        tracing::debug!(stream, shard, %key, "memory kinesis: split shard");
        Ok(())
    }

    /// MergeShards.
    pub(super) fn merge(
        &self,
        stream: &str,
        shard: &str,
        adjacent: &str,
    ) -> Result<(), KinesisError> {
        let op = Operation::MergeShards;
        let mut state = self.lock();
        let stream_state = self.stream_mut(&mut state, op, stream)?;
        let first = stream_state
            .index_of(shard)
            .map_err(|r| refused(op, stream, r))?;
        let second = stream_state
            .index_of(adjacent)
            .map_err(|r| refused(op, stream, r))?;
        stream_state
            .merge(first, second)
            .map_err(|r| refused(op, stream, r))?;
        tracing::debug!(stream, shard, adjacent, "memory kinesis: merged shards");
        Ok(())
    }
}

/// An [`KinesisError::InvalidArgument`] of `operation` on `stream`.
pub(super) fn invalid(operation: Operation, stream: &str, message: String) -> KinesisError {
    KinesisError::InvalidArgument {
        operation,
        stream: stream.to_owned(),
        message,
        source: None,
    }
}

/// The error a stream's refusal becomes.
pub(super) fn refused(operation: Operation, stream: &str, refusal: Refusal) -> KinesisError {
    match refusal {
        Refusal::ShardNotFound(shard) => KinesisError::ShardNotFound {
            operation,
            stream: stream.to_owned(),
            shard,
            source: None,
        },
        Refusal::Invalid(message) => invalid(operation, stream, message),
    }
}

/// The hash key an entry routes by, if it is well-formed.
#[cfg(feature = "test-util")]
fn entry_route_hash(entry: &PutRecordsEntry) -> Option<u128> {
    match &entry.explicit_hash_key {
        Some(key) => hash::parse_hash_key(key),
        None => Some(hash::hash_of(&entry.partition_key)),
    }
}

/// Checks one entry like the service and returns the hash key it routes by.
pub(super) fn entry_hash(
    op: Operation,
    stream: &str,
    index: Option<usize>,
    partition_key: &str,
    data_len: usize,
    explicit_hash_key: Option<&str>,
) -> Result<u128, KinesisError> {
    let name = |field: &str| match index {
        Some(i) => format!("Records[{i}].{field}"),
        None => field.to_owned(),
    };
    let key_chars = partition_key.chars().count();
    if key_chars == 0 || key_chars > MAX_PARTITION_KEY_CHARS {
        return Err(invalid(
            op,
            stream,
            format!(
                "{} must be 1 to {MAX_PARTITION_KEY_CHARS} characters long (it has {key_chars})",
                name("PartitionKey")
            ),
        ));
    }
    let size = data_len + partition_key.len();
    if size > MAX_RECORD_BYTES {
        return Err(invalid(
            op,
            stream,
            format!(
                "{} and its partition key take {size} bytes; a record takes at most \
                 {MAX_RECORD_BYTES} (1 MiB)",
                name("Data")
            ),
        ));
    }
    match explicit_hash_key {
        None => Ok(hash::hash_of(partition_key)),
        Some(key) => hash::parse_hash_key(key).ok_or_else(|| {
            invalid(
                op,
                stream,
                format!(
                    "{} `{key}` is not a decimal 128-bit hash key",
                    name("ExplicitHashKey")
                ),
            )
        }),
    }
}

/// The shard a GetRecords iterator names, when it still exists and is `shard`.
fn token_shard(
    stream_state: &StreamState,
    op: Operation,
    stream: &str,
    token: &IteratorToken,
    shard: &Arc<str>,
) -> Result<usize, KinesisError> {
    let index = usize::try_from(token.shard)
        .ok()
        .filter(|&i| i < stream_state.shards.len() && !stream_state.shards[i].expired)
        .ok_or_else(|| KinesisError::ShardNotFound {
            operation: op,
            stream: stream.to_owned(),
            shard: shard.to_string(),
            source: None,
        })?;
    let id = &stream_state.shards[index].id;
    if **id != **shard {
        return Err(invalid(
            op,
            stream,
            format!("ShardIterator belongs to shard {id}, not to shard {shard}"),
        ));
    }
    Ok(index)
}

/// Checks a PutRecords request like the service does; returns each entry's hash key.
fn check_put(
    op: Operation,
    stream: &str,
    entries: &[PutRecordsEntry],
) -> Result<Vec<u128>, KinesisError> {
    check_stream_name(stream).map_err(|message| invalid(op, stream, message))?;
    if entries.is_empty() || entries.len() > MAX_PUT_RECORDS_ENTRIES {
        return Err(invalid(
            op,
            stream,
            format!(
                "Records holds {} entries; PutRecords takes 1 to {MAX_PUT_RECORDS_ENTRIES}",
                entries.len()
            ),
        ));
    }
    let total: usize = entries
        .iter()
        .map(|e| e.data.len() + e.partition_key.len())
        .sum();
    if total > MAX_PUT_RECORDS_BYTES {
        return Err(invalid(
            op,
            stream,
            format!(
                "the request carries {total} bytes of data and partition keys; PutRecords \
                 takes at most {MAX_PUT_RECORDS_BYTES} (5 MiB)"
            ),
        ));
    }
    let hashes = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            entry_hash(
                op,
                stream,
                Some(i),
                &e.partition_key,
                e.data.len(),
                e.explicit_hash_key.as_deref(),
            )
        })
        .collect::<Result<Vec<u128>, KinesisError>>()?;
    Ok(hashes)
}
