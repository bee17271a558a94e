//! The P2P tiering manager (p2p-behaviour.md §3.3): one sans-IO machine,
//! [`PeerManager`], that owns the transport's [`super::ConnectionRegistry`], one
//! [`super::session::HandshakeSession`] per peer, and every decision the manager makes
//! around them: the tick order, the admission of an accepted peer ([`admission`]),
//! reaping dead sessions, the reconnect backoff ([`backoff`]), and what a failed open
//! or a failed send does. The libzmq driver and the simulator's peers both drive it.

pub mod admission;
pub mod backoff;
mod peer_manager;

pub use admission::{admit, Admission, Existing, ManagerRegressions};
pub use backoff::Backoff;
pub use peer_manager::{ManagerConfig, ManagerError, PeerEvent, PeerManager, SessionId};
