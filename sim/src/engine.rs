//! One simulated run: build the world of a scenario, play the fault plan while the
//! workload runs, heal, wait out a quiet period, and judge it with the oracles.
//!
//! Phases: *active* ([`ACTIVE`]: workload and faults), *heal* (every fault undone),
//! *quiet* (until [`END`], long enough for push-wait timeouts, reservation TTLs and P2P
//! re-handshakes), then the liveness checks. Safety oracles run after every step.
//!
//! Stepping: turmoil advances the hosts by one tick per step, and a step leaves out the
//! hosts with nothing to do (no task ready, no message delivered, no timer due in the
//! tick). The engine picks each tick before the step: one millisecond while some message is
//! on its way to a running host or some host has a task ready to run (what it sends then
//! arrives at the end of the step, so the tick is its latency); otherwise nothing changes
//! before the next timer, and the tick reaches to the earliest deadline any host (or the
//! fault driver) waits for, or the last one within [`COALESCE`] of it. Hosts sleep only
//! through `crate::clock`, so no deadline is jumped over.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::panic::{self, AssertUnwindSafe};
use std::time::Duration;

use ctlplane_core::ec::defaults::PUSH_WAIT_TIMEOUT;
use ctlplane_core::regressions::Regressions;

use crate::device::Device;
use crate::faults::{FaultDriver, FaultPlan};
use crate::hosts::workload;
use crate::hosts::world::{self, stream, World};
use crate::knobs::Knobs;
use crate::topology::Topology;
use crate::{clock, oracle, trace};

/// Steps a run may take. The main job's runs take at most about 20,000 (seeds 0..200); a
/// host that always has work (a retry loop with no backoff) keeps every tick fine and would
/// take hours of wall time (five times the most seen leaves room), so the run ends with a
/// verdict instead of a hang.
pub const STEP_BUDGET: u64 = 100_000;

/// Steps finished by every run in this process. Nothing in a run reads it: a harness's
/// watchdog does (`sim/tests/suite.rs`), to tell a step that never returns (a loop inside
/// the core or a host that reads no clock) from a slow one.
pub static STEPS_FINISHED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
/// Workload and faults run this long.
pub const ACTIVE: Duration = Duration::from_secs(20);
/// The run ends here: past the push-wait timeout of the last request, the retries of
/// every producer chain (discovery, reserve, cleanup cancels, each up to the 30 s client
/// timeout), the 300 s reservation TTL of whatever those left, and the P2P quiet period.
pub const END: Duration = Duration::from_secs(520);
/// Latency of every simulated link (fixed, so a run's timing depends on the seed only
/// through the workload and the faults).
pub const LINK_LATENCY: Duration = Duration::from_millis(1);
/// The fine tick, while anything is on the move.
const FINE_TICK: Duration = Duration::from_millis(1);
/// The longest idle jump.
const MAX_JUMP: Duration = Duration::from_secs(5);
/// Timer slack of an idle jump: it lands on the last deadline within this window of the
/// earliest, so periodic timers of many hosts (P2P manager ticks) share steps. A timer
/// fires at most this late; every protocol timeout is seconds long.
pub const COALESCE: Duration = Duration::from_millis(25);
/// Timer slack once the P2P world has stopped: what remains are reaps (1 s), reconnect
/// attempts to endpoints that are gone (100 ms) and the long EC deadlines (60 s, 300 s),
/// none of which a second of lateness changes.
pub const COALESCE_QUIET: Duration = Duration::from_secs(1);
/// The P2P world is judged this long after the faults heal, then stopped, so the long EC
/// quiet period (reservation TTLs) runs without its periodic ticks. The quiet period covers
/// two chained W1 handshake deadlines (a lost Connect is only recovered by the 30 s
/// deadline, and the reconnect can race into a second one).
pub const P2P_CHECK_AT: Duration = Duration::from_secs(ACTIVE.as_secs() + crate::p2p::QUIET_PERIOD.as_secs() + 5);

/// What to run.
#[derive(Clone, Debug)]
pub struct RunConfig {
    pub seed: u64,
    /// A [`Topology::by_name`] scenario: `"full"` (default) or `"small"`.
    pub scenario: String,
    /// `None`: drawn from the seed.
    pub plan: Option<FaultPlan>,
    /// Keep every trace event (for export); the hash is computed either way.
    pub keep_trace: bool,
}

impl RunConfig {
    /// The full scenario with the plan of `seed`.
    pub fn new(seed: u64) -> Self {
        RunConfig { seed, scenario: "full".to_string(), plan: None, keep_trace: false }
    }
}

/// The verdict and record of one run.
#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub scenario: String,
    pub plan: FaultPlan,
    pub violations: Vec<oracle::Violation>,
    pub trace: trace::Trace,
    pub trace_hash: u64,
    /// Simulated time covered.
    pub sim_time: Duration,
    /// turmoil steps taken.
    pub steps: u64,
    /// Counters: requests, items, pushes, device writes, shard totals, liveness findings.
    pub stats: BTreeMap<String, u64>,
}

/// How the engine steps turmoil; the defaults are what every run uses. The switches exist
/// so tests can show that a shortcut changes nothing a run observes.
#[derive(Clone, Copy, Debug)]
pub struct StepOptions {
    /// Leave out of a step the hosts with nothing to do (no task ready, no message
    /// delivered, no timer due in the tick). Off: every running host is ticked every step.
    pub skip_idle_hosts: bool,
}

impl Default for StepOptions {
    fn default() -> Self {
        StepOptions { skip_idle_hosts: true }
    }
}

/// Runs one seed. Never panics on a violation; a host panic or a turmoil error is reported
/// as a violation (`host-panic`, `sim-error`) and ends the run early.
pub fn run(cfg: &RunConfig) -> RunReport {
    run_with(cfg, &Regressions::default())
}

/// [`run`] with historical behaviours switched on in the core machines (the race
/// catalogue, `docs/races.md`): the oracles a race names must then fire for some seed.
pub fn run_with(cfg: &RunConfig, regressions: &Regressions) -> RunReport {
    run_tuned(cfg, regressions, &Knobs::default())
}

/// [`run_with`] in a world whose settings a scenario changed (`crate::knobs`).
pub fn run_tuned(cfg: &RunConfig, regressions: &Regressions, knobs: &Knobs) -> RunReport {
    run_with_options(cfg, regressions, knobs, StepOptions::default())
}

/// [`run_tuned`], stepping as `opts` says.
pub fn run_with_options(cfg: &RunConfig, regressions: &Regressions, knobs: &Knobs, opts: StepOptions) -> RunReport {
    clock::reset();
    trace::reset(cfg.keep_trace);
    oracle::reset();
    let Some(topo) = Topology::by_name(&cfg.scenario) else {
        let plan = cfg.plan.clone().unwrap_or_else(|| FaultPlan::none(cfg.seed));
        oracle::violate_at(0, "config", "engine", format!("unknown scenario {:?}", cfg.scenario));
        return report(cfg, plan, Duration::ZERO, 0, BTreeMap::new());
    };
    let plan = cfg.plan.clone().unwrap_or_else(|| FaultPlan::draw(cfg.seed, &topo, ACTIVE));
    let (steps, sim_time, mut stats) = run_world(cfg.seed, &topo, &plan, regressions, knobs, opts);
    stats.insert("steps".to_string(), steps);
    stats.insert("trace.events".to_string(), trace::count());
    report(cfg, plan, sim_time, steps, stats)
}

/// Collects the run's verdict and trace into its report.
fn report(cfg: &RunConfig, plan: FaultPlan, sim_time: Duration, steps: u64, stats: BTreeMap<String, u64>) -> RunReport {
    let violations = oracle::take();
    let trace = trace::take();
    let trace_hash = trace.hash();
    RunReport {
        seed: cfg.seed,
        scenario: cfg.scenario.clone(),
        plan,
        violations,
        trace,
        trace_hash,
        sim_time,
        steps,
        stats,
    }
}

fn run_world(
    seed: u64,
    topo: &Topology,
    plan: &FaultPlan,
    regressions: &Regressions,
    knobs: &Knobs,
    opts: StepOptions,
) -> (u64, Duration, BTreeMap<String, u64>) {
    let requests = workload::draw(
        &knobs.workload,
        topo.consumers.len(),
        topo.producers.len(),
        &mut world::rng(seed, stream::WORKLOAD, 0),
    );
    let device = Device::new(knobs.device.clone(), world::rng(seed, stream::DEVICE, 0));
    world::install(World::new(topo.clone(), seed, *regressions, knobs.clone(), requests, device));
    let mut sim = turmoil::Builder::new()
        .rng_seed(rand::RngCore::next_u64(&mut world::rng(seed, stream::TURMOIL, 0)))
        .min_message_latency(LINK_LATENCY)
        .max_message_latency(LINK_LATENCY)
        .tick_duration(FINE_TICK)
        .simulation_duration(END + Duration::from_secs(60))
        .build();
    crate::hosts::install(&mut sim, topo);
    crate::p2p::install_with(&mut sim, topo, seed, regressions.t0);
    let mut driver = FaultDriver::new(plan);
    // A step leaves out the hosts with nothing to do: every host timer is a registered
    // sleep (`clock::sleep_until`), so the clock knows each host's next deadline.
    if opts.skip_idle_hosts {
        sim.set_wake_hint(|addr| clock::next_deadline_of(addr).map(Duration::from_nanos));
    }
    let rank_hosts: Vec<(String, IpAddr)> =
        topo.ranks().iter().map(|(_, _, h)| (h.to_string(), sim.lookup(*h))).collect();
    let mut steps = 0u64;
    let mut healed = false;
    let mut p2p_live = true;
    loop {
        let now = sim.elapsed();
        if now >= END {
            break;
        }
        if !healed && now >= ACTIVE {
            driver.heal_all(&mut sim, now);
            healed = true;
            trace::record_at(now.as_nanos() as u64, "engine", "engine.healed", &[]);
        }
        if !healed {
            driver.step(&mut sim, now);
        }
        if p2p_live && now >= P2P_CHECK_AT {
            crate::p2p::check_liveness();
            for peer in &topo.p2p_peers {
                sim.crash(peer.as_str());
            }
            p2p_live = false;
            trace::record_at(now.as_nanos() as u64, "engine", "engine.p2p_stopped", &[]);
        }
        for (h, addr) in &rank_hosts {
            if !sim.is_host_running(*addr) {
                world::with(|w| w.rank_down(h));
            }
        }
        // Picked after the fault driver acted: a release or a restart is work for this step.
        sim.set_tick_duration(next_tick(&sim, &driver, healed, p2p_live));
        clock::begin_step();
        let stepped = panic::catch_unwind(AssertUnwindSafe(|| sim.step()));
        steps += 1;
        STEPS_FINISHED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let t_ns = sim.elapsed().as_nanos() as u64;
        if steps > STEP_BUDGET {
            oracle::violate_at(
                t_ns,
                "step-budget",
                "engine",
                format!(
                    "{steps} steps reached only {:?} of simulated time: some host never lets the clock jump",
                    sim.elapsed()
                ),
            );
            break;
        }
        match stepped {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                oracle::violate_at(t_ns, "sim-error", "engine", e.to_string());
                break;
            }
            Err(p) => {
                let msg = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                // A host that spun inside the step (`clock::SPIN_BUDGET`) has its verdict.
                if !msg.starts_with(clock::SPIN_MARK) {
                    oracle::violate_at(t_ns, "host-panic", "engine", msg);
                }
                break;
            }
        }
        oracle::check_step(t_ns);
        if p2p_live {
            crate::p2p::check_safety();
        }
    }
    let end = sim.elapsed();
    let end_ns = end.as_nanos() as u64;
    let mut stats = oracle::check_ec_liveness(end_ns, PUSH_WAIT_TIMEOUT);
    crate::push_returns::check(end_ns);
    let judged = crate::delivery::check(end_ns, plan);
    stats.insert("delivery.judged".to_string(), judged);
    let judged = crate::announced_accepted::check(end_ns, plan);
    stats.insert("announced_accepted.judged".to_string(), judged);
    if let Some(w) = world::take() {
        for (k, v) in &w.stats {
            *stats.entry(k.clone()).or_default() += v;
        }
        stats.insert("requests".to_string(), w.requests.len() as u64);
        let d = w.device.stats;
        for (k, v) in [
            ("device.started", d.started),
            ("device.landed", d.landed),
            ("device.failed", d.failed),
            ("device.bytes", d.bytes),
            ("device.unowned", d.unowned),
        ] {
            stats.insert(k.to_string(), v);
        }
        for rank in w.ranks.values() {
            let s = rank.shard.borrow().stats();
            for (k, v) in [
                ("shard.requests", s.requests),
                ("shard.error_replies", s.error_replies),
                ("shard.malformed", s.malformed),
                ("shard.events_queued", s.events_queued),
                ("shard.events_dropped", s.events_dropped),
            ] {
                *stats.entry(k.to_string()).or_default() += v;
            }
        }
        let restarts: u64 = w.incarnations.values().map(|&i| u64::from(i)).sum();
        stats.insert("restarts".to_string(), restarts);
    }
    trace::record_at(end_ns, "engine", "engine.end", &[("steps", &steps)]);
    (steps, end, stats)
}

/// The next tick: fine while anything moves, else a jump to the next deadline.
fn next_tick(sim: &turmoil::Sim<'_>, driver: &FaultDriver, healed: bool, p2p_live: bool) -> Duration {
    let now = sim.elapsed();
    if sim.has_pending_work() {
        return FINE_TICK;
    }
    let mut next = clock::coalesced_deadline(if p2p_live { COALESCE } else { COALESCE_QUIET })
        .map(Duration::from_nanos)
        .unwrap_or(END);
    if !healed {
        next = next.min(ACTIVE);
        if let Some(due) = driver.next_due() {
            next = next.min(due);
        }
    }
    if p2p_live {
        next = next.min(P2P_CHECK_AT);
    }
    let gap = next.min(END).saturating_sub(now);
    // Whole milliseconds (the hosts' timers resolve to one), at least one.
    let ms = gap.as_nanos().div_ceil(FINE_TICK.as_nanos()).max(1) as u32;
    (FINE_TICK * ms).min(MAX_JUMP)
}
