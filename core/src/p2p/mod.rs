//! The P2P KV-tiering control transport (mainline lineage T1 + W1).
//!
//! [`value`] is the msgpack model Python's msgspec peers read back with the same types,
//! [`messages`] the W1 session messages, [`registry`] the transport's connection map and
//! poll ordering, [`options`] the socket options and the monitor events that end a
//! connection, [`peer_check`] which inbound peers it dials back, [`session`] the W1
//! handshake over one connection, [`manager`] the tiering manager over both
//! (`PeerManager`: tick order, admission, reaping, reconnects).

pub mod defaults;
pub mod frames;
pub mod manager;
pub mod messages;
pub mod options;
pub mod peer_check;
pub mod registry;
pub mod session;
pub mod value;

pub use manager::{ManagerConfig, PeerEvent, PeerManager};
pub use peer_check::{AllowEntry, PeerCheck, PeerCheckMode};
pub use registry::{
    Action, ConnId, ConnectionRegistry, MonitorEvent, PollInput, RegistryConfig, T0Switches, TransportError,
};
pub use value::Value;
