//! The P2P races that need more than a switch: the socket bound of race S10 holds only
//! with ctlplane's fix configured (`max_peers` and the handshake deadline).

use ctlplane_core::regressions::Regressions;
use ctlplane_sim::engine::{self, RunConfig};
use ctlplane_sim::faults::{Fault, FaultKind, FaultPlan};
use ctlplane_sim::knobs::Knobs;

fn flood_plan(seed: u64) -> FaultPlan {
    let mut plan = FaultPlan::none(seed);
    plan.faults.push(Fault { at_ms: 2_000, kind: FaultKind::PeerFlood { host: "peer0".into(), count: 400 } });
    plan
}

fn oracles(regressions: &Regressions, knobs: &Knobs) -> Vec<String> {
    let cfg = RunConfig { seed: 3, scenario: "small".into(), plan: Some(flood_plan(3)), keep_trace: false };
    let report = engine::run_tuned(&cfg, regressions, knobs);
    let mut o: Vec<String> = report.violations.iter().map(|v| v.oracle.clone()).collect();
    o.sort();
    o.dedup();
    o
}

#[test]
fn unbounded_peers_exhaust_the_sockets_and_the_peer_bound_keeps_them() {
    // Mainline: no handshake deadline, no peer bound, and the open error ends the engine.
    let mut escape = Regressions::default();
    escape.manager.errors_escape = true;
    let mainline = Knobs { p2p_no_handshake_deadline: true, ..Knobs::default() };
    let found = oracles(&escape, &mainline);
    assert!(found.contains(&"sockets-bounded".to_string()), "{found:?}");
    assert!(found.contains(&"p2p-handshake-liveness".to_string()), "the engine died: {found:?}");
    // ctlplane's policy alone contains the open error, but the sockets still run out.
    let contained = oracles(&Regressions::default(), &mainline);
    assert!(contained.contains(&"sockets-bounded".to_string()), "{contained:?}");
    let bounded = Knobs { p2p_max_peers: Some(128), ..Knobs::default() };
    assert_eq!(oracles(&Regressions::default(), &bounded), Vec::<String>::new(), "128 peers and the 30 s deadline");
}
