//! P2P transport throughput: small msgpack messages per second from one DEALER into a
//! `ZmqTransport`'s ROUTER, counted after `poll` (decode and routing included) and `recv`.
//!
//! Senders: another `ZmqTransport` on its own thread (3 rounds, median reported), then the
//! Python reference transport (`tests/interop/p2p_peer.py blast`) for the ratio, when the
//! interop Python (`$CTLPLANE_PYTHON` or `.venv`) is there.
//! `P2P_BENCH_N` sets the message count (default 200 000).
//!
//! Wall-clock rates depend on what else the machine runs (four busy threads: sender,
//! receiver and each context's I/O thread), so each side's on-CPU time per message is
//! printed too (Linux `schedstat`): the rate one core could sustain, load or not.
//!
//! `cargo bench -p ctlplane-zmq --bench p2p`

use ctlplane_core::p2p::Value;
use ctlplane_zmq::{P2pError, ZmqTransport};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const ROUNDS: usize = 3;

/// The allocator of the `ctlplane` program, so the bench measures what it runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What `p2p_peer.py blast` sends: a W1-shaped lookup, 52 bytes of msgpack.
fn message() -> Value {
    Value::map([
        ("type", Value::from("lookup")),
        ("kv_request_id", Value::from("req-000001")),
        ("keys", Value::Array(vec![Value::Bin(vec![0; 8])])),
        ("round_seq", Value::from(7u64)),
    ])
}

/// This thread's time on a CPU so far (`/proc/thread-self/schedstat`), if readable.
fn cpu_time() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    stat.split_whitespace().next()?.parse().ok().map(Duration::from_nanos)
}

/// Wall time from the first message to the last, and the receiving thread's CPU time.
struct Received {
    wall: Duration,
    cpu: Option<Duration>,
}

/// Polls `rx` until `n` messages from `sender` arrived.
fn receive(rx: &mut ZmqTransport, sender: &str, n: usize) -> Received {
    let mut count = 0;
    let mut first = None;
    let cpu_start = cpu_time();
    let deadline = Instant::now() + Duration::from_secs(300);
    while count < n {
        assert!(Instant::now() < deadline, "only {count} of {n} messages arrived");
        rx.wait(Duration::from_millis(100)).expect("wait");
        rx.poll();
        let got = rx.recv(sender).len();
        if got > 0 && first.is_none() {
            first = Some(Instant::now());
        }
        count += got;
    }
    let cpu = cpu_start.zip(cpu_time()).map(|(a, b)| b.saturating_sub(a));
    Received { wall: first.map_or(Duration::ZERO, |t| t.elapsed()), cpu }
}

/// `n` messages in `d`: M msg/s.
fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64() / 1e6
}

fn per_msg(n: usize, d: Option<Duration>) -> String {
    d.map_or("?".into(), |d| format!("{:.0}", d.as_nanos() as f64 / n as f64))
}

/// One round with a Rust sender: (wall rate, receiver CPU, sender CPU).
fn rust_round(n: usize) -> (f64, Option<Duration>, Option<Duration>) {
    let mut rx = ZmqTransport::bind("127.0.0.1", 0).expect("bind receiver");
    let rx_id = rx.local_id().to_string();
    let (id_tx, id_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let sender = std::thread::spawn(move || {
        let mut tx = ZmqTransport::bind("127.0.0.1", 0).expect("bind sender");
        id_tx.send(tx.local_id().to_string()).expect("id");
        let cpu_start = cpu_time();
        tx.connect(&rx_id).expect("connect");
        let msg = message();
        for _ in 0..n {
            loop {
                match tx.send(&rx_id, &msg) {
                    Ok(()) => break,
                    // The DEALER's queue is full: sleep until the receiver catches up.
                    Err(P2pError::QueueFull { .. }) => {
                        tx.wait_writable(&rx_id, Duration::from_millis(100)).expect("wait writable");
                    }
                    Err(e) => panic!("send failed: {e}"),
                }
            }
        }
        let cpu = cpu_start.zip(cpu_time()).map(|(a, b)| b.saturating_sub(a));
        // Closing flushes for at most the DEALER linger: stay until everything arrived.
        let _ = done_rx.recv();
        tx.close();
        cpu
    });
    let tx_id = id_rx.recv().expect("sender id");
    let got = receive(&mut rx, &tx_id, n);
    done_tx.send(()).expect("done");
    let sender_cpu = sender.join().expect("sender thread");
    (rate(n, got.wall), got.cpu, sender_cpu)
}

fn python() -> Option<PathBuf> {
    let path = std::env::var_os("CTLPLANE_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python"));
    let ok = Command::new(&path).args(["-c", "import zmq, msgspec"]).status().is_ok_and(|s| s.success());
    ok.then_some(path)
}

/// Python blasts `n` messages: (Rust receive rate, receiver CPU, Python's own send rate).
fn python_round(py: &PathBuf, n: usize) -> (f64, Option<Duration>, f64) {
    let mut rx = ZmqTransport::bind("127.0.0.1", 0).expect("bind receiver");
    let port = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("free port");
        probe.local_addr().expect("addr").port()
    };
    let py_id = format!("127.0.0.1:{port}");
    let child = Command::new(py)
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/interop"))
        .args(["p2p_peer.py", "blast", "--port", &port.to_string(), "--to", rx.local_id()])
        .args(["--count", &n.to_string(), "--timeout", "300"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn python");
    let got = receive(&mut rx, &py_id, n);
    rx.send(&py_id, &Value::map([("type", Value::from("done"))])).expect("done");
    let out = child.wait_with_output().expect("python exit");
    let text = String::from_utf8_lossy(&out.stdout);
    let report = text.lines().last().unwrap_or_default();
    let seconds: f64 = report
        .split("\"seconds\": ")
        .nth(1)
        .and_then(|s| s.split([',', '}']).next())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(f64::NAN);
    rx.close();
    (rate(n, got.wall), got.cpu, n as f64 / seconds / 1e6)
}

fn main() {
    let n: usize = std::env::var("P2P_BENCH_N").ok().and_then(|s| s.parse().ok()).unwrap_or(200_000);
    println!("p2p: {n} messages of {} bytes per round", ctlplane_core::p2p::value::encode(&message()).len());
    let mut rounds: Vec<_> = (0..ROUNDS)
        .map(|round| {
            let (wall, rx_cpu, tx_cpu) = rust_round(n);
            println!(
                "  rust DEALER -> ZmqTransport::poll, round {round}: {wall:.3} M msg/s \
                 (receiver {} ns/msg on CPU, sender {} ns/msg)",
                per_msg(n, rx_cpu),
                per_msg(n, tx_cpu)
            );
            (wall, rx_cpu)
        })
        .collect();
    rounds.sort_by(|a, b| a.0.total_cmp(&b.0));
    let (rust, rust_cpu) = rounds[ROUNDS / 2];
    println!("rust sender, median: {rust:.3} M msg/s; receiver on CPU {} ns/msg", per_msg(n, rust_cpu));
    match python() {
        Some(py) => {
            let (received, rx_cpu, sent) = python_round(&py, n);
            println!(
                "python sender (reference transport): {received:.3} M msg/s received, receiver {} ns/msg on CPU \
                 (python sends at {sent:.3} M msg/s); rust/python = {:.1}x",
                per_msg(n, rx_cpu),
                rust / received
            );
        }
        None => println!("python sender: skipped (no interop Python; see README)"),
    }
}
