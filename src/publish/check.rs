//! The checks a record passes before anything is sent, and its PutRecords entry.

use super::settings::{MAX_PARTITION_KEY_CHARS, MAX_RECORD_BYTES};
use crate::api::PutRecordsEntry;
use crate::error::KinesisError;
use crate::record::OutgoingRecord;

/// The PutRecords entry for `record`.
pub(crate) fn entry(record: &OutgoingRecord) -> PutRecordsEntry {
    PutRecordsEntry {
        data: record.data.clone(),
        partition_key: record.partition_key.clone(),
        explicit_hash_key: record.explicit_hash_key.clone(),
    }
}

/// Checks `record` (the `index`th of a publish to `stream`) against the service's limits;
/// returns its size.
pub(crate) fn check(
    record: &OutgoingRecord,
    stream: &str,
    index: usize,
) -> Result<usize, KinesisError> {
    let size = record.size();
    let refuse = |reason: String| KinesisError::InvalidRecord {
        stream: stream.to_owned(),
        index,
        partition_key: record.partition_key.clone(),
        size,
        reason,
    };
    let key_chars = record.partition_key.chars().count();
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
            record.data.len(),
            record.partition_key.len()
        )));
    }
    if let Some(hash_key) = &record.explicit_hash_key
        && !is_hash_key(hash_key)
    {
        return Err(refuse(format!(
            "the explicit hash key `{hash_key}` is not a decimal number from 0 to 2^128 - 1 \
                 written without leading zeros"
        )));
    }
    Ok(size)
}

/// Whether `text` is a hash key the service takes: it matches `0|([1-9]\d{0,38})` (no sign, no
/// leading zeros, at most 39 digits) and its value is at most `2^128 - 1`. The service refuses
/// the whole PutRecords call over one bad key, so a bad key must never reach it.
fn is_hash_key(text: &str) -> bool {
    let well_formed = text == "0"
        || (matches!(text.as_bytes().first(), Some(b'1'..=b'9'))
            && text.len() <= 39
            && text.bytes().all(|b| b.is_ascii_digit()));
    well_formed && text.parse::<u128>().is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(record: &OutgoingRecord) -> String {
        match check(record, "orders", 3) {
            Err(e @ KinesisError::InvalidRecord { .. }) => e.to_string(),
            other => panic!("expected InvalidRecord, got {other:?}"),
        }
    }

    #[test]
    fn records_at_the_limits_pass() {
        let key = "k".repeat(MAX_PARTITION_KEY_CHARS);
        let data = vec![0u8; MAX_RECORD_BYTES - key.len()];
        let record = OutgoingRecord::new(key, data);
        assert_eq!(check(&record, "orders", 0).unwrap(), MAX_RECORD_BYTES);
        // 256 characters, not bytes: a key of 256 two-byte characters passes.
        let wide = OutgoingRecord::new("é".repeat(MAX_PARTITION_KEY_CHARS), "x");
        assert!(check(&wide, "orders", 0).is_ok());
        let pinned = OutgoingRecord::new("k", "x")
            .with_explicit_hash_key("340282366920938463463374607431768211455");
        assert!(check(&pinned, "orders", 0).is_ok());
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
            "007",
            "00",
            "0000000000000000000000000000000000000001",
            "1000000000000000000000000000000000000000",
            "340282366920938463463374607431768211456",
        ] {
            let message = refused(&OutgoingRecord::new("k", "x").with_explicit_hash_key(bad));
            assert!(message.contains("explicit hash key"), "{bad}: {message}");
        }
    }
}
