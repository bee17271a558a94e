//! What the `reservation-released` oracle needs beyond a rank's book: which cancels each
//! rank took, and which abandons each producer sent, so that a reservation left behind can
//! be told apart from the leaks the behaviour reference documents.
//!
//! Two properties of the behaviour reference (ec-behaviour.md S10, S13, S16, §3.5):
//!
//! - **Cancelled stays cancelled.** A cancel a rank took for a transfer it holds nothing
//!   live for leaves a tombstone, and a later reserve of that transfer answers `cancelled`.
//!   A rank that grants a live reservation (WRITING or READY) for a transfer after taking
//!   its cancel (same incarnation, no refresh) holds memory for a request that is gone,
//!   until the TTL. Unless the tombstone was evicted by the count bound (at most
//!   `tombstone_limit` kept, oldest first): then the reserve allocates afresh by design.
//! - **A failed push is abandoned everywhere.** A producer whose item failed or was skipped
//!   abandons it on every shard, with the empty id where the reserve failed. A reservation
//!   still deferred (pinned for good) at the end is the documented leak only when its
//!   producer could not abandon it: every abandon it sent was lost, or the producer died
//!   before its push finished. One whose producer finished the push without ever sending
//!   an abandon to that rank is a violation.

use std::collections::{BTreeMap, BTreeSet};

use ctlplane_core::ec::State;
use serde_json::Value;

use crate::hosts::world::{self, Shard};

/// The ledger of one run, kept in the world.
#[derive(Clone, Debug, Default)]
pub struct ReleaseLedger {
    /// `(rank host, transfer id)` of every abandon a producer sent.
    abandons_sent: BTreeSet<(String, String)>,
    /// Transfers whose producer reported the push done (nothing of it outstanding).
    pushes_done: BTreeSet<String>,
    /// By rank host: transfers a cancel left with nothing live, the rank's incarnation and
    /// how many tombstones its book had made by then.
    cancelled: BTreeMap<String, BTreeMap<String, (u32, u64)>>,
    /// `(rank host, incarnation, transfer id)` of every record a request left in a rank's
    /// book: a terminal record may be gone since (its tombstone reaped), the rank held it.
    held: BTreeSet<(String, u32, String)>,
}

/// A control request's op and fields, if the frame is a JSON object with an `op`.
fn decode(frame: &[u8]) -> Option<(String, Value)> {
    let v: Value = serde_json::from_slice(frame).ok()?;
    let op = v.get("op")?.as_str()?.to_string();
    Some((op, v))
}

fn flag(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// `tcp://host:port` -> `host`.
fn host_of(endpoint: &str) -> Option<&str> {
    endpoint.strip_prefix("tcp://")?.rsplit_once(':').map(|(h, _)| h)
}

/// Every transfer id a `reserve` or `reserve_batch` request names.
fn reserved_ids(op: &str, v: &Value) -> Vec<String> {
    let id = |x: &Value| x.get("transfer_id").and_then(Value::as_str).map(str::to_string);
    match op {
        "reserve" => id(v).into_iter().collect(),
        "reserve_batch" => {
            v.get("items").and_then(Value::as_array).map(|a| a.iter().filter_map(id).collect()).unwrap_or_default()
        }
        _ => Vec::new(),
    }
}

/// A producer sends `frame` to the logical address `addr`.
pub fn note_sent(addr: &str, frame: &[u8]) {
    if !frame.windows(9).any(|w| w == b"\"abandon\"") {
        return;
    }
    let Some((op, v)) = decode(frame) else { return };
    if op != "cancel" || !flag(&v, "abandon") {
        return;
    }
    let Some(tid) = v.get("transfer_id").and_then(Value::as_str) else { return };
    let Some(rank) = world::resolve(addr).and_then(|t| host_of(&t).map(str::to_string)) else { return };
    world::with(|w| w.release.abandons_sent.insert((rank, tid.to_string())));
}

/// A producer reported the push of these transfers done.
pub fn note_push_done<'a>(tids: impl IntoIterator<Item = &'a str>) {
    world::with(|w| w.release.pushes_done.extend(tids.into_iter().map(str::to_string)));
}

/// A rank (incarnation `incarnation`) handled `frame`: remember a cancel that left nothing
/// live; flag a reserve that made a cancelled transfer live again.
pub fn note_handled(host: &str, incarnation: u32, frame: &[u8], shard: &Shard) {
    let Some((op, v)) = decode(frame) else { return };
    let named = match op.as_str() {
        "cancel" => v.get("transfer_id").and_then(Value::as_str).map(str::to_string).into_iter().collect(),
        _ => reserved_ids(&op, &v),
    };
    let recorded: Vec<String> = named.into_iter().filter(|tid| shard.book().state_of(tid).is_some()).collect();
    if !recorded.is_empty() {
        world::with(|w| {
            w.release.held.extend(recorded.into_iter().map(|tid| (host.to_string(), incarnation, tid)));
        });
    }
    let live = |tid: &str| matches!(shard.book().state_of(tid), Some(State::Writing | State::Ready));
    if op == "cancel" {
        if flag(&v, "refresh") {
            return;
        }
        let Some(tid) = v.get("transfer_id").and_then(Value::as_str) else { return };
        // An abandon naming one reservation that leaves the record EXPIRED was rejected
        // (ec-behaviour.md §3.5 rules 1 and 8: that reservation was refreshed away or timed out) and
        // released nothing: the next reserve replaces the EXPIRED record by design (3.3
        // rule 3), e.g. a second push of the transfer re-reserving after its refresh.
        let named = v.get("reservation_id").and_then(Value::as_str).is_some_and(|r| !r.is_empty());
        if named && shard.book().state_of(tid) == Some(State::Expired) {
            return;
        }
        if !live(tid) {
            let made = shard.book().tombstones_made();
            world::with(|w| {
                w.release.cancelled.entry(host.to_string()).or_default().insert(tid.to_string(), (incarnation, made))
            });
        }
        return;
    }
    let book = shard.book();
    // At least this many tombstones made after the cancel's: it may have been evicted.
    let limit = book.config().tombstone_limit as u64;
    for tid in reserved_ids(&op, &v) {
        let cancelled =
            world::with(|w| {
                w.release.cancelled.get(host).and_then(|m| m.get(&tid)).is_some_and(|&(inc, made)| {
                    inc == incarnation && book.tombstones_made().saturating_sub(made) < limit
                })
            });
        if cancelled && live(&tid) {
            // Once per transfer and rank.
            world::with(|w| w.release.cancelled.get_mut(host).map(|m| m.remove(&tid)));
            crate::oracle::violate(
                "reservation-released",
                host,
                format!("{tid} reserved again after this rank took its cancel: its region lives until the TTL"),
            );
        }
    }
}

impl ReleaseLedger {
    /// `tid`'s producer will write no more to rank `host`: it abandoned the reservation
    /// there, or finished the push.
    pub fn producer_gave_up(&self, host: &str, tid: &str) -> bool {
        self.pushes_done.contains(tid) || self.abandons_sent.contains(&(host.to_string(), tid.to_string()))
    }

    /// Rank `host`'s incarnation `incarnation` held a record of `tid` at some point.
    pub fn ever_held(&self, host: &str, incarnation: u32, tid: &str) -> bool {
        self.held.contains(&(host.to_string(), incarnation, tid.to_string()))
    }
}

/// A reservation of `tid` on rank `host` is deferred for good at the end of the run: is it
/// one its producer finished pushing without ever abandoning it there?
pub fn never_abandoned(host: &str, tid: &str) -> bool {
    world::with(|w| {
        w.release.pushes_done.contains(tid) && !w.release.abandons_sent.contains(&(host.to_string(), tid.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ctlplane_core::ec::producer::{make_cancel_request, reserve_batch_request, reserve_request, PushItem};

    fn item(t: &str) -> PushItem {
        PushItem { transfer_id: t.into(), mm_hash: "h".into(), nbytes: 16, shape: vec![2, 4], dtype: "float16".into() }
    }

    /// The ledger reads the frames the core writes; if their shape changed, the oracle would
    /// silently see nothing.
    #[test]
    fn reads_the_core_frames() {
        let (op, v) = decode(&reserve_request(&item("a"))).expect("a reserve");
        assert_eq!(reserved_ids(&op, &v), vec!["a".to_string()]);
        let (op, v) = decode(&reserve_batch_request([&item("a"), &item("b")])).expect("a batch");
        assert_eq!(reserved_ids(&op, &v), vec!["a".to_string(), "b".to_string()]);
        let abandon = make_cancel_request("a", "", true, false);
        assert!(abandon.windows(9).any(|w| w == b"\"abandon\""));
        let (op, v) = decode(&abandon).expect("a cancel");
        assert_eq!(op, "cancel");
        assert!(flag(&v, "abandon") && !flag(&v, "refresh"));
        let (_, plain) = decode(&make_cancel_request("a", "", false, false)).expect("a cancel");
        assert!(!flag(&plain, "abandon"));
        assert!(reserved_ids("cancel", &plain).is_empty());
        assert!(decode(b"{not json").is_none());
        assert_eq!(host_of("tcp://consumer0-r1:19001"), Some("consumer0-r1"));
    }
}
