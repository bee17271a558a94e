//! WRITING writers by `mm_hash` fingerprint, for followers to find the writer they join.
//!
//! One hash lookup per operation instead of a B-tree walk. Writers sharing a fingerprint
//! (a collision, or hashes a caller made to collide) are kept sorted by transfer id, so a
//! lookup sees them in the same order whatever the map's hashing does; nothing iterates
//! the map itself except [`WriterIndex::sorted`], which sorts.

use super::ids::TransferId;
use super::keyed_hash::KeyedHash;
use std::collections::HashMap;

/// The writers of one fingerprint; almost always exactly one.
#[derive(Clone, Debug)]
enum Bucket {
    One(TransferId),
    /// Two or more, sorted.
    Many(Vec<TransferId>),
}

/// The index: fingerprint -> writers.
#[derive(Clone, Debug, Default)]
pub(crate) struct WriterIndex {
    map: HashMap<u64, Bucket, KeyedHash>,
}

impl WriterIndex {
    /// An empty index whose map hashes with `hash`.
    pub(crate) fn with_hasher(hash: KeyedHash) -> Self {
        WriterIndex { map: HashMap::with_hasher(hash) }
    }
}

impl WriterIndex {
    /// Adds `tid` under `fp` (once).
    pub(crate) fn insert(&mut self, fp: u64, tid: TransferId) {
        match self.map.get_mut(&fp) {
            None => {
                self.map.insert(fp, Bucket::One(tid));
            }
            Some(Bucket::One(t)) => {
                if *t != tid {
                    let mut v = vec![t.clone(), tid];
                    v.sort();
                    self.map.insert(fp, Bucket::Many(v));
                }
            }
            Some(Bucket::Many(v)) => {
                if let Err(at) = v.binary_search(&tid) {
                    v.insert(at, tid);
                }
            }
        }
    }

    /// Removes `tid` from under `fp`, if it is there.
    pub(crate) fn remove(&mut self, fp: u64, tid: &TransferId) {
        match self.map.get_mut(&fp) {
            Some(Bucket::One(t)) if t == tid => {
                self.map.remove(&fp);
            }
            Some(Bucket::Many(v)) => {
                if let Ok(at) = v.binary_search(tid) {
                    v.remove(at);
                }
                if v.len() == 1 {
                    let last = v.pop();
                    if let Some(last) = last {
                        self.map.insert(fp, Bucket::One(last));
                    }
                }
            }
            _ => {}
        }
    }

    /// The writers under `fp`, sorted by transfer id.
    pub(crate) fn candidates(&self, fp: u64) -> &[TransferId] {
        match self.map.get(&fp) {
            None => &[],
            Some(Bucket::One(t)) => std::slice::from_ref(t),
            Some(Bucket::Many(v)) => v,
        }
    }

    /// Every `(fingerprint, writer)`, sorted (for invariant checks).
    pub(crate) fn sorted(&self) -> Vec<(u64, &TransferId)> {
        let mut all: Vec<(u64, &TransferId)> =
            self.map.iter().flat_map(|(fp, b)| Self::bucket_ids(b).iter().map(move |t| (*fp, t))).collect();
        all.sort();
        all
    }

    fn bucket_ids(b: &Bucket) -> &[TransferId] {
        match b {
            Bucket::One(t) => std::slice::from_ref(t),
            Bucket::Many(v) => v,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colliding_writers_stay_sorted_and_come_and_go() {
        let mut idx = WriterIndex::default();
        let (a, b, c) = (TransferId::new("a"), TransferId::new("b"), TransferId::new("c"));
        idx.insert(7, c.clone());
        idx.insert(7, a.clone());
        idx.insert(7, b.clone());
        idx.insert(7, a.clone());
        idx.insert(9, b.clone());
        assert_eq!(idx.candidates(7), [a.clone(), b.clone(), c.clone()]);
        assert_eq!(idx.sorted(), vec![(7, &a), (7, &b), (7, &c), (9, &b)]);
        idx.remove(7, &b);
        idx.remove(7, &a);
        assert_eq!(idx.candidates(7), std::slice::from_ref(&c));
        idx.remove(7, &a);
        idx.remove(7, &c);
        assert!(idx.candidates(7).is_empty());
        idx.remove(9, &a);
        assert_eq!(idx.candidates(9), [b]);
    }
}
