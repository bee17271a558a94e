//! Tensors that stay resident in the receive slab after they were pushed.
//!
//! A resident entry serves later reserves of the same `mm_hash` as cache hits (a lease per
//! READY record) and local reloads after encoder-cache eviction. An entry is *pinned* while
//! the encoder cache references it and *leased* while READY records point at it; only an
//! unpinned, unleased entry can be evicted, least recently retired first.

use super::dtype::DType;
use super::slab::View;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Handle of a resident entry.
pub type EntryId = u64;

/// One resident tensor.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Content hash the entry serves.
    pub mm_hash: Arc<str>,
    /// Where it lives.
    pub view: View,
    /// Its shape.
    pub shape: Box<[u64]>,
    /// Its element type.
    pub dtype: DType,
    /// READY records borrowing it.
    pub leases: u32,
    /// Referenced by the encoder cache: not evictable.
    pub pinned: bool,
    /// Eviction order: lower was retired earlier.
    retired_seq: u64,
    /// Replaced by a newer entry of the same hash; freed when the last user lets go.
    displaced: bool,
}

/// The resident entries of one slab. Returned [`View`]s are memory the caller must free.
#[derive(Clone, Debug, Default)]
pub struct ResidentPool {
    entries: BTreeMap<EntryId, Entry>,
    by_hash: BTreeMap<Arc<str>, EntryId>,
    next_id: EntryId,
    next_retire: u64,
}

impl ResidentPool {
    /// The current entry serving `mm_hash`.
    pub fn lookup(&self, mm_hash: &str) -> Option<(EntryId, &Entry)> {
        let id = *self.by_hash.get(mm_hash)?;
        self.entries.get(&id).map(|e| (id, e))
    }

    /// An entry by handle.
    pub fn get(&self, id: EntryId) -> Option<&Entry> {
        self.entries.get(&id)
    }

    /// All entries, current and displaced.
    pub fn entries(&self) -> impl Iterator<Item = (EntryId, &Entry)> {
        self.entries.iter().map(|(&id, e)| (id, e))
    }

    /// Makes `view` the resident copy of `mm_hash`, displacing any older copy. Returns the
    /// new handle and memory released by the displacement.
    pub fn publish(
        &mut self,
        mm_hash: Arc<str>,
        view: View,
        shape: Box<[u64]>,
        dtype: DType,
        pinned: bool,
    ) -> (EntryId, Option<View>) {
        let id = self.next_id;
        self.next_id += 1;
        let retired_seq = self.bump_retire();
        let mut released = None;
        if let Some(old) = self.by_hash.insert(mm_hash.clone(), id) {
            if let Some(e) = self.entries.get_mut(&old) {
                e.displaced = true;
            }
            released = self.collect(old);
        }
        self.entries
            .insert(id, Entry { mm_hash, view, shape, dtype, leases: 0, pinned, retired_seq, displaced: false });
        (id, released)
    }

    /// Adds a lease on `id`.
    pub fn lease(&mut self, id: EntryId) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.leases += 1;
        }
    }

    /// Drops a lease; returns memory if that was the last user of a displaced entry.
    pub fn release(&mut self, id: EntryId) -> Option<View> {
        let e = self.entries.get_mut(&id)?;
        e.leases = e.leases.saturating_sub(1);
        if e.leases == 0 && !e.pinned {
            e.retired_seq = self.next_retire;
            self.next_retire += 1;
        }
        self.collect(id)
    }

    /// Turns a lease into an encoder-cache reference (`take` of a leased record).
    pub fn pin_from_lease(&mut self, id: EntryId) {
        if let Some(e) = self.entries.get_mut(&id) {
            e.leases = e.leases.saturating_sub(1);
            e.pinned = true;
        }
    }

    /// The encoder cache no longer references `mm_hash`: its entries become evictable.
    pub fn retire(&mut self, mm_hash: &str) -> Vec<View> {
        let ids: Vec<EntryId> =
            self.entries.iter().filter(|(_, e)| &*e.mm_hash == mm_hash && e.pinned).map(|(&id, _)| id).collect();
        let mut released = Vec::new();
        for id in ids {
            let seq = self.bump_retire();
            if let Some(e) = self.entries.get_mut(&id) {
                e.pinned = false;
                e.retired_seq = seq;
            }
            released.extend(self.collect(id));
        }
        released
    }

    /// Evicts the least recently retired evictable entry; returns its hash and memory.
    pub fn evict_one(&mut self) -> Option<(Arc<str>, View)> {
        let (&id, _) = self
            .entries
            .iter()
            .filter(|(_, e)| !e.pinned && e.leases == 0 && !e.displaced)
            .min_by_key(|(_, e)| e.retired_seq)?;
        let e = self.entries.remove(&id)?;
        self.by_hash.remove(&e.mm_hash);
        Some((e.mm_hash, e.view))
    }

    fn bump_retire(&mut self) -> u64 {
        let seq = self.next_retire;
        self.next_retire += 1;
        seq
    }

    /// Removes a displaced entry nobody uses any more.
    fn collect(&mut self, id: EntryId) -> Option<View> {
        let e = self.entries.get(&id)?;
        if e.displaced && e.leases == 0 && !e.pinned {
            return self.entries.remove(&id).map(|e| e.view);
        }
        None
    }
}
