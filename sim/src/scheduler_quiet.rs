//! `scheduler-quiet`: the scheduler's answer to "is anything pending?"
//! (`Scheduler::is_quiet`, on which the libzmq `ctlplane push` command stops) agrees with
//! what its host sees.
//!
//! - While a control request the host sent (a discovery or a remote cancel) is unanswered,
//!   the scheduler is not quiet.
//! - Late in the quiet phase, long after the last fault healed and the last request of the
//!   workload was answered, it is: a control request or remote cancel still pending then is
//!   work that never finishes, with no fault left to excuse it, and no other oracle looks
//!   at a cancel nobody waits for.

use ctlplane_core::ec::scheduler::Scheduler;
use ctlplane_core::time::Instant;

use crate::oracle::violate;

const ORACLE: &str = "scheduler-quiet";

/// After the host sent what `core` asked: `unanswered` control requests it sent have no
/// reply yet.
pub fn check_busy(host: &str, core: &Scheduler, unanswered: usize, now: Instant) {
    if unanswered > 0 && core.is_quiet() {
        violate(
            ORACLE,
            host,
            format!("at {now} the scheduler reports quiet with {unanswered} control requests unanswered"),
        );
    }
}

/// Late in the quiet phase (the scheduler host calls this once, at
/// [`crate::records_reaped::CHECK_AT`]).
pub fn check_settled(host: &str, core: &Scheduler, now: Instant) {
    if !core.is_quiet() {
        violate(
            ORACLE,
            host,
            format!(
                "at {now} the scheduler still has control requests or remote cancels pending ({} requests open)",
                core.active_requests()
            ),
        );
    }
}
