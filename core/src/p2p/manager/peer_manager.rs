//! [`PeerManager`]: the tiering manager's tick over the registry and the sessions.
//!
//! A driver feeds it what one poll of its sockets held ([`PeerManager::handle_frames`]),
//! then the tick ([`PeerManager::handle_tick`]), and the application's commands
//! ([`PeerManager::keep_connected`], [`PeerManager::send`], ...). After each call it
//! carries out [`PeerManager::poll_action`] until empty, reporting a DEALER it could not
//! open ([`PeerManager::handle_open_failed`]) or a frame it could not send
//! ([`PeerManager::handle_send_failed`]), and hands [`PeerManager::poll_event`] to the
//! application. It sleeps until [`PeerManager::poll_timeout`] or until a socket is
//! readable.
//!
//! The tick order is the manager's (p2p-behaviour.md §3.3): sessions whose connection was
//! swept or replaced lose it; accepted peers are admitted ([`super::admit`], race S6);
//! every session gets its messages, then its handshake deadline (after dispatch, so a
//! buffered Ack wins), then sends what it queued; dead sessions are reaped and their
//! peers scheduled for a reconnect after a [`Backoff`]; due reconnects are dialled.

use super::admission::{admit, Admission, Existing, ManagerRegressions};
use super::backoff::Backoff;
use crate::conformance::{record, Msgpack, Text};
use crate::p2p::messages::{Connect, Message};
use crate::p2p::options::SendMode;
use crate::p2p::registry::{Action, ConnId, ConnectionRegistry, PollInput, RegistryConfig, TransportError};
use crate::p2p::session::{DeathReason, HandshakeSession, SessionConfig, SessionError, SessionEvent};
use crate::time::Instant;
use rand_core::RngCore;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// A run-unique number for one session (for traces and for telling a session from its
/// replacement).
pub type SessionId = u64;

/// What the manager is built with.
#[derive(Clone, Debug)]
pub struct ManagerConfig {
    /// The transport's registry (its `local_id` is also every session's).
    pub registry: RegistryConfig,
    /// What each session announces; `local_id` is replaced by the registry's.
    pub session: SessionConfig,
    /// The race catalogue's switch for the manager.
    pub regressions: ManagerRegressions,
    /// Delay before a peer is dialled again.
    pub backoff: Backoff,
    /// Redial a reaped peer within the tick that reaped it, unless its session queued a
    /// Disconnect (a DEALER retired at once would drop it): the usual backoff lets it out.
    pub immediate_reconnect: bool,
    /// The first session id (a restarted process starts from a fresh range).
    pub first_session: SessionId,
}

impl ManagerConfig {
    /// ctlplane's behaviour: errors are contained, default backoff, no switch on.
    pub fn new(registry: RegistryConfig, session: SessionConfig) -> Self {
        ManagerConfig {
            registry,
            session,
            regressions: ManagerRegressions::default(),
            backoff: Backoff::default(),
            immediate_reconnect: false,
            first_session: 0,
        }
    }
}

/// Why an application command was refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ManagerError {
    #[error("no session with {0}")]
    NoSession(String),
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error("the manager stopped: {0}")]
    Stopped(String),
}

/// What the application (and a driver's traces) see.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerEvent {
    /// An outbound connection and its session were opened.
    Connecting { peer: String, conn: ConnId, session: SessionId },
    /// The registry refused to open a connection to `peer`.
    ConnectRefused { peer: String, error: TransportError },
    /// An inbound peer was admitted: a session on its connection.
    Accepted { peer: String, conn: ConnId, session: SessionId },
    /// An accepted connection was closed because `holder` still holds the peer; the
    /// messages in its buffer went with it.
    DuplicateRefused { peer: String, holder: SessionId },
    /// A dead session was removed.
    Reaped { peer: String, session: SessionId },
    /// The peer's valid Connect (its data-plane metadata).
    PeerConnected { peer: String, session: SessionId, connect: Connect },
    /// The handshake completed: the peer is up.
    Ready { peer: String, session: SessionId },
    /// A validated role message; answer with [`PeerManager::send_on`], then report
    /// [`PeerManager::dispatch_ok`] or a failure.
    Message { peer: String, session: SessionId, message: Message },
    /// The session died: the peer is down until a new session is ready.
    Down { peer: String, session: SessionId, reason: DeathReason },
    /// A frame could not be sent (the session dies of it).
    SendFailed { peer: String, error: String },
    /// A DEALER could not be opened; the registration is retired.
    OpenFailed { peer: String, conn: ConnId, error: String },
    /// An error escaped ([`ManagerRegressions::errors_escape`]): the manager stops.
    Fatal(String),
}

/// A session and the connection it was attached to.
#[derive(Clone, Debug)]
struct Managed {
    session: HandshakeSession,
    conn: ConnId,
    id: SessionId,
    /// It died of a protocol error, so its Disconnect is on the way out.
    sent_disconnect: bool,
}

/// The tiering manager: registry, sessions, admission, reaping, reconnects.
#[derive(Clone, Debug)]
pub struct PeerManager<R> {
    registry: ConnectionRegistry,
    config: ManagerConfig,
    rng: R,
    /// By peer id.
    sessions: BTreeMap<String, Managed>,
    /// Peers kept connected: redialled after their session is reaped.
    wanted: BTreeSet<String>,
    /// Peers to (re)connect to, and from when.
    reconnect_at: BTreeMap<String, Instant>,
    /// Peers the last `handle_sockets` accepted, admitted at the next tick.
    accepted: Vec<String>,
    events: VecDeque<PeerEvent>,
    next_session: SessionId,
    fatal: Option<String>,
}

impl<R: RngCore> PeerManager<R> {
    /// A manager with no peer; `rng` draws the reconnect backoffs.
    pub fn new(config: ManagerConfig, rng: R) -> Self {
        PeerManager {
            registry: ConnectionRegistry::new(config.registry.clone()),
            next_session: config.first_session,
            config,
            rng,
            sessions: BTreeMap::new(),
            wanted: BTreeSet::new(),
            reconnect_at: BTreeMap::new(),
            accepted: Vec::new(),
            events: VecDeque::new(),
            fatal: None,
        }
    }

    /// The registry, for a driver's socket bookkeeping (connections, directions, stats).
    pub fn registry(&self) -> &ConnectionRegistry {
        &self.registry
    }

    /// `"host:port"`: the local peer id.
    pub fn local_id(&self) -> &str {
        &self.registry.config().local_id
    }

    /// Keeps `peer` connected: dialled at the next tick from `now`, and again after a
    /// backoff whenever its session is reaped.
    pub fn keep_connected(&mut self, peer: &str, now: Instant) {
        record!("peer_manager", "keep_connected", "{peer}");
        self.wanted.insert(peer.to_string());
        if !self.sessions.contains_key(peer) {
            self.reconnect_at.insert(peer.to_string(), now);
        }
    }

    /// Dials `peer` now, once: a refused connect or a reaped session is not retried.
    pub fn connect_once(&mut self, peer: &str, now: Instant) {
        record!("peer_manager", "connect_once", "{peer}");
        self.dial(peer.to_string(), now, false);
    }

    /// Sends a role message to `peer`'s current session (queued until its handshake
    /// completes).
    pub fn send(&mut self, peer: &str, msg: Message) -> Result<(), ManagerError> {
        record!("peer_manager", "send", "{peer} {msg:?}");
        let session = self.session_id(peer).ok_or_else(|| ManagerError::NoSession(peer.to_string()))?;
        self.send_to_session(peer, session, msg)
    }

    /// [`Self::send`], only while `session` is still the peer's: a reply must not reach
    /// the replacement of the session that asked.
    pub fn send_on(&mut self, peer: &str, session: SessionId, msg: Message) -> Result<(), ManagerError> {
        record!("peer_manager", "send_on", "{peer} session {session} {msg:?}");
        self.send_to_session(peer, session, msg)
    }

    fn send_to_session(&mut self, peer: &str, session: SessionId, msg: Message) -> Result<(), ManagerError> {
        if let Some(error) = &self.fatal {
            return Err(ManagerError::Stopped(error.clone()));
        }
        let s = self
            .sessions
            .get_mut(peer)
            .filter(|s| s.id == session)
            .ok_or_else(|| ManagerError::NoSession(peer.to_string()))?;
        s.session.send(msg)?;
        self.flush(peer);
        Ok(())
    }

    /// The application handled `session`'s last message.
    pub fn dispatch_ok(&mut self, peer: &str, session: SessionId) {
        record!("peer_manager", "dispatch_ok", "{peer} session {session}");
        if let Some(s) = self.sessions.get_mut(peer).filter(|s| s.id == session) {
            s.session.dispatch_ok();
        }
    }

    /// The application failed on `session`'s last message; five in a row end it.
    pub fn dispatch_failed(&mut self, peer: &str, session: SessionId, error: &str) {
        record!("peer_manager", "dispatch_failed", "{peer} session {session} {error:?}");
        if let Some(s) = self.sessions.get_mut(peer).filter(|s| s.id == session) {
            s.session.dispatch_failed(error);
            self.flush(peer);
        }
    }

    /// Stops keeping `peer` connected and closes its session (a best-effort Disconnect).
    pub fn close(&mut self, peer: &str) {
        record!("peer_manager", "close", "{peer}");
        self.close_peer(peer);
    }

    fn close_peer(&mut self, peer: &str) {
        self.wanted.remove(peer);
        self.reconnect_at.remove(peer);
        if let Some(s) = self.sessions.get_mut(peer) {
            s.session.close();
            self.flush(peer);
        }
    }

    /// Closes every session and the transport.
    pub fn close_all(&mut self) {
        record!("peer_manager", "close_all", "");
        for peer in self.sessions.keys().cloned().collect::<Vec<_>>() {
            self.close_peer(&peer);
        }
        self.wanted.clear();
        self.reconnect_at.clear();
        self.registry.close_all();
    }

    /// What one poll of the sockets held, as owned frames: [`Self::handle_frames`] over
    /// them (the simulator's peers and the tests hand frames in this way).
    pub fn handle_sockets(&mut self, input: PollInput) {
        self.handle_frames(input.router_messages(), &input.monitor);
    }

    /// What one poll of the sockets held, over ROUTER messages the driver still holds (see
    /// `ConnectionRegistry::poll_frames`): the registry routes, sweeps and accepts; the
    /// accepted peers are admitted by the next [`Self::handle_tick`].
    pub fn handle_frames<'f, F>(
        &mut self,
        router: impl IntoIterator<Item = (&'f [F], Option<&'f str>)>,
        monitor: &[(ConnId, crate::p2p::MonitorEvent)],
    ) where
        F: std::ops::Deref<Target = [u8]> + 'f,
    {
        if !conformance_on() {
            let accepted = self.registry.poll_frames(router, monitor);
            self.accepted.extend(accepted);
            return;
        }
        let messages: Vec<(&[F], Option<&str>)> = router.into_iter().collect();
        let rendered: Vec<String> = messages.iter().map(|(m, from)| render_message(m, *from)).collect();
        let accepted = self.registry.poll_frames(messages, monitor);
        record!("peer_manager", "sockets", "router {rendered:?} monitor {monitor:?} -> accepted {accepted:?}");
        self.accepted.extend(accepted);
    }

    /// One manager tick, in the manager's order (see the module docs).
    pub fn handle_tick(&mut self, now: Instant) {
        record!("peer_manager", "tick", "");
        if self.fatal.is_some() {
            return;
        }
        self.lose_replaced();
        let accepted = std::mem::take(&mut self.accepted);
        self.admit_all(accepted, now);
        self.drive_sessions(now);
        self.reap(now);
        self.reconnect(now);
    }

    /// The driver could not open `conn`'s DEALER: nothing is open, so the registration is
    /// retired and the session on it dies (or the error escapes).
    pub fn handle_open_failed(&mut self, conn: ConnId, error: &str) {
        record!("peer_manager", "open_failed", "conn {conn} {error:?}");
        let peer = self.peer_of_conn(conn);
        if let Some(peer) = &peer {
            if self.registry.conn_id(peer) == Some(conn) {
                self.registry.close(peer);
            }
        }
        let peer = peer.unwrap_or_default();
        self.events.push_back(PeerEvent::OpenFailed { peer: peer.clone(), conn, error: error.to_string() });
        if self.config.regressions.errors_escape {
            self.escape(format!("cannot open the control connection to {peer}: {error}"));
        }
        if let Some(s) = self.sessions.get_mut(&peer).filter(|s| s.conn == conn) {
            s.session.connection_lost();
            self.collect(&peer);
        }
    }

    /// The driver could not send a frame on `conn`: as the reference's `_do_send`, the
    /// session dies and its connection is marked dead at once.
    pub fn handle_send_failed(&mut self, conn: ConnId, error: &str) {
        record!("peer_manager", "send_failed", "conn {conn} {error:?}");
        let Some(peer) = self.peer_of_conn(conn) else { return };
        self.events.push_back(PeerEvent::SendFailed { peer: peer.clone(), error: error.to_string() });
        self.registry.mark_dead_conn(&peer, conn);
        if let Some(s) = self.sessions.get_mut(&peer).filter(|s| s.conn == conn) {
            s.session.send_failed(error);
            self.collect(&peer);
        }
    }

    /// The driver found `conn`'s DEALER queue full: the error to report with
    /// [`Self::handle_send_failed`].
    pub fn queue_full(&mut self, conn: ConnId) -> TransportError {
        let error = self.registry.queue_full(conn);
        record!("peer_manager", "queue_full", "conn {conn} -> {error:?}");
        error
    }

    /// How the driver hands frames to a DEALER.
    pub fn send_mode(&self) -> SendMode {
        self.registry.send_mode()
    }

    /// The next socket action for the driver.
    pub fn poll_action(&mut self) -> Option<Action> {
        let action = self.registry.poll_action();
        if let Some(action) = &action {
            record!("peer_manager", "action", "{}", RenderAction(action));
        }
        action
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<PeerEvent> {
        let event = self.events.pop_front();
        if let Some(event) = &event {
            record!("peer_manager", "event", "{event:?}");
        }
        event
    }

    /// When the manager next needs a tick without socket activity: the earliest due
    /// reconnect or handshake deadline.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let reconnects = self.reconnect_at.iter().filter(|(p, _)| !self.sessions.contains_key(*p)).map(|(_, t)| *t);
        let deadlines = self.sessions.values().filter_map(|s| s.session.poll_timeout());
        reconnects.chain(deadlines).min()
    }

    /// The error that stopped the manager, if one escaped.
    pub fn fatal(&self) -> Option<&str> {
        self.fatal.as_deref()
    }

    /// Peers with a session (alive or not yet reaped), in id order.
    pub fn session_peers(&self) -> Vec<String> {
        self.sessions.keys().cloned().collect()
    }

    /// `peer`'s current session.
    pub fn session_id(&self, peer: &str) -> Option<SessionId> {
        self.sessions.get(peer).map(|s| s.id)
    }

    /// The connection `peer`'s session is attached to.
    pub fn session_conn(&self, peer: &str) -> Option<ConnId> {
        self.sessions.get(peer).map(|s| s.conn)
    }

    /// `peer`'s session completed its handshake.
    pub fn is_ready(&self, peer: &str) -> bool {
        self.sessions.get(peer).is_some_and(|s| s.session.is_ready())
    }

    /// `peer`'s session is not dead.
    pub fn is_alive(&self, peer: &str) -> bool {
        self.sessions.get(peer).is_some_and(|s| s.session.is_alive())
    }

    /// When `peer` is next dialled, if a reconnect is scheduled.
    pub fn reconnect_at(&self, peer: &str) -> Option<Instant> {
        self.reconnect_at.get(peer).copied()
    }

    fn escape(&mut self, error: String) {
        if self.fatal.is_none() {
            self.fatal = Some(error.clone());
            self.events.push_back(PeerEvent::Fatal(error));
        }
    }

    fn peer_of_conn(&self, conn: ConnId) -> Option<String> {
        if let Some((peer, _)) = self.sessions.iter().find(|(_, s)| s.conn == conn) {
            return Some(peer.clone());
        }
        self.registry.iter_connections().find(|(_, c, _)| *c == conn).map(|(p, _, _)| p.to_string())
    }

    /// A session whose connection was swept or replaced lost it.
    fn lose_replaced(&mut self) {
        let peers: Vec<String> = self.sessions.keys().cloned().collect();
        for peer in peers {
            let same = |s: &Managed| self.registry.conn_id(&peer) == Some(s.conn) && self.registry.is_alive(&peer);
            let lost = self.sessions.get(&peer).is_some_and(|s| s.session.is_alive() && !same(s));
            if lost {
                if let Some(s) = self.sessions.get_mut(&peer) {
                    s.session.connection_lost();
                }
                self.collect(&peer);
            }
        }
    }

    /// A session for every newly accepted inbound peer, as [`admit`] decides given the
    /// session held for it; its first messages are already in the registry's buffer.
    fn admit_all(&mut self, accepted: Vec<String>, now: Instant) {
        for peer in accepted {
            let Some(conn) = self.registry.conn_id(&peer) else { continue };
            let existing = match self.sessions.get(&peer) {
                None => Existing::None,
                Some(s) if s.session.is_alive() => Existing::Alive,
                Some(_) => Existing::Dead,
            };
            match admit(existing, &self.config.regressions) {
                Admission::Open => {}
                Admission::ReplaceDead => {
                    if let Some(old) = self.sessions.remove(&peer) {
                        self.events.push_back(PeerEvent::Reaped { peer: peer.clone(), session: old.id });
                    }
                }
                Admission::RefuseDuplicate => {
                    let holder = self.sessions.get(&peer).map_or(0, |s| s.id);
                    self.events.push_back(PeerEvent::DuplicateRefused { peer: peer.clone(), holder });
                    self.registry.close(&peer);
                    continue;
                }
            }
            let session = self.open_session(peer.clone(), conn, now);
            self.events.push_back(PeerEvent::Accepted { peer, conn, session });
        }
    }

    fn open_session(&mut self, peer: String, conn: ConnId, now: Instant) -> SessionId {
        let config = SessionConfig { local_id: self.registry.config().local_id.clone(), ..self.config.session.clone() };
        let mut session = HandshakeSession::new(peer.clone(), config);
        // A new session is pending, never dead: attach cannot fail.
        let _ = session.attach(now);
        let id = self.next_session;
        self.next_session += 1;
        self.reconnect_at.remove(&peer);
        self.sessions.insert(peer, Managed { session, conn, id, sent_disconnect: false });
        id
    }

    /// Every session gets its messages, then its deadline, then sends what it queued; a
    /// dead one's connection is marked dead so the next poll sweeps it. A session reads
    /// only its own connection: a newcomer refused while a dead session still holds the
    /// peer (S6) keeps its messages until the sweep drops and counts them.
    fn drive_sessions(&mut self, now: Instant) {
        let peers: Vec<String> = self.sessions.keys().cloned().collect();
        for peer in peers {
            let own = self.sessions.get(&peer).is_some_and(|s| self.registry.conn_id(&peer) == Some(s.conn));
            let msgs = if own { self.registry.recv(&peer) } else { Vec::new() };
            if let Some(s) = self.sessions.get_mut(&peer) {
                for m in &msgs {
                    s.session.handle_message(m);
                }
                s.session.handle_timeout(now);
            }
            self.flush(&peer);
            if let Some(s) = self.sessions.get(&peer).filter(|s| !s.session.is_alive()) {
                self.registry.mark_dead_conn(&peer, s.conn);
            }
        }
    }

    /// Hands what `peer`'s session queued to the registry; a refused send kills the
    /// session. A dead session is flushed too, so its best-effort Disconnect goes out.
    fn flush(&mut self, peer: &str) {
        while let Some((frame, conn)) =
            self.sessions.get_mut(peer).and_then(|s| s.session.poll_transmit().map(|f| (f, s.conn)))
        {
            if self.registry.conn_id(peer) != Some(conn) {
                continue;
            }
            if let Err(error) = self.registry.send(peer, &frame) {
                let error = error.to_string();
                self.events.push_back(PeerEvent::SendFailed { peer: peer.to_string(), error: error.clone() });
                if let Some(s) = self.sessions.get_mut(peer) {
                    s.session.send_failed(&error);
                }
                self.registry.mark_dead_conn(peer, conn);
            }
        }
        self.collect(peer);
    }

    /// Moves `peer`'s session events out as the manager's.
    fn collect(&mut self, peer: &str) {
        let Some(s) = self.sessions.get_mut(peer) else { return };
        let session = s.id;
        while let Some(event) = s.session.poll_event() {
            let peer = peer.to_string();
            self.events.push_back(match event {
                SessionEvent::PeerConnected(connect) => PeerEvent::PeerConnected { peer, session, connect },
                SessionEvent::Ready => PeerEvent::Ready { peer, session },
                SessionEvent::Message(message) => PeerEvent::Message { peer, session, message },
                SessionEvent::Dead(reason) => {
                    if matches!(reason, DeathReason::Protocol(_)) {
                        s.sent_disconnect = true;
                    }
                    PeerEvent::Down { peer, session, reason }
                }
            });
        }
    }

    /// Removes dead sessions (their connection is marked dead, so the next poll sweeps
    /// it) and schedules a reconnect to each peer kept connected.
    fn reap(&mut self, now: Instant) {
        let dead: Vec<String> =
            self.sessions.iter().filter(|(_, s)| !s.session.is_alive()).map(|(p, _)| p.clone()).collect();
        for peer in dead {
            let Some(s) = self.sessions.remove(&peer) else { continue };
            self.registry.mark_dead_conn(&peer, s.conn);
            self.events.push_back(PeerEvent::Reaped { peer: peer.clone(), session: s.id });
            if !self.wanted.contains(&peer) {
                continue;
            }
            let backoff = if self.config.immediate_reconnect && !s.sent_disconnect {
                Duration::ZERO
            } else {
                self.config.backoff.draw(&mut self.rng)
            };
            self.reconnect_at.insert(peer, now + backoff);
        }
    }

    /// Dials every peer whose reconnect is due.
    fn reconnect(&mut self, now: Instant) {
        let due: Vec<String> = self
            .reconnect_at
            .iter()
            .filter(|(p, t)| **t <= now && !self.sessions.contains_key(*p))
            .map(|(p, _)| p.clone())
            .collect();
        for peer in due {
            self.dial(peer, now, true);
            if self.fatal.is_some() {
                return;
            }
        }
    }

    /// Opens an outbound connection and session to `peer`. A refused connect is retried
    /// after a backoff when `retry`; a live registration is an error that escapes when
    /// errors do.
    fn dial(&mut self, peer: String, now: Instant, retry: bool) {
        match self.registry.connect(&peer) {
            Ok(conn) => {
                let session = self.open_session(peer.clone(), conn, now);
                self.events.push_back(PeerEvent::Connecting { peer: peer.clone(), conn, session });
                self.flush(&peer);
            }
            Err(error) => {
                let live = matches!(error, TransportError::AlreadyExists(_));
                self.events.push_back(PeerEvent::ConnectRefused { peer: peer.clone(), error: error.clone() });
                if live && self.config.regressions.errors_escape {
                    self.escape(format!("connect to {peer}: {error}"));
                } else if retry {
                    let backoff = self.config.backoff.draw(&mut self.rng);
                    self.reconnect_at.insert(peer, now + backoff);
                }
            }
        }
    }
}

/// Whether a subscriber records the conformance log (the rendering is skipped otherwise).
fn conformance_on() -> bool {
    tracing::enabled!(target: crate::conformance::TARGET, tracing::Level::TRACE)
}

/// A ROUTER message for the conformance log: the identity as text, payloads decoded.
fn render_message<F: std::ops::Deref<Target = [u8]>>(frames: &[F], from: Option<&str>) -> String {
    let mut out = String::from("[");
    for (i, frame) in frames.iter().enumerate() {
        if i == 0 {
            out.push_str(&Text(frame).to_string());
        } else {
            out.push_str(&format!(", {}", Msgpack(frame)));
        }
    }
    out.push_str(&format!("] from {from:?}"));
    out
}

/// An action for the conformance log, its frame decoded.
struct RenderAction<'a>(&'a Action);

impl std::fmt::Display for RenderAction<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Action::Transmit { conn, frame } => write!(f, "transmit conn {conn} {}", Msgpack(frame)),
            other => write!(f, "{other:?}"),
        }
    }
}

#[cfg(test)]
mod tests;
