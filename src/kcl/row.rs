//! A KCL lease row, read from and written as the KCL's own DynamoDB item.
//!
//! The names and types are those of the KCL's `DynamoDBLeaseSerializer` and
//! `DynamoDBMultiStreamLeaseSerializer` (awslabs/amazon-kinesis-client, read at commit
//! `024eb86e2163a3d211cacf21f44f5411b6c41c53`, release 3.5.1). KCL 1.x and 2.x write the same
//! attributes, fewer of them: 1.x has no hash keys, child ids or `entityType`.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;

use crate::error::KclError;
use crate::lease::type_name;

/// The partition key: the shard id, or `account:stream:epoch:shard` in multi-stream mode.
pub(crate) const LEASE_KEY: &str = "leaseKey";
const OWNER: &str = "leaseOwner";
const COUNTER: &str = "leaseCounter";
const OWNER_SWITCHES: &str = "ownerSwitchesSinceCheckpoint";
const CHECKPOINT: &str = "checkpoint";
const SUB_SEQUENCE: &str = "checkpointSubSequenceNumber";
const PARENTS: &str = "parentShardId";
const CHILDREN: &str = "childShardIds";
const STARTING_HASH_KEY: &str = "startingHashKey";
const ENDING_HASH_KEY: &str = "endingHashKey";
const ENTITY_TYPE: &str = "entityType";
/// The value of `entityType` on a lease row (KCL 3.5); rows without it are leases too.
const LEASE_ENTITY: &str = "LEASE";
/// Multi-stream mode: the stream's identifier, `account:stream:creationEpoch`.
const STREAM_ID: &str = "streamName";
/// Multi-stream mode: the shard id.
const SHARD_ID: &str = "shardId";

/// Where a KCL application stands in a shard: its `checkpoint` and
/// `checkpointSubSequenceNumber`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KclCheckpoint {
    /// The last record processed: the KCL resumes after (sequence, sub-sequence). A record
    /// that is not a KPL aggregate has sub-sequence 0; in an aggregate it is the user record's
    /// index.
    Sequence {
        /// The Kinesis record's sequence number.
        sequence: String,
        /// The user record's index in the aggregate (0 for a plain record).
        sub_sequence: u64,
    },
    /// `TRIM_HORIZON`: nothing processed; start at the oldest record kept.
    TrimHorizon,
    /// `LATEST`: nothing processed; the KCL starts at the tip when it opens the shard.
    Latest,
    /// `AT_TIMESTAMP`: nothing processed; the time is in the KCL application's configuration,
    /// not in the table.
    AtTimestamp,
    /// `SHARD_END`: the shard is closed and every record of it processed.
    ShardEnd,
}

impl KclCheckpoint {
    /// The `checkpoint` and `checkpointSubSequenceNumber` values.
    #[must_use]
    pub fn encode(&self) -> (String, u64) {
        match self {
            Self::Sequence {
                sequence,
                sub_sequence,
            } => (sequence.clone(), *sub_sequence),
            Self::TrimHorizon => ("TRIM_HORIZON".to_owned(), 0),
            Self::Latest => ("LATEST".to_owned(), 0),
            Self::AtTimestamp => ("AT_TIMESTAMP".to_owned(), 0),
            Self::ShardEnd => ("SHARD_END".to_owned(), 0),
        }
    }

    /// Reads the two attributes' values; `None` for anything else than digits or one of the
    /// four sentinels.
    #[must_use]
    pub fn decode(checkpoint: &str, sub_sequence: u64) -> Option<Self> {
        Some(match checkpoint {
            "TRIM_HORIZON" => Self::TrimHorizon,
            "LATEST" => Self::Latest,
            "AT_TIMESTAMP" => Self::AtTimestamp,
            "SHARD_END" => Self::ShardEnd,
            digits if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => {
                Self::Sequence {
                    sequence: digits.to_owned(),
                    sub_sequence,
                }
            }
            _ => return None,
        })
    }
}

impl std::fmt::Display for KclCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.encode() {
            (sequence, sub) if matches!(self, Self::Sequence { .. }) => {
                write!(f, "{sequence} (sub {sub})")
            }
            (sentinel, _) => f.write_str(&sentinel),
        }
    }
}

/// A multi-stream lease's stream: `account:stream:creationEpoch`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct KclStreamId {
    /// The AWS account id.
    pub account: String,
    /// The stream name.
    pub stream: String,
    /// The stream's creation time, in seconds since the Unix epoch.
    pub creation_epoch: u64,
}

impl KclStreamId {
    /// Reads `account:stream:epoch` (the KCL's own pattern: digits, no colon in the name,
    /// digits).
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(':');
        let (account, stream, epoch) = (parts.next()?, parts.next()?, parts.next()?);
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if parts.next().is_some() || !digits(account) || stream.is_empty() || !digits(epoch) {
            return None;
        }
        Some(Self {
            account: account.to_owned(),
            stream: stream.to_owned(),
            creation_epoch: epoch.parse().ok()?,
        })
    }
}

impl std::fmt::Display for KclStreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}",
            self.account, self.stream, self.creation_epoch
        )
    }
}

/// One lease of a KCL lease table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KclLease {
    /// Its `leaseKey`.
    pub lease_key: String,
    /// Multi-stream mode: the stream it belongs to; `None` in single-stream mode, where the
    /// table serves one stream and the key is the shard id.
    pub stream: Option<KclStreamId>,
    /// The shard id.
    pub shard_id: String,
    /// The worker holding it.
    pub owner: Option<String>,
    /// Bumped by every renewal and take: a counter that moves means a live worker.
    pub counter: u64,
    /// How often it changed hands since its last checkpoint.
    pub owner_switches: u64,
    /// The position.
    pub checkpoint: KclCheckpoint,
    /// The shard's parents.
    pub parents: Vec<String>,
    /// The shard's children (KCL 2.x and later, once the shard is finished).
    pub children: Vec<String>,
    /// The first and last hash key of the shard (KCL 2.x and later).
    pub hash_range: Option<(String, String)>,
}

/// What one item of a KCL table is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KclItem {
    /// A lease.
    Lease(Box<KclLease>),
    /// A row of another kind (KCL 3.5 keeps its coordinator and worker rows in the same
    /// table, tagged by `entityType`): skipped.
    Other {
        /// Its `leaseKey`.
        key: String,
        /// Its `entityType`.
        entity_type: String,
    },
}

/// Reads one item. Any lease row missing a required attribute, or holding one of the wrong
/// type, is a [`KclError::MalformedRow`] naming the table, the row and the attribute.
pub(crate) fn parse_item(
    table: &str,
    item: &HashMap<String, AttributeValue>,
) -> Result<KclItem, KclError> {
    let row = Item { table, item };
    let key = row.required(LEASE_KEY)?;
    match row.string(&key, ENTITY_TYPE)? {
        Some(kind) if kind != LEASE_ENTITY => {
            return Ok(KclItem::Other {
                key,
                entity_type: kind,
            });
        }
        _ => {}
    }
    let stream = match row.string(&key, STREAM_ID)? {
        None => None,
        Some(text) => Some(KclStreamId::parse(&text).ok_or_else(|| {
            row.bad(
                &key,
                STREAM_ID,
                format!("is {text:?}, not `account:stream:creationEpoch`"),
            )
        })?),
    };
    let shard_id = match (&stream, row.string(&key, SHARD_ID)?) {
        (Some(_), Some(shard)) => shard,
        (Some(_), None) => return Err(row.bad(&key, SHARD_ID, "is missing".to_owned())),
        (None, _) => key.clone(),
    };
    Ok(KclItem::Lease(Box::new(KclLease {
        owner: row.string(&key, OWNER)?,
        counter: row
            .number(&key, COUNTER)?
            .ok_or_else(|| row.missing(&key, COUNTER))?,
        owner_switches: row.number(&key, OWNER_SWITCHES)?.unwrap_or(0),
        checkpoint: row.checkpoint(&key)?,
        parents: row.set(&key, PARENTS)?,
        children: row.set(&key, CHILDREN)?,
        hash_range: row
            .string(&key, STARTING_HASH_KEY)?
            .zip(row.string(&key, ENDING_HASH_KEY)?),
        lease_key: key,
        stream,
        shard_id,
    })))
}

/// The item the KCL writes for `lease` (its `toDynamoRecord`): the same names and types.
pub(crate) fn to_item(lease: &KclLease) -> HashMap<String, AttributeValue> {
    let (checkpoint, sub) = lease.checkpoint.encode();
    let s = |v: &str| AttributeValue::S(v.to_owned());
    let n = |v: u64| AttributeValue::N(v.to_string());
    let mut item = HashMap::from([
        (LEASE_KEY.to_owned(), s(&lease.lease_key)),
        (COUNTER.to_owned(), n(lease.counter)),
        (OWNER_SWITCHES.to_owned(), n(lease.owner_switches)),
        (CHECKPOINT.to_owned(), s(&checkpoint)),
        (SUB_SEQUENCE.to_owned(), n(sub)),
        (ENTITY_TYPE.to_owned(), s(LEASE_ENTITY)),
    ]);
    if let Some(owner) = &lease.owner {
        item.insert(OWNER.to_owned(), s(owner));
    }
    // The KCL writes a string set only when it is not empty (DynamoDB refuses empty sets).
    if !lease.parents.is_empty() {
        item.insert(
            PARENTS.to_owned(),
            AttributeValue::Ss(lease.parents.clone()),
        );
    }
    if !lease.children.is_empty() {
        item.insert(
            CHILDREN.to_owned(),
            AttributeValue::Ss(lease.children.clone()),
        );
    }
    if let Some((start, end)) = &lease.hash_range {
        item.insert(STARTING_HASH_KEY.to_owned(), s(start));
        item.insert(ENDING_HASH_KEY.to_owned(), s(end));
    }
    if let Some(stream) = &lease.stream {
        item.insert(STREAM_ID.to_owned(), s(&stream.to_string()));
        item.insert(SHARD_ID.to_owned(), s(&lease.shard_id));
    }
    item
}

/// Whether an item carries an attribute only the KCL writes: a KCL lease row always holds
/// `checkpointSubSequenceNumber` and `ownerSwitchesSinceCheckpoint`.
pub(crate) fn has_kcl_attributes(item: &HashMap<String, AttributeValue>) -> bool {
    item.contains_key(SUB_SEQUENCE) || item.contains_key(OWNER_SWITCHES)
}

/// Whether an item is a row of another kind than a lease (its `entityType` says so).
pub(crate) fn is_other_entity(item: &HashMap<String, AttributeValue>) -> bool {
    matches!(item.get(ENTITY_TYPE), Some(AttributeValue::S(kind)) if kind != LEASE_ENTITY)
}

/// One item being read, for messages that name the table, the row and the attribute.
struct Item<'a> {
    table: &'a str,
    item: &'a HashMap<String, AttributeValue>,
}

impl Item<'_> {
    fn bad(&self, row: &str, attribute: &str, problem: String) -> KclError {
        KclError::MalformedRow {
            table: self.table.to_owned(),
            row: row.to_owned(),
            attribute: attribute.to_owned(),
            problem,
        }
    }

    fn missing(&self, row: &str, attribute: &str) -> KclError {
        self.bad(row, attribute, "is missing".to_owned())
    }

    fn wrong_type(&self, row: &str, attribute: &str, expected: &str) -> KclError {
        let found = self.item.get(attribute).map_or("none", type_name);
        self.bad(
            row,
            attribute,
            format!("has type {found}, expected {expected}"),
        )
    }

    fn required(&self, attribute: &str) -> Result<String, KclError> {
        match self.item.get(attribute) {
            Some(AttributeValue::S(s)) if !s.is_empty() => Ok(s.clone()),
            Some(_) => Err(self.wrong_type("(no leaseKey)", attribute, "a non-empty S")),
            None => Err(self.missing("(no leaseKey)", attribute)),
        }
    }

    fn string(&self, row: &str, attribute: &str) -> Result<Option<String>, KclError> {
        match self.item.get(attribute) {
            None => Ok(None),
            Some(AttributeValue::S(s)) => Ok(Some(s.clone())),
            Some(_) => Err(self.wrong_type(row, attribute, "S")),
        }
    }

    fn number(&self, row: &str, attribute: &str) -> Result<Option<u64>, KclError> {
        match self.item.get(attribute) {
            None => Ok(None),
            Some(AttributeValue::N(n)) => n
                .parse()
                .map(Some)
                .map_err(|_| self.bad(row, attribute, format!("is {n}, not a whole number >= 0"))),
            Some(_) => Err(self.wrong_type(row, attribute, "N")),
        }
    }

    fn set(&self, row: &str, attribute: &str) -> Result<Vec<String>, KclError> {
        match self.item.get(attribute) {
            None => Ok(Vec::new()),
            Some(AttributeValue::Ss(set)) => {
                let mut ids = set.clone();
                ids.sort();
                Ok(ids)
            }
            Some(_) => Err(self.wrong_type(row, attribute, "SS")),
        }
    }

    fn checkpoint(&self, row: &str) -> Result<KclCheckpoint, KclError> {
        let text = self
            .string(row, CHECKPOINT)?
            .ok_or_else(|| self.missing(row, CHECKPOINT))?;
        let sub = self.number(row, SUB_SEQUENCE)?.unwrap_or(0);
        KclCheckpoint::decode(&text, sub).ok_or_else(|| {
            self.bad(
                row,
                CHECKPOINT,
                format!(
                    "is {text:?}, not a sequence number, TRIM_HORIZON, LATEST, AT_TIMESTAMP or \
                     SHARD_END"
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> AttributeValue {
        AttributeValue::S(v.to_owned())
    }

    fn n(v: u64) -> AttributeValue {
        AttributeValue::N(v.to_string())
    }

    fn kcl2_row() -> HashMap<String, AttributeValue> {
        HashMap::from([
            ("leaseKey".to_owned(), s("shardId-000000000002")),
            ("leaseOwner".to_owned(), s("worker-a")),
            ("leaseCounter".to_owned(), n(41)),
            ("ownerSwitchesSinceCheckpoint".to_owned(), n(0)),
            (
                "checkpoint".to_owned(),
                s("49650000000000000000000000000000000000000000000000000002"),
            ),
            ("checkpointSubSequenceNumber".to_owned(), n(3)),
            (
                "parentShardId".to_owned(),
                AttributeValue::Ss(vec!["shardId-000000000000".to_owned()]),
            ),
            ("startingHashKey".to_owned(), s("0")),
            (
                "endingHashKey".to_owned(),
                s("170141183460469231731687303715884105727"),
            ),
        ])
    }

    #[test]
    fn a_kcl_2_row_reads_and_writes_back_the_same() {
        let KclItem::Lease(lease) = parse_item("t", &kcl2_row()).expect("a lease") else {
            panic!("not a lease")
        };
        assert_eq!(lease.shard_id, "shardId-000000000002");
        assert_eq!(lease.owner.as_deref(), Some("worker-a"));
        assert_eq!(lease.counter, 41);
        assert_eq!(
            lease.checkpoint,
            KclCheckpoint::Sequence {
                sequence: "49650000000000000000000000000000000000000000000000000002".into(),
                sub_sequence: 3
            }
        );
        let mut written = to_item(&lease);
        assert_eq!(written.remove("entityType"), Some(s("LEASE")));
        assert_eq!(written, kcl2_row());
    }

    #[test]
    fn a_multi_stream_row_names_its_stream() {
        let mut row = kcl2_row();
        row.insert(
            "leaseKey".into(),
            s("123456789012:orders:1700000000:shardId-000000000002"),
        );
        row.insert("streamName".into(), s("123456789012:orders:1700000000"));
        row.insert("shardId".into(), s("shardId-000000000002"));
        let KclItem::Lease(lease) = parse_item("t", &row).expect("a lease") else {
            panic!("not a lease")
        };
        assert_eq!(lease.shard_id, "shardId-000000000002");
        let stream = lease.stream.clone().expect("multi-stream");
        assert_eq!(
            (
                stream.account.as_str(),
                stream.stream.as_str(),
                stream.creation_epoch
            ),
            ("123456789012", "orders", 1_700_000_000)
        );
        assert_eq!(to_item(&lease).get("streamName"), row.get("streamName"));
    }

    #[test]
    fn rows_of_other_kinds_are_skipped_and_bad_rows_are_named() {
        let other = HashMap::from([
            ("leaseKey".to_owned(), s("Leader")),
            ("entityType".to_owned(), s("LEADER")),
        ]);
        assert!(matches!(parse_item("t", &other), Ok(KclItem::Other { .. })));
        let mut row = kcl2_row();
        row.insert("leaseCounter".into(), s("41"));
        let message = parse_item("kcl-app", &row)
            .expect_err("malformed")
            .to_string();
        for part in [
            "kcl-app",
            "shardId-000000000002",
            "leaseCounter",
            "expected N",
        ] {
            assert!(message.contains(part), "{message}");
        }
        let mut row = kcl2_row();
        row.insert("checkpoint".into(), s("49x"));
        let message = parse_item("kcl-app", &row)
            .expect_err("malformed")
            .to_string();
        assert!(message.contains("`checkpoint`"), "{message}");
        let mut row = kcl2_row();
        row.remove("checkpoint");
        assert!(parse_item("t", &row).is_err());
    }

    #[test]
    fn sentinels_read_as_sentinels() {
        for (text, expected) in [
            ("TRIM_HORIZON", KclCheckpoint::TrimHorizon),
            ("LATEST", KclCheckpoint::Latest),
            ("AT_TIMESTAMP", KclCheckpoint::AtTimestamp),
            ("SHARD_END", KclCheckpoint::ShardEnd),
        ] {
            assert_eq!(KclCheckpoint::decode(text, 0), Some(expected.clone()));
            assert_eq!(expected.encode().0, text);
        }
        assert_eq!(KclCheckpoint::decode("", 0), None);
        assert_eq!(KclStreamId::parse("1:a:b"), None);
        assert_eq!(KclStreamId::parse("1:a:2:3"), None);
    }
}
