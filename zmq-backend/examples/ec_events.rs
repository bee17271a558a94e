//! Readiness-event throughput of a consumer shard: the core's queue, the server's PUSH
//! socket to a PULL on loopback, and bare libzmq PUSH/PULL as the baseline.
//!
//! ```sh
//! cargo run --release -p ctlplane-zmq --example ec_events -- all 200000
//! ```
//!
//! Modes (`M` events each; every event is a distinct 32-hex transfer id turned READY by its
//! writer's completion, the frame a Python `EventInbox` reads, ~230 bytes):
//!
//! - `core M`: no sockets. `complete_batch` requests of 1024 items queue M events in a
//!   warm `ConsumerShard` (decode, complete, event and reply encoding), then
//!   `peek_event` / `confirm_sent` drain them.
//! - `flush M`: a `ConsumerControlServer` with M events queued while it waits (backlog
//!   raised to M), then one request wakes its loop: PULL receive rate of the flush alone.
//! - `e2e M`: a `ControlClient` sends `complete_batch` requests of 1024 items (through
//!   `ControlClient::complete_batch`, which reads the typed outcomes) to the
//!   server (default backlog of 4096); PULL receive rate from the first request to the
//!   last event.
//! - `raw M`: the same frames from a bare PUSH (blocking sends) to a PULL.
//! - `all M`: each of the above.
//!
//! An optional third argument sets the server's receive tick in ms (`ServerOptions::
//! recv_timeout`, default 100 as in production): the loop flushes events only between
//! requests and ticks, so a flush that fills the PUSH high-water mark waits for one.

use ctlplane_core::ec::shard::reply_result;
use ctlplane_core::ec::{ConsumerShard, DType, ShardConfig};
use ctlplane_core::Instant as CoreInstant;
use ctlplane_zmq::requests::{self, ReserveSpec};
use ctlplane_zmq::{ConsumerControlServer, ControlClient, ServerOptions};
use rand_core::{OsRng, RngCore};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const BATCH: usize = 1024;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn config(backlog: usize) -> ShardConfig {
    let mut config = ShardConfig::new(free_port(), 1 << 40);
    config.dst_session = "10.0.0.5:15417".into();
    config.max_pending_events = backlog;
    config
}

fn spec(i: u64) -> ReserveSpec {
    ReserveSpec {
        transfer_id: format!("{i:032x}"),
        mm_hash: format!("{i:064x}"),
        shape: vec![64, 128],
        dtype: DType::Float16,
    }
}

/// Reserves M writers on `shard` (not timed) and returns the `complete_batch` items, in
/// batches of `BATCH`, that turn them all READY: `(transfer_id, reservation_id)`.
fn reserve_all<R: RngCore>(shard: &mut ConsumerShard<R>, m: u64) -> Vec<Vec<(String, String)>> {
    let now = CoreInstant::from_secs(1);
    let mut batches = Vec::new();
    let ids: Vec<u64> = (0..m).collect();
    for chunk in ids.chunks(BATCH) {
        let specs: Vec<ReserveSpec> = chunk.iter().map(|&i| spec(i)).collect();
        let reply = shard.handle_request(&requests::reserve_batch(&specs).unwrap(), now);
        let granted = requests::parse_reserve_batch(&reply_result(&reply).unwrap(), specs.len()).unwrap();
        let rids: Vec<String> =
            granted.iter().map(|g| g.as_ref().unwrap()["reservation_id"].as_str().unwrap().to_string()).collect();
        batches.push(specs.into_iter().zip(rids).map(|(s, r)| (s.transfer_id, r)).collect());
    }
    batches
}

/// The `complete_batch` frame of each batch.
fn frames(batches: &[Vec<(String, String)>]) -> Vec<Vec<u8>> {
    batches.iter().map(|b| requests::complete_batch(b.iter().map(|(t, r)| (t.as_str(), r.as_str())))).collect()
}

fn rate(n: u64, d: Duration) -> String {
    format!("{:>10.0} /s  ({:.0} ns each, {n} in {d:.2?})", n as f64 / d.as_secs_f64(), d.as_nanos() as f64 / n as f64)
}

/// The timed part of `core`, kept out of line so callgrind reports it on its own.
#[inline(never)]
fn queue_events<R: RngCore>(shard: &mut ConsumerShard<R>, frames: &[Vec<u8>]) {
    for frame in frames {
        shard.handle_request(frame, CoreInstant::from_secs(2));
    }
}

/// The other timed part of `core`; returns the bytes drained.
#[inline(never)]
fn drain_events<R: RngCore>(shard: &mut ConsumerShard<R>) -> usize {
    let mut bytes = 0;
    while let Some(frame) = shard.peek_event() {
        bytes += frame.len();
        shard.confirm_sent();
    }
    bytes
}

fn core(m: u64) {
    let mut shard = ConsumerShard::new(config(m as usize), OsRng, CoreInstant::ZERO);
    let frames = frames(&reserve_all(&mut shard, m));
    let started = Instant::now();
    queue_events(&mut shard, &frames);
    let queued = started.elapsed();
    assert_eq!(shard.pending_events() as u64, m);
    let started = Instant::now();
    let bytes = drain_events(&mut shard);
    let drained = started.elapsed();
    println!("core  complete_batch -> queue: {}", rate(m, queued));
    println!("core  peek_event + confirm:    {}  (avg frame {} B)", rate(m, drained), bytes as u64 / m);
}

/// What a PULL saw.
struct Received {
    count: u64,
    first: Instant,
    last: Instant,
}

/// A PULL connected to `endpoint` receiving up to `m` frames on a thread, giving up 2 s
/// after the last one (dropped events never come).
fn pull(endpoint: &str, m: u64) -> (JoinHandle<Received>, zmq::Context) {
    let ctx = zmq::Context::new();
    let socket = ctx.socket(zmq::PULL).unwrap();
    socket.set_linger(0).unwrap();
    socket.connect(endpoint).unwrap();
    let thread = std::thread::spawn(move || {
        let mut received = Received { count: 0, first: Instant::now(), last: Instant::now() };
        while received.count < m {
            match socket.recv_bytes(0) {
                Ok(_) => {}
                Err(zmq::Error::EAGAIN) => break,
                Err(e) => panic!("{e}"),
            }
            received.last = Instant::now();
            if received.count == 0 {
                received.first = received.last;
                socket.set_rcvtimeo(2000).unwrap();
            }
            received.count += 1;
        }
        received
    });
    (thread, ctx)
}

fn options(tick_ms: u64) -> ServerOptions {
    ServerOptions { recv_timeout: Duration::from_millis(tick_ms), ..ServerOptions::default() }
}

fn flush(m: u64, tick_ms: u64) {
    let server = ConsumerControlServer::start_with("127.0.0.1", config(m as usize), OsRng, options(tick_ms)).unwrap();
    let frames = frames(&server.with_shard(|shard| reserve_all(shard, m)));
    let (receiver, _ctx) = pull(server.event_endpoint(), m);
    std::thread::sleep(Duration::from_millis(200)); // PULL connected
    server.with_shard(|shard| {
        for frame in &frames {
            shard.handle_request(frame, CoreInstant::from_secs(2));
        }
    });
    // Wakes the loop at once rather than at its next tick.
    ControlClient::new(5000).event_port(server.endpoint()).unwrap();
    let got = receiver.join().unwrap();
    let stats = server.stats();
    println!(
        "flush server PUSH -> PULL:      {}  ({tick_ms} ms tick; first to last event; sent {}, dropped {})",
        rate(got.count, got.last - got.first),
        stats.events_sent,
        stats.events_dropped
    );
}

fn e2e(m: u64, tick_ms: u64) {
    let server = ConsumerControlServer::start_with("127.0.0.1", config(4096), OsRng, options(tick_ms)).unwrap();
    let batches = server.with_shard(|shard| reserve_all(shard, m));
    let batches: Vec<Vec<(&str, &str)>> =
        batches.iter().map(|b| b.iter().map(|(t, r)| (t.as_str(), r.as_str())).collect()).collect();
    let (receiver, _ctx) = pull(server.event_endpoint(), m);
    std::thread::sleep(Duration::from_millis(200));
    let client = ControlClient::new(5000);
    let addr = server.endpoint().to_string();
    client.event_port(&addr).unwrap();
    let started = Instant::now();
    let mut ready = 0;
    for batch in &batches {
        ready += client.complete_batch(&addr, batch).unwrap().iter().filter(|c| c.became_ready).count();
    }
    assert_eq!(ready as u64, m);
    let requests_done = started.elapsed();
    // The last batch's events go out on the loop's next turn.
    client.event_port(&addr).unwrap();
    let got = receiver.join().unwrap();
    let stats = server.stats();
    println!(
        "e2e   complete_batch -> PULL:   {}  ({tick_ms} ms tick; requests done after {requests_done:.2?}; received {}, dropped {})",
        rate(got.count, got.last - started),
        got.count,
        stats.events_dropped
    );
}

fn raw(m: u64) {
    let mut shard = ConsumerShard::new(config(1), OsRng, CoreInstant::ZERO);
    let frames = frames(&reserve_all(&mut shard, 1));
    shard.handle_request(&frames[0], CoreInstant::from_secs(2));
    let event = shard.peek_event().unwrap().to_vec();
    let ctx = zmq::Context::new();
    let push = ctx.socket(zmq::PUSH).unwrap();
    push.set_linger(0).unwrap();
    push.bind("tcp://127.0.0.1:*").unwrap();
    let endpoint = push.get_last_endpoint().unwrap().unwrap();
    let (receiver, _ctx) = pull(&endpoint, m);
    std::thread::sleep(Duration::from_millis(200));
    let started = Instant::now();
    for _ in 0..m {
        push.send(&event[..], 0).unwrap();
    }
    let got = receiver.join().unwrap();
    println!("raw   libzmq PUSH -> PULL:     {}  ({} B frames)", rate(got.count, got.last - started), event.len());
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "all".into());
    let m: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(200_000);
    let tick_ms: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(100);
    match mode.as_str() {
        "core" => core(m),
        "flush" => flush(m, tick_ms),
        "e2e" => e2e(m, tick_ms),
        "raw" => raw(m),
        "all" => {
            core(m);
            flush(m, tick_ms);
            e2e(m, tick_ms);
            raw(m);
        }
        other => {
            eprintln!("unknown mode {other:?}: core | flush | e2e | raw | all");
            std::process::exit(2);
        }
    }
}
