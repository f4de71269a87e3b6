//! The two key layouts a lease table may have, and how each names a row and reads a stream.
//!
//! | layout | key | a listing reads |
//! |---|---|---|
//! | [`KeyLayout::ByStream`] (tables this library creates) | partition key `streamName`, sort key `shardId` | one `Query` of the stream's rows |
//! | [`KeyLayout::SingleKey`] (tables created before) | partition key `leaseKey` = `<stream>#<shard>` | a `Scan` of the whole table, filtered on the stream |
//!
//! A Query is read consistently and costs the stream's rows only; a Scan costs every row of
//! every stream in the table. An existing single-key table is read the old way, never changed
//! in place (see the guide's "Lease table" chapter).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::{AttributeValue, KeyType, ScalarAttributeType, TableDescription};

use super::row::{KEY, SHARD, STREAM};

/// How a lease table is keyed, as read from its description.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KeyLayout {
    /// Partition key `streamName`, sort key `shardId` (both strings): a stream's rows are
    /// read with one Query. The layout of every table the library creates.
    ByStream,
    /// Partition key `leaseKey` (`<stream>#<shard>`), no sort key: a stream's rows are read
    /// with a filtered Scan of the whole table. The layout of tables created before the
    /// by-stream layout; still read and written as they are.
    SingleKey,
}

impl KeyLayout {
    /// The layout of a table with this description; `None` when its key is neither.
    ///
    /// A description without a key schema (a minimal emulator) counts as by-stream, the
    /// layout the library creates.
    pub(crate) fn of(table: &TableDescription) -> Option<Self> {
        let string_key = |name: &str| {
            table.attribute_definitions().is_empty()
                || table.attribute_definitions().iter().any(|def| {
                    def.attribute_name() == name && def.attribute_type() == &ScalarAttributeType::S
                })
        };
        let keys: Vec<(&str, &KeyType)> = table
            .key_schema()
            .iter()
            .map(|k| (k.attribute_name(), k.key_type()))
            .collect();
        match keys.as_slice() {
            [] => Some(Self::ByStream),
            [(KEY, KeyType::Hash)] if string_key(KEY) => Some(Self::SingleKey),
            [(a, b), (c, d)] => {
                let (hash, range) = if **b == KeyType::Hash { (a, c) } else { (c, a) };
                let kinds_right = (b, d) == (&&KeyType::Hash, &&KeyType::Range)
                    || (b, d) == (&&KeyType::Range, &&KeyType::Hash);
                (kinds_right
                    && *hash == STREAM
                    && *range == SHARD
                    && string_key(STREAM)
                    && string_key(SHARD))
                .then_some(Self::ByStream)
            }
            _ => None,
        }
    }

    /// The key of the row of `shard` of `stream`.
    pub(crate) fn key(self, stream: &str, shard: &str) -> HashMap<String, AttributeValue> {
        match self {
            Self::ByStream => HashMap::from([
                (STREAM.to_owned(), AttributeValue::S(stream.to_owned())),
                (SHARD.to_owned(), AttributeValue::S(shard.to_owned())),
            ]),
            Self::SingleKey => HashMap::from([(
                KEY.to_owned(),
                AttributeValue::S(format!("{stream}#{shard}")),
            )]),
        }
    }

    /// An attribute every row has as part of its key (for `attribute_not_exists`).
    pub(crate) fn key_attribute(self) -> &'static str {
        match self {
            Self::ByStream => STREAM,
            Self::SingleKey => KEY,
        }
    }

    /// How the layout is named in messages and by the `kinesis-dataflow` tool.
    #[must_use]
    pub fn describe(self) -> &'static str {
        match self {
            Self::ByStream => "by stream (partition key streamName, sort key shardId)",
            Self::SingleKey => "single key (partition key leaseKey)",
        }
    }
}

#[cfg(test)]
mod tests {
    use aws_sdk_dynamodb::types::{AttributeDefinition, KeySchemaElement};

    use super::*;

    fn table(keys: &[(&str, KeyType)], types: &[(&str, ScalarAttributeType)]) -> TableDescription {
        let mut t = TableDescription::builder();
        for (name, kind) in keys {
            t = t.key_schema(
                KeySchemaElement::builder()
                    .attribute_name(*name)
                    .key_type(kind.clone())
                    .build()
                    .unwrap(),
            );
        }
        for (name, kind) in types {
            t = t.attribute_definitions(
                AttributeDefinition::builder()
                    .attribute_name(*name)
                    .attribute_type(kind.clone())
                    .build()
                    .unwrap(),
            );
        }
        t.build()
    }

    #[test]
    fn layouts_are_told_apart_by_their_key() {
        use KeyType::{Hash, Range};
        use ScalarAttributeType::{N, S};
        let cases = [
            (
                table(&[(KEY, Hash)], &[(KEY, S)]),
                Some(KeyLayout::SingleKey),
            ),
            (
                table(
                    &[(STREAM, Hash), (SHARD, Range)],
                    &[(STREAM, S), (SHARD, S)],
                ),
                Some(KeyLayout::ByStream),
            ),
            (
                table(
                    &[(SHARD, Range), (STREAM, Hash)],
                    &[(STREAM, S), (SHARD, S)],
                ),
                Some(KeyLayout::ByStream),
            ),
            (table(&[], &[]), Some(KeyLayout::ByStream)),
            (table(&[(KEY, Hash)], &[(KEY, N)]), None),
            (table(&[("id", Hash)], &[("id", S)]), None),
            (table(&[(STREAM, Hash)], &[(STREAM, S)]), None),
            (
                table(
                    &[(SHARD, Hash), (STREAM, Range)],
                    &[(STREAM, S), (SHARD, S)],
                ),
                None,
            ),
            (
                table(
                    &[(STREAM, Hash), (SHARD, Range)],
                    &[(STREAM, S), (SHARD, N)],
                ),
                None,
            ),
        ];
        for (description, expected) in cases {
            assert_eq!(KeyLayout::of(&description), expected, "{description:?}");
        }
    }

    #[test]
    fn keys_name_stream_and_shard() {
        let by_stream = KeyLayout::ByStream.key("s", "shardId-1");
        assert_eq!(by_stream[STREAM], AttributeValue::S("s".into()));
        assert_eq!(by_stream[SHARD], AttributeValue::S("shardId-1".into()));
        let single = KeyLayout::SingleKey.key("s", "shardId-1");
        assert_eq!(single.len(), 1);
        assert_eq!(single[KEY], AttributeValue::S("s#shardId-1".into()));
    }
}
