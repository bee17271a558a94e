//! The EC control channel's JSON, wire-compatible with the Python reference.
//!
//! Requests are decoded with the reference's lenient coercions (`str()` of ids, `bool()`
//! of flags, `int()` of sizes) and every refusal carries the text the reference's
//! `str(exc)` would put in its error reply. Replies and events are written the way
//! Python's `json.dumps` writes them, so a Python peer cannot tell the difference.

use super::dtype::DType;
use super::dumps;
use super::ids::{self, MmHash};
use super::pyjson::{self, repr, str_repr, to_int, to_str, truthy, type_name};
use super::reservations::{ReserveRef, ReserveRequest, Status, StatusView};
use super::scan::{self, Scan};
use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;

/// Most items a batch op may carry by default; bigger batches are refused whole.
pub const DEFAULT_MAX_BATCH_ITEMS: usize = 8192;

/// Why a request (or one batch item) could not be decoded. `Display` is the error text of
/// the reply, matching the reference.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum WireError {
    /// Not UTF-8, or not JSON.
    #[error("malformed control request")]
    Malformed,
    /// Valid JSON but not an object: the reference fails on `request.get`.
    #[error("'{0}' object has no attribute 'get'")]
    NotAnObject(&'static str),
    /// `op` absent or not one of the eight ops (the payload is Python's repr of it).
    #[error("unknown control op: {0}")]
    UnknownOp(String),
    /// A required key is absent (Python's `KeyError` text: the quoted key).
    #[error("'{0}'")]
    MissingKey(&'static str),
    /// A batch item is not an object: the text Python's `item["transfer_id"]` raises.
    #[error("{}", subscript_error(.0))]
    NotSubscriptable(&'static str),
    /// `items` or `shape` is not a list.
    #[error("'{0}' object is not iterable")]
    NotIterable(&'static str),
    /// `int()` of a size failed; the payload is Python's message.
    #[error("{0}")]
    BadInt(String),
    /// A payload that passes the worker's checks but that no destination can be carved
    /// for (a negative size or dimension, or more bytes than an address holds). It still
    /// goes through the reservation rules, which may answer first (a tombstone, a
    /// conflict); only where the reference would carve its destination does it fail, with
    /// the text torch raised there, and nothing is allocated.
    #[error("{}", .0.error)]
    Unplaceable(Box<Unplaceable>),
    /// `dtype` names no torch dtype.
    #[error("Unsupported torch dtype string: {0}")]
    UnsupportedDtype(String),
    /// `nbytes != prod(shape) * itemsize(dtype)` (or the product overflows).
    #[error("shape and dtype do not match nbytes")]
    ShapeMismatch,
    /// A batch larger than the configured limit.
    #[error("{op} carries {count} items; the limit is {limit}")]
    BatchTooLarge { op: &'static str, count: usize, limit: usize },
}

/// What `x["key"]` raises in Python for a non-dict `x` of type `type_name`.
fn subscript_error(type_name: &str) -> String {
    match type_name {
        "list" => "list indices must be integers or slices, not str".into(),
        "str" => "string indices must be integers, not 'str'".into(),
        other => format!("'{other}' object is not subscriptable"),
    }
}

/// One `complete` (or `complete_batch` item).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompleteItem {
    pub transfer_id: String,
    pub reservation_id: String,
}

/// A decoded control request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Peers,
    EventPort,
    Status {
        transfer_id: String,
    },
    /// A single reserve: a bad payload fails the whole request.
    Reserve(Result<ReserveRequest, WireError>),
    /// Items are decoded one by one; a bad item fails only its own entry.
    ReserveBatch(Vec<Result<ReserveRequest, WireError>>),
    /// A single complete.
    Complete(Result<CompleteItem, WireError>),
    /// Items are applied in order; the first bad item fails the reply after the items
    /// before it were applied (not atomic, as the reference).
    CompleteBatch(Vec<Result<CompleteItem, WireError>>),
    Cancel {
        transfer_id: String,
        reservation_id: String,
        abandon: bool,
        refresh: bool,
    },
}

impl Request {
    /// The op name, for logs.
    pub fn op(&self) -> &'static str {
        match self {
            Request::Peers => "peers",
            Request::EventPort => "event_port",
            Request::Status { .. } => "status",
            Request::Reserve(_) => "reserve",
            Request::ReserveBatch(_) => "reserve_batch",
            Request::Complete(_) => "complete",
            Request::CompleteBatch(_) => "complete_batch",
            Request::Cancel { .. } => "cancel",
        }
    }
}

/// A request as the shard reads it: the two bulk ops of a producer borrowed from the
/// frame when it is in the clients' exact layout, every other op (and every frame the
/// scanner leaves) owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// A valid `reserve` read in place.
    Reserve(ScannedReserve<'a>),
    /// A `complete_batch` whose `(transfer_id, reservation_id)` ids are borrowed, every
    /// item valid.
    CompleteBatch(Vec<(&'a str, &'a str)>),
    /// Any other request.
    Other(Request),
}

impl Decoded<'_> {
    /// The request, owned.
    pub fn into_request(self) -> Request {
        match self {
            Decoded::Reserve(r) => Request::Reserve(Ok(r.to_request())),
            Decoded::CompleteBatch(items) => Request::CompleteBatch(
                items
                    .into_iter()
                    .map(|(t, r)| Ok(CompleteItem { transfer_id: t.to_owned(), reservation_id: r.to_owned() }))
                    .collect(),
            ),
            Decoded::Other(request) => request,
        }
    }
}

/// Reads one request frame: the shard's one entry. A frame in the clients' layout (as the
/// Rust and Python clients write them) is read by one pass of the scanner
/// ([`read_request_fast`]); everything else, and every frame that would be refused, by
/// [`decode_request_general`].
pub fn read_request(frame: &[u8], max_batch_items: usize) -> Result<Decoded<'_>, WireError> {
    match read_request_fast(frame, max_batch_items) {
        Some(request) => Ok(request),
        None => decode_request_general(frame, max_batch_items).map(Decoded::Other),
    }
}

/// [`read_request`], owned.
pub fn decode_request(frame: &[u8], max_batch_items: usize) -> Result<Request, WireError> {
    read_request(frame, max_batch_items).map(Decoded::into_request)
}

/// [`read_request_fast`], owned.
pub fn decode_request_fast(frame: &[u8], max_batch_items: usize) -> Option<Request> {
    read_request_fast(frame, max_batch_items).map(Decoded::into_request)
}

/// The request of a frame in the clients' exact layout whose every item is valid, or
/// `None`. Whatever it returns, [`decode_request_general`] returns too: it reads only
/// printable-ASCII JSON without escapes or repeated keys, and leaves every refusal (and
/// every coercion) to the general path.
pub fn read_request_fast(frame: &[u8], max_batch_items: usize) -> Option<Decoded<'_>> {
    let mut s = Scan::new(frame);
    s.lit(b"{\"op\": ")?;
    let request = match s.str()? {
        "reserve" => {
            s.lit(b", ")?;
            Decoded::Reserve(scan_reserve_fields(&mut s)?)
        }
        "complete_batch" => {
            s.lit(b", \"items\": ")?;
            let items = s.list(|s| {
                s.lit(b"{\"transfer_id\": ")?;
                let transfer_id = s.str()?;
                s.lit(b", \"reservation_id\": ")?;
                let reservation_id = s.str()?;
                s.lit(b"}")?;
                Some((transfer_id, reservation_id))
            })?;
            s.lit(b"}")?;
            (items.len() <= max_batch_items).then_some(Decoded::CompleteBatch(items))?
        }
        "complete" => {
            s.lit(b", ")?;
            Decoded::Other(Request::Complete(Ok(scan_complete(&mut s)?)))
        }
        "reserve_batch" => {
            s.lit(b", \"items\": ")?;
            let items = s.list(|s| {
                s.lit(b"{")?;
                scan_reserve(s).map(Ok)
            })?;
            s.lit(b"}")?;
            (items.len() <= max_batch_items).then_some(Decoded::Other(Request::ReserveBatch(items)))?
        }
        "status" => {
            s.lit(b", \"transfer_id\": ")?;
            let transfer_id = s.str()?.to_owned();
            s.lit(b"}")?;
            Decoded::Other(Request::Status { transfer_id })
        }
        "cancel" => {
            s.lit(b", \"transfer_id\": ")?;
            let transfer_id = s.str()?.to_owned();
            s.lit(b", \"reservation_id\": ")?;
            let reservation_id = s.str()?.to_owned();
            let abandon = if s.eat(b", \"abandon\": ") { s.bool()? } else { false };
            let refresh = if s.eat(b", \"refresh\": ") { s.bool()? } else { false };
            s.lit(b"}")?;
            Decoded::Other(Request::Cancel { transfer_id, reservation_id, abandon, refresh })
        }
        "peers" => {
            s.lit(b"}")?;
            Decoded::Other(Request::Peers)
        }
        "event_port" => {
            s.lit(b"}")?;
            Decoded::Other(Request::EventPort)
        }
        _ => return None,
    };
    s.end()?;
    Some(request)
}

/// Most dimensions a scanned reserve payload holds inline; a tensor of more takes the
/// general path.
pub const INLINE_DIMS: usize = 8;

/// A valid reserve payload read in place: ids borrowed from the frame, the shape inline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScannedReserve<'a> {
    transfer_id: &'a str,
    mm_hash: &'a str,
    nbytes: u64,
    dims: [u64; INLINE_DIMS],
    rank: usize,
    dtype: DType,
}

impl ScannedReserve<'_> {
    /// The payload as the reservation book takes it.
    pub fn as_ref(&self) -> ReserveRef<'_> {
        ReserveRef {
            transfer_id: self.transfer_id,
            mm_hash: self.mm_hash,
            nbytes: self.nbytes,
            shape: &self.dims[..self.rank],
            dtype: self.dtype,
        }
    }

    /// The payload as an owned request.
    pub fn to_request(&self) -> ReserveRequest {
        ReserveRequest {
            transfer_id: self.transfer_id.to_owned(),
            mm_hash: self.mm_hash.to_owned(),
            nbytes: self.nbytes,
            shape: self.dims[..self.rank].to_vec(),
            dtype: self.dtype,
        }
    }
}

/// `"transfer_id": .., "mm_hash": .., "nbytes": .., "shape": [..], "dtype": ..}` of a
/// valid reserve payload (the caller has read the opening brace, or the op and its
/// separator).
fn scan_reserve_fields<'a>(s: &mut Scan<'a>) -> Option<ScannedReserve<'a>> {
    s.lit(b"\"transfer_id\": ")?;
    let transfer_id = s.str()?;
    s.lit(b", \"mm_hash\": ")?;
    let mm_hash = s.str()?;
    s.lit(b", \"nbytes\": ")?;
    let nbytes = s.uint()?;
    s.lit(b", \"shape\": [")?;
    let mut dims = [0u64; INLINE_DIMS];
    let mut rank = 0;
    if !s.eat(b"]") {
        loop {
            *dims.get_mut(rank)? = s.uint()?;
            rank += 1;
            if !s.eat(b", ") {
                s.lit(b"]")?;
                break;
            }
        }
    }
    s.lit(b", \"dtype\": ")?;
    let dtype = DType::from_name(s.str()?)?;
    s.lit(b"}")?;
    let expected = dims[..rank].iter().try_fold(dtype.itemsize(), |acc, &d| acc.checked_mul(d));
    (expected == Some(nbytes)).then_some(ScannedReserve { transfer_id, mm_hash, nbytes, dims, rank, dtype })
}

/// [`scan_reserve_fields`] into an owned request.
fn scan_reserve(s: &mut Scan<'_>) -> Option<ReserveRequest> {
    scan_reserve_fields(s).map(|r| r.to_request())
}

/// `"transfer_id": .., "reservation_id": ..}` (after the opening brace, or the op and
/// its separator).
fn scan_complete(s: &mut Scan<'_>) -> Option<CompleteItem> {
    s.lit(b"\"transfer_id\": ")?;
    let transfer_id = s.str()?;
    s.lit(b", \"reservation_id\": ")?;
    let reservation_id = s.str()?;
    s.lit(b"}")?;
    Some(CompleteItem { transfer_id: transfer_id.to_owned(), reservation_id: reservation_id.to_owned() })
}

/// Decodes one request frame through a `serde_json::Value`, with every coercion and
/// refusal of the reference.
pub fn decode_request_general(frame: &[u8], max_batch_items: usize) -> Result<Request, WireError> {
    let value = parse_json(frame)?;
    let Value::Object(obj) = value else {
        return Err(WireError::NotAnObject(type_name(&value)));
    };
    let op = obj.get("op").unwrap_or(&Value::Null);
    let Value::String(name) = op else {
        return Err(WireError::UnknownOp(repr(op)));
    };
    Ok(match name.as_str() {
        "peers" => Request::Peers,
        "event_port" => Request::EventPort,
        "status" => Request::Status { transfer_id: to_str(key(&obj, "transfer_id")?) },
        "reserve" => Request::Reserve(decode_reserve(&Value::Object(obj))),
        "reserve_batch" => {
            let items = batch_items(&obj, "reserve_batch", max_batch_items)?;
            Request::ReserveBatch(items.iter().map(|item| decode_reserve(item)).collect())
        }
        "complete" => Request::Complete(decode_complete(&Value::Object(obj))),
        "complete_batch" => {
            let items = batch_items(&obj, "complete_batch", max_batch_items)?;
            Request::CompleteBatch(items.iter().map(|item| decode_complete(item)).collect())
        }
        "cancel" => Request::Cancel {
            transfer_id: to_str(key(&obj, "transfer_id")?),
            reservation_id: obj.get("reservation_id").map(to_str).unwrap_or_default(),
            abandon: obj.get("abandon").is_some_and(truthy),
            refresh: obj.get("refresh").is_some_and(truthy),
        },
        _ => return Err(WireError::UnknownOp(repr(op))),
    })
}

/// `json.loads` of a UTF-8 frame, lone surrogates included.
///
/// Frames in the `json.dumps` layout are read by [`scan::value`], which gives the same
/// value; the rest go through `serde_json`.
pub fn parse_json(frame: &[u8]) -> Result<Value, WireError> {
    if let Some(value) = scan::value(frame) {
        return Ok(value);
    }
    parse_json_general(frame)
}

/// Deepest nesting of arrays and objects read. Python's `json.loads` reads deeper
/// frames until its recursion limit (just under 1000 levels for CPython 3.11, less the
/// caller's own stack); anything deeper is `malformed control request` there too.
pub const MAX_NESTING: usize = 900;

/// [`parse_json`] through `serde_json` alone, with what `json.loads` accepts beyond
/// strict JSON: lone surrogate escapes, the `NaN`, `Infinity` and `-Infinity` constants,
/// and nesting up to [`MAX_NESTING`]. An integer literal of more than
/// [`pyjson::INT_MAX_STR_DIGITS`] digits fails, as Python's `int` conversion does.
pub fn parse_json_general(frame: &[u8]) -> Result<Value, WireError> {
    let text = std::str::from_utf8(frame).map_err(|_| WireError::Malformed)?;
    if nesting_depth(text) > MAX_NESTING {
        return Err(WireError::Malformed);
    }
    let value = match from_str_deep(text) {
        Ok(v) => v,
        Err(_) => {
            let constants = pyjson::mark_constants(text);
            let text = constants.as_ref().map_or(text, |(t, _)| t.as_str());
            let carried = pyjson::carry_lone_surrogates(text);
            let text = carried.as_deref().unwrap_or(text);
            if constants.is_none() && carried.is_none() {
                return Err(WireError::Malformed);
            }
            let mut value = from_str_deep(text).map_err(|_| WireError::Malformed)?;
            if let Some((_, marks)) = &constants {
                marks.restore(&mut value);
            }
            value
        }
    };
    if pyjson::has_overlong_int(&value) {
        return Err(WireError::Malformed);
    }
    Ok(value)
}

/// `serde_json` without its own nesting limit ([`nesting_depth`] bounds it first).
fn from_str_deep(text: &str) -> serde_json::Result<Value> {
    use serde::Deserialize as _;
    let mut de = serde_json::Deserializer::from_str(text);
    de.disable_recursion_limit();
    let value = Value::deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// The deepest nesting of `[`/`{` outside strings.
fn nesting_depth(text: &str) -> usize {
    let (mut depth, mut max, mut in_str, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_str {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_str = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

fn key<'a>(obj: &'a Map<String, Value>, name: &'static str) -> Result<&'a Value, WireError> {
    obj.get(name).ok_or(WireError::MissingKey(name))
}

/// The items of a batch op as Python's `for item in request["items"]` sees them: a
/// list's items, a string's characters, a dict's keys.
fn batch_items<'a>(
    obj: &'a Map<String, Value>,
    op: &'static str,
    limit: usize,
) -> Result<Vec<std::borrow::Cow<'a, Value>>, WireError> {
    let items = key(obj, "items")?;
    match pyjson::iter_len(items) {
        Some(count) if count > limit => Err(WireError::BatchTooLarge { op, count, limit }),
        _ => pyjson::iterate(items).map_err(WireError::NotIterable),
    }
}

fn item_object(item: &Value) -> Result<&Map<String, Value>, WireError> {
    match item {
        Value::Object(obj) => Ok(obj),
        other => Err(WireError::NotSubscriptable(type_name(other))),
    }
}

/// A reserve payload no destination can be carved for; see [`WireError::Unplaceable`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unplaceable {
    pub transfer_id: String,
    pub mm_hash: String,
    /// The requested size, echoed by a tombstone's `cancelled` reply.
    pub nbytes: i128,
    /// What the reference raises where it carves the destination.
    pub error: String,
}

/// Validates one reserve payload as the reference worker does before reserving:
/// `int()` of `nbytes` and of every item of `shape` (any iterable), the dtype name looked
/// up on `torch`, and `prod(shape) * itemsize == nbytes`.
pub fn decode_reserve(item: &Value) -> Result<ReserveRequest, WireError> {
    let obj = item_object(item)?;
    let transfer_id = to_str(key(obj, "transfer_id")?);
    let mm_hash = to_str(key(obj, "mm_hash")?);
    let nbytes = to_int(key(obj, "nbytes")?).map_err(WireError::BadInt)?;
    let dims = pyjson::iterate(key(obj, "shape")?)
        .map_err(WireError::NotIterable)?
        .iter()
        .map(|d| to_int(d).map_err(WireError::BadInt))
        .collect::<Result<Vec<i128>, _>>()?;
    let dtype_name = to_str(key(obj, "dtype")?);
    let dtype = DType::from_name(&dtype_name).ok_or_else(|| WireError::UnsupportedDtype(str_repr(&dtype_name)))?;
    let expected = dims.iter().try_fold(i128::from(dtype.itemsize()), |acc, &d| acc.checked_mul(d));
    if expected != Some(nbytes) {
        return Err(WireError::ShapeMismatch);
    }
    let shape: Option<Vec<u64>> = dims.iter().map(|&d| u64::try_from(d).ok()).collect();
    match (u64::try_from(nbytes).ok(), shape) {
        (Some(nbytes), Some(shape)) => Ok(ReserveRequest { transfer_id, mm_hash, nbytes, shape, dtype }),
        _ => Err(WireError::Unplaceable(Box::new(Unplaceable {
            transfer_id,
            mm_hash,
            nbytes,
            error: view_error(nbytes, &dims),
        }))),
    }
}

/// What the reference raises carving a destination of `nbytes` viewed as `dims`:
/// `narrow()` refuses a negative length; `view()` then applies torch's shape inference
/// (one `-1` may be inferred, other negative sizes are invalid). More bytes than an
/// address holds cannot be allocated at all.
fn view_error(nbytes: i128, dims: &[i128]) -> String {
    if nbytes < 0 {
        return "narrow(): length must be non-negative.".into();
    }
    let mut inferred = false;
    for &d in dims {
        if d == -1 {
            if inferred {
                return "only one dimension can be inferred".into();
            }
            inferred = true;
        } else if d < 0 {
            return format!("invalid shape dimension {d}");
        }
    }
    if inferred {
        // One `-1` and no other negative size: the product is zero, so is `nbytes`.
        let shape: Vec<String> = dims.iter().map(i128::to_string).collect();
        return format!(
            "cannot reshape tensor of 0 elements into shape [{}] because the unspecified dimension size -1 can be any \
             value and is ambiguous",
            shape.join(", ")
        );
    }
    "EC consumer buffer pool is full".into()
}

fn decode_complete(item: &Value) -> Result<CompleteItem, WireError> {
    let obj = item_object(item)?;
    Ok(CompleteItem {
        transfer_id: to_str(key(obj, "transfer_id")?),
        reservation_id: to_str(key(obj, "reservation_id")?),
    })
}

/// Result of a granted `reserve`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ReserveResult {
    pub reservation_id: String,
    pub dst_session: String,
    pub dst_ptr: u64,
    pub nbytes: u64,
    pub write: bool,
    pub ready: bool,
    pub cached: bool,
}

/// Result of a `reserve` the consumer had already cancelled.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct CancelledResult {
    pub reservation_id: &'static str,
    pub dst_session: &'static str,
    pub dst_ptr: u64,
    /// The requested size as the request gave it (negative for an unplaceable one).
    pub nbytes: i128,
    pub write: bool,
    pub ready: bool,
    pub cancelled: bool,
}

impl CancelledResult {
    /// The reference's fixed shape, echoing the requested size.
    pub fn new(nbytes: i128) -> Self {
        CancelledResult {
            reservation_id: "",
            dst_session: "",
            dst_ptr: 0,
            nbytes,
            write: false,
            ready: false,
            cancelled: true,
        }
    }
}

/// Either reserve result.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum ReserveReply {
    Granted(ReserveResult),
    Cancelled(CancelledResult),
}

/// `complete` result.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct CompleteResult {
    pub completed: bool,
    pub became_ready: bool,
}

/// One entry of a batch reply: `{"ok": true, "result": ...}` or `{"ok": false, "error": ...}`.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum ItemReply<T> {
    Ok { ok: bool, result: T },
    Err { ok: bool, error: String },
}

impl<T> ItemReply<T> {
    pub fn ok(result: T) -> Self {
        ItemReply::Ok { ok: true, result }
    }
    pub fn err(error: impl ToString) -> Self {
        ItemReply::Err { ok: false, error: error.to_string() }
    }
}

/// `{"items": [...]}` of the batch ops.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct Items<T> {
    pub items: Vec<T>,
}

/// `peers` result.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct PeersResult {
    pub ports: Vec<u16>,
}

/// `cancel` result.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct CancelResult {
    pub cancelled: bool,
}

/// The status object, in the reference's key order.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StatusResult<'a> {
    pub mm_hash: &'a str,
    pub ready: bool,
    pub reservation_id: String,
    pub nbytes: u64,
    pub shape: &'a [u64],
    pub dtype: &'static str,
}

impl<'a> From<&'a Status> for StatusResult<'a> {
    fn from(s: &'a Status) -> Self {
        StatusResult {
            mm_hash: &s.mm_hash,
            ready: s.ready,
            reservation_id: s.reservation_id.map(|r| r.to_string()).unwrap_or_default(),
            nbytes: s.nbytes,
            shape: &s.shape,
            dtype: s.dtype.name(),
        }
    }
}

/// A readiness event: transfer id first, the status object, the shard's REP port last.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ReadyEvent<'a> {
    pub transfer_id: &'a str,
    pub mm_hash: &'a str,
    pub ready: bool,
    pub reservation_id: String,
    pub nbytes: u64,
    pub shape: &'a [u64],
    pub dtype: &'static str,
    pub shard: u16,
}

/// Encodes the readiness event of `transfer_id` from its status, as `json.dumps` of
/// [`ReadyEvent`] writes it (see [`encode_event_general`]), without the intermediate copies.
pub fn encode_event(transfer_id: &str, status: &Status, shard: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(192 + transfer_id.len() + status.mm_hash.len());
    write_event_fields(&mut out, transfer_id, |out| dumps::write_str(out, &status.mm_hash), status, shard);
    out
}

/// [`encode_event`] of a borrowed status, appended to `out` (the shard's event queue):
/// the same bytes, without an owned status or a buffer of its own.
pub fn write_event(out: &mut Vec<u8>, transfer_id: &str, status: &StatusView<'_>, shard: u16) {
    let mm_hash = |out: &mut Vec<u8>| match status.mm_hash {
        MmHash::Hex(bytes) => {
            // Lowercase hex digits need no escape.
            let mut hex = [0u8; 66];
            hex[0] = b'"';
            hex[65] = b'"';
            ids::hex_into(&mut hex[1..65], bytes);
            out.extend_from_slice(&hex);
        }
        MmHash::Text(text) => dumps::write_str(out, text),
    };
    let fields = EventFields {
        ready: status.ready,
        reservation_id: status.reservation_id,
        nbytes: status.nbytes,
        shape: status.shape,
        dtype: status.dtype,
    };
    write_event_fields(out, transfer_id, mm_hash, fields, shard);
}

/// The fields of an event after its `mm_hash`, owned or borrowed.
struct EventFields<'a> {
    ready: bool,
    reservation_id: Option<super::ids::ReservationId>,
    nbytes: u64,
    shape: &'a [u64],
    dtype: DType,
}

impl<'a> From<&'a Status> for EventFields<'a> {
    fn from(s: &'a Status) -> Self {
        EventFields {
            ready: s.ready,
            reservation_id: s.reservation_id,
            nbytes: s.nbytes,
            shape: &s.shape,
            dtype: s.dtype,
        }
    }
}

#[inline]
fn write_event_fields<'a>(
    out: &mut Vec<u8>,
    transfer_id: &str,
    mm_hash: impl FnOnce(&mut Vec<u8>),
    status: impl Into<EventFields<'a>>,
    shard: u16,
) {
    let status: EventFields<'a> = status.into();
    out.reserve(192 + transfer_id.len());
    out.extend_from_slice(b"{\"transfer_id\": ");
    dumps::write_str(out, transfer_id);
    out.extend_from_slice(b", \"mm_hash\": ");
    mm_hash(out);
    out.extend_from_slice(if status.ready { b", \"ready\": true" } else { b", \"ready\": false" });
    out.extend_from_slice(b", \"reservation_id\": \"");
    if let Some(id) = status.reservation_id {
        out.extend_from_slice(&id.to_hex());
    }
    out.extend_from_slice(b"\", \"nbytes\": ");
    dumps::write_u64(out, status.nbytes);
    out.extend_from_slice(b", \"shape\": [");
    for (i, d) in status.shape.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        dumps::write_u64(out, *d);
    }
    out.extend_from_slice(b"], \"dtype\": \"");
    // Canonical dtype names are plain ASCII identifiers.
    out.extend_from_slice(status.dtype.name().as_bytes());
    out.extend_from_slice(b"\", \"shard\": ");
    dumps::write_u64(out, u64::from(shard));
    out.push(b'}');
}

/// [`encode_event`] through [`ReadyEvent`] and `serde_json`.
pub fn encode_event_general(transfer_id: &str, status: &Status, shard: u16) -> Vec<u8> {
    let s = StatusResult::from(status);
    pyjson::dumps_general(&ReadyEvent {
        transfer_id,
        mm_hash: s.mm_hash,
        ready: s.ready,
        reservation_id: s.reservation_id,
        nbytes: s.nbytes,
        shape: s.shape,
        dtype: s.dtype,
        shard,
    })
}

#[derive(Serialize)]
struct OkEnvelope<'a, T: Serialize> {
    ok: bool,
    result: &'a T,
}

#[derive(Serialize)]
struct ErrEnvelope<'a> {
    ok: bool,
    error: &'a str,
}

/// `{"ok": true, "result": <result>}`.
pub fn encode_ok<T: Serialize>(result: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    out.extend_from_slice(b"{\"ok\": true, \"result\": ");
    match dumps::write(&mut out, result) {
        Ok(()) => {
            out.push(b'}');
            out
        }
        Err(_) => encode_ok_general(result),
    }
}

/// [`encode_ok`] of a `reserve` result, written field by field in one pass (the serde
/// writer's generic path costs several times more); the same bytes as
/// [`encode_ok_general`].
pub fn encode_reserve_ok(reply: &ReserveReply) -> Vec<u8> {
    let fields = match reply {
        ReserveReply::Granted(r) => ReserveFields {
            reservation_id: JsonText::Text(&r.reservation_id),
            dst_session: JsonText::Text(&r.dst_session),
            dst_ptr: r.dst_ptr,
            nbytes: r.nbytes,
            write: r.write,
            ready: r.ready,
            last: LastFlag::Cached(r.cached),
        },
        ReserveReply::Cancelled(c) => ReserveFields {
            reservation_id: JsonText::Text(c.reservation_id),
            dst_session: JsonText::Text(c.dst_session),
            dst_ptr: c.dst_ptr,
            nbytes: match u64::try_from(c.nbytes) {
                Ok(n) => n,
                // A negative echo is rare enough for the general writer.
                Err(_) => return encode_ok_general(reply),
            },
            write: c.write,
            ready: c.ready,
            last: LastFlag::Cancelled(c.cancelled),
        },
    };
    let mut out = Vec::new();
    write_reserve_ok(&mut out, &fields);
    out
}

/// A string field of a reply: text to write as a JSON string, or one already written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonText<'a> {
    /// Escaped as `json.dumps` does on the way out.
    Text(&'a str),
    /// A JSON string as [`dumps::write_str`] writes it, quotes included: a server writes
    /// its fixed `dst_session` once, and a minted id needs no escape.
    Encoded(&'a [u8]),
}

impl JsonText<'_> {
    fn write(self, out: &mut Vec<u8>) {
        match self {
            JsonText::Text(s) => dumps::write_str(out, s),
            JsonText::Encoded(b) => out.extend_from_slice(b),
        }
    }
}

/// The fields of a `reserve` result, borrowed, for [`write_reserve_ok`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReserveFields<'a> {
    pub reservation_id: JsonText<'a>,
    pub dst_session: JsonText<'a>,
    pub dst_ptr: u64,
    pub nbytes: u64,
    pub write: bool,
    pub ready: bool,
    /// The last key: `cached` of a grant, `cancelled` of the cancelled shape.
    pub last: LastFlag,
}

/// The last key of a `reserve` result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastFlag {
    Cached(bool),
    Cancelled(bool),
}

/// Appends [`encode_reserve_ok`]'s bytes for `fields` to `out`, so that a server can
/// write its reply without building a [`ReserveResult`] (two strings) first.
pub fn write_reserve_ok(out: &mut Vec<u8>, fields: &ReserveFields<'_>) {
    out.reserve(256);
    out.extend_from_slice(b"{\"ok\": true, \"result\": {\"reservation_id\": ");
    fields.reservation_id.write(out);
    out.extend_from_slice(b", \"dst_session\": ");
    fields.dst_session.write(out);
    out.extend_from_slice(b", \"dst_ptr\": ");
    dumps::write_u64(out, fields.dst_ptr);
    out.extend_from_slice(b", \"nbytes\": ");
    dumps::write_u64(out, fields.nbytes);
    // The flags in two pieces rather than seven.
    const WRITE_READY: [&[u8]; 4] = [
        b", \"write\": false, \"ready\": false",
        b", \"write\": false, \"ready\": true",
        b", \"write\": true, \"ready\": false",
        b", \"write\": true, \"ready\": true",
    ];
    out.extend_from_slice(WRITE_READY[usize::from(fields.write) * 2 + usize::from(fields.ready)]);
    out.extend_from_slice(match fields.last {
        LastFlag::Cached(false) => b", \"cached\": false}}",
        LastFlag::Cached(true) => b", \"cached\": true}}",
        LastFlag::Cancelled(false) => b", \"cancelled\": false}}",
        LastFlag::Cancelled(true) => b", \"cancelled\": true}}",
    });
}

/// [`encode_ok`] of a `complete_batch` result, `{"items": [...]}`, written in one pass.
pub fn encode_complete_batch_ok(results: &[CompleteResult]) -> Vec<u8> {
    let mut out = Vec::with_capacity(40 + 45 * results.len());
    out.extend_from_slice(b"{\"ok\": true, \"result\": {\"items\": [");
    for (i, r) in results.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(match (r.completed, r.became_ready) {
            (true, true) => b"{\"completed\": true, \"became_ready\": true}",
            (true, false) => b"{\"completed\": true, \"became_ready\": false}",
            (false, true) => b"{\"completed\": false, \"became_ready\": true}",
            (false, false) => b"{\"completed\": false, \"became_ready\": false}",
        });
    }
    out.extend_from_slice(b"]}}");
    out
}

/// [`encode_ok`] through `serde_json`.
pub fn encode_ok_general<T: Serialize>(result: &T) -> Vec<u8> {
    pyjson::dumps_general(&OkEnvelope { ok: true, result })
}

/// `{"ok": false, "error": <error>}`.
pub fn encode_err(error: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(32 + error.len());
    out.extend_from_slice(b"{\"ok\": false, \"error\": ");
    dumps::write_str(&mut out, error);
    out.push(b'}');
    out
}

/// [`encode_err`] through `serde_json`.
pub fn encode_err_general(error: &str) -> Vec<u8> {
    pyjson::dumps_general(&ErrEnvelope { ok: false, error })
}

/// A reply as a client reads it: `Ok(result)` or `Err(error text)`, with the reference
/// client's rules (falsy `ok` is an error, a missing error text gets a generic one).
///
/// A success in the server's layout (`{"ok": true, "result": ...}`, as `json.dumps`
/// writes it) is read without building the envelope; the rest take
/// [`decode_reply_general`].
pub fn decode_reply(frame: &[u8]) -> Result<Result<Value, String>, WireError> {
    let mut s = Scan::new(frame);
    if s.eat(b"{\"ok\": true, \"result\": ") {
        if let Some(result) = s.value(1) {
            if s.eat(b"}") && s.end().is_some() {
                return Ok(Ok(result));
            }
        }
    }
    decode_reply_general(frame)
}

/// [`decode_reply`] through a whole parsed frame.
pub fn decode_reply_general(frame: &[u8]) -> Result<Result<Value, String>, WireError> {
    let value = parse_json(frame)?;
    let Value::Object(mut obj) = value else {
        return Err(WireError::NotAnObject(type_name(&value)));
    };
    if obj.get("ok").is_some_and(truthy) {
        Ok(Ok(obj.remove("result").unwrap_or(Value::Null)))
    } else {
        Ok(Err(match obj.remove("error") {
            Some(Value::String(s)) => s,
            Some(other) => to_str(&other),
            None => "EC control request failed".into(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Result<Request, WireError> {
        decode_request(s.as_bytes(), DEFAULT_MAX_BATCH_ITEMS)
    }

    #[test]
    fn python_send_json_frames_decode() {
        let req = dec(
            r#"{"op": "reserve", "transfer_id": "t\u00e9", "mm_hash": "h", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}"#,
        );
        let Ok(Request::Reserve(Ok(r))) = req else { panic!("{req:?}") };
        assert_eq!(r.transfer_id, "té");
        assert_eq!((r.nbytes, r.shape.as_slice(), r.dtype), (16384, &[64u64, 128][..], DType::Float16));
    }

    #[test]
    fn lenient_coercions_match_the_reference() {
        let Ok(Request::Reserve(Ok(r))) = dec(
            r#"{"op": "reserve", "transfer_id": 5, "mm_hash": "h", "nbytes": "16", "shape": [2.0, "4"], "dtype": "float16"}"#,
        ) else {
            panic!()
        };
        assert_eq!((r.transfer_id.as_str(), r.nbytes, r.shape), ("5", 16, vec![2, 4]));
        let req = dec(r#"{"op": "cancel", "transfer_id": null, "abandon": "false", "refresh": 0}"#).unwrap();
        assert_eq!(
            req,
            Request::Cancel {
                transfer_id: "None".into(),
                reservation_id: String::new(),
                abandon: true,
                refresh: false
            }
        );
    }

    #[test]
    fn refusals_carry_the_reference_text() {
        let text = |s: &str| dec(s).unwrap_err().to_string();
        assert_eq!(text("{not json"), "malformed control request");
        assert_eq!(text("[]"), "'list' object has no attribute 'get'");
        assert_eq!(text("\"x\""), "'str' object has no attribute 'get'");
        assert_eq!(text("{}"), "unknown control op: None");
        assert_eq!(text(r#"{"op": "nonsense"}"#), "unknown control op: 'nonsense'");
        assert_eq!(text(r#"{"op": 5}"#), "unknown control op: 5");
        assert_eq!(text(r#"{"op": "status"}"#), "'transfer_id'");
        assert_eq!(text(r#"{"op": "reserve_batch"}"#), "'items'");
        assert!(decode_request(&[0xff, 0xfe], 1).is_err());
    }

    #[test]
    fn replies_are_python_json() {
        assert_eq!(encode_err("malformed control request"), br#"{"ok": false, "error": "malformed control request"}"#);
        assert_eq!(
            encode_ok(&PeersResult { ports: vec![19019, 19020] }),
            br#"{"ok": true, "result": {"ports": [19019, 19020]}}"#
        );
        assert_eq!(encode_ok(&Value::Null), br#"{"ok": true, "result": null}"#);
        assert_eq!(
            encode_ok(&ReserveReply::Cancelled(CancelledResult::new(64))),
            br#"{"ok": true, "result": {"reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": 64, "write": false, "ready": false, "cancelled": true}}"#
        );
    }
}
