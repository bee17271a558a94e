//! One simulated P2P peer: the driver of the core's [`PeerManager`] (as `zmq-backend`'s
//! manager loop drives it over libzmq) over the simulator's ZeroMQ model.
//!
//! Every decision is the core's: the manager's registry decides who is registered, swept
//! and accepted, its sessions the handshake and what to send, the manager itself the tick
//! order, admission, reaping and reconnects. The peer gathers what its sockets hold,
//! carries out the manager's actions, reports the ones that failed, injects faults, and
//! plays a small application on top: seeded lookups and fetches to every
//! other peer, answered with lookup responses and transfer completions, so that a pair
//! that stops talking is noticed.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use ctlplane_core::p2p::defaults::{HANDSHAKE_TIMEOUT, HEARTBEAT_IVL, HEARTBEAT_TIMEOUT, HEARTBEAT_TTL};
use ctlplane_core::p2p::manager::{Backoff, ManagerConfig, ManagerRegressions, PeerEvent, PeerManager, SessionId};
use ctlplane_core::p2p::messages::{Message, Parsed};
use ctlplane_core::p2p::options::{SendMode, DEALER_LINGER, DEALER_SNDHWM, MONITOR_EVENT_MASK, ROUTER_LINGER};
use ctlplane_core::p2p::registry::{ConnectionRegistry, Direction, RegistryStats};
use ctlplane_core::p2p::session::{SessionConfig, MAX_CONSECUTIVE_DISPATCH_ERRORS};
use ctlplane_core::p2p::{value, Action, ConnId, MonitorEvent, PollInput, RegistryConfig, T0Switches, TransportError};
use ctlplane_core::time::Instant;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::ledger;
use crate::clock;
use crate::faults::{self, POLL_INTERVAL};
use crate::oracle;
use crate::trace;
use crate::zmq::{monitor, Context, Socket, SocketOptions, SocketType, ZmqError};

/// `VLLM_P2P_SIDE_CHANNEL_PORT`: every peer's ROUTER port.
pub const PORT: u16 = 5710;
/// Requests a session may have unanswered before the peer stops sending it more.
const MAX_OUTSTANDING: usize = 32;
/// libzmq's default `ZMQ_MAX_SOCKETS` per context: creating one more socket fails with
/// EMFILE (p2p-behaviour.md S10, GHSA-frvg-qw88-hww9).
pub const MAX_SOCKETS: usize = 1023;
/// Sockets one connection holds: its DEALER, the monitor PAIR reading it and libzmq's
/// own PAIR publishing the monitor events.
const SOCKETS_PER_CONNECTION: usize = 3;
/// Bytes per key of an oversize lookup: long keys keep the key count of a message past
/// even the 64 MiB limit in the thousands.
const OVERSIZE_KEY_BYTES: usize = 4096;
/// First port of the unreachable peers a peer flood names (nothing listens there).
const FLOOD_PORT: u16 = PORT + 1;
/// `p2p-progress`: the longest a manager tick may take. Nothing in a tick waits (every
/// send is non-blocking), so a longer one blocked, and every session of the peer waited.
pub const MAX_TICK: Duration = Duration::from_secs(1);

/// Settings of every peer of a run beyond the T0 switches: the scenario's knobs and the
/// manager's regression switch.
#[derive(Clone, Copy, Debug, Default)]
pub struct PeerSettings {
    /// Sessions without the W1+ handshake deadline.
    pub no_handshake_deadline: bool,
    /// `RegistryConfig::max_peers`.
    pub max_peers: Option<usize>,
    /// Reconnect within the tick that reaped the session.
    pub immediate_reconnect: bool,
    /// `ManagerConfig::backoff`; `None` keeps the manager's default.
    pub backoff: Option<Backoff>,
    /// Every k-th message fails under a handler-failures fault; `None`: in a row.
    pub handler_spacing: Option<u32>,
    /// `RegistryConfig::max_message_bytes` and every socket's `maxmsgsize` (the T2
    /// lineage's frame limit, `TransportOptions::with_t2_frame_limit`); `None`: no limit.
    pub max_message_bytes: Option<usize>,
    /// `ManagerConfig::regressions`.
    pub manager: ManagerRegressions,
    /// `SessionConfig::config_fingerprint` every peer announces (`None`: the empty
    /// wildcard, production's default).
    pub config_fingerprint: Option<u64>,
    /// The index, in the world's peers, of the one that announces the empty wildcard
    /// whatever `config_fingerprint` says (`Knobs::p2p_wildcard_peer`).
    pub wildcard_peer: Option<usize>,
    /// The application sends no requests of its own, only answers (a scripted world,
    /// such as the driver-conformance test, decides every message).
    pub quiet: bool,
}

/// What a peer host is started with (kept across restarts).
#[derive(Clone, Debug)]
pub struct PeerConfig {
    /// turmoil host name.
    pub name: String,
    /// Every P2P peer's host name, this one included.
    pub peers: Vec<String>,
    pub seed: u64,
    /// Historical transport behaviours (race catalogue); off by default.
    pub t0: T0Switches,
    pub settings: PeerSettings,
}

/// The peer id of host `name`: `"{host}:{port}"`, dialled back verbatim.
pub fn peer_id(name: &str) -> String {
    format!("{name}:{PORT}")
}

fn host_of(peer: &str) -> &str {
    peer.rsplit_once(':').map_or(peer, |(h, _)| h)
}

/// FNV-1a of a host name: part of its RNG seed, so every peer has its own stream.
fn name_hash(name: &str) -> u64 {
    name.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// The ROUTER's options (`identity` `None`) or a DEALER's, with the core's high-water mark
/// and linger.
fn options(identity: Option<&str>, maxmsgsize: Option<usize>) -> SocketOptions {
    let linger = if identity.is_some() { DEALER_LINGER } else { ROUTER_LINGER };
    SocketOptions {
        heartbeat_ivl: Some(HEARTBEAT_IVL),
        heartbeat_timeout: Some(HEARTBEAT_TIMEOUT),
        heartbeat_ttl: Some(HEARTBEAT_TTL),
        routing_id: identity.map(|i| i.as_bytes().to_vec()),
        sndhwm: usize::try_from(DEALER_SNDHWM).unwrap_or(1000),
        linger,
        maxmsgsize,
        ..SocketOptions::default()
    }
}

/// One peer's DEALER and the PAIR reading its monitor.
struct Dealer {
    peer: String,
    dealer: Socket,
    pair: Socket,
}

/// The application's requests to one session still unanswered, by `kv_request_id`.
struct Outstanding {
    session: SessionId,
    requests: BTreeSet<String>,
}

struct Peer {
    name: String,
    inc: u32,
    ctx: Context,
    router: Socket,
    /// Every decision: registry, sessions, admission, reaping, reconnects.
    manager: PeerManager<ChaCha8Rng>,
    dealers: BTreeMap<ConnId, Dealer>,
    /// By peer id.
    outstanding: BTreeMap<String, Outstanding>,
    /// Sessions with a handshake deadline, by id: the peer and the latest the deadline can
    /// fall (`p2p-wake`).
    handshake_due: BTreeMap<SessionId, (String, Instant)>,
    /// The application's traffic stream.
    rng: ChaCha8Rng,
    next_request: u64,
    next_traffic: Instant,
    /// The topology's peers (a flood's unreachable peers are not reconnected).
    known: BTreeSet<String>,
    /// DEALERs a forged-identity fault opened from this host (kept open, as an attacker's).
    forged: Vec<Socket>,
    /// [`PeerSettings::max_message_bytes`], for the DEALERs it opens.
    max_message_bytes: Option<usize>,
    /// An error escaped into the engine loop: the mainline manager has no error boundary
    /// around the transport (the one of PR #51504 comes with `max_peers`), so EngineCore dies.
    fatal: Option<String>,
    /// [`PeerSettings::quiet`].
    quiet: bool,
    /// Per peer: the session its handler last failed on and the failures in a row there,
    /// counted only while the session is ready (a connect or ack resets the core's count
    /// before that).
    handler_failures: BTreeMap<String, (SessionId, u32)>,
    /// Peers whose DEALER could not be opened in the current poll: the connection is
    /// retired with the messages it carried (nothing could answer them), which the
    /// message-lost check excuses.
    open_failed: BTreeSet<String>,
    /// The current poll's ROUTER identities, each with the host its connection came from:
    /// an inbound peer id on that very host (another process there) may be dialled back.
    sources: BTreeMap<String, String>,
    /// What this host's sessions announce ([`session_config`]'s input).
    settings: PeerSettings,
    /// DEALER opens and closes the manager asked for: its registry's counters must agree.
    dealer_actions: (u64, u64),
    /// Sends a DEALER refused for a full queue, which the registry must count alike
    /// (`p2p-message-accounting`).
    refused_full: u64,
    /// Connections whose DEALER the registry closed: it may send on none of them again
    /// (`p2p-send-on-closed`).
    closed_conns: BTreeSet<ConnId>,
    /// While the node shuts down: the connections a Disconnect was handed to (`p2p-exit`).
    disconnects: Option<BTreeSet<ConnId>>,
}

/// The registry's count of ROUTER messages it has dealt with: routed, refused or dropped.
fn accounted(stats: RegistryStats) -> u64 {
    stats.messages_routed.wrapping_add(stats.messages_refused).wrapping_add(stats.frames_dropped)
}

/// The manager's configuration for host `name`: production's manager with the run's
/// switches and knobs.
fn manager_config(cfg: &PeerConfig, name: &str, inc: u32) -> ManagerConfig {
    let mut registry = RegistryConfig::new(peer_id(name));
    registry.t0 = cfg.t0;
    registry.max_peers = cfg.settings.max_peers;
    registry.max_message_bytes = cfg.settings.max_message_bytes;
    let session = session_config(name, inc, &cfg.settings);
    ManagerConfig {
        regressions: cfg.settings.manager,
        immediate_reconnect: cfg.settings.immediate_reconnect,
        backoff: cfg.settings.backoff.unwrap_or_default(),
        first_session: u64::from(inc) << 32,
        ..ManagerConfig::new(registry, session)
    }
}

/// What the sessions of host `name`'s incarnation `inc` announce (`local_id` is the
/// registry's); with the W1+ handshake deadline unless the settings turn it off.
pub fn session_config(name: &str, inc: u32, settings: &PeerSettings) -> SessionConfig {
    let deadline = !settings.no_handshake_deadline;
    SessionConfig {
        local_id: String::new(),
        agent_metadata: format!("agent-{name}-{inc}").into_bytes(),
        base_addr: 0x1000_0000,
        num_blocks: 1024,
        block_len: 4096,
        config_fingerprint: settings.config_fingerprint.map(|f| format!("{f:016x}")).unwrap_or_default(),
        hash_seed: "0".into(),
        // W1+: a session whose Connect went unanswered dies after 30 s instead of
        // stalling forever (race S5), so the pair reconnects. Mainline W1 has none.
        handshake_timeout: deadline.then_some(HANDSHAKE_TIMEOUT),
        silent_connect_rejection: false,
    }
}

/// The application's answer to a role message: lookups hit the keys whose first byte is
/// even, fetches succeed, aborts are acknowledged; responses need none.
pub fn answer(message: &Message) -> Option<Message> {
    match message {
        Message::Lookup { kv_request_id, keys, .. } => {
            let hits = keys.iter().map(|k| k.first().is_some_and(|b| b % 2 == 0)).collect();
            Some(Message::LookupResp { kv_request_id: kv_request_id.clone(), keys: keys.clone(), hits })
        }
        Message::Fetch { kv_request_id, round_seq, .. } => {
            Some(Message::TransferDone { kv_request_id: kv_request_id.clone(), success: true, round_seq: *round_seq })
        }
        Message::AbortFetch { kv_request_id, round_seq } => {
            Some(Message::AbortAck { kv_request_id: kv_request_id.clone(), round_seq: *round_seq })
        }
        _ => None,
    }
}

/// The host program: binds, connects to every other peer, then ticks until the host is
/// crashed or the run ends.
pub async fn run(cfg: Rc<PeerConfig>) -> turmoil::Result {
    let name = cfg.name.clone();
    let inc = ledger::start(&name);
    let ctx = Context::new(&name);
    let router = Socket::new(&ctx, SocketType::Router, options(None, cfg.settings.max_message_bytes));
    router.bind(&format!("tcp://{name}:{PORT}")).await.map_err(|e| format!("{name}: cannot bind ROUTER: {e}"))?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ name_hash(&name));
    rng.set_stream(u64::from(inc));
    // The manager's backoffs draw from their own stream of the same seed.
    let mut manager_rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ name_hash(&name));
    manager_rng.set_stream(u64::from(inc) | (1 << 63));
    let now = clock::now();
    let mut manager = PeerManager::new(manager_config(&cfg, &name, inc), manager_rng);
    let known: BTreeSet<String> = cfg.peers.iter().filter(|p| **p != name).map(|p| peer_id(p)).collect();
    for p in &known {
        manager.keep_connected(p, now);
    }
    let mut peer = Peer {
        name: name.clone(),
        inc,
        ctx,
        router,
        manager,
        dealers: BTreeMap::new(),
        outstanding: BTreeMap::new(),
        handshake_due: BTreeMap::new(),
        next_request: 0,
        next_traffic: now + Duration::from_millis(rng.gen_range(100..600)),
        rng,
        known,
        forged: Vec::new(),
        max_message_bytes: cfg.settings.max_message_bytes,
        fatal: None,
        quiet: cfg.settings.quiet,
        handler_failures: BTreeMap::new(),
        open_failed: BTreeSet::new(),
        sources: BTreeMap::new(),
        dealer_actions: (0, 0),
        refused_full: 0,
        closed_conns: BTreeSet::new(),
        disconnects: None,
        settings: cfg.settings,
    };
    trace::record(&name, "p2p.start", &[("incarnation", &inc)]);
    loop {
        if let Some(until) = faults::stopped_until(&name) {
            // The application stops reading; the sockets' I/O (heartbeats) goes on.
            trace::record(&name, "p2p.stop_reading", &[("until", &until)]);
            clock::sleep_until(until).await;
        }
        if faults::take_exit(&name) {
            peer.exit().await;
            break;
        }
        let started = clock::now();
        peer.tick().await;
        let took = clock::now().saturating_duration_since(started);
        if took > MAX_TICK {
            let starved = peer.manager.session_peers().join(", ");
            oracle::violate(
                "p2p-progress",
                &name,
                format!("one manager tick took {took:?}: sessions with {starved} made no progress"),
            );
        }
        if peer.fatal.is_some() {
            break;
        }
        // As the node loop's turn: the engine step, or sooner when the manager has a
        // reconnect or a handshake deadline due.
        let step = clock::now() + POLL_INTERVAL;
        let wake = peer.manager.poll_timeout().map_or(step, |due| due.min(step));
        peer.check_wake(wake);
        tokio::select! {
            biased;
            _ = peer.router.readable() => {}
            _ = clock::sleep_until(wake) => {}
        }
    }
    // EngineCore died, or the node shut down: the process's sockets go with it and
    // nothing answers any more.
    if let Some(error) = &peer.fatal {
        trace::record(&name, "p2p.engine_crash", &[("error", error)]);
    }
    for p in peer.manager.session_peers() {
        if let Some(host) = peer.pair_of(&p) {
            ledger::gone(&name, host);
        }
    }
    drop(peer);
    std::future::pending().await
}

impl Peer {
    /// The world peer host a session with `peer` stands for in the ledger's pairs: none
    /// for another id on that host (a flood's), whose sessions are not the pair's.
    fn pair_of<'p>(&self, peer: &'p str) -> Option<&'p str> {
        self.known.contains(peer).then(|| host_of(peer))
    }

    /// One manager tick: the sockets' poll, the manager's tick, then the application and
    /// the faults.
    async fn tick(&mut self) {
        let now = clock::now();
        self.poll_transport().await;
        self.manager.handle_tick(now);
        self.settle().await;
        if let Some(n) = faults::take_flood(&self.name) {
            self.flood(n, now).await;
        }
        for (to, claims) in faults::take_forged(&self.name) {
            self.forge(&to, &claims).await;
        }
        let (closes, reopens) = faults::take_closes(&self.name);
        for host in closes {
            self.close_session(&peer_id(&host)).await;
        }
        for host in reopens {
            trace::record(&self.name, "p2p.reopen", &[("peer", &host)]);
            self.manager.keep_connected(&peer_id(&host), now);
        }
        if self.fatal.is_some() {
            return;
        }
        if now >= self.next_traffic && !self.quiet {
            self.traffic().await;
            self.next_traffic = now + Duration::from_millis(self.rng.gen_range(200..800));
        }
        let conns: BTreeSet<ConnId> = self.manager.registry().iter_connections().map(|(_, c, _)| c).collect();
        ledger::registered(&self.name, self.inc, &conns);
    }

    /// Gathers the ROUTER's messages and each live connection's monitor events (up to its
    /// first fatal one), hands them to the manager and carries out its actions.
    async fn poll_transport(&mut self) {
        let registry = self.manager.registry();
        let before: BTreeMap<String, (ConnId, bool)> =
            registry.iter_connections().map(|(p, c, a)| (p.to_string(), (c, a))).collect();
        let mut input = PollInput::default();
        self.sources.clear();
        loop {
            match self.router.try_recv_with_peer() {
                Ok((frames, source)) => {
                    // Peer ids here are host names, so the source is reported by the name
                    // of the host that has the address.
                    let source = source.and_then(turmoil::reverse_lookup);
                    if let (Some(id), Some(host)) = (frames.first().and_then(|f| std::str::from_utf8(f).ok()), &source)
                    {
                        self.sources.insert(id.to_string(), host.clone());
                    }
                    input.router.push(frames);
                    input.sources.push(source);
                }
                Err(ZmqError::Again) => break,
                Err(e) => {
                    trace::record(&self.name, "p2p.router_error", &[("error", &e)]);
                    break;
                }
            }
        }
        // Live connections handed an event that ends a connection: dead after the poll.
        let mut ended: Vec<(String, ConnId, u16)> = Vec::new();
        for (_, conn, alive) in registry.iter_connections() {
            let Some(d) = self.dealers.get(&conn).filter(|_| alive) else { continue };
            while let Ok(msg) = d.pair.try_recv() {
                let Some((event, _, _)) = monitor::decode(&msg) else { continue };
                let ev = MonitorEvent::from_code(event);
                trace::record(&self.name, "p2p.monitor", &[("peer", &d.peer), ("conn", &conn), ("event", &event)]);
                input.monitor.push((conn, ev));
                if monitor_ends_connection(event) {
                    ended.push((d.peer.clone(), conn, event));
                }
                if ev.is_fatal() {
                    break;
                }
            }
        }
        // Messages from a peer whose registration here is dead: a reconnecting peer. They
        // must reach a fresh connection, not go down with the dead one (race S2).
        let mut reconnecting: BTreeMap<String, (ConnId, usize)> = BTreeMap::new();
        for frames in &input.router {
            let [identity, payload] = frames.as_slice() else { continue };
            let Ok(id) = std::str::from_utf8(identity) else { continue };
            if let Some(&(conn, false)) = before.get(id) {
                if value::decode(payload).is_ok() {
                    reconnecting.entry(id.to_string()).or_insert((conn, 0)).1 += 1;
                }
            }
        }
        let before = registry.stats();
        let handed = input.router.len() as u64;
        // What the registry may drop: a message that is not two frames, names no UTF-8
        // identity, is larger than the frame limit or is not one msgpack value. Judged where
        // nothing else drops (a `max_peers` bound drops the messages of peers it refuses).
        let malformed = self
            .max_message_bytes
            .filter(|_| self.settings.max_peers.is_none())
            .map(|limit| input.router.iter().filter(|frames| malformed(frames, limit)).count() as u64);
        self.manager.handle_sockets(input);
        let stats = self.manager.registry().stats();
        let dropped = stats.frames_dropped - before.frames_dropped;
        if let Some(malformed) = malformed.filter(|m| dropped > *m) {
            oracle::violate(
                "p2p-message-accounting",
                &self.name,
                format!("{dropped} ROUTER message(s) dropped, of which only {malformed} malformed"),
            );
        }
        // Every ROUTER message handed in is routed to a connection, refused by the peer
        // check or dropped, exactly once.
        let accounted_now = accounted(stats).wrapping_sub(accounted(before));
        if accounted_now != handed {
            oracle::violate(
                "p2p-message-accounting",
                &self.name,
                format!("{handed} ROUTER message(s) handed in, {accounted_now} routed, refused or dropped"),
            );
        }
        // Dead and retired: the poll sweeps again after its monitor step (docs/p2p-behaviour.md
        // §1.9, step 4), so a connection the monitor ended is not registered when it returns.
        for (peer, conn, event) in ended {
            let registered = self.manager.registry().iter_connections().find(|(_, c, _)| *c == conn);
            if let Some((_, _, alive)) = registered {
                let how = if alive { "alive" } else { "dead but still registered" };
                oracle::violate(
                    "p2p-monitor-fatal",
                    &self.name,
                    format!("connection {conn} to {peer} is {how} after its monitor reported event {event:#06x}"),
                );
            }
        }
        let refused = stats.messages_refused - before.messages_refused;
        if refused > 0 {
            trace::record(&self.name, "p2p.refused", &[("messages", &refused)]);
        }
        self.open_failed.clear();
        self.carry_out().await;
        let registry = self.manager.registry();
        for (id, (old, n)) in reconnecting {
            let fresh = registry.conn_id(&id).is_some_and(|c| c != old) && registry.is_alive(&id);
            if !fresh && !self.open_failed.contains(&id) {
                oracle::violate(
                    "p2p-message-lost",
                    &self.name,
                    format!("{n} message(s) from reconnecting peer {id} were dropped with its dead connection {old}"),
                );
            }
        }
    }

    /// Traces what the manager reports, keeps the ledger, and plays the application;
    /// returns how many events there were.
    fn drain_events(&mut self) -> usize {
        let mut n = 0;
        while let Some(event) = self.manager.poll_event() {
            n += 1;
            match event {
                PeerEvent::Connecting { peer, conn, session } => {
                    trace::record(&self.name, "p2p.connect", &[("peer", &peer), ("conn", &conn)]);
                    self.new_session(&peer, conn, session);
                }
                PeerEvent::Accepted { peer, conn, session } => {
                    trace::record(&self.name, "p2p.accept", &[("peer", &peer), ("conn", &conn)]);
                    self.new_session(&peer, conn, session);
                }
                PeerEvent::ConnectRefused { peer, error } => {
                    trace::record(&self.name, "p2p.connect_refused", &[("peer", &peer), ("error", &error)]);
                }
                PeerEvent::DuplicateRefused { peer, holder } => {
                    // The newcomer was closed ("duplicate connection"), its first message with it.
                    oracle::violate(
                        "p2p-message-lost",
                        &self.name,
                        format!("inbound connection from {peer} refused: session {holder} still holds the peer"),
                    );
                }
                PeerEvent::Reaped { peer, session } => {
                    trace::record(&self.name, "p2p.reap", &[("peer", &peer), ("session", &session)]);
                    if self.outstanding.get(&peer).is_some_and(|o| o.session == session) {
                        self.outstanding.remove(&peer);
                    }
                }
                PeerEvent::PeerConnected { peer, session, connect } => {
                    trace::record(
                        &self.name,
                        "p2p.peer_connected",
                        &[("peer", &connect.peer_id), ("session", &session)],
                    );
                    if connect.peer_id != peer {
                        // The data plane registers the peer's blocks under the id its
                        // Connect announces (p2p-behaviour.md §2.3): another name than the
                        // session's loses them.
                        oracle::violate(
                            "p2p-announced-id",
                            &self.name,
                            format!("session {session} with {peer} announced itself as {:?}", connect.peer_id),
                        );
                    }
                }
                PeerEvent::Ready { peer, session } => {
                    trace::record(&self.name, "p2p.ready", &[("peer", &peer), ("session", &session)]);
                    if let Some(host) = self.pair_of(&peer) {
                        ledger::ready(&self.name, host);
                    }
                }
                PeerEvent::Message { peer, session, message } => self.on_message(&peer, session, message),
                PeerEvent::Down { peer, session, reason } => {
                    trace::record(
                        &self.name,
                        "p2p.dead",
                        &[("peer", &peer), ("session", &session), ("reason", &reason)],
                    );
                    if let Some(host) = self.pair_of(&peer) {
                        ledger::gone(&self.name, host);
                    }
                }
                PeerEvent::SendFailed { peer, error } => {
                    trace::record(&self.name, "p2p.send_failed", &[("peer", &peer), ("error", &error)]);
                }
                PeerEvent::OpenFailed { peer, conn, error } => {
                    trace::record(
                        &self.name,
                        "p2p.dealer_open_failed",
                        &[("peer", &peer), ("conn", &conn), ("error", &error)],
                    );
                }
                PeerEvent::Fatal(error) => {
                    self.fatal.get_or_insert(error);
                }
            }
        }
        n
    }

    fn new_session(&mut self, peer: &str, conn: ConnId, session: SessionId) {
        trace::record(&self.name, "p2p.session", &[("peer", &peer), ("conn", &conn), ("session", &session)]);
        if !self.settings.no_handshake_deadline {
            // Attached at the tick's time, at most now: its deadline falls by now + the limit
            // (the slack covers the deadline's own nanosecond).
            let latest = clock::now() + HANDSHAKE_TIMEOUT + Duration::from_millis(1);
            self.handshake_due.insert(session, (peer.to_string(), latest));
        }
        self.outstanding.insert(peer.to_string(), Outstanding { session, requests: BTreeSet::new() });
    }

    /// `p2p-wake`: the loop's next wake, from the manager's `poll_timeout`, comes no later
    /// than the handshake deadline of any session still waiting for its handshake
    /// (p2p-behaviour.md §2.3 and §3.4: the loop wakes at the manager's `poll_timeout`,
    /// so the deadline falls on time with no message arriving). A later wake lets a
    /// silent session outlive its deadline.
    fn check_wake(&mut self, wake: Instant) {
        let manager = &self.manager;
        self.handshake_due.retain(|session, (peer, _)| {
            manager.session_id(peer) == Some(*session) && manager.is_alive(peer) && !manager.is_ready(peer)
        });
        let Some((session, (peer, due))) = self.handshake_due.iter().min_by_key(|(_, (_, due))| *due) else { return };
        if wake > *due {
            oracle::violate(
                "p2p-wake",
                &self.name,
                format!("the manager next wakes at {wake}, after the handshake deadline {due} of session {session} with {peer}"),
            );
        }
    }

    /// The application: answer requests, match responses.
    fn on_message(&mut self, peer: &str, session: SessionId, m: Message) {
        let spacing = self.settings.handler_spacing.unwrap_or(1);
        if faults::take_handler_failure(&self.name, host_of(peer), spacing) {
            self.handler_failed(peer, session, &m);
            return;
        }
        self.handler_failures.remove(peer);
        let reply = answer(&m);
        if let Message::LookupResp { kv_request_id, .. } | Message::TransferDone { kv_request_id, .. } = m {
            let asked = self
                .outstanding
                .get_mut(peer)
                .filter(|o| o.session == session)
                .is_some_and(|o| o.requests.remove(&kv_request_id));
            if asked {
                trace::record(&self.name, "p2p.response", &[("peer", &peer), ("kv", &kv_request_id)]);
                if let Some(host) = self.pair_of(peer).filter(|_| self.manager.is_ready(peer)) {
                    ledger::responded(&self.name, host);
                }
            } else {
                trace::record(&self.name, "p2p.unmatched_response", &[("peer", &peer), ("kv", &kv_request_id)]);
            }
        }
        self.manager.dispatch_ok(peer, session);
        if let Some(r) = reply {
            // A session that died on an earlier message of this batch refuses: nothing to do.
            let _ = self.manager.send_on(peer, session, r);
        }
    }

    /// A handler-failures fault: the handler raised on `m`. `p2p-dispatch-errors`: the
    /// session is dead once it failed [`MAX_CONSECUTIVE_DISPATCH_ERRORS`] times in a row
    /// while ready, and not before (a handled message between failures starts the count
    /// again).
    fn handler_failed(&mut self, peer: &str, session: SessionId, m: &Message) {
        trace::record(&self.name, "p2p.handler_failed", &[("peer", &peer), ("type", &m.kind())]);
        let ready = self.manager.is_ready(peer) && self.manager.session_id(peer) == Some(session);
        let alive = |p: &Self| p.manager.session_id(peer) == Some(session) && p.manager.is_alive(peer);
        let alive_before = alive(self);
        self.manager.dispatch_failed(peer, session, "handler failed (fault)");
        if !ready {
            self.handler_failures.remove(peer);
            return;
        }
        let failures = match self.handler_failures.get(peer) {
            Some(&(s, n)) if s == session => n + 1,
            _ => 1,
        };
        self.handler_failures.insert(peer.to_string(), (session, failures));
        if failures < MAX_CONSECUTIVE_DISPATCH_ERRORS && alive_before && !alive(self) {
            oracle::violate(
                "p2p-dispatch-errors",
                &self.name,
                format!("session {session} with {peer} died of {failures} handler failure(s) in a row"),
            );
        }
        let current = self.manager.session_id(peer) == Some(session);
        if failures >= MAX_CONSECUTIVE_DISPATCH_ERRORS && current && self.manager.is_alive(peer) {
            oracle::violate(
                "p2p-dispatch-errors",
                &self.name,
                format!("session {session} with {peer} is alive after {failures} handler failures in a row"),
            );
        }
    }

    /// `p2p-send-failed`: a connection a send failed on is dead when
    /// `handle_send_failed` returns, and so is the session on it (p2p-behaviour.md §2.8,
    /// §2.9: a send failure marks the connection dead; the peer is dead).
    fn check_send_failed(&self, peer: &str, conn: ConnId) {
        let session_alive = self.manager.session_conn(peer) == Some(conn) && self.manager.is_alive(peer);
        if session_alive || registry_holds_live(self.manager.registry(), conn) {
            oracle::violate(
                "p2p-send-failed",
                &self.name,
                format!(
                    "a send on connection {conn} to {peer} failed; afterwards the {} still alive",
                    if session_alive { "session on it is" } else { "connection is" }
                ),
            );
        }
    }

    /// A peer-close fault: the application closes its session with `peer`. `p2p-closed`:
    /// the session is dead once `close` returns (its Disconnect queued first).
    async fn close_session(&mut self, peer: &str) {
        let session = self.manager.session_id(peer);
        trace::record(&self.name, "p2p.close", &[("peer", &peer), ("session", &format_args!("{session:?}"))]);
        self.manager.close(peer);
        self.settle().await;
        let Some(session) = session else { return };
        if self.manager.session_id(peer) == Some(session) && self.manager.is_alive(peer) {
            oracle::violate(
                "p2p-closed",
                &self.name,
                format!("session {session} with {peer} is still alive after the application closed it"),
            );
        }
    }

    /// A peer-exit fault: the node shuts down as the node loop's `close` does. `p2p-exit`:
    /// once `close_all` is carried out no session is alive, nothing is registered, every
    /// DEALER is closed, and each session that had completed its handshake handed its
    /// connection a Disconnect first.
    async fn exit(&mut self) {
        let ready: Vec<(String, Option<ConnId>)> = self
            .manager
            .session_peers()
            .into_iter()
            .filter(|p| self.manager.is_ready(p) && self.manager.is_alive(p))
            .map(|p| {
                let conn = self.manager.session_conn(&p);
                (p, conn)
            })
            .collect();
        trace::record(&self.name, "p2p.exit", &[("ready", &ready.len())]);
        self.disconnects = Some(BTreeSet::new());
        self.manager.close_all();
        self.settle().await;
        let mut wrong = Vec::new();
        if let Some(alive) = self.manager.session_peers().into_iter().find(|p| self.manager.is_alive(p)) {
            wrong.push(format!("the session with {alive} is still alive"));
        }
        if let Some((peer, conn, _)) = self.manager.registry().iter_connections().next() {
            wrong.push(format!("connection {conn} to {peer} is still registered"));
        }
        if let Some((conn, d)) = self.dealers.iter().next() {
            wrong.push(format!("the DEALER of connection {conn} to {} is still open", d.peer));
        }
        for (peer, conn) in &ready {
            if !conn.is_some_and(|c| self.disconnects.as_ref().is_some_and(|d| d.contains(&c))) {
                wrong.push(format!("the ready session with {peer} sent no Disconnect"));
            }
        }
        if !wrong.is_empty() {
            oracle::violate("p2p-exit", &self.name, format!("after the node shut down: {}", wrong.join("; ")));
        }
    }

    /// An oversize fault: one lookup to `peer` whose frame exceeds the world's frame limit,
    /// which the sender must refuse (`p2p-frame-limit` judges what reaches a DEALER).
    async fn oversize(&mut self, peer: &str) {
        let Some(limit) = self.max_message_bytes else { return };
        let keys = vec![vec![0u8; OVERSIZE_KEY_BYTES]; limit / OVERSIZE_KEY_BYTES + 1];
        let kv = format!("{}.{}.oversize", self.name, self.inc);
        // First one frame of exactly the limit, which both ends must let through (a response
        // nobody asked for, so the receiver's application sends nothing back): the refused
        // one then ends the session.
        if let Some(msg) = at_limit(format!("{}.{}.at-limit", self.name, self.inc), limit) {
            let sent = self.manager.send(peer, msg);
            trace::record(&self.name, "p2p.at_limit", &[("peer", &peer), ("limit", &limit), ("ok", &sent.is_ok())]);
        }
        let sent = self.manager.send(peer, Message::Lookup { kv_request_id: kv, keys, round_seq: 0 });
        trace::record(&self.name, "p2p.oversize", &[("peer", &peer), ("limit", &limit), ("ok", &sent.is_ok())]);
        self.settle().await;
    }

    /// A peer flood: `n` requests name distinct peers where nothing listens, each opening a
    /// connection and a session that never handshakes (p2p-behaviour.md S10).
    async fn flood(&mut self, n: u32, now: Instant) {
        trace::record(&self.name, "p2p.flood", &[("count", &n)]);
        // Requests naming addresses that are not `host:port` come with it: each must be
        // refused before anything is opened (`p2p-peer-id`).
        for bad in [self.name.clone(), format!("{}:tcp", self.name), format!(":{PORT}")] {
            self.manager.connect_once(&bad, now);
            self.settle().await;
        }
        // And one names a peer this host holds a live session with: refused, and that
        // session goes on (`p2p-duplicate-connect`). Not asked of S1/S4's manager without
        // an error boundary, which escapes on it by design before the flood is felt.
        let live = self.manager.session_peers().into_iter().find(|p| self.manager.is_alive(p));
        if let Some(peer) = live.filter(|_| !self.settings.manager.errors_escape) {
            let session = self.manager.session_id(&peer);
            self.manager.connect_once(&peer, now);
            let kept = self.manager.session_id(&peer) == session && self.manager.is_alive(&peer);
            if self.manager.fatal().is_some() || !kept {
                oracle::violate(
                    "p2p-duplicate-connect",
                    &self.name,
                    format!("connecting again to {peer} while its session {session:?} is alive ended the engine or the session"),
                );
            }
            self.settle().await;
            if self.fatal.is_some() {
                return;
            }
        }
        for i in 0..n {
            let Some(port) = u16::try_from(i).ok().and_then(|i| FLOOD_PORT.checked_add(i)) else { break };
            self.manager.connect_once(&format!("{}:{port}", self.name), now);
            self.settle().await;
            if self.fatal.is_some() {
                return;
            }
        }
    }

    /// A forged-identity fault: one well-formed message to `to`'s ROUTER from a DEALER of
    /// our own whose routing identity claims to be `claims`. A claim on our own host (an
    /// inbound flood's) stands for another process here: a full Connect, and a listener on
    /// the claimed port.
    async fn forge(&mut self, to: &str, claims: &str) {
        let claimed = claims.rsplit_once(':');
        let port = claimed.and_then(|(_, p)| p.parse::<u16>().ok());
        // After a drop each forged connection comes back on its own schedule (spread by the
        // claimed port): an inbound flood's would otherwise all reconnect at once, more than
        // the simulated listener's backlog takes.
        let mut opts = options(Some(claims), self.max_message_bytes);
        opts.reconnect_ivl += Duration::from_millis(2 * (port.map_or(0, u64::from) % 1024));
        let dealer = Socket::new(&self.ctx, SocketType::Dealer, opts);
        let connected = dealer.connect(&format!("tcp://{to}:{PORT}"));
        let on_own_host = claimed.is_some_and(|(host, _)| host == self.name);
        let frame = if let Some(port) = port.filter(|_| on_own_host) {
            // It listens on the port its id names but never answers, so the receiver's
            // dial-back connects and its session waits for a handshake that never
            // completes, holding a registry slot until the handshake deadline.
            let listener = Socket::new(&self.ctx, SocketType::Router, options(None, self.max_message_bytes));
            if listener.bind(&format!("tcp://{}:{port}", self.name)).await.is_ok() {
                self.forged.push(listener);
            }
            let mut config = session_config(&self.name, self.inc, &self.settings);
            config.local_id = claims.to_string();
            value::encode(&Message::Connect(config.connect()).to_value())
        } else {
            value::encode(&value::Value::map([
                ("type", value::Value::from("connect")),
                ("peer_id", value::Value::from(claims)),
            ]))
        };
        // A hostile sender also tries a message of two frames, which the receiver's
        // registry must drop and count (`p2p-message-accounting`).
        let multipart = (!on_own_host).then(|| vec![frame.clone(), frame.clone()]);
        let sent = connected.and_then(|()| dealer.try_send(vec![frame.clone()]));
        trace::record(&self.name, "p2p.forged_sent", &[("to", &to), ("claims", &claims), ("ok", &sent.is_ok())]);
        if let Some(frames) = multipart.filter(|_| sent.is_ok()) {
            let sent = dealer.try_send(frames);
            trace::record(&self.name, "p2p.multipart_sent", &[("to", &to), ("ok", &sent.is_ok())]);
            // And one from an identity that is not UTF-8 (a routing id is any bytes), which
            // names no peer: dropped and counted as well.
            let mut opts = options(None, self.max_message_bytes);
            opts.linger = DEALER_LINGER;
            opts.routing_id = Some([claims.as_bytes(), &[0xff]].concat());
            let raw = Socket::new(&self.ctx, SocketType::Dealer, opts);
            let sent = raw.connect(&format!("tcp://{to}:{PORT}")).and_then(|()| raw.try_send(vec![frame.clone()]));
            trace::record(&self.name, "p2p.non_utf8_sent", &[("to", &to), ("ok", &sent.is_ok())]);
            self.forged.push(raw);
        }
        self.forged.push(dealer);
    }

    /// Seeded requests to some of the peers, and any malformed frames a fault asks for.
    async fn traffic(&mut self) {
        for peer in self.manager.session_peers() {
            if let Some(frame) = faults::take_malformed_to(&self.name, host_of(&peer), true) {
                self.send_raw(&peer, frame);
            }
            if let Some(n) = faults::take_burst(&self.name, host_of(&peer)) {
                self.burst(&peer, n).await;
            }
            if faults::take_oversize(&self.name, host_of(&peer)) {
                self.oversize(&peer).await;
            }
            if !self.rng.gen_bool(0.7) {
                continue;
            }
            let (Some(session), Some(conn)) = (self.manager.session_id(&peer), self.manager.session_conn(&peer)) else {
                continue;
            };
            let pending = self.outstanding.get(&peer).filter(|o| o.session == session).map_or(0, |o| o.requests.len());
            if pending >= MAX_OUTSTANDING || !self.manager.is_alive(&peer) {
                continue;
            }
            if self.manager.is_ready(&peer) && faults::take_send_failure(&self.name, host_of(&peer)) {
                // A replace race: this request, sent between two manager ticks, fails.
                self.manager.handle_send_failed(conn, "send refused by the DEALER (fault)");
                self.settle().await;
                continue;
            }
            let kv = format!("{}.{}.{}", self.name, self.inc, self.next_request);
            self.next_request += 1;
            let key = vec![self.rng.gen::<u8>(), self.rng.gen::<u8>()];
            let msg = if self.rng.gen_bool(0.5) {
                Message::Lookup { kv_request_id: kv.clone(), keys: vec![key], round_seq: 0 }
            } else {
                Message::Fetch { kv_request_id: kv.clone(), keys: vec![key], block_indexes: vec![7], round_seq: 0 }
            };
            trace::record(&self.name, "p2p.request", &[("peer", &peer), ("kv", &kv), ("type", &msg.kind())]);
            // A request goes to the peer's current session (`send`); only an answer is
            // pinned to the session that asked (`send_on`).
            if self.manager.send(&peer, msg).is_ok() {
                if let Some(o) = self.outstanding.get_mut(&peer).filter(|o| o.session == session) {
                    o.requests.insert(kv);
                }
            }
            self.settle().await;
        }
    }

    /// `n` lookups to `peer` in one go, not waited for (the peer stopped reading).
    async fn burst(&mut self, peer: &str, n: u32) {
        if !self.manager.is_ready(peer) {
            return;
        }
        trace::record(&self.name, "p2p.burst", &[("peer", &peer), ("count", &n)]);
        for i in 0..n {
            let kv = format!("{}.{}.burst{i}", self.name, self.inc);
            let _ = self.manager.send(peer, Message::Lookup { kv_request_id: kv, keys: vec![vec![0]], round_seq: 0 });
        }
        self.settle().await;
    }

    /// A frame straight onto `peer`'s DEALER, past the manager (a malformed-frame fault).
    fn send_raw(&mut self, peer: &str, frame: Vec<u8>) {
        let Some(conn) = self.manager.registry().conn_id(peer) else { return };
        let Some(d) = self.dealers.get(&conn) else { return };
        let result = d.dealer.try_send(vec![frame.clone()]);
        trace::record(
            &self.name,
            "p2p.malformed_sent",
            &[("peer", &peer), ("bytes", &frame.len()), ("ok", &result.is_ok())],
        );
    }

    /// Carries out the manager's actions and hands it their failures, then its events to
    /// the application, until neither has anything left (an answer queues a send, a
    /// failed send an event).
    async fn settle(&mut self) {
        loop {
            self.carry_out().await;
            if self.drain_events() == 0 {
                return;
            }
        }
    }

    /// Carries out the manager's queued socket actions, reporting a DEALER that could not
    /// be opened or a frame that could not be sent.
    async fn carry_out(&mut self) {
        while let Some(action) = self.manager.poll_action() {
            match action {
                Action::OpenDealer { conn, peer, endpoint, identity, monitor } => {
                    self.dealer_actions.0 += 1;
                    let host_port =
                        peer.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
                    if !host_port {
                        oracle::violate(
                            "p2p-peer-id",
                            &self.name,
                            format!("a DEALER opened to {endpoint} for {peer:?}, which is not host:port"),
                        );
                    }
                    let inbound = self.manager.registry().direction(&peer) == Some(Direction::Inbound);
                    let on_its_host = peer
                        .rsplit_once(':')
                        .is_some_and(|(host, _)| self.sources.get(&peer).is_some_and(|source| source == host));
                    if inbound && !self.known.contains(&peer) && !on_its_host {
                        oracle::violate(
                            "p2p-dial-non-peer",
                            &self.name,
                            format!("an inbound message made this node dial {endpoint}, which is not a peer"),
                        );
                    }
                    let sockets = 1 + SOCKETS_PER_CONNECTION * (self.dealers.len() + 1);
                    ledger::sockets_needed(&self.name, self.inc, sockets, MAX_SOCKETS);
                    let opened = if sockets > MAX_SOCKETS {
                        Err(ZmqError::Invalid(format!("Too many open files ({sockets} sockets, limit {MAX_SOCKETS})")))
                    } else if faults::take_open_failure(&self.name) {
                        Err(ZmqError::Invalid("Too many open files (an open-failures fault)".into()))
                    } else {
                        self.open_dealer(&endpoint, &identity, &monitor).await
                    };
                    ledger::opened(&self.name, self.inc, conn);
                    match opened {
                        Ok((dealer, pair)) => {
                            trace::record(
                                &self.name,
                                "p2p.dealer_open",
                                &[("peer", &peer), ("conn", &conn), ("monitor", &monitor)],
                            );
                            self.dealers.insert(conn, Dealer { peer, dealer, pair });
                        }
                        Err(e) => {
                            let session = self
                                .manager
                                .session_id(&peer)
                                .filter(|_| self.manager.session_conn(&peer) == Some(conn));
                            self.manager.handle_open_failed(conn, &e.to_string());
                            // Nothing was opened: a registration left alive on it would take
                            // the peer's messages and answers into a connection with no socket.
                            let registry = self.manager.registry();
                            if registry.iter_connections().any(|(_, c, alive)| c == conn && alive) {
                                oracle::violate(
                                    "p2p-open-failed",
                                    &self.name,
                                    format!("connection {conn} to {peer} stays alive after its DEALER failed to open"),
                                );
                            }
                            // Its session can never hear the peer: it dies now, not at its
                            // handshake deadline (which a world may not even set).
                            if session.is_some_and(|s| {
                                self.manager.session_id(&peer) == Some(s) && self.manager.is_alive(&peer)
                            }) {
                                oracle::violate(
                                    "p2p-open-failed",
                                    &self.name,
                                    format!("the session with {peer} on connection {conn} stays alive after its DEALER failed to open"),
                                );
                            }
                            self.open_failed.insert(peer);
                        }
                    }
                }
                Action::CloseDealer { conn, peer } => {
                    self.dealer_actions.1 += 1;
                    ledger::monitor_closed(&self.name, self.inc, conn);
                    ledger::dealer_closed(&self.name, self.inc, conn);
                    trace::record(&self.name, "p2p.dealer_close", &[("peer", &peer), ("conn", &conn)]);
                    self.closed_conns.insert(conn);
                    if let Some(d) = self.dealers.remove(&conn) {
                        d.pair.close();
                        d.dealer.close();
                    }
                }
                Action::Transmit { conn, frame } => {
                    // Actions run in the order the registry queued them, so a frame after
                    // its connection's close was queued on a connection already dead
                    // (`may_transmit_on` refuses a send on a dead one).
                    if self.closed_conns.contains(&conn) {
                        oracle::violate(
                            "p2p-send-on-closed",
                            &self.name,
                            format!("the registry queued a frame on connection {conn} after closing its DEALER"),
                        );
                    }
                    if let Some(limit) = self.max_message_bytes.filter(|l| frame.len() > *l) {
                        // The receiver's maxmsgsize would drop the whole connection.
                        oracle::violate(
                            "p2p-frame-limit",
                            &self.name,
                            format!(
                                "a {} byte frame reached the DEALER of connection {conn} (limit {limit})",
                                frame.len()
                            ),
                        );
                    }
                    if let Some(sent) = &mut self.disconnects {
                        if matches!(
                            value::decode(&frame).ok().and_then(|v| Message::parse(&v).ok()),
                            Some(Parsed::Message(Message::Disconnect))
                        ) {
                            sent.insert(conn);
                        }
                    }
                    let result = match (self.dealers.get(&conn), self.manager.send_mode()) {
                        (Some(d), SendMode::NonBlocking) => match d.dealer.try_send(vec![frame]) {
                            Ok(()) => Ok(()),
                            Err(ZmqError::Again) => {
                                self.refused_full += 1;
                                let error = self.manager.queue_full(conn);
                                // The caller's error names the peer whose queue is full.
                                if !matches!(&error, TransportError::QueueFull { peer } if *peer == d.peer) {
                                    oracle::violate(
                                        "p2p-message-accounting",
                                        &self.name,
                                        format!(
                                            "the full queue of {}'s connection {conn} reported as: {error}",
                                            d.peer
                                        ),
                                    );
                                }
                                Err(error.to_string())
                            }
                            Err(e) => Err(format!("send to {} failed: {e}", d.peer)),
                        },
                        // The seed's send: this whole peer waits for room (race p2p-hwm).
                        (Some(d), SendMode::BlockAtHwm) => {
                            d.dealer.send(vec![frame]).await.map_err(|e| format!("send to {} failed: {e}", d.peer))
                        }
                        (None, _) => Err(format!("no DEALER for connection {conn}")),
                    };
                    if let Err(e) = result {
                        let peer = self.dealers.get(&conn).map(|d| d.peer.clone()).unwrap_or_default();
                        self.manager.handle_send_failed(conn, &e);
                        self.check_send_failed(&peer, conn);
                    }
                }
            }
        }
        // What an operator reads of the registry: every DEALER opened and closed counted
        // once, as the actions it handed out (`dealer-closed-once`).
        let stats = self.manager.registry().stats();
        if (stats.dealers_opened, stats.dealers_closed) != self.dealer_actions {
            oracle::violate(
                "dealer-closed-once",
                &self.name,
                format!(
                    "the registry counts {} DEALER(s) opened and {} closed; it asked for {} and {}",
                    stats.dealers_opened, stats.dealers_closed, self.dealer_actions.0, self.dealer_actions.1
                ),
            );
            self.dealer_actions = (stats.dealers_opened, stats.dealers_closed);
        }
        if stats.sends_refused_full != self.refused_full {
            oracle::violate(
                "p2p-message-accounting",
                &self.name,
                format!(
                    "the registry counts {} send(s) refused for a full queue; the DEALERs refused {}",
                    stats.sends_refused_full, self.refused_full
                ),
            );
            self.refused_full = stats.sends_refused_full;
        }
    }

    /// DEALER with the heartbeat options and our identity, monitored for the core's fatal
    /// events, the PAIR connected to the monitor, then the DEALER connected: the
    /// reference's order.
    async fn open_dealer(
        &self,
        endpoint: &str,
        identity: &str,
        monitor_ep: &str,
    ) -> Result<(Socket, Socket), ZmqError> {
        let dealer = Socket::new(&self.ctx, SocketType::Dealer, options(Some(identity), self.max_message_bytes));
        dealer.monitor(monitor_ep, MONITOR_EVENT_MASK).await?;
        let pair = Socket::new(&self.ctx, SocketType::Pair, SocketOptions::default());
        pair.connect(monitor_ep)?;
        dealer.connect(endpoint)?;
        Ok((dealer, pair))
    }
}

/// Whether a ROUTER message is one the registry drops: not an identity and one payload, an
/// identity that is not UTF-8, a payload over `limit` or not one msgpack value.
fn malformed(frames: &[Vec<u8>], limit: usize) -> bool {
    match frames {
        [identity, payload] => {
            std::str::from_utf8(identity).is_err() || payload.len() > limit || value::validate(payload).is_err()
        }
        _ => true,
    }
}

/// A response whose frame is exactly `limit` bytes (its one key padded to fit), if one is.
fn at_limit(kv_request_id: String, limit: usize) -> Option<Message> {
    let mut key_len = limit;
    for _ in 0..4 {
        let msg = Message::LookupResp {
            kv_request_id: kv_request_id.clone(),
            keys: vec![vec![1; key_len]],
            hits: vec![false],
        };
        let len = value::encode(&msg.to_value()).len();
        if len == limit {
            return Some(msg);
        }
        key_len = (key_len + limit).checked_sub(len)?;
    }
    None
}

/// Whether a monitor event ends its connection, as the delta's transport reads them: a
/// disconnect, a close or a failed handshake. The simulator's own list, not the core's.
fn monitor_ends_connection(event: u16) -> bool {
    matches!(
        event,
        monitor::DISCONNECTED
            | monitor::CLOSED
            | monitor::HANDSHAKE_FAILED_NO_DETAIL
            | monitor::HANDSHAKE_FAILED_PROTOCOL
            | monitor::HANDSHAKE_FAILED_AUTH
    )
}

/// Whether `conn` is still registered and alive.
fn registry_holds_live(registry: &ConnectionRegistry, conn: ConnId) -> bool {
    registry.iter_connections().any(|(_, c, alive)| c == conn && alive)
}
