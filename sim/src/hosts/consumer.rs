//! A consumer rank: one [`ConsumerShard`] behind a REP and a PUSH, served as production
//! serves it: at every turn the shard's `next_step` says whether to publish, reap, wait
//! or stop, and `serve_request` whether to reply (core/src/ec/serve_step.rs).
//!
//! The shard is registered in the world so that the scheduler's loads (`take`, `retire`,
//! the model thread's calls in production) reach it, and the device registers its slab.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use ctlplane_core::ec::defaults::REP_RECV_TIMEOUT;
use ctlplane_core::ec::inbox::decode_event;
use ctlplane_core::ec::State;
use ctlplane_core::ec::{ConsumerShard, ServeStep, ShardConfig};

use super::world::{self, stream, Rank};
use crate::clock;
use crate::zmq::{Context, Socket, SocketOptions, SocketType, ZmqError};

/// The REP receive timeout of the reference loop: with events stuck behind a full PUSH,
/// the loop looks again this often.
pub const TICK: Duration = REP_RECV_TIMEOUT;
/// Mooncake RPC port of a rank's first incarnation; each restart registers its slab
/// under the next one, so a writer holding an old `dst_session` reaches nothing.
const RPC_PORT: u16 = 15000;
/// Event ports: `EVENT_PORT_BASE + 1000 * consumer + 100 * rank + incarnation % 100`.
/// libzmq picks an ephemeral port; here the ranks of one replica share the replica's
/// address, so each picks a distinct one, and a restarted rank a new one, as a fresh
/// ephemeral bind would.
const EVENT_PORT_BASE: u16 = 40000;
/// How long a restarted rank waits for its previous incarnation's port to be released
/// (a refused bind is retried every tick) before giving up.
const BIND_PATIENCE: Duration = Duration::from_secs(5);

/// Runs one rank until its serving loop fails; turmoil restarts it on `bounce`.
pub async fn run(host: String) -> turmoil::Result {
    let incarnation = world::start_incarnation(&host);
    let Some((spec, rank, consumer, index, seed, regressions, max_pending_events)) = world::with(|w| {
        let (spec, rank) = w.topo.rank_of(&host)?;
        let consumer = w.topo.consumers.iter().position(|c| c.name == spec.name)?;
        let index = w.topo.ranks().iter().position(|(_, _, h)| *h == host)?;
        Some((spec.clone(), rank, consumer, index, w.seed, w.regressions, w.knobs.max_pending_events))
    }) else {
        return Ok(());
    };
    let port = spec.rank_port(rank);
    let event_port = EVENT_PORT_BASE + 1000 * consumer as u16 + 100 * rank as u16 + (incarnation % 100) as u16;
    let session = format!("{host}:{}", RPC_PORT + (incarnation % 1000) as u16);
    let slab_base = 0x7000_0000_0000u64 + ((index as u64) << 36);
    let mut config = ShardConfig::new(port, spec.pool_bytes);
    config.peer_ports = spec.peer_ports();
    config.dst_session = session.clone();
    config.slab_base = slab_base;
    config.regressions = regressions.shard;
    config.book.regressions = regressions.book;
    if let Some(n) = max_pending_events {
        config.max_pending_events = n;
    }
    let rng = world::rng(seed, stream::SHARD, (index as u64) << 32 | u64::from(incarnation));
    let shard = Rc::new(RefCell::new(ConsumerShard::new(config, rng, clock::now())));

    let ctx = Context::new(&host);
    let rep = Socket::new(&ctx, SocketType::Rep, SocketOptions::default());
    let push = Socket::new(&ctx, SocketType::Push, SocketOptions::default());
    if !bind_retrying(&host, &rep, port).await || !bind_retrying(&host, &push, event_port).await {
        crate::trace::record(&host, "ec.shard.bind_failed", &[("port", &port)]);
        return Ok(());
    }
    shard.borrow_mut().set_event_port(event_port);
    world::with(|w| {
        w.device.register(&session, &host, slab_base, spec.pool_bytes);
        w.event_ports.insert((spec.name.clone(), event_port), host.clone());
        w.ranks.insert(
            host.clone(),
            Rank { shard: shard.clone(), incarnation, session: session.clone(), consumer, rank, owed: None },
        );
    });
    crate::trace::record(&host, "ec.shard.start", &[("incarnation", &incarnation), ("event_port", &event_port)]);

    let stop = serve(&host, incarnation, consumer, rank, &shard, &rep, &push).await;
    // Afterwards clients only see timeouts (ec-behaviour.md §2.5, races S1, S2).
    crate::trace::record(&host, "ec.shard.stopped", &[("why", &stop.why())]);
    if let Stop::Halted(why) = &stop {
        // The reference's `finally` closes the REP with linger 0 while the process stays
        // up: requests the REP had taken in but the dead loop never read are never answered.
        let queued = rep.queued_inbound();
        if queued > 0 {
            crate::oracle::violate(
                "rep-answers",
                &host,
                format!("{queued} request(s) queued at the REP closed unanswered when the shard halted ({why})"),
            );
        }
    }
    tracing::error!(%host, why = stop.why(), "EC control channel stopped serving");
    drop((rep, push));
    match stop {
        // The control thread died; the process (and the request it never answered) stays.
        Stop::Halted(_) => std::future::pending::<()>().await,
        Stop::Failed(_) => world::with(|w| w.rank_down(&host)),
    }
    Ok(())
}

/// Why a serving loop ended.
enum Stop {
    /// A regression switch halted the shard (the reference's dead control thread).
    Halted(String),
    /// A socket failed.
    Failed(String),
}

impl Stop {
    fn why(&self) -> &str {
        match self {
            Stop::Halted(why) | Stop::Failed(why) => why,
        }
    }
}

async fn bind_retrying(host: &str, socket: &Socket, port: u16) -> bool {
    let mut waited = Duration::ZERO;
    while waited < BIND_PATIENCE {
        match socket.bind(&format!("tcp://0.0.0.0:{port}")).await {
            Ok(_) => return true,
            Err(e) => {
                tracing::debug!(%host, port, error = %e, "bind refused; retrying");
                clock::sleep(TICK).await;
                waited += TICK;
            }
        }
    }
    false
}

async fn serve(
    host: &str,
    incarnation: u32,
    consumer: usize,
    rank: u32,
    shard: &Rc<RefCell<world::Shard>>,
    rep: &Socket,
    push: &Socket,
) -> Stop {
    let mut publish_blocked = false;
    loop {
        let now = clock::now();
        let step = shard.borrow().next_step(now, publish_blocked);
        match step {
            ServeStep::Publish => {
                match flush_events(host, consumer, rank, shard, push) {
                    Ok(all_sent) => publish_blocked = !all_sent,
                    Err(e) => return Stop::Failed(e.to_string()),
                }
                continue;
            }
            ServeStep::Timer => {
                shard.borrow_mut().handle_timeout(now);
                world::with(|w| w.dirty.insert(host.to_string()));
                continue;
            }
            ServeStep::Stop | ServeStep::Reply => return halted(shard),
            ServeStep::Wait { until, push_room: _ } => {
                // The model's PUSH has no writability signal: `until` already brings the
                // loop back within a tick while events wait for room.
                publish_blocked = false;
                match until {
                    Some(until) => {
                        tokio::select! {
                            biased;
                            _ = rep.readable() => {}
                            _ = clock::sleep_until(until) => continue,
                        }
                    }
                    None => rep.readable().await,
                }
            }
        }
        let msg = match rep.try_recv() {
            Ok(m) => m,
            Err(ZmqError::Again) => continue,
            Err(e) => return Stop::Failed(e.to_string()),
        };
        // One frame per request; a multi-part request is answered as malformed.
        let frame = match msg.as_slice() {
            [frame] => frame.clone(),
            _ => Vec::new(),
        };
        let received = clock::now();
        let delay = crate::faults::handler_delay(host);
        world::with(|w| {
            if let Some(r) = w.ranks.get_mut(host) {
                r.owed = Some((received, received + delay.unwrap_or(Duration::ZERO)));
            }
        });
        if let Some(delay) = delay {
            crate::trace::record(host, "ec.slow_handler", &[("delay_ms", &delay.as_millis())]);
            clock::sleep(delay).await;
        }
        let mut reply = Vec::new();
        let step = shard.borrow_mut().serve_request(&frame, clock::now(), &mut reply);
        world::with(|w| {
            w.dirty.insert(host.to_string());
            if let Some(session) = w.ranks.get(host).map(|r| r.session.clone()) {
                w.landed.note_handled(&session, &frame, &reply);
            }
        });
        crate::release::note_handled(host, incarnation, &frame, &shard.borrow());
        if step != ServeStep::Reply {
            return halted(shard);
        }
        if let Err(e) = rep.send(vec![reply]).await {
            return Stop::Failed(e.to_string());
        }
        world::with(|w| {
            if let Some(r) = w.ranks.get_mut(host) {
                r.owed = None;
            }
        });
    }
}

/// How the loop ends when the shard halted.
fn halted(shard: &Rc<RefCell<world::Shard>>) -> Stop {
    Stop::Halted(format!("{:?}", shard.borrow().halted()))
}

/// Hands queued events to PUSH without blocking; `Ok(false)` when PUSH refused one (it
/// stays queued).
fn flush_events(
    host: &str,
    consumer: usize,
    rank: u32,
    shard: &Rc<RefCell<world::Shard>>,
    push: &Socket,
) -> Result<bool, ZmqError> {
    loop {
        let Some(frame) = shard.borrow().peek_event().map(<[u8]>::to_vec) else { return Ok(true) };
        let transfer_id = decode_event(&frame).ok().flatten().map(|e| e.transfer_id);
        match push.try_send(vec![frame.clone()]) {
            Ok(()) => {
                shard.borrow_mut().confirm_sent();
                if let Some(tid) = transfer_id {
                    // An event that waited in the backlog (no subscriber yet) past its
                    // reservation's end is stale: the scheduler has no use for it, and the
                    // destination it names may hold another item's bytes by now. The
                    // ledger judges announcements of reservations still READY.
                    let live = shard.borrow().book().state_of(&tid) == Some(State::Ready);
                    let unwritten = world::with(|w| {
                        w.announced_at.insert((host.to_string(), tid.clone()), clock::now());
                        w.published.entry((consumer, tid)).or_default().insert(rank);
                        let session = w.ranks.get(host).map(|r| r.session.clone()).unwrap_or_default();
                        if live {
                            w.landed.check_published(&session, &frame).err()
                        } else {
                            None
                        }
                    });
                    // Oracle: an item is announced only once its reservation's bytes landed.
                    if let Some(detail) = unwritten {
                        crate::oracle::violate("accept-before-ready", host, detail);
                    }
                }
            }
            Err(ZmqError::Again) => return Ok(false),
            Err(e) => {
                tracing::warn!(%host, error = %e, "publishing an event failed");
                return Err(e);
            }
        }
    }
}
