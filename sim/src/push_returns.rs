//! `push-returns`: every push a producer began is reported done; `push-outcome`: what it
//! reports for each item is what happened to it.
//!
//! A push waits only on things that end: its encoder (the source is bound when it
//! finishes), control replies (each request meets its client timeout), device writes
//! (the device always returns) and, for a producer request that gave up, the settling of
//! what it reserved. A batch still open long after its source was bound, or after its
//! producer request gave it up, is one the coordinator forgot to finish: the caller's
//! `push()` never returns, and everything that producer would release with it stays held.

use std::collections::BTreeMap;
use std::time::Duration;

use ctlplane_core::ec::producer::{BatchId, ItemOutcome};
use ctlplane_core::time::Instant;

use crate::hosts::world;
use crate::oracle::{violate, violate_at};

/// How long after its due point (source bound, or request given up) a push may stay
/// open: a reserve and a complete meeting their client timeouts, queued behind the
/// requests already on their shard's sockets, plus the longest write the world draws.
pub const BOUND: Duration = Duration::from_secs(150);

/// The pushes of live producer incarnations not yet reported done.
#[derive(Clone, Debug, Default)]
pub struct OpenPushes {
    /// `(producer host, batch)` to `(incarnation, due)`.
    open: BTreeMap<(String, BatchId), (u32, Instant)>,
}

/// A producer began `batch`; it is due to move on from `due` on.
pub fn began(host: &str, incarnation: u32, batch: BatchId, due: Instant) {
    world::with(|w| w.open_pushes.open.insert((host.to_string(), batch), (incarnation, due)));
}

/// The producer's coordinator reported `batch` done.
pub fn done(host: &str, batch: BatchId) {
    world::with(|w| w.open_pushes.open.remove(&(host.to_string(), batch)));
}

/// At the end of the run: a push of a producer's current incarnation (a crash took the
/// earlier incarnations' pushes with it) still open more than [`BOUND`] past its due point.
pub fn check(end_ns: u64) {
    let late: Vec<(String, String)> = world::with(|w| {
        w.open_pushes
            .open
            .iter()
            .filter(|((host, _), (incarnation, due))| {
                w.incarnations.get(host) == Some(incarnation) && due.as_nanos() + BOUND.as_nanos() as u64 <= end_ns
            })
            .map(|((host, batch), (_, due))| {
                (host.clone(), format!("{batch} (due from {due}) never reported done: its push never returned"))
            })
            .collect()
    });
    for (host, detail) in late {
        violate_at(end_ns, "push-returns", &host, detail);
    }
}

/// `push-outcome`, when `batch` is reported done: an item reported `Pushed` had a write of
/// this push land, and one reported `Skipped` (the consumer cancelled first, another
/// writer or a resident copy serves it, or its source was never bound) had none. The
/// caller acts on these (a skipped item is not written again, a pushed one is announced),
/// so an outcome that misstates the write misleads it. Nor is an item reported `Skipped`
/// when a cancel of its reservations failed at its bound (S20: a skip whose release failed
/// is a failure, since the consumer keeps the reservation until its TTL). `landed[i]`
/// counts item `i`'s landed writes, as the producer host carried them; `release_failed[i]`
/// says whether one of its cancels was given up.
pub fn check_outcomes(host: &str, batch: BatchId, outcomes: &[ItemOutcome], landed: &[usize], release_failed: &[bool]) {
    for (index, (outcome, &writes)) in outcomes.iter().zip(landed).enumerate() {
        let kept = release_failed.get(index).copied().unwrap_or(false);
        let wrong = match outcome {
            ItemOutcome::Pushed => writes == 0,
            ItemOutcome::Skipped { .. } => writes > 0 || kept,
            ItemOutcome::Failed { .. } => false,
        };
        if wrong {
            let kept = if kept { ", and a cancel of its reservation failed at its bound" } else { "" };
            violate(
                "push-outcome",
                host,
                format!("{batch} item {index} reported {outcome:?} after {writes} landed write(s) of this push{kept}"),
            );
        }
    }
}
