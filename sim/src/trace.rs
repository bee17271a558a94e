//! The run's trace: every observable event, in the order it happened, and its hash.
//!
//! Two runs of one seed on one build must give the same hash; the determinism test and
//! `ctlsim replay` compare it. Events are plain strings so that the hash covers exactly
//! what a person reads in the JSON-lines export.

use std::cell::RefCell;
use std::fmt::Display;
use std::io::Write;

use serde::Serialize;

/// One observable event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TraceEvent {
    /// Simulated nanoseconds since the start of the run.
    pub t_ns: u64,
    /// turmoil host name (`"engine"` for the engine's own events: faults, oracle verdicts).
    pub host: String,
    /// What happened, e.g. `"zmq.send"`, `"ec.reply"`, `"fault.partition"`.
    pub kind: String,
    pub fields: Vec<(String, String)>,
}

/// A finished run's events.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub events: Vec<TraceEvent>,
    hash: u64,
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    // Separator, so that ("ab","c") and ("a","bc") differ.
    h ^= 0xff;
    h.wrapping_mul(FNV_PRIME)
}

#[derive(Default)]
struct Recorder {
    events: Vec<TraceEvent>,
    hash: u64,
    /// Keep events in memory (for export); the hash is always kept.
    keep: bool,
    count: u64,
}

thread_local! {
    static RECORDER: RefCell<Recorder> = RefCell::new(Recorder { hash: FNV_OFFSET, ..Recorder::default() });
}

/// Start a fresh trace. `keep` keeps every event for export (costs memory); the hash is
/// computed either way.
pub fn reset(keep: bool) {
    RECORDER.with(|r| *r.borrow_mut() = Recorder { hash: FNV_OFFSET, keep, ..Recorder::default() });
}

/// Record one event at simulated time `t_ns`.
pub fn record_at(t_ns: u64, host: &str, kind: &str, fields: &[(&str, &dyn Display)]) {
    RECORDER.with(|r| {
        let mut r = r.borrow_mut();
        let mut h = fnv(r.hash, &t_ns.to_le_bytes());
        h = fnv(h, host.as_bytes());
        h = fnv(h, kind.as_bytes());
        let mut owned = Vec::new();
        for (k, v) in fields {
            let v = v.to_string();
            h = fnv(h, k.as_bytes());
            h = fnv(h, v.as_bytes());
            if r.keep {
                owned.push(((*k).to_string(), v));
            }
        }
        r.hash = h;
        r.count += 1;
        if r.keep {
            r.events.push(TraceEvent { t_ns, host: host.to_string(), kind: kind.to_string(), fields: owned });
        }
    });
}

/// Record one event on `host` (the caller's own name: turmoil does not tell a host who it
/// is) at its current simulated time.
pub fn record(host: &str, kind: &str, fields: &[(&str, &dyn Display)]) {
    record_at(crate::clock::now().as_nanos(), host, kind, fields);
}

/// Events recorded so far.
pub fn count() -> u64 {
    RECORDER.with(|r| r.borrow().count)
}

/// The hash of everything recorded so far.
pub fn hash() -> u64 {
    RECORDER.with(|r| r.borrow().hash)
}

/// End the trace and hand it over.
pub fn take() -> Trace {
    RECORDER.with(|r| {
        let mut r = r.borrow_mut();
        let events = std::mem::take(&mut r.events);
        Trace { events, hash: r.hash }
    })
}

impl Trace {
    /// The trace hash, as printed at the end of every run.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// One JSON object per line: `{"t_ns":..,"host":..,"kind":..,"fields":[[k,v],..]}`.
    pub fn write_jsonl(&self, out: &mut impl Write) -> std::io::Result<()> {
        for e in &self.events {
            serde_json::to_writer(&mut *out, e)?;
            out.write_all(b"\n")?;
        }
        Ok(())
    }
}
