//! The world registry: what hosts share in-process, and the global view oracles read.
//!
//! Hosts are turmoil programs on one thread; state that production keeps in one process
//! (a rank's shard, seen by its control thread and its model thread) or that stands for
//! something out of scope (the proxy handing the same transfer ids to producer and
//! scheduler, the Mooncake data plane) lives here, behind a thread-local. The engine
//! installs it before a run and takes it back after.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use ctlplane_core::ec::{ConsumerShard, State};
use ctlplane_core::regressions::Regressions;
use ctlplane_core::time::Instant;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::workload::Request;
use crate::device::Device;
use crate::knobs::Knobs;
use crate::topology::Topology;

/// A consumer rank's control shard, shared by its serving loop and the scheduler's loads.
pub type Shard = ConsumerShard<ChaCha8Rng>;

/// RNG stream of each purpose, all derived from the run seed.
pub mod stream {
    pub const WORKLOAD: u64 = 1;
    pub const DEVICE: u64 = 2;
    pub const SHARD: u64 = 3;
    pub const TURMOIL: u64 = 4;
    pub const PRODUCER: u64 = 5;
}

/// A ChaCha stream for `purpose` (and `salt`, e.g. a host and incarnation) of `seed`.
pub fn rng(seed: u64, purpose: u64, salt: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(purpose << 48 ^ salt);
    r
}

/// A live consumer rank.
pub struct Rank {
    pub shard: Rc<RefCell<Shard>>,
    pub incarnation: u32,
    /// Mooncake session of its slab.
    pub session: String,
    pub consumer: usize,
    pub rank: u32,
    /// A request the REP took and has not answered: since when, and by when it must be.
    pub owed: Option<(Instant, Instant)>,
    /// What it answered, counted from the wire (`shard-counters`).
    pub answered: crate::shard_counters::Answered,
    /// How often it published each readiness event, and how many reserves of each
    /// transfer it answered `ready: true` (`announce-once`).
    pub announced: BTreeMap<Vec<u8>, u32>,
    pub ready_answers: BTreeMap<String, u32>,
    /// Transfers `drain_ready` reported whose events have not gone out yet (`ready-log`).
    pub engine_ready: std::collections::VecDeque<String>,
    /// The transfers it answered `write: true`, by `mm_hash` (`reserve-follower`).
    pub writers: BTreeMap<String, std::collections::BTreeSet<String>>,
    /// Transfers a reserve may have granted a second time (a duplicate's grant) while
    /// their record was WRITING (`cancel-rules`).
    pub repeated: std::collections::BTreeSet<String>,
}

/// How an item of a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemFate {
    /// Every rank took it.
    Loaded,
    /// The scheduler gave up waiting (or the transfer id collided): a retryable failure.
    Unavailable,
    /// Announced by every shard, but some rank could not hand it over.
    LoadFailed,
    /// The scheduler process restarted: its requests died with it.
    Aborted,
}

/// A request as the scheduler resolves it.
#[derive(Clone, Debug)]
pub struct RequestState {
    pub fates: Vec<Option<ItemFate>>,
    pub resolved_at: Option<Instant>,
}

/// Everything hosts share.
pub struct World {
    pub topo: Topology,
    pub seed: u64,
    /// Historical behaviours switched on in the core machines (all off by default).
    pub regressions: Regressions,
    /// The scenario's world settings.
    pub knobs: Knobs,
    pub workload: Rc<Vec<Request>>,
    /// transfer id -> (request, item).
    pub items: BTreeMap<String, (usize, usize)>,
    pub requests: Vec<RequestState>,
    /// Live consumer ranks by host.
    pub ranks: BTreeMap<String, Rank>,
    /// Event ports bound, by (logical consumer host, port) -> rank host.
    pub event_ports: BTreeMap<(String, u16), String>,
    /// Program starts per host (0 = first start).
    pub incarnations: BTreeMap<String, u32>,
    pub device: Device,
    /// Ranks that published a readiness event, by (consumer, transfer id), each with
    /// when it first did (`announced-accepted`).
    pub published: BTreeMap<(usize, String), BTreeMap<u32, Instant>>,
    /// Ranks whose book changed since the oracles last looked.
    pub dirty: BTreeSet<String>,
    pub stats: BTreeMap<String, u64>,
    /// Cancels ranks took and abandons producers sent (`reservation-released`).
    pub release: crate::release::ReleaseLedger,
    /// Items a producer reported pushed, written into its own destination on every rank
    /// while their request still waited: each must be announced by every rank.
    pub pushed: BTreeMap<String, Pushed>,
    /// When a rank host last published a readiness event for a transfer: a READY record
    /// lives its TTL from then (give or take the backlog's delay).
    pub announced_at: BTreeMap<(String, String), Instant>,
    /// Items a producer reported pushed while their request still waited, by transfer id.
    pub held: BTreeMap<String, Held>,
    /// Items whose push a producer reported failed, by transfer id.
    pub push_failed: BTreeSet<String>,
    /// Where written bytes landed and which destinations ranks granted
    /// (`accept-before-ready`).
    pub landed: crate::landed::LandedLedger,
    /// Slabs of closed ranks that stay registered because a writer may still land in them
    /// (race S21), by Mooncake session, with the book they closed with.
    pub kept: BTreeMap<String, Rc<RefCell<Shard>>>,
    /// mm_hashes some device write of failed (`delivery-after-heal` leaves them out).
    pub write_failed: BTreeSet<String>,
    /// Items whose load a lost-loads fault left unreported, and when the load began
    /// (`request-resolves` gives them the scheduler's LOADING deadline from then).
    pub loads_lost: BTreeMap<String, Instant>,
    /// When a push item to a consumer was refused because its buffer pool was full, by
    /// consumer index (capacity pressure refuses pushes by design: `delivery-after-heal`
    /// leaves requests that met it out).
    pub pool_full: Vec<(usize, Instant)>,
    /// Pushes producers began and have not reported done (`push-returns`).
    pub open_pushes: crate::push_returns::OpenPushes,
}

/// An item its producer reported pushed (see [`World::pushed`]).
#[derive(Clone, Debug)]
pub struct Pushed {
    /// Index into `Topology::consumers`.
    pub consumer: usize,
    /// The consumer's rank hosts and their incarnations when the push began: the check
    /// holds only where no rank ever restarted.
    pub incarnations: Vec<(String, u32)>,
    pub at: Instant,
}

/// An item a producer reported pushed while its request waited: what every rank of its
/// consumer held then, for the liveness oracle (a pushed item must become available).
#[derive(Clone, Debug)]
pub struct Held {
    pub consumer: usize,
    pub at: Instant,
    /// Live ranks then: host, rank, incarnation, and whether the rank held the transfer
    /// (a record in its book, or its readiness already published).
    pub ranks: Vec<(String, u32, u32, bool)>,
}

thread_local! {
    static WORLD: RefCell<Option<World>> = const { RefCell::new(None) };
}

impl World {
    /// A fresh world for a run.
    pub fn new(
        topo: Topology,
        seed: u64,
        regressions: Regressions,
        knobs: Knobs,
        workload: Vec<Request>,
        device: Device,
    ) -> Self {
        let mut items = BTreeMap::new();
        for (r, req) in workload.iter().enumerate() {
            for (i, item) in req.items.iter().enumerate() {
                items.insert(item.transfer_id.clone(), (r, i));
            }
        }
        let requests =
            workload.iter().map(|r| RequestState { fates: vec![None; r.items.len()], resolved_at: None }).collect();
        World {
            topo,
            seed,
            regressions,
            knobs,
            workload: Rc::new(workload),
            items,
            requests,
            ranks: BTreeMap::new(),
            event_ports: BTreeMap::new(),
            incarnations: BTreeMap::new(),
            device,
            published: BTreeMap::new(),
            dirty: BTreeSet::new(),
            stats: BTreeMap::new(),
            release: crate::release::ReleaseLedger::default(),
            pushed: BTreeMap::new(),
            announced_at: BTreeMap::new(),
            held: BTreeMap::new(),
            push_failed: BTreeSet::new(),
            landed: crate::landed::LandedLedger::default(),
            kept: BTreeMap::new(),
            write_failed: BTreeSet::new(),
            loads_lost: BTreeMap::new(),
            pool_full: Vec::new(),
            open_pushes: Default::default(),
        }
    }

    /// Adds `n` to a counter.
    pub fn count(&mut self, name: &str, n: u64) {
        *self.stats.entry(name.to_string()).or_default() += n;
    }

    /// Resolves one item; returns whether that resolved its whole request.
    pub fn resolve_item(&mut self, transfer_id: &str, fate: ItemFate, now: Instant) -> Option<usize> {
        let &(r, i) = self.items.get(transfer_id)?;
        let req = self.requests.get_mut(r)?;
        if req.fates[i].is_some() {
            return None;
        }
        req.fates[i] = Some(fate);
        let done = req.fates.iter().all(Option::is_some);
        if done {
            req.resolved_at = Some(now);
        }
        let name = match fate {
            ItemFate::Loaded => "items.loaded",
            ItemFate::Unavailable => "items.unavailable",
            ItemFate::LoadFailed => "items.load_failed",
            ItemFate::Aborted => "items.aborted",
        };
        self.count(name, 1);
        done.then_some(r)
    }

    /// The incarnation of every rank of `consumer` (0 for a rank not started yet).
    pub fn rank_incarnations(&self, consumer: usize) -> Vec<(String, u32)> {
        let ranks = self.topo.consumers.get(consumer).map(|c| c.ranks.clone()).unwrap_or_default();
        ranks.into_iter().map(|h| (h.clone(), self.incarnations.get(&h).copied().unwrap_or(0))).collect()
    }

    /// The live shard of a rank host.
    pub fn shard(&self, host: &str) -> Option<Rc<RefCell<Shard>>> {
        self.ranks.get(host).map(|r| r.shard.clone())
    }

    /// A producer reported `transfer_id` pushed: if its request still waits, remember what
    /// each live rank of its consumer held then.
    pub fn note_pushed(&mut self, transfer_id: &str, now: Instant) {
        let Some(&(r, i)) = self.items.get(transfer_id) else { return };
        if self.requests.get(r).is_none_or(|st| st.fates[i].is_some()) {
            return;
        }
        let consumer = self.workload[r].consumer;
        let Some(spec) = self.topo.consumers.get(consumer) else { return };
        let published = self.published.get(&(consumer, transfer_id.to_string()));
        let ranks = spec
            .ranks
            .iter()
            .filter_map(|host| {
                let rank = self.ranks.get(host)?;
                let held = rank.shard.borrow().book().state_of(transfer_id).is_some()
                    || self.release.ever_held(host, rank.incarnation, transfer_id)
                    || published.is_some_and(|p| p.contains_key(&rank.rank));
                Some((host.clone(), rank.rank, rank.incarnation, held))
            })
            .collect();
        self.held.insert(transfer_id.to_string(), Held { consumer, at: now, ranks });
    }

    /// A rank's program is gone (crashed or stopped): its shard, session and event port
    /// with it.
    pub fn rank_down(&mut self, host: &str) {
        self.rank_closed(host, false);
    }

    /// A rank's program is gone; its slab stays registered if `keep_slab` (a clean close
    /// that timed out waiting for its writers, race S21).
    pub fn rank_closed(&mut self, host: &str, keep_slab: bool) {
        if let Some(rank) = self.ranks.remove(host) {
            if keep_slab {
                self.kept.insert(rank.session.clone(), rank.shard.clone());
            } else {
                self.device.unregister(&rank.session);
            }
            self.event_ports.retain(|_, h| h != host);
            self.dirty.remove(host);
        }
    }
}

/// Installs the world of a run (replacing any earlier one).
pub fn install(world: World) {
    WORLD.with(|w| *w.borrow_mut() = Some(world));
}

/// Removes the world after a run.
pub fn take() -> Option<World> {
    WORLD.with(|w| w.borrow_mut().take())
}

/// Runs `f` on the world. Panics outside a run, which is a bug in the engine.
pub fn with<R>(f: impl FnOnce(&mut World) -> R) -> R {
    WORLD.with(|w| {
        let mut w = w.borrow_mut();
        let world = w.as_mut().expect("the simulated world is installed before any host runs");
        f(world)
    })
}

/// Runs `f` on the world if one is installed (a P2P world may run without the EC one).
pub fn try_with<R>(f: impl FnOnce(&mut World) -> R) -> Option<R> {
    WORLD.with(|w| w.borrow_mut().as_mut().map(f))
}

/// A host program starts: its incarnation number (0 the first time).
pub fn start_incarnation(host: &str) -> u32 {
    with(|w| {
        let e = w.incarnations.entry(host.to_string()).or_insert(u32::MAX);
        *e = e.wrapping_add(1);
        *e
    })
}

/// The records `shard` holds for the workload's transfers, with the states `keep`
/// selects (the oracles that judge a rank's book walk the workload, not the book).
pub fn workload_records(shard: &Shard, keep: impl Fn(State) -> bool) -> Vec<(String, State)> {
    let tids: Vec<String> = with(|w| w.items.keys().cloned().collect());
    tids.into_iter().filter_map(|t| shard.book().state_of(&t).map(|s| (t, s))).filter(|(_, s)| keep(*s)).collect()
}

/// The turmoil endpoint serving a logical endpoint (see [`Topology::resolve`]).
pub fn resolve(endpoint: &str) -> Option<String> {
    with(|w| w.topo.resolve(endpoint, &w.event_ports))
}
