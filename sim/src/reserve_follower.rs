//! `reserve-follower`: a reserve of a new transfer whose tensor (`mm_hash`, shape, dtype)
//! a WRITING writer of the rank is already receiving shares that writer's destination
//! and does not write (ec-behaviour.md §3.3 rule 7: a follower, `write: false`). A second
//! writer would receive the same bytes into memory of its own, and in a full pool be
//! refused a reserve the reference grants.
//!
//! The rank's writers are the transfers it answered `write: true`, kept by `mm_hash`;
//! one counts while its record is WRITING with its deadline ahead (a reserve reaps first,
//! and a writer past its deadline is deferred before the rule looks).

use ctlplane_core::ec::ids::TransferId;
use ctlplane_core::ec::{ReserveRequest, State};
use ctlplane_core::time::Instant;
use serde_json::Value;

use crate::hosts::world::{self, Shard};
use crate::oracle::violate;
use crate::reserve_items::{alone, items, Answers};

/// A reserve item of a request: its place (`None` for a single reserve), its transfer,
/// its tensor, and the writer it must follow, if one was WRITING before the request.
pub struct Item {
    index: Option<usize>,
    transfer_id: String,
    mm_hash: String,
    follows: Option<String>,
}

/// The reserve items of `frame`, with the writer each must follow in `host`'s `shard` at `now`.
pub fn before(host: &str, frame: &[u8], now: Instant, shard: &Shard) -> Vec<Item> {
    let items = items(frame);
    let book = shard.book();
    let writing = |tid: &str, req: &ReserveRequest| {
        book.state_of(tid) == Some(State::Writing)
            && book.deadline_of(tid).is_some_and(|d| d > now)
            && book.status_view(&TransferId::new(tid)).is_some_and(|v| {
                v.mm_hash.matches(&req.mm_hash) && v.shape == req.shape.as_slice() && v.dtype == req.dtype
            })
    };
    world::with(|w| {
        let writers = w.ranks.get(host).map(|r| &r.writers);
        items
            .iter()
            .map(|item| {
                let req = &item.req;
                // Alone in its request (the items before it cannot change what it finds)
                // and new to the book.
                let judged = alone(&items, item, |r| &r.transfer_id)
                    && alone(&items, item, |r| &r.mm_hash)
                    && book.state_of(&req.transfer_id).is_none();
                let follows = judged
                    .then(|| writers.and_then(|ws| ws.get(&req.mm_hash)))
                    .flatten()
                    .and_then(|tids| tids.iter().find(|t| writing(t, req)).cloned());
                Item { index: item.index, transfer_id: req.transfer_id.clone(), mm_hash: req.mm_hash.clone(), follows }
            })
            .collect()
    })
}

/// `host` answered the request with `reply`: a writer granted is noted, and an item that
/// had a writer to follow must not be one.
pub fn check(host: &str, items: Vec<Item>, reply: &[u8]) {
    let answers = Answers::of(reply);
    for item in items {
        let Some(Ok(answer)) = answers.get(item.index) else { continue };
        if answer.get("write") != Some(&Value::Bool(true)) {
            continue;
        }
        if let Some(writer) = &item.follows {
            violate(
                "reserve-follower",
                host,
                format!(
                    "{} was granted a destination of its own to write while {writer} was writing the same tensor: {answer}",
                    item.transfer_id
                ),
            );
        }
        world::with(|w| {
            if let Some(rank) = w.ranks.get_mut(host) {
                rank.writers.entry(item.mm_hash).or_default().insert(item.transfer_id);
            }
        });
    }
}
