//! The peer check on real sockets (p2p-behaviour.md S18, `docs/peer-admission.md`): a sender that
//! names an address of its choosing as its routing identity does not make the node dial
//! it; a genuine peer on the same host and an allowlisted peer from another address are
//! served. Loopback's other addresses (127.0.0.2, ...) stand in for other hosts: libzmq's
//! `tcp://SOURCE:0;HOST:PORT` sets a DEALER's source address.

mod common;

use common::{free_ports, Proc};
use ctlplane_core::p2p::value::encode;
use ctlplane_core::p2p::{PeerCheck, PeerCheckMode, Value};
use ctlplane_zmq::{TransportOptions, ZmqTransport};
use std::io::ErrorKind;
use std::net::TcpListener;
use std::process::Command;
use std::time::{Duration, Instant};

/// How long an expected event may take on a loaded machine.
const BOUND: Duration = Duration::from_secs(10);
/// How long the node keeps polling while nothing may reach the attacker's listener.
const QUIET: Duration = Duration::from_millis(1_500);

fn msg(kind: &str) -> Value {
    Value::map([("type", Value::from(kind))])
}

fn node(peer_check: PeerCheck) -> ZmqTransport {
    ZmqTransport::bind_with("127.0.0.1", 0, TransportOptions { peer_check, ..TransportOptions::default() }).unwrap()
}

/// A raw DEALER with routing identity `identity`, connected to `port` on 127.0.0.1 from
/// `source`, that has sent one well-formed message.
fn forged_sender(ctx: &zmq::Context, identity: &str, source: &str, port: u16) -> zmq::Socket {
    let dealer = ctx.socket(zmq::DEALER).unwrap();
    dealer.set_linger(0).unwrap();
    dealer.set_identity(identity.as_bytes()).unwrap();
    dealer.connect(&format!("tcp://{source}:0;127.0.0.1:{port}")).unwrap();
    dealer.send(encode(&msg("connect")), 0).unwrap();
    dealer
}

/// Polls `t` until `done` holds, at most [`BOUND`].
fn poll_until(t: &mut ZmqTransport, what: &str, mut done: impl FnMut(&mut ZmqTransport, Vec<String>) -> bool) {
    let deadline = Instant::now() + BOUND;
    loop {
        let accepted = t.poll();
        if done(t, accepted) {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        t.wait(Duration::from_millis(20)).unwrap();
    }
}

/// Polls `t` for `wait`, or until `listener` accepts a connection; whether it did.
fn listener_dialled(t: &mut ZmqTransport, listener: &TcpListener, wait: Duration) -> bool {
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        t.poll();
        match listener.accept() {
            Ok(_) => return true,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => panic!("listener: {e}"),
        }
        t.wait(Duration::from_millis(20)).unwrap();
    }
    false
}

/// The attacker's listener on another loopback address than the attacker's own.
fn attacker_listener() -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.3:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let target = format!("127.0.0.3:{}", listener.local_addr().unwrap().port());
    (listener, target)
}

#[test]
fn a_dial_back_to_an_address_of_the_senders_choosing_is_refused_and_counted() {
    let ctx = zmq::Context::new();
    let mut node = node(PeerCheck::default());
    let (listener, target) = attacker_listener();
    let _attacker = forged_sender(&ctx, &target, "127.0.0.1", node.port());
    poll_until(&mut node, "the forged message", |n, accepted| {
        assert!(accepted.is_empty(), "a forged identity is never accepted");
        n.stats().messages_refused == 1
    });
    assert!(!listener_dialled(&mut node, &listener, QUIET), "the node dialled {target}");
    assert_eq!(node.open_dealers(), 0);
    assert!(node.peers().is_empty());
    assert_eq!(node.stats().messages_refused, 1);
    assert_eq!(node.stats().dealers_opened, 0);

    // The same message with the check off (the reference's behaviour) reaches the
    // attacker's listener: the wait above would have seen it.
    let mut trusting = node_trusting();
    let (listener, target) = attacker_listener();
    let _attacker = forged_sender(&ctx, &target, "127.0.0.1", trusting.port());
    assert!(listener_dialled(&mut trusting, &listener, BOUND), "with the check off, {target} is dialled");
    assert_eq!(trusting.stats().messages_refused, 0);
}

fn node_trusting() -> ZmqTransport {
    node(PeerCheck { mode: PeerCheckMode::Off, allow: Vec::new() })
}

#[test]
fn a_genuine_peer_on_the_same_host_is_served() {
    let mut node = node(PeerCheck::default());
    let mut peer = ZmqTransport::bind("127.0.0.1", 0).unwrap();
    let (node_id, peer_id) = (node.local_id().to_string(), peer.local_id().to_string());
    peer.connect(&node_id).unwrap();
    peer.send(&node_id, &msg("hello")).unwrap();
    let mut got = Vec::new();
    poll_until(&mut node, "the peer's message", |n, _| {
        got.extend(n.recv(&peer_id));
        !got.is_empty()
    });
    assert_eq!(got, vec![msg("hello")]);
    node.send(&peer_id, &msg("back")).unwrap();
    let mut back = Vec::new();
    poll_until(&mut peer, "the node's reply", |p, _| {
        back.extend(p.recv(&node_id));
        !back.is_empty()
    });
    assert_eq!(back, vec![msg("back")]);
    assert_eq!(node.stats().messages_refused, 0);
}

#[test]
fn an_allowlisted_peer_from_another_address_is_served() {
    let ctx = zmq::Context::new();
    // The peer's ROUTER, where the node dials back, on 127.0.0.5; its DEALER reaches the
    // node from 127.0.0.2 (a NATed or multi-homed peer).
    let router = ctx.socket(zmq::ROUTER).unwrap();
    router.set_linger(0).unwrap();
    router.set_rcvtimeo(100).unwrap();
    router.bind("tcp://127.0.0.5:0").unwrap();
    let last = router.get_last_endpoint().unwrap().unwrap();
    let peer_id = last.trim_start_matches("tcp://").to_string();
    let allow = vec![peer_id.parse().unwrap()];
    let mut node = node(PeerCheck { mode: PeerCheckMode::Strict, allow });
    let _dealer = forged_sender(&ctx, &peer_id, "127.0.0.2", node.port());
    // Another identity from the same address is not on the list.
    let (listener, stranger) = attacker_listener();
    let _stranger = forged_sender(&ctx, &stranger, "127.0.0.2", node.port());
    let mut got = Vec::new();
    poll_until(&mut node, "the allowlisted peer's message", |n, _| {
        got.extend(n.recv(&peer_id));
        !got.is_empty() && n.stats().messages_refused == 1
    });
    assert_eq!(got, vec![msg("connect")]);
    assert_eq!(node.peers(), vec![peer_id.clone()]);
    node.send(&peer_id, &msg("served")).unwrap();
    let deadline = Instant::now() + BOUND;
    let frames = loop {
        node.poll();
        match router.recv_multipart(0) {
            Ok(frames) => break frames,
            Err(zmq::Error::EAGAIN) => assert!(Instant::now() < deadline, "the node's reply never came"),
            Err(e) => panic!("router: {e}"),
        }
    };
    assert_eq!(frames, vec![node.local_id().as_bytes().to_vec(), encode(&msg("served"))]);
    assert!(!listener_dialled(&mut node, &listener, QUIET), "the node dialled {stranger}");
}

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");

#[test]
fn ctlplane_p2p_echo_refuses_the_dial_back_by_default_and_serves_a_genuine_peer() {
    let ctx = zmq::Context::new();
    let port = free_ports(1);
    let mut echo = Command::new(BIN);
    echo.args(["p2p", "echo", "--port", &port.to_string()]);
    let mut echo = Proc::spawn(echo);
    echo.wait_ready();
    let (listener, target) = attacker_listener();
    let _attacker = forged_sender(&ctx, &target, "127.0.0.1", port);
    // The echo handles messages in arrival order: once a genuine peer's echo is back, the
    // forged message before it was handled too.
    let mut peer = ZmqTransport::bind("127.0.0.1", 0).unwrap();
    let echo_id = format!("127.0.0.1:{port}");
    peer.connect(&echo_id).unwrap();
    peer.send(&echo_id, &msg("genuine")).unwrap();
    let mut back = Vec::new();
    poll_until(&mut peer, "the echo", |p, _| {
        back.extend(p.recv(&echo_id));
        !back.is_empty()
    });
    assert_eq!(back, vec![msg("genuine")]);
    assert!(!listener_dialled(&mut peer, &listener, QUIET), "ctlplane p2p echo dialled {target}");
    echo.signal("-TERM");
    assert!(echo.wait_exit(BOUND).success());
    let stderr = plain(&echo.stderr());
    let warning = format!("refusing inbound peer: it will not be dialled back peer={target}");
    assert_eq!(stderr.matches(&warning).count(), 1, "one warning naming {target}:\n{stderr}");
    assert!(stderr.contains("refused=1"), "{stderr}");
}

#[test]
fn ctlplane_p2p_rejects_unknown_peer_checks_and_bad_allowlist_entries() {
    for (args, error) in [
        (["--peer-check", "on"], "expected strict, allowlist or off"),
        (["--peer-allow", "10.0.0.0/33"], "expected host:port or address/prefix"),
    ] {
        let out = Command::new(BIN).args(["p2p", "echo", "--port", "1"]).args(args).output().unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(error), "{stderr}");
    }
}

/// `text` without ANSI colour sequences (`ESC [ ... m`).
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
