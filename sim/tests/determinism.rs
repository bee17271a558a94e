//! The same seed on the same build gives the same trace hash; different seeds differ.

use std::collections::BTreeSet;

use ctlplane_sim::engine::{run, RunConfig};

/// Seeds run twice each (env `CTLSIM_DETERMINISM_SEEDS` overrides, for a quick local run).
fn seeds() -> u64 {
    std::env::var("CTLSIM_DETERMINISM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20)
}

#[test]
fn twenty_seeds_replay_bit_for_bit() {
    let mut hashes = BTreeSet::new();
    let n = seeds();
    for seed in 0..n {
        let a = run(&RunConfig::new(seed));
        let b = run(&RunConfig::new(seed));
        assert!(a.steps > 100, "seed {seed}: the run did not run ({} steps)", a.steps);
        assert!(a.stats.get("trace.events").copied().unwrap_or(0) > 1000, "seed {seed}: almost nothing was traced");
        assert_eq!(
            a.trace_hash, b.trace_hash,
            "seed {seed}: two runs differ (replay: ctlsim replay --seed {seed}); stats {:?} vs {:?}",
            a.stats, b.stats
        );
        assert_eq!(a.steps, b.steps, "seed {seed}");
        assert_eq!(a.violations, b.violations, "seed {seed}");
        hashes.insert(a.trace_hash);
    }
    assert_eq!(hashes.len() as u64, n, "different seeds gave the same trace hash");
}
