//! `ConnectionRegistry` fed arbitrary poll inputs (ROUTER frames, identities, monitor
//! events) mixed with connects, sends, kills and closes. A driver model carries out the
//! actions and checks what production relies on: every DEALER opened is closed at most
//! once, handles are never reused, open DEALERs never exceed the peer bound, after a
//! poll every registered connection is alive, and (with the strict peer check) a peer is
//! accepted only from a connection whose source is the host its identity names.
//! Each message comes from the host its identity names, from another host, or from an
//! unknown source.

#![no_main]

use arbitrary::Arbitrary;
use ctlplane_core::p2p::registry::MAX_CONTROL_MESSAGE_BYTES;
use ctlplane_core::p2p::value::{self, Value};
use ctlplane_core::p2p::{Action, ConnectionRegistry, MonitorEvent, PeerCheck, PeerCheckMode, PollInput, RegistryConfig};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;

#[derive(Arbitrary, Debug)]
enum Identity {
    Peer(u8),
    Raw(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
enum Payload {
    /// A small valid msgpack map.
    Valid(u8),
    Raw(Vec<u8>),
    /// One byte over the configured limit.
    Oversize,
}

/// Where a message's connection comes from.
#[derive(Arbitrary, Debug)]
enum Source {
    /// The host its identity names.
    Genuine,
    /// Another host (never one `peer` names).
    Other(u8),
    /// The driver could not tell.
    Unknown,
}

#[derive(Arbitrary, Debug)]
enum Message {
    Pair(Identity, Payload, Source),
    Frames(Vec<Vec<u8>>),
}

#[derive(Arbitrary, Debug)]
enum Step {
    Connect(u8),
    ConnectRaw(String),
    MarkDead(u8),
    Close(u8),
    Send(u8, u8),
    Recv(u8),
    Poll { router: Vec<Message>, monitor: Vec<(u8, u16)> },
    CloseAll,
}

#[derive(Arbitrary, Debug)]
struct Input {
    max_peers: Option<u8>,
    limit: Option<u8>,
    /// The reference's behaviour: every identity trusted.
    check_off: bool,
    steps: Vec<Step>,
}

fn peer(n: u8) -> String {
    if n % 16 == 15 {
        // Not host:port: refused, never registered.
        return format!("peer{n}");
    }
    format!("10.0.0.{}:{}", n % 4, 5710 + u16::from(n % 3))
}

fn host_of(identity: &[u8]) -> Option<&str> {
    std::str::from_utf8(identity).ok()?.rsplit_once(':').map(|(h, _)| h)
}

fn small(n: u8) -> Value {
    Value::map([("type", Value::from("lookup")), ("round_seq", Value::from(u64::from(n)))])
}

#[derive(Default)]
struct Driver {
    opened: BTreeSet<u64>,
    closed: BTreeSet<u64>,
}

impl Driver {
    fn carry_out(&mut self, reg: &mut ConnectionRegistry) {
        while let Some(action) = reg.poll_action() {
            match action {
                Action::OpenDealer { conn, identity, .. } => {
                    assert!(self.opened.insert(conn), "handle {conn} reused");
                    assert_eq!(identity, reg.config().local_id);
                }
                Action::CloseDealer { conn, .. } => {
                    assert!(self.opened.contains(&conn), "close of never-opened {conn}");
                    assert!(self.closed.insert(conn), "{conn} closed twice");
                }
                Action::Transmit { conn, frame } => {
                    assert!(self.opened.contains(&conn) && !self.closed.contains(&conn), "send on {conn}");
                    if let Some(limit) = reg.config().max_message_bytes {
                        assert!(frame.len() <= limit);
                    }
                    assert!(value::decode(&frame).is_ok(), "transmitted frame does not decode");
                }
            }
        }
        if let Some(limit) = reg.config().max_peers {
            let open = self.opened.len() - self.closed.len();
            assert!(open <= limit, "{open} DEALERs open, bound {limit}");
        }
    }
}

fuzz_target!(|input: Input| {
    let mut config = RegistryConfig::new("127.0.0.1:5700");
    config.max_peers = input.max_peers.map(|n| usize::from(n % 6));
    // A small frame limit so that short inputs reach it; T2's default otherwise.
    config.max_message_bytes = input.limit.map(|n| if n == 0 { MAX_CONTROL_MESSAGE_BYTES } else { usize::from(n) });
    if input.check_off {
        config.peer_check = PeerCheck::off();
    }
    let strict = config.peer_check.mode == PeerCheckMode::Strict && config.peer_check.allow.is_empty();
    let mut reg = ConnectionRegistry::new(config);
    let mut driver = Driver::default();
    for step in input.steps.iter().take(128) {
        match step {
            Step::Connect(n) => {
                let _ = reg.connect(&peer(*n));
            }
            Step::ConnectRaw(p) => {
                let _ = reg.connect(p);
            }
            Step::MarkDead(n) => reg.mark_dead(&peer(*n)),
            Step::Close(n) => reg.close(&peer(*n)),
            Step::Send(n, m) => {
                let _ = reg.send(&peer(*n), &small(*m));
            }
            Step::Recv(n) => {
                let _ = reg.recv(&peer(*n));
            }
            Step::Poll { router, monitor } => {
                let limit = reg.config().max_message_bytes.unwrap_or(64);
                let (router, sources): (Vec<Vec<Vec<u8>>>, Vec<Option<String>>) = router
                    .iter()
                    .take(64)
                    .map(|m| match m {
                        Message::Pair(id, payload, source) => {
                            let id = match id {
                                Identity::Peer(n) => peer(*n).into_bytes(),
                                Identity::Raw(b) => b.clone(),
                            };
                            let payload = match payload {
                                Payload::Valid(n) => value::encode(&small(*n)),
                                Payload::Raw(b) => b.clone(),
                                Payload::Oversize => vec![0xc0; limit.min(4096) + 1],
                            };
                            let source = match source {
                                Source::Genuine => host_of(&id).map(str::to_string),
                                Source::Other(n) => Some(format!("10.0.1.{n}")),
                                Source::Unknown => None,
                            };
                            (vec![id, payload], source)
                        }
                        Message::Frames(frames) => (frames.clone(), None),
                    })
                    .unzip();
                // (identity, source) pairs that may make a peer accepted under the strict check.
                let genuine: BTreeSet<Vec<u8>> = router
                    .iter()
                    .zip(&sources)
                    .filter(|(m, s)| {
                        m.first().and_then(|id| host_of(id)).is_some_and(|h| s.as_deref() == Some(h))
                    })
                    .filter_map(|(m, _)| m.first().cloned())
                    .collect();
                let conns: Vec<u64> = driver.opened.iter().copied().collect();
                let monitor = monitor
                    .iter()
                    .take(16)
                    .map(|&(c, e)| {
                        let conn = conns.get(usize::from(c)).copied().unwrap_or(u64::from(c));
                        let event = if e % 2 == 0 { MonitorEvent::Disconnected } else { MonitorEvent::Other(e) };
                        (conn, event)
                    })
                    .collect();
                let accepted = reg.poll(PollInput { router, sources, monitor });
                if strict {
                    for p in &accepted {
                        assert!(genuine.contains(p.as_bytes()), "{p} accepted without a message from its own host");
                    }
                }
                let unique: BTreeSet<&String> = accepted.iter().collect();
                assert_eq!(unique.len(), accepted.len(), "a peer accepted twice in one poll");
                for p in &accepted {
                    assert!(reg.is_alive(p), "accepted {p} is not alive");
                }
                for (p, _, alive) in reg.connections() {
                    assert!(alive, "{p} is registered dead after a poll");
                }
            }
            Step::CloseAll => reg.close_all(),
        }
        driver.carry_out(&mut reg);
        let peers = reg.peers();
        let unique: BTreeSet<&String> = peers.iter().collect();
        assert_eq!(unique.len(), peers.len(), "duplicate registration");
        if let Some(limit) = reg.config().max_peers {
            assert!(peers.len() <= limit, "{} peers registered, bound {limit}", peers.len());
        }
    }
    reg.close_all();
    driver.carry_out(&mut reg);
    assert_eq!(driver.opened, driver.closed, "DEALERs left open after close_all");
});
