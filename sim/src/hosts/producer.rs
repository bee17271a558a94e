//! A producer (encoder worker): the core's [`PushCoordinator`] over simulated REQ sockets
//! and the device model.
//!
//! The workload hands it push batches; each is reserved at once and its source bound when
//! the encoder finishes. Every [`Transmit::Request`] runs as a task over one of the host's
//! [`ControlClient`]s, the reference's worker threads with their own REQ socket per (thread,
//! address) (ec-behaviour.md §5): the coordinator keeps at most as many requests
//! in flight per shard address as there are clients (one by default), and the host hands
//! each to a client whose socket for that address is idle. Every [`Transmit::Write`] runs
//! as a task that waits out the device's latency and lands the write, where the ownership
//! ledger checks it.
//!
//! `push-settled` (ec-behaviour.md S17, S18): the driver releases a batch's source when the
//! coordinator reports the batch done, so none of the requests or writes the host carries
//! for that batch may still be outstanding then.
//!
//! `push-orphaned` (S20): a batch the coordinator accepted as an orphan (its producer
//! request gave up before the encoder output was bound) neither takes its source later nor
//! writes.

use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::time::Duration;

use ctlplane_core::ec::defaults::CONTROL_TIMEOUT;
use ctlplane_core::ec::producer::{
    BatchId, ItemOutcome, ItemRef, PushBatch, PushConfig, PushCoordinator, PushEvent, Token, Transmit,
};
use ctlplane_core::ec::request_slot::ReplyError;
use ctlplane_core::ec::{ReserveError, State};
use ctlplane_core::time::Instant;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::Value;
use tokio::sync::mpsc;

use super::client::ControlClient;
use super::workload::Request;
use super::world::{self, Pushed};
use crate::clock;
use crate::knobs::ProducerStalls;
use crate::zmq::Context;

enum Answer {
    Reply(Token, Result<Value, ReplyError>),
    Write(Token, Result<(), String>),
}

/// Runs one producer; a restart starts with an empty coordinator and picks the workload
/// up from the current time (what the crashed process was pushing is lost with it).
pub async fn run(host: String) -> turmoil::Result {
    let incarnation = world::start_incarnation(&host);
    let Some((me, workload, bases)) = world::with(|w| {
        let me = w.topo.producers.iter().position(|p| *p == host)?;
        let bases: Vec<String> = w.topo.consumers.iter().map(|c| c.base_addr()).collect();
        Some((me, w.workload.clone(), bases))
    }) else {
        return Ok(());
    };
    crate::trace::record(&host, "ec.producer.start", &[("incarnation", &incarnation)]);
    let ctx = Context::new(&host);
    let (regressions, sockets, request_timeout) = world::with(|w| {
        (w.regressions.push, w.knobs.producer_sockets_per_shard.unwrap_or(1).max(1), w.knobs.request_timeout_of(me))
    });
    let clients: Vec<Rc<ControlClient>> =
        (0..sockets).map(|_| Rc::new(ControlClient::new(&ctx, &host, CONTROL_TIMEOUT))).collect();
    let mut coordinator =
        PushCoordinator::new(PushConfig { regressions, max_requests_per_shard: sockets, ..PushConfig::default() });
    // Which client's socket to an address carries a request, by token; when each was last
    // handed one (a job goes to the worker idle longest).
    let mut socket_busy: BTreeSet<(usize, String)> = BTreeSet::new();
    let mut last_used: BTreeMap<(usize, String), u64> = BTreeMap::new();
    let mut handed = 0u64;
    let mut carried_by: BTreeMap<Token, (usize, String)> = BTreeMap::new();
    // For `push-settled`: the batch of every transfer id pushed, and of every request or
    // write handed out and not yet answered.
    let mut batch_of: BTreeMap<String, BatchId> = BTreeMap::new();
    let mut outstanding: BTreeMap<Token, (BatchId, &'static str)> = BTreeMap::new();
    // Retried cancels and discoveries (`cancel-attempts`).
    let mut attempts = crate::cancel_attempts::ProducerRetries::new(!regressions.s8_base_fallback);
    let (tx, mut rx) = mpsc::unbounded_channel::<Answer>();
    let start = clock::now();
    let mut next = workload.iter().position(|r| r.at >= start).unwrap_or(workload.len());
    // Retried encoder calls this producer runs (`WorkloadConfig::retry`), in time order.
    let mut retries: Vec<(Instant, usize)> = workload
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.retry.as_ref().filter(|t| t.producer == me && t.at >= start).map(|t| (t.at, i)))
        .collect();
    retries.sort();
    let mut next_retry = 0;
    let stalls = world::with(|w| {
        let salt = (me as u64) << 32 | u64::from(incarnation);
        w.knobs
            .producer_stalls
            .map(|c| stall_windows(&c, start, &mut world::rng(w.seed, world::stream::PRODUCER, salt)))
    })
    .unwrap_or_default();
    // Source binds due, by time.
    let mut binds: BTreeMap<Instant, Vec<_>> = BTreeMap::new();
    // Producer requests that finish at a deadline, bound or not (`Knobs::producer_request_timeout`).
    let mut deadlines: BTreeMap<Instant, Vec<BatchId>> = BTreeMap::new();
    // Batches the coordinator accepted as orphans (`push-orphaned`).
    let mut orphaned: BTreeSet<BatchId> = BTreeSet::new();
    let mut batches = BTreeMap::new();
    // For the announcement oracle: each batch's consumer and its ranks' incarnations when
    // it began, the item each write is for, and the writes that landed per item.
    let mut began: BTreeMap<_, (usize, Vec<(String, u32)>)> = BTreeMap::new();
    let mut write_items: BTreeMap<Token, ItemRef> = BTreeMap::new();
    let mut written: BTreeMap<ItemRef, usize> = BTreeMap::new();

    loop {
        let now = clock::now();
        // Pushes due now: this producer's own requests (bound when the encoder finishes),
        // then the retries handed to it (same transfer ids, their own encoder run).
        let mut due = Vec::new();
        while let Some(req) = workload.get(next).filter(|r| r.at <= now) {
            next += 1;
            if req.producer == me {
                due.push((req, now + req.encode, "ec.push"));
            }
        }
        while let Some(&(at, r)) = retries.get(next_retry).filter(|(at, _)| *at <= now) {
            next_retry += 1;
            if let Some((req, retry)) = workload.get(r).and_then(|q| Some((q, q.retry.as_ref()?))) {
                due.push((req, at + retry.encode, "ec.push_retry"));
            }
        }
        for (req, bind_at, what) in due {
            let Some(base) = bases.get(req.consumer) else { continue };
            let batch = PushBatch::new(base.clone(), req.items.clone()).awaiting_source();
            let id = coordinator.push(batch, now);
            batch_of.extend(req.items.iter().map(|i| (i.transfer_id.clone(), id)));
            batches.insert(id, req.id);
            began.insert(id, (req.consumer, world::with(|w| w.rank_incarnations(req.consumer))));
            binds.entry(bind_at).or_default().push(id);
            if let Some(limit) = request_timeout {
                deadlines.entry(now + limit).or_default().push(id);
            }
            let due = request_timeout.map_or(bind_at, |limit| bind_at.min(now + limit));
            crate::push_returns::began(&host, incarnation, id, due);
            crate::trace::record(&host, what, &[("request", &req.id), ("batch", &id), ("items", &req.items.len())]);
        }
        while let Some(entry) = binds.first_entry().filter(|e| *e.key() <= now) {
            for id in entry.remove() {
                match coordinator.bind_source(id, now) {
                    Err(e) => tracing::debug!(%host, error = %e, "source bound to a finished batch"),
                    Ok(()) if orphaned.contains(&id) => crate::oracle::violate(
                        "push-orphaned",
                        &host,
                        format!(
                            "{id} took its source after it was orphaned: the push goes on for a request that gave up"
                        ),
                    ),
                    Ok(()) => {}
                }
            }
        }
        while let Some(entry) = deadlines.first_entry().filter(|e| *e.key() <= now) {
            for id in entry.remove() {
                // A batch whose source is bound, or that is already done, is not orphaned.
                if coordinator.orphan(id, now).is_ok() {
                    crate::trace::record(&host, "ec.push_orphaned", &[("batch", &id)]);
                    orphaned.insert(id);
                }
            }
        }
        while let Some(t) = coordinator.poll_transmit() {
            match t {
                Transmit::Request { token, batch, addr, frame } => {
                    crate::release::note_sent(&addr, &frame);
                    attempts.sent(&host, token, batch, &addr, &frame);
                    if let Some((op, batch)) = batch_of_frame(&frame, &batch_of) {
                        outstanding.insert(token, (batch, op));
                    }
                    // The coordinator never has more in flight to one address than there
                    // are clients (`max_requests_per_shard`): a REQ socket carries one
                    // request at a time, and one with none idle fails the lockstep.
                    let idle = (0..clients.len())
                        .filter(|&i| !socket_busy.contains(&(i, addr.clone())))
                        .min_by_key(|&i| last_used.get(&(i, addr.clone())).copied().unwrap_or(0));
                    let slot = idle.unwrap_or_else(|| {
                        let detail =
                            format!("the coordinator sent a request to {addr} with all {} sockets busy", clients.len());
                        crate::oracle::violate("req-lockstep", &host, detail);
                        0
                    });
                    handed += 1;
                    last_used.insert((slot, addr.clone()), handed);
                    socket_busy.insert((slot, addr.clone()));
                    carried_by.insert(token, (slot, addr.clone()));
                    let (client, tx) = (clients[slot].clone(), tx.clone());
                    // A request due while the producer stalls leaves when the stall ends.
                    let resume = stalls.iter().find(|(from, to)| *from <= now && now < *to).map(|w| w.1);
                    tokio::task::spawn_local(async move {
                        if let Some(at) = resume {
                            clock::sleep_until(at).await;
                        }
                        let reply = client.request(&addr, frame).await;
                        let _ = tx.send(Answer::Reply(token, reply));
                    });
                }
                Transmit::Write { token, session, dst_ptr, nbytes, item } => {
                    if orphaned.contains(&item.batch) {
                        crate::oracle::violate(
                            "push-orphaned",
                            &host,
                            format!(
                                "{} wrote item {} after it was orphaned, with no source to write",
                                item.batch, item.index
                            ),
                        );
                    }
                    write_items.insert(token, item);
                    outstanding.insert(token, (item.batch, "write"));
                    let (tx, host) = (tx.clone(), host.clone());
                    let (transfer_id, mm_hash) = batches
                        .get(&item.batch)
                        .and_then(|&r| workload.get(r as usize))
                        .and_then(|r| r.items.get(item.index))
                        .map(|i| (i.transfer_id.clone(), i.mm_hash.clone()))
                        .unwrap_or_default();
                    tokio::task::spawn_local(async move {
                        let result = write(&host, &session, dst_ptr, nbytes, &transfer_id, &mm_hash).await;
                        let _ = tx.send(Answer::Write(token, result));
                    });
                }
            }
        }
        while let Some(PushEvent::BatchDone { batch, outcomes }) = coordinator.poll_event() {
            let unsettled: Vec<&str> = outstanding.values().filter(|(b, _)| *b == batch).map(|(_, op)| *op).collect();
            if !unsettled.is_empty() {
                crate::oracle::violate(
                    "push-settled",
                    &host,
                    format!("{batch} reported done, its source released, with {unsettled:?} still in flight"),
                );
            }
            crate::push_returns::done(&host, batch);
            orphaned.remove(&batch);
            let kept = attempts.batch_done(&host, batch);
            batch_of.retain(|_, b| *b != batch);
            let request = batches.remove(&batch).unwrap_or(u64::MAX);
            if let Some(req) = usize::try_from(request).ok().and_then(|r| workload.get(r)) {
                crate::release::note_push_done(req.items.iter().map(|i| i.transfer_id.as_str()));
            }
            let landed: Vec<usize> =
                (0..outcomes.len()).map(|index| written.remove(&ItemRef { batch, index }).unwrap_or(0)).collect();
            let items = usize::try_from(request).ok().and_then(|r| workload.get(r)).map(|req| &req.items[..]);
            let release_failed: Vec<bool> = (0..outcomes.len())
                .map(|i| items.and_then(|items| items.get(i)).is_some_and(|item| kept.contains(&item.transfer_id)))
                .collect();
            crate::push_returns::check_outcomes(&host, batch, &outcomes, &landed, &release_failed);
            note_pushed(&workload, request, began.remove(&batch), &outcomes, |index| {
                landed.get(index).copied().unwrap_or(0)
            });
            let (mut pushed, mut skipped, mut failed) = (0u64, 0u64, 0u64);
            for o in &outcomes {
                match o {
                    ItemOutcome::Pushed => pushed += 1,
                    ItemOutcome::Skipped { .. } => skipped += 1,
                    ItemOutcome::Failed { .. } => failed += 1,
                }
            }
            // The first failure's reason, so a trace says why a push failed.
            let first_error = outcomes
                .iter()
                .find_map(|o| match o {
                    ItemOutcome::Failed { error } => Some(error.as_str()),
                    _ => None,
                })
                .unwrap_or("");
            let items = workload.get(request as usize).map(|r| r.items.as_slice()).unwrap_or_default();
            let consumer = workload.get(request as usize).map(|r| r.consumer);
            let pool_full = ReserveError::PoolFull.to_string();
            let now = clock::now();
            world::with(|w| {
                for (item, o) in items.iter().zip(&outcomes) {
                    if *o == ItemOutcome::Pushed {
                        w.note_pushed(&item.transfer_id, now);
                    }
                    if let ItemOutcome::Failed { error } = o {
                        w.push_failed.insert(item.transfer_id.clone());
                        if *error == pool_full {
                            w.pool_full.extend(consumer.map(|c| (c, now)));
                        }
                    }
                }
                w.count("push.pushed", pushed);
                w.count("push.skipped", skipped);
                w.count("push.failed", failed);
            });
            crate::trace::record(
                &host,
                "ec.push_done",
                &[
                    ("request", &request),
                    ("pushed", &pushed),
                    ("skipped", &skipped),
                    ("failed", &failed),
                    ("error", &first_error),
                ],
            );
        }
        let wake = [
            workload.get(next).map(|r| r.at),
            binds.keys().next().copied(),
            deadlines.keys().next().copied(),
            retries.get(next_retry).map(|r| r.0),
        ]
        .into_iter()
        .flatten()
        .min();
        let answer = match wake {
            Some(at) => tokio::select! {
                biased;
                a = rx.recv() => a,
                _ = clock::sleep_until(at) => None,
            },
            None => rx.recv().await,
        };
        for a in answer.into_iter().chain(std::iter::from_fn(|| rx.try_recv().ok())) {
            match a {
                Answer::Reply(token, reply) => {
                    outstanding.remove(&token);
                    attempts.answered(token, &reply);
                    if let Some(slot) = carried_by.remove(&token) {
                        socket_busy.remove(&slot);
                    }
                    coordinator.handle_reply(token, reply, clock::now())
                }
                Answer::Write(token, result) => {
                    outstanding.remove(&token);
                    if let Some(item) = write_items.remove(&token).filter(|_| result.is_ok()) {
                        *written.entry(item).or_default() += 1;
                    }
                    coordinator.handle_write(token, result, clock::now())
                }
            }
        }
    }
}

/// The op of a control request and the batch whose transfer it names (`transfer_id`, or the
/// first of `items`), if it names one this host pushes. `peers` names none.
fn batch_of_frame(frame: &[u8], batch_of: &BTreeMap<String, BatchId>) -> Option<(&'static str, BatchId)> {
    let v: Value = serde_json::from_slice(frame).ok()?;
    let op = match v.get("op")?.as_str()? {
        "reserve" => "reserve",
        "reserve_batch" => "reserve_batch",
        "complete" => "complete",
        "complete_batch" => "complete_batch",
        "cancel" => "cancel",
        _ => "request",
    };
    let tid = v
        .get("transfer_id")
        .or_else(|| v.get("items")?.as_array()?.first()?.get("transfer_id"))
        .and_then(Value::as_str)?;
    Some((op, *batch_of.get(tid)?))
}

/// The stalls of one producer incarnation from `start` to the end of the run: gaps drawn
/// around `mean_gap` (uniform up to twice it), lengths between the bounds.
fn stall_windows(config: &ProducerStalls, start: Instant, rng: &mut ChaCha8Rng) -> Vec<(Instant, Instant)> {
    let span = |rng: &mut ChaCha8Rng, lo: Duration, hi: Duration| {
        Duration::from_nanos(rng.gen_range(lo.as_nanos() as u64..=hi.max(lo).as_nanos() as u64))
    };
    let end = Instant::from_nanos(crate::engine::END.as_nanos() as u64);
    let mut out = Vec::new();
    let mut t = start;
    loop {
        t = t + span(rng, Duration::ZERO, config.mean_gap * 2);
        if t >= end {
            return out;
        }
        let until = t + span(rng, config.length.0, config.length.1);
        out.push((t, until));
        t = until;
    }
}

/// Records, for the announcement oracle, the items of a finished batch that were pushed
/// into their own destination on every rank (`writes(index)` landed writes) while their
/// request still waited for them.
fn note_pushed(
    workload: &[Request],
    request: u64,
    began: Option<(usize, Vec<(String, u32)>)>,
    outcomes: &[ItemOutcome],
    mut writes: impl FnMut(usize) -> usize,
) {
    let (Some(req), Some((consumer, incarnations))) = (workload.get(request as usize), began) else { return };
    for (index, outcome) in outcomes.iter().enumerate() {
        let landed = writes(index);
        let Some(item) = req.items.get(index) else { continue };
        if *outcome != ItemOutcome::Pushed || landed < incarnations.len() {
            continue;
        }
        world::with(|w| {
            let waiting = w.items.get(&item.transfer_id).is_some_and(|&(r, i)| w.requests[r].fates[i].is_none());
            if waiting {
                let at = clock::now();
                let pushed = Pushed { consumer, incarnations: incarnations.clone(), at };
                w.pushed.insert(item.transfer_id.clone(), pushed);
            }
        });
    }
}

/// One Mooncake write through the device: it takes the device's time, then lands (or
/// fails); the ledger checks where it landed, and that the reservation it was granted
/// for (`transfer_id`'s on that rank) still owns it as a writer: a region freed and handed
/// to another transfer would pass the region check alone.
async fn write(
    host: &str,
    session: &str,
    dst_ptr: u64,
    nbytes: u64,
    transfer_id: &str,
    mm_hash: &str,
) -> Result<(), String> {
    let plan = world::with(|w| w.device.plan_write(nbytes));
    clock::sleep(plan.latency).await;
    let (landed, granted) = world::with(|w| {
        let ranks = &w.ranks;
        // A closed rank's slab that stays registered (S21) is judged by the book it closed with.
        let shard = w.kept.get(session).cloned().or_else(|| {
            let reg = w.device.slab(session)?;
            ranks.get(&reg.host).filter(|r| r.session == session).map(|r| r.shard.clone())
        });
        let landed = w.device.land(session, dst_ptr, nbytes, &plan, |_| {
            shard.as_ref().map(|s| s.borrow().book().writer_owned_regions()).unwrap_or_default()
        });
        let granted = shard.as_ref().map(|s| s.borrow().book().state_of(transfer_id));
        if landed.is_ok() {
            w.landed.note_landed(session, dst_ptr, nbytes, mm_hash);
        }
        w.landed.note_write_ended(session, transfer_id);
        if landed.is_err() {
            w.write_failed.insert(mm_hash.to_string());
        }
        (landed, granted)
    });
    match landed {
        Ok(None) => {
            if let Some(state) = granted.filter(|s| !s.is_some_and(State::is_writer_owned)) {
                let state = state.map_or("gone".to_string(), |s| s.to_string());
                crate::oracle::violate(
                    "write-owned",
                    host,
                    format!(
                        "{session}: write of {nbytes} bytes for {transfer_id} lands while its reservation is {state}"
                    ),
                );
            }
            Ok(())
        }
        Ok(Some(finding)) => {
            crate::oracle::violate("write-owned", host, format!("{session}: {finding} (a write for {transfer_id})"));
            Ok(())
        }
        // A consumer granted a destination outside the memory it registered: on a real
        // device the bytes land in whatever lies there. The device model refuses them, so
        // the ledger judges the grant here.
        Err(e @ ctlplane_core::ec::dataplane::DataPlaneError::OutOfRange { .. }) => {
            crate::oracle::violate("write-owned", host, format!("{session}: {e}"));
            Err(e.to_string())
        }
        Err(e) => Err(e.to_string()),
    }
}
