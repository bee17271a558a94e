//! Model-based property test of the EC consumer shard (ec-behaviour.md §2.3, §2.4 and §3).
//!
//! Random operation sequences go through `ConsumerShard::handle_request` as Python-style
//! JSON frames (plus the model thread's `take`, the encoder cache's `retire`, shutdown,
//! time jumps and the periodic reap). An independent reference model of the behaviour reference predicts
//! every reply, every readiness event and every slab slot; after every step the
//! test also checks the book's structural invariants, that memory a remote writer may still
//! write stays allocated (tracked from the wire replies alone), the tombstone bound and the
//! event accounting.
//!
//! Every allocation has the same aligned size (at most 256 bytes: shape `[n]`, 2-byte
//! dtypes, `1 <= n <= 128`), so the slab is a row of equal slots and first fit is "lowest free
//! slot": the model predicts `dst_ptr` exactly.
//!
//! Where the behaviour reference leaves an order open the model follows ctlplane's documented choice:
//! expiry visits due records in transfer-id order (the book keeps a `BTreeMap` keyed by
//! `TransferId`, canonical 32-hex ids before other strings; the id pool below is listed in
//! that order), and eviction picks the entry that became evictable (no pin, no lease) the
//! longest ago.

use ctlplane_core::ec::reservations::{BookConfig, FollowerCompletion, TOMBSTONE_LIMIT};
use ctlplane_core::ec::shard::{ConsumerShard, ShardConfig, MAX_PENDING_EVENTS};
use ctlplane_core::ec::State;
use ctlplane_core::Instant;
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

const PORT: u16 = 19020;
const DST_SESSION: &str = "10.0.0.5:15417";
const SLAB_BASE: u64 = 140_213_339_553_792;
const SLOT: u64 = 256;
const SEC: u64 = 1_000_000_000;
const TTL: u64 = 300 * SEC;
const REAP_INTERVAL: u64 = SEC;
const START: u64 = 1_000 * SEC;
const N_TIDS: usize = 6;
/// Hashes in play: a setup uses the first 3 or all 4.
const N_HASHES: usize = 4;
/// `[n]` float16 of each hash when the producer is consistent.
const CANONICAL_DIM: [u64; N_HASHES] = [16, 64, 128, 100];

/// Transfer ids in the book's order: four canonical `uuid4().hex` ids (stored as bytes,
/// ordered by value) and two producer-fallback ids (stored as text, ordered after them).
fn tid_str(i: usize) -> &'static str {
    const TIDS: [&str; N_TIDS] = [
        "1f0c3a9e5b7d4e2a8c6b0d9f7e5a3c1b",
        "3f2a9c1e3f2a9c1e3f2a9c1e3f2a9c1e",
        "7a4e0b2c9d8f4a1e8b3c5d7f9e0a2b4c",
        "c0ffee00c0ffee00c0ffee00c0ffee00",
        "req-4:0",
        "req-5:0",
    ];
    TIDS[i]
}

fn hash_str(h: usize) -> &'static str {
    const HASHES: [&str; N_HASHES] = ["9c1e0b7d0e4f2a1", "9c1e1b7d0e4f2a1", "9c1e2b7d0e4f2a1", "9c1e3b7d0e4f2a1"];
    HASHES[h]
}

// ---------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------

/// Which reservation id a `complete`/`cancel` names, resolved against earlier replies.
#[derive(Clone, Debug)]
enum RidPick {
    /// The last id a reply handed out for this transfer.
    Latest,
    /// Any id ever handed out for this transfer (often stale).
    Stale(u8),
    Empty,
    /// The latest id of another transfer.
    OtherTid(usize),
    /// 0: well-formed hex no reservation carries; 1: the latest id upper-cased; 2: text.
    Garbage(u8),
}

/// Which transfer an op names, resolved against the model when the op runs.
#[derive(Clone, Debug)]
enum TidPick {
    Any(usize),
    /// One of the transfers the model has READY (any transfer if none is).
    Ready(prop::sample::Index),
    /// One of the transfers a writer may still write (any transfer if none is).
    WriterOwned(prop::sample::Index),
}

/// The tensor a reserve item asks for, relative to its hash's canonical one.
#[derive(Clone, Debug)]
enum SpecPick {
    Canonical,
    /// Canonical shape under the `half` alias of float16 (the same tensor).
    Alias,
    /// Canonical shape as bfloat16: conflicts with float16.
    OtherDtype,
    /// `[1, n]`: conflicts with `[n]`.
    TwoDims,
    /// `[n]` float16 with an arbitrary `n`.
    Dim(u64),
    /// A dtype torch does not know.
    BadDtype,
    /// `nbytes` that does not match shape and dtype.
    BadNbytes,
}

#[derive(Clone, Debug)]
struct ReserveItem {
    tid: usize,
    hash: usize,
    spec: SpecPick,
}

/// A `complete_batch` item the server cannot decode, failing the rest of the batch.
#[derive(Clone, Debug)]
struct BadItem {
    at: usize,
    kind: u8,
}

#[derive(Clone, Debug)]
enum Op {
    Reserve(ReserveItem),
    ReserveBatch(Vec<ReserveItem>),
    Complete {
        tid: TidPick,
        rid: RidPick,
    },
    CompleteBatch {
        items: Vec<(TidPick, RidPick)>,
        bad: Option<BadItem>,
    },
    Cancel {
        tid: TidPick,
        rid: RidPick,
        abandon: bool,
        refresh: bool,
    },
    Status(usize),
    /// `take(tid, mm_hash)`; `hash: None` names the record's own hash.
    Take {
        tid: TidPick,
        hash: Option<usize>,
    },
    /// The encoder cache drops a hash; `None` picks one that has a pinned resident copy.
    Retire(Option<usize>),
    /// Advance the clock by this many milliseconds.
    Tick(u64),
    HandleTimeout,
    /// Flush up to `n` events; `confirm: false` is a send that hit EAGAIN.
    Drain {
        n: usize,
        confirm: bool,
    },
    Shutdown,
}

fn rid_pick() -> impl Strategy<Value = RidPick> {
    prop_oneof![
        13 => Just(RidPick::Latest),
        2 => any::<u8>().prop_map(RidPick::Stale),
        2 => Just(RidPick::Empty),
        1 => (0..N_TIDS).prop_map(RidPick::OtherTid),
        2 => (0..3u8).prop_map(RidPick::Garbage),
    ]
}

fn spec_pick() -> impl Strategy<Value = SpecPick> {
    prop_oneof![
        60 => Just(SpecPick::Canonical),
        2 => Just(SpecPick::Alias),
        1 => Just(SpecPick::OtherDtype),
        1 => Just(SpecPick::TwoDims),
        // `n >= 1`: an empty tensor owns no region (dst_ptr 0, ec-behaviour.md §10), which
        // the model's row of equal slots does not express; the slab's unit tests, the golden
        // frames and the release conformance streams cover empty tensors.
        1 => (1..=128u64).prop_map(SpecPick::Dim),
        1 => Just(SpecPick::BadDtype),
        1 => Just(SpecPick::BadNbytes),
    ]
}

/// Mostly a transfer's own hash (two transfers share each hash, so followers and cache
/// hits happen), sometimes any hash (conflicts).
fn reserve_item() -> impl Strategy<Value = ReserveItem> {
    (0..N_TIDS, prop::option::weighted(0.1, 0..N_HASHES), spec_pick()).prop_map(|(tid, hash, spec)| ReserveItem {
        tid,
        hash: hash.unwrap_or(tid % N_HASHES),
        spec,
    })
}

/// Any transfer, or (mostly) one with a destination a writer may still write.
fn completing_tid() -> impl Strategy<Value = TidPick> {
    prop_oneof![
        3 => any::<prop::sample::Index>().prop_map(TidPick::WriterOwned),
        2 => (0..N_TIDS).prop_map(TidPick::Any),
    ]
}

fn tick() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0..2_500u64,
        1 => Just(1_000u64),
        2 => prop::sample::select(vec![150_000u64, 299_000, 300_000, 301_000, 450_000, 900_000]),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        22 => reserve_item().prop_map(Op::Reserve),
        6 => prop::collection::vec(reserve_item(), 0..5).prop_map(Op::ReserveBatch),
        10 => (completing_tid(), rid_pick()).prop_map(|(tid, rid)| Op::Complete { tid, rid }),
        6 => (
            prop::collection::vec((completing_tid(), rid_pick()), 0..5),
            prop::option::weighted(0.1, (0..5usize, 0..3u8).prop_map(|(at, kind)| BadItem { at, kind })),
        )
            .prop_map(|(items, bad)| Op::CompleteBatch { items, bad }),
        4 => (0..N_TIDS).prop_map(|tid| Op::Cancel {
            tid: TidPick::Any(tid),
            rid: RidPick::Empty,
            abandon: false,
            refresh: false
        }),
        4 => (completing_tid(), rid_pick(), any::<bool>())
            .prop_map(|(tid, rid, refresh)| Op::Cancel { tid, rid, abandon: true, refresh }),
        1 => (0..N_TIDS, rid_pick()).prop_map(|(tid, rid)| Op::Cancel {
            tid: TidPick::Any(tid),
            rid,
            abandon: false,
            refresh: true
        }),
        5 => (0..N_TIDS).prop_map(Op::Status),
        8 => (
            prop_oneof![
                3 => any::<prop::sample::Index>().prop_map(TidPick::Ready),
                1 => (0..N_TIDS).prop_map(TidPick::Any),
            ],
            prop::option::weighted(0.2, 0..N_HASHES),
        )
            .prop_map(|(tid, hash)| Op::Take { tid, hash }),
        5 => prop::option::weighted(0.3, 0..N_HASHES).prop_map(Op::Retire),
        10 => tick().prop_map(Op::Tick),
        6 => Just(Op::HandleTimeout),
        5 => (1..5usize, prop::bool::weighted(0.85)).prop_map(|(n, confirm)| Op::Drain { n, confirm }),
    ]
}

/// A sequence of operations; one case in eight shuts the shard down somewhere.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    (prop::collection::vec(op(), 1..100), prop::option::weighted(0.125, any::<prop::sample::Index>())).prop_map(
        |(mut ops, shutdown)| {
            if let Some(at) = shutdown {
                ops.insert(at.index(ops.len() + 1), Op::Shutdown);
            }
            ops
        },
    )
}

// ---------------------------------------------------------------------------------------
// Reference model (ec-behaviour.md §3), written from the behaviour reference, sharing nothing with the book
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum St {
    Writing,
    Ready,
    CancelPending,
    ExpirePending,
    Cancelled,
    Expired,
}

impl St {
    fn active(self) -> bool {
        !matches!(self, St::Cancelled | St::Expired)
    }
    fn deferred(self) -> bool {
        matches!(self, St::CancelPending | St::ExpirePending)
    }
    fn writer_owned(self) -> bool {
        matches!(self, St::Writing | St::CancelPending | St::ExpirePending)
    }
    fn core(self) -> State {
        match self {
            St::Writing => State::Writing,
            St::Ready => State::Ready,
            St::CancelPending => State::CancelPending,
            St::ExpirePending => State::ExpirePending,
            St::Cancelled => State::Cancelled,
            St::Expired => State::Expired,
        }
    }
}

/// The element type a dtype name stands for: a resident copy is matched on it, while
/// records compare names as names.
fn element_type(name: &str) -> &str {
    match name {
        "half" => "float16",
        other => other,
    }
}

/// What a valid reserve asks for (dtype by name, as spelled).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Tensor {
    hash: usize,
    dims: Vec<u64>,
    dtype: &'static str,
    nbytes: u64,
}

#[derive(Clone, Debug)]
struct Rec {
    st: St,
    /// `None`: a cancel-before-reserve tombstone (empty mm_hash and reservation id).
    tensor: Option<Tensor>,
    rid: String,
    /// Slab slot owned by a writer (followers share their writer's).
    slot: Option<usize>,
    /// Resident entry borrowed by a READY record.
    lease: Option<u64>,
    /// On a follower: its writer.
    writer: Option<usize>,
    /// On a writer: its followers in arrival order.
    followers: Vec<usize>,
    deadline: Option<u64>,
    /// Duplicate reserves granted (each under an id of its own, ec-behaviour.md §3.3
    /// rule 5; the operations never name those ids).
    dups: usize,
    /// Position in the tombstone order.
    tomb: Option<u64>,
}

impl Rec {
    fn new(st: St, tensor: Option<Tensor>) -> Self {
        Rec {
            st,
            tensor,
            rid: String::new(),
            slot: None,
            lease: None,
            writer: None,
            followers: Vec::new(),
            deadline: None,
            dups: 0,
            tomb: None,
        }
    }
}

#[derive(Clone, Debug)]
struct Entry {
    tensor: Tensor,
    slot: usize,
    leases: u32,
    pinned: bool,
    displaced: bool,
    /// When it last became evictable (no pin, no lease): eviction order.
    evictable_since: u64,
}

/// What the model expects a reserve item to answer.
#[derive(Debug)]
enum Expect {
    Err(String),
    Cancelled,
    /// `rid: None` = a freshly minted id (learnt from the reply); `dup`: the grant of a
    /// duplicate reserve, whose fresh id stays the duplicate's (the record keeps its own).
    Granted {
        rid: Option<String>,
        dup: bool,
        slot: usize,
        write: bool,
        ready: bool,
        cached: bool,
    },
}

#[derive(Debug)]
struct Model {
    gen_b: bool,
    tombstone_limit: usize,
    max_events: usize,
    recs: BTreeMap<usize, Rec>,
    /// Tombstone order: seq -> (transfer, deadline).
    tombs: BTreeMap<u64, (usize, u64)>,
    next_tomb: u64,
    entries: BTreeMap<u64, Entry>,
    /// The current resident entry of each hash.
    current: BTreeMap<usize, u64>,
    next_entry: u64,
    clock: u64,
    slots: Vec<bool>,
    /// Expected readiness frames still queued.
    events: VecDeque<String>,
    events_queued: u64,
    events_dropped: u64,
    events_sent: u64,
    shutting_down: bool,
    last_reap: u64,
}

impl Model {
    fn new(setup: &Setup) -> Self {
        Model {
            gen_b: setup.gen_b,
            tombstone_limit: setup.tombstone_limit,
            max_events: setup.max_events,
            recs: BTreeMap::new(),
            tombs: BTreeMap::new(),
            next_tomb: 0,
            entries: BTreeMap::new(),
            current: BTreeMap::new(),
            next_entry: 0,
            clock: 0,
            slots: vec![false; setup.slots],
            events: VecDeque::new(),
            events_queued: 0,
            events_dropped: 0,
            events_sent: 0,
            shutting_down: false,
            last_reap: START,
        }
    }

    fn rec(&mut self, tid: usize) -> &mut Rec {
        self.recs.get_mut(&tid).expect("model record")
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    // --- memory -------------------------------------------------------------------------

    fn alloc_slot(&mut self) -> Option<usize> {
        let s = self.slots.iter().position(|used| !used)?;
        self.slots[s] = true;
        Some(s)
    }

    fn free_slot(&mut self, s: usize) {
        assert!(self.slots[s], "model frees slot {s} twice");
        self.slots[s] = false;
    }

    /// Frees a displaced entry nobody uses any more.
    fn collect(&mut self, id: u64) {
        let e = &self.entries[&id];
        if e.displaced && e.leases == 0 && !e.pinned {
            let slot = e.slot;
            self.entries.remove(&id);
            self.free_slot(slot);
        }
    }

    fn publish(&mut self, tensor: Tensor, slot: usize, pinned: bool) -> u64 {
        let id = self.next_entry;
        self.next_entry += 1;
        let hash = tensor.hash;
        if let Some(old) = self.current.insert(hash, id) {
            if let Some(e) = self.entries.get_mut(&old) {
                e.displaced = true;
            }
            self.collect(old);
        }
        let evictable_since = self.tick();
        self.entries.insert(id, Entry { tensor, slot, leases: 0, pinned, displaced: false, evictable_since });
        id
    }

    fn release(&mut self, id: u64) {
        let t = self.tick();
        let e = self.entries.get_mut(&id).expect("leased entry");
        e.leases -= 1;
        if e.leases == 0 && !e.pinned {
            e.evictable_since = t;
        }
        self.collect(id);
    }

    fn evict_one(&mut self) -> bool {
        let victim = self
            .entries
            .iter()
            .filter(|(_, e)| !e.pinned && e.leases == 0 && !e.displaced)
            .min_by_key(|(_, e)| e.evictable_since)
            .map(|(&id, _)| id);
        let Some(id) = victim else { return false };
        let e = self.entries.remove(&id).expect("victim");
        self.current.remove(&e.tensor.hash);
        self.free_slot(e.slot);
        true
    }

    fn retire(&mut self, hash: usize) {
        let ids: Vec<u64> =
            self.entries.iter().filter(|(_, e)| e.tensor.hash == hash && e.pinned).map(|(&id, _)| id).collect();
        for id in ids {
            let t = self.tick();
            let e = self.entries.get_mut(&id).expect("entry");
            e.pinned = false;
            if e.leases == 0 {
                e.evictable_since = t;
            }
            self.collect(id);
        }
    }

    /// The slot a record's destination lives in.
    fn slot_of(&self, tid: usize) -> Option<usize> {
        let r = &self.recs[&tid];
        match (r.lease, r.writer) {
            (Some(e), _) => Some(self.entries[&e].slot),
            (None, Some(w)) => self.recs[&w].slot,
            (None, None) => r.slot,
        }
    }

    // --- tombstones and terminal moves ------------------------------------------------------

    fn push_tomb(&mut self, tid: usize, now: u64) {
        let seq = self.next_tomb;
        self.next_tomb += 1;
        if let Some(old) = self.rec(tid).tomb.replace(seq) {
            self.tombs.remove(&old);
        }
        self.tombs.insert(seq, (tid, now + TTL));
    }

    /// Oldest tombstones go while past their deadline or over the bound.
    fn reap(&mut self, now: u64) {
        while let Some((&seq, &(tid, deadline))) = self.tombs.first_key_value() {
            if self.tombs.len() <= self.tombstone_limit && deadline > now {
                break;
            }
            self.tombs.remove(&seq);
            self.recs.remove(&tid);
        }
    }

    /// Terminal transition: release memory (a writer also cancels its followers), start
    /// the tombstone.
    fn terminate(&mut self, tid: usize, to: St, now: u64) {
        let r = self.rec(tid);
        r.st = to;
        r.deadline = None;
        let writer = r.writer.take();
        let slot = r.slot.take();
        let lease = r.lease.take();
        let followers = std::mem::take(&mut r.followers);
        match writer {
            Some(w) => self.rec(w).followers.retain(|&f| f != tid),
            None => {
                if let Some(s) = slot {
                    self.free_slot(s);
                }
                if let Some(e) = lease {
                    self.release(e);
                }
                for f in followers {
                    self.rec(f).writer = None;
                    self.terminate(f, St::Cancelled, now);
                }
            }
        }
        self.push_tomb(tid, now);
        self.reap(now);
    }

    fn defer(&mut self, tid: usize, to: St) {
        let r = self.rec(tid);
        r.st = to;
        r.deadline = None;
    }

    /// ec-behaviour.md §3.6.
    fn expire(&mut self, now: u64) {
        let due: Vec<usize> = self
            .recs
            .iter()
            .filter(|(_, r)| r.st.active() && r.deadline.is_some_and(|d| d <= now))
            .map(|(&t, _)| t)
            .collect();
        for tid in due {
            let Some(r) = self.recs.get(&tid) else { continue };
            match (r.st, r.writer.is_some()) {
                (St::Ready, _) => self.terminate(tid, St::Expired, now),
                (St::Writing, true) => self.terminate(tid, St::Cancelled, now),
                (St::Writing, false) => self.defer(tid, St::ExpirePending),
                _ => {}
            }
        }
        self.reap(now);
    }

    fn handle_timeout(&mut self, now: u64) {
        if now - self.last_reap >= REAP_INTERVAL {
            self.expire(now);
            self.last_reap = now;
        }
    }

    /// The WRITING writer of `hash`, which a new reserve of that hash follows.
    fn writer_of(&self, hash: usize) -> Option<usize> {
        let mut it = self
            .recs
            .iter()
            .filter(|(_, r)| {
                r.st == St::Writing && r.writer.is_none() && r.tensor.as_ref().map(|t| t.hash) == Some(hash)
            })
            .map(|(&t, _)| t);
        let w = it.next();
        assert!(it.next().is_none(), "model: two WRITING writers of hash {hash}");
        w
    }

    // --- operations -------------------------------------------------------------------------

    /// ec-behaviour.md §3.3 (after the request validated).
    fn reserve(&mut self, tid: usize, t: &Tensor, now: u64) -> Expect {
        self.expire(now);
        if self.shutting_down {
            return Expect::Err("Consumer reservation manager is shutting down".into());
        }
        if let Some(r) = self.recs.get(&tid) {
            match r.st {
                St::Cancelled => return Expect::Cancelled,
                St::Expired => {
                    if let Some(seq) = r.tomb {
                        self.tombs.remove(&seq);
                    }
                    self.recs.remove(&tid);
                }
                St::ExpirePending => {
                    return Expect::Err(format!("Transfer '{}' still has an active writer", tid_str(tid)))
                }
                st => {
                    if r.tensor.as_ref() != Some(t) {
                        return Expect::Err("conflicting reservation for transfer_id".into());
                    }
                    if st == St::CancelPending {
                        return Expect::Cancelled;
                    }
                    let cached = r.lease.is_some();
                    if st == St::Writing {
                        self.rec(tid).deadline = Some(now + TTL);
                    }
                    self.rec(tid).dups += 1;
                    let slot = self.slot_of(tid).expect("active record has a destination");
                    // ctlplane gives a duplicate an id of its own (ec-behaviour.md §3.3 rule 5).
                    return Expect::Granted {
                        rid: None,
                        dup: true,
                        slot,
                        write: false,
                        ready: st == St::Ready,
                        cached,
                    };
                }
            }
        }
        // A resident copy: cache hit.
        if let Some(&id) = self.current.get(&t.hash) {
            let e = self.entries.get_mut(&id).expect("current entry");
            if e.tensor.dims != t.dims || element_type(e.tensor.dtype) != element_type(t.dtype) {
                return Expect::Err("conflicting cached tensor for mm_hash".into());
            }
            e.leases += 1;
            let slot = e.slot;
            let mut r = Rec::new(St::Ready, Some(t.clone()));
            r.lease = Some(id);
            r.deadline = Some(now + TTL);
            self.recs.insert(tid, r);
            return Expect::Granted { rid: None, dup: false, slot, write: false, ready: true, cached: true };
        }
        // An in-flight writer: follow it.
        if let Some(w) = self.writer_of(t.hash) {
            let wt = self.recs[&w].tensor.clone().expect("writer tensor");
            if wt.dims != t.dims || wt.dtype != t.dtype {
                return Expect::Err("conflicting in-flight tensor for mm_hash".into());
            }
            self.rec(w).followers.push(tid);
            let slot = self.recs[&w].slot.expect("writer slot");
            let mut r = Rec::new(St::Writing, Some(t.clone()));
            r.writer = Some(w);
            r.deadline = Some(now + TTL);
            self.recs.insert(tid, r);
            return Expect::Granted { rid: None, dup: false, slot, write: false, ready: false, cached: false };
        }
        // Allocate: reap, then evict residents, under pressure.
        let mut slot = self.alloc_slot();
        if slot.is_none() {
            self.expire(now);
            slot = self.alloc_slot();
            while slot.is_none() && self.evict_one() {
                slot = self.alloc_slot();
            }
        }
        let Some(slot) = slot else {
            return Expect::Err("EC consumer buffer pool is full".into());
        };
        let mut r = Rec::new(St::Writing, Some(t.clone()));
        r.slot = Some(slot);
        r.deadline = Some(now + TTL);
        self.recs.insert(tid, r);
        Expect::Granted { rid: None, dup: false, slot, write: true, ready: false, cached: false }
    }

    /// ec-behaviour.md §3.4, with the shard's event order (published followers, then the writer).
    fn complete(&mut self, tid: usize, rid: &str, now: u64) -> (bool, bool) {
        let Some(r) = self.recs.get(&tid) else { return (false, false) };
        if r.rid != rid {
            return (false, false);
        }
        if r.st == St::Ready {
            return (true, false);
        }
        if r.writer.is_some() {
            return (self.gen_b, false);
        }
        let st = r.st;
        if st.writer_owned() && !r.followers.is_empty() {
            let r = self.rec(tid);
            let followers = std::mem::take(&mut r.followers);
            let slot = r.slot.take().expect("writer slot");
            let tensor = r.tensor.clone().expect("writer tensor");
            let id = self.publish(tensor, slot, false);
            self.entries.get_mut(&id).expect("entry").leases += 1 + followers.len() as u32;
            self.rec(tid).lease = Some(id);
            for &f in &followers {
                let fr = self.rec(f);
                fr.st = St::Ready;
                fr.writer = None;
                fr.lease = Some(id);
                fr.deadline = Some(now + TTL);
            }
            for f in followers {
                self.queue_event(f);
            }
        }
        if st.deferred() {
            let to = if st == St::CancelPending { St::Cancelled } else { St::Expired };
            self.terminate(tid, to, now);
            return (true, false);
        }
        if st != St::Writing {
            return (false, false);
        }
        let r = self.rec(tid);
        r.st = St::Ready;
        r.deadline = Some(now + TTL);
        self.queue_event(tid);
        (true, true)
    }

    /// ec-behaviour.md §3.5.
    fn cancel(&mut self, tid: usize, rid: &str, abandon: bool, refresh: bool, now: u64) -> bool {
        let Some(r) = self.recs.get(&tid) else {
            self.recs.insert(tid, Rec::new(St::Cancelled, None));
            self.push_tomb(tid, now);
            self.reap(now);
            return true;
        };
        if !rid.is_empty() && rid != r.rid {
            return false;
        }
        let (st, follower) = (r.st, r.writer.is_some());
        if self.dup_defers(tid, rid, abandon) {
            self.defer(tid, St::CancelPending);
            return true;
        }
        if st == St::Cancelled {
            self.push_tomb(tid, now);
            self.reap(now);
            return true;
        }
        if refresh {
            if !abandon || !matches!(st, St::Writing | St::ExpirePending) {
                return false;
            }
            self.terminate(tid, St::Expired, now);
            return true;
        }
        if follower {
            self.terminate(tid, St::Cancelled, now);
            return true;
        }
        if st.deferred() && !abandon {
            return true;
        }
        if st == St::Writing && !abandon {
            self.defer(tid, St::CancelPending);
            return true;
        }
        if !st.active() {
            return false;
        }
        self.terminate(tid, St::Cancelled, now);
        true
    }

    /// §3.5 rule 0: an empty-id abandon of a writer that duplicates were granted may come
    /// from a push that never wrote here; it defers like a plain cancel (the writer keeps
    /// its memory).
    fn dup_defers(&self, tid: usize, rid: &str, abandon: bool) -> bool {
        self.recs
            .get(&tid)
            .is_some_and(|r| abandon && rid.is_empty() && r.writer.is_none() && r.st == St::Writing && r.dups > 0)
    }

    fn status(&self, tid: usize) -> Value {
        match self.recs.get(&tid) {
            Some(r) if r.st.active() => {
                let t = r.tensor.as_ref().expect("active record tensor");
                json!({
                    "mm_hash": hash_str(t.hash),
                    "ready": r.st == St::Ready,
                    "reservation_id": r.rid,
                    "nbytes": t.nbytes,
                    "shape": t.dims,
                    "dtype": t.dtype,
                })
            }
            _ => Value::Null,
        }
    }

    /// ec-behaviour.md §3.7 `take`: the slot handed to the model, and the tensor.
    fn take(&mut self, tid: usize, hash: usize) -> Result<(usize, Tensor), String> {
        let err = || format!("Pushed EC tensor is not ready for mm_hash={}", hash_str(hash));
        match self.recs.get(&tid) {
            Some(r) if r.st == St::Ready && r.tensor.as_ref().map(|t| t.hash) == Some(hash) => {}
            _ => return Err(err()),
        }
        let r = self.recs.remove(&tid).expect("ready record");
        let tensor = r.tensor.expect("ready tensor");
        let slot = match (r.lease, r.slot) {
            (Some(id), _) => {
                let e = self.entries.get_mut(&id).expect("leased entry");
                e.leases -= 1;
                e.pinned = true;
                e.slot
            }
            (None, Some(slot)) => {
                self.publish(tensor.clone(), slot, true);
                slot
            }
            (None, None) => panic!("model: READY record without memory"),
        };
        Ok((slot, tensor))
    }

    /// ec-behaviour.md §3.7 `begin_shutdown`.
    fn shutdown(&mut self, now: u64) {
        self.shutting_down = true;
        let tids: Vec<usize> = self.recs.keys().copied().collect();
        for &tid in &tids {
            if let Some(r) = self.recs.get(&tid) {
                if r.st == St::Ready || (r.st == St::Writing && r.writer.is_some()) {
                    self.terminate(tid, St::Cancelled, now);
                }
            }
        }
        for &tid in &tids {
            if self.recs.get(&tid).is_some_and(|r| r.st == St::Writing) {
                self.defer(tid, St::CancelPending);
            }
        }
    }

    /// ec-behaviour.md §2.4: the status of an active record, prefixed by its transfer id and suffixed
    /// by the shard port; the oldest is dropped when the backlog is full.
    fn queue_event(&mut self, tid: usize) {
        let Some(r) = self.recs.get(&tid).filter(|r| r.st.active()) else { return };
        let t = r.tensor.as_ref().expect("active record tensor");
        let shape: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        let frame = format!(
            r#"{{"transfer_id": "{}", "mm_hash": "{}", "ready": {}, "reservation_id": "{}", "nbytes": {}, "shape": [{}], "dtype": "{}", "shard": {}}}"#,
            tid_str(tid),
            hash_str(t.hash),
            r.st == St::Ready,
            r.rid,
            t.nbytes,
            shape.join(", "),
            t.dtype,
            PORT
        );
        if self.events.len() >= self.max_events {
            self.events.pop_front();
            self.events_dropped += 1;
        }
        self.events.push_back(frame);
        self.events_queued += 1;
    }
}

// ---------------------------------------------------------------------------------------
// Harness: drives the shard and the model side by side
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
struct Setup {
    gen_b: bool,
    slots: usize,
    hashes: usize,
    tombstone_limit: usize,
    max_events: usize,
}

struct Harness {
    shard: ConsumerShard<ChaCha8Rng>,
    model: Model,
    hashes: usize,
    now: u64,
    requests: u64,
    /// Every reservation id any reply handed out.
    minted: BTreeSet<String>,
    /// Per transfer: the ids replies handed out, oldest first.
    history: Vec<Vec<String>>,
    /// Write grants (`write: true`) not yet released by an accepted `complete` or an
    /// accepted abandon: transfer -> (reservation id, slab offset). Maintained from the
    /// replies alone.
    ledger: BTreeMap<usize, (String, u64)>,
}

type Check = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

fn ensure_eq<T: PartialEq + std::fmt::Debug>(what: &str, actual: T, expected: T) -> Check {
    ensure!(actual == expected, "{what}: core {actual:?}, model {expected:?}");
    Ok(())
}

/// Every reply is one JSON object with a boolean `ok`, written envelope-first.
fn parse_reply(bytes: &[u8]) -> Result<Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("reply is not UTF-8: {e}"))?;
    let v: Value = serde_json::from_str(text).map_err(|e| format!("reply {text:?} is not JSON: {e}"))?;
    ensure!(v.get("ok").is_some_and(Value::is_boolean), "reply {text} has no boolean ok");
    ensure!(text.starts_with(r#"{"ok": "#), "reply {text} does not start with its ok field");
    Ok(v)
}

fn is_uuid4_hex(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 32
        && b.iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
        && b[12] == b'4'
        && matches!(b[16], b'8' | b'9' | b'a' | b'b')
}

fn dims_json(dims: &[u64]) -> String {
    let d: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", d.join(", "))
}

/// The shape, dtype name and nbytes a reserve item sends.
fn resolve_spec(item: &ReserveItem) -> (Vec<u64>, &'static str, u64) {
    let c = CANONICAL_DIM[item.hash];
    match item.spec {
        SpecPick::Canonical => (vec![c], "float16", 2 * c),
        SpecPick::Alias => (vec![c], "half", 2 * c),
        SpecPick::OtherDtype => (vec![c], "bfloat16", 2 * c),
        SpecPick::TwoDims => (vec![1, c], "float16", 2 * c),
        SpecPick::Dim(n) => (vec![n], "float16", 2 * n),
        SpecPick::BadDtype => (vec![c], "float17", 2 * c),
        SpecPick::BadNbytes => (vec![c], "float16", 2 * c + 2),
    }
}

fn reserve_payload(item: &ReserveItem) -> String {
    let (dims, dtype, nbytes) = resolve_spec(item);
    format!(
        r#""transfer_id": "{}", "mm_hash": "{}", "nbytes": {}, "shape": {}, "dtype": "{}""#,
        tid_str(item.tid),
        hash_str(item.hash),
        nbytes,
        dims_json(&dims),
        dtype
    )
}

impl Harness {
    fn new(setup: Setup, seed: u64) -> Self {
        let mut config = ShardConfig::new(PORT, setup.slots as u64 * SLOT);
        config.dst_session = DST_SESSION.into();
        config.slab_base = SLAB_BASE;
        config.max_pending_events = setup.max_events;
        config.book = BookConfig {
            tombstone_limit: setup.tombstone_limit,
            follower_completion: if setup.gen_b { FollowerCompletion::AcceptNoop } else { FollowerCompletion::Reject },
            ..BookConfig::default()
        };
        assert_eq!(config.book.ttl, Duration::from_nanos(TTL));
        assert_eq!(config.reap_interval, Duration::from_nanos(REAP_INTERVAL));
        let shard = ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(seed), Instant::from_nanos(START));
        Harness {
            shard,
            model: Model::new(&setup),
            hashes: setup.hashes,
            now: START,
            requests: 0,
            minted: BTreeSet::new(),
            history: vec![Vec::new(); N_TIDS],
            ledger: BTreeMap::new(),
        }
    }

    fn request(&mut self, frame: &str) -> (Value, String) {
        self.requests += 1;
        let reply = self.shard.handle_request(frame.as_bytes(), Instant::from_nanos(self.now));
        let text = String::from_utf8_lossy(&reply).into_owned();
        (parse_reply(&reply).unwrap_or_else(|e| Value::String(format!("UNPARSEABLE: {e}"))), text)
    }

    fn resolve_tid(&self, pick: &TidPick) -> usize {
        let among = |i: &prop::sample::Index, f: fn(&Rec) -> bool| {
            let tids: Vec<usize> = self.model.recs.iter().filter(|(_, r)| f(r)).map(|(&t, _)| t).collect();
            if tids.is_empty() {
                i.index(N_TIDS)
            } else {
                tids[i.index(tids.len())]
            }
        };
        match pick {
            TidPick::Any(t) => *t,
            TidPick::Ready(i) => among(i, |r| r.st == St::Ready),
            TidPick::WriterOwned(i) => among(i, |r| r.st.writer_owned()),
        }
    }

    fn resolve_rid(&self, tid: usize, pick: &RidPick) -> String {
        let latest = |t: usize| self.history[t].last().cloned().unwrap_or_default();
        match pick {
            RidPick::Latest => latest(tid),
            RidPick::Stale(k) => {
                let h = &self.history[tid];
                if h.is_empty() {
                    String::new()
                } else {
                    h[*k as usize % h.len()].clone()
                }
            }
            RidPick::Empty => String::new(),
            RidPick::OtherTid(o) => latest(*o),
            // Position 12 is not '4': no minted id looks like this.
            RidPick::Garbage(0) => "0123456789abcdef0123456789abcdef".into(),
            RidPick::Garbage(1) => {
                let l = latest(tid);
                if l.is_empty() {
                    "NOT-A-RESERVATION".into()
                } else {
                    l.to_uppercase()
                }
            }
            RidPick::Garbage(_) => "not-a-reservation".into(),
        }
    }

    /// Folds the generated hashes onto the setup's.
    fn localize(&self, op: &Op) -> Op {
        let n = self.hashes;
        let item = |i: &ReserveItem| ReserveItem { hash: i.hash % n, ..i.clone() };
        match op {
            Op::Reserve(i) => Op::Reserve(item(i)),
            Op::ReserveBatch(items) => Op::ReserveBatch(items.iter().map(item).collect()),
            Op::Take { tid, hash } => Op::Take { tid: tid.clone(), hash: hash.map(|h| h % n) },
            Op::Retire(hash) => Op::Retire(hash.map(|h| h % n)),
            other => other.clone(),
        }
    }

    fn step(&mut self, op: &Op) -> Check {
        let op = &self.localize(op);
        let now = self.now;
        match op {
            Op::Reserve(item) => {
                let frame = format!(r#"{{"op": "reserve", {}}}"#, reserve_payload(item));
                let (reply, _) = self.request(&frame);
                self.reserve_item(item, &reply)?;
            }
            Op::ReserveBatch(items) => {
                let payloads: Vec<String> = items.iter().map(|i| format!("{{{}}}", reserve_payload(i))).collect();
                let frame = format!(r#"{{"op": "reserve_batch", "items": [{}]}}"#, payloads.join(", "));
                let (reply, text) = self.request(&frame);
                ensure!(reply["ok"] == json!(true), "reserve_batch failed as a whole: {text}");
                let got = reply["result"]["items"].as_array().cloned().unwrap_or_default();
                ensure!(
                    got.len() == items.len(),
                    "reserve_batch answered {} items for {}: {text}",
                    got.len(),
                    items.len()
                );
                for (item, actual) in items.iter().zip(&got) {
                    self.reserve_item(item, actual)?;
                }
            }
            Op::Complete { tid, rid } => {
                let tid = &self.resolve_tid(tid);
                let rid = self.resolve_rid(*tid, rid);
                let frame =
                    format!(r#"{{"op": "complete", "transfer_id": "{}", "reservation_id": "{}"}}"#, tid_str(*tid), rid);
                let (reply, text) = self.request(&frame);
                let expected = self.complete_item(*tid, &rid);
                ensure!(
                    reply == json!({"ok": true, "result": expected}),
                    "complete {tid} {rid:?}: {text}, model {expected}"
                );
            }
            Op::CompleteBatch { items, bad } => {
                let resolved: Vec<(usize, String)> = items
                    .iter()
                    .map(|(t, p)| {
                        let t = self.resolve_tid(t);
                        (t, self.resolve_rid(t, p))
                    })
                    .collect();
                let mut parts: Vec<String> = resolved
                    .iter()
                    .map(|(t, r)| format!(r#"{{"transfer_id": "{}", "reservation_id": "{}"}}"#, tid_str(*t), r))
                    .collect();
                let bad = bad.as_ref().map(|b| {
                    let at = b.at.min(parts.len());
                    let (part, error) = match b.kind {
                        0 => (format!(r#"{{"transfer_id": "{}"}}"#, tid_str(0)), "'reservation_id'"),
                        1 => ("5".to_string(), "'int' object is not subscriptable"),
                        _ => (r#"{"reservation_id": ""}"#.to_string(), "'transfer_id'"),
                    };
                    parts.insert(at, part);
                    (at, error)
                });
                let frame = format!(r#"{{"op": "complete_batch", "items": [{}]}}"#, parts.join(", "));
                let (reply, text) = self.request(&frame);
                let applied = bad.map_or(resolved.len(), |(at, _)| at);
                let results: Vec<Value> = resolved[..applied].iter().map(|(t, r)| self.complete_item(*t, r)).collect();
                let expected = match bad {
                    Some((_, error)) => json!({"ok": false, "error": error}),
                    None => json!({"ok": true, "result": {"items": results}}),
                };
                ensure!(reply == expected, "complete_batch {resolved:?} bad {bad:?}: {text}, model {expected}");
            }
            Op::Cancel { tid, rid, abandon, refresh } => {
                let tid = &self.resolve_tid(tid);
                let rid = self.resolve_rid(*tid, rid);
                let mut frame =
                    format!(r#"{{"op": "cancel", "transfer_id": "{}", "reservation_id": "{}""#, tid_str(*tid), rid);
                if *abandon {
                    frame.push_str(r#", "abandon": true"#);
                }
                if *refresh {
                    frame.push_str(r#", "refresh": true"#);
                }
                frame.push('}');
                let (reply, text) = self.request(&frame);
                let deferred = self.model.dup_defers(*tid, &rid, *abandon);
                let cancelled = self.model.cancel(*tid, &rid, *abandon, *refresh, now);
                ensure!(
                    reply == json!({"ok": true, "result": {"cancelled": cancelled}}),
                    "cancel {tid} {rid:?} abandon={abandon} refresh={refresh}: {text}, model {cancelled}"
                );
                if cancelled && *abandon && !deferred {
                    self.release_grant(*tid, &rid);
                }
            }
            Op::Status(tid) => {
                let frame = format!(r#"{{"op": "status", "transfer_id": "{}"}}"#, tid_str(*tid));
                let (reply, text) = self.request(&frame);
                let expected = self.model.status(*tid);
                ensure!(reply == json!({"ok": true, "result": expected}), "status {tid}: {text}, model {expected}");
                if !expected.is_null() {
                    let keys =
                        ["\"mm_hash\"", "\"ready\"", "\"reservation_id\"", "\"nbytes\"", "\"shape\"", "\"dtype\""];
                    let pos: Vec<Option<usize>> = keys.iter().map(|k| text.find(k)).collect();
                    ensure!(
                        pos.iter().all(Option::is_some) && pos.windows(2).all(|w| w[0] < w[1]),
                        "status keys out of order: {text}"
                    );
                }
            }
            Op::Take { tid, hash } => {
                let tid = &self.resolve_tid(tid);
                let hash = hash.or_else(|| self.model.recs.get(tid).and_then(|r| r.tensor.as_ref()).map(|t| t.hash));
                let hash = hash.unwrap_or(0);
                let got = self.shard.take(tid_str(*tid), hash_str(hash));
                let expected = self.model.take(*tid, hash);
                match (got, expected) {
                    (Ok(taken), Ok((slot, t))) => {
                        ensure_eq("take offset", taken.view.region.offset, slot as u64 * SLOT)?;
                        ensure_eq("take nbytes", taken.view.nbytes, t.nbytes)?;
                        ensure_eq("take shape", &*taken.shape, t.dims.as_slice())?;
                        ensure_eq("take dtype", taken.dtype.name(), t.dtype)?;
                    }
                    (Err(e), Err(msg)) => ensure_eq("take error", e.to_string(), msg)?,
                    (got, expected) => return Err(format!("take {tid} {hash}: core {got:?}, model {expected:?}")),
                }
            }
            Op::Retire(hash) => {
                let pinned = self.model.entries.values().find(|e| e.pinned).map(|e| e.tensor.hash);
                let hash = hash.or(pinned).unwrap_or(0);
                self.shard.retire(hash_str(hash));
                self.model.retire(hash);
            }
            Op::Tick(ms) => self.now += ms * 1_000_000,
            Op::HandleTimeout => {
                self.shard.handle_timeout(Instant::from_nanos(now));
                self.model.handle_timeout(now);
            }
            Op::Drain { n, confirm } => {
                for _ in 0..*n {
                    let got = self.shard.peek_event().map(|f| String::from_utf8_lossy(f).into_owned());
                    ensure_eq("next event", got.as_ref(), self.model.events.front())?;
                    if let Some(frame) = &got {
                        let v: Value = serde_json::from_str(frame).map_err(|e| format!("event {frame}: {e}"))?;
                        ensure!(v.is_object(), "event {frame} is not an object");
                        ensure!(
                            frame.starts_with(r#"{"transfer_id": "#),
                            "event {frame} does not lead with transfer_id"
                        );
                        ensure!(
                            frame.ends_with(&format!(r#", "shard": {PORT}}}"#)),
                            "event {frame} does not end with shard"
                        );
                    }
                    if got.is_none() || !confirm {
                        break;
                    }
                    self.shard.confirm_sent();
                    self.model.events.pop_front();
                    self.model.events_sent += 1;
                }
            }
            Op::Shutdown => {
                self.shard.begin_shutdown(Instant::from_nanos(now));
                self.model.shutdown(now);
            }
        }
        self.check_invariants()
    }

    /// One reserve (or batch item): validation, the model's prediction, the reply check,
    /// learning a fresh id, the write ledger and the readiness event.
    fn reserve_item(&mut self, item: &ReserveItem, actual: &Value) -> Check {
        let (dims, dtype_name, nbytes) = resolve_spec(item);
        let dtype = match dtype_name {
            "float16" => Some("float16"),
            "half" => Some("half"),
            "bfloat16" => Some("bfloat16"),
            _ => None,
        };
        let expect = match dtype {
            None => Expect::Err(format!("Unsupported torch dtype string: '{dtype_name}'")),
            Some(_) if nbytes != 2 * dims.iter().product::<u64>() => {
                Expect::Err("shape and dtype do not match nbytes".into())
            }
            Some(dtype) => {
                let t = Tensor { hash: item.hash, dims: dims.clone(), dtype, nbytes };
                self.model.reserve(item.tid, &t, self.now)
            }
        };
        let expected = match &expect {
            Expect::Err(e) => json!({"ok": false, "error": e}),
            Expect::Cancelled => json!({"ok": true, "result": {
                "reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": nbytes,
                "write": false, "ready": false, "cancelled": true,
            }}),
            Expect::Granted { rid, dup, slot, write, ready, cached } => {
                let rid = match rid {
                    Some(r) => r.clone(),
                    None => {
                        let r = actual["result"]["reservation_id"].as_str().unwrap_or_default().to_string();
                        ensure!(is_uuid4_hex(&r), "reserve {item:?}: fresh id {r:?} is not uuid4 hex: {actual}");
                        ensure!(self.minted.insert(r.clone()), "reserve {item:?}: id {r} minted twice");
                        if !dup {
                            self.history[item.tid].push(r.clone());
                            self.model.rec(item.tid).rid = r.clone();
                        }
                        r
                    }
                };
                if *write {
                    let offset = *slot as u64 * SLOT;
                    let old = self.ledger.insert(item.tid, (rid.clone(), offset));
                    ensure!(old.is_none(), "write grant for {} while {old:?} is still writer-owned", item.tid);
                }
                if *ready {
                    self.model.queue_event(item.tid);
                }
                json!({"ok": true, "result": {
                    "reservation_id": rid, "dst_session": DST_SESSION,
                    "dst_ptr": SLAB_BASE + *slot as u64 * SLOT, "nbytes": nbytes,
                    "write": write, "ready": ready, "cached": cached,
                }})
            }
        };
        ensure!(*actual == expected, "reserve {item:?} at {}: core {actual}, model {expected}", self.now);
        Ok(())
    }

    fn complete_item(&mut self, tid: usize, rid: &str) -> Value {
        let (completed, became_ready) = self.model.complete(tid, rid, self.now);
        if completed {
            self.release_grant(tid, rid);
        }
        json!({"completed": completed, "became_ready": became_ready})
    }

    /// The producer completed or abandoned `tid`: its write grant (if `rid` names it) ends.
    fn release_grant(&mut self, tid: usize, rid: &str) {
        if self.ledger.get(&tid).is_some_and(|(r, _)| rid.is_empty() || r == rid) {
            self.ledger.remove(&tid);
        }
    }

    fn check_invariants(&self) -> Check {
        let book = self.shard.book();
        book.check_invariants().map_err(|e| format!("book invariant: {e}"))?;

        // Memory: the slab's allocations are exactly the model's occupied slots.
        let allocated: Vec<(u64, u64)> = book.allocations().iter().map(|r| (r.offset, r.len)).collect();
        let model_slots: Vec<(u64, u64)> =
            (0..self.model.slots.len()).filter(|&s| self.model.slots[s]).map(|s| (s as u64 * SLOT, SLOT)).collect();
        ensure_eq("slab allocations", &allocated, &model_slots)?;

        // Writer-owned memory is never released before completion or abandon: every
        // outstanding write grant is still a writer-owned region, still allocated, and
        // nothing else is writer-owned.
        let mut owned: Vec<u64> = book.writer_owned_regions().iter().map(|r| r.offset).collect();
        owned.sort_unstable();
        let mut granted: Vec<u64> = self.ledger.values().map(|(_, off)| *off).collect();
        granted.sort_unstable();
        ensure!(owned == granted, "writer-owned regions {owned:?} != outstanding write grants {:?}", self.ledger);
        for off in &granted {
            ensure!(allocated.iter().any(|(o, _)| o == off), "write grant at {off} is no longer allocated");
        }

        // Tombstones.
        let limit = book.config().tombstone_limit;
        ensure!(book.tombstone_count() <= limit, "{} tombstones over the limit {limit}", book.tombstone_count());
        ensure_eq("tombstones", book.tombstone_count(), self.model.tombs.len())?;

        // Records.
        let core_states: Vec<Option<State>> = (0..N_TIDS).map(|t| book.state_of(tid_str(t))).collect();
        let model_states: Vec<Option<State>> =
            (0..N_TIDS).map(|t| self.model.recs.get(&t).map(|r| r.st.core())).collect();
        ensure_eq("states", core_states, model_states)?;
        ensure_eq("records", book.len(), self.model.recs.len())?;
        let writer_owned = self.model.recs.values().filter(|r| r.st.writer_owned()).count();
        ensure_eq("writer-owned records", self.shard.writer_owned_count(), writer_owned)?;

        // Resident pool.
        let core_entries: Vec<(u64, &str, u64, u32, bool)> = book
            .resident()
            .entries()
            .map(|(id, e)| (id, &*e.mm_hash, e.view.region.offset, e.leases, e.pinned))
            .collect();
        let model_entries: Vec<(u64, &str, u64, u32, bool)> = self
            .model
            .entries
            .iter()
            .map(|(&id, e)| (id, hash_str(e.tensor.hash), e.slot as u64 * SLOT, e.leases, e.pinned))
            .collect();
        ensure_eq("resident entries", &core_entries, &model_entries)?;
        let core_current: Vec<Option<u64>> =
            (0..N_HASHES).map(|h| book.resident().lookup(hash_str(h)).map(|(id, _)| id)).collect();
        let model_current: Vec<Option<u64>> = (0..N_HASHES).map(|h| self.model.current.get(&h).copied()).collect();
        ensure_eq("resident copies", core_current, model_current)?;

        // Events: every readiness the model expects was queued once, and each queued one
        // is pending, sent or counted as dropped.
        let stats = self.shard.stats();
        ensure_eq("events queued", stats.events_queued, self.model.events_queued)?;
        ensure_eq("events dropped", stats.events_dropped, self.model.events_dropped)?;
        ensure_eq("events sent", stats.events_sent, self.model.events_sent)?;
        ensure_eq("events pending", self.shard.pending_events(), self.model.events.len())?;
        ensure!(
            stats.events_queued == self.shard.pending_events() as u64 + stats.events_sent + stats.events_dropped,
            "event accounting: {stats:?}, pending {}",
            self.shard.pending_events()
        );
        ensure_eq("requests", stats.requests, self.requests)?;
        ensure_eq(
            "poll_timeout",
            self.shard.poll_timeout(),
            Some(Instant::from_nanos(self.model.last_reap + REAP_INTERVAL)),
        )?;
        Ok(())
    }
}

fn run(setup: Setup, seed: u64, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut h = Harness::new(setup, seed);
    for (i, op) in ops.iter().enumerate() {
        if let Err(e) = h.step(op) {
            return Err(TestCaseError::fail(format!("step {i} ({op:?}) at t={}ns: {e}", h.now)));
        }
    }
    Ok(())
}

/// `ProptestConfig::default()` honours `PROPTEST_CASES`; failures are persisted under
/// `tests/proptest-regressions/`.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/proptest-regressions/ec_shard_model.txt"
        )))),
        ..ProptestConfig::default()
    }
}

const GEN_A_SMALL: Setup = Setup { gen_b: false, slots: 4, hashes: 3, tombstone_limit: 3, max_events: 3 };
const GEN_A_DEFAULT: Setup =
    Setup { gen_b: false, slots: 5, hashes: 4, tombstone_limit: TOMBSTONE_LIMIT, max_events: MAX_PENDING_EVENTS };
const GEN_B_SMALL: Setup = Setup { gen_b: true, slots: 4, hashes: 4, tombstone_limit: 3, max_events: 3 };
const GEN_B_DEFAULT: Setup =
    Setup { gen_b: true, slots: 6, hashes: 3, tombstone_limit: TOMBSTONE_LIMIT, max_events: MAX_PENDING_EVENTS };

proptest! {
    #![proptest_config(config())]

    /// Gen A: 4 slots, 3 hashes, 3 tombstones, 3 pending events.
    #[test]
    fn gen_a_small_bounds(seed in any::<u64>(), ops in ops()) {
        run(GEN_A_SMALL, seed, &ops)?;
    }

    /// Gen A with the reference's bounds: 5 slots, 4 hashes.
    #[test]
    fn gen_a_default_bounds(seed in any::<u64>(), ops in ops()) {
        run(GEN_A_DEFAULT, seed, &ops)?;
    }

    /// Gen B (follower completion is a no-op): 4 slots, 4 hashes, 3 tombstones, 3 pending events.
    #[test]
    fn gen_b_small_bounds(seed in any::<u64>(), ops in ops()) {
        run(GEN_B_SMALL, seed, &ops)?;
    }

    /// Gen B with the reference's bounds: 6 slots, 3 hashes.
    #[test]
    fn gen_b_default_bounds(seed in any::<u64>(), ops in ops()) {
        run(GEN_B_DEFAULT, seed, &ops)?;
    }
}
