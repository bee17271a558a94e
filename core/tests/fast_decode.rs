//! The EC codecs' fast paths against their general paths.
//!
//! Requests in the clients' `json.dumps` layout are read by a hand-written scanner, and
//! replies and events are written by a one-pass writer; everything else goes through
//! `serde_json`. These properties hold each shortcut to the general path on generated
//! frames: valid frames in the clients' layout, the same frames with coercions (numbers
//! as strings or floats, escapes, other key orders), byte-level perturbations of both, and
//! random bytes. Whatever a fast path answers, the general path answers identically; the
//! public entry points answer exactly what the general path does; and the frames the
//! Rust and Python clients send do take the fast path.

use ctlplane_core::ec::dtype::DType;
use ctlplane_core::ec::ids::{MmHash, ReservationId};
use ctlplane_core::ec::requests::{self, ReserveSpec};
use ctlplane_core::ec::reservations::{Status, StatusView};
use ctlplane_core::ec::reserve_outcome::{self, ReserveOutcome};
use ctlplane_core::ec::wire::{
    self, CancelResult, CancelledResult, CompleteItem, CompleteResult, Decoded, ItemReply, Items, JsonText, LastFlag,
    PeersResult, Request, ReserveFields, ReserveReply, ReserveResult, StatusResult,
};
use ctlplane_core::ec::{dumps, pyjson, scan};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde::Serialize;
use serde_json::{Map, Number, Value};
use std::collections::BTreeMap;
use std::sync::Arc;

fn config() -> ProptestConfig {
    ProptestConfig { failure_persistence: None, ..ProptestConfig::default() }
}

/// `json.dumps` of a string (ASCII escapes, lone surrogates for carried ones).
fn js(s: &str) -> String {
    String::from_utf8(pyjson::dumps_general(s)).unwrap()
}

/// Ids as clients send them: mostly `uuid4().hex`, sometimes anything.
fn id() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[0-9a-f]{32}",
        2 => "[ -~]{0,12}",
        1 => ".{0,6}",
        1 => (0xF0000u32..0xF0800).prop_map(|c| char::from_u32(c).unwrap().to_string()),
        1 => "[\\x00-\\x1f\\x7f\"\\\\]{1,3}",
    ]
}

/// An id that needs no escape in JSON.
fn plain_id() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[0-9a-f]{32}", 1 => "[ !#-\\[\\]-~]{0,12}"]
}

fn dtype_name() -> impl Strategy<Value = String> {
    let mut names: Vec<String> = DType::ALL.iter().map(|d| d.name().to_string()).collect();
    names.extend(["half", "float", "long", "Float16", "float17", ""].map(String::from));
    proptest::sample::select(names)
}

/// A number as a client may write it: plain, or in a form that needs a coercion.
fn number(n: u64) -> impl Strategy<Value = String> {
    prop_oneof![
        8 => Just(n.to_string()),
        1 => Just(format!("{n}.0")),
        1 => Just(format!("\"{n}\"")),
        1 => Just(format!("-{n}")),
        1 => Just(format!("{n}e0")),
        1 => Just("true".to_string()),
        1 => Just("null".to_string()),
    ]
}

/// The body of a reserve payload (without braces), and whether it is valid and plain.
fn reserve_body() -> impl Strategy<Value = (String, bool)> {
    (
        id(),
        id(),
        proptest::collection::vec(prop_oneof![8 => 0u64..300, 1 => Just(u64::MAX / 3)], 0..4),
        dtype_name(),
        prop_oneof![6 => Just(None), 1 => any::<u64>().prop_map(Some)],
    )
        .prop_flat_map(|(t, h, shape, dtype, nbytes_override)| {
            let itemsize = DType::from_name(&dtype).map(DType::itemsize);
            let product = itemsize.and_then(|i| shape.iter().try_fold(i, |acc, &d| acc.checked_mul(d)));
            let nbytes = nbytes_override.or(product).unwrap_or(7);
            let dims = shape.iter().map(|&d| number(d)).collect::<Vec<_>>();
            (number(nbytes), dims).prop_map(move |(nb, dims)| {
                let body = format!(
                    "\"transfer_id\": {}, \"mm_hash\": {}, \"nbytes\": {nb}, \"shape\": [{}], \"dtype\": {}",
                    js(&t),
                    js(&h),
                    dims.join(", "),
                    js(&dtype)
                );
                let plain =
                    [&t, &h].iter().all(|s| s.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\'))
                        && dims.iter().zip(&shape).all(|(d, n)| *d == n.to_string())
                        && nb == nbytes.to_string()
                        && product == Some(nbytes)
                        && nbytes.to_string().len() < 20
                        && shape.iter().all(|d| d.to_string().len() < 20);
                (body, plain)
            })
        })
}

fn complete_body() -> impl Strategy<Value = (String, bool)> {
    (id(), id()).prop_map(|(t, r)| {
        let plain = [&t, &r].iter().all(|s| s.bytes().all(|b| (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\'));
        (format!("\"transfer_id\": {}, \"reservation_id\": {}", js(&t), js(&r)), plain)
    })
}

fn items(body: impl Strategy<Value = (String, bool)>) -> impl Strategy<Value = (String, bool)> {
    proptest::collection::vec(body, 0..5).prop_map(|items| {
        let plain = items.iter().all(|(_, p)| *p);
        let list = items.iter().map(|(b, _)| format!("{{{b}}}")).collect::<Vec<_>>().join(", ");
        (format!("\"items\": [{list}]"), plain)
    })
}

/// A request frame in the clients' layout, and whether it is valid and plain (then the
/// fast path must take it).
fn request() -> impl Strategy<Value = (String, bool)> {
    let op = |name: &'static str, body: (String, bool)| (format!("{{\"op\": \"{name}\", {}}}", body.0), body.1);
    prop_oneof![
        4 => reserve_body().prop_map(move |b| op("reserve", b)),
        2 => items(reserve_body()).prop_map(move |b| op("reserve_batch", b)),
        2 => complete_body().prop_map(move |b| op("complete", b)),
        3 => items(complete_body()).prop_map(move |b| op("complete_batch", b)),
        1 => id().prop_map(move |t| {
            let plain = !js(&t).contains('\\');
            op("status", (format!("\"transfer_id\": {}", js(&t)), plain))
        }),
        2 => (complete_body(), any::<Option<bool>>(), any::<Option<bool>>()).prop_map(move |(b, a, r)| {
            let mut body = b.0;
            if let Some(a) = a {
                body.push_str(&format!(", \"abandon\": {a}"));
            }
            if let Some(r) = r {
                body.push_str(&format!(", \"refresh\": {r}"));
            }
            op("cancel", (body, b.1))
        }),
        1 => Just(("{\"op\": \"peers\"}".to_string(), true)),
        1 => Just(("{\"op\": \"event_port\"}".to_string(), true)),
        1 => Just(("{\"op\": \"nonsense\"}".to_string(), false)),
    ]
}

/// Bytes that matter to a JSON scanner.
const INTERESTING: &[u8] = b" \"\\,:{}[]0123-.eEtfnu\x00\x1f\x7f\xc3\xa9\xff";

#[derive(Clone, Debug)]
enum Edit {
    Delete(usize),
    Insert(usize, u8),
    Replace(usize, u8),
    Truncate(usize),
    /// `", "` or `": "` written without its space, as `json.dumps(separators=...)` would.
    Compact(usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    let byte = proptest::sample::select(INTERESTING);
    prop_oneof![
        any::<usize>().prop_map(Edit::Delete),
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Edit::Insert(i, b)),
        (any::<usize>(), byte).prop_map(|(i, b)| Edit::Replace(i, b)),
        any::<usize>().prop_map(Edit::Truncate),
        any::<usize>().prop_map(Edit::Compact),
    ]
}

fn apply(frame: &mut Vec<u8>, edit: &Edit) {
    let at = |i: usize, len: usize| if len == 0 { 0 } else { i % len };
    match *edit {
        Edit::Delete(i) if !frame.is_empty() => {
            let i = at(i, frame.len());
            frame.remove(i);
        }
        Edit::Insert(i, b) => {
            let i = at(i, frame.len() + 1);
            frame.insert(i, b);
        }
        Edit::Replace(i, b) if !frame.is_empty() => {
            let i = at(i, frame.len());
            frame[i] = b;
        }
        Edit::Truncate(i) => frame.truncate(at(i, frame.len() + 1)),
        Edit::Compact(i) => {
            let spaces: Vec<usize> =
                (1..frame.len()).filter(|&j| frame[j] == b' ' && b",:".contains(&frame[j - 1])).collect();
            if !spaces.is_empty() {
                frame.remove(spaces[i % spaces.len()]);
            }
        }
        _ => {}
    }
}

/// Whether `frame` takes the in-place `reserve` path.
fn in_place(frame: &[u8]) -> bool {
    matches!(wire::read_request_fast(frame, wire::DEFAULT_MAX_BATCH_ITEMS), Some(Decoded::Reserve(_)))
}

/// Every decoder's fast path against its general path, on one frame.
fn check_frame(frame: &[u8], max_batch_items: usize) -> Result<(), TestCaseError> {
    let general = wire::decode_request_general(frame, max_batch_items);
    if let Some(fast) = wire::decode_request_fast(frame, max_batch_items) {
        prop_assert_eq!(Ok(fast), general.clone(), "fast request decode of {:?}", String::from_utf8_lossy(frame));
    }
    match wire::read_request_fast(frame, max_batch_items) {
        Some(Decoded::Reserve(fast)) => {
            let owned = fast.to_request();
            prop_assert_eq!(fast.as_ref(), owned.as_ref());
            prop_assert_eq!(
                Ok(Request::Reserve(Ok(owned))),
                general.clone(),
                "in-place reserve of {:?}",
                String::from_utf8_lossy(frame)
            );
        }
        Some(Decoded::CompleteBatch(items)) => {
            let items = items
                .iter()
                .map(|&(t, r)| Ok(CompleteItem { transfer_id: t.to_owned(), reservation_id: r.to_owned() }))
                .collect();
            prop_assert_eq!(
                Ok(Request::CompleteBatch(items)),
                general.clone(),
                "complete_batch scan of {:?}",
                String::from_utf8_lossy(frame)
            );
        }
        _ => {}
    }
    prop_assert_eq!(wire::decode_request(frame, max_batch_items), general);
    let parsed = wire::parse_json_general(frame);
    if let Some(value) = scan::value(frame) {
        prop_assert_eq!(Ok(value), parsed.clone(), "scan of {:?}", String::from_utf8_lossy(frame));
    }
    prop_assert_eq!(wire::parse_json(frame), parsed);
    prop_assert_eq!(wire::decode_reply(frame), wire::decode_reply_general(frame));
    let reserve = wire::decode_reply_general(frame).map(|r| r.map(|v| ReserveOutcome::from_result(&v)));
    if let Some(fast) = reserve_outcome::scan_reserve_reply(frame) {
        prop_assert_eq!(
            Ok(Ok(Ok(fast))),
            reserve.clone(),
            "reserve reply scan of {:?}",
            String::from_utf8_lossy(frame)
        );
    }
    prop_assert_eq!(reserve_outcome::decode_reserve_reply(frame), reserve);
    for expected in 0..5 {
        let general =
            wire::decode_reply_general(frame).map(|r| r.map(|v| requests::parse_complete_batch(&v, expected)));
        if let Some(fast) = requests::scan_complete_batch_reply(frame, expected) {
            prop_assert_eq!(
                Ok(Ok(Ok(fast))),
                general.clone(),
                "complete_batch reply scan of {:?}",
                String::from_utf8_lossy(frame)
            );
        }
        prop_assert_eq!(requests::decode_complete_batch_reply(frame, expected), general);
    }
    Ok(())
}

fn plain_spec() -> impl Strategy<Value = ReserveSpec> {
    (plain_id(), plain_id(), proptest::collection::vec(0u64..5000, 0..4), proptest::sample::select(DType::ALL))
        .prop_map(|(transfer_id, mm_hash, shape, dtype)| ReserveSpec { transfer_id, mm_hash, shape, dtype })
}

/// A reservation id, or none.
fn reservation_id() -> impl Strategy<Value = Option<ReservationId>> {
    proptest::option::of("[0-9a-f]{32}".prop_map(|s| ReservationId::parse(&s).unwrap()))
}

fn status() -> impl Strategy<Value = Status> {
    (
        id(),
        any::<bool>(),
        reservation_id(),
        any::<u64>(),
        proptest::collection::vec(any::<u64>(), 0..4),
        proptest::sample::select(DType::ALL),
    )
        .prop_map(|(mm_hash, ready, reservation_id, nbytes, shape, dtype)| Status {
            mm_hash: Arc::from(mm_hash.as_str()),
            ready,
            reservation_id,
            nbytes,
            shape: shape.into_boxed_slice(),
            dtype,
        })
}

fn reserve_reply() -> impl Strategy<Value = ReserveReply> {
    prop_oneof![
        (id(), id(), any::<u64>(), any::<u64>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(reservation_id, dst_session, dst_ptr, nbytes, write, ready, cached)| {
                ReserveReply::Granted(ReserveResult {
                    reservation_id,
                    dst_session,
                    dst_ptr,
                    nbytes,
                    write,
                    ready,
                    cached,
                })
            }
        ),
        any::<i64>().prop_map(|n| ReserveReply::Cancelled(CancelledResult::new(n.into()))),
    ]
}

/// Any JSON value, arbitrary-precision numbers and floats included.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<u64>().prop_map(|n| Value::Number(n.into())),
        any::<i64>().prop_map(|n| Value::Number(n.into())),
        any::<f64>().prop_map(|f| Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "-?[1-9][0-9]{19,30}".prop_map(|s| Value::Number(s.parse().unwrap())),
        id().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            proptest::collection::btree_map(id(), inner, 0..5)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Every serde shape the writer must match `serde_json` on.
#[derive(Clone, Debug, Serialize)]
enum Shapes {
    Unit,
    Newtype(String),
    Tuple(u8, i64, char),
    Struct { a: Option<u32>, b: Vec<i16> },
}

#[derive(Clone, Debug, Serialize)]
struct UnitStruct;

#[derive(Clone, Debug, Serialize)]
struct TupleStruct(i128, u128, f32);

#[derive(Debug)]
struct Bytes(Vec<u8>);

impl Serialize for Bytes {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

#[derive(Debug, Serialize)]
struct Everything {
    shapes: Vec<Shapes>,
    unit: UnitStruct,
    tuple: TupleStruct,
    bytes: Bytes,
    int_keys: BTreeMap<i32, String>,
    bool_keys: BTreeMap<bool, ()>,
    char_keys: BTreeMap<char, f64>,
    text_keys: BTreeMap<String, Option<u64>>,
    shape_keys: BTreeMap<Vec<u8>, u8>,
    #[serde(flatten)]
    extra: BTreeMap<String, Value>,
}

fn shapes() -> impl Strategy<Value = Shapes> {
    prop_oneof![
        Just(Shapes::Unit),
        id().prop_map(Shapes::Newtype),
        (any::<u8>(), any::<i64>(), any::<char>()).prop_map(|(a, b, c)| Shapes::Tuple(a, b, c)),
        (any::<Option<u32>>(), proptest::collection::vec(any::<i16>(), 0..3))
            .prop_map(|(a, b)| Shapes::Struct { a, b }),
    ]
}

fn everything() -> impl Strategy<Value = Everything> {
    (
        proptest::collection::vec(shapes(), 0..4),
        (any::<i128>(), any::<u128>(), any::<f32>()),
        proptest::collection::vec(any::<u8>(), 0..4),
        proptest::collection::btree_map(any::<i32>(), id(), 0..3),
        proptest::collection::btree_map(any::<bool>(), Just(()), 0..2),
        proptest::collection::btree_map(any::<char>(), any::<f64>(), 0..2),
        proptest::collection::btree_map(id(), any::<Option<u64>>(), 0..3),
        proptest::collection::btree_map(proptest::collection::vec(any::<u8>(), 0..2), any::<u8>(), 0..2),
        proptest::collection::btree_map(id(), json_value(), 0..2),
    )
        .prop_map(|(shapes, (a, b, c), bytes, int_keys, bool_keys, char_keys, text_keys, shape_keys, extra)| {
            Everything {
                shapes,
                unit: UnitStruct,
                tuple: TupleStruct(a, b, c),
                bytes: Bytes(bytes),
                int_keys,
                bool_keys,
                char_keys,
                text_keys,
                shape_keys,
                extra,
            }
        })
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn client_layout_frames_decode_alike_and_take_the_fast_path((frame, plain) in request(), max in 0usize..6) {
        check_frame(frame.as_bytes(), max)?;
        let small_batch = !frame.contains("\"items\": [") || frame.matches("{\"transfer_id\"").count() <= max;
        if plain && small_batch {
            prop_assert!(
                wire::decode_request_fast(frame.as_bytes(), max).is_some(),
                "valid client frame left the fast path: {}",
                frame
            );
            if frame.starts_with("{\"op\": \"complete_batch\"") {
                prop_assert!(
                    matches!(wire::read_request_fast(frame.as_bytes(), max), Some(Decoded::CompleteBatch(_))),
                    "valid complete_batch left the borrowing scan: {}",
                    frame
                );
            }
        }
        if plain && frame.starts_with("{\"op\": \"reserve\", ") {
            prop_assert!(in_place(frame.as_bytes()), "reserve left the in-place path: {}", frame);
        }
    }

    #[test]
    fn perturbed_frames_decode_alike((frame, _) in request(), edits in proptest::collection::vec(edit(), 1..4)) {
        let mut frame = frame.into_bytes();
        for e in &edits {
            apply(&mut frame, e);
        }
        check_frame(&frame, wire::DEFAULT_MAX_BATCH_ITEMS)?;
    }

    #[test]
    fn random_bytes_decode_alike(frame in proptest::collection::vec(any::<u8>(), 0..64)) {
        check_frame(&frame, wire::DEFAULT_MAX_BATCH_ITEMS)?;
    }

    #[test]
    fn rust_client_frames_take_the_fast_path(specs in proptest::collection::vec(plain_spec(), 1..4), rid in plain_id()) {
        let decode = |frame: &[u8]| wire::decode_request_fast(frame, wire::DEFAULT_MAX_BATCH_ITEMS);
        let mut reused = b"{\"op\": \"stale\"}".to_vec();
        for spec in &specs {
            let written = requests::write_reserve(&mut reused, spec);
            if let Some(frame) = requests::reserve(spec) {
                prop_assert_eq!(written, Some(()));
                prop_assert_eq!(&reused, &frame, "a reused buffer holds the same frame");
                prop_assert!(decode(&frame).is_some(), "{}", String::from_utf8_lossy(&frame));
                prop_assert!(in_place(&frame), "{}", String::from_utf8_lossy(&frame));
                check_frame(&frame, wire::DEFAULT_MAX_BATCH_ITEMS)?;
            } else {
                prop_assert_eq!(written, None);
            }
        }
        if let Some(frame) = requests::reserve_batch(&specs) {
            prop_assert!(decode(&frame).is_some(), "{}", String::from_utf8_lossy(&frame));
        }
        let t = specs[0].transfer_id.as_str();
        let batch = requests::complete_batch(specs.iter().map(|s| (s.transfer_id.as_str(), rid.as_str())));
        let scanned = match wire::read_request_fast(&batch, wire::DEFAULT_MAX_BATCH_ITEMS) {
            Some(Decoded::CompleteBatch(items)) => Some(items.len()),
            _ => None,
        };
        prop_assert_eq!(scanned, Some(specs.len()), "{}", String::from_utf8_lossy(&batch));
        check_frame(&batch, wire::DEFAULT_MAX_BATCH_ITEMS)?;
        for frame in [
            requests::complete(t, &rid),
            requests::make_cancel_request(t, &rid, false, false),
            requests::make_cancel_request(t, &rid, true, false),
            requests::make_cancel_request(t, &rid, false, true),
            requests::make_cancel_request(t, &rid, true, true),
            requests::status(t),
            requests::peers(),
            requests::event_port(),
        ] {
            prop_assert!(decode(&frame).is_some(), "{}", String::from_utf8_lossy(&frame));
            check_frame(&frame, wire::DEFAULT_MAX_BATCH_ITEMS)?;
        }
    }

    #[test]
    fn replies_are_written_and_read_back_alike(
        reply in reserve_reply(),
        batch in proptest::collection::vec(prop_oneof![reserve_reply().prop_map(ItemReply::ok), id().prop_map(ItemReply::err)], 0..4),
        completions in proptest::collection::vec((any::<bool>(), any::<bool>()), 0..4),
        status in proptest::option::of(status()),
        ports in proptest::collection::vec(any::<u16>(), 0..3),
        error in id(),
        edits in proptest::collection::vec(edit(), 0..3),
    ) {
        let completion_count = completions.len();
        let completion_list: Vec<requests::Completion> =
            completions.iter().map(|&(completed, became_ready)| requests::Completion { completed, became_ready }).collect();
        let completions: Vec<CompleteResult> =
            completions.into_iter().map(|(completed, became_ready)| CompleteResult { completed, became_ready }).collect();
        let (direct, general) = (wire::encode_reserve_ok(&reply), wire::encode_ok_general(&reply));
        prop_assert_eq!(String::from_utf8_lossy(&direct), String::from_utf8_lossy(&general));
        if let ReserveReply::Granted(g) = &reply {
            // The server's way: its dst_session written once, its minted id unescaped.
            let mut session = Vec::new();
            dumps::write_str(&mut session, &g.dst_session);
            let mut out = b"stale".to_vec();
            out.clear();
            let fields = |rid| ReserveFields {
                reservation_id: rid,
                dst_session: JsonText::Encoded(&session),
                dst_ptr: g.dst_ptr,
                nbytes: g.nbytes,
                write: g.write,
                ready: g.ready,
                last: LastFlag::Cached(g.cached),
            };
            wire::write_reserve_ok(&mut out, &fields(JsonText::Text(&g.reservation_id)));
            prop_assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&general));
            if let Some(minted) = ReservationId::parse(&g.reservation_id) {
                let quoted = format!("\"{}\"", minted.to_hex_string());
                out.clear();
                wire::write_reserve_ok(&mut out, &fields(JsonText::Encoded(quoted.as_bytes())));
                prop_assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(&general));
            }
        }
        let frames = [
            (wire::encode_ok(&reply), wire::encode_ok_general(&reply)),
            (wire::encode_ok(&Items { items: batch.clone() }), wire::encode_ok_general(&Items { items: batch })),
            (wire::encode_ok(&completions), wire::encode_ok_general(&completions)),
            (wire::encode_complete_batch_ok(&completions), wire::encode_ok_general(&Items { items: completions.clone() })),
            (wire::encode_ok(&Items { items: completions.clone() }), wire::encode_ok_general(&Items { items: completions })),
            (
                wire::encode_ok(&status.as_ref().map(StatusResult::from)),
                wire::encode_ok_general(&status.as_ref().map(StatusResult::from)),
            ),
            (wire::encode_ok(&PeersResult { ports: ports.clone() }), wire::encode_ok_general(&PeersResult { ports })),
            (wire::encode_ok(&Some(7u16)), wire::encode_ok_general(&Some(7u16))),
            (wire::encode_ok(&CancelResult { cancelled: true }), wire::encode_ok_general(&CancelResult { cancelled: true })),
            (wire::encode_err(&error), wire::encode_err_general(&error)),
        ];
        let plain = |s: &str| s.bytes().all(|c| (b' '..=b'~').contains(&c) && c != b'"' && c != b'\\');
        if let ReserveReply::Granted(g) = &reply {
            if plain(&g.reservation_id) && plain(&g.dst_session) && g.dst_ptr < 10u64.pow(19) && g.nbytes < 10u64.pow(19) {
                prop_assert!(reserve_outcome::scan_reserve_reply(&frames[0].0).is_some());
            }
        }
        let batch_reply = &frames[3].0;
        prop_assert_eq!(
            requests::scan_complete_batch_reply(batch_reply, completion_count),
            Some(completion_list.clone()),
            "{}",
            String::from_utf8_lossy(batch_reply)
        );
        for (fast, general) in frames {
            prop_assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&general));
            let mut frame = fast;
            check_frame(&frame, wire::DEFAULT_MAX_BATCH_ITEMS)?;
            for e in &edits {
                apply(&mut frame, e);
            }
            check_frame(&frame, wire::DEFAULT_MAX_BATCH_ITEMS)?;
        }
    }

    #[test]
    fn events_are_written_alike(transfer_id in id(), status in status(), shard in any::<u16>()) {
        let fast = wire::encode_event(&transfer_id, &status, shard);
        let general = wire::encode_event_general(&transfer_id, &status, shard);
        prop_assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&general));
        check_frame(&fast, wire::DEFAULT_MAX_BATCH_ITEMS)?;
    }

    #[test]
    fn events_from_the_book_are_written_alike(
        transfer_id in id(),
        mm_hash in prop_oneof!["[0-9a-f]{64}", "[0-9a-fA-F]{64}", id()],
        status in status(),
        shard in any::<u16>(),
    ) {
        let status = Status { mm_hash: Arc::from(mm_hash.as_str()), ..status };
        let stored = MmHash::new(&mm_hash);
        let view = StatusView {
            mm_hash: &stored,
            ready: status.ready,
            reservation_id: status.reservation_id,
            nbytes: status.nbytes,
            shape: &status.shape,
            dtype: status.dtype,
        };
        prop_assert_eq!(&view.to_status(), &status);
        let mut queue = b"{previous event}".to_vec();
        wire::write_event(&mut queue, &transfer_id, &view, shard);
        let general = wire::encode_event_general(&transfer_id, &status, shard);
        prop_assert_eq!(String::from_utf8_lossy(&queue[16..]), String::from_utf8_lossy(&general));
        prop_assert_eq!(&queue[..16], b"{previous event}");
    }

    #[test]
    fn any_value_is_written_alike(value in json_value()) {
        let (fast, general) = (pyjson::dumps(&value), pyjson::dumps_general(&value));
        prop_assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&general));
    }

    #[test]
    fn every_serde_shape_is_written_alike(value in everything()) {
        let (fast, general) = (pyjson::dumps(&value), pyjson::dumps_general(&value));
        prop_assert_eq!(String::from_utf8_lossy(&fast), String::from_utf8_lossy(&general));
    }
}

#[test]
fn the_benchmarked_frames_take_the_fast_path() {
    let reserve = format!(
        r#"{{"op": "reserve", "transfer_id": "{:032x}", "mm_hash": "{:064x}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}}"#,
        7, 9
    );
    assert!(wire::decode_request_fast(reserve.as_bytes(), 1).is_some());
    let reply = wire::encode_ok(&ReserveReply::Granted(ReserveResult {
        reservation_id: format!("{:032x}", 5),
        dst_session: "10.0.0.5:15417".into(),
        dst_ptr: 140213339553792,
        nbytes: 16384,
        write: true,
        ready: false,
        cached: false,
    }));
    assert!(scan::value(&reply).is_some());
    assert_eq!(wire::decode_reply(&reply).unwrap().unwrap()["dst_ptr"], 140213339553792u64);
}

/// Two shards from one seed, the same requests: `complete_batch` in the clients' layout
/// (the borrowing scan and the book's one-lookup completion) against the same batch with
/// compact separators (the general decoder), with followers, repeats and refusals.
#[test]
fn the_complete_batch_fast_path_answers_and_publishes_like_the_general_path() {
    use ctlplane_core::ec::shard::reply_result;
    use ctlplane_core::ec::{ConsumerShard, ShardConfig};
    use ctlplane_core::Instant;
    use rand_chacha::rand_core::SeedableRng;

    let shard = || {
        let mut config = ShardConfig::new(19019, 1 << 20);
        config.max_pending_events = 5;
        ConsumerShard::new(config, rand_chacha::ChaCha8Rng::seed_from_u64(3), Instant::ZERO)
    };
    let (mut fast, mut general) = (shard(), shard());
    let spec = |t: String, h: &str| ReserveSpec {
        transfer_id: t,
        mm_hash: h.into(),
        shape: vec![2, 3],
        dtype: DType::Float16,
    };
    let hex = |i: u64| format!("{i:032x}");
    let digest = "ab".repeat(32);
    let specs = vec![
        spec(hex(1), &digest), // writer with two followers
        spec(hex(2), &digest), // follower
        spec("follower two".into(), &digest),
        spec(hex(4), "plain hash"),     // writer, completed twice
        spec(hex(5), &"cd".repeat(32)), // completed with a wrong reservation id
        spec(hex(6), &"ef".repeat(32)),
        spec(hex(7), &"01".repeat(32)),
        spec(hex(8), &"23".repeat(32)),
    ];
    let now = Instant::from_secs(1);
    let frame = requests::reserve_batch(&specs).unwrap();
    let reply = fast.handle_request(&frame, now);
    assert_eq!(reply, general.handle_request(&frame, now));
    let granted = requests::parse_reserve_batch(&reply_result(&reply).unwrap(), specs.len()).unwrap();
    let rids: Vec<String> =
        granted.iter().map(|g| g.as_ref().unwrap()["reservation_id"].as_str().unwrap().to_string()).collect();
    let mut items: Vec<(&str, &str)> =
        specs.iter().zip(&rids).map(|(s, r)| (s.transfer_id.as_str(), r.as_str())).collect();
    items.swap(0, 1); // a follower completes before its writer
    items[4].1 = &rids[0];
    items.push((&specs[3].transfer_id, &rids[3]));
    items.push(("never reserved", &rids[0]));
    let batch = requests::complete_batch(items.iter().copied());
    let borrowed =
        |f: &[u8]| matches!(wire::read_request_fast(f, wire::DEFAULT_MAX_BATCH_ITEMS), Some(Decoded::CompleteBatch(_)));
    assert!(borrowed(&batch));
    let compact = String::from_utf8(batch.clone()).unwrap().replace(", ", ",").replace(": ", ":");
    assert!(!borrowed(compact.as_bytes()));
    let later = Instant::from_secs(2);
    let (a, b) = (fast.handle_request(&batch, later), general.handle_request(compact.as_bytes(), later));
    assert_eq!(String::from_utf8_lossy(&a), String::from_utf8_lossy(&b));
    assert!(String::from_utf8_lossy(&a).contains("\"became_ready\": true"));
    assert_eq!(fast.stats(), general.stats());
    assert!(fast.stats().events_dropped > 0, "{:?}", fast.stats());
    let drain = |s: &mut ConsumerShard<rand_chacha::ChaCha8Rng>| {
        let mut out = Vec::new();
        while let Some(e) = s.peek_event() {
            out.push(String::from_utf8_lossy(e).into_owned());
            s.confirm_sent();
        }
        out
    };
    let events = drain(&mut fast);
    assert_eq!(events, drain(&mut general));
    assert_eq!(events.len(), 5);
    for t in ["never reserved", specs[1].transfer_id.as_str(), specs[3].transfer_id.as_str()] {
        assert_eq!(fast.book().status(t), general.book().status(t));
    }
    fast.book().check_invariants().unwrap();
}
