//! Scenario names: a plain topology (`full`, `small`) or a race of the catalogue
//! (`ec-s11`, `p2p-s6`, ...; `ctlplane_core::regressions::RACES`), which resolves to a
//! topology, the race's regression switches and a fault bias.
//!
//! The bias adds faults of the kinds that provoke the race to the seed's own plan, drawn
//! from the seed on a stream of their own, so a race scenario's plan is still a function of
//! the seed alone and `ctlsim plan --scenario <race>` prints exactly what a run plays.

use std::time::Duration;

use ctlplane_core::regressions::{self, Race, Regressions};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::engine::{self, RunConfig, RunReport};
use crate::faults::{self, Fault, FaultKind, FaultPlan, Garbage};
use crate::hosts::workload::WorkloadConfig;
use crate::knobs::Knobs;
use crate::topology::Topology;
use crate::world_swarm::Exposure;

mod dup_push;
mod ec_scheduler;
mod orphans;

/// RNG stream of the bias faults (apart from every stream `FaultPlan::draw` uses).
const BIAS_STREAM: u64 = 0xb1a5;
/// Bias faults added per seed (fewer when they would overlap the plan's own).
const BIAS_FAULTS: usize = 3;
/// The topology every race scenario runs on: small enough that one seed takes under a
/// second, with two ranks (multi-shard races) and two P2P peers.
pub const RACE_TOPOLOGY: &str = "small";

/// The fault kinds that provoke a race.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bias {
    /// No extra faults: the seed's plan (and the switch) suffice.
    None,
    /// Undecodable frames from a control client to a consumer rank.
    Malformed,
    /// Handlers slower than the client timeout.
    SlowHandler,
    /// Lost replies: one-way partitions from a rank back to its client.
    LostReplies,
    /// Peer restarts racing the other side's poll and teardown.
    ReconnectRace,
    /// Peer crashes without FIN, restarting within the heartbeat timeout.
    PeerCrash,
    /// Lost requests: one-way partitions from a producer to a rank, so its requests to
    /// that rank wait out the control timeout one at a time.
    LostRequests,
    /// Invalid P2P messages between the peers: the receiving session dies of a protocol
    /// error and its Disconnect kills the sender's, so both reconnect.
    P2pProtocolError,
    /// A P2P session dies of a failed send between two manager ticks while its peer
    /// restarts (`FaultKind::ReplaceRace`).
    ReplaceRace,
    /// A P2P peer's application names hundreds of peers where nothing listens.
    PeerFlood,
    /// A P2P peer sends another one message whose routing identity names some other host
    /// of the world (`FaultKind::ForgedIdentity`).
    ForgedIdentity,
    /// A P2P peer restarts while partitioned from the other (its FIN is lost), and the
    /// partition heals within the heartbeat timeout: the other side's ROUTER still holds
    /// the old incarnation's identity when the new one connects.
    SilentRestart,
    /// A handler slower than the client timeout on a rank just before its reap fails, so
    /// requests queue at its REP while the loop sleeps (`ec-s2`).
    ReapStall,
    /// The scheduler's first discovery lost (its base rank unreachable from the start),
    /// so no PULL drains the ranks' events for a control timeout (`ec-s4`).
    EventsUndrained,
    /// As [`Bias::EventsUndrained`], plus a producer-rank partition that fails some
    /// pushes, so requests that arrive while a drain blocks wait in vain (`ec-s5`).
    SchedulerDiscovery,
    /// The producer's first `peers` reply lost (`ec-s8`).
    ProducerDiscovery,
    /// A P2P peer stops reading for a while and the others send it more requests than
    /// the DEALER high-water mark lets queue (`p2p-hwm`).
    StopReading,
    /// Completions that fail fast on one rank while the other rank's are still in flight
    /// (`ec-s17`): replies from one rank lost for a while, and a burst of undecodable frames
    /// from the producer to the other rank at the same moment.
    CompletionFailure,
    /// The scheduler's first discovery gets every answer but one rank's `event_port`
    /// (`ec-s7`).
    PartialDiscovery,
}

/// What a scenario name resolves to.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The [`Topology::by_name`] name.
    pub topology: String,
    /// The switches the run turns on (all off for a topology or a race ctlplane has).
    pub regressions: Regressions,
    /// The race, for a race scenario.
    pub race: Option<&'static Race>,
    pub bias: Bias,
    /// The world settings both the switched and the fixed run use (unless the plan
    /// carries a drawn world).
    pub knobs: Knobs,
    /// `Some`: the main job's swarmed world (`full`, and every `generic-<race>`): each
    /// seed draws its world with its plan, with the settings of this exposure allowed.
    pub swarm: Option<Exposure>,
}

/// The prefix of a generic race scenario: `generic-ec-s11` is race `ec-s11` searched on
/// the main job's scenario (swarmed `full`) with only its switch on.
pub const GENERIC_PREFIX: &str = "generic-";
/// The main job's scenario.
pub const MAIN: &str = "full";

/// The bias of a race scenario.
pub fn bias_of(scenario: &str) -> Bias {
    match scenario {
        "ec-s1" => Bias::Malformed,
        "ec-s9" => Bias::SlowHandler,
        "ec-s10" | "ec-s16" | "ec-dup-push" => Bias::LostReplies,
        "ec-s17" => Bias::CompletionFailure,
        "p2p-s5" => Bias::ReconnectRace,
        "p2p-s3" => Bias::PeerCrash,
        "p2p-s7" => Bias::SilentRestart,
        "p2p-s1" | "p2p-s4" => Bias::P2pProtocolError,
        "p2p-s2" | "p2p-s6" => Bias::ReplaceRace,
        "p2p-s10" => Bias::PeerFlood,
        "p2p-hwm" => Bias::StopReading,
        "p2p-s18" => Bias::ForgedIdentity,
        "ec-s13" => Bias::LostRequests,
        "ec-s2" => Bias::ReapStall,
        "ec-s4" => Bias::EventsUndrained,
        "ec-s5" => Bias::SchedulerDiscovery,
        "ec-s8" => Bias::ProducerDiscovery,
        "ec-s7" => Bias::PartialDiscovery,
        _ => Bias::None,
    }
}

/// The world settings of a race scenario (production's for the rest).
pub fn knobs_of(scenario: &str) -> Knobs {
    let mut k = Knobs::default();
    match scenario {
        // A scheduler that gives up before the producer's control timeout (ec-behaviour.md S15's
        // deployment waited 20 s), so its cancel can overtake a reserve stuck behind one.
        "ec-s13" => k.push_wait_timeout = Some(S13_PUSH_WAIT),
        "ec-s11" => k = knobs_s11(),
        "ec-s12" => k = knobs_s12(),
        "ec-s14" => k = knobs_s14(),
        "ec-s12b" => k = knobs_s12b(),
        "ec-dup-push" => k = dup_push::knobs(),
        // A backlog bound a control timeout of undrained events exceeds.
        "ec-s4" => k.max_pending_events = Some(EC_S4_MAX_PENDING_EVENTS),
        // A request names the peer right after its session was reaped, before the next
        // poll sweeps the dead registration.
        "p2p-s1" | "p2p-s4" => k.p2p_immediate_reconnect = true,
        // Mainline W1 sessions: a lost Connect is never retried nor timed out.
        "p2p-s5" | "p2p-s7" | "p2p-s10" => k.p2p_no_handshake_deadline = true,
        // Several REQ sockets per shard address, as the reference's thread pool keeps, so
        // an abandon can travel beside a completion still in flight to the same shard.
        "ec-s17" => k = knobs_s17(),
        "ec-s24" => k = ec_scheduler::knobs_s24(),
        // Producer requests that end before their encoder output is bound.
        "ec-s20" => k = orphans::knobs_s20(),
        _ => {}
    }
    k
}

/// P2P HWM: requests each peer sends a peer that stopped reading.
const STOP_READING_BURST: u32 = 3_000;
/// P2P S18: the port a forged identity names (nothing listens there).
const FORGED_PORT: u16 = 22;

/// EC S17: the producer's REQ sockets per shard address.
const EC_S17_SOCKETS: usize = 4;

/// EC S17: encoder runs, so that pushes reserved before a fault reach their completion
/// while it lasts.
const EC_S17_MIN_ENCODE: Duration = Duration::from_secs(2);
const EC_S17_MAX_ENCODE: Duration = Duration::from_secs(15);

/// EC S17: a producer with [`EC_S17_SOCKETS`] sockets per shard address (the reference's
/// thread pool), and encoders of 2 to 15 s.
fn knobs_s17() -> Knobs {
    let workload =
        WorkloadConfig { min_encode: EC_S17_MIN_ENCODE, max_encode: EC_S17_MAX_ENCODE, ..WorkloadConfig::default() };
    Knobs { producer_sockets_per_shard: Some(EC_S17_SOCKETS), workload, ..Knobs::default() }
}

/// EC S12: encoders that finish 310 to 420 s after the push reserved, past the 300 s TTL
/// (which defers the waiting writer), and a scheduler configured to wait 450 s for them,
/// so the item is still wanted when its write lands.
fn knobs_s12() -> Knobs {
    let mut k = Knobs::default();
    k.workload.min_encode = Duration::from_secs(310);
    k.workload.max_encode = Duration::from_secs(420);
    k.push_wait_timeout = Some(Duration::from_secs(450));
    k
}

/// EC S14: encoders finishing 140 to 160 s after reserving, around the 150 s refresh age,
/// and writes of 3 to 13 s: a push of a popular mm_hash writes while a later push of the
/// same hash (its follower) has aged past the refresh and refreshes. The scheduler waits
/// 200 s, so the follower is still wanted (not cancelled) when it refreshes.
fn knobs_s14() -> Knobs {
    let mut k = Knobs::default();
    k.workload.min_encode = Duration::from_secs(140);
    k.workload.max_encode = Duration::from_secs(160);
    k.device.setup = Duration::from_secs(3);
    k.device.jitter = Duration::from_secs(10);
    k.push_wait_timeout = Some(Duration::from_secs(200));
    k
}

/// EC S12b: a proxy retries every encoder call on the other producer with the same
/// transfer ids (ec-behaviour.md S24) 0.1 to 0.5 s after the first, while both encoders are slow:
/// the first finishes 145 to 145.5 s after its push reserved (short of the 150 s refresh
/// age, so it writes into its own reservation), the retried one 150 to 150.5 s after its
/// own, so it refreshes the reservation it holds as a duplicate and re-reserves, always
/// after the first push's write landed (writes take 2 to 4 s). Busy encoders stall their
/// producers' control threads for 2 to 6 s about every 20 s, so the first push's
/// `complete` can reach a rank after the retry's re-reserve and before the retry's own
/// write lands. The requests arrive once the seed's faults healed (the race needs none,
/// and a retried push's cleanup after a lost reserve abandons the first push's writer,
/// a hazard of its own), and the scheduler waits 200 s for the items.
fn knobs_s12b() -> Knobs {
    let mut k = Knobs::default();
    // Mostly distinct items (each first push of one a writer), few enough to fit the pool
    // while every one of them waits 150 s for its encoder.
    k.workload.start = crate::engine::ACTIVE + Duration::from_secs(1);
    k.workload.hashes = 4096;
    k.workload.mean_gap = Duration::from_millis(400);
    k.workload.max_items = 2;
    k.workload.min_encode = Duration::from_millis(145_000);
    k.workload.max_encode = Duration::from_millis(145_500);
    k.workload.retry = Some(crate::hosts::workload::RetryConfig {
        per_mille: 1000,
        after: (Duration::from_millis(100), Duration::from_millis(500)),
        encode: (Duration::from_millis(150_000), Duration::from_millis(150_500)),
    });
    k.device.setup = Duration::from_secs(2);
    k.device.jitter = Duration::from_secs(2);
    k.producer_stalls = Some(crate::knobs::ProducerStalls {
        mean_gap: Duration::from_secs(20),
        length: (Duration::from_secs(2), Duration::from_secs(6)),
    });
    k.push_wait_timeout = Some(Duration::from_secs(200));
    k
}

/// EC S11: the consumer gives up on an item while its write is still in flight. Writes
/// take 3 to 8 s (a congested data plane: longer than the 2 s grace), encoders up to 25 s,
/// and the scheduler waits 20 s (the production setting of ec-behaviour.md S15), so many requests
/// time out and cancel their items while the producer is writing them.
fn knobs_s11() -> Knobs {
    let mut k = Knobs::default();
    k.workload.max_encode = Duration::from_secs(25);
    k.device.setup = Duration::from_secs(3);
    k.device.jitter = Duration::from_secs(5);
    k.push_wait_timeout = Some(Duration::from_secs(20));
    k
}

/// The push-wait timeout of the `ec-s13` scenario.
pub const S13_PUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(20);

/// The event backlog bound of the `ec-s4` scenario (production: 4096).
pub const EC_S4_MAX_PENDING_EVENTS: usize = 8;

/// Resolves a scenario name: a topology name or a race of the catalogue.
pub fn resolve(name: &str) -> Option<Resolved> {
    if Topology::by_name(name).is_some() {
        return Some(Resolved {
            topology: name.to_string(),
            regressions: Regressions::default(),
            race: None,
            bias: Bias::None,
            knobs: Knobs::default(),
            swarm: (name == MAIN).then(Exposure::default),
        });
    }
    if let Some(race_name) = name.strip_prefix(GENERIC_PREFIX) {
        let race = regressions::race(race_name)?;
        return Some(Resolved {
            topology: MAIN.to_string(),
            regressions: race.regressions(),
            race: Some(race),
            bias: Bias::None,
            knobs: Knobs::default(),
            swarm: Some(Exposure::of(race_name)),
        });
    }
    let race = regressions::race(name)?;
    Some(Resolved {
        topology: topology_of(name).to_string(),
        regressions: race.regressions(),
        race: Some(race),
        bias: bias_of(name),
        knobs: knobs_of(name),
        swarm: None,
    })
}

/// The topology a race scenario runs on: [`RACE_TOPOLOGY`], one with a second producer
/// where the race needs two pushes of one transfer id, or `full` where it needs more than
/// two P2P peers.
fn topology_of(scenario: &str) -> &'static str {
    match scenario {
        "ec-s12b" | "ec-dup-push" => "small-2p",
        // A stall shows on the sessions with the other peers: more than two peers.
        "p2p-hwm" => "full",
        _ => RACE_TOPOLOGY,
    }
}

/// Every scenario name: the topologies, then the races.
pub fn names() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Topology::names().to_vec();
    v.extend(regressions::RACES.iter().map(|r| r.scenario));
    v.push("generic-<race>");
    v
}

/// The topology of a scenario name.
pub fn topology(name: &str) -> Option<Topology> {
    resolve(name).and_then(|r| Topology::by_name(&r.topology))
}

/// The fault plan `seed` plays in scenario `name`: the topology's own draw plus the race's
/// bias faults.
pub fn plan(seed: u64, name: &str) -> Option<FaultPlan> {
    let r = resolve(name)?;
    let topo = Topology::by_name(&r.topology)?;
    if let Some(exposure) = r.swarm {
        return Some(FaultPlan::draw_swarmed(seed, &topo, engine::ACTIVE, exposure));
    }
    let mut plan = FaultPlan::draw(seed, &topo, engine::ACTIVE);
    add_bias(&mut plan, r.bias, &topo);
    Some(plan)
}

/// Runs `cfg` with its scenario resolved: a race scenario runs on its topology with its
/// switches and (unless `cfg.plan` is given) its biased plan. An unknown name runs as the
/// engine runs it (a `config` violation).
pub fn run(cfg: &RunConfig) -> RunReport {
    run_switched(cfg, true)
}

/// [`run`], with the race's switches on (`switched`) or every switch off (the fix).
pub fn run_switched(cfg: &RunConfig, switched: bool) -> RunReport {
    let Some(r) = resolve(&cfg.scenario) else { return engine::run(cfg) };
    let plan = cfg.plan.clone().or_else(|| plan(cfg.seed, &cfg.scenario));
    let inner = RunConfig { seed: cfg.seed, scenario: r.topology.clone(), plan, keep_trace: cfg.keep_trace };
    let regs = if switched { r.regressions } else { Regressions::default() };
    // A plan that carries a drawn world runs in it (a saved plan of the main job too).
    let knobs = inner.plan.as_ref().and_then(|p| p.world.as_ref()).map_or_else(|| r.knobs.clone(), |w| w.knobs());
    let mut report = engine::run_tuned(&inner, &regs, &knobs);
    report.scenario = cfg.scenario.clone();
    report
}

fn add_bias(plan: &mut FaultPlan, bias: Bias, topo: &Topology) {
    if bias == Bias::None {
        return;
    }
    let mut rng = ChaCha8Rng::seed_from_u64(plan.seed);
    rng.set_stream(BIAS_STREAM);
    let horizon = engine::ACTIVE.as_millis() as u64;
    let ranks: Vec<String> = topo.ranks().iter().map(|(_, _, h)| h.to_string()).collect();
    let clients: Vec<String> = topo.producers.iter().chain(&topo.schedulers).cloned().collect();
    let peers = &topo.p2p_peers;
    let pick = |rng: &mut ChaCha8Rng, v: &[String]| -> Option<String> {
        (!v.is_empty()).then(|| v[rng.gen_range(0..v.len())].clone())
    };
    if matches!(
        bias,
        Bias::ReapStall
            | Bias::EventsUndrained
            | Bias::SchedulerDiscovery
            | Bias::ProducerDiscovery
            | Bias::CompletionFailure
            | Bias::PartialDiscovery
    ) {
        for _ in 0..BIAS_FAULTS {
            let mut candidate = plan.clone();
            candidate.faults.extend(timed_bias(bias, &mut rng, topo));
            candidate.faults.sort_by_key(|f| f.at_ms);
            if candidate.validate(topo).is_ok() {
                *plan = candidate;
            }
        }
        return;
    }
    for _ in 0..BIAS_FAULTS {
        let kind = match bias {
            Bias::None => return,
            Bias::Malformed => {
                let (Some(from), Some(to)) = (pick(&mut rng, &clients), pick(&mut rng, &ranks)) else { return };
                FaultKind::Malformed { from, to, count: rng.gen_range(1..=3), garbage: Garbage::NotJson }
            }
            Bias::SlowHandler => {
                let Some(host) = pick(&mut rng, &ranks) else { return };
                FaultKind::SlowHandler {
                    host,
                    delay_ms: rng.gen_range(31_000..=40_000),
                    for_ms: rng.gen_range(2_000..=8_000),
                }
            }
            Bias::LostReplies => {
                let (Some(from), Some(to)) = (pick(&mut rng, &ranks), pick(&mut rng, &topo.producers)) else { return };
                FaultKind::OneWay { from, to, for_ms: rng.gen_range(2_000..=8_000) }
            }
            Bias::P2pProtocolError => {
                let (Some(from), Some(to)) = (pick(&mut rng, peers), pick(&mut rng, peers)) else { return };
                if from == to {
                    continue;
                }
                FaultKind::Malformed { from, to, count: 1, garbage: Garbage::WrongTypes }
            }
            Bias::ReplaceRace => {
                let Some(host) = pick(&mut rng, peers) else { return };
                let others: Vec<String> = peers.iter().filter(|p| **p != host).cloned().collect();
                let Some(peer) = pick(&mut rng, &others) else { return };
                FaultKind::ReplaceRace { host, peer }
            }
            Bias::PeerFlood => {
                let Some(host) = pick(&mut rng, peers) else { return };
                FaultKind::PeerFlood { host, count: rng.gen_range(360..=480) }
            }
            Bias::StopReading => {
                let Some(host) = pick(&mut rng, peers) else { return };
                // Shorter than the heartbeat timeout, so the stopped peer's links stay up;
                // the burst is more than SNDHWM plus the peer's RCVHWM and the TCP credit.
                FaultKind::StopReading { host, for_ms: rng.gen_range(4_000..=8_000), burst: STOP_READING_BURST }
            }
            Bias::ForgedIdentity => {
                let Some(from) = pick(&mut rng, peers) else { return };
                let others: Vec<String> = peers.iter().filter(|p| **p != from).cloned().collect();
                let Some(to) = pick(&mut rng, &others) else { return };
                let targets: Vec<String> = topo.hosts().into_iter().filter(|h| *h != from).collect();
                let Some(target) = pick(&mut rng, &targets) else { return };
                FaultKind::ForgedIdentity { from, to, claims: format!("{target}:{FORGED_PORT}") }
            }
            Bias::SilentRestart => {
                let Some(host) = pick(&mut rng, peers) else { return };
                let others: Vec<String> = peers.iter().filter(|p| **p != host).cloned().collect();
                let Some(peer) = pick(&mut rng, &others) else { return };
                let for_ms = rng.gen_range(1_000..=6_000);
                let at_ms = rng.gen_range(1_000..horizon - for_ms);
                let bounce_ms = at_ms + rng.gen_range(100..=for_ms / 2);
                let mut candidate = plan.clone();
                candidate
                    .faults
                    .push(Fault { at_ms, kind: FaultKind::Partition { a: host.clone(), b: peer.clone(), for_ms } });
                candidate.faults.push(Fault {
                    at_ms: bounce_ms,
                    kind: FaultKind::ReconnectRace { host, peer, partition_ms: 0, gap_ms: 0 },
                });
                candidate.faults.sort_by_key(|f| f.at_ms);
                if candidate.validate(topo).is_ok() {
                    *plan = candidate;
                }
                continue;
            }
            Bias::ReconnectRace | Bias::PeerCrash => {
                let Some(host) = pick(&mut rng, peers) else { return };
                let others: Vec<String> = peers.iter().filter(|p| **p != host).cloned().collect();
                let Some(peer) = pick(&mut rng, &others) else { return };
                if bias == Bias::PeerCrash {
                    FaultKind::Crash { host, down_ms: rng.gen_range(500..=5_000) }
                } else {
                    let partition_ms = if rng.gen_bool(0.5) { 0 } else { rng.gen_range(100..=3_000) };
                    FaultKind::ReconnectRace { host, peer, partition_ms, gap_ms: rng.gen_range(0..=50) }
                }
            }
            Bias::LostRequests => {
                let (Some(from), Some(to)) = (pick(&mut rng, &topo.producers), pick(&mut rng, &ranks)) else { return };
                FaultKind::OneWay { from, to, for_ms: rng.gen_range(2_000..=8_000) }
            }
            Bias::ReapStall
            | Bias::EventsUndrained
            | Bias::SchedulerDiscovery
            | Bias::ProducerDiscovery
            | Bias::CompletionFailure
            | Bias::PartialDiscovery => return,
        };
        let span = kind.span_ms();
        if span >= horizon {
            continue;
        }
        let at_ms = rng.gen_range(1_000..horizon - span);
        let mut candidate = plan.clone();
        candidate.faults.push(Fault { at_ms, kind });
        candidate.faults.sort_by_key(|f| f.at_ms);
        // Keep a bias fault only where it fits (no two faults hold one link or host).
        if candidate.validate(topo).is_ok() {
            *plan = candidate;
        }
    }
}

/// Bias faults pinned to a moment of the run (the reap failure, the first discovery).
fn timed_bias(bias: Bias, rng: &mut ChaCha8Rng, topo: &Topology) -> Vec<Fault> {
    let ranks: Vec<String> = topo.ranks().iter().map(|(_, _, h)| h.to_string()).collect();
    // Rank 0 of each consumer serves its base address (`peers`).
    let bases: Vec<String> = topo.consumers.iter().filter_map(|c| c.ranks.first().cloned()).collect();
    let pick = |rng: &mut ChaCha8Rng, v: &[String]| -> Option<String> {
        (!v.is_empty()).then(|| v[rng.gen_range(0..v.len())].clone())
    };
    let mut out = Vec::new();
    match bias {
        Bias::ReapStall => {
            let Some(host) = pick(rng, &ranks) else { return out };
            let fail_ms = regressions::S2_REAP_FAULT_AT.as_nanos() / 1_000_000;
            let at_ms = rng.gen_range(fail_ms.saturating_sub(6_000)..fail_ms.saturating_sub(500).max(1));
            let kind = FaultKind::SlowHandler {
                host,
                delay_ms: rng.gen_range(31_000..=40_000),
                for_ms: rng.gen_range(1_000..=4_000),
            };
            out.push(Fault { at_ms, kind });
        }
        Bias::EventsUndrained | Bias::SchedulerDiscovery => {
            let (Some(a), Some(b)) = (pick(rng, &topo.schedulers), pick(rng, &bases)) else { return out };
            out.push(Fault { at_ms: 0, kind: FaultKind::Partition { a, b, for_ms: rng.gen_range(3_000..=15_000) } });
            if bias == Bias::SchedulerDiscovery {
                let (Some(a), Some(b)) = (pick(rng, &topo.producers), pick(rng, &ranks)) else { return out };
                let kind = FaultKind::Partition { a, b, for_ms: rng.gen_range(2_000..=8_000) };
                out.push(Fault { at_ms: rng.gen_range(0..=4_000), kind });
            }
        }
        Bias::ProducerDiscovery => {
            let (Some(from), Some(to)) = (pick(rng, &bases), pick(rng, &topo.producers)) else { return out };
            let kind = FaultKind::OneWay { from, to, for_ms: rng.gen_range(2_000..=8_000) };
            out.push(Fault { at_ms: rng.gen_range(0..=150), kind });
        }
        Bias::CompletionFailure => {
            // Replies from one rank lost: the completions in flight to it stay so until the
            // control timeout. From the same moment the other rank gets garbage in place of
            // the producer's next requests, so the same batches' completions there fail at once.
            let Some(slow) = pick(rng, &ranks) else { return out };
            let others: Vec<String> = ranks.iter().filter(|r| **r != slow).cloned().collect();
            let (Some(failing), Some(producer)) = (pick(rng, &others), pick(rng, &topo.producers)) else {
                return out;
            };
            let at_ms = rng.gen_range(3_000..=15_000);
            let for_ms = rng.gen_range(2_000..=8_000);
            out.extend(faults::completion_failure(rng, slow, failing, producer, at_ms, for_ms));
        }
        Bias::PartialDiscovery => out.extend(ec_scheduler::partial_discovery(rng, topo)),
        _ => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn race_names_resolve_to_their_switches() {
        let r = resolve("ec-s11").expect("a race of the catalogue");
        assert_eq!(r.topology, RACE_TOPOLOGY);
        assert!(!r.regressions.is_fixed());
        assert!(resolve("p2p-s5").is_some_and(|r| r.regressions.is_fixed()));
        assert!(resolve("full").is_some_and(|r| r.race.is_none()));
        assert!(resolve("nope").is_none());
    }

    #[test]
    fn a_race_plan_is_the_seed_plan_plus_valid_bias_faults() {
        let topo = Topology::small();
        for seed in 0..20 {
            let base = FaultPlan::draw(seed, &topo, engine::ACTIVE);
            let biased = plan(seed, "ec-s1").expect("known");
            assert!(biased.validate(&topo).is_ok());
            assert!(biased.faults.len() >= base.faults.len());
            assert_eq!(plan(seed, "ec-s1"), Some(biased), "deterministic");
        }
        assert_eq!(plan(3, "small"), Some(FaultPlan::draw(3, &topo, engine::ACTIVE)));
    }

    #[test]
    fn the_main_job_draws_its_world_with_its_plan_and_keeps_the_base_kinds_draws() {
        let full = Topology::full();
        let mut unbiased = 0;
        // Every bias kind is off together on about one seed in 2,100 (fifteen switches at
        // 40%).
        for seed in 0..10_000 {
            let p = plan(seed, MAIN).expect("known");
            assert!(p.world.is_some(), "the main job's plan carries its world");
            assert!(p.validate(&full).is_ok());
            assert_eq!(plan(seed, MAIN).as_ref(), Some(&p), "deterministic");
            let base = FaultPlan::draw(seed, &full, engine::ACTIVE);
            let off = crate::faults::KindRate::default();
            let extra = crate::faults::Swarm {
                peer_flood: off,
                replace_race: off,
                stop_reading: off,
                forged_identity: off,
                silent_restart: off,
                discovery_loss: off,
                completion_failure: off,
                handler_failures: off,
                oversize: off,
                lost_loads: off,
                discovery_garbage: off,
                peer_close: off,
                open_failures: off,
                scheduler_garbage: off,
                inbound_flood: off,
                peer_exit: off,
                subscribe_failures: off,
                ..p.swarm
            };
            assert_eq!(extra, base.swarm, "seed {seed}: the base kinds are switched as before");
            if extra == p.swarm {
                unbiased += 1;
                assert_eq!(p.faults, base.faults, "seed {seed}: no bias kind on, the base draw's faults");
            }
        }
        assert!(unbiased > 0);
        assert!(plan(3, "small").is_some_and(|p| p.world.is_none()));
        let g = resolve("generic-ec-s11").expect("a generic race");
        assert_eq!((g.topology.as_str(), g.bias), (MAIN, Bias::None));
        assert!(!g.regressions.is_fixed() && g.swarm == Some(Exposure::default()));
        assert!(resolve("generic-p2p-s5").is_some_and(|r| r.swarm.is_some_and(|e| e.no_handshake_deadline)));
        assert!(resolve("generic-nope").is_none());
    }
}
