//! The P2P sockets of one node (a ROUTER, and a DEALER with its monitor per connection)
//! and the socket work both P2P drivers share: gathering what one poll holds, carrying
//! out one of the core's [`Action`]s, waiting for activity. Who owns the decisions differs:
//! [`super::ZmqTransport`] a bare `ConnectionRegistry`, [`super::ManagerLoop`] the core's
//! `PeerManager`.

use super::router_batch::RouterBatch;
use super::sockets::{self, Dealer};
use super::{P2pError, TransportOptions};
use crate::sockets::endpoint_port;
use ctlplane_core::p2p::options::{SendMode, ROUTER_LINGER};
use ctlplane_core::p2p::{Action, ConnId, MonitorEvent};
use std::collections::BTreeMap;
use std::time::Duration;

/// Frames up to this size are copied into libzmq's message rather than handed over: a
/// handed-over buffer costs libzmq a second allocation (its reference count) and a free on
/// the I/O thread, more than copying a control message.
const COPY_FRAMES_UP_TO: usize = 8 * 1024;

/// Why an action could not be carried out.
#[derive(Debug)]
pub(crate) enum ActionError {
    /// The DEALER or its monitor could not be set up; nothing is open.
    Open(P2pError),
    /// The DEALER queues its high-water mark of messages.
    Full(ConnId),
    /// libzmq refused the frame, or the connection has no DEALER.
    Send(P2pError),
}

/// A node's P2P sockets; closed on drop (sockets before the context).
pub(crate) struct SocketSet {
    options: TransportOptions,
    /// Open DEALERs by connection handle.
    dealers: BTreeMap<ConnId, (String, Dealer)>,
    /// The ROUTER messages of the current poll (empty between polls).
    inbound: RouterBatch,
    /// The monitor events of the current poll (empty between polls).
    monitor_events: Vec<(ConnId, MonitorEvent)>,
    router: Option<zmq::Socket>,
    ctx: Option<zmq::Context>,
}

impl SocketSet {
    /// Binds the ROUTER at `tcp://host:port`; returns the sockets and the bound port
    /// (port 0 picks a free one).
    pub fn bind(host: &str, port: u16, options: TransportOptions) -> Result<(Self, u16), P2pError> {
        let ctx = zmq::Context::new();
        // As `_tcp_addr`: no bracketing, IPv6 unsupported upstream.
        let endpoint = format!("tcp://{host}:{port}");
        let router = sockets::bind_router(&ctx, &endpoint, &options)
            .map_err(|source| P2pError::Bind { endpoint: endpoint.clone(), source })?;
        let port = if port != 0 {
            port
        } else {
            let last = match router.get_last_endpoint() {
                Ok(Ok(s)) => s,
                Ok(Err(raw)) => String::from_utf8_lossy(&raw).into_owned(),
                Err(source) => return Err(P2pError::Bind { endpoint, source }),
            };
            endpoint_port(&last).ok_or(P2pError::Endpoint(last))?
        };
        let set = SocketSet {
            options,
            dealers: BTreeMap::new(),
            inbound: RouterBatch::default(),
            monitor_events: Vec::new(),
            router: Some(router),
            ctx: Some(ctx),
        };
        Ok((set, port))
    }

    /// Whether the ROUTER is still open.
    pub fn is_open(&self) -> bool {
        self.router.is_some()
    }

    /// Reads everything the ROUTER holds and the pending monitor events of every live
    /// connection (each up to its first fatal one) into the current poll's batch.
    pub fn gather<'c>(&mut self, local_id: &str, connections: impl Iterator<Item = (&'c str, ConnId, bool)>) {
        let Some(router) = &self.router else { return };
        if let Err(error) = self.inbound.drain(router) {
            tracing::warn!(%local_id, %error, "P2P ROUTER recv error");
        }
        for (peer, conn, alive) in connections {
            let Some((_, dealer)) = self.dealers.get(&conn).filter(|_| alive) else { continue };
            if let Err(error) = dealer.monitor_events(conn, &mut self.monitor_events) {
                tracing::warn!(%peer, %error, "P2P monitor error");
            }
        }
    }

    /// The current poll's ROUTER messages, each with its source address.
    pub fn router_batch(&self) -> impl Iterator<Item = (&[zmq::Message], Option<&str>)> + '_ {
        self.inbound.messages()
    }

    /// The current poll's monitor events.
    pub fn monitor_batch(&self) -> &[(ConnId, MonitorEvent)] {
        &self.monitor_events
    }

    /// Empties the current poll's batch.
    pub fn clear_batch(&mut self) {
        self.inbound.clear();
        self.monitor_events.clear();
    }

    /// Carries out one action.
    pub fn perform(&mut self, action: Action, mode: SendMode) -> Result<(), ActionError> {
        match action {
            Action::OpenDealer { conn, peer, endpoint, identity, monitor } => {
                let Some(ctx) = &self.ctx else {
                    return Err(ActionError::Open(ctlplane_core::p2p::TransportError::Closed.into()));
                };
                match Dealer::open(ctx, &endpoint, &identity, &monitor, &self.options) {
                    Ok(dealer) => {
                        tracing::debug!(%peer, %endpoint, %monitor, "P2P DEALER opened");
                        self.dealers.insert(conn, (peer, dealer));
                        Ok(())
                    }
                    Err(source) => {
                        tracing::warn!(%peer, %endpoint, error = %source, "cannot open P2P DEALER");
                        Err(ActionError::Open(P2pError::Open { peer, endpoint, source }))
                    }
                }
            }
            Action::CloseDealer { conn, peer } => {
                if let Some((_, dealer)) = self.dealers.remove(&conn) {
                    tracing::debug!(%peer, "P2P DEALER closed");
                    dealer.close();
                }
                Ok(())
            }
            Action::Transmit { conn, mut frame } => self.transmit(conn, &mut frame, mode),
        }
    }

    /// Writes `frame` to `conn`'s DEALER without waiting (unless `mode` restores the
    /// blocking send). A small frame is copied into a libzmq message (one allocation,
    /// freed by whichever thread closes it) and `frame` keeps its buffer for the next
    /// message; a large one is handed over without a copy, leaving `frame` empty.
    pub fn transmit(&mut self, conn: ConnId, frame: &mut Vec<u8>, mode: SendMode) -> Result<(), ActionError> {
        let Some((peer, dealer)) = self.dealers.get(&conn) else {
            return Err(ActionError::Send(ctlplane_core::p2p::TransportError::Closed.into()));
        };
        let flags = match mode {
            SendMode::NonBlocking => zmq::DONTWAIT,
            SendMode::BlockAtHwm => 0,
        };
        let sent = if frame.len() <= COPY_FRAMES_UP_TO {
            dealer.dealer.send(&frame[..], flags)
        } else {
            dealer.dealer.send(std::mem::take(frame), flags)
        };
        match sent {
            Ok(()) => Ok(()),
            Err(zmq::Error::EAGAIN) => Err(ActionError::Full(conn)),
            Err(source) => Err(ActionError::Send(P2pError::Send { peer: peer.clone(), source })),
        }
    }

    /// Blocks until the ROUTER or a live connection's monitor is readable, or `timeout`
    /// passes; `Ok(true)` if something is readable.
    pub fn wait(&self, connections: impl Iterator<Item = (ConnId, bool)>, timeout: Duration) -> Result<bool, P2pError> {
        let Some(router) = &self.router else { return Ok(false) };
        let mut items = vec![router.as_poll_item(zmq::POLLIN)];
        for (conn, alive) in connections {
            if let Some((_, d)) = self.dealers.get(&conn).filter(|_| alive) {
                items.push(d.monitor.as_poll_item(zmq::POLLIN));
            }
        }
        let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        match zmq::poll(&mut items, ms) {
            Ok(n) => Ok(n > 0),
            Err(zmq::Error::EINTR) => Ok(false),
            Err(e) => Err(P2pError::Wait(e)),
        }
    }

    /// Blocks until `conn`'s DEALER has room for a frame, or `timeout` passes.
    pub fn wait_writable(&self, conn: Option<ConnId>, timeout: Duration) -> Result<bool, P2pError> {
        let Some((_, d)) = conn.and_then(|conn| self.dealers.get(&conn)) else { return Ok(false) };
        let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        match d.dealer.poll(zmq::POLLOUT, ms) {
            Ok(n) => Ok(n > 0),
            Err(zmq::Error::EINTR) => Ok(false),
            Err(e) => Err(P2pError::Wait(e)),
        }
    }

    /// Open DEALERs (each with its monitor PAIR), for leak checks.
    pub fn open_dealers(&self) -> usize {
        self.dealers.len()
    }

    /// Closes every remaining DEALER (each flushing for at most its linger), then the
    /// ROUTER (linger 0), then the context. Idempotent.
    pub fn close(&mut self) {
        for (_, (_, dealer)) in std::mem::take(&mut self.dealers) {
            dealer.close();
        }
        if let Some(router) = self.router.take() {
            sockets::close_after(router, ROUTER_LINGER);
        }
        // Terminating waits at most one DEALER linger for frames still queued.
        self.ctx.take();
    }
}

impl Drop for SocketSet {
    fn drop(&mut self) {
        self.close();
    }
}
