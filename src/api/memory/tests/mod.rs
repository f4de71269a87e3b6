//! Tests of the in-memory Kinesis through the [`KinesisApi`] trait, with the helpers they
//! share.

mod control;
mod fan_out;
mod reads;
mod reshard;
mod writes;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use super::{Fault, FaultKind, MemoryKinesis};
use crate::api::{
    ChildShard, GetRecordsOutput, KinesisApi, PutRecordResult, PutRecordsEntry, ShardDescription,
    StreamStatus,
};
use crate::error::{KinesisError, Operation};
use crate::position::StartingPoint;
use crate::record::{Record, cmp_sequence};

const S0: &str = "shardId-000000000000";
const S1: &str = "shardId-000000000001";
const S2: &str = "shardId-000000000002";
const S3: &str = "shardId-000000000003";

fn kinesis(stream: &str, shards: u32) -> MemoryKinesis {
    let kinesis = MemoryKinesis::new();
    kinesis.add_stream(stream, shards).expect("stream");
    kinesis
}

fn entry(key: &str, data: &'static [u8]) -> PutRecordsEntry {
    PutRecordsEntry {
        data: Bytes::from_static(data),
        partition_key: key.to_owned(),
        explicit_hash_key: None,
    }
}

fn entry_at(hash: u128, data: &'static [u8]) -> PutRecordsEntry {
    PutRecordsEntry {
        explicit_hash_key: Some(hash.to_string()),
        ..entry("k", data)
    }
}

fn err<T: std::fmt::Debug>(result: Result<T, KinesisError>) -> KinesisError {
    result.expect_err("the call should fail")
}

fn assert_invalid(error: &KinesisError, needle: &str) {
    match error {
        KinesisError::InvalidArgument { message, .. } => assert!(
            message.contains(needle),
            "message `{message}` should mention `{needle}`"
        ),
        other => panic!("expected InvalidArgument mentioning `{needle}`, got {other:?}"),
    }
}

fn datas(records: &[Record]) -> Vec<&[u8]> {
    records.iter().map(|r| r.data().as_ref()).collect()
}

async fn iterator(k: &MemoryKinesis, stream: &str, shard: &str, start: StartingPoint) -> String {
    k.get_shard_iterator(stream, shard, &start)
        .await
        .expect("iterator")
}

/// Reads `shard` from `start` until it ends or an empty page at the tip; returns the records
/// and the last answer.
async fn read_all(
    k: &MemoryKinesis,
    stream: &str,
    shard: &str,
    start: StartingPoint,
    limit: u32,
) -> (Vec<Record>, GetRecordsOutput) {
    let shard: Arc<str> = shard.into();
    let mut it = iterator(k, stream, &shard, start).await;
    let mut records = Vec::new();
    loop {
        let page = k
            .get_records(stream, &shard, it, limit)
            .await
            .expect("records");
        records.extend(page.records.iter().cloned());
        match &page.next_shard_iterator {
            Some(next) if !page.records.is_empty() => it = next.clone(),
            _ => return (records, page),
        }
    }
}

async fn all_shards(k: &MemoryKinesis, stream: &str) -> Vec<ShardDescription> {
    let mut shards = Vec::new();
    let mut token = None;
    loop {
        let page = k.list_shards(stream, token).await.expect("list");
        shards.extend(page.shards);
        match page.next_token {
            Some(next) => token = Some(next),
            None => return shards,
        }
    }
}
