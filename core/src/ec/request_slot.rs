//! The REQ lockstep rule of a control client (ec-behaviour.md §5, race S9), and what an
//! exchange's ending means.
//!
//! A REQ socket that sent and did not receive cannot send again. So after a timeout, a
//! transport error or an undecodable reply the socket is discarded and the next request
//! opens a fresh one; a late reply addressed to the discarded socket belongs to an older
//! generation and is ignored. A reply that completes the round trip (an error reply, or
//! JSON that is not an object, which the reference refuses after its receive) leaves the
//! socket in lockstep, so it stays. Drivers report how an exchange ended
//! ([`RequestSlot::finish`]) and carry out the [`Outcome`]: they never classify a
//! failure themselves.

use super::wire::WireError;
use crate::conformance::{record, Text};
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

/// A request was started while the previous one still waits for its reply. The slot is
/// left as it was: the outstanding exchange still owns the socket.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error("REQ socket is still waiting for the reply to its previous request")]
pub struct Busy;

/// How an exchange ended, as the driver's transport saw it.
#[derive(Debug)]
pub enum Ending<'a, E> {
    /// The reply: exactly one frame.
    Reply(&'a [u8]),
    /// A reply of this many frames (not one), read whole and not decoded.
    MultiPart(usize),
    /// The deadline of [`Begin`] passed without a reply (libzmq's EAGAIN on RCVTIMEO or
    /// SNDTIMEO, the simulator's timer).
    TimedOut,
    /// Opening, sending or receiving failed otherwise.
    Transport(E),
}

/// Why a request failed.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure<E> {
    /// `ok` was falsy: the server's text (`EC control request failed` when it sent none).
    Remote(String),
    /// The reply was JSON but not an object (the reference's `assert isinstance(response,
    /// dict)` after its receive); its Python type name.
    NotAnObject(&'static str),
    /// The reply was not one frame of UTF-8 JSON; what was wrong with it.
    Malformed(String),
    /// No reply before the deadline.
    TimedOut,
    /// The transport refused the exchange.
    Transport(E),
    /// A reply for a discarded socket or a request nobody waits for: dropped unread.
    Stale,
}

impl<E> Failure<E> {
    /// The server answered `ok: false`: it ran the request and refused it, so the request
    /// left nothing behind there. After any other failure the server may have run it.
    pub fn refused(&self) -> bool {
        matches!(self, Failure::Remote(_))
    }

    /// This failure as a machine of the core takes it, `text` being the driver's wording.
    pub fn reply_error(&self, text: String) -> ReplyError {
        if self.refused() {
            ReplyError::Refused(text)
        } else {
            ReplyError::Unanswered(text)
        }
    }
}

/// Why a request got no usable result, as the producer's machine takes it: whether the
/// server is known to have left nothing behind decides whether a failed reserve is
/// compensated there (ec-dup-push).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ReplyError {
    /// The server answered and refused the request.
    #[error("{0}")]
    Refused(String),
    /// No answer is known (timeout, transport failure, unreadable reply): the server may
    /// have run the request.
    #[error("{0}")]
    Unanswered(String),
}

impl From<String> for ReplyError {
    fn from(text: String) -> Self {
        ReplyError::Unanswered(text)
    }
}

impl From<&str> for ReplyError {
    fn from(text: &str) -> Self {
        ReplyError::Unanswered(text.to_string())
    }
}

/// What became of an exchange: its result, and what the driver does with the socket.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub struct Outcome<T, E> {
    /// Close the socket of the exchange's generation (linger 0) and forget it; the next
    /// request opens a fresh one. `false`: keep it for the next request.
    pub discard_socket: bool,
    /// The decoded `result`, or why the request failed.
    pub result: Result<T, Failure<E>>,
}

/// What to make of a reply frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReplyFate {
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
        let begun = self.begin_at(now);
        record!(
            "request_slot",
            "begin",
            "{}",
            match &begun {
                Ok(b) => format!(
                    "generation {} open {} deadline now+{:?}",
                    b.generation,
                    b.open,
                    b.deadline.saturating_duration_since(now)
                ),
                Err(Busy) => "busy".to_string(),
            }
        );
        begun
    }

    fn begin_at(&mut self, now: Instant) -> Result<Begin, Busy> {
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

    /// The exchange of `generation` (from [`Self::begin`]) ended: what its result is and
    /// whether its socket goes. `decode` reads a reply frame into `Ok(result)` or
    /// `Err(the server's text)`.
    ///
    /// | ending | result | socket |
    /// |---|---|---|
    /// | `ok: true` reply | `Ok(result)` | kept |
    /// | `ok: false` reply | [`Failure::Remote`] | kept |
    /// | JSON that is not an object | [`Failure::NotAnObject`] | kept: the round trip completed |
    /// | not UTF-8 JSON, or not one frame | [`Failure::Malformed`] | discarded |
    /// | timeout | [`Failure::TimedOut`] | discarded (kept under the S9 regression) |
    /// | transport error | [`Failure::Transport`] | discarded |
    /// | reply nobody waits for | [`Failure::Stale`] | untouched |
    pub fn finish<T, E>(
        &mut self,
        generation: u64,
        ending: Ending<'_, E>,
        decode: impl FnOnce(&[u8]) -> Result<Result<T, String>, WireError>,
    ) -> Outcome<T, E> {
        if !tracing::enabled!(target: crate::conformance::TARGET, tracing::Level::TRACE) {
            return self.end(generation, ending, decode);
        }
        let input = match &ending {
            Ending::Reply(frame) => format!("reply {}", Text(frame)),
            Ending::MultiPart(frames) => format!("multipart {frames}"),
            Ending::TimedOut => "timed out".to_string(),
            Ending::Transport(_) => "transport error".to_string(),
        };
        let outcome = self.end(generation, ending, decode);
        let result = match &outcome.result {
            Ok(_) => "ok".to_string(),
            Err(Failure::Remote(text)) => format!("remote {text:?}"),
            Err(Failure::NotAnObject(name)) => format!("not an object ({name})"),
            Err(Failure::Malformed(detail)) => format!("malformed ({detail})"),
            Err(Failure::TimedOut) => "timed out".to_string(),
            Err(Failure::Transport(_)) => "transport error".to_string(),
            Err(Failure::Stale) => "stale".to_string(),
        };
        record!(
            "request_slot",
            "finish",
            "generation {generation} {input} -> {result}, discard socket {}",
            outcome.discard_socket
        );
        outcome
    }

    fn end<T, E>(
        &mut self,
        generation: u64,
        ending: Ending<'_, E>,
        decode: impl FnOnce(&[u8]) -> Result<Result<T, String>, WireError>,
    ) -> Outcome<T, E> {
        match ending {
            Ending::Reply(frame) => {
                if self.handle_reply(generation) == ReplyFate::Ignore {
                    return Outcome { discard_socket: false, result: Err(Failure::Stale) };
                }
                match decode(frame) {
                    Ok(Ok(result)) => Outcome { discard_socket: false, result: Ok(result) },
                    Ok(Err(text)) => Outcome { discard_socket: false, result: Err(Failure::Remote(text)) },
                    Err(WireError::NotAnObject(name)) => {
                        Outcome { discard_socket: false, result: Err(Failure::NotAnObject(name)) }
                    }
                    Err(e) => self.discard(generation, Failure::Malformed(e.to_string())),
                }
            }
            Ending::MultiPart(frames) => {
                if self.handle_reply(generation) == ReplyFate::Ignore {
                    return Outcome { discard_socket: false, result: Err(Failure::Stale) };
                }
                self.discard(generation, Failure::Malformed(format!("{frames} frames")))
            }
            Ending::TimedOut => {
                if self.regressions.s9_reuse_after_timeout && self.is_outstanding(generation) {
                    self.state = SlotState::Idle;
                    return Outcome { discard_socket: false, result: Err(Failure::TimedOut) };
                }
                self.discard(generation, Failure::TimedOut)
            }
            Ending::Transport(e) => self.discard(generation, Failure::Transport(e)),
        }
    }

    /// `generation`'s request is the one waiting for its reply.
    fn is_outstanding(&self, generation: u64) -> bool {
        matches!(self.state, SlotState::Waiting { .. }) && generation == self.generation
    }

    /// A reply arrived on the socket of `generation`.
    fn handle_reply(&mut self, generation: u64) -> ReplyFate {
        if self.is_outstanding(generation) {
            self.state = SlotState::Idle;
            ReplyFate::Accept
        } else {
            ReplyFate::Ignore
        }
    }

    /// The exchange of `generation` failed: its socket is stuck in lockstep or suspect.
    /// If it is the current socket the slot forgets it; an older one is already gone.
    fn discard<T, E>(&mut self, generation: u64, failure: Failure<E>) -> Outcome<T, E> {
        let current = generation == self.generation && self.state != SlotState::NoSocket;
        if current {
            self.state = SlotState::NoSocket;
        }
        Outcome { discard_socket: current, result: Err(failure) }
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec::wire::decode_reply;
    use serde_json::{json, Value};

    const T: Duration = Duration::from_secs(30);

    /// A transport error as a driver would carry it.
    #[derive(Debug, PartialEq, Eq)]
    struct Refused;

    fn waiting(regressions: SlotRegressions) -> (RequestSlot, Begin) {
        let mut slot = RequestSlot::with_regressions(T, regressions);
        let begin = slot.begin(Instant::ZERO).unwrap();
        (slot, begin)
    }

    fn end(slot: &mut RequestSlot, generation: u64, ending: Ending<'_, Refused>) -> Outcome<Value, Refused> {
        slot.finish(generation, ending, decode_reply)
    }

    /// After `outcome`, whether the next request reuses the socket (`open: false`).
    fn next_reuses(slot: &mut RequestSlot) -> bool {
        !slot.begin(Instant::from_secs(31)).unwrap().open
    }

    #[test]
    fn an_ok_reply_is_the_result_and_keeps_the_socket() {
        let (mut slot, b) = waiting(SlotRegressions::default());
        let o = end(&mut slot, b.generation, Ending::Reply(br#"{"ok": true, "result": 7}"#));
        assert_eq!(o, Outcome { discard_socket: false, result: Ok(json!(7)) });
        assert!(next_reuses(&mut slot));
    }

    #[test]
    fn an_error_reply_is_the_server_text_and_keeps_the_socket() {
        let (mut slot, b) = waiting(SlotRegressions::default());
        let o = end(&mut slot, b.generation, Ending::Reply(br#"{"ok": false, "error": "boom"}"#));
        assert_eq!(o, Outcome { discard_socket: false, result: Err(Failure::Remote("boom".into())) });
        let b = slot.begin(Instant::from_secs(1)).unwrap();
        assert!(!b.open);
        let o = end(&mut slot, b.generation, Ending::Reply(br#"{"ok": false}"#));
        assert_eq!(o.result, Err(Failure::Remote("EC control request failed".into())));
    }

    #[test]
    fn a_non_object_reply_completed_the_round_trip_so_the_socket_stays() {
        let (mut slot, b) = waiting(SlotRegressions::default());
        let o = end(&mut slot, b.generation, Ending::Reply(b"[1, 2]"));
        assert_eq!(o, Outcome { discard_socket: false, result: Err(Failure::NotAnObject("list")) });
        assert!(next_reuses(&mut slot));
    }

    #[test]
    fn garbage_discards_the_socket() {
        for ending in [Ending::Reply(b"{not json".as_slice()), Ending::Reply(b""), Ending::MultiPart(2)] {
            let (mut slot, b) = waiting(SlotRegressions::default());
            let o = end(&mut slot, b.generation, ending);
            assert!(o.discard_socket);
            assert!(matches!(o.result, Err(Failure::Malformed(_))), "{o:?}");
            assert!(!next_reuses(&mut slot));
        }
    }

    #[test]
    fn a_timeout_discards_the_socket_unless_s9_is_restored() {
        let (mut slot, b) = waiting(SlotRegressions::default());
        let o = end(&mut slot, b.generation, Ending::TimedOut);
        assert_eq!(o, Outcome { discard_socket: true, result: Err(Failure::TimedOut) });
        assert!(!next_reuses(&mut slot));

        let (mut old, b) = waiting(SlotRegressions { s9_reuse_after_timeout: true });
        let o = end(&mut old, b.generation, Ending::TimedOut);
        assert_eq!(o, Outcome { discard_socket: false, result: Err(Failure::TimedOut) });
        assert!(next_reuses(&mut old), "S9: the next request goes out on the timed-out socket");
    }

    #[test]
    fn a_transport_error_discards_the_socket_even_under_s9() {
        for regressions in [SlotRegressions::default(), SlotRegressions { s9_reuse_after_timeout: true }] {
            let (mut slot, b) = waiting(regressions);
            let o = end(&mut slot, b.generation, Ending::Transport(Refused));
            assert_eq!(o, Outcome { discard_socket: true, result: Err(Failure::Transport(Refused)) });
            assert!(!next_reuses(&mut slot));
        }
    }

    #[test]
    fn first_request_opens_a_socket_and_later_ones_reuse_it() {
        let mut slot = RequestSlot::new(T);
        let b = slot.begin(Instant::ZERO).unwrap();
        assert_eq!((b.generation, b.open, b.deadline), (1, true, Instant::from_secs(30)));
        assert!(end(&mut slot, 1, Ending::Reply(br#"{"ok": true, "result": null}"#)).result.is_ok());
        let b = slot.begin(Instant::from_secs(1)).unwrap();
        assert_eq!((b.generation, b.open), (1, false));
    }

    #[test]
    fn a_second_send_before_the_reply_is_refused_and_changes_nothing() {
        let mut slot = RequestSlot::new(T);
        slot.begin(Instant::ZERO).unwrap();
        assert_eq!(slot.begin(Instant::ZERO), Err(Busy));
        assert_eq!(slot.poll_timeout(), Some(Instant::from_secs(30)));
    }

    #[test]
    fn a_late_reply_of_a_discarded_socket_is_stale() {
        const OK: &[u8] = br#"{"ok": true, "result": 1}"#;
        let mut slot = RequestSlot::new(T);
        slot.begin(Instant::ZERO).unwrap();
        assert!(end(&mut slot, 1, Ending::TimedOut).discard_socket);
        let b = slot.begin(Instant::from_secs(31)).unwrap();
        assert_eq!((b.generation, b.open), (2, true));
        let late = end(&mut slot, 1, Ending::Reply(OK));
        assert_eq!(late, Outcome { discard_socket: false, result: Err(Failure::Stale) });
        assert!(slot.is_waiting());
        assert_eq!(end(&mut slot, 2, Ending::Reply(OK)).result, Ok(json!(1)));
        assert_eq!(end(&mut slot, 2, Ending::Reply(OK)).result, Err(Failure::Stale), "nothing outstanding");
        assert!(!end(&mut slot, 1, Ending::Transport(Refused)).discard_socket, "generation 1 is gone already");
        assert!(slot.begin(Instant::from_secs(32)).is_ok_and(|b| !b.open));
    }
}
