//! The production manager loop (`ManagerLoop`, the core's `PeerManager` over libzmq)
//! against `ctlplane p2p echo --w1`: the handshake, role messages echoed on their session,
//! and a restarted peer noticed, reaped and handshaken again.

mod common;

use common::Proc;
use ctlplane_core::p2p::messages::Message;
use ctlplane_core::p2p::session::SessionConfig;
use ctlplane_core::p2p::PeerEvent;
use ctlplane_zmq::{ManagerLoop, TransportOptions};
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");

fn session() -> SessionConfig {
    SessionConfig {
        local_id: String::new(),
        agent_metadata: b"test".to_vec(),
        base_addr: 0,
        num_blocks: 1,
        block_len: 4096,
        config_fingerprint: String::new(),
        hash_seed: "0".into(),
        handshake_timeout: Some(Duration::from_secs(5)),
        silent_connect_rejection: false,
    }
}

fn echo(port: u16) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.args(["p2p", "echo", "--w1", "--port", &port.to_string()]);
    let proc = Proc::spawn(cmd);
    proc.wait_ready();
    proc
}

/// Turns `node` until `want` picks an event (15 s at most); returns what it picked and
/// every event seen up to it.
fn until<T>(node: &mut ManagerLoop, what: &str, mut want: impl FnMut(&PeerEvent) -> Option<T>) -> (T, Vec<PeerEvent>) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut seen = Vec::new();
    loop {
        node.turn(Duration::from_millis(20)).unwrap();
        while let Some(event) = node.poll_event() {
            let picked = want(&event);
            seen.push(event);
            if let Some(v) = picked {
                return (v, seen);
            }
        }
        let last = &seen[seen.len().saturating_sub(10)..];
        assert!(Instant::now() < deadline, "timed out waiting for {what}; last events: {last:?}");
    }
}

fn lookup(kv: &str) -> Message {
    Message::Lookup { kv_request_id: kv.into(), keys: vec![vec![1, 2]], round_seq: 0 }
}

/// Sends a lookup to `peer` and waits for the echo on the same session.
fn round_trip(node: &mut ManagerLoop, peer: &str, session: u64, kv: &str) {
    node.send_on(peer, session, lookup(kv)).unwrap();
    until(node, "the echoed lookup", |e| match e {
        PeerEvent::Message { session: s, message, .. } if *s == session && *message == lookup(kv) => Some(()),
        _ => None,
    });
}

#[test]
fn the_manager_loop_notices_a_restarted_peer_and_handshakes_again() {
    let port = common::free_ports(1);
    let peer = format!("127.0.0.1:{port}");
    let mut first = echo(port);
    let mut node = ManagerLoop::bind("127.0.0.1", 0, TransportOptions::default(), session()).unwrap();
    node.keep_connected(&peer);
    let (s1, _) = until(&mut node, "the handshake", |e| match e {
        PeerEvent::Ready { peer: p, session } if *p == peer => Some(*session),
        _ => None,
    });
    round_trip(&mut node, &peer, s1, "before");

    // The echo peer crashes (no Disconnect) and comes back on the same port.
    first.child.kill().unwrap();
    first.wait_exit(Duration::from_secs(5));
    let _second = echo(port);
    let (s2, seen) = until(&mut node, "a new handshake", |e| match e {
        PeerEvent::Ready { peer: p, session } if *p == peer && *session != s1 => Some(*session),
        _ => None,
    });
    let down = seen.iter().position(|e| matches!(e, PeerEvent::Down { session, .. } if *session == s1));
    let reaped = seen.iter().position(|e| matches!(e, PeerEvent::Reaped { session, .. } if *session == s1));
    assert!(down.is_some() && down < reaped, "the old session died and was reaped first: {seen:?}");
    assert_eq!(node.manager().session_id(&peer), Some(s2));
    round_trip(&mut node, &peer, s2, "after");
    assert!(node.send_on(&peer, s1, lookup("stale")).is_err(), "the old session is gone");
    node.close();
}
