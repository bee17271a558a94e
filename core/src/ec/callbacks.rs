//! The callback-mode consumer control server: the reference's request dispatch with the
//! reservation manager left to a [`ControlHandler`] (in production, a vLLM consumer's
//! Python callbacks), so an engine that keeps its own manager can still run ctlplane's
//! serving loop. Sans-IO like [`ConsumerShard`](super::ConsumerShard): a frame and the
//! time come in, the reply and queued event frames go out.
//!
//! The handler is called exactly where the reference calls its callbacks, and their
//! exceptions become the reference's error replies. Where the reference would let an
//! exception end its loop (a failing `reap`), the error is logged and serving goes on.

use super::dumps;
use super::pyjson::{repr, to_str, truthy, type_name};
use super::wire::{self, WireError};
use crate::Instant;
use serde_json::{Map, Value};
use std::collections::VecDeque;
use std::time::Duration;

/// A callback's outcome: the JSON text of its return value (as `json.dumps` writes it),
/// or the `str()` of the exception it raised.
pub type Outcome = Result<Vec<u8>, String>;

/// The reservation manager of a callback-mode server: the reference's callbacks.
pub trait ControlHandler {
    /// `reserve(item)`: the grant object.
    fn reserve(&mut self, item: &Value) -> Outcome;
    /// `status(transfer_id)`: the status object or `null`.
    fn status(&mut self, transfer_id: &str) -> Outcome;
    /// `complete(transfer_id, reservation_id)`: `(accepted, became_ready)`.
    fn complete(&mut self, transfer_id: &str, reservation_id: &str) -> Outcome;
    /// `cancel(transfer_id, reservation_id, abandon, refresh)`: whether it cancelled.
    fn cancel(&mut self, transfer_id: &str, reservation_id: &str, abandon: bool, refresh: bool) -> Outcome;
    /// `reap()`: its count is not used.
    fn reap(&mut self) -> Result<(), String>;
    /// `drain_ready()`: transfer ids that turned READY besides the completed one.
    fn drain_ready(&mut self) -> Outcome;
}

/// What a callback-mode server knows about itself.
#[derive(Clone, Debug)]
pub struct CallbackConfig {
    /// This rank's REP port; also the `shard` tag of its events.
    pub port: u16,
    /// What `peers` answers.
    pub peer_ports: Vec<u16>,
    /// Event backlog bound (drop oldest beyond it).
    pub max_pending_events: usize,
    /// Least time between two `reap` calls.
    pub reap_interval: Duration,
}

impl CallbackConfig {
    /// A lone shard on `port` with the reference's defaults.
    pub fn new(port: u16) -> Self {
        CallbackConfig {
            port,
            peer_ports: vec![port],
            max_pending_events: super::shard::MAX_PENDING_EVENTS,
            reap_interval: super::shard::REAP_INTERVAL,
        }
    }
}

/// Counters for drivers and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallbackStats {
    pub requests: u64,
    pub error_replies: u64,
    pub malformed: u64,
    pub events_dropped: u64,
    pub reap_failures: u64,
}

/// One callback-mode consumer shard: dispatch, event backlog and reap timer.
#[derive(Debug)]
pub struct CallbackServer {
    config: CallbackConfig,
    event_port: Option<u16>,
    events: VecDeque<Vec<u8>>,
    next_reap: Instant,
    stats: CallbackStats,
}

/// One item of a reserve's results: the grant's JSON text or the error text.
type ItemResult = Result<Vec<u8>, String>;

impl CallbackServer {
    /// A server whose first reap is due one interval after `now`.
    pub fn new(config: CallbackConfig, now: Instant) -> Self {
        let next_reap = now.saturating_add(config.reap_interval);
        CallbackServer { config, event_port: None, events: VecDeque::new(), next_reap, stats: CallbackStats::default() }
    }

    /// The PUSH port, once bound (what `event_port` answers; `null` before).
    pub fn set_event_port(&mut self, port: u16) {
        self.event_port = Some(port);
    }

    /// Answers one request frame; always returns a reply.
    pub fn handle_request<H: ControlHandler + ?Sized>(&mut self, frame: &[u8], handler: &mut H) -> Vec<u8> {
        self.stats.requests += 1;
        let request = match wire::parse_json(frame) {
            Ok(request) => request,
            Err(_) => {
                self.stats.malformed += 1;
                self.stats.error_replies += 1;
                return wire::encode_err(&WireError::Malformed.to_string());
            }
        };
        match self.dispatch(&request, handler) {
            Ok(result) => ok_envelope(&result),
            Err(error) => {
                self.stats.error_replies += 1;
                wire::encode_err(&error)
            }
        }
    }

    /// When `handle_timeout` is next due.
    pub fn poll_timeout(&self) -> Instant {
        self.next_reap
    }

    /// Calls `reap` if due. A failing reap is logged; the server keeps serving.
    pub fn handle_timeout<H: ControlHandler + ?Sized>(&mut self, now: Instant, handler: &mut H) {
        if now < self.next_reap {
            return;
        }
        if let Err(error) = handler.reap() {
            self.stats.reap_failures += 1;
            tracing::error!(port = self.config.port, %error, "EC Mooncake reservation reap failed");
        }
        self.next_reap = now.saturating_add(self.config.reap_interval);
    }

    /// The oldest event not yet handed to PUSH.
    pub fn peek_event(&self) -> Option<&[u8]> {
        self.events.front().map(Vec::as_slice)
    }

    /// PUSH took the event [`Self::peek_event`] returned.
    pub fn confirm_sent(&mut self) {
        self.events.pop_front();
    }

    /// Events waiting for PUSH.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    /// Counters.
    pub fn stats(&self) -> CallbackStats {
        self.stats
    }

    fn dispatch<H: ControlHandler + ?Sized>(&mut self, request: &Value, handler: &mut H) -> Result<Vec<u8>, String> {
        let Value::Object(obj) = request else {
            return Err(WireError::NotAnObject(type_name(request)).to_string());
        };
        let op = obj.get("op");
        match op.and_then(Value::as_str) {
            Some("reserve") => {
                let results = self.reserve_items(std::slice::from_ref(request), handler);
                results.into_iter().next().unwrap_or_else(|| Err(String::new()))
            }
            Some("reserve_batch") => {
                let items = py_iter(key(obj, "items")?)?;
                let results = self.reserve_items(&items, handler);
                let mut out = b"{\"items\": [".to_vec();
                for (i, result) in results.iter().enumerate() {
                    if i > 0 {
                        out.extend_from_slice(b", ");
                    }
                    match result {
                        Ok(grant) => out.extend_from_slice(&ok_envelope(grant)),
                        Err(error) => out.extend_from_slice(&wire::encode_err(error)),
                    }
                }
                out.extend_from_slice(b"]}");
                Ok(out)
            }
            Some("status") => handler.status(&to_str(key(obj, "transfer_id")?)),
            Some("event_port") => Ok(match self.event_port {
                Some(port) => port.to_string().into_bytes(),
                None => b"null".to_vec(),
            }),
            Some("peers") => {
                let ports: Vec<String> = self.config.peer_ports.iter().map(u16::to_string).collect();
                Ok(format!("{{\"ports\": [{}]}}", ports.join(", ")).into_bytes())
            }
            Some("complete") => {
                let (completed, became_ready) = self.complete_item(request, handler)?;
                Ok(completion(&completed, &became_ready))
            }
            Some("complete_batch") => {
                let items = py_iter(key(obj, "items")?)?;
                let mut out = b"{\"items\": [".to_vec();
                for (i, item) in items.iter().enumerate() {
                    let (completed, became_ready) = self.complete_item(item, handler)?;
                    if i > 0 {
                        out.extend_from_slice(b", ");
                    }
                    out.extend_from_slice(&completion(&completed, &became_ready));
                }
                out.extend_from_slice(b"]}");
                Ok(out)
            }
            Some("cancel") => {
                let transfer_id = to_str(key(obj, "transfer_id")?);
                let reservation_id = obj.get("reservation_id").map(to_str).unwrap_or_default();
                let abandon = obj.get("abandon").is_some_and(truthy);
                let refresh = obj.get("refresh").is_some_and(truthy);
                let cancelled = handler.cancel(&transfer_id, &reservation_id, abandon, refresh)?;
                let mut out = b"{\"cancelled\": ".to_vec();
                out.extend_from_slice(&cancelled);
                out.push(b'}');
                Ok(out)
            }
            _ => Err(WireError::UnknownOp(op.map_or_else(|| "None".to_string(), repr)).to_string()),
        }
    }

    /// The reference's reserve loop: each item's grant or error, and a readiness event
    /// for a grant that is already READY. A grant whose readiness could not be queued
    /// is followed by that error, as the reference appends both.
    fn reserve_items<H: ControlHandler + ?Sized>(&mut self, items: &[Value], handler: &mut H) -> Vec<ItemResult> {
        let mut results = Vec::with_capacity(items.len());
        for item in items {
            match handler.reserve(item) {
                Ok(grant) => {
                    let after = self.after_reserve(&grant, item, handler);
                    results.push(Ok(grant));
                    if let Err(error) = after {
                        results.push(Err(error));
                    }
                }
                Err(error) => results.push(Err(error)),
            }
        }
        results
    }

    /// `if reserved.get("ready"): queue_ready(str(item["transfer_id"]))`.
    fn after_reserve<H: ControlHandler + ?Sized>(
        &mut self,
        grant: &[u8],
        item: &Value,
        handler: &mut H,
    ) -> Result<(), String> {
        let grant = parse_result(grant)?;
        let Value::Object(fields) = &grant else {
            return Err(WireError::NotAnObject(type_name(&grant)).to_string());
        };
        if fields.get("ready").is_some_and(truthy) {
            let transfer_id = to_str(subscript(item, "transfer_id")?);
            self.queue_ready(&transfer_id, handler)?;
        }
        Ok(())
    }

    /// One completion: the callback's pair, then every follower `drain_ready` reports,
    /// then the completed transfer if it became READY.
    fn complete_item<H: ControlHandler + ?Sized>(
        &mut self,
        item: &Value,
        handler: &mut H,
    ) -> Result<(Value, Value), String> {
        let transfer_id = to_str(subscript(item, "transfer_id")?);
        let reservation_id = to_str(subscript(item, "reservation_id")?);
        let pair = parse_result(&handler.complete(&transfer_id, &reservation_id)?)?;
        let (completed, became_ready) = unpack_pair(&pair)?;
        let ready = parse_result(&handler.drain_ready()?)?;
        for ready_id in py_iter(&ready)? {
            self.queue_ready(&to_str(&ready_id), handler)?;
        }
        if truthy(&became_ready) {
            self.queue_ready(&transfer_id, handler)?;
        }
        Ok((completed, became_ready))
    }

    /// `{"transfer_id": id, **status(id), "shard": port}` onto the backlog, dropping the
    /// oldest event when it is full; nothing when the status is `null`.
    fn queue_ready<H: ControlHandler + ?Sized>(&mut self, transfer_id: &str, handler: &mut H) -> Result<(), String> {
        let raw = handler.status(transfer_id)?;
        let status = parse_result(&raw)?;
        let event = match &status {
            Value::Null => return Ok(()),
            Value::Object(fields) => self.encode_event(transfer_id, &raw, fields),
            other => return Err(format!("'{}' object is not a mapping", type_name(other))),
        };
        if self.events.len() >= self.config.max_pending_events.max(1) {
            self.events.pop_front();
            self.stats.events_dropped += 1;
            tracing::warn!(port = self.config.port, "EC Mooncake event backlog full; dropping the oldest readiness");
        }
        self.events.push_back(event);
        Ok(())
    }

    /// The event frame: the status's own text spliced in, so its keys keep their order.
    fn encode_event(&self, transfer_id: &str, raw: &[u8], fields: &Map<String, Value>) -> Vec<u8> {
        let inner = trim_braces(raw);
        if fields.contains_key("transfer_id") || fields.contains_key("shard") || inner.is_none() {
            // A status that overrides the envelope's keys: built as the dict display does.
            let mut event = Map::new();
            event.insert("transfer_id".into(), Value::String(transfer_id.to_string()));
            for (k, v) in fields {
                event.insert(k.clone(), v.clone());
            }
            event.insert("shard".into(), Value::from(self.config.port));
            return super::pyjson::dumps(&Value::Object(event));
        }
        let mut out = b"{\"transfer_id\": ".to_vec();
        dumps::write_str(&mut out, transfer_id);
        if let Some(inner) = inner.filter(|i| !i.is_empty()) {
            out.extend_from_slice(b", ");
            out.extend_from_slice(inner);
        }
        out.extend_from_slice(b", \"shard\": ");
        dumps::write_u64(&mut out, u64::from(self.config.port));
        out.push(b'}');
        out
    }
}

/// `{"ok": true, "result": <result>}` around a result's JSON text.
fn ok_envelope(result: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + result.len());
    out.extend_from_slice(b"{\"ok\": true, \"result\": ");
    out.extend_from_slice(result);
    out.push(b'}');
    out
}

fn completion(completed: &Value, became_ready: &Value) -> Vec<u8> {
    let mut out = b"{\"completed\": ".to_vec();
    out.extend_from_slice(&super::pyjson::dumps(completed));
    out.extend_from_slice(b", \"became_ready\": ");
    out.extend_from_slice(&super::pyjson::dumps(became_ready));
    out.push(b'}');
    out
}

/// A callback's JSON text as a value.
fn parse_result(raw: &[u8]) -> Result<Value, String> {
    wire::parse_json(raw).map_err(|_| "callback result is not JSON".to_string())
}

/// The text between an object's outer braces, trimmed.
fn trim_braces(raw: &[u8]) -> Option<&[u8]> {
    let raw = raw.trim_ascii();
    let inner = raw.strip_prefix(b"{")?.strip_suffix(b"}")?;
    Some(inner.trim_ascii())
}

/// `request[name]` of the request object: Python's `KeyError` text when absent.
fn key<'a>(obj: &'a Map<String, Value>, name: &'static str) -> Result<&'a Value, String> {
    obj.get(name).ok_or_else(|| WireError::MissingKey(name).to_string())
}

/// `item[name]` of any decoded value, with the text Python raises.
fn subscript<'a>(item: &'a Value, name: &'static str) -> Result<&'a Value, String> {
    match item {
        Value::Object(obj) => key(obj, name),
        other => Err(WireError::NotSubscriptable(type_name(other)).to_string()),
    }
}

/// What `for x in v` yields in Python: a list's items, a dict's keys, a string's
/// characters; anything else is not iterable.
fn py_iter(v: &Value) -> Result<Vec<Value>, String> {
    match v {
        Value::Array(items) => Ok(items.clone()),
        Value::Object(obj) => Ok(obj.keys().map(|k| Value::String(k.clone())).collect()),
        Value::String(s) => Ok(s.chars().map(|c| Value::String(c.to_string())).collect()),
        other => Err(WireError::NotIterable(type_name(other)).to_string()),
    }
}

/// `a, b = v`, with Python's unpacking errors.
fn unpack_pair(v: &Value) -> Result<(Value, Value), String> {
    let items = py_iter(v).map_err(|_| format!("cannot unpack non-iterable {} object", type_name(v)))?;
    match <[Value; 2]>::try_from(items) {
        Ok([a, b]) => Ok((a, b)),
        Err(items) if items.len() < 2 => Err(format!("not enough values to unpack (expected 2, got {})", items.len())),
        Err(_) => Err("too many values to unpack (expected 2)".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A toy manager: one record, READY after complete.
    #[derive(Default)]
    struct Toy {
        ready: bool,
        reaps: usize,
        fail_reserve: bool,
    }

    impl ControlHandler for Toy {
        fn reserve(&mut self, item: &Value) -> Outcome {
            if self.fail_reserve {
                return Err("EC consumer buffer pool is full".into());
            }
            let _ = subscript(item, "transfer_id")?;
            Ok(format!("{{\"write\": true, \"ready\": {}}}", self.ready).into_bytes())
        }
        fn status(&mut self, transfer_id: &str) -> Outcome {
            Ok(if transfer_id == "t" {
                format!("{{\"mm_hash\": \"m\", \"ready\": {}}}", self.ready).into_bytes()
            } else {
                b"null".to_vec()
            })
        }
        fn complete(&mut self, _: &str, _: &str) -> Outcome {
            self.ready = true;
            Ok(b"[true, true]".to_vec())
        }
        fn cancel(&mut self, _: &str, _: &str, abandon: bool, _: bool) -> Outcome {
            Ok(if abandon { b"true".to_vec() } else { b"false".to_vec() })
        }
        fn reap(&mut self) -> Result<(), String> {
            self.reaps += 1;
            Err("reap failed".into())
        }
        fn drain_ready(&mut self) -> Outcome {
            Ok(b"[]".to_vec())
        }
    }

    fn server() -> CallbackServer {
        let mut s = CallbackServer::new(CallbackConfig::new(7000), Instant::ZERO);
        s.set_event_port(7001);
        s
    }

    fn ask(s: &mut CallbackServer, toy: &mut Toy, frame: &str) -> String {
        String::from_utf8(s.handle_request(frame.as_bytes(), toy)).unwrap()
    }

    #[test]
    fn dispatches_as_the_reference() {
        let (mut s, mut toy) = (server(), Toy::default());
        assert_eq!(ask(&mut s, &mut toy, r#"{"op": "event_port"}"#), r#"{"ok": true, "result": 7001}"#);
        assert_eq!(ask(&mut s, &mut toy, r#"{"op": "peers"}"#), r#"{"ok": true, "result": {"ports": [7000]}}"#);
        assert_eq!(
            ask(&mut s, &mut toy, r#"{"op": "reserve", "transfer_id": "t"}"#),
            r#"{"ok": true, "result": {"write": true, "ready": false}}"#
        );
        assert_eq!(
            ask(&mut s, &mut toy, r#"{"op": "complete", "transfer_id": "t", "reservation_id": "r"}"#),
            r#"{"ok": true, "result": {"completed": true, "became_ready": true}}"#
        );
        assert_eq!(s.peek_event().unwrap(), br#"{"transfer_id": "t", "mm_hash": "m", "ready": true, "shard": 7000}"#);
        s.confirm_sent();
        assert_eq!(
            ask(&mut s, &mut toy, r#"{"op": "cancel", "transfer_id": "t", "abandon": 1}"#),
            r#"{"ok": true, "result": {"cancelled": true}}"#
        );
        assert_eq!(ask(&mut s, &mut toy, r#"{"op": "status", "transfer_id": "x"}"#), r#"{"ok": true, "result": null}"#);
    }

    #[test]
    fn errors_read_as_python_raises_them() {
        let (mut s, mut toy) = (server(), Toy::default());
        assert_eq!(ask(&mut s, &mut toy, "\u{1}"), r#"{"ok": false, "error": "malformed control request"}"#);
        assert_eq!(ask(&mut s, &mut toy, "[1]"), r#"{"ok": false, "error": "'list' object has no attribute 'get'"}"#);
        assert_eq!(ask(&mut s, &mut toy, r#"{"op": 5}"#), r#"{"ok": false, "error": "unknown control op: 5"}"#);
        assert_eq!(ask(&mut s, &mut toy, "{}"), r#"{"ok": false, "error": "unknown control op: None"}"#);
        assert_eq!(ask(&mut s, &mut toy, r#"{"op": "status"}"#), r#"{"ok": false, "error": "'transfer_id'"}"#);
        assert_eq!(
            ask(&mut s, &mut toy, r#"{"op": "reserve_batch", "items": 3}"#),
            r#"{"ok": false, "error": "'int' object is not iterable"}"#
        );
        assert_eq!(
            ask(&mut s, &mut toy, r#"{"op": "complete_batch", "items": ["x"]}"#),
            r#"{"ok": false, "error": "string indices must be integers, not 'str'"}"#
        );
        toy.fail_reserve = true;
        assert_eq!(
            ask(&mut s, &mut toy, r#"{"op": "reserve_batch", "items": [{"transfer_id": "a"}]}"#),
            r#"{"ok": true, "result": {"items": [{"ok": false, "error": "EC consumer buffer pool is full"}]}}"#
        );
        assert_eq!(
            ask(&mut s, &mut toy, r#"{"op": "reserve", "transfer_id": "a"}"#),
            r#"{"ok": false, "error": "EC consumer buffer pool is full"}"#
        );
    }

    #[test]
    fn a_failing_reap_is_survived_and_rescheduled() {
        let (mut s, mut toy) = (server(), Toy::default());
        s.handle_timeout(Instant::from_nanos(1), &mut toy);
        assert_eq!(toy.reaps, 0);
        s.handle_timeout(Instant::from_secs(1), &mut toy);
        assert_eq!((toy.reaps, s.stats().reap_failures), (1, 1));
        assert_eq!(s.poll_timeout(), Instant::from_secs(2));
        assert_eq!(ask(&mut s, &mut toy, r#"{"op": "event_port"}"#), r#"{"ok": true, "result": 7001}"#);
    }

    #[test]
    fn backlog_drops_the_oldest() {
        let mut s =
            CallbackServer::new(CallbackConfig { max_pending_events: 1, ..CallbackConfig::new(1) }, Instant::ZERO);
        let mut toy = Toy { ready: true, ..Toy::default() };
        ask(&mut s, &mut toy, r#"{"op": "reserve", "transfer_id": "t"}"#);
        ask(&mut s, &mut toy, r#"{"op": "reserve", "transfer_id": "t"}"#);
        assert_eq!((s.pending_events(), s.stats().events_dropped), (1, 1));
    }
}
