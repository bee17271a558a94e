//! The control client against hand-played and real servers on loopback.

mod common;

use common::{raw_router, router_recv, router_send, spec, start_server};
use ctlplane_core::ec::request_slot::SlotRegressions;
use ctlplane_zmq::{ClientError, ControlClient, ReserveOutcome};
use serde_json::json;
use std::time::{Duration, Instant};

#[test]
fn a_stalled_server_times_the_request_out_and_the_next_one_uses_a_fresh_socket() {
    let ctx = zmq::Context::new();
    let (router, addr) = raw_router(&ctx);
    let server = std::thread::spawn(move || {
        let (stalled, _) = router_recv(&router); // never answered in time
        let (fresh, body) = router_recv(&router);
        assert_ne!(stalled, fresh, "the retry must come from a new socket");
        assert_eq!(body, br#"{"op": "peers"}"#);
        router_send(&router, &fresh, br#"{"ok": true, "result": 7}"#);
        // A late reply to the discarded socket goes nowhere.
        router_send(&router, &stalled, br#"{"ok": true, "result": "late"}"#);
        let (again, _) = router_recv(&router);
        assert_eq!(again, fresh, "a socket that got its reply is reused");
        router_send(&router, &again, br#"{"ok": true, "result": 8}"#);
    });

    let client = ControlClient::new(300);
    let started = Instant::now();
    let err = client.request(&addr, &json!({"op": "peers"})).unwrap_err();
    assert!(matches!(err, ClientError::Timeout { timeout_ms: 300, .. }), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(client.request(&addr, &json!({"op": "peers"})).unwrap(), json!(7));
    assert_eq!(client.request(&addr, &json!({"op": "peers"})).unwrap(), json!(8));
    server.join().unwrap();
}

/// EC S9 (docs/races.md): the timeout of the production client goes through the core's
/// slot, so the regression switch reaches a real socket. Fixed, every request after a
/// timeout goes out on a fresh socket; with the switch the timed-out socket is kept, and
/// libzmq's strict REQ refuses the next send (EFSM) before anything reaches the server.
#[test]
fn the_s9_switch_keeps_the_timed_out_socket_of_the_production_client() {
    let peers = json!({"op": "peers"});
    for s9 in [false, true] {
        let ctx = zmq::Context::new();
        let (router, addr) = raw_router(&ctx);
        let client = ControlClient::new(200).with_regressions(SlotRegressions { s9_reuse_after_timeout: s9 });
        let err = client.request(&addr, &peers).unwrap_err();
        assert!(matches!(err, ClientError::Timeout { timeout_ms: 200, .. }), "{err:?}");
        let (stalled, _) = router_recv(&router); // never answered
        let err = client.request(&addr, &peers).unwrap_err();
        if s9 {
            assert!(matches!(err, ClientError::Transport { source: zmq::Error::EFSM, .. }), "{err:?}");
            router.set_rcvtimeo(300).unwrap();
            assert!(router.recv_multipart(0).is_err(), "the refused send reached nobody");
            router.set_rcvtimeo(5_000).unwrap();
            // The transport error discarded the kept socket: the next request is fresh.
            let err = client.request(&addr, &peers).unwrap_err();
            assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
        } else {
            assert!(matches!(err, ClientError::Timeout { .. }), "{err:?}");
        }
        let (fresh, _) = router_recv(&router);
        assert_ne!(stalled, fresh, "a new socket after the timeout (s9: {s9})");
    }
}

#[test]
fn error_replies_carry_the_server_text_and_keep_the_socket() {
    let server = start_server(|_| {});
    let client = ControlClient::new(5_000);
    let err = client.request(server.endpoint(), &json!({"op": "nonsense"})).unwrap_err();
    assert!(matches!(err, ClientError::Remote { .. }));
    assert_eq!(err.to_string(), "unknown control op: 'nonsense'");
    assert_eq!(client.status(server.endpoint(), "nobody").unwrap(), json!(null));
}

#[test]
fn typed_reserves_read_what_the_value_api_reads() {
    let server = start_server(|_| {});
    let client = ControlClient::new(5_000);
    let addr = server.endpoint();
    let ReserveOutcome::Granted(first) = client.reserve_outcome(addr, &spec("t1", "h1")).unwrap() else {
        panic!("a fresh reserve is granted")
    };
    assert!(first.write && !first.ready && !first.cached);
    assert_eq!((first.nbytes, first.reservation_id.len()), (16384, 32));
    // A repeat is the same destination under an id of its own (the duplicate's grant,
    // ec-dup-push), as the value API shows it.
    let again = client.reserve(addr, &spec("t1", "h1")).unwrap();
    assert_ne!(again["reservation_id"], first.reservation_id.as_str());
    assert_eq!(again["dst_ptr"], first.dst_ptr);
    assert_eq!(again["dst_session"], first.dst_session.as_str());
    let Ok(ReserveOutcome::Granted(repeat)) = client.reserve_outcome(addr, &spec("t1", "h1")) else { panic!() };
    assert!(!repeat.write && repeat.reservation_id != first.reservation_id && repeat.dst_ptr == first.dst_ptr);
    assert!(client.cancel(addr, "t2", "", false, false).unwrap());
    assert_eq!(client.reserve_outcome(addr, &spec("t2", "h2")).unwrap(), ReserveOutcome::Cancelled);
    let err = client.reserve_outcome(addr, &spec("t1", "other")).unwrap_err();
    assert!(matches!(err, ClientError::Remote { .. }));
    assert_eq!(err.to_string(), "conflicting reservation for transfer_id");
}

#[test]
fn typed_reserves_refuse_results_without_a_grant_and_keep_the_socket() {
    let ctx = zmq::Context::new();
    let (router, addr) = raw_router(&ctx);
    let server = std::thread::spawn(move || {
        let (first, _) = router_recv(&router);
        router_send(&router, &first, br#"{"ok": true, "result": {"dst_session": "s", "dst_ptr": 1, "nbytes": 2}}"#);
        let (second, _) = router_recv(&router);
        assert_eq!(first, second, "a completed round trip keeps the socket");
        // Another key order takes the general path and reads alike.
        router_send(
            &router,
            &second,
            br#"{"result": {"nbytes": "16384", "dst_ptr": 1, "reservation_id": 7, "dst_session": "s", "write": 1}, "ok": 1}"#,
        );
        // A grant to write other than the bytes asked for is refused, as the producer does.
        let (third, _) = router_recv(&router);
        router_send(
            &router,
            &third,
            br#"{"ok": true, "result": {"reservation_id": "r", "dst_session": "s", "dst_ptr": 1, "nbytes": 2, "write": true, "ready": false, "cached": false}}"#,
        );
    });
    let client = ControlClient::new(5_000);
    let err = client.reserve_outcome(&addr, &spec("t", "h")).unwrap_err();
    assert_eq!(err.to_string(), format!("malformed reserve result from {addr}: Malformed EC reservation response"));
    let ReserveOutcome::Granted(g) = client.reserve_outcome(&addr, &spec("t", "h")).unwrap() else { panic!() };
    assert_eq!((g.reservation_id.as_str(), g.dst_ptr, g.nbytes, g.write, g.ready), ("7", 1, 16384, true, false));
    let err = client.reserve_outcome(&addr, &spec("t", "h")).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("malformed reserve result from {addr}: EC consumer granted 2 bytes for mm_hash=h, expected 16384")
    );
    server.join().unwrap();
}

#[test]
fn a_non_object_reply_keeps_the_socket_and_a_malformed_one_discards_it() {
    let ctx = zmq::Context::new();
    let (router, addr) = raw_router(&ctx);
    let server = std::thread::spawn(move || {
        let (first, _) = router_recv(&router);
        router_send(&router, &first, b"[1, 2]");
        let (second, _) = router_recv(&router);
        assert_eq!(first, second, "a completed round trip keeps the socket");
        router_send(&router, &second, b"{not json");
        let (third, _) = router_recv(&router);
        assert_ne!(second, third, "an undecodable reply discards the socket");
        router_send(&router, &third, br#"{"ok": false}"#);
    });
    let client = ControlClient::new(5_000);
    let peers = json!({"op": "peers"});
    assert!(matches!(client.request(&addr, &peers), Err(ClientError::NotAnObject { .. })));
    assert!(matches!(client.request(&addr, &peers), Err(ClientError::MalformedReply { .. })));
    let err = client.request(&addr, &peers).unwrap_err();
    assert_eq!(err.to_string(), "EC control request failed");
    server.join().unwrap();
}

#[test]
fn discovery_caches_successes_only_and_gives_up_after_two_attempts() {
    let ctx = zmq::Context::new();
    let (router, addr) = raw_router(&ctx);
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    let server = std::thread::spawn(move || {
        for reply in [r#"{"ok": true, "result": {"ports": []}}"#, r#"{"ok": false, "error": "boom"}"#] {
            let (id, body) = router_recv(&router);
            assert_eq!(body, br#"{"op": "peers"}"#);
            router_send(&router, &id, reply.as_bytes());
        }
        let (id, _) = router_recv(&router);
        router_send(
            &router,
            &id,
            format!(r#"{{"ok": true, "result": {{"ports": [{port}, "{}"]}}}}"#, port + 1).as_bytes(),
        );
        // Nothing more may arrive: the topology is cached from now on.
        router.set_rcvtimeo(300).unwrap();
        assert!(router.recv_multipart(0).is_err());
    });
    let client = ControlClient::new(5_000);
    let err = client.shards(&addr).unwrap_err();
    assert_eq!(err.to_string(), format!("Could not discover every EC consumer shard at {addr}"));
    let expected = vec![addr.clone(), format!("tcp://127.0.0.1:{}", port + 1)];
    assert_eq!(client.discover_shards(&addr), Some(expected.clone()));
    assert_eq!(client.shards(&addr).unwrap(), expected);
    server.join().unwrap();
}

#[test]
fn two_threads_use_two_sockets() {
    let ctx = zmq::Context::new();
    let (router, addr) = raw_router(&ctx);
    let server = std::thread::spawn(move || {
        let mut ids = Vec::new();
        for _ in 0..2 {
            let (id, _) = router_recv(&router);
            router_send(&router, &id, br#"{"ok": true, "result": null}"#);
            ids.push(id);
        }
        assert_ne!(ids[0], ids[1]);
    });
    let client = ControlClient::new(5_000);
    std::thread::scope(|s| {
        s.spawn(|| client.request(&addr, &json!({"op": "peers"})).unwrap());
    });
    client.request(&addr, &json!({"op": "peers"})).unwrap();
    server.join().unwrap();
}
