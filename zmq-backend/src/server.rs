//! `ConsumerControlServer`: one consumer TP rank's control channel on real sockets.
//!
//! A thread owns a REP socket (requests) and a PUSH socket (readiness events) and drives a
//! core [`ConsumerShard`] with them; see [`crate::serve_loop`] for the loop. The shard sits
//! behind a mutex shared with the owner, as the reference shares one lock between the
//! serving thread and the model thread, so the owner can read its counters or call
//! `take` / `begin_shutdown` while it serves.

use crate::clock::Clock;
use crate::curve::{CurveError, CurveServer};
use crate::serve_loop::{self, Bound};
use crate::{lock, sockets};
use ctlplane_core::ec::config::zmq_path;
use ctlplane_core::ec::defaults::REP_RECV_TIMEOUT;
use ctlplane_core::ec::{ConsumerShard, DrainOutcome, DrainStep, ShardConfig, ShardStats, ShutdownDrain};
use rand_core::{OsRng, RngCore};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;
use thiserror::Error;

/// Timings of a server; the defaults are the reference's.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// REP `RCVTIMEO`: the loop's tick while no request arrives (events, reaps, stop flag).
    pub recv_timeout: Duration,
    /// How long `start` waits for the thread to report that it is bound.
    pub start_timeout: Duration,
    /// `ZMQ_MAXMSGSIZE` of the REP socket: libzmq closes the connection of a client whose
    /// request frame is larger, before allocating it (the refusal is logged, see
    /// `rep_monitor`). `None` = unbounded, as the reference.
    pub max_request_bytes: Option<usize>,
    /// CURVE on the REP and PUSH sockets: only clients that know the server's public key
    /// get answers or events. `None` = NULL security, as the reference.
    pub curve: Option<CurveServer>,
}

/// Default request frame bound: a `reserve_batch` of `DEFAULT_MAX_BATCH_ITEMS` (8192)
/// items of 64-hex ids, hashes and shapes is under 3 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 16 << 20;

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            recv_timeout: REP_RECV_TIMEOUT,
            start_timeout: Duration::from_secs(5),
            max_request_bytes: Some(DEFAULT_MAX_REQUEST_BYTES),
            curve: None,
        }
    }
}

/// Why a server did not start. `Display` is the reference's message; the cause is the
/// error's source.
#[derive(Debug, Error)]
pub enum StartError {
    /// The REP or PUSH endpoint could not be bound (port in use, bad host, ...).
    #[error("EC Mooncake control channel failed to bind")]
    Bind(#[source] BindCause),
    /// The thread did not report within the start timeout.
    #[error("EC Mooncake control channel failed to start")]
    Timeout,
    /// The thread or its sockets could not be set up.
    #[error("EC Mooncake control channel failed to start")]
    Setup(#[source] SetupCause),
}

/// What went wrong binding.
#[derive(Debug, Error)]
pub enum BindCause {
    #[error("cannot bind {endpoint}")]
    Zmq {
        endpoint: String,
        #[source]
        source: zmq::Error,
    },
    /// The PUSH socket's `LAST_ENDPOINT` did not name a port.
    #[error("event socket reports no usable endpoint ({0:?})")]
    EventEndpoint(String),
}

/// What went wrong before binding.
#[derive(Debug, Error)]
pub enum SetupCause {
    #[error("cannot create or configure a socket")]
    Socket(#[source] zmq::Error),
    #[error("cannot set up CURVE security")]
    Curve(#[source] CurveError),
    #[error("cannot spawn the server thread")]
    Spawn(#[source] std::io::Error),
    #[error("the server thread ended before reporting")]
    ThreadEnded,
}

/// A running control server for one TP rank.
pub struct ConsumerControlServer<R = OsRng> {
    port: u16,
    endpoint: String,
    event_port: u16,
    event_endpoint: String,
    shard: Arc<Mutex<ConsumerShard<R>>>,
    /// The serving thread's clock (the shard's instants are counted from its origin).
    clock: Clock,
    stop: Arc<AtomicBool>,
    serving: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<R: RngCore + Send + 'static> ConsumerControlServer<R> {
    /// Binds `tcp://host:config.port` (REP) and an ephemeral PUSH port on `host`, and
    /// serves `config`'s shard on a thread. `rng` mints reservation ids (`OsRng` in
    /// production).
    pub fn start(host: &str, config: ShardConfig, rng: R) -> Result<Self, StartError> {
        Self::start_with(host, config, rng, ServerOptions::default())
    }

    /// [`Self::start`] with explicit timings.
    pub fn start_with(host: &str, config: ShardConfig, rng: R, options: ServerOptions) -> Result<Self, StartError> {
        let clock = Clock::new();
        let port = config.port;
        let endpoint = zmq_path("tcp", host, port);
        let shard = Arc::new(Mutex::new(ConsumerShard::new(config, rng, clock.now())));
        let stop = Arc::new(AtomicBool::new(false));
        let serving = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = mpsc::sync_channel(1);

        let thread = {
            let (host, endpoint) = (host.to_string(), endpoint.clone());
            let (shard, stop, serving) = (shard.clone(), stop.clone(), serving.clone());
            let options = options.clone();
            std::thread::Builder::new()
                .name(format!("ec-control-{port}"))
                .spawn(move || {
                    let bound = match serve_loop::bind(&host, &endpoint, port, &options) {
                        Ok(bound) => bound,
                        Err(e) => {
                            let _ = started_tx.send(Err(e));
                            return;
                        }
                    };
                    lock(&shard).set_event_port(bound.event_port);
                    serving.store(true, Ordering::Release);
                    let _ = started_tx.send(Ok((bound.event_port, bound.event_endpoint.clone())));
                    serve(bound, port, &shard, &clock, &stop);
                    serving.store(false, Ordering::Release);
                })
                .map_err(|e| StartError::Setup(SetupCause::Spawn(e)))?
        };

        let ((event_port, event_endpoint), thread) =
            serve_loop::await_started(&started_rx, thread, &stop, options.start_timeout)?;
        tracing::info!("EC Mooncake control channel listening on {endpoint} (events {event_endpoint})");
        Ok(ConsumerControlServer {
            port,
            endpoint,
            event_port,
            event_endpoint,
            shard,
            clock,
            stop,
            serving,
            thread: Some(thread),
        })
    }

    /// This rank's REP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The REP endpoint clients connect to, `tcp://host:port`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The PUSH socket's ephemeral port (what `event_port` answers).
    pub fn event_port(&self) -> u16 {
        self.event_port
    }

    /// `tcp://host:event_port`, for a PULL to connect to.
    pub fn event_endpoint(&self) -> &str {
        &self.event_endpoint
    }

    /// The shard's counters now.
    pub fn stats(&self) -> ShardStats {
        lock(&self.shard).stats()
    }

    /// Runs `f` on the shard between two requests (the model thread's `take`, `retire`,
    /// `begin_shutdown`, or reading its book).
    pub fn with_shard<T>(&self, f: impl FnOnce(&mut ConsumerShard<R>) -> T) -> T {
        f(&mut lock(&self.shard))
    }

    /// The serving thread is still in its loop (false after `close` or a loop failure).
    pub fn is_serving(&self) -> bool {
        self.serving.load(Ordering::Acquire)
    }

    /// Worker close with writers in flight (docs/ec-behaviour.md §3.7, race S21): puts the
    /// book into shutdown, serves on while the core's [`ShutdownDrain`] waits up to
    /// `timeout` for the writers to complete, then closes. The outcome says whether the
    /// pool may be released or must stay registered (a remote writer may still write).
    pub fn shutdown(&mut self, timeout: Duration) -> DrainOutcome {
        let drain = self.with_shard(|shard| ShutdownDrain::begin(shard, self.clock.now(), timeout));
        let outcome = loop {
            let now = self.clock.now();
            match self.with_shard(|shard| drain.poll(shard, now)) {
                DrainStep::Done(outcome) => break outcome,
                DrainStep::Wait { until } => std::thread::sleep(DRAIN_POLL.min(until.saturating_duration_since(now))),
            }
        };
        match outcome {
            DrainOutcome::Released => tracing::debug!(port = self.port, "EC control channel drained"),
            DrainOutcome::KeptPool { writers } => tracing::warn!(
                port = self.port,
                writers,
                "EC control channel closed with {writers} writer(s) in flight; the receive pool stays registered"
            ),
        }
        self.close();
        outcome
    }
}

/// How often `shutdown` looks at the book while writers drain.
const DRAIN_POLL: Duration = Duration::from_millis(5);

impl<R> ConsumerControlServer<R> {
    /// Stops the loop and waits for the thread; its sockets close with linger 0.
    /// Idempotent. Takes up to one receive tick plus an in-flight request.
    pub fn close(&mut self) {
        let Some(thread) = self.thread.take() else { return };
        self.stop.store(true, Ordering::Release);
        if thread.join().is_err() {
            tracing::error!(port = self.port, "EC control channel thread panicked");
        }
    }
}

impl<R> Drop for ConsumerControlServer<R> {
    fn drop(&mut self) {
        self.close();
    }
}

/// Runs the loop until stopped, logging (never swallowing) whatever ended it, then closes
/// the sockets (linger 0) and waits until their ports are released.
fn serve<R: RngCore>(bound: Bound, port: u16, shard: &Mutex<ConsumerShard<R>>, clock: &Clock, stop: &AtomicBool) {
    let outcome =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| serve_loop::run(&bound, shard, clock, stop)));
    match outcome {
        Ok(Ok(())) => tracing::debug!(port, "EC control channel closed"),
        Ok(Err(error)) => {
            tracing::error!(port, %error, "EC control channel on port {port} stopped serving")
        }
        Err(_) => tracing::error!(port, "EC control channel on port {port} stopped serving: the loop panicked"),
    }
    bound.close();
}

/// Opens both sockets of a server (kept here so `serve_loop` only moves frames).
pub(crate) fn open_sockets(
    ctx: &zmq::Context,
    options: &ServerOptions,
) -> Result<(zmq::Socket, zmq::Socket), StartError> {
    let rep = sockets::new_rep(ctx, options.recv_timeout, options.max_request_bytes)
        .map_err(|e| StartError::Setup(SetupCause::Socket(e)))?;
    let push = sockets::new_push(ctx).map_err(|e| StartError::Setup(SetupCause::Socket(e)))?;
    if let Some(curve) = &options.curve {
        for socket in [&rep, &push] {
            curve.apply(socket).map_err(|e| StartError::Setup(SetupCause::Curve(e)))?;
        }
    }
    Ok((rep, push))
}
