//! `expire-on-time`: a shard's timer expires a record only once its deadline passed
//! (ec-behaviour.md §3.6: a READY record lives the TTL from its completion, a WRITING
//! one the TTL from its last reserve or refresh).
//!
//! `ready-ttl` judges the deadline a completion sets; this judges the timer that acts on
//! it. A timer that expires records before their deadline takes a tensor from under a
//! model told it is ready, or defers a writer still inside its lease; the push then
//! fails like one the TTL outran, which no other oracle tells apart.

use ctlplane_core::ec::State;
use ctlplane_core::time::Instant;

use crate::hosts::world::{self, Shard};
use crate::oracle::violate;

/// A workload record the timer at `now` must leave alone: READY or WRITING, not yet due.
#[derive(Debug)]
pub struct NotDue {
    transfer_id: String,
    state: State,
    deadline: Instant,
}

/// The records of the workload not yet due at `now`, just before the shard's timer runs.
pub fn not_due(shard: &Shard, now: Instant) -> Vec<NotDue> {
    let book = shard.book();
    world::workload_records(shard, |s| matches!(s, State::Ready | State::Writing))
        .into_iter()
        .filter_map(|(t, state)| {
            let deadline = book.deadline_of(&t).filter(|d| *d > now)?;
            Some(NotDue { transfer_id: t, state, deadline })
        })
        .collect()
}

/// After the timer ran at `now`: none of `before` was expired (READY to EXPIRED, WRITING
/// to EXPIRE_PENDING).
pub fn check(host: &str, shard: &Shard, before: &[NotDue], now: Instant) {
    let book = shard.book();
    for r in before {
        let after = book.state_of(&r.transfer_id);
        let expired = matches!(
            (r.state, after),
            (State::Ready, Some(State::Expired)) | (State::Writing, Some(State::ExpirePending))
        );
        if expired {
            violate(
                "expire-on-time",
                host,
                format!(
                    "{} expired at {now} from {:?} to {after:?}; its deadline was {}",
                    r.transfer_id, r.state, r.deadline
                ),
            );
        }
    }
}
