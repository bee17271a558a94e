//! Soak with faults on real ZMQ: `ctlplane push` against `ctlplane consumer`, the
//! consumer killed (SIGKILL) and restarted twice under load. Every item must end pushed,
//! failed or skipped in the producer's own count (none silently lost), the same producer
//! process must push again after each restart (no client restart), and once the load
//! stops the restarted consumer must hold no reservation or tombstone past its TTL.
//!
//! Each kill waits until the running consumer has completed pushes (the load is on it),
//! and each consumer stays down longer than the producer's request timeout, so a batch
//! started in the gap fails whatever the machine's load: the test never depends on a
//! request happening to be in flight at the instant of the kill.

mod common;

use common::{free_ports, Proc};
use serde_json::Value;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");
/// Reservation and tombstone lifetime of the consumer under test.
const TTL_MS: u64 = 2_000;
/// The shard's reap interval: a record past its deadline goes at the next reap.
const REAP_MS: u64 = 1_000;
const ITEMS: u64 = 3_000;
/// The producer's request timeout (`--timeout-ms`).
const TIMEOUT_MS: u64 = 400;
/// How long each killed consumer stays down: well past `TIMEOUT_MS`.
const DOWN: Duration = Duration::from_millis(3 * TIMEOUT_MS);

fn consumer(port: u16) -> Proc {
    let mut cmd = Command::new(BIN);
    cmd.args(["consumer", "--port", &port.to_string(), "--tp", "2", "--pool-bytes", &(64u64 << 20).to_string()])
        .args(["--ttl-ms", &TTL_MS.to_string(), "--stats-interval-ms", "100"]);
    let proc = Proc::spawn(cmd);
    proc.wait_ready();
    proc
}

/// The latest stats line of every rank that `consumer` printed within `wait`.
fn stats(consumer: &Proc, wait: Duration) -> [Option<Value>; 2] {
    let mut latest = [None, None];
    let deadline = Instant::now() + wait;
    while let Some(line) = consumer.line(deadline.saturating_duration_since(Instant::now())) {
        let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
        if let Some(rank) = v["rank"].as_u64().filter(|&r| r < 2) {
            latest[rank as usize] = Some(v);
        }
    }
    latest
}

/// Reads `consumer`'s stats until a rank reports a completed push (the producer's load is
/// on it); panics after `PATIENCE`.
fn until_loaded(consumer: &Proc) {
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = consumer.line(left).unwrap_or_else(|| panic!("the consumer saw no push; {}", consumer.stderr()));
        let Ok(v) = serde_json::from_str::<Value>(&line) else { continue };
        if v["events_queued"].as_u64() > Some(0) {
            return;
        }
    }
}

fn kill_and_restart(consumer: &mut Proc, port: u16) -> Proc {
    until_loaded(consumer);
    consumer.signal("-KILL");
    consumer.wait_exit(Duration::from_secs(10));
    // Down for longer than the request timeout: a batch started now cannot succeed.
    std::thread::sleep(DOWN);
    self::consumer(port)
}

#[test]
fn push_survives_two_consumer_restarts_and_nothing_outlives_its_ttl() {
    let port = free_ports(2);
    let mut first = consumer(port);
    let started = Instant::now();
    let mut push = Command::new(BIN);
    push.args(["push", "--consumer", &format!("tcp://127.0.0.1:{port}"), "--items", &ITEMS.to_string()])
        .args(["--nbytes", "4096", "--batch", "4", "--concurrency", "2", "--batch-interval-ms", "8"])
        .args(["--timeout-ms", &TIMEOUT_MS.to_string(), "--no-events"]);
    let mut push = Proc::spawn(push);

    let mut second = kill_and_restart(&mut first, port);
    let second_up = started.elapsed();
    let third = kill_and_restart(&mut second, port);
    let third_up = started.elapsed();
    let running_at_third = push.child.try_wait().map(|s| s.is_none()).unwrap_or(false);

    let status = push.wait_exit(Duration::from_secs(60));
    let load_done = Instant::now();
    let summary = push.line(Duration::from_secs(1)).unwrap_or_else(|| panic!("no summary; {}", push.stderr()));
    let summary: Value = serde_json::from_str(&summary).unwrap();
    eprintln!("soak: restarts at {second_up:?} and {third_up:?}; push summary {summary}");
    let count = |k: &str| summary[k].as_u64().unwrap_or_else(|| panic!("{k} missing in {summary}"));
    assert_eq!(count("pushed") + count("failed") + count("skipped"), ITEMS, "items lost without a report: {summary}");
    assert!(count("failed") > 0, "the restarts cost no item, so they did not hit the load: {summary}");
    assert_eq!(status.code(), Some(1), "push exits 1 when items failed");
    assert!(push.stderr().contains("first failure:"), "{}", push.stderr());
    assert!(running_at_third, "push ended before the second restart ({second_up:?}, {third_up:?}): {summary}");

    // The last consumer served completions of the same producer process.
    let after = stats(&third, Duration::from_millis(300));
    for (rank, s) in after.iter().enumerate() {
        let s = s.as_ref().unwrap_or_else(|| panic!("rank {rank} printed no stats; {}", third.stderr()));
        assert!(s["events_queued"].as_u64() > Some(0), "rank {rank} of the restarted consumer completed nothing: {s}");
    }

    // Once the load stops, every reservation and tombstone is gone within TTL + one reap.
    let bound = Duration::from_millis(TTL_MS + REAP_MS + 500);
    std::thread::sleep(bound.saturating_sub(load_done.elapsed()));
    let end = stats(&third, Duration::from_millis(400));
    for (rank, s) in end.iter().enumerate() {
        let s = s.as_ref().unwrap_or_else(|| panic!("rank {rank} printed no stats"));
        assert_eq!(
            (s["records"].as_u64(), s["tombstones"].as_u64(), s["writer_owned"].as_u64()),
            (Some(0), Some(0), Some(0)),
            "rank {rank} holds reservations {bound:?} after the load stopped: {s}"
        );
    }
}
