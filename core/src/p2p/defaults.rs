//! The P2P transport's protocol timings, each stated once: the libzmq transport, the
//! simulator's peers and the Python bindings read them from here. Their values are the
//! reference's (`docs/p2p-behaviour.md` §1.4, §4).

use std::time::Duration;

/// `ZMQ_HEARTBEAT_IVL` of the ROUTER and every DEALER: a PING this often on every link
/// (p2p-behaviour.md §1.4, §4).
pub const HEARTBEAT_IVL: Duration = Duration::from_secs(2);

/// `ZMQ_HEARTBEAT_TIMEOUT`: a link silent this long after a PING is dropped, which is how
/// a peer that died without closing TCP is noticed (p2p-behaviour.md §1.4, §4).
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);

/// `ZMQ_HEARTBEAT_TTL`, carried in our PINGs: how long the remote may go without hearing
/// from us before it drops the link (p2p-behaviour.md §1.4, §4).
pub const HEARTBEAT_TTL: Duration = Duration::from_secs(10);

/// `VLLM_P2P_HANDSHAKE_TIMEOUT_S` of the W1+ lineage (off unless configured): a session
/// whose handshake has not completed this long after it connected ends
/// (p2p-behaviour.md §2.3, §4).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
