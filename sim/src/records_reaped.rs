//! `records-reaped`: the scheduler drops a transfer's terminal record once it is
//! [`RECORD_TTL`] old (ec-behaviour.md §6.4: terminal records are dropped after 300 s).
//!
//! A record kept past that changes no request's fate, so no other oracle sees a leak in
//! the scheduler's transfer table; a long-running scheduler would grow it without bound.
//! The judgement needs nothing from the table's own bookkeeping: every item of a request
//! the scheduler finished is terminal (or READY, which the reference keeps) from that
//! moment on, and each transfer id belongs to one request of the workload.

use std::time::Duration;

use ctlplane_core::ec::defaults::RECORD_TTL;
use ctlplane_core::ec::readiness::TransferState;
use ctlplane_core::ec::scheduler::{ConsumerId, Scheduler};
use ctlplane_core::time::Instant;

use crate::oracle::violate;

/// The oracle's name.
const ORACLE: &str = "records-reaped";

/// When the scheduler host looks: late in the quiet phase, so that everything the active
/// phase finished is far past its record TTL.
pub const CHECK_AT: Duration = Duration::from_secs(crate::engine::END.as_secs() - 10);

/// How long past the TTL a record may linger: the scheduler reaps on its next wake.
const SLACK: Duration = Duration::from_secs(5);

/// A request the scheduler reported done: its consumer, the transfer ids of its items and
/// when.
#[derive(Clone, Debug)]
pub struct Finished {
    pub consumer: ConsumerId,
    pub transfer_ids: Vec<String>,
    pub at: Instant,
}

/// At `now`: no item of a request finished more than the TTL (plus slack) earlier still
/// has a terminal record.
pub fn check(host: &str, core: &Scheduler, finished: &[Finished], now: Instant) {
    let bound = (RECORD_TTL + SLACK).as_nanos() as u64;
    let mut judged = 0u64;
    for f in finished.iter().filter(|f| f.at.as_nanos() + bound <= now.as_nanos()) {
        let Some(readiness) = core.readiness(f.consumer) else { continue };
        for tid in &f.transfer_ids {
            judged += 1;
            // The terminal states are named here rather than asked of the table: the
            // oracle judges that code.
            let state = readiness.state(tid);
            if matches!(
                state,
                Some(
                    TransferState::Unavailable
                        | TransferState::Expired
                        | TransferState::Failed
                        | TransferState::Cancelled
                )
            ) {
                violate(
                    ORACLE,
                    host,
                    format!(
                        "{tid} still has a {state:?} record at {now}; its request finished at {}, more than the record TTL earlier",
                        f.at
                    ),
                );
            }
        }
    }
    crate::hosts::world::with(|w| w.count("records_reaped.judged", judged));
}
