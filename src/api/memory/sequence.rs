//! Sequence numbers: 56-digit decimal strings, like the service's.
//!
//! Layout, most significant digit first:
//!
//! | digits | what |
//! |---|---|
//! | 2 | the constant `49` |
//! | 6 | the stream's number within its [`MemoryKinesis`](super::MemoryKinesis) |
//! | 12 | the shard's number (the digits of its id) |
//! | 16 | check digits (from the MD5 of the 20 digits before them) |
//! | 20 | the record's position in its shard, counted from the shard's first record ever |
//!
//! So within a shard the numbers strictly increase with the position, every number is unique
//! within its stream, all have the same length (so they also compare as strings), a number
//! names the stream and shard it came from, and a number with a mistyped stream or shard does
//! not parse. A child shard has a larger number than its parents, so its records' numbers are
//! larger too, as on the service (where they grow with time).

use md5::{Digest, Md5};

/// The length of every sequence number.
pub(crate) const SEQUENCE_LEN: usize = 56;

/// The largest stream number the layout holds.
pub(crate) const MAX_STREAM_NUMBER: u64 = 999_999;

/// The position used for the synthetic ending sequence number of a closed, empty shard. No
/// record is ever stored there.
pub(crate) const END_POSITION: u64 = u64::MAX;

const PREFIX: &str = "49";
const CHECK_MODULUS: u64 = 10_000_000_000_000_000;

/// What a sequence number names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SequenceParts {
    /// The stream's number.
    pub(crate) stream: u64,
    /// The shard's number.
    pub(crate) shard: u64,
    /// The record's position in the shard.
    pub(crate) position: u64,
}

fn check_digits(body: &str) -> u64 {
    let digest: [u8; 16] = Md5::digest(body.as_bytes()).into();
    let mut high = [0_u8; 8];
    high.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(high) % CHECK_MODULUS
}

/// The sequence number of the record at `position` of shard `shard` in stream `stream`.
pub(crate) fn encode(stream: u64, shard: u64, position: u64) -> String {
    let owner = format!("{PREFIX}{stream:06}{shard:012}");
    let check = check_digits(&owner);
    format!("{owner}{check:016}{position:020}")
}

/// Reads a sequence number back, or `None` when it is not one this store issues.
pub(crate) fn decode(text: &str) -> Option<SequenceParts> {
    if text.len() != SEQUENCE_LEN
        || !text.bytes().all(|b| b.is_ascii_digit())
        || !text.starts_with(PREFIX)
    {
        return None;
    }
    let (owner, rest) = text.split_at(20);
    let (check, position) = rest.split_at(16);
    if check.parse::<u64>().ok()? != check_digits(owner) {
        return None;
    }
    Some(SequenceParts {
        stream: owner[2..8].parse().ok()?,
        shard: owner[8..20].parse().ok()?,
        position: position.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::cmp_sequence;
    use std::cmp::Ordering;

    #[test]
    fn round_trips_and_orders() {
        let a = encode(1, 0, 0);
        let b = encode(1, 0, 1);
        let c = encode(1, 0, 10_000);
        assert_eq!(a.len(), SEQUENCE_LEN);
        assert_eq!(cmp_sequence(&a, &b), Ordering::Less);
        assert_eq!(cmp_sequence(&b, &c), Ordering::Less);
        assert!(b < c, "equal lengths compare as strings too");
        assert_eq!(
            decode(&c),
            Some(SequenceParts {
                stream: 1,
                shard: 0,
                position: 10_000
            })
        );
        let end = encode(MAX_STREAM_NUMBER, 999_999_999_999, END_POSITION);
        assert_eq!(end.len(), SEQUENCE_LEN);
        assert_eq!(decode(&end).map(|p| p.position), Some(END_POSITION));
        // Other shards differ.
        assert_ne!(encode(1, 1, 0), a);
    }

    #[test]
    fn rejects_what_it_did_not_issue() {
        let good = encode(3, 2, 7);
        // A mistyped shard digit breaks the check digits.
        let mut bad = good.clone().into_bytes();
        bad[19] = if bad[19] == b'2' { b'1' } else { b'2' };
        assert_eq!(decode(&String::from_utf8(bad).unwrap_or_default()), None);
        assert_eq!(decode("12"), None);
        assert_eq!(decode(&good[1..]), None);
        assert_eq!(decode(&format!("x{}", &good[1..])), None);
        assert_eq!(
            decode("49590338271490256608559692538361571095921575989136588898"),
            None
        );
        // An overflowing position does not parse.
        let mut huge = good[..36].to_owned();
        huge.push_str("99999999999999999999");
        assert_eq!(decode(&huge), None);
        // The last digits count the records of the shard.
        assert!(encode(1, 0, 123_456).ends_with("123456"));
    }
}
