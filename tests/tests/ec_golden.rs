//! Golden wire frames of the EC control channel (ec-behaviour.md §2.1-2.4).
//!
//! Requests are written byte for byte as pyzmq's `send_json` writes them (`json.dumps`
//! defaults: `", "` and `": "` separators, `ensure_ascii=True`, so non-ASCII travels as
//! `\uXXXX`, surrogate pairs above the BMP). Replies and events must be byte-identical to
//! what the reference's `send_json` would write for its reply dict, keys in the behaviour reference's
//! order. Every expectation below is written out by hand; only reservation ids (minted
//! from the seeded RNG) are read back from the replies.
//!
//! [`python_json_round_trips_every_frame`] then feeds every request, reply and event of
//! these sessions to a real Python: `json.loads` must give a dict and `json.dumps` of it
//! must reproduce the frame exactly, which proves the formatting is Python's own.

use ctlplane_core::ec::{ConsumerShard, ShardConfig};
use ctlplane_core::Instant;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use serde_json::Value;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

type Shard = ConsumerShard<ChaCha8Rng>;

const PORT: u16 = 19020;
/// The slab base of the behaviour reference's example reply (`dst_ptr` of the first allocation).
const BASE: u64 = 140213339553792;
const SESSION: &str = "10.0.0.5:15417";

/// Transfer ids and hashes shaped like the reference's `uuid4().hex`.
const T1: &str = "3f2a9c1e8b7d4c6a9e0f1b2c3d4e5f60";
const T2: &str = "7b3e9f0a1c2d4e5f8a9b0c1d2e3f4a5b";
const T5: &str = "5d1c0b9a8f7e4d6c8b5a4f3e2d1c0b9a";
const H: &str = "9c1e5d7a3b2f4e6c8a0b1c2d3e4f5a6b";
/// `"café-😀-中"` and `'h3\t"q"\\\x7f'` as `json.dumps` writes them.
const T3_JSON: &str = r#""caf\u00e9-\ud83d\ude00-\u4e2d""#;
const H3_JSON: &str = r#""h3\t\"q\"\\\u007f""#;

/// What a session sent and received, for the Python round trip.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Request,
    Reply,
    Event,
}

impl Kind {
    fn tag(self) -> &'static str {
        match self {
            Kind::Request => "request",
            Kind::Reply => "reply",
            Kind::Event => "event",
        }
    }
}

/// One consumer shard and the log of every frame through it.
struct Session {
    shard: Shard,
    now: Instant,
    frames: Vec<(Kind, Vec<u8>)>,
}

impl Session {
    fn new() -> Self {
        let mut config = ShardConfig::new(PORT, 1 << 20);
        config.peer_ports = vec![PORT, PORT + 1];
        config.dst_session = SESSION.into();
        config.slab_base = BASE;
        Session {
            shard: ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(0x601d), Instant::ZERO),
            now: Instant::ZERO,
            frames: Vec::new(),
        }
    }

    /// Sends `request` as is and returns the reply text.
    fn call(&mut self, request: &str) -> String {
        let reply = self.shard.handle_request(request.as_bytes(), self.now);
        self.frames.push((Kind::Request, request.as_bytes().to_vec()));
        self.frames.push((Kind::Reply, reply.clone()));
        String::from_utf8(reply).expect("replies are UTF-8")
    }

    /// Sends `request` and asserts the exact reply bytes.
    fn expect(&mut self, request: &str, reply: &str) {
        let got = self.call(request);
        assert_eq!(got, reply, "\nrequest: {request}");
    }

    /// Like [`Session::expect`] for a frame no Python client would send: only the reply
    /// joins the log.
    fn expect_hostile(&mut self, request: &str, reply: &str) {
        let got = self.shard.handle_request(request.as_bytes(), self.now);
        self.frames.push((Kind::Reply, got.clone()));
        assert_eq!(String::from_utf8(got).unwrap(), reply, "\nrequest: {request}");
    }

    /// Everything the PUSH socket would send now, oldest first.
    fn events(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(frame) = self.shard.peek_event() {
            let frame = frame.to_vec();
            self.frames.push((Kind::Event, frame.clone()));
            out.push(String::from_utf8(frame).expect("events are UTF-8"));
            self.shard.confirm_sent();
        }
        out
    }

    /// Moves the clock and lets the shard reap, as the server loop does.
    fn advance(&mut self, d: Duration) {
        self.now = self.now + d;
        self.shard.handle_timeout(self.now);
    }
}

/// A reservation id read from JSON: 32 lowercase hex digits shaped like `uuid4().hex`.
fn rid(v: &Value) -> String {
    let id = v.as_str().unwrap_or_else(|| panic!("reservation_id is not a string: {v}"));
    assert_eq!(id.len(), 32, "{id}");
    assert!(id.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c)), "{id}");
    assert_eq!(&id[12..13], "4", "uuid4 version nibble: {id}");
    assert!(matches!(&id[16..17], "8" | "9" | "a" | "b"), "uuid4 variant: {id}");
    id.to_string()
}

/// The reservation id of a single `reserve` reply.
fn rid_of(reply: &str) -> String {
    let v: Value = serde_json::from_str(reply).unwrap();
    rid(&v["result"]["reservation_id"])
}

/// A granted reserve result in the reference's key order.
fn granted(rid: &str, dst_ptr: u64, nbytes: u64, write: bool, ready: bool, cached: bool) -> String {
    format!(
        r#"{{"reservation_id": "{rid}", "dst_session": "{SESSION}", "dst_ptr": {dst_ptr}, "nbytes": {nbytes}, "write": {write}, "ready": {ready}, "cached": {cached}}}"#
    )
}

fn ok(result: &str) -> String {
    format!(r#"{{"ok": true, "result": {result}}}"#)
}

fn complete_reply(completed: bool, became_ready: bool) -> String {
    ok(&format!(r#"{{"completed": {completed}, "became_ready": {became_ready}}}"#))
}

const CANCELLED_TRUE: &str = r#"{"ok": true, "result": {"cancelled": true}}"#;
const CANCELLED_FALSE: &str = r#"{"ok": true, "result": {"cancelled": false}}"#;
const NULL: &str = r#"{"ok": true, "result": null}"#;

// ---------------------------------------------------------------------------------------
// Scenarios (each also feeds the Python round trip)
// ---------------------------------------------------------------------------------------

fn scenario_peers_and_event_port(s: &mut Session) {
    s.expect(r#"{"op": "peers"}"#, r#"{"ok": true, "result": {"ports": [19020, 19021]}}"#);
    s.expect(r#"{"op": "event_port"}"#, NULL);
    s.shard.set_event_port(41237);
    s.expect(r#"{"op": "event_port"}"#, r#"{"ok": true, "result": 41237}"#);
}

fn scenario_reserve_and_status(s: &mut Session) {
    let reserve = format!(
        r#"{{"op": "reserve", "transfer_id": "{T1}", "mm_hash": "{H}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}}"#
    );
    let reply = s.call(&reserve);
    let r1 = rid_of(&reply);
    assert_eq!(reply, ok(&granted(&r1, 140213339553792, 16384, true, false, false)));

    let status = format!(r#"{{"op": "status", "transfer_id": "{T1}"}}"#);
    let writing = format!(
        r#"{{"mm_hash": "{H}", "ready": false, "reservation_id": "{r1}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}}"#
    );
    s.expect(&status, &ok(&writing));
    // A duplicate reserve of an in-flight transfer: the same destination, no write, and an
    // id of its own, so the duplicate's cleanup cannot free the first grant (`ec-dup-push`).
    let reply = s.call(&reserve);
    let dup = rid_of(&reply);
    assert_ne!(dup, r1, "a duplicate's grant has an id of its own");
    assert_eq!(reply, ok(&granted(&dup, 140213339553792, 16384, false, false, false)));
    s.expect(r#"{"op": "status", "transfer_id": "nobody"}"#, NULL);
    assert!(s.events().is_empty(), "nothing is ready yet");
}

fn scenario_batches_and_events(s: &mut Session) {
    let r1 = rid_of(&s.call(&format!(
        r#"{{"op": "reserve", "transfer_id": "{T1}", "mm_hash": "{H}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}}"#
    )));

    // T2 follows T1 (same mm_hash in flight), T3 is a new writer with a non-ASCII id,
    // the third item fails on its own.
    let batch = format!(
        r#"{{"op": "reserve_batch", "items": [{{"transfer_id": "{T2}", "mm_hash": "{H}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}}, {{"transfer_id": {T3_JSON}, "mm_hash": {H3_JSON}, "nbytes": 16, "shape": [8], "dtype": "bfloat16"}}, {{"transfer_id": "t4", "mm_hash": "h4", "nbytes": 16, "shape": [8], "dtype": "x"}}]}}"#
    );
    let reply = s.call(&batch);
    let v: Value = serde_json::from_str(&reply).unwrap();
    let (r2, r3) = (
        rid(&v["result"]["items"][0]["result"]["reservation_id"]),
        rid(&v["result"]["items"][1]["result"]["reservation_id"]),
    );
    assert_eq!(
        reply,
        ok(&format!(
            r#"{{"items": [{{"ok": true, "result": {}}}, {{"ok": true, "result": {}}}, {{"ok": false, "error": "Unsupported torch dtype string: 'x'"}}]}}"#,
            granted(&r2, 140213339553792, 16384, false, false, false),
            granted(&r3, 140213339570176, 16, true, false, false),
        ))
    );

    // Gen A: a follower's completion is refused.
    s.expect(
        &format!(r#"{{"op": "complete", "transfer_id": "{T2}", "reservation_id": "{r2}"}}"#),
        &complete_reply(false, false),
    );
    s.expect(
        &format!(
            r#"{{"op": "complete_batch", "items": [{{"transfer_id": "{T1}", "reservation_id": "{r1}"}}, {{"transfer_id": {T3_JSON}, "reservation_id": "{r3}"}}]}}"#
        ),
        r#"{"ok": true, "result": {"items": [{"completed": true, "became_ready": true}, {"completed": true, "became_ready": true}]}}"#,
    );
    // The follower T1 published goes out before T1's own event.
    assert_eq!(
        s.events(),
        [
            format!(
                r#"{{"transfer_id": "{T2}", "mm_hash": "{H}", "ready": true, "reservation_id": "{r2}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16", "shard": 19020}}"#
            ),
            format!(
                r#"{{"transfer_id": "{T1}", "mm_hash": "{H}", "ready": true, "reservation_id": "{r1}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16", "shard": 19020}}"#
            ),
            format!(
                r#"{{"transfer_id": {T3_JSON}, "mm_hash": {H3_JSON}, "ready": true, "reservation_id": "{r3}", "nbytes": 16, "shape": [8], "dtype": "bfloat16", "shard": 19020}}"#
            ),
        ]
    );
    s.expect(
        &format!(r#"{{"op": "status", "transfer_id": {T3_JSON}}}"#),
        &ok(&format!(
            r#"{{"mm_hash": {H3_JSON}, "ready": true, "reservation_id": "{r3}", "nbytes": 16, "shape": [8], "dtype": "bfloat16"}}"#
        )),
    );

    // A new transfer of the published tensor is a cache hit: READY at once, event queued.
    let hit = s.call(&format!(
        r#"{{"op": "reserve", "transfer_id": "{T5}", "mm_hash": "{H}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}}"#
    ));
    let r5 = rid_of(&hit);
    assert_eq!(hit, ok(&granted(&r5, 140213339553792, 16384, false, true, true)));
    assert_eq!(
        s.events(),
        [format!(
            r#"{{"transfer_id": "{T5}", "mm_hash": "{H}", "ready": true, "reservation_id": "{r5}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16", "shard": 19020}}"#
        )]
    );

    // Repeats: a completion is idempotent and sends nothing; a reserve of a READY transfer
    // answers the record (T1 holds a lease now) and re-queues its event.
    s.expect(
        &format!(r#"{{"op": "complete_batch", "items": [{{"transfer_id": "{T1}", "reservation_id": "{r1}"}}]}}"#),
        r#"{"ok": true, "result": {"items": [{"completed": true, "became_ready": false}]}}"#,
    );
    assert!(s.events().is_empty());
    // The record again, under an id of the duplicate's own (`ec-dup-push`).
    let reply = s.call(&format!(
        r#"{{"op": "reserve", "transfer_id": "{T1}", "mm_hash": "{H}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}}"#
    ));
    let dup = rid_of(&reply);
    assert_ne!(dup, r1, "a duplicate's grant has an id of its own");
    assert_eq!(reply, ok(&granted(&dup, 140213339553792, 16384, false, true, true)));
    assert_eq!(s.events().len(), 1);
}

fn scenario_cancel(s: &mut Session) {
    // Cancel before reserve: the later reserve is told not to write.
    s.expect(r#"{"op": "cancel", "transfer_id": "t6", "reservation_id": ""}"#, CANCELLED_TRUE);
    s.expect(
        r#"{"op": "reserve", "transfer_id": "t6", "mm_hash": "h6", "nbytes": 64, "shape": [32], "dtype": "float16"}"#,
        r#"{"ok": true, "result": {"reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": 64, "write": false, "ready": false, "cancelled": true}}"#,
    );
    // The behaviour reference's example.
    s.expect(r#"{"op": "cancel", "transfer_id": "t1", "reservation_id": "r0", "abandon": true}"#, CANCELLED_TRUE);

    // Stale refresh: abandon + refresh expires the writer; the re-reserve gets a new id and
    // the same (freed) destination; a late completion with the old id is refused.
    let reserve7 =
        r#"{"op": "reserve", "transfer_id": "t7", "mm_hash": "h7", "nbytes": 512, "shape": [128], "dtype": "float32"}"#;
    let first = s.call(reserve7);
    let r7a = rid_of(&first);
    assert_eq!(first, ok(&granted(&r7a, 140213339553792, 512, true, false, false)));
    s.expect(
        &format!(
            r#"{{"op": "cancel", "transfer_id": "t7", "reservation_id": "{r7a}", "abandon": true, "refresh": true}}"#
        ),
        CANCELLED_TRUE,
    );
    s.expect(r#"{"op": "status", "transfer_id": "t7"}"#, NULL);
    let second = s.call(reserve7);
    let r7b = rid_of(&second);
    assert_ne!(r7a, r7b);
    assert_eq!(second, ok(&granted(&r7b, 140213339553792, 512, true, false, false)));
    s.expect(
        &format!(r#"{{"op": "complete", "transfer_id": "t7", "reservation_id": "{r7a}"}}"#),
        &complete_reply(false, false),
    );
    s.expect(
        &format!(r#"{{"op": "complete", "transfer_id": "t7", "reservation_id": "{r7b}"}}"#),
        &complete_reply(true, true),
    );
    assert_eq!(
        s.events(),
        [format!(
            r#"{{"transfer_id": "t7", "mm_hash": "h7", "ready": true, "reservation_id": "{r7b}", "nbytes": 512, "shape": [128], "dtype": "float32", "shard": 19020}}"#
        )]
    );

    // A plain cancel of a writer defers it: memory kept, the reserve says cancelled, the
    // writer's completion releases it without an event.
    let third = s.call(
        r#"{"op": "reserve", "transfer_id": "t8", "mm_hash": "h8", "nbytes": 64, "shape": [32], "dtype": "float16"}"#,
    );
    let r8 = rid_of(&third);
    assert_eq!(third, ok(&granted(&r8, 140213339554304, 64, true, false, false)));
    s.expect(r#"{"op": "cancel", "transfer_id": "t8", "reservation_id": ""}"#, CANCELLED_TRUE);
    s.expect(
        r#"{"op": "status", "transfer_id": "t8"}"#,
        &ok(&format!(
            r#"{{"mm_hash": "h8", "ready": false, "reservation_id": "{r8}", "nbytes": 64, "shape": [32], "dtype": "float16"}}"#
        )),
    );
    s.expect(
        r#"{"op": "reserve", "transfer_id": "t8", "mm_hash": "h8", "nbytes": 64, "shape": [32], "dtype": "float16"}"#,
        r#"{"ok": true, "result": {"reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": 64, "write": false, "ready": false, "cancelled": true}}"#,
    );
    s.expect(
        &format!(r#"{{"op": "complete", "transfer_id": "t8", "reservation_id": "{r8}"}}"#),
        &complete_reply(true, false),
    );
    s.expect(r#"{"op": "status", "transfer_id": "t8"}"#, NULL);
    assert!(s.events().is_empty());
    assert_eq!(s.shard.book().slab().used_bytes(), 512, "only t7's region is left");

    // Producer abandon of a READY reservation: a wrong id is refused, the right one frees it.
    s.expect(
        &format!(r#"{{"op": "cancel", "transfer_id": "t7", "reservation_id": "{r8}", "abandon": true}}"#),
        CANCELLED_FALSE,
    );
    s.expect(
        &format!(r#"{{"op": "cancel", "transfer_id": "t7", "reservation_id": "{r7b}", "abandon": true}}"#),
        CANCELLED_TRUE,
    );
    s.expect(r#"{"op": "status", "transfer_id": "t7"}"#, NULL);
    assert_eq!(s.shard.book().slab().used_bytes(), 0);
}

fn scenario_errors(s: &mut Session) {
    s.expect_hostile("{not json", r#"{"ok": false, "error": "malformed control request"}"#);
    s.expect_hostile("[]", r#"{"ok": false, "error": "'list' object has no attribute 'get'"}"#);
    s.expect(r#"{"op": "r\u00e9serve"}"#, r#"{"ok": false, "error": "unknown control op: 'r\u00e9serve'"}"#);
    s.expect(r#"{"op": "it's"}"#, r#"{"ok": false, "error": "unknown control op: \"it's\""}"#);
    s.expect(r#"{"op": "complete", "transfer_id": "x"}"#, r#"{"ok": false, "error": "'reservation_id'"}"#);
    s.expect(
        r#"{"op": "reserve", "transfer_id": "t9", "mm_hash": "h9", "nbytes": "abc", "shape": [8], "dtype": "uint8"}"#,
        r#"{"ok": false, "error": "invalid literal for int() with base 10: 'abc'"}"#,
    );
    s.expect(
        r#"{"op": "reserve", "transfer_id": "t9", "mm_hash": "h9", "nbytes": 4194304, "shape": [4194304], "dtype": "uint8"}"#,
        r#"{"ok": false, "error": "EC consumer buffer pool is full"}"#,
    );
    // A writer past its TTL is deferred; a plain re-reserve is refused, naming the
    // transfer with Python's repr (non-ASCII escaped by json.dumps).
    let reserve =
        r#"{"op": "reserve", "transfer_id": "t\u00e9", "mm_hash": "h9", "nbytes": 8, "shape": [8], "dtype": "uint8"}"#;
    let rid = rid_of(&s.call(reserve));
    s.advance(Duration::from_secs(301));
    s.expect(reserve, r#"{"ok": false, "error": "Transfer 't\u00e9' still has an active writer"}"#);
    s.expect(
        &format!(r#"{{"op": "cancel", "transfer_id": "t\u00e9", "reservation_id": "{rid}", "abandon": true, "refresh": true}}"#),
        CANCELLED_TRUE,
    );
    let fresh = s.call(reserve);
    let rid2 = rid_of(&fresh);
    assert_ne!(rid, rid2);
    assert_eq!(fresh, ok(&granted(&rid2, 140213339553792, 8, true, false, false)));
}

/// A reserve request frame of `dtype` in the clients' layout.
fn reserve_frame(tid: &str, hash: &str, nbytes: &str, shape: &str, dtype: &str) -> String {
    format!(
        r#"{{"op": "reserve", "transfer_id": "{tid}", "mm_hash": "{hash}", "nbytes": {nbytes}, "shape": {shape}, "dtype": "{dtype}"}}"#
    )
}

fn err(text: &str) -> String {
    format!(r#"{{"ok": false, "error": "{text}"}}"#)
}

/// The classes where vLLM 0.33.0's consumer answers differently from the seed's
/// (docs/ec-behaviour.md, "Parity with vLLM 0.33.0"), one golden exchange each.
fn scenario_v033_classes(s: &mut Session) {
    // 1. torch's whole dtype table.
    let r = s.call(&reserve_frame("v1", "h1", "16", "[16]", "float8_e8m0fnu"));
    assert_eq!(r, ok(&granted(&rid_of(&r), BASE, 16, true, false, false)));
    let r = s.call(&reserve_frame("v2", "h2", "4", "[4]", "float4_e2m1fn_x2"));
    assert_eq!(r, ok(&granted(&rid_of(&r), BASE + 256, 4, true, false, false)));
    // 2. Names are compared as names, and echoed as spelled.
    let r = s.call(&reserve_frame("v3", "m1", "32", "[2]", "complex128"));
    assert_eq!(r, ok(&granted(&rid_of(&r), BASE + 512, 32, true, false, false)));
    s.expect(&reserve_frame("v4", "m1", "32", "[2]", "cdouble"), &err("conflicting in-flight tensor for mm_hash"));
    let r = s.call(&reserve_frame("v5", "h5", "16", "[4]", "int"));
    let rid5 = rid_of(&r);
    assert_eq!(r, ok(&granted(&rid5, BASE + 768, 16, true, false, false)));
    let status = format!(
        r#"{{"mm_hash": "h5", "ready": false, "reservation_id": "{rid5}", "nbytes": 16, "shape": [4], "dtype": "int"}}"#
    );
    s.expect(r#"{"op": "status", "transfer_id": "v5"}"#, &ok(&status));
    s.expect(
        &format!(r#"{{"op": "complete", "transfer_id": "v5", "reservation_id": "{rid5}"}}"#),
        &complete_reply(true, true),
    );
    assert_eq!(
        s.events(),
        [format!(
            r#"{{"transfer_id": "v5", "mm_hash": "h5", "ready": true, "reservation_id": "{rid5}", "nbytes": 16, "shape": [4], "dtype": "int", "shard": {PORT}}}"#
        )]
    );
    // 3. An empty tensor: null pointer, no pool space, later offsets do not drift.
    let r = s.call(&reserve_frame("v6", "h6", "0", "[0, 8]", "float32"));
    assert_eq!(r, ok(&granted(&rid_of(&r), 0, 0, true, false, false)));
    let r = s.call(&reserve_frame("v7", "h7", "16", "[16]", "uint8"));
    assert_eq!(r, ok(&granted(&rid_of(&r), BASE + 1024, 16, true, false, false)));
    // 4. Python iterates whatever it is given.
    s.expect(r#"{"op": "reserve_batch", "items": ""}"#, &ok(r#"{"items": []}"#));
    s.expect(
        r#"{"op": "reserve_batch", "items": {"transfer_id": "x"}}"#,
        &ok(r#"{"items": [{"ok": false, "error": "string indices must be integers, not 'str'"}]}"#),
    );
    let r = s.call(&reserve_frame("v8", "h8", "2704", r#"{"676": 0, "1": 0, "4": 0}"#, "uint8"));
    let rid8 = rid_of(&r);
    assert_eq!(r, ok(&granted(&rid8, BASE + 1280, 2704, true, false, false)));
    s.expect(
        r#"{"op": "status", "transfer_id": "v8"}"#,
        &ok(&format!(
            r#"{{"mm_hash": "h8", "ready": false, "reservation_id": "{rid8}", "nbytes": 2704, "shape": [676, 1, 4], "dtype": "uint8"}}"#
        )),
    );
    s.expect(r#"{"op": "complete_batch", "items": "ab"}"#, &err("string indices must be integers, not 'str'"));
    s.expect(&reserve_frame("v8", "h8", "8", "8", "uint8"), &err("'int' object is not iterable"));
    // 5. Negative sizes fail where torch carves the view; nothing is allocated.
    s.expect(&reserve_frame("v9", "h9", "-3", "[-3]", "uint8"), &err("narrow(): length must be non-negative."));
    s.expect(&reserve_frame("v9", "h9", "4", "[-2, -2]", "uint8"), &err("invalid shape dimension -2"));
    let r = s.call(&reserve_frame("v10", "h10", "16", "[16]", "uint8"));
    assert_eq!(r, ok(&granted(&rid_of(&r), BASE + 4096, 16, true, false, false)), "no region leaked");
    s.expect(r#"{"op": "cancel", "transfer_id": "v11", "reservation_id": ""}"#, CANCELLED_TRUE);
    s.expect(
        &reserve_frame("v11", "h11", "-3", "[-3]", "uint8"),
        r#"{"ok": true, "result": {"reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": -3, "write": false, "ready": false, "cancelled": true}}"#,
    );
    // 6. What json.loads accepts: NaN, deep nesting.
    s.expect(r#"{"op": "status", "transfer_id": NaN}"#, NULL);
    s.expect(r#"{"op": "status", "transfer_id": -Infinity}"#, NULL);
    let arrays = format!("{}{}", "[".repeat(150), "]".repeat(150));
    s.expect_hostile(&arrays, &err("'list' object has no attribute 'get'"));
    let objects = format!("{}0{}", r#"{"a": "#.repeat(150), "}".repeat(150));
    s.expect_hostile(&objects, &err("unknown control op: None"));
    // 7. Python's int: its digit limit, and digits of any script.
    let long = format!(r#"{{"op": "status", "transfer_id": {}}}"#, "7".repeat(4301));
    s.expect_hostile(&long, &err("malformed control request"));
    s.expect(&format!(r#"{{"op": "status", "transfer_id": {}}}"#, "7".repeat(4300)), NULL);
    let r = s.call(&reserve_frame("v12", "h12", r#""\u0665\u0663\u0660""#, "[530]", "uint8"));
    assert_eq!(r, ok(&granted(&rid_of(&r), BASE + 4352, 530, true, false, false)));
    // A cancel queues no readiness event, whatever it frees.
    let r = s.call(&reserve_frame("v13", "h13", "8", "[8]", "uint8"));
    let rid13 = rid_of(&r);
    assert_eq!(r, ok(&granted(&rid13, BASE + 5120, 8, true, false, false)));
    let r = s.call(&reserve_frame("v14", "h13", "8", "[8]", "uint8"));
    assert_eq!(r, ok(&granted(&rid_of(&r), BASE + 5120, 8, false, false, false)));
    s.expect(
        &format!(r#"{{"op": "cancel", "transfer_id": "v13", "reservation_id": "{rid13}", "abandon": true}}"#),
        CANCELLED_TRUE,
    );
    s.expect(r#"{"op": "cancel", "transfer_id": "v14", "reservation_id": ""}"#, CANCELLED_TRUE);
    assert!(s.events().is_empty(), "0.33.0 queues no event for a cancel");
}

#[test]
fn golden_vllm_0_33_classes() {
    scenario_v033_classes(&mut Session::new());
}

type Scenario = fn(&mut Session);

const SCENARIOS: &[(&str, Scenario)] = &[
    ("peers_and_event_port", scenario_peers_and_event_port),
    ("reserve_and_status", scenario_reserve_and_status),
    ("batches_and_events", scenario_batches_and_events),
    ("cancel", scenario_cancel),
    ("errors", scenario_errors),
    ("v033_classes", scenario_v033_classes),
];

#[test]
fn golden_peers_and_event_port() {
    scenario_peers_and_event_port(&mut Session::new());
}

#[test]
fn golden_reserve_duplicate_and_status() {
    scenario_reserve_and_status(&mut Session::new());
}

#[test]
fn golden_reserve_batch_complete_batch_and_readiness_events() {
    scenario_batches_and_events(&mut Session::new());
}

#[test]
fn golden_cancel_plain_abandon_and_refresh() {
    scenario_cancel(&mut Session::new());
}

#[test]
fn golden_error_replies() {
    scenario_errors(&mut Session::new());
}

// ---------------------------------------------------------------------------------------
// Real Python
// ---------------------------------------------------------------------------------------

/// Reads `<kind> <hex>` lines; checks each frame decodes as pyzmq's `recv_json` would, is a
/// dict, is ASCII (`ensure_ascii`), survives `json.dumps(json.loads(frame)) == frame`, and
/// has its keys in the reference's order.
const PY_CHECK: &str = r#"
import json, sys
assert sys.version_info >= (3, 7), sys.version
ENVELOPES = (["ok", "result"], ["ok", "error"])
GRANTED = ["reservation_id", "dst_session", "dst_ptr", "nbytes", "write", "ready", "cached"]
CANCELLED = ["reservation_id", "dst_session", "dst_ptr", "nbytes", "write", "ready", "cancelled"]
STATUS = ["mm_hash", "ready", "reservation_id", "nbytes", "shape", "dtype"]
EVENT = ["transfer_id"] + STATUS + ["shard"]
COMPLETE = ["completed", "became_ready"]

def check_result(r, where):
    if isinstance(r, dict):
        keys = list(r)
        if "dst_session" in r:
            assert keys in (GRANTED, CANCELLED), (where, keys)
        elif "mm_hash" in r:
            assert keys == STATUS, (where, keys)
        elif "completed" in r:
            assert keys == COMPLETE, (where, keys)
        elif "items" in r:
            assert keys == ["items"], (where, keys)
            for i, item in enumerate(r["items"]):
                if "ok" in item:
                    assert list(item) in ENVELOPES, (where, i, list(item))
                    check_result(item.get("result"), f"{where} item {i}")
                else:
                    check_result(item, f"{where} item {i}")
        else:
            assert keys in (["ports"], ["cancelled"]), (where, keys)

failures, count = [], 0
for lineno, line in enumerate(sys.stdin, 1):
    kind, data = line.split()
    frame = bytes.fromhex(data)
    count += 1
    try:
        text = frame.decode("utf-8")
        assert text.isascii(), "not ASCII: send_json uses ensure_ascii=True"
        obj = json.loads(text)
        assert isinstance(obj, dict), f"not a dict: {type(obj).__name__}"
        again = json.dumps(obj)
        assert again == text, f"json.dumps gives {again}"
        if kind == "reply":
            assert list(obj) in ENVELOPES, list(obj)
            assert isinstance(obj["ok"], bool)
            if obj["ok"]:
                check_result(obj["result"], "result")
            else:
                assert isinstance(obj["error"], str)
        elif kind == "event":
            assert list(obj) == EVENT, list(obj)
            assert obj["ready"] is True
        else:
            assert kind == "request" and isinstance(obj.get("op"), str), kind
    except Exception as e:
        failures.append(f"line {lineno} ({kind}) {frame!r}: {type(e).__name__}: {e}")
for f in failures:
    print(f)
print(f"checked {count} frames, {len(failures)} failed")
sys.exit(1 if failures else 0)
"#;

/// Runs `PY_CHECK` over `frames`; the Python interpreter is `$CTLPLANE_PYTHON` or `python3`.
fn python_check(frames: &[(Kind, Vec<u8>)]) {
    let python = std::env::var("CTLPLANE_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let mut child = Command::new(&python)
        .args(["-I", "-c", PY_CHECK])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start `{python}` ({e}). This test checks the wire frames with Python's own json module \
                 and does not skip: install Python 3 (CI uses 3.11) or set CTLPLANE_PYTHON to an interpreter."
            )
        });
    let mut input = String::new();
    for (kind, frame) in frames {
        input.push_str(kind.tag());
        input.push(' ');
        for b in frame {
            input.push_str(&format!("{b:02x}"));
        }
        input.push('\n');
    }
    let mut stdin = child.stdin.take().expect("piped stdin");
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().expect("python3 ran");
    writer.join().expect("stdin writer").expect("frames written to python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "Python rejected frames ({}):\n{stdout}\n{stderr}", out.status);
    assert!(
        stdout.contains(&format!("checked {} frames, 0 failed", frames.len())),
        "unexpected output from Python:\n{stdout}\n{stderr}"
    );
}

#[test]
fn python_json_round_trips_every_frame() {
    let mut frames = Vec::new();
    for (name, scenario) in SCENARIOS {
        let mut s = Session::new();
        scenario(&mut s);
        assert!(s.frames.iter().any(|(k, _)| *k == Kind::Reply), "{name} produced no replies");
        frames.extend(s.frames);
    }
    let count = |kind| frames.iter().filter(|(k, _)| *k == kind).count();
    assert!(count(Kind::Event) >= 6, "the sessions should publish events");
    // Two hostile requests of the error scenario and three of the 0.33 classes (deep
    // nesting, an over-long integer) are not frames a Python client writes.
    assert!(count(Kind::Request) + 5 == count(Kind::Reply), "five hostile requests are not Python frames");
    python_check(&frames);
}

/// The Python check itself must be able to fail: a compact frame (serde_json's default
/// layout) and a non-ASCII one are rejected.
#[test]
fn python_check_rejects_frames_python_would_not_write() {
    for bad in [&br#"{"ok":true,"result":null}"#[..], "{\"ok\": false, \"error\": \"caf\u{e9}\"}".as_bytes()] {
        let result = std::panic::catch_unwind(|| python_check(&[(Kind::Reply, bad.to_vec())]));
        assert!(result.is_err(), "python_check accepted {}", String::from_utf8_lossy(bad));
    }
}
