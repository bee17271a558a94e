//! The `load-reported` oracle: the workers' report of a load moves the scheduler's record
//! on (ec-behaviour.md §6.4: a load makes the record LOADING; the report makes it READY
//! when every rank took the item, FAILED when one could not).
//!
//! A report the table drops leaves the record LOADING until its deadline, and then the
//! scheduler fails and cancels an item its request already has: no request's fate changes
//! (the request resolved on the report), so only this sees it.

use ctlplane_core::ec::readiness::TransferState;
use ctlplane_core::ec::scheduler::{ConsumerId, Scheduler};

use crate::oracle::violate;

const ORACLE: &str = "load-reported";

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
    if now != Some(want) && !(now.is_none() && !loaded) {
        violate(
            ORACLE,
            host,
            format!("the load of {transfer_id} was reported (loaded: {loaded}); its record is {now:?}, not {want:?}"),
        );
    }
}
