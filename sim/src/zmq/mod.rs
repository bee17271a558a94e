//! ZeroMQ socket semantics over turmoil TCP.
//!
//! The simulator's hosts use these sockets where production uses libzmq: REQ, REP, PUSH,
//! PULL, ROUTER, DEALER, and inproc PAIR (for monitors). What the application sees is
//! libzmq's: the frames of each message, EAGAIN / EFSM / EHOSTUNREACH at the same points,
//! per-pipe high-water marks, queueing on a connecting pipe, reconnects, ZMTP 3.1
//! heartbeats and monitor events. The wire is not ZMTP but a small framing of its own
//! (see [`wire`]); each socket runs its listener and connections as local tasks of the
//! host, so a crashed host drops its streams as a real process would.
//!
//! `tests/zmq_differential.rs` runs scripted scenarios on both this model and libzmq and
//! requires the same observations. Where the model knowingly differs from libzmq:
//!
//! - Reconnects happen every `reconnect_ivl` exactly (libzmq adds up to one interval of
//!   random jitter); the handshake interval is fixed at 30 s.
//! - A ROUTER drops the messages of a refused duplicate identity's connection for its
//!   whole life; libzmq leaves them unread in the pipe (it consumed the identity and never
//!   reads that pipe again), which differs only once that pipe's HWM is reached.
//! - A second `connect` to the same TCP endpoint is EINVAL (libzmq opens another pipe).
//! - High-water marks count the messages queued in a pipe; turmoil's per-stream segment
//!   credit stands in for the kernel's socket buffers behind them.
//! - A socket closed with an infinite LINGER drops what a connecting pipe queued before
//!   any connection carried it (libzmq keeps trying to deliver it forever); with a finite
//!   LINGER it keeps trying for that long, as libzmq does. A lingering connection that
//!   flushes its last messages ends at once, so the receiver loses them with its pipe
//!   (next point) unless it read them first.
//! - An inproc `connect` before the `bind` is ECONNREFUSED; inproc pipes emit no monitor
//!   events.
//! - While a connection's inbox is at RCVHWM it reads nothing, so the bytes behind stay
//!   "in flight" for the engine's clock until it sees them stalled (no read for 20 ms).
//! - When a connection ends, messages it delivered that the application has not read yet
//!   are dropped with its pipe; libzmq lets the reader take them before the pipe's
//!   delimiter. A peer's last message before it disconnects (a P2P Disconnect) can
//!   therefore be missed, which costs that pair a handshake deadline in the simulation.

mod connection;
mod context;
mod endpoint;
mod heartbeat;
pub mod lockstep;
pub mod monitor;
mod routing;
mod socket;
mod state;
pub mod wire;

use std::time::Duration;

pub use context::Context;
pub use socket::Socket;

/// One message: its frames, in order.
pub type Multipart = Vec<Vec<u8>>;

/// libzmq's errors, as the operations of the model return them. `Display` is libzmq's
/// `strerror` text, which is what the production drivers log.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ZmqError {
    /// EAGAIN: the operation would block (full pipe, no peer, nothing to receive).
    #[error("Resource temporarily unavailable")]
    Again,
    /// EFSM: REQ/REP used out of lockstep.
    #[error("Operation cannot be accomplished in current state")]
    Fsm,
    /// EADDRINUSE.
    #[error("Address already in use")]
    AddrInUse,
    /// EHOSTUNREACH: ROUTER_MANDATORY and no peer with that identity.
    #[error("Host unreachable")]
    HostUnreachable,
    /// ECONNREFUSED: inproc connect to an endpoint nobody binds.
    #[error("Connection refused")]
    ConnRefused,
    /// ENOTSOCK / ETERM: the socket was closed.
    #[error("Socket operation on non-socket")]
    Closed,
    /// EMSGSIZE: a frame above MAXMSGSIZE (the receiver drops the connection).
    #[error("Message too long")]
    TooBig,
    /// EINVAL (or ENOTSUP / ENOENT, which the model folds into it): bad endpoint, option
    /// or operation for this socket type.
    #[error("Invalid argument: {0}")]
    Invalid(String),
}

/// The socket types the model implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SocketType {
    Req,
    Rep,
    Push,
    Pull,
    Router,
    Dealer,
    Pair,
}

impl SocketType {
    /// libzmq's numeric socket type (`ZMQ_REQ` = 3, ...), also the model's greeting byte.
    pub fn code(self) -> u8 {
        match self {
            SocketType::Pair => 0,
            SocketType::Req => 3,
            SocketType::Rep => 4,
            SocketType::Dealer => 5,
            SocketType::Router => 6,
            SocketType::Pull => 7,
            SocketType::Push => 8,
        }
    }

    /// The type whose `code` is `c`.
    pub fn from_code(c: u8) -> Option<SocketType> {
        Some(match c {
            0 => SocketType::Pair,
            3 => SocketType::Req,
            4 => SocketType::Rep,
            5 => SocketType::Dealer,
            6 => SocketType::Router,
            7 => SocketType::Pull,
            8 => SocketType::Push,
            _ => return None,
        })
    }

    /// Whether ZMTP lets a socket of this type talk to one of type `peer` (RFC 23/28).
    pub fn compatible(self, peer: SocketType) -> bool {
        use SocketType::*;
        match self {
            Req => matches!(peer, Rep | Router),
            Rep => matches!(peer, Req | Dealer),
            Dealer => matches!(peer, Rep | Dealer | Router),
            Router => matches!(peer, Req | Dealer | Router),
            Push => peer == Pull,
            Pull => peer == Push,
            Pair => peer == Pair,
        }
    }

    /// libzmq's name of the type, for traces.
    pub fn name(self) -> &'static str {
        match self {
            SocketType::Req => "REQ",
            SocketType::Rep => "REP",
            SocketType::Push => "PUSH",
            SocketType::Pull => "PULL",
            SocketType::Router => "ROUTER",
            SocketType::Dealer => "DEALER",
            SocketType::Pair => "PAIR",
        }
    }
}

/// The socket options the model honours. `Default` is libzmq's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketOptions {
    /// Messages a pipe queues outbound before a send is EAGAIN (0 = unlimited).
    pub sndhwm: usize,
    /// Messages a pipe holds inbound before the connection stops reading (0 = unlimited).
    pub rcvhwm: usize,
    /// Pause between connection attempts of a connecting pipe.
    pub reconnect_ivl: Duration,
    /// `ZMQ_HEARTBEAT_IVL`: send a PING this often (None: no heartbeats).
    pub heartbeat_ivl: Option<Duration>,
    /// `ZMQ_HEARTBEAT_TIMEOUT`: drop the connection when nothing arrives this long after a
    /// PING (None: the interval).
    pub heartbeat_timeout: Option<Duration>,
    /// `ZMQ_HEARTBEAT_TTL`: carried in our PINGs; the peer drops us after this long without
    /// traffic (None: 0, the peer does not time out on it).
    pub heartbeat_ttl: Option<Duration>,
    /// `ZMQ_ROUTING_ID`: sent in the greeting, a ROUTER peer routes to us by it.
    pub routing_id: Option<Vec<u8>>,
    /// `ZMQ_ROUTER_MANDATORY`: an unroutable send is EHOSTUNREACH (or EAGAIN when full)
    /// instead of a silent drop.
    pub router_mandatory: bool,
    /// `ZMQ_ROUTER_HANDOVER`: a newcomer with a live identity takes it over.
    pub router_handover: bool,
    /// `ZMQ_IMMEDIATE`: queue only on completed connections.
    pub immediate: bool,
    /// `ZMQ_MAXMSGSIZE`: an inbound frame above this drops the connection.
    pub maxmsgsize: Option<usize>,
    /// `ZMQ_LINGER`: how long a closed socket keeps flushing queued messages. libzmq's
    /// default (-1) is infinite; here, anything of a day or more counts as infinite.
    pub linger: Duration,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            sndhwm: 1000,
            rcvhwm: 1000,
            reconnect_ivl: Duration::from_millis(100),
            heartbeat_ivl: None,
            heartbeat_timeout: None,
            heartbeat_ttl: None,
            routing_id: None,
            router_mandatory: false,
            router_handover: false,
            immediate: false,
            maxmsgsize: None,
            linger: Duration::MAX,
        }
    }
}

/// A linger of this length or more never expires.
pub(crate) const INFINITE_LINGER: Duration = Duration::from_secs(86_400);

/// `ZMQ_HANDSHAKE_IVL` default: a connection whose greeting does not complete in this
/// time is dropped.
pub(crate) const HANDSHAKE_IVL: Duration = Duration::from_secs(30);
