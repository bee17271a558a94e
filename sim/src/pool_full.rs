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
use ctlplane_core::ec::ReserveError;
use serde_json::Value;

use crate::hosts::world::Shard;

/// The oracle's name.
const ORACLE: &str = "pool-full-honest";

/// `host` answered `frame` with `reply`; `shard` is its state after the answer.
pub fn check(host: &str, frame: &[u8], reply: &[u8], shard: &Shard) {
    let refusal = ReserveError::PoolFull.to_string();
    if !reply.windows(refusal.len()).any(|w| w == refusal.as_bytes()) {
        return;
    }
    let Ok(request) = serde_json::from_slice::<Value>(frame) else { return };
    if request.get("op").and_then(Value::as_str) != Some("reserve") {
        return;
    }
    let nbytes = match request.get("nbytes") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse().ok(),
        _ => None,
    };
    let Some(len) = nbytes.and_then(aligned_size).filter(|&len| len > 0) else { return };
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
