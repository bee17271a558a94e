//! A peer that stops reading, on real sockets: the node sending to it never blocks, its
//! session with that peer dies of the full-queue error, its other peers are served all the
//! while, and the pair handshakes again once the peer reads again
//! (`docs/p2p-behaviour.md`).

use ctlplane_core::p2p::messages::Message;
use ctlplane_core::p2p::session::{DeathReason, HandshakeSession, SessionConfig, SessionEvent};
use ctlplane_core::Instant as CoreInstant;
use ctlplane_zmq::p2p::session_io;
use ctlplane_zmq::ZmqTransport;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A node: a transport and the sessions a minimal manager keeps on it.
struct Node {
    t: ZmqTransport,
    started: Instant,
    sessions: BTreeMap<String, HandshakeSession>,
    deaths: Vec<(String, DeathReason)>,
    readies: BTreeMap<String, u32>,
    lookups_in: u64,
    responses: u64,
    next_kv: u64,
}

impl Node {
    fn new() -> Node {
        Node {
            t: ZmqTransport::bind("127.0.0.1", 0).expect("bind"),
            started: Instant::now(),
            sessions: BTreeMap::new(),
            deaths: Vec::new(),
            readies: BTreeMap::new(),
            lookups_in: 0,
            responses: 0,
            next_kv: 0,
        }
    }

    fn id(&self) -> String {
        self.t.local_id().to_string()
    }

    fn now(&self) -> CoreInstant {
        CoreInstant::ZERO + self.started.elapsed()
    }

    fn session(&self, peer: &str) -> HandshakeSession {
        let config = SessionConfig {
            local_id: self.id(),
            agent_metadata: vec![1],
            base_addr: 0x1000,
            num_blocks: 16,
            block_len: 4096,
            config_fingerprint: String::new(),
            hash_seed: "0".into(),
            handshake_timeout: Some(Duration::from_secs(5)),
            silent_connect_rejection: false,
        };
        let mut s = HandshakeSession::new(peer, config);
        s.attach(self.now()).expect("a new session attaches");
        s
    }

    /// An outbound connection and session to `peer`; false if the transport refused.
    fn connect(&mut self, peer: &str) -> bool {
        if self.t.connect(peer).is_err() {
            return false;
        }
        let mut s = self.session(peer);
        session_io::flush(&mut self.t, &mut s);
        self.sessions.insert(peer.to_string(), s);
        true
    }

    fn ready(&self, peer: &str) -> bool {
        self.sessions.get(peer).is_some_and(HandshakeSession::is_ready)
    }

    /// Queues a lookup carrying a key of `key_bytes` on `peer`'s ready session.
    fn lookup(&mut self, peer: &str, key_bytes: usize) {
        let kv_request_id = format!("kv-{}", self.next_kv);
        self.next_kv += 1;
        if let Some(s) = self.sessions.get_mut(peer).filter(|s| s.is_ready()) {
            let _ = s.send(Message::Lookup { kv_request_id, keys: vec![vec![7; key_bytes]], round_seq: 0 });
        }
    }

    /// One manager tick: poll, accept (a newcomer replaces any session held for it),
    /// drive every session, answer lookups, reap the dead.
    fn tick(&mut self) {
        let now = self.now();
        for peer in self.t.poll() {
            let s = self.session(&peer);
            self.sessions.insert(peer, s);
        }
        let peers: Vec<String> = self.sessions.keys().cloned().collect();
        for peer in peers {
            let Some(s) = self.sessions.get_mut(&peer) else { continue };
            session_io::drive(&mut self.t, s, now);
            while let Some(event) = s.poll_event() {
                match event {
                    SessionEvent::Ready => *self.readies.entry(peer.clone()).or_default() += 1,
                    SessionEvent::Message(Message::Lookup { kv_request_id, .. }) => {
                        self.lookups_in += 1;
                        let _ = s.send(Message::LookupResp { kv_request_id, keys: vec![], hits: vec![] });
                        s.dispatch_ok();
                    }
                    SessionEvent::Message(_) => {
                        self.responses += 1;
                        s.dispatch_ok();
                    }
                    SessionEvent::Dead(reason) => self.deaths.push((peer.clone(), reason)),
                    SessionEvent::PeerConnected(_) => {}
                }
            }
            session_io::flush(&mut self.t, s);
            if !s.is_alive() {
                self.t.mark_dead(&peer);
                self.sessions.remove(&peer);
            }
        }
    }
}

fn until(what: &str, limit: Duration, mut step: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !step() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn a_peer_that_stops_reading_costs_only_its_own_session() {
    let (mut n, mut p, mut q) = (Node::new(), Node::new(), Node::new());
    let (n_id, p_id, q_id) = (n.id(), p.id(), q.id());
    assert!(n.connect(&p_id) && n.connect(&q_id));
    until("both handshakes", Duration::from_secs(20), || {
        n.tick();
        p.tick();
        q.tick();
        n.ready(&p_id) && n.ready(&q_id) && p.ready(&n_id) && q.ready(&n_id)
    });

    // P stops reading. N keeps sending it lookups of 16 KiB; Q keeps asking N.
    let mut slowest = Duration::ZERO;
    until("the full-queue error", Duration::from_secs(30), || {
        for _ in 0..50 {
            n.lookup(&p_id, 16 * 1024);
        }
        q.lookup(&n_id, 8);
        let tick = Instant::now();
        n.tick();
        slowest = slowest.max(tick.elapsed());
        q.tick();
        n.deaths.iter().any(|(peer, _)| *peer == p_id)
    });
    let (_, reason) = n.deaths.iter().find(|(peer, _)| *peer == p_id).expect("P's session died").clone();
    let full = format!("ZmqConnection: send queue to {p_id} is full");
    assert_eq!(reason, DeathReason::SendFailed(full));
    // A blocking send would hold the tick until P reads again; a loaded machine may still
    // be slow, so the bound is loose.
    assert!(slowest < Duration::from_secs(5), "a send blocked the node for {slowest:?}");
    // Q was served while P's queue filled, and still is.
    let served = q.responses;
    until("Q served while P is stopped", Duration::from_secs(20), || {
        q.lookup(&n_id, 8);
        n.tick();
        q.tick();
        q.responses >= served + 20
    });
    assert!(served > 0, "Q got answers while N filled P's queue");
    assert!(n.ready(&q_id), "Q's session is untouched");

    // P reads again: N reconnects (retrying while P still drains the old backlog) and the
    // pair handshakes again.
    let mut next_try = Instant::now();
    until("P's session to handshake again", Duration::from_secs(60), || {
        if !n.sessions.contains_key(&p_id) && Instant::now() >= next_try {
            n.connect(&p_id);
            next_try = Instant::now() + Duration::from_millis(200);
        }
        n.tick();
        p.tick();
        q.tick();
        n.ready(&p_id) && p.ready(&n_id)
    });
    assert!(p.lookups_in > 0, "P read the backlog when it resumed");
    assert!(n.readies.get(&p_id).copied().unwrap_or(0) >= 2);
    assert!(n.ready(&q_id));
}
