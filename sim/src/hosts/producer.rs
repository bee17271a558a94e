//! A producer (encoder worker): the core's [`PushCoordinator`] over simulated REQ sockets
//! and the device model.
//!
//! The workload hands it push batches; each is reserved at once and its source bound when
//! the encoder finishes. Every [`Transmit::Request`] runs as a task over the host's
//! [`ControlClient`] (the coordinator keeps one request in flight per shard address, as one
//! REQ socket per address needs); every [`Transmit::Write`] as a task that waits out the
//! device's latency and lands the write, where the ownership ledger checks it.

use std::collections::BTreeMap;
use std::rc::Rc;

use ctlplane_core::ec::producer::{ItemOutcome, PushBatch, PushConfig, PushCoordinator, PushEvent, Token, Transmit};
use ctlplane_core::time::Instant;
use serde_json::Value;
use tokio::sync::mpsc;

use super::client::{ControlClient, CONTROL_TIMEOUT};
use super::world;
use crate::clock;
use crate::zmq::Context;

enum Answer {
    Reply(Token, Result<Value, String>),
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
    let client = Rc::new(ControlClient::new(&ctx, &host, CONTROL_TIMEOUT));
    let regressions = world::with(|w| w.regressions.push);
    let mut coordinator = PushCoordinator::new(PushConfig { regressions, ..PushConfig::default() });
    let (tx, mut rx) = mpsc::unbounded_channel::<Answer>();
    let start = clock::now();
    let mut next = workload.iter().position(|r| r.at >= start).unwrap_or(workload.len());
    // Source binds due, by time.
    let mut binds: BTreeMap<Instant, Vec<_>> = BTreeMap::new();
    let mut batches = BTreeMap::new();

    loop {
        let now = clock::now();
        while let Some(req) = workload.get(next).filter(|r| r.at <= now) {
            next += 1;
            if req.producer != me {
                continue;
            }
            let Some(base) = bases.get(req.consumer) else { continue };
            let batch = PushBatch::new(base.clone(), req.items.clone()).awaiting_source();
            let id = coordinator.push(batch, now);
            batches.insert(id, req.id);
            binds.entry(now + req.encode).or_default().push(id);
            crate::trace::record(
                &host,
                "ec.push",
                &[("request", &req.id), ("batch", &id), ("items", &req.items.len())],
            );
        }
        while let Some(entry) = binds.first_entry().filter(|e| *e.key() <= now) {
            for id in entry.remove() {
                if let Err(e) = coordinator.bind_source(id, now) {
                    tracing::debug!(%host, error = %e, "source bound to a finished batch");
                }
            }
        }
        while let Some(t) = coordinator.poll_transmit() {
            match t {
                Transmit::Request { token, addr, frame } => {
                    let (client, tx) = (client.clone(), tx.clone());
                    tokio::task::spawn_local(async move {
                        let reply = client.request(&addr, frame).await;
                        let _ = tx.send(Answer::Reply(token, reply));
                    });
                }
                Transmit::Write { token, session, dst_ptr, nbytes, item: _ } => {
                    let (tx, host) = (tx.clone(), host.clone());
                    tokio::task::spawn_local(async move {
                        let result = write(&host, &session, dst_ptr, nbytes).await;
                        let _ = tx.send(Answer::Write(token, result));
                    });
                }
            }
        }
        while let Some(PushEvent::BatchDone { batch, outcomes }) = coordinator.poll_event() {
            let request = batches.remove(&batch).unwrap_or(u64::MAX);
            let (mut pushed, mut skipped, mut failed) = (0u64, 0u64, 0u64);
            for o in &outcomes {
                match o {
                    ItemOutcome::Pushed => pushed += 1,
                    ItemOutcome::Skipped { .. } => skipped += 1,
                    ItemOutcome::Failed { .. } => failed += 1,
                }
            }
            let items = workload.get(request as usize).map(|r| r.items.as_slice()).unwrap_or_default();
            let now = clock::now();
            world::with(|w| {
                for (item, o) in items.iter().zip(&outcomes) {
                    if *o == ItemOutcome::Pushed {
                        w.note_pushed(&item.transfer_id, now);
                    }
                }
                w.count("push.pushed", pushed);
                w.count("push.skipped", skipped);
                w.count("push.failed", failed);
            });
            crate::trace::record(
                &host,
                "ec.push_done",
                &[("request", &request), ("pushed", &pushed), ("skipped", &skipped), ("failed", &failed)],
            );
        }
        let wake = [workload.get(next).map(|r| r.at), binds.keys().next().copied()].into_iter().flatten().min();
        let answer = match wake {
            Some(at) => tokio::select! {
                biased;
                a = rx.recv() => a,
                _ = clock::sleep_until(at) => None,
            },
            None => rx.recv().await,
        };
        match answer {
            Some(Answer::Reply(token, reply)) => coordinator.handle_reply(token, reply, clock::now()),
            Some(Answer::Write(token, result)) => coordinator.handle_write(token, result, clock::now()),
            None => {}
        }
        while let Ok(a) = rx.try_recv() {
            match a {
                Answer::Reply(token, reply) => coordinator.handle_reply(token, reply, clock::now()),
                Answer::Write(token, result) => coordinator.handle_write(token, result, clock::now()),
            }
        }
    }
}

/// One Mooncake write through the device: it takes the device's time, then lands (or
/// fails); the ledger checks where it landed.
async fn write(host: &str, session: &str, dst_ptr: u64, nbytes: u64) -> Result<(), String> {
    let plan = world::with(|w| w.device.plan_write(nbytes));
    clock::sleep(plan.latency).await;
    let landed = world::with(|w| {
        let ranks = &w.ranks;
        w.device.land(session, dst_ptr, nbytes, &plan, |rank_host| {
            ranks.get(rank_host).map(|r| r.shard.borrow().book().writer_owned_regions()).unwrap_or_default()
        })
    });
    match landed {
        Ok(None) => Ok(()),
        Ok(Some(finding)) => {
            crate::oracle::violate("write-owned", host, format!("{session}: {finding}"));
            Ok(())
        }
        Err(e) => Err(e.to_string()),
    }
}
