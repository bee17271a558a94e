//! `reserve-duplicate`: a reserve repeating a live transfer's reservation is answered with
//! that reservation (ec-behaviour.md, the reserve result: a duplicate reserve of an
//! in-flight transfer answers `write: false, ready: false`, one of a READY transfer its
//! record again; either way with the reservation's size, which is judged here). A retried
//! reserve whose reply was lost is such a repeat; answered `conflicting reservation`, the
//! push fails an item the consumer holds.
//!
//! Judged per reserve item whose transfer, before the request, had a WRITING or READY
//! record with the same `mm_hash`, shape and dtype and a deadline still ahead.

use ctlplane_core::ec::ids::TransferId;
use ctlplane_core::ec::State;
use ctlplane_core::time::Instant;
use serde_json::Value;

use crate::hosts::world::Shard;
use crate::oracle::violate;
use crate::reserve_items::{alone, items, Answers};

/// A reserve item that repeats a live record: its place in the request (`None` for a
/// single reserve), its transfer, and whether the record was READY.
pub struct Repeat {
    item: Option<usize>,
    transfer_id: String,
    ready: bool,
    /// The reservation's size, which the answer repeats.
    nbytes: u64,
}

/// The items of `frame` that repeat a live record of `shard`, before it serves them at `now`.
/// A transfer named twice in one batch is judged by neither item.
pub fn before(frame: &[u8], now: Instant, shard: &Shard) -> Vec<Repeat> {
    let book = shard.book();
    let items = items(frame);
    items
        .iter()
        .filter(|item| alone(&items, item, |r| &r.transfer_id))
        .filter_map(|item| {
            let req = &item.req;
            let state = book.state_of(&req.transfer_id)?;
            if !matches!(state, State::Writing | State::Ready) || book.deadline_of(&req.transfer_id)? <= now {
                return None;
            }
            let view = book.status_view(&TransferId::new(&req.transfer_id))?;
            let same =
                view.mm_hash.matches(&req.mm_hash) && view.shape == req.shape.as_slice() && view.dtype == req.dtype;
            same.then(|| Repeat {
                item: item.index,
                transfer_id: req.transfer_id.clone(),
                ready: state == State::Ready,
                nbytes: view.nbytes,
            })
        })
        .collect()
}

/// `host` answered the request with `reply`: each repeat must have got its reservation.
pub fn check(host: &str, repeats: &[Repeat], reply: &[u8]) {
    if repeats.is_empty() {
        return;
    }
    let answers = Answers::of(reply);
    for r in repeats {
        let Some(answer) = answers.get(r.item) else { continue };
        let wrong = match answer {
            Err(error) => Some(format!("refused: {error}")),
            Ok(result) => {
                let flag = |k: &str| result.get(k).and_then(Value::as_bool);
                let nbytes = result.get("nbytes").and_then(Value::as_u64);
                (flag("write") != Some(false) || flag("ready") != Some(r.ready) || nbytes != Some(r.nbytes))
                    .then(|| format!("answered {result} (the reservation holds {} bytes)", r.nbytes))
            }
        };
        if let Some(wrong) = wrong {
            let state = if r.ready { "READY" } else { "WRITING" };
            violate(
                "reserve-duplicate",
                host,
                format!("a reserve repeating the {state} reservation of {} was {wrong}", r.transfer_id),
            );
        }
    }
}
