//! The hasher of the book's lookup maps: a folded-multiply hash keyed from the book's
//! injected RNG.
//!
//! The maps are keyed by ids a client chooses, so a fixed hash function would let a
//! hostile client make every id collide. The key comes from the RNG the driver hands the
//! shard (the OS CSPRNG in production, the run seed in the simulator), never from ambient
//! randomness, so a simulated run stays a function of its seed. Map order never reaches
//! an output either way: every walk sorts first.
//!
//! The mixing is the folded 64x64->128 multiply of foldhash and wyhash: every word is
//! XORed with a secret before the multiply, so without the key an attacker cannot aim
//! ids at one bucket. The book hashes a 16-byte transfer id or a `u64` fingerprint on
//! every step; this costs a few multiplies where SipHash-1-3 cost ~450 instructions.

use rand_core::RngCore;
use std::hash::{BuildHasher, Hasher};

/// Builds [`KeyedHasher`]s from a secret 128-bit key.
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
    type Hasher = KeyedHasher;

    #[inline]
    fn build_hasher(&self) -> KeyedHasher {
        KeyedHasher { acc: self.k0, key: self.k1 }
    }
}

/// Odd constants (digits of pi) that keep one key from serving every position.
const P0: u64 = 0xa409_3822_299f_31d0;
const P1: u64 = 0x082e_fa98_ec4e_6c89;

/// The high and low halves of the 128-bit product, XORed: every input bit reaches
/// every output bit.
#[inline(always)]
fn folded_multiply(x: u64, y: u64) -> u64 {
    let full = u128::from(x) * u128::from(y);
    (full as u64) ^ ((full >> 64) as u64)
}

/// The state of one hash computation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyedHasher {
    acc: u64,
    key: u64,
}

impl KeyedHasher {
    #[inline(always)]
    fn mix(&mut self, word: u64) {
        self.acc = folded_multiply(self.acc ^ word, self.key ^ P0);
    }
}

impl Hasher for KeyedHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        let mut word = [0u8; 8];
        word[..rest.len()].copy_from_slice(rest);
        // The length goes in with the tail, so "a" and "a\0" differ.
        self.mix(u64::from_le_bytes(word) ^ ((bytes.len() as u64) << 56));
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.mix(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.mix(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.mix(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        folded_multiply(self.acc ^ P1, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_core::SeedableRng;
    use std::collections::HashSet;

    #[test]
    fn the_key_changes_the_hash_and_the_same_key_repeats_it() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
        let a = KeyedHash::from_rng(&mut rng);
        let b = KeyedHash::from_rng(&mut rng);
        assert_eq!(a.hash_one(42u64), a.hash_one(42u64));
        assert_ne!(a.hash_one(42u64), b.hash_one(42u64));
        assert_ne!(a.hash_one(b"a".as_slice()), a.hash_one(b"a\0".as_slice()));
    }

    #[test]
    fn sequential_ids_spread_over_buckets() {
        // hashbrown takes the bucket from the low bits and a tag from the top 7: both
        // must vary over ids that differ in one byte.
        let h = KeyedHash::from_rng(&mut rand_chacha::ChaCha8Rng::seed_from_u64(2));
        let hashes: Vec<u64> = (0u64..4096).map(|i| h.hash_one(i.to_le_bytes())).collect();
        let low: HashSet<u64> = hashes.iter().map(|x| x & 0xfff).collect();
        let top: HashSet<u64> = hashes.iter().map(|x| x >> 57).collect();
        assert!(low.len() > 2400, "{} distinct low-12-bit buckets of 4096", low.len());
        assert_eq!(top.len(), 128);
    }
}
