//! The `ec-s20` scenario's world: producer requests that end before their encoder output.

use std::time::Duration;

use crate::knobs::Knobs;

/// EC S20: how long a producer request lives before it ends with its push unbound.
pub const EC_S20_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// EC S20: encoders take 1 to 12 s, and every producer request ends 5 s after it arrived
/// ([`Knobs::producer_request_timeout`]), so about two thirds of the batches are orphaned
/// while they hold reservations and wait for their source. Without the orphan's abandons
/// those reservations stay WRITING for the TTL and then deferred for good.
pub fn knobs_s20() -> Knobs {
    let mut k = Knobs::default();
    k.workload.min_encode = Duration::from_secs(1);
    k.workload.max_encode = Duration::from_secs(12);
    k.producer_request_timeout = Some(EC_S20_REQUEST_TIMEOUT);
    k
}
