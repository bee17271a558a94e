//! `shard-counters`: a rank's request counters agree with what it answered, and its reap
//! counter with the reaps that came due.
//!
//! The counters are what an operator watches (requests served, refusals, undecodable
//! frames); nothing else in a run reads them, so a counter that drifts would pass unseen.
//! They are recounted here from the frames and replies alone, with the core's wire
//! decoders (which decide nothing about the shard's state).

use ctlplane_core::ec::wire::{decode_reply, read_request, WireError};

use ctlplane_core::time::Instant;

use crate::hosts::world::{self, Shard};

/// The oracle's name.
const ORACLE: &str = "shard-counters";

/// A rank incarnation's answers, counted from the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Answered {
    pub requests: u64,
    pub error_replies: u64,
    pub malformed: u64,
    /// Reported once: after a mismatch every later answer would repeat it.
    reported: bool,
}

/// `host` answered `frame` with `reply`; `shard` is its state after the answer.
pub fn note(host: &str, frame: &[u8], reply: &[u8], shard: &Shard) {
    // A halted shard answers nothing; what it counted on the way down is its own business.
    if shard.halted().is_some() {
        return;
    }
    let stats = shard.stats();
    let finding = world::with(|w| {
        let answered = &mut w.ranks.get_mut(host)?.answered;
        answered.requests += 1;
        if matches!(decode_reply(reply), Ok(Err(_))) {
            answered.error_replies += 1;
        }
        if matches!(read_request(frame, usize::MAX), Err(WireError::Malformed)) {
            answered.malformed += 1;
        }
        let counted = (stats.requests, stats.error_replies, stats.malformed);
        let seen = (answered.requests, answered.error_replies, answered.malformed);
        if counted == seen || answered.reported {
            return None;
        }
        answered.reported = true;
        Some(format!("counters (requests, error replies, malformed) are {counted:?}; the rank answered {seen:?}"))
    });
    if let Some(detail) = finding {
        crate::oracle::violate(ORACLE, host, detail);
    }
}

/// `host`'s shard handled the timer at `now`, its reap having been due at `due` with
/// `reaps_before` counted: a call at or past the due reap runs one reap and counts it, an
/// earlier one neither (the reap counter is what an operator reads to see the rank alive).
pub fn note_timer(host: &str, due: Option<Instant>, now: Instant, reaps_before: u64, shard: &Shard) {
    if shard.halted().is_some() {
        return;
    }
    let expected = reaps_before + u64::from(due.is_some_and(|d| now >= d));
    let reaps = shard.stats().reaps;
    if reaps != expected {
        crate::oracle::violate(
            ORACLE,
            host,
            format!("the reap counter is {reaps} after a timer at {now:?} (reap due {due:?}); expected {expected}"),
        );
    }
}
