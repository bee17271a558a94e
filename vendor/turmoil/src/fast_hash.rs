//! ctlplane patch: a cheap hasher for the maps a step looks up many times (hosts,
//! runtimes, links, TCP sockets), all keyed by addresses. SipHash's resistance to chosen
//! keys buys nothing in a simulation and cost about a tenth of a step. `IndexMap` iterates
//! in insertion order whatever the hasher, so no order changes.

use std::hash::{BuildHasherDefault, Hasher};

use indexmap::IndexMap;

/// An `IndexMap` with [`FastHasher`].
pub(crate) type FastMap<K, V> = IndexMap<K, V, BuildHasherDefault<FastHasher>>;

/// Multiply-rotate hashing in the style of rustc's `FxHasher`.
#[derive(Default, Clone, Copy)]
pub(crate) struct FastHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = self.0.wrapping_add(word).wrapping_mul(K);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{IpAddr, Ipv4Addr};

    #[test]
    fn distinct_addresses_map_apart() {
        let mut map: FastMap<IpAddr, usize> = FastMap::default();
        for i in 0..=255u8 {
            map.insert(IpAddr::V4(Ipv4Addr::new(192, 168, 0, i)), usize::from(i));
        }
        for i in 0..=255u8 {
            assert_eq!(map.get(&IpAddr::V4(Ipv4Addr::new(192, 168, 0, i))), Some(&usize::from(i)));
        }
        assert_eq!(map.keys().next(), Some(&IpAddr::V4(Ipv4Addr::new(192, 168, 0, 0))));
    }
}
