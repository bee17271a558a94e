//! `ready-ttl`: a reservation that a `complete` made READY lives the TTL from that
//! completion (ec-behaviour.md §3.6: READY 300 s from completion), not from its reserve.
//!
//! `reservation-released` bounds a record's life from above; nothing else sees a READY
//! record whose deadline was left at its reserve's, which expires early by the write's
//! duration and can take a tensor from under a model that was told it is ready. Judged
//! from the request and its reply, with the core's wire decoders, and the book's deadline
//! right after the answer.

use ctlplane_core::ec::wire::{decode_reply, decode_request, Request};
use ctlplane_core::time::Instant;
use serde_json::Value;

use crate::hosts::world::Shard;
use crate::oracle::violate;

/// `host` answered `frame` with `reply` at `now`; `shard` is its state after the answer.
pub fn check(host: &str, frame: &[u8], reply: &[u8], now: Instant, shard: &Shard) {
    let Ok(Ok(result)) = decode_reply(reply) else { return };
    let became_ready = |r: &Value| r.get("became_ready") == Some(&Value::Bool(true));
    let made_ready: Vec<String> = match decode_request(frame, usize::MAX) {
        Ok(Request::Complete(Ok(item))) if became_ready(&result) => vec![item.transfer_id],
        Ok(Request::CompleteBatch(items)) => {
            let entries = result.get("items").and_then(Value::as_array).map(Vec::as_slice).unwrap_or(&[]);
            items
                .into_iter()
                .zip(entries)
                .filter_map(|(item, entry)| item.ok().filter(|_| became_ready(entry)).map(|i| i.transfer_id))
                .collect()
        }
        _ => return,
    };
    let book = shard.book();
    let due = now + book.config().ttl;
    for tid in made_ready {
        let deadline = book.deadline_of(&tid);
        if deadline.is_some_and(|d| d != due) {
            violate(
                "ready-ttl",
                host,
                format!("{tid} became READY at {now} with its deadline at {deadline:?}, not the TTL later ({due})"),
            );
        }
    }
}
