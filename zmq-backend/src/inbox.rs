//! `EventInbox`: the consumer scheduler's subscription to the readiness events of every
//! shard of a consumer (ec-behaviour.md §6.1; races S5, S6, S7, S22).
//!
//! A drain must never block the scheduler (S5), yet subscribing needs blocking control
//! requests (`peers`, then `event_port` of every shard). So discovery runs on a background
//! thread that reports its outcome over a channel, while the PULL socket is created and
//! read only on the draining thread. What to ask, when and where to start, adopt or retry
//! a discovery, and what a frame means are the core's decisions ([`EndpointDiscovery`],
//! [`Inbox`], [`decode_event`]); this type only carries out its [`StartDiscovery`] and
//! [`Subscribe`] and moves requests, frames and outcomes.

use crate::client::ControlClient;
use crate::curve::CurveClient;
use ctlplane_core::ec::inbox::{
    decode_event, DiscoveryStep, EndpointDiscovery, EventError, Inbox, InboxRegressions, ReadyEvent, StartDiscovery,
    Subscribe,
};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::sync::Arc;

/// A discovery pass's outcome: every shard's event endpoint, or why the pass failed.
type Outcome = Result<Vec<String>, String>;

/// What one drain read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Drained {
    /// Readiness events, in arrival order.
    pub events: Vec<ReadyEvent>,
    /// Well-formed events that are not readiness (`ready` falsy), skipped.
    pub skipped: usize,
    /// Frames discarded with a warning: undecodable, not an object, or incomplete.
    pub discarded: usize,
}

/// Counts of a [`EventInbox::drain_each`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainCounts {
    /// Readiness events handed to the callback.
    pub events: usize,
    /// Well-formed events that are not readiness (`ready` falsy), skipped.
    pub skipped: usize,
    /// Frames discarded with a warning.
    pub discarded: usize,
}

/// The background discovery thread: one per inbox, started by the first drain and reused
/// by every retry, so that its per-thread REQ sockets in the client are reused too rather
/// than left open under the ids of finished threads.
struct Discoverer {
    /// One message per pass to run; dropping it ends the thread after its current pass.
    start: Sender<EndpointDiscovery>,
    outcomes: Receiver<Outcome>,
    /// A pass is running and its outcome not yet adopted.
    running: bool,
}

/// The PULL socket connected to every shard's event endpoint.
struct Subscription {
    socket: zmq::Socket,
    endpoints: Vec<String>,
}

/// Subscribes to every shard of the consumer at one base address and reads their
/// readiness events without ever blocking.
///
/// As in the reference, the first drain only starts discovery and returns nothing, even
/// when the consumer is healthy; events a shard queued before the subscription arrive
/// once the PULL socket connects.
pub struct EventInbox {
    client: Arc<ControlClient>,
    base: String,
    inbox: Inbox,
    discoverer: Option<Discoverer>,
    subscription: Option<Subscription>,
}

impl EventInbox {
    /// An inbox for the consumer whose rank-0 control address is `base`. Discovery uses
    /// `client`, and shares its topology cache, so `peers` confirmed once is not asked again.
    pub fn new(client: Arc<ControlClient>, base: &str) -> Self {
        Self::with_regressions(client, base, InboxRegressions::default())
    }

    /// [`Self::new`] with the inbox's regression switches (the race catalogue,
    /// `docs/races.md`: EC S5 runs discovery inside the drain, S6 subscribes to the base
    /// shard only).
    pub fn with_regressions(client: Arc<ControlClient>, base: &str, regressions: InboxRegressions) -> Self {
        EventInbox {
            client,
            base: base.to_string(),
            inbox: Inbox::new(regressions),
            discoverer: None,
            subscription: None,
        }
    }

    /// Reads every event queued on the PULL socket, returning at once in every case.
    pub fn drain(&mut self) -> Drained {
        let mut events = Vec::new();
        let counts = self.drain_each(|event, _| events.push(event));
        Drained { events, skipped: counts.skipped, discarded: counts.discarded }
    }

    /// [`Self::drain`], handing each readiness event to `f` together with the frame it
    /// arrived in (what `ctlplane ec watch` prints) instead of collecting them.
    ///
    /// Frames are read non-blocking until EAGAIN. A frame that does not decode costs that
    /// frame only; a transport error ends this drain (the next one tries again).
    pub fn drain_each(&mut self, mut f: impl FnMut(ReadyEvent, &[u8])) -> DrainCounts {
        let start = self.client.with_topologies(|cache| self.inbox.on_drain(&self.base, cache));
        if let Some(start) = start {
            self.start_discovery(start);
        }
        self.poll_discovery();
        let mut counts = DrainCounts::default();
        let Some(sub) = &self.subscription else { return counts };
        let mut msg = zmq::Message::new();
        loop {
            match sub.socket.recv(&mut msg, zmq::DONTWAIT) {
                Ok(()) => match decode_event(&msg) {
                    Ok(Some(event)) => {
                        counts.events += 1;
                        f(event, &msg);
                    }
                    Ok(None) => counts.skipped += 1,
                    Err(error) => {
                        counts.discarded += 1;
                        warn_discarded(&error, msg.len());
                    }
                },
                Err(zmq::Error::EAGAIN) => break,
                Err(zmq::Error::EINTR) => continue,
                Err(error) => {
                    tracing::warn!(%error, base = %self.base, "EC Mooncake event channel failed");
                    break;
                }
            }
        }
        counts
    }

    /// Shards the inbox listens to: 1 until subscribed, as the reference.
    pub fn shard_count(&self) -> usize {
        self.inbox.shard_count()
    }

    /// The PULL socket is connected to every shard.
    pub fn is_subscribed(&self) -> bool {
        self.subscription.is_some()
    }

    /// The event endpoints subscribed to (empty until subscribed).
    pub fn endpoints(&self) -> &[String] {
        self.subscription.as_ref().map_or(&[], |s| s.endpoints.as_slice())
    }

    /// The consumer's base address.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// Abandons a running discovery (its thread ends after its current pass, which the
    /// client's timeout bounds) and closes the PULL socket with linger 0. Idempotent;
    /// later drains return nothing.
    pub fn close(&mut self) {
        self.inbox.close();
        self.discoverer = None;
        self.subscription = None;
    }

    fn start_discovery(&mut self, start: StartDiscovery) {
        if start.inline {
            let outcome = discover(&self.client, start.pass);
            return self.adopt(outcome);
        }
        if self.discoverer.is_none() {
            match spawn_discoverer(self.client.clone()) {
                Ok(d) => self.discoverer = Some(d),
                Err(e) => return self.adopt(Err(format!("cannot spawn the discovery thread: {e}"))),
            }
        }
        let started = self.discoverer.as_mut().is_some_and(|d| {
            d.running = d.start.send(start.pass).is_ok();
            d.running
        });
        if !started {
            // The thread is gone; the retry after this failure spawns a new one.
            self.discoverer = None;
            self.adopt(Err("the discovery thread is gone".into()));
        }
    }

    /// Adopts the running pass's outcome if it has arrived.
    fn poll_discovery(&mut self) {
        let Some(d) = self.discoverer.as_mut().filter(|d| d.running) else { return };
        let outcome = match d.outcomes.try_recv() {
            Ok(outcome) => {
                d.running = false;
                outcome
            }
            Err(TryRecvError::Empty) => return,
            Err(TryRecvError::Disconnected) => {
                self.discoverer = None;
                Err("the discovery thread ended without an outcome".into())
            }
        };
        self.adopt(outcome);
    }

    fn adopt(&mut self, outcome: Outcome) {
        if let Some(subscribe) = self.inbox.on_discovery(outcome) {
            self.subscribe(subscribe);
        }
    }

    fn subscribe(&mut self, Subscribe { endpoints }: Subscribe) {
        match open_pull(&endpoints, self.client.curve()) {
            Ok(socket) => {
                tracing::info!(base = %self.base, shards = endpoints.len(), "subscribed to EC readiness events");
                self.subscription = Some(Subscription { socket, endpoints });
            }
            Err(e) => self.inbox.on_subscribe_failed(&e.to_string()),
        }
    }
}

impl Drop for EventInbox {
    fn drop(&mut self) {
        self.close();
    }
}

/// Starts the discovery thread: it runs each pass it is sent, until the inbox drops its
/// end of either channel.
fn spawn_discoverer(client: Arc<ControlClient>) -> std::io::Result<Discoverer> {
    let (start, starts) = mpsc::channel::<EndpointDiscovery>();
    let (report, outcomes) = mpsc::channel();
    std::thread::Builder::new().name("ec-inbox-discovery".into()).spawn(move || {
        while let Ok(pass) = starts.recv() {
            if report.send(discover(&client, pass)).is_err() {
                break;
            }
        }
    })?;
    Ok(Discoverer { start, outcomes, running: false })
}

/// One discovery pass (on the background thread, or inside the drain under S5): the core
/// says what to ask next; the topology cache is locked only around its calls, never
/// across a request.
fn discover(client: &ControlClient, mut pass: EndpointDiscovery) -> Outcome {
    let mut step = pass.step();
    loop {
        match step {
            DiscoveryStep::Request { addr, frame } => {
                let reply = client.request_frame(&addr, &frame).map_err(|e| e.to_string());
                step = client.with_topologies(|cache| pass.handle_reply(cache, reply));
            }
            DiscoveryStep::Done(endpoints) => return Ok(endpoints),
            DiscoveryStep::Failed(error) => return Err(error),
        }
    }
}

/// A PULL socket (`IPV6=1` as the reference; linger 0 so closing never waits) connected
/// to every endpoint. Its context lives as long as the socket does.
pub(crate) fn open_pull(endpoints: &[String], curve: Option<&CurveClient>) -> zmq::Result<zmq::Socket> {
    let context = zmq::Context::new();
    let socket = context.socket(zmq::PULL)?;
    socket.set_ipv6(true)?;
    socket.set_linger(0)?;
    if let Some(curve) = curve {
        curve.apply(&socket).map_err(crate::curve::as_zmq)?;
    }
    for endpoint in endpoints {
        socket.connect(endpoint)?;
    }
    Ok(socket)
}

fn warn_discarded(error: &EventError, bytes: usize) {
    tracing::warn!(%error, bytes, "discarding an EC event frame");
}
