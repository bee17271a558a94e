//! The seeded suite: N seeds of the main job's scenario (`full`), each with its own world and
//! fault plan, and not one oracle may fire. N comes from `CTLSIM_SUITE_SEEDS` (default 200); seeds start at
//! `CTLSIM_SUITE_FIRST` (default 0). Seeds run on `CTLSIM_SUITE_THREADS` threads (default
//! 2): every simulation keeps its state thread-local, so runs on different threads are
//! independent. With `CTLSIM_SUITE_FAIL_FAST=1` no seed starts after one failed (the
//! mutation job, `scripts/mutation.sh`: one verdict is enough to kill a mutant).
//!
//! A watchdog ends the suite with a verdict when no simulation step finishes for
//! `CTLSIM_SUITE_STALL_SECS` (default 60) of wall time: a step that never returns (a loop
//! inside the core or a host that never yields nor reads the clock) stops simulated time,
//! and is a failure with its seeds to replay rather than a hang.

use std::collections::BTreeSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ctlplane_sim::engine::{RunConfig, STEPS_FINISHED};
use ctlplane_sim::scenario::run;

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

#[test]
fn seeded_suite_of_the_full_topology_has_no_violations() {
    let n = env("CTLSIM_SUITE_SEEDS", 200);
    let first = env("CTLSIM_SUITE_FIRST", 0);
    let threads = env("CTLSIM_SUITE_THREADS", 2).max(1);
    let fail_fast = env("CTLSIM_SUITE_FAIL_FAST", 0) != 0;
    let next = Arc::new(AtomicU64::new(first));
    let failures = Arc::new(Mutex::new(Vec::new()));
    let sim_secs = Arc::new(Mutex::new(0f64));
    let running: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let finished = Arc::new(AtomicBool::new(false));
    watchdog(env("CTLSIM_SUITE_STALL_SECS", 60), running.clone(), finished.clone());
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (next, failures, sim_secs) = (next.clone(), failures.clone(), sim_secs.clone());
            let running = running.clone();
            std::thread::spawn(move || loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= first + n || (fail_fast && !failures.lock().unwrap().is_empty()) {
                    return;
                }
                running.lock().unwrap().insert(seed);
                let report = run(&RunConfig::new(seed));
                running.lock().unwrap().remove(&seed);
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
    finished.store(true, Ordering::Relaxed);
    let mut failures = failures.lock().unwrap().clone();
    failures.sort();
    for (_, text) in &failures {
        eprintln!("{text}");
    }
    eprintln!("{n} seeds, {:.0} simulated seconds, {} failing", sim_secs.lock().unwrap(), failures.len());
    assert!(failures.is_empty(), "{} of {n} seeds broke an oracle (see above)", failures.len());
}

/// Ends the process with a verdict when no step of any run finishes for `stall_secs`.
fn watchdog(stall_secs: u64, running: Arc<Mutex<BTreeSet<u64>>>, finished: Arc<AtomicBool>) {
    let stall = Duration::from_secs(stall_secs.max(1));
    std::thread::spawn(move || {
        let mut last = STEPS_FINISHED.load(Ordering::Relaxed);
        let mut still = Duration::ZERO;
        let tick = Duration::from_millis(500);
        while !finished.load(Ordering::Relaxed) {
            std::thread::sleep(tick);
            let now = STEPS_FINISHED.load(Ordering::Relaxed);
            still = if now == last { still + tick } else { Duration::ZERO };
            last = now;
            if still >= stall {
                let seeds = running.lock().map(|r| r.iter().copied().collect::<Vec<_>>()).unwrap_or_default();
                // Straight to stderr: the test harness's capture would go down with the process.
                let mut err = std::io::stderr().lock();
                for seed in &seeds {
                    let _ = writeln!(
                        err,
                        "seed {seed}: step-budget: no simulation step finished in {stall:?} of wall time (a loop \
                         that never yields holds a step); replay: ctlsim replay --seed {seed}"
                    );
                }
                let _ = writeln!(err, "the seeded suite stalled on seeds {seeds:?}");
                std::process::exit(101);
            }
        }
    });
}

/// The oracles are not vacuous: a historical behaviour of the race catalogue switched on
/// makes the oracle it names fire, and the same seed without it passes.
#[test]
fn race_switches_make_their_oracles_fire() {
    use ctlplane_core::regressions::Regressions;
    use ctlplane_sim::engine::run_with;
    use ctlplane_sim::faults::{Fault, FaultKind, FaultPlan, Garbage};

    let quiet = RunConfig { plan: Some(FaultPlan::none(1)), ..RunConfig::new(1) };
    let fixed = run(&quiet);
    assert!(fixed.violations.is_empty(), "{:?}", fixed.violations);

    // S6: the inbox subscribes to rank 0 only and counts one shard.
    let mut s6 = Regressions::default();
    s6.inbox.s6_base_shard_only = true;
    let report = run_with(&quiet, &s6);
    assert!(
        report.violations.iter().any(|v| v.oracle == "accept-before-ready"),
        "S6 went unnoticed: {:?}",
        report.violations.iter().map(|v| &v.oracle).collect::<Vec<_>>()
    );

    // S1: an undecodable request kills the control thread; the REP never answers it.
    let mut plan = FaultPlan::none(1);
    plan.faults.push(Fault {
        at_ms: 2_000,
        kind: FaultKind::Malformed {
            from: "producer0".into(),
            to: "consumer0-r1".into(),
            count: 1,
            garbage: Garbage::NotJson,
        },
    });
    let malformed = RunConfig { plan: Some(plan), ..RunConfig::new(1) };
    let fixed = run(&malformed);
    assert!(fixed.violations.is_empty(), "{:?}", fixed.violations);
    assert!(fixed.stats.get("shard.malformed").copied().unwrap_or(0) >= 1, "the malformed frame was not sent");
    let mut s1 = Regressions::default();
    s1.shard.s1_undecodable_kills_server = true;
    let report = run_with(&malformed, &s1);
    assert!(
        report.violations.iter().any(|v| v.oracle == "rep-answers"),
        "S1 went unnoticed: {:?}",
        report.violations.iter().map(|v| &v.oracle).collect::<Vec<_>>()
    );
}
