//! A CI-sized part of `ctlsim catalogue`: races the simulator finds within a few seeds
//! with their switch on must be found, and the same seeds must pass with every switch off.
//! The full catalogue (every race, 200 seeds) and its wall time are in `docs/races.md`.

use ctlplane_core::regressions::race;
use ctlplane_sim::catalogue::{self, check_race};

/// Races found within this many seeds on this build.
const CAP: u64 = 5;
const CI_RACES: &[&str] = &[
    "ec-s1",
    "ec-s4",
    "ec-s5",
    "ec-s6",
    "ec-s8",
    "ec-s10",
    "ec-s11",
    "ec-s12",
    "ec-s12b",
    "ec-s13",
    "ec-s14",
    "ec-s16",
    "p2p-s1",
    "p2p-s2",
    "p2p-s3",
    "p2p-s4",
    "p2p-s5",
    "p2p-s6",
    "p2p-s7",
    "p2p-s10",
    "p2p-s18",
    "ec-s9",
    "ec-s17",
    "p2p-hwm",
    "ec-s7",
    "ec-s24",
    "ec-s20",
    "ec-dup-push",
];

#[test]
fn ci_races_are_found_with_the_switch_and_pass_with_the_fix() {
    for name in CI_RACES {
        let r = check_race(race(name).expect("in the catalogue"), 0, CAP);
        let (seed, _) = r.found.unwrap_or_else(|| panic!("{name} not found within {CAP} seeds"));
        let oracle = r.oracle.clone().expect("an oracle fired");
        assert!(race(name).is_some_and(|r| r.oracles.contains(&oracle.as_str())), "{name}: {oracle}");
        if r.switched {
            assert_eq!(r.fixed_runs, seed + 1, "every searched seed reran with the fix");
        } else {
            assert_eq!(r.fixed_runs, 0, "{name}: a race ctlplane has gets no fixed run");
        }
        assert!(r.fixed_failures.is_empty(), "{name} fails with the fix: {:?}", r.fixed_failures);
        assert!(r.ok());
    }
}

#[test]
fn the_table_has_a_row_per_race_and_a_summary() {
    let mut out = Vec::new();
    let only: Vec<String> = vec!["ec-s6".to_string()];
    let rows = catalogue::run(&only, 0, 2, &mut out);
    let text = String::from_utf8(out).expect("utf-8");
    assert_eq!(rows.len(), 1);
    assert!(text.contains("ec-s6") && text.contains("s6_base_shard_only"), "{text}");
    assert!(text.contains("accept-before-ready"), "{text}");
    assert!(text.contains("1/1 races found within 2 seeds"), "{text}");
}

/// Races the generic catalogue (`ctlsim catalogue --generic`, the main job's swarmed world
/// with only the race's switch on) finds within a couple of seeds on this build. The full
/// generic table (every race, 200 seeds) is in `docs/races.md`.
const GENERIC_CAP: u64 = 3;
const GENERIC_CI_RACES: &[&str] = &["ec-s6", "ec-s8", "ec-s9", "ec-s24", "p2p-s1", "p2p-s3", "p2p-s18", "p2p-hwm"];

#[test]
fn generic_ci_races_are_found_on_the_main_job_and_pass_with_the_fix() {
    let only: Vec<String> = GENERIC_CI_RACES.iter().map(|s| s.to_string()).collect();
    let mut out = Vec::new();
    let rows = catalogue::run_in(&only, 0, GENERIC_CAP, true, &mut out);
    let text = String::from_utf8(out).expect("utf-8");
    assert_eq!(rows.len(), GENERIC_CI_RACES.len(), "{text}");
    for r in &rows {
        assert!(r.switched, "{}: every CI race here has a switch", r.scenario);
        let (seed, _) =
            r.found.unwrap_or_else(|| panic!("{} not found within {GENERIC_CAP} seeds:\n{text}", r.scenario));
        assert_eq!(r.fixed_runs, seed + 1, "{}: every searched seed reran with the fix", r.scenario);
        assert!(r.fixed_failures.is_empty(), "{} fails with the fix:\n{text}", r.scenario);
    }
}
