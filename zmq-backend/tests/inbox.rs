//! The event inbox over real sockets on loopback: drains that never block (S5), readiness
//! from every shard (S6), events queued before the subscription, hostile frames (S22).

mod common;

use common::{free_ports, next_events, raw_router, raw_socket, router_recv, router_send, spec, until_subscribed};
use ctlplane_core::ec::inbox::InboxRegressions;
use ctlplane_core::ec::readiness::{EventFate, Readiness, TransferState};
use ctlplane_core::ec::PortPlan;
use ctlplane_zmq::{Clock, ConsumerServers, ControlClient, EventInbox, ServerOptions};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a drain may take at most, against a client timeout 40 times longer.
const DRAIN_BOUND: Duration = Duration::from_millis(50);
const CLIENT_TIMEOUT_MS: u64 = 2_000;

/// Several drains against `base`, each timed: every one must return at once.
fn assert_drains_return_at_once(base: &str) -> EventInbox {
    let client = Arc::new(ControlClient::new(CLIENT_TIMEOUT_MS));
    let mut inbox = EventInbox::new(client, base);
    for _ in 0..6 {
        let started = Instant::now();
        let drained = inbox.drain();
        let took = started.elapsed();
        assert!(took < DRAIN_BOUND, "a drain took {took:?}");
        assert!(drained.events.is_empty());
        std::thread::sleep(Duration::from_millis(30));
    }
    assert!(!inbox.is_subscribed());
    assert_eq!(inbox.shard_count(), 1);
    inbox
}

#[test]
fn drains_return_at_once_while_nothing_listens_on_the_consumer_port() {
    let base = format!("tcp://127.0.0.1:{}", free_ports(1));
    let mut inbox = assert_drains_return_at_once(&base);
    let started = Instant::now();
    inbox.close();
    inbox.close();
    assert!(started.elapsed() < DRAIN_BOUND, "close waited for the discovery");
    assert!(inbox.drain().events.is_empty());
}

#[test]
fn drains_return_at_once_while_the_consumer_never_answers() {
    let ctx = zmq::Context::new();
    let (router, base) = raw_router(&ctx);
    let mut inbox = assert_drains_return_at_once(&base);
    // Discovery did ask, on its own thread, while the drains went on.
    let (_, body) = router_recv(&router);
    assert_eq!(body, br#"{"op": "peers"}"#);
    let started = Instant::now();
    inbox.close();
    assert!(started.elapsed() < DRAIN_BOUND, "close waited for the discovery");
}

#[test]
fn an_item_is_ready_only_once_all_three_shards_announced_it() {
    let port = free_ports(3);
    let plan = PortPlan::new("127.0.0.1", i64::from(port), 0, 3).unwrap();
    let servers = ConsumerServers::start(&plan, 1 << 20, &ServerOptions::default(), |_| {}).unwrap();
    let client = Arc::new(ControlClient::new(5_000));
    let mut inbox = EventInbox::new(client.clone(), &plan.control_addr());
    until_subscribed(&mut inbox);
    assert_eq!(inbox.shard_count(), 3);
    let servers = servers.servers();
    let subscribed: Vec<String> = servers.iter().map(|s| s.event_endpoint().to_string()).collect();
    assert_eq!(inbox.endpoints(), subscribed.as_slice());

    let clock = Clock::new();
    let mut readiness = Readiness::default();
    assert_eq!(readiness.wait_for_event("t3", "h3", clock.now()), Ok(TransferState::WaitingEvent));
    for (rank, server) in servers.iter().enumerate() {
        let shard = server.endpoint();
        let granted = client.reserve(shard, &spec("t3", "h3")).unwrap();
        let rid = granted["reservation_id"].as_str().unwrap();
        assert!(client.complete(shard, "t3", rid).unwrap().became_ready);

        let [event] = <[_; 1]>::try_from(next_events(&mut inbox, 1)).unwrap();
        assert_eq!(event.shard, Some(i64::from(server.port())));
        let fate = readiness.handle_event(event, inbox.shard_count(), clock.now());
        if rank < 2 {
            assert_eq!(fate, EventFate::Partial, "rank {rank} alone says nothing about the others");
            assert_eq!(readiness.state("t3"), Some(TransferState::WaitingEvent));
        } else {
            assert_eq!(fate, EventFate::Accepted);
            assert_eq!(readiness.state("t3"), Some(TransferState::Available));
        }
    }
    inbox.close();
    client.close();
}

#[test]
fn events_queued_before_any_subscriber_arrive_once_the_pull_connects() {
    let port = free_ports(2);
    let plan = PortPlan::new("127.0.0.1", i64::from(port), 0, 2).unwrap();
    let servers = ConsumerServers::start(&plan, 1 << 20, &ServerOptions::default(), |_| {}).unwrap();
    let client = Arc::new(ControlClient::new(5_000));
    for server in servers.servers() {
        let granted = client.reserve(server.endpoint(), &spec("early", "h")).unwrap();
        let rid = granted["reservation_id"].as_str().unwrap();
        assert!(client.complete(server.endpoint(), "early", rid).unwrap().became_ready);
        assert_eq!(server.with_shard(|s| s.pending_events()), 1, "queued, nobody subscribed");
    }

    let mut inbox = EventInbox::new(client.clone(), &plan.control_addr());
    // As the reference: the first drain only starts discovery.
    assert!(inbox.drain().events.is_empty());
    let events = next_events(&mut inbox, 2);
    assert!(events.iter().all(|e| e.transfer_id == "early" && e.nbytes == 16384));
    let shards: BTreeSet<i64> = events.iter().filter_map(|e| e.shard).collect();
    assert_eq!(shards, BTreeSet::from([i64::from(port), i64::from(port) + 1]));
    inbox.close();
    client.close();
}

#[test]
fn hostile_frames_cost_one_frame_each_and_the_drain_goes_on() {
    // A consumer played by hand: a ROUTER answering discovery, a PUSH sending junk.
    let ctx = zmq::Context::new();
    let (router, base) = raw_router(&ctx);
    let push = raw_socket(&ctx, zmq::PUSH, 5_000);
    push.set_sndtimeo(5_000).unwrap();
    push.bind("tcp://127.0.0.1:0").unwrap();
    let push_endpoint = push.get_last_endpoint().unwrap().unwrap();
    let push_port: u16 = push_endpoint.rsplit_once(':').unwrap().1.parse().unwrap();
    let base_port: u16 = base.rsplit_once(':').unwrap().1.parse().unwrap();
    let discovery = std::thread::spawn(move || {
        let (peer, body) = router_recv(&router);
        assert_eq!(body, br#"{"op": "peers"}"#);
        router_send(&router, &peer, format!(r#"{{"ok": true, "result": {{"ports": [{base_port}]}}}}"#).as_bytes());
        let (peer, body) = router_recv(&router);
        assert_eq!(body, br#"{"op": "event_port"}"#);
        router_send(&router, &peer, format!(r#"{{"ok": true, "result": {push_port}}}"#).as_bytes());
    });

    let client = Arc::new(ControlClient::new(5_000));
    let mut inbox = EventInbox::new(client, &base);
    until_subscribed(&mut inbox);
    discovery.join().unwrap();
    assert_eq!(inbox.endpoints(), [format!("tcp://127.0.0.1:{push_port}")]);

    let valid = br#"{"transfer_id": "t", "mm_hash": "h", "ready": true, "reservation_id": "r", "nbytes": 4, "shape": [2], "dtype": "float16", "shard": 7}"#;
    let junk: [&[u8]; 7] = [
        b"{not json",
        b"\xff\xfe",
        b"[]",
        br#""ready""#,
        b"null",
        br#"{"ready": true, "transfer_id": "t"}"#,
        br#"{"ready": true, "transfer_id": "t", "mm_hash": "h", "nbytes": -1, "shape": [], "dtype": "x"}"#,
    ];
    for frame in junk {
        push.send(frame, 0).unwrap();
    }
    push.send(&br#"{"ready": false, "transfer_id": "t"}"#[..], 0).unwrap();
    push.send(&valid[..], 0).unwrap();

    let deadline = Instant::now() + common::PATIENCE;
    let (mut frames, mut discarded, mut skipped) = (Vec::new(), 0, 0);
    while frames.is_empty() {
        let counts = inbox.drain_each(|event, frame| frames.push((event, frame.to_vec())));
        discarded += counts.discarded;
        skipped += counts.skipped;
        assert!(Instant::now() < deadline, "the valid event never arrived");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!((discarded, skipped), (junk.len(), 1));
    let [(event, frame)] = <[_; 1]>::try_from(frames).unwrap();
    assert_eq!((event.transfer_id.as_str(), event.shard), ("t", Some(7)));
    assert_eq!(frame, valid, "the frame as it arrived");
}

#[test]
fn a_failed_event_port_retries_the_whole_pass_with_peers_cached_in_the_client() {
    // Two shards played by hand; shard 1 fails its first `event_port` (S7).
    let ctx = zmq::Context::new();
    let (router0, base) = raw_router(&ctx);
    let (router1, shard1) = raw_router(&ctx);
    let port_of = |addr: &str| -> u16 { addr.rsplit_once(':').unwrap().1.parse().unwrap() };
    let (p0, p1) = (port_of(&base), port_of(&shard1));
    let (asked_tx, asked) = std::sync::mpsc::channel();
    let play = |router: zmq::Socket, rank: u8, replies: Vec<String>| {
        let asked = asked_tx.clone();
        std::thread::spawn(move || {
            for reply in replies {
                let (peer, body) = router_recv(&router);
                asked.send((rank, String::from_utf8(body).unwrap())).unwrap();
                router_send(&router, &peer, reply.as_bytes());
            }
        })
    };
    let ok = |result: String| format!(r#"{{"ok": true, "result": {result}}}"#);
    let shard0 =
        play(router0, 0, vec![ok(format!(r#"{{"ports": [{p0}, {p1}]}}"#)), ok("41000".into()), ok("41000".into())]);
    let shard1_thread = play(router1, 1, vec![r#"{"ok": false, "error": "boom"}"#.into(), ok("41001".into())]);

    let client = Arc::new(ControlClient::new(5_000));
    let mut inbox = EventInbox::new(client.clone(), &base);
    until_subscribed(&mut inbox);
    shard0.join().unwrap();
    shard1_thread.join().unwrap();
    assert_eq!(inbox.endpoints(), ["tcp://127.0.0.1:41000", "tcp://127.0.0.1:41001"]);
    assert_eq!(inbox.shard_count(), 2);
    let (peers, ep) = (r#"{"op": "peers"}"#.to_string(), r#"{"op": "event_port"}"#.to_string());
    let order: Vec<(u8, String)> = asked.try_iter().collect();
    assert_eq!(order, [(0, peers), (0, ep.clone()), (1, ep.clone()), (0, ep.clone()), (1, ep)]);
    // The inbox confirmed the topology in the client's own cache: no request needed.
    assert_eq!(client.discover_shards(&base), Some(vec![base.clone(), shard1.clone()]));
}

/// EC S5 and S6 (docs/races.md) reach the production inbox: the core hands it the pass
/// to run and where. Under S6 the pass asks the base for its `event_port` at once (no
/// `peers`) and subscribes to one shard; under S5 the first drain runs that pass itself,
/// so it returns subscribed.
#[test]
fn the_s5_and_s6_switches_reach_the_production_inbox() {
    let ctx = zmq::Context::new();
    let (router, base) = raw_router(&ctx);
    let server = std::thread::spawn(move || {
        let (id, body) = router_recv(&router);
        assert_eq!(body, br#"{"op": "event_port"}"#, "S6 asks only the base, without peers");
        router_send(&router, &id, br#"{"ok": true, "result": 20001}"#);
    });
    let client = Arc::new(ControlClient::new(CLIENT_TIMEOUT_MS));
    let regressions =
        InboxRegressions { s5_inline_discovery: true, s6_base_shard_only: true, ..InboxRegressions::default() };
    let mut inbox = EventInbox::with_regressions(client, &base, regressions);
    assert!(inbox.drain().events.is_empty());
    assert!(inbox.is_subscribed(), "S5: the first drain ran the whole pass");
    assert_eq!(inbox.endpoints(), ["tcp://127.0.0.1:20001".to_string()]);
    assert_eq!(inbox.shard_count(), 1);
    server.join().unwrap();
}
