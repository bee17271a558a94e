//! `PushCoordinator` against real `ConsumerShard`s and an in-process data plane: the
//! producer's side of the EC channel (ec-behaviour.md §1.3, §2.3, §4) and its races (S8-S20), driven by a
//! tiny loop that routes every request frame to the shard it names and every write into the
//! shard's registered slab.

use ctlplane_core::ec::dataplane::{DataPlane, InProcessDataPlane};
use ctlplane_core::ec::producer::{
    BatchId, ItemOutcome, PushBatch, PushConfig, PushCoordinator, PushEvent, PushItem, SkipReason, Transmit,
};
use ctlplane_core::ec::shard::reply_result;
use ctlplane_core::ec::{ConsumerShard, ShardConfig};
use ctlplane_core::Instant;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

type Shard = ConsumerShard<ChaCha8Rng>;

const HOST: &str = "tcp://10.0.0.5";
const FIRST_PORT: u16 = 19019;
const POOL: u64 = 1 << 20;
const NBYTES: u64 = 16384;
const T0: Instant = Instant::from_secs(1000);
const TIMEOUT: &str = "Resource temporarily unavailable";

fn addr(rank: usize) -> String {
    format!("{HOST}:{}", FIRST_PORT + rank as u16)
}

fn session(rank: usize) -> String {
    format!("10.0.0.5:{}", 15417 + rank)
}

fn slab_base(rank: usize) -> u64 {
    0x7f00_0000_0000 + ((rank as u64) << 32)
}

fn item(tid: &str, hash: &str) -> PushItem {
    PushItem {
        transfer_id: tid.into(),
        mm_hash: hash.into(),
        nbytes: NBYTES,
        shape: vec![64, 128],
        dtype: "float16".into(),
    }
}

/// What the loop does with one request.
enum Fault {
    /// Deliver it and its reply.
    Deliver,
    /// The request never reaches the shard; the client sees this error.
    Fail(String),
    /// The shard runs it, but the reply is lost (the client times out).
    LoseReply(String),
}

type Hook = Box<dyn FnMut(&mut BTreeMap<String, Shard>, &str, &Value) -> Fault>;

struct World {
    coord: PushCoordinator,
    shards: BTreeMap<String, Shard>,
    dp: InProcessDataPlane,
    sources: BTreeMap<(BatchId, usize), Vec<u8>>,
    now: Instant,
    /// Every request the producer sent, in order: (address, decoded frame).
    sent: Vec<(String, Value)>,
    done: Vec<PushEvent>,
    hook: Hook,
}

impl World {
    fn new(pools: &[u64]) -> Self {
        Self::with_config(pools, PushConfig::default())
    }

    fn with_config(pools: &[u64], config: PushConfig) -> Self {
        let peer_ports: Vec<u16> = (0..pools.len()).map(|r| FIRST_PORT + r as u16).collect();
        let mut shards = BTreeMap::new();
        let mut dp = InProcessDataPlane::new();
        for (rank, &pool) in pools.iter().enumerate() {
            let mut config = ShardConfig::new(FIRST_PORT + rank as u16, pool);
            config.peer_ports = peer_ports.clone();
            config.dst_session = session(rank);
            config.slab_base = slab_base(rank);
            shards.insert(addr(rank), ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(rank as u64 + 1), T0));
            dp.register(&session(rank), slab_base(rank), pool as usize);
        }
        World {
            coord: PushCoordinator::new(config),
            shards,
            dp,
            sources: BTreeMap::new(),
            now: T0,
            sent: Vec::new(),
            done: Vec::new(),
            hook: Box::new(|_, _, _| Fault::Deliver),
        }
    }

    fn hook(&mut self, f: impl FnMut(&mut BTreeMap<String, Shard>, &str, &Value) -> Fault + 'static) {
        self.hook = Box::new(f);
    }

    /// Pushes `items` to rank 0's address and registers deterministic source bytes.
    fn push(&mut self, items: Vec<PushItem>, source_ready: bool) -> BatchId {
        let n = items.len();
        let mut batch = PushBatch::new(addr(0), items.clone());
        batch.source_ready = source_ready;
        let id = self.coord.push(batch, self.now);
        for (index, it) in items.iter().enumerate().take(n) {
            self.sources.insert((id, index), source_bytes(&it.transfer_id, it.nbytes));
        }
        id
    }

    /// Everything the coordinator wants done right now (so all of it is "in flight").
    fn collect(&mut self) -> Vec<Transmit> {
        std::iter::from_fn(|| self.coord.poll_transmit()).collect()
    }

    fn deliver(&mut self, t: Transmit) {
        match t {
            Transmit::Request { token, addr, frame, .. } => {
                let request: Value = serde_json::from_slice(&frame).expect("requests are JSON");
                self.sent.push((addr.clone(), request.clone()));
                let fault = (self.hook)(&mut self.shards, &addr, &request);
                let reply = match (fault, self.shards.get_mut(&addr)) {
                    (Fault::Fail(e), _) => Err(e.into()),
                    (_, None) => Err(TIMEOUT.into()),
                    (Fault::Deliver, Some(shard)) => reply_result(&shard.handle_request(&frame, self.now)),
                    (Fault::LoseReply(e), Some(shard)) => {
                        shard.handle_request(&frame, self.now);
                        Err(e.into())
                    }
                };
                self.coord.handle_reply(token, reply, self.now);
            }
            Transmit::Write { token, session, dst_ptr, nbytes, item } => {
                let src = &self.sources[&(item.batch, item.index)];
                assert_eq!(src.len() as u64, nbytes);
                let result = self.dp.write(&session, dst_ptr, src).map_err(|e| e.to_string());
                self.coord.handle_write(token, result, self.now);
            }
        }
        self.collect_events();
    }

    fn collect_events(&mut self) {
        while let Some(e) = self.coord.poll_event() {
            self.done.push(e);
        }
    }

    /// One round: take everything outstanding, then answer it in order.
    fn step(&mut self) -> usize {
        let round = self.collect();
        let n = round.len();
        for t in round {
            self.deliver(t);
        }
        n
    }

    fn run(&mut self) {
        while self.step() > 0 {}
        assert_eq!(self.coord.in_flight(), 0);
    }

    fn outcomes(&self, id: BatchId) -> Vec<ItemOutcome> {
        self.done
            .iter()
            .find_map(|PushEvent::BatchDone { batch, outcomes }| (*batch == id).then(|| outcomes.clone()))
            .unwrap_or_else(|| panic!("{id} is not done"))
    }

    fn is_done(&self, id: BatchId) -> bool {
        self.done.iter().any(|PushEvent::BatchDone { batch, .. }| *batch == id)
    }

    fn call(&mut self, rank: usize, request: Value) -> Value {
        let frame = serde_json::to_vec(&request).unwrap();
        let now = self.now;
        let reply = self.shards.get_mut(&addr(rank)).unwrap().handle_request(&frame, now);
        reply_result(&reply).expect("direct call succeeds")
    }

    fn status(&mut self, rank: usize, tid: &str) -> Value {
        self.call(rank, json!({"op": "status", "transfer_id": tid}))
    }

    /// Requests sent to `rank` with op `op`.
    fn sent_to(&self, rank: usize, op: &str) -> Vec<Value> {
        self.sent.iter().filter(|(a, r)| *a == addr(rank) && r["op"] == op).map(|(_, r)| r.clone()).collect()
    }

    fn ops_to(&self, rank: usize) -> Vec<String> {
        self.sent
            .iter()
            .filter(|(a, _)| *a == addr(rank))
            .map(|(_, r)| r["op"].as_str().unwrap_or("?").to_string())
            .collect()
    }

    fn sent_ops(&self, op: &str) -> usize {
        self.sent.iter().filter(|(_, r)| r["op"] == op).count()
    }

    fn readiness(&mut self, rank: usize) -> Vec<Value> {
        let shard = self.shards.get_mut(&addr(rank)).unwrap();
        let mut out = Vec::new();
        while let Some(frame) = shard.peek_event() {
            out.push(serde_json::from_slice(frame).unwrap());
            shard.confirm_sent();
        }
        out
    }

    /// The bytes a rank's slab holds at a reservation's destination.
    fn landed(&self, rank: usize, dst_ptr: u64, len: u64) -> Vec<u8> {
        self.dp.read(&session(rank), dst_ptr, len as usize).unwrap().to_vec()
    }
}

fn source_bytes(tid: &str, nbytes: u64) -> Vec<u8> {
    let seed = tid.bytes().fold(7u8, |a, b| a.wrapping_mul(31).wrapping_add(b));
    (0..nbytes).map(|k| seed.wrapping_add((k % 251) as u8)).collect()
}

fn failed(error: &str) -> ItemOutcome {
    ItemOutcome::Failed { error: error.into() }
}

fn cancel(tid: &str, rid: &str) -> Value {
    json!({"op": "cancel", "transfer_id": tid, "reservation_id": rid, "abandon": true})
}

/// The reservation id of `tid`'s active record on `rank`.
fn granted_rid(w: &mut World, rank: usize, tid: &str) -> String {
    w.status(rank, tid)["reservation_id"].as_str().expect("an active reservation").to_string()
}

#[test]
fn push_to_tp2_reserves_writes_and_completes_on_every_shard() {
    let mut w = World::new(&[POOL, POOL]);
    let id = w.push(vec![item("t1", "h1")], true);
    w.run();
    assert_eq!(w.outcomes(id), vec![ItemOutcome::Pushed]);
    // Discovery once at the base address, then one reserve and one complete_batch per shard.
    assert_eq!(w.ops_to(0), ["peers", "reserve", "complete_batch"]);
    assert_eq!(w.ops_to(1), ["reserve", "complete_batch"]);
    assert_eq!(
        w.sent_to(1, "reserve")[0],
        json!({"op": "reserve", "transfer_id": "t1", "mm_hash": "h1", "nbytes": NBYTES, "shape": [64, 128], "dtype": "float16"})
    );
    let src = source_bytes("t1", NBYTES);
    for rank in 0..2 {
        // The first reservation of a fresh slab sits at its base.
        assert_eq!(w.landed(rank, slab_base(rank), NBYTES), src, "rank {rank} holds the tensor");
        let status = w.status(rank, "t1");
        assert_eq!(status["ready"], true);
        let events = w.readiness(rank);
        assert_eq!(events.len(), 1, "rank {rank} publishes readiness");
        assert_eq!(events[0]["transfer_id"], "t1");
        assert_eq!(events[0]["shard"], FIRST_PORT + rank as u16);
        assert_eq!(events[0]["reservation_id"], status["reservation_id"]);
    }
    assert_eq!(w.dp.writes().len(), 2);
    assert!(w.coord.is_idle());
}

#[test]
fn tp3_batch_uses_reserve_batch_and_one_complete_batch_per_shard() {
    let mut w = World::new(&[POOL, POOL, POOL]);
    let id = w.push(vec![item("a", "ha"), item("b", "hb")], true);
    w.run();
    assert_eq!(w.outcomes(id), vec![ItemOutcome::Pushed, ItemOutcome::Pushed]);
    for rank in 0..3 {
        assert_eq!(w.sent_to(rank, "reserve_batch").len(), 1);
        let complete = &w.sent_to(rank, "complete_batch")[0];
        let rids = [granted_rid(&mut w, rank, "a"), granted_rid(&mut w, rank, "b")];
        assert_eq!(
            complete["items"],
            json!([{"transfer_id": "a", "reservation_id": rids[0]}, {"transfer_id": "b", "reservation_id": rids[1]}])
        );
        assert_eq!(w.landed(rank, slab_base(rank) + NBYTES, NBYTES), source_bytes("b", NBYTES));
        assert_eq!(w.readiness(rank).len(), 2);
    }
}

#[test]
fn topology_retries_transient_discovery_failures_and_caches_success() {
    let mut w = World::new(&[POOL, POOL]);
    let mut peers_seen = 0;
    w.hook(move |_, _, r| {
        if r["op"] == "peers" {
            peers_seen += 1;
            if peers_seen == 1 {
                return Fault::Fail(TIMEOUT.into());
            }
        }
        Fault::Deliver
    });
    let first = w.push(vec![item("t1", "h1")], true);
    w.run();
    assert_eq!(w.outcomes(first), vec![ItemOutcome::Pushed]);
    let second = w.push(vec![item("t2", "h2")], true);
    w.run();
    assert_eq!(w.outcomes(second), vec![ItemOutcome::Pushed]);
    assert_eq!(w.sent_ops("peers"), 2, "one failure, one success, then the cache");
    assert_eq!(w.coord.topology().get(&addr(0)).unwrap(), [addr(0), addr(1)]);
}

#[test]
fn reservation_requires_confirmed_topology_before_any_rpc() {
    let mut w = World::new(&[POOL, POOL]);
    w.hook(|_, _, r| if r["op"] == "peers" { Fault::Fail(TIMEOUT.into()) } else { Fault::Deliver });
    let id = w.push(vec![item("a", "ha"), item("b", "hb")], true);
    w.run();
    let error = format!("Could not discover every EC consumer shard at {}", addr(0));
    assert_eq!(w.outcomes(id), vec![failed(&error), failed(&error)]);
    assert_eq!(w.sent_ops("peers"), 2, "DISCOVERY_ATTEMPTS");
    assert_eq!(w.sent.len(), 2, "no reserve, no cancel, no base-address fallback");
    assert!(w.coord.topology().get(&addr(0)).is_none(), "failures are not cached");
    assert!(w.dp.writes().is_empty());
}

#[test]
fn partial_reserve_is_compensated_before_its_future_fails() {
    // Shard 1's pool cannot hold the tensor.
    let mut w = World::new(&[POOL, 256]);
    let id = w.push(vec![item("t1", "h1")], true);
    assert_eq!(w.step(), 1, "peers");
    assert_eq!(w.step(), 2, "reserve on both shards");
    assert!(!w.is_done(id), "the item does not fail before its cleanup settles");
    let r0 = granted_rid(&mut w, 0, "t1");
    w.run();
    assert_eq!(w.outcomes(id), vec![failed("EC consumer buffer pool is full")]);
    assert_eq!(w.sent_to(0, "cancel"), vec![cancel("t1", &r0)]);
    assert!(w.sent_to(1, "cancel").is_empty(), "the shard that refused holds nothing of this push");
    assert_eq!(w.status(0, "t1"), Value::Null, "shard 0's reservation is abandoned");
    assert!(w.dp.writes().is_empty());
    assert_eq!(w.sent_ops("complete_batch"), 0);
    // The slab on shard 0 is free again: the same bytes can be reserved by another transfer.
    assert_eq!(w.shards[&addr(0)].book().slab().used_bytes(), 0);
}

#[test]
fn reserve_executed_after_the_producer_gave_up_is_freed_by_the_empty_id_cancel() {
    // S10: shard 1 runs the reserve but its reply is lost.
    let mut w = World::new(&[POOL, POOL]);
    w.hook(
        |_, a, r| {
            if a == addr(1) && r["op"] == "reserve" {
                Fault::LoseReply(TIMEOUT.into())
            } else {
                Fault::Deliver
            }
        },
    );
    let id = w.push(vec![item("t1", "h1")], true);
    w.run();
    assert_eq!(w.outcomes(id), vec![failed(TIMEOUT)]);
    assert_eq!(w.sent_to(1, "cancel"), vec![cancel("t1", "")]);
    for rank in 0..2 {
        assert_eq!(w.status(rank, "t1"), Value::Null, "rank {rank} freed");
        assert_eq!(w.shards[&addr(rank)].book().slab().used_bytes(), 0);
    }
}

#[test]
fn partial_batch_reservation_cleans_only_the_failed_item() {
    // Shard 1 holds exactly one tensor: the second item of the batch fails there.
    let mut w = World::new(&[POOL, NBYTES]);
    let id = w.push(vec![item("a", "ha"), item("b", "hb")], true);
    w.run();
    assert_eq!(w.outcomes(id), vec![ItemOutcome::Pushed, failed("EC consumer buffer pool is full")]);
    let cancels: Vec<Value> = w.sent.iter().filter(|(_, r)| r["op"] == "cancel").map(|(_, r)| r.clone()).collect();
    assert_eq!(cancels.len(), 1, "rank 0's grant; rank 1 refused the item");
    assert!(cancels.iter().all(|c| c["transfer_id"] == "b" && c["abandon"] == true), "{cancels:?}");
    for rank in 0..2 {
        assert_eq!(w.status(rank, "a")["ready"], true, "the sibling keeps its reservation on rank {rank}");
        assert_eq!(w.status(rank, "b"), Value::Null);
        let complete = &w.sent_to(rank, "complete_batch")[0];
        assert_eq!(complete["items"].as_array().unwrap().len(), 1);
        assert_eq!(complete["items"][0]["transfer_id"], "a");
    }
}

#[test]
fn consumer_cancel_before_reserve_skips_the_write() {
    let mut w = World::new(&[POOL, POOL]);
    // S13: the consumer's plain cancel reached shard 0 first (a tombstone).
    assert_eq!(
        w.call(0, json!({"op": "cancel", "transfer_id": "t1", "reservation_id": ""})),
        json!({"cancelled": true})
    );
    let id = w.push(vec![item("t1", "h1")], true);
    w.run();
    assert_eq!(w.outcomes(id), vec![ItemOutcome::Skipped { reason: SkipReason::ConsumerCancelled }]);
    assert!(w.dp.writes().is_empty(), "no write");
    assert_eq!(w.sent_ops("complete_batch"), 0);
    assert_eq!(w.sent_to(0, "cancel"), Vec::<Value>::new(), "nothing held on the cancelled shard");
    assert_eq!(w.sent_to(1, "cancel").len(), 1, "shard 1's writer grant is abandoned");
    assert_eq!(w.status(1, "t1"), Value::Null);
}

#[test]
fn follower_is_neither_written_nor_completed() {
    // S14: two transfers of one mm_hash; the second shares the first's destination.
    let mut w = World::new(&[POOL, POOL]);
    let writer = w.push(vec![item("w", "h")], false);
    w.run();
    let follower = w.push(vec![item("f", "h")], true);
    w.run();
    assert_eq!(w.outcomes(follower), vec![ItemOutcome::Skipped { reason: SkipReason::NotWriter }]);
    assert!(w.dp.writes().is_empty());
    w.coord.bind_source(writer, w.now).unwrap();
    w.run();
    assert_eq!(w.outcomes(writer), vec![ItemOutcome::Pushed]);
    for rank in 0..2 {
        let complete = &w.sent_to(rank, "complete_batch");
        assert_eq!(complete.len(), 1);
        assert_eq!(complete[0]["items"][0]["transfer_id"], "w");
        let ids: Vec<Value> = w.readiness(rank).iter().map(|e| e["transfer_id"].clone()).collect();
        assert_eq!(ids, [json!("f"), json!("w")], "follower published before its writer");
    }
}

#[test]
fn stale_shards_are_abandoned_before_remote_re_reserve() {
    let mut w = World::new(&[POOL, POOL]);
    let id = w.push(vec![item("t1", "h1")], false);
    w.run();
    let old: Vec<String> = (0..2).map(|r| granted_rid(&mut w, r, "t1")).collect();
    w.now = T0 + Duration::from_secs(150);
    w.coord.bind_source(id, w.now).unwrap();
    w.run();
    assert_eq!(w.outcomes(id), vec![ItemOutcome::Pushed]);
    for (rank, old) in old.iter().enumerate() {
        assert_eq!(
            w.ops_to(rank).iter().filter(|op| *op != "peers").collect::<Vec<_>>(),
            ["reserve", "cancel", "reserve", "complete_batch"]
        );
        assert_eq!(
            w.sent_to(rank, "cancel")[0],
            json!({"op": "cancel", "transfer_id": "t1", "reservation_id": old, "abandon": true, "refresh": true})
        );
        let new = granted_rid(&mut w, rank, "t1");
        assert_ne!(&new, old, "a fresh reservation id");
        assert_eq!(w.sent_to(rank, "complete_batch")[0]["items"][0]["reservation_id"], new);
        assert_eq!(w.status(rank, "t1")["ready"], true);
        // S12: a late completion carrying the old id is refused and leaves the new record alone.
        let late = w.call(rank, json!({"op": "complete", "transfer_id": "t1", "reservation_id": old}));
        assert_eq!(late, json!({"completed": false, "became_ready": false}));
        assert_eq!(w.status(rank, "t1")["reservation_id"], new.as_str());
    }
}

#[test]
fn a_source_that_arrives_in_time_is_written_without_refresh() {
    let mut w = World::new(&[POOL, POOL]);
    let id = w.push(vec![item("t1", "h1")], false);
    w.run();
    assert!(w.dp.writes().is_empty(), "writes wait for the source");
    w.now = T0 + Duration::from_secs(149);
    w.coord.bind_source(id, w.now).unwrap();
    w.run();
    assert_eq!(w.outcomes(id), vec![ItemOutcome::Pushed]);
    assert_eq!(w.sent_ops("cancel"), 0);
    assert_eq!(w.sent_ops("reserve"), 2);
}

#[test]
fn expired_writer_is_replaced_only_after_refresh_abandon() {
    let mut w = World::new(&[POOL, POOL]);
    let id = w.push(vec![item("t1", "h1")], false);
    w.run();
    // The consumer's TTL defers both writers (EXPIRE_PENDING): a plain re-reserve would fail.
    w.now = T0 + Duration::from_secs(400);
    for shard in w.shards.values_mut() {
        shard.handle_timeout(w.now);
    }
    let plain = w.call(0, json!({"op": "status", "transfer_id": "t1"}));
    assert_eq!(plain["ready"], false, "still active, writer-owned");
    w.coord.bind_source(id, w.now).unwrap();
    w.run();
    assert_eq!(w.outcomes(id), vec![ItemOutcome::Pushed]);
    for rank in 0..2 {
        assert_eq!(w.status(rank, "t1")["ready"], true);
    }
}

/// Before shard 1 sees the `complete_batch`, item `a`'s reservation there is abandoned
/// behind the producer's back (a stale reservation the consumer side already dropped).
fn reject_first_completion_on_shard_1(w: &mut World) {
    w.hook(|shards, a, r| {
        if a == addr(1) && r["op"] == "complete_batch" {
            let shard = shards.get_mut(a).unwrap();
            let rid = r["items"][0]["reservation_id"].clone();
            let frame = serde_json::to_vec(&cancel("a", rid.as_str().unwrap())).unwrap();
            shard.handle_request(&frame, T0);
        }
        Fault::Deliver
    });
}

#[test]
fn completion_rejection_fails_the_whole_gen_a_batch_and_abandons_it() {
    let mut w = World::new(&[POOL, POOL]);
    reject_first_completion_on_shard_1(&mut w);
    let id = w.push(vec![item("a", "ha"), item("b", "hb")], true);
    w.run();
    let error = "Unknown EC reservation for mm_hash=ha";
    assert_eq!(w.outcomes(id), vec![failed(error), failed(error)]);
    assert_eq!(w.sent_ops("cancel"), 4, "every shard reservation of the batch is abandoned");
    for rank in 0..2 {
        for tid in ["a", "b"] {
            assert_eq!(w.status(rank, tid), Value::Null, "{tid} on rank {rank}");
        }
        assert_eq!(w.shards[&addr(rank)].book().slab().used_bytes(), 0);
    }
}

#[test]
fn gen_b_logs_a_rejected_completion_and_completes_the_rest() {
    let config = PushConfig { gen_b_completion: true, ..PushConfig::default() };
    let mut w = World::with_config(&[POOL, POOL], config);
    reject_first_completion_on_shard_1(&mut w);
    let id = w.push(vec![item("a", "ha"), item("b", "hb")], true);
    w.run();
    let outcomes = w.outcomes(id);
    assert!(
        matches!(&outcomes[0], ItemOutcome::Failed { error } if error.contains("rejected") && error.contains("ha"))
    );
    assert_eq!(outcomes[1], ItemOutcome::Pushed);
    assert_eq!(w.sent_ops("cancel"), 0, "nothing is abandoned");
    for rank in 0..2 {
        assert_eq!(w.status(rank, "b")["ready"], true);
    }
}

#[test]
fn failed_push_is_reported_not_raised() {
    // S19: the Mooncake write to shard 1 fails.
    let mut w = World::new(&[POOL, POOL]);
    w.dp.fail_next(&session(1), -1);
    let id = w.push(vec![item("t1", "h1")], true);
    w.run();
    assert_eq!(w.outcomes(id), vec![failed("Mooncake EC push to 10.0.0.5:15418 failed with status -1")]);
    assert_eq!(w.sent_ops("complete_batch"), 0);
    assert_eq!(w.sent_ops("cancel"), 2);
    for rank in 0..2 {
        assert_eq!(w.status(rank, "t1"), Value::Null, "rank {rank} abandoned");
        assert!(w.readiness(rank).is_empty());
    }
}

#[test]
fn a_failed_write_waits_for_the_write_still_in_flight() {
    // S18: the batch is not abandoned nor reported while another write still reads the source.
    let mut w = World::new(&[POOL, POOL]);
    w.dp.fail_next(&session(0), 5);
    let id = w.push(vec![item("t1", "h1")], true);
    w.step(); // peers
    w.step(); // reserves
    let writes = w.collect();
    assert_eq!(writes.len(), 2);
    let mut writes = writes.into_iter();
    w.deliver(writes.next().unwrap()); // shard 0's write fails
    assert!(w.collect().is_empty(), "no abandon while shard 1's write is in flight");
    assert!(!w.is_done(id));
    w.deliver(writes.next().unwrap());
    w.run();
    assert_eq!(w.outcomes(id), vec![failed("Mooncake EC push to 10.0.0.5:15417 failed with status 5")]);
    assert_eq!(w.sent_ops("cancel"), 2);
}

#[test]
fn partial_complete_abandons_all_shards_before_releasing_source() {
    // S17: shard 0's complete_batch fails while shard 1's is still in flight.
    let mut w = World::new(&[POOL, POOL]);
    w.hook(
        |_, a, r| {
            if a == addr(0) && r["op"] == "complete_batch" {
                Fault::LoseReply(TIMEOUT.into())
            } else {
                Fault::Deliver
            }
        },
    );
    let id = w.push(vec![item("t1", "h1")], true);
    w.step(); // peers
    w.step(); // reserves
    let rids: Vec<String> = (0..2).map(|r| granted_rid(&mut w, r, "t1")).collect();
    w.step(); // writes
    let completes = w.collect();
    assert_eq!(completes.len(), 2);
    let mut completes = completes.into_iter();
    w.deliver(completes.next().unwrap());
    assert!(w.collect().is_empty(), "the producer waits for every shard's completion");
    assert!(!w.is_done(id));
    w.deliver(completes.next().unwrap());
    w.run();
    assert_eq!(w.outcomes(id), vec![failed(TIMEOUT)]);
    for (rank, rid) in rids.iter().enumerate() {
        assert_eq!(w.sent_to(rank, "cancel"), vec![cancel("t1", rid)]);
        assert_eq!(w.status(rank, "t1"), Value::Null);
    }
}

#[test]
fn a_failed_cleanup_cancel_is_retried_exactly_once() {
    let mut w = World::new(&[POOL, 256]);
    let mut failures = 1;
    w.hook(move |_, a, r| {
        if a == addr(0) && r["op"] == "cancel" && failures > 0 {
            failures -= 1;
            return Fault::Fail(TIMEOUT.into());
        }
        Fault::Deliver
    });
    let id = w.push(vec![item("t1", "h1")], true);
    w.run();
    assert_eq!(w.outcomes(id), vec![failed("EC consumer buffer pool is full")]);
    let cancels = w.sent_to(0, "cancel");
    assert_eq!(cancels.len(), 2, "{cancels:?}");
    assert_eq!(cancels[0], cancels[1], "the same abandon, retried");
    assert_ne!(cancels[0]["reservation_id"], "", "rank 0's grant");
    assert_eq!(w.status(0, "t1"), Value::Null, "the retry freed it");
}

#[test]
fn a_permanently_failing_cleanup_cancel_stops_after_two_attempts() {
    let mut w = World::new(&[POOL, 256]);
    w.hook(|_, a, r| if a == addr(0) && r["op"] == "cancel" { Fault::Fail(TIMEOUT.into()) } else { Fault::Deliver });
    let id = w.push(vec![item("t1", "h1")], true);
    w.run();
    assert_eq!(w.outcomes(id), vec![failed("EC consumer buffer pool is full")], "the reserve error stays");
    assert_eq!(w.sent_to(0, "cancel").len(), 2);
    assert!(w.coord.is_idle(), "no third attempt is pending");
}

#[test]
fn finished_request_cancels_unbound_reservation() {
    // S20: the producer request finished before its encoder output was bound.
    let mut w = World::new(&[POOL, POOL]);
    let id = w.push(vec![item("t1", "h1")], false);
    w.run();
    assert!(!w.is_done(id));
    w.coord.orphan(id, w.now).unwrap();
    w.run();
    assert_eq!(w.outcomes(id), vec![ItemOutcome::Skipped { reason: SkipReason::Unbound }]);
    for rank in 0..2 {
        assert_eq!(w.sent_to(rank, "cancel").len(), 1);
        assert_eq!(w.status(rank, "t1"), Value::Null);
    }
    assert!(w.dp.writes().is_empty());
}

#[test]
fn permanent_orphan_cleanup_failure_marks_push_failed() {
    let mut w = World::new(&[POOL, POOL]);
    let id = w.push(vec![item("t1", "h1")], false);
    w.run();
    w.hook(|_, a, r| if a == addr(1) && r["op"] == "cancel" { Fault::Fail(TIMEOUT.into()) } else { Fault::Deliver });
    assert_eq!(w.coord.orphan_unbound(w.now), 1);
    w.run();
    assert_eq!(w.outcomes(id), vec![failed(TIMEOUT)]);
    assert_eq!(w.sent_to(1, "cancel").len(), 2);
}

#[test]
fn orphan_while_reserving_abandons_once_reservations_settle() {
    let mut w = World::new(&[POOL, POOL]);
    let id = w.push(vec![item("t1", "h1")], false);
    w.step(); // peers
    let reserves = w.collect();
    w.coord.orphan(id, w.now).unwrap();
    for t in reserves {
        w.deliver(t);
    }
    w.run();
    assert_eq!(w.outcomes(id), vec![ItemOutcome::Skipped { reason: SkipReason::Unbound }]);
    for rank in 0..2 {
        assert_eq!(w.status(rank, "t1"), Value::Null);
    }
}

#[test]
fn same_inputs_give_the_same_traffic() {
    let run = || {
        // Shard 1 holds two of the three tensors: one item fails, which one is decided
        // by the order of the traffic alone.
        let mut w = World::new(&[POOL, 2 * NBYTES, POOL]);
        let a = w.push(vec![item("a", "ha"), item("b", "hb")], true);
        let c = w.push(vec![item("c", "hc")], false);
        w.run();
        w.now = T0 + Duration::from_secs(200);
        let _ = w.coord.bind_source(c, w.now);
        w.run();
        let (oa, oc) = (w.outcomes(a), w.outcomes(c));
        (w.sent, oa, oc)
    };
    assert_eq!(run(), run());
}
