//! Admission: what the tiering manager does with a peer the transport just accepted (p2p-behaviour.md §3.3, race
//! S6).
//!
//! The manager keeps one [`super::session::HandshakeSession`] per peer id. A session can die
//! between two ticks (a send failure inside a scheduler-thread call), so when the peer's
//! replacement connection is accepted, the old session may still be in the map. Reaping dead
//! sessions before admitting new connections lets the replacement in; the mainline manager
//! admitted first and refused it as a duplicate, losing the ConnectMsg in its buffer.

/// Historical behaviours of the manager, restoring one race of the catalogue
/// (`docs/races.md`). All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ManagerRegressions {
    /// P2P S6: accepted peers are admitted before dead sessions are reaped, so a
    /// replacement for a dead, not yet reaped session is refused as a duplicate.
    pub s6_accept_before_reap: bool,
    /// P2P S1/S4 (the mainline manager): no error boundary around the transport. A DEALER
    /// that cannot be opened, or a connect to a peer still registered alive, escapes and
    /// ends the engine ([`super::PeerEvent::Fatal`]). Off (ctlplane): the session dies and
    /// the peer is dialled again.
    pub errors_escape: bool,
}

/// The session the manager holds for a peer when its new connection is accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Existing {
    /// No session for this peer.
    None,
    /// A live session (its connection was registered and alive until this poll).
    Alive,
    /// A session that died and is not reaped yet.
    Dead,
}

/// What to do with an accepted peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Open a session on the accepted connection; its first messages are in its buffer.
    Open,
    /// Reap the dead session first (its connection is retired by the next sweep), then open
    /// a session on the accepted connection.
    ReplaceDead,
    /// A session still holds the peer: close the accepted connection ("duplicate
    /// connection"); the messages in its buffer are lost with it.
    RefuseDuplicate,
}

/// Decides the admission of one accepted peer given the session the manager holds for it.
pub fn admit(existing: Existing, regressions: &ManagerRegressions) -> Admission {
    match existing {
        Existing::None => Admission::Open,
        Existing::Alive => Admission::RefuseDuplicate,
        Existing::Dead if regressions.s6_accept_before_reap => Admission::RefuseDuplicate,
        Existing::Dead => Admission::ReplaceDead,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_session_is_replaced_unless_accept_runs_before_reap() {
        let fixed = ManagerRegressions::default();
        let old = ManagerRegressions { s6_accept_before_reap: true, ..Default::default() };
        assert_eq!(admit(Existing::None, &fixed), Admission::Open);
        assert_eq!(admit(Existing::Alive, &fixed), Admission::RefuseDuplicate);
        assert_eq!(admit(Existing::Dead, &fixed), Admission::ReplaceDead);
        assert_eq!(admit(Existing::Dead, &old), Admission::RefuseDuplicate);
        assert_eq!(admit(Existing::None, &old), Admission::Open);
    }
}
