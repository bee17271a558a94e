//! `ConsumerShard` through the wire: ops, batch semantics, the event backlog and the reap
//! schedule (ec-behaviour.md §2.3-2.5), bytes in and bytes out.

use ctlplane_core::ec::{ConsumerShard, ShardConfig};
use ctlplane_core::Instant;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::time::Duration;

type Shard = ConsumerShard<ChaCha8Rng>;

const PORT: u16 = 19020;
const BASE: u64 = 0x7f00_0000_0000;
const T0: Instant = Instant::from_secs(50);

fn shard_with(f: impl FnOnce(&mut ShardConfig)) -> Shard {
    let mut config = ShardConfig::new(PORT, 1 << 20);
    config.peer_ports = vec![19019, 19020];
    config.dst_session = "10.0.0.5:15417".into();
    config.slab_base = BASE;
    f(&mut config);
    ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(9), T0)
}

fn shard() -> Shard {
    shard_with(|_| {})
}

fn call(s: &mut Shard, req: Value, now: Instant) -> Value {
    let frame = serde_json::to_vec(&req).unwrap();
    let reply = s.handle_request(&frame, now);
    serde_json::from_slice(&reply).expect("every reply is JSON")
}

fn ok(s: &mut Shard, req: Value) -> Value {
    let reply = call(s, req, T0);
    assert_eq!(reply["ok"], true, "{reply}");
    reply["result"].clone()
}

fn reserve(tid: &str, hash: &str) -> Value {
    json!({"op": "reserve", "transfer_id": tid, "mm_hash": hash, "nbytes": 16384, "shape": [64, 128], "dtype": "float16"})
}

fn complete_batch(items: &[(&str, &str)]) -> Value {
    let items: Vec<Value> = items.iter().map(|(t, r)| json!({"transfer_id": t, "reservation_id": r})).collect();
    json!({"op": "complete_batch", "items": items})
}

/// Drains the backlog as a PUSH socket would when every send succeeds.
fn drain(s: &mut Shard) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(frame) = s.peek_event() {
        out.push(serde_json::from_slice(frame).unwrap());
        s.confirm_sent();
    }
    out
}

#[test]
fn peers_and_event_port_come_from_configuration() {
    let mut s = shard();
    assert_eq!(ok(&mut s, json!({"op": "peers"})), json!({"ports": [19019, 19020]}));
    assert_eq!(ok(&mut s, json!({"op": "event_port"})), Value::Null);
    s.set_event_port(41237);
    assert_eq!(ok(&mut s, json!({"op": "event_port"})), json!(41237));
}

#[test]
fn reserve_grants_an_absolute_destination() {
    let mut s = shard();
    let r = ok(&mut s, reserve("t1", "h1"));
    assert_eq!(r["dst_session"], "10.0.0.5:15417");
    assert_eq!(r["dst_ptr"], BASE);
    assert_eq!(
        (r["nbytes"].as_u64(), &r["write"], &r["ready"], &r["cached"]),
        (Some(16384), &json!(true), &json!(false), &json!(false))
    );
    let r2 = ok(&mut s, reserve("t2", "h2"));
    assert_eq!(r2["dst_ptr"], BASE + 16384);
    assert!(drain(&mut s).is_empty(), "a writer grant is not ready: no event");
}

#[test]
fn status_is_the_status_object_or_null() {
    let mut s = shard();
    assert_eq!(ok(&mut s, json!({"op": "status", "transfer_id": "t1"})), Value::Null);
    let r = ok(&mut s, reserve("t1", "h1"));
    let st = ok(&mut s, json!({"op": "status", "transfer_id": "t1"}));
    assert_eq!(
        st,
        json!({"mm_hash": "h1", "ready": false, "reservation_id": r["reservation_id"], "nbytes": 16384, "shape": [64, 128], "dtype": "float16"})
    );
}

#[test]
fn completion_queues_one_event_tagged_with_the_shard_port() {
    let mut s = shard();
    let r = ok(&mut s, reserve("t1", "h1"));
    let rid = r["reservation_id"].as_str().unwrap().to_string();
    let done = ok(&mut s, complete_batch(&[("t1", &rid)]));
    assert_eq!(done, json!({"items": [{"completed": true, "became_ready": true}]}));
    let frame = s.peek_event().unwrap().to_vec();
    let text = String::from_utf8(frame).unwrap();
    assert!(text.starts_with("{\"transfer_id\": \"t1\", \"mm_hash\": \"h1\", \"ready\": true"), "{text}");
    assert!(text.ends_with(&format!("\"shard\": {PORT}}}")), "{text}");
    assert_eq!(drain(&mut s).len(), 1);
    // A repeated completion is accepted but publishes nothing new.
    assert_eq!(
        ok(&mut s, complete_batch(&[("t1", &rid)])),
        json!({"items": [{"completed": true, "became_ready": false}]})
    );
    assert!(drain(&mut s).is_empty());
}

#[test]
fn follower_events_precede_the_writers_event() {
    let mut s = shard();
    let w = ok(&mut s, reserve("w", "h"));
    let f = ok(&mut s, reserve("f", "h"));
    assert_eq!((&f["write"], &f["dst_ptr"]), (&json!(false), &w["dst_ptr"]));
    ok(&mut s, complete_batch(&[("w", w["reservation_id"].as_str().unwrap())]));
    let order: Vec<Value> = drain(&mut s).iter().map(|e| e["transfer_id"].clone()).collect();
    assert_eq!(order, vec![json!("f"), json!("w")]);
}

#[test]
fn cache_hit_and_ready_duplicate_queue_an_event_at_once() {
    let mut s = shard();
    let w = ok(&mut s, reserve("w", "h"));
    ok(&mut s, complete_batch(&[("w", w["reservation_id"].as_str().unwrap())]));
    drain(&mut s);
    // A duplicate reserve of a READY transfer re-queues its readiness.
    let dup = ok(&mut s, reserve("w", "h"));
    assert_eq!((&dup["write"], &dup["ready"]), (&json!(false), &json!(true)));
    assert_eq!(drain(&mut s).len(), 1);
    s.take("w", "h").unwrap();
    let hit = ok(&mut s, reserve("x", "h"));
    assert_eq!((&hit["write"], &hit["ready"], &hit["cached"]), (&json!(false), &json!(true), &json!(true)));
    let events = drain(&mut s);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["transfer_id"], "x");
}

#[test]
fn cancelled_transfer_reserves_as_cancelled() {
    let mut s = shard();
    assert_eq!(
        ok(&mut s, json!({"op": "cancel", "transfer_id": "t", "reservation_id": ""})),
        json!({"cancelled": true})
    );
    assert_eq!(
        ok(&mut s, reserve("t", "h")),
        json!({"reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": 16384, "write": false, "ready": false, "cancelled": true})
    );
}

#[test]
fn reserve_batch_answers_each_item_independently() {
    let mut s = shard_with(|c| c.pool_bytes = 16384);
    let bad = json!({"transfer_id": "b", "mm_hash": "hb", "nbytes": 3, "shape": [64, 128], "dtype": "float16"});
    let req = json!({"op": "reserve_batch", "items": [reserve("a", "ha"), bad, reserve("c", "hc"), 7]});
    let reply = call(&mut s, req, T0);
    assert_eq!(reply["ok"], true, "the envelope is ok even when items fail");
    let items = reply["result"]["items"].as_array().unwrap();
    assert_eq!(items.len(), 4);
    assert_eq!(items[0]["ok"], true);
    assert_eq!(items[1], json!({"ok": false, "error": "shape and dtype do not match nbytes"}));
    assert_eq!(items[2], json!({"ok": false, "error": "EC consumer buffer pool is full"}));
    assert_eq!(items[3], json!({"ok": false, "error": "'int' object is not subscriptable"}));
}

#[test]
fn single_reserve_failure_is_an_error_reply() {
    let mut s = shard_with(|c| c.pool_bytes = 256);
    assert_eq!(call(&mut s, reserve("a", "ha"), T0), json!({"ok": false, "error": "EC consumer buffer pool is full"}));
}

#[test]
fn complete_batch_is_applied_in_order_and_not_atomic() {
    let mut s = shard();
    let a = ok(&mut s, reserve("a", "ha"));
    let b = ok(&mut s, reserve("b", "hb"));
    let req = json!({"op": "complete_batch", "items": [
        {"transfer_id": "a", "reservation_id": a["reservation_id"]},
        {"transfer_id": "b"},
        {"transfer_id": "b", "reservation_id": b["reservation_id"]},
    ]});
    assert_eq!(call(&mut s, req, T0), json!({"ok": false, "error": "'reservation_id'"}));
    // Item 1 was applied and its event queued; item 3 never ran.
    let events = drain(&mut s);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["transfer_id"], "a");
    assert_eq!(ok(&mut s, json!({"op": "status", "transfer_id": "b"}))["ready"], false);
}

#[test]
fn backlog_drops_the_oldest_event_and_counts_it() {
    let mut s = shard_with(|c| c.max_pending_events = 3);
    for i in 0..5 {
        let t = format!("t{i}");
        let r = ok(&mut s, reserve(&t, &format!("h{i}")));
        ok(&mut s, complete_batch(&[(&t, r["reservation_id"].as_str().unwrap())]));
    }
    let stats = s.stats();
    assert_eq!((stats.events_queued, stats.events_dropped), (5, 2));
    let order: Vec<Value> = drain(&mut s).iter().map(|e| e["transfer_id"].clone()).collect();
    assert_eq!(order, vec![json!("t2"), json!("t3"), json!("t4")]);
    assert_eq!(s.stats().events_sent, 3);
}

#[test]
fn an_unsent_event_stays_queued() {
    let mut s = shard();
    let r = ok(&mut s, reserve("t", "h"));
    ok(&mut s, complete_batch(&[("t", r["reservation_id"].as_str().unwrap())]));
    // The driver peeked but the send hit EAGAIN: it does not confirm.
    let first = s.peek_event().unwrap().to_vec();
    assert_eq!(s.peek_event().unwrap(), first.as_slice());
    assert_eq!(s.pending_events(), 1);
    s.confirm_sent();
    assert_eq!(s.pending_events(), 0);
    s.confirm_sent();
    assert_eq!(s.stats().events_sent, 1, "confirming nothing sends nothing");
}

#[test]
fn reap_runs_at_most_once_per_interval() {
    let mut s = shard();
    assert_eq!(s.poll_timeout(), Some(T0 + Duration::from_secs(1)));
    s.handle_timeout(T0 + Duration::from_millis(999));
    assert_eq!(s.stats().reaps, 0);
    s.handle_timeout(T0 + Duration::from_secs(1));
    assert_eq!(s.stats().reaps, 1);
    assert_eq!(s.poll_timeout(), Some(T0 + Duration::from_secs(2)));
    s.handle_timeout(T0 + Duration::from_millis(1500));
    assert_eq!(s.stats().reaps, 1);
}

#[test]
fn periodic_reap_expires_ready_records() {
    let mut s = shard();
    let r = ok(&mut s, reserve("t", "h"));
    ok(&mut s, complete_batch(&[("t", r["reservation_id"].as_str().unwrap())]));
    s.handle_timeout(T0 + Duration::from_secs(301));
    assert_eq!(call(&mut s, json!({"op": "status", "transfer_id": "t"}), T0)["result"], Value::Null);
    assert_eq!(s.book().slab().used_bytes(), 0);
}

#[test]
fn every_reserve_reaps_first() {
    let mut s = shard_with(|c| c.pool_bytes = 16384);
    let r = ok(&mut s, reserve("t", "h"));
    ok(&mut s, complete_batch(&[("t", r["reservation_id"].as_str().unwrap())]));
    // No periodic reap ran, yet the READY record past its lease makes room.
    let later = T0 + Duration::from_secs(300);
    let reply = call(&mut s, reserve("u", "h2"), later);
    assert_eq!(reply["result"]["write"], true, "{reply}");
    assert_eq!(s.stats().reaps, 0);
}

#[test]
fn undecodable_request_is_answered_and_serving_continues() {
    let mut s = shard();
    assert_eq!(s.handle_request(b"{not json", T0), br#"{"ok": false, "error": "malformed control request"}"#);
    assert_eq!(
        call(&mut s, json!({"op": "nonsense"}), T0),
        json!({"ok": false, "error": "unknown control op: 'nonsense'"})
    );
    assert_eq!(ok(&mut s, json!({"op": "peers"})), json!({"ports": [19019, 19020]}));
    assert_eq!(s.stats().malformed, 1);
    assert_eq!(s.stats().requests, 3);
}

#[test]
fn shutdown_refuses_reserves_through_the_wire() {
    let mut s = shard();
    let r = ok(&mut s, reserve("t", "h"));
    s.begin_shutdown(T0);
    assert_eq!(s.writer_owned_count(), 1);
    assert_eq!(
        call(&mut s, reserve("u", "h2"), T0),
        json!({"ok": false, "error": "Consumer reservation manager is shutting down"})
    );
    ok(&mut s, complete_batch(&[("t", r["reservation_id"].as_str().unwrap())]));
    assert_eq!(s.writer_owned_count(), 0);
}

#[test]
fn config_for_rank_derives_port_and_peers() {
    let plan = ctlplane_core::ec::PortPlan::new("127.0.0.1", 5000, 1, 2).unwrap();
    let c = ShardConfig::for_rank(&plan, 1, 1024).unwrap();
    assert_eq!((c.port, c.peer_ports.clone()), (5003, vec![5002, 5003]));
    assert_eq!(ShardConfig::for_rank(&plan, 2, 1024).unwrap_err().to_string(), "TP rank 2 is outside 0..2");
}
