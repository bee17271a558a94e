//! The `ec-dup-push` race's world (docs/races.md): two pushes of one transfer id.

use crate::knobs::Knobs;
use std::time::Duration;

/// EC dup-push: a proxy retries every encoder call on the other producer with the same
/// transfer ids (ec-behaviour.md S24) 0.1 to 0.5 s after the first, so the retry's
/// reserves are duplicates of the first push's on every rank. Lost replies (the scenario's
/// bias) fail one of the two pushes on a rank after the 30 s control timeout, and its
/// cleanup abandons what it holds on the others; both encoders run 40 to 60 s, so the
/// first push's write comes after that cleanup. The scheduler waits 120 s for the items.
pub fn knobs() -> Knobs {
    let mut k = Knobs::default();
    k.workload.min_encode = Duration::from_secs(40);
    k.workload.max_encode = Duration::from_secs(60);
    k.workload.retry = Some(crate::hosts::workload::RetryConfig {
        per_mille: 1000,
        after: (Duration::from_millis(100), Duration::from_millis(500)),
        encode: (Duration::from_secs(40), Duration::from_secs(60)),
    });
    k.push_wait_timeout = Some(Duration::from_secs(120));
    k
}
