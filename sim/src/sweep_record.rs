//! One seed's result as a line of JSON, and the summary of many.
//!
//! A sweep split over machines (`ctlsim sweep --shard I/N --json FILE` on each) leaves one
//! file per shard; `ctlsim report` reads them back and prints the summary a single sweep
//! would have printed, so every shard's verdicts meet in one table with their replay
//! commands. The line format is the contract between the two: one writer, one reader.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::cli::replay_command;

/// A run's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// No oracle fired.
    Pass,
    /// At least one oracle fired.
    Fail,
    /// The run panicked (a simulator or core bug, reported as a failure).
    Panic,
}

/// What a sweep keeps of one seed: the line `--json` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SeedRecord {
    pub seed: u64,
    pub scenario: String,
    pub verdict: Verdict,
    /// Every oracle that fired, in the order they fired (repeats kept: the count matters).
    #[serde(default)]
    pub oracles: Vec<String>,
    /// The first violation's (or the panic's) text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// The trace hash (hex); absent for a panicked run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    /// Simulated seconds covered.
    pub sim_s: f64,
    /// CPU seconds the run took on its worker thread.
    pub cpu_s: f64,
}

impl SeedRecord {
    pub fn failed(&self) -> bool {
        self.verdict != Verdict::Pass
    }

    /// One line of JSON, no newline.
    pub fn to_line(&self) -> String {
        // A struct of strings and numbers always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A results file that cannot be merged.
#[derive(Debug, Error)]
pub enum ReportError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}:{line}: not a sweep result line: {source}")]
    BadLine { path: String, line: usize, source: serde_json::Error },
    #[error(
        "seed {seed} ({scenario}) appears twice with different results (hashes {first} and {second}): \
         the shards ran different builds, or the run is not deterministic"
    )]
    Conflict { seed: u64, scenario: String, first: String, second: String },
}

/// Reads result lines from `files`, one record per (scenario, seed). A seed present in two
/// files (a retried shard) is kept once when both runs agree; disagreeing runs are an error,
/// because a seed that replays differently cannot be trusted.
pub fn read_files(files: &[impl AsRef<Path>]) -> Result<Vec<SeedRecord>, ReportError> {
    let mut by_seed: BTreeMap<(String, u64), SeedRecord> = BTreeMap::new();
    for path in files {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let file = std::fs::File::open(path).map_err(|source| ReportError::Read { path: shown.clone(), source })?;
        for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|source| ReportError::Read { path: shown.clone(), source })?;
            if line.trim().is_empty() {
                continue;
            }
            let r: SeedRecord = serde_json::from_str(&line).map_err(|source| ReportError::BadLine {
                path: shown.clone(),
                line: i + 1,
                source,
            })?;
            let key = (r.scenario.clone(), r.seed);
            match by_seed.get(&key) {
                Some(old) if old.verdict != r.verdict || old.hash != r.hash => {
                    return Err(ReportError::Conflict {
                        seed: r.seed,
                        scenario: r.scenario,
                        first: old.hash.clone().unwrap_or_else(|| "none".into()),
                        second: r.hash.clone().unwrap_or_else(|| "none".into()),
                    });
                }
                Some(_) => {}
                None => {
                    by_seed.insert(key, r);
                }
            }
        }
    }
    Ok(by_seed.into_values().collect())
}

/// How the summary names the time it took.
pub struct Timing {
    /// Wall seconds and worker threads of a sweep run here; `None` for merged files.
    pub wall: Option<(f64, u32)>,
}

/// Prints the summary of `results` (sorted by scenario, then seed) with one replay command
/// per failed seed. Returns whether every seed passed.
pub fn summarise(results: &[SeedRecord], timing: &Timing, out: &mut impl Write) -> bool {
    let sim: f64 = results.iter().map(|r| r.sim_s).sum();
    let cpu: f64 = results.iter().map(|r| r.cpu_s).sum();
    let failed: Vec<&SeedRecord> = results.iter().filter(|r| r.failed()).collect();
    let mut by_oracle: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for r in results {
        let mut seen = BTreeSet::new();
        let names: Vec<&str> =
            if r.verdict == Verdict::Panic { vec!["panic"] } else { r.oracles.iter().map(String::as_str).collect() };
        for o in names {
            let e = by_oracle.entry(o).or_default();
            e.0 += 1;
            if seen.insert(o) {
                e.1 += 1;
            }
        }
    }
    let scenarios: BTreeSet<&str> = results.iter().map(|r| r.scenario.as_str()).collect();
    let scenarios: Vec<&str> = scenarios.into_iter().collect();
    let _ = writeln!(out, "scenario        {}", scenarios.join(", "));
    let _ = writeln!(out, "seeds           {} ({} failed)", results.len(), failed.len());
    let _ = writeln!(out, "simulated       {sim:.1} s");
    let _ = writeln!(out, "cpu             {cpu:.1} s");
    if let Some((wall, jobs)) = timing.wall {
        let _ = writeln!(out, "wall            {wall:.1} s ({jobs} jobs)");
        let compression = if wall > 0.0 { sim / wall } else { 0.0 };
        let _ = writeln!(out, "compression     {compression:.0}x");
    }
    if !by_oracle.is_empty() {
        let _ = writeln!(out, "{:<28} {:>10} {:>8}", "oracle", "violations", "seeds");
        for (oracle, (n, seeds)) in &by_oracle {
            let _ = writeln!(out, "{oracle:<28} {n:>10} {seeds:>8}");
        }
    }
    const SHOWN: usize = 20;
    for r in failed.iter().take(SHOWN) {
        let first = match (r.verdict, r.oracles.first(), &r.detail) {
            (Verdict::Panic, _, d) => format!("panic: {}", d.as_deref().unwrap_or("")),
            (_, Some(o), Some(d)) => format!("{o}: {d}"),
            (_, Some(o), None) => o.clone(),
            _ => String::new(),
        };
        let _ = writeln!(out, "FAILED seed {} ({first})", r.seed);
        let _ = writeln!(out, "  replay: {}", replay_command(r.seed, &r.scenario, None));
    }
    if failed.len() > SHOWN {
        let _ = writeln!(out, "... and {} more failed seeds", failed.len() - SHOWN);
    }
    failed.is_empty()
}

/// CPU time of the calling thread, for the per-seed `cpu_s`.
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seed: u64, verdict: Verdict, oracles: &[&str], hash: &str) -> SeedRecord {
        SeedRecord {
            seed,
            scenario: "full".into(),
            verdict,
            oracles: oracles.iter().map(|s| s.to_string()).collect(),
            detail: (!oracles.is_empty()).then(|| "what went wrong".to_string()),
            hash: Some(hash.into()),
            sim_s: 2.5,
            cpu_s: 0.25,
        }
    }

    #[test]
    fn a_record_round_trips_through_its_line() {
        let r = rec(7, Verdict::Fail, &["write-owned", "write-owned"], "00ff");
        let back: SeedRecord = serde_json::from_str(&r.to_line()).expect("parses");
        assert_eq!(back, r);
    }

    #[test]
    fn the_summary_counts_violations_and_seeds_per_oracle_and_names_each_replay() {
        let rs = vec![
            rec(1, Verdict::Pass, &[], "01"),
            rec(2, Verdict::Fail, &["write-owned", "write-owned"], "02"),
            rec(3, Verdict::Fail, &["write-owned"], "03"),
        ];
        let mut out = Vec::new();
        assert!(!summarise(&rs, &Timing { wall: None }, &mut out));
        let text = String::from_utf8(out).expect("utf8");
        assert!(text.contains("seeds           3 (2 failed)"), "{text}");
        let row = text.lines().find(|l| l.starts_with("write-owned")).expect("row");
        assert_eq!(row.split_whitespace().collect::<Vec<_>>(), ["write-owned", "3", "2"]);
        assert!(text.contains("  replay: ctlsim replay --seed 2 --scenario full"), "{text}");
        assert!(text.contains("  replay: ctlsim replay --seed 3 --scenario full"), "{text}");
        assert!(!text.contains("--seed 1 "), "{text}");
    }
}
