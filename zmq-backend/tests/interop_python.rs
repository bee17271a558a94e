//! Interop with Python peers written from the reference (tests/interop/*.py, pyzmq): a
//! Python producer and scheduler against `ctlplane consumer`, and the Rust client and
//! event inbox against a Python consumer.
//!
//! The interpreter is `$CTLPLANE_PYTHON`, else the workspace's `.venv` that
//! `scripts/test.sh` provisions (pyzmq, msgspec).

mod common;

use common::{free_ports, next_events, python, spec, start_until_ready, until_subscribed, workspace};
use ctlplane_core::ec::readiness::{EventFate, Readiness};
use ctlplane_core::Instant;
use ctlplane_zmq::{ControlClient, EventInbox};
use std::process::Command;
use std::sync::Arc;

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");

#[test]
fn python_producer_and_scheduler_against_a_rust_consumer() {
    let port = free_ports(3);
    let mut cmd = Command::new(BIN);
    cmd.args(["consumer", "--port", &port.to_string(), "--tp", "3", "--pool-bytes", "1048576"]);
    let _consumer = start_until_ready(cmd);
    let out = Command::new(python())
        .current_dir(workspace().join("tests/interop"))
        .args(["ec_python_client.py", "--addr", &format!("tcp://127.0.0.1:{port}"), "--tp", "3"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "python client failed: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(summary, serde_json::json!({"ok": true, "shards": 3, "events": 3}));
}

#[test]
fn rust_client_and_event_inbox_against_a_python_consumer() {
    let port = free_ports(2);
    let mut cmd = Command::new(python());
    cmd.current_dir(workspace().join("tests/interop"));
    cmd.args(["ec_python_consumer.py", "--port", &port.to_string(), "--tp", "2"]);
    let _consumer = start_until_ready(cmd);
    let base = format!("tcp://127.0.0.1:{port}");
    let client = Arc::new(ControlClient::new(5_000));
    let shards = client.shards(&base).unwrap();
    assert_eq!(shards, [base.clone(), format!("tcp://127.0.0.1:{}", port + 1)]);

    let mut inbox = EventInbox::new(client.clone(), &base);
    until_subscribed(&mut inbox);
    assert_eq!(inbox.shard_count(), 2);
    let mut readiness = Readiness::default();
    let (transfer_id, mm_hash) = ("0123456789abcdef0123456789abcdef", "ab".repeat(32));
    for (rank, shard) in shards.iter().enumerate() {
        let granted = client.reserve(shard, &spec(transfer_id, &mm_hash)).unwrap();
        assert_eq!(granted["write"], true, "{granted}");
        let rid = granted["reservation_id"].as_str().unwrap();
        let done = client.complete(shard, transfer_id, rid).unwrap();
        assert!(done.completed && done.became_ready);

        let [event] = <[_; 1]>::try_from(next_events(&mut inbox, 1)).unwrap();
        assert_eq!(event.shard, Some(i64::from(port) + rank as i64), "tagged with the shard's port");
        assert_eq!((event.transfer_id.as_str(), event.mm_hash.as_str()), (transfer_id, mm_hash.as_str()));
        assert_eq!((event.nbytes, event.shape.as_slice(), event.dtype.as_str()), (16384, &[64, 128][..], "float16"));
        let fate = readiness.handle_event(event, inbox.shard_count(), Instant::ZERO);
        assert_eq!(fate, if rank == 0 { EventFate::Partial } else { EventFate::Accepted });
    }
    inbox.close();
    client.close();
}
