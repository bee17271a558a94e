//! `ZmqTransport`: the P2P control transport on libzmq sockets.
//!
//! The core's [`ConnectionRegistry`] decides who is registered, alive, swept and new; this
//! type only lends it what the sockets hold (`ConnectionRegistry::poll_frames`) and carries
//! out the [`Action`]s the registry returns. No background threads: all I/O happens in the
//! calls.

use super::router_batch::RouterBatch;
use super::sockets::{self, Dealer};
use super::TransportOptions;
use crate::sockets::endpoint_port;
use ctlplane_core::p2p::options::{SendMode, ROUTER_LINGER};
use ctlplane_core::p2p::registry::RegistryStats;
use ctlplane_core::p2p::{Action, ConnId, ConnectionRegistry, MonitorEvent, RegistryConfig, TransportError, Value};
use std::collections::BTreeMap;
use std::time::Duration;
use thiserror::Error;

/// Why a transport call failed.
#[derive(Debug, Error)]
pub enum P2pError {
    /// The registry refused (duplicate live peer, bad peer id, closed, ...).
    #[error(transparent)]
    Refused(#[from] TransportError),
    /// The ROUTER could not be created or bound.
    #[error("cannot bind the P2P ROUTER at {endpoint}")]
    Bind {
        endpoint: String,
        #[source]
        source: zmq::Error,
    },
    /// `LAST_ENDPOINT` of the bound ROUTER named no port.
    #[error("the P2P ROUTER reports no usable endpoint ({0:?})")]
    Endpoint(String),
    /// The DEALER or its monitor could not be set up; the connection is retired.
    #[error("cannot open the control connection to {peer} ({endpoint})")]
    Open {
        peer: String,
        endpoint: String,
        #[source]
        source: zmq::Error,
    },
    /// The DEALER already queues its high-water mark of messages for the peer (it stopped
    /// reading, or is not reachable): sending never blocks, so the frame is not sent, and
    /// the owning session treats the connection as dead.
    #[error("ZmqConnection: send queue to {peer} is full")]
    QueueFull { peer: String },
    /// libzmq refused the frame.
    #[error("send to {peer} failed")]
    Send {
        peer: String,
        #[source]
        source: zmq::Error,
    },
    /// Waiting for readable sockets failed.
    #[error("polling the P2P sockets failed")]
    Wait(#[source] zmq::Error),
}

/// One node's P2P control transport: a ROUTER and one DEALER per peer.
pub struct ZmqTransport {
    registry: ConnectionRegistry,
    options: TransportOptions,
    port: u16,
    /// Open DEALERs by connection handle. Sockets before the context: they must close
    /// before the context terminates.
    dealers: BTreeMap<ConnId, (String, Dealer)>,
    /// The ROUTER messages of the current poll (empty between polls).
    inbound: RouterBatch,
    /// The monitor events of the current poll (empty between polls).
    monitor_events: Vec<(ConnId, MonitorEvent)>,
    router: Option<zmq::Socket>,
    ctx: Option<zmq::Context>,
}

impl ZmqTransport {
    /// Binds the ROUTER at `tcp://host:port` with the reference's options. Port 0 picks a
    /// free port; the local id (every DEALER's identity) is `host:port` with the real
    /// port and `host` verbatim, as peers dial it back.
    pub fn bind(host: &str, port: u16) -> Result<Self, P2pError> {
        Self::bind_with(host, port, TransportOptions::default())
    }

    /// [`Self::bind`] with explicit options.
    pub fn bind_with(host: &str, port: u16, options: TransportOptions) -> Result<Self, P2pError> {
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
        let mut config = RegistryConfig::new(format!("{host}:{port}"));
        config.max_peers = options.max_peers;
        config.max_message_bytes = options.max_message_bytes;
        config.peer_check = options.peer_check.clone();
        config.t0 = options.t0;
        tracing::info!(local_id = %config.local_id, "P2P ROUTER bound on {endpoint}");
        Ok(ZmqTransport {
            registry: ConnectionRegistry::new(config),
            options,
            port,
            dealers: BTreeMap::new(),
            inbound: RouterBatch::default(),
            monitor_events: Vec::new(),
            router: Some(router),
            ctx: Some(ctx),
        })
    }

    /// [`Self::bind_with`], announcing `local_id` (every DEALER's routing identity) instead
    /// of `host:port`, as the reference's constructor takes its id from the caller.
    pub fn bind_as(local_id: &str, host: &str, port: u16, options: TransportOptions) -> Result<Self, P2pError> {
        let mut transport = Self::bind_with(host, port, options)?;
        let config = RegistryConfig { local_id: local_id.to_string(), ..transport.registry.config().clone() };
        // Nothing is registered yet, so the registry can be replaced whole.
        transport.registry = ConnectionRegistry::new(config);
        Ok(transport)
    }

    /// The handle of `peer`'s registered connection, if any: a binding's connection
    /// object keeps it to tell its own connection from a later one to the same peer.
    pub fn conn_id(&self, peer: &str) -> Option<ConnId> {
        self.registry.conn_id(peer)
    }

    /// [`Self::mark_dead`], only while `conn` is still `peer`'s registered connection.
    pub fn mark_dead_conn(&mut self, peer: &str, conn: ConnId) -> bool {
        self.registry.mark_dead_conn(peer, conn)
    }

    /// `"host:port"`: this node's peer id and every DEALER's routing identity.
    pub fn local_id(&self) -> &str {
        &self.registry.config().local_id
    }

    /// The ROUTER's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Opens an outbound connection to `peer` (`host:port`). A registered dead connection
    /// is retired first; a live one is [`TransportError::AlreadyExists`]. Frames sent
    /// right away queue in the DEALER until the link is up.
    pub fn connect(&mut self, peer: &str) -> Result<(), P2pError> {
        self.registry.connect(peer)?;
        self.carry_out()
    }

    /// Sends `msg` to `peer` as one msgpack frame, never blocking.
    pub fn send(&mut self, peer: &str, msg: &Value) -> Result<(), P2pError> {
        self.registry.send(peer, msg)?;
        self.carry_out()
    }

    /// [`Self::send`] of a frame already written with `value::Writer`.
    pub fn send_frame(&mut self, peer: &str, frame: Vec<u8>) -> Result<(), P2pError> {
        self.registry.send_frame(peer, frame)?;
        self.carry_out()
    }

    /// Everything received from `peer` since the last call.
    pub fn recv(&mut self, peer: &str) -> Vec<Value> {
        self.registry.recv(peer)
    }

    /// [`Self::recv`] as frames, each known to decode (`value::read` builds from them).
    pub fn recv_frames(&mut self, peer: &str) -> Vec<Vec<u8>> {
        self.registry.recv_frames(peer)
    }

    /// Liveness only (the session found the peer gone); the sockets stay open until the
    /// next `poll` sweeps the connection, so `recv` can still be drained.
    pub fn mark_dead(&mut self, peer: &str) {
        self.registry.mark_dead(peer);
    }

    /// Releases `peer`'s DEALER and monitor now; idempotent. It is unregistered at the
    /// next `poll`.
    pub fn close_peer(&mut self, peer: &str) {
        self.registry.close(peer);
        // CloseDealer cannot fail.
        let _ = self.carry_out();
    }

    /// Whether `peer` has a registered, live connection.
    pub fn is_alive(&self, peer: &str) -> bool {
        self.registry.is_alive(peer)
    }

    /// Registered peers, in registration order.
    pub fn peers(&self) -> Vec<String> {
        self.registry.peers()
    }

    /// The registry's counters.
    pub fn stats(&self) -> RegistryStats {
        self.registry.stats()
    }

    /// Open DEALERs (each with its monitor PAIR), for leak checks.
    pub fn open_dealers(&self) -> usize {
        self.dealers.len()
    }

    /// One poll: everything the ROUTER holds and every live connection's pending monitor
    /// events (up to its first fatal one) go to the registry, which decides; its actions are carried out.
    /// Returns the newly accepted inbound peers, their first messages already in `recv`.
    /// A peer whose DEALER could not be opened is returned too, already dead.
    pub fn poll(&mut self) -> Vec<String> {
        let Some(router) = &self.router else { return Vec::new() };
        if let Err(error) = self.inbound.drain(router) {
            tracing::warn!(local_id = %self.registry.config().local_id, %error, "P2P ROUTER recv error");
        }
        for (peer, conn, alive) in self.registry.iter_connections() {
            let Some((_, dealer)) = self.dealers.get(&conn).filter(|_| alive) else { continue };
            if let Err(error) = dealer.monitor_events(conn, &mut self.monitor_events) {
                tracing::warn!(%peer, %error, "P2P monitor error");
            }
        }
        let accepted = self.registry.poll_frames(self.inbound.messages(), &self.monitor_events);
        self.inbound.clear();
        self.monitor_events.clear();
        if let Err(error) = self.carry_out() {
            tracing::warn!(%error, "P2P connection not opened");
        }
        accepted
    }

    /// Blocks until the ROUTER or a live connection's monitor is readable, or `timeout`
    /// passes; `Ok(true)` if something is readable. Lets a loop sleep instead of spinning.
    pub fn wait(&self, timeout: Duration) -> Result<bool, P2pError> {
        let Some(router) = &self.router else { return Ok(false) };
        let mut items = vec![router.as_poll_item(zmq::POLLIN)];
        for (_, conn, alive) in self.registry.iter_connections() {
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

    /// Blocks until `peer`'s DEALER has room for a frame, or `timeout` passes; `Ok(true)`
    /// if it has. For a caller that got [`P2pError::QueueFull`] and chooses to wait
    /// rather than spin (sending itself never blocks).
    pub fn wait_writable(&self, peer: &str, timeout: Duration) -> Result<bool, P2pError> {
        let Some((_, d)) = self.registry.conn_id(peer).and_then(|conn| self.dealers.get(&conn)) else {
            return Ok(false);
        };
        let ms = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        match d.dealer.poll(zmq::POLLOUT, ms) {
            Ok(n) => Ok(n > 0),
            Err(zmq::Error::EINTR) => Ok(false),
            Err(e) => Err(P2pError::Wait(e)),
        }
    }

    /// Closes every connection (each DEALER flushing for at most its linger), then the
    /// ROUTER (linger 0), then the context. Idempotent.
    pub fn close(&mut self) {
        self.registry.close_all();
        let _ = self.carry_out();
        for (_, (_, dealer)) in std::mem::take(&mut self.dealers) {
            dealer.close();
        }
        if let Some(router) = self.router.take() {
            sockets::close_after(router, ROUTER_LINGER);
        }
        // Terminating waits at most one DEALER linger for frames still queued.
        self.ctx.take();
    }

    /// Carries out the registry's queued actions. The first open or send failure is
    /// returned; later actions still run.
    fn carry_out(&mut self) -> Result<(), P2pError> {
        let mut first = None;
        while let Some(action) = self.registry.poll_action() {
            if let Err(e) = self.perform(action) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    fn perform(&mut self, action: Action) -> Result<(), P2pError> {
        match action {
            Action::OpenDealer { conn, peer, endpoint, identity, monitor } => {
                let Some(ctx) = &self.ctx else { return Err(TransportError::Closed.into()) };
                match Dealer::open(ctx, &endpoint, &identity, &monitor, &self.options) {
                    Ok(dealer) => {
                        tracing::debug!(%peer, %endpoint, %monitor, "P2P DEALER opened");
                        self.dealers.insert(conn, (peer, dealer));
                        Ok(())
                    }
                    Err(source) => {
                        // Nothing is open: retire the registration (T2's rollback), so the
                        // next poll sweeps it and a later connect starts afresh.
                        tracing::warn!(%peer, %endpoint, error = %source, "cannot open P2P DEALER");
                        self.registry.close(&peer);
                        Err(P2pError::Open { peer, endpoint, source })
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
            Action::Transmit { conn, frame } => {
                let Some((peer, dealer)) = self.dealers.get(&conn) else {
                    return Err(TransportError::Closed.into());
                };
                let flags = match self.registry.send_mode() {
                    SendMode::NonBlocking => zmq::DONTWAIT,
                    SendMode::BlockAtHwm => 0,
                };
                // A small frame is copied into a libzmq message (one allocation, freed by
                // whichever thread closes it); a large one is handed over without a copy.
                let sent = if frame.len() <= COPY_FRAMES_UP_TO {
                    dealer.dealer.send(&frame[..], flags)
                } else {
                    dealer.dealer.send(frame, flags)
                };
                match sent {
                    Ok(()) => Ok(()),
                    Err(zmq::Error::EAGAIN) => match self.registry.queue_full(conn) {
                        TransportError::QueueFull { peer } => Err(P2pError::QueueFull { peer }),
                        other => Err(other.into()),
                    },
                    Err(source) => Err(P2pError::Send { peer: peer.clone(), source }),
                }
            }
        }
    }
}

/// Frames up to this size are copied into libzmq's message rather than handed over: a
/// handed-over buffer costs libzmq a second allocation (its reference count) and a free on
/// the I/O thread, more than copying a control message.
const COPY_FRAMES_UP_TO: usize = 8 * 1024;

impl Drop for ZmqTransport {
    fn drop(&mut self) {
        self.close();
    }
}
