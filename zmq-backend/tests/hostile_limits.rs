//! Limits and safe defaults against hostile peers, on real sockets and the real program:
//! oversize EC requests and P2P frames, oversize batches, more P2P peers than allowed,
//! loopback-only binds, unpredictable reservation ids, and reservation ids used by
//! someone who does not hold them. Each limit must answer with a clear error or a logged
//! refusal and leave the server serving.

mod common;

use common::{free_ports, spec, start_server, Proc, PATIENCE};
use ctlplane_core::p2p::Value;
use ctlplane_zmq::{ControlClient, TransportOptions, ZmqTransport};
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ctlplane");

fn consumer(args: &[&str]) -> Proc {
    let proc = Proc::spawn({
        let mut cmd = Command::new(BIN);
        cmd.arg("consumer").args(args);
        cmd
    });
    proc.wait_ready();
    proc
}

/// A REQ socket to `addr` that gives up after `ms`.
fn req(ctx: &zmq::Context, addr: &str, ms: i32) -> zmq::Socket {
    let s = ctx.socket(zmq::REQ).unwrap();
    s.set_rcvtimeo(ms).unwrap();
    s.set_linger(0).unwrap();
    s.connect(addr).unwrap();
    s
}

fn ask(ctx: &zmq::Context, addr: &str, frame: &[u8]) -> Option<serde_json::Value> {
    let s = req(ctx, addr, 5_000);
    s.send(frame, 0).unwrap();
    s.recv_bytes(0).ok().map(|r| serde_json::from_slice(&r).unwrap())
}

/// Waits until `proc`'s stderr contains `needle`.
fn logged(proc: &Proc, needle: &str) -> bool {
    let deadline = Instant::now() + PATIENCE;
    while Instant::now() < deadline {
        if proc.stderr().contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Whether a TCP socket listens on `port` and on which address (`/proc/net/tcp`, state 0A).
fn listen_addrs(port: u16) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let table6 = std::fs::read_to_string("/proc/net/tcp6").unwrap_or_default();
    table
        .lines()
        .chain(table6.lines())
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let (addr, p) = cols.get(1)?.split_once(':')?;
            (u16::from_str_radix(p, 16).ok()? == port && cols.get(3) == Some(&"0A")).then(|| addr.to_string())
        })
        .collect()
}

#[test]
fn oversize_request_frame_is_refused_logged_and_the_consumer_keeps_serving() {
    let port = free_ports(1);
    let proc = consumer(&["--port", &port.to_string(), "--max-request-bytes", "4096"]);
    let addr = format!("tcp://127.0.0.1:{port}");
    let ctx = zmq::Context::new();
    let big = format!(r#"{{"op": "peers", "pad": "{}"}}"#, "x".repeat(8192));
    let s = req(&ctx, &addr, 1_000);
    s.send(big.as_bytes(), 0).unwrap();
    assert_eq!(s.recv_bytes(0).err(), Some(zmq::Error::EAGAIN), "an oversize request got an answer");
    assert!(logged(&proc, "a request over 4096 bytes is refused"), "no refusal logged: {}", proc.stderr());
    // Just under the bound is served, and so is everyone after the refusal.
    let fits = format!(r#"{{"op": "peers", "pad": "{}"}}"#, "x".repeat(4000));
    assert_eq!(ask(&ctx, &addr, fits.as_bytes()), Some(json!({"ok": true, "result": {"ports": [port]}})));
}

#[test]
fn oversize_batch_gets_a_clear_error_under_the_configured_limit() {
    let port = free_ports(1);
    let _proc = consumer(&["--port", &port.to_string(), "--max-batch-items", "3"]);
    let addr = format!("tcp://127.0.0.1:{port}");
    let ctx = zmq::Context::new();
    let item = json!({"transfer_id": "t", "mm_hash": "h", "nbytes": 16, "shape": [2, 4], "dtype": "float16"});
    let batch = |n: usize| json!({"op": "reserve_batch", "items": vec![item.clone(); n]}).to_string();
    assert_eq!(
        ask(&ctx, &addr, batch(4).as_bytes()),
        Some(json!({"ok": false, "error": "reserve_batch carries 4 items; the limit is 3"}))
    );
    let done = json!({"op": "complete_batch", "items": vec![json!({"transfer_id": "t", "reservation_id": ""}); 4]});
    assert_eq!(
        ask(&ctx, &addr, done.to_string().as_bytes()),
        Some(json!({"ok": false, "error": "complete_batch carries 4 items; the limit is 3"}))
    );
    let three = ask(&ctx, &addr, batch(3).as_bytes()).unwrap();
    assert_eq!(three["ok"], json!(true), "{three}");
}

#[test]
fn servers_bind_loopback_unless_told_otherwise() {
    let port = free_ports(2);
    let mut lines = Vec::new();
    let proc = Proc::spawn({
        let mut cmd = Command::new(BIN);
        cmd.args(["consumer", "--port", &port.to_string()]);
        cmd
    });
    while let Some(line) = proc.line(PATIENCE) {
        if line == "ready" {
            break;
        }
        lines.push(line);
    }
    let event_port: u16 = lines[0].rsplit_once(':').unwrap().1.parse().unwrap();
    let p2p = Proc::spawn({
        let mut cmd = Command::new(BIN);
        cmd.args(["p2p", "echo", "--port", &(port + 1).to_string()]);
        cmd
    });
    p2p.wait_ready();
    // 127.0.0.1 in /proc/net/tcp's byte order; with IPV6=1 libzmq binds ::ffff:127.0.0.1.
    let loopback = ["0100007F", "0000000000000000FFFF00000100007F"];
    for p in [port, event_port, port + 1] {
        let addrs = listen_addrs(p);
        assert!(!addrs.is_empty(), "nothing listens on {p}");
        assert!(addrs.iter().all(|a| loopback.contains(&a.as_str())), "port {p} listens on {addrs:?}");
    }
}

#[test]
fn production_reservation_ids_are_unpredictable() {
    // Two consumers started alike must not mint the same id for the same first request,
    // as a seeded generator would: ids come from the OS CSPRNG.
    let ids: Vec<String> = (0..2)
        .map(|_| {
            let port = free_ports(1);
            let _proc = consumer(&["--port", &port.to_string()]);
            let ctx = zmq::Context::new();
            let r = json!({"op": "reserve", "transfer_id": "t1", "mm_hash": "h1", "nbytes": 16, "shape": [2, 4],
                           "dtype": "float16"});
            let reply = ask(&ctx, &format!("tcp://127.0.0.1:{port}"), r.to_string().as_bytes()).unwrap();
            reply["result"]["reservation_id"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(ids[0].len(), 32, "{ids:?}");
    assert!(ids[0].bytes().all(|b| b.is_ascii_hexdigit()), "{ids:?}");
    assert_ne!(ids[0], ids[1]);
}

#[test]
fn someone_elses_reservation_id_cannot_complete_or_cancel_a_transfer() {
    let server = start_server(|_| {});
    let addr = server.endpoint().to_string();
    let client = ControlClient::new(5_000);
    let mine = client.reserve(&addr, &spec("mine", "h-mine")).unwrap();
    let theirs = client.reserve(&addr, &spec("theirs", "h-theirs")).unwrap();
    let (my_rid, their_rid) = (mine["reservation_id"].as_str().unwrap(), theirs["reservation_id"].as_str().unwrap());
    assert_ne!(my_rid, their_rid);

    // Their id on my transfer: every path is refused and my reservation is untouched.
    let c = client.complete(&addr, "mine", their_rid).unwrap();
    assert!(!c.completed && !c.became_ready);
    assert!(!client.complete_batch(&addr, &[("mine", their_rid)]).unwrap()[0].completed);
    assert!(!client.cancel(&addr, "mine", their_rid, true, false).unwrap());
    assert!(!client.cancel(&addr, "mine", their_rid, true, true).unwrap());
    assert!(!client.cancel(&addr, "mine", their_rid, false, false).unwrap());
    let status = client.status(&addr, "mine").unwrap();
    assert_eq!((status["ready"].as_bool(), status["reservation_id"].as_str()), (Some(false), Some(my_rid)));
    assert_eq!(server.with_shard(|s| s.writer_owned_count()), 2);

    // The holder's own id still works.
    assert!(client.complete(&addr, "mine", my_rid).unwrap().became_ready);
    client.close();
}

#[test]
fn p2p_peers_beyond_the_bound_are_refused_and_hold_no_socket() {
    // Every peer costs a DEALER, a monitor and a PAIR (3 sockets of libzmq's 1023): 200
    // peers against a bound of 16 must leave 16 registered and the rest refused.
    let options = TransportOptions { max_peers: Some(16), ..TransportOptions::default() };
    let mut node = ZmqTransport::bind_with("127.0.0.1", 0, options).unwrap();
    let target = format!("tcp://127.0.0.1:{}", node.port());
    let ctx = zmq::Context::new();
    // Each identity names a TCP listener that never accepts nor answers: a dial-back
    // connects and then waits in its handshake, so an admitted peer stays registered (a
    // refused connect would end its connection at once, and free its place in the bound).
    let listeners: Vec<std::net::TcpListener> =
        (0..200).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    let dealers: Vec<zmq::Socket> = listeners
        .iter()
        .map(|listener| {
            let d = ctx.socket(zmq::DEALER).unwrap();
            d.set_linger(0).unwrap();
            d.set_identity(format!("127.0.0.1:{}", listener.local_addr().unwrap().port()).as_bytes()).unwrap();
            d.connect(&target).unwrap();
            let hello = ctlplane_core::p2p::value::encode(&Value::map([("type", Value::from("lookup"))]));
            d.send(hello, 0).unwrap();
            d
        })
        .collect();
    let deadline = Instant::now() + PATIENCE;
    while node.stats().frames_dropped + (node.peers().len() as u64) < 200 && Instant::now() < deadline {
        node.wait(Duration::from_millis(50)).unwrap();
        node.poll();
    }
    assert_eq!(node.peers().len(), 16);
    assert_eq!(node.open_dealers(), 16);
    assert_eq!(node.stats().frames_dropped, 184, "every refused peer is counted");
    // An outbound connect past the bound is a clear error.
    let err = node.connect("127.0.0.1:1").unwrap_err();
    assert_eq!(err.to_string(), "refusing connection to 127.0.0.1:1: 16 peers already registered");
    drop(dealers);
    node.close();
    drop(listeners);
}

#[test]
fn p2p_oversize_frames_are_refused_both_ways_and_the_peer_keeps_serving() {
    let port = free_ports(3);
    let echo = Proc::spawn({
        let mut cmd = Command::new(BIN);
        cmd.args(["p2p", "echo", "--port", &port.to_string(), "--max-message-bytes", "1024"]);
        cmd
    });
    echo.wait_ready();
    let send = |local: u16, text: &str, limit: &str| {
        let json = json!({"type": "lookup", "pad": text}).to_string();
        Command::new(BIN)
            .args(["p2p", "send", "--local", &format!("127.0.0.1:{local}"), "--to", &format!("127.0.0.1:{port}")])
            .args(["--json", &json, "--timeout-ms", "1500", "--max-message-bytes", limit])
            .output()
            .unwrap()
    };
    // Outbound: the sender's own bound refuses before anything is sent.
    let out = send(port + 1, &"x".repeat(2048), "1024");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("control message exceeds 1024 bytes"), "{stderr}");
    // Inbound: the echo peer's ZMQ_MAXMSGSIZE drops the frame; no answer comes.
    let out = send(port + 1, &"x".repeat(2048), "0");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    // The sender sees its link dropped (or, if the drop comes late, no reply).
    let lost = format!("connection to 127.0.0.1:{port} lost");
    assert!(stderr.contains(&lost) || stderr.contains("no reply"), "{stderr}");
    // A small message from another peer is still echoed.
    let out = send(port + 2, "ok", "1024");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains(r#""pad": "ok""#), "{:?}", out);
    let mut echo = echo;
    assert!(echo.child.try_wait().unwrap().is_none(), "the echo peer died: {}", echo.stderr());
}
