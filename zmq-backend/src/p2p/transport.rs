//! `ZmqTransport`: the P2P control transport on libzmq sockets.
//!
//! The core's [`ConnectionRegistry`] decides who is registered, alive, swept and new; this
//! type only lends it what the sockets hold (`ConnectionRegistry::poll_frames`) and carries
//! out the [`Action`]s the registry returns. No background threads: all I/O happens in the
//! calls.

use super::socket_set::{ActionError, SocketSet};
use super::TransportOptions;
use ctlplane_core::p2p::frames::Frames;
use ctlplane_core::p2p::registry::RegistryStats;
use ctlplane_core::p2p::{Action, ConnId, ConnectionRegistry, RegistryConfig, TransportError, Value};
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
    sockets: SocketSet,
    port: u16,
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
        let config = super::registry_config(&options, "");
        let (sockets, port) = SocketSet::bind(host, port, options)?;
        let config = RegistryConfig { local_id: format!("{host}:{port}"), ..config };
        tracing::info!(local_id = %config.local_id, "P2P ROUTER bound on tcp://{host}:{port}");
        Ok(ZmqTransport { registry: ConnectionRegistry::new(config), sockets, port })
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

    /// [`Self::send_frame`] only while `conn` is `peer`'s registered connection, written to
    /// the DEALER at once (the registry's `may_transmit_on` decides). `frame` keeps its
    /// buffer for reuse unless it was large enough to be handed over.
    pub fn send_frame_on(&mut self, peer: &str, conn: ConnId, frame: &mut Vec<u8>) -> Result<(), P2pError> {
        self.registry.may_transmit_on(peer, conn, frame.len())?;
        let sent = self.sockets.transmit(conn, frame, self.registry.send_mode());
        self.settle(sent, None)
    }

    /// Everything received from `peer` since the last call.
    pub fn recv(&mut self, peer: &str) -> Vec<Value> {
        self.registry.recv(peer)
    }

    /// [`Self::recv`] as frames, each known to decode (`value::read` builds from them).
    pub fn recv_frames(&mut self, peer: &str) -> Frames {
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
        self.sockets.open_dealers()
    }

    /// One poll: everything the ROUTER holds and every live connection's pending monitor
    /// events (up to its first fatal one) go to the registry, which decides; its actions are carried out.
    /// Returns the newly accepted inbound peers, their first messages already in `recv`.
    /// A peer whose DEALER could not be opened is returned too, already dead.
    pub fn poll(&mut self) -> Vec<String> {
        if !self.sockets.is_open() {
            return Vec::new();
        }
        self.sockets.gather(&self.registry.config().local_id, self.registry.iter_connections());
        let accepted = self.registry.poll_frames(self.sockets.router_batch(), self.sockets.monitor_batch());
        self.sockets.clear_batch();
        if let Err(error) = self.carry_out() {
            tracing::warn!(%error, "P2P connection not opened");
        }
        accepted
    }

    /// Blocks until the ROUTER or a live connection's monitor is readable, or `timeout`
    /// passes; `Ok(true)` if something is readable. Lets a loop sleep instead of spinning.
    pub fn wait(&self, timeout: Duration) -> Result<bool, P2pError> {
        self.sockets.wait(self.registry.iter_connections().map(|(_, c, a)| (c, a)), timeout)
    }

    /// Blocks until `peer`'s DEALER has room for a frame, or `timeout` passes; `Ok(true)`
    /// if it has. For a caller that got [`P2pError::QueueFull`] and chooses to wait
    /// rather than spin (sending itself never blocks).
    pub fn wait_writable(&self, peer: &str, timeout: Duration) -> Result<bool, P2pError> {
        self.sockets.wait_writable(self.registry.conn_id(peer), timeout)
    }

    /// Closes every connection (each DEALER flushing for at most its linger), then the
    /// ROUTER (linger 0), then the context. Idempotent.
    pub fn close(&mut self) {
        self.registry.close_all();
        let _ = self.carry_out();
        self.sockets.close();
    }

    /// Carries out the registry's queued actions. The first open or send failure is
    /// returned; later actions still run.
    fn carry_out(&mut self) -> Result<(), P2pError> {
        let mut first = None;
        while let Some(action) = self.registry.poll_action() {
            let peer = match &action {
                Action::OpenDealer { peer, .. } => Some(peer.clone()),
                _ => None,
            };
            let performed = self.sockets.perform(action, self.registry.send_mode());
            if let Err(e) = self.settle(performed, peer) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// What the caller gets for one carried-out action, the registry told of a failure.
    fn settle(&mut self, performed: Result<(), ActionError>, opened: Option<String>) -> Result<(), P2pError> {
        match performed {
            Ok(()) => Ok(()),
            Err(ActionError::Open(e)) => {
                // Nothing is open: retire the registration (T2's rollback), so the
                // next poll sweeps it and a later connect starts afresh.
                if let Some(peer) = opened {
                    self.registry.close(&peer);
                }
                Err(e)
            }
            Err(ActionError::Full(conn)) => match self.registry.queue_full(conn) {
                TransportError::QueueFull { peer } => Err(P2pError::QueueFull { peer }),
                other => Err(other.into()),
            },
            Err(ActionError::Send(e)) => Err(e),
        }
    }
}

impl Drop for ZmqTransport {
    fn drop(&mut self) {
        self.close();
    }
}
