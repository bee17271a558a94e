//! What each socket type does with a send or a receive: which pipe, which frames, and
//! when the answer is EAGAIN, EFSM or EHOSTUNREACH, as libzmq's socket classes decide.

use super::state::{Link, SocketState};
use super::{Multipart, SocketType, ZmqError};
use std::net::IpAddr;

impl SocketState {
    /// One non-blocking send (`ZMQ_DONTWAIT`).
    pub fn try_send(&mut self, msg: Multipart) -> Result<(), ZmqError> {
        if self.closed {
            return Err(ZmqError::Closed);
        }
        if msg.is_empty() {
            return Err(ZmqError::Invalid("a message has at least one frame".into()));
        }
        match self.kind {
            SocketType::Push | SocketType::Dealer | SocketType::Pair => {
                let id = self.lb_next().ok_or(ZmqError::Again)?;
                self.lb_last = id;
                self.enqueue(id, msg);
                Ok(())
            }
            SocketType::Req => {
                if self.req.awaiting {
                    let peers: Vec<&str> = self.pipes.values().map(|p| p.endpoint.as_str()).collect();
                    super::lockstep::refused(self.ctx.host(), self.id, &peers.join(","));
                    return Err(ZmqError::Fsm);
                }
                let id = self.lb_next().ok_or(ZmqError::Again)?;
                self.lb_last = id;
                let mut framed = Vec::with_capacity(msg.len() + 1);
                framed.push(Vec::new());
                framed.extend(msg);
                self.enqueue(id, framed);
                self.req.awaiting = true;
                self.req.reply_pipe = Some(id);
                Ok(())
            }
            SocketType::Rep => {
                let Some((id, envelope)) = self.rep.pending.take() else { return Err(ZmqError::Fsm) };
                let mut framed = envelope;
                framed.extend(msg);
                // The requester's connection may be gone, or its pipe full: the reply
                // is dropped silently, as libzmq's ROUTER underneath REP does.
                if self.has_room(id) {
                    self.enqueue(id, framed);
                } else {
                    self.record_drop("zmq.reply_dropped", id);
                }
                Ok(())
            }
            SocketType::Router => self.router_send(msg),
            SocketType::Pull => Err(ZmqError::Invalid("PULL cannot send".into())),
        }
    }

    fn router_send(&mut self, mut msg: Multipart) -> Result<(), ZmqError> {
        let identity = msg.remove(0);
        let route = self.routes.get(&identity).copied();
        let Some(id) = route else {
            crate::trace::record(self.ctx.host(), "zmq.unroutable", &[("sock", &self.id), ("len", &identity.len())]);
            return if self.opts.router_mandatory { Err(ZmqError::HostUnreachable) } else { Ok(()) };
        };
        if msg.is_empty() {
            // An identity frame alone carries nothing to send.
            return Ok(());
        }
        if !self.has_room(id) {
            if self.opts.router_mandatory {
                return Err(ZmqError::Again);
            }
            self.record_drop("zmq.full_dropped", id);
            return Ok(());
        }
        self.enqueue(id, msg);
        Ok(())
    }

    fn record_drop(&self, kind: &str, pipe: u64) {
        crate::trace::record(self.ctx.host(), kind, &[("sock", &self.id), ("pipe", &pipe)]);
    }

    /// One non-blocking receive.
    pub fn try_recv(&mut self) -> Result<Multipart, ZmqError> {
        if self.closed {
            return Err(ZmqError::Closed);
        }
        match self.kind {
            SocketType::Pull | SocketType::Dealer | SocketType::Pair => self.fq_pop().ok_or(ZmqError::Again),
            SocketType::Router => {
                let (id, msg) = self.fq_pop_from().ok_or(ZmqError::Again)?;
                let identity = self.pipes.get(&id).map(|p| p.identity.clone()).unwrap_or_default();
                let mut out = Vec::with_capacity(msg.len() + 1);
                out.push(identity);
                out.extend(msg);
                Ok(out)
            }
            SocketType::Req => {
                if !self.req.awaiting {
                    return Err(ZmqError::Fsm);
                }
                self.req_prune();
                let id = self.req.reply_pipe.ok_or(ZmqError::Again)?;
                let mut msg = self.pop_inbox(id).ok_or(ZmqError::Again)?;
                msg.remove(0);
                self.fq_last = id;
                self.req.awaiting = false;
                self.req.reply_pipe = None;
                Ok(msg)
            }
            SocketType::Rep => {
                if self.rep.pending.is_some() {
                    return Err(ZmqError::Fsm);
                }
                loop {
                    let (id, mut msg) = self.fq_pop_from().ok_or(ZmqError::Again)?;
                    // The envelope ends at the first empty frame; a request without one
                    // is malformed and dropped, as libzmq does.
                    let Some(bottom) = msg.iter().position(Vec::is_empty) else {
                        self.record_drop("zmq.malformed_dropped", id);
                        continue;
                    };
                    let body = msg.split_off(bottom + 1);
                    self.rep.pending = Some((id, msg));
                    return Ok(body);
                }
            }
            SocketType::Push => Err(ZmqError::Invalid("PUSH cannot receive".into())),
        }
    }

    /// [`Self::try_recv`] on a ROUTER, with the source address of the connection the
    /// message came in on (libzmq's `Peer-Address` property); `None` for inproc.
    pub fn try_recv_with_peer(&mut self) -> Result<(Multipart, Option<IpAddr>), ZmqError> {
        if self.closed {
            return Err(ZmqError::Closed);
        }
        if self.kind != SocketType::Router {
            return self.try_recv().map(|m| (m, None));
        }
        let (id, msg) = self.fq_pop_from().ok_or(ZmqError::Again)?;
        let pipe = self.pipes.get(&id);
        let identity = pipe.map(|p| p.identity.clone()).unwrap_or_default();
        let peer = pipe.and_then(|p| match p.link {
            Link::Tcp { peer, .. } => peer,
            Link::Inproc { .. } => None,
        });
        let mut out = Vec::with_capacity(msg.len() + 1);
        out.push(identity);
        out.extend(msg);
        Ok((out, peer))
    }

    fn fq_pop(&mut self) -> Option<Multipart> {
        self.fq_pop_from().map(|(_, m)| m)
    }

    fn fq_pop_from(&mut self) -> Option<(u64, Multipart)> {
        let id = self.fq_next()?;
        self.fq_last = id;
        self.pop_inbox(id).map(|m| (id, m))
    }

    /// REQ drops what cannot be its reply: messages from other pipes, and replies that do
    /// not start with the empty delimiter.
    fn req_prune(&mut self) {
        let ids: Vec<u64> = self.pipes.keys().copied().collect();
        for id in ids {
            while let Some(front) = self.pipes.get(&id).and_then(|p| p.inbox.front()) {
                let from_reply_pipe = self.req.reply_pipe == Some(id);
                if from_reply_pipe && front.first().is_some_and(Vec::is_empty) {
                    break;
                }
                self.pop_inbox(id);
                self.record_drop("zmq.stray_reply_dropped", id);
            }
        }
    }

    /// Whether `try_recv` would return a message now.
    pub fn recv_ready(&mut self) -> bool {
        if self.closed {
            return false;
        }
        match self.kind {
            SocketType::Pull | SocketType::Dealer | SocketType::Pair | SocketType::Router => self.fq_next().is_some(),
            SocketType::Req => {
                if !self.req.awaiting {
                    return false;
                }
                self.req_prune();
                self.req.reply_pipe.is_some_and(|id| self.pipes.get(&id).is_some_and(|p| !p.inbox.is_empty()))
            }
            SocketType::Rep => {
                if self.rep.pending.is_some() {
                    return false;
                }
                // Drop malformed requests so that a ready REP really has one.
                while let Some(id) = self.fq_next() {
                    let ok =
                        self.pipes.get(&id).and_then(|p| p.inbox.front()).is_some_and(|m| m.iter().any(Vec::is_empty));
                    if ok {
                        return true;
                    }
                    self.pop_inbox(id);
                    self.record_drop("zmq.malformed_dropped", id);
                }
                false
            }
            SocketType::Push => false,
        }
    }
}
