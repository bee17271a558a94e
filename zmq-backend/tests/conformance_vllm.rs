//! EC conformance against the vLLM release itself (tests/conformance/ec_consumer.py).
//!
//! The Python side loads the release's Mooncake EC modules from its wheel at test time
//! (downloading the pinned version once into `~/.cache/ctlplane`, see
//! tests/conformance/vllm_release.py), then (1) drives `ctlplane consumer` with the
//! release's own `ControlClient`, `make_cancel_request` and `EventInbox`, and (2) sends
//! the same seeded request streams, every class of docs/ec-behaviour.md's parity list
//! included, to `ctlplane consumer` and to the release's consumer, comparing replies and
//! readiness events one for one.
//!
//! The interpreter is `$CTLPLANE_PYTHON`, else the workspace's `.venv` that `scripts/test.sh` provisions.

mod common;

use common::{free_ports, python, start_until_ready, workspace, Running};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");
const POOL_BYTES: &str = "1048576";

/// Starts `ctlplane consumer` and waits for its `ready` line.
fn start_consumer(port: u16) -> Running {
    let mut cmd = Command::new(BIN);
    cmd.args(["consumer", "--port", &port.to_string(), "--tp", "1", "--pool-bytes", POOL_BYTES]);
    start_until_ready(cmd)
}

#[test]
fn ctlplane_consumer_answers_as_the_vllm_release_does() {
    let port = free_ports(1);
    let _consumer = start_consumer(port);
    let out = Command::new(python())
        .current_dir(workspace().join("tests/conformance"))
        .args([
            "ec_consumer.py",
            "--ctlplane",
            &format!("tcp://127.0.0.1:{port}"),
            "--pool-bytes",
            POOL_BYTES,
            "--seeds",
            "0..20",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "conformance failed: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    let summary: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(summary["ok"], true, "{summary}");
    assert_eq!(summary["inbox_events"], 1, "{summary}");
    // Every class of the parity list was exercised.
    for class in ["plain", "zero", "negative", "dict-shape", "arabic", "bad-dtype", "iterables", "json", "batch"] {
        assert!(summary["classes"][class].as_u64().unwrap_or(0) > 0, "class {class} never ran: {summary}");
    }
    assert!(summary["events"].as_u64().unwrap_or(0) > 0, "{summary}");
}
