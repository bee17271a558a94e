//! Leaving idle hosts out of a turmoil step (the vendored turmoil's wake hint) changes
//! nothing a run observes: with and without it, a seed gives the same trace hash, the
//! same steps and the same verdict.
//!
//! The seeds cover every fault kind: crashes and restarts (seeds 3, 5, 9, 12, 33: a host
//! whose clock lagged is dropped and restarted), holds released at once, partitions,
//! one-way and long partitions, slow handlers, malformed frames and reconnect races.

use ctlplane_core::regressions::Regressions;
use ctlplane_sim::engine::{run_with_options, RunConfig, StepOptions};
use ctlplane_sim::knobs::Knobs;

/// Seeds compared (env `CTLSIM_SKIP_SEEDS`, comma-separated, overrides).
fn seeds() -> Vec<u64> {
    std::env::var("CTLSIM_SKIP_SEEDS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![3, 4, 5, 9, 10, 12, 33])
}

#[test]
fn skipping_idle_hosts_changes_no_trace() {
    let none = Regressions::default();
    for seed in seeds() {
        let cfg = RunConfig::new(seed);
        let skipped = run_with_options(&cfg, &none, &Knobs::default(), StepOptions { skip_idle_hosts: true });
        let ticked = run_with_options(&cfg, &none, &Knobs::default(), StepOptions { skip_idle_hosts: false });
        assert!(skipped.steps > 100, "seed {seed}: the run did not run");
        assert_eq!(
            skipped.trace_hash, ticked.trace_hash,
            "seed {seed}: skipping idle hosts changed the trace (ctlsim run --seed {seed} --trace t.jsonl)"
        );
        assert_eq!(skipped.steps, ticked.steps, "seed {seed}");
        assert_eq!(skipped.violations, ticked.violations, "seed {seed}");
        assert_eq!(skipped.stats, ticked.stats, "seed {seed}");
    }
}
