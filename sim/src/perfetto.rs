//! A run's trace as Chrome trace-event JSON, which <https://ui.perfetto.dev> opens: hosts
//! are processes, ZeroMQ sockets are threads (thread 0 holds a host's other events), every
//! delivered message is a flow arrow from its `zmq.send` to its `zmq.recv`, and faults and
//! oracle violations are global instant events.
//!
//! The ZeroMQ model traces a message's socket, pipe, endpoint, frame count and length, but
//! no message id, so sends and receives are paired here: per direction in order, a receive
//! takes the oldest unpaired send with the same frame count and length. The connecting side
//! names the binding host in its endpoint (`tcp://consumer0-r0:19000`); the binding side
//! names its own bind address, which identifies the direction from the other end. A message
//! lost on the way (a partition, a dropped pipe) stays unpaired and gets no arrow.

use std::collections::{BTreeMap, VecDeque};
use std::io::Write;

use serde_json::{json, Value};

use crate::trace::{Trace, TraceEvent};

/// Sends older than this are no longer offered to a receive (they were lost); keeps the
/// pairing linear when many messages are lost.
const PAIR_WINDOW_NS: u64 = 120_000_000_000;
/// Thread of a host's events that belong to no socket.
const HOST_TID: u64 = 0;
/// Process of the engine's own events (faults, verdicts): the first id.
const ENGINE: &str = "engine";

/// One side of a message.
#[derive(Clone, Debug)]
struct End {
    idx: usize,
    t_ns: u64,
    frames: String,
    len: String,
}

fn field<'a>(e: &'a TraceEvent, k: &str) -> Option<&'a str> {
    e.fields.iter().find(|(fk, _)| fk == k).map(|(_, v)| v.as_str())
}

/// `tcp://host:port` -> (host, port).
fn split_endpoint(ep: &str) -> Option<(&str, &str)> {
    ep.strip_prefix("tcp://")?.rsplit_once(':')
}

/// Pairs of trace indices (send, receive) of the messages that arrived.
pub fn pair_messages(trace: &Trace) -> Vec<(usize, usize)> {
    let hosts: std::collections::BTreeSet<&str> = trace.events.iter().map(|e| e.host.as_str()).collect();
    // Sends by (receiving host, port) from the connecting side, and by (sending host, port)
    // from the binding side.
    let mut to_binder: BTreeMap<(String, String), VecDeque<End>> = BTreeMap::new();
    let mut from_binder: BTreeMap<(String, String), VecDeque<End>> = BTreeMap::new();
    let mut pairs = Vec::new();
    for (idx, e) in trace.events.iter().enumerate() {
        let is_send = e.kind == "zmq.send";
        if !is_send && e.kind != "zmq.recv" {
            continue;
        }
        let (Some(peer), Some(frames), Some(len)) = (field(e, "peer"), field(e, "frames"), field(e, "len")) else {
            continue;
        };
        let Some((peer_host, port)) = split_endpoint(peer) else { continue };
        let named = hosts.contains(peer_host) && peer_host != e.host;
        let end = End { idx, t_ns: e.t_ns, frames: frames.to_string(), len: len.to_string() };
        let port = port.to_string();
        match (is_send, named) {
            (true, true) => to_binder.entry((peer_host.to_string(), port)).or_default().push_back(end),
            (true, false) => from_binder.entry((e.host.clone(), port)).or_default().push_back(end),
            (false, true) => {
                if let Some(q) = from_binder.get_mut(&(peer_host.to_string(), port)) {
                    if let Some(s) = take_match(q, &end) {
                        pairs.push((s, idx));
                    }
                }
            }
            (false, false) => {
                if let Some(q) = to_binder.get_mut(&(e.host.clone(), port)) {
                    if let Some(s) = take_match(q, &end) {
                        pairs.push((s, idx));
                    }
                }
            }
        }
    }
    pairs.sort_unstable();
    pairs
}

fn take_match(q: &mut VecDeque<End>, recv: &End) -> Option<usize> {
    while q.front().is_some_and(|s| s.t_ns + PAIR_WINDOW_NS < recv.t_ns) {
        q.pop_front();
    }
    let pos = q.iter().position(|s| s.t_ns <= recv.t_ns && s.frames == recv.frames && s.len == recv.len)?;
    q.remove(pos).map(|s| s.idx)
}

/// The Chrome trace-event document of `trace`.
pub fn document(trace: &Trace) -> Value {
    let mut pids: BTreeMap<&str, u64> = BTreeMap::new();
    pids.insert(ENGINE, 1);
    for e in &trace.events {
        let next = pids.len() as u64 + 1;
        pids.entry(e.host.as_str()).or_insert(next);
    }
    let mut events = Vec::new();
    // Socket names: the first `zmq.socket` of each (host, sock) names the thread.
    let mut threads: BTreeMap<(u64, u64), String> = BTreeMap::new();
    for (host, pid) in &pids {
        events.push(json!({"ph": "M", "name": "process_name", "pid": pid, "tid": HOST_TID, "args": {"name": host}}));
        events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": HOST_TID, "args": {"name": "events"}}));
    }
    let tid_of = |e: &TraceEvent| field(e, "sock").and_then(|s| s.parse::<u64>().ok()).unwrap_or(HOST_TID);
    for e in &trace.events {
        if e.kind == "zmq.socket" {
            let pid = pids[e.host.as_str()];
            let tid = tid_of(e);
            threads.entry((pid, tid)).or_insert_with(|| format!("sock {tid} {}", field(e, "kind").unwrap_or_default()));
        }
    }
    for ((pid, tid), name) in &threads {
        events.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}));
    }
    let pairs = pair_messages(trace);
    let mut flow_out: BTreeMap<usize, usize> = BTreeMap::new();
    let mut flow_in: BTreeMap<usize, usize> = BTreeMap::new();
    for (id, &(s, r)) in pairs.iter().enumerate() {
        flow_out.insert(s, id + 1);
        flow_in.insert(r, id + 1);
    }
    for (idx, e) in trace.events.iter().enumerate() {
        let pid = pids[e.host.as_str()];
        let ts = e.t_ns as f64 / 1000.0;
        let args: serde_json::Map<String, Value> =
            e.fields.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect();
        if e.kind.starts_with("fault.") || e.kind == "oracle.violation" || e.kind.starts_with("engine.") {
            let name = match field(e, "oracle") {
                Some(o) if e.kind == "oracle.violation" => format!("violation {o}"),
                _ => e.kind.clone(),
            };
            events.push(json!({"ph": "i", "s": "g", "name": name, "cat": e.kind, "pid": pid, "tid": HOST_TID, "ts": ts, "args": args}));
            continue;
        }
        let tid = tid_of(e);
        if e.kind == "zmq.send" || e.kind == "zmq.recv" {
            // A one-microsecond slice for the flow arrow to bind to.
            events.push(json!({"ph": "X", "name": e.kind, "cat": "zmq", "pid": pid, "tid": tid, "ts": ts, "dur": 1, "args": args}));
            if let Some(id) = flow_out.get(&idx) {
                events
                    .push(json!({"ph": "s", "name": "msg", "cat": "msg", "id": id, "pid": pid, "tid": tid, "ts": ts}));
            }
            if let Some(id) = flow_in.get(&idx) {
                events.push(
                    json!({"ph": "f", "bp": "e", "name": "msg", "cat": "msg", "id": id, "pid": pid, "tid": tid, "ts": ts}),
                );
            }
        } else {
            events.push(json!({"ph": "i", "s": "t", "name": e.kind, "cat": "event", "pid": pid, "tid": tid, "ts": ts, "args": args}));
        }
    }
    json!({"traceEvents": events, "displayTimeUnit": "ms"})
}

/// Writes [`document`] of `trace` to `out`.
pub fn write(trace: &Trace, out: &mut impl Write) -> std::io::Result<()> {
    serde_json::to_writer(&mut *out, &document(trace))?;
    out.flush()
}
