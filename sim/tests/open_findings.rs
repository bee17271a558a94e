//! Findings of the swarmed world that ctlplane still has (`docs/races.md`, "Found by the
//! swarmed world"). Each replays a saved plan (its world included) with every switch off
//! and checks the oracle still fires: when core fixes one, its test fails and the finding
//! moves to the catalogue with a regression switch (its test here then checks the fix).

use ctlplane_sim::engine::RunConfig;
use ctlplane_sim::faults::FaultPlan;
use ctlplane_sim::scenario::run;

/// Fixed (`docs/races.md`, `ec-dup-push`): two producers push one transfer id (a retried
/// encoder call, ec-behaviour.md S24); one push fails on a rank and its cleanup abandons
/// what it holds on the others. The duplicate's grants are its own, so the other push's
/// write lands in a live reservation; with `dup_push_shares_grant` it lands in a
/// CANCELLED one, as before the fix.
#[test]
fn a_failed_push_abandons_only_its_own_grants_not_the_retried_push_s_destination() {
    let text = include_str!("plans/shared-transfer-id-abandon.json");
    let plan = FaultPlan::from_json(text).expect("the saved plan parses");
    assert!(plan.world.as_ref().is_some_and(|w| w.retry.is_some()), "the plan carries its world");
    let fixed =
        run(&RunConfig { seed: plan.seed, scenario: "full".into(), plan: Some(plan.clone()), keep_trace: false });
    assert!(fixed.violations.is_empty(), "fixed: {:?}", fixed.violations);
    let old = run(&RunConfig {
        seed: plan.seed,
        scenario: "generic-ec-dup-push".into(),
        plan: Some(plan),
        keep_trace: false,
    });
    assert!(
        old.violations.iter().any(|v| v.oracle == "write-owned" && v.detail.contains("CANCELLED")),
        "the switch restores the finding: {:?}",
        old.violations
    );
}

/// An encoder that runs past the TTL and a push wait that ends between the TTL and the
/// encoder's end: the scheduler's cancel reaches a writer the TTL deferred (EXPIRE_PENDING)
/// and is dropped, so the producer's refresh re-reserves the transfer on a rank that took
/// its cancel, and the new reservation lives until its TTL.
#[test]
fn a_cancel_of_a_writer_deferred_by_the_ttl_is_forgotten_and_the_refresh_reserves_again() {
    let text = include_str!("plans/cancel-of-an-expired-writer.json");
    let plan = FaultPlan::from_json(text).expect("the saved plan parses");
    assert!(plan.faults.is_empty(), "the world alone shows it");
    let report = run(&RunConfig { seed: plan.seed, scenario: "full".into(), plan: Some(plan), keep_trace: false });
    assert!(
        report.violations.iter().any(|v| v.oracle == "reservation-released"
            && v.detail.contains("reserved again after this rank took its cancel")),
        "the finding no longer shows (fixed? move it to the catalogue): {:?}",
        report.violations
    );
}
