//! Fault plans: what goes wrong in a run, and when, drawn from the run's seed.
//!
//! A plan is drawn swarm style: each fault kind is switched on or off per seed and gets
//! its own rate, so some seeds hammer one mechanism and others mix a few. The plan is a
//! plain value: it prints, round-trips through JSON and replays exactly, so a failing
//! seed's plan can be saved, edited down and run again with `ctlsim run --plan FILE`.
//!
//! [`FaultDriver`] applies a plan to the turmoil world as simulated time passes (link
//! faults, crashes, restarts). Faults a host must play itself (a slow handler, a malformed
//! frame) go into a thread-local table the hosts read with [`handler_delay`] and
//! [`take_malformed`].

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::IpAddr;
use std::time::Duration;

use ctlplane_core::ec::defaults::CONTROL_TIMEOUT;
use ctlplane_core::p2p::defaults::{HEARTBEAT_IVL, HEARTBEAT_TIMEOUT};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::topology::Topology;
use crate::world_swarm::{Exposure, WorldSwarm};

/// How often a simulated P2P peer polls its transport when nothing arrives (one manager
/// tick). Mainline polls once per engine scheduler step (p2p-behaviour.md §3.4: 0.45-0.6 s per hop on a
/// busy rank); 50 ms is a lightly loaded engine's step. A readable ROUTER wakes it sooner.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Why a plan could not be loaded or does not fit a topology.
#[derive(Debug, Error)]
pub enum FaultError {
    #[error("fault plan is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("fault {index} names host {host:?}, which is not in the topology")]
    UnknownHost { index: usize, host: String },
    #[error("fault {index} joins host {host:?} to itself")]
    SameHost { index: usize, host: String },
    #[error("fault {index} overlaps fault {other} on {resource}: one fault per link or host at a time")]
    Overlap { index: usize, other: usize, resource: String },
    #[error("fault {index}: {what}")]
    Invalid { index: usize, what: &'static str },
}

/// Whether a fault kind is drawn in this run, and how often.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindRate {
    pub enabled: bool,
    /// Expected faults of this kind per hour of active simulated time.
    pub per_hour: u32,
}

/// The swarm switches of one seed: one [`KindRate`] per fault kind (a kind left out of a
/// hand-written plan is off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Swarm {
    pub partition: KindRate,
    pub one_way: KindRate,
    pub hold: KindRate,
    pub crash: KindRate,
    pub long_partition: KindRate,
    pub slow_handler: KindRate,
    pub malformed: KindRate,
    pub reconnect_race: KindRate,
    /// The kinds below are drawn only in the main job's swarmed world
    /// ([`FaultPlan::draw_swarmed`]): the faults the race scenarios add as a bias.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub peer_flood: KindRate,
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub replace_race: KindRate,
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub stop_reading: KindRate,
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub forged_identity: KindRate,
    /// A P2P peer restarting inside a partition from another (its FIN lost).
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub silent_restart: KindRate,
    /// A discovery lost at the start: the scheduler cut from a base rank, or a base rank's
    /// replies to a producer lost.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub discovery_loss: KindRate,
    /// Replies from one rank to a producer lost while the producer's requests to another
    /// rank turn into garbage: completions fail on one rank while in flight on the other.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub completion_failure: KindRate,
    /// A P2P application whose handler fails on a few messages in a row.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub handler_failures: KindRate,
    /// A P2P application sending one message above the world's frame limit.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub oversize: KindRate,
    /// The scheduler's model runners never reporting the loads begun for a while.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub lost_loads: KindRate,
    /// A producer's first requests to a base rank turned into garbage from the start, so
    /// its discovery there fails on every attempt.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub discovery_garbage: KindRate,
    /// A P2P application closing its session with one peer for a while.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub peer_close: KindRate,
    /// A P2P process out of file descriptors: its next DEALER opens fail.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub open_failures: KindRate,
    /// One P2P peer opening many connections to another, as peers on its own host.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub inbound_flood: KindRate,
    /// The scheduler's next 2 or 3 requests to one rank turned into garbage at any time:
    /// a remote cancel (or its discovery) fails twice or more in a row, so its lane
    /// reaches its attempt bounds.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub scheduler_garbage: KindRate,
    /// A P2P node shutting down cleanly (every session closed, a Disconnect to each
    /// peer) and its host starting again later.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub peer_exit: KindRate,
    /// A scheduler out of file descriptors when it subscribes to a consumer's events.
    #[serde(skip_serializing_if = "KindRate::is_off")]
    pub subscribe_failures: KindRate,
}

impl KindRate {
    fn is_off(&self) -> bool {
        *self == KindRate::default()
    }
}

/// A frame that is not what the receiver's protocol expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Garbage {
    /// Not UTF-8, and `0xc1` is never valid msgpack.
    NotUtf8,
    /// `{not json`.
    NotJson,
    /// Valid JSON that is not an object (`[]`).
    NonObject,
    /// An empty frame.
    Empty,
    /// A msgpack map cut short.
    TruncatedMsgpack,
    /// A well-formed message of a known type with fields of the wrong type: JSON
    /// `{"op": 7}`, or a msgpack `fetch` without its fields.
    WrongTypes,
}

impl Garbage {
    const ALL: [Garbage; 6] = [
        Garbage::NotUtf8,
        Garbage::NotJson,
        Garbage::NonObject,
        Garbage::Empty,
        Garbage::TruncatedMsgpack,
        Garbage::WrongTypes,
    ];

    /// The frame, for a JSON receiver (EC control) or a msgpack one (P2P).
    pub fn frame(self, msgpack: bool) -> Vec<u8> {
        match self {
            Garbage::NotUtf8 => vec![0xff, 0xfe, 0xc1, 0x00],
            Garbage::NotJson => b"{not json".to_vec(),
            Garbage::NonObject => b"[]".to_vec(),
            Garbage::Empty => Vec::new(),
            // fixmap of 2, "type" (fixstr 4), then nothing.
            Garbage::TruncatedMsgpack => vec![0x82, 0xa4, b't', b'y', b'p', b'e'],
            Garbage::WrongTypes if msgpack => {
                // {"type": "fetch"}: a known type missing every field.
                let mut f = vec![0x81, 0xa4];
                f.extend_from_slice(b"type");
                f.push(0xa5);
                f.extend_from_slice(b"fetch");
                f
            }
            Garbage::WrongTypes => br#"{"op": 7}"#.to_vec(),
        }
    }
}

/// One thing that goes wrong.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Every segment between `a` and `b`, both ways, is dropped for `for_ms` (shorter
    /// than the heartbeat timeout: the links should survive it or reconnect).
    Partition { a: String, b: String, for_ms: u64 },
    /// Segments from `from` to `to` are dropped for `for_ms`; the other way works.
    OneWay { from: String, to: String, for_ms: u64 },
    /// Segments between `a` and `b` are held for `for_ms`, then all delivered at once.
    Hold { a: String, b: String, for_ms: u64 },
    /// `host`'s software stops (sockets gone, no FIN) and restarts after `down_ms`.
    Crash { host: String, down_ms: u64 },
    /// A partition longer than the heartbeat timeout: the links must be found dead.
    LongPartition { a: String, b: String, for_ms: u64 },
    /// Requests `host` handles during `for_ms` are answered `delay_ms` late (longer than
    /// the client timeout).
    SlowHandler { host: String, delay_ms: u64, for_ms: u64 },
    /// `from` sends `count` frames of `garbage` to `to` in place of its next requests.
    Malformed { from: String, to: String, count: u32, garbage: Garbage },
    /// `host` restarts at once, `gap_ms` after a partition from `peer` of `partition_ms`
    /// heals (none if 0), so its reconnect races `peer`'s poll, heartbeat and its own
    /// old connection's teardown.
    ReconnectRace { host: String, peer: String, partition_ms: u64, gap_ms: u64 },
    /// `host`'s application receives `count` requests naming distinct P2P peers where
    /// nothing listens (p2p-behaviour.md S10): each opens a DEALER and a monitor that never see a
    /// DISCONNECTED.
    PeerFlood { host: String, count: u32 },
    /// `peer`'s next request to `host` fails to send (its session dies between two manager
    /// ticks, p2p-behaviour.md S6), and `host` restarts the moment it does, so its replacement's
    /// Connect reaches `peer` before `peer`'s next poll.
    ReplaceRace { host: String, peer: String },
    /// `host`'s P2P application stops reading (its manager does not poll) for `for_ms`
    /// while its sockets stay up; each other peer's application sends it `burst` requests
    /// at its next traffic turn, more than the DEALER high-water mark lets queue.
    StopReading { host: String, for_ms: u64, burst: u32 },
    /// `from` sends `to`'s P2P ROUTER one well-formed message over a connection of its own
    /// whose routing identity is `claims` (`host:port`), an address of its choosing
    /// (p2p-behaviour.md S18).
    ForgedIdentity { from: String, to: String, claims: String },
    /// `from` opens `count` connections of its own to `to`'s P2P ROUTER, each with the
    /// routing identity `from:port` for a distinct port, where `from` listens without ever
    /// answering, and sends a Connect on each: peers on the sender's own host, which the
    /// peer check admits, so `to` registers them (each waiting out its handshake deadline)
    /// until its `max_peers` bound refuses the rest.
    InboundFlood { from: String, to: String, count: u32 },
    /// `host`'s P2P application fails on the next `count` role messages from `peer` (its
    /// handler raises); five in a row end the session (p2p-behaviour.md §2.3).
    HandlerFailures { host: String, peer: String, count: u32 },
    /// `from`'s P2P application sends `to` one lookup whose frame is larger than the
    /// world's frame limit (nothing when the world has none).
    Oversize { from: String, to: String },
    /// For `for_ms`, the first `count` loads scheduler `host` begins are never reported:
    /// the model runners hung on them, so only the scheduler's LOADING deadline ends them
    /// (ec-behaviour.md §6.3).
    LostLoads { host: String, for_ms: u64, count: u32 },
    /// `host`'s P2P application closes its session with `peer` (`PeerManager::close`: a
    /// best-effort Disconnect, then dead) and keeps the peer connected again `for_ms`
    /// later.
    PeerClose { host: String, peer: String, for_ms: u64 },
    /// `host`'s next `count` DEALER opens fail as a process out of file descriptors fails
    /// them (`EMFILE`): the manager is told through `handle_open_failed`.
    OpenFailures { host: String, count: u32 },
    /// `host`'s P2P node shuts down cleanly at its next turn (`PeerManager::close_all`: a
    /// best-effort Disconnect on every session, every DEALER closed), its process exits,
    /// and the host starts again `down_ms` after the fault began.
    PeerExit { host: String, down_ms: u64 },
    /// Scheduler `host`'s next `count` event-channel subscriptions fail as a process out of
    /// file descriptors fails its PULL socket: the core is told through
    /// `Scheduler::subscribe_failed`, and a later drain discovers again.
    SubscribeFailures { host: String, count: u32 },
}

impl FaultKind {
    /// Stable short name, used in trace kinds (`fault.<name>`).
    pub fn name(&self) -> &'static str {
        match self {
            FaultKind::Partition { .. } => "partition",
            FaultKind::OneWay { .. } => "one_way",
            FaultKind::Hold { .. } => "hold",
            FaultKind::Crash { .. } => "crash",
            FaultKind::LongPartition { .. } => "long_partition",
            FaultKind::SlowHandler { .. } => "slow_handler",
            FaultKind::Malformed { .. } => "malformed",
            FaultKind::ReconnectRace { .. } => "reconnect_race",
            FaultKind::PeerFlood { .. } => "peer_flood",
            FaultKind::ReplaceRace { .. } => "replace_race",
            FaultKind::StopReading { .. } => "stop_reading",
            FaultKind::ForgedIdentity { .. } => "forged_identity",
            FaultKind::InboundFlood { .. } => "inbound_flood",
            FaultKind::HandlerFailures { .. } => "handler_failures",
            FaultKind::Oversize { .. } => "oversize",
            FaultKind::LostLoads { .. } => "lost_loads",
            FaultKind::PeerClose { .. } => "peer_close",
            FaultKind::OpenFailures { .. } => "open_failures",
            FaultKind::PeerExit { .. } => "peer_exit",
            FaultKind::SubscribeFailures { .. } => "subscribe_failures",
        }
    }

    /// How long the fault lasts from its start, ms.
    pub fn span_ms(&self) -> u64 {
        match self {
            FaultKind::Partition { for_ms, .. }
            | FaultKind::OneWay { for_ms, .. }
            | FaultKind::Hold { for_ms, .. }
            | FaultKind::LongPartition { for_ms, .. }
            | FaultKind::SlowHandler { for_ms, .. }
            | FaultKind::StopReading { for_ms, .. }
            | FaultKind::LostLoads { for_ms, .. }
            | FaultKind::PeerClose { for_ms, .. } => *for_ms,
            FaultKind::Crash { down_ms, .. } | FaultKind::PeerExit { down_ms, .. } => *down_ms,
            FaultKind::Malformed { .. } => 0,
            FaultKind::ReconnectRace { partition_ms, gap_ms, .. } => partition_ms + gap_ms,
            FaultKind::PeerFlood { .. }
            | FaultKind::ReplaceRace { .. }
            | FaultKind::ForgedIdentity { .. }
            | FaultKind::HandlerFailures { .. }
            | FaultKind::Oversize { .. }
            | FaultKind::OpenFailures { .. }
            | FaultKind::SubscribeFailures { .. } => 0,
            FaultKind::InboundFlood { count, .. } => INBOUND_FLOOD_GAP_MS * u64::from(*count),
        }
    }

    /// Whether the oracles excuse this fault's harm item by item (the world records the
    /// items it hit) rather than every request near a host it names: lost loads hold up
    /// only the loads they lost.
    pub fn excused_per_item(&self) -> bool {
        matches!(self, FaultKind::LostLoads { .. })
    }

    /// Every host the fault names.
    pub fn hosts(&self) -> Vec<&str> {
        match self {
            FaultKind::Partition { a, b, .. }
            | FaultKind::Hold { a, b, .. }
            | FaultKind::LongPartition { a, b, .. } => {
                vec![a, b]
            }
            FaultKind::OneWay { from, to, .. } | FaultKind::Malformed { from, to, .. } => vec![from, to],
            FaultKind::Crash { host, .. } | FaultKind::SlowHandler { host, .. } => vec![host],
            FaultKind::ReconnectRace { host, peer, .. } => vec![host, peer],
            FaultKind::PeerFlood { host, .. } => vec![host],
            FaultKind::ReplaceRace { host, peer } => vec![host, peer],
            FaultKind::StopReading { host, .. }
            | FaultKind::LostLoads { host, .. }
            | FaultKind::OpenFailures { host, .. }
            | FaultKind::SubscribeFailures { host, .. }
            | FaultKind::PeerExit { host, .. } => vec![host],
            FaultKind::ForgedIdentity { from, to, .. }
            | FaultKind::InboundFlood { from, to, .. }
            | FaultKind::Oversize { from, to } => vec![from, to],
            FaultKind::HandlerFailures { host, peer, .. } | FaultKind::PeerClose { host, peer, .. } => {
                vec![host, peer]
            }
        }
    }

    /// What the fault occupies while it lasts: a link (`a|b`, sorted) or a host's
    /// software (`host`). Two faults on one resource must not overlap: turmoil keeps one
    /// state per link direction, and a restart would cut a crash short.
    fn resources(&self) -> Vec<String> {
        let link = |a: &str, b: &str| if a < b { format!("link {a}|{b}") } else { format!("link {b}|{a}") };
        match self {
            FaultKind::Partition { a, b, .. }
            | FaultKind::Hold { a, b, .. }
            | FaultKind::LongPartition { a, b, .. } => {
                vec![link(a, b)]
            }
            FaultKind::OneWay { from, to, .. } => vec![link(from, to)],
            FaultKind::Crash { host, .. } | FaultKind::PeerExit { host, .. } => vec![format!("host {host}")],
            FaultKind::SlowHandler { host, .. } => vec![format!("handler {host}")],
            FaultKind::Malformed { .. } => Vec::new(),
            FaultKind::ReconnectRace { host, peer, partition_ms, .. } => {
                let mut r = vec![format!("host {host}")];
                if *partition_ms > 0 {
                    r.push(link(host, peer));
                }
                r
            }
            FaultKind::PeerFlood { .. }
            | FaultKind::ForgedIdentity { .. }
            | FaultKind::HandlerFailures { .. }
            | FaultKind::Oversize { .. }
            | FaultKind::OpenFailures { .. }
            | FaultKind::SubscribeFailures { .. } => Vec::new(),
            // Its connections are made and accepted one by one: a hold on the link, or
            // either end down or not polling, would leave them to arrive at once, more than
            // the simulated listener's backlog takes.
            FaultKind::InboundFlood { from, to, .. } => vec![
                link(from, to),
                format!("host {from}"),
                format!("reader {from}"),
                format!("host {to}"),
                format!("reader {to}"),
            ],
            // The host restarts when the armed send fails, soon after the fault starts.
            FaultKind::ReplaceRace { host, .. } => vec![format!("host {host}")],
            FaultKind::StopReading { host, .. } => vec![format!("reader {host}")],
            FaultKind::LostLoads { host, .. } => vec![format!("loads {host}")],
            FaultKind::PeerClose { host, peer, .. } => vec![format!("close {host}|{peer}")],
        }
    }
}

/// One fault and when it starts, ms of simulated time from the start of the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fault {
    pub at_ms: u64,
    pub kind: FaultKind,
}

/// Everything that goes wrong in one run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultPlan {
    pub seed: u64,
    /// How the faults were drawn; informative only (a plan runs its `faults`).
    #[serde(default)]
    pub swarm: Swarm,
    /// The world the run plays in, drawn with the plan in the main job's scenario
    /// (`crate::world_swarm`); `None`: the scenario's own settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub world: Option<WorldSwarm>,
    /// Sorted by `at_ms` (ties keep drawing order).
    pub faults: Vec<Fault>,
}

/// RNG stream of each drawing purpose, so that adding a kind never shifts another's draws.
mod stream {
    pub const SWARM: u64 = 1;
    pub const KIND_BASE: u64 = 0x100;
    /// The swarm switches of the kinds only the main job's world draws.
    pub const SWARM_EXTRA: u64 = 2;
}

/// Host pairs that talk to each other, and hosts by role, as the draw needs them.
struct Targets {
    /// Every pair with a TCP connection between them (producer/scheduler to consumer
    /// rank, P2P peer to P2P peer), each once.
    links: Vec<(String, String)>,
    hosts: Vec<String>,
    ranks: Vec<String>,
    /// `(from, to, to speaks msgpack)`.
    senders: Vec<(String, String, bool)>,
    p2p_pairs: Vec<(String, String)>,
}

impl Targets {
    fn of(topo: &Topology) -> Self {
        let ranks: Vec<String> = topo.ranks().into_iter().map(|(_, _, h)| h.to_string()).collect();
        let mut links = Vec::new();
        let mut senders = Vec::new();
        for client in topo.producers.iter().chain(&topo.schedulers) {
            for r in &ranks {
                links.push((client.clone(), r.clone()));
                senders.push((client.clone(), r.clone(), false));
            }
        }
        let mut p2p_pairs = Vec::new();
        for (i, a) in topo.p2p_peers.iter().enumerate() {
            for b in &topo.p2p_peers[i + 1..] {
                links.push((a.clone(), b.clone()));
                p2p_pairs.push((a.clone(), b.clone()));
            }
            for b in &topo.p2p_peers {
                if a != b {
                    senders.push((a.clone(), b.clone(), true));
                }
            }
        }
        Targets { links, hosts: topo.hosts(), ranks, senders, p2p_pairs }
    }
}

/// A completion failure on two ranks: from `at_ms`, the `slow` rank's replies to the
/// producer are lost for `for_ms` (the completions in flight to it wait out the control
/// timeout), and from the same moment the `failing` rank gets garbage in place of the
/// producer's next requests (the same batches' completions there fail at once).
pub fn completion_failure(
    rng: &mut ChaCha8Rng,
    slow: String,
    failing: String,
    producer: String,
    at_ms: u64,
    for_ms: u64,
) -> [Fault; 2] {
    let lost = Fault { at_ms, kind: FaultKind::OneWay { from: slow, to: producer.clone(), for_ms } };
    let kind =
        FaultKind::Malformed { from: producer, to: failing, count: rng.gen_range(12..=30), garbage: Garbage::NotJson };
    [lost, Fault { at_ms: at_ms + rng.gen_range(0..=100), kind }]
}

fn pick<'a, T>(rng: &mut ChaCha8Rng, v: &'a [T]) -> Option<&'a T> {
    if v.is_empty() {
        None
    } else {
        v.get(rng.gen_range(0..v.len()))
    }
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

impl FaultPlan {
    /// No faults at all (the swarm switches everything off).
    pub fn none(seed: u64) -> Self {
        FaultPlan { seed, swarm: Swarm::default(), world: None, faults: Vec::new() }
    }

    /// The plan of `seed` for `topo`: every fault starts and ends inside `horizon` (the
    /// active phase). Durations straddle the thresholds that matter: short partitions
    /// stay under the heartbeat timeout, long ones exceed it by at least one heartbeat
    /// interval, slow handlers exceed the client timeout.
    pub fn draw(seed: u64, topo: &Topology, horizon: Duration) -> Self {
        Self::draw_inner(seed, topo, horizon, false)
    }

    /// The main job's plan of `seed`: [`Self::draw`]'s faults, the race biases as further
    /// fault kinds (each switched on or off per seed, on streams of their own, so the
    /// faults [`Self::draw`] gives are drawn as before and only the overlap rule may drop
    /// one), and the seed's world ([`WorldSwarm::draw`] with `exposure`).
    pub fn draw_swarmed(seed: u64, topo: &Topology, horizon: Duration, exposure: Exposure) -> Self {
        let mut plan = Self::draw_inner(seed, topo, horizon, true);
        let mut world = WorldSwarm::draw(seed, exposure);
        let flooded =
            plan.faults.iter().any(|f| matches!(f.kind, FaultKind::PeerFlood { .. } | FaultKind::InboundFlood { .. }));
        if flooded && world.max_peers.is_none() && !exposure.unbounded_peers {
            // Unbounded peers under a flood is race p2p-s10, which ctlplane has by default:
            // its fix is this bound (the open PR's value).
            world.max_peers = Some(FLOOD_FIX_MAX_PEERS);
        }
        plan.world = Some(world);
        plan
    }

    fn draw_inner(seed: u64, topo: &Topology, horizon: Duration, extra: bool) -> Self {
        let horizon_ms = ms(horizon);
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream::SWARM);
        let mut rate = || {
            let enabled = rng.gen_bool(0.5);
            KindRate { enabled, per_hour: if enabled { rng.gen_range(30..=240) } else { 0 } }
        };
        let swarm = Swarm {
            partition: rate(),
            one_way: rate(),
            hold: rate(),
            crash: rate(),
            long_partition: rate(),
            slow_handler: rate(),
            malformed: rate(),
            reconnect_race: rate(),
            ..Swarm::default()
        };
        let t = Targets::of(topo);
        let kinds = [
            swarm.partition,
            swarm.one_way,
            swarm.hold,
            swarm.crash,
            swarm.long_partition,
            swarm.slow_handler,
            swarm.malformed,
            swarm.reconnect_race,
        ];
        let mut drawn = Vec::new();
        for (k, kr) in kinds.iter().enumerate() {
            if !kr.enabled {
                continue;
            }
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rng.set_stream(stream::KIND_BASE + k as u64);
            // Expected count per_hour * horizon; the fraction decides one more or not.
            let expected_milli = u128::from(kr.per_hour) * u128::from(horizon_ms) * 1000 / 3_600_000;
            let mut n = (expected_milli / 1000) as u64;
            if rng.gen_range(0..1000) < (expected_milli % 1000) as u64 {
                n += 1;
            }
            for _ in 0..n {
                if let Some(kind) = draw_kind(k, &mut rng, &t) {
                    let span = kind.span_ms();
                    if span >= horizon_ms {
                        continue;
                    }
                    let mut at_ms = rng.gen_range(0..horizon_ms - span);
                    if let FaultKind::ReconnectRace { partition_ms: 0, .. } = kind {
                        // Line the restart up with a poll tick, give or take a millisecond.
                        let tick = ms(POLL_INTERVAL).max(1);
                        at_ms = (at_ms / tick * tick + rng.gen_range(0..=2)).saturating_sub(1);
                    }
                    drawn.push(Fault { at_ms, kind });
                }
            }
        }
        let mut swarm = swarm;
        if extra {
            draw_extra(seed, horizon_ms, topo, &t, &mut swarm, &mut drawn);
        }
        drawn.sort_by_key(|f| f.at_ms);
        // Keep a fault only if its link or host is free for its whole span.
        let mut busy: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
        let mut faults = Vec::new();
        for f in drawn {
            let (s, e) = (f.at_ms, f.at_ms + f.kind.span_ms());
            let res = f.kind.resources();
            let clash = res.iter().any(|r| busy.get(r).is_some_and(|w| w.iter().any(|&(s2, e2)| s <= e2 && s2 <= e)));
            if clash {
                continue;
            }
            for r in res {
                busy.entry(r).or_default().push((s, e));
            }
            faults.push(f);
        }
        FaultPlan { seed, swarm, world: None, faults }
    }

    /// Pretty JSON, as `ctlsim plan` prints it and `--plan` reads it.
    pub fn to_json(&self) -> String {
        // A plan holds only strings, integers and enums: serialising cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// Reads a plan written by [`Self::to_json`] (or by hand). The faults are sorted by
    /// start; whether they fit a topology is [`Self::validate`]'s business.
    pub fn from_json(s: &str) -> Result<Self, FaultError> {
        let mut plan: FaultPlan = serde_json::from_str(s)?;
        plan.faults.sort_by_key(|f| f.at_ms);
        plan.check_shape()?;
        Ok(plan)
    }

    /// Checks that every host exists in `topo`, no fault joins a host to itself, and no two
    /// faults hold one link or host at the same time.
    pub fn validate(&self, topo: &Topology) -> Result<(), FaultError> {
        self.check_shape()?;
        let hosts: BTreeSet<String> = topo.hosts().into_iter().collect();
        for (index, f) in self.faults.iter().enumerate() {
            for h in f.kind.hosts() {
                if !hosts.contains(h) {
                    return Err(FaultError::UnknownHost { index, host: h.to_string() });
                }
            }
        }
        Ok(())
    }

    fn check_shape(&self) -> Result<(), FaultError> {
        let mut busy: BTreeMap<String, Vec<(usize, u64, u64)>> = BTreeMap::new();
        for (index, f) in self.faults.iter().enumerate() {
            let hosts = f.kind.hosts();
            if hosts.len() == 2 && hosts[0] == hosts[1] {
                return Err(FaultError::SameHost { index, host: hosts[0].to_string() });
            }
            if let FaultKind::Malformed { count: 0, .. } = f.kind {
                return Err(FaultError::Invalid { index, what: "a malformed fault needs count >= 1" });
            }
            if let FaultKind::PeerFlood { count: 0, .. } | FaultKind::InboundFlood { count: 0, .. } = f.kind {
                return Err(FaultError::Invalid { index, what: "a peer flood needs count >= 1" });
            }
            if let FaultKind::HandlerFailures { count: 0, .. } = f.kind {
                return Err(FaultError::Invalid { index, what: "handler failures need count >= 1" });
            }
            let (s, e) = (f.at_ms, f.at_ms.saturating_add(f.kind.span_ms()));
            for r in f.kind.resources() {
                let w = busy.entry(r.clone()).or_default();
                if let Some(&(other, _, _)) = w.iter().find(|&&(_, s2, e2)| s <= e2 && s2 <= e) {
                    return Err(FaultError::Overlap { index, other, resource: r });
                }
                w.push((index, s, e));
            }
        }
        Ok(())
    }

    /// When the last fault ends, ms.
    pub fn end_ms(&self) -> u64 {
        self.faults.iter().map(|f| f.at_ms + f.kind.span_ms()).max().unwrap_or(0)
    }
}

/// `max_peers` the main job gives the P2P peers of a seed with a peer flood, unless its
/// world drew a bound of its own.
pub const FLOOD_FIX_MAX_PEERS: usize = 128;

/// The first port an inbound flood's identities claim (no P2P peer listens there).
pub const INBOUND_FLOOD_PORT: u16 = 20_000;

/// Between two connections of an inbound flood, ms: the simulated listener accepts about
/// one connection per ms, and its backlog is bounded (64).
const INBOUND_FLOOD_GAP_MS: u64 = 2;
/// Requests each other peer sends a peer that stopped reading (more than the DEALER
/// high-water mark, the peer's RCVHWM and the TCP credit hold).
const STOP_READING_BURST: u32 = 3_000;

/// The bias kinds of the main job's plan: each on or off per seed (its switch on stream
/// [`stream::SWARM_EXTRA`]), its faults on a stream of its own.
fn draw_extra(seed: u64, horizon_ms: u64, topo: &Topology, t: &Targets, swarm: &mut Swarm, out: &mut Vec<Fault>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(stream::SWARM_EXTRA);
    let mut rate = || {
        let enabled = rng.gen_bool(0.4);
        // 0.5 to 3 faults in a 20 s active phase: one is often all a race needs.
        KindRate { enabled, per_hour: if enabled { rng.gen_range(90..=540) } else { 0 } }
    };
    swarm.peer_flood = rate();
    swarm.replace_race = rate();
    swarm.stop_reading = rate();
    swarm.forged_identity = rate();
    swarm.silent_restart = rate();
    swarm.discovery_loss = rate();
    swarm.completion_failure = rate();
    swarm.handler_failures = rate();
    swarm.oversize = rate();
    swarm.lost_loads = rate();
    swarm.discovery_garbage = rate();
    swarm.peer_close = rate();
    swarm.open_failures = rate();
    swarm.scheduler_garbage = rate();
    swarm.inbound_flood = rate();
    swarm.peer_exit = rate();
    swarm.subscribe_failures = rate();
    let kinds = [
        swarm.peer_flood,
        swarm.replace_race,
        swarm.stop_reading,
        swarm.forged_identity,
        swarm.silent_restart,
        swarm.discovery_loss,
        swarm.completion_failure,
        swarm.handler_failures,
        swarm.oversize,
        swarm.lost_loads,
        swarm.discovery_garbage,
        swarm.peer_close,
        swarm.open_failures,
        swarm.scheduler_garbage,
        swarm.inbound_flood,
        swarm.peer_exit,
        swarm.subscribe_failures,
    ];
    let ranks = &t.ranks;
    let bases: Vec<String> = topo.consumers.iter().filter_map(|c| c.ranks.first().cloned()).collect();
    let peers = &topo.p2p_peers;
    for (k, kr) in kinds.iter().enumerate() {
        if !kr.enabled {
            continue;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        rng.set_stream(stream::KIND_BASE + 0x80 + k as u64);
        let expected_milli = u128::from(kr.per_hour) * u128::from(horizon_ms) * 1000 / 3_600_000;
        let mut n = (expected_milli / 1000) as u64;
        if rng.gen_range(0..1000) < (expected_milli % 1000) as u64 {
            n += 1;
        }
        for _ in 0..n {
            let two = |rng: &mut ChaCha8Rng| -> Option<(String, String)> {
                let (a, b) = pick(rng, &t.p2p_pairs)?.clone();
                Some(if rng.gen_bool(0.5) { (a, b) } else { (b, a) })
            };
            let at = |rng: &mut ChaCha8Rng, span: u64| rng.gen_range(0..horizon_ms.saturating_sub(span).max(1));
            match k {
                0 => {
                    let Some(host) = pick(&mut rng, peers).cloned() else { continue };
                    let kind = FaultKind::PeerFlood { host, count: rng.gen_range(20..=480) };
                    out.push(Fault { at_ms: at(&mut rng, 0), kind });
                }
                1 => {
                    let Some((host, peer)) = two(&mut rng) else { continue };
                    out.push(Fault { at_ms: at(&mut rng, 0), kind: FaultKind::ReplaceRace { host, peer } });
                }
                2 => {
                    let Some(host) = pick(&mut rng, peers).cloned() else { continue };
                    let for_ms = rng.gen_range(1_000..=8_000);
                    let kind = FaultKind::StopReading { host, for_ms, burst: STOP_READING_BURST };
                    out.push(Fault { at_ms: at(&mut rng, for_ms), kind });
                }
                3 => {
                    let Some((from, to)) = two(&mut rng) else { continue };
                    let targets: Vec<String> = t.hosts.iter().filter(|h| **h != from).cloned().collect();
                    let Some(target) = pick(&mut rng, &targets).cloned() else { continue };
                    let port = if rng.gen_bool(0.5) { 22 } else { rng.gen_range(1..=65_535) };
                    let kind = FaultKind::ForgedIdentity { from, to, claims: format!("{target}:{port}") };
                    out.push(Fault { at_ms: at(&mut rng, 0), kind });
                }
                4 => {
                    let Some((host, peer)) = two(&mut rng) else { continue };
                    let for_ms = rng.gen_range(1_000..=6_000);
                    let at_ms = at(&mut rng, for_ms);
                    let bounce_ms = at_ms + rng.gen_range(100..=for_ms / 2);
                    out.push(Fault { at_ms, kind: FaultKind::Partition { a: host.clone(), b: peer.clone(), for_ms } });
                    let kind = FaultKind::ReconnectRace { host, peer, partition_ms: 0, gap_ms: 0 };
                    out.push(Fault { at_ms: bounce_ms, kind });
                }
                5 => {
                    if rng.gen_bool(0.5) {
                        let (Some(a), Some(b)) =
                            (pick(&mut rng, &topo.schedulers).cloned(), pick(&mut rng, &bases).cloned())
                        else {
                            continue;
                        };
                        let kind = FaultKind::Partition { a, b, for_ms: rng.gen_range(3_000..=15_000) };
                        // Half the time from the very start, so the scheduler's first
                        // `peers` is lost too (it leaves in the first step and is answered
                        // within milliseconds): the consumer's topology stays unknown, and
                        // a remote cancel meanwhile must discover the shards itself.
                        let at_ms = if rng.gen_bool(0.5) { 0 } else { rng.gen_range(0..=200) };
                        out.push(Fault { at_ms, kind });
                        // Half the time pushes fail meanwhile too, so requests that arrive
                        // while a drain blocks on discovery wait in vain.
                        if rng.gen_bool(0.5) {
                            let (Some(a), Some(b)) =
                                (pick(&mut rng, &topo.producers).cloned(), pick(&mut rng, ranks).cloned())
                            else {
                                continue;
                            };
                            let kind = FaultKind::Partition { a, b, for_ms: rng.gen_range(2_000..=8_000) };
                            out.push(Fault { at_ms: rng.gen_range(0..=4_000), kind });
                        }
                    } else {
                        let (Some(from), Some(to)) =
                            (pick(&mut rng, &bases).cloned(), pick(&mut rng, &topo.producers).cloned())
                        else {
                            continue;
                        };
                        let kind = FaultKind::OneWay { from, to, for_ms: rng.gen_range(2_000..=8_000) };
                        out.push(Fault { at_ms: rng.gen_range(0..=150), kind });
                    }
                }
                6 => {
                    let Some(slow) = pick(&mut rng, ranks).cloned() else { continue };
                    let others: Vec<String> = ranks.iter().filter(|r| **r != slow).cloned().collect();
                    let (Some(failing), Some(producer)) =
                        (pick(&mut rng, &others).cloned(), pick(&mut rng, &topo.producers).cloned())
                    else {
                        continue;
                    };
                    let for_ms = rng.gen_range(2_000..=8_000);
                    let at_ms = at(&mut rng, for_ms + 100);
                    out.extend(completion_failure(&mut rng, slow, failing, producer, at_ms, for_ms));
                }
                7 => {
                    let Some((host, peer)) = two(&mut rng) else { continue };
                    let kind = FaultKind::HandlerFailures { host, peer, count: rng.gen_range(1..=8) };
                    out.push(Fault { at_ms: at(&mut rng, 0), kind });
                }
                8 => {
                    let Some((from, to)) = two(&mut rng) else { continue };
                    out.push(Fault { at_ms: at(&mut rng, 0), kind: FaultKind::Oversize { from, to } });
                }
                9 => {
                    let Some(host) = pick(&mut rng, &topo.schedulers).cloned() else { continue };
                    let for_ms = rng.gen_range(500..=10_000);
                    let count = rng.gen_range(1..=3);
                    let kind = FaultKind::LostLoads { host, for_ms, count };
                    out.push(Fault { at_ms: at(&mut rng, for_ms), kind });
                }
                10 => {
                    // Armed before the producer's first discovery of the consumer: its
                    // first requests to the base rank are `peers`, each retry included.
                    let (Some(from), Some(to)) =
                        (pick(&mut rng, &topo.producers).cloned(), pick(&mut rng, &bases).cloned())
                    else {
                        continue;
                    };
                    let kind =
                        FaultKind::Malformed { from, to, count: rng.gen_range(2..=3), garbage: Garbage::NotJson };
                    out.push(Fault { at_ms: rng.gen_range(0..=100), kind });
                }
                11 => {
                    let Some((host, peer)) = two(&mut rng) else { continue };
                    let for_ms = rng.gen_range(0..=10_000);
                    out.push(Fault { at_ms: at(&mut rng, for_ms), kind: FaultKind::PeerClose { host, peer, for_ms } });
                }
                12 => {
                    let Some(host) = pick(&mut rng, peers).cloned() else { continue };
                    let kind = FaultKind::OpenFailures { host, count: rng.gen_range(1..=3) };
                    out.push(Fault { at_ms: at(&mut rng, 0), kind });
                }
                14 => {
                    let Some((from, to)) = two(&mut rng) else { continue };
                    let kind = FaultKind::InboundFlood { from, to, count: rng.gen_range(20..=300) };
                    out.push(Fault { at_ms: at(&mut rng, 0), kind });
                }
                15 => {
                    let Some(host) = pick(&mut rng, peers).cloned() else { continue };
                    // Longer than a turn, so the node shuts down before its host restarts.
                    let down_ms = rng.gen_range(200..=8_000);
                    out.push(Fault { at_ms: at(&mut rng, down_ms), kind: FaultKind::PeerExit { host, down_ms } });
                }
                16 => {
                    // Armed before the scheduler's first subscription, half the time; at
                    // any time otherwise, for a subscription after a re-discovery.
                    let Some(host) = pick(&mut rng, &topo.schedulers).cloned() else { continue };
                    let kind = FaultKind::SubscribeFailures { host, count: rng.gen_range(1..=2) };
                    let at_ms = if rng.gen_bool(0.5) { rng.gen_range(0..=100) } else { at(&mut rng, 0) };
                    out.push(Fault { at_ms, kind });
                }
                _ => {
                    let (Some(from), Some(to)) =
                        (pick(&mut rng, &topo.schedulers).cloned(), pick(&mut rng, ranks).cloned())
                    else {
                        continue;
                    };
                    let kind =
                        FaultKind::Malformed { from, to, count: rng.gen_range(2..=3), garbage: Garbage::NotJson };
                    out.push(Fault { at_ms: at(&mut rng, 0), kind });
                }
            }
        }
    }
}

/// Draws one fault of kind index `k` (the order of [`Swarm`]'s fields).
fn draw_kind(k: usize, rng: &mut ChaCha8Rng, t: &Targets) -> Option<FaultKind> {
    let hb = ms(HEARTBEAT_TIMEOUT);
    let ivl = ms(HEARTBEAT_IVL);
    Some(match k {
        0 => {
            let (a, b) = pick(rng, &t.links)?.clone();
            FaultKind::Partition { a, b, for_ms: rng.gen_range(200..hb - ivl) }
        }
        1 => {
            let (a, b) = pick(rng, &t.links)?.clone();
            let (from, to) = if rng.gen_bool(0.5) { (a, b) } else { (b, a) };
            FaultKind::OneWay { from, to, for_ms: rng.gen_range(500..=2 * hb) }
        }
        2 => {
            let (a, b) = pick(rng, &t.links)?.clone();
            FaultKind::Hold { a, b, for_ms: rng.gen_range(5..=2_000) }
        }
        3 => {
            let host = pick(rng, &t.hosts)?.clone();
            FaultKind::Crash { host, down_ms: rng.gen_range(0..=15_000) }
        }
        4 => {
            let (a, b) = pick(rng, &t.links)?.clone();
            FaultKind::LongPartition { a, b, for_ms: rng.gen_range(hb + ivl + 1_000..=3 * hb) }
        }
        5 => {
            let host = pick(rng, &t.ranks)?.clone();
            let timeout = ms(CONTROL_TIMEOUT);
            FaultKind::SlowHandler {
                host,
                delay_ms: rng.gen_range(timeout + 1..=timeout * 3 / 2),
                for_ms: rng.gen_range(1_000..=20_000),
            }
        }
        6 => {
            let (from, to, _) = pick(rng, &t.senders)?.clone();
            let garbage = *pick(rng, &Garbage::ALL)?;
            FaultKind::Malformed { from, to, count: rng.gen_range(1..=3), garbage }
        }
        7 => {
            let (a, b) = pick(rng, &t.p2p_pairs)?.clone();
            let (host, peer) = if rng.gen_bool(0.5) { (a, b) } else { (b, a) };
            let partition_ms = if rng.gen_bool(0.5) { 0 } else { rng.gen_range(1_000..=2 * hb) };
            FaultKind::ReconnectRace { host, peer, partition_ms, gap_ms: rng.gen_range(0..=20) }
        }
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------
// Host side: faults a host plays itself.

#[derive(Default)]
struct HostFaults {
    delays: BTreeMap<String, Duration>,
    /// Per sender: `(to, garbage)` frames still to send, in order.
    malformed: BTreeMap<String, VecDeque<(String, Garbage)>>,
    /// Per P2P host: requests naming peers nobody listens for, still to arrive.
    floods: BTreeMap<String, u32>,
    /// Per P2P host: `(to, claimed identity)` forged messages still to send.
    forged: BTreeMap<String, Vec<(String, String)>>,
    /// Per `(P2P host, peer)`: role messages from the peer its handler still fails on.
    handler_failures: BTreeMap<(String, String), u32>,
    /// Per `(P2P host, peer)`: messages its handler takes before it fails again (spaced
    /// failures, `Knobs::p2p_handler_spacing`).
    handler_spared: BTreeMap<(String, String), u32>,
    /// P2P hosts whose node shuts down at its next turn.
    exits: BTreeSet<String>,
    /// Per P2P host: peers whose session its application closes now.
    closes: BTreeMap<String, BTreeSet<String>>,
    /// Per P2P host: peers it keeps connected again now.
    reopens: BTreeMap<String, BTreeSet<String>>,
    /// Schedulers whose loads go unreported (a lost-loads fault).
    loads_lost: BTreeMap<String, u32>,
    /// Per P2P host: peers it still owes a message above the frame limit.
    oversize: BTreeMap<String, BTreeSet<String>>,
    /// Per P2P host: DEALER opens still to fail.
    open_failures: BTreeMap<String, u32>,
    /// Per scheduler: event-channel subscriptions still to fail.
    subscribe_failures: BTreeMap<String, u32>,
    /// Per `(sender, receiver)`: the next request fails to send; the value is the fault's
    /// index, whose receiver then restarts.
    send_failures: BTreeMap<(String, String), usize>,
    /// Restarts a failed send asked for, by fault index: the driver plays them next step.
    bounces: Vec<(usize, String)>,
    /// P2P hosts that stop reading, and until when.
    stopped: BTreeMap<String, ctlplane_core::time::Instant>,
    /// Per stopped host: the burst each other peer sends it, and who sent theirs already.
    bursts: BTreeMap<String, (u32, BTreeSet<String>)>,
}

thread_local! {
    static HOST_FAULTS: RefCell<HostFaults> = RefCell::new(HostFaults::default());
}

/// Forget every host-side fault; [`FaultDriver::new`] calls it.
pub fn reset() {
    HOST_FAULTS.with(|h| *h.borrow_mut() = HostFaults::default());
}

/// How much later than usual `host` answers a request it handles now, if a slow-handler
/// fault is active on it.
pub fn handler_delay(host: &str) -> Option<Duration> {
    HOST_FAULTS.with(|h| h.borrow().delays.get(host).copied())
}

/// The next malformed frame `host` must send (to any receiver) in place of a request;
/// a JSON-shaped frame, for the EC control channel.
pub fn take_malformed(host: &str) -> Option<Vec<u8>> {
    HOST_FAULTS.with(|h| {
        let mut h = h.borrow_mut();
        let q = h.malformed.get_mut(host)?;
        let (_, g) = q.pop_front()?;
        Some(g.frame(false))
    })
}

/// The next malformed frame `host` must send to `to`, msgpack-shaped when `msgpack`.
pub fn take_malformed_to(host: &str, to: &str, msgpack: bool) -> Option<Vec<u8>> {
    HOST_FAULTS.with(|h| {
        let mut h = h.borrow_mut();
        let q = h.malformed.get_mut(host)?;
        let i = q.iter().position(|(t, _)| t == to)?;
        let (_, g) = q.remove(i)?;
        Some(g.frame(msgpack))
    })
}

/// How many requests naming unreachable peers `host`'s application received (a peer
/// flood), taken once.
pub fn take_flood(host: &str) -> Option<u32> {
    HOST_FAULTS.with(|h| h.borrow_mut().floods.remove(host))
}

/// The forged messages `host` must send now: `(to, claimed identity)` each, taken once.
pub fn take_forged(host: &str) -> Vec<(String, String)> {
    HOST_FAULTS.with(|h| h.borrow_mut().forged.remove(host).unwrap_or_default())
}

/// Whether `host`'s P2P handler fails on this role message from `peer` (one failure of a
/// handler-failures fault taken). With `spacing` k > 1 the handler takes k - 1 messages
/// between two failures, so they never come in a row.
pub fn take_handler_failure(host: &str, peer: &str, spacing: u32) -> bool {
    HOST_FAULTS.with(|h| {
        let mut h = h.borrow_mut();
        let key = (host.to_string(), peer.to_string());
        if !h.handler_failures.contains_key(&key) {
            return false;
        }
        if let Some(spared) = h.handler_spared.get_mut(&key).filter(|n| **n > 0) {
            *spared -= 1;
            return false;
        }
        let Some(left) = h.handler_failures.get_mut(&key) else { return false };
        *left -= 1;
        if *left == 0 {
            h.handler_failures.remove(&key);
            h.handler_spared.remove(&key);
        } else {
            h.handler_spared.insert(key, spacing.saturating_sub(1));
        }
        true
    })
}

/// The peers whose session `host`'s application closes now, and the peers it keeps
/// connected again now (a peer-close fault), each taken once.
pub fn take_closes(host: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    HOST_FAULTS.with(|h| {
        let mut h = h.borrow_mut();
        (h.closes.remove(host).unwrap_or_default(), h.reopens.remove(host).unwrap_or_default())
    })
}

/// Whether `host`'s P2P node shuts down now (a peer-exit fault, taken once).
pub fn take_exit(host: &str) -> bool {
    HOST_FAULTS.with(|h| h.borrow_mut().exits.remove(host))
}

/// Whether the load scheduler `host` begins now goes unreported (one of a lost-loads
/// fault's, taken).
pub fn take_lost_load(host: &str) -> bool {
    HOST_FAULTS.with(|h| take_one(&mut h.borrow_mut().loads_lost, host))
}

/// Whether `host`'s DEALER open now fails (one of an open-failures fault's, taken).
pub fn take_open_failure(host: &str) -> bool {
    HOST_FAULTS.with(|h| take_one(&mut h.borrow_mut().open_failures, host))
}

/// Takes one of `host`'s remaining failures in `left`, if any.
fn take_one(left: &mut BTreeMap<String, u32>, host: &str) -> bool {
    let Some(n) = left.get_mut(host).filter(|n| **n > 0) else { return false };
    *n -= 1;
    true
}

/// Whether scheduler `host`'s subscription now fails (one of a subscribe-failures
/// fault's, taken).
pub fn take_subscribe_failure(host: &str) -> bool {
    HOST_FAULTS.with(|h| take_one(&mut h.borrow_mut().subscribe_failures, host))
}

/// Whether `host` owes `peer` a message above the frame limit now (taken once).
pub fn take_oversize(host: &str, peer: &str) -> bool {
    HOST_FAULTS.with(|h| h.borrow_mut().oversize.get_mut(host).is_some_and(|to| to.remove(peer)))
}

/// Whether `host`'s next request to `to` fails to send (a replace race); if so, `to`
/// restarts at the driver's next step.
pub fn take_send_failure(host: &str, to: &str) -> bool {
    HOST_FAULTS.with(|h| {
        let mut h = h.borrow_mut();
        match h.send_failures.remove(&(host.to_string(), to.to_string())) {
            Some(index) => {
                h.bounces.push((index, to.to_string()));
                crate::clock::note_activity();
                true
            }
            None => false,
        }
    })
}

/// Until when `host`'s P2P application stops reading, if a stop-reading fault is on.
pub fn stopped_until(host: &str) -> Option<ctlplane_core::time::Instant> {
    HOST_FAULTS.with(|h| h.borrow().stopped.get(host).copied())
}

/// How many requests `from` must send to `to` in one go (`to` stopped reading), taken
/// once per sender.
pub fn take_burst(from: &str, to: &str) -> Option<u32> {
    HOST_FAULTS.with(|h| {
        let mut h = h.borrow_mut();
        let (n, done) = h.bursts.get_mut(to)?;
        done.insert(from.to_string()).then_some(*n)
    })
}

// ---------------------------------------------------------------------------------------
// Engine side: applying the plan to the turmoil world.

/// One step of a fault on the world.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Partition {
        a: String,
        b: String,
    },
    Repair {
        a: String,
        b: String,
    },
    OneWay {
        from: String,
        to: String,
    },
    RepairOneWay {
        from: String,
        to: String,
    },
    Hold {
        a: String,
        b: String,
    },
    Release {
        a: String,
        b: String,
    },
    Crash {
        host: String,
    },
    Restart {
        host: String,
    },
    /// A restart that is the fault itself (a reconnect race), not the end of a crash.
    Bounce {
        host: String,
    },
    SlowOn {
        host: String,
        delay: Duration,
    },
    SlowOff {
        host: String,
    },
    Malformed {
        from: String,
        to: String,
        count: u32,
        garbage: Garbage,
    },
    Flood {
        host: String,
        count: u32,
    },
    Forge {
        from: String,
        to: String,
        claims: String,
    },
    /// `host`'s P2P handler fails on the next `count` messages from `peer`.
    FailHandler {
        host: String,
        peer: String,
        count: u32,
    },
    /// `host`'s P2P node shuts down at its next turn and its process exits.
    Exit {
        host: String,
    },
    /// `host`'s P2P application closes its session with `peer`.
    ClosePeer {
        host: String,
        peer: String,
    },
    /// `host`'s P2P application keeps `peer` connected again.
    ReopenPeer {
        host: String,
        peer: String,
    },
    /// Scheduler `host`'s loads go unreported from now.
    LoadsOff {
        host: String,
        count: u32,
    },
    /// Scheduler `host`'s loads are reported again.
    LoadsOn {
        host: String,
    },
    /// `from` owes `to` a message above the frame limit.
    Oversize {
        from: String,
        to: String,
    },
    /// Scheduler `host`'s next `count` subscriptions fail.
    FailSubscribes {
        host: String,
        count: u32,
    },
    /// `host`'s next `count` DEALER opens fail.
    FailOpens {
        host: String,
        count: u32,
    },
    /// Arms a failed send from `from` to `to`; `to` restarts when it happens.
    ArmSendFailure {
        from: String,
        to: String,
    },
    /// `host`'s P2P application stops reading until `until`; the others owe it a burst.
    ReadOff {
        host: String,
        until: ctlplane_core::time::Instant,
        burst: u32,
    },
    /// `host` reads again.
    ReadOn {
        host: String,
    },
}

impl Step {
    /// Steps that undo a fault (run by [`FaultDriver::heal_all`] even when not yet due).
    fn is_heal(&self) -> bool {
        matches!(
            self,
            Step::Repair { .. }
                | Step::RepairOneWay { .. }
                | Step::Release { .. }
                | Step::Restart { .. }
                | Step::SlowOff { .. }
                | Step::LoadsOn { .. }
                | Step::ReopenPeer { .. }
                | Step::ReadOn { .. }
        )
    }
}

/// Applies a [`FaultPlan`] to a turmoil world as simulated time passes, and heals it.
pub struct FaultDriver {
    /// `(due ms, fault index, step)`, in order of due time.
    pending: VecDeque<(u64, usize, Step)>,
    /// Directions whose segments cannot arrive now, with how many faults block each.
    blocked: BTreeMap<(IpAddr, IpAddr), u32>,
    names: Vec<&'static str>,
    /// Faults whose first step ran: only their heals run in [`Self::heal_all`].
    started: BTreeSet<usize>,
}

impl FaultDriver {
    /// A driver for `plan`; clears the host-side fault table.
    pub fn new(plan: &FaultPlan) -> Self {
        reset();
        let mut steps: Vec<(u64, usize, usize, Step)> = Vec::new();
        let mut push = |t: u64, i: usize, s: Step| {
            let n = steps.len();
            steps.push((t, i, n, s));
        };
        for (i, f) in plan.faults.iter().enumerate() {
            let t = f.at_ms;
            match f.kind.clone() {
                FaultKind::Partition { a, b, for_ms } | FaultKind::LongPartition { a, b, for_ms } => {
                    push(t, i, Step::Partition { a: a.clone(), b: b.clone() });
                    push(t + for_ms, i, Step::Repair { a, b });
                }
                FaultKind::OneWay { from, to, for_ms } => {
                    push(t, i, Step::OneWay { from: from.clone(), to: to.clone() });
                    push(t + for_ms, i, Step::RepairOneWay { from, to });
                }
                FaultKind::Hold { a, b, for_ms } => {
                    push(t, i, Step::Hold { a: a.clone(), b: b.clone() });
                    push(t + for_ms, i, Step::Release { a, b });
                }
                FaultKind::Crash { host, down_ms } => {
                    push(t, i, Step::Crash { host: host.clone() });
                    push(t + down_ms, i, Step::Restart { host });
                }
                FaultKind::SlowHandler { host, delay_ms, for_ms } => {
                    push(t, i, Step::SlowOn { host: host.clone(), delay: Duration::from_millis(delay_ms) });
                    push(t + for_ms, i, Step::SlowOff { host });
                }
                FaultKind::Malformed { from, to, count, garbage } => {
                    push(t, i, Step::Malformed { from, to, count, garbage });
                }
                FaultKind::ReconnectRace { host, peer, partition_ms, gap_ms } => {
                    if partition_ms > 0 {
                        push(t, i, Step::Partition { a: host.clone(), b: peer.clone() });
                        push(t + partition_ms, i, Step::Repair { a: host.clone(), b: peer });
                    }
                    // A bounce: the old incarnation's tasks and sockets go, a new one starts.
                    push(t + partition_ms + gap_ms, i, Step::Bounce { host });
                }
                FaultKind::PeerFlood { host, count } => push(t, i, Step::Flood { host, count }),
                FaultKind::ForgedIdentity { from, to, claims } => push(t, i, Step::Forge { from, to, claims }),
                FaultKind::InboundFlood { from, to, count } => {
                    for n in 0..count {
                        let Some(port) = u16::try_from(n).ok().and_then(|n| n.checked_add(INBOUND_FLOOD_PORT)) else {
                            break;
                        };
                        let claims = format!("{from}:{port}");
                        let at = t + INBOUND_FLOOD_GAP_MS * u64::from(n);
                        push(at, i, Step::Forge { from: from.clone(), to: to.clone(), claims });
                    }
                }
                FaultKind::HandlerFailures { host, peer, count } => {
                    push(t, i, Step::FailHandler { host, peer, count });
                }
                FaultKind::Oversize { from, to } => push(t, i, Step::Oversize { from, to }),
                FaultKind::OpenFailures { host, count } => push(t, i, Step::FailOpens { host, count }),
                FaultKind::SubscribeFailures { host, count } => push(t, i, Step::FailSubscribes { host, count }),
                FaultKind::PeerExit { host, down_ms } => {
                    push(t, i, Step::Exit { host: host.clone() });
                    push(t + down_ms, i, Step::Restart { host });
                }
                FaultKind::PeerClose { host, peer, for_ms } => {
                    push(t, i, Step::ClosePeer { host: host.clone(), peer: peer.clone() });
                    push(t + for_ms, i, Step::ReopenPeer { host, peer });
                }
                FaultKind::LostLoads { host, for_ms, count } => {
                    push(t, i, Step::LoadsOff { host: host.clone(), count });
                    push(t + for_ms, i, Step::LoadsOn { host });
                }
                FaultKind::ReplaceRace { host, peer } => push(t, i, Step::ArmSendFailure { from: peer, to: host }),
                FaultKind::StopReading { host, for_ms, burst } => {
                    let until = ctlplane_core::time::Instant::from_nanos((t + for_ms) * 1_000_000);
                    push(t, i, Step::ReadOff { host: host.clone(), until, burst });
                    push(t + for_ms, i, Step::ReadOn { host });
                }
            }
        }
        // By time; at one instant heals before new faults, then plan order.
        steps.sort_by_key(|(t, i, n, s)| (*t, !s.is_heal(), *i, *n));
        let names = plan.faults.iter().map(|f| f.kind.name()).collect();
        FaultDriver {
            pending: steps.into_iter().map(|(t, i, _, s)| (t, i, s)).collect(),
            blocked: BTreeMap::new(),
            names,
            started: BTreeSet::new(),
        }
    }

    /// Simulated time of the next fault step, if any remain.
    pub fn next_due(&self) -> Option<Duration> {
        self.pending.front().map(|(t, _, _)| Duration::from_millis(*t))
    }

    /// Applies every step due at or before `now` (`Sim::elapsed`).
    pub fn step(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration) {
        let now_ms = now.as_millis() as u64;
        while self.pending.front().is_some_and(|(t, _, _)| *t <= now_ms) {
            if let Some((_, i, s)) = self.pending.pop_front() {
                self.apply(sim, now, i, s);
            }
        }
        for (i, host) in HOST_FAULTS.with(|h| std::mem::take(&mut h.borrow_mut().bounces)) {
            // A host that is down (another fault crashed it) has nothing to restart.
            if sim.is_host_running(host.as_str()) {
                self.apply(sim, now, i, Step::Bounce { host });
            }
        }
    }

    /// Ends every fault now: heal steps still pending run at once, faults not yet started
    /// are dropped, and unsent malformed frames and slow handlers are forgotten.
    pub fn heal_all(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration) {
        for (_, i, s) in std::mem::take(&mut self.pending) {
            if s.is_heal() && self.started.contains(&i) {
                self.apply(sim, now, i, s);
            }
        }
        HOST_FAULTS.with(|h| {
            let mut h = h.borrow_mut();
            h.malformed.clear();
            h.floods.clear();
            h.forged.clear();
            h.handler_failures.clear();
            h.handler_spared.clear();
            h.oversize.clear();
            h.open_failures.clear();
            h.loads_lost.clear();
            // A reopen the heal just queued stays: the peer is kept connected again.
            h.closes.clear();
            h.send_failures.clear();
            h.bounces.clear();
            h.stopped.clear();
            h.bursts.clear();
        });
        crate::trace::record_at(now.as_nanos() as u64, "engine", "fault.heal_all", &[]);
    }

    /// Whether segments from `a` to `b` cannot arrive now (partitioned or held), so the
    /// engine need not wait for the bytes in flight between them.
    pub fn is_partitioned(&self, a: IpAddr, b: IpAddr) -> bool {
        self.blocked.get(&(a, b)).is_some_and(|n| *n > 0)
    }

    fn block(&mut self, sim: &turmoil::Sim<'_>, from: &str, to: &str, on: bool) {
        let key = (sim.lookup(from), sim.lookup(to));
        let n = self.blocked.entry(key).or_insert(0);
        if on {
            *n += 1;
        } else {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.blocked.remove(&key);
            }
        }
    }

    fn apply(&mut self, sim: &mut turmoil::Sim<'_>, now: Duration, index: usize, s: Step) {
        self.started.insert(index);
        let t_ns = now.as_nanos() as u64;
        let kind = format!("fault.{}", self.names.get(index).copied().unwrap_or("unknown"));
        let rec = |action: &str, fields: &[(&str, &dyn std::fmt::Display)]| {
            let mut all: Vec<(&str, &dyn std::fmt::Display)> = vec![("fault", &index), ("action", &action)];
            all.extend_from_slice(fields);
            crate::trace::record_at(t_ns, "engine", &kind, &all);
        };
        match s {
            Step::Partition { a, b } => {
                sim.partition(a.as_str(), b.as_str());
                self.block(sim, &a, &b, true);
                self.block(sim, &b, &a, true);
                rec("partition", &[("a", &a), ("b", &b)]);
            }
            Step::Repair { a, b } => {
                sim.repair(a.as_str(), b.as_str());
                self.block(sim, &a, &b, false);
                self.block(sim, &b, &a, false);
                rec("repair", &[("a", &a), ("b", &b)]);
            }
            Step::OneWay { from, to } => {
                sim.partition_oneway(from.as_str(), to.as_str());
                self.block(sim, &from, &to, true);
                rec("partition_oneway", &[("from", &from), ("to", &to)]);
            }
            Step::RepairOneWay { from, to } => {
                sim.repair_oneway(from.as_str(), to.as_str());
                self.block(sim, &from, &to, false);
                rec("repair_oneway", &[("from", &from), ("to", &to)]);
            }
            Step::Hold { a, b } => {
                sim.hold(a.as_str(), b.as_str());
                self.block(sim, &a, &b, true);
                self.block(sim, &b, &a, true);
                rec("hold", &[("a", &a), ("b", &b)]);
            }
            Step::Release { a, b } => {
                sim.release(a.as_str(), b.as_str());
                self.block(sim, &a, &b, false);
                self.block(sim, &b, &a, false);
                rec("release", &[("a", &a), ("b", &b)]);
            }
            Step::Crash { host } => {
                sim.crash(host.as_str());
                rec("crash", &[("host", &host)]);
            }
            Step::Restart { host } => {
                // A shutdown the old incarnation never reached is not the new one's.
                HOST_FAULTS.with(|h| h.borrow_mut().exits.remove(&host));
                sim.bounce(host.as_str());
                rec("restart", &[("host", &host)]);
            }
            Step::Bounce { host } => {
                sim.bounce(host.as_str());
                rec("bounce", &[("host", &host)]);
            }
            Step::SlowOn { host, delay } => {
                HOST_FAULTS.with(|h| h.borrow_mut().delays.insert(host.clone(), delay));
                rec("slow_on", &[("host", &host), ("delay_ms", &delay.as_millis())]);
            }
            Step::SlowOff { host } => {
                HOST_FAULTS.with(|h| h.borrow_mut().delays.remove(&host));
                rec("slow_off", &[("host", &host)]);
            }
            Step::Exit { host } => {
                HOST_FAULTS.with(|h| h.borrow_mut().exits.insert(host.clone()));
                rec("exit", &[("host", &host)]);
            }
            Step::ClosePeer { host, peer } => {
                HOST_FAULTS.with(|h| h.borrow_mut().closes.entry(host.clone()).or_default().insert(peer.clone()));
                rec("close", &[("host", &host), ("peer", &peer)]);
            }
            Step::ReopenPeer { host, peer } => {
                HOST_FAULTS.with(|h| {
                    let mut h = h.borrow_mut();
                    if let Some(c) = h.closes.get_mut(&host) {
                        c.remove(&peer);
                    }
                    h.reopens.entry(host.clone()).or_default().insert(peer.clone());
                });
                rec("reopen", &[("host", &host), ("peer", &peer)]);
            }
            Step::LoadsOff { host, count } => {
                HOST_FAULTS.with(|h| h.borrow_mut().loads_lost.insert(host.clone(), count));
                rec("loads_off", &[("host", &host)]);
            }
            Step::LoadsOn { host } => {
                HOST_FAULTS.with(|h| h.borrow_mut().loads_lost.remove(&host));
                rec("loads_on", &[("host", &host)]);
            }
            Step::Malformed { from, to, count, garbage } => {
                HOST_FAULTS.with(|h| {
                    let mut h = h.borrow_mut();
                    let q = h.malformed.entry(from.clone()).or_default();
                    q.extend(std::iter::repeat_n((to.clone(), garbage), count as usize));
                });
                rec(
                    "arm",
                    &[("from", &from), ("to", &to), ("count", &count), ("garbage", &format_args!("{garbage:?}"))],
                );
            }
            Step::Flood { host, count } => {
                HOST_FAULTS.with(|h| *h.borrow_mut().floods.entry(host.clone()).or_default() += count);
                rec("flood", &[("host", &host), ("count", &count)]);
            }
            Step::Forge { from, to, claims } => {
                HOST_FAULTS.with(|h| {
                    h.borrow_mut().forged.entry(from.clone()).or_default().push((to.clone(), claims.clone()))
                });
                rec("forge", &[("from", &from), ("to", &to), ("claims", &claims)]);
            }
            Step::FailHandler { host, peer, count } => {
                HOST_FAULTS.with(|h| {
                    *h.borrow_mut().handler_failures.entry((host.clone(), peer.clone())).or_default() += count
                });
                rec("fail_handler", &[("host", &host), ("peer", &peer), ("count", &count)]);
            }
            Step::FailSubscribes { host, count } => {
                HOST_FAULTS.with(|h| *h.borrow_mut().subscribe_failures.entry(host.clone()).or_default() += count);
                rec("subscribe_failures", &[("host", &host), ("count", &count)]);
            }
            Step::FailOpens { host, count } => {
                HOST_FAULTS.with(|h| *h.borrow_mut().open_failures.entry(host.clone()).or_default() += count);
                rec("open_failures", &[("host", &host), ("count", &count)]);
            }
            Step::Oversize { from, to } => {
                HOST_FAULTS.with(|h| h.borrow_mut().oversize.entry(from.clone()).or_default().insert(to.clone()));
                rec("oversize", &[("from", &from), ("to", &to)]);
            }
            Step::ArmSendFailure { from, to } => {
                HOST_FAULTS.with(|h| h.borrow_mut().send_failures.insert((from.clone(), to.clone()), index));
                rec("arm_send_failure", &[("from", &from), ("to", &to)]);
            }
            Step::ReadOff { host, until, burst } => {
                HOST_FAULTS.with(|h| {
                    let mut h = h.borrow_mut();
                    h.stopped.insert(host.clone(), until);
                    h.bursts.insert(host.clone(), (burst, BTreeSet::new()));
                });
                rec("stop_reading", &[("host", &host), ("until", &until), ("burst", &burst)]);
            }
            Step::ReadOn { host } => {
                HOST_FAULTS.with(|h| {
                    let mut h = h.borrow_mut();
                    h.stopped.remove(&host);
                    h.bursts.remove(&host);
                });
                rec("read_again", &[("host", &host)]);
            }
        }
        crate::clock::note_activity();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draw_is_a_function_of_the_seed() {
        let topo = Topology::full();
        let h = Duration::from_secs(120);
        assert_eq!(FaultPlan::draw(7, &topo, h), FaultPlan::draw(7, &topo, h));
        let distinct: BTreeSet<String> = (0..20).map(|s| FaultPlan::draw(s, &topo, h).to_json()).collect();
        assert!(distinct.len() > 15, "seeds give different plans");
    }

    #[test]
    fn json_round_trips_and_validates() {
        let topo = Topology::full();
        for seed in 0..50 {
            let plan = FaultPlan::draw(seed, &topo, Duration::from_secs(120));
            let back = FaultPlan::from_json(&plan.to_json()).unwrap();
            assert_eq!(back, plan);
            plan.validate(&topo).unwrap();
            assert!(plan.end_ms() < 120_000);
        }
    }

    #[test]
    fn bad_plans_are_refused_with_a_reason() {
        let topo = Topology::small();
        let mut plan = FaultPlan::none(1);
        plan.faults.push(Fault { at_ms: 0, kind: FaultKind::Crash { host: "nobody".into(), down_ms: 5 } });
        assert!(matches!(plan.validate(&topo), Err(FaultError::UnknownHost { index: 0, .. })));
        plan.faults = vec![
            Fault { at_ms: 0, kind: FaultKind::Partition { a: "peer0".into(), b: "peer1".into(), for_ms: 100 } },
            Fault { at_ms: 50, kind: FaultKind::Hold { a: "peer1".into(), b: "peer0".into(), for_ms: 100 } },
        ];
        assert!(matches!(FaultPlan::from_json(&plan.to_json()), Err(FaultError::Overlap { index: 1, other: 0, .. })));
        assert!(matches!(FaultPlan::from_json("{\"seed\": 1"), Err(FaultError::Json(_))));
        plan.faults =
            vec![Fault { at_ms: 0, kind: FaultKind::Hold { a: "peer1".into(), b: "peer1".into(), for_ms: 1 } }];
        assert!(matches!(plan.validate(&topo), Err(FaultError::SameHost { .. })));
    }

    #[test]
    fn swarm_switches_kinds_off_and_thresholds_are_crossed() {
        let topo = Topology::full();
        let plans: Vec<FaultPlan> = (0..200).map(|s| FaultPlan::draw(s, &topo, Duration::from_secs(120))).collect();
        let kinds = |p: &FaultPlan| p.faults.iter().map(|f| f.kind.name()).collect::<BTreeSet<_>>();
        assert!(plans.iter().any(|p| !kinds(p).contains("partition") && kinds(p).contains("crash")));
        for p in &plans {
            for f in &p.faults {
                match &f.kind {
                    FaultKind::Partition { for_ms, .. } => assert!(*for_ms < ms(HEARTBEAT_TIMEOUT)),
                    FaultKind::LongPartition { for_ms, .. } => {
                        assert!(*for_ms > ms(HEARTBEAT_TIMEOUT + HEARTBEAT_IVL))
                    }
                    FaultKind::SlowHandler { delay_ms, .. } => assert!(*delay_ms > ms(CONTROL_TIMEOUT)),
                    _ => {}
                }
            }
        }
        let all: BTreeSet<&str> = plans.iter().flat_map(|p| p.faults.iter().map(|f| f.kind.name())).collect();
        assert_eq!(all.len(), 8, "every kind is drawn by some seed: {all:?}");
    }

    #[test]
    fn a_lost_scheduler_discovery_sometimes_starts_before_its_first_request() {
        let topo = Topology::full();
        let starts: Vec<u64> = (0..200)
            .flat_map(|s| FaultPlan::draw_swarmed(s, &topo, Duration::from_secs(120), Exposure::default()).faults)
            .filter_map(|f| match &f.kind {
                FaultKind::Partition { a, b, .. } if a.starts_with("scheduler") && b.ends_with("-r0") => Some(f.at_ms),
                _ => None,
            })
            .collect();
        assert!(starts.contains(&0), "the scheduler's first `peers` is lost: {starts:?}");
        assert!(starts.iter().any(|&t| t > 0), "{starts:?}");
    }

    #[test]
    fn host_table_plays_malformed_frames_by_target() {
        reset();
        HOST_FAULTS.with(|h| {
            h.borrow_mut()
                .malformed
                .entry("a".into())
                .or_default()
                .extend([("b".to_string(), Garbage::NotJson), ("c".to_string(), Garbage::WrongTypes)])
        });
        assert_eq!(take_malformed_to("a", "c", true), Some(Garbage::WrongTypes.frame(true)));
        assert_eq!(take_malformed_to("a", "c", true), None);
        assert_eq!(take_malformed("a"), Some(b"{not json".to_vec()));
        assert_eq!(take_malformed("a"), None);
        assert_eq!(handler_delay("a"), None);
    }

    #[test]
    fn host_table_counts_handler_failures_down_and_hands_out_closes_once() {
        reset();
        HOST_FAULTS.with(|h| {
            let mut h = h.borrow_mut();
            h.handler_failures.insert(("a".into(), "b".into()), 2);
            h.closes.entry("a".into()).or_default().insert("b".into());
            h.reopens.entry("a".into()).or_default().insert("c".into());
        });
        assert!(!take_handler_failure("a", "c", 1), "only the named peer's messages fail");
        assert!(take_handler_failure("a", "b", 1));
        assert!(take_handler_failure("a", "b", 1));
        assert!(!take_handler_failure("a", "b", 1), "two failures, then the handler works");
        HOST_FAULTS.with(|h| h.borrow_mut().handler_failures.insert(("a".into(), "b".into()), 2));
        let spaced: Vec<bool> = (0..5).map(|_| take_handler_failure("a", "b", 3)).collect();
        assert_eq!(spaced, [true, false, false, true, false], "two messages handled between the failures");
        let one = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<String>>();
        assert_eq!(take_closes("a"), (one(&["b"]), one(&["c"])));
        assert_eq!(take_closes("a"), (BTreeSet::new(), BTreeSet::new()));
    }
}
