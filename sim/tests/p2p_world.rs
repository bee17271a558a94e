//! The P2P world on its own: peers handshake, keep talking through faults, recover after
//! them, and the oracles fire on the historical transport bugs they exist for.

use std::time::Duration;

use ctlplane_core::p2p::T0Switches;
use ctlplane_sim::faults::{Fault, FaultDriver, FaultKind, FaultPlan};
use ctlplane_sim::oracle::{self, Violation};
use ctlplane_sim::topology::Topology;
use ctlplane_sim::{clock, p2p, trace};

fn peers_only(n: usize) -> Topology {
    let mut t = Topology::small();
    t.producers.clear();
    t.consumers.clear();
    t.schedulers.clear();
    t.p2p_peers = (0..n).map(|i| format!("peer{i}")).collect();
    t
}

struct Outcome {
    violations: Vec<Violation>,
    hash: u64,
}

/// Steps the world with a fixed 1 ms tick: `plan` during `active`, then everything healed
/// and `quiet` more, then the liveness check.
fn run(seed: u64, topo: &Topology, plan: &FaultPlan, active: Duration, quiet: Duration, t0: T0Switches) -> Outcome {
    clock::reset();
    trace::reset(false);
    oracle::reset();
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(24 * 3600))
        .tick_duration(Duration::from_millis(1))
        .rng_seed(seed)
        .build();
    p2p::install_with(&mut sim, topo, seed, t0);
    let mut driver = FaultDriver::new(plan);
    while sim.elapsed() < active {
        let now = sim.elapsed();
        driver.step(&mut sim, now);
        sim.step().expect("the simulation runs");
        p2p::check_safety();
    }
    let now = sim.elapsed();
    driver.heal_all(&mut sim, now);
    while sim.elapsed() < active + quiet {
        sim.step().expect("the simulation runs");
        p2p::check_safety();
    }
    p2p::check_liveness();
    Outcome { violations: oracle::take(), hash: trace::take().hash() }
}

fn oracles(v: &[Violation]) -> Vec<&str> {
    let mut o: Vec<&str> = v.iter().map(|v| v.oracle.as_str()).collect();
    o.dedup();
    o
}

#[test]
fn four_peers_handshake_and_talk_without_faults() {
    let topo = peers_only(4);
    let out =
        run(1, &topo, &FaultPlan::none(1), Duration::from_secs(5), Duration::from_secs(10), T0Switches::default());
    assert!(out.violations.is_empty(), "{:#?}", out.violations);
    for a in &topo.p2p_peers {
        for b in &topo.p2p_peers {
            if a != b {
                assert_eq!(p2p::handshakes(a, b), 1, "{a} with {b}");
            }
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    let topo = peers_only(3);
    let plan = FaultPlan::draw(9, &topo, Duration::from_secs(20));
    let a = run(9, &topo, &plan, Duration::from_secs(20), Duration::from_secs(5), T0Switches::default());
    let b = run(9, &topo, &plan, Duration::from_secs(20), Duration::from_secs(5), T0Switches::default());
    assert_eq!(a.hash, b.hash);
}

fn crash_plan(host: &str, at_ms: u64, down_ms: u64) -> FaultPlan {
    let mut plan = FaultPlan::none(0);
    plan.faults.push(Fault { at_ms, kind: FaultKind::Crash { host: host.into(), down_ms } });
    plan
}

#[test]
fn pairs_handshake_again_after_a_crash_and_a_long_partition() {
    let topo = peers_only(3);
    let mut plan = crash_plan("peer1", 3_000, 2_000);
    plan.faults.push(Fault {
        at_ms: 6_000,
        kind: FaultKind::LongPartition { a: "peer0".into(), b: "peer2".into(), for_ms: 15_000 },
    });
    let out = run(2, &topo, &plan, Duration::from_secs(25), p2p::QUIET_PERIOD, T0Switches::default());
    assert!(out.violations.is_empty(), "{:#?}", out.violations);
    assert!(p2p::handshakes("peer0", "peer1") >= 2, "peer0 re-handshook with the restarted peer1");
    assert!(p2p::handshakes("peer0", "peer2") >= 2, "the partition outlived the heartbeat timeout");
}

#[test]
fn mark_dead_closing_the_connection_leaks_its_sockets() {
    // S3: with the T0 behaviour, a connection found dead is swept without its DEALER and
    // monitor ever being closed.
    let topo = peers_only(2);
    let t0 = T0Switches { mark_dead_closes: true, ..T0Switches::default() };
    let plan = crash_plan("peer1", 2_000, 1_000);
    let out = run(3, &topo, &plan, Duration::from_secs(15), Duration::from_secs(20), t0);
    let o = oracles(&out.violations);
    assert!(o.contains(&"dealer-closed-once") && o.contains(&"monitor-closed-once"), "{:#?}", out.violations);
}

#[test]
fn drawn_fault_plans_leave_no_violation_behind() {
    let topo = peers_only(4);
    // The engine's active phase.
    let active = Duration::from_secs(20);
    let quiet = p2p::QUIET_PERIOD;
    let mut report = Vec::new();
    for seed in 0..8 {
        let plan = FaultPlan::draw(seed, &topo, active);
        let out = run(seed, &topo, &plan, active, quiet, T0Switches::default());
        if !out.violations.is_empty() {
            report.push((seed, plan.to_json(), out.violations));
        }
    }
    assert!(report.is_empty(), "{report:#?}");
}
