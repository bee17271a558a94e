//! The `shutdown-safe` oracle: a consumer rank's clean close (ec-behaviour.md §3.7, race
//! S21, played by `Knobs::consumer_shutdown`).
//!
//! Once shutdown began, the rank's book holds no READY record (cancelled) and no WRITING
//! one (followers cancelled, writers deferred to CANCEL_PENDING), and no reserve gets
//! fresh memory. A rank that closes and releases its pool does so only when no writer can
//! still land in it: every fresh writer grant of its slab has had its write return, or its
//! producer abandoned it there or finished the push. A close that timed out keeps the slab
//! registered, so a late write lands in memory nobody reuses (`write-owned` judges it
//! against the book the rank closed with); it must have had a writer left to wait for,
//! and have waited the whole control timeout for it.

use std::time::Duration;

use ctlplane_core::ec::defaults::CONTROL_TIMEOUT;
use ctlplane_core::ec::State;

use crate::hosts::world::{self, Shard};

const ORACLE: &str = "shutdown-safe";

/// Right after `begin_shutdown`: nothing READY or WRITING is left.
pub fn check_shut(host: &str, shard: &Shard) {
    let live = world::workload_records(shard, |s| matches!(s, State::Ready | State::Writing));
    if !live.is_empty() {
        crate::oracle::violate(ORACLE, host, format!("after shutdown began the book still holds {live:?}"));
    }
}

/// A request served while the rank closes (`granted_writer`: its reply granted fresh
/// memory to write).
pub fn check_served(host: &str, shard: &Shard, granted_writer: bool) {
    if granted_writer {
        crate::oracle::violate(ORACLE, host, "a reserve got fresh memory after shutdown began");
    }
    check_shut(host, shard);
}

/// The rank closes `waited` after shutdown began; `keep_slab` false: it releases its
/// pool. A pool kept registered must have had a reason: a record of the workload still
/// writer-owned when the wait ran out (else the close leaked the pool for nothing), and
/// the wait must have run the whole control timeout (else writers that would have
/// completed in time left the pool kept).
pub fn check_release(host: &str, session: &str, shard: &Shard, keep_slab: bool, waited: Duration) {
    if keep_slab {
        if world::workload_records(shard, State::is_writer_owned).is_empty() {
            crate::oracle::violate(
                ORACLE,
                host,
                format!("pool of {session} kept registered though no writer could still land in it"),
            );
        }
        if waited < CONTROL_TIMEOUT {
            crate::oracle::violate(
                ORACLE,
                host,
                format!(
                    "pool of {session} kept registered {waited:?} after shutdown began, before the control timeout \
                     ({CONTROL_TIMEOUT:?}) gave its writers their time"
                ),
            );
        }
        return;
    }
    let open: Vec<String> = world::with(|w| {
        w.landed.unwritten_grants(session).into_iter().filter(|tid| !w.release.producer_gave_up(host, tid)).collect()
    });
    if !open.is_empty() {
        crate::oracle::violate(
            ORACLE,
            host,
            format!("pool of {session} released while writers granted there may still land: {open:?}"),
        );
    }
}
