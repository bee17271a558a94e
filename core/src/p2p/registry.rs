//! `ConnectionRegistry`: every decision of the P2P control transport (p2p-behaviour.md §1.7-1.10).
//!
//! The driver owns one ROUTER, one DEALER plus one monitor PAIR per peer. It gathers what
//! the sockets hold (ROUTER messages, each connection's monitor events up to its first fatal one) into a
//! [`PollInput`] for [`ConnectionRegistry::poll`] (or lends them to
//! [`ConnectionRegistry::poll_frames`]), and carries out the [`Action`]s the registry
//! queues (open or close a DEALER and its monitor, transmit a frame). The registry decides who is registered, who is alive, what is swept, in which
//! order, and which peers are new.
//!
//! Every ROUTER message passes the peer check ([`super::peer_check`]) with the source
//! address the driver read off it before it is routed or its sender accepted.
//!
//! The T0 lineage's behaviours are kept behind [`T0Switches`], off by default, so the
//! simulator can re-find the races they caused (p2p-behaviour.md §5, S1-S4; S18 for the
//! reference's trusted identities).

use super::frames::Frames;
use super::options::{self, SendMode};
use super::peer_check::PeerCheck;
use super::value::{self, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::Deref;
use thiserror::Error;

/// `MAX_CONTROL_MESSAGE_BYTES` of the T2 lineage (also its `ZMQ_MAXMSGSIZE`).
pub const MAX_CONTROL_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Largest encoding buffer `send` keeps between calls.
const KEPT_SCRATCH_BYTES: usize = 64 * 1024;

/// Refused identities remembered so each is warned about once; past this many, further
/// ones are only counted (a sender inventing identities must not grow the set).
const MAX_REFUSED_WARNED: usize = 1024;

/// Handle of one opened connection (its DEALER and monitor); never reused.
pub type ConnId = u64;

/// Historical (T0) behaviours, each restoring one known race. All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct T0Switches {
    /// S2: sweep dead connections only at the end of `poll` (after accept).
    pub sweep_last: bool,
    /// S3: `mark_dead` also marks the connection closed, so `close` never releases it.
    pub mark_dead_closes: bool,
    /// S4: monitor endpoint without the per-transport sequence number.
    pub monitor_without_seq: bool,
    /// S1: `connect` refuses any registered peer, dead or alive.
    pub connect_refuses_any: bool,
    /// Blocking send at HWM: a send to a full DEALER waits for room (the seed), so one peer
    /// that stops reading stalls the caller and every other session behind it.
    pub blocking_send_at_hwm: bool,
    /// S18: an inbound identity is trusted as the address to dial back, whatever the
    /// connection's source (the peer check is skipped).
    pub trust_identity: bool,
}

/// Tunables of the registry.
#[derive(Clone, Debug)]
pub struct RegistryConfig {
    /// `"{host}:{port}"` of the local ROUTER: every DEALER's routing identity.
    pub local_id: String,
    /// Most registered peers (the socket-exhaustion bound); `None` = unbounded.
    pub max_peers: Option<usize>,
    /// Largest inbound or outbound payload (T2); `None` = unbounded (T1).
    pub max_message_bytes: Option<usize>,
    /// Which inbound identities may be dialled back (strict by default).
    pub peer_check: PeerCheck,
    /// Regression switches.
    pub t0: T0Switches,
}

impl RegistryConfig {
    /// Mainline (T1) behaviour for `local_id`, with the strict peer check.
    pub fn new(local_id: impl Into<String>) -> Self {
        RegistryConfig {
            local_id: local_id.into(),
            max_peers: None,
            max_message_bytes: None,
            peer_check: PeerCheck::default(),
            t0: T0Switches::default(),
        }
    }
}

/// Which side opened a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Outbound,
    Inbound,
}

/// Something for the driver to do with its sockets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create a DEALER (heartbeat options, routing identity, `options::DEALER_SNDHWM`,
    /// `options::DEALER_LINGER`), start its monitor for `options::MONITOR_EVENT_MASK` on
    /// `monitor`, connect a PAIR to it, then connect the DEALER to `endpoint`.
    OpenDealer { conn: ConnId, peer: String, endpoint: String, identity: String, monitor: String },
    /// Close the monitor PAIR, then the DEALER.
    CloseDealer { conn: ConnId, peer: String },
    /// Send one frame on the connection's DEALER, as [`ConnectionRegistry::send_mode`]
    /// says; a refusal for a full queue is reported with [`ConnectionRegistry::queue_full`].
    Transmit { conn: ConnId, frame: Vec<u8> },
}

/// A monitor event read off a connection's PAIR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MonitorEvent {
    /// `ZMQ_EVENT_DISCONNECTED`: the DEALER's TCP link dropped (peer exit or heartbeat).
    Disconnected,
    /// `ZMQ_EVENT_CLOSED`: a connect attempt's socket was closed (refused, unreachable).
    Closed,
    /// One of the `ZMQ_EVENT_HANDSHAKE_FAILED_*` events (its code): the ZMTP handshake
    /// with the peer failed (protocol, security or a link lost during it).
    HandshakeFailed(u16),
    /// Anything else (not subscribed; ignored).
    Other(u16),
}

impl MonitorEvent {
    /// The event of a libzmq event code.
    pub fn from_code(code: u16) -> MonitorEvent {
        match code {
            options::EVENT_DISCONNECTED => MonitorEvent::Disconnected,
            options::EVENT_CLOSED => MonitorEvent::Closed,
            options::EVENT_HANDSHAKE_FAILED_NO_DETAIL
            | options::EVENT_HANDSHAKE_FAILED_PROTOCOL
            | options::EVENT_HANDSHAKE_FAILED_AUTH => MonitorEvent::HandshakeFailed(code),
            other => MonitorEvent::Other(other),
        }
    }

    /// Whether the event ends the connection. A driver reads a connection's monitor until
    /// it is empty or until the first fatal event, leaving the rest unread.
    pub fn is_fatal(self) -> bool {
        !matches!(self, MonitorEvent::Other(_))
    }
}

/// What the sockets held at the start of one `poll`.
#[derive(Clone, Debug, Default)]
pub struct PollInput {
    /// ROUTER messages in arrival order, each as its frames.
    pub router: Vec<Vec<Vec<u8>>>,
    /// The source address of `router[i]`'s connection (libzmq's `Peer-Address`); a
    /// missing entry or `None` is unknown.
    pub sources: Vec<Option<String>>,
    /// Monitor events per connection, in the order read: each connection's events up to
    /// and including its first fatal one.
    pub monitor: Vec<(ConnId, MonitorEvent)>,
}

impl PollInput {
    /// The ROUTER messages as `poll_frames` takes them, each with its source address.
    pub fn router_messages(&self) -> impl Iterator<Item = (&[Vec<u8>], Option<&str>)> + '_ {
        let sources = self.sources.iter().map(Option::as_deref).chain(std::iter::repeat(None));
        self.router.iter().map(Vec::as_slice).zip(sources)
    }
}

/// Why `connect` or `send` refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum TransportError {
    /// A live connection to this peer is registered (the reference asserts).
    #[error("ZmqConnection to {0} already exists")]
    AlreadyExists(String),
    /// The peer id is not `host:port`.
    #[error("invalid peer id {0:?}: expected host:port")]
    InvalidPeerId(String),
    /// The peer bound is reached.
    #[error("refusing connection to {peer}: {limit} peers already registered")]
    TooManyPeers { peer: String, limit: usize },
    /// The connection is dead or closed.
    #[error("ZmqConnection: send on closed connection to {0}")]
    SendOnClosed(String),
    /// No connection is registered for the peer.
    #[error("no connection to {0}")]
    NotConnected(String),
    /// The payload exceeds the message limit.
    #[error("control message exceeds {0} bytes")]
    TooLarge(usize),
    /// The transport was closed.
    #[error("transport is closed")]
    Closed,
    /// The DEALER already queues `options::DEALER_SNDHWM` messages for the peer: it stopped
    /// reading. The owning session treats the connection as dead.
    #[error("ZmqConnection: send queue to {peer} is full")]
    QueueFull { peer: String },
}

#[derive(Clone, Debug)]
struct Connection {
    id: ConnId,
    direction: Direction,
    monitor: String,
    dead: bool,
    closed: bool,
    /// Frames received and found to decode, in arrival order: each receiver builds its
    /// own values from them ([`ConnectionRegistry::recv`] the core's, the Python bindings
    /// Python objects) through the one parser.
    inbox: Frames,
}

impl Connection {
    fn alive(&self) -> bool {
        !(self.dead || self.closed)
    }
}

/// Counters for drivers and oracles.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegistryStats {
    pub dealers_opened: u64,
    pub dealers_closed: u64,
    pub frames_dropped: u64,
    pub messages_routed: u64,
    /// ROUTER messages dropped because the peer check refused their sender.
    pub messages_refused: u64,
    /// Messages thrown away inside connections swept with a non-empty inbox.
    pub messages_lost_in_sweep: u64,
    /// Sends refused because the peer's queue was full.
    pub sends_refused_full: u64,
}

/// The P2P transport's connection map and poll ordering.
#[derive(Clone, Debug)]
pub struct ConnectionRegistry {
    config: RegistryConfig,
    conns: BTreeMap<String, Connection>,
    /// Connection handles in registration order, for deterministic sweeps.
    order: Vec<String>,
    seq: u64,
    actions: VecDeque<Action>,
    stats: RegistryStats,
    closed: bool,
    /// Encoding buffer of `send`, kept between calls.
    scratch: Vec<u8>,
    /// Identities already warned about as refused.
    refused_warned: BTreeSet<String>,
}

impl ConnectionRegistry {
    /// An empty registry.
    pub fn new(config: RegistryConfig) -> Self {
        ConnectionRegistry {
            config,
            conns: BTreeMap::new(),
            order: Vec::new(),
            seq: 0,
            actions: VecDeque::new(),
            stats: RegistryStats::default(),
            closed: false,
            scratch: Vec::new(),
            refused_warned: BTreeSet::new(),
        }
    }

    /// Opens an outbound connection to `peer`. A dead registration is retired first (T1);
    /// a live one is a typed error, never a panic.
    pub fn connect(&mut self, peer: &str) -> Result<ConnId, TransportError> {
        if self.closed {
            return Err(TransportError::Closed);
        }
        if let Some(existing) = self.conns.get(peer) {
            if existing.alive() || self.config.t0.connect_refuses_any {
                return Err(TransportError::AlreadyExists(peer.to_string()));
            }
            tracing::info!(peer, "retiring dead connection before reconnect");
            self.close(peer);
            self.unregister(peer);
        }
        self.open(peer, Direction::Outbound)
    }

    /// Liveness only: the sockets stay open so the owner can still drain `recv`.
    pub fn mark_dead(&mut self, peer: &str) {
        if let Some(c) = self.conns.get_mut(peer) {
            c.dead = true;
            if self.config.t0.mark_dead_closes {
                c.closed = true;
            }
        }
    }

    /// [`Self::mark_dead`], but only while `conn` is still `peer`'s registered connection:
    /// a session that failed must not kill the replacement registered since. Returns
    /// whether it marked.
    pub fn mark_dead_conn(&mut self, peer: &str, conn: ConnId) -> bool {
        if self.conn_id(peer) != Some(conn) {
            return false;
        }
        self.mark_dead(peer);
        true
    }

    /// Releases the connection's sockets; idempotent. It stays registered until swept.
    pub fn close(&mut self, peer: &str) {
        if let Some(c) = self.conns.get_mut(peer) {
            if c.closed {
                return;
            }
            c.dead = true;
            c.closed = true;
            let conn = c.id;
            self.stats.dealers_closed += 1;
            self.actions.push_back(Action::CloseDealer { conn, peer: peer.to_string() });
        }
    }

    /// Everything received for `peer` since the last call.
    pub fn recv(&mut self, peer: &str) -> Vec<Value> {
        // Every kept frame passed `value::validate`, which gives `decode`'s verdict.
        self.recv_frames(peer).iter().filter_map(|frame| value::decode(frame).ok()).collect()
    }

    /// [`Self::recv`] as the frames themselves, each known to decode (see
    /// `value::read`).
    pub fn recv_frames(&mut self, peer: &str) -> Frames {
        self.conns.get_mut(peer).map(|c| std::mem::take(&mut c.inbox)).unwrap_or_default()
    }

    /// Encodes `msg` and queues its transmission on `peer`'s DEALER.
    pub fn send(&mut self, peer: &str, msg: &Value) -> Result<(), TransportError> {
        // Encoded into a kept buffer, then copied once into a frame of the exact size (a
        // frame libzmq takes over is then never reallocated); a large frame takes the
        // buffer itself, so no large buffer is kept.
        self.scratch.clear();
        value::encode_into(&mut self.scratch, msg);
        let frame = if self.scratch.len() > KEPT_SCRATCH_BYTES {
            std::mem::take(&mut self.scratch)
        } else {
            self.scratch.clone()
        };
        self.send_frame(peer, frame)
    }

    /// [`Self::send`] of a frame the caller encoded with `value::Writer` (the bindings
    /// write Python objects straight into one): exactly one value; the same checks apply.
    pub fn send_frame(&mut self, peer: &str, frame: Vec<u8>) -> Result<(), TransportError> {
        debug_assert_eq!(value::validate(&frame), Ok(()), "send_frame takes one msgpack value");
        let conn = self.conn_id(peer).ok_or_else(|| TransportError::NotConnected(peer.to_string()))?;
        self.may_transmit_on(peer, conn, frame.len())?;
        self.actions.push_back(Action::Transmit { conn, frame });
        Ok(())
    }

    /// Whether a frame of `len` bytes may go out on `conn`, which must still be `peer`'s
    /// registered, live connection (a caller holding a handle to a replaced or dead one
    /// gets `SendOnClosed`). The one check of every send: [`Self::send_frame`] asks it for
    /// the peer's current connection and queues a `Transmit`; a binding's send asks it for
    /// the connection its handle holds and, on `Ok`, transmits at once.
    pub fn may_transmit_on(&self, peer: &str, conn: ConnId, len: usize) -> Result<(), TransportError> {
        match self.conns.get(peer) {
            Some(c) if c.id == conn && c.alive() => match self.config.max_message_bytes {
                Some(limit) if len > limit => Err(TransportError::TooLarge(limit)),
                _ => Ok(()),
            },
            _ => Err(TransportError::SendOnClosed(peer.to_string())),
        }
    }

    /// How drivers hand frames to a DEALER: never blocking, unless the seed's blocking send
    /// is restored for a regression run.
    pub fn send_mode(&self) -> SendMode {
        if self.config.t0.blocking_send_at_hwm {
            SendMode::BlockAtHwm
        } else {
            SendMode::NonBlocking
        }
    }

    /// The driver found `conn`'s DEALER queue full: the error the caller gets. The
    /// connection stays registered; its session decides it is dead (as the reference's
    /// owning session does on `ConnectionError`).
    pub fn queue_full(&mut self, conn: ConnId) -> TransportError {
        self.stats.sends_refused_full += 1;
        let peer = self.conns.iter().find(|(_, c)| c.id == conn).map(|(p, _)| p.clone()).unwrap_or_default();
        tracing::warn!(%peer, "send queue full: the peer stopped reading");
        TransportError::QueueFull { peer }
    }

    /// Whether `peer` has a registered, live connection.
    pub fn is_alive(&self, peer: &str) -> bool {
        self.conns.get(peer).is_some_and(Connection::alive)
    }

    /// Whether `peer` is registered at all (alive or not yet swept).
    pub fn is_registered(&self, peer: &str) -> bool {
        self.conns.contains_key(peer)
    }

    /// The connection handle registered for `peer`.
    pub fn conn_id(&self, peer: &str) -> Option<ConnId> {
        self.conns.get(peer).map(|c| c.id)
    }

    /// The direction of `peer`'s registered connection.
    pub fn direction(&self, peer: &str) -> Option<Direction> {
        self.conns.get(peer).map(|c| c.direction)
    }

    /// Registered peers in registration order.
    pub fn peers(&self) -> Vec<String> {
        self.order.clone()
    }

    /// Registered connections with their handles, for the driver's monitor reads.
    pub fn connections(&self) -> Vec<(String, ConnId, bool)> {
        self.order.iter().filter_map(|p| self.conns.get(p).map(|c| (p.clone(), c.id, c.alive()))).collect()
    }

    /// [`Self::connections`] without copying: what a driver walks on every poll.
    pub fn iter_connections(&self) -> impl Iterator<Item = (&str, ConnId, bool)> + '_ {
        self.order.iter().filter_map(|p| self.conns.get(p).map(|c| (p.as_str(), c.id, c.alive())))
    }

    /// One poll step over what the sockets held. Returns each newly accepted inbound
    /// peer exactly once, its first message(s) already in its `recv` buffer.
    ///
    /// Order (T1): sweep, route ROUTER messages, monitor events, sweep, accept. Sweeping
    /// first keeps a reconnecting peer's first message out of a dead registration (S2);
    /// sweeping again before accept retires peers that died in this poll.
    pub fn poll(&mut self, input: PollInput) -> Vec<String> {
        self.poll_frames(input.router_messages(), &input.monitor)
    }

    /// [`Self::poll`] over ROUTER messages whose frames the driver still holds (libzmq's
    /// own messages, for one), each with its connection's source address. The same
    /// decisions in the same order; only what a connection keeps (the decoded message, the
    /// id of a new peer) is copied out, so routing a message allocates nothing before
    /// decode.
    pub fn poll_frames<'f, F>(
        &mut self,
        router: impl IntoIterator<Item = (&'f [F], Option<&'f str>)>,
        monitor: &[(ConnId, MonitorEvent)],
    ) -> Vec<String>
    where
        F: Deref<Target = [u8]> + 'f,
    {
        if self.closed {
            return Vec::new();
        }
        if !self.config.t0.sweep_last {
            self.sweep();
        }
        let pending = self.route(router);
        self.check_monitors(monitor);
        if !self.config.t0.sweep_last {
            self.sweep();
        }
        let accepted = self.accept(pending);
        if self.config.t0.sweep_last {
            self.sweep();
        }
        accepted
    }

    /// Closes every connection and the transport; idempotent.
    pub fn close_all(&mut self) {
        if self.closed {
            return;
        }
        for peer in self.order.clone() {
            self.close(&peer);
        }
        self.conns.clear();
        self.order.clear();
        self.closed = true;
    }

    /// The next socket action for the driver.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Counters.
    pub fn stats(&self) -> RegistryStats {
        self.stats
    }

    /// The configuration.
    pub fn config(&self) -> &RegistryConfig {
        &self.config
    }

    fn open(&mut self, peer: &str, direction: Direction) -> Result<ConnId, TransportError> {
        let (host, port) = peer.rsplit_once(':').ok_or_else(|| TransportError::InvalidPeerId(peer.to_string()))?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(TransportError::InvalidPeerId(peer.to_string()));
        }
        if let Some(limit) = self.config.max_peers {
            if self.conns.len() >= limit {
                return Err(TransportError::TooManyPeers { peer: peer.to_string(), limit });
            }
        }
        let id = self.seq;
        self.seq += 1;
        let safe_id = peer.replace([':', '/'], "-");
        let monitor = if self.config.t0.monitor_without_seq {
            format!("inproc://p2p-monitor-{safe_id}")
        } else {
            format!("inproc://p2p-monitor-{safe_id}-{id}")
        };
        // `_tcp_addr` as the reference: no bracketing (IPv6 is unsupported upstream).
        let endpoint = format!("tcp://{host}:{port}");
        self.actions.push_back(Action::OpenDealer {
            conn: id,
            peer: peer.to_string(),
            endpoint,
            identity: self.config.local_id.clone(),
            monitor: monitor.clone(),
        });
        self.stats.dealers_opened += 1;
        self.conns.insert(
            peer.to_string(),
            Connection { id, direction, monitor, dead: false, closed: false, inbox: Frames::default() },
        );
        self.order.push(peer.to_string());
        Ok(id)
    }

    fn unregister(&mut self, peer: &str) {
        if let Some(c) = self.conns.remove(peer) {
            if !c.inbox.is_empty() {
                self.stats.messages_lost_in_sweep += c.inbox.len() as u64;
                tracing::debug!(peer, lost = c.inbox.len(), "dropping unread messages of a retired connection");
            }
        }
        self.order.retain(|p| p != peer);
    }

    fn sweep(&mut self) {
        let dead: Vec<String> =
            self.order.iter().filter(|p| self.conns.get(*p).is_some_and(|c| !c.alive())).cloned().collect();
        for peer in dead {
            self.close(&peer);
            self.unregister(&peer);
        }
    }

    /// Routes ROUTER messages into registered connections; the rest wait for accept. A
    /// message whose identity the peer check refuses is dropped, whether or not its
    /// identity is registered: it came from somewhere else than the peer it names.
    fn route<'f, F>(&mut self, messages: impl IntoIterator<Item = (&'f [F], Option<&'f str>)>) -> Vec<(String, Vec<u8>)>
    where
        F: Deref<Target = [u8]> + 'f,
    {
        let mut pending = Vec::new();
        // The identity last checked for UTF-8: a drain is mostly runs of one sender.
        let mut last: Option<(&'f [u8], &'f str)> = None;
        // The (identity, source) last admitted, for the same reason.
        let mut last_admitted: Option<(&'f str, Option<&'f str>)> = None;
        for (frames, source) in messages {
            let [identity, payload] = frames else {
                self.stats.frames_dropped += 1;
                tracing::warn!("dropping message with {} frames (expected 2)", frames.len());
                continue;
            };
            let identity: &'f [u8] = identity;
            let sender = match last {
                Some((bytes, sender)) if bytes == identity => sender,
                _ => match std::str::from_utf8(identity) {
                    Ok(sender) => {
                        last = Some((identity, sender));
                        sender
                    }
                    Err(_) => {
                        self.stats.frames_dropped += 1;
                        tracing::warn!("dropping message from a non-UTF-8 identity");
                        continue;
                    }
                },
            };
            if last_admitted != Some((sender, source)) {
                if !self.admits(sender, source) {
                    continue;
                }
                last_admitted = Some((sender, source));
            }
            let payload: &[u8] = payload;
            if let Some(limit) = self.config.max_message_bytes {
                if payload.len() > limit {
                    self.stats.frames_dropped += 1;
                    tracing::warn!(peer = %sender, bytes = payload.len(), "dropping oversize control message");
                    continue;
                }
            }
            let msg = match value::validate(payload) {
                Ok(()) => payload,
                Err(e) => {
                    self.stats.frames_dropped += 1;
                    tracing::warn!(peer = %sender, error = %e, "dropping undecodable control message");
                    continue;
                }
            };
            match self.conns.get_mut(sender) {
                Some(c) => {
                    c.inbox.push(msg);
                    self.stats.messages_routed += 1;
                }
                None => pending.push((sender.to_string(), msg.to_vec())),
            }
        }
        pending
    }

    /// The peer check for one message; a refusal is counted and warned about once per
    /// identity.
    fn admits(&mut self, sender: &str, source: Option<&str>) -> bool {
        if self.config.t0.trust_identity {
            return true;
        }
        let Err(refusal) = self.config.peer_check.admit(sender, source) else { return true };
        self.stats.messages_refused += 1;
        let source = source.unwrap_or("unknown");
        if self.refused_warned.contains(sender) {
            tracing::debug!(peer = %sender, %source, %refusal, "dropping message from a refused peer");
        } else if self.refused_warned.len() < MAX_REFUSED_WARNED {
            self.refused_warned.insert(sender.to_string());
            tracing::warn!(peer = %sender, %source, %refusal, "refusing inbound peer: it will not be dialled back");
            if self.refused_warned.len() == MAX_REFUSED_WARNED {
                tracing::warn!("{MAX_REFUSED_WARNED} inbound identities refused; further ones are only counted");
            }
        } else {
            tracing::debug!(peer = %sender, %source, %refusal, "refusing inbound peer");
        }
        false
    }

    fn check_monitors(&mut self, events: &[(ConnId, MonitorEvent)]) {
        // The first fatal event of a live connection kills it; the others find it dead.
        for &(conn, event) in events {
            if !event.is_fatal() {
                continue;
            }
            let peer = self.conns.iter().find(|(_, c)| c.id == conn && c.alive()).map(|(p, _)| p.clone());
            if let Some(peer) = peer {
                tracing::info!(peer = %peer, ?event, "control connection lost");
                self.mark_dead(&peer);
            }
        }
    }

    fn accept(&mut self, pending: Vec<(String, Vec<u8>)>) -> Vec<String> {
        let mut accepted = Vec::new();
        for (sender, msg) in pending {
            if !self.conns.contains_key(&sender) {
                match self.open(&sender, Direction::Inbound) {
                    Ok(_) => accepted.push(sender.clone()),
                    Err(e) => {
                        self.stats.frames_dropped += 1;
                        tracing::warn!(peer = %sender, error = %e, "refusing inbound peer");
                        continue;
                    }
                }
            }
            if let Some(c) = self.conns.get_mut(&sender) {
                c.inbox.push(&msg);
                self.stats.messages_routed += 1;
            }
        }
        accepted
    }

    /// The monitor endpoint of `peer`'s registered connection.
    pub fn monitor_endpoint(&self, peer: &str) -> Option<&str> {
        self.conns.get(peer).map(|c| c.monitor.as_str())
    }
}
