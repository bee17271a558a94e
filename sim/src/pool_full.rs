//! `pool-full-honest`: a rank answers a `reserve` with "buffer pool is full" only when its
//! slab has no free block the request would fit in.
//!
//! The run excuses requests that met pool pressure (capacity refuses pushes by design),
//! so a rank that refused with memory to spare would pass unseen. The check is sound
//! whatever the book could evict: it runs after the answer, when every eviction the
//! reserve made has only added free space. Only for a single `reserve`: within a
//! `reserve_batch` a later item may expire records and free memory after an earlier
//! item's refusal.

use ctlplane_core::ec::slab::aligned_size;
use ctlplane_core::ec::wire::{decode_reply, decode_request, Request};
use ctlplane_core::ec::ReserveError;

use crate::hosts::world::Shard;

/// The oracle's name.
const ORACLE: &str = "pool-full-honest";

/// `host` answered `frame` with `reply`; `shard` is its state after the answer. Both are
/// read with the core's own decoders.
pub fn check(host: &str, frame: &[u8], reply: &[u8], shard: &Shard) {
    let Ok(Err(refusal)) = decode_reply(reply) else { return };
    if refusal != ReserveError::PoolFull.to_string() {
        return;
    }
    let Ok(Request::Reserve(Ok(request))) = decode_request(frame, usize::MAX) else { return };
    let Some(len) = aligned_size(request.nbytes).filter(|&len| len > 0) else { return };
    let book = shard.book();
    if let Some(block) = book.slab().free_blocks().find(|b| b.len >= len) {
        crate::oracle::violate(
            ORACLE,
            host,
            format!(
                "refused a reserve of {len} aligned bytes as pool-full with a free block of {} bytes at offset {}",
                block.len, block.offset
            ),
        );
    }
}
