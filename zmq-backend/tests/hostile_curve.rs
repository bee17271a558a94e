//! CURVE (cargo feature `curve`, linked against the system libzmq): a client without the
//! server's public key gets no answer, one with it is served, on the EC channel, its
//! events and the P2P transport, through the library and the `ctlplane` program.
//!
//! cargo test -p ctlplane-zmq --features curve --config zmq-backend/system-libzmq.toml --test hostile_curve
#![cfg(feature = "curve")]

mod common;

use common::{free_ports, spec, Proc, PATIENCE};
use ctlplane_core::ec::ShardConfig;
use ctlplane_core::p2p::Value;
use ctlplane_zmq::{
    ConsumerControlServer, ControlClient, CurveClient, CurveServer, KeyPair, ServerOptions, TransportOptions,
    ZmqTransport,
};
use rand_core::OsRng;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");

fn curve_server() -> (ConsumerControlServer<OsRng>, KeyPair) {
    let keys = KeyPair::generate().expect("this libzmq has CURVE");
    let options = ServerOptions { curve: Some(CurveServer { keys: keys.clone() }), ..ServerOptions::default() };
    let server =
        ConsumerControlServer::start_with("127.0.0.1", ShardConfig::new(free_ports(1), 1 << 20), OsRng, options)
            .unwrap();
    (server, keys)
}

fn client_of(server_key: [u8; 32], timeout_ms: u64) -> ControlClient {
    let curve = CurveClient { server_key, keys: KeyPair::generate().unwrap() };
    ControlClient::new(timeout_ms).with_curve(curve)
}

#[test]
fn ec_server_answers_only_clients_that_know_its_key() {
    let (server, keys) = curve_server();
    let addr = server.endpoint().to_string();

    // NULL security: the handshake fails, nothing is ever answered.
    let plain = ControlClient::new(500);
    assert!(plain.request_frame(&addr, br#"{"op": "peers"}"#).is_err(), "an unauthenticated client was served");
    plain.close();
    // CURVE with another server's key: no answer either.
    let wrong = client_of(KeyPair::generate().unwrap().public, 500);
    assert!(wrong.request_frame(&addr, br#"{"op": "peers"}"#).is_err(), "a client with a wrong key was served");
    wrong.close();
    assert_eq!(server.stats().requests, 0, "the shard saw a request from an unauthenticated client");

    let good = client_of(keys.public, 5_000);
    let granted = good.reserve(&addr, &spec("t1", "h1")).unwrap();
    let rid = granted["reservation_id"].as_str().unwrap().to_string();
    assert!(good.complete(&addr, "t1", &rid).unwrap().became_ready);

    // Events: a NULL PULL gets nothing; the CURVE inbox of the same client gets the event.
    let ctx = zmq::Context::new();
    let pull = ctx.socket(zmq::PULL).unwrap();
    pull.set_rcvtimeo(500).unwrap();
    pull.set_linger(0).unwrap();
    pull.connect(server.event_endpoint()).unwrap();
    assert_eq!(pull.recv_bytes(0).err(), Some(zmq::Error::EAGAIN), "an unauthenticated PULL got an event");
    let client = std::sync::Arc::new(good);
    let mut inbox = ctlplane_zmq::EventInbox::new(client.clone(), &addr);
    let deadline = Instant::now() + PATIENCE;
    let mut events = Vec::new();
    while events.is_empty() && Instant::now() < deadline {
        events.extend(inbox.drain().events);
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(events.first().map(|e| e.transfer_id.as_str()), Some("t1"));
    inbox.close();
    client.close();
}

#[test]
fn p2p_nodes_talk_only_with_the_cluster_key() {
    let cluster = KeyPair::generate().unwrap();
    let opts = || TransportOptions {
        curve: Some(CurveClient { server_key: cluster.public, keys: cluster.clone() }),
        ..TransportOptions::default()
    };
    let mut a = ZmqTransport::bind_with("127.0.0.1", 0, opts()).unwrap();
    let mut b = ZmqTransport::bind_with("127.0.0.1", 0, opts()).unwrap();
    let mut outsider = ZmqTransport::bind("127.0.0.1", 0).unwrap();
    let hello = Value::map([("type", Value::from("lookup"))]);
    outsider.connect(a.local_id()).unwrap();
    outsider.send(a.local_id(), &hello).unwrap();
    b.connect(a.local_id()).unwrap();
    b.send(a.local_id(), &hello).unwrap();
    let deadline = Instant::now() + PATIENCE;
    let mut accepted = Vec::new();
    while accepted.is_empty() && Instant::now() < deadline {
        a.wait(Duration::from_millis(50)).unwrap();
        accepted.extend(a.poll());
    }
    // Give the outsider as long again: it must never be accepted.
    let settle = Instant::now() + Duration::from_millis(500);
    while Instant::now() < settle {
        a.wait(Duration::from_millis(50)).unwrap();
        accepted.extend(a.poll());
    }
    assert_eq!(accepted, [b.local_id().to_string()]);
    assert_eq!(a.recv(b.local_id()), [hello]);
    for t in [&mut a, &mut b, &mut outsider] {
        t.close();
    }
}

#[test]
fn ctlplane_commands_take_curve_keys() {
    let dir = std::env::temp_dir().join(format!("ctlplane-curve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("server.key");
    let _ = std::fs::remove_file(&key_file);
    let out = Command::new(BIN).args(["curve-keygen", "--out"]).arg(&key_file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let public = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(public.len(), 40);

    let port = free_ports(1);
    let consumer = Proc::spawn({
        let mut cmd = Command::new(BIN);
        cmd.args(["consumer", "--port", &port.to_string(), "--curve-secret-key-file"]).arg(&key_file);
        cmd
    });
    consumer.wait_ready();
    let addr = format!("tcp://127.0.0.1:{port}");
    let ec = |extra: &[&str]| {
        Command::new(BIN).args(["ec", "peers", "--addr", &addr, "--timeout-ms", "1000"]).args(extra).output().unwrap()
    };
    let out = ec(&[]);
    assert_eq!(out.status.code(), Some(1), "served without a key");
    assert!(String::from_utf8_lossy(&out.stderr).contains("timed out"));
    let out = ec(&["--curve-server-key", &public]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), format!(r#"{{"ports":[{port}]}}"#));
    std::fs::remove_dir_all(&dir).unwrap();
}
