//! The consumer control server over real sockets on loopback.

mod common;

use common::{free_ports, raw_socket, spec, start_server};
use ctlplane_core::ec::{PortPlan, ShardConfig};
use ctlplane_zmq::{ConsumerControlServer, ConsumerServers, ControlClient, ServerOptions, StartError};
use rand_core::OsRng;
use serde_json::{json, Value};
use std::error::Error;

const MALFORMED: &[u8] = br#"{"ok": false, "error": "malformed control request"}"#;

#[test]
fn undecodable_and_multipart_requests_are_answered_as_malformed_and_serving_goes_on() {
    let server = start_server(|_| {});
    let ctx = zmq::Context::new();
    let req = raw_socket(&ctx, zmq::REQ, 5_000);
    req.connect(server.endpoint()).unwrap();

    req.send("{not json", 0).unwrap();
    assert_eq!(req.recv_bytes(0).unwrap(), MALFORMED);
    req.send_multipart([&br#"{"op": "peers"}"#[..], b"x"], 0).unwrap();
    assert_eq!(req.recv_bytes(0).unwrap(), MALFORMED);
    req.send(r#"{"op": "peers"}"#, 0).unwrap();
    let port = server.port();
    assert_eq!(req.recv_string(0).unwrap().unwrap(), format!(r#"{{"ok": true, "result": {{"ports": [{port}]}}}}"#));

    let stats = server.stats();
    assert_eq!((stats.requests, stats.malformed, stats.error_replies), (3, 2, 2));
    assert!(server.is_serving());
}

#[test]
fn events_queued_before_any_subscriber_arrive_once_a_pull_connects() {
    let server = start_server(|_| {});
    let client = ControlClient::new(5_000);
    let addr = server.endpoint();
    assert_eq!(client.event_port(addr).unwrap(), json!(server.event_port()));

    let granted = client.reserve(addr, &spec("t1", "h1")).unwrap();
    assert_eq!((granted["write"].clone(), granted["nbytes"].clone()), (json!(true), json!(16384)));
    let rid = granted["reservation_id"].as_str().unwrap().to_string();
    let done = client.complete(addr, "t1", &rid).unwrap();
    assert!(done.completed && done.became_ready);
    assert_eq!(server.stats().events_queued, 1);

    let ctx = zmq::Context::new();
    let pull = raw_socket(&ctx, zmq::PULL, 5_000);
    pull.connect(server.event_endpoint()).unwrap();
    let event: Value = serde_json::from_slice(&pull.recv_bytes(0).unwrap()).unwrap();
    assert_eq!(event["transfer_id"], "t1");
    assert_eq!(event["reservation_id"], rid.as_str());
    assert_eq!(event["ready"], true);
    assert_eq!(event["shard"], server.port());
    // The loop confirms the send right after libzmq took the frame, maybe just after the
    // PULL already read it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while server.stats().events_sent != 1 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(server.stats().events_sent, 1);
    client.close();
}

#[test]
fn a_full_backlog_drops_the_oldest_events_and_counts_them() {
    let server = start_server(|c| c.max_pending_events = 2);
    let client = ControlClient::new(5_000);
    let addr = server.endpoint();
    let specs: Vec<_> = (0..4).map(|i| spec(&format!("t{i}"), &format!("h{i}"))).collect();
    let granted = client.reserve_batch(addr, &specs).unwrap();
    let rids: Vec<String> =
        granted.iter().map(|g| g.as_ref().unwrap()["reservation_id"].as_str().unwrap().to_string()).collect();
    let items: Vec<(&str, &str)> = specs.iter().zip(&rids).map(|(s, r)| (s.transfer_id.as_str(), r.as_str())).collect();
    let done = client.complete_batch(addr, &items).unwrap();
    assert!(done.iter().all(|c| c.completed && c.became_ready));

    let stats = server.stats();
    assert_eq!((stats.events_queued, stats.events_dropped, stats.events_sent), (4, 2, 0));
    assert_eq!(server.with_shard(|s| s.pending_events()), 2);
}

#[test]
fn a_port_in_use_fails_to_bind_with_its_cause() {
    let first = start_server(|_| {});
    let err = ConsumerControlServer::start("127.0.0.1", ShardConfig::new(first.port(), 1 << 20), OsRng)
        .err()
        .expect("second bind must fail");
    assert!(matches!(err, StartError::Bind(_)), "{err:?}");
    assert_eq!(err.to_string(), "EC Mooncake control channel failed to bind");
    let cause = err.source().expect("the cause is kept");
    assert!(cause.to_string().contains(first.endpoint()), "{cause}");
    assert!(cause.source().is_some(), "the zmq error is kept");
    assert!(first.is_serving());
}

#[test]
fn close_is_idempotent_and_stops_serving() {
    let mut server = start_server(|_| {});
    assert!(server.is_serving());
    server.close();
    server.close();
    assert!(!server.is_serving());
    // The port is free again the moment `close` returns, however often it is reused.
    for _ in 0..20 {
        let mut again =
            ConsumerControlServer::start("127.0.0.1", ShardConfig::new(server.port(), 1 << 20), OsRng).unwrap();
        again.close();
    }

    let client = ControlClient::new(1_000);
    client.close();
    client.close();
    assert!(matches!(
        client.request(server.endpoint(), &json!({"op": "peers"})),
        Err(ctlplane_zmq::ClientError::Closed)
    ));
}

#[test]
fn a_replica_serves_every_rank_and_advertises_them_all() {
    let base = free_ports(2);
    let plan = PortPlan::new("127.0.0.1", i64::from(base), 0, 2).unwrap();
    let mut replica = ConsumerServers::start(&plan, 1 << 20, &ServerOptions::default(), |_| {}).unwrap();
    let client = ControlClient::new(5_000);
    let shards = client.shards(&plan.control_addr()).unwrap();
    assert_eq!(shards, [format!("tcp://127.0.0.1:{base}"), format!("tcp://127.0.0.1:{}", base + 1)]);
    for (shard, server) in shards.iter().zip(replica.servers()) {
        assert_eq!(client.event_port(shard).unwrap(), json!(server.event_port()));
        let granted = client.reserve(shard, &spec("t", "h")).unwrap();
        assert_eq!(granted["dst_session"], "127.0.0.1:0");
    }
    replica.close();
    replica.close();
    assert!(!replica.all_serving());
}

/// EC S2 reaches production: with the reap-fault switch on, the first reap halts the
/// shard, the serving loop stops as the reference's control thread died (no reply, REP
/// closed), and requests only time out; with it off the same server keeps answering
/// across many reaps.
#[test]
fn the_reap_fault_switch_halts_a_real_server_and_only_it() {
    use ctlplane_core::time::Instant;
    use std::time::Duration;

    let reap = Duration::from_millis(20);
    let healthy = start_server(|c| c.reap_interval = reap);
    let faulty = start_server(|c| {
        c.reap_interval = reap;
        c.regressions.s2_reap_fault_at = Some(Instant::ZERO);
    });
    let client = ControlClient::new(300);
    // Bounded wait on the condition: the faulty loop stops at its first reap.
    let deadline = std::time::Instant::now() + common::PATIENCE;
    while faulty.is_serving() {
        assert!(std::time::Instant::now() < deadline, "the switched server never halted");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(client.event_port(faulty.endpoint()).is_err(), "a halted server answered");
    // Many reap intervals later the healthy one still answers.
    std::thread::sleep(reap * 10);
    assert!(healthy.is_serving());
    assert_eq!(client.event_port(healthy.endpoint()).unwrap(), json!(healthy.event_port()));
}

/// EC S1 reaches production: with the switch on, an undecodable request halts the shard
/// and the serving loop stops without answering it; with it off the same frame gets the
/// malformed reply and serving goes on.
#[test]
fn the_undecodable_request_switch_halts_a_real_server_and_only_it() {
    let healthy = start_server(|_| {});
    let faulty = start_server(|c| c.regressions.s1_undecodable_kills_server = true);
    let ctx = zmq::Context::new();
    for (server, halts) in [(&healthy, false), (&faulty, true)] {
        let req = raw_socket(&ctx, zmq::REQ, 1_000);
        req.connect(server.endpoint()).unwrap();
        req.send("{not json", 0).unwrap();
        match req.recv_bytes(0) {
            Ok(reply) => {
                assert!(!halts, "a halted server answered");
                assert_eq!(reply, MALFORMED);
            }
            Err(e) => assert!(halts, "the healthy server did not answer: {e}"),
        }
        // Bounded wait on the condition: the loop ends right after the frame.
        let deadline = std::time::Instant::now() + common::PATIENCE;
        while server.is_serving() == halts {
            assert!(std::time::Instant::now() < deadline, "serving is {} after the frame", server.is_serving());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    assert!(healthy.is_serving() && !faulty.is_serving());
}
