//! `ZmqTransport` between Rust peers on loopback: messages both ways, sweeping and
//! reconnecting, disconnect detection, a send that never blocks, the T2 frame limit, close,
//! and the W1 handshake driven over the transport.

mod common;

use ctlplane_core::p2p::session::{HandshakeSession, SessionConfig, SessionEvent};
use ctlplane_core::p2p::{TransportError, Value};
use ctlplane_zmq::p2p::session_io;
use ctlplane_zmq::{Clock, P2pError, TransportOptions, ZmqTransport};
use std::time::{Duration, Instant};

fn bind() -> ZmqTransport {
    ZmqTransport::bind("127.0.0.1", 0).unwrap()
}

fn msg(kind: &str, n: i64) -> Value {
    Value::map([("type", Value::from(kind)), ("n", Value::from(n))])
}

/// Polls `t` until `done` holds (10 s at most), sleeping on its sockets in between.
fn poll_until(t: &mut ZmqTransport, what: &str, mut done: impl FnMut(&mut ZmqTransport, Vec<String>) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let accepted = t.poll();
        if done(t, accepted) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        t.wait(Duration::from_millis(20)).unwrap();
    }
}

#[test]
fn two_transports_exchange_messages_both_ways_in_order() {
    let (mut a, mut b) = (bind(), bind());
    let (a_id, b_id) = (a.local_id().to_string(), b.local_id().to_string());
    a.connect(&b_id).unwrap();
    for n in 0..3 {
        a.send(&b_id, &msg("ping", n)).unwrap();
    }
    let mut got = Vec::new();
    let mut accepted = Vec::new();
    poll_until(&mut b, "a's messages", |b, new| {
        accepted.extend(new);
        got.extend(b.recv(&a_id));
        got.len() == 3
    });
    assert_eq!(accepted, vec![a_id.clone()], "a is accepted exactly once");
    assert_eq!(got, (0..3).map(|n| msg("ping", n)).collect::<Vec<_>>());
    b.send(&a_id, &msg("pong", 9)).unwrap();
    let mut back = Vec::new();
    poll_until(&mut a, "b's reply", |a, new| {
        assert!(new.is_empty(), "b's reply routes into a's outbound connection");
        back.extend(a.recv(&b_id));
        !back.is_empty()
    });
    assert_eq!(back, vec![msg("pong", 9)]);
}

#[test]
fn close_twice_is_fine_and_a_closed_transport_refuses() {
    let (mut a, b) = (bind(), bind());
    a.connect(b.local_id()).unwrap();
    assert_eq!(a.open_dealers(), 1);
    a.close();
    a.close();
    assert_eq!(a.open_dealers(), 0);
    assert!(matches!(a.connect(b.local_id()), Err(P2pError::Refused(TransportError::Closed))));
    assert!(a.send(b.local_id(), &msg("x", 0)).is_err());
    assert!(a.poll().is_empty());
    assert!(!a.wait(Duration::from_millis(1)).unwrap());
}

#[test]
fn dead_connections_are_retired_and_every_reconnect_gets_fresh_sockets() {
    let (mut a, b) = (bind(), bind());
    let b_id = b.local_id().to_string();
    a.connect(&b_id).unwrap();
    assert!(matches!(a.connect(&b_id), Err(P2pError::Refused(TransportError::AlreadyExists(_)))));
    // S1 + S4: ten reconnects straight after mark_dead, each with its own monitor endpoint.
    for _ in 0..10 {
        a.mark_dead(&b_id);
        a.connect(&b_id).unwrap();
        assert_eq!(a.open_dealers(), 1);
        a.send(&b_id, &msg("hi", 1)).unwrap();
    }
    // S3: a dead connection is closed when swept, not leaked.
    a.mark_dead(&b_id);
    assert!(matches!(a.send(&b_id, &msg("x", 0)), Err(P2pError::Refused(TransportError::SendOnClosed(_)))));
    a.poll();
    assert_eq!(a.open_dealers(), 0);
    assert!(a.peers().is_empty());
    let stats = a.stats();
    assert_eq!((stats.dealers_opened, stats.dealers_closed), (11, 11));
}

#[test]
fn a_peer_that_goes_away_is_detected_and_swept() {
    let (mut a, mut b) = (bind(), bind());
    let (a_id, b_id) = (a.local_id().to_string(), b.local_id().to_string());
    a.connect(&b_id).unwrap();
    a.send(&b_id, &msg("hello", 0)).unwrap();
    poll_until(&mut b, "a accepted", |_, new| new.contains(&a_id));
    let started = Instant::now();
    b.close();
    poll_until(&mut a, "b swept", |a, _| a.peers().is_empty());
    assert!(started.elapsed() < Duration::from_secs(5), "a closed peer is seen at once, not by heartbeat");
    assert_eq!(a.open_dealers(), 0);
}

#[test]
fn sending_to_an_unreachable_peer_never_blocks() {
    let mut a = bind();
    let nowhere = format!("127.0.0.1:{}", common::free_ports(1));
    a.connect(&nowhere).unwrap();
    let started = Instant::now();
    let mut sent = 0;
    let error = loop {
        match a.send(&nowhere, &msg("queued", sent)) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 100_000, "the DEALER's queue never filled");
    };
    assert!(matches!(&error, P2pError::QueueFull { peer } if *peer == nowhere), "{error}");
    assert_eq!(error.to_string(), format!("ZmqConnection: send queue to {nowhere} is full"));
    assert_eq!(sent, 1_000, "a DEALER queues exactly its high-water mark before connecting");
    assert!(started.elapsed() < Duration::from_secs(5));
    // Nothing listens: each refused attempt reports CLOSED, which is fatal since 0.33, so
    // the connection is found dead and swept instead of holding its sockets (S10).
    poll_until(&mut a, "the refused connection swept", |a, _| a.peers().is_empty());
    assert_eq!(a.open_dealers(), 0);
}

#[test]
fn the_t2_frame_limit_refuses_oversize_sends_and_drops_links_that_carry_them() {
    let options = TransportOptions { max_message_bytes: Some(1024), ..TransportOptions::default() };
    let mut limited = ZmqTransport::bind_with("127.0.0.1", 0, options).unwrap();
    let mut open = bind();
    let (limited_id, open_id) = (limited.local_id().to_string(), open.local_id().to_string());
    let big = Value::map([("blob", Value::Bin(vec![7; 4096]))]);

    limited.connect(&open_id).unwrap();
    assert!(matches!(limited.send(&open_id, &big), Err(P2pError::Refused(TransportError::TooLarge(1024)))));
    assert_eq!(TransportOptions::default().with_t2_frame_limit().max_message_bytes, Some(64 << 20));

    // libzmq (ZMQ_MAXMSGSIZE) drops the link an oversize frame arrives on: the sender's
    // DEALER reports DISCONNECTED and the connection is swept.
    open.connect(&limited_id).unwrap();
    open.send(&limited_id, &msg("small", 1)).unwrap();
    poll_until(&mut limited, "the small message", |l, _| !l.recv(&open_id).is_empty());
    open.send(&limited_id, &big).unwrap();
    poll_until(&mut open, "the oversize link dropped", |o, _| !o.is_alive(&limited_id));
    limited.poll();
    assert!(limited.recv(&open_id).is_empty(), "the oversize frame was never delivered");
}

fn session_config(local_id: &str) -> SessionConfig {
    SessionConfig {
        local_id: local_id.to_string(),
        agent_metadata: b"agent".to_vec(),
        base_addr: 1 << 40,
        num_blocks: 16,
        block_len: 256,
        config_fingerprint: "fp-1".into(),
        hash_seed: "0".into(),
        handshake_timeout: None,
        silent_connect_rejection: false,
    }
}

#[test]
fn w1_handshake_completes_between_two_rust_sessions() {
    let clock = Clock::new();
    let (mut a, mut b) = (bind(), bind());
    let (a_id, b_id) = (a.local_id().to_string(), b.local_id().to_string());
    let mut sa = HandshakeSession::new(&b_id, session_config(&a_id));
    a.connect(&b_id).unwrap();
    sa.attach(clock.now()).unwrap();
    let mut sb: Option<HandshakeSession> = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(sa.is_ready() && sb.as_ref().is_some_and(HandshakeSession::is_ready)) {
        assert!(Instant::now() < deadline, "handshake did not complete");
        a.poll();
        session_io::drive(&mut a, &mut sa, clock.now());
        if b.poll().contains(&a_id) {
            let mut s = HandshakeSession::new(&a_id, session_config(&b_id));
            s.attach(clock.now()).unwrap();
            sb = Some(s);
        }
        if let Some(s) = &mut sb {
            session_io::drive(&mut b, s, clock.now());
        }
        a.wait(Duration::from_millis(5)).unwrap();
    }
    let events: Vec<_> = std::iter::from_fn(|| sa.poll_event()).collect();
    assert!(matches!(&events[0], SessionEvent::PeerConnected(c) if c.peer_id == b_id && c.agent_metadata == b"agent"));
    assert_eq!(events[1], SessionEvent::Ready);
}
