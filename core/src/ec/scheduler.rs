//! `Scheduler`: the consumer scheduler's side of the EC channel as one sans-IO machine
//! (ec-behaviour.md §6; races S5, S6, S7, S22, S23, S24, S27).
//!
//! It composes, for every consumer replica it serves, the event [`Inbox`] and its
//! [`EndpointDiscovery`] passes, [`Readiness`] (fed the inbox's shard count, so an item is
//! loadable only once every subscribed shard announced it), the shared [`TopologyCache`],
//! and the policy around them:
//!
//! - a request waits for its items; an item every shard announced is **loaded** (the
//!   driver takes it on every rank and reports back), an item past its push-wait deadline
//!   fails as unavailable, and once every item of a request is resolved the request is
//!   done: every item it held is cancelled in the core's terms, and a loaded item is
//!   **retired** from every rank's encoder cache;
//! - an item cancelled while the consumer may still hold it is **cancelled remotely**: a
//!   plain cancel to every shard, one transfer at a time per consumer, the topology
//!   confirmed first (`peers` tried [`DISCOVERY_ATTEMPTS`] times) and each shard tried
//!   [`CANCEL_ATTEMPTS`] times before the scheduler gives up on it.
//!
//! Drivers send each [`Transmit`] (answering with [`Scheduler::handle_reply`]), feed the
//! event frames their PULL sockets read ([`Scheduler::handle_event_frame`]), start drains
//! ([`Scheduler::handle_drain`]) and wake at [`Scheduler::poll_timeout`]; they carry out
//! what [`Scheduler::poll_event`] hands back. Requests of one [`Lane`] are sequential (at
//! most one in flight), so a driver can keep one REQ socket per (lane, address).

use super::inbox::{
    decode_event, DiscoveryStep, EndpointDiscovery, EventError, Inbox, InboxRegressions, ReadyEvent, Subscribe,
};
use super::producer::CANCEL_ATTEMPTS;
use super::readiness::{EventFate, Notice, Readiness, ReadinessConfig, TransferState};
use super::requests::make_cancel_request;
use super::topology::{peers_request, TopologyCache, DISCOVERY_ATTEMPTS};
use crate::time::Instant;
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};

/// Tunables of a [`Scheduler`].
#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// Push-wait deadline and table bounds of every consumer's [`Readiness`].
    pub readiness: ReadinessConfig,
    /// The inbox's regression switches (races S5, S6).
    pub inbox: InboxRegressions,
    /// The scheduler's own regression switches (race S24).
    pub regressions: SchedulerRegressions,
    /// `peers` attempts before a remote cancel gives up on an unconfirmed topology.
    pub discovery_attempts: u32,
    /// Attempts of a remote cancel on one shard before the scheduler gives up on it.
    pub cancel_attempts: u32,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            readiness: ReadinessConfig::default(),
            inbox: InboxRegressions::default(),
            regressions: SchedulerRegressions::default(),
            discovery_attempts: DISCOVERY_ATTEMPTS,
            cancel_attempts: CANCEL_ATTEMPTS,
        }
    }
}

/// Historical behaviours of the scheduler, each restoring one race of the catalogue
/// (`docs/races.md`). All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SchedulerRegressions {
    /// EC S24: a request naming a transfer id that already names another mm_hash stops
    /// the scheduler ([`Scheduler::halted`]), as the reference's `schedule()` once raised
    /// and took EngineCore down with it, instead of failing that request's item alone.
    pub s24_collision_raises: bool,
}

/// Why a scheduler stopped serving: only a regression switch stops one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedulerHalt {
    /// EC S24: a colliding transfer id escaped `schedule()`.
    TransferIdCollision { transfer_id: String, existing: String },
}

/// Names a consumer replica of the scheduler (in the order they were added).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerId(usize);

impl ConsumerId {
    /// The index (0 for the first consumer added).
    pub fn index(self) -> usize {
        self.0
    }
}

/// Names a request of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(u64);

pub use super::token::Token;

/// A sequence of control requests with at most one in flight: the driver may serve each
/// lane with its own REQ sockets (a thread or task of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Lane {
    /// Event-endpoint discovery of one consumer.
    Discovery(ConsumerId),
    /// Remote cancels to one consumer.
    Cancel(ConsumerId),
}

/// A control request to send; answer with [`Scheduler::handle_reply`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    pub token: Token,
    pub lane: Lane,
    pub addr: String,
    pub frame: Vec<u8>,
    /// Send it and wait for its answer before doing anything else: discovery inside the
    /// drain that started it (the S5 regression stalls the whole scheduler this way).
    pub inline: bool,
}

/// How a waited item ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemFate {
    /// Every rank took it.
    Loaded,
    /// Every shard announced it, but some rank could not hand it over.
    LoadFailed,
    /// Not announced by every shard before the push-wait deadline, not loaded in time, or
    /// its transfer id already names another item: a retryable failure.
    Unavailable,
}

/// What the scheduler reports, or asks the driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchedulerEvent {
    /// Open a PULL socket (IPV6 on) connected to every endpoint and feed its frames to
    /// [`Scheduler::handle_event_frame`]; report a failure with
    /// [`Scheduler::subscribe_failed`]. Replaces any earlier subscription of the consumer.
    Subscribe { consumer: ConsumerId, endpoints: Vec<String> },
    /// Every shard of the consumer announced the item.
    Ready { consumer: ConsumerId, transfer_id: String, mm_hash: String },
    /// A request waits for this ready item: take it on every rank and answer with
    /// [`Scheduler::report_load`].
    Load { consumer: ConsumerId, request: RequestId, transfer_id: String, mm_hash: String },
    /// An item of a request is resolved.
    ItemDone { consumer: ConsumerId, request: RequestId, transfer_id: String, fate: ItemFate },
    /// Every item of the request is resolved (or the request was finished).
    RequestDone { consumer: ConsumerId, request: RequestId },
    /// The load of this item is over: every rank's encoder cache drops it.
    Retire { consumer: ConsumerId, mm_hash: String },
    /// A remote cancel went to every shard; `gave_up` lists the shards that failed every
    /// attempt (they keep the transfer until their TTL).
    Released { consumer: ConsumerId, transfer_id: String, shards: usize, gave_up: Vec<String> },
    /// A remote cancel was dropped: the consumer's topology could not be confirmed, so no
    /// shard was asked (never the base address alone).
    Undiscovered { consumer: ConsumerId, transfer_id: String },
}

/// A remote cancel in progress.
#[derive(Clone, Debug)]
struct CancelJob {
    transfer_id: String,
    /// Confirmed shards; `None` while `peers` is being asked.
    shards: Option<Vec<String>>,
    /// The shard being cancelled (index into `shards`).
    next: usize,
    /// Attempt of the outstanding request (`peers` or the current shard's cancel).
    attempt: u32,
    gave_up: Vec<String>,
}

#[derive(Clone, Debug)]
struct Consumer {
    base: String,
    inbox: Inbox,
    readiness: Readiness,
    /// The running discovery pass and whether it runs inline.
    discovery: Option<(EndpointDiscovery, bool)>,
    cancels: VecDeque<String>,
    cancel: Option<CancelJob>,
}

#[derive(Clone, Debug)]
struct Item {
    transfer_id: String,
    mm_hash: String,
    fate: Option<ItemFate>,
}

#[derive(Clone, Debug)]
struct Request {
    consumer: usize,
    items: Vec<Item>,
}

/// The consumer scheduler. See the module documentation.
#[derive(Clone, Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    topology: TopologyCache,
    consumers: Vec<Consumer>,
    requests: BTreeMap<RequestId, Request>,
    /// The request waiting for each (consumer, transfer id), and the item's index.
    waiters: BTreeMap<(usize, String), (RequestId, usize)>,
    outbox: VecDeque<Transmit>,
    in_flight: BTreeMap<Token, Lane>,
    events: VecDeque<SchedulerEvent>,
    next_token: u64,
    next_request: u64,
    halted: Option<SchedulerHalt>,
}

impl Default for Scheduler {
    fn default() -> Self {
        Scheduler::new(SchedulerConfig::default())
    }
}

impl Scheduler {
    /// A scheduler serving no consumer yet.
    pub fn new(config: SchedulerConfig) -> Self {
        Scheduler {
            config,
            topology: TopologyCache::default(),
            consumers: Vec::new(),
            requests: BTreeMap::new(),
            waiters: BTreeMap::new(),
            outbox: VecDeque::new(),
            in_flight: BTreeMap::new(),
            events: VecDeque::new(),
            next_token: 0,
            next_request: 0,
            halted: None,
        }
    }

    /// Serves the consumer replica whose rank-0 control address is `base`.
    pub fn add_consumer(&mut self, base: &str) -> ConsumerId {
        self.consumers.push(Consumer {
            base: base.to_string(),
            inbox: Inbox::new(self.config.inbox),
            readiness: Readiness::new(self.config.readiness.clone()),
            discovery: None,
            cancels: VecDeque::new(),
            cancel: None,
        });
        ConsumerId(self.consumers.len() - 1)
    }

    /// Input: a request needs `items` (transfer id, mm_hash) from `consumer`, none of them
    /// loadable yet; each waits for its events until the push-wait deadline. An item
    /// whose transfer id already names another item fails at once (only the newcomer;
    /// under the S24 regression the scheduler halts instead, see [`Self::halted`]).
    pub fn request(
        &mut self,
        consumer: ConsumerId,
        items: impl IntoIterator<Item = (String, String)>,
        now: Instant,
    ) -> RequestId {
        self.next_request += 1;
        let id = RequestId(self.next_request);
        let items: Vec<Item> =
            items.into_iter().map(|(transfer_id, mm_hash)| Item { transfer_id, mm_hash, fate: None }).collect();
        self.requests.insert(id, Request { consumer: consumer.0, items: items.clone() });
        for (index, item) in items.iter().enumerate() {
            let Some(c) = self.consumers.get_mut(consumer.0) else {
                self.resolve(id, index, ItemFate::Unavailable);
                continue;
            };
            match c.readiness.wait_for_event(&item.transfer_id, &item.mm_hash, now) {
                Ok(_) => {
                    self.waiters.entry((consumer.0, item.transfer_id.clone())).or_insert((id, index));
                }
                Err(error) if self.config.regressions.s24_collision_raises => {
                    tracing::error!(%error, "EC scheduler stopped by a colliding transfer id");
                    self.halted = Some(SchedulerHalt::TransferIdCollision {
                        transfer_id: error.transfer_id,
                        existing: error.existing,
                    });
                    return id;
                }
                Err(error) => {
                    tracing::warn!(%error, "EC request refused");
                    self.resolve(id, index, ItemFate::Unavailable);
                }
            }
        }
        self.finish_if_resolved(id, now);
        id
    }

    /// Input: the request finished (or was aborted) before every item resolved: nothing
    /// waits for its items any more, and each is cancelled (remotely where the consumer
    /// may still hold it).
    pub fn finish_request(&mut self, request: RequestId, now: Instant) {
        if self.requests.contains_key(&request) {
            self.request_done(request, now);
        }
    }

    /// Input: a drain of every consumer begins. Never blocks: at most it starts a
    /// discovery pass (whose requests are [`Transmit::inline`] under the S5 regression).
    pub fn handle_drain(&mut self, _now: Instant) {
        for i in 0..self.consumers.len() {
            let c = &mut self.consumers[i];
            let Some(start) = c.inbox.on_drain(&c.base, &self.topology) else { continue };
            c.discovery = Some((start.pass, start.inline));
            self.discovery_step(i);
        }
    }

    /// Input: one frame the consumer's PULL socket read. A frame that does not decode
    /// costs that frame only.
    pub fn handle_event_frame(
        &mut self,
        consumer: ConsumerId,
        frame: &[u8],
        now: Instant,
    ) -> Result<Option<EventFate>, EventError> {
        let Some(event) = decode_event(frame)? else { return Ok(None) };
        Ok(Some(self.handle_event(consumer, event, now)))
    }

    /// Input: one readiness event of the consumer, already decoded with
    /// [`decode_event`]; counted against the shards its inbox subscribed to.
    pub fn handle_event(&mut self, consumer: ConsumerId, event: ReadyEvent, now: Instant) -> EventFate {
        let Some(c) = self.consumers.get_mut(consumer.0) else { return EventFate::Ignored };
        let fate = c.readiness.handle_event(event, c.inbox.shard_count(), now);
        self.handle_notices(consumer.0, now);
        fate
    }

    /// Input: the PULL socket of a [`SchedulerEvent::Subscribe`] could not be opened or
    /// connected: a later drain discovers again.
    pub fn subscribe_failed(&mut self, consumer: ConsumerId, error: &str) {
        if let Some(c) = self.consumers.get_mut(consumer.0) {
            c.inbox.on_subscribe_failed(error);
        }
    }

    /// Input: the load of a [`SchedulerEvent::Load`] ended: every rank took the item
    /// (`loaded`) or some rank could not.
    pub fn report_load(&mut self, consumer: ConsumerId, transfer_id: &str, loaded: bool, now: Instant) {
        let Some(c) = self.consumers.get_mut(consumer.0) else { return };
        if c.readiness.state(transfer_id) != Some(TransferState::Loading) {
            return;
        }
        c.readiness.report_load(transfer_id, loaded, now);
        let mm_hash = self.waiters.get(&(consumer.0, transfer_id.to_string())).and_then(|&(r, i)| {
            let item = self.requests.get(&r)?.items.get(i)?;
            Some(item.mm_hash.clone())
        });
        if let Some(&(request, index)) = self.waiters.get(&(consumer.0, transfer_id.to_string())) {
            self.resolve(request, index, if loaded { ItemFate::Loaded } else { ItemFate::LoadFailed });
            self.finish_if_resolved(request, now);
        }
        self.handle_notices(consumer.0, now);
        if let Some(mm_hash) = mm_hash {
            self.events.push_back(SchedulerEvent::Retire { consumer, mm_hash });
        }
    }

    /// Input: the answer to a [`Transmit`]: the reply's `result`, or the error (timeout,
    /// transport failure, or the text of an `ok: false` reply).
    pub fn handle_reply(&mut self, token: Token, reply: Result<Value, String>, _now: Instant) {
        let Some(lane) = self.in_flight.remove(&token) else {
            tracing::debug!(token = token.0, "reply for no outstanding EC scheduler request");
            return;
        };
        match lane {
            Lane::Discovery(c) => self.discovery_reply(c.0, reply),
            Lane::Cancel(c) => self.cancel_reply(c.0, reply),
        }
    }

    /// Input: the clock reached [`Self::poll_timeout`]: waits and loads past their deadline
    /// fail, announced items nobody loaded expire.
    pub fn handle_timeout(&mut self, now: Instant) {
        for i in 0..self.consumers.len() {
            if self.consumers[i].readiness.poll_timeout().is_some_and(|d| d <= now) {
                self.consumers[i].readiness.handle_timeout(now);
            }
            self.handle_notices(i, now);
        }
    }

    /// When [`Self::handle_timeout`] is next needed.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.consumers.iter().filter_map(|c| c.readiness.poll_timeout()).min()
    }

    /// Output: the next control request to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let t = self.outbox.pop_front()?;
        self.in_flight.insert(t.token, t.lane);
        Some(t)
    }

    /// Output: the next thing to report or carry out.
    pub fn poll_event(&mut self) -> Option<SchedulerEvent> {
        self.events.pop_front()
    }

    /// Closing: running discoveries are abandoned and nothing is subscribed after.
    pub fn close(&mut self) {
        for c in &mut self.consumers {
            c.inbox.close();
        }
    }

    /// `Some` once a regression switch stopped the scheduler (EC S24): the driver must
    /// stop serving it, as the reference's EngineCore died with the exception.
    pub fn halted(&self) -> Option<&SchedulerHalt> {
        self.halted.as_ref()
    }

    /// Shards the consumer's inbox listens to (1 until subscribed).
    pub fn shard_count(&self, consumer: ConsumerId) -> usize {
        self.consumers.get(consumer.0).map_or(1, |c| c.inbox.shard_count())
    }

    /// The consumer's readiness table.
    pub fn readiness(&self, consumer: ConsumerId) -> Option<&Readiness> {
        self.consumers.get(consumer.0).map(|c| &c.readiness)
    }

    /// Requests not yet done.
    pub fn active_requests(&self) -> usize {
        self.requests.len()
    }

    /// Remote cancels of `consumer` waiting for the one under way (not counting it).
    pub fn queued_cancels(&self, consumer: ConsumerId) -> usize {
        self.consumers.get(consumer.0).map_or(0, |c| c.cancels.len())
    }

    /// No control request queued or in flight and no remote cancel pending.
    pub fn is_quiet(&self) -> bool {
        self.outbox.is_empty()
            && self.in_flight.is_empty()
            && self.consumers.iter().all(|c| c.cancel.is_none() && c.cancels.is_empty())
    }

    fn transmit(&mut self, lane: Lane, addr: String, frame: Vec<u8>, inline: bool) {
        self.next_token += 1;
        self.outbox.push_back(Transmit { token: Token(self.next_token), lane, addr, frame, inline });
    }

    // -- requests ------------------------------------------------------------------------

    fn resolve(&mut self, request: RequestId, index: usize, fate: ItemFate) {
        let Some(r) = self.requests.get_mut(&request) else { return };
        let Some(item) = r.items.get_mut(index) else { return };
        if item.fate.is_some() {
            return;
        }
        item.fate = Some(fate);
        self.events.push_back(SchedulerEvent::ItemDone {
            consumer: ConsumerId(r.consumer),
            request,
            transfer_id: item.transfer_id.clone(),
            fate,
        });
    }

    fn finish_if_resolved(&mut self, request: RequestId, now: Instant) {
        let resolved = self.requests.get(&request).is_some_and(|r| r.items.iter().all(|i| i.fate.is_some()));
        if resolved {
            self.request_done(request, now);
        }
    }

    /// The request is done: every item it held is cancelled in the core's terms.
    fn request_done(&mut self, request: RequestId, now: Instant) {
        let Some(r) = self.requests.remove(&request) else { return };
        self.events.push_back(SchedulerEvent::RequestDone { consumer: ConsumerId(r.consumer), request });
        for item in &r.items {
            let key = (r.consumer, item.transfer_id.clone());
            if self.waiters.get(&key).is_some_and(|&(w, _)| w == request) {
                self.waiters.remove(&key);
            }
            if let Some(c) = self.consumers.get_mut(r.consumer) {
                c.readiness.cancel(&item.transfer_id, &item.mm_hash, now);
            }
        }
        self.handle_notices(r.consumer, now);
    }

    fn handle_notices(&mut self, i: usize, now: Instant) {
        let consumer = ConsumerId(i);
        while let Some(notice) = self.consumers.get_mut(i).and_then(|c| c.readiness.poll_notice()) {
            match notice {
                Notice::Available { transfer_id, event } => {
                    self.events.push_back(SchedulerEvent::Ready {
                        consumer,
                        transfer_id: transfer_id.clone(),
                        mm_hash: event.mm_hash.clone(),
                    });
                    let Some(&(request, index)) = self.waiters.get(&(i, transfer_id.clone())) else { continue };
                    let waiting = self
                        .requests
                        .get(&request)
                        .and_then(|r| r.items.get(index))
                        .is_some_and(|it| it.fate.is_none());
                    if waiting && self.consumers[i].readiness.begin_load(&transfer_id, now) {
                        self.events.push_back(SchedulerEvent::Load {
                            consumer,
                            request,
                            transfer_id,
                            mm_hash: event.mm_hash,
                        });
                    }
                }
                Notice::Unavailable { transfer_id, mm_hash: _ } => {
                    let Some(&(request, index)) = self.waiters.get(&(i, transfer_id)) else { continue };
                    self.resolve(request, index, ItemFate::Unavailable);
                    self.finish_if_resolved(request, now);
                }
                Notice::CancelRemote { transfer_id } => {
                    self.consumers[i].cancels.push_back(transfer_id);
                    self.next_cancel(i);
                }
            }
        }
    }

    // -- discovery -----------------------------------------------------------------------

    /// Hands out the running pass's next request, or adopts its outcome.
    fn discovery_step(&mut self, i: usize) {
        let Some((pass, inline)) = &self.consumers[i].discovery else { return };
        let inline = *inline;
        match pass.step() {
            DiscoveryStep::Request { addr, frame } => {
                self.transmit(Lane::Discovery(ConsumerId(i)), addr, frame, inline)
            }
            DiscoveryStep::Done(endpoints) => self.adopt(i, Ok(endpoints)),
            DiscoveryStep::Failed(error) => self.adopt(i, Err(error)),
        }
    }

    fn discovery_reply(&mut self, i: usize, reply: Result<Value, String>) {
        let Some(c) = self.consumers.get_mut(i) else { return };
        let Some((pass, _)) = &mut c.discovery else { return };
        pass.handle_reply(&mut self.topology, reply);
        self.discovery_step(i);
    }

    fn adopt(&mut self, i: usize, outcome: Result<Vec<String>, String>) {
        let c = &mut self.consumers[i];
        c.discovery = None;
        if let Some(Subscribe { endpoints }) = c.inbox.on_discovery(outcome) {
            self.events.push_back(SchedulerEvent::Subscribe { consumer: ConsumerId(i), endpoints });
        }
    }

    // -- remote cancels ------------------------------------------------------------------

    /// Starts the consumer's next remote cancel if none is running.
    fn next_cancel(&mut self, i: usize) {
        let c = &mut self.consumers[i];
        if c.cancel.is_some() {
            return;
        }
        let Some(transfer_id) = c.cancels.pop_front() else { return };
        let shards = self.topology.get(&c.base).map(<[String]>::to_vec);
        c.cancel = Some(CancelJob { transfer_id, shards, next: 0, attempt: 1, gave_up: Vec::new() });
        self.cancel_step(i);
    }

    /// Hands out the running cancel's next request, or reports it and starts the next.
    fn cancel_step(&mut self, i: usize) {
        let lane = Lane::Cancel(ConsumerId(i));
        let c = &mut self.consumers[i];
        let Some(job) = &c.cancel else { return };
        match &job.shards {
            None => {
                let base = c.base.clone();
                self.transmit(lane, base, peers_request(), false);
            }
            Some(shards) => match shards.get(job.next) {
                Some(shard) => {
                    let (addr, frame) = (shard.clone(), make_cancel_request(&job.transfer_id, "", false, false));
                    self.transmit(lane, addr, frame, false);
                }
                None => {
                    let Some(job) = c.cancel.take() else { return };
                    let shards = job.shards.map_or(0, |s| s.len());
                    self.events.push_back(SchedulerEvent::Released {
                        consumer: ConsumerId(i),
                        transfer_id: job.transfer_id,
                        shards,
                        gave_up: job.gave_up,
                    });
                    self.next_cancel(i);
                }
            },
        }
    }

    fn cancel_reply(&mut self, i: usize, reply: Result<Value, String>) {
        let (discovery_attempts, cancel_attempts) = (self.config.discovery_attempts, self.config.cancel_attempts);
        let Some(c) = self.consumers.get_mut(i) else { return };
        let Some(job) = &mut c.cancel else { return };
        match &job.shards {
            None => match self.topology.record(&c.base, reply) {
                Ok(shards) => {
                    job.shards = Some(shards);
                    job.attempt = 1;
                }
                Err(error) if job.attempt < discovery_attempts => {
                    tracing::info!(base = %c.base, %error, "EC consumer did not report its shards; retrying");
                    job.attempt += 1;
                }
                Err(error) => {
                    tracing::warn!(transfer_id = %job.transfer_id, %error,
                        "Could not discover every EC consumer shard at {}", c.base);
                    let Some(job) = c.cancel.take() else { return };
                    self.events.push_back(SchedulerEvent::Undiscovered {
                        consumer: ConsumerId(i),
                        transfer_id: job.transfer_id,
                    });
                    return self.next_cancel(i);
                }
            },
            Some(shards) => {
                let shard = shards.get(job.next).cloned().unwrap_or_default();
                match reply {
                    Ok(_) => {
                        job.next += 1;
                        job.attempt = 1;
                    }
                    Err(error) if job.attempt < cancel_attempts => {
                        tracing::info!(%shard, %error, "EC remote cancel failed; retrying");
                        job.attempt += 1;
                    }
                    Err(error) => {
                        tracing::warn!(%shard, transfer_id = %job.transfer_id, %error,
                            "EC remote cancel failed for good; the shard keeps the transfer until its TTL");
                        job.gave_up.push(shard);
                        job.next += 1;
                        job.attempt = 1;
                    }
                }
            }
        }
        self.cancel_step(i);
    }
}

#[cfg(test)]
mod tests;
