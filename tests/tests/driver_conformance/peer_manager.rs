//! The P2P tiering manager (`PeerManager`) with one scripted peer: the handshake, a
//! lookup and a fetch answered by the application, a frame that is not msgpack, a message
//! of an unknown type, then the peer crashes (its ROUTER closes: a DISCONNECTED monitor
//! event), the session is reaped and redialled, and the restarted peer handshakes a new
//! session and is answered on it. Production: `ctlplane_zmq::ManagerLoop` on loopback. The
//! simulator: the P2P peer host (`ctlplane_sim::p2p`) in a turmoil world.
//!
//! Both runs play the simulator's application (`ctlplane_sim::p2p::answer`) with the same
//! session settings; only addresses are normalised, and turns of the loop in which the
//! manager had nothing to do (how many there are depends on time) are left out.

use super::call_log::{assert_same, CallLog};
use ctlplane_core::p2p::messages::{Connect, Message, Parsed};
use ctlplane_core::p2p::value::{self, Value};
use ctlplane_core::p2p::PeerEvent;
use std::collections::VecDeque;
use std::time::Duration;

/// The simulator's host names of the node under test and of the scripted peer.
const NODE: &str = "nodea";
const SCRIPTED: &str = "nodeb";
/// The longest a whole run may take in wall-clock time (a stuck script fails, not hangs).
const RUN_LIMIT: Duration = Duration::from_secs(60);

/// One step of the scripted peer.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Wait for the next ROUTER message: it must come from the node and be of this type.
    Receive(&'static str),
    /// Wait until the node's log shows a line containing this, logged since the last step.
    AwaitLog(&'static str),
    /// Open a DEALER to the node's ROUTER, with the scripted peer's id as identity.
    Dial,
    /// Send a frame on the DEALER.
    Send(Out),
    /// The process dies: every socket closes, no Disconnect is sent.
    Crash,
    /// The restarted process binds its ROUTER on the same address.
    Rebind,
}

#[derive(Clone, Copy, Debug)]
enum Out {
    Connect,
    ConnectAck,
    Lookup(&'static str),
    Fetch(&'static str),
    /// Not msgpack: dropped by the registry, the connection stays.
    Garbage,
    /// msgpack of a type nobody knows: skipped by the session.
    Unknown,
}

const HANDSHAKE: &[Step] = &[
    Step::Receive("connect"),
    Step::Dial,
    Step::Send(Out::Connect),
    Step::Receive("connect_ack"),
    Step::Send(Out::ConnectAck),
    Step::AwaitLog("event: Ready {"),
];

fn script() -> Vec<Step> {
    let mut steps = HANDSHAKE.to_vec();
    steps.extend([
        Step::Send(Out::Lookup("kv-1")),
        Step::Receive("lookup_resp"),
        Step::Send(Out::Garbage),
        Step::AwaitLog("undecodable("),
        Step::Send(Out::Unknown),
        Step::AwaitLog("bogus"),
        Step::Send(Out::Fetch("kv-2")),
        Step::Receive("transfer_done"),
        Step::Crash,
        Step::AwaitLog("event: Reaped {"),
        Step::Rebind,
    ]);
    steps.extend(HANDSHAKE);
    steps.extend([Step::Send(Out::Lookup("kv-3")), Step::Receive("lookup_resp")]);
    steps
}

/// What the driver of the scripted peer must do next.
#[derive(Debug)]
enum Do {
    Dial,
    Send(Vec<u8>),
    Crash,
    Rebind,
    /// Nothing yet: wait for a ROUTER message or the node's next turn.
    Wait,
    Done,
}

/// The scripted peer's state, the same for both drivers.
struct Scripted {
    steps: VecDeque<Step>,
    /// The log's length when the current step began.
    mark: usize,
    id: String,
    node: String,
    incarnation: u32,
    /// ROUTER messages not yet consumed: (identity, payload).
    inbox: VecDeque<(Vec<u8>, Vec<u8>)>,
}

impl Scripted {
    fn new(id: String, node: String) -> Self {
        Scripted { steps: script().into(), mark: 0, id, node, incarnation: 0, inbox: VecDeque::new() }
    }

    /// A ROUTER message arrived.
    fn received(&mut self, frames: Vec<Vec<u8>>) {
        let [identity, payload]: [Vec<u8>; 2] =
            frames.try_into().unwrap_or_else(|f| panic!("not [identity, payload]: {f:?}"));
        self.inbox.push_back((identity, payload));
    }

    /// The next thing to do, given the node's log so far.
    fn next(&mut self, log: &CallLog) -> Do {
        let Some(step) = self.steps.front().copied() else { return Do::Done };
        let act = match step {
            Step::Receive(kind) => {
                let Some((identity, payload)) = self.inbox.pop_front() else { return Do::Wait };
                assert_eq!(identity, self.node.as_bytes(), "a message from someone else");
                let got = value::decode(&payload).ok().and_then(|v| Message::parse(&v).ok());
                let Some(Parsed::Message(m)) = got else { panic!("step {step:?}: not a message: {payload:?}") };
                assert_eq!(m.kind(), kind, "step {step:?}: got {m:?}");
                None
            }
            Step::AwaitLog(needle) => {
                let lines = log.lines();
                if !lines.get(self.mark..).unwrap_or_default().iter().any(|l| l.contains(needle)) {
                    return Do::Wait;
                }
                None
            }
            Step::Dial => Some(Do::Dial),
            Step::Send(out) => Some(Do::Send(self.frame(out))),
            Step::Crash => Some(Do::Crash),
            Step::Rebind => {
                self.incarnation += 1;
                Some(Do::Rebind)
            }
        };
        self.steps.pop_front();
        self.mark = log.lines().len();
        // A condition met: the next step may be possible at once.
        act.unwrap_or_else(|| self.next(log))
    }

    fn frame(&self, out: Out) -> Vec<u8> {
        let message = match out {
            Out::Connect => Message::Connect(Connect {
                peer_id: self.id.clone(),
                agent_metadata: format!("scripted-{}", self.incarnation).into_bytes(),
                base_addr: 0x2000_0000,
                num_blocks: 16,
                block_len: 4096,
                config_fingerprint: String::new(),
                hash_seed: "0".into(),
            }),
            Out::ConnectAck => Message::ConnectAck { peer_id: self.id.clone() },
            Out::Lookup(kv) => Message::Lookup { kv_request_id: kv.into(), keys: vec![vec![2], vec![3]], round_seq: 0 },
            Out::Fetch(kv) => {
                Message::Fetch { kv_request_id: kv.into(), keys: vec![vec![4]], block_indexes: vec![1], round_seq: 0 }
            }
            Out::Garbage => return b"\xc1 is never msgpack".to_vec(),
            Out::Unknown => return value::encode(&Value::map([("type", Value::from("bogus"))])),
        };
        value::encode(&message.to_value())
    }
}

/// The log with addresses replaced by `<A>` (the node), `<B>` (the scripted peer) and
/// `<host>` (a host alone), and without the calls of turns with nothing to do: an empty
/// socket poll or a tick that no action or event follows.
fn normalise(lines: &[String], names: &[(String, &str)]) -> Vec<String> {
    let lines: Vec<String> =
        lines.iter().map(|l| names.iter().fold(l.clone(), |l, (from, to)| l.replace(from.as_str(), to))).collect();
    let idle = |l: &str| l == "peer_manager tick: " || l == "peer_manager sockets: router [] monitor [] -> accepted []";
    let output = |l: &str| l.starts_with("peer_manager action: ") || l.starts_with("peer_manager event: ");
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if idle(line) && !lines.get(i + 1).is_some_and(|next| output(next)) {
            continue;
        }
        out.push(line.clone());
    }
    out
}

fn names(node: &str, scripted: &str, host: &[&str]) -> Vec<(String, &'static str)> {
    let mut names = Vec::new();
    for (id, to) in [(node, "<A>"), (scripted, "<B>")] {
        names.push((id.to_string(), to));
        names.push((id.replace(':', "-"), to));
    }
    names.extend(host.iter().map(|h| (h.to_string(), "<host>")));
    names
}

/// The application both runs play over the manager.
fn serve(events: impl Iterator<Item = PeerEvent>, mut on_message: impl FnMut(&str, u64, Option<Message>)) {
    for event in events {
        if let PeerEvent::Message { peer, session, message } = event {
            on_message(&peer, session, ctlplane_sim::p2p::answer(&message));
        }
    }
}

fn production() -> Vec<String> {
    use ctlplane_core::p2p::manager::ManagerRegressions;
    use ctlplane_zmq::{ManagerLoop, TransportOptions};
    use rand_chacha::rand_core::SeedableRng;

    /// The scripted peer's process: its context and sockets (none while it is down).
    struct Peer {
        ctx: zmq::Context,
        router: Option<zmq::Socket>,
        dealer: Option<zmq::Socket>,
        port: u16,
    }
    fn bind(ctx: &zmq::Context, port: u16) -> zmq::Result<zmq::Socket> {
        let router = ctx.socket(zmq::ROUTER)?;
        router.set_linger(0)?;
        router.bind(&format!("tcp://127.0.0.1:{port}"))?;
        Ok(router)
    }

    let ctx = zmq::Context::new();
    let router = bind(&ctx, 0).expect("scripted ROUTER");
    let endpoint = router.get_last_endpoint().expect("endpoint").expect("utf-8 endpoint");
    let port: u16 = endpoint.rsplit(':').next().and_then(|p| p.parse().ok()).expect("port");
    let mut peer = Peer { ctx, router: Some(router), dealer: None, port };
    let scripted_id = format!("127.0.0.1:{port}");

    let log = CallLog::default();
    let session = ctlplane_sim::p2p::session_config(NODE, 0, &ctlplane_sim::p2p::PeerSettings::default());
    let rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let (node, node_id) = log.record(|| {
        let mut node = ManagerLoop::bind_with(
            "127.0.0.1",
            0,
            TransportOptions::default(),
            session,
            ManagerRegressions::default(),
            rng,
        )
        .expect("bind the node");
        let node_id = node.local_id().to_string();
        let mut script = Scripted::new(scripted_id.clone(), node_id.clone());
        node.keep_connected(&scripted_id);
        let started = std::time::Instant::now();
        'run: loop {
            if started.elapsed() > RUN_LIMIT {
                let lines = log.lines();
                let last = &lines[lines.len().saturating_sub(20)..];
                panic!("the script is stuck before {:?}; the node's last calls: {last:#?}", script.steps.front());
            }
            node.turn(Duration::from_millis(5)).expect("turn");
            let events: Vec<PeerEvent> = std::iter::from_fn(|| node.poll_event()).collect();
            serve(events.into_iter(), |peer, session, reply| {
                node.dispatch_ok(peer, session);
                if let Some(reply) = reply {
                    let _ = node.send_on(peer, session, reply);
                }
            });
            while let Some(Ok(frames)) = peer.router.as_ref().map(|r| r.recv_multipart(zmq::DONTWAIT)) {
                script.received(frames);
            }
            loop {
                match script.next(&log) {
                    Do::Wait => break,
                    Do::Done => break 'run,
                    Do::Dial => {
                        let dealer = peer.ctx.socket(zmq::DEALER).expect("DEALER");
                        dealer.set_linger(0).expect("linger");
                        dealer.set_identity(scripted_id.as_bytes()).expect("identity");
                        dealer.connect(&format!("tcp://{node_id}")).expect("connect");
                        peer.dealer = Some(dealer);
                    }
                    Do::Send(frame) => {
                        peer.dealer.as_ref().expect("dialled").send(frame, zmq::DONTWAIT).expect("send");
                    }
                    Do::Crash => {
                        // Every socket closes (linger 0) and the context ends, which waits
                        // until they are: the port is free again.
                        peer.dealer = None;
                        peer.router = None;
                        peer.ctx = zmq::Context::new();
                    }
                    Do::Rebind => {
                        peer.router = Some(bind(&peer.ctx, peer.port).expect("rebind the scripted ROUTER on its port"));
                    }
                }
            }
        }
        (node, node_id)
    });
    drop(node);
    normalise(&log.lines(), &names(&node_id, &scripted_id, &["127.0.0.1"]))
}

fn simulated() -> Vec<String> {
    use ctlplane_core::p2p::T0Switches;
    use ctlplane_sim::p2p::{install_peer, peer_id, PeerConfig, PeerSettings};
    use ctlplane_sim::zmq::{Context, Socket, SocketOptions, SocketType};

    let mut sim = super::scripted_world();
    let settings = PeerSettings { quiet: true, ..PeerSettings::default() };
    let peers = vec![NODE.to_string(), SCRIPTED.to_string()];
    install_peer(&mut sim, PeerConfig { name: NODE.into(), peers, seed: 7, t0: T0Switches::default(), settings });
    let log = CallLog::default();
    let script_log = log.clone();
    sim.client(SCRIPTED, async move {
        let id = peer_id(SCRIPTED);
        let mut script = Scripted::new(id.clone(), peer_id(NODE));
        let bind_at = format!("tcp://{SCRIPTED}:{}", ctlplane_sim::p2p::PORT);
        let mut ctx = Context::new(SCRIPTED);
        let router = Socket::new(&ctx, SocketType::Router, SocketOptions::default());
        router.bind(&bind_at).await?;
        let mut router = Some(router);
        let mut dealer: Option<Socket> = None;
        loop {
            while let Some(Ok(frames)) = router.as_ref().map(Socket::try_recv) {
                script.received(frames);
            }
            match script.next(&script_log) {
                Do::Wait => {
                    // A message, or a look at the node's log again (nothing wakes on a log line).
                    let readable = async {
                        match &router {
                            Some(r) => r.readable().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        biased;
                        _ = readable => {}
                        _ = ctlplane_sim::clock::sleep(Duration::from_millis(5)) => {}
                    }
                }
                Do::Done => return Ok(()),
                Do::Dial => {
                    let options =
                        SocketOptions { routing_id: Some(id.as_bytes().to_vec()), ..SocketOptions::default() };
                    let d = Socket::new(&ctx, SocketType::Dealer, options);
                    d.connect(&format!("tcp://{}", peer_id(NODE)))?;
                    dealer = Some(d);
                }
                Do::Send(frame) => dealer.as_ref().ok_or("not dialled")?.try_send(vec![frame])?,
                Do::Crash => {
                    for socket in [dealer.take(), router.take()].into_iter().flatten() {
                        socket.close();
                    }
                    ctx = Context::new(SCRIPTED);
                }
                Do::Rebind => {
                    let r = Socket::new(&ctx, SocketType::Router, SocketOptions::default());
                    r.bind(&bind_at).await?;
                    router = Some(r);
                }
            }
        }
    });
    log.record(|| sim.run()).expect("the simulated run");
    normalise(&log.lines(), &names(&peer_id(NODE), &peer_id(SCRIPTED), &[NODE, SCRIPTED]))
}

#[test]
fn the_peer_manager_gets_the_same_calls_in_production_and_in_the_simulator() {
    let production = production();
    let sim = simulated();
    for needle in ["monitor [(0, Disconnected)]", "undecodable(", "session: 1", "LookupResp"] {
        assert!(production.iter().any(|l| l.contains(needle)), "the script reached {needle}: {production:#?}");
    }
    assert_same("P2P manager", &production, &sim);
}
