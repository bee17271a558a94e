//! `ctlsim shrink`: the smallest fault plan of a failing seed that still makes the same
//! oracle fire, by deterministic greedy passes: drop each fault, halve each duration, move
//! each fault later; a step is kept when the oracle still fires, and passes repeat until
//! none is kept.

use crate::engine::{self, RunConfig};
use crate::faults::{Fault, FaultKind, FaultPlan};
use crate::oracle::Violation;
use crate::scenario;

/// Runs a shrink may take (the original run included).
pub const MAX_RUNS: usize = 400;

/// Why a seed cannot be shrunk.
#[derive(Debug, thiserror::Error)]
pub enum ShrinkError {
    #[error("unknown scenario {0:?}")]
    UnknownScenario(String),
    #[error("seed {seed} passes in scenario {scenario}: nothing to shrink")]
    Passes { seed: u64, scenario: String },
    #[error("cannot write plan {path}: {source}")]
    WritePlan { path: std::path::PathBuf, source: std::io::Error },
}

/// The outcome of a shrink.
#[derive(Clone, Debug)]
pub struct Shrunk {
    /// The oracle kept firing.
    pub oracle: String,
    pub original: FaultPlan,
    pub minimal: FaultPlan,
    /// Simulations run.
    pub runs: usize,
}

/// The oracle a shrink holds on to: for a race scenario the first of the race's oracles that
/// fired, otherwise the first violation's.
fn target(scenario_name: &str, violations: &[Violation]) -> Option<String> {
    match ctlplane_core::regressions::race(scenario_name) {
        Some(race) => crate::catalogue::race_oracle(race, violations),
        None => violations.first().map(|v| v.oracle.clone()),
    }
}

fn fires(seed: u64, scenario_name: &str, plan: &FaultPlan, oracle: &str) -> bool {
    let cfg = RunConfig { seed, scenario: scenario_name.to_string(), plan: Some(plan.clone()), keep_trace: false };
    scenario::run(&cfg).violations.iter().any(|v| v.oracle == oracle)
}

/// Shrinks the plan of `seed` in `scenario_name` (its own plan, or `plan` when given).
pub fn shrink(seed: u64, scenario_name: &str, plan: Option<FaultPlan>) -> Result<Shrunk, ShrinkError> {
    let topo = scenario::topology(scenario_name).ok_or_else(|| ShrinkError::UnknownScenario(scenario_name.into()))?;
    let original = match plan {
        Some(p) => p,
        None => {
            scenario::plan(seed, scenario_name).ok_or_else(|| ShrinkError::UnknownScenario(scenario_name.into()))?
        }
    };
    let cfg = RunConfig { seed, scenario: scenario_name.to_string(), plan: Some(original.clone()), keep_trace: false };
    let first = scenario::run(&cfg);
    let oracle = target(scenario_name, &first.violations)
        .ok_or_else(|| ShrinkError::Passes { seed, scenario: scenario_name.to_string() })?;
    let mut runs = 1;
    let mut best = original.clone();
    let horizon = engine::ACTIVE.as_millis() as u64;
    let try_plan = |candidate: FaultPlan, runs: &mut usize| -> Option<FaultPlan> {
        if *runs >= MAX_RUNS || candidate.validate(&topo).is_err() {
            return None;
        }
        *runs += 1;
        fires(seed, scenario_name, &candidate, &oracle).then_some(candidate)
    };
    loop {
        let mut kept = false;
        // Drop each fault (from the last, so indices stay valid).
        let mut i = best.faults.len();
        while i > 0 {
            i -= 1;
            let mut c = best.clone();
            c.faults.remove(i);
            if let Some(c) = try_plan(c, &mut runs) {
                best = c;
                kept = true;
            }
        }
        // Halve each duration.
        for i in 0..best.faults.len() {
            if let Some(kind) = halved(&best.faults[i].kind) {
                let mut c = best.clone();
                c.faults[i].kind = kind;
                if let Some(c) = try_plan(c, &mut runs) {
                    best = c;
                    kept = true;
                }
            }
        }
        // Move each fault halfway to the latest start that still ends in the active phase.
        for i in 0..best.faults.len() {
            let f = &best.faults[i];
            let latest = horizon.saturating_sub(f.kind.span_ms() + 1);
            if latest <= f.at_ms + 1 {
                continue;
            }
            let mut c = best.clone();
            c.faults[i] = Fault { at_ms: f.at_ms + (latest - f.at_ms) / 2, kind: f.kind.clone() };
            c.faults.sort_by_key(|f| f.at_ms);
            if let Some(c) = try_plan(c, &mut runs) {
                best = c;
                kept = true;
            }
        }
        if !kept || runs >= MAX_RUNS {
            break;
        }
    }
    Ok(Shrunk { oracle, original, minimal: best, runs })
}

/// `kind` with its duration halved, or `None` when it is already minimal. A slow handler
/// keeps its delay (it must outlast the client timeout) and halves how long it lasts.
fn halved(kind: &FaultKind) -> Option<FaultKind> {
    let half = |v: u64| (v >= 2).then_some(v / 2);
    let mut k = kind.clone();
    match &mut k {
        FaultKind::Partition { for_ms, .. }
        | FaultKind::OneWay { for_ms, .. }
        | FaultKind::Hold { for_ms, .. }
        | FaultKind::LongPartition { for_ms, .. }
        | FaultKind::SlowHandler { for_ms, .. }
        | FaultKind::StopReading { for_ms, .. }
        | FaultKind::LostLoads { for_ms, .. }
        | FaultKind::PeerClose { for_ms, .. } => *for_ms = half(*for_ms)?,
        FaultKind::Crash { down_ms, .. } => *down_ms = half(*down_ms)?,
        // At least a turn: the node shuts down before its host restarts.
        FaultKind::PeerExit { down_ms, .. } => *down_ms = half(*down_ms).filter(|&d| d >= 200)?,
        FaultKind::Malformed { count, .. } => *count = (*count >= 2).then_some(*count / 2)?,
        FaultKind::ReconnectRace { partition_ms, gap_ms, .. } => match (half(*partition_ms), half(*gap_ms)) {
            (Some(p), _) => *partition_ms = p,
            (None, Some(g)) => *gap_ms = g,
            (None, None) => return None,
        },
        FaultKind::PeerFlood { count, .. } | FaultKind::InboundFlood { count, .. } => {
            *count = (*count >= 2).then_some(*count / 2)?
        }
        FaultKind::HandlerFailures { count, .. }
        | FaultKind::OpenFailures { count, .. }
        | FaultKind::SubscribeFailures { count, .. } => *count = (*count >= 2).then_some(*count / 2)?,
        FaultKind::ReplaceRace { .. } | FaultKind::ForgedIdentity { .. } | FaultKind::Oversize { .. } => return None,
    }
    Some(k)
}

/// Whether `small` is no larger than `big`: no more faults and no longer summed span.
pub fn no_larger(small: &FaultPlan, big: &FaultPlan) -> bool {
    let span = |p: &FaultPlan| p.faults.iter().map(|f| f.kind.span_ms()).sum::<u64>();
    small.faults.len() <= big.faults.len() && span(small) <= span(big)
}

/// `ctlsim shrink` arguments.
#[derive(Debug, clap::Args)]
pub struct ShrinkArgs {
    /// The failing seed.
    #[arg(long)]
    pub seed: u64,
    /// Its scenario (a topology or a race of the catalogue).
    #[arg(long, default_value = "full")]
    pub scenario: String,
    /// Where to write the minimal plan; `shrunk-<scenario>-<seed>.json` when absent.
    #[arg(long, value_name = "FILE")]
    pub out: Option<std::path::PathBuf>,
}

/// Runs `ctlsim shrink`: prints the minimal plan and the command that replays it.
pub fn execute(a: &ShrinkArgs, out: &mut impl std::io::Write) -> Result<bool, crate::cli::CliError> {
    let s = shrink(a.seed, &a.scenario, None)?;
    let path = a.out.clone().unwrap_or_else(|| format!("shrunk-{}-{}.json", a.scenario, a.seed).into());
    std::fs::write(&path, s.minimal.to_json() + "\n")
        .map_err(|source| ShrinkError::WritePlan { path: path.clone(), source })?;
    let _ = writeln!(
        out,
        "seed {} ({}): {} fires with {} of {} faults ({} runs)",
        a.seed,
        a.scenario,
        s.oracle,
        s.minimal.faults.len(),
        s.original.faults.len(),
        s.runs
    );
    let _ = writeln!(out, "{}", s.minimal.to_json());
    let _ = writeln!(out, "replay: {}", crate::cli::replay_command(a.seed, &a.scenario, Some(&path)));
    Ok(true)
}
