//! The same seed on the same build gives the same trace hash; different seeds differ. Seeds
//! run the main job's scenario (`full`, its world and fault plan drawn from the seed).
//!
//! Each seed runs twice on one thread; seeds are spread over two threads (a simulation's
//! state is thread-local, so runs on different threads do not interact).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ctlplane_sim::engine::RunConfig;
use ctlplane_sim::scenario::run;

/// Seeds run twice each (env `CTLSIM_DETERMINISM_SEEDS` overrides, for a quick local run).
fn seeds() -> u64 {
    std::env::var("CTLSIM_DETERMINISM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20)
}

#[test]
fn twenty_seeds_replay_bit_for_bit() {
    let n = seeds();
    let next = Arc::new(AtomicU64::new(0));
    let hashes = Arc::new(Mutex::new(BTreeMap::new()));
    let handles: Vec<_> = (0..2)
        .map(|_| {
            let (next, hashes) = (next.clone(), hashes.clone());
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= n {
                    return;
                }
                let a = run(&RunConfig::new(seed));
                let b = run(&RunConfig::new(seed));
                assert!(a.steps > 100, "seed {seed}: the run did not run ({} steps)", a.steps);
                assert!(
                    a.stats.get("trace.events").copied().unwrap_or(0) > 1000,
                    "seed {seed}: almost nothing was traced"
                );
                assert_eq!(
                    a.trace_hash, b.trace_hash,
                    "seed {seed}: two runs differ (replay: ctlsim replay --seed {seed}); stats {:?} vs {:?}",
                    a.stats, b.stats
                );
                assert_eq!(a.steps, b.steps, "seed {seed}");
                assert_eq!(a.violations, b.violations, "seed {seed}");
                hashes.lock().unwrap().insert(seed, a.trace_hash);
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a determinism thread failed (see its panic above)");
    }
    let hashes = hashes.lock().unwrap();
    assert_eq!(hashes.len() as u64, n);
    let mut distinct: Vec<u64> = hashes.values().copied().collect();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct.len() as u64, n, "different seeds gave the same trace hash: {hashes:?}");
}
