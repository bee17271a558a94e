//! The `ctlsim` command: run one seed, sweep a range of seeds, replay a failing seed, or
//! print a seed's fault plan.
//!
//! Exit codes: 0 when no oracle fired, 1 when one did (or a run panicked), 2 for a usage
//! or I/O error. Wall-clock time is measured here only, for the sweep summary; the
//! simulation never reads it.

use std::io::{IsTerminal, Write};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use thiserror::Error;

use crate::engine::{RunConfig, RunReport};
use crate::faults::{FaultError, FaultPlan};
use crate::sweep_record::{SeedRecord, Verdict};
use crate::topology::Topology;

/// Deterministic simulation of the ctlplane control plane.
#[derive(Debug, Parser)]
#[command(name = "ctlsim", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run one seed and print its verdict and trace hash.
    Run(RunArgs),
    /// Run a range of seeds on several threads and summarise.
    Sweep(SweepArgs),
    /// Print a seed's fault plan, run it, and print the trace hash.
    Replay(ReplayArgs),
    /// Print the fault plan a seed draws, as JSON (loadable with --plan).
    Plan(PlanArgs),
    /// Find every race of the catalogue with its switch on, and check the fix passes.
    Catalogue(crate::catalogue::CatalogueArgs),
    /// Minimise a failing seed's fault plan while the same oracle fires.
    Shrink(crate::shrink::ShrinkArgs),
    /// Merge the `--json` result files of many sweep shards into one summary.
    Report(ReportArgs),
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Result files written by `ctlsim sweep --json`.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct World {
    /// The run's seed: the whole run is a function of it.
    #[arg(long)]
    pub seed: u64,
    /// The scenario (topology) to run.
    #[arg(long, default_value = "full")]
    pub scenario: String,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub world: World,
    /// Write every trace event to FILE as JSON lines.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Write the trace as Chrome trace-event JSON (ui.perfetto.dev) to FILE.
    #[arg(long, value_name = "FILE")]
    pub perfetto: Option<PathBuf>,
    /// Run this fault plan (JSON, as `ctlsim plan` prints it) instead of the seed's own.
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,
    /// Run a race scenario with its switches off: the catalogue's fixed run.
    #[arg(long)]
    pub fixed: bool,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub world: World,
    /// Replay this fault plan instead of the seed's own.
    #[arg(long, value_name = "FILE")]
    pub plan: Option<PathBuf>,
    /// Write every trace event to FILE as JSON lines.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Write the trace as Chrome trace-event JSON (ui.perfetto.dev) to FILE.
    #[arg(long, value_name = "FILE")]
    pub perfetto: Option<PathBuf>,
    /// Replay a race scenario with its switches off: the catalogue's fixed run.
    #[arg(long)]
    pub fixed: bool,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub world: World,
}

#[derive(Debug, Args)]
pub struct SweepArgs {
    /// Seeds to run: `A..B` (B excluded) or `A..=B`.
    #[arg(long, value_parser = parse_seeds)]
    pub seeds: Range<u64>,
    /// The scenario (topology) to run.
    #[arg(long, default_value = "full")]
    pub scenario: String,
    /// Threads, each running whole simulations.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: u32,
    /// Run only the seeds of shard I of N (`seed % N == I`), to split a sweep over machines.
    #[arg(long, value_parser = parse_shard)]
    pub shard: Option<(u64, u64)>,
    /// Write one JSON line per seed to FILE as results arrive (merge shards with `ctlsim report`).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// `A..B` or `A..=B`.
fn parse_seeds(s: &str) -> Result<Range<u64>, String> {
    let bad = || format!("expected A..B or A..=B, got {s:?}");
    let (a, b, inclusive) = if let Some((a, b)) = s.split_once("..=") {
        (a, b, true)
    } else if let Some((a, b)) = s.split_once("..") {
        (a, b, false)
    } else {
        return Err(bad());
    };
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    let end = if inclusive { b.checked_add(1).ok_or_else(bad)? } else { b };
    if end <= a {
        return Err(format!("empty seed range {s:?}"));
    }
    Ok(a..end)
}

/// `I/N` with `I < N`.
fn parse_shard(s: &str) -> Result<(u64, u64), String> {
    let bad = || format!("expected I/N with I < N, got {s:?}");
    let (i, n) = s.split_once('/').ok_or_else(bad)?;
    let (i, n): (u64, u64) = (i.trim().parse().map_err(|_| bad())?, n.trim().parse().map_err(|_| bad())?);
    if n == 0 || i >= n {
        return Err(bad());
    }
    Ok((i, n))
}

/// A usage or I/O problem: exit code 2.
#[derive(Debug, Error)]
pub enum CliError {
    #[error("unknown scenario {0:?} (known: {known})", known = crate::scenario::names().join(", "))]
    UnknownScenario(String),
    #[error("cannot read plan {path}: {source}")]
    ReadPlan { path: PathBuf, source: std::io::Error },
    #[error("plan {path}: {source}")]
    BadPlan { path: PathBuf, source: FaultError },
    #[error("plan {path} is for seed {plan}, not {seed}")]
    PlanSeed { path: PathBuf, plan: u64, seed: u64 },
    #[error("cannot write trace {path}: {source}")]
    WriteTrace { path: PathBuf, source: std::io::Error },
    #[error("cannot write results {path}: {source}")]
    WriteResults { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Report(#[from] crate::sweep_record::ReportError),
    #[error(transparent)]
    Shrink(#[from] crate::shrink::ShrinkError),
}

/// Parses the arguments, runs the command, and returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let out = std::io::stdout();
    match execute(cli.command, &mut out.lock()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("ctlsim: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs `command`, writing its report to `out`. `Ok(true)`: no oracle fired.
pub fn execute(command: Command, out: &mut impl Write) -> Result<bool, CliError> {
    match command {
        Command::Run(a) => {
            let plan = load_plan(a.plan.as_deref(), &a.world)?;
            let paths = (a.trace.as_deref(), a.perfetto.as_deref());
            one(&a.world, (plan, a.plan.as_deref()), paths, (a.fixed, false), out)
        }
        Command::Replay(a) => {
            let plan = load_plan(a.plan.as_deref(), &a.world)?;
            let paths = (a.trace.as_deref(), a.perfetto.as_deref());
            one(&a.world, (plan, a.plan.as_deref()), paths, (a.fixed, true), out)
        }
        Command::Plan(a) => {
            let plan = crate::scenario::plan(a.world.seed, &a.world.scenario)
                .ok_or_else(|| CliError::UnknownScenario(a.world.scenario.clone()))?;
            let _ = writeln!(out, "{}", plan.to_json());
            Ok(true)
        }
        Command::Sweep(a) => sweep(&a, out),
        Command::Catalogue(a) => crate::catalogue::execute(&a, out),
        Command::Shrink(a) => crate::shrink::execute(&a, out),
        Command::Report(a) => {
            let results = crate::sweep_record::read_files(&a.files)?;
            Ok(crate::sweep_record::summarise(&results, &crate::sweep_record::Timing { wall: None }, out))
        }
    }
}

fn topology(scenario: &str) -> Result<Topology, CliError> {
    crate::scenario::topology(scenario).ok_or_else(|| CliError::UnknownScenario(scenario.to_string()))
}

fn load_plan(path: Option<&Path>, world: &World) -> Result<Option<FaultPlan>, CliError> {
    let topo = topology(&world.scenario)?;
    let Some(path) = path else { return Ok(None) };
    let text = std::fs::read_to_string(path).map_err(|source| CliError::ReadPlan { path: path.into(), source })?;
    let plan = FaultPlan::from_json(&text).map_err(|source| CliError::BadPlan { path: path.into(), source })?;
    plan.validate(&topo).map_err(|source| CliError::BadPlan { path: path.into(), source })?;
    if plan.seed != world.seed {
        return Err(CliError::PlanSeed { path: path.into(), plan: plan.seed, seed: world.seed });
    }
    Ok(Some(plan))
}

/// The command that replays a run.
pub fn replay_command(seed: u64, scenario: &str, plan: Option<&Path>) -> String {
    match plan {
        Some(p) => format!("ctlsim replay --seed {seed} --scenario {scenario} --plan {}", p.display()),
        None => format!("ctlsim replay --seed {seed} --scenario {scenario}"),
    }
}

/// Runs one seed, catching a panic as a failed run.
/// Runs one seed (`switched`: a race scenario's switches on, as `scenario::run` does).
fn run_seed(
    seed: u64,
    scenario: &str,
    plan: Option<FaultPlan>,
    keep_trace: bool,
    switched: bool,
) -> Result<RunReport, String> {
    let config = RunConfig { seed, scenario: scenario.to_string(), plan, keep_trace };
    std::panic::catch_unwind(|| crate::scenario::run_switched(&config, switched)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "panic".to_string())
    })
}

fn one(
    world: &World,
    (plan, plan_path): (Option<FaultPlan>, Option<&Path>),
    (trace_path, perfetto_path): (Option<&Path>, Option<&Path>),
    (fixed, print_plan): (bool, bool),
    out: &mut impl Write,
) -> Result<bool, CliError> {
    let replay = || {
        let command = replay_command(world.seed, &world.scenario, plan_path);
        if fixed {
            format!("{command} --fixed")
        } else {
            command
        }
    };
    topology(&world.scenario)?;
    let seed = world.seed;
    if print_plan {
        let shown = plan
            .clone()
            .or_else(|| crate::scenario::plan(seed, &world.scenario))
            .unwrap_or_else(|| FaultPlan::none(seed));
        let _ = writeln!(out, "plan:\n{}", shown.to_json());
    }
    let wall = Instant::now();
    let keep_trace = trace_path.is_some() || perfetto_path.is_some();
    let report = match run_seed(seed, &world.scenario, plan, keep_trace, !fixed) {
        Ok(r) => r,
        Err(panic) => {
            let _ = writeln!(out, "seed {seed} ({}): the run panicked: {panic}", world.scenario);
            let _ = writeln!(out, "replay: {}", replay());
            return Ok(false);
        }
    };
    let wall = wall.elapsed();
    if let Some(path) = trace_path {
        let file = std::fs::File::create(path).map_err(|source| CliError::WriteTrace { path: path.into(), source })?;
        let mut w = std::io::BufWriter::new(file);
        report
            .trace
            .write_jsonl(&mut w)
            .and_then(|()| w.flush())
            .map_err(|source| CliError::WriteTrace { path: path.into(), source })?;
    }
    if let Some(path) = perfetto_path {
        std::fs::File::create(path)
            .and_then(|f| crate::perfetto::write(&report.trace, &mut std::io::BufWriter::new(f)))
            .map_err(|source| CliError::WriteTrace { path: path.into(), source })?;
    }
    let _ = writeln!(
        out,
        "seed {seed} ({}): {} faults, {:.3} s simulated in {} steps, {:.3} s wall",
        world.scenario,
        report.plan.faults.len(),
        report.sim_time.as_secs_f64(),
        report.steps,
        wall.as_secs_f64()
    );
    for v in &report.violations {
        let _ = writeln!(out, "violation {} at {:.3} s on {}: {}", v.oracle, v.t_ns as f64 / 1e9, v.host, v.detail);
    }
    let _ = writeln!(out, "trace hash: {:016x}", report.trace_hash);
    if report.violations.is_empty() {
        let _ = writeln!(out, "ok");
        Ok(true)
    } else {
        let _ = writeln!(out, "FAILED: {} violation(s)", report.violations.len());
        let _ = writeln!(out, "replay: {}", replay());
        Ok(false)
    }
}

fn sweep(a: &SweepArgs, out: &mut impl Write) -> Result<bool, CliError> {
    topology(&a.scenario)?;
    let mut json = match &a.json {
        Some(path) => Some((
            path,
            std::io::BufWriter::new(
                std::fs::File::create(path).map_err(|source| CliError::WriteResults { path: path.clone(), source })?,
            ),
        )),
        None => None,
    };
    let seeds: Vec<u64> = a.seeds.clone().filter(|s| a.shard.is_none_or(|(i, n)| s % n == i)).collect();
    let total = seeds.len();
    let seeds = Arc::new(seeds);
    let next = Arc::new(AtomicUsize::new(0));
    let (tx, rx) = mpsc::channel::<SeedRecord>();
    let wall = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..a.jobs.min(total.max(1) as u32) {
        let (seeds, next, tx, scenario) = (seeds.clone(), next.clone(), tx.clone(), a.scenario.clone());
        workers.push(std::thread::spawn(move || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(&seed) = seeds.get(i) else { return };
            let cpu = crate::sweep_record::thread_cpu_seconds();
            let outcome = run_seed(seed, &scenario, None, false, true);
            let cpu_s = crate::sweep_record::thread_cpu_seconds() - cpu;
            let record = match outcome {
                Ok(r) => SeedRecord {
                    seed,
                    scenario: scenario.clone(),
                    verdict: if r.violations.is_empty() { Verdict::Pass } else { Verdict::Fail },
                    oracles: r.violations.iter().map(|v| v.oracle.clone()).collect(),
                    detail: r.violations.first().map(|v| v.detail.clone()),
                    hash: Some(format!("{:016x}", r.trace_hash)),
                    sim_s: r.sim_time.as_secs_f64(),
                    cpu_s,
                },
                Err(p) => SeedRecord {
                    seed,
                    scenario: scenario.clone(),
                    verdict: Verdict::Panic,
                    oracles: Vec::new(),
                    detail: Some(p),
                    hash: None,
                    sim_s: 0.0,
                    cpu_s,
                },
            };
            if tx.send(record).is_err() {
                return;
            }
        }));
    }
    drop(tx);
    let mut progress = Progress::new(total);
    let mut results = Vec::with_capacity(total);
    for r in rx {
        progress.update(results.len() + 1, r.failed(), wall.elapsed());
        if let Some((path, w)) = json.as_mut() {
            // Each line is flushed as it lands, so a shard killed mid-way keeps its results.
            writeln!(w, "{}", r.to_line())
                .and_then(|()| w.flush())
                .map_err(|source| CliError::WriteResults { path: (*path).clone(), source })?;
        }
        results.push(r);
    }
    for w in workers {
        let _ = w.join();
    }
    progress.finish();
    results.sort_by_key(|r| r.seed);
    let timing = crate::sweep_record::Timing { wall: Some((wall.elapsed().as_secs_f64(), a.jobs)) };
    Ok(crate::sweep_record::summarise(&results, &timing, out))
}

/// A progress bar on stderr: redrawn in place on a terminal, a line per tenth otherwise.
struct Progress {
    total: usize,
    failed: usize,
    tty: bool,
    last_tenth: usize,
}

impl Progress {
    fn new(total: usize) -> Self {
        Progress { total, failed: 0, tty: std::io::stderr().is_terminal(), last_tenth: 0 }
    }

    fn update(&mut self, done: usize, failed: bool, wall: Duration) {
        self.failed += usize::from(failed);
        let total = self.total.max(1);
        if self.tty {
            const WIDTH: usize = 30;
            let filled = done * WIDTH / total;
            eprint!(
                "\r[{}{}] {done}/{} seeds, {} failed, {:.0} s",
                "#".repeat(filled),
                ".".repeat(WIDTH - filled),
                self.total,
                self.failed,
                wall.as_secs_f64()
            );
        } else {
            let tenth = done * 10 / total;
            if tenth > self.last_tenth || done == self.total {
                self.last_tenth = tenth;
                eprintln!("{done}/{} seeds, {} failed, {:.0} s", self.total, self.failed, wall.as_secs_f64());
            }
        }
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_ranges_and_shards_parse() {
        assert_eq!(parse_seeds("3..7"), Ok(3..7));
        assert_eq!(parse_seeds("3..=7"), Ok(3..8));
        assert!(parse_seeds("7..3").is_err());
        assert!(parse_seeds("x..3").is_err());
        assert!(parse_seeds("3").is_err());
        assert_eq!(parse_shard("1/4"), Ok((1, 4)));
        assert!(parse_shard("4/4").is_err());
        assert!(parse_shard("0/0").is_err());
    }

    #[test]
    fn the_replay_command_names_seed_scenario_and_plan() {
        assert_eq!(replay_command(5, "small", None), "ctlsim replay --seed 5 --scenario small");
        assert_eq!(
            replay_command(5, "full", Some(Path::new("p.json"))),
            "ctlsim replay --seed 5 --scenario full --plan p.json"
        );
    }
}
