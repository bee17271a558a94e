//! Shrinking a failing race seed gives a plan no larger that still fires the same oracle.

use ctlplane_sim::engine::RunConfig;
use ctlplane_sim::{scenario, shrink};

#[test]
fn shrinking_ec_s1_keeps_rep_answers_firing_with_no_larger_plan() {
    let s = shrink::shrink(1, "ec-s1", None).expect("ec-s1 seed 1 fails");
    assert_eq!(s.oracle, "rep-answers");
    assert!(shrink::no_larger(&s.minimal, &s.original), "{:?} vs {:?}", s.minimal, s.original);
    assert!(!s.minimal.faults.is_empty(), "the race needs its malformed frame");
    assert!(s.minimal.faults.len() < s.original.faults.len(), "the other faults are dropped");
    let cfg = RunConfig { seed: 1, scenario: "ec-s1".into(), plan: Some(s.minimal.clone()), keep_trace: false };
    let report = scenario::run(&cfg);
    assert!(report.violations.iter().any(|v| v.oracle == "rep-answers"), "the minimal plan still fails");
}

#[test]
fn a_passing_seed_has_nothing_to_shrink() {
    let plan = ctlplane_sim::faults::FaultPlan::none(1);
    assert!(matches!(shrink::shrink(1, "ec-s1", Some(plan)), Err(shrink::ShrinkError::Passes { .. })));
}
