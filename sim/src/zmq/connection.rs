//! One TCP connection of a socket: greeting, then moving frames between the stream and
//! the connection's pipe, heartbeats, and the teardown that libzmq's stream engine does
//! when the peer goes away, a heartbeat expires, or a frame is above MAXMSGSIZE.
//!
//! Every byte is reported to the engine's clock (`net_wrote` / `net_read`), and every
//! wait is a registered sleep, so the engine's idle skipping never oversleeps a timer
//! nor delivers a byte late. Each message is written with one `write`, which turmoil
//! performs whole or not at all: a write cancelled by another branch loses nothing.

use super::heartbeat::{Heartbeat, HeartbeatAction};
use super::monitor;
use super::state::{Link, Pipe, SocketState};
use super::wire::{self, Assembler, Command, Decoder, Frame, WireError};
use super::{SocketType, HANDSHAKE_IVL};
use crate::clock;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::net::IpAddr;
use std::rc::Rc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use turmoil::net::TcpStream;

/// Which end made the connection.
#[derive(Clone, Debug)]
pub(crate) enum Side {
    /// Accepted by a listener bound at this endpoint.
    Accept,
    /// Made for `connect(endpoint)`; the endpoint keys the socket's connect table.
    Connect { key: String },
}

/// Why a connection ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum End {
    /// The socket closed (and lingered, if it had to).
    SocketClosed,
    /// EOF or reset from the peer.
    Lost(String),
    /// Heartbeat timeout or TTL, or no greeting within the handshake interval.
    TimedOut,
    /// A frame above MAXMSGSIZE.
    TooBig,
    /// Bytes that are not the model's protocol, or an incompatible socket type.
    Protocol(String),
    /// ROUTER_HANDOVER gave this connection's identity to a newcomer.
    HandedOver,
    /// `disconnect` of its endpoint.
    Disconnected,
}

impl fmt::Display for End {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            End::SocketClosed => write!(f, "socket closed"),
            End::Lost(why) => write!(f, "lost: {why}"),
            End::TimedOut => write!(f, "heartbeat timeout"),
            End::TooBig => write!(f, "frame above maxmsgsize"),
            End::Protocol(why) => write!(f, "protocol error: {why}"),
            End::HandedOver => write!(f, "identity handed over"),
            End::Disconnected => write!(f, "disconnected"),
        }
    }
}

/// Whatever was in flight on a stream never arrives once it is gone (also on a crash,
/// when the host's tasks are dropped mid-await).
struct StreamGuard {
    local: IpAddr,
    peer: IpAddr,
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        clock::net_reset(self.local, self.peer);
        clock::net_reset(self.peer, self.local);
    }
}

/// What the loop asks the socket state each turn.
struct Turn {
    stop: Option<End>,
    can_read: bool,
    next_out: Option<Vec<u8>>,
    linger_until: Option<ctlplane_core::time::Instant>,
}

/// Runs one connection of `sock` until it ends, then detaches its pipe (emitting
/// DISCONNECTED unless the socket itself closed). `endpoint` names it in events.
pub(crate) async fn run(
    sock: Rc<RefCell<SocketState>>,
    stream: TcpStream,
    endpoint: String,
    side: Side,
    fd: u32,
) -> End {
    let (local, peer) = match (stream.local_addr(), stream.peer_addr()) {
        (Ok(l), Ok(p)) => (l.ip(), p.ip()),
        _ => return End::Lost("no address".into()),
    };
    let _guard = StreamGuard { local, peer };
    let (host, kind, opts, shutdown) = {
        let s = sock.borrow();
        (s.ctx.host().to_string(), s.kind, s.opts.clone(), s.shutdown.clone())
    };
    let (mut rd, mut wr) = stream.into_split();
    let mut buf = vec![0u8; 64 * 1024];
    let mut dec = Decoder::new(opts.maxmsgsize);

    // Greeting, both ways.
    let greeting = wire::encode_greeting(kind, opts.routing_id.as_deref().unwrap_or_default());
    if let Err(e) = wr.write_all(&greeting).await {
        return End::Lost(e.to_string());
    }
    clock::net_wrote(local, peer, greeting.len());
    let deadline = clock::now() + HANDSHAKE_IVL;
    let peer_greeting = loop {
        match wire::decode_greeting(dec.buffered()) {
            Ok(Some((g, n))) => {
                dec.consume(n);
                break g;
            }
            Ok(None) => {}
            Err(e) => return finish(&sock, None, &side, &endpoint, fd, End::Protocol(e.to_string())),
        }
        {
            let s = sock.borrow();
            let flushing = matches!(&side, Side::Connect { key } if s.flushing(key));
            if s.closed && !flushing {
                return End::SocketClosed;
            }
        }
        tokio::select! {
            biased;
            _ = shutdown.notified() => {}
            r = rd.read(&mut buf) => match r {
                Ok(0) => return handshake_failed(&sock, &side, &endpoint, fd, End::Lost("eof".into())),
                Ok(n) => {
                    clock::net_read(peer, local, n);
                    dec.extend(&buf[..n]);
                }
                Err(e) => return handshake_failed(&sock, &side, &endpoint, fd, End::Lost(e.to_string())),
            },
            _ = clock::sleep_until(deadline) => return handshake_failed(&sock, &side, &endpoint, fd, End::TimedOut),
        }
    };
    if !kind.compatible(peer_greeting.kind) {
        let why = format!("{} cannot talk to {}", kind.name(), peer_greeting.kind.name());
        return finish(&sock, None, &side, &endpoint, fd, End::Protocol(why));
    }
    let (pipe_id, wake) = attach(&sock, &side, &endpoint, peer, peer_greeting.routing_id);
    {
        let s = sock.borrow();
        crate::trace::record(&host, "zmq.handshake", &[("sock", &s.id), ("pipe", &pipe_id), ("peer", &endpoint)]);
        s.emit(monitor::HANDSHAKE_SUCCEEDED, 0, &endpoint);
    }

    let mut hb = Heartbeat::new(&opts, clock::now());
    let mut asm = Assembler::default();
    let mut commands: VecDeque<Vec<u8>> = VecDeque::new();
    // The bytes being written and how many of them are out (turmoil writes whole
    // buffers, but a short write must not interleave another message).
    let mut current: Option<(Vec<u8>, usize)> = None;
    let end = loop {
        // Decode what was read, as far as the inbox has room.
        if let Some(end) = drain_frames(&sock, pipe_id, &mut dec, &mut asm, &mut hb, &mut commands) {
            break end;
        }
        let turn = take_turn(&sock, pipe_id, &commands, current.is_some());
        if let Some(end) = turn.stop {
            break end;
        }
        if current.is_none() {
            current = commands.pop_front().or(turn.next_out).map(|b| (b, 0));
        }
        let write_buf: Option<&[u8]> = current.as_ref().map(|(b, off)| &b[*off..]);
        let timer = match (hb.next_deadline(), turn.linger_until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        tokio::select! {
            biased;
            _ = wake.notified() => {}
            _ = shutdown.notified() => {}
            r = rd.read(&mut buf), if turn.can_read => match r {
                Ok(0) => break End::Lost("eof".into()),
                Ok(n) => {
                    clock::net_read(peer, local, n);
                    dec.extend(&buf[..n]);
                }
                Err(e) => break End::Lost(e.to_string()),
            },
            r = write_some(&mut wr, write_buf) => match r {
                Ok(n) => {
                    clock::net_wrote(local, peer, n);
                    if let Some((b, off)) = current.as_mut() {
                        *off += n;
                        if *off >= b.len() {
                            current = None;
                        }
                    }
                }
                Err(e) => break End::Lost(e.to_string()),
            },
            _ = sleep_until_opt(timer) => {
                match hb.on_timer(clock::now()) {
                    HeartbeatAction::Expired => break End::TimedOut,
                    HeartbeatAction::Ping { ttl } => commands.push_back(wire::encode_command(Command::Ping { ttl })),
                    HeartbeatAction::Idle => {}
                }
            }
        }
    };
    finish(&sock, Some(pipe_id), &side, &endpoint, fd, end)
}

async fn write_some(wr: &mut turmoil::net::tcp::OwnedWriteHalf, buf: Option<&[u8]>) -> std::io::Result<usize> {
    match buf {
        Some(b) => wr.write(b).await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<ctlplane_core::time::Instant>) {
    match at {
        Some(at) => clock::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Decodes buffered frames into the pipe while its inbox has room; `Some` ends the
/// connection (oversize or malformed frame).
fn drain_frames(
    sock: &Rc<RefCell<SocketState>>,
    pipe_id: u64,
    dec: &mut Decoder,
    asm: &mut Assembler,
    hb: &mut Heartbeat,
    commands: &mut VecDeque<Vec<u8>>,
) -> Option<End> {
    loop {
        if !sock.borrow().inbox_has_room(pipe_id) {
            return None;
        }
        let frame = match dec.next_frame() {
            Ok(Some(f)) => f,
            Ok(None) => return None,
            Err(WireError::TooBig { .. }) => return Some(End::TooBig),
            Err(e) => return Some(End::Protocol(e.to_string())),
        };
        hb.on_frame();
        match frame {
            Frame::Data { more, body } => {
                if let Some(msg) = asm.push(more, body) {
                    let mut s = sock.borrow_mut();
                    if !s.closed {
                        s.deliver(pipe_id, msg);
                    }
                }
            }
            Frame::Command(Command::Ping { ttl }) => {
                hb.on_ping(ttl, clock::now());
                commands.push_back(wire::encode_command(Command::Pong));
            }
            Frame::Command(Command::Pong) => {}
        }
    }
}

/// Reads the socket state for one turn of the loop: whether to stop, read, and what to
/// write next (taking it off the pipe: a message the connection took is lost with it).
fn take_turn(sock: &Rc<RefCell<SocketState>>, pipe_id: u64, commands: &VecDeque<Vec<u8>>, writing: bool) -> Turn {
    let mut s = sock.borrow_mut();
    let Some(pipe) = s.pipes.get(&pipe_id) else {
        return Turn { stop: Some(End::Disconnected), can_read: false, next_out: None, linger_until: None };
    };
    if pipe.kill {
        return Turn { stop: Some(End::HandedOver), can_read: false, next_out: None, linger_until: None };
    }
    if s.closed {
        let now = clock::now();
        let flushed = pipe.out.is_empty() && commands.is_empty() && !writing;
        if flushed || s.linger_until.is_some_and(|t| now >= t) {
            return Turn { stop: Some(End::SocketClosed), can_read: false, next_out: None, linger_until: None };
        }
    }
    let can_read = !s.closed && s.inbox_has_room(pipe_id);
    let linger_until = if s.closed { s.linger_until } else { None };
    let mut next_out = None;
    if !writing && commands.is_empty() {
        if let Some(pipe) = s.pipes.get_mut(&pipe_id) {
            if let Some(msg) = pipe.out.pop_front() {
                let mut bytes = Vec::new();
                wire::encode_message(&msg, &mut bytes);
                next_out = Some(bytes);
                s.room.notify_waiters();
            }
        }
    }
    Turn { stop: None, can_read, next_out, linger_until }
}

/// Gives the connection its pipe: the connecting pipe `connect` made (unless IMMEDIATE,
/// which makes it now), or a new one for an accepted connection. A ROUTER identifies the
/// peer here. Returns the pipe and the connection's wake-up.
fn attach(
    sock: &Rc<RefCell<SocketState>>,
    side: &Side,
    endpoint: &str,
    peer: IpAddr,
    routing_id: Vec<u8>,
) -> (u64, Rc<Notify>) {
    let mut s = sock.borrow_mut();
    let existing = match side {
        Side::Connect { key } => s.connects.get(key).and_then(|c| c.pipe).filter(|id| s.pipes.contains_key(id)),
        Side::Accept => None,
    };
    let (id, wake) = match existing {
        Some(id) => {
            let wake = Rc::new(Notify::new());
            if let Some(pipe) = s.pipes.get_mut(&id) {
                pipe.link = Link::Tcp { wake: wake.clone(), up: true, peer: Some(peer) };
            }
            (id, wake)
        }
        None => {
            let wake = Rc::new(Notify::new());
            let id = s.add_pipe(Pipe::new(
                endpoint.to_string(),
                Link::Tcp { wake: wake.clone(), up: true, peer: Some(peer) },
            ));
            if let Side::Connect { key } = side {
                if let Some(c) = s.connects.get_mut(key) {
                    c.pipe = Some(id);
                }
            }
            (id, wake)
        }
    };
    if s.kind == SocketType::Router {
        identify(&mut s, id, routing_id);
    } else if let Some(pipe) = s.pipes.get_mut(&id) {
        pipe.identity = routing_id;
    }
    // Messages queued while the pipe waited for its connection go out now.
    wake.notify_one();
    s.room.notify_waiters();
    (id, wake)
}

/// ROUTER: the peer's identity (generated when it sent none). A duplicate of a live one is
/// refused (the pipe is muted for its life) unless ROUTER_HANDOVER, which renames the old
/// pipe and ends its connection.
fn identify(s: &mut SocketState, id: u64, routing_id: Vec<u8>) {
    let identity = if routing_id.is_empty() {
        let n = s.next_routing_id;
        s.next_routing_id = n.wrapping_add(1);
        let mut g = vec![0u8];
        g.extend_from_slice(&n.to_be_bytes());
        g
    } else {
        routing_id
    };
    if let Some(&old) = s.routes.get(&identity) {
        if !s.opts.router_handover {
            crate::trace::record(s.ctx.host(), "zmq.identity_refused", &[("sock", &s.id), ("pipe", &id)]);
            if let Some(pipe) = s.pipes.get_mut(&id) {
                pipe.mute = true;
                pipe.identity = identity;
            }
            return;
        }
        crate::trace::record(s.ctx.host(), "zmq.identity_handover", &[("sock", &s.id), ("old", &old), ("pipe", &id)]);
        if let Some(pipe) = s.pipes.get_mut(&old) {
            pipe.kill = true;
            pipe.mute = true;
            pipe.wake();
        }
    }
    s.routes.insert(identity.clone(), id);
    if let Some(pipe) = s.pipes.get_mut(&id) {
        pipe.identity = identity;
    }
}

/// The link ended before the greeting completed: libzmq reports
/// HANDSHAKE_FAILED_NO_DETAIL, then DISCONNECTED (a protocol error during the greeting,
/// such as an incompatible socket type, is reported as DISCONNECTED alone).
fn handshake_failed(sock: &Rc<RefCell<SocketState>>, side: &Side, endpoint: &str, fd: u32, end: End) -> End {
    {
        let s = sock.borrow();
        if !s.closed {
            s.emit(monitor::HANDSHAKE_FAILED_NO_DETAIL, 0, endpoint);
        }
    }
    finish(sock, None, side, endpoint, fd, end)
}

/// Detaches the connection's pipe and reports the end: DISCONNECTED for a connection
/// that was up and ended by itself (not by the socket's close).
fn finish(
    sock: &Rc<RefCell<SocketState>>,
    pipe_id: Option<u64>,
    side: &Side,
    endpoint: &str,
    fd: u32,
    end: End,
) -> End {
    let mut s = sock.borrow_mut();
    let host = s.ctx.host().to_string();
    crate::trace::record(
        &host,
        "zmq.conn_end",
        &[("sock", &s.id), ("pipe", &pipe_id.unwrap_or(0)), ("peer", &endpoint), ("why", &end)],
    );
    if let Some(id) = pipe_id {
        let keep = matches!(side, Side::Connect { .. }) && !s.opts.immediate && !s.closed && end != End::Disconnected;
        if keep {
            if let Some(pipe) = s.pipes.get_mut(&id) {
                if let Link::Tcp { up, peer, .. } = &mut pipe.link {
                    *up = false;
                    *peer = None;
                }
                pipe.kill = false;
            }
        } else {
            s.remove_pipe(id);
            if let Side::Connect { key } = side {
                if let Some(c) = s.connects.get_mut(key) {
                    c.pipe = None;
                }
            }
        }
    }
    if end != End::SocketClosed && !s.closed {
        s.emit(monitor::DISCONNECTED, fd, endpoint);
    }
    end
}
