//! Carries a core [`HandshakeSession`]'s frames over a bare [`ZmqTransport`] connection,
//! for callers that run their own sessions without the tiering manager.
//!
//! The session decides; this only feeds it what arrived, whether the connection is still
//! alive, the clock and send failures, and sends what it hands back, in the order of the
//! core's `PeerManager` tick (the production manager, [`super::ManagerLoop`], runs that
//! tick itself). Its events stay in the session for the owner (`poll_event`).

use super::ZmqTransport;
use ctlplane_core::p2p::session::HandshakeSession;
use ctlplane_core::Instant;

/// One tick for `session` (call after [`ZmqTransport::poll`]), in the manager's order: a
/// lost connection first (the poll swept or replaced it), then the peer's messages, then
/// the deadline (after dispatch, so a buffered Ack wins), then what the session queued;
/// a dead session's connection is marked dead so the next poll retires it.
pub fn drive(transport: &mut ZmqTransport, session: &mut HandshakeSession, now: Instant) {
    let peer = session.peer_id().to_string();
    if session.is_alive() && !transport.is_alive(&peer) {
        session.connection_lost();
    }
    for msg in transport.recv(&peer) {
        session.handle_message(&msg);
    }
    session.handle_timeout(now);
    flush(transport, session);
    if !session.is_alive() {
        transport.mark_dead(&peer);
    }
}

/// Sends everything `session` queued; a failed send kills the session (the reference's
/// `_do_send` marks the connection dead). A session is flushed even when it died, so its
/// best-effort Disconnect goes out.
pub fn flush(transport: &mut ZmqTransport, session: &mut HandshakeSession) {
    let peer = session.peer_id().to_string();
    while let Some(frame) = session.poll_transmit() {
        if let Err(error) = transport.send(&peer, &frame) {
            tracing::warn!(%peer, %error, "P2P send failed");
            session.send_failed(&error.to_string());
            transport.mark_dead(&peer);
        }
    }
}
