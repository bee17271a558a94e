//! The P2P connection registry: the transport-only races of p2p-behaviour.md §5 (S1-S4), each shown
//! with its T0 switch on (the bug) and off (the fix), plus poll ordering and framing.

use ctlplane_core::p2p::value::{encode, Value};
use ctlplane_core::p2p::{
    Action, AllowEntry, ConnectionRegistry, MonitorEvent, PeerCheck, PeerCheckMode, PollInput, RegistryConfig,
    T0Switches, TransportError,
};

const P: &str = "10.0.0.2:7777";

fn registry(t0: T0Switches) -> ConnectionRegistry {
    ConnectionRegistry::new(RegistryConfig { t0, ..RegistryConfig::new("10.0.0.1:5710") })
}

fn actions(r: &mut ConnectionRegistry) -> Vec<Action> {
    std::iter::from_fn(|| r.poll_action()).collect()
}

fn msg(kind: &str) -> Value {
    Value::map([("type", Value::from(kind))])
}

fn from(peer: &str, v: &Value) -> Vec<Vec<u8>> {
    vec![peer.as_bytes().to_vec(), encode(v)]
}

/// The host an identity names, as the source a genuine peer's connection comes from.
fn genuine_source(frames: &[Vec<u8>]) -> Option<String> {
    let id = std::str::from_utf8(frames.first()?).ok()?;
    id.rsplit_once(':').map(|(host, _)| host.to_string())
}

/// A poll of messages from genuine peers: each comes from the host its identity names.
fn poll_router(r: &mut ConnectionRegistry, router: Vec<Vec<Vec<u8>>>) -> Vec<String> {
    let sources = router.iter().map(|m| genuine_source(m)).collect();
    r.poll(PollInput { router, sources, monitor: vec![] })
}

fn poll_from(r: &mut ConnectionRegistry, messages: Vec<(Vec<Vec<u8>>, Option<&str>)>) -> Vec<String> {
    let (router, sources) = messages.into_iter().map(|(m, s)| (m, s.map(str::to_string))).unzip();
    r.poll(PollInput { router, sources, monitor: vec![] })
}

fn closes(acts: &[Action]) -> usize {
    acts.iter().filter(|a| matches!(a, Action::CloseDealer { .. })).count()
}

// S1: connect after the session marked the connection dead.

#[test]
fn s1_connect_retires_dead_connection() {
    let mut r = registry(T0Switches::default());
    let first = r.connect(P).unwrap();
    r.mark_dead(P);
    let second = r.connect(P).expect("a dead registration is retired, not an error");
    assert_ne!(first, second);
    let acts = actions(&mut r);
    assert!(matches!(acts[1], Action::CloseDealer { conn, .. } if conn == first));
    assert!(matches!(acts[2], Action::OpenDealer { conn, .. } if conn == second));
    assert!(r.is_alive(P));
}

#[test]
fn s1_t0_connect_refuses_a_dead_registration() {
    let mut r = registry(T0Switches { connect_refuses_any: true, ..T0Switches::default() });
    r.connect(P).unwrap();
    r.mark_dead(P);
    assert_eq!(r.connect(P), Err(TransportError::AlreadyExists(P.into())));
}

#[test]
fn connect_to_a_live_peer_is_a_typed_error() {
    let mut r = registry(T0Switches::default());
    r.connect(P).unwrap();
    assert_eq!(r.connect(P).unwrap_err().to_string(), format!("ZmqConnection to {P} already exists"));
    assert_eq!(r.connect("no-port"), Err(TransportError::InvalidPeerId("no-port".into())));
}

// S2: a reconnecting peer's first message arrives while its old registration is dead.

#[test]
fn s2_inbound_message_survives_dead_registration() {
    let mut r = registry(T0Switches::default());
    r.connect(P).unwrap();
    r.mark_dead(P);
    let accepted = poll_router(&mut r, vec![from(P, &msg("connect"))]);
    assert_eq!(accepted, vec![P.to_string()], "a fresh inbound connection is returned");
    assert_eq!(r.recv(P), vec![msg("connect")], "with the first message in its buffer");
    assert_eq!(r.stats().messages_lost_in_sweep, 0);
}

#[test]
fn s2_t0_sweep_last_swallows_the_first_message() {
    let mut r = registry(T0Switches { sweep_last: true, ..T0Switches::default() });
    r.connect(P).unwrap();
    r.mark_dead(P);
    let accepted = poll_router(&mut r, vec![from(P, &msg("connect"))]);
    assert!(accepted.is_empty());
    assert!(!r.is_registered(P));
    assert_eq!(r.stats().messages_lost_in_sweep, 1, "routed into the dead connection and swept with it");
}

// S3: mark_dead must not turn close into a no-op.

#[test]
fn s3_close_after_mark_dead_releases_sockets() {
    let mut r = registry(T0Switches::default());
    r.connect(P).unwrap();
    r.mark_dead(P);
    poll_router(&mut r, vec![]);
    let acts = actions(&mut r);
    assert_eq!(closes(&acts), 1);
    let s = r.stats();
    assert_eq!((s.dealers_opened, s.dealers_closed), (1, 1));
    assert!(!r.is_registered(P));
}

#[test]
fn s3_t0_mark_dead_leaks_the_dealer() {
    let mut r = registry(T0Switches { mark_dead_closes: true, ..T0Switches::default() });
    r.connect(P).unwrap();
    r.mark_dead(P);
    poll_router(&mut r, vec![]);
    assert_eq!(closes(&actions(&mut r)), 0, "close saw the flag mark_dead set and did nothing");
    let s = r.stats();
    assert_eq!((s.dealers_opened, s.dealers_closed), (1, 0));
}

// S4: every monitor endpoint unique within one transport.

fn monitors(acts: &[Action]) -> Vec<String> {
    acts.iter()
        .filter_map(|a| match a {
            Action::OpenDealer { monitor, .. } => Some(monitor.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn s4_repeated_reconnect_gets_fresh_monitor_endpoints() {
    let mut r = registry(T0Switches::default());
    for _ in 0..10 {
        r.connect(P).unwrap();
        r.mark_dead(P);
        poll_router(&mut r, vec![]);
    }
    let acts = actions(&mut r);
    let eps = monitors(&acts);
    assert_eq!(eps[0], "inproc://p2p-monitor-10.0.0.2-7777-0");
    let mut unique = eps.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 10);
    assert_eq!(closes(&acts), 10);
    assert!(r.peers().is_empty());
}

#[test]
fn s4_t0_reuses_the_monitor_endpoint() {
    let mut r = registry(T0Switches { monitor_without_seq: true, ..T0Switches::default() });
    for _ in 0..2 {
        r.connect(P).unwrap();
        r.mark_dead(P);
        poll_router(&mut r, vec![]);
    }
    let eps = monitors(&actions(&mut r));
    assert_eq!(eps, vec!["inproc://p2p-monitor-10.0.0.2-7777".to_string(); 2]);
}

// Poll ordering, framing and accept.

#[test]
fn death_in_the_same_poll_drops_routed_messages_s5() {
    // Known and still present upstream: a message routed into a connection whose
    // DISCONNECTED arrives in the same poll is swept with it.
    let mut r = registry(T0Switches::default());
    let conn = r.connect(P).unwrap();
    let accepted = r.poll(PollInput {
        router: vec![from(P, &msg("connect"))],
        sources: vec![Some("10.0.0.2".into())],
        monitor: vec![(conn, MonitorEvent::Disconnected)],
    });
    assert!(accepted.is_empty());
    assert!(!r.is_registered(P));
    assert_eq!(r.stats().messages_lost_in_sweep, 1);
}

#[test]
fn accepted_peers_are_returned_once_with_messages_in_order() {
    let mut r = registry(T0Switches::default());
    let q = "10.0.0.3:1";
    let accepted = poll_router(&mut r, vec![from(P, &msg("a")), from(q, &msg("b")), from(P, &msg("c"))]);
    assert_eq!(accepted, vec![P.to_string(), q.to_string()]);
    assert_eq!(r.recv(P), vec![msg("a"), msg("c")]);
    assert!(poll_router(&mut r, vec![from(P, &msg("d"))]).is_empty(), "already registered");
    assert_eq!(r.recv(P), vec![msg("d")]);
    let acts = actions(&mut r);
    assert!(matches!(&acts[0], Action::OpenDealer { endpoint, identity, .. }
        if endpoint == "tcp://10.0.0.2:7777" && identity == "10.0.0.1:5710"));
}

#[test]
fn malformed_frames_are_dropped_with_nothing_else_lost() {
    let mut r = registry(T0Switches::default());
    let router = vec![
        vec![P.as_bytes().to_vec()],
        vec![P.as_bytes().to_vec(), encode(&msg("x")), vec![]],
        vec![vec![0x00, 0xff, 0x12], encode(&msg("x"))],
        vec![P.as_bytes().to_vec(), vec![0xc1]],
        vec![b"no-colon".to_vec(), encode(&msg("x"))],
        from(P, &msg("ok")),
    ];
    let accepted = poll_router(&mut r, router);
    assert_eq!(accepted, vec![P.to_string()]);
    assert_eq!(r.recv(P), vec![msg("ok")]);
    assert_eq!(r.stats().frames_dropped, 4);
    assert_eq!(r.stats().messages_refused, 1, "an identity that is not host:port names nothing to admit");
}

// The peer check (p2p-behaviour.md S18): an identity is dialled back only if it names the host
// the connection comes from.

#[test]
fn s18_an_identity_naming_another_host_is_refused_counted_and_never_dialled() {
    let mut r = registry(T0Switches::default());
    let target = "10.9.9.9:22";
    let accepted = poll_from(
        &mut r,
        vec![(from(target, &msg("connect")), Some("10.0.0.2")), (from(target, &msg("again")), Some("10.0.0.2"))],
    );
    assert!(accepted.is_empty());
    assert!(!r.is_registered(target));
    assert!(actions(&mut r).is_empty(), "no DEALER for a refused peer");
    assert_eq!(r.stats().messages_refused, 2);
    assert_eq!(r.stats().dealers_opened, 0);
    // The genuine peer on that host is served in the same poll.
    let accepted =
        poll_from(&mut r, vec![(from(target, &msg("x")), Some("10.0.0.2")), (from(P, &msg("y")), Some("10.0.0.2"))]);
    assert_eq!(accepted, vec![P.to_string()]);
    assert_eq!(r.recv(P), vec![msg("y")]);
    assert_eq!(r.stats().messages_refused, 3);
}

#[test]
fn s18_a_forged_identity_cannot_inject_into_a_registered_peer() {
    let mut r = registry(T0Switches::default());
    r.connect(P).unwrap();
    poll_from(&mut r, vec![(from(P, &msg("forged")), Some("10.0.0.66")), (from(P, &msg("real")), Some("10.0.0.2"))]);
    assert_eq!(r.recv(P), vec![msg("real")]);
    assert_eq!(r.stats().messages_refused, 1);
}

#[test]
fn s18_t0_trusts_the_identity_and_dials_wherever_it_points() {
    let mut r = registry(T0Switches { trust_identity: true, ..T0Switches::default() });
    let target = "10.9.9.9:22";
    let accepted = poll_from(&mut r, vec![(from(target, &msg("connect")), Some("10.0.0.2"))]);
    assert_eq!(accepted, vec![target.to_string()]);
    assert!(matches!(&actions(&mut r)[0], Action::OpenDealer { endpoint, .. } if endpoint == "tcp://10.9.9.9:22"));
    assert_eq!(r.stats().messages_refused, 0);
}

#[test]
fn unknown_sources_are_refused_in_strict_mode_and_allowlists_admit_what_they_name() {
    let mut r = registry(T0Switches::default());
    assert!(poll_from(&mut r, vec![(from(P, &msg("x")), None)]).is_empty());
    assert_eq!(r.stats().messages_refused, 1);

    let allow: Vec<AllowEntry> = vec!["10.0.0.2:7777".parse().unwrap()];
    let check = PeerCheck { mode: PeerCheckMode::Allowlist, allow };
    let mut r = ConnectionRegistry::new(RegistryConfig { peer_check: check, ..RegistryConfig::new("10.0.0.1:5710") });
    let accepted = poll_from(
        &mut r,
        vec![(from(P, &msg("natted")), Some("203.0.113.5")), (from("10.0.0.3:1", &msg("x")), Some("10.0.0.3"))],
    );
    assert_eq!(accepted, vec![P.to_string()], "allowlist mode admits only the listed identity");
    assert_eq!(r.stats().messages_refused, 1);

    let mut r = ConnectionRegistry::new(RegistryConfig { peer_check: PeerCheck::off(), ..RegistryConfig::new("l:1") });
    assert_eq!(poll_from(&mut r, vec![(from("10.9.9.9:22", &msg("x")), None)]), vec!["10.9.9.9:22".to_string()]);
}

#[test]
fn max_peers_refuses_beyond_the_bound() {
    let mut r = ConnectionRegistry::new(RegistryConfig { max_peers: Some(1), ..RegistryConfig::new("l:1") });
    r.connect(P).unwrap();
    assert!(matches!(r.connect("h:2"), Err(TransportError::TooManyPeers { limit: 1, .. })));
    assert!(poll_router(&mut r, vec![from("h:3", &msg("x"))]).is_empty());
}

#[test]
fn send_requires_a_live_connection_and_respects_the_size_limit() {
    let mut r = ConnectionRegistry::new(RegistryConfig { max_message_bytes: Some(64), ..RegistryConfig::new("l:1") });
    assert_eq!(r.send(P, &msg("x")), Err(TransportError::NotConnected(P.into())));
    let conn = r.connect(P).unwrap();
    actions(&mut r);
    r.send(P, &msg("x")).unwrap();
    assert_eq!(actions(&mut r), vec![Action::Transmit { conn, frame: encode(&msg("x")) }]);
    assert_eq!(r.send(P, &Value::Bin(vec![0; 100])), Err(TransportError::TooLarge(64)));
    r.mark_dead(P);
    assert_eq!(
        r.send(P, &msg("x")).unwrap_err().to_string(),
        format!("ZmqConnection: send on closed connection to {P}")
    );
}

#[test]
fn close_all_is_idempotent_and_closes_each_dealer_once() {
    let mut r = registry(T0Switches::default());
    r.connect(P).unwrap();
    r.connect("10.0.0.3:1").unwrap();
    r.close(P);
    r.close_all();
    r.close_all();
    let acts = actions(&mut r);
    assert_eq!(closes(&acts), 2);
    assert_eq!(r.connect(P), Err(TransportError::Closed));
}

#[test]
fn a_failed_old_connection_does_not_kill_its_replacement() {
    let mut r = registry(T0Switches::default());
    let first = r.connect(P).unwrap();
    r.mark_dead(P);
    let second = r.connect(P).unwrap();
    assert!(!r.mark_dead_conn(P, first), "the old connection is no longer registered");
    assert!(r.is_alive(P));
    assert!(r.mark_dead_conn(P, second));
    assert!(!r.is_alive(P));
}

// vLLM 0.33: bounded, non-blocking sends and more fatal monitor events.

#[test]
fn every_fatal_monitor_event_kills_and_others_are_ignored() {
    use ctlplane_core::p2p::options::{EVENT_CLOSED, EVENT_HANDSHAKE_FAILED_AUTH, EVENT_HANDSHAKE_FAILED_NO_DETAIL};
    for code in [0x0200, EVENT_CLOSED, EVENT_HANDSHAKE_FAILED_NO_DETAIL, 0x2000, EVENT_HANDSHAKE_FAILED_AUTH] {
        let mut r = registry(T0Switches::default());
        let conn = r.connect(P).unwrap();
        let event = MonitorEvent::from_code(code);
        assert!(event.is_fatal(), "{code:#x}");
        // Non-fatal events before it change nothing; the fatal one kills in this poll.
        let monitor =
            vec![(conn, MonitorEvent::from_code(0x0001)), (conn, MonitorEvent::from_code(0x1000)), (conn, event)];
        r.poll(PollInput { router: vec![], sources: vec![], monitor });
        assert!(!r.is_registered(P), "{code:#x} retires the connection");
    }
    let mut r = registry(T0Switches::default());
    let conn = r.connect(P).unwrap();
    r.poll(PollInput { router: vec![], sources: vec![], monitor: vec![(conn, MonitorEvent::from_code(0x0004))] });
    assert!(r.is_alive(P), "a retried connect is not fatal");
}

#[test]
fn a_full_queue_is_the_release_error_and_sends_never_block_unless_switched() {
    use ctlplane_core::p2p::options::SendMode;
    let mut r = registry(T0Switches::default());
    assert_eq!(r.send_mode(), SendMode::NonBlocking);
    let conn = r.connect(P).unwrap();
    let error = r.queue_full(conn);
    assert_eq!(error, TransportError::QueueFull { peer: P.into() });
    assert_eq!(error.to_string(), format!("ZmqConnection: send queue to {P} is full"));
    assert_eq!(r.stats().sends_refused_full, 1);
    // The owning session decides the connection is dead; the registry keeps it until then.
    assert!(r.is_alive(P));
    let seed = registry(T0Switches { blocking_send_at_hwm: true, ..T0Switches::default() });
    assert_eq!(seed.send_mode(), SendMode::BlockAtHwm);
}
