//! `ready-log`: the engine learns of every transfer the subscribers learn of. The
//! consumer engine polls `ConsumerShard::drain_ready` (the Python server's
//! `drain_ready()`) for the transfers it may take; every readiness event a rank publishes
//! must name a transfer that call reported, in the order the events go out.
//!
//! The rank drains the log before each publish, as an engine polling between requests
//! would. An event is matched with the oldest reported transfer not yet announced; those
//! passed over are events the backlog dropped or repeats still queued, so only an event
//! nothing reported is a violation.

use crate::hosts::world;
use crate::oracle::violate;

/// `host` published the readiness event of `transfer_id`; `drained` is what its shard's
/// `drain_ready` reported since the last publish.
pub fn note_published(host: &str, drained: Vec<String>, transfer_id: &str) {
    let found = world::with(|w| {
        let Some(rank) = w.ranks.get_mut(host) else { return true };
        rank.engine_ready.extend(drained);
        while let Some(reported) = rank.engine_ready.pop_front() {
            if reported == transfer_id {
                return true;
            }
        }
        false
    });
    if !found {
        violate(
            "ready-log",
            host,
            format!("published the readiness event of {transfer_id}, which drain_ready never reported to the engine"),
        );
    }
}
