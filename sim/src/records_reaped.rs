//! The scheduler's terminal records live [`RECORD_TTL`], no shorter and no longer
//! (ec-behaviour.md §6.3, §6.4: a terminal record ignores late events; terminal records
//! are dropped after 300 s).
//!
//! - `records-reaped`: a record kept past its TTL changes no request's fate, so no other
//!   oracle sees a transfer table that grows without bound.
//! - `records-kept`: a record dropped early lets a late readiness event of a finished
//!   request make the item available again, and the scheduler acts on it.
//!
//! The judgement needs nothing from the table's own bookkeeping: every item of a request
//! the scheduler finished is terminal (or READY, which the reference keeps and which
//! ignores events too) from that moment on, and each transfer id belongs to one request of
//! the workload.

use std::collections::BTreeMap;
use std::time::Duration;

use ctlplane_core::ec::defaults::RECORD_TTL;
use ctlplane_core::ec::readiness::TransferState;
use ctlplane_core::ec::scheduler::{ConsumerId, Scheduler};
use ctlplane_core::time::Instant;

use crate::oracle::violate;

/// When the scheduler host looks for records kept too long: late in the quiet phase, so
/// that everything the active phase finished is far past its record TTL.
pub const CHECK_AT: Duration = Duration::from_secs(crate::engine::END.as_secs() - 10);

/// How long past the TTL a record may linger: the scheduler reaps on its next wake.
const SLACK: Duration = Duration::from_secs(5);

/// The items of the requests a scheduler incarnation finished: transfer id to consumer
/// and when.
#[derive(Clone, Debug, Default)]
pub struct Finished {
    by_tid: BTreeMap<String, (ConsumerId, Instant)>,
}

impl Finished {
    /// The scheduler reported a request of `consumer` done at `at`.
    pub fn note<'a>(&mut self, consumer: ConsumerId, transfer_ids: impl IntoIterator<Item = &'a str>, at: Instant) {
        for tid in transfer_ids {
            self.by_tid.insert(tid.to_string(), (consumer, at));
        }
    }

    /// `records-kept`: the scheduler made `transfer_id` available at `now`.
    pub fn check_available(&self, host: &str, transfer_id: &str, now: Instant) {
        let Some(&(_, at)) = self.by_tid.get(transfer_id) else { return };
        if now.as_nanos() < at.as_nanos() + RECORD_TTL.as_nanos() as u64 {
            violate(
                "records-kept",
                host,
                format!(
                    "{transfer_id} made available at {now} by a late readiness event; its request finished at {at}, \
                     less than the record TTL earlier"
                ),
            );
        }
    }

    /// `records-reaped`, at `now`: no item of a request finished more than the TTL (plus
    /// slack) earlier still has a terminal record.
    pub fn check_reaped(&self, host: &str, core: &Scheduler, now: Instant) {
        let bound = (RECORD_TTL + SLACK).as_nanos() as u64;
        let mut judged = 0u64;
        for (tid, &(consumer, at)) in &self.by_tid {
            if at.as_nanos() + bound > now.as_nanos() {
                continue;
            }
            let Some(readiness) = core.readiness(consumer) else { continue };
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
                    "records-reaped",
                    host,
                    format!(
                        "{tid} still has a {state:?} record at {now}; its request finished at {at}, more than the record TTL earlier"
                    ),
                );
            }
        }
        crate::hosts::world::with(|w| w.count("records_reaped.judged", judged));
    }
}
