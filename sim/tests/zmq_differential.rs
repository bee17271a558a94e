//! The ZeroMQ model against real libzmq: each scenario is a script of socket calls run
//! once on libzmq over loopback and once on the model inside turmoil; what the
//! application can observe (messages and their order, EAGAIN / EFSM / EHOSTUNREACH, monitor
//! events) must be the same.
//!
//! Only deterministic observations are scripted: a step that waits gives libzmq's I/O
//! threads time to settle, and monitor events are compared through a mask that leaves out
//! the reconnect attempts whose number depends on timing.

use ctlplane_sim::clock;
use ctlplane_sim::zmq::{self as model, monitor, Context, Multipart, SocketOptions, SocketType, ZmqError};
use std::collections::BTreeMap;
use std::time::Duration;

/// One step of a scenario. Sockets are named; ports are numbered slots.
#[derive(Clone, Debug)]
enum Step {
    /// Create a socket.
    Socket(&'static str, SocketType, Opts),
    /// Bind on loopback at slot `n`.
    Bind(&'static str, usize),
    /// Connect to slot `n` (bound or not).
    Connect(&'static str, usize),
    /// Non-blocking send; logs ok or the error.
    TrySend(&'static str, &'static [&'static str]),
    /// Receive, waiting up to this many ms; logs the frames, the error, or "timeout".
    Recv(&'static str, u64),
    /// Non-blocking receives until EAGAIN; logs every message.
    Drain(&'static str),
    /// Let time pass (ms).
    Wait(u64),
    /// Close a socket (linger 0): its peers see the connection end.
    Close(&'static str),
    /// Monitor a socket for these events.
    Monitor(&'static str, u16),
    /// Log the monitor events received so far.
    Events(&'static str),
    /// Log the distinct monitor events received so far, in numeric order (how often a
    /// reconnect repeats them depends on timing).
    EventSet(&'static str),
    /// A plain TCP listener at slot `n` that accepts connections and closes them at once,
    /// before any greeting.
    RawAcceptClose(usize),
    /// Non-blocking sends of messages of this many bytes until EAGAIN, then a pause, again
    /// and again: logs "stuck" once a send right after a pause is EAGAIN (the peer stopped
    /// reading and everything between is full), "never stuck" otherwise.
    FillUntilStuck(&'static str, usize),
    /// Non-blocking receives until EAGAIN; logs whether any message came.
    DrainSome(&'static str),
}

/// The options scenarios set (everything else is the default).
#[derive(Clone, Debug, Default)]
struct Opts {
    routing_id: Option<&'static str>,
    sndhwm: Option<usize>,
    immediate: bool,
    mandatory: bool,
    /// LINGER in ms (0 unless set).
    linger_ms: Option<u64>,
    rcvhwm: Option<usize>,
}

/// Fill rounds before `FillUntilStuck` gives up.
const FILL_ROUNDS: usize = 500;
/// Pause between fill rounds, ms.
const FILL_PAUSE_MS: u64 = 20;

fn distinct(events: &[u16]) -> String {
    let set: std::collections::BTreeSet<u16> = events.iter().copied().collect();
    set.iter().map(u16::to_string).collect::<Vec<_>>().join(" ")
}

fn plain() -> Opts {
    Opts::default()
}

fn id(name: &'static str) -> Opts {
    Opts { routing_id: Some(name), ..Opts::default() }
}

fn show(m: &Multipart) -> String {
    let frames: Vec<String> =
        m.iter()
            .map(|f| {
                if f.first() == Some(&0) {
                    "<generated id>".to_string()
                } else {
                    String::from_utf8_lossy(f).into_owned()
                }
            })
            .collect();
    format!("[{}]", frames.join(","))
}

// ---------------------------------------------------------------------------------------
// libzmq

fn zmq_kind(kind: SocketType) -> zmq::SocketType {
    match kind {
        SocketType::Req => zmq::REQ,
        SocketType::Rep => zmq::REP,
        SocketType::Push => zmq::PUSH,
        SocketType::Pull => zmq::PULL,
        SocketType::Router => zmq::ROUTER,
        SocketType::Dealer => zmq::DEALER,
        SocketType::Pair => zmq::PAIR,
    }
}

fn zmq_err(e: zmq::Error) -> String {
    match e {
        zmq::Error::EAGAIN => "EAGAIN".into(),
        zmq::Error::EFSM => "EFSM".into(),
        zmq::Error::EHOSTUNREACH => "EHOSTUNREACH".into(),
        other => format!("{other:?}"),
    }
}

/// Free loopback ports for the scenario's slots (bound later, or never).
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> =
        (0..n).map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("free port")).collect();
    listeners.iter().map(|l| l.local_addr().expect("port").port()).collect()
}

fn run_libzmq(steps: &[Step]) -> Vec<String> {
    let ctx = zmq::Context::new();
    let ports = free_ports(4);
    let mut sockets: BTreeMap<&str, zmq::Socket> = BTreeMap::new();
    let mut monitors: BTreeMap<&str, zmq::Socket> = BTreeMap::new();
    let mut log = Vec::new();
    for step in steps {
        match step {
            Step::Socket(name, kind, o) => {
                let s = ctx.socket(zmq_kind(*kind)).expect("socket");
                s.set_linger(o.linger_ms.unwrap_or(0) as i32).expect("linger");
                if let Some(h) = o.rcvhwm {
                    s.set_rcvhwm(h as i32).expect("rcvhwm");
                }
                if let Some(rid) = o.routing_id {
                    s.set_identity(rid.as_bytes()).expect("identity");
                }
                if let Some(h) = o.sndhwm {
                    s.set_sndhwm(h as i32).expect("sndhwm");
                }
                s.set_immediate(o.immediate).expect("immediate");
                if o.mandatory {
                    s.set_router_mandatory(true).expect("mandatory");
                }
                sockets.insert(name, s);
            }
            Step::Bind(name, slot) => sockets[name].bind(&format!("tcp://127.0.0.1:{}", ports[*slot])).expect("bind"),
            Step::Connect(name, slot) => {
                sockets[name].connect(&format!("tcp://127.0.0.1:{}", ports[*slot])).expect("connect")
            }
            Step::TrySend(name, frames) => {
                let r = sockets[name].send_multipart(frames.iter().map(|f| f.as_bytes()), zmq::DONTWAIT);
                log.push(format!("send {name}: {}", r.map_or_else(zmq_err, |()| "ok".into())));
            }
            Step::Recv(name, timeout) => {
                let s = &sockets[name];
                let mut r = s.recv_multipart(zmq::DONTWAIT);
                if r == Err(zmq::Error::EAGAIN) {
                    let mut items = [s.as_poll_item(zmq::POLLIN)];
                    zmq::poll(&mut items, *timeout as i64).expect("poll");
                    r = s.recv_multipart(zmq::DONTWAIT);
                }
                let shown = match r {
                    Ok(m) => show(&m),
                    Err(zmq::Error::EAGAIN) => "timeout".into(),
                    Err(e) => zmq_err(e),
                };
                log.push(format!("recv {name}: {shown}"));
            }
            Step::Drain(name) => {
                let mut got = Vec::new();
                while let Ok(m) = sockets[name].recv_multipart(zmq::DONTWAIT) {
                    got.push(show(&m));
                }
                log.push(format!("drain {name}: {}", got.join(" ")));
            }
            Step::Wait(ms) => std::thread::sleep(Duration::from_millis(*ms)),
            Step::Close(name) => drop(sockets.remove(name)),
            Step::Monitor(name, events) => {
                let endpoint = format!("inproc://mon-{name}");
                sockets[name].monitor(&endpoint, i32::from(*events)).expect("monitor");
                let pair = ctx.socket(zmq::PAIR).expect("pair");
                pair.connect(&endpoint).expect("pair connect");
                monitors.insert(name, pair);
            }
            Step::Events(name) => {
                let mut got = Vec::new();
                while let Ok(m) = monitors[name].recv_multipart(zmq::DONTWAIT) {
                    if let Some((event, _, _)) = monitor::decode(&m) {
                        got.push(event.to_string());
                    }
                }
                log.push(format!("events {name}: {}", got.join(" ")));
            }
            Step::EventSet(name) => {
                let mut got = Vec::new();
                while let Ok(m) = monitors[name].recv_multipart(zmq::DONTWAIT) {
                    if let Some((event, _, _)) = monitor::decode(&m) {
                        got.push(event);
                    }
                }
                log.push(format!("events {name}: {}", distinct(&got)));
            }
            Step::RawAcceptClose(slot) => {
                let listener = std::net::TcpListener::bind(("127.0.0.1", ports[*slot])).expect("raw listener");
                std::thread::spawn(move || {
                    for stream in listener.incoming() {
                        drop(stream);
                    }
                });
            }
            Step::FillUntilStuck(name, bytes) => {
                let s = &sockets[name];
                let body = vec![b'x'; *bytes];
                let mut stuck = false;
                for _ in 0..FILL_ROUNDS {
                    let mut sent = 0;
                    while s.send(&body, zmq::DONTWAIT).is_ok() {
                        sent += 1;
                    }
                    if sent == 0 {
                        stuck = true;
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(FILL_PAUSE_MS));
                }
                log.push(format!("fill {name}: {}", if stuck { "stuck" } else { "never stuck" }));
            }
            Step::DrainSome(name) => {
                let mut n = 0;
                while sockets[name].recv_multipart(zmq::DONTWAIT).is_ok() {
                    n += 1;
                }
                log.push(format!("drain {name}: {}", if n > 0 { "some" } else { "none" }));
            }
        }
    }
    log
}

// ---------------------------------------------------------------------------------------
// The model, on one turmoil host (its own address is its loopback).

fn model_err(e: ZmqError) -> String {
    match e {
        ZmqError::Again => "EAGAIN".into(),
        ZmqError::Fsm => "EFSM".into(),
        ZmqError::HostUnreachable => "EHOSTUNREACH".into(),
        other => format!("{other:?}"),
    }
}

fn run_model(steps: &[Step]) -> Vec<String> {
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(60))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(1))
        .rng_seed(1)
        .build();
    let shared = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
    let out = shared.clone();
    let steps = steps.to_vec();
    sim.client("node", async move {
        let ctx = Context::new("node");
        let port = |slot: usize| 5000 + slot as u16;
        let mut sockets: BTreeMap<&str, model::Socket> = BTreeMap::new();
        let mut monitors: BTreeMap<&str, model::Socket> = BTreeMap::new();
        let mut log = Vec::new();
        for step in &steps {
            match step {
                Step::Socket(name, kind, o) => {
                    let opts = SocketOptions {
                        routing_id: o.routing_id.map(|r| r.as_bytes().to_vec()),
                        sndhwm: o.sndhwm.unwrap_or(1000),
                        immediate: o.immediate,
                        router_mandatory: o.mandatory,
                        linger: Duration::from_millis(o.linger_ms.unwrap_or(0)),
                        rcvhwm: o.rcvhwm.unwrap_or(1000),
                        ..SocketOptions::default()
                    };
                    sockets.insert(name, model::Socket::new(&ctx, *kind, opts));
                }
                Step::Bind(name, slot) => {
                    sockets[name].bind(&format!("tcp://0.0.0.0:{}", port(*slot))).await?;
                }
                Step::Connect(name, slot) => sockets[name].connect(&format!("tcp://node:{}", port(*slot)))?,
                Step::TrySend(name, frames) => {
                    let r = sockets[name].try_send(frames.iter().map(|f| f.as_bytes().to_vec()).collect());
                    log.push(format!("send {name}: {}", r.map_or_else(model_err, |()| "ok".into())));
                }
                Step::Recv(name, timeout) => {
                    let s = &sockets[name];
                    let mut r = s.try_recv();
                    if r == Err(ZmqError::Again) {
                        tokio::select! {
                            biased;
                            _ = s.readable() => {}
                            _ = clock::sleep(Duration::from_millis(*timeout)) => {}
                        }
                        r = s.try_recv();
                    }
                    let shown = match r {
                        Ok(m) => show(&m),
                        Err(ZmqError::Again) => "timeout".into(),
                        Err(e) => model_err(e),
                    };
                    log.push(format!("recv {name}: {shown}"));
                }
                Step::Drain(name) => {
                    let mut got = Vec::new();
                    while let Ok(m) = sockets[name].try_recv() {
                        got.push(show(&m));
                    }
                    log.push(format!("drain {name}: {}", got.join(" ")));
                }
                Step::Wait(ms) => clock::sleep(Duration::from_millis(*ms)).await,
                Step::Close(name) => drop(sockets.remove(name)),
                Step::Monitor(name, events) => {
                    let endpoint = format!("inproc://mon-{name}");
                    sockets[name].monitor(&endpoint, *events).await?;
                    let pair = model::Socket::new(&ctx, SocketType::Pair, SocketOptions::default());
                    pair.connect(&endpoint)?;
                    monitors.insert(name, pair);
                }
                Step::Events(name) => {
                    let mut got = Vec::new();
                    while let Ok(m) = monitors[name].try_recv() {
                        if let Some((event, _, _)) = monitor::decode(&m) {
                            got.push(event.to_string());
                        }
                    }
                    log.push(format!("events {name}: {}", got.join(" ")));
                }
                Step::EventSet(name) => {
                    let mut got = Vec::new();
                    while let Ok(m) = monitors[name].try_recv() {
                        if let Some((event, _, _)) = monitor::decode(&m) {
                            got.push(event);
                        }
                    }
                    log.push(format!("events {name}: {}", distinct(&got)));
                }
                Step::RawAcceptClose(slot) => {
                    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", port(*slot))).await?;
                    tokio::task::spawn_local(async move {
                        while let Ok((stream, _)) = listener.accept().await {
                            drop(stream);
                        }
                    });
                }
                Step::FillUntilStuck(name, bytes) => {
                    let s = &sockets[name];
                    let mut stuck = false;
                    for _ in 0..FILL_ROUNDS {
                        let mut sent = 0;
                        while s.try_send(vec![vec![b'x'; *bytes]]).is_ok() {
                            sent += 1;
                        }
                        if sent == 0 {
                            stuck = true;
                            break;
                        }
                        clock::sleep(Duration::from_millis(FILL_PAUSE_MS)).await;
                    }
                    log.push(format!("fill {name}: {}", if stuck { "stuck" } else { "never stuck" }));
                }
                Step::DrainSome(name) => {
                    let mut n = 0;
                    while sockets[name].try_recv().is_ok() {
                        n += 1;
                    }
                    log.push(format!("drain {name}: {}", if n > 0 { "some" } else { "none" }));
                }
            }
        }
        *shared.borrow_mut() = log;
        Ok(())
    });
    sim.run().expect("model scenario");
    let log = out.borrow().clone();
    log
}

/// Runs `steps` on both, requires the same log, and returns it for scenario checks.
fn differential(steps: &[Step]) -> Vec<String> {
    let real = run_libzmq(steps);
    let modelled = run_model(steps);
    assert_eq!(modelled, real, "model (left) differs from libzmq (right)");
    real
}

use SocketType::*;
use Step::*;

#[test]
fn req_rep_lockstep_and_efsm() {
    let log = differential(&[
        Socket("rep", Rep, plain()),
        Socket("req", Req, plain()),
        Bind("rep", 0),
        Connect("req", 0),
        Wait(50),
        Recv("req", 10),
        TrySend("req", &["a"]),
        TrySend("req", &["b"]),
        TrySend("rep", &["too early"]),
        Recv("rep", 500),
        Recv("rep", 10),
        TrySend("rep", &["A", "B"]),
        Recv("req", 500),
        Recv("req", 10),
        TrySend("req", &["c"]),
        Recv("rep", 500),
    ]);
    assert!(log.contains(&"send req: EFSM".to_string()) && log.contains(&"recv req: EFSM".to_string()), "{log:?}");
}

#[test]
fn req_round_robins_across_two_reps() {
    let mut steps = vec![
        Socket("rep1", Rep, plain()),
        Socket("rep2", Rep, plain()),
        Socket("req", Req, plain()),
        Bind("rep1", 0),
        Bind("rep2", 1),
        Connect("req", 0),
        Connect("req", 1),
        Wait(100),
    ];
    const BODIES: [&[&str]; 4] = [&["0"], &["1"], &["2"], &["3"]];
    const REPLIES: [&[&str]; 4] = [&["r0"], &["r1"], &["r2"], &["r3"]];
    for (body, reply) in BODIES.into_iter().zip(REPLIES) {
        steps.extend([TrySend("req", body), Wait(30), Drain("rep1"), Drain("rep2")]);
        // Whichever REP got it answers; the other is EFSM.
        steps.extend([TrySend("rep1", reply), TrySend("rep2", reply), Recv("req", 500)]);
    }
    let log = differential(&steps);
    assert!(log.contains(&"drain rep1: [0]".to_string()) && log.contains(&"drain rep2: [1]".to_string()), "{log:?}");
}

#[test]
fn push_round_robins_across_two_pulls() {
    let log = differential(&[
        Socket("pull1", Pull, plain()),
        Socket("pull2", Pull, plain()),
        Socket("push", Push, plain()),
        Bind("pull1", 0),
        Bind("pull2", 1),
        Connect("push", 0),
        Connect("push", 1),
        Wait(100),
        TrySend("push", &["0"]),
        TrySend("push", &["1"]),
        TrySend("push", &["2"]),
        TrySend("push", &["3"]),
        Wait(50),
        Drain("pull1"),
        Drain("pull2"),
    ]);
    assert!(log.contains(&"drain pull1: [0] [2]".to_string()), "{log:?}");
}

#[test]
fn pull_fair_queues_two_pushes() {
    let log = differential(&[
        Socket("pull", Pull, plain()),
        Socket("a", Push, plain()),
        Socket("b", Push, plain()),
        Bind("pull", 0),
        Connect("a", 0),
        Wait(50),
        Connect("b", 0),
        Wait(50),
        TrySend("a", &["a0"]),
        TrySend("a", &["a1"]),
        TrySend("a", &["a2"]),
        TrySend("b", &["b0"]),
        TrySend("b", &["b1"]),
        TrySend("b", &["b2"]),
        Wait(50),
        Drain("pull"),
    ]);
    assert_eq!(log.last().map(String::as_str), Some("drain pull: [a0] [b0] [a1] [b1] [a2] [b2]"));
}

#[test]
fn router_dealer_identity_routing_and_unknown_identity_dropped() {
    let log = differential(&[
        Socket("router", Router, plain()),
        Socket("dealer", Dealer, id("d1")),
        Socket("anon", Dealer, plain()),
        Bind("router", 0),
        Connect("dealer", 0),
        Connect("anon", 0),
        Wait(50),
        TrySend("dealer", &["hi", "there"]),
        Recv("router", 500),
        TrySend("anon", &["who"]),
        Recv("router", 500),
        TrySend("router", &["nobody", "lost"]),
        TrySend("router", &["d1", "back"]),
        Recv("dealer", 500),
        Recv("dealer", 50),
        Recv("anon", 50),
    ]);
    assert!(log.contains(&"recv router: [d1,hi,there]".to_string()), "{log:?}");
    assert!(log.contains(&"recv router: [<generated id>,who]".to_string()), "{log:?}");
}

#[test]
fn router_mandatory_is_ehostunreach() {
    differential(&[
        Socket("router", Router, Opts { mandatory: true, ..plain() }),
        Bind("router", 0),
        TrySend("router", &["nobody", "x"]),
    ]);
}

#[test]
fn eagain_without_a_peer_and_dealer_queues_before_connect() {
    let log = differential(&[
        Socket("bound", Push, plain()),
        Bind("bound", 0),
        TrySend("bound", &["x"]),
        Socket("immediate", Push, Opts { immediate: true, ..plain() }),
        Connect("immediate", 1),
        Wait(20),
        TrySend("immediate", &["x"]),
        Socket("dealer", Dealer, id("q")),
        Connect("dealer", 2),
        TrySend("dealer", &["m0"]),
        TrySend("dealer", &["m1"]),
        TrySend("dealer", &["m2"]),
        Wait(50),
        Socket("router", Router, plain()),
        Bind("router", 2),
        Wait(400),
        Drain("router"),
    ]);
    assert_eq!(log.last().map(String::as_str), Some("drain router: [q,m0] [q,m1] [q,m2]"));
}

#[test]
fn hwm_of_a_connecting_pipe_is_exactly_sndhwm() {
    let mut steps = vec![Socket("dealer", Dealer, Opts { sndhwm: Some(10), ..plain() }), Connect("dealer", 0)];
    for _ in 0..11 {
        steps.push(TrySend("dealer", &["m"]));
    }
    let log = differential(&steps);
    assert_eq!(log.iter().filter(|l| *l == "send dealer: ok").count(), 10);
    assert_eq!(log.last().map(String::as_str), Some("send dealer: EAGAIN"));
}

#[test]
fn peer_close_fires_monitor_disconnected() {
    let mask = monitor::CONNECTED | monitor::HANDSHAKE_SUCCEEDED | monitor::DISCONNECTED;
    let log = differential(&[
        Socket("router", Router, plain()),
        Socket("dealer", Dealer, id("d")),
        Monitor("dealer", mask),
        Bind("router", 0),
        Connect("dealer", 0),
        Wait(100),
        Events("dealer"),
        Close("router"),
        Wait(100),
        Events("dealer"),
    ]);
    assert_eq!(log.last().map(String::as_str), Some("events dealer: 512"));
}

#[test]
fn duplicate_identity_is_refused() {
    let log = differential(&[
        Socket("router", Router, plain()),
        Socket("d1", Dealer, id("dup")),
        Socket("d2", Dealer, id("dup")),
        Bind("router", 0),
        Connect("d1", 0),
        Wait(50),
        Connect("d2", 0),
        Wait(50),
        TrySend("d1", &["one"]),
        TrySend("d2", &["two"]),
        Wait(50),
        Drain("router"),
        TrySend("router", &["dup", "back"]),
        Wait(50),
        Drain("d1"),
        Drain("d2"),
    ]);
    assert!(log.contains(&"drain router: [dup,one]".to_string()), "{log:?}");
}

#[test]
fn rep_fair_queues_and_routes_replies_to_each_requester() {
    differential(&[
        Socket("rep", Rep, plain()),
        Socket("c1", Req, plain()),
        Socket("c2", Req, plain()),
        Bind("rep", 0),
        Connect("c1", 0),
        Wait(50),
        Connect("c2", 0),
        Wait(50),
        TrySend("c1", &["from c1"]),
        TrySend("c2", &["from c2"]),
        Wait(50),
        Recv("rep", 100),
        TrySend("rep", &["first"]),
        Recv("rep", 100),
        TrySend("rep", &["second"]),
        Recv("c1", 200),
        Recv("c2", 200),
    ]);
}

#[test]
fn monitor_event_sequences_of_both_ends() {
    let log = differential(&[
        Socket("router", Router, plain()),
        Socket("dealer", Dealer, id("d")),
        Monitor("router", monitor::ALL),
        Monitor("dealer", monitor::ALL),
        Bind("router", 0),
        Connect("dealer", 0),
        Wait(100),
        Events("router"),
        Events("dealer"),
        Close("dealer"),
        Wait(100),
        Events("router"),
        Events("dealer"),
        Close("router"),
        Wait(100),
        Events("router"),
    ]);
    assert_eq!(log[0], "events router: 8 32 4096");
}

// What the P2P transport relies on since vLLM 0.33 (`docs/p2p-behaviour.md`).

#[test]
fn a_peer_that_stops_reading_fills_the_pipe_to_eagain_and_room_returns_when_it_reads() {
    let log = differential(&[
        Socket("router", Router, Opts { rcvhwm: Some(10), ..plain() }),
        Socket("dealer", Dealer, Opts { sndhwm: Some(10), ..id("s") }),
        Bind("router", 0),
        Connect("dealer", 0),
        Wait(100),
        FillUntilStuck("dealer", 64 * 1024),
        DrainSome("router"),
        Wait(200),
        TrySend("dealer", &["again"]),
    ]);
    assert_eq!(log, vec!["fill dealer: stuck", "drain router: some", "send dealer: ok"]);
}

/// A closed DEALER with a 500 ms linger keeps trying to deliver what it queued: a ROUTER
/// bound within the linger sees it connect, hand its messages over and go; one bound after
/// sees nothing. (What the ROUTER can still read once the link is gone is where the model
/// differs, see `ctlplane_sim::zmq`; the connection itself is the observation here.)
#[test]
fn close_linger_keeps_delivering_for_the_linger_time_only() {
    let within = format!(
        "events router: {} {} {} {}",
        monitor::LISTENING,
        monitor::ACCEPTED,
        monitor::DISCONNECTED,
        monitor::HANDSHAKE_SUCCEEDED
    );
    let after = format!("events router: {}", monitor::LISTENING);
    for (wait, want) in [(100, within), (900, after)] {
        let log = differential(&[
            Socket("dealer", Dealer, Opts { linger_ms: Some(500), ..id("q") }),
            Connect("dealer", 0),
            TrySend("dealer", &["m0"]),
            TrySend("dealer", &["m1"]),
            TrySend("dealer", &["m2"]),
            Close("dealer"),
            Wait(wait),
            Socket("router", Router, plain()),
            Monitor("router", monitor::ALL),
            Bind("router", 0),
            Wait(500),
            EventSet("router"),
        ]);
        assert_eq!(log.last(), Some(&want), "bound {wait} ms after close");
    }
}

/// The events the P2P transport treats as fatal.
const FATAL: u16 = monitor::DISCONNECTED
    | monitor::CLOSED
    | monitor::HANDSHAKE_FAILED_NO_DETAIL
    | monitor::HANDSHAKE_FAILED_PROTOCOL
    | monitor::HANDSHAKE_FAILED_AUTH;

#[test]
fn a_refused_connect_fires_closed() {
    let log = differential(&[
        Socket("dealer", Dealer, id("d")),
        Monitor("dealer", FATAL),
        Connect("dealer", 0),
        Wait(250),
        EventSet("dealer"),
    ]);
    assert_eq!(log, vec![format!("events dealer: {}", monitor::CLOSED)]);
}

#[test]
fn a_link_lost_before_the_greeting_fires_handshake_failed_then_disconnected() {
    let log = differential(&[
        RawAcceptClose(0),
        Socket("dealer", Dealer, id("d")),
        Monitor("dealer", FATAL | monitor::HANDSHAKE_SUCCEEDED),
        Connect("dealer", 0),
        Wait(250),
        EventSet("dealer"),
    ]);
    let want = format!("events dealer: {} {}", monitor::DISCONNECTED, monitor::HANDSHAKE_FAILED_NO_DETAIL);
    assert_eq!(log, vec![want]);
}
