//! Interned tensor shapes.
//!
//! Every reservation has a shape, but a model pushes a handful of distinct ones; keeping
//! each once (reference-counted) instead of once per record is a large part of what
//! keeps a live reservation small.

use std::collections::BTreeMap;

/// Handle of an interned shape.
pub type ShapeId = u32;

/// Distinct shapes in use, with a count of the records holding each.
#[derive(Clone, Debug, Default)]
pub struct ShapeTable {
    ids: BTreeMap<Box<[u64]>, ShapeId>,
    entries: Vec<Option<(Box<[u64]>, u32)>>,
    free: Vec<ShapeId>,
}

impl ShapeTable {
    /// A reference to `shape`, interning it if new.
    pub fn intern(&mut self, shape: &[u64]) -> ShapeId {
        if let Some(&id) = self.ids.get(shape) {
            if let Some(Some((_, refs))) = self.entries.get_mut(id as usize) {
                *refs += 1;
            }
            return id;
        }
        let entry = Some((Box::<[u64]>::from(shape), 1));
        let id = match self.free.pop() {
            Some(id) => {
                self.entries[id as usize] = entry;
                id
            }
            None => {
                self.entries.push(entry);
                (self.entries.len() - 1) as ShapeId
            }
        };
        self.ids.insert(shape.into(), id);
        id
    }

    /// Another reference to an interned shape.
    pub fn retain(&mut self, id: ShapeId) {
        if let Some(Some((_, refs))) = self.entries.get_mut(id as usize) {
            *refs += 1;
        }
    }

    /// Drops a reference; the shape goes with its last one.
    pub fn release(&mut self, id: ShapeId) {
        let Some(slot) = self.entries.get_mut(id as usize) else { return };
        let Some((shape, refs)) = slot else { return };
        *refs -= 1;
        if *refs == 0 {
            self.ids.remove(&**shape);
            *slot = None;
            self.free.push(id);
        }
    }

    /// The shape of `id` (empty if unknown, which a caller never holds).
    pub fn get(&self, id: ShapeId) -> &[u64] {
        match self.entries.get(id as usize) {
            Some(Some((shape, _))) => shape,
            _ => &[],
        }
    }

    /// References held on `id`.
    pub fn refs(&self, id: ShapeId) -> u32 {
        match self.entries.get(id as usize) {
            Some(Some((_, refs))) => *refs,
            _ => 0,
        }
    }

    /// Distinct shapes interned.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// No shape interned.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Every interned shape with its reference count.
    pub fn iter(&self) -> impl Iterator<Item = (ShapeId, u32)> + '_ {
        self.entries.iter().enumerate().filter_map(|(i, e)| e.as_ref().map(|(_, r)| (i as ShapeId, *r)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_shared_and_freed_with_their_last_reference() {
        let mut t = ShapeTable::default();
        let a = t.intern(&[64, 128]);
        let b = t.intern(&[64, 128]);
        let c = t.intern(&[8]);
        assert_eq!((a, t.len(), t.refs(a)), (b, 2, 2));
        t.release(a);
        t.release(b);
        assert_eq!(t.len(), 1);
        assert_eq!(t.get(c), &[8]);
        let d = t.intern(&[1, 2, 3]);
        assert_eq!(d, a, "the freed handle is reused");
        assert_eq!(t.get(d), &[1, 2, 3]);
    }
}
