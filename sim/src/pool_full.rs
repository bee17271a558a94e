//! `pool-full-honest`: a rank answers a `reserve` with "buffer pool is full" only when its
//! slab has no free block the request would fit in.
//!
//! The run excuses requests that met pool pressure (capacity refuses pushes by design),
//! so a rank that refused with memory to spare would pass unseen. The check is sound
//! whatever the book could evict: it runs after the answer, when every eviction the
//! reserve made has only added free space. Only for a single `reserve`: within a
//! `reserve_batch` a later item may expire records and free memory after an earlier
//! item's refusal.
//!
//! The size a request needs is worked out here, from the slab's granularity, rather than
//! with the slab's own rounding: an oracle that shared the rounding would be blind to a
//! wrong one (a rounding that fits nothing makes every refusal look honest).

use ctlplane_core::ec::slab::ALIGNMENT;
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
    let Some(len) = needed(request.nbytes).filter(|&len| len > 0) else { return };
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

/// `nbytes` rounded up to the slab's granularity; `None` when no slab could hold it.
fn needed(nbytes: u64) -> Option<u64> {
    let granules = u128::from(nbytes).div_ceil(u128::from(ALIGNMENT));
    u64::try_from(granules * u128::from(ALIGNMENT)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_size_a_request_needs_is_rounded_up_to_the_granularity() {
        assert_eq!(needed(0), Some(0));
        assert_eq!(needed(1), Some(ALIGNMENT));
        assert_eq!(needed(ALIGNMENT), Some(ALIGNMENT));
        assert_eq!(needed(ALIGNMENT + 1), Some(2 * ALIGNMENT));
        assert_eq!(needed(u64::MAX), None);
    }
}
