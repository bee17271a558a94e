//! `announce-once`: a rank publishes a reservation's readiness event once for each reason
//! the reference gives (ec-behaviour.md §2.3, §2.4): the completion or cache hit that made
//! it READY, and every later `reserve` answered `ready: true` (a duplicate reserve of a
//! READY transfer re-queues its event). Any other repeat is a completion counted twice,
//! and it costs the scheduler a slot of every shard's event backlog.

use ctlplane_core::ec::wire::{decode_reply, decode_request, Request};
use serde_json::Value;

use crate::hosts::world::{self, World};

/// `host` answered `frame` with `reply`: every reserve answered `ready: true` allows its
/// transfer's event one more time.
pub fn note_answer(host: &str, frame: &[u8], reply: &[u8]) {
    let Ok(Ok(result)) = decode_reply(reply) else { return };
    let ready = |v: &Value| v.get("ready") == Some(&Value::Bool(true));
    let tids: Vec<String> = match decode_request(frame, usize::MAX) {
        Ok(Request::Reserve(Ok(req))) if ready(&result) => vec![req.transfer_id],
        Ok(Request::ReserveBatch(items)) => {
            let entries = result.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
            items
                .into_iter()
                .zip(entries)
                .filter_map(|(item, entry)| {
                    let req = item.ok()?;
                    entry.get("result").filter(|r| ready(r)).map(|_| req.transfer_id)
                })
                .collect()
        }
        _ => return,
    };
    world::with(|w| {
        if let Some(rank) = w.ranks.get_mut(host) {
            for tid in tids {
                *rank.ready_answers.entry(tid).or_default() += 1;
            }
        }
    });
}

/// `host` published `event` for `transfer_id` (inside `world::with`): the violation's detail if that is once
/// more than its reasons allow.
pub fn note_published_in(w: &mut World, host: &str, transfer_id: &str, event: &[u8]) -> Option<String> {
    let rank = w.ranks.get_mut(host)?;
    let times = rank.announced.entry(event.to_vec()).or_default();
    *times += 1;
    let allowed = 1 + rank.ready_answers.get(transfer_id).copied().unwrap_or(0);
    (*times > allowed).then(|| {
        format!(
            "published the readiness event of {transfer_id} {times} times, with {} reserve(s) answered ready: {}",
            allowed - 1,
            String::from_utf8_lossy(event)
        )
    })
}
