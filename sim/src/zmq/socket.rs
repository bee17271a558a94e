//! The application's handle on a socket: libzmq's calls, over the shared state that the
//! socket's listener and connection tasks update in the background.

use super::connection::{self, End, Side};
use super::context::Context;
use super::endpoint::Endpoint;
use super::monitor::{self, MonitorSink};
use super::state::{ConnectEntry, Link, Pipe, SocketState};
use super::{Multipart, SocketOptions, SocketType, ZmqError, INFINITE_LINGER};
use crate::clock;
use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::rc::Rc;
use turmoil::net::{TcpListener, TcpStream};

/// One socket. Not `Clone`; dropping it closes it.
pub struct Socket {
    inner: Rc<RefCell<SocketState>>,
}

impl Socket {
    /// A new socket of `kind` in `ctx`, with `opts` fixed for its life.
    pub fn new(ctx: &Context, kind: SocketType, opts: SocketOptions) -> Socket {
        let state = SocketState::new(ctx, kind, opts);
        crate::trace::record(ctx.host(), "zmq.socket", &[("sock", &state.id), ("kind", &kind.name())]);
        Socket { inner: Rc::new(RefCell::new(state)) }
    }

    /// The socket's number in its context (deterministic: creation order).
    pub fn id(&self) -> u64 {
        self.inner.borrow().id
    }

    pub fn kind(&self) -> SocketType {
        self.inner.borrow().kind
    }

    /// Live connections (TCP connections past their greeting, inproc peers).
    pub fn peer_count(&self) -> usize {
        self.inner.borrow().live_pipes()
    }

    /// Messages that arrived from live connections and wait for `recv`: a REP closed
    /// with some queued drops requests it took in and never answers.
    pub fn queued_inbound(&self) -> usize {
        self.inner.borrow().pipes.values().map(|p| p.inbox.len()).sum()
    }

    fn ctx(&self) -> Context {
        self.inner.borrow().ctx.clone()
    }

    /// "tcp://0.0.0.0:PORT", "tcp://*:PORT", "tcp://HOST:0" (ephemeral; HOST is this host's
    /// name or address, or 127.0.0.1) or "inproc://name". Returns the resolved endpoint
    /// ("tcp://<ip>:<port>").
    pub async fn bind(&self, endpoint: &str) -> Result<String, ZmqError> {
        let parsed = Endpoint::parse(endpoint)?;
        let ctx = self.ctx();
        let result = match parsed {
            Endpoint::Inproc(name) => self.bind_inproc(&ctx, &name, endpoint),
            Endpoint::Tcp { host, port } => self.bind_tcp(&ctx, &host, port).await,
        };
        let s = self.inner.borrow();
        match &result {
            Ok(resolved) => crate::trace::record(ctx.host(), "zmq.bind", &[("sock", &s.id), ("endpoint", resolved)]),
            Err(e) => {
                crate::trace::record(
                    ctx.host(),
                    "zmq.bind_failed",
                    &[("sock", &s.id), ("endpoint", &endpoint), ("error", e)],
                );
                s.emit(monitor::BIND_FAILED, 0, endpoint);
            }
        }
        result
    }

    fn bind_inproc(&self, ctx: &Context, name: &str, endpoint: &str) -> Result<String, ZmqError> {
        if self.inner.borrow().closed {
            return Err(ZmqError::Closed);
        }
        ctx.bind_inproc(name, Rc::downgrade(&self.inner))?;
        self.inner.borrow_mut().inproc_binds.push(name.to_string());
        Ok(endpoint.to_string())
    }

    async fn bind_tcp(&self, ctx: &Context, host: &str, port: u16) -> Result<String, ZmqError> {
        if self.inner.borrow().closed {
            return Err(ZmqError::Closed);
        }
        let ip = ctx.ip();
        let unspecified: IpAddr =
            if ip.is_ipv4() { Ipv4Addr::UNSPECIFIED.into() } else { Ipv6Addr::UNSPECIFIED.into() };
        let (bind_ip, shown_ip) = match host {
            "*" | "0.0.0.0" | "::" => (unspecified, ip),
            "127.0.0.1" | "localhost" => (Ipv4Addr::LOCALHOST.into(), Ipv4Addr::LOCALHOST.into()),
            h if h == ctx.host() || h.parse::<IpAddr>().ok() == Some(ip) => (unspecified, ip),
            other => return Err(ZmqError::Invalid(format!("cannot bind to {other}: not an address of this host"))),
        };
        let listener = TcpListener::bind((bind_ip, port)).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => ZmqError::AddrInUse,
            _ => ZmqError::Invalid(e.to_string()),
        })?;
        let port = listener.local_addr().map_err(|e| ZmqError::Invalid(e.to_string()))?.port();
        let resolved = format!("tcp://{shown_ip}:{port}");
        let fd = ctx.next_fd();
        let task = tokio::task::spawn_local(accept_loop(self.inner.clone(), listener, resolved.clone()));
        let mut s = self.inner.borrow_mut();
        s.emit(monitor::LISTENING, fd, &resolved);
        s.listeners.push((resolved.clone(), fd, task));
        Ok(resolved)
    }

    /// Non-blocking: the connection is made (and remade after loss, every
    /// reconnect_ivl) in the background. Unless IMMEDIATE, the pipe exists from now on and
    /// queues messages until the connection is up.
    pub fn connect(&self, endpoint: &str) -> Result<(), ZmqError> {
        let parsed = Endpoint::parse(endpoint)?;
        if self.inner.borrow().closed {
            return Err(ZmqError::Closed);
        }
        match parsed {
            Endpoint::Inproc(name) => self.connect_inproc(&name, endpoint),
            Endpoint::Tcp { host, port } => self.connect_tcp(endpoint, host, port),
        }
    }

    fn connect_tcp(&self, endpoint: &str, host: String, port: u16) -> Result<(), ZmqError> {
        if port == 0 || host == "*" {
            return Err(ZmqError::Invalid(format!("cannot connect to {endpoint}")));
        }
        let key = format!("tcp://{host}:{port}");
        let mut s = self.inner.borrow_mut();
        if s.connects.contains_key(&key) {
            return Err(ZmqError::Invalid(format!("already connected to {key}")));
        }
        let pipe = (!s.opts.immediate).then(|| {
            let link = Link::Tcp { wake: Rc::new(tokio::sync::Notify::new()), up: false, peer: None };
            s.add_pipe(Pipe::new(key.clone(), link))
        });
        let task = tokio::task::spawn_local(connect_loop(self.inner.clone(), key.clone(), host, port));
        crate::trace::record(s.ctx.host(), "zmq.connect", &[("sock", &s.id), ("endpoint", &key)]);
        s.connects.insert(key, ConnectEntry { pipe, task, connected: false });
        Ok(())
    }

    fn connect_inproc(&self, name: &str, endpoint: &str) -> Result<(), ZmqError> {
        let ctx = self.ctx();
        let peer = ctx.lookup_inproc(name).ok_or(ZmqError::ConnRefused)?;
        if Rc::ptr_eq(&peer, &self.inner) {
            return Err(ZmqError::Invalid("a socket cannot connect to itself".into()));
        }
        let mut me = self.inner.borrow_mut();
        let mut other = peer.try_borrow_mut().map_err(|_| ZmqError::ConnRefused)?;
        if !me.kind.compatible(other.kind) {
            return Err(ZmqError::Invalid(format!("{} cannot talk to {}", me.kind.name(), other.kind.name())));
        }
        let refused = |s: &SocketState| s.kind == SocketType::Pair && s.pipes.values().any(|p| !p.dead);
        if refused(&me) || refused(&other) {
            // A PAIR has one peer; libzmq terminates the newcomer's pipe.
            crate::trace::record(ctx.host(), "zmq.pair_refused", &[("sock", &me.id), ("endpoint", &endpoint)]);
            return Ok(());
        }
        let mine =
            me.add_pipe(Pipe::new(endpoint.to_string(), Link::Inproc { peer: Rc::downgrade(&peer), peer_pipe: 0 }));
        let theirs = other.add_pipe(Pipe::new(
            endpoint.to_string(),
            Link::Inproc { peer: Rc::downgrade(&self.inner), peer_pipe: mine },
        ));
        let (my_id, their_id) = (me.opts.routing_id.clone(), other.opts.routing_id.clone());
        if let Some(p) = me.pipes.get_mut(&mine) {
            p.link = Link::Inproc { peer: Rc::downgrade(&peer), peer_pipe: theirs };
            p.identity = their_id.unwrap_or_default();
        }
        if let Some(p) = other.pipes.get_mut(&theirs) {
            p.identity = my_id.unwrap_or_default();
        }
        crate::trace::record(ctx.host(), "zmq.connect", &[("sock", &me.id), ("endpoint", &endpoint)]);
        Ok(())
    }

    /// Stops connecting to `endpoint` and drops its pipe with whatever it queued.
    pub fn disconnect(&self, endpoint: &str) -> Result<(), ZmqError> {
        let parsed = Endpoint::parse(endpoint)?;
        let mut s = self.inner.borrow_mut();
        match parsed {
            Endpoint::Tcp { host, port } => {
                let key = format!("tcp://{host}:{port}");
                let entry =
                    s.connects.remove(&key).ok_or_else(|| ZmqError::Invalid(format!("not connected to {key}")))?;
                entry.task.abort();
                if let Some(id) = entry.pipe {
                    s.remove_pipe(id);
                }
            }
            Endpoint::Inproc(_) => {
                let ids: Vec<u64> = s.pipes.iter().filter(|(_, p)| p.endpoint == endpoint).map(|(id, _)| *id).collect();
                if ids.is_empty() {
                    return Err(ZmqError::Invalid(format!("not connected to {endpoint}")));
                }
                for id in ids {
                    if let Some(pipe) = s.remove_pipe(id) {
                        hang_up_inproc(&pipe);
                    }
                }
            }
        }
        crate::trace::record(s.ctx.host(), "zmq.disconnect", &[("sock", &s.id), ("endpoint", &endpoint)]);
        Ok(())
    }

    /// `send` with ZMQ_DONTWAIT.
    pub fn try_send(&self, msg: Multipart) -> Result<(), ZmqError> {
        let result = self.inner.borrow_mut().try_send(msg);
        if result == Err(ZmqError::Again) {
            let s = self.inner.borrow();
            crate::trace::record(s.ctx.host(), "zmq.eagain", &[("sock", &s.id)]);
        }
        result
    }

    /// Blocks (in simulated time) while the send would be EAGAIN.
    pub async fn send(&self, msg: Multipart) -> Result<(), ZmqError> {
        loop {
            let room = self.inner.borrow().room.clone();
            let notified = room.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.inner.borrow_mut().try_send(msg.clone()) {
                Err(ZmqError::Again) => {}
                other => return other,
            }
            notified.await;
        }
    }

    /// `recv` with ZMQ_DONTWAIT.
    pub fn try_recv(&self) -> Result<Multipart, ZmqError> {
        self.inner.borrow_mut().try_recv()
    }

    /// `try_recv` on a ROUTER, with the message's `Peer-Address` (its connection's
    /// source address).
    pub fn try_recv_with_peer(&self) -> Result<(Multipart, Option<std::net::IpAddr>), ZmqError> {
        self.inner.borrow_mut().try_recv_with_peer()
    }

    /// Blocks (in simulated time) until a message arrives.
    pub async fn recv(&self) -> Result<Multipart, ZmqError> {
        loop {
            let readable = self.inner.borrow().readable.clone();
            let notified = readable.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.inner.borrow_mut().try_recv() {
                Err(ZmqError::Again) => {}
                other => return other,
            }
            notified.await;
        }
    }

    /// Resolves when `try_recv` would return a message (or the socket is closed), for
    /// `select!`.
    pub async fn readable(&self) {
        loop {
            let readable = self.inner.borrow().readable.clone();
            let notified = readable.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.inner.borrow_mut();
                if s.closed || s.recv_ready() {
                    return;
                }
            }
            notified.await;
        }
    }

    /// `zmq_socket_monitor`: publishes the events in `events` on a PAIR bound at
    /// `endpoint` (inproc). `events == 0` stops monitoring.
    pub async fn monitor(&self, endpoint: &str, events: u16) -> Result<(), ZmqError> {
        let ctx = self.ctx();
        let old = self.inner.borrow_mut().monitor.take();
        if let Some(old) = old {
            stop_monitor(old);
        }
        if events == 0 {
            return Ok(());
        }
        let Endpoint::Inproc(name) = Endpoint::parse(endpoint)? else {
            return Err(ZmqError::Invalid("a monitor endpoint is inproc".into()));
        };
        if self.inner.borrow().closed {
            return Err(ZmqError::Closed);
        }
        let pair = Rc::new(RefCell::new(SocketState::new(&ctx, SocketType::Pair, SocketOptions::default())));
        ctx.bind_inproc(&name, Rc::downgrade(&pair))?;
        pair.borrow_mut().inproc_binds.push(name);
        let mut s = self.inner.borrow_mut();
        crate::trace::record(
            ctx.host(),
            "zmq.monitor",
            &[("sock", &s.id), ("endpoint", &endpoint), ("events", &events)],
        );
        s.monitor = Some(MonitorSink { pair, events, endpoint: endpoint.to_string() });
        Ok(())
    }

    /// Closes the socket (as dropping it does).
    pub fn close(self) {}
}

impl Drop for Socket {
    fn drop(&mut self) {
        close_state(&self.inner);
    }
}

/// Closes a socket's state: listeners stop, connecting tasks without a connection stop
/// (unless they hold messages and a finite LINGER lets them keep trying), connections
/// flush for up to LINGER, inproc peers see the pipe end, bound inproc names
/// are released after the context's lag, and a monitor says MONITOR_STOPPED.
fn close_state(inner: &Rc<RefCell<SocketState>>) {
    let monitor = {
        let Ok(mut s) = inner.try_borrow_mut() else { return };
        if s.closed {
            return;
        }
        s.closed = true;
        let now = clock::now();
        s.linger_until = if s.opts.linger >= INFINITE_LINGER { None } else { Some(now + s.opts.linger) };
        crate::trace::record(s.ctx.host(), "zmq.close", &[("sock", &s.id)]);
        for (endpoint, fd, task) in std::mem::take(&mut s.listeners) {
            task.abort();
            s.emit(monitor::CLOSED, fd, &endpoint);
        }
        // A connecting pipe with queued messages keeps trying for the linger time.
        for (key, entry) in &s.connects {
            if !entry.connected && !s.flushing(key) {
                entry.task.abort();
            }
        }
        let ids: Vec<u64> = s.pipes.keys().copied().collect();
        for id in ids {
            let inproc = matches!(s.pipes.get(&id).map(|p| &p.link), Some(Link::Inproc { .. }));
            if inproc {
                if let Some(pipe) = s.remove_pipe(id) {
                    hang_up_inproc(&pipe);
                }
            } else if let Some(pipe) = s.pipes.get(&id) {
                pipe.wake();
            }
        }
        for name in std::mem::take(&mut s.inproc_binds) {
            s.ctx.release_inproc(&name);
        }
        s.shutdown.notify_waiters();
        s.readable.notify_waiters();
        s.room.notify_waiters();
        s.monitor.take()
    };
    if let Some(m) = monitor {
        stop_monitor(m);
    }
}

fn stop_monitor(m: MonitorSink) {
    m.emit(monitor::MONITOR_STOPPED, 0, &m.endpoint);
    close_state(&m.pair);
}

/// Tells the other end of an inproc pipe that this end is gone; it keeps what it holds.
fn hang_up_inproc(pipe: &Pipe) {
    let Link::Inproc { peer, peer_pipe } = &pipe.link else { return };
    let Some(peer) = peer.upgrade() else { return };
    let Ok(mut peer) = peer.try_borrow_mut() else { return };
    let empty = match peer.pipes.get_mut(peer_pipe) {
        Some(p) => {
            p.dead = true;
            p.inbox.is_empty()
        }
        None => return,
    };
    if empty {
        peer.remove_pipe(*peer_pipe);
    }
    peer.readable.notify_waiters();
    peer.room.notify_waiters();
}

/// Accepts connections on `listener` until the socket closes (which aborts this task).
async fn accept_loop(sock: Rc<RefCell<SocketState>>, listener: TcpListener, endpoint: String) {
    loop {
        let accepted = listener.accept().await;
        let (stream, origin) = match accepted {
            Ok(a) => a,
            Err(e) => {
                let s = sock.borrow();
                crate::trace::record(s.ctx.host(), "zmq.accept_failed", &[("sock", &s.id), ("error", &e)]);
                s.emit(monitor::ACCEPT_FAILED, 0, &endpoint);
                return;
            }
        };
        let fd = {
            let s = sock.borrow();
            if s.closed {
                return;
            }
            let fd = s.ctx.next_fd();
            crate::trace::record(s.ctx.host(), "zmq.accepted", &[("sock", &s.id), ("from", &origin), ("fd", &fd)]);
            s.emit(monitor::ACCEPTED, fd, &endpoint);
            fd
        };
        tokio::task::spawn_local(connection::run(sock.clone(), stream, endpoint.clone(), Side::Accept, fd));
    }
}

/// Connects to `host:port`, runs the connection, and reconnects every reconnect_ivl after
/// a refusal or a loss, until the socket closes or the endpoint is disconnected.
async fn connect_loop(sock: Rc<RefCell<SocketState>>, key: String, host: String, port: u16) {
    loop {
        let (ctx, ivl, fd) = {
            let s = sock.borrow();
            if s.closed && !s.flushing(&key) {
                return;
            }
            (s.ctx.clone(), s.opts.reconnect_ivl, s.ctx.next_fd())
        };
        sock.borrow().emit(monitor::CONNECT_DELAYED, monitor::EINPROGRESS, &key);
        let attempt = {
            let _connecting = Connecting::start();
            TcpStream::connect((host.as_str(), port)).await
        };
        match attempt {
            Ok(stream) => {
                {
                    let mut s = sock.borrow_mut();
                    if let Some(entry) = s.connects.get_mut(&key) {
                        entry.connected = true;
                    }
                    crate::trace::record(
                        ctx.host(),
                        "zmq.connected",
                        &[("sock", &s.id), ("endpoint", &key), ("fd", &fd)],
                    );
                    s.emit(monitor::CONNECTED, fd, &key);
                }
                let end =
                    connection::run(sock.clone(), stream, key.clone(), Side::Connect { key: key.clone() }, fd).await;
                let mut s = sock.borrow_mut();
                if let Some(entry) = s.connects.get_mut(&key) {
                    entry.connected = false;
                }
                if matches!(end, End::SocketClosed | End::Disconnected) || s.closed {
                    return;
                }
            }
            Err(e) => {
                let s = sock.borrow();
                crate::trace::record(
                    ctx.host(),
                    "zmq.connect_failed",
                    &[("sock", &s.id), ("endpoint", &key), ("error", &e)],
                );
                s.emit(monitor::CLOSED, fd, &key);
            }
        }
        {
            let s = sock.borrow();
            if s.closed && !s.flushing(&key) {
                return;
            }
            s.emit(monitor::CONNECT_RETRIED, u32::try_from(ivl.as_millis()).unwrap_or(u32::MAX), &key);
        }
        clock::sleep(ivl).await;
    }
}

/// Reports a connect in progress to the engine's clock for as long as it lasts (also
/// when the task is dropped mid-connect).
struct Connecting;

impl Connecting {
    fn start() -> Connecting {
        clock::net_connecting(true);
        Connecting
    }
}

impl Drop for Connecting {
    fn drop(&mut self) {
        clock::net_connecting(false);
    }
}
