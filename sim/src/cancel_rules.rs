//! `cancel-rules`: a `cancel` does what ec-behaviour.md §3.5 says for the record it finds.
//! Judged from the record before the request (its state and reservation id) and after
//! it, with the core's wire decoders, wherever the rules decide from what the book shows;
//! a cancel naming another reservation id (a duplicate's grant or a stale one), an
//! empty-id abandon of a WRITING record a reserve may have granted twice (see
//! [`note_reserves`]: the abandon may come from a push holding only a duplicate's grant,
//! and the record then waits for its writer) and records past their deadline are left to
//! the other oracles.
//!
//! - No record: answered `true` (a tombstone is inserted).
//! - A tombstone, with the empty id: `true`.
//! - `refresh`: with `abandon` on a WRITING or EXPIRE_PENDING record the record expires
//!   (memory released), `true`; otherwise `false` and the record as it was.
//! - READY, or a writer-owned record with `abandon` (the empty id included, when no
//!   duplicate's grant can be about): terminated, `true`.
//! - WRITING without `abandon`: deferred to CANCEL_PENDING (or, a follower, terminated), `true`.
//! - CANCEL_PENDING or EXPIRE_PENDING without `abandon`: unchanged, `true`.

use std::collections::BTreeSet;

use ctlplane_core::ec::ids::{ReservationId, TransferId};
use ctlplane_core::ec::wire::{decode_reply, decode_request, Request};
use ctlplane_core::ec::State;
use ctlplane_core::time::Instant;
use serde_json::Value;

use crate::hosts::world::Shard;
use crate::oracle::violate;
use crate::reserve_items::{alone, items};

/// A cancel the rules decide, and the record it found.
pub struct Judged {
    transfer_id: String,
    before: Option<State>,
    abandon: bool,
    refresh: bool,
}

/// Adds to `repeated` the transfers of the reserves in `frame` that may be granted a
/// second time: a reserve of a transfer whose record is WRITING, or a transfer the request
/// names twice. Never cleared: a transfer once in it is only judged less.
pub fn note_reserves(frame: &[u8], shard: &Shard, repeated: &mut BTreeSet<String>) {
    let book = shard.book();
    let items = items(frame);
    for item in &items {
        let tid = &item.req.transfer_id;
        if book.state_of(tid) == Some(State::Writing) || !alone(&items, item, |r| &r.transfer_id) {
            repeated.insert(tid.clone());
        }
    }
}

/// The cancel in `frame`, if the rules decide it from what `shard` shows at `now`;
/// `repeated` answers from what [`note_reserves`] gathered on this rank.
pub fn before(frame: &[u8], now: Instant, shard: &Shard, repeated: impl Fn(&str) -> bool) -> Option<Judged> {
    let Ok(Request::Cancel { transfer_id, reservation_id, abandon, refresh }) = decode_request(frame, usize::MAX)
    else {
        return None;
    };
    let book = shard.book();
    let before = book.state_of(&transfer_id);
    if let Some(state) = before {
        if book.deadline_of(&transfer_id).is_some_and(|d| d <= now) || state == State::Expired {
            return None;
        }
        if state == State::Cancelled {
            if !reservation_id.is_empty() {
                return None;
            }
        } else {
            let own = book.status_view(&TransferId::new(&transfer_id)).and_then(|v| v.reservation_id);
            let named = ReservationId::parse(&reservation_id);
            if reservation_id.is_empty() {
                if abandon && state == State::Writing && repeated(&transfer_id) {
                    return None;
                }
            } else if own.is_none() || named != own {
                return None;
            }
        }
    }
    Some(Judged { transfer_id, before, abandon, refresh })
}

/// `host` answered the cancel with `reply`; `shard` is its state after the answer.
pub fn check(host: &str, judged: Option<Judged>, reply: &[u8], shard: &Shard) {
    let Some(j) = judged else { return };
    let Ok(Ok(result)) = decode_reply(reply) else { return };
    let Some(cancelled) = result.get("cancelled").and_then(Value::as_bool) else { return };
    let after = shard.book().state_of(&j.transfer_id);
    let ended = !after.is_some_and(|s| s.is_active());
    use State::*;
    let (want, ok, rule): (bool, bool, &str) = match (j.before, j.refresh, j.abandon) {
        (None, _, _) => (true, true, "a cancel before any reserve leaves a tombstone"),
        (Some(Cancelled), _, _) => (true, true, "a repeated cancel of a tombstone"),
        (Some(s @ (Writing | ExpirePending)), true, true) => (
            true,
            ended,
            if s == Writing {
                "a refresh of a WRITING record expires it"
            } else {
                "a refresh of an EXPIRE_PENDING record expires it"
            },
        ),
        (Some(_), true, _) => {
            (false, after == j.before, "a refresh needs abandon and a WRITING or EXPIRE_PENDING record")
        }
        (Some(Ready), false, _) => (true, ended, "a cancel of a READY record terminates it"),
        (Some(Writing | CancelPending | ExpirePending), false, true) => {
            (true, ended, "an abandon of a writer-owned record terminates it")
        }
        (Some(Writing), false, false) => {
            (true, after == Some(CancelPending) || ended, "a cancel of a WRITING record defers it")
        }
        (Some(s @ (CancelPending | ExpirePending)), false, false) => {
            (true, after == Some(s), "a plain cancel of a deferred record leaves it")
        }
        (Some(Expired), ..) => return,
    };
    if cancelled != want || !ok {
        violate(
            "cancel-rules",
            host,
            format!(
                "{rule}: cancel of {} (abandon {}, refresh {}) found {:?}, answered {cancelled}, left {after:?}",
                j.transfer_id, j.abandon, j.refresh, j.before
            ),
        );
    }
}
