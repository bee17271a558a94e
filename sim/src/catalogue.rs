//! `ctlsim catalogue`: for every race of the catalogue, search seeds with its switch on
//! until one of the race's oracles fires, then run the same seeds with every switch off,
//! which must all pass. A race ctlplane still has (no switch) is found with every switch
//! off and has no fixed run.
//!
//! `--generic` searches each race on the main job's scenario instead of its tuned one:
//! the swarmed `full` world (`crate::world_swarm`) with only the race's switch on, no
//! hand-picked knobs and no fault bias (`generic-<race>`, `scenario::GENERIC_PREFIX`). A
//! race ctlplane still has is searched with the setting it needs allowed in the draw
//! (`world_swarm::Exposure`), since that setting is its only switch.

use std::io::Write;
use std::time::{Duration, Instant};

use ctlplane_core::regressions::{Race, RACES};

use crate::engine::RunConfig;
use crate::scenario;

/// Seeds searched per race unless told otherwise.
pub const DEFAULT_CAP: u64 = 200;

/// What the catalogue found for one race.
#[derive(Clone, Debug)]
pub struct RaceResult {
    pub scenario: &'static str,
    /// `false`: ctlplane has the race as it is (no switch).
    pub switched: bool,
    /// The seed whose run fired one of the race's oracles, and how many seeds that took.
    pub found: Option<(u64, u64)>,
    /// The race oracle that fired.
    pub oracle: Option<String>,
    /// Seeds run with every switch off, and the seeds among them where a race oracle fired.
    pub fixed_runs: u64,
    pub fixed_failures: Vec<(u64, String)>,
    pub wall: Duration,
}

impl RaceResult {
    /// Found, and (for a switched race) none of the searched seeds failed with the fix.
    pub fn ok(&self) -> bool {
        self.found.is_some() && self.fixed_failures.is_empty()
    }
}

/// The first of `race`'s oracles among a run's violations.
pub fn race_oracle(race: &Race, violations: &[crate::oracle::Violation]) -> Option<String> {
    violations.iter().find(|v| race.oracles.contains(&v.oracle.as_str())).map(|v| v.oracle.clone())
}

/// Searches `first..first + cap` for `race`, then re-runs the searched seeds with the fix.
pub fn check_race(race: &'static Race, first: u64, cap: u64) -> RaceResult {
    check_race_in(race, race.scenario, first, cap)
}

/// [`check_race`] on scenario `name` (the race's own, or its generic one).
pub fn check_race_in(race: &'static Race, name: &str, first: u64, cap: u64) -> RaceResult {
    let wall = Instant::now();
    let switched = race.switches.is_some();
    let mut found = None;
    let mut oracle = None;
    for (i, seed) in (first..first.saturating_add(cap)).enumerate() {
        let cfg = RunConfig { seed, scenario: name.to_string(), plan: None, keep_trace: false };
        let report = scenario::run_switched(&cfg, true);
        if let Some(o) = race_oracle(race, &report.violations) {
            found = Some((seed, i as u64 + 1));
            oracle = Some(o);
            break;
        }
    }
    let mut fixed_runs = 0;
    let mut fixed_failures = Vec::new();
    if switched {
        let last = found.map(|(s, _)| s + 1).unwrap_or(first.saturating_add(cap));
        for seed in first..last {
            let cfg = RunConfig { seed, scenario: name.to_string(), plan: None, keep_trace: false };
            let report = scenario::run_switched(&cfg, false);
            fixed_runs += 1;
            if let Some(o) = race_oracle(race, &report.violations) {
                fixed_failures.push((seed, o));
            }
        }
    }
    RaceResult { scenario: race.scenario, switched, found, oracle, fixed_runs, fixed_failures, wall: wall.elapsed() }
}

/// Checks the races named in `only` (every race when empty) and prints the table to `out`
/// as each row completes. Returns every row; the command fails unless each is `ok`.
pub fn run(only: &[String], first: u64, cap: u64, out: &mut impl Write) -> Vec<RaceResult> {
    run_in(only, first, cap, false, out)
}

/// [`run`], on each race's generic scenario when `generic`.
pub fn run_in(only: &[String], first: u64, cap: u64, generic: bool, out: &mut impl Write) -> Vec<RaceResult> {
    let _ = writeln!(
        out,
        "{:<9} {:<36} {:>6} {:>9} {:<24} {:>11} {:>8}",
        "scenario", "switch", "seed", "seeds", "oracle", "fixed pass", "wall s"
    );
    let mut rows = Vec::new();
    for race in RACES.iter().filter(|r| only.is_empty() || only.iter().any(|o| o == r.scenario)) {
        let name =
            if generic { format!("{}{}", scenario::GENERIC_PREFIX, race.scenario) } else { race.scenario.into() };
        let r = check_race_in(race, &name, first, cap);
        let switch = if r.switched { switch_name(race) } else { "none (present)".to_string() };
        let (seed, seeds) = match r.found {
            Some((s, n)) => (s.to_string(), n.to_string()),
            None => ("-".to_string(), format!(">{cap}")),
        };
        let fixed = if r.switched {
            format!("{}/{}", r.fixed_runs - r.fixed_failures.len() as u64, r.fixed_runs)
        } else {
            "n/a".to_string()
        };
        let _ = writeln!(
            out,
            "{:<9} {:<36} {:>6} {:>9} {:<24} {:>11} {:>8.1}{}",
            r.scenario,
            switch,
            seed,
            seeds,
            r.oracle.as_deref().unwrap_or("NOT FOUND"),
            fixed,
            r.wall.as_secs_f64(),
            if r.ok() { "" } else { "  FAILED" }
        );
        for (s, o) in &r.fixed_failures {
            let _ = writeln!(out, "  fixed run of seed {s} fired {o}: ctlsim run --seed {s} --scenario {name} --fixed");
        }
        let _ = out.flush();
        rows.push(r);
    }
    let found = rows.iter().filter(|r| r.found.is_some()).count();
    let ok = rows.iter().filter(|r| r.ok()).count();
    let _ = writeln!(out, "{found}/{} races found within {cap} seeds, {ok} with every fixed run passing", rows.len());
    rows
}

/// The switch's fields, as `docs/races.md` names them (from the `Regressions` debug
/// form), joined with `+` where a race turns on several.
fn switch_name(race: &Race) -> String {
    let r = race.regressions();
    let d = format!("{r:?}");
    // The fields set to `true` or `Some(..)`.
    let on: Vec<&str> = d
        .split(['{', ',', '}'])
        .filter_map(|part| part.trim().split_once(':'))
        .filter(|(_, v)| v.trim() == "true" || v.trim().starts_with("Some("))
        .map(|(k, _)| k.trim())
        .collect();
    if on.is_empty() {
        "on".to_string()
    } else {
        on.join("+")
    }
}

/// `ctlsim catalogue` arguments.
#[derive(Debug, clap::Args)]
pub struct CatalogueArgs {
    /// Seeds searched per race.
    #[arg(long, default_value_t = DEFAULT_CAP)]
    pub cap: u64,
    /// The first seed searched.
    #[arg(long, default_value_t = 0)]
    pub first: u64,
    /// Only these races (comma-separated scenario names); all when absent.
    #[arg(long, value_delimiter = ',')]
    pub races: Vec<String>,
    /// Search each race on the main job's swarmed scenario with only its switch on
    /// (`generic-<race>`): no tuned knobs, no fault bias.
    #[arg(long)]
    pub generic: bool,
}

/// Runs `ctlsim catalogue`. `Ok(true)`: every race found and every fixed run passed.
pub fn execute(a: &CatalogueArgs, out: &mut impl Write) -> Result<bool, crate::cli::CliError> {
    if let Some(bad) = a.races.iter().find(|n| ctlplane_core::regressions::race(n).is_none()) {
        return Err(crate::cli::CliError::UnknownScenario(bad.clone()));
    }
    let rows = run_in(&a.races, a.first, a.cap, a.generic, out);
    Ok(rows.iter().all(RaceResult::ok))
}
