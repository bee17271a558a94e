//! A `reserve` reply read straight into fields, for clients that act on it.
//!
//! Building a `serde_json::Value` for every reserve reply (an object of seven keys, two
//! strings) and dropping it costs more than the rest of the client's round trip. A reply in
//! the exact layout the consumer (Rust or Python) writes is scanned into a
//! [`ReserveOutcome`] directly; anything else takes the general path
//! ([`wire::decode_reply`] and [`ReserveOutcome::from_result`]), which decides everything,
//! error texts included. The fields are read with the reference producer's rules: ids with
//! Python's `str`, sizes as integers, flags by truthiness, `cancelled` first. This is the
//! one reader of a reserve result: the producer ([`super::producer`]) and the client
//! (`ctlplane_zmq::ControlClient`) both call it, and [`ReserveOutcome::checked`] applies
//! the producer's size rule for both.

use super::pyjson::{to_int, to_str, truthy};
use super::scan::Scan;
use super::wire::{self, WireError};
use serde_json::Value;

/// What a consumer granted for one `reserve`: the fields the server's reply carries.
pub type ReserveGrant = wire::ReserveResult;

/// A `reserve` result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReserveOutcome {
    /// A destination to write to, share or read.
    Granted(ReserveGrant),
    /// The consumer cancelled the transfer first (`cancelled` truthy): write nothing.
    Cancelled,
}

/// The error of a `reserve` result that is not a reservation (the reference producer's).
pub const MALFORMED_RESERVE: &str = "Malformed EC reservation response";

impl ReserveOutcome {
    /// Reads a decoded `result`; `Err` is the reference producer's error text.
    pub fn from_result(result: &Value) -> Result<Self, String> {
        let Value::Object(obj) = result else {
            return Err(MALFORMED_RESERVE.into());
        };
        if obj.get("cancelled").is_some_and(truthy) {
            return Ok(ReserveOutcome::Cancelled);
        }
        let text = |k: &str| obj.get(k).map(to_str).ok_or_else(|| MALFORMED_RESERVE.to_string());
        let size = |k: &str| {
            obj.get(k)
                .and_then(|v| to_int(v).ok())
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| MALFORMED_RESERVE.to_string())
        };
        let flag = |k: &str| obj.get(k).is_some_and(truthy);
        Ok(ReserveOutcome::Granted(ReserveGrant {
            reservation_id: text("reservation_id")?,
            dst_session: text("dst_session")?,
            dst_ptr: size("dst_ptr")?,
            nbytes: size("nbytes")?,
            write: flag("write"),
            ready: flag("ready"),
            cached: flag("cached"),
        }))
    }
}

impl ReserveOutcome {
    /// The outcome if a writer may act on it: a grant to write must be exactly the
    /// `nbytes` asked for `mm_hash` (never write more than the consumer says its
    /// destination holds); otherwise the reference producer's error text.
    pub fn checked(self, nbytes: u64, mm_hash: &str) -> Result<Self, String> {
        match &self {
            ReserveOutcome::Granted(g) if g.write && g.nbytes != nbytes => {
                Err(format!("EC consumer granted {} bytes for mm_hash={mm_hash}, expected {nbytes}", g.nbytes))
            }
            _ => Ok(self),
        }
    }
}

/// A whole `reserve` reply: `Ok(Ok(outcome))`, `Ok(Err(detail))` for a success whose result
/// is malformed, `Err(text)` for the server's refusal, or the frame's own [`WireError`].
pub type DecodedReserve = Result<Result<ReserveOutcome, String>, String>;

/// Decodes a `reserve` reply frame; the same answer as [`decode_reserve_reply_general`].
pub fn decode_reserve_reply(frame: &[u8]) -> Result<DecodedReserve, WireError> {
    match scan_reserve_reply(frame) {
        Some(outcome) => Ok(Ok(Ok(outcome))),
        None => decode_reserve_reply_general(frame),
    }
}

/// [`decode_reserve_reply`] through [`wire::decode_reply`] and a `Value`.
pub fn decode_reserve_reply_general(frame: &[u8]) -> Result<DecodedReserve, WireError> {
    Ok(wire::decode_reply(frame)?.map(|result| ReserveOutcome::from_result(&result)))
}

/// The reply in the consumer's layout, or `None` for the general path:
/// `{"ok": true, "result": {"reservation_id": "..", "dst_session": "..", "dst_ptr": N,
/// "nbytes": N, "write": B, "ready": B, "cached": B}}`, or the cancelled shape ending in
/// `"write": false, "ready": false, "cancelled": true}}`.
pub fn scan_reserve_reply(frame: &[u8]) -> Option<ReserveOutcome> {
    let mut s = Scan::new(frame);
    s.lit(b"{\"ok\": true, \"result\": {\"reservation_id\": ")?;
    let reservation_id = s.str()?;
    s.lit(b", \"dst_session\": ")?;
    let dst_session = s.str()?;
    s.lit(b", \"dst_ptr\": ")?;
    let dst_ptr = s.uint()?;
    s.lit(b", \"nbytes\": ")?;
    let nbytes = s.uint()?;
    s.lit(b", \"write\": ")?;
    let write = s.bool()?;
    s.lit(b", \"ready\": ")?;
    let ready = s.bool()?;
    let outcome = if s.eat(b", \"cached\": ") {
        let cached = s.bool()?;
        ReserveOutcome::Granted(ReserveGrant {
            reservation_id: reservation_id.to_owned(),
            dst_session: dst_session.to_owned(),
            dst_ptr,
            nbytes,
            write,
            ready,
            cached,
        })
    } else {
        // Only the reference's cancelled shape; a falsy `cancelled` is left to the general path.
        s.lit(b", \"cancelled\": true")?;
        ReserveOutcome::Cancelled
    };
    s.lit(b"}}")?;
    s.end()?;
    Some(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec::wire::{encode_err, encode_ok, CancelledResult, ReserveResult};

    fn both(frame: &[u8]) -> Result<DecodedReserve, WireError> {
        let general = decode_reserve_reply_general(frame);
        assert_eq!(decode_reserve_reply(frame), general, "{}", String::from_utf8_lossy(frame));
        general
    }

    fn granted(write: bool, ready: bool, cached: bool) -> ReserveResult {
        ReserveResult {
            reservation_id: "9c1e".repeat(8),
            dst_session: "10.0.0.5:15417".into(),
            dst_ptr: 4096,
            nbytes: 16384,
            write,
            ready,
            cached,
        }
    }

    #[test]
    fn server_replies_take_the_scan_and_match_the_general_path() {
        for (w, r, c) in [(true, false, false), (false, true, true), (false, false, false)] {
            let frame = encode_ok(&granted(w, r, c));
            let outcome = scan_reserve_reply(&frame).expect("server layout");
            let ReserveOutcome::Granted(g) = &outcome else { panic!("{outcome:?}") };
            assert_eq!((g.write, g.ready, g.cached, g.dst_ptr, g.nbytes), (w, r, c, 4096, 16384));
            assert_eq!(both(&frame), Ok(Ok(Ok(outcome))));
        }
        let frame = encode_ok(&CancelledResult::new(77));
        assert_eq!(scan_reserve_reply(&frame), Some(ReserveOutcome::Cancelled));
        assert_eq!(both(&frame), Ok(Ok(Ok(ReserveOutcome::Cancelled))));
    }

    #[test]
    fn other_layouts_take_the_general_path() {
        let cases: [(&[u8], Result<DecodedReserve, WireError>); 7] = [
            (
                br#"{"ok": true, "result": {"dst_ptr": 1, "nbytes": 2, "reservation_id": "r", "dst_session": "s", "write": 1}}"#,
                Ok(Ok(Ok(ReserveOutcome::Granted(ReserveGrant {
                    reservation_id: "r".into(),
                    dst_session: "s".into(),
                    dst_ptr: 1,
                    nbytes: 2,
                    write: true,
                    ready: false,
                    cached: false,
                })))),
            ),
            (
                br#"{"ok": true, "result": {"reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": 1, "write": false, "ready": false, "cancelled": "yes"}}"#,
                Ok(Ok(Ok(ReserveOutcome::Cancelled))),
            ),
            (
                br#"{"ok": true, "result": {"reservation_id": "r", "dst_session": "s", "dst_ptr": -1, "nbytes": 2}}"#,
                Ok(Ok(Err(MALFORMED_RESERVE.into()))),
            ),
            (br#"{"ok": true, "result": null}"#, Ok(Ok(Err(MALFORMED_RESERVE.into())))),
            (br#"{"ok": true, "result": {"dst_session": "s"}}"#, Ok(Ok(Err(MALFORMED_RESERVE.into())))),
            (br#"{"ok": false, "error": "EC consumer buffer pool is full"}"#, Ok(Err("EC consumer buffer pool is full".into()))),
            (&encode_err("conflicting reservation for transfer_id"), Ok(Err("conflicting reservation for transfer_id".into()))),
        ];
        for (frame, want) in cases {
            assert_eq!(scan_reserve_reply(frame), None, "{}", String::from_utf8_lossy(frame));
            assert_eq!(both(frame), want, "{}", String::from_utf8_lossy(frame));
        }
        assert!(both(b"[1]").is_err());
        assert!(both(b"{").is_err());
    }
}
