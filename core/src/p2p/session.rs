//! `HandshakeSession`: the W1 handshake over one control connection (p2p-behaviour.md §2.3, §2.9).
//!
//! Both sides announce themselves with a Connect when a connection is attached; a valid
//! Connect from the peer registers it and is answered with a ConnectAck; the session is
//! ready once the peer acknowledges ours. Role messages sent before that wait in a queue
//! and go out in order on the Ack. The session never touches a socket: it hands frames to
//! send through [`HandshakeSession::poll_transmit`] and reports what happened through
//! [`HandshakeSession::poll_event`].

use super::messages::{Connect, Message, Parsed};
use super::value::Value;
use crate::time::Instant;
use std::collections::VecDeque;
use std::time::Duration;
use thiserror::Error;

/// `_MAX_CONSECUTIVE_DISPATCH_ERRORS`.
pub const MAX_CONSECUTIVE_DISPATCH_ERRORS: u32 = 5;

/// What this side announces in its Connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionConfig {
    pub local_id: String,
    pub agent_metadata: Vec<u8>,
    pub base_addr: u64,
    pub num_blocks: u64,
    pub block_len: u64,
    /// `""` = no fingerprint: matches anything.
    pub config_fingerprint: String,
    pub hash_seed: String,
    /// Kill a session not ready this long after attach (`None`: wait forever, as W1).
    pub handshake_timeout: Option<Duration>,
    /// Reject a bad Connect as the reference does: mark dead without sending a
    /// Disconnect. Off by default: the peer is told, so it does not wait for an Ack.
    pub silent_connect_rejection: bool,
}

impl SessionConfig {
    /// The Connect this side announces.
    pub fn connect(&self) -> Connect {
        Connect {
            peer_id: self.local_id.clone(),
            agent_metadata: self.agent_metadata.clone(),
            base_addr: self.base_addr,
            num_blocks: self.num_blocks,
            block_len: self.block_len,
            config_fingerprint: self.config_fingerprint.clone(),
            hash_seed: self.hash_seed.clone(),
        }
    }
}

/// Why a session died.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum DeathReason {
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("peer sent disconnect")]
    PeerDisconnected,
    #[error("send failed: {0}")]
    SendFailed(String),
    #[error("handshake not completed within {0:?}")]
    HandshakeTimeout(Duration),
    #[error("connection lost")]
    ConnectionLost,
    #[error("session closed")]
    Closed,
}

/// What the session reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// The peer's valid Connect: register its data-plane metadata (`add_remote_peer`).
    PeerConnected(Connect),
    /// The peer acknowledged our Connect: queued messages are flushed.
    Ready,
    /// A validated role message for the client/server roles.
    Message(Message),
    /// The session is dead: mark its connection dead; nothing is resumed.
    Dead(DeathReason),
}

/// Misuse of the session API.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum SessionError {
    #[error("session with {0} already connected")]
    AlreadyConnected(String),
    #[error("session with {0} is dead")]
    Dead(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Pending,
    Connected { ready: bool, attached_at: Instant },
    Dead,
}

/// One peer's W1 session (handshake and send gating).
#[derive(Clone, Debug)]
pub struct HandshakeSession {
    peer_id: String,
    config: SessionConfig,
    phase: Phase,
    queued: VecDeque<Message>,
    outbox: VecDeque<Value>,
    events: VecDeque<SessionEvent>,
    consecutive_errors: u32,
}

impl HandshakeSession {
    /// A pending session: it can queue, not send, until a connection is attached.
    pub fn new(peer_id: impl Into<String>, config: SessionConfig) -> Self {
        HandshakeSession {
            peer_id: peer_id.into(),
            config,
            phase: Phase::Pending,
            queued: VecDeque::new(),
            outbox: VecDeque::new(),
            events: VecDeque::new(),
            consecutive_errors: 0,
        }
    }

    /// A connection is attached: announce ourselves.
    pub fn attach(&mut self, now: Instant) -> Result<(), SessionError> {
        match self.phase {
            Phase::Pending => {}
            Phase::Connected { .. } => return Err(SessionError::AlreadyConnected(self.peer_id.clone())),
            Phase::Dead => return Err(SessionError::Dead(self.peer_id.clone())),
        }
        self.phase = Phase::Connected { ready: false, attached_at: now };
        self.outbox.push_back(Message::Connect(self.config.connect()).to_value());
        Ok(())
    }

    /// Sends a role message, or queues it until the handshake completes.
    pub fn send(&mut self, msg: Message) -> Result<(), SessionError> {
        match self.phase {
            Phase::Dead => Err(SessionError::Dead(self.peer_id.clone())),
            Phase::Connected { ready: true, .. } => {
                self.outbox.push_back(msg.to_value());
                Ok(())
            }
            _ => {
                self.queued.push_back(msg);
                Ok(())
            }
        }
    }

    /// One message received on the connection. Messages after death are ignored.
    pub fn handle_message(&mut self, raw: &Value) {
        if self.phase == Phase::Dead {
            return;
        }
        let parsed = match Message::parse(raw) {
            Ok(p) => p,
            Err(e) => return self.protocol_error(&e),
        };
        let msg = match parsed {
            Parsed::Unknown(v) => {
                tracing::warn!(peer = %self.peer_id, message = %v, "ignoring control message of unknown type");
                self.consecutive_errors = 0;
                return;
            }
            Parsed::Message(m) => m,
        };
        match msg {
            Message::Connect(c) => self.on_connect(c),
            Message::ConnectAck { .. } => {
                if let Phase::Connected { ready, .. } = &mut self.phase {
                    let was_ready = std::mem::replace(ready, true);
                    self.outbox.extend(self.queued.drain(..).map(|m| m.to_value()));
                    if !was_ready {
                        self.events.push_back(SessionEvent::Ready);
                    }
                }
                self.consecutive_errors = 0;
            }
            Message::Disconnect => self.die(DeathReason::PeerDisconnected),
            role => self.events.push_back(SessionEvent::Message(role)),
        }
    }

    fn on_connect(&mut self, c: Connect) {
        if matches!(self.phase, Phase::Connected { ready: true, .. }) {
            return self.protocol_error(&"duplicate connect after handshake");
        }
        let mismatch = if c.block_len != self.config.block_len {
            Some(format!("block_len mismatch: local {} vs remote {}", self.config.block_len, c.block_len))
        } else if !c.config_fingerprint.is_empty()
            && !self.config.config_fingerprint.is_empty()
            && c.config_fingerprint != self.config.config_fingerprint
        {
            Some(format!(
                "config fingerprint mismatch: local {} vs remote {}",
                self.config.config_fingerprint, c.config_fingerprint
            ))
        } else if c.hash_seed != self.config.hash_seed {
            Some(format!("hash_seed mismatch: local {:?} vs remote {:?}", self.config.hash_seed, c.hash_seed))
        } else {
            None
        };
        if let Some(reason) = mismatch {
            tracing::warn!(peer = %self.peer_id, %reason, "rejecting peer connect");
            if self.config.silent_connect_rejection {
                return self.die(DeathReason::Protocol(reason));
            }
            return self.protocol_error(&reason);
        }
        self.consecutive_errors = 0;
        self.events.push_back(SessionEvent::PeerConnected(c));
        self.outbox.push_back(Message::ConnectAck { peer_id: self.config.local_id.clone() }.to_value());
    }

    /// The role handler processed the last [`SessionEvent::Message`] successfully.
    pub fn dispatch_ok(&mut self) {
        self.consecutive_errors = 0;
    }

    /// The role handler failed on a message for a reason other than validation; five in
    /// a row are a protocol error.
    pub fn dispatch_failed(&mut self, error: &str) {
        if self.phase == Phase::Dead {
            return;
        }
        self.consecutive_errors += 1;
        tracing::warn!(peer = %self.peer_id, %error, count = self.consecutive_errors, "control message handler failed");
        if self.consecutive_errors >= MAX_CONSECUTIVE_DISPATCH_ERRORS {
            self.protocol_error(&format!("{} consecutive dispatch errors", self.consecutive_errors));
        }
    }

    /// The driver could not send a frame from [`Self::poll_transmit`].
    pub fn send_failed(&mut self, error: &str) {
        self.die(DeathReason::SendFailed(error.to_string()));
    }

    /// The connection was found dead by the transport.
    pub fn connection_lost(&mut self) {
        self.die(DeathReason::ConnectionLost);
    }

    /// Call after dispatching the messages of a tick: a deadline missed by a session whose
    /// Ack was already buffered must not kill it (S10 sub-race).
    pub fn handle_timeout(&mut self, now: Instant) {
        if let (Phase::Connected { ready: false, attached_at }, Some(limit)) =
            (self.phase, self.config.handshake_timeout)
        {
            if now.saturating_duration_since(attached_at) > limit {
                self.die(DeathReason::HandshakeTimeout(limit));
            }
        }
    }

    /// When the handshake deadline falls, if one applies.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.phase, self.config.handshake_timeout) {
            (Phase::Connected { ready: false, attached_at }, Some(limit)) => {
                Some(attached_at + limit + Duration::from_nanos(1))
            }
            _ => None,
        }
    }

    /// Closing: a best-effort Disconnect, then dead.
    pub fn close(&mut self) {
        if matches!(self.phase, Phase::Connected { .. }) {
            self.outbox.push_back(Message::Disconnect.to_value());
        }
        self.die(DeathReason::Closed);
    }

    /// The next message to send on the connection.
    pub fn poll_transmit(&mut self) -> Option<Value> {
        self.outbox.pop_front()
    }

    /// The next event for the owner.
    pub fn poll_event(&mut self) -> Option<SessionEvent> {
        self.events.pop_front()
    }

    /// Handshake complete.
    pub fn is_ready(&self) -> bool {
        matches!(self.phase, Phase::Connected { ready: true, .. })
    }

    /// Not dead (a pending session counts as alive, as the reference).
    pub fn is_alive(&self) -> bool {
        self.phase != Phase::Dead
    }

    /// Role messages waiting for the handshake.
    pub fn queued(&self) -> usize {
        self.queued.len()
    }

    /// The remote peer id.
    pub fn peer_id(&self) -> &str {
        &self.peer_id
    }

    fn protocol_error(&mut self, error: &dyn std::fmt::Display) {
        tracing::warn!(peer = %self.peer_id, %error, "control protocol error; disconnecting");
        if matches!(self.phase, Phase::Connected { .. }) {
            self.outbox.push_back(Message::Disconnect.to_value());
        }
        self.die(DeathReason::Protocol(error.to_string()));
    }

    fn die(&mut self, reason: DeathReason) {
        if self.phase == Phase::Dead {
            return;
        }
        self.phase = Phase::Dead;
        self.queued.clear();
        self.events.push_back(SessionEvent::Dead(reason));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::p2p::defaults::HANDSHAKE_TIMEOUT;

    fn config(id: &str) -> SessionConfig {
        SessionConfig {
            local_id: id.into(),
            agent_metadata: vec![1, 2, 3],
            base_addr: 4096,
            num_blocks: 8,
            block_len: 256,
            config_fingerprint: "fp".into(),
            hash_seed: "0".into(),
            handshake_timeout: None,
            silent_connect_rejection: false,
        }
    }

    fn kinds(s: &mut HandshakeSession) -> Vec<String> {
        std::iter::from_fn(|| s.poll_transmit())
            .map(|v| match v.get("type") {
                Some(Value::Str(t)) => t.clone(),
                _ => "?".into(),
            })
            .collect()
    }

    /// Delivers everything `from` wants to send to `to`.
    fn pump(from: &mut HandshakeSession, to: &mut HandshakeSession) {
        while let Some(v) = from.poll_transmit() {
            to.handle_message(&v);
        }
    }

    #[test]
    fn handshake_completes_and_flushes_queued_messages_in_order() {
        let mut a = HandshakeSession::new("b:2", config("a:1"));
        let mut b = HandshakeSession::new("a:1", config("b:2"));
        let lookup = |n| Message::Lookup { kv_request_id: format!("r{n}"), keys: vec![], round_seq: 0 };
        a.send(lookup(1)).unwrap();
        a.attach(Instant::ZERO).unwrap();
        a.send(lookup(2)).unwrap();
        b.attach(Instant::ZERO).unwrap();
        pump(&mut a, &mut b); // a's Connect -> b answers Ack
        pump(&mut b, &mut a); // b's Connect + Ack -> a answers Ack, becomes ready, flushes
        assert!(a.is_ready());
        let frames: Vec<Value> = std::iter::from_fn(|| a.poll_transmit()).collect();
        let types: Vec<&Value> = frames.iter().filter_map(|v| v.get("type")).collect();
        assert_eq!(types, vec![&Value::from("connect_ack"), &Value::from("lookup"), &Value::from("lookup")]);
        assert_eq!(frames[1].get("kv_request_id"), Some(&Value::from("r1")));
        assert!(matches!(a.poll_event(), Some(SessionEvent::PeerConnected(c)) if c.peer_id == "b:2"));
        assert_eq!(a.poll_event(), Some(SessionEvent::Ready));
        for f in &frames {
            b.handle_message(f);
        }
        assert!(b.is_ready());
        assert!(matches!(b.poll_event(), Some(SessionEvent::PeerConnected(_))));
        assert_eq!(b.poll_event(), Some(SessionEvent::Ready));
        assert!(matches!(b.poll_event(), Some(SessionEvent::Message(Message::Lookup { .. }))));
    }

    #[test]
    fn mismatched_hash_seed_is_a_protocol_error_with_disconnect() {
        let mut a = HandshakeSession::new("b:2", config("a:1"));
        let mut other = config("b:2");
        other.hash_seed = "42".into();
        let mut b = HandshakeSession::new("a:1", other);
        a.attach(Instant::ZERO).unwrap();
        b.attach(Instant::ZERO).unwrap();
        kinds(&mut a);
        pump(&mut b, &mut a);
        assert!(!a.is_alive());
        assert_eq!(kinds(&mut a), vec!["disconnect"], "no Ack, a best-effort Disconnect");
        assert!(
            matches!(a.poll_event(), Some(SessionEvent::Dead(DeathReason::Protocol(r))) if r.contains("hash_seed"))
        );
    }

    #[test]
    fn silent_rejection_sends_nothing_as_the_reference() {
        let mut cfg = config("a:1");
        cfg.silent_connect_rejection = true;
        let mut a = HandshakeSession::new("b:2", cfg);
        a.attach(Instant::ZERO).unwrap();
        kinds(&mut a);
        let mut remote = config("b:2");
        remote.block_len = 512;
        let mut b = HandshakeSession::new("a:1", remote);
        b.attach(Instant::ZERO).unwrap();
        pump(&mut b, &mut a);
        assert!(!a.is_alive());
        assert!(kinds(&mut a).is_empty());
    }

    #[test]
    fn duplicate_connect_after_handshake_kills_the_session() {
        let mut a = HandshakeSession::new("b:2", config("a:1"));
        let mut b = HandshakeSession::new("a:1", config("b:2"));
        a.attach(Instant::ZERO).unwrap();
        b.attach(Instant::ZERO).unwrap();
        pump(&mut a, &mut b);
        pump(&mut b, &mut a);
        assert!(a.is_ready());
        kinds(&mut a);
        let mut b2 = HandshakeSession::new("a:1", config("b:2"));
        b2.attach(Instant::ZERO).unwrap();
        pump(&mut b2, &mut a);
        assert!(!a.is_alive());
        assert_eq!(kinds(&mut a), vec!["disconnect"]);
    }

    #[test]
    fn disconnect_kills_without_reply_and_later_messages_are_ignored() {
        let mut a = HandshakeSession::new("b:2", config("a:1"));
        a.attach(Instant::ZERO).unwrap();
        kinds(&mut a);
        a.handle_message(&Message::Disconnect.to_value());
        a.handle_message(&Message::ConnectAck { peer_id: "b:2".into() }.to_value());
        assert!(!a.is_alive());
        assert!(kinds(&mut a).is_empty());
        assert_eq!(a.poll_event(), Some(SessionEvent::Dead(DeathReason::PeerDisconnected)));
        assert_eq!(a.poll_event(), None);
    }

    #[test]
    fn five_consecutive_handler_errors_are_a_protocol_error() {
        let mut a = HandshakeSession::new("b:2", config("a:1"));
        a.attach(Instant::ZERO).unwrap();
        for _ in 0..4 {
            a.dispatch_failed("boom");
        }
        a.dispatch_ok();
        for _ in 0..4 {
            a.dispatch_failed("boom");
        }
        assert!(a.is_alive(), "a success resets the count");
        a.dispatch_failed("boom");
        assert!(!a.is_alive());
    }

    #[test]
    fn handshake_deadline_is_checked_after_dispatch() {
        let mut cfg = config("a:1");
        cfg.handshake_timeout = Some(HANDSHAKE_TIMEOUT);
        let mut a = HandshakeSession::new("b:2", cfg.clone());
        a.attach(Instant::ZERO).unwrap();
        let late = Instant::ZERO + HANDSHAKE_TIMEOUT + Duration::from_secs(1);
        // The Ack was buffered: dispatch first, then the deadline finds the session ready.
        a.handle_message(&Message::ConnectAck { peer_id: "b:2".into() }.to_value());
        a.handle_timeout(late);
        assert!(a.is_alive());

        let mut b = HandshakeSession::new("b:2", cfg);
        b.attach(Instant::ZERO).unwrap();
        assert_eq!(b.poll_timeout(), Some(Instant::ZERO + HANDSHAKE_TIMEOUT + Duration::from_nanos(1)));
        b.handle_timeout(late);
        assert!(!b.is_alive());
    }

    #[test]
    fn invalid_role_message_is_a_protocol_error() {
        let mut a = HandshakeSession::new("b:2", config("a:1"));
        a.attach(Instant::ZERO).unwrap();
        kinds(&mut a);
        let bad = Value::map([("type", Value::from("transfer_done")), ("kv_request_id", Value::from("r"))]);
        a.handle_message(&bad);
        assert!(!a.is_alive());
        assert_eq!(kinds(&mut a), vec!["disconnect"]);
    }
}
