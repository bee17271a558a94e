//! The ZeroMQ model's semantics, each run inside turmoil.

use ctlplane_sim::clock;
use ctlplane_sim::zmq::{monitor, Context, Multipart, Socket, SocketOptions, SocketType, ZmqError};
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;
use turmoil::{Builder, Sim};

fn sim<'a>() -> Sim<'a> {
    Builder::new()
        .simulation_duration(Duration::from_secs(120))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(1))
        .rng_seed(7)
        .build()
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn msg(parts: &[&str]) -> Multipart {
    parts.iter().map(|p| p.as_bytes().to_vec()).collect()
}

fn text(m: &Multipart) -> Vec<String> {
    m.iter().map(|f| String::from_utf8_lossy(f).into_owned()).collect()
}

/// `recv` with a simulated-time limit.
async fn recv_within(s: &Socket, d: Duration) -> Option<Multipart> {
    tokio::select! {
        biased;
        r = s.recv() => r.ok(),
        _ = clock::sleep(d) => None,
    }
}

async fn wait_peers(s: &Socket, n: usize) {
    for _ in 0..10_000 {
        if s.peer_count() >= n {
            return;
        }
        clock::sleep(ms(1)).await;
    }
    panic!("socket never reached {n} peers");
}

/// A REP host that answers every request with `[name, request...]`.
fn rep_echo(sim: &mut Sim, name: &'static str, port: u16) {
    sim.host(name, move || async move {
        let ctx = Context::new(name);
        let rep = Socket::new(&ctx, SocketType::Rep, SocketOptions::default());
        rep.bind(&format!("tcp://0.0.0.0:{port}")).await?;
        loop {
            let mut req = rep.recv().await?;
            req.insert(0, name.as_bytes().to_vec());
            rep.send(req).await?;
        }
    });
}

#[test]
fn req_rep_lockstep_and_efsm() {
    let mut sim = sim();
    rep_echo(&mut sim, "server", 5555);
    sim.client("client", async {
        let ctx = Context::new("client");
        let req = Socket::new(&ctx, SocketType::Req, SocketOptions::default());
        assert_eq!(req.try_recv(), Err(ZmqError::Fsm), "recv before send");
        req.connect("tcp://server:5555")?;
        req.send(msg(&["a"])).await?;
        assert_eq!(req.try_send(msg(&["b"])), Err(ZmqError::Fsm), "second send before the reply");
        let reply = recv_within(&req, ms(500)).await.expect("reply");
        assert_eq!(text(&reply), ["server", "a"]);
        assert_eq!(req.try_recv(), Err(ZmqError::Fsm), "recv after the reply");
        req.send(msg(&["c", "d"])).await?;
        assert_eq!(text(&recv_within(&req, ms(500)).await.expect("reply")), ["server", "c", "d"]);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn rep_is_efsm_out_of_lockstep() {
    let mut sim = sim();
    sim.client("solo", async {
        let ctx = Context::new("solo");
        let rep = Socket::new(&ctx, SocketType::Rep, SocketOptions::default());
        rep.bind("tcp://0.0.0.0:5000").await?;
        assert_eq!(rep.try_send(msg(&["x"])), Err(ZmqError::Fsm));
        assert_eq!(rep.try_recv(), Err(ZmqError::Again));
        let push = Socket::new(&ctx, SocketType::Push, SocketOptions::default());
        assert!(matches!(push.try_recv(), Err(ZmqError::Invalid(_))));
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn req_round_robins_over_its_connections() {
    let mut sim = sim();
    rep_echo(&mut sim, "rep1", 5555);
    rep_echo(&mut sim, "rep2", 5555);
    sim.client("client", async {
        let ctx = Context::new("client");
        let req = Socket::new(&ctx, SocketType::Req, SocketOptions::default());
        req.connect("tcp://rep1:5555")?;
        req.connect("tcp://rep2:5555")?;
        wait_peers(&req, 2).await;
        let mut seen = Vec::new();
        for i in 0..4 {
            req.send(msg(&[&i.to_string()])).await?;
            seen.push(text(&recv_within(&req, ms(500)).await.expect("reply"))[0].clone());
        }
        assert_eq!(seen, ["rep1", "rep2", "rep1", "rep2"]);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn rep_answers_each_requester_on_its_own_connection() {
    let mut sim = sim();
    rep_echo(&mut sim, "server", 5555);
    for name in ["c1", "c2", "c3"] {
        sim.client(name, async move {
            let ctx = Context::new(name);
            let req = Socket::new(&ctx, SocketType::Req, SocketOptions::default());
            req.connect("tcp://server:5555")?;
            for i in 0..5 {
                let body = format!("{name}-{i}");
                req.send(msg(&[&body])).await?;
                let reply = recv_within(&req, ms(500)).await.expect("reply");
                assert_eq!(text(&reply), ["server".to_string(), body]);
            }
            Ok(())
        });
    }
    sim.run().unwrap();
}

#[test]
fn push_round_robins_and_pull_fair_queues() {
    let mut sim = sim();
    let got: Rc<RefCell<Vec<(String, String)>>> = Rc::default();
    for name in ["pull1", "pull2"] {
        let got = got.clone();
        sim.host(name, move || {
            let got = got.clone();
            async move {
                let ctx = Context::new(name);
                let pull = Socket::new(&ctx, SocketType::Pull, SocketOptions::default());
                pull.bind("tcp://0.0.0.0:6000").await?;
                loop {
                    let m = pull.recv().await?;
                    got.borrow_mut().push((name.to_string(), text(&m)[0].clone()));
                }
            }
        });
    }
    // Two pushers into one PULL that reads only once both have queued three messages.
    for name in ["pushA", "pushB"] {
        sim.host(name, move || async move {
            let ctx = Context::new(name);
            let push = Socket::new(&ctx, SocketType::Push, SocketOptions::default());
            push.connect("tcp://sink:6001")?;
            for i in 0..3 {
                push.send(msg(&[&format!("{name}{i}")])).await?;
            }
            std::future::pending::<()>().await;
            Ok(())
        });
    }
    sim.client("sink", async {
        let ctx = Context::new("sink");
        let pull = Socket::new(&ctx, SocketType::Pull, SocketOptions::default());
        pull.bind("tcp://0.0.0.0:6001").await?;
        clock::sleep(ms(500)).await;
        let mut order = Vec::new();
        while let Ok(m) = pull.try_recv() {
            order.push(text(&m)[0].clone());
        }
        assert_eq!(order, ["pushA0", "pushB0", "pushA1", "pushB1", "pushA2", "pushB2"]);
        Ok(())
    });
    let got2 = got.clone();
    sim.client("pusher", async move {
        let ctx = Context::new("pusher");
        let push = Socket::new(&ctx, SocketType::Push, SocketOptions::default());
        push.connect("tcp://pull1:6000")?;
        push.connect("tcp://pull2:6000")?;
        wait_peers(&push, 2).await;
        for i in 0..4 {
            push.send(msg(&[&i.to_string()])).await?;
        }
        clock::sleep(ms(100)).await;
        let mut got = got2.borrow().clone();
        got.sort();
        let expect: Vec<(String, String)> = [("pull1", "0"), ("pull1", "2"), ("pull2", "1"), ("pull2", "3")]
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, expect);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn eagain_without_peers_and_queueing_before_connect() {
    let mut sim = sim();
    // The server appears only after 300 ms.
    sim.host("late", || async {
        clock::sleep(ms(300)).await;
        let ctx = Context::new("late");
        let router = Socket::new(&ctx, SocketType::Router, SocketOptions::default());
        router.bind("tcp://0.0.0.0:7000").await?;
        loop {
            let m = router.recv().await?;
            router.send(vec![m[0].clone(), b"ack".to_vec(), m[1].clone()]).await?;
        }
    });
    sim.client("client", async {
        let ctx = Context::new("client");
        // Bound PUSH with no peer, and IMMEDIATE PUSH whose peer is not up: EAGAIN.
        let bound = Socket::new(&ctx, SocketType::Push, SocketOptions::default());
        bound.bind("tcp://0.0.0.0:7100").await?;
        assert_eq!(bound.try_send(msg(&["x"])), Err(ZmqError::Again));
        let immediate = Socket::new(&ctx, SocketType::Push, SocketOptions { immediate: true, ..Default::default() });
        immediate.connect("tcp://late:7001")?;
        assert_eq!(immediate.try_send(msg(&["x"])), Err(ZmqError::Again));
        let req = Socket::new(&ctx, SocketType::Req, SocketOptions { immediate: true, ..Default::default() });
        assert_eq!(req.try_send(msg(&["x"])), Err(ZmqError::Again));

        // A DEALER connecting before the server is up queues up to SNDHWM, in order.
        let opts = SocketOptions { sndhwm: 5, routing_id: Some(b"d".to_vec()), ..Default::default() };
        let dealer = Socket::new(&ctx, SocketType::Dealer, opts);
        dealer.connect("tcp://late:7000")?;
        for i in 0..5 {
            dealer.try_send(msg(&[&i.to_string()]))?;
        }
        assert_eq!(dealer.try_send(msg(&["6"])), Err(ZmqError::Again), "exactly sndhwm queue");
        assert_eq!(dealer.peer_count(), 0);
        let mut replies = Vec::new();
        while replies.len() < 5 {
            let m = recv_within(&dealer, Duration::from_secs(2)).await.expect("queued messages delivered");
            replies.push(text(&m));
        }
        let expect: Vec<Vec<String>> = (0..5).map(|i| vec!["ack".to_string(), i.to_string()]).collect();
        assert_eq!(replies, expect);
        assert!(clock::now().as_nanos() >= 300_000_000, "delivered only once the server was up");
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn router_routes_by_identity_and_drops_unknown_ones() {
    let mut sim = sim();
    sim.host("dealer", || async {
        let ctx = Context::new("dealer");
        let opts = SocketOptions { routing_id: Some(b"d1".to_vec()), ..Default::default() };
        let dealer = Socket::new(&ctx, SocketType::Dealer, opts);
        dealer.connect("tcp://router:7000")?;
        dealer.send(msg(&["hello", "there"])).await?;
        loop {
            let m = dealer.recv().await?;
            // Echo what the router sent back, so the router sees it arrived.
            dealer.send([b"echo".to_vec()].into_iter().chain(m).collect()).await?;
        }
    });
    sim.client("router", async {
        let ctx = Context::new("router");
        let router = Socket::new(&ctx, SocketType::Router, SocketOptions::default());
        router.bind("tcp://0.0.0.0:7000").await?;
        let m = recv_within(&router, Duration::from_secs(1)).await.expect("hello");
        assert_eq!(text(&m), ["d1", "hello", "there"]);
        router.send(msg(&["nobody", "lost"])).await?; // dropped silently
        router.send(msg(&["d1", "x"])).await?;
        let m = recv_within(&router, Duration::from_secs(1)).await.expect("echo");
        assert_eq!(text(&m), ["d1", "echo", "x"]);
        assert_eq!(router.try_recv(), Err(ZmqError::Again));

        let mandatory =
            Socket::new(&ctx, SocketType::Router, SocketOptions { router_mandatory: true, ..Default::default() });
        assert_eq!(mandatory.try_send(msg(&["nobody", "x"])), Err(ZmqError::HostUnreachable));
        Ok(())
    });
    sim.run().unwrap();
}

fn dup_identity(handover: bool) -> Vec<Vec<String>> {
    let mut sim = sim();
    for (name, delay) in [("first", 0u64), ("second", 200)] {
        sim.host(name, move || async move {
            clock::sleep(ms(delay)).await;
            let ctx = Context::new(name);
            let opts = SocketOptions { routing_id: Some(b"dup".to_vec()), ..Default::default() };
            let dealer = Socket::new(&ctx, SocketType::Dealer, opts);
            dealer.connect("tcp://router:7000")?;
            for i in 0..3 {
                dealer.send(msg(&[&format!("{name}{i}")])).await?;
                clock::sleep(ms(100)).await;
            }
            std::future::pending::<()>().await;
            Ok(())
        });
    }
    let seen: Rc<RefCell<Vec<Vec<String>>>> = Rc::default();
    let seen2 = seen.clone();
    sim.client("router", async move {
        let ctx = Context::new("router");
        let router =
            Socket::new(&ctx, SocketType::Router, SocketOptions { router_handover: handover, ..Default::default() });
        router.bind("tcp://0.0.0.0:7000").await?;
        while let Some(m) = recv_within(&router, ms(800)).await {
            seen2.borrow_mut().push(text(&m));
        }
        Ok(())
    });
    sim.run().unwrap();
    let out = seen.borrow().clone();
    out
}

#[test]
fn duplicate_identity_is_refused_unless_handover() {
    let refused = dup_identity(false);
    assert!(refused.iter().all(|m| m[0] == "dup" && m[1].starts_with("first")), "{refused:?}");
    assert_eq!(refused.len(), 3);
    let handed = dup_identity(true);
    assert!(handed.iter().any(|m| m[1].starts_with("second")), "{handed:?}");
    // Once handed over, the first peer's later messages no longer arrive under "dup".
    let after: Vec<&Vec<String>> = handed.iter().skip_while(|m| !m[1].starts_with("second")).collect();
    assert!(after.iter().all(|m| m[1].starts_with("second")), "{handed:?}");
}

/// Collects monitor events of `sock` (subscribed to `events`) into a shared list.
async fn watch(ctx: &Context, sock: &Socket, name: &str, events: u16) -> Rc<RefCell<Vec<(u16, u32)>>> {
    sock.monitor(&format!("inproc://{name}"), events).await.unwrap();
    let pair = Socket::new(ctx, SocketType::Pair, SocketOptions::default());
    pair.connect(&format!("inproc://{name}")).unwrap();
    let seen: Rc<RefCell<Vec<(u16, u32)>>> = Rc::default();
    let out = seen.clone();
    tokio::task::spawn_local(async move {
        while let Ok(m) = pair.recv().await {
            if let Some((ev, value, _)) = monitor::decode(&m) {
                seen.borrow_mut().push((ev, value));
            }
        }
    });
    out
}

#[test]
fn peer_crash_fires_disconnected_then_reconnects() {
    let mut sim = sim();
    let phase = Rc::new(Cell::new(0u8));
    rep_echo(&mut sim, "server", 5555);
    let p = phase.clone();
    sim.client("client", async move {
        let ctx = Context::new("client");
        let dealer = Socket::new(&ctx, SocketType::Dealer, SocketOptions::default());
        let events = watch(&ctx, &dealer, "mon", monitor::ALL).await;
        dealer.connect("tcp://server:5555")?;
        dealer.send(msg(&["", "one"])).await?;
        assert_eq!(text(&recv_within(&dealer, ms(500)).await.expect("reply")), ["", "server", "one"]);
        let kinds: Vec<u16> = events.borrow().iter().map(|e| e.0).collect();
        assert_eq!(kinds, [monitor::CONNECT_DELAYED, monitor::CONNECTED, monitor::HANDSHAKE_SUCCEEDED]);
        p.set(1); // the test crashes the server now
        while p.get() != 2 {
            clock::sleep(ms(1)).await;
        }
        clock::sleep(ms(50)).await;
        assert_eq!(dealer.peer_count(), 0);
        let kinds: Vec<u16> = events.borrow().iter().map(|e| e.0).collect();
        assert_eq!(kinds[3], monitor::DISCONNECTED, "{kinds:?}");
        assert_eq!(events.borrow()[3].1, events.borrow()[1].1, "DISCONNECTED carries the connection's fd");
        p.set(3); // the test restarts the server
                  // The pipe survives the reconnect: a request sent now goes out once it is up.
        dealer.send(msg(&["", "two"])).await?;
        assert_eq!(text(&recv_within(&dealer, Duration::from_secs(2)).await.expect("reply")), ["", "server", "two"]);
        let kinds: Vec<u16> = events.borrow().iter().map(|e| e.0).collect();
        assert!(kinds.contains(&monitor::CONNECT_RETRIED), "{kinds:?}");
        assert_eq!(kinds.last(), Some(&monitor::HANDSHAKE_SUCCEEDED), "{kinds:?}");
        Ok(())
    });
    loop {
        let done = sim.step().unwrap();
        if done {
            break;
        }
        match phase.get() {
            1 => {
                sim.crash("server");
                phase.set(2);
            }
            3 => {
                sim.bounce("server");
                phase.set(4);
            }
            _ => {}
        }
    }
}

/// A partitioned connection: with heartbeats it is dropped after the timeout; without,
/// it stays up.
fn partition_drops_after(hb: bool) -> (usize, Vec<u16>, u64) {
    let mut sim = sim();
    let phase = Rc::new(Cell::new(0u8));
    let result: Rc<RefCell<(usize, Vec<u16>, u64)>> = Rc::default();
    let opts = move || SocketOptions {
        heartbeat_ivl: hb.then(|| Duration::from_secs(2)),
        heartbeat_timeout: hb.then(|| Duration::from_secs(10)),
        heartbeat_ttl: hb.then(|| Duration::from_secs(10)),
        ..Default::default()
    };
    sim.host("server", move || async move {
        let ctx = Context::new("server");
        let router = Socket::new(&ctx, SocketType::Router, opts());
        router.bind("tcp://0.0.0.0:5710").await?;
        std::future::pending::<()>().await;
        Ok(())
    });
    let (p, r) = (phase.clone(), result.clone());
    sim.client("client", async move {
        let ctx = Context::new("client");
        let dealer = Socket::new(&ctx, SocketType::Dealer, opts());
        let events = watch(&ctx, &dealer, "mon", monitor::DISCONNECTED).await;
        dealer.connect("tcp://server:5710")?;
        wait_peers(&dealer, 1).await;
        // Heartbeats keep a healthy idle connection up.
        clock::sleep(Duration::from_secs(30)).await;
        assert_eq!(dealer.peer_count(), 1);
        p.set(1);
        let start = clock::now();
        let mut dropped_after = 0;
        for _ in 0..600 {
            clock::sleep(ms(50)).await;
            if !events.borrow().is_empty() && dropped_after == 0 {
                dropped_after = (clock::now() - start).as_millis() as u64;
            }
        }
        *r.borrow_mut() = (dealer.peer_count(), events.borrow().iter().map(|e| e.0).collect(), dropped_after);
        Ok(())
    });
    loop {
        if sim.step().unwrap() {
            break;
        }
        if phase.get() == 1 {
            sim.partition("client", "server");
            phase.set(2);
        }
    }
    let out = result.borrow().clone();
    out
}

#[test]
fn heartbeats_drop_a_wedged_connection_and_without_them_it_stays() {
    let (peers, events, after_ms) = partition_drops_after(true);
    assert_eq!(events.first(), Some(&monitor::DISCONNECTED));
    // The last PING before the partition armed nothing (traffic answered it); the first
    // unanswered one goes out within 2 s, and 10 s later the connection is dropped.
    assert!((10_000..=12_100).contains(&after_ms), "dropped after {after_ms} ms");
    assert_eq!(peers, 0, "reconnect attempts fail while partitioned");
    let (peers, events, _) = partition_drops_after(false);
    assert!(events.is_empty(), "{events:?}");
    assert_eq!(peers, 1, "a wedged connection without heartbeats stays");
}

#[test]
fn inproc_endpoint_is_released_after_the_lag() {
    let mut sim = sim();
    sim.client("host", async {
        let ctx = Context::new("host");
        ctx.set_inproc_release_lag(ms(5));
        let missing = Socket::new(&ctx, SocketType::Pair, SocketOptions::default());
        assert_eq!(missing.connect("inproc://nobody"), Err(ZmqError::ConnRefused));
        let a = Socket::new(&ctx, SocketType::Pair, SocketOptions::default());
        a.bind("inproc://m").await?;
        let b = Socket::new(&ctx, SocketType::Pair, SocketOptions::default());
        assert_eq!(b.bind("inproc://m").await, Err(ZmqError::AddrInUse));
        b.connect("inproc://m")?;
        b.send(msg(&["ping"])).await?;
        assert_eq!(text(&a.recv().await?), ["ping"]);
        a.send(msg(&["last"])).await?;
        a.close();
        // What the closed end sent can still be read; then the pipe is gone.
        assert_eq!(text(&b.try_recv()?), ["last"]);
        assert_eq!(b.try_send(msg(&["x"])), Err(ZmqError::Again));
        let c = Socket::new(&ctx, SocketType::Pair, SocketOptions::default());
        assert_eq!(c.bind("inproc://m").await, Err(ZmqError::AddrInUse), "not yet released");
        assert_eq!(c.connect("inproc://m"), Err(ZmqError::ConnRefused));
        clock::sleep(ms(5)).await;
        assert_eq!(c.bind("inproc://m").await, Ok("inproc://m".to_string()));
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn oversize_message_drops_the_connection() {
    let mut sim = sim();
    sim.host("sink", || async {
        let ctx = Context::new("sink");
        let pull = Socket::new(&ctx, SocketType::Pull, SocketOptions { maxmsgsize: Some(8), ..Default::default() });
        pull.bind("tcp://0.0.0.0:6000").await?;
        let push = Socket::new(&ctx, SocketType::Push, SocketOptions::default());
        push.bind("tcp://0.0.0.0:6001").await?;
        loop {
            let m = pull.recv().await?;
            push.send(m).await?;
        }
    });
    sim.client("source", async {
        let ctx = Context::new("source");
        let push = Socket::new(&ctx, SocketType::Push, SocketOptions::default());
        let events = watch(&ctx, &push, "mon", monitor::DISCONNECTED).await;
        push.connect("tcp://sink:6000")?;
        let back = Socket::new(&ctx, SocketType::Pull, SocketOptions::default());
        back.connect("tcp://sink:6001")?;
        push.send(msg(&["0123456789"])).await?;
        assert_eq!(recv_within(&back, ms(300)).await, None, "oversize message not delivered");
        assert_eq!(events.borrow().len(), 1, "the sink dropped the connection");
        // After the reconnect, small messages flow again.
        push.send(msg(&["small"])).await?;
        assert_eq!(text(&recv_within(&back, ms(500)).await.expect("small")), ["small"]);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn late_reply_to_a_closed_req_is_not_seen_by_its_replacement() {
    let mut sim = sim();
    sim.host("server", || async {
        let ctx = Context::new("server");
        let rep = Socket::new(&ctx, SocketType::Rep, SocketOptions::default());
        rep.bind("tcp://0.0.0.0:5555").await?;
        loop {
            let req = rep.recv().await?;
            if req[0] == b"slow" {
                clock::sleep(ms(300)).await;
            }
            // The requester may be gone: the reply is dropped, the send still succeeds.
            rep.send(req).await?;
        }
    });
    sim.client("client", async {
        let ctx = Context::new("client");
        let opts = SocketOptions { linger: Duration::ZERO, ..Default::default() };
        let first = Socket::new(&ctx, SocketType::Req, opts.clone());
        first.connect("tcp://server:5555")?;
        first.send(msg(&["slow"])).await?;
        assert_eq!(recv_within(&first, ms(100)).await, None, "timed out");
        first.close();
        let second = Socket::new(&ctx, SocketType::Req, opts);
        second.connect("tcp://server:5555")?;
        second.send(msg(&["fast"])).await?;
        assert_eq!(text(&recv_within(&second, Duration::from_secs(1)).await.expect("reply")), ["fast"]);
        assert_eq!(recv_within(&second, ms(500)).await, None);
        Ok(())
    });
    sim.run().unwrap();
}

#[test]
fn same_scenario_gives_the_same_trace() {
    fn run() -> u64 {
        ctlplane_sim::trace::reset(false);
        let mut sim = sim();
        rep_echo(&mut sim, "server", 5555);
        sim.client("client", async {
            let ctx = Context::new("client");
            let req = Socket::new(&ctx, SocketType::Req, SocketOptions::default());
            req.connect("tcp://server:5555")?;
            for i in 0..10 {
                req.send(msg(&[&i.to_string()])).await?;
                recv_within(&req, ms(500)).await.expect("reply");
            }
            Ok(())
        });
        sim.run().unwrap();
        ctlplane_sim::trace::hash()
    }
    let a = run();
    assert!(ctlplane_sim::trace::count() > 40);
    assert_eq!(a, run());
}

/// Runs `sim` the way the engine does: a 1 ms tick while bytes are on the wire, a connect
/// is in progress or something just happened, otherwise a jump to the next registered
/// deadline. Returns the number of steps.
fn run_idle_skipping(sim: &mut Sim) -> u64 {
    clock::reset();
    let mut steps = 0;
    loop {
        let activity = clock::activity();
        steps += 1;
        if sim.step().unwrap() {
            return steps;
        }
        let (pairs, connecting) = clock::in_flight_pairs();
        let tick = if connecting || !pairs.is_empty() || clock::activity() != activity {
            ms(1)
        } else {
            let now = sim.elapsed().as_nanos() as u64;
            let next = clock::next_deadline().unwrap_or(now + 1_000_000_000);
            Duration::from_nanos(next.saturating_sub(now)).max(ms(1))
        };
        sim.set_tick_duration(Duration::from_millis(tick.as_nanos().div_ceil(1_000_000) as u64));
    }
}

/// A heartbeating DEALER/ROUTER pair idle for a minute around slow replies; returns what
/// the client observed (reply times in ms, connection count, monitor events).
/// Replies with their times (ms), live connections at the end, monitor events.
type Observed = (Vec<(String, u64)>, usize, Vec<u16>);

fn idle_minute(skip: bool) -> (Vec<(String, u64)>, usize, Vec<u16>, u64) {
    let mut sim = sim();
    let hb = || SocketOptions {
        heartbeat_ivl: Some(Duration::from_secs(2)),
        heartbeat_timeout: Some(Duration::from_secs(10)),
        heartbeat_ttl: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    sim.host("server", move || async move {
        let ctx = Context::new("server");
        let router = Socket::new(&ctx, SocketType::Router, hb());
        router.bind("tcp://0.0.0.0:5710").await?;
        loop {
            let m = router.recv().await?;
            clock::sleep(Duration::from_secs(5)).await;
            router.send(m).await?;
        }
    });
    let seen: Rc<RefCell<Observed>> = Rc::default();
    let out = seen.clone();
    sim.client("client", async move {
        let ctx = Context::new("client");
        let dealer = Socket::new(&ctx, SocketType::Dealer, hb());
        let events = watch(&ctx, &dealer, "mon", monitor::ALL).await;
        dealer.connect("tcp://server:5710")?;
        for i in 0..3 {
            dealer.send(msg(&[&i.to_string()])).await?;
            let m = recv_within(&dealer, Duration::from_secs(30)).await.expect("reply");
            seen.borrow_mut().0.push((text(&m)[0].clone(), clock::now().as_nanos() / 1_000_000));
            clock::sleep(Duration::from_secs(20)).await;
        }
        let kinds = events.borrow().iter().map(|e| e.0).collect();
        let mut s = seen.borrow_mut();
        s.1 = dealer.peer_count();
        s.2 = kinds;
        Ok(())
    });
    let steps = if skip {
        run_idle_skipping(&mut sim)
    } else {
        sim.run().unwrap();
        0
    };
    let s = out.borrow().clone();
    (s.0, s.1, s.2, steps)
}

#[test]
fn idle_skipping_changes_nothing_observable() {
    let (fine_replies, fine_peers, fine_events, _) = idle_minute(false);
    let (replies, peers, events, steps) = idle_minute(true);
    assert_eq!(fine_replies.len(), 3);
    assert_eq!(fine_peers, 1, "heartbeats kept the idle connection up");
    assert!(!fine_events.contains(&monitor::DISCONNECTED), "{fine_events:?}");
    assert_eq!((replies, peers, events), (fine_replies, fine_peers, fine_events));
    // 75 s of simulated time: a fixed 1 ms tick takes 75,000 steps.
    assert!(steps < 5_000, "{steps} steps");
}

#[test]
fn blocking_send_waits_for_a_peer_and_disconnect_stops_a_route() {
    let mut sim = sim();
    for (name, delay) in [("r1", 0u64), ("r2", 200)] {
        sim.host(name, move || async move {
            clock::sleep(ms(delay)).await;
            let ctx = Context::new(name);
            let rep = Socket::new(&ctx, SocketType::Rep, SocketOptions::default());
            rep.bind("tcp://0.0.0.0:5555").await?;
            loop {
                let mut m = rep.recv().await?;
                m.insert(0, name.as_bytes().to_vec());
                rep.send(m).await?;
            }
        });
    }
    sim.client("client", async {
        let ctx = Context::new("client");
        // IMMEDIATE: no pipe until r2 is up, so send blocks until then.
        let req = Socket::new(&ctx, SocketType::Req, SocketOptions { immediate: true, ..Default::default() });
        req.connect("tcp://r2:5555")?;
        assert_eq!(req.try_send(msg(&["x"])), Err(ZmqError::Again));
        req.send(msg(&["x"])).await?;
        assert!(clock::now().as_nanos() >= 200_000_000, "send returned before r2 was up");
        assert_eq!(text(&recv_within(&req, ms(500)).await.expect("reply")), ["r2", "x"]);

        let dealer = Socket::new(&ctx, SocketType::Dealer, SocketOptions::default());
        dealer.connect("tcp://r1:5555")?;
        dealer.connect("tcp://r2:5555")?;
        wait_peers(&dealer, 2).await;
        dealer.disconnect("tcp://r1:5555")?;
        assert!(matches!(dealer.disconnect("tcp://r1:5555"), Err(ZmqError::Invalid(_))));
        for i in 0..4 {
            dealer.send(msg(&["", &i.to_string()])).await?;
        }
        for i in 0..4 {
            let reply = recv_within(&dealer, ms(500)).await.expect("reply");
            assert_eq!(text(&reply), ["".to_string(), "r2".to_string(), i.to_string()]);
        }
        clock::sleep(ms(50)).await;
        assert_eq!(dealer.peer_count(), 1);
        Ok(())
    });
    sim.run().unwrap();
}
