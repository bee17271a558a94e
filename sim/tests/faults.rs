//! `FaultDriver` on a real turmoil world: faults start and heal on time, crashed hosts
//! come back, `heal_all` ends everything, and every step is traced.

use std::time::Duration;

use ctlplane_sim::faults::{self, Fault, FaultDriver, FaultKind, FaultPlan, Garbage};
use ctlplane_sim::trace;

fn world() -> turmoil::Sim<'static> {
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(3600))
        .tick_duration(Duration::from_millis(1))
        .rng_seed(1)
        .build();
    for h in ["a", "b"] {
        sim.host(h, || async {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }
    sim
}

fn plan() -> FaultPlan {
    let mut p = FaultPlan::none(1);
    p.faults = vec![
        Fault { at_ms: 10, kind: FaultKind::Partition { a: "a".into(), b: "b".into(), for_ms: 20 } },
        Fault { at_ms: 15, kind: FaultKind::Crash { host: "b".into(), down_ms: 30 } },
        Fault { at_ms: 20, kind: FaultKind::SlowHandler { host: "a".into(), delay_ms: 31_000, for_ms: 10 } },
        Fault {
            at_ms: 25,
            kind: FaultKind::Malformed { from: "a".into(), to: "b".into(), count: 2, garbage: Garbage::NotJson },
        },
        Fault { at_ms: 100, kind: FaultKind::Crash { host: "a".into(), down_ms: 1_000 } },
        Fault { at_ms: 5_000, kind: FaultKind::Hold { a: "a".into(), b: "b".into(), for_ms: 10 } },
    ];
    p
}

/// Steps until `until`, applying due faults first, as the engine does.
fn step_to(sim: &mut turmoil::Sim<'_>, d: &mut FaultDriver, until: Duration) {
    while sim.elapsed() < until {
        let now = sim.elapsed();
        d.step(sim, now);
        sim.step().expect("the world runs");
    }
}

#[test]
fn faults_start_and_heal_on_time() {
    trace::reset(true);
    let mut sim = world();
    let mut d = FaultDriver::new(&plan());
    let (a, b) = (sim.lookup("a"), sim.lookup("b"));
    assert_eq!(d.next_due(), Some(Duration::from_millis(10)));
    step_to(&mut sim, &mut d, Duration::from_millis(11));
    assert!(d.is_partitioned(a, b) && d.is_partitioned(b, a));
    step_to(&mut sim, &mut d, Duration::from_millis(16));
    assert!(!sim.is_host_running("b"));
    step_to(&mut sim, &mut d, Duration::from_millis(21));
    assert_eq!(faults::handler_delay("a"), Some(Duration::from_millis(31_000)));
    step_to(&mut sim, &mut d, Duration::from_millis(26));
    assert_eq!(faults::take_malformed_to("a", "c", false), None, "frames are for b only");
    assert_eq!(faults::take_malformed("a"), Some(b"{not json".to_vec()));
    step_to(&mut sim, &mut d, Duration::from_millis(31));
    assert!(!d.is_partitioned(a, b), "repaired after 20 ms");
    assert_eq!(faults::handler_delay("a"), None, "slow for 10 ms only");
    step_to(&mut sim, &mut d, Duration::from_millis(46));
    assert!(sim.is_host_running("b"), "restarted after 30 ms down");
    step_to(&mut sim, &mut d, Duration::from_millis(101));
    assert!(!sim.is_host_running("a"));
    // Everything ends now: a comes back, the hold at 5 s never starts, the unsent
    // malformed frame is forgotten.
    let now = sim.elapsed();
    d.heal_all(&mut sim, now);
    assert!(sim.is_host_running("a"));
    assert_eq!(d.next_due(), None);
    assert_eq!(faults::take_malformed("a"), None);
    let t = trace::take();
    let actions: Vec<String> = t
        .events
        .iter()
        .filter(|e| e.kind.starts_with("fault."))
        .map(|e| {
            let action = e.fields.iter().find(|(k, _)| k == "action").map_or("", |(_, v)| v.as_str());
            format!("{}:{action}", e.kind)
        })
        .collect();
    assert_eq!(
        actions,
        [
            "fault.partition:partition",
            "fault.crash:crash",
            "fault.slow_handler:slow_on",
            "fault.malformed:arm",
            "fault.partition:repair",
            "fault.slow_handler:slow_off",
            "fault.crash:restart",
            "fault.crash:crash",
            "fault.crash:restart",
            "fault.heal_all:",
        ]
    );
}

#[test]
fn a_drawn_plan_applies_without_touching_unknown_hosts() {
    let topo = ctlplane_sim::topology::Topology::small();
    for seed in 0..30 {
        let plan = FaultPlan::draw(seed, &topo, Duration::from_secs(20));
        plan.validate(&topo).expect("a drawn plan fits its topology");
        let names = topo.hosts();
        for f in &plan.faults {
            assert!(f.kind.hosts().iter().all(|h| names.iter().any(|n| n == h)));
            assert!(f.at_ms + f.kind.span_ms() < 20_000);
        }
    }
}
