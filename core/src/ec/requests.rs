//! Request frames an EC client sends and the result shapes it reads back.
//!
//! Frames are written like the reference's `send_json` (Python `json.dumps`, keys in the
//! reference helpers' order) so a capture of ctlplane traffic reads like the reference's.
//! The result checks are the reference producer's (a batch reply must have one entry per
//! item); what to do about an entry is the caller's business.

use super::dtype::DType;
use super::dumps;
use super::pyjson::{self, truthy};
use super::scan::Scan;
use super::wire::{self, WireError};
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

    /// The spec's wire fields; `None` if its size overflows.
    pub fn fields(&self) -> Option<ReserveFields<'_>> {
        Some(ReserveFields {
            transfer_id: &self.transfer_id,
            mm_hash: &self.mm_hash,
            nbytes: self.nbytes()?,
            shape: &self.shape,
            dtype: self.dtype.name(),
        })
    }
}

/// One reserve item as it goes on the wire, whoever asks (a client's [`ReserveSpec`], a
/// producer's `PushItem`): the one encoder of `reserve` and `reserve_batch` writes these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReserveFields<'a> {
    pub transfer_id: &'a str,
    pub mm_hash: &'a str,
    pub nbytes: u64,
    pub shape: &'a [u64],
    /// The bare torch dtype name (`"float16"`).
    pub dtype: &'a str,
}

impl ReserveFields<'_> {
    /// `"transfer_id": .., "mm_hash": .., "nbytes": .., "shape": [..], "dtype": ..`.
    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"\"transfer_id\": ");
        dumps::write_str(out, self.transfer_id);
        out.extend_from_slice(b", \"mm_hash\": ");
        dumps::write_str(out, self.mm_hash);
        out.extend_from_slice(b", \"nbytes\": ");
        dumps::write_u64(out, self.nbytes);
        out.extend_from_slice(b", \"shape\": [");
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                out.extend_from_slice(b", ");
            }
            dumps::write_u64(out, *d);
        }
        out.extend_from_slice(b"], \"dtype\": ");
        dumps::write_str(out, self.dtype);
    }
}

/// `{"op": "<op>"` of every frame.
fn begin(op: &str, capacity: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(capacity);
    out.extend_from_slice(b"{\"op\": ");
    dumps::write_str(&mut out, op);
    out
}

/// `"transfer_id": .., "reservation_id": ..`.
fn write_complete(out: &mut Vec<u8>, transfer_id: &str, reservation_id: &str) {
    out.extend_from_slice(b"\"transfer_id\": ");
    dumps::write_str(out, transfer_id);
    out.extend_from_slice(b", \"reservation_id\": ");
    dumps::write_str(out, reservation_id);
}

/// `{"op": "peers"}`.
pub fn peers() -> Vec<u8> {
    let mut out = begin("peers", 16);
    out.push(b'}');
    out
}

/// `{"op": "event_port"}`.
pub fn event_port() -> Vec<u8> {
    let mut out = begin("event_port", 24);
    out.push(b'}');
    out
}

/// `{"op": "status", "transfer_id": ...}`.
pub fn status(transfer_id: &str) -> Vec<u8> {
    let mut out = begin("status", 40 + transfer_id.len());
    out.extend_from_slice(b", \"transfer_id\": ");
    dumps::write_str(&mut out, transfer_id);
    out.push(b'}');
    out
}

/// `{"op": "reserve", ...spec}`; `None` if the spec's size overflows.
pub fn reserve(spec: &ReserveSpec) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    write_reserve(&mut out, spec)?;
    Some(out)
}

/// [`reserve`]'s frame written into `out` (cleared first), so a client can keep one
/// buffer for its requests; `None` (and `out` left unspecified) if the size overflows.
pub fn write_reserve(out: &mut Vec<u8>, spec: &ReserveSpec) -> Option<()> {
    write_reserve_fields(out, &spec.fields()?);
    Some(())
}

/// The `reserve` frame of `fields`, written into `out` (cleared first).
pub fn write_reserve_fields(out: &mut Vec<u8>, fields: &ReserveFields<'_>) {
    out.clear();
    out.reserve(128 + fields.transfer_id.len() + fields.mm_hash.len());
    out.extend_from_slice(b"{\"op\": \"reserve\", ");
    fields.write(out);
    out.push(b'}');
}

/// `{"op": "reserve_batch", "items": [...]}`; `None` if a spec's size overflows.
pub fn reserve_batch(specs: &[ReserveSpec]) -> Option<Vec<u8>> {
    let fields = specs.iter().map(ReserveSpec::fields).collect::<Option<Vec<_>>>()?;
    Some(reserve_batch_fields(fields))
}

/// `{"op": "reserve_batch", "items": [...]}` of `items`.
pub fn reserve_batch_fields<'a>(items: impl IntoIterator<Item = ReserveFields<'a>>) -> Vec<u8> {
    let items = items.into_iter();
    let mut out = begin("reserve_batch", 40 + 200 * items.size_hint().0);
    out.extend_from_slice(b", \"items\": [");
    for (i, fields) in items.enumerate() {
        out.extend_from_slice(if i > 0 { b", {" } else { b"{" });
        fields.write(&mut out);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    out
}

/// `{"op": "complete", "transfer_id": ..., "reservation_id": ...}`.
pub fn complete(transfer_id: &str, reservation_id: &str) -> Vec<u8> {
    let mut out = begin("complete", 64 + transfer_id.len() + reservation_id.len());
    out.extend_from_slice(b", ");
    write_complete(&mut out, transfer_id, reservation_id);
    out.push(b'}');
    out
}

/// `{"op": "complete_batch", "items": [{"transfer_id", "reservation_id"}, ...]}`.
pub fn complete_batch<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    let items = items.into_iter();
    let mut out = begin("complete_batch", 40 + 110 * items.size_hint().0);
    out.extend_from_slice(b", \"items\": [");
    for (i, (transfer_id, reservation_id)) in items.enumerate() {
        out.extend_from_slice(if i > 0 { b", {" } else { b"{" });
        write_complete(&mut out, transfer_id, reservation_id);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    out
}

/// `{"op": "cancel", "transfer_id", "reservation_id"[, "abandon": true][, "refresh": true]}`,
/// the frame of 0.33's `make_cancel_request`: `reservation_id` always (`""` when none is
/// known), each flag only when it is set. The one cancel encoder: every cancel ctlplane
/// sends (producer, client, CLI, simulator hosts) is built here.
pub fn make_cancel_request(transfer_id: &str, reservation_id: &str, abandon: bool, refresh: bool) -> Vec<u8> {
    let mut out = begin("cancel", 100 + transfer_id.len() + reservation_id.len());
    out.extend_from_slice(b", ");
    write_complete(&mut out, transfer_id, reservation_id);
    if abandon {
        out.extend_from_slice(b", \"abandon\": true");
    }
    if refresh {
        out.extend_from_slice(b", \"refresh\": true");
    }
    out.push(b'}');
    out
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

/// The outcomes of a `complete_batch` reply in the consumer's exact layout (`json.dumps`
/// of `{"ok": true, "result": {"items": [{"completed": .., "became_ready": ..}, ..]}}`)
/// holding `expected` entries, read without building a `Value`, or `None`. Whatever it
/// returns, [`decode_reply_general`](wire::decode_reply_general) and
/// [`parse_complete_batch`] return too.
pub fn scan_complete_batch_reply(frame: &[u8], expected: usize) -> Option<Vec<Completion>> {
    let mut s = Scan::new(frame);
    s.lit(b"{\"ok\": true, \"result\": {\"items\": ")?;
    let items = s.list(|s| {
        s.lit(b"{\"completed\": ")?;
        let completed = s.bool()?;
        s.lit(b", \"became_ready\": ")?;
        let became_ready = s.bool()?;
        s.lit(b"}")?;
        Some(Completion { completed, became_ready })
    })?;
    s.lit(b"}}")?;
    s.end()?;
    (items.len() == expected).then_some(items)
}

/// A `complete_batch` reply frame as a client reads it: the server's error text
/// (`Ok(Err(..))`), or the outcomes, or why the result is not a batch of `expected`
/// entries. The consumer's exact layout is scanned, the rest parsed.
#[allow(clippy::type_complexity)]
pub fn decode_complete_batch_reply(
    frame: &[u8],
    expected: usize,
) -> Result<Result<Result<Vec<Completion>, String>, String>, WireError> {
    if let Some(items) = scan_complete_batch_reply(frame, expected) {
        return Ok(Ok(Ok(items)));
    }
    Ok(wire::decode_reply(frame)?.map(|result| parse_complete_batch(&result, expected)))
}

/// The `cancelled` flag of a `cancel` result.
pub fn parse_cancel(result: &Value) -> bool {
    result.get("cancelled").is_some_and(truthy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The frames through serde and `pyjson::dumps_general`, to hold the writers above to.
    mod general {
        use super::super::{DType, ReserveSpec};
        use crate::ec::pyjson;
        use serde::Serialize;

        #[derive(Serialize)]
        struct ReserveItem<'a> {
            transfer_id: &'a str,
            mm_hash: &'a str,
            nbytes: u64,
            shape: &'a [u64],
            dtype: &'static str,
        }

        fn item(spec: &ReserveSpec) -> Option<ReserveItem<'_>> {
            Some(ReserveItem {
                transfer_id: &spec.transfer_id,
                mm_hash: &spec.mm_hash,
                nbytes: spec.nbytes()?,
                shape: &spec.shape,
                dtype: DType::name(spec.dtype),
            })
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
            pyjson::dumps_general(&Op { op, body })
        }

        pub fn peers() -> Vec<u8> {
            frame("peers", NoBody {})
        }
        pub fn event_port() -> Vec<u8> {
            frame("event_port", NoBody {})
        }
        pub fn status(transfer_id: &str) -> Vec<u8> {
            frame("status", TransferIdBody { transfer_id })
        }
        pub fn reserve(spec: &ReserveSpec) -> Option<Vec<u8>> {
            Some(frame("reserve", item(spec)?))
        }
        pub fn reserve_batch(specs: &[ReserveSpec]) -> Option<Vec<u8>> {
            let items = specs.iter().map(item).collect::<Option<Vec<_>>>()?;
            Some(frame("reserve_batch", ItemsBody { items }))
        }
        pub fn complete(transfer_id: &str, reservation_id: &str) -> Vec<u8> {
            frame("complete", CompleteBody { transfer_id, reservation_id })
        }
        pub fn complete_batch(items: &[(String, String)]) -> Vec<u8> {
            let items = items.iter().map(|(t, r)| CompleteBody { transfer_id: t, reservation_id: r }).collect();
            frame("complete_batch", ItemsBody { items })
        }
        pub fn cancel(transfer_id: &str, reservation_id: &str, abandon: bool, refresh: bool) -> Vec<u8> {
            frame("cancel", CancelBody { transfer_id, reservation_id, abandon, refresh })
        }
    }

    fn text() -> impl Strategy<Value = String> {
        prop_oneof!["[0-9a-f]{32}", "[ -~]{0,8}", ".{0,4}", "[\\x00-\\x1f\\x7f]{1,2}"]
    }

    fn spec_strategy() -> impl Strategy<Value = ReserveSpec> {
        (
            text(),
            text(),
            proptest::collection::vec(prop_oneof![0u64..5000, Just(u64::MAX)], 0..4),
            proptest::sample::select(DType::ALL),
        )
            .prop_map(|(transfer_id, mm_hash, shape, dtype)| ReserveSpec {
                transfer_id,
                mm_hash,
                shape,
                dtype,
            })
    }

    proptest! {
        #[test]
        fn frames_are_the_general_writers_bytes(
            specs in proptest::collection::vec(spec_strategy(), 0..4),
            ids in proptest::collection::vec((text(), text()), 0..4),
            abandon in any::<bool>(),
            refresh in any::<bool>(),
        ) {
            for spec in &specs {
                prop_assert_eq!(reserve(spec), general::reserve(spec));
                prop_assert_eq!(status(&spec.transfer_id), general::status(&spec.transfer_id));
            }
            prop_assert_eq!(reserve_batch(&specs), general::reserve_batch(&specs));
            prop_assert_eq!(complete_batch(ids.iter().map(|(t, r)| (t.as_str(), r.as_str()))), general::complete_batch(&ids));
            for (t, r) in &ids {
                prop_assert_eq!(complete(t, r), general::complete(t, r));
                prop_assert_eq!(make_cancel_request(t, r, abandon, refresh), general::cancel(t, r, abandon, refresh));
            }
            prop_assert_eq!(peers(), general::peers());
            prop_assert_eq!(event_port(), general::event_port());
        }
    }

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
        assert_eq!(
            make_cancel_request("t1", "", false, false),
            br#"{"op": "cancel", "transfer_id": "t1", "reservation_id": ""}"#
        );
        assert_eq!(
            make_cancel_request("t1", "r0", true, true),
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
