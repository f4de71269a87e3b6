//! What goes out ([`OutgoingRecord`]), what comes back ([`Published`]), and the checks made
//! before anything is sent.

use bytes::Bytes;

use super::settings::{MAX_PARTITION_KEY_CHARS, MAX_RECORD_BYTES};
use crate::api::PutRecordsEntry;
use crate::error::KinesisError;

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
    /// A decimal hash key (0 to 2^128 - 1) that picks the shard instead of the key's MD5.
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

    /// The PutRecords entry for this record.
    pub(crate) fn to_entry(&self) -> PutRecordsEntry {
        PutRecordsEntry {
            data: self.data.clone(),
            partition_key: self.partition_key.clone(),
            explicit_hash_key: self.explicit_hash_key.clone(),
        }
    }

    /// Checks the record against the service's limits; returns its size.
    pub(crate) fn check(&self, stream: &str, index: usize) -> Result<usize, KinesisError> {
        let size = self.size();
        let refuse = |reason: String| KinesisError::InvalidRecord {
            stream: stream.to_owned(),
            index,
            partition_key: self.partition_key.clone(),
            size,
            reason,
        };
        let key_chars = self.partition_key.chars().count();
        if key_chars == 0 {
            return Err(refuse(format!(
                "the partition key is empty; Kinesis needs 1 to {MAX_PARTITION_KEY_CHARS} \
                 characters (use the id of the entity the record is about)"
            )));
        }
        if key_chars > MAX_PARTITION_KEY_CHARS {
            return Err(refuse(format!(
                "the partition key has {key_chars} characters; Kinesis takes at most \
                 {MAX_PARTITION_KEY_CHARS} (shorten it, e.g. to a hash of the long key)"
            )));
        }
        if size > MAX_RECORD_BYTES {
            return Err(refuse(format!(
                "the data ({} bytes) and the partition key ({} bytes) take {size} bytes; \
                 Kinesis takes at most {MAX_RECORD_BYTES} (1 MiB) per record (split the \
                 payload, or store it elsewhere and publish a reference)",
                self.data.len(),
                self.partition_key.len()
            )));
        }
        if let Some(hash_key) = &self.explicit_hash_key
            && !is_hash_key(hash_key)
        {
            return Err(refuse(format!(
                "the explicit hash key `{hash_key}` is not a decimal number from 0 to 2^128 - 1"
            )));
        }
        Ok(size)
    }
}

/// Where a record was stored.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Published {
    /// The shard it landed on.
    pub shard_id: String,
    /// Its sequence number in that shard.
    pub sequence_number: String,
}

/// Whether `text` is a decimal 128-bit hash key.
fn is_hash_key(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && text.parse::<u128>().is_ok()
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

    fn refused(record: &OutgoingRecord) -> String {
        match record.check("orders", 3) {
            Err(e @ KinesisError::InvalidRecord { .. }) => e.to_string(),
            other => panic!("expected InvalidRecord, got {other:?}"),
        }
    }

    #[test]
    fn records_at_the_limits_pass() {
        let key = "k".repeat(MAX_PARTITION_KEY_CHARS);
        let data = vec![0u8; MAX_RECORD_BYTES - key.len()];
        let record = OutgoingRecord::new(key, data);
        assert_eq!(record.check("orders", 0).unwrap(), MAX_RECORD_BYTES);
        // 256 characters, not bytes: a key of 256 two-byte characters passes.
        let wide = OutgoingRecord::new("é".repeat(MAX_PARTITION_KEY_CHARS), "x");
        assert!(wide.check("orders", 0).is_ok());
        let pinned = OutgoingRecord::new("k", "x")
            .with_explicit_hash_key("340282366920938463463374607431768211455");
        assert!(pinned.check("orders", 0).is_ok());
    }

    #[test]
    fn records_past_the_limits_are_refused_with_stream_key_and_size() {
        let message = refused(&OutgoingRecord::new("big", vec![0u8; MAX_RECORD_BYTES - 2]));
        assert!(message.contains("record 3"), "{message}");
        assert!(message.contains("`orders`"), "{message}");
        assert!(message.contains("`big`"), "{message}");
        assert!(message.contains("1048577 bytes"), "{message}");
        assert!(message.contains("1 MiB"), "{message}");

        let message = refused(&OutgoingRecord::new("", "x"));
        assert!(message.contains("partition key is empty"), "{message}");

        let message = refused(&OutgoingRecord::new("k".repeat(257), "x"));
        assert!(message.contains("257 characters"), "{message}");
        assert!(message.contains("at most 256"), "{message}");

        for bad in [
            "",
            "-1",
            "+1",
            "1e3",
            "340282366920938463463374607431768211456",
        ] {
            let message = refused(&OutgoingRecord::new("k", "x").with_explicit_hash_key(bad));
            assert!(message.contains("explicit hash key"), "{bad}: {message}");
        }
    }

    #[test]
    fn long_keys_are_cut_in_messages() {
        assert_eq!(quote_key("abc"), "`abc`");
        let quoted = quote_key(&"x".repeat(300));
        assert!(quoted.ends_with("…` (300 characters)"), "{quoted}");
        assert!(quoted.len() < 100);
    }
}
