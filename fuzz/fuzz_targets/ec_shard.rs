//! `ConsumerShard` fed arbitrary sequences of request frames, clock steps, timeouts,
//! event sends and model-thread calls. After every step it must have answered with one
//! reference envelope and kept its invariants; a `complete` or `cancel` naming another
//! transfer's reservation id must be refused and change nothing.

#![no_main]

use arbitrary::Arbitrary;
use ctlplane_core::ec::{ConsumerShard, ShardConfig};
use ctlplane_core::Instant;
use libfuzzer_sys::fuzz_target;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use serde_json::{json, Value};
use std::time::Duration;

const DTYPES: [&str; 4] = ["float16", "bfloat16", "float32", "uint8"];
const ITEMSIZE: [u64; 4] = [2, 2, 4, 1];

/// Which reservation id a `complete` or `cancel` names.
#[derive(Arbitrary, Debug, Clone, Copy)]
enum Rid {
    /// The id the transfer's own record holds (if any).
    Own,
    /// The id another transfer's record holds: must be refused.
    Foreign(u8),
    Empty,
    Garbage(u32),
}

#[derive(Arbitrary, Debug)]
struct Item {
    tid: u8,
    hash: u8,
    dims: (u8, u8),
    dtype: u8,
}

#[derive(Arbitrary, Debug)]
enum Step {
    Raw(Vec<u8>),
    Reserve(Item),
    ReserveBatch(Vec<Item>),
    Complete {
        tid: u8,
        rid: Rid,
    },
    CompleteBatch(Vec<(u8, Rid)>),
    Cancel {
        tid: u8,
        rid: Rid,
        abandon: bool,
        refresh: bool,
    },
    Status(u8),
    /// Move the clock by this many 10 ms steps, then run a due timer.
    Advance(u16),
    /// Send up to this many queued events.
    Flush(u8),
    Take {
        tid: u8,
        hash: u8,
    },
    Retire(u8),
    Shutdown,
}

#[derive(Arbitrary, Debug)]
struct Input {
    pool_kib: u8,
    max_batch: u8,
    max_events: u8,
    steps: Vec<Step>,
}

fn tid(n: u8) -> String {
    format!("t{}", n % 12)
}

fn hash(n: u8) -> String {
    format!("h{}", n % 5)
}

fn item_json(item: &Item) -> Value {
    let d = usize::from(item.dtype) % DTYPES.len();
    let (a, b) = (u64::from(item.dims.0 % 17), u64::from(item.dims.1 % 17));
    json!({"transfer_id": tid(item.tid), "mm_hash": hash(item.hash), "nbytes": a * b * ITEMSIZE[d],
           "shape": [a, b], "dtype": DTYPES[d]})
}

struct Harness {
    shard: ConsumerShard<ChaCha8Rng>,
    now: Instant,
    requests: u64,
}

impl Harness {
    fn current_rid(&self, tid: &str) -> Option<String> {
        self.shard.book().status(tid).and_then(|s| s.reservation_id).map(|r| r.to_string())
    }

    fn rid(&self, tid: &str, rid: Rid) -> String {
        match rid {
            Rid::Own => self.current_rid(tid).unwrap_or_default(),
            Rid::Foreign(n) => self.current_rid(&self::tid(n)).unwrap_or_default(),
            Rid::Empty => String::new(),
            Rid::Garbage(n) => format!("{n:032x}"),
        }
    }

    fn request(&mut self, frame: &[u8]) -> Value {
        let reply = self.shard.handle_request(frame, self.now);
        self.requests += 1;
        ctlplane_fuzz::envelope(&reply);
        assert_eq!(self.shard.stats().requests, self.requests, "a request went unanswered");
        serde_json::from_slice(&reply).unwrap_or(Value::Null)
    }

    /// `complete` or `cancel` of `tid` with `rid`: when `rid` is another transfer's
    /// current id, the request is refused and the record is untouched.
    fn guarded(&mut self, tid: &str, rid: &str, frame: &[u8], field: &str) {
        let own = self.current_rid(tid);
        let foreign = !rid.is_empty() && own.is_some() && own.as_deref() != Some(rid);
        let (state, len) = (self.shard.book().state_of(tid), self.shard.book().len());
        let reply = self.request(frame);
        if foreign {
            assert_eq!(reply["result"][field], json!(false), "foreign id {rid} accepted for {tid}: {reply}");
            assert_eq!(self.shard.book().state_of(tid), state, "foreign id {rid} changed {tid}");
            assert_eq!(self.shard.book().len(), len);
        }
    }

    fn check(&self) {
        if let Err(e) = self.shard.book().check_invariants() {
            panic!("invariant broken: {e}");
        }
        let max = self.shard.config().max_pending_events;
        assert!(self.shard.pending_events() <= max, "{} events queued, bound {max}", self.shard.pending_events());
    }
}

fuzz_target!(|input: Input| {
    let mut config = ShardConfig::new(19020, (u64::from(input.pool_kib) + 1) * 1024);
    config.peer_ports = vec![19020, 19021];
    config.max_batch_items = usize::from(input.max_batch % 16) + 1;
    config.max_pending_events = usize::from(input.max_events % 32) + 1;
    let mut h = Harness {
        shard: ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(7), Instant::ZERO),
        now: Instant::ZERO,
        requests: 0,
    };
    for step in input.steps.iter().take(256) {
        match step {
            Step::Raw(frame) => {
                h.request(frame);
            }
            Step::Reserve(item) => {
                let mut req = item_json(item);
                req["op"] = json!("reserve");
                h.request(req.to_string().as_bytes());
            }
            Step::ReserveBatch(items) => {
                let items: Vec<Value> = items.iter().take(32).map(item_json).collect();
                h.request(json!({"op": "reserve_batch", "items": items}).to_string().as_bytes());
            }
            Step::Complete { tid, rid } => {
                let t = self::tid(*tid);
                let r = h.rid(&t, *rid);
                let frame = json!({"op": "complete", "transfer_id": t, "reservation_id": r}).to_string();
                h.guarded(&t, &r, frame.as_bytes(), "completed");
            }
            Step::CompleteBatch(items) => {
                let items: Vec<Value> = items
                    .iter()
                    .take(32)
                    .map(|(t, r)| {
                        let t = tid(*t);
                        json!({"transfer_id": t, "reservation_id": h.rid(&t, *r)})
                    })
                    .collect();
                h.request(json!({"op": "complete_batch", "items": items}).to_string().as_bytes());
            }
            Step::Cancel { tid, rid, abandon, refresh } => {
                let t = self::tid(*tid);
                let r = h.rid(&t, *rid);
                let frame = json!({"op": "cancel", "transfer_id": t, "reservation_id": r,
                                   "abandon": abandon, "refresh": refresh})
                .to_string();
                h.guarded(&t, &r, frame.as_bytes(), "cancelled");
            }
            Step::Status(t) => {
                h.request(json!({"op": "status", "transfer_id": tid(*t)}).to_string().as_bytes());
            }
            Step::Advance(steps) => {
                h.now = h.now + Duration::from_millis(u64::from(*steps) * 10);
                if h.shard.poll_timeout().is_some_and(|due| h.now >= due) {
                    h.shard.handle_timeout(h.now);
                }
            }
            Step::Flush(n) => {
                for _ in 0..*n {
                    let Some(frame) = h.shard.peek_event() else { break };
                    let event: Value = serde_json::from_slice(frame).expect("events are JSON");
                    assert_eq!(event["ready"], json!(true), "event {event}");
                    h.shard.confirm_sent();
                }
            }
            Step::Take { tid, hash } => {
                let _ = h.shard.take(&self::tid(*tid), &self::hash(*hash));
            }
            Step::Retire(n) => h.shard.retire(&hash(*n)),
            Step::Shutdown => h.shard.begin_shutdown(h.now),
        }
        h.check();
    }
    // Whatever happened, the shard still serves.
    let peers = h.request(br#"{"op": "peers"}"#);
    assert_eq!(peers, json!({"ok": true, "result": {"ports": [19020, 19021]}}));
});
