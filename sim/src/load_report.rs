//! The `load-reported` oracle: the workers' report of a load moves the scheduler's record
//! on (ec-behaviour.md §6.4: a load makes the record LOADING; the report makes it READY
//! when every rank took the item, FAILED when one could not).
//!
//! A report the table drops leaves the record LOADING until its deadline, and then the
//! scheduler fails and cancels an item its request already has: no request's fate changes
//! (the request resolved on the report), so only this sees it. And a READY record is
//! left alone by the cancel that ends its request (§6.4), so the scheduler never sends a
//! remote cancel for an item every rank took ([`Loaded`]).

use std::collections::BTreeSet;

use ctlplane_core::ec::readiness::TransferState;
use ctlplane_core::ec::scheduler::{ConsumerId, Scheduler};
use ctlplane_core::ec::wire::{decode_request, Request};

use crate::oracle::violate;

const ORACLE: &str = "load-reported";

/// The items a scheduler incarnation's workers reported loaded, per consumer.
#[derive(Debug, Default)]
pub struct Loaded(BTreeSet<(ConsumerId, String)>);

impl Loaded {
    /// Every rank of `consumer` took `transfer_id`.
    pub fn note(&mut self, consumer: ConsumerId, transfer_id: &str) {
        self.0.insert((consumer, transfer_id.to_string()));
    }

    /// The scheduler sends `frame` on `consumer`'s cancel lane: not a cancel of a loaded item.
    pub fn check_cancel(&self, host: &str, consumer: ConsumerId, frame: &[u8]) {
        let Ok(Request::Cancel { transfer_id, .. }) = decode_request(frame, usize::MAX) else { return };
        if self.0.contains(&(consumer, transfer_id.clone())) {
            violate(ORACLE, host, format!("a remote cancel of {transfer_id}, which every rank reported loaded"));
        }
    }
}

/// The scheduler host reported the load of `transfer_id` (`loaded`: every rank took it);
/// `before`: the record's state just before the report.
pub fn check(
    host: &str,
    core: &Scheduler,
    consumer: ConsumerId,
    transfer_id: &str,
    before: Option<TransferState>,
    loaded: bool,
) {
    if before != Some(TransferState::Loading) {
        return;
    }
    // Named here rather than derived from `loaded` by the table's code: the oracle judges it.
    let want = if loaded { TransferState::Ready } else { TransferState::Failed };
    let now = core.readiness(consumer).and_then(|r| r.state(transfer_id));
    // A FAILED record may be reaped at once when the table is over its bound.
    let reaped = now.is_none() && !loaded;
    if now != Some(want) && !reaped {
        violate(
            ORACLE,
            host,
            format!("the load of {transfer_id} was reported (loaded: {loaded}); its record is {now:?}, not {want:?}"),
        );
    }
}
