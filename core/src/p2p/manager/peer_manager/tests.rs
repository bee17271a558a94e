use super::*;
use crate::p2p::value;
use crate::p2p::{PeerCheck, PeerCheckMode};
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

const B: &str = "b:2";

fn config(regressions: ManagerRegressions) -> ManagerConfig {
    let mut registry = RegistryConfig::new("a:1");
    registry.peer_check = PeerCheck { mode: PeerCheckMode::Off, allow: Vec::new() };
    let session = SessionConfig {
        local_id: String::new(),
        agent_metadata: vec![1],
        base_addr: 0,
        num_blocks: 8,
        block_len: 256,
        config_fingerprint: String::new(),
        hash_seed: "0".into(),
        handshake_timeout: None,
        silent_connect_rejection: false,
    };
    ManagerConfig { regressions, ..ManagerConfig::new(registry, session) }
}

fn manager(regressions: ManagerRegressions) -> PeerManager<ChaCha8Rng> {
    PeerManager::new(config(regressions), ChaCha8Rng::seed_from_u64(1))
}

/// `B`'s Connect, as its DEALER delivers it to our ROUTER.
fn connect_from_b() -> PollInput {
    let connect = Message::Connect(Connect {
        peer_id: B.into(),
        agent_metadata: vec![2],
        base_addr: 0,
        num_blocks: 8,
        block_len: 256,
        config_fingerprint: String::new(),
        hash_seed: "0".into(),
    });
    PollInput {
        router: vec![vec![B.as_bytes().to_vec(), value::encode(&connect.to_value())]],
        sources: vec![None],
        monitor: Vec::new(),
    }
}

fn actions(m: &mut PeerManager<impl RngCore>) -> Vec<Action> {
    std::iter::from_fn(|| m.poll_action()).collect()
}

fn events(m: &mut PeerManager<impl RngCore>) -> Vec<PeerEvent> {
    std::iter::from_fn(|| m.poll_event()).collect()
}

fn conn_of_open(actions: &[Action]) -> ConnId {
    actions
        .iter()
        .find_map(|a| match a {
            Action::OpenDealer { conn, .. } => Some(*conn),
            _ => None,
        })
        .expect("an OpenDealer")
}

/// `B` connects in, is admitted, and its session then dies of a failed send between two
/// ticks (the S6 setup). Returns the dead session's id.
fn accepted_then_failed(m: &mut PeerManager<impl RngCore>) -> SessionId {
    let now = Instant::ZERO;
    m.handle_sockets(connect_from_b());
    m.handle_tick(now);
    let conn = conn_of_open(&actions(m));
    let first = m.session_id(B).expect("admitted");
    assert!(events(m).contains(&PeerEvent::Accepted { peer: B.into(), conn, session: first }));
    m.handle_send_failed(conn, "EHOSTUNREACH");
    let ev = events(m);
    assert!(ev.contains(&PeerEvent::SendFailed { peer: B.into(), error: "EHOSTUNREACH".into() }));
    assert!(ev.iter().any(|e| matches!(e, PeerEvent::Down { reason: DeathReason::SendFailed(_), .. })));
    assert!(!m.registry().is_alive(B), "the connection is marked dead at once");
    first
}

#[test]
fn a_replacement_for_a_dead_session_is_admitted() {
    let mut m = manager(ManagerRegressions::default());
    let old = accepted_then_failed(&mut m);
    // B reconnects before the next tick reaped its dead session.
    let now = Instant::from_secs(1);
    m.handle_sockets(connect_from_b());
    m.handle_tick(now);
    let ev = events(&mut m);
    let new = m.session_id(B).expect("the replacement holds the peer");
    assert_ne!(new, old);
    let reaped = ev.iter().position(|e| *e == PeerEvent::Reaped { peer: B.into(), session: old });
    let accepted = ev.iter().position(|e| matches!(e, PeerEvent::Accepted { session, .. } if *session == new));
    assert!(reaped < accepted && accepted.is_some(), "reaped, then admitted: {ev:?}");
    assert!(ev.iter().any(|e| matches!(e, PeerEvent::PeerConnected { session, .. } if *session == new)));
}

#[test]
fn with_s6_the_replacement_is_refused_as_a_duplicate() {
    let mut m = manager(ManagerRegressions { s6_accept_before_reap: true, ..Default::default() });
    let old = accepted_then_failed(&mut m);
    let now = Instant::from_secs(1);
    m.handle_sockets(connect_from_b());
    actions(&mut m);
    m.handle_tick(now);
    let ev = events(&mut m);
    assert!(ev.contains(&PeerEvent::DuplicateRefused { peer: B.into(), holder: old }), "{ev:?}");
    assert!(!ev.iter().any(|e| matches!(e, PeerEvent::Accepted { .. } | PeerEvent::PeerConnected { .. })));
    assert!(actions(&mut m).iter().any(|a| matches!(a, Action::CloseDealer { .. })), "the newcomer is closed");
    assert!(m.session_id(B).is_none(), "the dead session is reaped after admission");
    // The dead session did not read the newcomer's Connect: the next sweep drops it.
    assert_eq!(m.registry().stats().messages_lost_in_sweep, 0);
    m.handle_sockets(PollInput::default());
    assert_eq!(m.registry().stats().messages_lost_in_sweep, 1, "the refused Connect is counted as lost");
}

#[test]
fn dead_sessions_are_reaped_after_dispatch_and_redialled_after_the_drawn_backoff() {
    /// An RNG that always draws `n`.
    struct Fixed(u64);
    impl RngCore for Fixed {
        fn next_u32(&mut self) -> u32 {
            self.0 as u32
        }
        fn next_u64(&mut self) -> u64 {
            self.0
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            dest.fill(0);
        }
        fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
            dest.fill(0);
            Ok(())
        }
    }
    let mut m = PeerManager::new(config(ManagerRegressions::default()), Fixed(300));
    m.keep_connected(B, Instant::ZERO);
    assert_eq!(m.poll_timeout(), Some(Instant::ZERO));
    m.handle_tick(Instant::ZERO);
    let acts = actions(&mut m);
    let conn = conn_of_open(&acts);
    assert!(matches!(acts.last(), Some(Action::Transmit { conn: c, .. }) if *c == conn), "our Connect goes out");
    let first = m.session_id(B).unwrap();
    events(&mut m);
    // The peer disconnects: dispatched in the tick, the session dies, is reaped in the
    // same tick, and B is redialled 200 ms + 300 % 800 ms later.
    let now = Instant::from_secs(5);
    let bye = value::encode(&Message::Disconnect.to_value());
    m.handle_sockets(PollInput { router: vec![vec![B.as_bytes().to_vec(), bye]], ..PollInput::default() });
    m.handle_tick(now);
    let ev = events(&mut m);
    let down = ev.iter().position(|e| matches!(e, PeerEvent::Down { reason: DeathReason::PeerDisconnected, .. }));
    let reaped = ev.iter().position(|e| *e == PeerEvent::Reaped { peer: B.into(), session: first });
    assert!(down.is_some() && down < reaped, "{ev:?}");
    let due = now + Duration::from_millis(500);
    assert_eq!(m.reconnect_at(B), Some(due));
    assert_eq!(m.poll_timeout(), Some(due));
    m.handle_tick(due - Duration::from_millis(1));
    assert!(m.session_id(B).is_none(), "not before the backoff");
    m.handle_tick(due);
    assert!(m.session_id(B).is_some_and(|s| s != first));
    assert!(events(&mut m).iter().any(|e| matches!(e, PeerEvent::Connecting { .. })));
}

#[test]
fn a_failed_open_retires_the_connection_and_the_peer_is_redialled() {
    let mut m = manager(ManagerRegressions::default());
    m.keep_connected(B, Instant::ZERO);
    m.handle_tick(Instant::ZERO);
    let conn = conn_of_open(&actions(&mut m));
    events(&mut m);
    m.handle_open_failed(conn, "Too many open files");
    assert!(actions(&mut m).contains(&Action::CloseDealer { conn, peer: B.into() }));
    let ev = events(&mut m);
    assert!(ev.contains(&PeerEvent::OpenFailed { peer: B.into(), conn, error: "Too many open files".into() }));
    assert!(ev.iter().any(|e| matches!(e, PeerEvent::Down { reason: DeathReason::ConnectionLost, .. })));
    assert!(m.fatal().is_none());
    let now = Instant::from_secs(1);
    m.handle_tick(now);
    assert!(m.reconnect_at(B).is_some_and(|t| t > now), "reaped and scheduled");
    m.handle_tick(now + Duration::from_secs(1));
    assert!(m.is_alive(B), "dialled again");

    // The mainline manager lets the error escape.
    let mut mainline = PeerManager::new(
        config(ManagerRegressions { errors_escape: true, ..Default::default() }),
        ChaCha8Rng::seed_from_u64(1),
    );
    mainline.keep_connected(B, Instant::ZERO);
    mainline.handle_tick(Instant::ZERO);
    let conn = conn_of_open(&actions(&mut mainline));
    mainline.handle_open_failed(conn, "Too many open files");
    assert!(mainline.fatal().is_some_and(|e| e.contains("Too many open files")));
    assert!(events(&mut mainline).iter().any(|e| matches!(e, PeerEvent::Fatal(_))));
    assert!(mainline.send(B, Message::Disconnect).is_err());
}

#[test]
fn a_failed_send_kills_only_the_session_it_was_sent_for() {
    let mut m = manager(ManagerRegressions::default());
    m.keep_connected(B, Instant::ZERO);
    m.handle_tick(Instant::ZERO);
    let old_conn = conn_of_open(&actions(&mut m));
    // A stale report for an older connection: nothing happens to the current one.
    m.handle_send_failed(old_conn + 100, "stale");
    assert!(m.is_alive(B) && m.registry().is_alive(B));
    m.handle_send_failed(old_conn, "queue full");
    assert!(!m.is_alive(B));
    assert!(!m.registry().is_alive(B));
    assert!(matches!(
        m.send(B, Message::AbortAck { kv_request_id: "r".into(), round_seq: 0 }),
        Err(ManagerError::Session(SessionError::Dead(_)))
    ));
    m.handle_tick(Instant::from_secs(1));
    assert!(events(&mut m).contains(&PeerEvent::Reaped { peer: B.into(), session: 0 }));
}
