//! Reserve round trips for instruction counting, both sides in one process.
//!
//! ```sh
//! cargo build --release -p ctlplane-zmq --example reserve_roundtrip
//! valgrind --tool=callgrind target/release/examples/reserve_roundtrip reserve 1000
//! valgrind --tool=callgrind target/release/examples/reserve_roundtrip reserve 3000
//! ```
//!
//! `reserve N`: a `ControlClient` sends N `reserve`s (`reserve_outcome`: the typed result; distinct 32-hex transfer ids and
//! 64-hex mm_hashes, 64x128 float16) to a `ConsumerControlServer` serving on a thread of
//! the same process over loopback TCP. `echo N`: the baseline, a bare libzmq REQ socket
//! sending the same reserve frame to a REP thread that sends it straight back. `json-echo
//! N`: the echo with a `serde_json::Value` parse on both sides and a re-encode on the REP
//! side. Each side has its own context (hence I/O thread), as client and server do.
//!
//! Callgrind counts every thread of the process (user space only), so the per-round-trip
//! figure is `(I(N2) - I(N1)) / (N2 - N1)`, which cancels start-up and shutdown.

use ctlplane_core::ec::{DType, ShardConfig};
use ctlplane_zmq::{ConsumerControlServer, ControlClient, ReserveGrant, ReserveOutcome, ReserveSpec};
use rand_core::OsRng;
use std::time::Instant;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spec(i: u64) -> ReserveSpec {
    let mut spec = ReserveSpec {
        transfer_id: "0".repeat(32),
        mm_hash: "0".repeat(64),
        shape: vec![64, 128],
        dtype: DType::Float16,
    };
    renumber(&mut spec, i);
    spec
}

/// Gives `spec` the ids of item `i` (`{i:032x}` and `{i:064x}`) in place by rewriting
/// their last 16 digits: `format!` would cost ~6k instructions (`fmt` pads one
/// `write_char` at a time), which would swamp the figure.
fn renumber(spec: &mut ReserveSpec, i: u64) {
    let mut digits = [0u8; 16];
    for (k, digit) in digits.iter_mut().enumerate() {
        *digit = b"0123456789abcdef"[(i >> (60 - 4 * k) & 15) as usize];
    }
    let digits = std::str::from_utf8(&digits).unwrap();
    spec.transfer_id.truncate(16);
    spec.transfer_id.push_str(digits);
    spec.mm_hash.truncate(48);
    spec.mm_hash.push_str(digits);
}

/// N reserves through the production client and server.
fn reserve(n: u64) {
    let mut config = ShardConfig::new(free_port(), 1 << 40);
    config.dst_session = "10.0.0.5:15417".into();
    let server = ConsumerControlServer::start("127.0.0.1", config, OsRng).unwrap();
    let client = ControlClient::new(5000);
    let addr = server.endpoint().to_string();
    // Connects the REQ socket; counted in both runs, so it cancels out.
    client.event_port(&addr).unwrap();
    let mut item = spec(0);
    let started = Instant::now();
    for i in 0..n {
        renumber(&mut item, i);
        let outcome = client.reserve_outcome(&addr, &item).unwrap();
        assert!(matches!(outcome, ReserveOutcome::Granted(ReserveGrant { write: true, .. })));
    }
    let elapsed = started.elapsed();
    println!("{n} reserves in {elapsed:?}; {} live reservations", server.with_shard(|s| s.book().len()));
    // Tearing the book down is no part of a round trip: leave it to the process exit.
    std::mem::forget(server);
    std::mem::forget(client);
}

/// N bare REQ/REP round trips of the reserve frame; with `json`, both sides parse it.
fn echo(n: u64, json: bool) {
    let endpoint = format!("tcp://127.0.0.1:{}", free_port());
    let server_ctx = zmq::Context::new();
    let rep = server_ctx.socket(zmq::REP).unwrap();
    rep.set_linger(0).unwrap();
    rep.bind(&endpoint).unwrap();
    let server = std::thread::spawn(move || {
        // One extra exchange for the connect below.
        for _ in 0..=n {
            let frame = rep.recv_bytes(0).unwrap();
            if json {
                let value: serde_json::Value = serde_json::from_slice(&frame).unwrap();
                rep.send(serde_json::to_vec(&value).unwrap(), 0).unwrap();
            } else {
                rep.send(frame, 0).unwrap();
            }
        }
    });
    let client_ctx = zmq::Context::new();
    let req = client_ctx.socket(zmq::REQ).unwrap();
    req.set_linger(0).unwrap();
    req.connect(&endpoint).unwrap();
    req.send(&b"{}"[..], 0).unwrap();
    req.recv_bytes(0).unwrap();
    // Built once: the baseline is the transport (plus parsing, with `json`) alone.
    let frame = ctlplane_zmq::requests::reserve(&spec(0)).unwrap();
    let started = Instant::now();
    for _ in 0..n {
        req.send(&frame[..], 0).unwrap();
        let reply = req.recv_bytes(0).unwrap();
        if json {
            let value: serde_json::Value = serde_json::from_slice(&reply).unwrap();
            assert!(value.is_object());
        }
    }
    let elapsed = started.elapsed();
    server.join().unwrap();
    println!("{n} {} round trips in {elapsed:?}", if json { "JSON-parsing echo" } else { "echo" });
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mode = args.next().unwrap_or_else(|| "reserve".into());
    let n: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    match mode.as_str() {
        "reserve" => reserve(n),
        "echo" => echo(n, false),
        "json-echo" => echo(n, true),
        other => {
            eprintln!("unknown mode {other:?}: reserve | echo | json-echo");
            std::process::exit(2);
        }
    }
}
