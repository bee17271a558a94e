//! The receive slab of one consumer rank: a fixed pool of device memory handed out
//! first-fit in 256-byte-aligned regions, with a coalescing free list.
//!
//! Only offsets are modelled; the driver (or the simulated device) adds the slab's base
//! address to turn an offset into the `dst_ptr` a Mooncake writer targets.

use std::collections::BTreeMap;
use thiserror::Error;

/// Allocation granularity and alignment of the reference allocator.
pub const ALIGNMENT: u64 = 256;

/// A region of the slab: `len` is the aligned size that is reserved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Region {
    /// Offset from the slab base, a multiple of [`ALIGNMENT`].
    pub offset: u64,
    /// Reserved bytes, a multiple of [`ALIGNMENT`].
    pub len: u64,
}

impl Region {
    /// One past the last reserved byte.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A tensor-sized view into a region: what a writer may write, and what a reader loads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct View {
    /// The backing region.
    pub region: Region,
    /// Exact tensor bytes (`<= region.len`).
    pub nbytes: u64,
}

/// Misuse of the allocator: always a bug in the caller, never input from the wire.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SlabError {
    /// The region was not handed out by this slab, or was already freed.
    #[error("region at offset {offset} (+{len}) is not allocated")]
    NotAllocated { offset: u64, len: u64 },
}

/// Rounds `nbytes` up to the allocation granularity. A zero-byte tensor takes no memory:
/// torch gives an empty tensor a null data pointer, so it never needs a region of its own.
pub fn aligned_size(nbytes: u64) -> Option<u64> {
    nbytes.div_ceil(ALIGNMENT).checked_mul(ALIGNMENT)
}

/// The address a writer targets for `view` in a slab based at `base`: `base + offset`,
/// and 0 for an empty tensor (torch's null data pointer).
pub fn dst_ptr(base: u64, view: &View) -> u64 {
    if view.nbytes == 0 {
        0
    } else {
        base.saturating_add(view.region.offset)
    }
}

/// First-fit allocator over `[0, size)`.
#[derive(Clone, Debug)]
pub struct Slab {
    size: u64,
    /// Free blocks by offset; adjacent blocks are always merged. Live regions are not
    /// listed: their owners (the reservation book) know them, and a free that overlaps a
    /// free block is caught as a double free.
    free: BTreeMap<u64, u64>,
    used_bytes: u64,
}

impl Slab {
    /// A slab of `size` bytes (rounded down to the alignment).
    pub fn new(size: u64) -> Self {
        let size = size - size % ALIGNMENT;
        let mut free = BTreeMap::new();
        if size > 0 {
            free.insert(0, size);
        }
        Slab { size, free, used_bytes: 0 }
    }

    /// Bytes currently handed out.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Reserves the lowest-addressed free block that holds `nbytes` (after alignment).
    ///
    /// A zero-byte request takes nothing: it is placed at the first free block and
    /// succeeds while any block is free, as the reference's first-fit does; on a full slab
    /// it fails like any other size (and the caller's pressure path runs).
    pub fn allocate(&mut self, nbytes: u64) -> Option<View> {
        let len = aligned_size(nbytes)?;
        if len == 0 {
            let (&offset, _) = self.free.iter().next()?;
            return Some(View { region: Region { offset, len: 0 }, nbytes });
        }
        let (&offset, &block) = self.free.iter().find(|(_, &block)| block >= len)?;
        self.free.remove(&offset);
        if block > len {
            self.free.insert(offset + len, block - len);
        }
        self.used_bytes += len;
        Some(View { region: Region { offset, len }, nbytes })
    }

    /// Returns a region to the free list, merging it with its free neighbours.
    /// Freeing an empty region (a zero-byte tensor's) is a no-op.
    pub fn free(&mut self, region: Region) -> Result<(), SlabError> {
        if region.len == 0 && region.offset % ALIGNMENT == 0 && region.offset <= self.size {
            return Ok(());
        }
        if !self.is_allocated(region) {
            return Err(SlabError::NotAllocated { offset: region.offset, len: region.len });
        }
        self.used_bytes -= region.len;
        let mut offset = region.offset;
        let mut len = region.len;
        if let Some((&prev, &prev_len)) = self.free.range(..offset).next_back() {
            if prev + prev_len == offset {
                self.free.remove(&prev);
                offset = prev;
                len += prev_len;
            }
        }
        if let Some(&next_len) = self.free.get(&(region.end())) {
            self.free.remove(&region.end());
            len += next_len;
        }
        self.free.insert(offset, len);
        Ok(())
    }

    /// Whether every byte of `region` is handed out (inside the slab, aligned, and
    /// overlapping no free block).
    pub fn is_allocated(&self, region: Region) -> bool {
        let aligned = region.offset % ALIGNMENT == 0 && region.len % ALIGNMENT == 0 && region.len > 0;
        let inside = region.offset.checked_add(region.len).is_some_and(|end| end <= self.size);
        if !aligned || !inside {
            return false;
        }
        let before = self.free.range(..=region.offset).next_back();
        if before.is_some_and(|(&off, &len)| off + len > region.offset) {
            return false;
        }
        self.free.range(region.offset..region.end()).next().is_none()
    }

    /// Spans of handed-out memory in address order (adjacent regions merged).
    pub fn allocated_spans(&self) -> Vec<Region> {
        let mut spans = Vec::new();
        let mut cursor = 0;
        for (&off, &len) in &self.free {
            if off > cursor {
                spans.push(Region { offset: cursor, len: off - cursor });
            }
            cursor = off + len;
        }
        if cursor < self.size {
            spans.push(Region { offset: cursor, len: self.size - cursor });
        }
        spans
    }

    /// Free blocks in address order.
    pub fn free_blocks(&self) -> impl Iterator<Item = Region> + '_ {
        self.free.iter().map(|(&offset, &len)| Region { offset, len })
    }

    /// Checks the allocator's own bookkeeping: free blocks are aligned, inside the slab,
    /// disjoint and never adjacent (they would have been merged), and the used byte count
    /// is what they leave.
    pub fn check(&self) -> Result<(), String> {
        let mut cursor = 0;
        let mut first = true;
        let mut free_bytes = 0;
        for (&off, &len) in &self.free {
            if off % ALIGNMENT != 0 || len % ALIGNMENT != 0 || len == 0 {
                return Err(format!("misaligned free block at {off} (+{len})"));
            }
            if !first && off <= cursor {
                return Err(format!("free block at {off} overlaps or touches the previous one (ends {cursor})"));
            }
            first = false;
            cursor = off + len;
            free_bytes += len;
        }
        if cursor > self.size {
            return Err(format!("free blocks reach {cursor}, past the {}-byte slab", self.size));
        }
        if free_bytes + self.used_bytes != self.size {
            return Err(format!("free {free_bytes} + used {} != size {}", self.used_bytes, self.size));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_first_fit_and_aligned() {
        let mut slab = Slab::new(4096);
        let a = slab.allocate(16).unwrap();
        let b = slab.allocate(300).unwrap();
        let c = slab.allocate(256).unwrap();
        assert_eq!((a.region.offset, a.region.len, a.nbytes), (0, 256, 16));
        assert_eq!((b.region.offset, b.region.len), (256, 512));
        assert_eq!(c.region.offset, 768);
        slab.free(a.region).unwrap();
        // The hole at 0 is first and big enough.
        assert_eq!(slab.allocate(200).unwrap().region.offset, 0);
        // Too big for the hole: goes after c.
        slab.free(Region { offset: 0, len: 256 }).unwrap();
        assert_eq!(slab.allocate(257).unwrap().region.offset, 1024);
        assert_eq!(slab.allocated_spans(), vec![Region { offset: 256, len: 1280 }]);
        slab.check().unwrap();
    }

    #[test]
    fn freeing_coalesces_both_neighbours() {
        let mut slab = Slab::new(768);
        let a = slab.allocate(256).unwrap().region;
        let b = slab.allocate(256).unwrap().region;
        let c = slab.allocate(256).unwrap().region;
        assert!(slab.allocate(1).is_none());
        slab.free(a).unwrap();
        slab.free(c).unwrap();
        assert!(slab.allocate(512).is_none());
        slab.free(b).unwrap();
        assert_eq!(slab.free_blocks().collect::<Vec<_>>(), vec![Region { offset: 0, len: 768 }]);
        assert_eq!(slab.allocate(768).unwrap().region.offset, 0);
        slab.check().unwrap();
    }

    #[test]
    fn double_free_is_refused() {
        let mut slab = Slab::new(1024);
        let a = slab.allocate(10).unwrap().region;
        slab.free(a).unwrap();
        assert_eq!(slab.free(a), Err(SlabError::NotAllocated { offset: 0, len: 256 }));
        let b = slab.allocate(600).unwrap().region;
        assert_eq!(b, Region { offset: 0, len: 768 });
        assert!(slab.free(Region { offset: 512, len: 512 }).is_err(), "reaches into free memory");
        assert!(slab.free(Region { offset: 4096, len: 256 }).is_err(), "outside the slab");
        assert!(slab.free(Region { offset: 10, len: 256 }).is_err(), "misaligned");
        slab.free(b).unwrap();
        slab.check().unwrap();
    }

    #[test]
    fn zero_bytes_take_nothing_and_huge_sizes_fail_cleanly() {
        let mut slab = Slab::new(1024);
        let empty = slab.allocate(0).unwrap();
        assert_eq!((empty.region, slab.used_bytes()), (Region { offset: 0, len: 0 }, 0));
        assert_eq!(dst_ptr(4096, &empty), 0, "an empty tensor has a null pointer");
        let a = slab.allocate(1).unwrap();
        assert_eq!((a.region.offset, dst_ptr(4096, &a)), (0, 4096), "the next offset does not drift");
        slab.free(empty.region).unwrap();
        slab.check().unwrap();
        assert!(slab.allocate(768).is_some());
        assert!(slab.allocate(0).is_none(), "a full slab has no free block to place it at");
        assert!(slab.allocate(u64::MAX).is_none());
        assert_eq!(aligned_size(u64::MAX), None);
    }
}
