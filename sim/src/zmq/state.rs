//! A socket's shared state: its pipes (one per peer connection, or per connecting
//! endpoint), their queues, and the lockstep state of REQ/REP. Connection tasks and the
//! application's calls meet here, inside one host, so it lives in an `Rc<RefCell<..>>`.

use super::context::Context;
use super::monitor::MonitorSink;
use super::{Multipart, SocketOptions, SocketType};
use ctlplane_core::time::Instant;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::rc::{Rc, Weak};
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// How a pipe reaches its peer.
pub(crate) enum Link {
    /// A simulated TCP connection (absent while a connecting pipe waits to connect).
    Tcp {
        /// Wakes the connection's task: queued output, room in the inbox, close.
        wake: Rc<Notify>,
        /// A connection is carrying the pipe now.
        up: bool,
        /// The peer's address while up.
        peer: Option<IpAddr>,
    },
    /// The other end of an inproc pipe, in a socket of the same context.
    Inproc { peer: Weak<RefCell<SocketState>>, peer_pipe: u64 },
}

/// One pipe: a peer's queues.
pub(crate) struct Pipe {
    pub endpoint: String,
    /// The routing id the peer sent (ROUTER: its identity once identified).
    pub identity: Vec<u8>,
    /// ROUTER refused the peer's identity (a duplicate): its messages are dropped and
    /// nothing routes to it.
    pub mute: bool,
    /// The peer is gone (inproc); what is in the inbox can still be read.
    pub dead: bool,
    /// ROUTER_HANDOVER took the identity away: the connection must end.
    pub kill: bool,
    pub out: VecDeque<Multipart>,
    pub inbox: VecDeque<Multipart>,
    pub link: Link,
}

impl Pipe {
    pub fn new(endpoint: String, link: Link) -> Pipe {
        Pipe {
            endpoint,
            identity: Vec::new(),
            mute: false,
            dead: false,
            kill: false,
            out: VecDeque::new(),
            inbox: VecDeque::new(),
            link,
        }
    }

    /// Carried by a live connection (TCP) or a live peer (inproc).
    pub fn is_live(&self) -> bool {
        match &self.link {
            Link::Tcp { up, .. } => *up,
            Link::Inproc { .. } => !self.dead,
        }
    }

    pub fn wake(&self) {
        if let Link::Tcp { wake, .. } = &self.link {
            wake.notify_one();
        }
    }
}

/// REQ's side of the lockstep.
#[derive(Debug, Default)]
pub(crate) struct ReqState {
    /// A request went out and its reply has not been received.
    pub awaiting: bool,
    /// The pipe the request went to: only its reply is accepted.
    pub reply_pipe: Option<u64>,
}

/// REP's side of the lockstep: the request being answered.
#[derive(Debug, Default)]
pub(crate) struct RepState {
    /// (pipe, envelope up to and including the empty delimiter).
    pub pending: Option<(u64, Multipart)>,
}

/// Everything a socket shares with its tasks.
pub(crate) struct SocketState {
    pub id: u64,
    pub kind: SocketType,
    pub opts: SocketOptions,
    pub ctx: Context,
    pub closed: bool,
    /// When a closed socket's connections stop flushing (None: never).
    pub linger_until: Option<Instant>,
    pub pipes: BTreeMap<u64, Pipe>,
    next_pipe: u64,
    /// Last pipe a message was sent to / received from (round robin, fair queueing).
    pub lb_last: u64,
    pub fq_last: u64,
    pub req: ReqState,
    pub rep: RepState,
    /// ROUTER: identity → pipe.
    pub routes: BTreeMap<Vec<u8>, u64>,
    pub next_routing_id: u32,
    /// Woken (all waiters) when a message arrives.
    pub readable: Rc<Notify>,
    /// Woken (all waiters) when a pipe gains room or a pipe appears.
    pub room: Rc<Notify>,
    /// Woken (all waiters) when the socket closes.
    pub shutdown: Rc<Notify>,
    pub monitor: Option<MonitorSink>,
    /// TCP endpoints this socket connects to: endpoint → its connecting pipe (if any).
    pub connects: BTreeMap<String, ConnectEntry>,
    /// Inproc names this socket binds.
    pub inproc_binds: Vec<String>,
    /// Listener tasks (stopped at close).
    pub listeners: Vec<(String, u32, JoinHandle<()>)>,
}

/// One `connect`ed TCP endpoint.
pub(crate) struct ConnectEntry {
    pub pipe: Option<u64>,
    pub task: JoinHandle<()>,
    /// A connection is up: at close, the task may still flush (linger).
    pub connected: bool,
}

impl SocketState {
    pub fn new(ctx: &Context, kind: SocketType, opts: SocketOptions) -> SocketState {
        SocketState {
            id: ctx.next_socket_id(),
            kind,
            opts,
            ctx: ctx.clone(),
            closed: false,
            linger_until: None,
            pipes: BTreeMap::new(),
            next_pipe: 1,
            lb_last: 0,
            fq_last: 0,
            req: ReqState::default(),
            rep: RepState::default(),
            routes: BTreeMap::new(),
            // libzmq starts from a random number; the model from a fixed one.
            next_routing_id: 0x6b8b_4567,
            readable: Rc::new(Notify::new()),
            room: Rc::new(Notify::new()),
            shutdown: Rc::new(Notify::new()),
            monitor: None,
            connects: BTreeMap::new(),
            inproc_binds: Vec::new(),
            listeners: Vec::new(),
        }
    }

    /// Adds a pipe; it joins round robin and fair queueing after the existing ones.
    pub fn add_pipe(&mut self, pipe: Pipe) -> u64 {
        let id = self.next_pipe;
        self.next_pipe += 1;
        self.pipes.insert(id, pipe);
        self.room.notify_waiters();
        id
    }

    /// Removes a pipe and everything queued in it; REQ/REP forget a request on it and
    /// ROUTER its identity.
    pub fn remove_pipe(&mut self, id: u64) -> Option<Pipe> {
        let pipe = self.pipes.remove(&id)?;
        if self.routes.get(&pipe.identity) == Some(&id) {
            self.routes.remove(&pipe.identity);
        }
        if self.req.reply_pipe == Some(id) {
            // libzmq forgets the reply pipe; REQ then waits forever (the caller's timeout).
            self.req.reply_pipe = None;
        }
        Some(pipe)
    }

    /// Whether a message can be queued on `id` now (its HWM not reached).
    pub fn has_room(&self, id: u64) -> bool {
        let Some(pipe) = self.pipes.get(&id) else { return false };
        match &pipe.link {
            Link::Tcp { .. } => self.opts.sndhwm == 0 || pipe.out.len() < self.opts.sndhwm,
            Link::Inproc { peer, peer_pipe } => {
                if pipe.dead {
                    return false;
                }
                let Some(peer) = peer.upgrade() else { return false };
                let Ok(peer) = peer.try_borrow() else { return false };
                let limit = self.opts.sndhwm.saturating_add(peer.opts.rcvhwm);
                let queued = peer.pipes.get(peer_pipe).map_or(usize::MAX, |p| p.inbox.len());
                self.opts.sndhwm == 0 || peer.opts.rcvhwm == 0 || queued < limit
            }
        }
    }

    /// Queues `msg` on pipe `id` (room already checked) and wakes whoever carries it.
    pub fn enqueue(&mut self, id: u64, msg: Multipart) {
        let Some(pipe) = self.pipes.get_mut(&id) else { return };
        let len: usize = msg.iter().map(Vec::len).sum();
        crate::trace::record(
            self.ctx.host(),
            "zmq.send",
            &[("sock", &self.id), ("pipe", &id), ("peer", &pipe.endpoint), ("frames", &msg.len()), ("len", &len)],
        );
        match &pipe.link {
            Link::Tcp { wake, .. } => {
                pipe.out.push_back(msg);
                wake.notify_one();
            }
            Link::Inproc { peer, peer_pipe } => {
                if let Some(peer) = peer.upgrade() {
                    if let Ok(mut peer) = peer.try_borrow_mut() {
                        peer.deliver(*peer_pipe, msg);
                    }
                }
            }
        }
    }

    /// A message arrived on pipe `id`.
    pub fn deliver(&mut self, id: u64, msg: Multipart) {
        let Some(pipe) = self.pipes.get_mut(&id) else { return };
        if pipe.mute {
            crate::trace::record(self.ctx.host(), "zmq.drop_muted", &[("sock", &self.id), ("pipe", &id)]);
            return;
        }
        pipe.inbox.push_back(msg);
        self.readable.notify_waiters();
    }

    /// Whether the connection carrying `id` may read another message (RCVHWM).
    pub fn inbox_has_room(&self, id: u64) -> bool {
        self.pipes.get(&id).is_some_and(|p| self.opts.rcvhwm == 0 || p.inbox.len() < self.opts.rcvhwm)
    }

    /// Pops the next message of pipe `id`, telling its carrier there is room again.
    pub fn pop_inbox(&mut self, id: u64) -> Option<Multipart> {
        let pipe = self.pipes.get_mut(&id)?;
        let msg = pipe.inbox.pop_front()?;
        let len: usize = msg.iter().map(Vec::len).sum();
        let endpoint = pipe.endpoint.clone();
        match &pipe.link {
            Link::Tcp { wake, .. } => wake.notify_one(),
            Link::Inproc { peer, .. } => {
                if let Some(peer) = peer.upgrade() {
                    if let Ok(peer) = peer.try_borrow() {
                        peer.room.notify_waiters();
                    }
                }
            }
        }
        if pipe.dead && pipe.inbox.is_empty() {
            self.remove_pipe(id);
        }
        crate::trace::record(
            self.ctx.host(),
            "zmq.recv",
            &[("sock", &self.id), ("pipe", &id), ("peer", &endpoint), ("frames", &msg.len()), ("len", &len)],
        );
        Some(msg)
    }

    /// Pipes in round-robin order after `last`, wrapping.
    pub fn pipes_after(&self, last: u64) -> Vec<u64> {
        let mut order: Vec<u64> = self.pipes.range(last + 1..).map(|(id, _)| *id).collect();
        order.extend(self.pipes.range(..=last).map(|(id, _)| *id));
        order
    }

    /// The next pipe with a message, fair-queued (muted pipes never hold any).
    pub fn fq_next(&self) -> Option<u64> {
        self.pipes_after(self.fq_last).into_iter().find(|id| self.pipes.get(id).is_some_and(|p| !p.inbox.is_empty()))
    }

    /// The next pipe that can take a message, round robin; `None` is EAGAIN.
    pub fn lb_next(&self) -> Option<u64> {
        self.pipes_after(self.lb_last)
            .into_iter()
            .find(|id| self.pipes.get(id).is_some_and(|p| !p.mute) && self.has_room(*id))
    }

    /// Live connections.
    pub fn live_pipes(&self) -> usize {
        self.pipes.values().filter(|p| p.is_live()).count()
    }

    /// A closed socket still trying to deliver what `connect(key)`'s pipe queued before
    /// any connection carried it: it holds messages and a finite linger has not run out.
    /// (With an infinite linger libzmq would retry forever; the model drops them at close.)
    pub fn flushing(&self, key: &str) -> bool {
        if !self.closed || self.linger_until.is_none_or(|t| crate::clock::now() >= t) {
            return false;
        }
        self.connects
            .get(key)
            .and_then(|c| c.pipe)
            .and_then(|id| self.pipes.get(&id))
            .is_some_and(|p| !p.out.is_empty())
    }

    /// Emits a monitor event if a monitor subscribed to it.
    pub fn emit(&self, event: u16, value: u32, endpoint: &str) {
        if let Some(m) = &self.monitor {
            m.emit(event, value, endpoint);
        }
    }
}
