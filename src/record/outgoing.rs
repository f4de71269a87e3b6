//! What goes out ([`OutgoingRecord`]) and what comes back ([`Published`]). Plain data: the
//! checks made before anything is sent are in `check.rs`.

use bytes::Bytes;

/// One record to publish.
///
/// ```
/// use kinesis_dataflow::publish::OutgoingRecord;
///
/// let record = OutgoingRecord::new("customer-7", "order placed");
/// assert_eq!(record.size(), "customer-7".len() + "order placed".len());
///
/// // Pin the record to the shard holding hash key 0, whatever its partition key hashes to.
/// let pinned = OutgoingRecord::new("customer-7", "x").with_explicit_hash_key("0");
/// assert_eq!(pinned.explicit_hash_key.as_deref(), Some("0"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingRecord {
    /// The partition key: 1 to 256 Unicode characters. Its MD5 picks the shard, and the
    /// publisher keeps the records of one key in order (see the [module docs](super)).
    pub partition_key: String,
    /// The payload. Together with the partition key's UTF-8 bytes at most 1 MiB.
    pub data: Bytes,
    /// A decimal hash key (0 to 2^128 - 1, without leading zeros, as the service takes it)
    /// that picks the shard instead of the key's MD5.
    pub explicit_hash_key: Option<String>,
}

impl OutgoingRecord {
    /// A record of `data` under `partition_key`.
    #[must_use]
    pub fn new(partition_key: impl Into<String>, data: impl Into<Bytes>) -> Self {
        Self {
            partition_key: partition_key.into(),
            data: data.into(),
            explicit_hash_key: None,
        }
    }

    /// Routes the record by `hash_key` (decimal) instead of its partition key's MD5.
    #[must_use]
    pub fn with_explicit_hash_key(mut self, hash_key: impl Into<String>) -> Self {
        self.explicit_hash_key = Some(hash_key.into());
        self
    }

    /// The size the service counts against its limits: data plus the partition key's UTF-8
    /// bytes (the explicit hash key does not count).
    #[must_use]
    pub fn size(&self) -> usize {
        self.data.len() + self.partition_key.len()
    }
}

/// Where a record was stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Published {
    /// The shard it landed on.
    pub shard_id: String,
    /// Its sequence number in that shard.
    pub sequence_number: String,
    /// For a user record put inside a KPL aggregate (see
    /// [`Publisher::aggregate`](crate::publish::Publisher::aggregate)), its place in the aggregate,
    /// from 0: the aggregate's sequence number and this number order it among the shard's
    /// records, as a reader reports them ([`Record::sub_sequence_number`]). `None` for a
    /// record put as it is.
    ///
    /// [`Record::sub_sequence_number`]: crate::Record::sub_sequence_number
    pub sub_sequence_number: Option<u64>,
}

/// A partition key for a message: quoted, and cut to its first 64 characters (with the full
/// count) when longer.
#[must_use]
pub(crate) fn quote_key(key: &str) -> String {
    const SHOWN: usize = 64;
    let chars = key.chars().count();
    if chars <= SHOWN {
        format!("`{key}`")
    } else {
        let head: String = key.chars().take(SHOWN).collect();
        format!("`{head}…` ({chars} characters)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_keys_are_cut_in_messages() {
        assert_eq!(quote_key("abc"), "`abc`");
        let quoted = quote_key(&"x".repeat(300));
        assert!(quoted.ends_with("…` (300 characters)"), "{quoted}");
        assert!(quoted.len() < 100);
    }
}
