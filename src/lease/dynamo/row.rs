//! How a lease becomes a DynamoDB item and back: the attribute names, the item, the row parser.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::AttributeValue;

use super::layout::KeyLayout;
use crate::error::Operation;
use crate::lease::{Lease, LeaseError, WorkerLimits};
use crate::position::Checkpoint;

/// The partition key: `<stream>#<shard>`.
pub(super) const KEY: &str = "leaseKey";
/// The stream name.
pub(super) const STREAM: &str = "streamName";
/// The shard id.
pub(super) const SHARD: &str = "shardId";
/// The holder, absent while the lease is free.
pub(super) const OWNER: &str = "leaseOwner";
/// The fencing token, bumped by every write.
pub(super) const COUNTER: &str = "leaseCounter";
/// A sequence number or [`SHARD_END`].
pub(super) const CHECKPOINT: &str = "checkpoint";
/// The parent shard ids.
const PARENTS: &str = "parentShardIds";
/// Wall-clock milliseconds of the last write; informational only.
pub(super) const WRITTEN: &str = "lastWrittenAt";
/// The shard's starting sequence number (tells the generations of a stream name apart).
const STARTING_SEQUENCE: &str = "startingSequenceNumber";
/// On a worker row: the instance's relative weight.
const WEIGHT: &str = "workerWeight";
/// On a worker row: the most shards the instance reads at once.
const MAX_LEASES: &str = "workerMaxLeases";
/// On a worker row: the instance's liveness group (see [`Lease::liveness_group`]).
const LIVENESS_GROUP: &str = "workerLivenessGroup";
/// How a [`Checkpoint::ShardEnd`] is stored.
const SHARD_END: &str = "SHARD_END";

/// The partition key of one shard of one stream.
fn lease_key(stream: &str, shard: &str) -> String {
    format!("{stream}#{shard}")
}

pub(super) fn number(n: u64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

pub(super) fn now_ms() -> u64 {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_millis();
    u64::try_from(ms).unwrap_or(u64::MAX)
}

pub(super) fn checkpoint_value(checkpoint: &Checkpoint) -> AttributeValue {
    AttributeValue::S(checkpoint.encode())
}

/// The row `create` writes: the lease as given, keyed for a table of `layout` (a single-key
/// row also holds `leaseKey`).
pub(super) fn to_item(lease: &Lease, layout: KeyLayout) -> HashMap<String, AttributeValue> {
    let mut item = HashMap::from([
        (STREAM.to_owned(), AttributeValue::S(lease.stream.clone())),
        (SHARD.to_owned(), AttributeValue::S(lease.shard_id.clone())),
        (COUNTER.to_owned(), number(lease.counter)),
        (WRITTEN.to_owned(), number(now_ms())),
    ]);
    item.extend(layout.key(&lease.stream, &lease.shard_id));
    if let Some(owner) = &lease.owner {
        item.insert(OWNER.to_owned(), AttributeValue::S(owner.clone()));
    }
    if let Some(checkpoint) = &lease.checkpoint {
        item.insert(CHECKPOINT.to_owned(), checkpoint_value(checkpoint));
    }
    if let Some(seq) = &lease.starting_sequence_number {
        item.insert(STARTING_SEQUENCE.to_owned(), AttributeValue::S(seq.clone()));
    }
    if let Some(limits) = &lease.limits {
        item.insert(WEIGHT.to_owned(), number(u64::from(limits.weight)));
        if let Some(max) = limits.max_leases {
            item.insert(MAX_LEASES.to_owned(), number(u64::from(max)));
        }
    }
    if let Some(group) = &lease.liveness_group {
        item.insert(LIVENESS_GROUP.to_owned(), AttributeValue::S(group.clone()));
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
pub(crate) fn type_name(value: &AttributeValue) -> &'static str {
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
pub(super) fn parse_row(
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
        limits: row.limits()?,
        liveness_group: row.string(LIVENESS_GROUP)?,
    })
}

/// One row read back, with the errors that name it.
struct Row<'a> {
    table: &'a str,
    call: Operation,
    /// How the row is named in errors: its `leaseKey`, or `<stream>#<shard>`.
    key: String,
    item: &'a HashMap<String, AttributeValue>,
}

impl<'a> Row<'a> {
    fn new(table: &'a str, call: Operation, item: &'a HashMap<String, AttributeValue>) -> Self {
        let text = |name| match item.get(name) {
            Some(AttributeValue::S(text)) => Some(text.as_str()),
            _ => None,
        };
        let key = match (text(KEY), text(STREAM), text(SHARD)) {
            (Some(key), _, _) => key.to_owned(),
            (None, Some(stream), Some(shard)) => lease_key(stream, shard),
            (None, Some(stream), None) => format!("{stream}#(no shardId)"),
            (None, None, _) => "(no leaseKey or streamName)".to_owned(),
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

    /// A number attribute that fits a `u32`, if present.
    fn small_number(&self, attribute: &str) -> Result<Option<u32>, LeaseError> {
        match self.item.get(attribute) {
            None => Ok(None),
            Some(AttributeValue::N(n)) => n.parse::<u32>().map(Some).map_err(|_| {
                self.bad(
                    attribute,
                    format!("`{n}` is not a whole number up to {}", u32::MAX),
                )
            }),
            Some(other) => Err(self.bad(
                attribute,
                format!(
                    "is of type {} where a number (N) was expected",
                    type_name(other)
                ),
            )),
        }
    }

    fn limits(&self) -> Result<Option<WorkerLimits>, LeaseError> {
        let Some(weight) = self.small_number(WEIGHT)? else {
            return Ok(None);
        };
        Ok(Some(WorkerLimits {
            weight,
            max_leases: self.small_number(MAX_LEASES)?,
        }))
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
            let item = to_item(&lease, KeyLayout::SingleKey);
            assert_eq!(item[KEY], AttributeValue::S("s#shardId-1".into()));
            assert_eq!(parse_row("t", Operation::Scan, &item).unwrap(), lease);
        }
        for limits in [
            WorkerLimits::default(),
            WorkerLimits {
                weight: 3,
                max_leases: Some(40),
            },
        ] {
            let mut worker = Lease::new("s", "worker:me", vec![]);
            worker.limits = Some(limits);
            let item = to_item(&worker, KeyLayout::SingleKey);
            assert_eq!(item[WEIGHT], AttributeValue::N(limits.weight.to_string()));
            assert_eq!(parse_row("t", Operation::Scan, &item).unwrap(), worker);
            worker.liveness_group = Some("g-1".into());
            let item = to_item(&worker, KeyLayout::ByStream);
            assert_eq!(item[LIVENESS_GROUP], AttributeValue::S("g-1".into()));
            assert_eq!(parse_row("t", Operation::Query, &item).unwrap(), worker);
        }
        let bad = row(&[
            (STREAM, AttributeValue::S("s".into())),
            (SHARD, AttributeValue::S("worker:me".into())),
            (COUNTER, AttributeValue::N("1".into())),
            (WEIGHT, AttributeValue::N("-2".into())),
        ]);
        let err = parse_row("t", Operation::Scan, &bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains(WEIGHT), "{err}");
        let free = Lease::new("s", "shardId-1", vec![]);
        let item = to_item(&free, KeyLayout::ByStream);
        assert!(!item.contains_key(KEY), "{item:?}");
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
}
