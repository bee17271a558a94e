//! The consumer scheduler host: the core's [`Scheduler`] over simulated sockets. Every
//! decision (when to discover and subscribe, when an item is ready, loaded, unavailable or
//! retired, when and how often a remote cancel is tried) is the core's; this host moves
//! control requests, event frames and time, carries out loads and retires on the ranks'
//! shards (the model thread of every rank), and keeps the workload's books.
//!
//! Each [`Lane`] of the core gets its own control client, as production gives it its own
//! thread: discovery shares one client, every consumer's remote cancels have their own.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;

use ctlplane_core::ec::defaults::CONTROL_TIMEOUT;
use ctlplane_core::ec::readiness::ReadinessConfig;
use ctlplane_core::ec::scheduler::{
    ConsumerId, ItemFate as CoreFate, Lane, RequestId, Scheduler, SchedulerConfig, SchedulerEvent, Token, Transmit,
};
use ctlplane_core::time::Instant;
use serde_json::Value;
use tokio::sync::mpsc;

use super::client::ControlClient;
use super::world::{self, ItemFate};
use crate::cancel_attempts::CancelLane;
use crate::clock;
use crate::records_reaped::{self, Finished};
use crate::zmq::{Context, Socket, SocketOptions, SocketType, ZmqError};

enum Msg {
    Reply(Token, Result<Value, String>),
    Event(ConsumerId, Vec<u8>),
}

/// What the host keeps per consumer: the rank hosts (to load and retire on) and the PULL.
struct PerConsumer {
    index: usize,
    /// turmoil hosts of the ranks, by rank.
    ranks: Vec<String>,
    pull: Option<Rc<Socket>>,
}

struct Host {
    name: String,
    ctx: Context,
    core: Scheduler,
    consumers: BTreeMap<ConsumerId, PerConsumer>,
    /// Workload request index of each core request.
    requests: BTreeMap<RequestId, usize>,
    /// Colliding requests ([`Collisions`]): no workload request of their own.
    /// The value: whether its item was refused yet (it must be within the pump that
    /// follows the request).
    colliders: BTreeMap<RequestId, bool>,
    /// Items the core resolved per workload request it has not finished: once all are,
    /// the request is done in the same turn (`request-resolves`).
    items_done: BTreeMap<RequestId, usize>,
    discovery: Rc<ControlClient>,
    cancels: BTreeMap<ConsumerId, Rc<ControlClient>>,
    tx: mpsc::UnboundedSender<Msg>,
    workload: Rc<Vec<super::workload::Request>>,
    /// Items of the requests this incarnation finished (`records-reaped`, `records-kept`).
    finished: Finished,
    /// Requests the client aborted: the core resolves none of their items any more.
    aborted: BTreeSet<RequestId>,
    /// Every consumer's cancel lane (`cancel-attempts`), and the lane of each control
    /// request sent and not answered yet (`scheduler-quiet` counts them).
    lanes: BTreeMap<ConsumerId, CancelLane>,
    in_flight: BTreeMap<Token, Lane>,
    /// Items every rank took (`load-reported`).
    loaded: crate::load_report::Loaded,
}

/// How long before the end of the run a lost load must have begun, past its LOADING
/// deadline, for `request-resolves` to see the scheduler give it up.
const LOST_LOAD_MARGIN: std::time::Duration = std::time::Duration::from_secs(15);

/// Whether a load `host` begins at `now` goes unreported (a lost-loads fault), only while
/// the scheduler's LOADING deadline still falls well inside the run.
fn load_lost(host: &str, now: Instant) -> bool {
    let wait = world::with(|w| w.knobs.push_wait_timeout).unwrap_or(ReadinessConfig::default().push_wait_timeout);
    let end = Instant::from_nanos(crate::engine::END.as_nanos() as u64);
    now + wait + crate::oracle::RESOLVE_SLACK + LOST_LOAD_MARGIN < end && crate::faults::take_lost_load(host)
}

/// Runs the scheduler. A restart loses every request in flight (they die with the
/// process) and the subscription, which is made again from scratch.
pub async fn run(host: String) -> turmoil::Result {
    let incarnation = world::start_incarnation(&host);
    let start = clock::now();
    let workload = world::with(|w| w.workload.clone());
    if incarnation > 0 {
        abort_unresolved(start);
    }
    crate::trace::record(&host, "ec.scheduler.start", &[("incarnation", &incarnation)]);
    let ctx = Context::new(&host);
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    let (config, specs, timeout) = world::with(|w| {
        let mut readiness = ReadinessConfig::default();
        if let Some(wait) = w.knobs.push_wait_timeout {
            readiness.push_wait_timeout = wait;
        }
        let config = SchedulerConfig {
            readiness,
            inbox: w.regressions.inbox,
            regressions: w.regressions.scheduler,
            ..SchedulerConfig::default()
        };
        let specs: Vec<(String, Vec<String>)> =
            w.topo.consumers.iter().map(|c| (c.base_addr(), c.ranks.clone())).collect();
        (config, specs, w.knobs.scheduler_control_timeout.unwrap_or(CONTROL_TIMEOUT))
    });
    let mut core = Scheduler::new(config);
    let mut consumers = BTreeMap::new();
    let mut cancels = BTreeMap::new();
    for (index, (base, ranks)) in specs.into_iter().enumerate() {
        let id = core.add_consumer(&base);
        consumers.insert(id, PerConsumer { index, ranks, pull: None });
        cancels.insert(id, Rc::new(ControlClient::new(&ctx, &host, timeout)));
    }
    let discovery = Rc::new(ControlClient::new(&ctx, &host, timeout));
    let mut collisions = Collisions::new(incarnation);
    let mut h = Host {
        name: host,
        ctx,
        core,
        consumers,
        requests: BTreeMap::new(),
        items_done: BTreeMap::new(),
        colliders: BTreeMap::new(),
        discovery,
        cancels,
        tx,
        workload: workload.clone(),
        finished: Finished::default(),
        aborted: BTreeSet::new(),
        lanes: BTreeMap::new(),
        in_flight: BTreeMap::new(),
        loaded: Default::default(),
    };
    // Client aborts, in time order (`WorkloadConfig::abort`).
    let mut aborts: Vec<(Instant, usize)> =
        workload.iter().enumerate().filter_map(|(r, req)| req.abort.map(|at| (at, r))).collect();
    aborts.sort();
    let mut next_abort = 0;
    let check_at = Instant::from_nanos(records_reaped::CHECK_AT.as_nanos() as u64);
    let mut checked = false;
    let mut next = workload.iter().position(|r| r.at >= start).unwrap_or(workload.len());

    loop {
        let now = clock::now();
        // Requests arriving: wait for every item's events.
        let mut made = Vec::new();
        while let Some(req) = workload.get(next).filter(|r| r.at <= now) {
            let r = next;
            next += 1;
            let Some(&consumer) = h.consumers.iter().find(|(_, c)| c.index == req.consumer).map(|(id, _)| id) else {
                continue;
            };
            let items = req.items.iter().map(|i| (i.transfer_id.clone(), i.mm_hash.clone()));
            let id = h.core.request(consumer, items, now);
            h.requests.insert(id, r);
            if let Some(item) = req.items.first().filter(|_| collisions.draw()) {
                // Another client names the same transfer id for another item (S24).
                let clash = (item.transfer_id.clone(), format!("{}-collision", item.mm_hash));
                crate::trace::record(&h.name, "ec.colliding_request", &[("transfer_id", &clash.0)]);
                let id = h.core.request(consumer, [clash], now);
                h.colliders.insert(id, false);
                made.push(id);
            }
            if let Some(halt) = h.core.halted() {
                // The exception left `schedule()`: EngineCore is gone, and nothing resolves
                // any more.
                crate::trace::record(&h.name, "ec.scheduler.engine_crash", &[("halt", &format!("{halt:?}"))]);
                world::with(|w| w.count("scheduler.halted", 1));
                drop(h);
                return std::future::pending().await;
            }
        }
        while let Some(&(_, r)) = aborts.get(next_abort).filter(|(at, _)| *at <= now) {
            next_abort += 1;
            h.abort(r, now).await;
        }
        h.core.handle_drain(now);
        if h.core.poll_timeout().is_some_and(|d| d <= now) {
            h.core.handle_timeout(now);
        }
        if !checked && now >= check_at {
            h.finished.check_reaped(&h.name, &h.core, now);
            crate::scheduler_quiet::check_settled(&h.name, &h.core, now);
            checked = true;
        }
        h.pump().await;
        for id in made {
            // A colliding transfer id is refused when the request names it (ec-behaviour.md,
            // S24): its item resolves at once, without waiting for any event.
            if h.colliders.get(&id) == Some(&false) {
                crate::oracle::violate(
                    "request-resolves",
                    &h.name,
                    format!("the colliding request {id:?} made at {now} was not refused at once"),
                );
            }
        }
        crate::scheduler_quiet::check_busy(&h.name, &h.core, h.in_flight.len(), now);
        let wake = h
            .core
            .poll_timeout()
            .into_iter()
            .chain(workload.get(next).map(|r| r.at))
            .chain(aborts.get(next_abort).map(|(at, _)| *at))
            .chain((!checked).then_some(check_at))
            .min();
        let msg = match wake {
            Some(at) => tokio::select! {
                biased;
                m = rx.recv() => m,
                _ = clock::sleep_until(at) => None,
            },
            None => rx.recv().await,
        };
        let mut batch: Vec<Msg> = msg.into_iter().collect();
        while let Ok(m) = rx.try_recv() {
            batch.push(m);
        }
        let now = clock::now();
        for m in batch {
            match m {
                Msg::Reply(token, reply) => {
                    h.note_reply(token, reply.is_ok());
                    h.core.handle_reply(token, reply, now)
                }
                Msg::Event(consumer, frame) => match h.core.handle_event_frame(consumer, &frame, now) {
                    Ok(fate) => tracing::trace!(host = %h.name, ?fate, "readiness event"),
                    Err(e) => tracing::warn!(host = %h.name, error = %e, "EC event discarded"),
                },
            }
        }
    }
}

impl Host {
    /// A request of the core was answered (`ok`) or failed: its cancel lane counts it.
    fn note_reply(&mut self, token: Token, ok: bool) {
        if let Some(Lane::Cancel(c)) = self.in_flight.remove(&token) {
            self.lanes.entry(c).or_default().answered(&self.name, ok);
        }
    }

    /// The client gave up on workload request `r`: vLLM finishes the request, and the
    /// scheduler must resolve none of its items afterwards (`request-aborted`).
    async fn abort(&mut self, r: usize, now: Instant) {
        let Some(id) = self.requests.iter().find(|(_, &w)| w == r).map(|(&id, _)| id) else {
            return; // Resolved already, or lost with an earlier incarnation.
        };
        crate::trace::record(&self.name, "ec.request_aborted", &[("request", &r)]);
        world::with(|w| {
            let tids: Vec<String> = w
                .workload
                .get(r)
                .map(|req| req.items.iter().map(|i| i.transfer_id.clone()).collect())
                .unwrap_or_default();
            for tid in tids {
                w.resolve_item(&tid, ItemFate::Aborted, now);
            }
        });
        self.aborted.insert(id);
        self.core.finish_request(id, now);
        self.pump().await;
        if self.requests.contains_key(&id) {
            crate::oracle::violate(
                "request-aborted",
                &self.name,
                format!("request {r} was finished at {now} and the scheduler never reported it done"),
            );
            self.requests.remove(&id);
        }
    }

    /// Sends what the core asks (inline requests right here, the scheduler stalled until
    /// they end) and carries out what it reports, until it has nothing more.
    async fn pump(&mut self) {
        loop {
            if let Some(t) = self.core.poll_transmit() {
                self.send(t).await;
                continue;
            }
            let Some(event) = self.core.poll_event() else { break };
            self.carry_out(event);
        }
        // A request whose every item resolved is finished at once: its end is what cancels
        // its items' records (ec-behaviour.md §6.4).
        for (request, &n) in &self.items_done {
            let Some(&r) = self.requests.get(request) else { continue };
            let items = self.workload.get(r).map_or(0, |req| req.items.len());
            if n >= items {
                crate::oracle::violate(
                    "request-resolves",
                    &self.name,
                    format!("all {n} items of request {r} resolved, and the scheduler did not finish it"),
                );
            }
        }
    }

    async fn send(&mut self, t: Transmit) {
        let client = match t.lane {
            Lane::Discovery(_) => self.discovery.clone(),
            Lane::Cancel(c) => match self.cancels.get(&c) {
                Some(client) => {
                    self.lanes.entry(c).or_default().sent(&self.name, &t.addr, &t.frame);
                    self.loaded.check_cancel(&self.name, c, &t.frame);
                    client.clone()
                }
                None => return,
            },
        };
        self.in_flight.insert(t.token, t.lane);
        if t.inline {
            // The drain waits for the request (race S5); the stall is traced.
            let began = clock::now();
            let reply = client.request(&t.addr, t.frame).await.map_err(|e| e.to_string());
            let blocked_ms = clock::now().as_nanos().saturating_sub(began.as_nanos()) / 1_000_000;
            let consumer = match t.lane {
                Lane::Discovery(c) | Lane::Cancel(c) => c.index(),
            };
            crate::trace::record(
                &self.name,
                "ec.drain_blocked",
                &[("consumer", &consumer), ("ms", &blocked_ms), ("ok", &reply.is_ok())],
            );
            world::with(|w| w.count("scheduler.drain_blocked_ms", blocked_ms));
            self.note_reply(t.token, reply.is_ok());
            self.core.handle_reply(t.token, reply, clock::now());
            return;
        }
        let tx = self.tx.clone();
        tokio::task::spawn_local(async move {
            let reply = client.request(&t.addr, t.frame).await.map_err(|e| e.to_string());
            let _ = tx.send(Msg::Reply(t.token, reply));
        });
    }

    fn carry_out(&mut self, event: SchedulerEvent) {
        let now = clock::now();
        let host = self.name.as_str();
        match event {
            SchedulerEvent::Subscribe { consumer, endpoints } => match subscribe(&self.ctx, host, &endpoints) {
                Ok(pull) => {
                    crate::trace::record(
                        host,
                        "ec.subscribed",
                        &[("consumer", &consumer.index()), ("shards", &endpoints.len())],
                    );
                    let pull = Rc::new(pull);
                    if let Some(c) = self.consumers.get_mut(&consumer) {
                        c.pull = Some(pull.clone());
                    }
                    tokio::task::spawn_local(read_events(consumer, pull, self.tx.clone()));
                }
                Err(e) => self.core.subscribe_failed(consumer, &e),
            },
            SchedulerEvent::Ready { consumer, transfer_id, .. } => {
                self.finished.check_available(host, &transfer_id, now);
                if let Some(c) = self.consumers.get(&consumer) {
                    check_every_shard_published(host, c.index, &c.ranks, &transfer_id);
                }
            }
            SchedulerEvent::Load { consumer, transfer_id, mm_hash, .. } => {
                if load_lost(host, now) {
                    // The model runners hung on it: nothing is taken, nothing reported.
                    crate::trace::record(host, "ec.load_lost", &[("transfer_id", &transfer_id)]);
                    world::with(|w| w.loads_lost.insert(transfer_id.clone(), now));
                    return;
                }
                // The model thread of every rank takes its copy.
                let ranks = self.consumers.get(&consumer).map(|c| c.ranks.clone()).unwrap_or_default();
                let mut loaded = true;
                for rank in &ranks {
                    let shard = world::with(|w| w.shard(rank));
                    let took = shard.is_some_and(|s| s.borrow_mut().take(&transfer_id, &mm_hash).is_ok());
                    world::with(|w| w.dirty.insert(rank.clone()));
                    loaded &= took;
                }
                crate::trace::record(host, "ec.load", &[("transfer_id", &transfer_id), ("loaded", &loaded)]);
                let before = self.core.readiness(consumer).and_then(|r| r.state(&transfer_id));
                self.core.report_load(consumer, &transfer_id, loaded, now);
                crate::load_report::check(host, &self.core, consumer, &transfer_id, before, loaded);
                if loaded {
                    self.loaded.note(consumer, &transfer_id);
                }
            }
            SchedulerEvent::ItemDone { request, transfer_id, fate, .. } if self.aborted.contains(&request) => {
                crate::oracle::violate(
                    "request-aborted",
                    host,
                    format!("{transfer_id} of a request finished earlier (aborted) resolved {fate:?} afterwards"),
                );
            }
            SchedulerEvent::ItemDone { request, transfer_id, fate, .. } if self.colliders.contains_key(&request) => {
                self.colliders.insert(request, true);
                // Only the colliding request fails; the first keeps the id.
                let refused = fate == CoreFate::Unavailable;
                world::with(|w| w.count(if refused { "collisions.refused" } else { "collisions.served" }, 1));
                if !refused {
                    crate::oracle::violate(
                        "request-resolves",
                        host,
                        format!("the colliding request for {transfer_id} ended {fate:?}, not unavailable"),
                    );
                }
            }
            SchedulerEvent::ItemDone { request, transfer_id, fate, .. } => {
                *self.items_done.entry(request).or_default() += 1;
                let fate = match fate {
                    CoreFate::Loaded => ItemFate::Loaded,
                    CoreFate::LoadFailed => ItemFate::LoadFailed,
                    CoreFate::Unavailable => {
                        crate::trace::record(host, "ec.unavailable", &[("transfer_id", &transfer_id)]);
                        ItemFate::Unavailable
                    }
                };
                world::with(|w| w.resolve_item(&transfer_id, fate, now));
            }
            SchedulerEvent::RequestDone { consumer, request } => {
                self.colliders.remove(&request);
                self.items_done.remove(&request);
                if let Some(r) = self.requests.remove(&request) {
                    crate::trace::record(host, "ec.request_done", &[("request", &r)]);
                    if let Some(req) = self.workload.get(r) {
                        self.finished.note(consumer, req.items.iter().map(|i| i.transfer_id.as_str()), now);
                    }
                }
            }
            SchedulerEvent::Retire { consumer, mm_hash } => {
                // The request is done with the item: the encoder cache drops it.
                let ranks = self.consumers.get(&consumer).map(|c| c.ranks.clone()).unwrap_or_default();
                for rank in &ranks {
                    if let Some(s) = world::with(|w| w.shard(rank)) {
                        s.borrow_mut().retire(&mm_hash);
                        check_retired(rank, &s.borrow(), &mm_hash);
                    }
                }
            }
            SchedulerEvent::Released { consumer, transfer_id, gave_up, .. } => {
                self.lanes.entry(consumer).or_default().job_ended(host);
                let failed = gave_up.len() as u64;
                world::with(|w| {
                    w.count("cancel.sent", 1);
                    w.count("cancel.shard_failures", failed);
                });
                crate::trace::record(
                    host,
                    "ec.cancel_remote",
                    &[("transfer_id", &transfer_id), ("failed_shards", &failed)],
                );
            }
            SchedulerEvent::Undiscovered { consumer, .. } => {
                self.lanes.entry(consumer).or_default().job_ended(host);
                world::with(|w| w.count("cancel.undiscovered", 1))
            }
        }
    }
}

/// Which workload requests another client collides with (`Knobs::colliding_ids_per_mille`),
/// drawn from the seed on a stream of their own.
struct Collisions {
    per_mille: u32,
    rng: rand_chacha::ChaCha8Rng,
}

impl Collisions {
    /// RNG stream of the draw (apart from every other stream of the run).
    const STREAM: u64 = 0x5324;

    fn new(incarnation: u32) -> Self {
        use rand::SeedableRng;
        let (seed, per_mille) = world::with(|w| (w.seed, w.knobs.colliding_ids_per_mille.unwrap_or(0)));
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed ^ u64::from(incarnation));
        rng.set_stream(Self::STREAM);
        Collisions { per_mille, rng }
    }

    fn draw(&mut self) -> bool {
        use rand::Rng;
        self.per_mille > 0 && self.rng.gen_range(0..1000) < self.per_mille
    }
}

/// Requests of the crashed incarnation: they died with it.
fn abort_unresolved(now: Instant) {
    world::with(|w| {
        let tids: Vec<String> = w
            .workload
            .iter()
            .filter(|r| r.at < now)
            .flat_map(|r| r.items.iter().map(|i| i.transfer_id.clone()))
            .collect();
        for tid in tids {
            w.resolve_item(&tid, ItemFate::Aborted, now);
        }
    });
}

/// Oracle `retire-unpins`: once the encoder cache dropped `mm_hash`, no resident copy
/// of it stays pinned on the rank (ec-behaviour.md §6.4: its memory becomes evictable). A
/// copy pinned for good is memory the rank never gets back: pool pressure would excuse
/// every push it refuses afterwards.
fn check_retired(rank: &str, shard: &world::Shard, mm_hash: &str) {
    let pinned = shard.book().resident().entries().filter(|(_, e)| &*e.mm_hash == mm_hash && e.pinned).count();
    if pinned > 0 {
        crate::oracle::violate(
            "retire-unpins",
            rank,
            format!("{pinned} resident copies of {mm_hash} still pinned after the encoder cache dropped it"),
        );
    }
}

/// Oracle: the core accepted an item only after every rank published its readiness.
fn check_every_shard_published(host: &str, consumer: usize, ranks: &[String], transfer_id: &str) {
    let published: Vec<u32> = world::with(|w| {
        w.published.get(&(consumer, transfer_id.to_string())).map(|p| p.keys().copied().collect()).unwrap_or_default()
    });
    if published.len() < ranks.len() {
        crate::oracle::violate(
            "accept-before-ready",
            host,
            format!("{transfer_id} accepted with readiness from ranks {published:?} of {}", ranks.len()),
        );
    }
}

fn subscribe(ctx: &Context, host: &str, endpoints: &[String]) -> Result<Socket, String> {
    if crate::faults::take_subscribe_failure(host) {
        crate::trace::record(host, "ec.subscribe_failed", &[("shards", &endpoints.len())]);
        return Err("Too many open files (a subscribe-failures fault)".into());
    }
    let pull = Socket::new(ctx, SocketType::Pull, SocketOptions::default());
    for ep in endpoints {
        let target = world::resolve(ep).ok_or_else(|| format!("no host serves {ep}"))?;
        pull.connect(&target).map_err(|e| e.to_string())?;
    }
    Ok(pull)
}

async fn read_events(consumer: ConsumerId, pull: Rc<Socket>, tx: mpsc::UnboundedSender<Msg>) {
    loop {
        match pull.recv().await {
            Ok(msg) => {
                for frame in msg {
                    if tx.send(Msg::Event(consumer, frame)).is_err() {
                        return;
                    }
                }
            }
            Err(ZmqError::Closed) => return,
            Err(e) => {
                // A transport error stops that drain; the next one reads again.
                tracing::warn!(error = %e, "EC event channel failed");
                clock::sleep(super::consumer::TICK).await;
            }
        }
    }
}
