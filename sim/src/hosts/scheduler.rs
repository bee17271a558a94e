//! The consumer scheduler: for every consumer replica an [`Inbox`] (event subscription
//! through [`EndpointDiscovery`], run as a task so a drain never blocks), a PULL socket,
//! and [`Readiness`] (multi-shard readiness and the waiting table with its push-wait
//! deadline). Requests arrive from the workload; an item is loaded (every rank's `take`)
//! when the core accepts it, and a request fails as unavailable when the core says so.
//! Remote cancels go to every shard through a cancel worker, as the reference's executor.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use ctlplane_core::ec::defaults::CONTROL_TIMEOUT;
use ctlplane_core::ec::inbox::{decode_event, DiscoveryStep, EndpointDiscovery, Inbox, Subscribe};
use ctlplane_core::ec::producer::CANCEL_ATTEMPTS;
use ctlplane_core::ec::readiness::{Notice, Readiness, ReadinessConfig};
use ctlplane_core::ec::requests;
use ctlplane_core::ec::topology::{peers_request, TopologyCache, DISCOVERY_ATTEMPTS};
use ctlplane_core::time::Instant;
use tokio::sync::{mpsc, Notify};

use super::client::ControlClient;
use super::world::{self, ItemFate};
use crate::clock;
use crate::zmq::{Context, Socket, SocketOptions, SocketType, ZmqError};

enum Msg {
    Discovered(usize, Result<Vec<String>, String>),
    Event(usize, Vec<u8>),
}

struct PerConsumer {
    base: String,
    /// turmoil hosts of the ranks, by rank.
    ranks: Vec<String>,
    inbox: Inbox,
    readiness: Readiness,
    pull: Option<Rc<Socket>>,
    cancels: Rc<RefCell<VecDeque<String>>>,
    cancel_wake: Rc<Notify>,
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
    let topology = Rc::new(RefCell::new(TopologyCache::default()));
    let (tx, mut rx) = mpsc::unbounded_channel::<Msg>();
    let mut consumers: Vec<PerConsumer> = world::with(|w| {
        let mut readiness = ReadinessConfig::default();
        if let Some(wait) = w.knobs.push_wait_timeout {
            readiness.push_wait_timeout = wait;
        }
        w.topo
            .consumers
            .iter()
            .map(|c| PerConsumer {
                base: c.base_addr(),
                ranks: c.ranks.clone(),
                inbox: Inbox::new(w.regressions.inbox),
                readiness: Readiness::new(readiness.clone()),
                pull: None,
                cancels: Rc::new(RefCell::new(VecDeque::new())),
                cancel_wake: Rc::new(Notify::new()),
            })
            .collect()
    });
    for c in &consumers {
        let worker = ControlClient::new(&ctx, &host, CONTROL_TIMEOUT);
        tokio::task::spawn_local(cancel_worker(
            worker,
            c.base.clone(),
            topology.clone(),
            c.cancels.clone(),
            c.cancel_wake.clone(),
            host.clone(),
        ));
    }
    let discovery = Rc::new(ControlClient::new(&ctx, &host, CONTROL_TIMEOUT));
    let mut next = workload.iter().position(|r| r.at >= start).unwrap_or(workload.len());

    loop {
        let now = clock::now();
        // Requests arriving: wait for every item's events.
        while let Some(req) = workload.get(next).filter(|r| r.at <= now) {
            next += 1;
            let Some(c) = consumers.get_mut(req.consumer) else { continue };
            for item in &req.items {
                if let Err(e) = c.readiness.wait_for_event(&item.transfer_id, &item.mm_hash, now) {
                    tracing::warn!(%host, error = %e, "request refused");
                    finish_item(&host, c, &item.transfer_id, ItemFate::Unavailable, now);
                }
            }
        }
        // Drain: subscribe if needed (never blocking), then read what arrived.
        for (i, c) in consumers.iter_mut().enumerate() {
            let start = c.inbox.on_drain(&c.base, &topology.borrow());
            if let Some(start) = start {
                let pass = start.pass;
                if start.inline {
                    // The drain waits for the whole pass (race S5); the stall is traced.
                    let began = clock::now();
                    let outcome = discover(&discovery, pass, &topology).await;
                    let blocked_ms = clock::now().as_nanos().saturating_sub(began.as_nanos()) / 1_000_000;
                    crate::trace::record(
                        &host,
                        "ec.drain_blocked",
                        &[("consumer", &i), ("ms", &blocked_ms), ("ok", &outcome.is_ok())],
                    );
                    world::with(|w| w.count("scheduler.drain_blocked_ms", blocked_ms));
                    let _ = tx.send(Msg::Discovered(i, outcome));
                } else {
                    let (client, tx, topology) = (discovery.clone(), tx.clone(), topology.clone());
                    tokio::task::spawn_local(async move {
                        let outcome = discover(&client, pass, &topology).await;
                        let _ = tx.send(Msg::Discovered(i, outcome));
                    });
                }
            }
        }
        for c in consumers.iter_mut() {
            if c.readiness.poll_timeout().is_some_and(|d| d <= now) {
                c.readiness.handle_timeout(now);
            }
            handle_notices(&host, c, now);
        }
        let wake =
            consumers.iter().filter_map(|c| c.readiness.poll_timeout()).chain(workload.get(next).map(|r| r.at)).min();
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
                Msg::Discovered(i, outcome) => {
                    let Some(c) = consumers.get_mut(i) else { continue };
                    if let Some(Subscribe { endpoints }) = c.inbox.on_discovery(outcome) {
                        match subscribe(&ctx, &endpoints) {
                            Ok(pull) => {
                                crate::trace::record(
                                    &host,
                                    "ec.subscribed",
                                    &[("consumer", &i), ("shards", &endpoints.len())],
                                );
                                let pull = Rc::new(pull);
                                c.pull = Some(pull.clone());
                                tokio::task::spawn_local(read_events(i, pull, tx.clone()));
                            }
                            Err(e) => c.inbox.on_subscribe_failed(&e),
                        }
                    }
                }
                Msg::Event(i, frame) => {
                    let Some(c) = consumers.get_mut(i) else { continue };
                    match decode_event(&frame) {
                        Ok(Some(event)) => {
                            let fate = c.readiness.handle_event(event, c.inbox.shard_count(), now);
                            tracing::trace!(%host, ?fate, "readiness event");
                        }
                        Ok(None) => {}
                        Err(e) => tracing::warn!(%host, error = %e, "EC event discarded"),
                    }
                }
            }
        }
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

fn handle_notices(host: &str, c: &mut PerConsumer, now: Instant) {
    while let Some(notice) = c.readiness.poll_notice() {
        match notice {
            Notice::Available { transfer_id, event } => {
                let consumer = world::with(|w| w.topo.consumers.iter().position(|s| s.base_addr() == c.base));
                check_every_shard_published(host, consumer, &c.ranks, &transfer_id);
                let waited =
                    world::with(|w| w.items.get(&transfer_id).is_some_and(|&(r, i)| w.requests[r].fates[i].is_none()));
                if !waited || !c.readiness.begin_load(&transfer_id, now) {
                    continue;
                }
                // The model thread of every rank takes its copy.
                let mut loaded = true;
                for rank in &c.ranks {
                    let shard = world::with(|w| w.shard(rank));
                    let took = shard.is_some_and(|s| s.borrow_mut().take(&transfer_id, &event.mm_hash).is_ok());
                    world::with(|w| w.dirty.insert(rank.clone()));
                    loaded &= took;
                }
                c.readiness.report_load(&transfer_id, loaded, now);
                crate::trace::record(host, "ec.load", &[("transfer_id", &transfer_id), ("loaded", &loaded)]);
                let fate = if loaded { ItemFate::Loaded } else { ItemFate::LoadFailed };
                finish_item(host, c, &transfer_id, fate, now);
                // The request is done with the item: the encoder cache drops it.
                for rank in &c.ranks {
                    if let Some(s) = world::with(|w| w.shard(rank)) {
                        s.borrow_mut().retire(&event.mm_hash);
                    }
                }
            }
            Notice::Unavailable { transfer_id, mm_hash: _ } => {
                crate::trace::record(host, "ec.unavailable", &[("transfer_id", &transfer_id)]);
                finish_item(host, c, &transfer_id, ItemFate::Unavailable, now);
            }
            Notice::CancelRemote { transfer_id } => {
                c.cancels.borrow_mut().push_back(transfer_id);
                c.cancel_wake.notify_one();
            }
        }
    }
}

/// Resolves an item; once its whole request is resolved, the request finishes, which
/// cancels (in the core's terms) every item it held.
fn finish_item(host: &str, c: &mut PerConsumer, transfer_id: &str, fate: ItemFate, now: Instant) {
    let Some(r) = world::with(|w| w.resolve_item(transfer_id, fate, now)) else { return };
    let items = world::with(|w| w.workload[r].items.clone());
    crate::trace::record(host, "ec.request_done", &[("request", &r)]);
    for item in items {
        c.readiness.cancel(&item.transfer_id, &item.mm_hash, now);
    }
}

/// Oracle: the core accepted an item only after every rank published its readiness.
fn check_every_shard_published(host: &str, consumer: Option<usize>, ranks: &[String], transfer_id: &str) {
    let Some(consumer) = consumer else { return };
    let published = world::with(|w| w.published.get(&(consumer, transfer_id.to_string())).cloned()).unwrap_or_default();
    if published.len() < ranks.len() {
        crate::oracle::violate(
            "accept-before-ready",
            host,
            format!("{transfer_id} accepted with readiness from ranks {published:?} of {}", ranks.len()),
        );
    }
}

/// One discovery pass: `peers` (unless cached) and every shard's `event_port`.
async fn discover(
    client: &ControlClient,
    mut d: EndpointDiscovery,
    topology: &Rc<RefCell<TopologyCache>>,
) -> Result<Vec<String>, String> {
    let mut step = d.step();
    loop {
        match step {
            DiscoveryStep::Request { addr, frame } => {
                let reply = client.request(&addr, frame).await;
                step = d.handle_reply(&mut topology.borrow_mut(), reply);
            }
            DiscoveryStep::Done(endpoints) => return Ok(endpoints),
            DiscoveryStep::Failed(e) => return Err(e),
        }
    }
}

fn subscribe(ctx: &Context, endpoints: &[String]) -> Result<Socket, String> {
    let pull = Socket::new(ctx, SocketType::Pull, SocketOptions::default());
    for ep in endpoints {
        let target = world::resolve(ep).ok_or_else(|| format!("no host serves {ep}"))?;
        pull.connect(&target).map_err(|e| e.to_string())?;
    }
    Ok(pull)
}

async fn read_events(consumer: usize, pull: Rc<Socket>, tx: mpsc::UnboundedSender<Msg>) {
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

/// Plain cancels to every shard of one consumer, one transfer at a time: discovery (cached
/// topology, else `peers`) and each cancel tried [`CANCEL_ATTEMPTS`] times.
async fn cancel_worker(
    client: ControlClient,
    base: String,
    topology: Rc<RefCell<TopologyCache>>,
    queue: Rc<RefCell<VecDeque<String>>>,
    wake: Rc<Notify>,
    host: String,
) {
    loop {
        let Some(transfer_id) = queue.borrow_mut().pop_front() else {
            wake.notified().await;
            continue;
        };
        let mut shards = topology.borrow().get(&base).map(<[String]>::to_vec);
        let mut attempt = 0;
        while shards.is_none() && attempt < DISCOVERY_ATTEMPTS {
            attempt += 1;
            let reply = client.request(&base, peers_request()).await;
            shards = topology.borrow_mut().record(&base, reply).ok();
        }
        let Some(shards) = shards else {
            tracing::warn!(%host, %transfer_id, "Could not discover every EC consumer shard at {base}");
            world::with(|w| w.count("cancel.undiscovered", 1));
            continue;
        };
        let frame = requests::make_cancel_request(&transfer_id, "", false, false);
        let mut sent = BTreeMap::new();
        for shard in &shards {
            let mut ok = false;
            for _ in 0..CANCEL_ATTEMPTS {
                if client.request(shard, frame.clone()).await.is_ok() {
                    ok = true;
                    break;
                }
            }
            sent.insert(shard.clone(), ok);
        }
        let failed = sent.values().filter(|ok| !**ok).count() as u64;
        world::with(|w| {
            w.count("cancel.sent", 1);
            w.count("cancel.shard_failures", failed);
        });
        crate::trace::record(&host, "ec.cancel_remote", &[("transfer_id", &transfer_id), ("failed_shards", &failed)]);
    }
}
