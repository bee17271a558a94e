//! What the P2P transport's sockets are set up with and which monitor events end a
//! connection (vLLM 0.33 release behaviour, `docs/p2p-behaviour.md`).
//!
//! The drivers (libzmq, the simulator's model) apply these values; they decide nothing.
//! A full send queue never blocks the caller: the tiering manager's lock is held while
//! sending, so one peer that stops reading would otherwise stall every other session.

use std::time::Duration;

/// `ZMQ_SNDHWM` of every DEALER: messages queued for one peer before a send is refused.
/// Control messages are small, so reaching it means the peer stopped reading.
pub const DEALER_SNDHWM: i32 = 1000;

/// `ZMQ_LINGER` of every DEALER: a closed DEALER keeps flushing what it queued (a
/// best-effort Disconnect) this long, then drops it, so closing never waits on a peer
/// that cannot be reached.
pub const DEALER_LINGER: Duration = Duration::from_millis(500);

/// `ZMQ_LINGER` of the ROUTER at close: nothing it queued is worth waiting for.
pub const ROUTER_LINGER: Duration = Duration::ZERO;

/// libzmq's `ZMQ_EVENT_CLOSED`.
pub const EVENT_CLOSED: u16 = 0x0080;
/// libzmq's `ZMQ_EVENT_DISCONNECTED`.
pub const EVENT_DISCONNECTED: u16 = 0x0200;
/// libzmq's `ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL`.
pub const EVENT_HANDSHAKE_FAILED_NO_DETAIL: u16 = 0x0800;
/// libzmq's `ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL`.
pub const EVENT_HANDSHAKE_FAILED_PROTOCOL: u16 = 0x2000;
/// libzmq's `ZMQ_EVENT_HANDSHAKE_FAILED_AUTH`.
pub const EVENT_HANDSHAKE_FAILED_AUTH: u16 = 0x4000;

/// The events a DEALER's monitor subscribes to: each one means the peer will not be
/// reached through this socket, so each one kills the connection.
pub const MONITOR_EVENT_MASK: u16 = EVENT_DISCONNECTED
    | EVENT_CLOSED
    | EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | EVENT_HANDSHAKE_FAILED_PROTOCOL
    | EVENT_HANDSHAKE_FAILED_AUTH;

/// How a driver hands a frame to a DEALER.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendMode {
    /// `ZMQ_DONTWAIT`: a full queue is refused at once ([`super::TransportError::QueueFull`]).
    NonBlocking,
    /// Wait for room in the queue (the seed's send; a regression switch only).
    BlockAtHwm,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mask_is_the_five_fatal_events() {
        assert_eq!(MONITOR_EVENT_MASK, 0x0080 | 0x0200 | 0x0800 | 0x2000 | 0x4000);
        assert_eq!(MONITOR_EVENT_MASK.count_ones(), 5);
    }
}
