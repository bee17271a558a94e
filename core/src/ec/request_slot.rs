//! The REQ lockstep rule of a control client (ec-behaviour.md §5, race S9).
//!
//! A REQ socket that sent and did not receive cannot send again. So after a timeout or
//! any error the socket is discarded and the next request opens a fresh one; a late reply
//! addressed to the discarded socket belongs to an older generation and is ignored.

use crate::time::Instant;
use std::time::Duration;
use thiserror::Error;

/// What the driver must do to start a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Begin {
    /// The socket generation this exchange belongs to.
    pub generation: u64,
    /// No usable socket: open a fresh one (IPV6, RCVTIMEO, SNDTIMEO, LINGER 0) first.
    pub open: bool,
    /// Give up on the reply at this instant.
    pub deadline: Instant,
}

/// The driver must close the socket of this generation with linger 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Discard {
    pub generation: u64,
}

/// A request was started while the previous one still waits for its reply.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("REQ socket is still waiting for the reply to its previous request")]
pub struct Busy;

/// What to make of a reply frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplyFate {
    /// The reply to the outstanding request.
    Accept,
    /// A reply for a discarded socket or a request nobody waits for: drop it.
    Ignore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    NoSocket,
    Idle,
    Waiting { deadline: Instant },
}

/// Historical behaviours of a control client's REQ slot, restoring one race of the
/// catalogue (`docs/races.md`). All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SlotRegressions {
    /// EC S9: a timed-out request keeps its socket. The next request is sent on it: a
    /// strict REQ refuses the send (EFSM), a lenient one delivers the late reply of the
    /// timed-out request as the answer to the new one.
    pub s9_reuse_after_timeout: bool,
}

/// Lockstep state of the REQ socket a client keeps for one (thread, address).
#[derive(Clone, Debug)]
pub struct RequestSlot {
    timeout: Duration,
    generation: u64,
    state: SlotState,
    regressions: SlotRegressions,
}

impl RequestSlot {
    /// A slot whose requests time out after `timeout` (`control_timeout_s`).
    pub fn new(timeout: Duration) -> Self {
        Self::with_regressions(timeout, SlotRegressions::default())
    }

    /// [`Self::new`] with regression switches.
    pub fn with_regressions(timeout: Duration, regressions: SlotRegressions) -> Self {
        RequestSlot { timeout, generation: 0, state: SlotState::NoSocket, regressions }
    }

    /// Starts a request at `now`.
    pub fn begin(&mut self, now: Instant) -> Result<Begin, Busy> {
        let open = match self.state {
            SlotState::Waiting { .. } => return Err(Busy),
            SlotState::NoSocket => {
                self.generation += 1;
                true
            }
            SlotState::Idle => false,
        };
        let deadline = now + self.timeout;
        self.state = SlotState::Waiting { deadline };
        Ok(Begin { generation: self.generation, open, deadline })
    }

    /// A reply arrived on the socket of `generation`.
    pub fn handle_reply(&mut self, generation: u64) -> ReplyFate {
        match self.state {
            SlotState::Waiting { .. } if generation == self.generation => {
                self.state = SlotState::Idle;
                ReplyFate::Accept
            }
            _ => ReplyFate::Ignore,
        }
    }

    /// The exchange failed (send error, receive error, undecodable reply): the socket
    /// is stuck in lockstep or suspect, so it goes.
    pub fn handle_failure(&mut self) -> Option<Discard> {
        match self.state {
            SlotState::NoSocket => None,
            _ => {
                self.state = SlotState::NoSocket;
                Some(Discard { generation: self.generation })
            }
        }
    }

    /// The clock reached `poll_timeout`: an overdue request fails and its socket goes
    /// (under the S9 regression the socket stays and the next request reuses it).
    pub fn handle_timeout(&mut self, now: Instant) -> Option<Discard> {
        match self.state {
            SlotState::Waiting { deadline } if now >= deadline => {
                if self.regressions.s9_reuse_after_timeout {
                    self.state = SlotState::Idle;
                    return None;
                }
                self.handle_failure()
            }
            _ => None,
        }
    }

    /// When the outstanding request times out.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            SlotState::Waiting { deadline } => Some(deadline),
            _ => None,
        }
    }

    /// A request is outstanding.
    pub fn is_waiting(&self) -> bool {
        matches!(self.state, SlotState::Waiting { .. })
    }

    /// The current socket generation (0 before the first socket).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The configured timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// `control_timeout_s` to milliseconds as the reference: `max(1, ceil(s * 1000))`.
pub fn timeout_ms(seconds: f64) -> u64 {
    if !seconds.is_finite() || seconds <= 0.0 {
        return 1;
    }
    ((seconds * 1000.0).ceil() as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Duration = Duration::from_secs(30);

    #[test]
    fn first_request_opens_a_socket_and_later_ones_reuse_it() {
        let mut slot = RequestSlot::new(T);
        let b = slot.begin(Instant::ZERO).unwrap();
        assert_eq!((b.generation, b.open, b.deadline), (1, true, Instant::from_secs(30)));
        assert_eq!(slot.handle_reply(1), ReplyFate::Accept);
        let b = slot.begin(Instant::from_secs(1)).unwrap();
        assert_eq!((b.generation, b.open), (1, false));
    }

    #[test]
    fn a_second_send_before_the_reply_is_refused() {
        let mut slot = RequestSlot::new(T);
        slot.begin(Instant::ZERO).unwrap();
        assert_eq!(slot.begin(Instant::ZERO), Err(Busy));
    }

    #[test]
    fn timeout_discards_the_socket_and_the_late_reply_is_ignored() {
        let mut slot = RequestSlot::new(T);
        slot.begin(Instant::ZERO).unwrap();
        assert_eq!(slot.handle_timeout(Instant::from_secs(29)), None);
        assert_eq!(slot.handle_timeout(Instant::from_secs(30)), Some(Discard { generation: 1 }));
        let b = slot.begin(Instant::from_secs(31)).unwrap();
        assert_eq!((b.generation, b.open), (2, true));
        assert_eq!(slot.handle_reply(1), ReplyFate::Ignore, "late reply of the discarded socket");
        assert!(slot.is_waiting());
        assert_eq!(slot.handle_reply(2), ReplyFate::Accept);
        assert_eq!(slot.handle_reply(2), ReplyFate::Ignore, "nothing outstanding");
    }

    #[test]
    fn failure_discards_and_timeout_ms_rounds_up() {
        let mut slot = RequestSlot::new(T);
        assert_eq!(slot.handle_failure(), None);
        slot.begin(Instant::ZERO).unwrap();
        assert_eq!(slot.handle_failure(), Some(Discard { generation: 1 }));
        assert_eq!(slot.poll_timeout(), None);
        assert_eq!(timeout_ms(30.0), 30000);
        assert_eq!(timeout_ms(0.0004), 1);
        assert_eq!(timeout_ms(0.4), 400);
    }
}
