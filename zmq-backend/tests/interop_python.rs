//! Interop with Python peers written from the reference (tests/interop/*.py, pyzmq):
//! a Python producer and scheduler against `ctlplane consumer`.
//!
//! The interpreter is `$CTLPLANE_PYTHON`, else the workspace's `.venv-interop` that
//! `.ci/run` creates (`python3 -m venv .venv-interop && pip install pyzmq msgspec`).

mod common;

use common::{free_ports, python, workspace};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");

/// A child process killed when the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a server process and waits for its `ready` line.
fn start_until_ready(mut cmd: Command) -> Running {
    let mut child = Running(cmd.stdout(Stdio::piped()).stderr(Stdio::null()).stdin(Stdio::piped()).spawn().unwrap());
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = rx.recv_timeout(Duration::from_secs(20)).expect("server printed `ready`");
        if line == "ready" {
            return child;
        }
    }
}

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
