//! A control client over the ZeroMQ model: one REQ socket per address, under the core's
//! [`RequestSlot`] lockstep rule. The client reports how each exchange ended (a reply, a
//! timeout, a transport error) and carries out the core's [`Outcome`]: the result, and
//! whether the socket is discarded so that the next request opens a fresh one (a late
//! reply to a discarded socket is lost with it).
//!
//! Endpoints are logical (`tcp://consumer0:19001`); the client resolves them to the rank
//! host serving them when it opens a socket. A fault may make the host send a malformed
//! frame in place of a request: the server's answer to it is then the request's answer.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use ctlplane_core::ec::request_slot::{Ending, Failure, Outcome, ReplyError, RequestSlot, SlotRegressions};
use ctlplane_core::ec::wire;
use serde_json::Value;

use super::world;
use crate::clock;
use crate::zmq::{Context, Socket, SocketOptions, SocketType, ZmqError};

struct Conn {
    slot: RequestSlot,
    socket: Option<Rc<Socket>>,
}

/// REQ sockets of one host (or one of its workers), by logical address.
pub struct ControlClient {
    ctx: Context,
    host: String,
    timeout: Duration,
    regressions: SlotRegressions,
    conns: RefCell<BTreeMap<String, Conn>>,
}

impl ControlClient {
    pub fn new(ctx: &Context, host: &str, timeout: Duration) -> Self {
        // Outside an EC world (a test of the client alone) the slot has no switch on.
        let regressions = world::try_with(|w| w.regressions.slot).unwrap_or_default();
        ControlClient {
            ctx: ctx.clone(),
            host: host.to_string(),
            timeout,
            regressions,
            conns: RefCell::new(BTreeMap::new()),
        }
    }

    /// One exchange: `Ok(result)`, or the error (the server's refusal for `ok: false`,
    /// libzmq's text for a timeout) as the core's machines take it.
    pub async fn request(&self, addr: &str, frame: Vec<u8>) -> Result<Value, ReplyError> {
        let now = clock::now();
        // Outside an EC world endpoints name hosts directly.
        let target =
            world::try_with(|w| w.topo.resolve(addr, &w.event_ports)).unwrap_or_else(|| Some(addr.to_string()));
        let (begin, socket) = {
            let mut conns = self.conns.borrow_mut();
            let conn = conns.entry(addr.to_string()).or_insert_with(|| Conn {
                slot: RequestSlot::with_regressions(self.timeout, self.regressions),
                socket: None,
            });
            let begin = conn.slot.begin(now).map_err(|e| ReplyError::from(e.to_string()))?;
            let socket = match conn.socket.take() {
                Some(socket) if !begin.open => Ok(socket),
                // As libzmq's `zmq_connect`, an endpoint that does not resolve or parse
                // fails the open: the exchange ends in a transport error, for the slot
                // to judge, rather than waiting out its deadline on a socket with no peer.
                _ => open_req(&self.ctx, addr, target.as_deref()).map(Rc::new),
            };
            (begin, socket)
        };
        // A fault may replace this request with a malformed frame.
        let rank_host = target.as_deref().and_then(host_of);
        let frame = rank_host
            .and_then(|to| crate::faults::take_malformed_to(&self.host, to, false))
            .inspect(|garbage| {
                crate::trace::record(&self.host, "ec.malformed_sent", &[("to", &addr), ("len", &garbage.len())]);
            })
            .unwrap_or(frame);
        let received = match &socket {
            Ok(socket) => tokio::select! {
                biased;
                r = exchange(socket, frame) => Some(r),
                _ = clock::sleep_until(begin.deadline) => None,
            },
            Err(e) => Some(Err(e.clone())),
        };
        let ending = match &received {
            Some(Ok(reply)) => match reply.as_slice() {
                [frame] => Ending::Reply(frame),
                frames => Ending::MultiPart(frames.len()),
            },
            Some(Err(e)) => Ending::Transport(e.to_string()),
            None => Ending::TimedOut,
        };
        let mut conns = self.conns.borrow_mut();
        let Some(conn) = conns.get_mut(addr) else { return Err(ZmqError::Closed.to_string().into()) };
        let Outcome { discard_socket, result } = conn.slot.finish(begin.generation, ending, wire::decode_reply);
        if !discard_socket {
            conn.socket = socket.ok();
        }
        result.map_err(|failure| {
            let text = match &failure {
                Failure::Remote(text) | Failure::Transport(text) => text.clone(),
                Failure::NotAnObject(name) => format!("control reply from {addr} is a '{name}', not a JSON object"),
                Failure::Malformed(detail) => format!("malformed control reply from {addr}: {detail}"),
                Failure::TimedOut => ZmqError::Again.to_string(),
                Failure::Stale => "reply for a discarded request".to_string(),
            };
            failure.reply_error(text)
        })
    }
}

/// A REQ socket connected to `target`, the logical `addr` resolved (`None`: it does not).
fn open_req(ctx: &Context, addr: &str, target: Option<&str>) -> Result<Socket, ZmqError> {
    let target = target.ok_or_else(|| ZmqError::Invalid(format!("cannot resolve {addr}")))?;
    let socket = Socket::new(ctx, SocketType::Req, SocketOptions::default());
    socket.connect(target)?;
    Ok(socket)
}

async fn exchange(socket: &Socket, frame: Vec<u8>) -> Result<Vec<Vec<u8>>, ZmqError> {
    socket.send(vec![frame]).await?;
    socket.recv().await
}

/// `tcp://host:port` -> `host`.
fn host_of(endpoint: &str) -> Option<&str> {
    endpoint.strip_prefix("tcp://")?.rsplit_once(':').map(|(h, _)| h)
}
