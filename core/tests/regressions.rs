//! The regression switches of the race catalogue (`docs/races.md`): each test drives one
//! core machine directly (sans-IO) through its race and shows what changes when the switch
//! restores the historical behaviour. Default configurations must keep the fixed behaviour.

use ctlplane_core::ec::defaults::RESERVATION_TTL;
use ctlplane_core::ec::inbox::{DiscoveryStep, EndpointDiscovery, Inbox, InboxRegressions, ReadyEvent, Subscribe};
use ctlplane_core::ec::producer::{
    BatchId, ItemOutcome, PushBatch, PushConfig, PushCoordinator, PushEvent, PushItem, PushRegressions, SkipReason,
    Transmit,
};
use ctlplane_core::ec::readiness::{EventFate, Readiness};
use ctlplane_core::ec::request_slot::{Ending, Failure, Outcome, ReplyError, RequestSlot, SlotRegressions};
use ctlplane_core::ec::reservations::{BookRegressions, ReserveRequest, Reserved};
use ctlplane_core::ec::shard::{reply_result, Halt, ShardRegressions};
use ctlplane_core::ec::topology::TopologyCache;
use ctlplane_core::ec::{wire, BookConfig, ConsumerShard, DType, ReservationBook, ShardConfig, State};
use ctlplane_core::p2p::manager::{admit, Admission, Existing, ManagerRegressions};
use ctlplane_core::p2p::value::{encode, Value as MsgValue};
use ctlplane_core::p2p::{ConnectionRegistry, PollInput, RegistryConfig};
use ctlplane_core::regressions::{self, Regressions, RACES};
use ctlplane_core::Instant;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

type Shard = ConsumerShard<ChaCha8Rng>;

const T0: Instant = Instant::from_secs(1000);
const NBYTES: u64 = 16384;
const POOL: u64 = 1 << 20;
const TIMEOUT: &str = "Resource temporarily unavailable";
const MALFORMED: &[u8] = br#"{"ok": false, "error": "malformed control request"}"#;
const PEERS: &[u8] = br#"{"op": "peers"}"#;

fn shard(regressions: ShardRegressions) -> Shard {
    let mut config = ShardConfig::new(19019, POOL);
    config.regressions = regressions;
    ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(1), T0)
}

fn reserve_frame(tid: &str, hash: &str) -> Vec<u8> {
    serde_json::to_vec(
        &json!({"op": "reserve", "transfer_id": tid, "mm_hash": hash, "nbytes": 16, "shape": [8], "dtype": "float16"}),
    )
    .unwrap()
}

// ---------------------------------------------------------------------------------------
// EC S1, S2: the control server dies

#[test]
fn ec_s1_undecodable_request_halts_the_server_only_with_the_switch() {
    let mut fixed = shard(ShardRegressions::default());
    assert_eq!(fixed.handle_request(b"{not json", T0), MALFORMED);
    assert_eq!(fixed.halted(), None);
    assert_eq!(reply_result(&fixed.handle_request(PEERS, T0)), Ok(json!({"ports": [19019]})));

    let mut old = shard(ShardRegressions { s1_undecodable_kills_server: true, ..ShardRegressions::default() });
    assert!(old.handle_request(b"{not json", T0).is_empty(), "no reply: the REP never answers");
    assert_eq!(old.halted(), Some(Halt::UndecodableRequest));
    assert!(old.handle_request(PEERS, T0).is_empty(), "nothing is served after the death");
    assert_eq!(old.poll_timeout(), None);
    // A well-formed request on a live historical shard is still served.
    let mut live = shard(ShardRegressions { s1_undecodable_kills_server: true, ..ShardRegressions::default() });
    assert_eq!(reply_result(&live.handle_request(PEERS, T0)), Ok(json!({"ports": [19019]})));
    assert_eq!(live.halted(), None);
}

#[test]
fn ec_s2_reap_fault_halts_the_server_from_its_instant_on() {
    let fault = T0 + Duration::from_secs(5);
    let mut old = shard(ShardRegressions { s2_reap_fault_at: Some(fault), ..ShardRegressions::default() });
    let mut fixed = shard(ShardRegressions::default());
    for s in [&mut old, &mut fixed] {
        for k in 1..5 {
            s.handle_timeout(T0 + Duration::from_secs(k));
        }
        assert_eq!(s.halted(), None, "before the fault both serve");
        assert!(!s.handle_request(&reserve_frame("t1", "h1"), T0 + Duration::from_secs(4)).is_empty());
        assert_eq!(s.pending_events(), 0);
        s.handle_timeout(fault);
    }
    assert_eq!(old.halted(), Some(Halt::ReapFailed));
    assert!(old.handle_request(PEERS, fault).is_empty(), "every later request goes unanswered");
    assert_eq!(old.poll_timeout(), None);
    assert_eq!(fixed.halted(), None);
    assert_eq!(fixed.stats().reaps, 5);
    assert_eq!(reply_result(&fixed.handle_request(PEERS, fault)), Ok(json!({"ports": [19019]})));
}

// ---------------------------------------------------------------------------------------
// EC S4: present behaviour, no switch

#[test]
fn ec_s4_full_backlog_drops_the_oldest_and_counts_it() {
    let mut config = ShardConfig::new(19019, POOL);
    config.max_pending_events = 2;
    let mut s = ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(1), T0);
    for t in ["a", "b", "c"] {
        let granted = reply_result(&s.handle_request(&reserve_frame(t, &format!("h{t}")), T0)).unwrap();
        let rid = granted["reservation_id"].as_str().unwrap().to_string();
        let complete = json!({"op": "complete", "transfer_id": t, "reservation_id": rid});
        s.handle_request(&serde_json::to_vec(&complete).unwrap(), T0);
    }
    assert_eq!(s.pending_events(), 2, "the bound holds");
    assert_eq!(s.stats().events_dropped, 1, "the drop is counted");
    let first: Value = serde_json::from_slice(s.peek_event().unwrap()).unwrap();
    assert_eq!(first["transfer_id"], "b", "the oldest (a) went");
    assert_eq!(s.book().state_of("a"), Some(State::Ready), "a's reservation stays until cancel or TTL");
}

// ---------------------------------------------------------------------------------------
// EC S5, S6: the scheduler's event inbox

#[test]
fn ec_s5_inline_discovery_is_asked_of_the_driver_only_with_the_switch() {
    let mut fixed = Inbox::default();
    let mut old = Inbox::new(InboxRegressions { s5_inline_discovery: true, ..InboxRegressions::default() });
    let cache = TopologyCache::default();
    for (inbox, inline) in [(&mut fixed, false), (&mut old, true)] {
        // Both ask for a pass on every drain while the consumer stays unreachable: the
        // failure is not cached, so an inline pass costs its timeouts on every drain.
        for _ in 0..3 {
            let start = inbox.on_drain("tcp://10.0.0.5:19019", &cache).expect("a pass on every drain");
            assert_eq!(start.inline, inline);
            assert_eq!(inbox.on_discovery(Err(TIMEOUT.into())), None);
        }
    }
}

fn ready(tid: &str, shard: i64) -> ReadyEvent {
    ReadyEvent {
        transfer_id: tid.into(),
        mm_hash: "h".into(),
        nbytes: 16,
        shape: vec![8],
        dtype: "float16".into(),
        shard: Some(shard),
    }
}

#[test]
fn ec_s6_base_shard_only_makes_one_rank_enough() {
    let base = "tcp://10.0.0.5:19019";
    let endpoints: Vec<String> = (1..=3).map(|k| format!("tcp://10.0.0.5:2000{k}")).collect();
    let cache = TopologyCache::default();
    let mut outcomes = Vec::new();
    for regressions in
        [InboxRegressions::default(), InboxRegressions { s6_base_shard_only: true, ..Default::default() }]
    {
        let mut inbox = Inbox::new(regressions);
        let first = inbox.on_drain(base, &cache).expect("the first drain starts a pass").pass.step();
        let subscribed = inbox.on_discovery(Ok(endpoints.clone()));
        let mut readiness = Readiness::default();
        readiness.wait_for_event("t", "h", T0).unwrap();
        let fate = readiness.handle_event(ready("t", 19019), inbox.shard_count(), T0);
        outcomes.push((first, subscribed, inbox.shard_count(), fate));
    }
    let (first, subscribed, count, fate) = &outcomes[0];
    assert_eq!(first, &EndpointDiscovery::new(base, &TopologyCache::default()).step(), "peers first");
    assert_eq!(subscribed, &Some(Subscribe { endpoints: endpoints.clone() }));
    assert_eq!((*count, *fate), (3, EventFate::Partial), "rank 0 alone is not enough");

    let (first, subscribed, count, fate) = &outcomes[1];
    assert!(
        matches!(first, DiscoveryStep::Request { addr, frame } if addr == base && frame == br#"{"op": "event_port"}"#),
        "only the base's event_port"
    );
    assert_eq!(subscribed, &Some(Subscribe { endpoints: endpoints[..1].to_vec() }));
    assert_eq!((*count, *fate), (1, EventFate::Accepted), "accepted before ranks 1 and 2 hold it");
}

// ---------------------------------------------------------------------------------------
// EC S9: the REQ slot

#[test]
fn ec_s9_reused_socket_takes_the_late_reply_as_the_next_answer() {
    const LATE: &[u8] = br#"{"ok": true, "result": "late"}"#;
    let timeout = Duration::from_secs(30);
    let mut fixed = RequestSlot::new(timeout);
    let mut old = RequestSlot::with_regressions(timeout, SlotRegressions { s9_reuse_after_timeout: true });
    for slot in [&mut fixed, &mut old] {
        assert!(slot.begin(T0).unwrap().open);
    }
    let late = T0 + timeout;
    let timed_out = |slot: &mut RequestSlot| slot.finish::<Value, ()>(1, Ending::TimedOut, wire::decode_reply);
    assert_eq!(timed_out(&mut fixed), Outcome { discard_socket: true, result: Err(Failure::TimedOut) });
    let kept = timed_out(&mut old);
    assert_eq!(kept, Outcome { discard_socket: false, result: Err(Failure::TimedOut) }, "the timed-out socket is kept");

    let next = fixed.begin(late).unwrap();
    assert_eq!((next.generation, next.open), (2, true));
    let dropped = fixed.finish::<Value, ()>(1, Ending::Reply(LATE), wire::decode_reply);
    assert_eq!(dropped.result, Err(Failure::Stale), "the late reply of request 1 is dropped");

    let next = old.begin(late).unwrap();
    assert_eq!((next.generation, next.open), (1, false), "request 2 goes out on the old socket");
    let taken = old.finish::<Value, ()>(1, Ending::Reply(LATE), wire::decode_reply);
    assert_eq!(taken.result, Ok(json!("late")), "request 1's late reply answers request 2");
}

// ---------------------------------------------------------------------------------------
// EC S11-S14: the reservation book

fn book(regressions: BookRegressions) -> ReservationBook<ChaCha8Rng> {
    let config = BookConfig { regressions, ..BookConfig::default() };
    ReservationBook::new(POOL, config, ChaCha8Rng::seed_from_u64(7))
}

fn req(tid: &str, hash: &str) -> ReserveRequest {
    ReserveRequest {
        transfer_id: tid.into(),
        mm_hash: hash.into(),
        nbytes: NBYTES,
        shape: vec![64, 64],
        dtype: DType::Float16,
    }
}

fn granted(r: Result<Reserved, ctlplane_core::ec::ReserveError>) -> (String, u64, bool) {
    match r {
        Ok(Reserved::Granted { reservation_id, view, write, .. }) => {
            (reservation_id.to_string(), view.region.offset, write)
        }
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn ec_s11_grace_period_frees_a_destination_its_writer_still_writes() {
    let grace = Duration::from_secs(10);
    let mut fixed = book(BookRegressions::default());
    let mut old = book(BookRegressions { s11_grace_period_free: Some(grace), ..BookRegressions::default() });
    let mut offsets = Vec::new();
    for b in [&mut fixed, &mut old] {
        let (rid, offset, write) = granted(b.reserve(&req("t1", "h1"), T0));
        assert!(write);
        assert!(b.cancel("t1", &rid, false, false, T0), "plain cancel defers");
        assert_eq!(b.state_of("t1"), Some(State::CancelPending));
        b.expire(T0 + grace);
        b.check_invariants().unwrap();
        // Another transfer asks for memory while t1's writer is still writing.
        let (_, other, _) = granted(b.reserve(&req("t2", "h2"), T0 + grace));
        offsets.push((offset, other, b.state_of("t1"), b.writer_owned_regions().len()));
        // The writer's completion comes last.
        let late = b.complete("t1", &rid, T0 + grace + Duration::from_secs(1));
        b.check_invariants().unwrap();
        offsets.push((0, 0, b.state_of("t1"), usize::from(late.0)));
    }
    let (t1, t2, state, owned) = offsets[0];
    assert_ne!(t1, t2, "fixed: t1's region stays reserved for its writer");
    assert_eq!((state, owned), (Some(State::CancelPending), 2));
    assert_eq!((offsets[1].2, offsets[1].3), (Some(State::Cancelled), 1), "the writer's completion frees it");

    let (t1, t2, state, owned) = offsets[2];
    assert_eq!(t1, t2, "historical: t2 is handed the region t1's writer still writes into");
    assert_eq!((state, owned), (Some(State::Cancelled), 1));
    assert_eq!(offsets[3].3, 0, "the late completion is refused");
}

#[test]
fn ec_s12_late_completion_with_the_old_id_completes_the_new_reservation() {
    let mut outcomes = Vec::new();
    for regressions in [
        BookRegressions::default(),
        BookRegressions { s12_complete_ignores_reservation_id: true, ..Default::default() },
    ] {
        let mut b = book(regressions);
        let (old_rid, _, _) = granted(b.reserve(&req("t1", "h1"), T0));
        // The producer's refresh abandons the stale reservation and reserves again.
        assert!(b.cancel("t1", &old_rid, true, true, T0 + Duration::from_secs(150)));
        let (new_rid, _, write) = granted(b.reserve(&req("t1", "h1"), T0 + Duration::from_secs(150)));
        assert!(write);
        assert_ne!(old_rid, new_rid);
        let late = b.complete("t1", &old_rid, T0 + Duration::from_secs(151));
        outcomes.push((late, b.state_of("t1")));
    }
    assert_eq!(outcomes[0], ((false, false), Some(State::Writing)), "fixed: the new record is untouched");
    assert_eq!(outcomes[1], ((true, true), Some(State::Ready)), "historical: READY before the new write landed");
}

#[test]
fn ec_s13_cancel_before_reserve_leaves_no_tombstone() {
    let mut fixed = book(BookRegressions::default());
    let mut old = book(BookRegressions { s13_no_cancel_tombstone: true, ..BookRegressions::default() });
    assert!(fixed.cancel("t1", "", false, false, T0));
    assert!(!old.cancel("t1", "", false, false, T0), "nothing to cancel");
    assert_eq!(fixed.reserve(&req("t1", "h1"), T0), Ok(Reserved::Cancelled), "the producer skips the write");
    assert_eq!(fixed.slab().used_bytes(), 0);
    let (_, _, write) = granted(old.reserve(&req("t1", "h1"), T0));
    assert!(write, "historical: memory allocated and written for a request that is gone");
    assert!(old.slab().used_bytes() > 0);
    old.check_invariants().unwrap();
}

#[test]
fn ec_s14_follower_refresh_abandons_the_shared_writer() {
    let mut states = Vec::new();
    for regressions in [
        BookRegressions::default(),
        BookRegressions { s14_follower_refresh_abandons_writer: true, ..Default::default() },
    ] {
        let mut b = book(regressions);
        let (_, w_off, write) = granted(b.reserve(&req("w", "h"), T0));
        assert!(write);
        let (f_rid, f_off, f_write) = granted(b.reserve(&req("f", "h"), T0));
        assert_eq!((f_off, f_write), (w_off, false), "the follower shares the writer's destination");
        assert!(b.cancel("f", &f_rid, true, true, T0));
        b.check_invariants().unwrap();
        states.push((b.state_of("w"), b.state_of("f"), b.slab().used_bytes() > 0));
    }
    assert_eq!(states[0], (Some(State::Writing), Some(State::Expired), true), "fixed: the writer keeps writing");
    assert_eq!(
        states[1],
        (Some(State::Expired), Some(State::Cancelled), false),
        "historical: the writer's destination is freed under its producer"
    );
}

/// Two pushes of one transfer id (ec-behaviour.md S24) on one rank: the second reserve is a
/// duplicate (`write: false`). Its push fails elsewhere and abandons what it holds here.
/// Fixed: the duplicate's grant is its own id, and its abandon releases that grant only; an
/// empty-id abandon (its reserve failed here) defers a shared record instead of freeing
/// it. Spec'd (the switch): one shared id, so either abandon frees the writer's region.
#[test]
fn ec_dup_push_a_duplicate_push_abandons_only_its_own_grant() {
    let mut outcomes = Vec::new();
    for regressions in
        [BookRegressions::default(), BookRegressions { dup_push_shares_grant: true, ..Default::default() }]
    {
        for empty_id in [false, true] {
            let mut b = book(regressions);
            let (w_rid, w_off, write) = granted(b.reserve(&req("t1", "h1"), T0));
            assert!(write);
            let (d_rid, d_off, d_write) = granted(b.reserve(&req("t1", "h1"), T0));
            assert_eq!((d_off, d_write), (w_off, false), "the duplicate shares the destination");
            let rid = if empty_id { String::new() } else { d_rid.clone() };
            assert!(b.cancel("t1", &rid, true, false, T0), "the duplicate push's cleanup");
            b.check_invariants().unwrap();
            let (_, other, _) = granted(b.reserve(&req("t2", "h2"), T0));
            let state = b.state_of("t1");
            let completed = b.complete("t1", &w_rid, T0 + Duration::from_secs(1));
            b.check_invariants().unwrap();
            outcomes.push((d_rid == w_rid, state, other == w_off, completed, b.state_of("t1")));
        }
    }
    assert_eq!(
        outcomes[0],
        (false, Some(State::Writing), false, (true, true), Some(State::Ready)),
        "fixed: the writer's push is untouched"
    );
    assert_eq!(
        outcomes[1],
        (false, Some(State::CancelPending), false, (true, false), Some(State::Cancelled)),
        "fixed: an empty-id abandon of a shared record waits for the writer's completion"
    );
    for historical in &outcomes[2..] {
        assert_eq!(
            *historical,
            (true, Some(State::Cancelled), true, (false, false), Some(State::Cancelled)),
            "spec'd: the writer's region is freed and handed on while its push writes"
        );
    }
}

// ---------------------------------------------------------------------------------------
// EC S8, S10, S12, S16, S17: the producer's push coordinator against real shards

fn addr(rank: usize) -> String {
    format!("tcp://10.0.0.5:{}", 19019 + rank)
}

fn item(tid: &str) -> PushItem {
    PushItem {
        transfer_id: tid.into(),
        mm_hash: format!("h-{tid}"),
        nbytes: NBYTES,
        shape: vec![64, 128],
        dtype: "float16".into(),
    }
}

/// What happens to a request.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fate {
    Deliver,
    /// Never reaches the shard.
    Fail,
    /// Runs on the shard; the reply is lost.
    LoseReply,
    /// Never runs on the shard; the client hears its refusal (`ok: false`).
    Refuse,
}

type Rule = Box<dyn Fn(&str, &Value) -> Fate>;

struct World {
    coord: PushCoordinator,
    shards: BTreeMap<String, Shard>,
    now: Instant,
    sent: Vec<(String, Value)>,
    done: Vec<PushEvent>,
    rule: Rule,
}

impl World {
    fn new(pools: &[u64], regressions: PushRegressions) -> Self {
        let ports: Vec<u16> = (0..pools.len()).map(|r| 19019 + r as u16).collect();
        let mut shards = BTreeMap::new();
        for (rank, &pool) in pools.iter().enumerate() {
            let mut config = ShardConfig::new(ports[rank], pool);
            config.peer_ports = ports.clone();
            config.dst_session = format!("session-{rank}");
            shards.insert(addr(rank), ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(rank as u64 + 1), T0));
        }
        let config = PushConfig { regressions, ..PushConfig::default() };
        World {
            coord: PushCoordinator::new(config),
            shards,
            now: T0,
            sent: Vec::new(),
            done: Vec::new(),
            rule: Box::new(|_, _| Fate::Deliver),
        }
    }

    fn collect(&mut self) -> Vec<Transmit> {
        std::iter::from_fn(|| self.coord.poll_transmit()).collect()
    }

    fn deliver(&mut self, t: Transmit) {
        match t {
            Transmit::Request { token, addr, frame, .. } => {
                let request: Value = serde_json::from_slice(&frame).unwrap();
                self.sent.push((addr.clone(), request.clone()));
                let fate = (self.rule)(&addr, &request);
                let reply = match (fate, self.shards.get_mut(&addr)) {
                    (Fate::Fail, _) | (_, None) => Err(TIMEOUT.into()),
                    (Fate::Refuse, _) => Err(ReplyError::Refused("malformed control request".into())),
                    (Fate::Deliver, Some(s)) => reply_result(&s.handle_request(&frame, self.now)),
                    (Fate::LoseReply, Some(s)) => {
                        s.handle_request(&frame, self.now);
                        Err(TIMEOUT.into())
                    }
                };
                self.coord.handle_reply(token, reply, self.now);
            }
            Transmit::Write { token, .. } => self.coord.handle_write(token, Ok(()), self.now),
        }
        while let Some(e) = self.coord.poll_event() {
            self.done.push(e);
        }
    }

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
    }

    fn outcomes(&self) -> Vec<ItemOutcome> {
        match self.done.as_slice() {
            [PushEvent::BatchDone { outcomes, .. }] => outcomes.clone(),
            other => panic!("expected one finished batch, got {other:?}"),
        }
    }

    fn ops_to(&self, rank: usize) -> Vec<String> {
        self.sent.iter().filter(|(a, _)| *a == addr(rank)).map(|(_, r)| r["op"].as_str().unwrap().to_string()).collect()
    }

    fn cancels_to(&self, rank: usize) -> Vec<String> {
        self.sent
            .iter()
            .filter(|(a, r)| *a == addr(rank) && r["op"] == "cancel")
            .map(|(_, r)| r["reservation_id"].as_str().unwrap().to_string())
            .collect()
    }

    fn used(&self, rank: usize) -> u64 {
        self.shards[&addr(rank)].book().slab().used_bytes()
    }

    fn state(&self, rank: usize, tid: &str) -> Option<State> {
        self.shards[&addr(rank)].book().state_of(tid)
    }

    fn events(&mut self, rank: usize) -> usize {
        let s = self.shards.get_mut(&addr(rank)).unwrap();
        let mut n = 0;
        while s.peek_event().is_some() {
            s.confirm_sent();
            n += 1;
        }
        n
    }
}

fn push(w: &mut World, tids: &[&str], source_ready: bool) -> BatchId {
    let mut batch = PushBatch::new(addr(0), tids.iter().map(|t| item(t)).collect());
    batch.source_ready = source_ready;
    w.coord.push(batch, w.now)
}

#[test]
fn ec_s8_failed_discovery_falls_back_to_rank_zero_only() {
    let peers_fail: fn(&str, &Value) -> Fate = |_, r| if r["op"] == "peers" { Fate::Fail } else { Fate::Deliver };
    let mut fixed = World::new(&[POOL, POOL], PushRegressions::default());
    fixed.rule = Box::new(peers_fail);
    push(&mut fixed, &["t1"], true);
    fixed.run();
    assert!(matches!(fixed.outcomes()[0], ItemOutcome::Failed { .. }));
    assert_eq!(fixed.ops_to(0), ["peers", "peers"], "two attempts, then nothing is sent");

    let mut old = World::new(&[POOL, POOL], PushRegressions { s8_base_fallback: true, ..Default::default() });
    old.rule = Box::new(peers_fail);
    push(&mut old, &["t1"], true);
    old.run();
    assert_eq!(old.outcomes(), vec![ItemOutcome::Pushed], "reported pushed");
    assert_eq!(old.ops_to(0), ["peers", "reserve", "complete_batch"]);
    assert!(old.ops_to(1).is_empty(), "rank 1 never hears of the item");
    assert_eq!((old.state(0, "t1"), old.state(1, "t1")), (Some(State::Ready), None));
    assert!(old.coord.topology().get(&addr(0)).is_none(), "the fallback is not cached");
}

#[test]
fn ec_s10_a_late_reserve_without_its_compensating_cancel_pins_memory() {
    let lose_rank1_reserve: fn(&str, &Value) -> Fate =
        |a, r| if a == addr(1) && r["op"] == "reserve" { Fate::LoseReply } else { Fate::Deliver };
    let mut results = Vec::new();
    for regressions in
        [PushRegressions::default(), PushRegressions { s10_no_compensating_cancel: true, ..Default::default() }]
    {
        let mut w = World::new(&[POOL, POOL], regressions);
        w.rule = Box::new(lose_rank1_reserve);
        push(&mut w, &["t1"], true);
        w.run();
        assert!(matches!(w.outcomes()[0], ItemOutcome::Failed { .. }));
        // The consumer's TTL passes: a writer nobody abandons is deferred, not freed.
        let later = T0 + RESERVATION_TTL + Duration::from_secs(1);
        w.shards.get_mut(&addr(1)).unwrap().handle_timeout(later);
        results.push((w.cancels_to(1), w.state(1, "t1"), w.used(1), w.used(0)));
    }
    assert_eq!(results[0], (vec![String::new()], None, 0, 0), "fixed: the empty-id abandon frees rank 1");
    let (cancels, state, used, used0) = &results[1];
    assert!(cancels.is_empty(), "historical: no cancel to the shard whose reserve timed out");
    assert_eq!(*state, Some(State::ExpirePending), "pinned with no deadline");
    assert!(*used > 0);
    assert_eq!(*used0, 0, "rank 0's grant is still abandoned");
}

#[test]
fn ec_s12_without_refresh_the_write_goes_to_a_deferred_reservation() {
    let mut results = Vec::new();
    for regressions in [PushRegressions::default(), PushRegressions { s12_no_refresh: true, ..Default::default() }] {
        let mut w = World::new(&[POOL, POOL], regressions);
        let id = push(&mut w, &["t1"], false);
        w.run();
        // The encoder output arrives after the consumer's TTL deferred the writers.
        w.now = T0 + RESERVATION_TTL + Duration::from_secs(1);
        for rank in 0..2 {
            let now = w.now;
            w.shards.get_mut(&addr(rank)).unwrap().handle_timeout(now);
            assert_eq!(w.state(rank, "t1"), Some(State::ExpirePending));
        }
        w.coord.bind_source(id, w.now).unwrap();
        w.run();
        let events: Vec<usize> = (0..2).map(|r| w.events(r)).collect();
        results.push((w.outcomes(), events, w.state(0, "t1"), w.ops_to(0)));
    }
    let (outcomes, events, state, ops) = &results[0];
    assert_eq!(outcomes, &vec![ItemOutcome::Pushed]);
    assert_eq!((events.as_slice(), *state), (&[1, 1][..], Some(State::Ready)), "fixed: refreshed, written, ready");
    assert_eq!(ops, &["peers", "reserve", "cancel", "reserve", "complete_batch"]);

    let (outcomes, events, state, ops) = &results[1];
    assert_eq!(outcomes, &vec![ItemOutcome::Pushed], "reported pushed all the same");
    assert_eq!(events.as_slice(), &[0, 0], "historical: no readiness ever; the request fails by push-wait");
    assert_eq!(*state, Some(State::Expired));
    assert_eq!(ops, &["peers", "reserve", "complete_batch"]);
}

#[test]
fn ec_s16_a_failed_item_keeps_its_grants_on_the_other_shards() {
    let mut results = Vec::new();
    for regressions in
        [PushRegressions::default(), PushRegressions { s16_failed_item_keeps_grants: true, ..Default::default() }]
    {
        // Shard 1's pool cannot hold the tensor.
        let mut w = World::new(&[POOL, 256], regressions);
        push(&mut w, &["t1"], true);
        w.run();
        assert_eq!(w.outcomes(), vec![ItemOutcome::Failed { error: "EC consumer buffer pool is full".into() }]);
        results.push((w.cancels_to(0).len(), w.cancels_to(1), w.state(0, "t1"), w.used(0)));
    }
    assert_eq!(results[0], (1, vec![], Some(State::Cancelled), 0), "fixed: rank 0's grant is abandoned");
    let (cancels0, cancels1, state, used) = &results[1];
    assert_eq!(*cancels0, 0, "historical: rank 0 keeps a WRITING reservation nobody will write");
    assert!(cancels1.is_empty(), "the shard that refused holds nothing to abandon");
    assert_eq!(*state, Some(State::Writing));
    assert!(*used > 0);
}

#[test]
fn ec_dup_push_an_abandon_sent_where_the_reserve_was_refused_frees_the_other_push() {
    let refuse_rank1_reserve: fn(&str, &Value) -> Fate =
        |a, r| if a == addr(1) && r["op"] == "reserve" { Fate::Refuse } else { Fate::Deliver };
    let mut results = Vec::new();
    for regressions in
        [PushRegressions::default(), PushRegressions { dup_push_abandons_refused: true, ..Default::default() }]
    {
        let mut w = World::new(&[POOL, POOL], regressions);
        // The first push holds the writer grant on both ranks and waits for its source.
        push(&mut w, &["t1"], false);
        w.run();
        assert_eq!((w.state(0, "t1"), w.state(1, "t1")), (Some(State::Writing), Some(State::Writing)));
        // A retried push of the same transfer id: rank 1 refuses its reserve.
        w.rule = Box::new(refuse_rank1_reserve);
        push(&mut w, &["t1"], true);
        w.run();
        results.push((w.cancels_to(1), w.state(0, "t1"), w.state(1, "t1"), w.used(1)));
    }
    let (cancels, state0, state1, used) = &results[0];
    assert!(cancels.is_empty(), "fixed: nothing is abandoned where the reserve was refused");
    assert_eq!((*state0, *state1), (Some(State::Writing), Some(State::Writing)), "the first push keeps both");
    assert!(*used > 0);
    let (cancels, state0, state1, used) = &results[1];
    assert_eq!(cancels, &vec![String::new()], "historical: the empty-id abandon goes to the refusing rank");
    assert_eq!(*state0, Some(State::Writing), "rank 0: only the retry's duplicate grant is released");
    assert_eq!(*state1, Some(State::Cancelled), "rank 1: the first push's destination is freed under it");
    assert_eq!(*used, 0);
}

#[test]
fn ec_s17_abandons_go_out_while_another_shard_still_completes() {
    let lose_rank0_complete: fn(&str, &Value) -> Fate =
        |a, r| if a == addr(0) && r["op"] == "complete_batch" { Fate::LoseReply } else { Fate::Deliver };
    let mut results = Vec::new();
    for regressions in
        [PushRegressions::default(), PushRegressions { s17_abandon_before_settle: true, ..Default::default() }]
    {
        let mut w = World::new(&[POOL, POOL], regressions);
        w.rule = Box::new(lose_rank0_complete);
        push(&mut w, &["t1"], true);
        w.step(); // peers
        w.step(); // reserves
        w.step(); // writes
        let mut completes = w.collect().into_iter();
        w.deliver(completes.next().unwrap()); // rank 0's completion fails
        let early: Vec<String> = w
            .collect()
            .into_iter()
            .map(|t| match t {
                Transmit::Request { addr, frame, .. } => {
                    let r: Value = serde_json::from_slice(&frame).unwrap();
                    format!("{} {addr}", r["op"].as_str().unwrap())
                }
                Transmit::Write { .. } => "write".into(),
            })
            .collect();
        results.push(early);
    }
    assert!(results[0].is_empty(), "fixed: nothing moves until every shard's completion settled");
    assert_eq!(results[1], vec![format!("cancel {}", addr(0))], "historical: rank 0 abandoned mid-completion");
}

// ---------------------------------------------------------------------------------------
// P2P S6: the manager's admission of a replacement

#[test]
fn p2p_s6_a_replacement_for_a_dead_unreaped_session_is_refused_only_with_the_switch() {
    let peer = "10.0.0.2:5710";
    let mut results = Vec::new();
    for regressions in
        [ManagerRegressions::default(), ManagerRegressions { s6_accept_before_reap: true, ..Default::default() }]
    {
        let mut r = ConnectionRegistry::new(RegistryConfig::new("10.0.0.1:5710"));
        r.connect(peer).unwrap();
        // The session died between ticks (a send failure): its connection is marked dead
        // and the session still sits in the manager's map.
        r.mark_dead(peer);
        let connect = vec![peer.as_bytes().to_vec(), encode(&MsgValue::map([("type", MsgValue::from("connect"))]))];
        let sources = vec![Some("10.0.0.2".to_string())];
        let accepted = r.poll(PollInput { router: vec![connect], sources, monitor: vec![] });
        assert_eq!(accepted, vec![peer.to_string()], "the transport accepts the replacement");
        let admission = admit(Existing::Dead, &regressions);
        let first = match admission {
            Admission::ReplaceDead | Admission::Open => r.recv(peer),
            Admission::RefuseDuplicate => {
                r.close(peer);
                r.poll(PollInput::default());
                Vec::new()
            }
        };
        results.push((admission, first.len(), r.stats().messages_lost_in_sweep, r.is_registered(peer)));
    }
    assert_eq!(results[0], (Admission::ReplaceDead, 1, 0, true), "fixed: the new session gets the Connect");
    assert_eq!(results[1], (Admission::RefuseDuplicate, 0, 1, false), "historical: the Connect goes with it");
}

// ---------------------------------------------------------------------------------------
// The catalogue and its documentation

const ORACLES: &[&str] = &[
    "write-owned",
    "no-overlap",
    "accept-before-ready",
    "rep-answers",
    "request-resolves",
    "reservation-released",
    "backlog-bounded",
    "dealer-closed-once",
    "monitor-closed-once",
    "p2p-message-lost",
    "p2p-handshake-liveness",
    "sockets-bounded",
    "p2p-progress",
    "p2p-dial-non-peer",
    "req-lockstep",
    "push-settled",
];

#[test]
fn every_race_is_documented_with_its_switches_and_oracles() {
    let docs = include_str!("../../docs/races.md");
    let mut names: Vec<&str> = RACES.iter().map(|r| r.scenario).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), RACES.len(), "scenario names are unique");
    for race in RACES {
        let heading = format!("### {} ", race.scenario);
        assert!(docs.contains(&heading), "docs/races.md lacks {heading:?}");
        let replay = format!("ctlsim replay --scenario {} --seed ", race.scenario);
        assert!(docs.contains(&replay), "docs/races.md lacks {replay:?}");
        assert_eq!(race.switches.is_none(), race.regressions().is_fixed(), "{}", race.scenario);
        assert!(!race.oracles.is_empty(), "{}", race.scenario);
        for oracle in race.oracles {
            assert!(ORACLES.contains(oracle), "{}: unknown oracle {oracle}", race.scenario);
        }
        assert_eq!(regressions::race(race.scenario).map(|r| r.scenario), Some(race.scenario));
    }
    assert!(regressions::race("ec-s99").is_none());
    assert!(Regressions::default().is_fixed());
}

#[test]
fn ec_s14_follower_refresh_also_frees_a_writer_a_plain_cancel_deferred() {
    let mut b = book(BookRegressions { s14_follower_refresh_abandons_writer: true, ..BookRegressions::default() });
    let (w_rid, _, _) = granted(b.reserve(&req("w", "h"), T0));
    let (f_rid, _, _) = granted(b.reserve(&req("f", "h"), T0));
    assert!(b.cancel("w", &w_rid, false, false, T0), "the consumer's plain cancel defers the writer");
    assert_eq!(b.state_of("w"), Some(State::CancelPending));
    assert!(b.cancel("f", &f_rid, true, true, T0));
    assert_eq!((b.state_of("w"), b.state_of("f")), (Some(State::Cancelled), Some(State::Cancelled)));
    assert_eq!(b.slab().used_bytes(), 0, "freed while the writer's producer may still write");
    b.check_invariants().unwrap();
}

/// Random operations on a book with the switches on: they change decisions, never the
/// book's structural invariants, and never reach an illegal transition (a debug panic).
#[test]
fn book_switches_keep_the_structural_invariants() {
    use rand_chacha::rand_core::RngCore;
    let all = BookRegressions {
        s11_grace_period_free: Some(Duration::from_secs(2)),
        s12_complete_ignores_reservation_id: true,
        s13_no_cancel_tombstone: true,
        s14_follower_refresh_abandons_writer: true,
        dup_push_shares_grant: true,
    };
    let variants = [
        all,
        BookRegressions { s11_grace_period_free: Some(Duration::from_secs(2)), ..Default::default() },
        BookRegressions { s14_follower_refresh_abandons_writer: true, ..Default::default() },
        BookRegressions::default(),
    ];
    for (seed, regressions) in variants.into_iter().enumerate() {
        let mut rng = ChaCha8Rng::seed_from_u64(seed as u64 + 100);
        let config = BookConfig { regressions, ttl: Duration::from_secs(20), ..BookConfig::default() };
        let mut b = ReservationBook::new(8 * 16384, config, ChaCha8Rng::seed_from_u64(seed as u64));
        let mut rids: Vec<String> = vec![String::new()];
        let mut now = T0;
        for step in 0..20_000 {
            let tid = format!("t{}", rng.next_u32() % 12);
            let hash = format!("h{}", rng.next_u32() % 4);
            match rng.next_u32() % 6 {
                0 | 1 => {
                    if let Ok(Reserved::Granted { reservation_id, .. }) = b.reserve(&req(&tid, &hash), now) {
                        rids.push(reservation_id.to_string());
                    }
                }
                2 => {
                    let rid = &rids[rng.next_u32() as usize % rids.len()];
                    b.complete(&tid, rid, now);
                }
                3 => {
                    let rid = &rids[rng.next_u32() as usize % rids.len()];
                    let bits = rng.next_u32();
                    b.cancel(&tid, rid, bits & 1 == 1, bits & 2 == 2, now);
                }
                4 => {
                    let _ = b.take(&tid, &hash);
                    if rng.next_u32() % 4 == 0 {
                        b.retire(&hash);
                    }
                }
                _ => {
                    now = now + Duration::from_millis(u64::from(rng.next_u32() % 5_000));
                    b.expire(now);
                }
            }
            if let Err(e) = b.check_invariants() {
                panic!("variant {seed}, step {step}: {e}");
            }
        }
    }
}

/// Pushes under random lost requests and replies with the push switches on: whatever they
/// change, every batch still ends (a simulation must never hang on a regression run).
#[test]
fn push_switches_still_finish_every_batch_under_random_faults() {
    use rand_chacha::rand_core::RngCore;
    use std::cell::RefCell;
    use std::rc::Rc;
    let all = PushRegressions {
        s8_base_fallback: true,
        s10_no_compensating_cancel: true,
        s12_no_refresh: true,
        s16_failed_item_keeps_grants: true,
        s17_abandon_before_settle: true,
        s20_orphan_keeps_grants: true,
        dup_push_abandons_refused: true,
    };
    let variants = [
        PushRegressions::default(),
        all,
        PushRegressions { s17_abandon_before_settle: true, ..Default::default() },
        PushRegressions { s8_base_fallback: true, ..Default::default() },
    ];
    for (v, regressions) in variants.into_iter().enumerate() {
        for seed in 0..100u64 {
            let rng = Rc::new(RefCell::new(ChaCha8Rng::seed_from_u64(seed * 31 + v as u64)));
            let mut w = World::new(&[POOL, 4 * NBYTES], regressions);
            let faults = Rc::clone(&rng);
            w.rule = Box::new(move |_, _| match faults.borrow_mut().next_u32() % 10 {
                0 => Fate::Fail,
                1 => Fate::LoseReply,
                _ => Fate::Deliver,
            });
            let mut late = Vec::new();
            for b in 0..3 {
                let n = 1 + (rng.borrow_mut().next_u32() % 3) as usize;
                let tids: Vec<String> = (0..n).map(|i| format!("b{b}i{i}")).collect();
                let refs: Vec<&str> = tids.iter().map(String::as_str).collect();
                let ready = rng.borrow_mut().next_u32() % 2 == 0;
                let id = push(&mut w, &refs, ready);
                if !ready {
                    late.push(id);
                }
            }
            w.run();
            w.now = T0 + Duration::from_secs(200);
            for id in late {
                // A batch may already be done (every item failed or skipped).
                let _ = w.coord.bind_source(id, w.now);
            }
            w.run();
            assert_eq!(w.done.len(), 3, "variant {v}, seed {seed}: every batch reported done");
            assert!(w.coord.is_idle(), "variant {v}, seed {seed}: nothing left outstanding");
            for s in w.shards.values() {
                s.book().check_invariants().unwrap();
            }
        }
    }
}

#[test]
fn ec_s20_an_orphaned_batch_keeps_its_grants_only_with_the_switch() {
    for switched in [false, true] {
        let regressions = PushRegressions { s20_orphan_keeps_grants: switched, ..Default::default() };
        let mut w = World::new(&[POOL, POOL], regressions);
        let id = push(&mut w, &["t1"], false);
        w.run();
        assert_eq!(w.state(0, "t1"), Some(State::Writing));
        // The producer request finished before the encoder output was bound.
        w.coord.orphan(id, w.now).unwrap();
        w.run();
        while let Some(e) = w.coord.poll_event() {
            w.done.push(e);
        }
        assert_eq!(w.outcomes(), vec![ItemOutcome::Skipped { reason: SkipReason::Unbound }]);
        for rank in 0..2 {
            if switched {
                assert!(w.cancels_to(rank).is_empty(), "rank {rank}: no abandon");
                assert_eq!(w.state(rank, "t1"), Some(State::Writing), "rank {rank}: the grant stays");
                assert!(w.used(rank) > 0);
            } else {
                assert_eq!(w.cancels_to(rank).len(), 1, "rank {rank}: one abandon");
                assert_eq!(w.used(rank), 0, "rank {rank}: the destination is freed");
            }
        }
        assert!(w.coord.is_idle());
    }
}
