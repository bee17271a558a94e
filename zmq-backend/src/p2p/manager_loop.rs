//! `ManagerLoop`: the production tiering manager, the core's [`PeerManager`] over libzmq
//! sockets.
//!
//! Every decision is the manager's (tick order, admission, reaping, reconnect backoff,
//! what a failed open or send does): this loop only waits for socket activity or the
//! manager's next deadline, lends it what one poll of the sockets holds, ticks it, and
//! carries out the socket actions it returns, reporting the ones that failed. The
//! simulator's peers drive the same machine the same way (`docs/architecture.md`).

use super::socket_set::{ActionError, SocketSet};
use super::{P2pError, TransportOptions};
use crate::Clock;
use ctlplane_core::p2p::manager::{ManagerConfig, ManagerError, ManagerRegressions, PeerEvent, PeerManager, SessionId};
use ctlplane_core::p2p::messages::Message;
use ctlplane_core::p2p::session::SessionConfig;
use ctlplane_core::p2p::Action;
use rand_core::{OsRng, RngCore};
use std::time::Duration;

/// One node's tiering manager over its P2P sockets. No background threads: all I/O
/// happens in the calls.
pub struct ManagerLoop<R: RngCore = OsRng> {
    manager: PeerManager<R>,
    sockets: SocketSet,
    clock: Clock,
    port: u16,
}

impl ManagerLoop<OsRng> {
    /// Binds the ROUTER at `tcp://host:port` (port 0 picks a free one; the local id is
    /// `host:port` with the real port) and starts a manager whose sessions announce
    /// `session` (its `local_id` is replaced). Backoffs draw from the OS.
    pub fn bind(host: &str, port: u16, options: TransportOptions, session: SessionConfig) -> Result<Self, P2pError> {
        Self::bind_with(host, port, options, session, ManagerRegressions::default(), OsRng)
    }
}

impl<R: RngCore> ManagerLoop<R> {
    /// [`ManagerLoop::bind`] with the manager's regression switches and its RNG.
    pub fn bind_with(
        host: &str,
        port: u16,
        options: TransportOptions,
        session: SessionConfig,
        regressions: ManagerRegressions,
        rng: R,
    ) -> Result<Self, P2pError> {
        let registry = super::registry_config(&options, "");
        let (sockets, port) = SocketSet::bind(host, port, options)?;
        let registry = ctlplane_core::p2p::RegistryConfig { local_id: format!("{host}:{port}"), ..registry };
        tracing::info!(local_id = %registry.local_id, "P2P manager bound on tcp://{host}:{port}");
        let config = ManagerConfig { regressions, ..ManagerConfig::new(registry, session) };
        Ok(ManagerLoop { manager: PeerManager::new(config, rng), sockets, clock: Clock::new(), port })
    }

    /// `"host:port"`: this node's peer id.
    pub fn local_id(&self) -> &str {
        self.manager.local_id()
    }

    /// The ROUTER's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The manager, for its state (sessions, registry).
    pub fn manager(&self) -> &PeerManager<R> {
        &self.manager
    }

    /// Keeps `peer` (`host:port`) connected: dialled at the next turn, redialled after a
    /// backoff whenever its session ends.
    pub fn keep_connected(&mut self, peer: &str) {
        self.manager.keep_connected(peer, self.clock.now());
    }

    /// Stops keeping `peer` connected and closes its session (a best-effort Disconnect).
    pub fn close_peer(&mut self, peer: &str) {
        self.manager.close(peer);
        self.carry_out();
    }

    /// Sends a role message to `peer`'s session (queued until its handshake completes).
    pub fn send(&mut self, peer: &str, msg: Message) -> Result<(), ManagerError> {
        let result = self.manager.send(peer, msg);
        self.carry_out();
        result
    }

    /// Answers on `session` only: a reply must not reach the session's replacement.
    pub fn send_on(&mut self, peer: &str, session: SessionId, msg: Message) -> Result<(), ManagerError> {
        let result = self.manager.send_on(peer, session, msg);
        self.carry_out();
        result
    }

    /// The application handled `session`'s last message.
    pub fn dispatch_ok(&mut self, peer: &str, session: SessionId) {
        self.manager.dispatch_ok(peer, session);
    }

    /// The next thing the application sees (peer up, down, messages).
    pub fn poll_event(&mut self) -> Option<PeerEvent> {
        self.manager.poll_event()
    }

    /// One turn: waits at most `max_wait` (less if the manager has a deadline sooner) for
    /// socket activity, hands the manager what the sockets hold, ticks it, and carries out
    /// its actions. Events are then in [`Self::poll_event`].
    pub fn turn(&mut self, max_wait: Duration) -> Result<(), P2pError> {
        let now = self.clock.now();
        let wait = self.manager.poll_timeout().map_or(max_wait, |at| at.saturating_duration_since(now).min(max_wait));
        let connections = self.manager.registry().iter_connections().map(|(_, c, a)| (c, a));
        self.sockets.wait(connections, wait)?;
        self.sockets.gather(self.manager.local_id(), self.manager.registry().iter_connections());
        self.manager.handle_frames(self.sockets.router_batch(), self.sockets.monitor_batch());
        self.sockets.clear_batch();
        self.carry_out();
        self.manager.handle_tick(self.clock.now());
        self.carry_out();
        Ok(())
    }

    /// Closes every session (best-effort Disconnects), then the sockets. Idempotent.
    pub fn close(&mut self) {
        self.manager.close_all();
        self.carry_out();
        self.sockets.close();
    }

    /// Carries out the manager's actions, reporting to it a DEALER that could not be
    /// opened or a frame that could not be sent.
    fn carry_out(&mut self) {
        while let Some(action) = self.manager.poll_action() {
            let conn = match &action {
                Action::OpenDealer { conn, .. } | Action::CloseDealer { conn, .. } | Action::Transmit { conn, .. } => {
                    *conn
                }
            };
            match self.sockets.perform(action, self.manager.send_mode()) {
                Ok(()) => {}
                Err(ActionError::Open(e)) => self.manager.handle_open_failed(conn, &error_chain(&e)),
                Err(ActionError::Full(conn)) => {
                    let e = self.manager.queue_full(conn);
                    self.manager.handle_send_failed(conn, &e.to_string());
                }
                Err(ActionError::Send(e)) => self.manager.handle_send_failed(conn, &error_chain(&e)),
            }
        }
    }
}

impl<R: RngCore> Drop for ManagerLoop<R> {
    fn drop(&mut self) {
        self.close();
    }
}

/// An error with its sources, for the manager's event.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
