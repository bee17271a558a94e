//! The `ctlsim` binary: exit codes, replay reproduces run's hash, plans round-trip through
//! JSON files, sweeps summarise, usage errors exit 2.

use std::path::PathBuf;
use std::process::{Command, Output};

fn ctlsim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ctlsim")).args(args).output().expect("ctlsim runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn hash(o: &Output) -> String {
    let out = stdout(o);
    out.lines()
        .find_map(|l| l.strip_prefix("trace hash: "))
        .unwrap_or_else(|| panic!("no trace hash in {out}"))
        .to_string()
}

/// Exit 0 with "ok", or exit 1 with the failure and the one command that replays it.
fn assert_verdict(o: &Output, seed: u64, scenario: &str) {
    let out = stdout(o);
    match o.status.code() {
        Some(0) => assert!(out.lines().any(|l| l == "ok") && !out.contains("violation "), "{out}"),
        Some(1) => {
            assert!(out.contains("violation ") || out.contains("panicked"), "{out}");
            let replay = format!("replay: ctlsim replay --seed {seed} --scenario {scenario}");
            assert!(out.lines().any(|l| l.starts_with(&replay)), "{out}");
        }
        other => panic!("exit {other:?}: {out}\n{}", String::from_utf8_lossy(&o.stderr)),
    }
}

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ctlsim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

#[test]
fn run_and_replay_give_the_same_hash_and_verdict() {
    for seed in [1u64, 2] {
        let seed_s = seed.to_string();
        let run = ctlsim(&["run", "--seed", &seed_s, "--scenario", "small"]);
        assert_verdict(&run, seed, "small");
        let replay = ctlsim(&["replay", "--seed", &seed_s, "--scenario", "small"]);
        assert_verdict(&replay, seed, "small");
        assert_eq!(run.status.code(), replay.status.code());
        assert_eq!(hash(&run), hash(&replay));
        assert!(stdout(&replay).starts_with("plan:\n{"), "replay prints the plan first");
    }
}

#[test]
fn a_plan_round_trips_through_a_file_and_runs_the_same() {
    let plan = ctlsim(&["plan", "--seed", "4", "--scenario", "small"]);
    assert_eq!(plan.status.code(), Some(0));
    let path = temp("plan4.json");
    std::fs::write(&path, &plan.stdout).expect("write plan");
    let p = path.to_str().expect("utf-8 path");
    let from_file = ctlsim(&["run", "--seed", "4", "--scenario", "small", "--plan", p]);
    let drawn = ctlsim(&["run", "--seed", "4", "--scenario", "small"]);
    assert_eq!(hash(&from_file), hash(&drawn));
    assert_eq!(from_file.status.code(), drawn.status.code());
    // The printed plan is the one replay shows.
    let replay = ctlsim(&["replay", "--seed", "4", "--scenario", "small", "--plan", p]);
    assert!(stdout(&replay).contains(String::from_utf8_lossy(&plan.stdout).trim()));
}

#[test]
fn the_main_jobs_plan_prints_its_world_and_a_plan_file_replays_it() {
    let plan = ctlsim(&["plan", "--seed", "5"]);
    assert_eq!(plan.status.code(), Some(0));
    let text = stdout(&plan);
    assert!(text.contains("\"world\": {") && text.contains("\"encode_ms\""), "{text}");
    let path = temp("plan5-full.json");
    std::fs::write(&path, &plan.stdout).expect("write plan");
    let p = path.to_str().expect("utf-8 path");
    let from_file = ctlsim(&["run", "--seed", "5", "--plan", p]);
    let drawn = ctlsim(&["run", "--seed", "5"]);
    assert_eq!(hash(&from_file), hash(&drawn), "the file's world is the one the seed draws");
    assert_eq!(from_file.status.code(), Some(0));
}

#[test]
fn the_generic_catalogue_searches_a_race_on_the_main_job() {
    let out = ctlsim(&["catalogue", "--generic", "--races", "ec-s9", "--cap", "3"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.contains("ec-s9") && text.contains("req-lockstep"), "{text}");
    assert!(text.contains("1/1 races found within 3 seeds, 1 with every fixed run passing"), "{text}");
    let run = ctlsim(&["run", "--seed", "0", "--scenario", "generic-ec-s9"]);
    assert_verdict(&run, 0, "generic-ec-s9");
}

#[test]
fn run_writes_its_trace_as_json_lines() {
    let path = temp("trace.jsonl");
    let p = path.to_str().expect("utf-8 path");
    let run = ctlsim(&["run", "--seed", "5", "--scenario", "small", "--trace", p]);
    assert_verdict(&run, 5, "small");
    let text = std::fs::read_to_string(&path).expect("trace written");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() > 100, "{} events", lines.len());
    for l in &lines[..10] {
        let v: serde_json::Value = serde_json::from_str(l).expect("a JSON object per line");
        assert!(v.get("t_ns").is_some() && v.get("host").is_some() && v.get("kind").is_some(), "{l}");
    }
}

#[test]
fn usage_and_io_errors_exit_2() {
    assert_eq!(ctlsim(&["run", "--seed", "1", "--scenario", "nope"]).status.code(), Some(2));
    assert_eq!(ctlsim(&["run"]).status.code(), Some(2));
    assert_eq!(ctlsim(&["sweep", "--seeds", "5..2"]).status.code(), Some(2));
    assert_eq!(ctlsim(&["sweep", "--seeds", "0..2", "--shard", "3/3"]).status.code(), Some(2));
    let missing = temp("missing.json");
    let o = ctlsim(&["run", "--seed", "1", "--scenario", "small", "--plan", missing.to_str().unwrap_or("x")]);
    assert_eq!(o.status.code(), Some(2));
    let bad = temp("bad.json");
    std::fs::write(
        &bad,
        r#"{"seed": 1, "swarm": {}, "faults": [{"at_ms": 1, "kind": {"crash": {"host": "nobody", "down_ms": 1}}}]}"#,
    )
    .expect("write");
    let o = ctlsim(&["run", "--seed", "1", "--scenario", "small", "--plan", bad.to_str().unwrap_or("x")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("nobody"), "the error names the problem");
    let other_seed = ctlsim(&["plan", "--seed", "9", "--scenario", "small"]);
    let p = temp("plan9.json");
    std::fs::write(&p, &other_seed.stdout).expect("write");
    let o = ctlsim(&["run", "--seed", "1", "--scenario", "small", "--plan", p.to_str().unwrap_or("x")]);
    assert_eq!(o.status.code(), Some(2), "a plan of another seed is refused");
}

#[test]
fn a_sweep_summarises_and_its_exit_code_says_whether_any_oracle_fired() {
    let o = ctlsim(&["sweep", "--seeds", "0..4", "--scenario", "small", "--jobs", "2", "--shard", "0/2"]);
    let out = stdout(&o);
    assert!(out.contains("seeds           2 ("), "shard 0/2 of 0..4 runs seeds 0 and 2: {out}");
    assert!(out.contains("compression"), "{out}");
    let failed: usize = out
        .lines()
        .find_map(|l| l.strip_prefix("seeds           2 (")?.strip_suffix(" failed)")?.parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(o.status.code(), Some(if failed == 0 { 0 } else { 1 }), "{out}");
    assert_eq!(out.matches("  replay: ctlsim replay --seed ").count(), failed, "{out}");
}

/// The lines of a summary that do not depend on timing.
fn verdict_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| !["simulated", "cpu", "wall", "compression"].iter().any(|p| l.starts_with(p)))
        .map(str::to_string)
        .collect()
}

#[test]
fn shard_result_files_merge_into_the_summary_of_one_sweep() {
    let whole = ctlsim(&["sweep", "--seeds", "0..6", "--scenario", "small", "--jobs", "2"]);
    let (a, b) = (temp("shard-0.jsonl"), temp("shard-1.jsonl"));
    for (i, path) in [(0, &a), (1, &b)] {
        let shard = format!("{i}/2");
        let path_s = path.to_str().expect("utf8 path");
        let o = ctlsim(&["sweep", "--seeds", "0..6", "--scenario", "small", "--shard", &shard, "--json", path_s]);
        assert!(matches!(o.status.code(), Some(0 | 1)), "{}", String::from_utf8_lossy(&o.stderr));
        let lines = std::fs::read_to_string(path).expect("results written");
        assert_eq!(lines.lines().count(), 3, "one line per seed of the shard: {lines}");
    }
    // A retried shard's file given twice is merged once.
    let merged = ctlsim(&["report", a.to_str().expect("utf8"), b.to_str().expect("utf8"), a.to_str().expect("utf8")]);
    assert_eq!(merged.status.code(), whole.status.code(), "{}", stdout(&merged));
    assert_eq!(verdict_lines(&stdout(&merged)), verdict_lines(&stdout(&whole)));
    assert!(stdout(&merged).contains("seeds           6 ("), "{}", stdout(&merged));
}

#[test]
fn report_refuses_a_malformed_line_and_a_seed_that_replayed_differently() {
    let path = temp("bad.jsonl");
    std::fs::write(&path, "{\"seed\": 1}\n").expect("write");
    let o = ctlsim(&["report", path.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("bad.jsonl:1"), "{}", String::from_utf8_lossy(&o.stderr));
    let line = |hash: &str| {
        format!("{{\"seed\":3,\"scenario\":\"small\",\"verdict\":\"pass\",\"hash\":\"{hash}\",\"sim_s\":1.0,\"cpu_s\":0.1}}\n")
    };
    std::fs::write(&path, line("aa") + &line("bb")).expect("write");
    let o = ctlsim(&["report", path.to_str().expect("utf8")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("seed 3 (small) appears twice"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(ctlsim(&["report", "/nonexistent/results.jsonl"]).status.code(), Some(2));
}
