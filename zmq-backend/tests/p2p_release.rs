//! Conformance with the released vLLM P2P transport: the release's own `ZmqTransport`,
//! loaded from its wheel at test time by tests/conformance/p2p_release.py (the pinned
//! version is set there), against ctlplane's transport and `ctlplane p2p echo`, both ways,
//! and the full-queue refusal compared side by side.

mod common;

use common::{free_ports, python, workspace, Proc};
use ctlplane_core::p2p::Value;
use ctlplane_zmq::{P2pError, ZmqTransport};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");
/// Loading the release from its wheel (downloaded on the first run) can take a while.
const START: Duration = Duration::from_secs(300);
const SOON: Duration = Duration::from_secs(30);

/// `p2p_release.py MODE ARGS...`, started and waited for until bound.
fn release_peer(mode: &str, args: &[&str]) -> Proc {
    let mut cmd = Command::new(python());
    cmd.current_dir(workspace().join("tests/conformance")).arg("p2p_release.py").arg(mode).args(args);
    let peer = Proc::spawn(cmd);
    assert_eq!(peer.line(START).as_deref(), Some("ready"), "stderr:\n{}", peer.stderr());
    peer
}

/// Messages of every msgpack type the control messages use.
fn typed() -> Vec<Value> {
    vec![
        Value::map([
            ("type", Value::from("fetch")),
            ("kv_request_id", Value::from("req-1")),
            ("keys", Value::Array(vec![Value::Bin(vec![0, 1, 255]), Value::Bin(vec![])])),
            ("block_indexes", Value::Array(vec![Value::Int(0), Value::Int(7), Value::Int(2_147_483_647)])),
            ("round_seq", Value::Int(0)),
        ]),
        Value::map([
            ("type", Value::from("ints")),
            ("u64max", Value::Int(i128::from(u64::MAX))),
            ("i64min", Value::Int(i128::from(i64::MIN))),
            ("neg", Value::Int(-1)),
        ]),
        Value::map([
            ("type", Value::from("nested")),
            ("m", Value::map([("inner", Value::Array(vec![Value::Bool(true), Value::Nil, Value::Float(1.5)]))])),
            ("s", Value::from("h\u{e9}llo \u{2713}")),
            ("big", Value::Bin((0..=255).cycle().take(70_000).collect())),
        ]),
    ]
}

fn bind() -> ZmqTransport {
    ZmqTransport::bind("127.0.0.1", 0).unwrap()
}

#[test]
fn the_release_echoes_ctlplane_messages_with_exact_types() {
    let port = free_ports(1);
    let _peer = release_peer("echo", &["--port", &port.to_string()]);
    let mut t = bind();
    let to = format!("127.0.0.1:{port}");
    t.connect(&to).unwrap();
    let sent = typed();
    for m in &sent {
        t.send(&to, m).unwrap();
    }
    let mut got = Vec::new();
    let deadline = Instant::now() + SOON;
    while got.len() < sent.len() {
        assert!(Instant::now() < deadline, "echoes missing: {got:?}");
        t.wait(Duration::from_millis(20)).unwrap();
        t.poll();
        got.extend(t.recv(&to));
    }
    assert_eq!(got, sent);
}

#[test]
fn ctlplane_p2p_echo_answers_the_release_with_exact_types() {
    let port = free_ports(1);
    let mut echo = Command::new(BIN);
    echo.args(["p2p", "echo", "--port", &port.to_string()]);
    let mut echo = Proc::spawn(echo);
    echo.wait_ready();
    let mut peer = release_peer("send-types", &["--to", &format!("127.0.0.1:{port}")]);
    assert!(peer.wait_exit(SOON).success(), "stderr:\n{}", peer.stderr());
    let verdict: serde_json::Value = serde_json::from_str(&peer.line(SOON).unwrap()).unwrap();
    assert_eq!(verdict, json!({"ok": true, "received": 5, "mismatch": []}));
    echo.signal("-TERM");
    assert!(echo.wait_exit(SOON).success());
}

#[test]
fn a_full_queue_is_refused_with_the_release_error_on_both_sides() {
    // The release fills its queue to a ctlplane node that never reads.
    let stopped = bind();
    let stopped_id = stopped.local_id().to_string();
    let mut peer = release_peer("fill", &["--to", &stopped_id]);
    assert!(peer.wait_exit(SOON).success(), "stderr:\n{}", peer.stderr());
    let release: serde_json::Value = serde_json::from_str(&peer.line(SOON).unwrap()).unwrap();
    assert_eq!(release["error"], json!("ConnectionError"));
    assert_eq!(release["message"], json!(format!("ZmqConnection: send queue to {stopped_id} is full")));
    assert!(release["sent"].as_u64().is_some_and(|n| n >= 1_000), "{release}");

    // ctlplane fills its queue to a release node that never reads.
    let port = free_ports(1);
    let frozen = release_peer("echo", &["--port", &port.to_string()]);
    frozen.signal("-STOP");
    let mut t = bind();
    let to = format!("127.0.0.1:{port}");
    t.connect(&to).unwrap();
    let msg = Value::map([("type", Value::from("lookup")), ("kv_request_id", Value::from("fill"))]);
    let mut sent: u64 = 0;
    let error = loop {
        match t.send(&to, &msg) {
            Ok(()) => sent += 1,
            Err(e) => break e,
        }
        assert!(sent < 10_000_000, "the queue never filled");
    };
    frozen.signal("-CONT");
    assert!(matches!(&error, P2pError::QueueFull { peer } if *peer == to), "{error}");
    assert_eq!(error.to_string(), format!("ZmqConnection: send queue to {to} is full"));
    assert!(sent >= 1_000, "{sent}");
}
