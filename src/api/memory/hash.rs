//! The 128-bit hash key space: how partition keys map onto it and how shards divide it.
//!
//! Kinesis routes a record by the MD5 digest of its partition key, read as a big-endian
//! unsigned 128-bit integer (or by an explicit hash key given in decimal). Every open shard owns
//! one contiguous, inclusive range of that space, and the open shards together cover all of it.

use md5::{Digest, Md5};

/// An inclusive range of hash keys owned by one shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HashRange {
    /// The first hash key of the range.
    pub(crate) start: u128,
    /// The last hash key of the range (inclusive).
    pub(crate) end: u128,
}

impl HashRange {
    /// Whether `key` falls inside the range.
    pub(crate) fn contains(self, key: u128) -> bool {
        self.start <= key && key <= self.end
    }

    /// Whether `self` and `other` touch without a gap (in either order).
    pub(crate) fn is_adjacent_to(self, other: Self) -> bool {
        self.end.checked_add(1) == Some(other.start) || other.end.checked_add(1) == Some(self.start)
    }

    /// The smallest range covering both `self` and `other`.
    pub(crate) fn union(self, other: Self) -> Self {
        Self {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

/// The hash key of a partition key: its MD5 digest as a big-endian `u128`.
pub(crate) fn hash_of(partition_key: &str) -> u128 {
    let digest: [u8; 16] = Md5::digest(partition_key.as_bytes()).into();
    u128::from_be_bytes(digest)
}

/// Parses a decimal hash key as the service accepts them: the pattern `0|([1-9]\d{0,38})` (no
/// sign, no leading zeros, at most 39 digits) and a value of at most `2^128 - 1`.
pub(crate) fn parse_hash_key(text: &str) -> Option<u128> {
    let well_formed = text == "0"
        || (matches!(text.as_bytes().first(), Some(b'1'..=b'9'))
            && text.len() <= 39
            && text.bytes().all(|b| b.is_ascii_digit()));
    if !well_formed {
        return None;
    }
    text.parse().ok()
}

/// The ranges of a new stream of `count` shards, splitting the space evenly like the service:
/// shard `i` starts at `i * floor(2^128 / count)` and the last shard ends at `2^128 - 1`.
///
/// `count` must be at least 1.
pub(crate) fn even_ranges(count: u32) -> Vec<HashRange> {
    let n = u128::from(count);
    if n <= 1 {
        return vec![HashRange {
            start: 0,
            end: u128::MAX,
        }];
    }
    // floor(2^128 / n), computed without overflowing: (MAX + 1) / n.
    let step = u128::MAX / n + u128::from(u128::MAX % n == n - 1);
    (0..n)
        .map(|i| {
            let start = i * step;
            let end = if i + 1 == n {
                u128::MAX
            } else {
                (i + 1) * step - 1
            };
            HashRange { start, end }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_ranges_match_the_service() {
        let one = even_ranges(1);
        assert_eq!(
            one,
            vec![HashRange {
                start: 0,
                end: u128::MAX
            }]
        );

        let two = even_ranges(2);
        assert_eq!(
            two[0].end,
            170_141_183_460_469_231_731_687_303_715_884_105_727
        );
        assert_eq!(
            two[1].start,
            170_141_183_460_469_231_731_687_303_715_884_105_728
        );
        assert_eq!(two[1].end, u128::MAX);

        let three = even_ranges(3);
        assert_eq!(
            three[0].end,
            113_427_455_640_312_821_154_458_202_477_256_070_484
        );
        assert_eq!(
            three[1].start,
            113_427_455_640_312_821_154_458_202_477_256_070_485
        );
        assert_eq!(
            three[2].start,
            226_854_911_280_625_642_308_916_404_954_512_140_970
        );

        for count in [1, 2, 3, 4, 5, 7, 10, 64, 1000] {
            let ranges = even_ranges(count);
            assert_eq!(ranges.len(), count as usize);
            assert_eq!(ranges[0].start, 0);
            assert_eq!(ranges.last().map(|r| r.end), Some(u128::MAX));
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].end + 1, pair[1].start);
                assert!(pair[0].is_adjacent_to(pair[1]));
            }
        }
    }

    #[test]
    fn hash_is_md5_big_endian() {
        // MD5("") = d41d8cd98f00b204e9800998ecf8427e
        assert_eq!(hash_of(""), 0xd41d_8cd9_8f00_b204_e980_0998_ecf8_427e);
        assert_eq!(hash_of("key-1"), hash_of("key-1"));
        assert_ne!(hash_of("key-1"), hash_of("key-2"));
    }

    #[test]
    fn hash_keys_parse_as_decimal_only() {
        assert_eq!(parse_hash_key("0"), Some(0));
        assert_eq!(
            parse_hash_key("340282366920938463463374607431768211455"),
            Some(u128::MAX)
        );
        assert_eq!(
            parse_hash_key("340282366920938463463374607431768211456"),
            None
        );
        assert_eq!(parse_hash_key("+1"), None);
        assert_eq!(parse_hash_key("-1"), None);
        assert_eq!(parse_hash_key(""), None);
        assert_eq!(parse_hash_key("0x10"), None);
        assert_eq!(parse_hash_key("007"), None);
        assert_eq!(parse_hash_key("00"), None);
        assert_eq!(
            parse_hash_key("0000000000000000000000000000000000000001"),
            None
        );
    }
}
