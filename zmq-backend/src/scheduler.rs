//! `SchedulerDriver`: the core's [`Scheduler`] over libzmq, the production twin of the
//! simulator's scheduler host.
//!
//! Every decision (when to discover and subscribe, when an item is ready, when a request
//! is done, how often a remote cancel is tried before the scheduler gives up) is the
//! core's. This driver owns the threads, sockets and clock: each [`Lane`] of control
//! requests runs on a thread of its own (so it has its own REQ sockets in the shared
//! [`ControlClient`], and a drain never waits for one), except the inline requests of
//! the S5 regression, which run on the caller's thread as the historical drain did. It
//! opens the PULL sockets the core asks for and reads them without blocking.

use crate::client::ControlClient;
use crate::clock::Clock;
use crate::inbox::open_pull;
use ctlplane_core::ec::inbox::decode_event;
use ctlplane_core::ec::readiness::EventFate;
use ctlplane_core::ec::scheduler::{
    ConsumerId, Lane, RequestId, Scheduler, SchedulerConfig, SchedulerEvent, Token, Transmit,
};
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

type Reply = (Token, Result<Value, String>);

/// Run on a lane thread after each answer it hands over.
type Waker = Arc<dyn Fn() + Send + Sync>;

/// A readiness event one drain read, and what the core made of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeardEvent {
    pub consumer: ConsumerId,
    pub transfer_id: String,
    pub fate: EventFate,
}

/// A lane's thread and the channel feeding it.
struct LaneThread {
    jobs: Sender<Transmit>,
    thread: JoinHandle<()>,
}

/// The consumer scheduler over libzmq. See the module documentation.
pub struct SchedulerDriver {
    core: Scheduler,
    client: Arc<ControlClient>,
    clock: Clock,
    lanes: BTreeMap<Lane, LaneThread>,
    replies_tx: Sender<Reply>,
    replies: Receiver<Reply>,
    pulls: BTreeMap<ConsumerId, zmq::Socket>,
    events: VecDeque<SchedulerEvent>,
    waker: Option<Waker>,
}

impl SchedulerDriver {
    /// A scheduler sending its control requests with `client` (CURVE, if the client has
    /// it, applies to the PULL sockets too).
    pub fn new(client: Arc<ControlClient>, config: SchedulerConfig) -> Self {
        let (replies_tx, replies) = mpsc::channel();
        SchedulerDriver {
            core: Scheduler::new(config),
            client,
            clock: Clock::new(),
            lanes: BTreeMap::new(),
            replies_tx,
            replies,
            pulls: BTreeMap::new(),
            events: VecDeque::new(),
            waker: None,
        }
    }

    /// Runs `wake` on a lane thread each time an answer arrives, so that a caller blocked
    /// on something else (its own workers' channel) steps the scheduler without delay.
    pub fn with_waker(mut self, wake: impl Fn() + Send + Sync + 'static) -> Self {
        self.waker = Some(Arc::new(wake));
        self
    }

    /// Serves the consumer whose rank-0 control address is `base`.
    pub fn add_consumer(&mut self, base: &str) -> ConsumerId {
        self.core.add_consumer(base)
    }

    /// A request needs `items` (transfer id, mm_hash) from `consumer`.
    pub fn request(&mut self, consumer: ConsumerId, items: impl IntoIterator<Item = (String, String)>) -> RequestId {
        let id = self.core.request(consumer, items, self.clock.now());
        self.pump();
        id
    }

    /// The request finished: its items are cancelled (remotely where the consumer may
    /// still hold them).
    pub fn finish_request(&mut self, request: RequestId) {
        self.core.finish_request(request, self.clock.now());
        self.pump();
    }

    /// The load of a [`SchedulerEvent::Load`] ended.
    pub fn report_load(&mut self, consumer: ConsumerId, transfer_id: &str, loaded: bool) {
        self.core.report_load(consumer, transfer_id, loaded, self.clock.now());
        self.pump();
    }

    /// A drain: subscribes where the core says so (never waiting, but under S5) and reads
    /// every frame queued on the PULL sockets, then does what [`Self::step`] does.
    pub fn drain(&mut self) -> Vec<HeardEvent> {
        self.core.handle_drain(self.clock.now());
        self.pump();
        let mut heard = Vec::new();
        let mut msg = zmq::Message::new();
        let consumers: Vec<ConsumerId> = self.pulls.keys().copied().collect();
        for consumer in consumers {
            while let Some(pull) = self.pulls.get(&consumer) {
                match pull.recv(&mut msg, zmq::DONTWAIT) {
                    Ok(()) => match decode_event(&msg) {
                        Ok(Some(event)) => {
                            let transfer_id = event.transfer_id.clone();
                            let fate = self.core.handle_event(consumer, event, self.clock.now());
                            heard.push(HeardEvent { consumer, transfer_id, fate });
                        }
                        Ok(None) => {}
                        Err(error) => tracing::warn!(%error, bytes = msg.len(), "discarding an EC event frame"),
                    },
                    Err(zmq::Error::EAGAIN) => break,
                    Err(zmq::Error::EINTR) => continue,
                    Err(error) => {
                        tracing::warn!(%error, "EC Mooncake event channel failed");
                        break;
                    }
                }
            }
        }
        self.step();
        heard
    }

    /// Takes in the answers that arrived and the clock, and hands out what follows.
    pub fn step(&mut self) {
        while let Ok((token, reply)) = self.replies.try_recv() {
            self.core.handle_reply(token, reply, self.clock.now());
        }
        let now = self.clock.now();
        if self.core.poll_timeout().is_some_and(|d| d <= now) {
            self.core.handle_timeout(now);
        }
        self.pump();
    }

    /// Waits up to `timeout` for an answer, then [`Self::step`]s.
    pub fn wait(&mut self, timeout: Duration) {
        match self.replies.recv_timeout(timeout) {
            Ok((token, reply)) => self.core.handle_reply(token, reply, self.clock.now()),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        self.step();
    }

    /// The next thing to report (subscriptions are carried out here, not reported).
    pub fn poll_event(&mut self) -> Option<SchedulerEvent> {
        self.events.pop_front()
    }

    /// No control request queued or in flight and no remote cancel pending.
    pub fn is_quiet(&self) -> bool {
        self.core.is_quiet()
    }

    /// A PULL socket is connected to every shard of `consumer`.
    pub fn is_subscribed(&self, consumer: ConsumerId) -> bool {
        self.pulls.contains_key(&consumer)
    }

    /// The core machine (read-only).
    pub fn core(&self) -> &Scheduler {
        &self.core
    }

    /// Stops: nothing is subscribed after, the PULL sockets close (linger 0) and the lane
    /// threads end after their current request (which the client's timeout bounds).
    pub fn close(&mut self) {
        self.core.close();
        self.pulls.clear();
        let lanes = std::mem::take(&mut self.lanes);
        for (_, lane) in lanes {
            drop(lane.jobs);
            let _ = lane.thread.join();
        }
    }

    /// Sends what the core asks and carries out its subscriptions, until it has nothing.
    fn pump(&mut self) {
        loop {
            if let Some(t) = self.core.poll_transmit() {
                self.send(t);
                continue;
            }
            let Some(event) = self.core.poll_event() else { return };
            match event {
                SchedulerEvent::Subscribe { consumer, endpoints } => match open_pull(&endpoints, self.client.curve()) {
                    Ok(socket) => {
                        tracing::info!(shards = endpoints.len(), "subscribed to EC readiness events");
                        self.pulls.insert(consumer, socket);
                    }
                    Err(e) => self.core.subscribe_failed(consumer, &e.to_string()),
                },
                other => self.events.push_back(other),
            }
        }
    }

    fn send(&mut self, t: Transmit) {
        if t.inline {
            let reply = self.client.request_frame(&t.addr, &t.frame).map_err(|e| e.to_string());
            self.core.handle_reply(t.token, reply, self.clock.now());
            return;
        }
        let (token, lane) = (t.token, t.lane);
        let sent = match self.lane(lane) {
            Ok(jobs) => jobs.send(t).map_err(|_| "the scheduler's request thread is gone".to_string()),
            Err(e) => Err(e),
        };
        if let Err(error) = sent {
            // The next request of the lane starts a new thread.
            self.lanes.remove(&lane);
            self.core.handle_reply(token, Err(error), self.clock.now());
        }
    }

    /// The job channel of `lane`'s thread, started on first use.
    fn lane(&mut self, lane: Lane) -> Result<&Sender<Transmit>, String> {
        if !self.lanes.contains_key(&lane) {
            let (jobs, rx) = mpsc::channel::<Transmit>();
            let (client, replies, waker) = (self.client.clone(), self.replies_tx.clone(), self.waker.clone());
            let thread = std::thread::Builder::new()
                .name("ec-scheduler-lane".into())
                .spawn(move || {
                    while let Ok(t) = rx.recv() {
                        let reply = client.request_frame(&t.addr, &t.frame).map_err(|e| e.to_string());
                        if replies.send((t.token, reply)).is_err() {
                            break;
                        }
                        if let Some(wake) = &waker {
                            wake();
                        }
                    }
                })
                .map_err(|e| format!("cannot spawn a scheduler request thread: {e}"))?;
            self.lanes.insert(lane, LaneThread { jobs, thread });
        }
        self.lanes.get(&lane).map(|l| &l.jobs).ok_or_else(|| "no lane thread".to_string())
    }
}

impl Drop for SchedulerDriver {
    fn drop(&mut self) {
        self.close();
    }
}
