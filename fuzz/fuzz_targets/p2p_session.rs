//! `HandshakeSession` dispatch fed arbitrary received payloads (raw msgpack, or W1
//! messages with fields drawn to match or mismatch the local side) mixed with sends,
//! handler outcomes, timeouts and closes. It must report death at most once and nothing
//! after it, become ready at most once, hold no queue once ready, and only ever transmit
//! valid W1 messages.

#![no_main]

use arbitrary::Arbitrary;
use ctlplane_core::p2p::messages::{Connect, Message, Parsed};
use ctlplane_core::p2p::session::{HandshakeSession, SessionConfig, SessionEvent};
use ctlplane_core::p2p::value::{self, Value};
use ctlplane_core::Instant;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

#[derive(Arbitrary, Debug)]
enum Incoming {
    Raw(Vec<u8>),
    Connect { block_len: u8, fingerprint: u8, seed: u8 },
    Ack,
    Disconnect,
    Lookup(u8),
    Fetch { keys: u8, indexes: u8 },
    Unknown,
}

#[derive(Arbitrary, Debug)]
enum Step {
    Attach,
    Receive(Incoming),
    Send(u8),
    DispatchOk,
    DispatchFailed,
    SendFailed,
    ConnectionLost,
    /// Advance the clock by this many seconds and run the timer.
    Advance(u8),
    Close,
    Drain,
}

#[derive(Arbitrary, Debug)]
struct Input {
    timeout: Option<u8>,
    silent: bool,
    steps: Vec<Step>,
}

const LOCAL_BLOCK_LEN: u64 = 256;

fn config(timeout: Option<u8>, silent: bool) -> SessionConfig {
    SessionConfig {
        local_id: "10.0.0.1:5710".into(),
        agent_metadata: vec![1, 2, 3],
        base_addr: 4096,
        num_blocks: 8,
        block_len: LOCAL_BLOCK_LEN,
        config_fingerprint: "fp".into(),
        hash_seed: "0".into(),
        handshake_timeout: timeout.map(|s| Duration::from_secs(u64::from(s))),
        silent_connect_rejection: silent,
    }
}

fn incoming(i: &Incoming) -> Option<Value> {
    let keys = |n: u8| (0..n % 4).map(|k| vec![k; 8]).collect::<Vec<_>>();
    let msg = match i {
        Incoming::Raw(b) => return value::decode(b).ok(),
        Incoming::Connect { block_len, fingerprint, seed } => Message::Connect(Connect {
            peer_id: "10.0.0.2:5710".into(),
            agent_metadata: vec![9],
            base_addr: 0,
            num_blocks: 4,
            block_len: if block_len % 4 == 0 { u64::from(*block_len) + 1 } else { LOCAL_BLOCK_LEN },
            config_fingerprint: ["", "fp", "other"][usize::from(fingerprint % 3)].into(),
            hash_seed: if seed % 4 == 0 { "1".into() } else { "0".into() },
        }),
        Incoming::Ack => Message::ConnectAck { peer_id: "10.0.0.2:5710".into() },
        Incoming::Disconnect => Message::Disconnect,
        Incoming::Lookup(n) => Message::Lookup { kv_request_id: format!("r{n}"), keys: keys(*n), round_seq: 0 },
        Incoming::Fetch { keys: k, indexes } => {
            let mut v = Message::Fetch {
                kv_request_id: "f".into(),
                keys: keys(*k),
                block_indexes: (0..u64::from(k % 4)).collect(),
                round_seq: 1,
            }
            .to_value();
            // Optionally break the keys/block_indexes pairing.
            if indexes % 3 == 0 {
                if let Value::Map(entries) = &mut v {
                    entries.retain(|(key, _)| key != "block_indexes");
                    entries.push(("block_indexes".into(), Value::Array(vec![Value::from("x")])));
                }
            }
            return Some(v);
        }
        Incoming::Unknown => return Some(Value::map([("type", Value::from("gossip"))])),
    };
    Some(msg.to_value())
}

fuzz_target!(|input: Input| {
    let mut s = HandshakeSession::new("10.0.0.2:5710", config(input.timeout, input.silent));
    let mut now = Instant::ZERO;
    let (mut dead, mut ready) = (false, false);
    for step in input.steps.iter().take(128) {
        match step {
            Step::Attach => {
                let attached = s.attach(now);
                assert!(attached.is_err() || !dead, "a dead session attached");
            }
            Step::Receive(i) => {
                if let Some(v) = incoming(i) {
                    s.handle_message(&v);
                }
            }
            Step::Send(n) => {
                let sent = s.send(Message::AbortAck { kv_request_id: format!("a{n}"), round_seq: u64::from(*n) });
                assert_eq!(sent.is_err(), dead, "send on a dead session must fail, and only then");
            }
            Step::DispatchOk => s.dispatch_ok(),
            Step::DispatchFailed => s.dispatch_failed("handler failed"),
            Step::SendFailed => s.send_failed("EHOSTUNREACH"),
            Step::ConnectionLost => s.connection_lost(),
            Step::Advance(secs) => {
                now = now + Duration::from_secs(u64::from(*secs));
                s.handle_timeout(now);
                if let Some(due) = s.poll_timeout() {
                    assert!(due > now, "timer due at {due:?} not run at {now:?}");
                }
            }
            Step::Close => s.close(),
            Step::Drain => {}
        }
        while let Some(frame) = s.poll_transmit() {
            match Message::parse(&frame) {
                Ok(Parsed::Message(_)) => {}
                other => panic!("transmitted an invalid message {frame}: {other:?}"),
            }
        }
        while let Some(event) = s.poll_event() {
            assert!(!dead, "event {event:?} after death");
            match event {
                SessionEvent::Dead(_) => dead = true,
                SessionEvent::Ready => {
                    assert!(!ready, "ready twice");
                    ready = true;
                }
                SessionEvent::PeerConnected(c) => assert_eq!(c.block_len, LOCAL_BLOCK_LEN),
                SessionEvent::Message(_) => {}
            }
        }
        assert_eq!(s.is_alive(), !dead);
        if s.is_ready() {
            assert_eq!(s.queued(), 0, "messages queued on a ready session");
        }
        if dead {
            assert_eq!(s.queued(), 0, "a dead session keeps its queue");
        }
    }
});
