//! The landing ledger: where written bytes landed, and whether a rank announced an item
//! ready only after the bytes of the very reservation it announced were there.
//!
//! ec-behaviour.md §3.4 makes a reservation READY on its writer's completion, which the producer sends
//! after its write returned; S12 adds that a late completion carrying an older reservation
//! id must not make the transfer's new reservation READY. Both say: a readiness event
//! (ec-behaviour.md §2.4) names a reservation whose destination holds the item's bytes.
//!
//! The rank host notes the destination of every reservation it grants (`reserve` and
//! `reserve_batch` replies); a writer grant hands out memory afresh, so whatever landed
//! there before is forgotten. The device notes every write that lands. When a rank
//! publishes a readiness event, the destination of the reservation it names must hold a
//! landed write of the event's mm_hash covering its bytes: the writer's own write, the
//! writer's write a follower shares, or the resident tensor a cache hit leases.

use std::collections::{BTreeMap, BTreeSet};

use ctlplane_core::ec::slab::aligned_size;
use serde_json::Value;

/// Landed writes and granted destinations, by Mooncake session (one per rank
/// incarnation: a restarted rank's memory is a new slab).
#[derive(Clone, Debug, Default)]
pub struct LandedLedger {
    /// Landed writes by session: first byte -> (end, mm_hash). Disjoint: a write that
    /// lands over older bytes replaces them.
    landed: BTreeMap<String, BTreeMap<u64, (u64, String)>>,
    /// Destinations granted: (session, transfer id, reservation id) -> dst_ptr.
    granted: BTreeMap<(String, String, String), u64>,
    /// Fresh writer grants whose write has not returned yet: (session, transfer id).
    /// What a closing rank must not release its pool under (race S21).
    writing: BTreeSet<(String, String)>,
    /// Zero-byte writes that returned, by (session, mm_hash): an empty tensor has no
    /// destination bytes (its `dst_ptr` is null), so its readiness needs only that a
    /// write of the item returned in that slab.
    empty: BTreeSet<(String, String)>,
}

impl LandedLedger {
    /// A write of `nbytes` of `mm_hash` landed at `dst_ptr` in `session`'s slab.
    pub fn note_landed(&mut self, session: &str, dst_ptr: u64, nbytes: u64, mm_hash: &str) {
        if nbytes == 0 {
            self.empty.insert((session.to_string(), mm_hash.to_string()));
            return;
        }
        let end = dst_ptr.saturating_add(nbytes);
        self.forget(session, dst_ptr, end);
        self.landed.entry(session.to_string()).or_default().insert(dst_ptr, (end, mm_hash.to_string()));
    }

    /// A rank of `session` answered `frame` with `reply`: note the destinations it granted.
    pub fn note_handled(&mut self, session: &str, frame: &[u8], reply: &[u8]) {
        if !frame.windows(7).any(|w| w == b"reserve") {
            return;
        }
        let (Ok(request), Ok(reply)) = (serde_json::from_slice::<Value>(frame), serde_json::from_slice::<Value>(reply))
        else {
            return;
        };
        let Some(result) = reply.get("result").filter(|_| reply.get("ok") == Some(&Value::Bool(true))) else {
            return;
        };
        let tid = |v: &Value| v.get("transfer_id").and_then(Value::as_str).map(str::to_string);
        match request.get("op").and_then(Value::as_str) {
            Some("reserve") => {
                if let Some(t) = tid(&request) {
                    self.note_grant(session, &t, result);
                }
            }
            Some("reserve_batch") => {
                let asked = request.get("items").and_then(Value::as_array);
                let answered = result.get("items").and_then(Value::as_array);
                let (Some(asked), Some(answered)) = (asked, answered) else { return };
                for (item, entry) in asked.iter().zip(answered) {
                    if let (Some(t), Some(r)) = (tid(item), entry.get("result")) {
                        self.note_grant(session, &t, r);
                    }
                }
            }
            _ => {}
        }
    }

    /// A rank of `session` published the readiness event `frame`: `Err` says why its
    /// reservation's bytes are not there. An event naming a reservation this ledger never
    /// saw granted is not judged.
    pub fn check_published(&self, session: &str, frame: &[u8]) -> Result<(), String> {
        let Ok(event) = serde_json::from_slice::<Value>(frame) else { return Ok(()) };
        let field = |k: &str| event.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let (tid, rid, mm_hash) = (field("transfer_id"), field("reservation_id"), field("mm_hash"));
        let nbytes = event.get("nbytes").and_then(Value::as_u64).unwrap_or(0);
        let Some(&dst) = self.granted.get(&(session.to_string(), tid.clone(), rid.clone())) else { return Ok(()) };
        if nbytes == 0 {
            return if self.empty.contains(&(session.to_string(), mm_hash.clone())) {
                Ok(())
            } else {
                Err(format!("{tid} announced ready (reservation {rid}) before any write of its empty tensor returned"))
            };
        }
        let covering = self.landed.get(session).and_then(|m| m.range(..=dst).next_back());
        match covering {
            Some((_, (end, h))) if *end >= dst.saturating_add(nbytes) && *h == mm_hash => Ok(()),
            Some((start, (end, h))) if *start <= dst && *end > dst => Err(format!(
                "{tid} announced ready (reservation {rid}) while its destination holds a write of {h}, \
                 not of {mm_hash}"
            )),
            _ => Err(format!(
                "{tid} announced ready (reservation {rid}) before any write of its {nbytes} bytes landed in its destination"
            )),
        }
    }

    fn note_grant(&mut self, session: &str, tid: &str, result: &Value) {
        if result.get("cancelled").and_then(Value::as_bool) == Some(true) {
            return;
        }
        let rid = result.get("reservation_id").and_then(Value::as_str).unwrap_or_default();
        let (Some(dst), Some(nbytes)) =
            (result.get("dst_ptr").and_then(Value::as_u64), result.get("nbytes").and_then(Value::as_u64))
        else {
            return;
        };
        if rid.is_empty() {
            return;
        }
        if result.get("write").and_then(Value::as_bool) == Some(true) {
            // Fresh memory for this writer: nothing of an earlier owner counts.
            let len = aligned_size(nbytes).unwrap_or(nbytes);
            self.forget(session, dst, dst.saturating_add(len));
            self.writing.insert((session.to_string(), tid.to_string()));
        }
        self.granted.insert((session.to_string(), tid.to_string(), rid.to_string()), dst);
    }

    /// A write of `transfer_id` into `session` returned (landed or failed).
    pub fn note_write_ended(&mut self, session: &str, transfer_id: &str) {
        self.writing.remove(&(session.to_string(), transfer_id.to_string()));
    }

    /// Transfers `session`'s rank granted fresh memory to write whose write has not
    /// returned (some may never be written: their producer gave up).
    pub fn unwritten_grants(&self, session: &str) -> Vec<String> {
        let from = (session.to_string(), String::new());
        self.writing.range(from..).take_while(|(s, _)| s == session).map(|(_, t)| t.clone()).collect()
    }

    /// Forgets what landed over `[start, end)`.
    fn forget(&mut self, session: &str, start: u64, end: u64) {
        let Some(m) = self.landed.get_mut(session) else { return };
        let stale: Vec<u64> = m.range(..end).filter(|(_, (e, _))| *e > start).map(|(s, _)| *s).collect();
        for s in stale {
            m.remove(&s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserve(tid: &str) -> Vec<u8> {
        format!(r#"{{"op": "reserve", "transfer_id": "{tid}", "mm_hash": "h", "nbytes": 512, "shape": [2, 128], "dtype": "float16"}}"#)
            .into_bytes()
    }

    fn granted(rid: &str, dst: u64, write: bool) -> Vec<u8> {
        format!(
            r#"{{"ok": true, "result": {{"reservation_id": "{rid}", "dst_session": "s", "dst_ptr": {dst}, "nbytes": 512, "write": {write}, "ready": false, "cached": false}}}}"#
        )
        .into_bytes()
    }

    fn event(tid: &str, rid: &str, mm_hash: &str) -> Vec<u8> {
        format!(
            r#"{{"transfer_id": "{tid}", "mm_hash": "{mm_hash}", "ready": true, "reservation_id": "{rid}", "nbytes": 512, "shape": [2, 128], "dtype": "float16", "shard": 19000}}"#
        )
        .into_bytes()
    }

    #[test]
    fn an_announcement_needs_the_bytes_of_its_own_reservation() {
        let mut l = LandedLedger::default();
        l.note_handled("s", &reserve("t"), &granted("r1", 4096, true));
        assert!(l.check_published("s", &event("t", "r1", "h")).is_err(), "nothing landed yet");
        l.note_landed("s", 4096, 512, "h");
        assert_eq!(l.check_published("s", &event("t", "r1", "h")), Ok(()));
        // A follower (write: false) shares the writer's landed bytes.
        l.note_handled("s", &reserve("f"), &granted("rf", 4096, false));
        assert_eq!(l.check_published("s", &event("f", "rf", "h")), Ok(()));
        // A new writer reservation of the same transfer gets the memory afresh.
        l.note_handled("s", &reserve("t"), &granted("r2", 4096, true));
        let e = l.check_published("s", &event("t", "r2", "h")).unwrap_err();
        assert!(e.contains("before any write"), "{e}");
        // Another item's bytes there do not count.
        l.note_landed("s", 4096, 512, "other");
        assert!(l.check_published("s", &event("t", "r2", "h")).unwrap_err().contains("other"));
        l.note_landed("s", 4096, 512, "h");
        assert_eq!(l.check_published("s", &event("t", "r2", "h")), Ok(()));
        // Other sessions, unknown reservations and undecodable frames are not judged.
        assert_eq!(l.check_published("s2", &event("t", "r2", "h")), Ok(()));
        assert_eq!(l.check_published("s", &event("t", "nope", "h")), Ok(()));
        assert_eq!(l.check_published("s", b"{not json"), Ok(()));
    }

    #[test]
    fn an_empty_tensor_needs_a_returned_write_of_its_item() {
        let mut l = LandedLedger::default();
        let frame = br#"{"op": "reserve", "transfer_id": "e", "mm_hash": "h0", "nbytes": 0, "shape": [0, 128], "dtype": "float16"}"#;
        let reply = br#"{"ok": true, "result": {"reservation_id": "re", "dst_session": "s", "dst_ptr": 0, "nbytes": 0, "write": true, "ready": false, "cached": false}}"#;
        l.note_handled("s", frame, reply);
        let ready = br#"{"transfer_id": "e", "mm_hash": "h0", "ready": true, "reservation_id": "re", "nbytes": 0, "shape": [0, 128], "dtype": "float16", "shard": 19000}"#;
        assert!(l.check_published("s", ready).unwrap_err().contains("empty tensor"), "no write returned yet");
        l.note_landed("s", 0, 0, "other");
        assert!(l.check_published("s", ready).is_err(), "another item's write does not count");
        l.note_landed("s2", 0, 0, "h0");
        assert!(l.check_published("s", ready).is_err(), "nor one in another slab");
        l.note_landed("s", 0, 0, "h0");
        assert_eq!(l.check_published("s", ready), Ok(()));
    }

    #[test]
    fn batch_grants_and_refusals() {
        let mut l = LandedLedger::default();
        let frame = br#"{"op": "reserve_batch", "items": [{"transfer_id": "a"}, {"transfer_id": "b"}]}"#;
        let reply = br#"{"ok": true, "result": {"items": [{"ok": true, "result": {"reservation_id": "ra", "dst_ptr": 0, "nbytes": 512, "write": true}}, {"ok": true, "result": {"reservation_id": "", "dst_ptr": 0, "nbytes": 512, "write": false, "cancelled": true}}]}}"#;
        l.note_handled("s", frame, reply);
        assert!(l.check_published("s", &event("a", "ra", "h")).is_err());
        assert_eq!(l.granted.len(), 1, "a cancelled answer grants nothing");
        l.note_landed("s", 0, 512, "h");
        assert_eq!(l.check_published("s", &event("a", "ra", "h")), Ok(()));
    }
}
