//! A control client over the ZeroMQ model: one REQ socket per address, under the core's
//! [`RequestSlot`] lockstep rule (a socket whose exchange failed or timed out is discarded
//! and the next request opens a fresh one; a late reply to it is lost with it).
//!
//! Endpoints are logical (`tcp://consumer0:19001`); the client resolves them to the rank
//! host serving them when it opens a socket. A fault may make the host send a malformed
//! frame in place of a request: the server's answer to it is then the request's answer.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

use ctlplane_core::ec::request_slot::{ReplyFate, RequestSlot, SlotRegressions};
use ctlplane_core::ec::wire;
use serde_json::Value;

use super::world;
use crate::clock;
use crate::zmq::{Context, Socket, SocketOptions, SocketType, ZmqError};

/// `control_timeout_s` default.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

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
        let regressions = world::with(|w| w.regressions.slot);
        ControlClient {
            ctx: ctx.clone(),
            host: host.to_string(),
            timeout,
            regressions,
            conns: RefCell::new(BTreeMap::new()),
        }
    }

    /// One exchange: `Ok(result)`, or the error text (the server's for `ok: false`,
    /// libzmq's for a timeout) as the core's machines take it.
    pub async fn request(&self, addr: &str, frame: Vec<u8>) -> Result<Value, String> {
        let now = clock::now();
        let target = world::resolve(addr);
        let (begin, socket) = {
            let mut conns = self.conns.borrow_mut();
            let conn = conns.entry(addr.to_string()).or_insert_with(|| Conn {
                slot: RequestSlot::with_regressions(self.timeout, self.regressions),
                socket: None,
            });
            let begin = conn.slot.begin(now).map_err(|e| e.to_string())?;
            if begin.open || conn.socket.is_none() {
                if let Some(old) = conn.socket.take() {
                    drop(old);
                }
                let s = Socket::new(&self.ctx, SocketType::Req, SocketOptions::default());
                if let Some(target) = &target {
                    if let Err(e) = s.connect(target) {
                        tracing::debug!(host = %self.host, %addr, error = %e, "REQ connect refused");
                    }
                }
                conn.socket = Some(Rc::new(s));
            }
            (begin, conn.socket.clone())
        };
        let Some(socket) = socket else { return Err(ZmqError::Closed.to_string()) };
        // A fault may replace this request with a malformed frame.
        let rank_host = target.as_deref().and_then(host_of);
        let frame = rank_host
            .and_then(|to| crate::faults::take_malformed_to(&self.host, to, false))
            .inspect(|garbage| {
                crate::trace::record(&self.host, "ec.malformed_sent", &[("to", &addr), ("len", &garbage.len())]);
            })
            .unwrap_or(frame);
        let outcome = tokio::select! {
            biased;
            r = exchange(&socket, frame) => Some(r),
            _ = clock::sleep_until(begin.deadline) => None,
        };
        let mut conns = self.conns.borrow_mut();
        let Some(conn) = conns.get_mut(addr) else { return Err(ZmqError::Closed.to_string()) };
        match outcome {
            Some(Ok(reply)) => {
                if conn.slot.handle_reply(begin.generation) != ReplyFate::Accept {
                    return Err("reply for a discarded request".to_string());
                }
                match reply.as_slice() {
                    [frame] => match wire::decode_reply(frame) {
                        Ok(result) => result,
                        Err(e) => {
                            // Undecodable reply: the socket is suspect and goes.
                            conn.slot.handle_failure();
                            conn.socket = None;
                            Err(format!("malformed control reply from {addr}: {e}"))
                        }
                    },
                    _ => {
                        conn.slot.handle_failure();
                        conn.socket = None;
                        Err(format!("malformed control reply from {addr}: {} frames", reply.len()))
                    }
                }
            }
            Some(Err(e)) => {
                conn.slot.handle_failure();
                conn.socket = None;
                Err(e.to_string())
            }
            None => {
                if conn.slot.handle_timeout(clock::now()).is_some() {
                    conn.socket = None;
                }
                Err(ZmqError::Again.to_string())
            }
        }
    }
}

async fn exchange(socket: &Socket, frame: Vec<u8>) -> Result<Vec<Vec<u8>>, ZmqError> {
    socket.send(vec![frame]).await?;
    socket.recv().await
}

/// `tcp://host:port` -> `host`.
fn host_of(endpoint: &str) -> Option<&str> {
    endpoint.strip_prefix("tcp://")?.rsplit_once(':').map(|(h, _)| h)
}
