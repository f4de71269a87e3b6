//! Which shard a user record belongs to: its effective hash key against a shard's range.

use md5::{Digest, Md5};

/// The hash keys a shard takes, both ends included (ListShards' `HashKeyRange`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HashRange {
    start: u128,
    end: u128,
}

impl HashRange {
    /// The range from ListShards' decimal strings; `None` when either does not parse.
    pub(crate) fn parse(start: &str, end: &str) -> Option<Self> {
        Some(Self {
            start: start.parse().ok()?,
            end: end.parse().ok()?,
        })
    }

    /// True when the user record with `partition_key` and `explicit_hash_key` belongs to the
    /// shard. A hash key that does not parse counts as belonging: it cannot say otherwise.
    pub(crate) fn contains(&self, partition_key: &str, explicit_hash_key: Option<&str>) -> bool {
        effective_hash_key(partition_key, explicit_hash_key)
            .is_none_or(|key| (self.start..=self.end).contains(&key))
    }
}

/// The hash key the service places a record by: its explicit hash key, else the MD5 of its
/// partition key read as a 128-bit big-endian number.
pub(crate) fn effective_hash_key(
    partition_key: &str,
    explicit_hash_key: Option<&str>,
) -> Option<u128> {
    match explicit_hash_key {
        Some(key) => key.parse().ok(),
        None => Some(u128::from_be_bytes(
            Md5::digest(partition_key.as_bytes()).into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_belongs_where_its_hash_key_falls() {
        let lower = HashRange::parse("0", "170141183460469231731687303715884105727").unwrap();
        let upper = HashRange::parse(
            "170141183460469231731687303715884105728",
            "340282366920938463463374607431768211455",
        )
        .unwrap();
        assert!(lower.contains("any", Some("5")));
        assert!(!upper.contains("any", Some("5")));
        // The MD5 of "a" is 0cc175b9c0f1b6a8..., in the lower half.
        assert!(lower.contains("a", None) && !upper.contains("a", None));
        assert!(
            upper.contains("x", Some("not a number")),
            "unknown counts as belonging"
        );
        assert_eq!(HashRange::parse("1", "x"), None);
    }
}
