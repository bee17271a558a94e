//! The seeded suite: N seeds of the full topology, each with its own fault plan, and not
//! one oracle may fire. N comes from `CTLSIM_SUITE_SEEDS` (default 200); seeds start at
//! `CTLSIM_SUITE_FIRST` (default 0). Seeds run on `CTLSIM_SUITE_THREADS` threads (default
//! 2): every simulation keeps its state thread-local, so runs on different threads are
//! independent.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ctlplane_sim::engine::{run, RunConfig};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

#[test]
fn seeded_suite_of_the_full_topology_has_no_violations() {
    let n = env("CTLSIM_SUITE_SEEDS", 200);
    let first = env("CTLSIM_SUITE_FIRST", 0);
    let threads = env("CTLSIM_SUITE_THREADS", 2).max(1);
    let next = Arc::new(AtomicU64::new(first));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let sim_secs = Arc::new(Mutex::new(0f64));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (next, failures, sim_secs) = (next.clone(), failures.clone(), sim_secs.clone());
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + n {
                    return;
                }
                let report = run(&RunConfig::new(seed));
                *sim_secs.lock().unwrap() += report.sim_time.as_secs_f64();
                assert!(report.steps > 100, "seed {seed}: the run did not run");
                if !report.violations.is_empty() {
                    let mut lines = vec![format!(
                        "seed {seed}: {} violation(s); replay: ctlsim replay --seed {seed}",
                        report.violations.len()
                    )];
                    for v in report.violations.iter().take(5) {
                        lines.push(format!("  {} at {} ns on {}: {}", v.oracle, v.t_ns, v.host, v.detail));
                    }
                    failures.lock().unwrap().push((seed, lines.join("\n")));
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("a suite thread panicked");
    }
    let mut failures = failures.lock().unwrap().clone();
    failures.sort();
    for (_, text) in &failures {
        eprintln!("{text}");
    }
    eprintln!("{n} seeds, {:.0} simulated seconds, {} failing", sim_secs.lock().unwrap(), failures.len());
    assert!(failures.is_empty(), "{} of {n} seeds broke an oracle (see above)", failures.len());
}
