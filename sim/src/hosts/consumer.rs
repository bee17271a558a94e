//! A consumer rank: one [`ConsumerShard`] behind a REP and a PUSH, served as production
//! serves it: at every turn the shard's `next_step` says whether to publish, reap, wait
//! or stop, and `serve_request` whether to reply (core/src/ec/serve_step.rs).
//!
//! The shard is registered in the world so that the scheduler's loads (`take`, `retire`,
//! the model thread's calls in production) reach it, and the device registers its slab.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use ctlplane_core::ec::defaults::{CONTROL_TIMEOUT, REP_RECV_TIMEOUT};
use ctlplane_core::ec::inbox::decode_event;
use ctlplane_core::ec::State;
use ctlplane_core::ec::{ConsumerShard, DrainOutcome, DrainStep, ServeStep, ShardConfig, ShutdownDrain};
use ctlplane_core::time::Instant;

use super::world::{self, stream, Rank};
use crate::clock;
use crate::knobs::ConsumerShutdown;
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

/// Runs one rank until its serving loop fails; turmoil restarts it on `bounce`. A rank that
/// closes cleanly (`Knobs::consumer_shutdown`) starts again as a new incarnation.
pub async fn run(host: String) -> turmoil::Result {
    while let Some(down) = run_incarnation(&host).await {
        clock::sleep(down).await;
    }
    Ok(())
}

/// One incarnation of the rank: `Some(down)` when it closed cleanly and starts again
/// `down` later.
async fn run_incarnation(host: &str) -> Option<Duration> {
    let host = host.to_string();
    let incarnation = world::start_incarnation(&host);
    let (spec, rank, consumer, index, seed, regressions, (max_pending_events, tombstone_limit), shutdown) =
        world::with(|w| {
            let (spec, rank) = w.topo.rank_of(&host)?;
            let consumer = w.topo.consumers.iter().position(|c| c.name == spec.name)?;
            let index = w.topo.ranks().iter().position(|(_, _, h)| *h == host)?;
            // Only the first incarnation closes; its successor serves to the end.
            let shutdown = w
                .knobs
                .consumer_shutdown
                .filter(|s| incarnation == 0 && s.consumer % w.topo.consumers.len().max(1) == consumer);
            let bounds = (w.knobs.max_pending_events, w.knobs.tombstone_limit);
            Some((spec.clone(), rank, consumer, index, w.seed, w.regressions, bounds, shutdown))
        })?;
    let event_port = EVENT_PORT_BASE + 1000 * consumer as u16 + 100 * rank as u16 + (incarnation % 100) as u16;
    let session = format!("{host}:{}", RPC_PORT + (incarnation % 1000) as u16);
    let slab_base = 0x7000_0000_0000u64 + ((index as u64) << 36);
    let mut config = match spec.plan().and_then(|plan| ShardConfig::for_rank(&plan, rank, spec.pool_bytes)) {
        Ok(config) => config,
        Err(e) => {
            crate::trace::record(&host, "ec.shard.bad_config", &[("error", &e)]);
            return None;
        }
    };
    let port = config.port;
    config.dst_session = session.clone();
    config.slab_base = slab_base;
    config.regressions = regressions.shard;
    config.book.regressions = regressions.book;
    if let Some(n) = max_pending_events {
        config.max_pending_events = n;
    }
    if let Some(n) = tombstone_limit {
        config.book.tombstone_limit = n;
    }
    let rng = world::rng(seed, stream::SHARD, (index as u64) << 32 | u64::from(incarnation));
    let shard = Rc::new(RefCell::new(ConsumerShard::new(config, rng, clock::now())));

    let ctx = Context::new(&host);
    let rep = Socket::new(&ctx, SocketType::Rep, SocketOptions::default());
    let push = Socket::new(&ctx, SocketType::Push, SocketOptions::default());
    if !bind_retrying(&host, &rep, port).await || !bind_retrying(&host, &push, event_port).await {
        crate::trace::record(&host, "ec.shard.bind_failed", &[("port", &port)]);
        return None;
    }
    shard.borrow_mut().set_event_port(event_port);
    world::with(|w| {
        w.device.register(&session, &host, slab_base, spec.pool_bytes);
        w.event_ports.insert((spec.name.clone(), event_port), host.clone());
        w.ranks.insert(
            host.clone(),
            Rank {
                shard: shard.clone(),
                incarnation,
                session: session.clone(),
                consumer,
                rank,
                owed: None,
                answered: Default::default(),
                announced: Default::default(),
                ready_answers: Default::default(),
                engine_ready: Default::default(),
                writers: Default::default(),
                repeated: Default::default(),
            },
        );
    });
    crate::trace::record(&host, "ec.shard.start", &[("incarnation", &incarnation), ("event_port", &event_port)]);

    let mut close = shutdown.map(Close::armed);
    let stop = serve(&host, incarnation, consumer, rank, &shard, (&rep, &push), &mut close).await;
    if let Stop::Closed { keep_slab, waited } = stop {
        // Clients of the closed REP see timeouts until the next incarnation binds.
        drop((rep, push));
        crate::shutdown::check_release(&host, &session, &shard.borrow(), keep_slab, waited);
        world::with(|w| w.rank_closed(&host, keep_slab));
        crate::trace::record(&host, "ec.shard.closed", &[("slab_kept", &keep_slab)]);
        world::with(|w| w.count(if keep_slab { "shutdown.slab_kept" } else { "shutdown.released" }, 1));
        return shutdown.map(|s| s.down);
    }
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
        Stop::Failed(_) | Stop::Closed { .. } => world::with(|w| w.rank_down(&host)),
    }
    None
}

/// Why a serving loop ended.
enum Stop {
    /// A regression switch halted the shard (the reference's dead control thread).
    Halted(String),
    /// A socket failed.
    Failed(String),
    /// A clean close ended (race S21): every writer gone, or the control timeout passed
    /// with some left (then the slab stays registered); `waited`: since shutdown began.
    Closed { keep_slab: bool, waited: Duration },
}

impl Stop {
    fn why(&self) -> &str {
        match self {
            Stop::Halted(why) | Stop::Failed(why) => why,
            Stop::Closed { .. } => "closed",
        }
    }
}

/// A rank's clean close (`Knobs::consumer_shutdown`; ec-behaviour.md §3.7, race S21).
#[derive(Clone, Copy, Debug)]
enum Close {
    /// Shutdown begins at the first fresh writer grant from `at`, or at `at + PATIENCE`.
    Armed { at: Instant },
    /// Shutdown began: the REP serves on (completions must reach the book) while the
    /// core's drain waits for the writers, up to the control timeout. `began` is the
    /// host's own note of when, so the oracle does not take the wait from the drain.
    Closing { drain: ShutdownDrain, began: Instant },
}

impl Close {
    fn armed(s: ConsumerShutdown) -> Self {
        Close::Armed { at: Instant::from_nanos(s.at.as_nanos() as u64) }
    }

    /// When the serving loop must look again, at the latest.
    fn wake(&self) -> Instant {
        match *self {
            Close::Armed { at } => at + ConsumerShutdown::PATIENCE,
            Close::Closing { drain, .. } => drain.deadline(),
        }
    }
}

/// Moves a rank's close on after a turn of its loop (`granted_writer`: the turn answered a
/// reserve with fresh memory to write). `Some` when the rank closes now.
fn advance_close(
    host: &str,
    shard: &Rc<RefCell<world::Shard>>,
    close: &mut Option<Close>,
    granted_writer: bool,
) -> Option<Stop> {
    let now = clock::now();
    match (*close)? {
        Close::Armed { at } => {
            if now >= at && (granted_writer || now >= at + ConsumerShutdown::PATIENCE) {
                let writers = shard.borrow().writer_owned_count();
                let drain = ShutdownDrain::begin(&mut *shard.borrow_mut(), now, CONTROL_TIMEOUT);
                world::with(|w| w.dirty.insert(host.to_string()));
                crate::trace::record(host, "ec.shard.shutdown", &[("writers", &writers)]);
                world::with(|w| {
                    w.count("shutdown.begun", 1);
                    w.count("shutdown.writers", writers as u64);
                });
                *close = Some(Close::Closing { drain, began: now });
                crate::shutdown::check_shut(host, &shard.borrow());
                return advance_close(host, shard, close, false);
            }
            None
        }
        Close::Closing { drain, began } => match drain.poll(&shard.borrow(), now) {
            DrainStep::Wait { .. } => None,
            DrainStep::Done(outcome) => {
                *close = None;
                let keep_slab = matches!(outcome, DrainOutcome::KeptPool { .. });
                Some(Stop::Closed { keep_slab, waited: now.saturating_duration_since(began) })
            }
        },
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
    (rep, push): (&Socket, &Socket),
    close: &mut Option<Close>,
) -> Stop {
    let mut publish_blocked = false;
    loop {
        if let Some(stop) = advance_close(host, shard, close, false) {
            return stop;
        }
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
                let (due, reaps) = {
                    let s = shard.borrow();
                    (s.poll_timeout(), s.stats().reaps)
                };
                let not_due = crate::expire_on_time::not_due(&shard.borrow(), now);
                shard.borrow_mut().handle_timeout(now);
                crate::expire_on_time::check(host, &shard.borrow(), &not_due, now);
                crate::shard_counters::note_timer(host, due, now, reaps, &shard.borrow());
                world::with(|w| w.dirty.insert(host.to_string()));
                continue;
            }
            ServeStep::Stop | ServeStep::Reply => return halted(shard),
            ServeStep::Wait { until, push_room: _ } => {
                // The model's PUSH has no writability signal: `until` already brings the
                // loop back within a tick while events wait for room.
                publish_blocked = false;
                let until = match (until, close.as_ref().map(Close::wake)) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
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
        let served = clock::now();
        let repeats = crate::reserve_duplicate::before(&frame, served, &shard.borrow());
        world::with(|w| {
            if let Some(r) = w.ranks.get_mut(host) {
                crate::cancel_rules::note_reserves(&frame, &shard.borrow(), &mut r.repeated);
            }
        });
        let repeated = |tid: &str| world::with(|w| w.ranks.get(host).is_none_or(|r| r.repeated.contains(tid)));
        let cancel = crate::cancel_rules::before(&frame, served, &shard.borrow(), repeated);
        let reserves = crate::reserve_follower::before(host, &frame, served, &shard.borrow());
        let step = shard.borrow_mut().serve_request(&frame, served, &mut reply);
        world::with(|w| {
            w.dirty.insert(host.to_string());
            if let Some(session) = w.ranks.get(host).map(|r| r.session.clone()) {
                w.landed.note_handled(&session, &frame, &reply);
            }
        });
        crate::release::note_handled(host, incarnation, &frame, &shard.borrow());
        crate::pool_full::check(host, &frame, &reply, &shard.borrow());
        crate::ready_ttl::check(host, &frame, &reply, served, &shard.borrow());
        crate::reserve_duplicate::check(host, &repeats, &reply);
        crate::cancel_rules::check(host, cancel, &reply, &shard.borrow());
        crate::reserve_follower::check(host, reserves, &reply);
        crate::shard_counters::note(host, &frame, &reply, &shard.borrow());
        crate::announce_once::note_answer(host, &frame, &reply);
        if step != ServeStep::Reply {
            return halted(shard);
        }
        crate::oracle::check_reply(host, &reply);
        let granted_writer = reply.windows(13).any(|w| w == b"\"write\": true");
        if matches!(close, Some(Close::Closing { .. })) {
            crate::shutdown::check_served(host, &shard.borrow(), granted_writer);
        }
        if let Err(e) = rep.send(vec![reply]).await {
            return Stop::Failed(e.to_string());
        }
        world::with(|w| {
            if let Some(r) = w.ranks.get_mut(host) {
                r.owed = None;
            }
        });
        if let Some(stop) = advance_close(host, shard, close, granted_writer) {
            return stop;
        }
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
                let queued = shard.borrow().pending_events();
                shard.borrow_mut().confirm_sent();
                if shard.borrow().pending_events() + 1 != queued {
                    // The same event would go out again and again: stop publishing for
                    // this turn so the run reaches its verdict.
                    crate::oracle::violate(
                        "backlog-bounded",
                        host,
                        format!("the PUSH socket took an event and the backlog of {queued} kept it"),
                    );
                    return Ok(false);
                }
                if let Some(tid) = transfer_id {
                    let drained = shard.borrow_mut().drain_ready();
                    crate::ready_log::note_published(host, drained, &tid);
                    // An event that waited in the backlog (no subscriber yet) past its
                    // reservation's end is stale: the scheduler has no use for it, and the
                    // destination it names may hold another item's bytes by now. The
                    // ledger judges announcements of reservations still READY.
                    let live = shard.borrow().book().state_of(&tid) == Some(State::Ready);
                    let (unwritten, repeated) = world::with(|w| {
                        w.announced_at.insert((host.to_string(), tid.clone()), clock::now());
                        w.published.entry((consumer, tid.clone())).or_default().entry(rank).or_insert_with(clock::now);
                        let session = w.ranks.get(host).map(|r| r.session.clone()).unwrap_or_default();
                        let unwritten = if live { w.landed.check_published(&session, &frame).err() } else { None };
                        (unwritten, crate::announce_once::note_published_in(w, host, &tid, &frame))
                    });
                    if let Some(detail) = repeated {
                        crate::oracle::violate("announce-once", host, detail);
                    }
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
