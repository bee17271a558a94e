//! `ctlplane p2p ...`: a P2P control-transport peer (an echo peer, and a one-shot sender),
//! for operators checking a link and for interop runs against Python peers.

use crate::p2p_json;
use crate::security::PeerCurve;
use clap::{Args, Subcommand};
use ctlplane_core::p2p::defaults::HANDSHAKE_TIMEOUT;
use ctlplane_core::p2p::registry::MAX_CONTROL_MESSAGE_BYTES;
use ctlplane_core::p2p::session::SessionConfig;
use ctlplane_core::p2p::PeerEvent;
use ctlplane_core::p2p::{AllowEntry, PeerCheck, PeerCheckMode};
use ctlplane_zmq::{ManagerLoop, TransportOptions, ZmqTransport};
use std::error::Error;
use std::io::Write;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct P2pArgs {
    #[command(subcommand)]
    op: Op,
}

/// Bounds against hostile or runaway peers.
#[derive(Args)]
struct Limits {
    /// Most registered peers. Every peer costs a DEALER, its monitor and a PAIR, and
    /// libzmq's context holds 1023 sockets; a new peer past the bound is refused and
    /// logged. 0 = unbounded (the reference).
    #[arg(long, default_value_t = 128)]
    max_peers: usize,
    /// Largest control message in bytes (ZMQ_MAXMSGSIZE on every socket and the
    /// registry's payload bound, T2's 64 MiB by default): a bigger inbound frame drops
    /// its connection, a bigger outbound one is refused. 0 = unbounded (T1).
    #[arg(long, default_value_t = MAX_CONTROL_MESSAGE_BYTES)]
    max_message_bytes: usize,
    /// Which inbound peers are dialled back (docs/peer-admission.md). strict: a peer's
    /// identity must name the host its connection comes from (or be allowlisted);
    /// allowlist: only allowlisted identities; off: every identity, as the reference
    /// (only for trusted networks that rewrite source addresses).
    #[arg(long, default_value_t = PeerCheckMode::Strict)]
    peer_check: PeerCheckMode,
    /// An identity (`host:port`) or network (`10.1.0.0/16`) this node may dial back
    /// whatever address the peer's connection comes from (NAT, multi-homed peers).
    /// Repeatable.
    #[arg(long = "peer-allow")]
    peer_allow: Vec<AllowEntry>,
    #[command(flatten)]
    curve: PeerCurve,
}

impl Limits {
    fn options(&self) -> Result<TransportOptions, Box<dyn Error>> {
        Ok(TransportOptions {
            curve: self.curve.peer()?,
            max_peers: (self.max_peers > 0).then_some(self.max_peers),
            max_message_bytes: (self.max_message_bytes > 0).then_some(self.max_message_bytes),
            peer_check: PeerCheck { mode: self.peer_check, allow: self.peer_allow.clone() },
            ..TransportOptions::default()
        })
    }
}

#[derive(Subcommand)]
enum Op {
    /// Answer every message with the same message on its sender's connection, until
    /// SIGINT or SIGTERM; prints `ready` once bound and a summary line per message on
    /// stderr (its type and size, never the payload unless `--log-payload`).
    Echo {
        /// Host to bind and advertise (peers dial `host:port` back, verbatim).
        #[arg(long, default_value = "127.0.0.1")]
        host: String,
        #[arg(long)]
        port: u16,
        /// Log each message in full (its display form) instead of a summary line.
        #[arg(long)]
        log_payload: bool,
        /// Run W1 sessions on the tiering manager (handshake, reaping, reconnects) and echo
        /// each peer's role messages on its session, instead of echoing raw frames.
        #[arg(long)]
        w1: bool,
        /// With `--w1`: a peer (`host:port`) to keep connected. Repeatable.
        #[arg(long = "peer", requires = "w1")]
        peers: Vec<String>,
        /// With `--w1`: the KV block length announced in the Connect (peers must match).
        #[arg(long, default_value_t = 4096, requires = "w1")]
        block_len: u64,
        /// With `--w1`: the hash seed announced in the Connect (peers must match).
        #[arg(long, default_value = "0", requires = "w1")]
        hash_seed: String,
        #[command(flatten)]
        limits: Limits,
    },
    /// Send one message and print the first message that comes back, as one line of JSON
    /// (`bin` as `{"$bin": "hex"}`).
    Send {
        /// `host:port` to bind the local ROUTER at; the peer sends its reply there.
        #[arg(long)]
        local: String,
        /// The peer's `host:port`.
        #[arg(long)]
        to: String,
        /// The message, a JSON object; integers of any width, `{"$bin": "hex"}` for bytes.
        #[arg(long)]
        json: String,
        /// A top-level field whose hex string (or list of hex strings) is sent as bin.
        #[arg(long = "bin-field")]
        bin_fields: Vec<String>,
        /// How long to wait for the reply.
        #[arg(long, default_value_t = 5_000)]
        timeout_ms: u64,
        /// Print the reply in the display form (`b"hex"` for bin) instead of exact JSON.
        #[arg(long)]
        display: bool,
        #[command(flatten)]
        limits: Limits,
    },
}

/// How long one wait for socket activity lasts, so a signal is seen promptly.
const TICK: Duration = Duration::from_millis(100);

pub fn run(args: P2pArgs) -> Result<ExitCode, Box<dyn Error>> {
    match args.op {
        Op::Echo { host, port, log_payload, w1: false, limits, .. } => {
            echo(&host, port, log_payload, limits.options()?)
        }
        Op::Echo { host, port, log_payload, w1: true, peers, block_len, hash_seed, limits } => {
            let session = SessionConfig {
                local_id: String::new(),
                agent_metadata: Vec::new(),
                base_addr: 0,
                num_blocks: 1,
                block_len,
                config_fingerprint: String::new(),
                hash_seed,
                handshake_timeout: Some(HANDSHAKE_TIMEOUT),
                silent_connect_rejection: false,
            };
            echo_w1(&host, port, &peers, session, log_payload, limits.options()?)
        }
        Op::Send { local, to, json, bin_fields, timeout_ms, display, limits } => {
            let msg = p2p_json::parse(&json, &bin_fields)?;
            send(&local, &to, &msg, Duration::from_millis(timeout_ms), display, limits.options()?)
        }
    }
}

fn echo(host: &str, port: u16, log_payload: bool, options: TransportOptions) -> Result<ExitCode, Box<dyn Error>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Release))?;
    let mut transport = ZmqTransport::bind_with(host, port, options)?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);
    while !stop.load(Ordering::Acquire) {
        transport.wait(TICK)?;
        for peer in transport.poll() {
            tracing::info!(%peer, "accepted P2P peer");
        }
        for peer in transport.peers() {
            for msg in transport.recv(&peer) {
                log_message(&peer, &msg, log_payload);
                if let Err(error) = transport.send(&peer, &msg) {
                    tracing::warn!(%peer, %error, "echo not sent");
                }
            }
        }
    }
    let refused = transport.stats().messages_refused;
    tracing::info!(refused, "signal received; closing the P2P transport");
    transport.close();
    Ok(ExitCode::SUCCESS)
}

/// `echo --w1`: the production manager loop; every role message is answered with itself on
/// the session it came from.
fn echo_w1(
    host: &str,
    port: u16,
    peers: &[String],
    session: SessionConfig,
    log_payload: bool,
    options: TransportOptions,
) -> Result<ExitCode, Box<dyn Error>> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    ctrlc::set_handler(move || flag.store(true, Ordering::Release))?;
    let mut node = ManagerLoop::bind(host, port, options, session)?;
    for peer in peers {
        node.keep_connected(peer);
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);
    while !stop.load(Ordering::Acquire) {
        node.turn(TICK)?;
        while let Some(event) = node.poll_event() {
            match event {
                PeerEvent::Message { peer, session, message } => {
                    log_message(&peer, &message.to_value(), log_payload);
                    node.dispatch_ok(&peer, session);
                    if let Err(error) = node.send_on(&peer, session, message) {
                        tracing::warn!(%peer, %error, "echo not sent");
                    }
                }
                PeerEvent::Ready { peer, session } => tracing::info!(%peer, session, "P2P peer up"),
                PeerEvent::Down { peer, session, reason } => tracing::info!(%peer, session, %reason, "P2P peer down"),
                other => tracing::debug!(?other, "P2P manager"),
            }
        }
    }
    tracing::info!("signal received; closing the P2P manager");
    node.close();
    Ok(ExitCode::SUCCESS)
}

/// One stderr line per echoed message, formatted first and written with one call (stderr
/// is unbuffered: formatting straight into it costs a write per piece, which for a
/// binary payload is one per byte).
fn log_message(peer: &str, msg: &ctlplane_core::p2p::Value, payload: bool) {
    use ctlplane_core::p2p::Value;
    let line = if payload {
        format!("{peer}: {msg}\n")
    } else {
        let kind = match msg.get("type") {
            Some(Value::Str(t)) => t.as_str(),
            _ => msg.type_name(),
        };
        let bytes = ctlplane_core::p2p::value::encode(msg).len();
        format!("{peer}: echoed {kind} message ({bytes} bytes)\n")
    };
    // A closed stderr must not stop the echo.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

fn send(
    local: &str,
    to: &str,
    msg: &ctlplane_core::p2p::Value,
    timeout: Duration,
    display: bool,
    options: TransportOptions,
) -> Result<ExitCode, Box<dyn Error>> {
    let (host, port) = local.rsplit_once(':').ok_or_else(|| format!("--local {local:?}: expected host:port"))?;
    let port: u16 = port.parse().map_err(|_| format!("--local {local:?}: invalid port"))?;
    let mut transport = ZmqTransport::bind_with(host, port, options)?;
    transport.connect(to)?;
    transport.send(to, msg)?;
    let deadline = Instant::now() + timeout;
    loop {
        let now = Instant::now();
        if now >= deadline {
            transport.close();
            return Err(format!("no reply from {to} within {} ms", timeout.as_millis()).into());
        }
        transport.wait(TICK.min(deadline - now))?;
        // A peer that calls itself by another name than `to` replies from a new identity.
        let accepted = transport.poll();
        let reply = std::iter::once(to.to_string())
            .chain(accepted)
            .find_map(|peer| transport.recv(&peer).into_iter().next().map(|m| (peer, m)));
        if let Some((peer, reply)) = reply {
            if peer != to {
                tracing::info!(%peer, "reply came from another peer id than --to");
            }
            println!("{}", if display { reply.to_string() } else { p2p_json::render(&reply) });
            transport.close();
            return Ok(ExitCode::SUCCESS);
        }
        if !transport.is_alive(to) {
            transport.close();
            return Err(format!("connection to {to} lost").into());
        }
    }
}
