//! One Kinesis record, as the reader hands it on.
//!
//! [`Record`] owns its payload ([`Bytes`], so clones share it) and its metadata (shared
//! strings), so a clone of a record allocates nothing: a delivery keeps one for its
//! redelivery. The reader moves the SDK's buffers into it without copying the payload.

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;

/// A record read from one shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    data: Bytes,
    partition_key: Arc<str>,
    sequence_number: Arc<str>,
    shard_id: Arc<str>,
    approximate_arrival: Option<SystemTime>,
    millis_behind_latest: Option<u64>,
}

impl Record {
    /// Builds a record. The reader makes these; tests and in-memory pipelines may too.
    #[must_use]
    pub fn new(
        shard_id: Arc<str>,
        sequence_number: impl Into<Arc<str>>,
        partition_key: impl Into<Arc<str>>,
        data: impl Into<Bytes>,
        approximate_arrival: Option<SystemTime>,
    ) -> Self {
        Self {
            data: data.into(),
            partition_key: partition_key.into(),
            sequence_number: sequence_number.into(),
            shard_id,
            approximate_arrival,
            millis_behind_latest: None,
        }
    }

    /// Sets how far behind the shard's tip the read that returned this record was.
    #[must_use]
    pub fn with_millis_behind_latest(mut self, millis: Option<u64>) -> Self {
        self.millis_behind_latest = millis;
        self
    }

    /// The payload.
    #[must_use]
    pub fn data(&self) -> &Bytes {
        &self.data
    }

    /// Takes the payload out of the record.
    #[must_use]
    pub fn into_data(self) -> Bytes {
        self.data
    }

    /// The partition key the producer gave.
    #[must_use]
    pub fn partition_key(&self) -> &str {
        &self.partition_key
    }

    /// The record's sequence number, unique within its stream and increasing within its shard.
    #[must_use]
    pub fn sequence_number(&self) -> &str {
        &self.sequence_number
    }

    /// The sequence number as a shared string (no allocation to clone).
    #[must_use]
    pub fn sequence_number_shared(&self) -> &Arc<str> {
        &self.sequence_number
    }

    /// The id of the shard the record was read from.
    #[must_use]
    pub fn shard_id(&self) -> &str {
        &self.shard_id
    }

    /// The shard id as a shared string (no allocation to clone).
    #[must_use]
    pub fn shard_id_shared(&self) -> &Arc<str> {
        &self.shard_id
    }

    /// When the service accepted the record, by its own clock.
    #[must_use]
    pub fn approximate_arrival(&self) -> Option<SystemTime> {
        self.approximate_arrival
    }

    /// How far behind the tip of its shard the read that returned this record was
    /// (`MillisBehindLatest` of that GetRecords answer).
    #[must_use]
    pub fn millis_behind_latest(&self) -> Option<u64> {
        self.millis_behind_latest
    }
}

/// Compares two sequence numbers of one shard by their numeric value.
///
/// Sequence numbers are decimal strings too long for any integer type; a longer one (without
/// leading zeros) is larger, and equal lengths compare digit by digit.
#[must_use]
pub(crate) fn cmp_sequence(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_numbers_compare_numerically() {
        assert_eq!(cmp_sequence("9", "10"), Ordering::Less);
        assert_eq!(cmp_sequence("0010", "10"), Ordering::Equal);
        assert_eq!(
            cmp_sequence(
                "49590338271490256608559692538361571095921575989136588898",
                "49590338271490256608559692538361571095921575989136588899"
            ),
            Ordering::Less
        );
    }
}
