//! `ctlplane push` and `ctlplane ec watch` against `ctlplane consumer` on loopback.

mod common;

use common::{free_ports, PATIENCE};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");

/// A child process killed when the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `ctlplane consumer` with `tp` shards from `port`, once it printed `ready`.
fn consumer(port: u16, tp: u32, pool_bytes: u64) -> Running {
    let mut cmd = Command::new(BIN);
    cmd.args(["consumer", "--port", &port.to_string(), "--tp", &tp.to_string()]);
    cmd.args(["--pool-bytes", &pool_bytes.to_string()]);
    let mut child = Running(cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap());
    let lines = lines_of(&mut child.0);
    loop {
        let line = lines.recv_timeout(PATIENCE).expect("consumer printed `ready`");
        if line == "ready" {
            return child;
        }
    }
}

/// The child's stdout, line by line, read on a thread.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn push(port: u16, args: &[&str]) -> Output {
    let consumer = format!("tcp://127.0.0.1:{port}");
    Command::new(BIN).args(["push", "--consumer", &consumer, "--timeout-ms", "5000"]).args(args).output().unwrap()
}

/// The one-line summary on stdout.
fn summary(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "stdout: {stdout}\nstderr: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_str(lines[0]).unwrap()
}

#[test]
fn push_to_a_tp2_consumer_pushes_every_item_and_every_shard_announces_each() {
    let port = free_ports(2);
    let _consumer = consumer(port, 2, 1 << 20);
    let out = push(port, &["--items", "64", "--nbytes", "4096", "--batch", "8"]);
    let s = summary(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{s}\n{stderr}");
    for (key, want) in [
        ("items", 64),
        ("pushed", 64),
        ("failed", 0),
        ("skipped", 0),
        ("batches", 8),
        ("shards", 2),
        ("bytes_written", 64 * 4096 * 2),
        // Each shard completed every item: every item was announced by both.
        ("events", 128),
        ("ready", 64),
        ("released", 64),
    ] {
        assert_eq!(s[key], want, "{key} in {s}");
    }
    for key in ["seconds", "items_per_s", "p50_ms", "p99_ms"] {
        assert!(s[key].as_f64().is_some_and(|v| v > 0.0), "{key} in {s}");
    }
    assert!(stderr.contains("pushed 64/64 items (0 failed, 0 skipped)"), "{stderr}");
}

#[test]
fn released_items_recycle_the_pool_and_kept_ones_fill_it() {
    let port = free_ports(1);
    // Room for four 16 KiB items.
    let _consumer = consumer(port, 1, 4 * 16384);
    let serial = ["--nbytes", "16384", "--batch", "1", "--concurrency", "1", "--no-events"];

    let out = push(port, &[&["--items", "12"][..], &serial].concat());
    let s = summary(&out);
    assert_eq!((out.status.code(), s["pushed"].as_u64(), s["released"].as_u64()), (Some(0), Some(12), Some(12)));

    let out = push(port, &[&["--items", "6", "--keep"][..], &serial].concat());
    let s = summary(&out);
    assert_eq!((s["pushed"].as_u64(), s["failed"].as_u64()), (Some(4), Some(2)), "{s}");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("first failure: EC consumer buffer pool is full"), "{stderr}");
}

#[test]
fn push_refuses_an_odd_item_size() {
    let out = push(free_ports(1), &["--items", "1", "--nbytes", "3"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a positive even number"));
}

#[test]
fn watch_prints_every_event_of_a_push() {
    let port = free_ports(2);
    let _consumer = consumer(port, 2, 1 << 20);
    let addr = format!("tcp://127.0.0.1:{port}");
    let mut watch = Running(
        Command::new(BIN)
            .args(["ec", "watch", "--addr", &addr, "--timeout-ms", "5000", "--count", "20"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let lines = lines_of(&mut watch.0);
    // The push does not subscribe, so every event goes to the watcher, even those the
    // shards queued before it connected.
    let out = push(port, &["--items", "10", "--nbytes", "256", "--batch", "4", "--no-events"]);
    assert_eq!(summary(&out)["pushed"], 10);

    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(status) = watch.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "watch did not exit after 20 events");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status.code(), Some(0));
    // The watcher exited, so its output ends: read it to the end.
    let events: Vec<Value> = lines.iter().map(|l| serde_json::from_str(&l).unwrap()).collect();
    assert_eq!(events.len(), 20);
    let mut shards_of: BTreeMap<String, BTreeSet<u64>> = BTreeMap::new();
    for e in &events {
        assert_eq!(
            (e["ready"].as_bool(), e["nbytes"].as_u64(), e["dtype"].as_str()),
            (Some(true), Some(256), Some("float16"))
        );
        assert_eq!(e["shape"], serde_json::json!([128]));
        let tid = e["transfer_id"].as_str().unwrap();
        assert_eq!(tid.len(), 32);
        assert_eq!(e["mm_hash"].as_str().map(str::len), Some(64));
        shards_of.entry(tid.to_string()).or_default().insert(e["shard"].as_u64().unwrap());
    }
    assert_eq!(shards_of.len(), 10, "{shards_of:?}");
    let both = BTreeSet::from([u64::from(port), u64::from(port) + 1]);
    assert!(shards_of.values().all(|s| *s == both), "{shards_of:?}");
}

#[test]
fn push_to_an_unreachable_consumer_fails_every_item_with_exit_code_1() {
    let consumer = format!("tcp://127.0.0.1:{}", free_ports(1));
    let out = Command::new(BIN)
        .args(["push", "--consumer", &consumer, "--timeout-ms", "200", "--items", "3", "--nbytes", "64"])
        .output()
        .unwrap();
    let s = summary(&out);
    assert_eq!((s["pushed"].as_u64(), s["failed"].as_u64(), s["shards"].as_u64()), (Some(0), Some(3), Some(0)), "{s}");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("first failure: Could not discover every EC consumer shard at {consumer}")),
        "{stderr}"
    );
}
