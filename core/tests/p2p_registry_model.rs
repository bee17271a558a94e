//! Model-based property test of the P2P `ConnectionRegistry` (p2p-behaviour.md §1.7-1.10 and §5, S1-S5).
//!
//! Random interleavings of `connect`, `mark_dead`, `close`, `send`, `recv`, `poll` (ROUTER
//! messages from known peers, new peers and malformed senders, plus monitor events for
//! current, stale and unknown connection ids) and `close_all` run against the registry
//! and against a small model of the mainline (T1) transport written from the behaviour reference: a
//! registration-ordered list of peer -> {conn id, dead, closed, inbox}. The model predicts
//! every return value, every socket action and the counters.
//!
//! Independently of the model, after every step the test checks invariants that are
//! derived from the actions and return values alone:
//! * at most one registration and at most one open DEALER per peer;
//! * every DEALER is closed at most once, never while its connection is still alive, and
//!   an open DEALER always belongs to a registered connection (no leak); after the final
//!   `close_all` every DEALER opened has been closed exactly once;
//! * no monitor endpoint is used twice within one registry;
//! * no message is lost to a peer that stays alive: a valid message (two frames, UTF-8
//!   `host:port` identity, decodable payload) lands in a live connection unless the
//!   sender's connection is marked dead by a monitor event of the same poll (S5, out of
//!   scope upstream), and it shows up in a later `recv` unless that connection is retired
//!   after dying;
//! * `connect` never fails on a dead registration (S1);
//! * frames are only transmitted on open DEALERs.
//!
//! The T0 regression switches are then shown to break exactly the invariant their race is
//! about (S1-S4): each by a fixed scenario and by a seeded random search.

use ctlplane_core::p2p::registry::{ConnId, Direction, RegistryStats};
use ctlplane_core::p2p::value::{decode, encode, Value};
use ctlplane_core::p2p::{
    Action, ConnectionRegistry, MonitorEvent, PeerCheck, PollInput, RegistryConfig, T0Switches, TransportError,
};
use proptest::prelude::*;
use proptest::test_runner::{Config, FileFailurePersistence, RngAlgorithm, TestError, TestRng, TestRunner};
use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use Inbound::Msg;
use Op::{Connect, MarkDead, Poll};

const LOCAL: &str = "10.0.0.1:5710";

/// Peer ids: four peers sessions connect to, two valid ids only strangers use (one of
/// them non-ASCII), and two invalid ids (no `:`, empty host).
const PEERS: [&str; 8] =
    ["10.0.0.2:7777", "10.0.0.3:7777", "10.0.0.4:7777", "10.0.0.5:7777", "10.0.1.9:9000", "hôte:9", "nocolon", ":7777"];

/// Monitor events for ids that no connection ever had start here.
const UNKNOWN_CONN: ConnId = 1_000_000;

/// Whether `peer` parses as `host:port` (the registry's rule: `rsplit(":", 1)`, non-empty
/// host, `u16` port).
fn valid_id(peer: &str) -> bool {
    peer.rsplit_once(':').is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

// ---------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------

/// The body of a generated message; the harness adds a unique `seq` to every message.
#[derive(Clone, Debug)]
enum Payload {
    Plain(u8),
    Keys(Vec<u8>),
}

/// One ROUTER message.
#[derive(Clone, Debug)]
enum Inbound {
    /// `[PEERS[i], encode(message)]`.
    Msg(usize, Payload),
    /// `[PEERS[i], bytes]`: arbitrary payload bytes, decodable or not.
    Raw(usize, Vec<u8>),
    /// `[PEERS[i], payload]` with a payload that never decodes (kind 0..6).
    Undecodable(usize, u8),
    /// `n` frames (0, 1 or 3) from `PEERS[i]`.
    Frames(usize, u8),
    /// A valid message from a non-UTF-8 identity (kind 0..3).
    NonUtf8(u8),
}

/// One monitor event, resolved against the registry at poll time.
#[derive(Clone, Debug)]
enum Mon {
    /// For the connection currently registered for `PEERS[i]` (skipped if none);
    /// `true` = DISCONNECTED, `false` = some other event.
    Current(usize, bool),
    /// For a connection no longer registered (skipped if there is none).
    Stale(usize, bool),
    /// For an id no connection ever had.
    Unknown(u64),
}

#[derive(Clone, Debug)]
enum Op {
    Connect(usize),
    MarkDead(usize),
    Close(usize),
    Send(usize, Payload),
    Recv(usize),
    Poll(Vec<Inbound>, Vec<Mon>),
    CloseAll,
}

fn peer() -> impl Strategy<Value = usize> {
    prop_oneof![6 => 0..4usize, 1 => 4..6usize, 1 => 6..8usize]
}

fn payload() -> impl Strategy<Value = Payload> {
    prop_oneof![
        3 => (0..3u8).prop_map(Payload::Plain),
        1 => prop::collection::vec(any::<u8>(), 0..4).prop_map(Payload::Keys),
    ]
}

fn inbound() -> impl Strategy<Value = Inbound> {
    prop_oneof![
        10 => (peer(), payload()).prop_map(|(p, m)| Inbound::Msg(p, m)),
        1 => (peer(), prop::collection::vec(any::<u8>(), 0..6)).prop_map(|(p, b)| Inbound::Raw(p, b)),
        1 => (peer(), 0..6u8).prop_map(|(p, k)| Inbound::Undecodable(p, k)),
        1 => (peer(), prop::sample::select(vec![0u8, 1, 3])).prop_map(|(p, n)| Inbound::Frames(p, n)),
        1 => (0..3u8).prop_map(Inbound::NonUtf8),
    ]
}

fn mon() -> impl Strategy<Value = Mon> {
    prop_oneof![
        4 => (peer(), prop::bool::weighted(0.85)).prop_map(|(p, d)| Mon::Current(p, d)),
        2 => (any::<usize>(), prop::bool::weighted(0.85)).prop_map(|(k, d)| Mon::Stale(k, d)),
        1 => (0..4u64).prop_map(Mon::Unknown),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => peer().prop_map(Op::Connect),
        2 => peer().prop_map(Op::MarkDead),
        1 => peer().prop_map(Op::Close),
        2 => (peer(), payload()).prop_map(|(p, m)| Op::Send(p, m)),
        3 => peer().prop_map(Op::Recv),
        5 => (prop::collection::vec(inbound(), 0..5), prop::collection::vec(mon(), 0..3))
            .prop_map(|(r, m)| Op::Poll(r, m)),
    ]
}

/// Up to 48 operations; occasionally `close_all` followed by a few operations on the
/// closed registry. The harness always ends with its own (idempotent) `close_all`.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    (prop::collection::vec(op(), 0..48), prop::option::weighted(0.15, prop::collection::vec(op(), 0..6))).prop_map(
        |(mut ops, tail)| {
            if let Some(tail) = tail {
                ops.push(Op::CloseAll);
                ops.extend(tail);
            }
            ops
        },
    )
}

// ---------------------------------------------------------------------------------------
// Model of the mainline (T1) transport
// ---------------------------------------------------------------------------------------

struct MConn {
    peer: String,
    id: ConnId,
    direction: Direction,
    monitor: String,
    dead: bool,
    closed: bool,
    inbox: Vec<Value>,
}

impl MConn {
    fn alive(&self) -> bool {
        !(self.dead || self.closed)
    }
}

/// The transport's connection map (a Python dict: registration order), its counters and
/// the socket actions it asks for.
#[derive(Default)]
struct Model {
    conns: Vec<MConn>,
    next_id: ConnId,
    closed: bool,
    stats: RegistryStats,
    actions: Vec<Action>,
}

impl Model {
    fn find(&self, peer: &str) -> Option<usize> {
        self.conns.iter().position(|c| c.peer == peer)
    }

    fn get(&self, peer: &str) -> Option<&MConn> {
        self.find(peer).map(|i| &self.conns[i])
    }

    /// `ZmqConnection.close()`: idempotent; sets `_dead` and releases PAIR then DEALER.
    fn close_at(&mut self, i: usize) {
        let c = &mut self.conns[i];
        if !c.closed {
            c.dead = true;
            c.closed = true;
            self.stats.dealers_closed += 1;
            self.actions.push(Action::CloseDealer { conn: c.id, peer: c.peer.clone() });
        }
    }

    /// Unregisters a connection; whatever it still held is gone.
    fn retire(&mut self, i: usize) {
        let c = self.conns.remove(i);
        assert!(!c.alive(), "the model only retires dead connections");
        self.stats.messages_lost_in_sweep += c.inbox.len() as u64;
    }

    /// `_open_connection`: monitor `inproc://p2p-monitor-{safe_id}-{seq}` (1.6).
    fn open(&mut self, peer: &str, direction: Direction) -> Result<ConnId, TransportError> {
        if !valid_id(peer) {
            return Err(TransportError::InvalidPeerId(peer.to_string()));
        }
        let id = self.next_id;
        self.next_id += 1;
        let monitor = format!("inproc://p2p-monitor-{}-{id}", peer.replace([':', '/'], "-"));
        self.actions.push(Action::OpenDealer {
            conn: id,
            peer: peer.to_string(),
            endpoint: format!("tcp://{peer}"),
            identity: LOCAL.to_string(),
            monitor: monitor.clone(),
        });
        self.stats.dealers_opened += 1;
        self.conns.push(MConn {
            peer: peer.to_string(),
            id,
            direction,
            monitor,
            dead: false,
            closed: false,
            inbox: vec![],
        });
        Ok(id)
    }

    /// 1.8 (T1): a live registration is a duplicate; a dead one is closed and retired.
    fn connect(&mut self, peer: &str) -> Result<ConnId, TransportError> {
        if self.closed {
            return Err(TransportError::Closed);
        }
        if let Some(i) = self.find(peer) {
            if self.conns[i].alive() {
                return Err(TransportError::AlreadyExists(peer.to_string()));
            }
            self.close_at(i);
            self.retire(i);
        }
        self.open(peer, Direction::Outbound)
    }

    /// 1.7: liveness only; sockets and inbox stay.
    fn mark_dead(&mut self, peer: &str) {
        if let Some(i) = self.find(peer) {
            self.conns[i].dead = true;
        }
    }

    fn close(&mut self, peer: &str) {
        if let Some(i) = self.find(peer) {
            self.close_at(i);
        }
    }

    fn recv(&mut self, peer: &str) -> Vec<Value> {
        self.find(peer).map(|i| std::mem::take(&mut self.conns[i].inbox)).unwrap_or_default()
    }

    fn send(&mut self, peer: &str, msg: &Value) -> Result<(), TransportError> {
        let c = self.get(peer).ok_or_else(|| TransportError::NotConnected(peer.to_string()))?;
        if !c.alive() {
            return Err(TransportError::SendOnClosed(peer.to_string()));
        }
        let conn = c.id;
        self.actions.push(Action::Transmit { conn, frame: encode(msg) });
        Ok(())
    }

    /// `_sweep_dead_connections`: close and unregister every non-alive connection.
    fn sweep(&mut self) {
        let mut i = 0;
        while i < self.conns.len() {
            if self.conns[i].alive() {
                i += 1;
            } else {
                self.close_at(i);
                self.retire(i);
            }
        }
    }

    /// 1.9 (T1): sweep, route, monitors, sweep, accept.
    fn poll(&mut self, input: &PollInput) -> Vec<String> {
        if self.closed {
            return vec![];
        }
        self.sweep();
        let mut pending = Vec::new();
        for frames in &input.router {
            let [identity, payload] = frames.as_slice() else {
                self.stats.frames_dropped += 1;
                continue;
            };
            let Ok(sender) = std::str::from_utf8(identity) else {
                self.stats.frames_dropped += 1;
                continue;
            };
            let Ok(msg) = decode(payload) else {
                self.stats.frames_dropped += 1;
                continue;
            };
            match self.find(sender) {
                Some(i) => {
                    self.conns[i].inbox.push(msg);
                    self.stats.messages_routed += 1;
                }
                None => pending.push((sender.to_string(), msg)),
            }
        }
        for &(id, event) in &input.monitor {
            if event == MonitorEvent::Disconnected {
                if let Some(c) = self.conns.iter_mut().find(|c| c.id == id && c.alive()) {
                    c.dead = true;
                }
            }
        }
        self.sweep();
        let mut accepted = Vec::new();
        for (sender, msg) in pending {
            let i = match self.find(&sender) {
                Some(i) => i,
                None => {
                    if self.open(&sender, Direction::Inbound).is_err() {
                        self.stats.frames_dropped += 1;
                        continue;
                    }
                    accepted.push(sender);
                    self.conns.len() - 1
                }
            };
            self.conns[i].inbox.push(msg);
            self.stats.messages_routed += 1;
        }
        accepted
    }

    /// 1.10: close every connection, clear the map.
    fn close_all(&mut self) {
        if self.closed {
            return;
        }
        for i in 0..self.conns.len() {
            self.close_at(i);
        }
        self.conns.clear();
        self.closed = true;
    }
}

// ---------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// The registry disagrees with the model.
    Mismatch,
    /// Two registrations for one peer, or a connection id handed out twice.
    Duplicate,
    /// A DEALER closed twice, or one that was never opened.
    DoubleClose,
    /// A DEALER left open without a registered connection (or beside a newer one).
    Leak,
    /// A monitor endpoint used twice within one registry.
    MonitorReuse,
    /// A message to a peer that stayed alive never reached `recv`.
    Lost,
    /// `connect` failed on a dead registration.
    DeadConnect,
    /// A frame transmitted on a DEALER that is not open.
    ClosedTransmit,
    /// Registered state that contradicts the actions (alive connection, closed DEALER).
    Inconsistent,
}

#[derive(Debug)]
struct Violation {
    kind: Kind,
    detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}: {}", self.kind, self.detail)
    }
}

fn violation(kind: Kind, detail: impl Into<String>) -> Violation {
    Violation { kind, detail: detail.into() }
}

struct Dealer {
    peer: String,
    closes: u32,
}

struct Harness {
    reg: ConnectionRegistry,
    /// `None` for the T0 runs, which check the invariants only.
    model: Option<Model>,
    /// Every DEALER the registry opened, by connection id.
    dealers: BTreeMap<ConnId, Dealer>,
    monitors: BTreeSet<String>,
    /// Messages a correct transport must still hand to `recv`, with the connection
    /// holding them.
    owed: BTreeMap<String, Vec<(ConnId, Value)>>,
    next_seq: i64,
    closed: bool,
    /// The first disagreement with the model in this step; reported after the
    /// invariants, so that a broken invariant is what a T0 run reports.
    mismatch: Option<Violation>,
}

/// `(conn, alive)` of every registered peer.
type Snapshot = BTreeMap<String, (ConnId, bool)>;

fn undecodable(kind: u8, valid: Vec<u8>) -> Vec<u8> {
    match kind {
        0 => vec![0xc1],
        1 => vec![],
        2 => vec![0x92, 0x01],
        3 => [valid, vec![0x00]].concat(),
        4 => vec![0xa3, 0xff, 0xfe, 0xfd],
        _ => vec![0x81, 0x01, 0x02],
    }
}

fn non_utf8(kind: u8) -> Vec<u8> {
    match kind {
        0 => vec![0x00, 0x80, 0x00, 0x00, 0x01],
        1 => vec![0xff],
        _ => [PEERS[0].as_bytes(), &[0xc3]].concat(),
    }
}

fn encoded(values: &[Value]) -> Vec<Vec<u8>> {
    values.iter().map(encode).collect()
}

impl Harness {
    fn new(t0: T0Switches, with_model: bool) -> Self {
        Harness {
            // The model is the reference's registry, which trusts every identity.
            reg: ConnectionRegistry::new(RegistryConfig {
                t0,
                peer_check: PeerCheck::off(),
                ..RegistryConfig::new(LOCAL)
            }),
            model: with_model.then(Model::default),
            dealers: BTreeMap::new(),
            monitors: BTreeSet::new(),
            owed: BTreeMap::new(),
            next_seq: 0,
            closed: false,
            mismatch: None,
        }
    }

    fn message(&mut self, p: &Payload) -> Value {
        let seq = Value::from(self.next_seq);
        self.next_seq += 1;
        match p {
            Payload::Plain(k) => {
                Value::map([("type", Value::from(["connect", "lookup", "fetch"][*k as usize])), ("seq", seq)])
            }
            Payload::Keys(b) => Value::map([
                ("type", Value::from("lookup")),
                ("seq", seq),
                ("keys", Value::Array(vec![Value::Bin(b.clone())])),
            ]),
        }
    }

    fn expect<T: PartialEq + fmt::Debug>(&mut self, what: &str, got: T, want: T) {
        if got != want && self.mismatch.is_none() {
            self.mismatch = Some(violation(Kind::Mismatch, format!("{what}: registry {got:?}, model {want:?}")));
        }
    }

    fn snapshot(&self) -> Snapshot {
        self.reg.connections().into_iter().map(|(p, id, alive)| (p, (id, alive))).collect()
    }

    fn step(&mut self, op: &Op) -> Result<(), Violation> {
        let before = self.snapshot();
        let mut killed = BTreeSet::new();
        let mut protected = Vec::new();
        match op {
            Op::Connect(i) => {
                let p = PEERS[*i];
                let dead_registration = !self.closed && before.get(p).is_some_and(|&(_, alive)| !alive);
                let got = self.reg.connect(p);
                if dead_registration {
                    if let Err(e) = &got {
                        return Err(violation(Kind::DeadConnect, format!("connect({p}) on a dead registration: {e}")));
                    }
                }
                if let Some(m) = &mut self.model {
                    let want = m.connect(p);
                    self.expect(&format!("connect({p})"), got, want);
                }
            }
            Op::MarkDead(i) => {
                self.reg.mark_dead(PEERS[*i]);
                if let Some(m) = &mut self.model {
                    m.mark_dead(PEERS[*i]);
                }
            }
            Op::Close(i) => {
                self.reg.close(PEERS[*i]);
                if let Some(m) = &mut self.model {
                    m.close(PEERS[*i]);
                }
            }
            Op::Send(i, payload) => {
                let p = PEERS[*i];
                let msg = self.message(payload);
                let got = self.reg.send(p, &msg);
                if let Some(m) = &mut self.model {
                    let want = m.send(p, &msg);
                    self.expect(&format!("send({p})"), got, want);
                }
            }
            Op::Recv(i) => {
                let p = PEERS[*i];
                let got = self.reg.recv(p);
                let got_bytes = encoded(&got);
                if let Some(owed) = self.owed.remove(p) {
                    let mut rest = got_bytes.iter();
                    for (conn, msg) in owed {
                        let want = encode(&msg);
                        if !rest.any(|g| *g == want) {
                            return Err(violation(
                                Kind::Lost,
                                format!("{msg} routed to {p} (conn {conn}) is missing from recv: {got:?}"),
                            ));
                        }
                    }
                }
                if let Some(m) = &mut self.model {
                    let want = encoded(&m.recv(p));
                    self.expect(&format!("recv({p})"), got_bytes, want);
                }
            }
            Op::Poll(inbound, mons) => {
                let mut router = Vec::new();
                // Messages a correct transport must deliver: (sender, message).
                let mut valid = Vec::new();
                for ib in inbound {
                    match ib {
                        Inbound::Msg(i, pl) => {
                            let msg = self.message(pl);
                            router.push(vec![PEERS[*i].as_bytes().to_vec(), encode(&msg)]);
                            if valid_id(PEERS[*i]) {
                                valid.push((PEERS[*i].to_string(), msg));
                            }
                        }
                        Inbound::Raw(i, bytes) => {
                            router.push(vec![PEERS[*i].as_bytes().to_vec(), bytes.clone()]);
                            if let (true, Ok(msg)) = (valid_id(PEERS[*i]), decode(bytes)) {
                                valid.push((PEERS[*i].to_string(), msg));
                            }
                        }
                        Inbound::Undecodable(i, kind) => {
                            let msg = self.message(&Payload::Plain(0));
                            let payload = undecodable(*kind, encode(&msg));
                            assert!(decode(&payload).is_err(), "test bug: {payload:?} decodes");
                            router.push(vec![PEERS[*i].as_bytes().to_vec(), payload]);
                        }
                        Inbound::Frames(i, n) => {
                            let msg = self.message(&Payload::Plain(0));
                            let frames = match n {
                                0 => vec![],
                                1 => vec![PEERS[*i].as_bytes().to_vec()],
                                _ => vec![PEERS[*i].as_bytes().to_vec(), vec![], encode(&msg)],
                            };
                            router.push(frames);
                        }
                        Inbound::NonUtf8(kind) => {
                            let msg = self.message(&Payload::Plain(0));
                            router.push(vec![non_utf8(*kind), encode(&msg)]);
                        }
                    }
                }
                let stale: Vec<ConnId> =
                    self.dealers.keys().filter(|id| !before.values().any(|(c, _)| c == *id)).copied().collect();
                let mut monitor: Vec<(ConnId, MonitorEvent)> = Vec::new();
                for m in mons {
                    let event = |d: bool| if d { MonitorEvent::Disconnected } else { MonitorEvent::Other(0x0001) };
                    let (id, ev) = match *m {
                        Mon::Current(i, d) => match self.reg.conn_id(PEERS[i]) {
                            Some(id) => (id, event(d)),
                            None => continue,
                        },
                        Mon::Stale(_, _) if stale.is_empty() => continue,
                        Mon::Stale(k, d) => (stale[k % stale.len()], event(d)),
                        Mon::Unknown(x) => (UNKNOWN_CONN + x, MonitorEvent::Disconnected),
                    };
                    // At most one event per connection per poll (1.6).
                    if !monitor.iter().any(|&(c, _)| c == id) {
                        monitor.push((id, ev));
                    }
                }
                killed = monitor
                    .iter()
                    .filter(|&&(id, ev)| {
                        ev == MonitorEvent::Disconnected && before.values().any(|&(c, alive)| c == id && alive)
                    })
                    .map(|&(id, _)| id)
                    .collect();
                // S5: a message routed into a connection that dies in the same poll is
                // lost upstream too; everything else must be delivered.
                protected = valid
                    .into_iter()
                    .filter(|(s, _)| !before.get(s).is_some_and(|&(c, alive)| alive && killed.contains(&c)))
                    .collect();
                let input = PollInput { router, sources: Vec::new(), monitor };
                let got = self.reg.poll(input.clone());
                if let Some(m) = &mut self.model {
                    let want = m.poll(&input);
                    self.expect("poll accepted", got, want);
                }
            }
            Op::CloseAll => {
                self.reg.close_all();
                self.closed = true;
                if let Some(m) = &mut self.model {
                    m.close_all();
                }
            }
        }
        self.drain_actions()?;
        self.check_registrations()?;
        self.settle_owed(&before, &killed, matches!(op, Op::CloseAll))?;
        if !self.closed {
            for (sender, msg) in protected {
                match self.reg.conn_id(&sender) {
                    Some(conn) if self.reg.is_alive(&sender) => self.owed.entry(sender).or_default().push((conn, msg)),
                    _ => {
                        return Err(violation(
                            Kind::Lost,
                            format!("{msg} from {sender} has no live connection to land in after the poll"),
                        ))
                    }
                }
            }
        }
        if let Some(v) = self.mismatch.take() {
            return Err(v);
        }
        self.compare_state()
    }

    /// Checks the socket actions of the step against the DEALER ledger (and the model).
    fn drain_actions(&mut self) -> Result<(), Violation> {
        let got: Vec<Action> = std::iter::from_fn(|| self.reg.poll_action()).collect();
        for a in &got {
            match a {
                Action::OpenDealer { conn, peer, monitor, .. } => {
                    if self.dealers.contains_key(conn) {
                        return Err(violation(Kind::Duplicate, format!("connection id {conn} opened twice")));
                    }
                    if let Some((old, _)) = self.dealers.iter().find(|(_, d)| d.peer == *peer && d.closes == 0) {
                        return Err(violation(
                            Kind::Leak,
                            format!("DEALER {old} to {peer} is still open when DEALER {conn} opens"),
                        ));
                    }
                    if !self.monitors.insert(monitor.clone()) {
                        return Err(violation(Kind::MonitorReuse, format!("{monitor} reused by connection {conn}")));
                    }
                    self.dealers.insert(*conn, Dealer { peer: peer.clone(), closes: 0 });
                }
                Action::CloseDealer { conn, peer } => {
                    let Some(d) = self.dealers.get_mut(conn) else {
                        return Err(violation(Kind::DoubleClose, format!("closing DEALER {conn} never opened")));
                    };
                    d.closes += 1;
                    if d.closes > 1 {
                        return Err(violation(Kind::DoubleClose, format!("DEALER {conn} to {peer} closed twice")));
                    }
                    if d.peer != *peer {
                        return Err(violation(
                            Kind::Inconsistent,
                            format!("DEALER {conn} of {} closed as {peer}", d.peer),
                        ));
                    }
                }
                Action::Transmit { conn, .. } => {
                    if self.dealers.get(conn).is_none_or(|d| d.closes != 0) {
                        return Err(violation(
                            Kind::ClosedTransmit,
                            format!("transmit on DEALER {conn} which is not open"),
                        ));
                    }
                }
            }
        }
        if let Some(m) = &mut self.model {
            let want = std::mem::take(&mut m.actions);
            self.expect("actions", got, want);
        }
        Ok(())
    }

    /// One registration per peer; open DEALERs belong to registered connections; a live
    /// connection's DEALER is open.
    fn check_registrations(&self) -> Result<(), Violation> {
        let conns = self.reg.connections();
        let peers: BTreeSet<&str> = conns.iter().map(|(p, _, _)| p.as_str()).collect();
        if peers.len() != conns.len() {
            return Err(violation(Kind::Duplicate, format!("several registrations for one peer: {conns:?}")));
        }
        for (peer, id, alive) in &conns {
            let Some(d) = self.dealers.get(id) else {
                return Err(violation(Kind::Inconsistent, format!("{peer} registered with unopened connection {id}")));
            };
            if d.peer != *peer || (*alive && d.closes > 0) {
                return Err(violation(
                    Kind::Inconsistent,
                    format!("{peer} registered (alive: {alive}) with DEALER {id} of {} closed {}x", d.peer, d.closes),
                ));
            }
        }
        for (id, d) in &self.dealers {
            if d.closes == 0 && !conns.iter().any(|(_, c, _)| c == id) {
                return Err(violation(
                    Kind::Leak,
                    format!("DEALER {id} to {} is open but no longer registered", d.peer),
                ));
            }
        }
        Ok(())
    }

    /// Messages owed on connections that went away in this step: fine if the connection
    /// was dead before the step, died by a monitor event in it, or the transport closed.
    fn settle_owed(&mut self, before: &Snapshot, killed: &BTreeSet<ConnId>, closing: bool) -> Result<(), Violation> {
        for (peer, owed) in &mut self.owed {
            let current = self.reg.conn_id(peer);
            for (conn, msg) in owed.iter().filter(|(c, _)| Some(*c) != current) {
                let was_alive = before.get(peer).is_some_and(|&(c, alive)| c == *conn && alive);
                if was_alive && !killed.contains(conn) && !closing {
                    return Err(violation(
                        Kind::Lost,
                        format!("{msg} for live peer {peer} dropped with its connection {conn}"),
                    ));
                }
            }
            owed.retain(|(c, _)| Some(*c) == current);
        }
        self.owed.retain(|_, owed| !owed.is_empty());
        Ok(())
    }

    fn compare_state(&self) -> Result<(), Violation> {
        let Some(m) = &self.model else { return Ok(()) };
        let mismatch = |what: &str, got: &dyn fmt::Debug, want: &dyn fmt::Debug| {
            Err(violation(Kind::Mismatch, format!("{what}: registry {got:?}, model {want:?}")))
        };
        let peers: Vec<String> = m.conns.iter().map(|c| c.peer.clone()).collect();
        if self.reg.peers() != peers {
            return mismatch("peers", &self.reg.peers(), &peers);
        }
        for p in PEERS {
            let c = m.get(p);
            let got = (
                self.reg.is_registered(p),
                self.reg.is_alive(p),
                self.reg.conn_id(p),
                self.reg.direction(p),
                self.reg.monitor_endpoint(p),
            );
            let want = (
                c.is_some(),
                c.is_some_and(MConn::alive),
                c.map(|c| c.id),
                c.map(|c| c.direction),
                c.map(|c| c.monitor.as_str()),
            );
            if got != want {
                return mismatch(&format!("state of {p}"), &got, &want);
            }
        }
        if self.reg.stats() != m.stats {
            return mismatch("stats", &self.reg.stats(), &m.stats);
        }
        Ok(())
    }
}

/// Runs `ops`, then `close_all`, and checks every DEALER was closed exactly once.
fn run(t0: T0Switches, with_model: bool, ops: &[Op]) -> Result<(), Violation> {
    let mut h = Harness::new(t0, with_model);
    for (i, op) in ops.iter().chain([&Op::CloseAll]).enumerate() {
        h.step(op).map_err(|v| violation(v.kind, format!("step {i} {op:?}: {}", v.detail)))?;
    }
    for (id, d) in &h.dealers {
        if d.closes != 1 {
            return Err(violation(
                Kind::Leak,
                format!("after close_all DEALER {id} to {} closed {}x", d.peer, d.closes),
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Mainline: the registry matches the model and keeps every invariant
// ---------------------------------------------------------------------------------------

/// `ProptestConfig::default()` honours `PROPTEST_CASES`.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/proptest-regressions/p2p_registry_model.txt"
        )))),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn mainline_matches_the_model_and_keeps_the_invariants(ops in ops()) {
        run(T0Switches::default(), true, &ops).map_err(|v| TestCaseError::fail(v.to_string()))?;
    }
}

#[test]
fn mainline_scenarios() {
    let scenarios: Vec<Vec<Op>> = vec![
        // S1: connect after mark_dead retires the dead registration.
        vec![Connect(0), MarkDead(0), Connect(0), Op::Recv(0)],
        // S2: the reconnecting peer's first message survives a dead registration.
        vec![Connect(0), MarkDead(0), Poll(vec![Msg(0, Payload::Plain(0))], vec![]), Op::Recv(0)],
        // S3/S4: repeated reconnects close each DEALER once, on fresh monitor endpoints.
        (0..5).flat_map(|_| [Connect(0), MarkDead(0), Poll(vec![], vec![])]).collect(),
        // S5 (documented out of scope): routed and killed in the same poll.
        vec![Connect(0), Poll(vec![Msg(0, Payload::Plain(0))], vec![Mon::Current(0, true)]), Op::Recv(0)],
        // Malformed senders next to a good one; close of a closed peer; stale events.
        vec![
            Connect(1),
            Op::Close(1),
            Op::Close(1),
            Poll(
                vec![
                    Inbound::Frames(0, 1),
                    Inbound::NonUtf8(0),
                    Inbound::Undecodable(0, 0),
                    Msg(6, Payload::Plain(1)),
                    Msg(5, Payload::Plain(2)),
                ],
                vec![Mon::Stale(0, true), Mon::Unknown(0)],
            ),
            Op::Recv(5),
            Op::CloseAll,
            Connect(0),
        ],
    ];
    for ops in scenarios {
        if let Err(v) = run(T0Switches::default(), true, &ops) {
            panic!("{ops:?}: {v}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// T0 switches: each race is found by the invariant it breaks
// ---------------------------------------------------------------------------------------

/// The fixed scenario violates `kind` with `t0` and passes on mainline; a seeded random
/// search of at most `cases` cases finds a violation of the same kind too.
fn assert_found(t0: T0Switches, kind: Kind, scenario: &[Op], cases: u32) {
    run(T0Switches::default(), true, scenario).unwrap_or_else(|v| panic!("mainline fails the scenario: {v}"));
    match run(t0, false, scenario) {
        Err(v) if v.kind == kind => {}
        other => panic!("{t0:?}: expected {kind:?} on {scenario:?}, got {other:?}"),
    }
    let config = Config { cases, failure_persistence: None, max_shrink_iters: 2048, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    // Cases run up to the first failure (shrinking runs the closure again afterwards).
    let (tried, found) = (Cell::new(0u32), Cell::new(false));
    let result = runner.run(&ops(), |ops| {
        if !found.get() {
            tried.set(tried.get() + 1);
        }
        run(t0, false, &ops).map_err(|v| {
            found.set(true);
            TestCaseError::fail(v.to_string())
        })
    });
    match result {
        Err(TestError::Fail(_, minimal)) => {
            let v = run(t0, false, &minimal).expect_err("the minimal case fails");
            eprintln!("{t0:?}: first violation in case {}, minimal {minimal:?}: {v}", tried.get());
            assert_eq!(v.kind, kind, "{t0:?}: minimal case {minimal:?} fails with {v}");
            run(T0Switches::default(), true, &minimal).unwrap_or_else(|v| panic!("mainline fails {minimal:?}: {v}"));
        }
        other => panic!("{t0:?}: no {kind:?} found in {cases} cases: {other:?}"),
    }
}

#[test]
fn t0_mark_dead_closes_leaks_dealers() {
    let t0 = T0Switches { mark_dead_closes: true, ..T0Switches::default() };
    assert_found(t0, Kind::Leak, &[Connect(0), MarkDead(0), Poll(vec![], vec![])], 1000);
}

#[test]
fn t0_monitor_without_seq_reuses_endpoints() {
    let t0 = T0Switches { monitor_without_seq: true, ..T0Switches::default() };
    assert_found(t0, Kind::MonitorReuse, &[Connect(0), MarkDead(0), Connect(0)], 1000);
}

#[test]
fn t0_sweep_last_loses_a_reconnecting_peers_message() {
    let t0 = T0Switches { sweep_last: true, ..T0Switches::default() };
    assert_found(t0, Kind::Lost, &[Connect(0), MarkDead(0), Poll(vec![Msg(0, Payload::Plain(0))], vec![])], 1000);
}

#[test]
fn t0_connect_refuses_any_fails_on_a_dead_registration() {
    let t0 = T0Switches { connect_refuses_any: true, ..T0Switches::default() };
    assert_found(t0, Kind::DeadConnect, &[Connect(0), MarkDead(0), Connect(0)], 1000);
}
