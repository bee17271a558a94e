//! The hasher of the book's lookup maps: SipHash keyed from the book's injected RNG.
//!
//! The maps are keyed by ids a client chooses, so a fixed hash function would let a
//! hostile client make every id collide. The key comes from the RNG the driver hands the
//! shard (the OS CSPRNG in production, the run seed in the simulator), never from ambient
//! randomness, so a simulated run stays a function of its seed. Map order never reaches
//! an output either way: every walk sorts first.

use rand_core::RngCore;
use std::collections::hash_map::DefaultHasher;
use std::hash::{BuildHasher, Hasher};

/// Builds SipHash hashers whose state starts from a secret 128-bit key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyedHash {
    k0: u64,
    k1: u64,
}

impl KeyedHash {
    /// A key drawn from `rng`.
    pub(crate) fn from_rng(rng: &mut impl RngCore) -> Self {
        KeyedHash { k0: rng.next_u64(), k1: rng.next_u64() }
    }
}

impl Default for KeyedHash {
    /// A fixed key, for maps no client fills (tests, scratch indexes).
    fn default() -> Self {
        KeyedHash { k0: 0x243f_6a88_85a3_08d3, k1: 0x1319_8a2e_0370_7344 }
    }
}

impl BuildHasher for KeyedHash {
    type Hasher = DefaultHasher;

    fn build_hasher(&self) -> DefaultHasher {
        let mut h = DefaultHasher::new();
        h.write_u64(self.k0);
        h.write_u64(self.k1);
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;

    #[test]
    fn the_key_changes_the_hash_and_the_same_key_repeats_it() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let a = KeyedHash::from_rng(&mut rng);
        let b = KeyedHash::from_rng(&mut rng);
        assert_eq!(a.hash_one(42u64), a.hash_one(42u64));
        assert_ne!(a.hash_one(42u64), b.hash_one(42u64));
    }
}
