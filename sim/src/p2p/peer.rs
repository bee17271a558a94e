//! One simulated P2P peer: the mainline transport driver (`zmq-backend`'s `ZmqTransport`
//! and `session_io`) and a manager tick, over the simulator's ZeroMQ model.
//!
//! Every decision is the core's: the [`ConnectionRegistry`] decides who is registered,
//! swept and accepted; each [`HandshakeSession`] decides the handshake and what to send.
//! The peer gathers what its sockets hold, carries out the registry's actions, feeds the
//! sessions, and plays a small application on top: seeded lookups and fetches to every
//! other peer, answered with lookup responses and transfer completions, so that a pair
//! that stops talking is noticed.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use ctlplane_core::p2p::defaults::{HANDSHAKE_TIMEOUT, HEARTBEAT_IVL, HEARTBEAT_TIMEOUT, HEARTBEAT_TTL};
use ctlplane_core::p2p::manager::{admit, Admission, Existing, ManagerRegressions};
use ctlplane_core::p2p::messages::Message;
use ctlplane_core::p2p::options::{SendMode, DEALER_LINGER, DEALER_SNDHWM, MONITOR_EVENT_MASK, ROUTER_LINGER};
use ctlplane_core::p2p::registry::Direction;
use ctlplane_core::p2p::session::{DeathReason, HandshakeSession, SessionConfig, SessionEvent};
use ctlplane_core::p2p::{
    value, Action, ConnId, ConnectionRegistry, MonitorEvent, PollInput, RegistryConfig, T0Switches, TransportError,
};
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
    /// The argument of `p2p::manager::admit`.
    pub manager: ManagerRegressions,
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
fn options(identity: Option<&str>) -> SocketOptions {
    let linger = if identity.is_some() { DEALER_LINGER } else { ROUTER_LINGER };
    SocketOptions {
        heartbeat_ivl: Some(HEARTBEAT_IVL),
        heartbeat_timeout: Some(HEARTBEAT_TIMEOUT),
        heartbeat_ttl: Some(HEARTBEAT_TTL),
        routing_id: identity.map(|i| i.as_bytes().to_vec()),
        sndhwm: usize::try_from(DEALER_SNDHWM).unwrap_or(1000),
        linger,
        ..SocketOptions::default()
    }
}

/// One peer's DEALER and the PAIR reading its monitor.
struct Dealer {
    peer: String,
    dealer: Socket,
    pair: Socket,
}

/// A session and the connection it was attached to.
struct Sess {
    session: HandshakeSession,
    conn: ConnId,
    /// Run-unique number, for traces.
    id: u64,
    /// Our requests still unanswered, by `kv_request_id`.
    outstanding: BTreeSet<String>,
    /// It died of a protocol error, so its Disconnect is on the way out.
    sent_disconnect: bool,
}

struct Peer {
    name: String,
    inc: u32,
    ctx: Context,
    router: Socket,
    registry: ConnectionRegistry,
    dealers: BTreeMap<ConnId, Dealer>,
    /// By peer id.
    sessions: BTreeMap<String, Sess>,
    /// Peers to (re)connect to, and from when.
    reconnect_at: BTreeMap<String, Instant>,
    rng: ChaCha8Rng,
    next_session: u64,
    next_request: u64,
    next_traffic: Instant,
    settings: PeerSettings,
    /// The topology's peers (a flood's unreachable peers are not reconnected).
    known: BTreeSet<String>,
    /// DEALERs a forged-identity fault opened from this host (kept open, as an attacker's).
    forged: Vec<Socket>,
    /// An error escaped into the engine loop: the mainline manager has no error boundary
    /// around the transport (the one of PR #51504 comes with `max_peers`), so EngineCore dies.
    fatal: Option<String>,
}

/// The host program: binds, connects to every other peer, then ticks until the host is
/// crashed or the run ends.
pub async fn run(cfg: Rc<PeerConfig>) -> turmoil::Result {
    let name = cfg.name.clone();
    let inc = ledger::start(&name);
    let ctx = Context::new(&name);
    let router = Socket::new(&ctx, SocketType::Router, options(None));
    router.bind(&format!("tcp://{name}:{PORT}")).await.map_err(|e| format!("{name}: cannot bind ROUTER: {e}"))?;
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ name_hash(&name));
    rng.set_stream(u64::from(inc));
    let now = clock::now();
    let mut config = RegistryConfig::new(peer_id(&name));
    config.t0 = cfg.t0;
    config.max_peers = cfg.settings.max_peers;
    let reconnect_at = cfg.peers.iter().filter(|p| **p != name).map(|p| (peer_id(p), now)).collect();
    let known = cfg.peers.iter().filter(|p| **p != name).map(|p| peer_id(p)).collect();
    let mut peer = Peer {
        name: name.clone(),
        inc,
        ctx,
        router,
        registry: ConnectionRegistry::new(config),
        dealers: BTreeMap::new(),
        sessions: BTreeMap::new(),
        reconnect_at,
        next_session: u64::from(inc) << 32,
        next_request: 0,
        next_traffic: now + Duration::from_millis(rng.gen_range(100..600)),
        rng,
        settings: cfg.settings,
        known,
        forged: Vec::new(),
        fatal: None,
    };
    trace::record(&name, "p2p.start", &[("incarnation", &inc)]);
    loop {
        if let Some(until) = faults::stopped_until(&name) {
            // The application stops reading; the sockets' I/O (heartbeats) goes on.
            trace::record(&name, "p2p.stop_reading", &[("until", &until)]);
            clock::sleep_until(until).await;
        }
        let started = clock::now();
        peer.tick().await;
        let took = clock::now().saturating_duration_since(started);
        if took > MAX_TICK {
            let starved: Vec<&str> = peer.sessions.keys().map(String::as_str).collect();
            oracle::violate(
                "p2p-progress",
                &name,
                format!("one manager tick took {took:?}: sessions with {} made no progress", starved.join(", ")),
            );
        }
        if peer.fatal.is_some() {
            break;
        }
        let wake = clock::now() + POLL_INTERVAL;
        tokio::select! {
            biased;
            _ = peer.router.readable() => {}
            _ = clock::sleep_until(wake) => {}
        }
    }
    // EngineCore died: the process's sockets go with it and nothing answers any more.
    let error = peer.fatal.clone().unwrap_or_default();
    trace::record(&name, "p2p.engine_crash", &[("error", &error)]);
    for p in peer.sessions.keys() {
        ledger::gone(&name, host_of(p));
    }
    drop(peer);
    std::future::pending().await
}

impl Peer {
    /// One manager tick: transport poll, sessions, application, reconnects.
    async fn tick(&mut self) {
        let now = clock::now();
        let accepted = self.poll_transport().await;
        // A session whose connection was swept or replaced lost it.
        for (peer, s) in &mut self.sessions {
            let same = self.registry.conn_id(peer) == Some(s.conn) && self.registry.is_alive(peer);
            if s.session.is_alive() && !same {
                s.session.connection_lost();
            }
        }
        self.drain_events();
        // The mainline manager's tick: accept, session polls, reap. A session that died
        // since the last reap is still held when its peer's replacement is accepted;
        // `admit` decides whether it is reaped first (race S6).
        self.accept(accepted, now);
        self.drive_sessions(now).await;
        self.reap(now);
        if let Some(n) = faults::take_flood(&self.name) {
            self.flood(n, now).await;
        }
        for (to, claims) in faults::take_forged(&self.name) {
            self.forge(&to, &claims);
        }
        if self.fatal.is_some() {
            return;
        }
        if now >= self.next_traffic {
            self.traffic().await;
            self.next_traffic = now + Duration::from_millis(self.rng.gen_range(200..800));
        }
        self.reconnect(now).await;
        let conns: BTreeSet<ConnId> = self.registry.connections().into_iter().map(|(_, c, _)| c).collect();
        ledger::registered(&self.name, self.inc, &conns);
    }

    /// Gathers the ROUTER's messages and each live connection's monitor events (up to its
    /// first fatal one), lets the registry decide, carries out its actions and sets up sessions for accepted peers.
    async fn poll_transport(&mut self) -> Vec<String> {
        let before: BTreeMap<String, (ConnId, bool)> =
            self.registry.connections().into_iter().map(|(p, c, a)| (p, (c, a))).collect();
        let mut input = PollInput::default();
        loop {
            match self.router.try_recv_with_peer() {
                Ok((frames, source)) => {
                    input.router.push(frames);
                    // Peer ids here are host names, so the source is reported by the name
                    // of the host that has the address.
                    input.sources.push(source.and_then(turmoil::reverse_lookup));
                }
                Err(ZmqError::Again) => break,
                Err(e) => {
                    trace::record(&self.name, "p2p.router_error", &[("error", &e)]);
                    break;
                }
            }
        }
        for (_, conn, alive) in self.registry.connections() {
            let Some(d) = self.dealers.get(&conn).filter(|_| alive) else { continue };
            while let Ok(msg) = d.pair.try_recv() {
                let Some((event, _, _)) = monitor::decode(&msg) else { continue };
                let ev = MonitorEvent::from_code(event);
                trace::record(&self.name, "p2p.monitor", &[("peer", &d.peer), ("conn", &conn), ("event", &event)]);
                input.monitor.push((conn, ev));
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
        let refused_before = self.registry.stats().messages_refused;
        let accepted = self.registry.poll(input);
        let refused = self.registry.stats().messages_refused - refused_before;
        if refused > 0 {
            trace::record(&self.name, "p2p.refused", &[("messages", &refused)]);
        }
        // A poll queues opens and closes only; a failed open retires its connection itself.
        let _ = self.carry_out().await;
        for (id, (old, n)) in reconnecting {
            let fresh = self.registry.conn_id(&id).is_some_and(|c| c != old) && self.registry.is_alive(&id);
            if !fresh {
                oracle::violate(
                    "p2p-message-lost",
                    &self.name,
                    format!("{n} message(s) from reconnecting peer {id} were dropped with its dead connection {old}"),
                );
            }
        }
        accepted
    }

    /// A session for every newly accepted inbound peer, as `manager::admit` decides given
    /// the session held for it; its first messages are already in the registry's buffer.
    fn accept(&mut self, accepted: Vec<String>, now: Instant) {
        for peer in accepted {
            let Some(conn) = self.registry.conn_id(&peer) else { continue };
            let existing = match self.sessions.get(&peer) {
                None => Existing::None,
                Some(s) if s.session.is_alive() => Existing::Alive,
                Some(_) => Existing::Dead,
            };
            match admit(existing, &self.settings.manager) {
                Admission::Open => {}
                Admission::ReplaceDead => {
                    if let Some(old) = self.sessions.remove(&peer) {
                        trace::record(&self.name, "p2p.reap", &[("peer", &peer), ("session", &old.id)]);
                    }
                }
                Admission::RefuseDuplicate => {
                    let old = self.sessions.get(&peer).map_or(0, |s| s.id);
                    // The newcomer is closed ("duplicate connection"), its first message with it.
                    oracle::violate(
                        "p2p-message-lost",
                        &self.name,
                        format!("inbound connection from {peer} refused: session {old} still holds the peer"),
                    );
                    self.registry.close(&peer);
                    continue;
                }
            }
            trace::record(&self.name, "p2p.accept", &[("peer", &peer), ("conn", &conn)]);
            self.open_session(peer, conn, now);
        }
    }

    fn open_session(&mut self, peer: String, conn: ConnId, now: Instant) {
        let config = SessionConfig {
            local_id: self.registry.config().local_id.clone(),
            agent_metadata: format!("agent-{}-{}", self.name, self.inc).into_bytes(),
            base_addr: 0x1000_0000,
            num_blocks: 1024,
            block_len: 4096,
            config_fingerprint: String::new(),
            hash_seed: "0".into(),
            // W1+: a session whose Connect went unanswered dies after 30 s instead of
            // stalling forever (race S5), so the pair reconnects. Mainline W1 has none.
            handshake_timeout: (!self.settings.no_handshake_deadline).then_some(HANDSHAKE_TIMEOUT),
            silent_connect_rejection: false,
        };
        let mut session = HandshakeSession::new(peer.clone(), config);
        // A new session is pending, never dead: attach cannot fail.
        let _ = session.attach(now);
        let id = self.next_session;
        self.next_session += 1;
        trace::record(&self.name, "p2p.session", &[("peer", &peer), ("conn", &conn), ("session", &id)]);
        self.reconnect_at.remove(&peer);
        self.sessions.insert(peer, Sess { session, conn, id, outstanding: BTreeSet::new(), sent_disconnect: false });
    }

    /// Feeds every session what arrived for it, its deadline, then sends what it queued.
    async fn drive_sessions(&mut self, now: Instant) {
        let peers: Vec<String> = self.sessions.keys().cloned().collect();
        for peer in peers {
            let msgs = self.registry.recv(&peer);
            if let Some(s) = self.sessions.get_mut(&peer) {
                for m in &msgs {
                    s.session.handle_message(m);
                }
                s.session.handle_timeout(now);
            }
            self.drain_events();
            self.flush(&peer).await;
            if let Some(s) = self.sessions.get(&peer) {
                if !s.session.is_alive() {
                    self.registry.mark_dead_conn(&peer, s.conn);
                }
            }
        }
    }

    /// Sends what `peer`'s session queued; a failed send kills the session. A dead session
    /// is flushed too, so its best-effort Disconnect goes out.
    async fn flush(&mut self, peer: &str) {
        loop {
            let Some(s) = self.sessions.get_mut(peer) else { return };
            let Some(frame) = s.session.poll_transmit() else { return };
            let conn = s.conn;
            if self.registry.conn_id(peer) != Some(conn) {
                continue;
            }
            let result = match self.registry.send(peer, &frame) {
                Ok(()) => self.carry_out().await,
                Err(e) => Err(e.to_string()),
            };
            if let Err(error) = result {
                trace::record(&self.name, "p2p.send_failed", &[("peer", &peer), ("error", &error)]);
                if let Some(s) = self.sessions.get_mut(peer) {
                    s.session.send_failed(&error);
                }
                // As the reference's `_do_send`: the connection is marked dead at once.
                self.registry.mark_dead_conn(peer, conn);
            }
        }
    }

    /// Handles every session's events: handshake progress, role messages, deaths.
    fn drain_events(&mut self) {
        let peers: Vec<String> = self.sessions.keys().cloned().collect();
        for peer in peers {
            while let Some((event, sid)) =
                self.sessions.get_mut(&peer).and_then(|s| s.session.poll_event().map(|e| (e, s.id)))
            {
                let host = host_of(&peer).to_string();
                match event {
                    SessionEvent::PeerConnected(c) => {
                        trace::record(&self.name, "p2p.peer_connected", &[("peer", &c.peer_id), ("session", &sid)]);
                    }
                    SessionEvent::Ready => {
                        trace::record(&self.name, "p2p.ready", &[("peer", &peer), ("session", &sid)]);
                        ledger::ready(&self.name, &host);
                    }
                    SessionEvent::Dead(reason) => {
                        if let (DeathReason::Protocol(_), Some(s)) = (&reason, self.sessions.get_mut(&peer)) {
                            s.sent_disconnect = true;
                        }
                        trace::record(
                            &self.name,
                            "p2p.dead",
                            &[("peer", &peer), ("session", &sid), ("reason", &reason)],
                        );
                        ledger::gone(&self.name, &host);
                    }
                    SessionEvent::Message(m) => self.on_message(&peer, m),
                }
            }
        }
    }

    /// The application: answer requests, match responses.
    fn on_message(&mut self, peer: &str, m: Message) {
        let Some(s) = self.sessions.get_mut(peer) else { return };
        let reply = match m {
            Message::Lookup { kv_request_id, keys, .. } => {
                let hits = keys.iter().map(|k| k.first().is_some_and(|b| b % 2 == 0)).collect();
                Some(Message::LookupResp { kv_request_id, keys, hits })
            }
            Message::Fetch { kv_request_id, round_seq, .. } => {
                Some(Message::TransferDone { kv_request_id, success: true, round_seq })
            }
            Message::AbortFetch { kv_request_id, round_seq } => Some(Message::AbortAck { kv_request_id, round_seq }),
            Message::LookupResp { kv_request_id, .. } | Message::TransferDone { kv_request_id, .. } => {
                if s.outstanding.remove(&kv_request_id) {
                    trace::record(&self.name, "p2p.response", &[("peer", &peer), ("kv", &kv_request_id)]);
                    if s.session.is_ready() {
                        ledger::responded(&self.name, host_of(peer));
                    }
                } else {
                    trace::record(&self.name, "p2p.unmatched_response", &[("peer", &peer), ("kv", &kv_request_id)]);
                }
                None
            }
            _ => None,
        };
        s.session.dispatch_ok();
        if let Some(r) = reply {
            // A session that died on an earlier message of this batch refuses: nothing to do.
            let _ = s.session.send(r);
        }
    }

    /// Removes dead sessions (their connection is marked dead, so the next poll sweeps
    /// it) and schedules a reconnect to the peer.
    fn reap(&mut self, now: Instant) {
        let dead: Vec<String> =
            self.sessions.iter().filter(|(_, s)| !s.session.is_alive()).map(|(p, _)| p.clone()).collect();
        for peer in dead {
            if let Some(s) = self.sessions.remove(&peer) {
                self.registry.mark_dead_conn(&peer, s.conn);
                trace::record(&self.name, "p2p.reap", &[("peer", &peer), ("session", &s.id)]);
                if !self.known.contains(&peer) {
                    continue;
                }
                // A Disconnect just queued would go down with a DEALER retired at once
                // (linger 0): after a protocol error the usual backoff lets it out.
                let backoff = if self.settings.immediate_reconnect && !s.sent_disconnect {
                    Duration::ZERO
                } else {
                    Duration::from_millis(self.rng.gen_range(200..1_000))
                };
                self.reconnect_at.insert(peer, now + backoff);
            }
        }
    }

    /// Opens an outbound connection and session to every peer whose reconnect is due.
    async fn reconnect(&mut self, now: Instant) {
        let due: Vec<String> = self
            .reconnect_at
            .iter()
            .filter(|(p, t)| **t <= now && !self.sessions.contains_key(*p))
            .map(|(p, _)| p.clone())
            .collect();
        for peer in due {
            self.connect_to(peer, now, true).await;
            if self.fatal.is_some() {
                return;
            }
        }
    }

    /// Opens an outbound connection and session to `peer`. A refused connect is retried
    /// after a backoff when `retry`; a duplicate live registration or a DEALER that cannot
    /// be opened is an error the mainline manager does not catch.
    async fn connect_to(&mut self, peer: String, now: Instant, retry: bool) {
        match self.registry.connect(&peer) {
            Ok(conn) => {
                let _ = self.carry_out().await;
                if self.fatal.is_some() || self.registry.conn_id(&peer) != Some(conn) {
                    return;
                }
                trace::record(&self.name, "p2p.connect", &[("peer", &peer), ("conn", &conn)]);
                self.open_session(peer.clone(), conn, now);
                self.flush(&peer).await;
            }
            Err(e @ TransportError::AlreadyExists(_)) => {
                trace::record(&self.name, "p2p.connect_refused", &[("peer", &peer), ("error", &e)]);
                self.fatal = Some(format!("connect to {peer}: {e}"));
            }
            Err(e) => {
                trace::record(&self.name, "p2p.connect_refused", &[("peer", &peer), ("error", &e)]);
                if retry {
                    let backoff = Duration::from_millis(self.rng.gen_range(200..1_000));
                    self.reconnect_at.insert(peer, now + backoff);
                }
            }
        }
    }

    /// A peer flood: `n` requests name distinct peers where nothing listens, each opening a
    /// connection and a session that never handshakes (p2p-behaviour.md S10).
    async fn flood(&mut self, n: u32, now: Instant) {
        trace::record(&self.name, "p2p.flood", &[("count", &n)]);
        for i in 0..n {
            let Some(port) = u16::try_from(i).ok().and_then(|i| FLOOD_PORT.checked_add(i)) else { break };
            self.connect_to(format!("{}:{port}", self.name), now, false).await;
            if self.fatal.is_some() {
                return;
            }
        }
    }

    /// A forged-identity fault: one well-formed message to `to`'s ROUTER from a DEALER of
    /// our own whose routing identity claims to be `claims`.
    fn forge(&mut self, to: &str, claims: &str) {
        let dealer = Socket::new(&self.ctx, SocketType::Dealer, options(Some(claims)));
        let connected = dealer.connect(&format!("tcp://{to}:{PORT}"));
        let frame = value::encode(&value::Value::map([
            ("type", value::Value::from("connect")),
            ("peer_id", value::Value::from(claims)),
        ]));
        let sent = connected.and_then(|()| dealer.try_send(vec![frame]));
        trace::record(&self.name, "p2p.forged_sent", &[("to", &to), ("claims", &claims), ("ok", &sent.is_ok())]);
        self.forged.push(dealer);
    }

    /// Seeded requests to some of the peers, and any malformed frames a fault asks for.
    async fn traffic(&mut self) {
        let peers: Vec<String> = self.sessions.keys().cloned().collect();
        for peer in peers {
            if let Some(frame) = faults::take_malformed_to(&self.name, host_of(&peer), true) {
                self.send_raw(&peer, frame);
            }
            if let Some(n) = faults::take_burst(&self.name, host_of(&peer)) {
                self.burst(&peer, n).await;
            }
            if !self.rng.gen_bool(0.7) {
                continue;
            }
            let Some(s) = self.sessions.get_mut(&peer) else { continue };
            if s.outstanding.len() >= MAX_OUTSTANDING || !s.session.is_alive() {
                continue;
            }
            if s.session.is_ready() && faults::take_send_failure(&self.name, host_of(&peer)) {
                // A replace race: this request, sent between two manager ticks, fails.
                let error = "send refused by the DEALER (fault)";
                trace::record(&self.name, "p2p.send_failed", &[("peer", &peer), ("error", &error)]);
                s.session.send_failed(error);
                self.registry.mark_dead_conn(&peer, s.conn);
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
            if s.session.send(msg).is_ok() {
                s.outstanding.insert(kv);
            }
            self.flush(&peer).await;
        }
    }

    /// `n` lookups to `peer` in one go, not waited for (the peer stopped reading).
    async fn burst(&mut self, peer: &str, n: u32) {
        let Some(s) = self.sessions.get_mut(peer).filter(|s| s.session.is_ready()) else { return };
        trace::record(&self.name, "p2p.burst", &[("peer", &peer), ("count", &n)]);
        for i in 0..n {
            let kv = format!("{}.{}.burst{i}", self.name, self.inc);
            let _ = s.session.send(Message::Lookup { kv_request_id: kv, keys: vec![vec![0]], round_seq: 0 });
        }
        self.flush(peer).await;
    }

    /// A frame straight onto `peer`'s DEALER, past the registry and the session (a
    /// malformed-frame fault).
    fn send_raw(&mut self, peer: &str, frame: Vec<u8>) {
        let Some(conn) = self.registry.conn_id(peer) else { return };
        let Some(d) = self.dealers.get(&conn) else { return };
        let result = d.dealer.try_send(vec![frame.clone()]);
        trace::record(
            &self.name,
            "p2p.malformed_sent",
            &[("peer", &peer), ("bytes", &frame.len()), ("ok", &result.is_ok())],
        );
    }

    /// Carries out the registry's queued actions. The first transmit failure is returned
    /// (a failed open retires the connection instead).
    async fn carry_out(&mut self) -> Result<(), String> {
        let mut first = None;
        while let Some(action) = self.registry.poll_action() {
            match action {
                Action::OpenDealer { conn, peer, endpoint, identity, monitor } => {
                    if self.registry.direction(&peer) == Some(Direction::Inbound) && !self.known.contains(&peer) {
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
                    } else {
                        self.open_dealer(&endpoint, &identity, &monitor).await
                    };
                    match opened {
                        Ok((dealer, pair)) => {
                            ledger::opened(&self.name, self.inc, conn);
                            trace::record(
                                &self.name,
                                "p2p.dealer_open",
                                &[("peer", &peer), ("conn", &conn), ("monitor", &monitor)],
                            );
                            self.dealers.insert(conn, Dealer { peer, dealer, pair });
                        }
                        Err(e) => {
                            trace::record(
                                &self.name,
                                "p2p.dealer_open_failed",
                                &[("peer", &peer), ("conn", &conn), ("error", &e)],
                            );
                            // Nothing is open: retire the registration, as the production driver,
                            // and report the error, which escapes into the engine loop.
                            ledger::opened(&self.name, self.inc, conn);
                            self.registry.close(&peer);
                            self.fatal.get_or_insert(format!("cannot open the control connection to {peer}: {e}"));
                        }
                    }
                }
                Action::CloseDealer { conn, peer } => {
                    ledger::monitor_closed(&self.name, self.inc, conn);
                    ledger::dealer_closed(&self.name, self.inc, conn);
                    trace::record(&self.name, "p2p.dealer_close", &[("peer", &peer), ("conn", &conn)]);
                    if let Some(d) = self.dealers.remove(&conn) {
                        d.pair.close();
                        d.dealer.close();
                    }
                }
                Action::Transmit { conn, frame } => {
                    let result = match (self.dealers.get(&conn), self.registry.send_mode()) {
                        (Some(d), SendMode::NonBlocking) => match d.dealer.try_send(vec![frame]) {
                            Ok(()) => Ok(()),
                            Err(ZmqError::Again) => Err(self.registry.queue_full(conn).to_string()),
                            Err(e) => Err(format!("send to {} failed: {e}", d.peer)),
                        },
                        // The seed's send: this whole peer waits for room (race p2p-hwm).
                        (Some(d), SendMode::BlockAtHwm) => {
                            d.dealer.send(vec![frame]).await.map_err(|e| format!("send to {} failed: {e}", d.peer))
                        }
                        (None, _) => Err(format!("no DEALER for connection {conn}")),
                    };
                    if let Err(e) = result {
                        first.get_or_insert(e);
                    }
                }
            }
        }
        first.map_or(Ok(()), Err)
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
        let dealer = Socket::new(&self.ctx, SocketType::Dealer, options(Some(identity)));
        dealer.monitor(monitor_ep, MONITOR_EVENT_MASK).await?;
        let pair = Socket::new(&self.ctx, SocketType::Pair, SocketOptions::default());
        pair.connect(monitor_ep)?;
        dealer.connect(endpoint)?;
        Ok((dealer, pair))
    }
}
