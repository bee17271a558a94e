//! The `ctlplane` program: a consumer until SIGTERM, and the operator's `ec` tool.

mod common;

use common::free_ports;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");

/// A running `ctlplane consumer`, killed if a test fails before it exits.
struct Consumer(Child);

impl Drop for Consumer {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Consumer {
    fn signal(&self, name: &str) {
        let kill = Command::new("kill").args([name, &self.0.id().to_string()]).status().unwrap();
        assert!(kill.success());
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.0.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "consumer did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `ctlplane consumer` and returns it with the lines it printed up to `ready`.
fn consumer(port: u16, tp: u32) -> (Consumer, Vec<String>) {
    let mut child = Consumer(
        Command::new(BIN)
            .args(["consumer", "--port", &port.to_string(), "--tp", &tp.to_string(), "--pool-bytes", "1048576"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    loop {
        let line = rx.recv_timeout(Duration::from_secs(15)).expect("consumer printed `ready`");
        if line == "ready" {
            return (child, lines);
        }
        lines.push(line);
    }
}

fn ec(args: &[&str]) -> Output {
    Command::new(BIN).arg("ec").args(args).output().unwrap()
}

fn stdout_json(out: &Output) -> Vec<Value> {
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn consumer_prints_its_shards_answers_the_ec_tool_and_exits_0_on_sigterm() {
    let port = free_ports(2);
    let (mut child, lines) = consumer(port, 2);
    assert_eq!(lines.len(), 2, "{lines:?}");
    for (rank, line) in lines.iter().enumerate() {
        let prefix =
            format!("shard rank={rank} control=tcp://127.0.0.1:{} events=tcp://127.0.0.1:", port + rank as u16);
        assert!(line.starts_with(&prefix), "{line}");
    }
    let addr = format!("tcp://127.0.0.1:{port}");

    let peers = stdout_json(&ec(&["peers", "--addr", &addr]));
    assert_eq!(peers, [json!({"ports": [port, port + 1]})]);

    let events = stdout_json(&ec(&["event-port", "--addr", &addr, "--all-shards"]));
    assert_eq!(events.len(), 2);
    for (line, event) in lines.iter().zip(&events) {
        assert!(line.ends_with(&format!(":{}", event["result"])), "{line} vs {event}");
    }

    let reserve = ["reserve", "--addr", &addr, "--transfer-id", "t1", "--mm-hash", "h1", "--shape", "64,128"];
    let granted = stdout_json(&ec(&[&reserve[..], &["--dtype", "float16", "--all-shards"]].concat()));
    assert_eq!(granted.len(), 2);
    assert!(granted.iter().all(|g| g["result"]["write"] == true && g["result"]["nbytes"] == 16384));
    let rid = granted[0]["result"]["reservation_id"].as_str().unwrap();
    let done = stdout_json(&ec(&["complete", "--addr", &addr, "--transfer-id", "t1", "--reservation-id", rid]));
    assert_eq!(done, [json!({"completed": true, "became_ready": true})]);
    let status = stdout_json(&ec(&["status", "--addr", &addr, "--transfer-id", "t1"]));
    assert_eq!(status[0]["ready"], true);
    let cancel = stdout_json(&ec(&["cancel", "--addr", &addr, "--transfer-id", "t9", "--abandon"]));
    assert_eq!(cancel.len(), 1);

    let refused = ec(&["status", "--addr", &addr]);
    assert!(!refused.status.success());

    child.signal("-TERM");
    assert_eq!(child.wait_exit().code(), Some(0));
}

#[test]
fn ec_tool_reports_failures_on_stderr_with_exit_code_1() {
    let port = free_ports(1);
    let out = ec(&["peers", "--addr", &format!("tcp://127.0.0.1:{port}"), "--timeout-ms", "200"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("timed out after 200 ms"), "{stderr}");

    let out = ec(&["peers", "--addr", &format!("tcp://127.0.0.1:{port}"), "--timeout-ms", "200", "--all-shards"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Could not discover every EC consumer shard"));
}

#[test]
fn consumer_on_a_port_in_use_fails_to_bind() {
    let port = free_ports(1);
    let (mut first, _) = consumer(port, 1);
    let out = Command::new(BIN).args(["consumer", "--port", &port.to_string()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("failed to bind") && stderr.contains("Address already in use"), "{stderr}");
    first.signal("-INT");
    assert_eq!(first.wait_exit().code(), Some(0));
}
