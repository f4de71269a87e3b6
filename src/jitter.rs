//! Spreading in time: a small seeded generator for retry jitter, and a stable seed from a
//! name, so instances and shards that start together do not act in lockstep.

/// A xorshift64* generator: enough randomness to spread retries, no `rand` dependency.
#[derive(Debug, Clone)]
pub(crate) struct Jitter(u64);

impl Jitter {
    /// A generator seeded from `seed` (any value, zero included).
    pub(crate) fn new(seed: u64) -> Self {
        // splitmix64 scrambles close seeds apart; xorshift needs a non-zero state.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Self(if z == 0 { 0x2545_F491_4F6C_DD1D } else { z })
    }

    /// The next pseudo-random value.
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A value that differs from run to run and call to call (the standard library's randomly
/// keyed hasher over the current time): for ids that must not repeat across starts.
pub(crate) fn unpredictable() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    hasher.finish()
}

/// FNV-1a of `text`: a stable seed from a name.
pub(crate) fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xCBF2_9CE4_8422_2325, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01B3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_seed_still_yields_a_full_sequence() {
        let mut jitter = Jitter::new(0);
        let values: std::collections::HashSet<u64> = (0..100).map(|_| jitter.next()).collect();
        assert_eq!(values.len(), 100);
    }

    #[test]
    fn the_seed_of_a_name_is_stable_and_tells_names_apart() {
        assert_eq!(fnv1a("shardId-000000000000"), fnv1a("shardId-000000000000"));
        assert_ne!(fnv1a("shardId-000000000000"), fnv1a("shardId-000000000001"));
        assert_eq!(fnv1a(""), 0xCBF2_9CE4_8422_2325);
    }
}
