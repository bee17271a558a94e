//! Findings of the swarmed world that ctlplane still has (`docs/races.md`, "Found by the
//! swarmed world"). Each replays a saved plan (its world included) with every switch off
//! and checks the oracle still fires: when core fixes one, its test fails and the finding
//! moves to the catalogue with a regression switch.

use ctlplane_sim::engine::RunConfig;
use ctlplane_sim::faults::FaultPlan;
use ctlplane_sim::scenario::run;

/// Two producers push one transfer id (a retried encoder call, ec-behaviour.md S24): one
/// push fails on a rank, its cleanup abandons the grant both share on the other ranks, and
/// the other push's write lands in the cancelled reservation.
#[test]
fn a_failed_push_abandons_the_grant_a_retried_push_of_the_same_transfer_id_writes_into() {
    let text = include_str!("plans/shared-transfer-id-abandon.json");
    let plan = FaultPlan::from_json(text).expect("the saved plan parses");
    assert!(plan.world.as_ref().is_some_and(|w| w.retry.is_some()), "the plan carries its world");
    let report = run(&RunConfig { seed: plan.seed, scenario: "full".into(), plan: Some(plan), keep_trace: false });
    assert!(
        report.violations.iter().any(|v| v.oracle == "write-owned" && v.detail.contains("CANCELLED")),
        "the finding no longer shows (fixed? move it to the catalogue): {:?}",
        report.violations
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
