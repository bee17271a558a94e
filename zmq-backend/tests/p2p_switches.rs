//! The P2P regression switches on real sockets (`docs/races.md`, p2p-s1, p2p-s2, p2p-s3,
//! p2p-s6): each scenario runs over loopback libzmq through the production types
//! (`ZmqTransport` with `TransportOptions::t0`, and for S6 the `ManagerLoop` that drives
//! the core's `PeerManager`), once with the switch on, where the historical failure must
//! show, and once with it off, where it must not.
//!
//! A peer a scenario does not test is played by hand with raw sockets, so nothing but the
//! switched node decides. Every wait is on a condition with a deadline (`PATIENCE`).

mod common;

use common::PATIENCE;
use ctlplane_core::p2p::manager::{ManagerRegressions, SessionId};
use ctlplane_core::p2p::messages::{Connect, Message};
use ctlplane_core::p2p::registry::RegistryStats;
use ctlplane_core::p2p::session::{DeathReason, SessionConfig};
use ctlplane_core::p2p::value::{self, Value};
use ctlplane_core::p2p::{PeerEvent, T0Switches, TransportError};
use ctlplane_zmq::{ManagerLoop, P2pError, TransportOptions, ZmqTransport};
use rand_core::OsRng;
use std::time::{Duration, Instant};

fn options(t0: T0Switches) -> TransportOptions {
    TransportOptions { t0, ..TransportOptions::default() }
}

fn msg(kind: &str, n: i64) -> Value {
    Value::map([("type", Value::from(kind)), ("n", Value::from(n))])
}

/// The Connect a peer `peer_id` announces itself with; it matches `session()`.
fn connect_of(peer_id: &str) -> Message {
    Message::Connect(Connect {
        peer_id: peer_id.into(),
        agent_metadata: b"peer".to_vec(),
        base_addr: 0,
        num_blocks: 1,
        block_len: 4096,
        config_fingerprint: String::new(),
        hash_seed: "0".into(),
    })
}

/// A raw ROUTER on an OS-chosen loopback port, playing a peer's listening side; returns it
/// and the peer id it stands for. With `handover`, a new link under an identity the socket
/// already holds takes it over, so what the node sends on a new DEALER is read even while
/// its retired DEALER's link is still being torn down (without it, libzmq refuses the
/// newcomer for that while: p2p-s7).
fn peer_router(ctx: &zmq::Context, handover: bool) -> (zmq::Socket, String) {
    let router = ctx.socket(zmq::ROUTER).unwrap();
    router.set_linger(0).unwrap();
    router.set_rcvtimeo(i32::try_from(PATIENCE.as_millis()).unwrap()).unwrap();
    router.set_router_handover(handover).unwrap();
    router.bind("tcp://127.0.0.1:0").unwrap();
    let endpoint = router.get_last_endpoint().unwrap().unwrap();
    let id = endpoint.trim_start_matches("tcp://").to_string();
    (router, id)
}

/// The next message `router` reads (`PATIENCE` at most): the sender's identity and the
/// decoded payload.
fn recv_from(router: &zmq::Socket) -> (String, Value) {
    let frames = router.recv_multipart(0).expect("a message within the patience");
    assert_eq!(frames.len(), 2, "identity and payload");
    let identity = String::from_utf8(frames[0].clone()).expect("a UTF-8 identity");
    (identity, value::decode(&frames[1]).expect("a msgpack payload"))
}

/// Blocks until `t`'s ROUTER holds a message (a dead connection's monitor is not watched).
fn until_router_readable(t: &ZmqTransport) {
    let deadline = Instant::now() + PATIENCE;
    while !t.wait(Duration::from_millis(100)).unwrap() {
        assert!(Instant::now() < deadline, "nothing reached the ROUTER");
    }
}

// p2p-s1: `connect` on a dead registration.

/// `a` dials a peer (a raw ROUTER) and the link carries a message. `a`'s session with it
/// then dies between two polls (of a protocol error or a failed send; `session_io` marks
/// its connection dead) and `a` dials the peer again at once, before any poll swept the
/// dead registration.
struct S1 {
    a: ZmqTransport,
    peer: zmq::Socket,
    peer_id: String,
    redial: Result<(), P2pError>,
}

fn s1_redial_after_death(connect_refuses_any: bool) -> S1 {
    let ctx = zmq::Context::new();
    let (peer, peer_id) = peer_router(&ctx, true);
    let t0 = T0Switches { connect_refuses_any, ..T0Switches::default() };
    let mut a = ZmqTransport::bind_with("127.0.0.1", 0, options(t0)).unwrap();
    a.connect(&peer_id).unwrap();
    a.send(&peer_id, &msg("hello", 0)).unwrap();
    assert_eq!(recv_from(&peer), (a.local_id().to_string(), msg("hello", 0)), "the link is up");
    a.mark_dead(&peer_id);
    let redial = a.connect(&peer_id);
    S1 { a, peer, peer_id, redial }
}

#[test]
fn s1_switch_on_connect_refuses_the_dead_registration_on_real_sockets() {
    let S1 { mut a, peer: _peer, peer_id, redial } = s1_redial_after_death(true);
    let error = redial.expect_err("the switched connect refuses");
    assert!(matches!(&error, P2pError::Refused(TransportError::AlreadyExists(p)) if *p == peer_id), "{error:?}");
    // The reference's assertion, as a typed error.
    assert_eq!(error.to_string(), format!("ZmqConnection to {peer_id} already exists"));
    // The peer cannot be reached until a poll sweeps the dead registration.
    let refused = a.send(&peer_id, &msg("again", 1));
    assert!(matches!(refused, Err(P2pError::Refused(TransportError::SendOnClosed(_)))), "{refused:?}");
    assert_eq!(a.peers(), vec![peer_id.clone()], "the dead registration is still there");
    a.poll();
    a.connect(&peer_id).expect("the sweep ends the refusal");
    a.close();
}

#[test]
fn s1_switch_off_connect_retires_the_dead_registration_and_reaches_the_peer() {
    let S1 { mut a, peer, peer_id, redial } = s1_redial_after_death(false);
    redial.expect("a dead registration is retired, not an error");
    assert_eq!(a.open_dealers(), 1, "the dead DEALER is closed, a fresh one open");
    let stats = a.stats();
    assert_eq!((stats.dealers_opened, stats.dealers_closed), (2, 1));
    a.send(&peer_id, &msg("again", 1)).unwrap();
    assert_eq!(recv_from(&peer), (a.local_id().to_string(), msg("again", 1)), "sent on the new DEALER");
    a.close();
}

// p2p-s2: a reconnecting peer's first message and the dead registration.

/// `a` dials `b` (a raw ROUTER on a port of its own) and the link carries a message; `b`
/// crashes; `a`'s session with it dies between two polls and marks the connection dead.
/// `b` restarts on the same port (the production transport this time), dials `a` and
/// sends its Connect, which reaches `a`'s ROUTER before `a` polls again. What that poll
/// makes of it is returned.
struct S2 {
    accepted: Vec<String>,
    received: Vec<Value>,
    registered: bool,
    stats: RegistryStats,
}

fn s2_first_message_after_restart(sweep_last: bool) -> S2 {
    let port = common::free_ports(1);
    let b_id = format!("127.0.0.1:{port}");
    let t0 = T0Switches { sweep_last, ..T0Switches::default() };
    let mut a = ZmqTransport::bind_with("127.0.0.1", 0, options(t0)).unwrap();
    let a_id = a.local_id().to_string();
    {
        // The first `b` has a context of its own: dropping it closes the port for good.
        let ctx = zmq::Context::new();
        let first = ctx.socket(zmq::ROUTER).unwrap();
        first.set_linger(0).unwrap();
        first.set_rcvtimeo(i32::try_from(PATIENCE.as_millis()).unwrap()).unwrap();
        first.bind(&format!("tcp://{b_id}")).unwrap();
        a.connect(&b_id).unwrap();
        a.send(&b_id, &msg("hello", 0)).unwrap();
        assert_eq!(recv_from(&first), (a_id.clone(), msg("hello", 0)), "the link is up");
    }
    a.mark_dead(&b_id);
    let mut b = bind_retrying(port);
    b.connect(&a_id).unwrap();
    b.send(&a_id, &connect_of(&b_id).to_value()).unwrap();
    until_router_readable(&a);
    let accepted = a.poll();
    let received = a.recv(&b_id);
    let outcome = S2 { accepted, received, registered: a.peers().contains(&b_id), stats: a.stats() };
    b.close();
    a.close();
    outcome
}

/// The production transport on `port`, retried while the port is still being released.
fn bind_retrying(port: u16) -> ZmqTransport {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match ZmqTransport::bind("127.0.0.1", port) {
            Ok(t) => return t,
            Err(e) => assert!(Instant::now() < deadline, "cannot bind port {port} again: {e}"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn s2_switch_on_the_restarted_peers_connect_is_swept_with_the_dead_registration() {
    let s = s2_first_message_after_restart(true);
    assert!(s.accepted.is_empty(), "the Connect was routed into the dead registration: {:?}", s.accepted);
    assert!(s.received.is_empty(), "nothing reached the restarted peer's connection");
    assert!(!s.registered, "swept at the end of the poll");
    assert_eq!(s.stats.messages_lost_in_sweep, 1, "the Connect went with the dead connection");
}

#[test]
fn s2_switch_off_the_restarted_peers_connect_lands_in_a_fresh_connection() {
    let s = s2_first_message_after_restart(false);
    let b_id = s.accepted.first().cloned().expect("the restarted peer is accepted");
    assert_eq!(s.accepted.len(), 1);
    assert_eq!(s.received, vec![connect_of(&b_id).to_value()], "its Connect is in the new buffer");
    assert!(s.registered);
    assert_eq!(s.stats.messages_lost_in_sweep, 0);
}

// p2p-s3: `mark_dead` and `close`.

/// Established TCP connections to `127.0.0.1:port`, from the kernel's table: one per
/// DEALER of ours that is still connected to the peer listening there (nothing else dials
/// that OS-chosen port).
fn established_to(port: u16) -> usize {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter(|line| {
            // `sl local rem st ...`; addresses are `%08X:%04X`, the IPv4 address in host
            // byte order.
            let fields: Vec<&str> = line.split_whitespace().collect();
            let remote = fields.get(2).and_then(|a| a.split_once(':'));
            let to_peer = remote.is_some_and(|(addr, p)| {
                matches!(addr, "0100007F" | "7F000001") && u16::from_str_radix(p, 16) == Ok(port)
            });
            to_peer && fields.get(3) == Some(&"01")
        })
        .count()
}

/// Waits until `established_to(port) == want`; false if it never settles there.
fn settles_at(port: u16, want: usize) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while established_to(port) != want {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

const S3_CYCLES: usize = 4;

/// `a` dials a listening peer, sends it a message, its session dies and marks the
/// connection dead, and the next poll sweeps it: `S3_CYCLES` times. Returns `a` and the
/// peer's port.
fn s3_dial_and_die(mark_dead_closes: bool) -> (ZmqTransport, zmq::Socket, u16) {
    let ctx = zmq::Context::new();
    let (peer, peer_id) = peer_router(&ctx, false);
    let port = peer_id.rsplit_once(':').and_then(|(_, p)| p.parse().ok()).unwrap();
    let t0 = T0Switches { mark_dead_closes, ..T0Switches::default() };
    let mut a = ZmqTransport::bind_with("127.0.0.1", 0, options(t0)).unwrap();
    for n in 0..S3_CYCLES {
        a.connect(&peer_id).unwrap();
        a.send(&peer_id, &msg("hello", i64::try_from(n).unwrap())).unwrap();
        a.mark_dead(&peer_id);
        a.poll();
        assert!(a.peers().is_empty(), "the dead connection is swept");
    }
    (a, peer, port)
}

#[test]
fn s3_switch_on_every_dead_connection_leaks_its_dealer_on_real_sockets() {
    let (mut a, _peer, port) = s3_dial_and_die(true);
    assert_eq!(a.open_dealers(), S3_CYCLES, "no swept DEALER was closed");
    let stats = a.stats();
    assert_eq!((stats.dealers_opened, stats.dealers_closed), (S3_CYCLES as u64, 0));
    assert!(
        settles_at(port, S3_CYCLES),
        "each leaked DEALER keeps its link to the peer: {} established",
        established_to(port)
    );
    // Closing the transport is the only way left to release them.
    a.close();
    assert_eq!(a.open_dealers(), 0);
    assert!(settles_at(port, 0), "{} links outlived the transport", established_to(port));
}

#[test]
fn s3_switch_off_every_dead_connection_is_closed_when_swept() {
    let (mut a, _peer, port) = s3_dial_and_die(false);
    assert_eq!(a.open_dealers(), 0);
    let stats = a.stats();
    assert_eq!((stats.dealers_opened, stats.dealers_closed), (S3_CYCLES as u64, S3_CYCLES as u64));
    assert!(settles_at(port, 0), "{} links to the peer are still up", established_to(port));
    a.close();
}

// p2p-s6: a replacement accepted while the dead session is not reaped yet.

fn session() -> SessionConfig {
    SessionConfig {
        local_id: String::new(),
        agent_metadata: b"node".to_vec(),
        base_addr: 0,
        num_blocks: 1,
        block_len: 4096,
        config_fingerprint: String::new(),
        hash_seed: "0".into(),
        handshake_timeout: None,
        silent_connect_rejection: false,
    }
}

fn events(node: &mut ManagerLoop) -> Vec<PeerEvent> {
    std::iter::from_fn(|| node.poll_event()).collect()
}

/// Turns `node` until `want` picks an event (`PATIENCE` at most).
fn until<T>(node: &mut ManagerLoop, what: &str, mut want: impl FnMut(&PeerEvent) -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    let mut seen = Vec::new();
    loop {
        node.turn(Duration::from_millis(20)).unwrap();
        for event in events(node) {
            if let Some(v) = want(&event) {
                return v;
            }
            seen.push(event);
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}; seen: {seen:?}");
    }
}

/// A production `ManagerLoop` and a peer `b` played by hand: `b`'s DEALER dials the node
/// and the pair handshakes, while `b`'s ROUTER never reads what the node sends. The node's
/// application then sends `b` lookups until the queue to it is full: the session dies of
/// the failed send inside that call, between two manager ticks, and marks its connection
/// dead. `b` announces a new session with a fresh Connect before the node's next turn (on
/// its existing link: a restarted process would bring a new link under the same
/// identity, which libzmq's ROUTER may refuse while the old one lingers, p2p-s7). The
/// events of that turn are returned.
struct S6 {
    node: ManagerLoop,
    b_dealer: zmq::Socket,
    _b_router: zmq::Socket,
    b_id: String,
    old: SessionId,
    turn: Vec<PeerEvent>,
}

fn s6_replacement_before_reap(s6_accept_before_reap: bool) -> S6 {
    let regressions = ManagerRegressions { s6_accept_before_reap, ..Default::default() };
    let mut node =
        ManagerLoop::bind_with("127.0.0.1", 0, TransportOptions::default(), session(), regressions, OsRng).unwrap();
    let ctx = zmq::Context::new();
    // `b` stops reading from the start; a tiny inbound queue makes the node's fill quickly.
    let b_router = ctx.socket(zmq::ROUTER).unwrap();
    b_router.set_linger(0).unwrap();
    b_router.set_rcvhwm(1).unwrap();
    b_router.set_rcvbuf(4096).unwrap();
    b_router.bind("tcp://127.0.0.1:0").unwrap();
    let b_id = b_router.get_last_endpoint().unwrap().unwrap().trim_start_matches("tcp://").to_string();
    let b_dealer = ctx.socket(zmq::DEALER).unwrap();
    b_dealer.set_linger(0).unwrap();
    b_dealer.set_identity(b_id.as_bytes()).unwrap();
    b_dealer.connect(&format!("tcp://{}", node.local_id())).unwrap();
    let send = |m: &Message| b_dealer.send(value::encode(&m.to_value()), 0).unwrap();

    // W1: b's Connect and its Ack of ours (b needs nothing from ours to answer it).
    send(&connect_of(&b_id));
    send(&Message::ConnectAck { peer_id: b_id.clone() });
    let old = until(&mut node, "the handshake", |e| match e {
        PeerEvent::Ready { peer, session } if *peer == b_id => Some(*session),
        _ => None,
    });

    let lookup = Message::Lookup { kv_request_id: "kv".into(), keys: vec![vec![7; 4096]], round_seq: 0 };
    let deadline = Instant::now() + PATIENCE;
    let mut sent = 0u64;
    while node.manager().is_alive(&b_id) {
        node.send(&b_id, lookup.clone()).unwrap();
        sent += 1;
        assert!(Instant::now() < deadline, "the queue to b never filled ({sent} lookups)");
    }
    let full = format!("ZmqConnection: send queue to {b_id} is full");
    let died = events(&mut node);
    assert!(died.contains(&PeerEvent::SendFailed { peer: b_id.clone(), error: full.clone() }), "{died:?}");
    let down = PeerEvent::Down { peer: b_id.clone(), session: old, reason: DeathReason::SendFailed(full) };
    assert!(died.contains(&down), "{died:?}");
    assert_eq!(node.manager().session_id(&b_id), Some(old), "dead, not reaped before the next tick");

    send(&connect_of(&b_id));
    // Nothing else wakes the node: its only connection is dead and no deadline is set, so
    // this turn starts once the Connect is in the ROUTER.
    node.turn(PATIENCE).unwrap();
    let turn = events(&mut node);
    S6 { node, b_dealer, _b_router: b_router, b_id, old, turn }
}

#[test]
fn s6_switch_on_the_replacement_is_refused_as_a_duplicate_and_its_connect_lost() {
    let S6 { mut node, b_dealer: _b_dealer, _b_router, b_id, old, turn } = s6_replacement_before_reap(true);
    let refused = PeerEvent::DuplicateRefused { peer: b_id.clone(), holder: old };
    assert!(turn.contains(&refused), "{turn:?}");
    assert!(
        !turn.iter().any(|e| matches!(e, PeerEvent::Accepted { .. } | PeerEvent::PeerConnected { .. })),
        "{turn:?}"
    );
    assert!(turn.contains(&PeerEvent::Reaped { peer: b_id.clone(), session: old }), "reaped after admission");
    assert_eq!(node.manager().session_id(&b_id), None, "nobody holds b: its Connect goes unanswered");
    // The next poll sweeps the refused connection with the Connect in its buffer.
    node.turn(Duration::ZERO).unwrap();
    assert_eq!(node.manager().registry().stats().messages_lost_in_sweep, 1);
    assert_eq!(node.manager().session_id(&b_id), None);
    node.close();
}

#[test]
fn s6_switch_off_the_replacement_replaces_the_dead_session_and_handshakes() {
    let S6 { mut node, b_dealer, _b_router, b_id, old, turn } = s6_replacement_before_reap(false);
    let reaped = turn.iter().position(|e| *e == PeerEvent::Reaped { peer: b_id.clone(), session: old });
    let (at, new) = turn
        .iter()
        .enumerate()
        .find_map(|(i, e)| match e {
            PeerEvent::Accepted { peer, session, .. } if *peer == b_id => Some((i, *session)),
            _ => None,
        })
        .unwrap_or_else(|| panic!("the replacement is admitted: {turn:?}"));
    assert!(reaped.is_some_and(|r| r < at), "the dead session is reaped first: {turn:?}");
    assert_ne!(new, old);
    assert!(
        turn.iter().any(|e| matches!(e, PeerEvent::PeerConnected { peer, session, connect }
            if *peer == b_id && *session == new && connect.peer_id == b_id)),
        "its Connect reached the new session: {turn:?}"
    );
    b_dealer.send(value::encode(&Message::ConnectAck { peer_id: b_id.clone() }.to_value()), 0).unwrap();
    until(&mut node, "the new handshake", |e| match e {
        PeerEvent::Ready { peer, session } if *peer == b_id && *session == new => Some(()),
        _ => None,
    });
    assert_eq!(node.manager().registry().stats().messages_lost_in_sweep, 0);
    node.close();
}
