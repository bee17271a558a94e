//! The P2P KV-tiering control transport on libzmq (mainline T1; T2's frame limit as an
//! option).
//!
//! [`ManagerLoop`] is the production tiering manager: the core's `PeerManager` (sessions,
//! admission, reaping, reconnects, tick order) over real sockets. [`ZmqTransport`] is the
//! bare transport (what the Python bindings wrap): it carries out what the core's
//! `ConnectionRegistry` decides; [`session_io`] moves one `HandshakeSession`'s frames over
//! it for callers that run their own sessions. Both share the socket work
//! (`socket_set`).

mod manager_loop;
mod router_batch;
pub mod session_io;
mod socket_set;
mod sockets;
mod transport;

pub use manager_loop::ManagerLoop;
pub use transport::{P2pError, ZmqTransport};

use crate::curve::CurveClient;
use ctlplane_core::p2p::defaults::{HEARTBEAT_IVL, HEARTBEAT_TIMEOUT, HEARTBEAT_TTL};
use ctlplane_core::p2p::registry::MAX_CONTROL_MESSAGE_BYTES;
use ctlplane_core::p2p::{PeerCheck, RegistryConfig, T0Switches};
use std::time::Duration;

/// Socket options and registry bounds; the defaults are the mainline reference's.
#[derive(Clone, Debug)]
pub struct TransportOptions {
    /// `ZMQ_HEARTBEAT_IVL`: a PING every 2 s on every link.
    pub heartbeat_ivl: Duration,
    /// `ZMQ_HEARTBEAT_TIMEOUT`: a link silent this long after a PING is dropped, which is
    /// how a peer that died without closing TCP is noticed.
    pub heartbeat_timeout: Duration,
    /// `ZMQ_HEARTBEAT_TTL`: how long the remote may wait for us before dropping the link.
    pub heartbeat_ttl: Duration,
    /// T2's frame limit (`ZMQ_MAXMSGSIZE` on every socket and the registry's payload
    /// bound); `None` = unbounded, as T1.
    pub max_message_bytes: Option<usize>,
    /// Most registered peers; `None` = unbounded, as the reference.
    pub max_peers: Option<usize>,
    /// Which inbound identities are dialled back: strict by default (an identity must
    /// name the host its connection comes from), unlike the reference, which trusts every
    /// identity (`docs/peer-admission.md`).
    pub peer_check: PeerCheck,
    /// Historical behaviours, for regression runs on real sockets.
    pub t0: T0Switches,
    /// CURVE: the ROUTER is a server with `keys`, every DEALER a client of peers whose
    /// ROUTER public key is `server_key` (one key for the whole cluster). `None` = NULL
    /// security, as the reference.
    pub curve: Option<CurveClient>,
}

impl Default for TransportOptions {
    fn default() -> Self {
        TransportOptions {
            heartbeat_ivl: HEARTBEAT_IVL,
            heartbeat_timeout: HEARTBEAT_TIMEOUT,
            heartbeat_ttl: HEARTBEAT_TTL,
            max_message_bytes: None,
            max_peers: None,
            peer_check: PeerCheck::default(),
            t0: T0Switches::default(),
            curve: None,
        }
    }
}

impl TransportOptions {
    /// The T2 lineage's 64 MiB frame limit on top of the defaults.
    pub fn with_t2_frame_limit(mut self) -> Self {
        self.max_message_bytes = Some(MAX_CONTROL_MESSAGE_BYTES);
        self
    }
}

/// The registry's configuration for `options`, announcing `local_id`.
pub(crate) fn registry_config(options: &TransportOptions, local_id: &str) -> RegistryConfig {
    let mut config = RegistryConfig::new(local_id);
    config.max_peers = options.max_peers;
    config.max_message_bytes = options.max_message_bytes;
    config.peer_check = options.peer_check.clone();
    config.t0 = options.t0;
    config
}
