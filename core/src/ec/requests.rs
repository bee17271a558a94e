//! Request frames an EC client sends and the result shapes it reads back.
//!
//! Frames are written like the reference's `send_json` (Python `json.dumps`, keys in the
//! reference helpers' order) so a capture of ctlplane traffic reads like the reference's.
//! The result checks are the reference producer's (a batch reply must have one entry per
//! item); what to do about an entry is the caller's business.

use super::dtype::DType;
use super::pyjson::{self, truthy};
use serde::Serialize;
use serde_json::Value;

/// One tensor to reserve room for on a consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReserveSpec {
    pub transfer_id: String,
    pub mm_hash: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
}

impl ReserveSpec {
    /// `prod(shape) * itemsize(dtype)`, or `None` if that overflows.
    pub fn nbytes(&self) -> Option<u64> {
        self.shape.iter().try_fold(self.dtype.itemsize(), |acc, &d| acc.checked_mul(d))
    }

    fn item(&self) -> Option<ReserveItem<'_>> {
        Some(ReserveItem {
            transfer_id: &self.transfer_id,
            mm_hash: &self.mm_hash,
            nbytes: self.nbytes()?,
            shape: &self.shape,
            dtype: self.dtype.name(),
        })
    }
}

#[derive(Serialize)]
struct ReserveItem<'a> {
    transfer_id: &'a str,
    mm_hash: &'a str,
    nbytes: u64,
    shape: &'a [u64],
    dtype: &'static str,
}

#[derive(Serialize)]
struct Op<'a, T: Serialize> {
    op: &'a str,
    #[serde(flatten)]
    body: T,
}

#[derive(Serialize)]
struct NoBody {}

#[derive(Serialize)]
struct TransferIdBody<'a> {
    transfer_id: &'a str,
}

#[derive(Serialize)]
struct CompleteBody<'a> {
    transfer_id: &'a str,
    reservation_id: &'a str,
}

#[derive(Serialize)]
struct ItemsBody<T> {
    items: Vec<T>,
}

#[derive(Serialize)]
struct CancelBody<'a> {
    transfer_id: &'a str,
    reservation_id: &'a str,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    abandon: bool,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    refresh: bool,
}

fn frame<T: Serialize>(op: &str, body: T) -> Vec<u8> {
    pyjson::dumps(&Op { op, body })
}

/// `{"op": "peers"}`.
pub fn peers() -> Vec<u8> {
    frame("peers", NoBody {})
}

/// `{"op": "event_port"}`.
pub fn event_port() -> Vec<u8> {
    frame("event_port", NoBody {})
}

/// `{"op": "status", "transfer_id": ...}`.
pub fn status(transfer_id: &str) -> Vec<u8> {
    frame("status", TransferIdBody { transfer_id })
}

/// `{"op": "reserve", ...spec}`; `None` if the spec's size overflows.
pub fn reserve(spec: &ReserveSpec) -> Option<Vec<u8>> {
    Some(frame("reserve", spec.item()?))
}

/// `{"op": "reserve_batch", "items": [...]}`; `None` if a spec's size overflows.
pub fn reserve_batch(specs: &[ReserveSpec]) -> Option<Vec<u8>> {
    let items = specs.iter().map(ReserveSpec::item).collect::<Option<Vec<_>>>()?;
    Some(frame("reserve_batch", ItemsBody { items }))
}

/// `{"op": "complete", "transfer_id": ..., "reservation_id": ...}`.
pub fn complete(transfer_id: &str, reservation_id: &str) -> Vec<u8> {
    frame("complete", CompleteBody { transfer_id, reservation_id })
}

/// `{"op": "complete_batch", "items": [{"transfer_id", "reservation_id"}, ...]}`.
pub fn complete_batch<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    let items = items.into_iter().map(|(transfer_id, reservation_id)| CompleteBody { transfer_id, reservation_id });
    frame("complete_batch", ItemsBody { items: items.collect() })
}

/// `{"op": "cancel", "transfer_id", "reservation_id"[, "abandon": true][, "refresh": true]}`:
/// the reference helper always sends `reservation_id` and a flag only when it is set.
pub fn cancel(transfer_id: &str, reservation_id: &str, abandon: bool, refresh: bool) -> Vec<u8> {
    frame("cancel", CancelBody { transfer_id, reservation_id, abandon, refresh })
}

/// One entry of a `complete_batch` result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The consumer accepted the completion.
    pub completed: bool,
    /// The reservation became READY (a readiness event was queued).
    pub became_ready: bool,
}

/// The `items` list of a batch result, which must hold `expected` entries.
fn batch_items(result: &Value, expected: usize) -> Result<&[Value], String> {
    match result.get("items") {
        Some(Value::Array(items)) if items.len() == expected => Ok(items),
        Some(Value::Array(items)) => Err(format!("{} entries for {expected} items", items.len())),
        _ => Err("no items list".into()),
    }
}

/// Per-item outcomes of a `reserve_batch` result: the reserve result, or the error text.
pub fn parse_reserve_batch(result: &Value, expected: usize) -> Result<Vec<Result<Value, String>>, String> {
    let items = batch_items(result, expected)?;
    Ok(items
        .iter()
        .map(|item| {
            if item.get("ok").is_some_and(truthy) {
                Ok(item.get("result").cloned().unwrap_or(Value::Null))
            } else {
                Err(match item.get("error") {
                    Some(Value::String(s)) => s.clone(),
                    Some(other) => pyjson::to_str(other),
                    None => "EC control request failed".into(),
                })
            }
        })
        .collect())
}

/// Per-item outcomes of a `complete` or `complete_batch` entry.
pub fn parse_completion(item: &Value) -> Completion {
    Completion {
        completed: item.get("completed").is_some_and(truthy),
        became_ready: item.get("became_ready").is_some_and(truthy),
    }
}

/// Per-item outcomes of a `complete_batch` result.
pub fn parse_complete_batch(result: &Value, expected: usize) -> Result<Vec<Completion>, String> {
    Ok(batch_items(result, expected)?.iter().map(parse_completion).collect())
}

/// The `cancelled` flag of a `cancel` result.
pub fn parse_cancel(result: &Value) -> bool {
    result.get("cancelled").is_some_and(truthy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(t: &str) -> ReserveSpec {
        ReserveSpec { transfer_id: t.into(), mm_hash: "h".into(), shape: vec![64, 128], dtype: DType::Float16 }
    }

    #[test]
    fn frames_read_like_the_reference_helpers() {
        assert_eq!(peers(), br#"{"op": "peers"}"#);
        assert_eq!(event_port(), br#"{"op": "event_port"}"#);
        assert_eq!(status("t"), br#"{"op": "status", "transfer_id": "t"}"#);
        assert_eq!(
            reserve(&spec("t")).unwrap(),
            br#"{"op": "reserve", "transfer_id": "t", "mm_hash": "h", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}"#
        );
        assert_eq!(cancel("t1", "", false, false), br#"{"op": "cancel", "transfer_id": "t1", "reservation_id": ""}"#);
        assert_eq!(
            cancel("t1", "r0", true, true),
            br#"{"op": "cancel", "transfer_id": "t1", "reservation_id": "r0", "abandon": true, "refresh": true}"#
        );
        assert_eq!(
            complete_batch([("a", "r")]),
            br#"{"op": "complete_batch", "items": [{"transfer_id": "a", "reservation_id": "r"}]}"#
        );
        let huge = ReserveSpec { shape: vec![u64::MAX, 2], ..spec("t") };
        assert_eq!(reserve(&huge), None);
        assert_eq!(reserve_batch(&[spec("a"), huge]), None);
    }

    #[test]
    fn batch_results_need_one_entry_per_item() {
        let r = json!({"items": [{"ok": true, "result": {"write": true}}, {"ok": false, "error": "EC consumer buffer pool is full"}]});
        let items = parse_reserve_batch(&r, 2).unwrap();
        assert_eq!(items[0], Ok(json!({"write": true})));
        assert_eq!(items[1], Err("EC consumer buffer pool is full".into()));
        assert!(parse_reserve_batch(&r, 3).is_err());
        assert!(parse_reserve_batch(&json!(null), 0).is_err());
        let c = json!({"items": [{"completed": true, "became_ready": false}]});
        assert_eq!(parse_complete_batch(&c, 1).unwrap(), [Completion { completed: true, became_ready: false }]);
        assert!(parse_cancel(&json!({"cancelled": true})));
        assert!(!parse_cancel(&json!({})));
    }
}
