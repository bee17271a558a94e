//! The serving loop of one consumer control server: it moves frames between the sockets
//! and the core shard and feeds it the clock; the shard decides everything.

use crate::clock::Clock;
use crate::lock;
use crate::rep_monitor::{self, RepMonitor};
use crate::server::{open_sockets, BindCause, ServerOptions, SetupCause, StartError};
use crate::sockets::endpoint_port;
use ctlplane_core::ec::config::zmq_path;
use ctlplane_core::ec::{ConsumerShard, ServeStep};
use ctlplane_core::time::Instant;
use rand_core::RngCore;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use thiserror::Error;

/// Both sockets of a server, bound.
pub(crate) struct Bound {
    pub rep: zmq::Socket,
    pub push: zmq::Socket,
    pub event_port: u16,
    pub event_endpoint: String,
    /// The REP receive timeout in ms: how long one turn waits.
    pub tick_ms: i64,
    ctx: zmq::Context,
    monitor: RepMonitor,
}

impl Bound {
    /// Closes both sockets and waits until libzmq has released their ports. `zmq_close`
    /// only hands a socket to libzmq's reaper; terminating the context is what waits for
    /// the listeners to close, so a port is free again once a server's `close` returns.
    pub(crate) fn close(self) {
        let Bound { rep, push, ctx, monitor, .. } = self;
        drop((rep, push));
        monitor.stop();
        drop(ctx);
    }
}

/// What ends a loop other than the stop flag. Afterwards clients only see timeouts, so
/// the server logs it at error level.
#[derive(Debug, Error)]
pub(crate) enum LoopError {
    #[error("receiving a request failed: {0}")]
    Recv(#[source] zmq::Error),
    #[error("sending a reply failed: {0}")]
    Reply(#[source] zmq::Error),
    #[error("publishing an event failed: {0}")]
    Event(#[source] zmq::Error),
    /// A regression switch halted the shard (the reference's dead control thread).
    #[error("the shard halted: {0}")]
    Halted(String),
}

/// Waits up to `timeout` for the serving thread to report its bind. On a timeout the
/// thread may still bind later, so it is told to stop as soon as it can; on a failure the
/// thread has ended and is joined.
pub(crate) fn await_started<T>(
    started: &mpsc::Receiver<Result<T, StartError>>,
    thread: JoinHandle<()>,
    stop: &AtomicBool,
    timeout: Duration,
) -> Result<(T, JoinHandle<()>), StartError> {
    match started.recv_timeout(timeout) {
        Ok(Ok(bound)) => Ok((bound, thread)),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            stop.store(true, Ordering::Release);
            Err(StartError::Timeout)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let _ = thread.join();
            Err(StartError::Setup(SetupCause::ThreadEnded))
        }
    }
}

/// Creates the context and sockets and binds REP at `endpoint`, then PUSH on an ephemeral
/// port of `host`, reading the chosen port back from `LAST_ENDPOINT`. The REP's dropped
/// connections are logged from the start (see `rep_monitor`).
pub(crate) fn bind(host: &str, endpoint: &str, port: u16, options: &ServerOptions) -> Result<Bound, StartError> {
    let recv_timeout = options.recv_timeout;
    let ctx = zmq::Context::new();
    let (rep, push) = open_sockets(&ctx, options)?;
    let monitor = rep_monitor::spawn(&ctx, &rep, port, options.max_request_bytes)?;
    let bind_err = |endpoint: &str, source| StartError::Bind(BindCause::Zmq { endpoint: endpoint.to_string(), source });
    rep.bind(endpoint).map_err(|e| bind_err(endpoint, e))?;
    let ephemeral = zmq_path("tcp", host, 0);
    push.bind(&ephemeral).map_err(|e| bind_err(&ephemeral, e))?;
    let last = match push.get_last_endpoint() {
        Ok(Ok(s)) => s,
        Ok(Err(raw)) => String::from_utf8_lossy(&raw).into_owned(),
        Err(e) => return Err(bind_err(&ephemeral, e)),
    };
    let Some(event_port) = endpoint_port(&last) else {
        return Err(StartError::Bind(BindCause::EventEndpoint(last)));
    };
    // With IPV6=1 libzmq reports an IPv4 host as `[::ffff:a.b.c.d]`; like the reference,
    // only the port is taken from it and the advertised host is kept.
    let tick_ms = i64::try_from(recv_timeout.as_millis()).unwrap_or(i64::MAX);
    Ok(Bound { rep, push, event_port, event_endpoint: zmq_path("tcp", host, event_port), tick_ms, ctx, monitor })
}

/// Serves until `stop` is set or the shard halts, doing at each turn what the shard's
/// [`ServeStep`] says (publish, reap, wait, reply, stop); this loop only moves frames
/// and waits. A wait lasts one tick at most, so `stop` is seen within a tick.
pub(crate) fn run<R: RngCore>(
    bound: &Bound,
    shard: &Mutex<ConsumerShard<R>>,
    clock: &Clock,
    stop: &AtomicBool,
) -> Result<(), LoopError> {
    // One reply buffer for the server's life: a reply is copied into libzmq's message.
    let mut reply = Vec::new();
    let mut publish_blocked = false;
    // REP's receive timeout as last set: it bounds a wait with no room to watch for.
    let mut rcvtimeo = bound.tick_ms;
    while !stop.load(Ordering::Acquire) {
        let now = clock.now();
        let step = lock(shard).next_step(now, publish_blocked);
        match step {
            ServeStep::Publish => {
                publish_blocked = !flush_events(&bound.push, &mut lock(shard))?;
                continue;
            }
            ServeStep::Timer => {
                lock(shard).handle_timeout(now);
                continue;
            }
            ServeStep::Stop | ServeStep::Reply => return Err(halted(shard)),
            ServeStep::Wait { until, push_room } => {
                publish_blocked = false;
                let wait_ms = until.map_or(bound.tick_ms, |until| ms_until(now, until).min(bound.tick_ms));
                if push_room {
                    if !wait_request_or_room(bound, wait_ms)? {
                        continue;
                    }
                } else if wait_ms != rcvtimeo {
                    let ms = i32::try_from(wait_ms).unwrap_or(i32::MAX);
                    bound.rep.set_rcvtimeo(ms).map_err(LoopError::Recv)?;
                    rcvtimeo = wait_ms;
                }
            }
        }
        let Some(frame) = recv_request(&bound.rep)? else { continue };
        // The shard's lock is released before the reply goes out (and before `halted`
        // takes it again).
        let step = lock(shard).serve_request(&frame, clock.now(), &mut reply);
        match step {
            ServeStep::Reply => send_retrying(&bound.rep, &reply, 0).map_err(LoopError::Reply)?,
            _ => return Err(halted(shard)),
        }
    }
    Ok(())
}

/// The error a halted shard ends the loop with.
fn halted<R: RngCore>(shard: &Mutex<ConsumerShard<R>>) -> LoopError {
    LoopError::Halted(format!("{:?}", lock(shard).halted()))
}

/// Whole milliseconds from `now` until `until`, rounded up (a wait never ends early).
fn ms_until(now: Instant, until: Instant) -> i64 {
    let nanos = until.saturating_duration_since(now).as_nanos();
    i64::try_from(nanos.div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

/// Events are waiting behind a full (or peerless) PUSH: wait up to `wait_ms` for a
/// request or for room on PUSH. `true` when a request is there to read.
fn wait_request_or_room(bound: &Bound, wait_ms: i64) -> Result<bool, LoopError> {
    let mut items = [bound.rep.as_poll_item(zmq::POLLIN), bound.push.as_poll_item(zmq::POLLOUT)];
    match zmq::poll(&mut items, wait_ms) {
        Ok(_) | Err(zmq::Error::EINTR) => {}
        Err(e) => return Err(LoopError::Recv(e)),
    }
    Ok(items[0].is_readable())
}

/// Hands queued events to PUSH without blocking; `false` when PUSH refused one (no PULL
/// connected, or its queue is full), which stays queued in the shard.
fn flush_events<R: RngCore>(push: &zmq::Socket, shard: &mut ConsumerShard<R>) -> Result<bool, LoopError> {
    while let Some(frame) = shard.peek_event() {
        match push.send(frame, zmq::DONTWAIT) {
            Ok(()) => shard.confirm_sent(),
            Err(zmq::Error::EAGAIN) => return Ok(false),
            Err(zmq::Error::EINTR) => continue,
            Err(e) => return Err(LoopError::Event(e)),
        }
    }
    Ok(true)
}

/// One request off REP, or `None` when the tick passed without one.
///
/// REP owes exactly one reply per request, whatever its shape, so every part of a
/// multi-part request is read and the request is handed to the shard as an empty (hence
/// undecodable) frame: the client gets "malformed control request" and the channel keeps
/// serving, where the reference would probably fail its reply and stop.
///
/// The frame is handed over in libzmq's own buffer, without a copy.
pub(crate) fn recv_request(rep: &zmq::Socket) -> Result<Option<zmq::Message>, LoopError> {
    let frame = match rep.recv_msg(0) {
        Ok(frame) => frame,
        Err(zmq::Error::EAGAIN | zmq::Error::EINTR) => return Ok(None),
        Err(e) => return Err(LoopError::Recv(e)),
    };
    if !frame.get_more() {
        return Ok(Some(frame));
    }
    let mut parts = 1usize;
    loop {
        // The rest of a multi-part message has already arrived with its first part.
        match rep.recv_msg(0) {
            Ok(_) => parts += 1,
            Err(zmq::Error::EINTR) => continue,
            Err(e) => return Err(LoopError::Recv(e)),
        }
        if !rep.get_rcvmore().map_err(LoopError::Recv)? {
            break;
        }
    }
    tracing::warn!(parts, "EC control channel received a multi-part request; answering it as malformed");
    Ok(Some(zmq::Message::new()))
}

/// `send`, retried when a signal interrupts it.
pub(crate) fn send_retrying(socket: &zmq::Socket, frame: &[u8], flags: i32) -> zmq::Result<()> {
    loop {
        match socket.send(frame, flags) {
            Err(zmq::Error::EINTR) => continue,
            other => return other,
        }
    }
}
