//! `ConsumerShard`: the control server of one consumer TP rank as a sans-IO machine.
//!
//! The driver owns the REP and PUSH sockets. It hands every request frame to
//! [`ConsumerShard::handle_request`] and sends back the reply it returns (a REP owes one),
//! calls [`ConsumerShard::handle_timeout`] when [`ConsumerShard::poll_timeout`] comes due,
//! and publishes events with [`ConsumerShard::peek_event`] / [`ConsumerShard::confirm_sent`],
//! so an event whose send hit EAGAIN stays queued.

use super::config::{ConfigError, PortPlan};
use super::dumps;
use super::event_queue::EventQueue;
use super::ids::TransferId;
use super::request_slot::ReplyError;
use super::reservations::{BookConfig, ReservationBook, ReserveError, ReserveRef, Reserved, TakeError, Taken};
use super::wire::{
    self, CancelResult, CancelledResult, CompleteResult, Decoded, ItemReply, Items, JsonText, LastFlag, PeersResult,
    Request, ReserveFields, ReserveReply, ReserveResult, StatusResult, WireError,
};
use crate::time::Instant;
use rand_core::RngCore;
use serde_json::Value;
use std::collections::VecDeque;
use std::time::Duration;

/// `_MAX_PENDING_EVENTS`: readiness events kept for a PULL peer that is not draining.
pub const MAX_PENDING_EVENTS: usize = 4096;
/// `_RESERVATION_REAP_INTERVAL_SECONDS`: least time between two periodic reaps.
pub const REAP_INTERVAL: Duration = Duration::from_secs(1);

/// Everything one shard needs to know about itself.
#[derive(Clone, Debug)]
pub struct ShardConfig {
    /// This rank's REP port; also the `shard` tag of its events.
    pub port: u16,
    /// What `peers` answers: every REP port of the replica.
    pub peer_ports: Vec<u16>,
    /// `dst_session` of granted reservations: the Mooncake session writers target.
    pub dst_session: String,
    /// Address of the slab's first byte; `dst_ptr = slab_base + offset`.
    pub slab_base: u64,
    /// Receive slab size (`ec_buffer_size`).
    pub pool_bytes: u64,
    /// Reservation lifetimes and Gen A/B behaviour.
    pub book: BookConfig,
    /// Event backlog bound (drop oldest beyond it).
    pub max_pending_events: usize,
    /// Least time between periodic reaps.
    pub reap_interval: Duration,
    /// Largest batch accepted by `reserve_batch` / `complete_batch`.
    pub max_batch_items: usize,
    /// Historical behaviours for the race catalogue, all off.
    pub regressions: ShardRegressions,
}

/// Historical behaviours of the control server, each restoring one race of the catalogue
/// (`docs/races.md`). All off by default; a halted shard is reported by
/// [`ConsumerShard::halted`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardRegressions {
    /// EC S1: an undecodable request escapes the serving loop, as `recv_json` raising
    /// outside the per-request `try` did: no reply, both sockets closed, the server gone.
    pub s1_undecodable_kills_server: bool,
    /// EC S2: the first periodic reap at or after this instant fails, as the reference's
    /// `reap()` raising did, and the server stops serving. An injected fault: ctlplane's
    /// reap cannot fail, so this is how a replay makes the control thread die.
    pub s2_reap_fault_at: Option<Instant>,
}

/// Why a shard stopped serving (only with a [`ShardRegressions`] switch on). The driver
/// must send nothing more, close REP and PUSH, and end the serving loop; clients then see
/// only timeouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Halt {
    /// EC S1: a request frame was not UTF-8 JSON; it gets no reply.
    UndecodableRequest,
    /// EC S2: the periodic reap failed.
    ReapFailed,
}

impl ShardConfig {
    /// A lone shard on `port` with the reference defaults.
    pub fn new(port: u16, pool_bytes: u64) -> Self {
        ShardConfig {
            port,
            peer_ports: vec![port],
            dst_session: String::new(),
            slab_base: 0,
            pool_bytes,
            book: BookConfig::default(),
            max_pending_events: MAX_PENDING_EVENTS,
            reap_interval: REAP_INTERVAL,
            max_batch_items: wire::DEFAULT_MAX_BATCH_ITEMS,
            regressions: ShardRegressions::default(),
        }
    }

    /// The shard of TP rank `rank` in `plan`: its port and the replica's peer list.
    pub fn for_rank(plan: &PortPlan, rank: u32, pool_bytes: u64) -> Result<Self, ConfigError> {
        let port = plan.rank_port(rank)?;
        Ok(ShardConfig { peer_ports: plan.peer_ports(), ..ShardConfig::new(port, pool_bytes) })
    }
}

/// Counters a driver can export.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Requests answered (every frame gets exactly one reply).
    pub requests: u64,
    /// Replies with `ok: false`.
    pub error_replies: u64,
    /// Frames that were not UTF-8 JSON.
    pub malformed: u64,
    /// Readiness events queued.
    pub events_queued: u64,
    /// Readiness events handed to the PUSH socket.
    pub events_sent: u64,
    /// Readiness events dropped because the backlog was full.
    pub events_dropped: u64,
    /// Periodic reaps run.
    pub reaps: u64,
    /// READY transfer ids the engine never drained, dropped oldest first past
    /// [`READY_LOG_LIMIT`].
    pub ready_log_dropped: u64,
}

/// The server logic of one consumer rank.
#[derive(Debug)]
pub struct ConsumerShard<R> {
    config: ShardConfig,
    /// `config.dst_session` as a JSON string, written once for every reserve reply.
    dst_session_json: Vec<u8>,
    book: ReservationBook<R>,
    event_port: Option<u16>,
    events: EventQueue,
    last_reap: Instant,
    stats: ShardStats,
    halted: Option<Halt>,
    /// Transfer ids turned READY (writers and followers) not yet handed to the engine by
    /// [`ConsumerShard::drain_ready`]; the newest [`READY_LOG_LIMIT`] at most, so an
    /// engine that never asks costs a bounded amount.
    ready_log: VecDeque<String>,
}

/// How many READY transfer ids the shard keeps for [`ConsumerShard::drain_ready`].
pub const READY_LOG_LIMIT: usize = 65_536;

impl<R: RngCore> ConsumerShard<R> {
    /// A shard whose reap clock starts at `now`; `rng` mints reservation ids.
    pub fn new(config: ShardConfig, rng: R, now: Instant) -> Self {
        let book = ReservationBook::new(config.pool_bytes, config.book.clone(), rng);
        let mut dst_session_json = Vec::new();
        dumps::write_str(&mut dst_session_json, &config.dst_session);
        ConsumerShard {
            config,
            dst_session_json,
            book,
            event_port: None,
            events: EventQueue::default(),
            last_reap: now,
            stats: ShardStats::default(),
            halted: None,
            ready_log: VecDeque::new(),
        }
    }

    /// The driver bound the PUSH socket: `event_port` now reports this port.
    pub fn set_event_port(&mut self, port: u16) {
        self.event_port = Some(port);
    }

    /// Input: one request frame off the REP socket. Always returns the reply frame, except
    /// on a shard that [`Self::halted`] (only with a regression switch on): then it returns
    /// an empty frame that must not be sent.
    pub fn handle_request(&mut self, frame: &[u8], now: Instant) -> Vec<u8> {
        let mut out = Vec::new();
        self.handle_request_into(frame, now, &mut out);
        out
    }

    /// [`Self::handle_request`] with the reply written into `out` (cleared first), so a
    /// driver can keep one reply buffer. A `reserve` in the clients' exact layout is served
    /// from the frame in place: nothing is allocated for the request, and the reply is
    /// written without building the result's strings. Everything else is decoded whole.
    pub fn handle_request_into(&mut self, frame: &[u8], now: Instant, out: &mut Vec<u8>) {
        out.clear();
        if self.halted.is_some() {
            return;
        }
        self.stats.requests += 1;
        let request = match wire::read_request(frame, self.config.max_batch_items) {
            Ok(request) => request,
            Err(WireError::Malformed) if self.config.regressions.s1_undecodable_kills_server => {
                self.stats.malformed += 1;
                self.halt(Halt::UndecodableRequest);
                return;
            }
            Err(error) => {
                if error == WireError::Malformed {
                    self.stats.malformed += 1;
                    tracing::warn!(
                        port = self.config.port,
                        bytes = frame.len(),
                        "EC control channel received an undecodable request"
                    );
                }
                *out = self.refuse(&error.to_string());
                return;
            }
        };
        match request {
            Decoded::Reserve(req) => {
                tracing::trace!(port = self.config.port, op = "reserve", "control request");
                if let Err(error) = self.reserve_into(req.as_ref(), now, out) {
                    out.clear();
                    out.extend_from_slice(&self.refuse(&error.to_string()));
                }
            }
            Decoded::CompleteBatch(items) => {
                tracing::trace!(port = self.config.port, op = "complete_batch", "control request");
                let results: Vec<CompleteResult> = items.iter().map(|&(t, r)| self.complete_one(t, r, now)).collect();
                *out = wire::encode_complete_batch_ok(&results);
            }
            Decoded::Other(request) => {
                tracing::trace!(port = self.config.port, op = request.op(), "control request");
                *out = match self.dispatch(request, now) {
                    Ok(bytes) => bytes,
                    Err(error) => self.refuse(&error),
                };
            }
        }
    }

    /// The error reply of a refused request.
    fn refuse(&mut self, error: &str) -> Vec<u8> {
        self.stats.error_replies += 1;
        tracing::debug!(port = self.config.port, %error, "control request refused");
        wire::encode_err(error)
    }

    /// One `reserve`, its reply appended to `out`: the same bytes [`Self::reserve_one`]
    /// and [`wire::encode_reserve_ok`] give.
    fn reserve_into(&mut self, req: ReserveRef<'_>, now: Instant, out: &mut Vec<u8>) -> Result<(), ReserveError> {
        match self.book.reserve_ref(req, now)? {
            Reserved::Cancelled => {
                out.extend_from_slice(&wire::encode_reserve_ok(&ReserveReply::Cancelled(CancelledResult::new(
                    req.nbytes.into(),
                ))));
            }
            Reserved::Granted { reservation_id, view, write, ready, cached } => {
                if ready {
                    self.queue_ready(req.transfer_id);
                }
                let mut quoted = [b'"'; 34];
                quoted[1..33].copy_from_slice(&reservation_id.to_hex());
                wire::write_reserve_ok(
                    out,
                    &ReserveFields {
                        reservation_id: JsonText::Encoded(&quoted),
                        dst_session: JsonText::Encoded(&self.dst_session_json),
                        dst_ptr: super::slab::dst_ptr(self.config.slab_base, &view),
                        nbytes: req.nbytes,
                        write,
                        ready,
                        last: LastFlag::Cached(cached),
                    },
                );
            }
        }
        Ok(())
    }

    fn dispatch(&mut self, request: Request, now: Instant) -> Result<Vec<u8>, String> {
        match request {
            Request::Peers => Ok(wire::encode_ok(&PeersResult { ports: self.config.peer_ports.clone() })),
            Request::EventPort => Ok(wire::encode_ok(&self.event_port)),
            Request::Status { transfer_id } => {
                let status = self.book.status(&transfer_id);
                Ok(wire::encode_ok(&status.as_ref().map(StatusResult::from)))
            }
            Request::Reserve(item) => {
                let reply = self.reserve_one(item, now)?;
                Ok(wire::encode_reserve_ok(&reply))
            }
            Request::ReserveBatch(items) => {
                let items = items
                    .into_iter()
                    .map(|item| match self.reserve_one(item, now) {
                        Ok(r) => ItemReply::ok(r),
                        Err(e) => ItemReply::err(e),
                    })
                    .collect();
                Ok(wire::encode_ok(&Items { items }))
            }
            Request::Complete(item) => {
                let item = item.map_err(|e| e.to_string())?;
                let result = self.complete_one(&item.transfer_id, &item.reservation_id, now);
                Ok(wire::encode_ok(&result))
            }
            Request::CompleteBatch(items) => {
                let mut results = Vec::with_capacity(items.len());
                for item in items {
                    // Not atomic, as the reference: earlier items stay applied.
                    let item = item.map_err(|e| e.to_string())?;
                    results.push(self.complete_one(&item.transfer_id, &item.reservation_id, now));
                }
                Ok(wire::encode_complete_batch_ok(&results))
            }
            Request::Cancel { transfer_id, reservation_id, abandon, refresh } => {
                let cancelled = self.book.cancel(&transfer_id, &reservation_id, abandon, refresh, now);
                Ok(wire::encode_ok(&CancelResult { cancelled }))
            }
        }
    }

    fn reserve_one(
        &mut self,
        item: Result<super::reservations::ReserveRequest, WireError>,
        now: Instant,
    ) -> Result<ReserveReply, String> {
        let req = match item {
            Ok(req) => req,
            Err(WireError::Unplaceable(u)) => {
                return match self.book.reserve_unplaceable(&u.transfer_id, &u.mm_hash, &u.error, now) {
                    Ok(_) => Ok(ReserveReply::Cancelled(CancelledResult::new(u.nbytes))),
                    Err(e) => Err(e.to_string()),
                };
            }
            Err(e) => return Err(e.to_string()),
        };
        let reserved = self.book.reserve_ref(req.as_ref(), now).map_err(|e| e.to_string())?;
        Ok(match reserved {
            Reserved::Cancelled => ReserveReply::Cancelled(CancelledResult::new(req.nbytes.into())),
            Reserved::Granted { reservation_id, view, write, ready, cached } => {
                if ready {
                    self.queue_ready(&req.transfer_id);
                }
                ReserveReply::Granted(ReserveResult {
                    reservation_id: reservation_id.to_hex_string(),
                    dst_session: self.config.dst_session.clone(),
                    dst_ptr: super::slab::dst_ptr(self.config.slab_base, &view),
                    nbytes: req.nbytes,
                    write,
                    ready,
                    cached,
                })
            }
        })
    }

    fn complete_one(&mut self, transfer_id: &str, reservation_id: &str, now: Instant) -> CompleteResult {
        let port = self.config.port;
        let max_pending = self.config.max_pending_events;
        let (events, stats, ready_log) = (&mut self.events, &mut self.stats, &mut self.ready_log);
        // The common case: the event is written from the record the completion holds.
        let completed = self.book.complete_with(transfer_id, reservation_id, now, |status| {
            log_ready(ready_log, stats, transfer_id);
            push_event(events, stats, port, max_pending, |out| wire::write_event(out, transfer_id, status, port))
        });
        if completed.followers_ready {
            // Followers this completion published go out before the writer's own event.
            self.queue_followers();
            if completed.became_ready {
                self.queue_ready(transfer_id);
            }
        }
        CompleteResult { completed: completed.completed, became_ready: completed.became_ready }
    }

    fn queue_followers(&mut self) {
        for follower in self.book.drain_ready() {
            self.queue_ready(&follower);
        }
    }

    /// Queues the readiness event of an active record, dropping the oldest queued event
    /// when the backlog is full.
    fn queue_ready(&mut self, transfer_id: &str) {
        let Some(status) = self.book.status_view(&TransferId::new(transfer_id)) else { return };
        log_ready(&mut self.ready_log, &mut self.stats, transfer_id);
        let port = self.config.port;
        push_event(&mut self.events, &mut self.stats, port, self.config.max_pending_events, |out| {
            wire::write_event(out, transfer_id, &status, port)
        });
    }

    /// Input: the clock reached [`Self::poll_timeout`]. Reaps if the interval has passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.halted.is_some() {
            return;
        }
        if now.saturating_duration_since(self.last_reap) >= self.config.reap_interval {
            if self.config.regressions.s2_reap_fault_at.is_some_and(|at| now >= at) {
                self.halt(Halt::ReapFailed);
                return;
            }
            let expired = self.book.expire(now);
            self.last_reap = now;
            self.stats.reaps += 1;
            if expired > 0 {
                tracing::debug!(port = self.config.port, expired, "expired READY reservations");
            }
        }
    }

    /// When the next periodic reap is due (never, once halted).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.halted.is_some() {
            return None;
        }
        Some(self.last_reap + self.config.reap_interval)
    }

    /// Output: the oldest queued readiness event (none once halted: PUSH is closed).
    pub fn peek_event(&self) -> Option<&[u8]> {
        if self.halted.is_some() {
            return None;
        }
        self.events.front()
    }

    /// Whether, and why, the shard stopped serving. Only a [`ShardRegressions`] switch
    /// halts a shard. The driver checks this after every `handle_request` and
    /// `handle_timeout`: once `Some`, it drops the reply, closes REP and PUSH and ends the
    /// serving loop, as the reference's dead control thread did.
    pub fn halted(&self) -> Option<Halt> {
        self.halted
    }

    fn halt(&mut self, why: Halt) {
        tracing::error!(port = self.config.port, ?why, "EC control server stopped serving");
        self.halted = Some(why);
    }

    /// The event from [`Self::peek_event`] was sent: drop it from the backlog.
    pub fn confirm_sent(&mut self) {
        if self.events.pop_front() {
            self.stats.events_sent += 1;
        }
    }

    /// Events waiting for the PUSH socket.
    pub fn pending_events(&self) -> usize {
        self.events.len()
    }

    /// Every transfer id that turned READY since the last call (a completed writer and the
    /// followers it published), in the order their readiness events were queued: what the
    /// consumer engine polls to know what it may `take` (not a wire op).
    pub fn drain_ready(&mut self) -> Vec<String> {
        self.ready_log.drain(..).collect()
    }

    /// The model thread loads a READY tensor (not a wire op).
    pub fn take(&mut self, transfer_id: &str, mm_hash: &str) -> Result<Taken, TakeError> {
        self.book.take(transfer_id, mm_hash)
    }

    /// The encoder cache dropped `mm_hash` (not a wire op).
    pub fn retire(&mut self, mm_hash: &str) {
        self.book.retire(mm_hash);
    }

    /// Worker close: new reserves are refused, writers are deferred.
    pub fn begin_shutdown(&mut self, now: Instant) {
        self.book.begin_shutdown(now);
    }

    /// Records a remote writer may still write into; close waits for zero.
    pub fn writer_owned_count(&self) -> usize {
        self.book.writer_owned_count()
    }

    /// The reservation book, read-only (for drivers' metrics and oracles).
    pub fn book(&self) -> &ReservationBook<R> {
        &self.book
    }

    /// Counters.
    pub fn stats(&self) -> ShardStats {
        self.stats
    }

    /// The configuration.
    pub fn config(&self) -> &ShardConfig {
        &self.config
    }
}

/// Appends the event `write` encodes, dropping the oldest queued event first when the
/// backlog is full. (A free function so that the event can be written from a status
/// borrowed from the book.)
fn push_event(
    events: &mut EventQueue,
    stats: &mut ShardStats,
    port: u16,
    max_pending: usize,
    write: impl FnOnce(&mut Vec<u8>),
) {
    if events.len() >= max_pending {
        if let Some(dropped) = events.front() {
            tracing::warn!(port, transfer_id = %event_transfer_id(dropped), "EC event backlog full; dropping readiness");
        }
        if events.pop_front() {
            stats.events_dropped += 1;
        }
    }
    stats.events_queued += 1;
    events.push_with(write);
}

/// Notes a transfer that turned READY for [`ConsumerShard::drain_ready`], dropping the
/// oldest note when the log is full: every readiness event the shard queues is noted
/// here first, so the engine learns of each READY transfer the subscribers learn of.
fn log_ready(log: &mut VecDeque<String>, stats: &mut ShardStats, transfer_id: &str) {
    if log.len() >= READY_LOG_LIMIT {
        log.pop_front();
        stats.ready_log_dropped += 1;
    }
    log.push_back(transfer_id.to_string());
}

/// The transfer id of a queued event frame, for the log of a dropped one.
fn event_transfer_id(frame: &[u8]) -> String {
    let parsed: Option<Value> = serde_json::from_slice(frame).ok();
    match parsed.as_ref().and_then(|v| v.get("transfer_id")) {
        Some(Value::String(t)) => t.clone(),
        _ => String::from_utf8_lossy(frame).into_owned(),
    }
}

/// Parses a reply frame as a client does: `ok: false` is the server's refusal, a frame
/// that does not decode leaves the request unanswered.
pub fn reply_result(frame: &[u8]) -> Result<Value, ReplyError> {
    match wire::decode_reply(frame) {
        Ok(r) => r.map_err(ReplyError::Refused),
        Err(e) => Err(ReplyError::Unanswered(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::rand_core::SeedableRng;
    use rand_chacha::ChaCha8Rng;

    fn shard(pool: u64) -> ConsumerShard<ChaCha8Rng> {
        let mut config = ShardConfig::new(19019, pool);
        config.dst_session = "10.0.0.5:15417 \"q\" \u{e9}".into();
        config.slab_base = 1 << 40;
        ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(7), Instant::from_secs(1))
    }

    fn reserve(tid: &str, hash: &str, shape: &[u64]) -> Vec<u8> {
        let dims = shape.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        let nbytes = shape.iter().product::<u64>() * 2;
        format!(
            r#"{{"op": "reserve", "transfer_id": "{tid}", "mm_hash": "{hash}", "nbytes": {nbytes}, "shape": [{dims}], "dtype": "float16"}}"#
        )
        .into_bytes()
    }

    /// The in-place reserve path answers every request, and leaves the shard, exactly as
    /// decoding the request whole does: fresh grants, followers, duplicates, conflicts,
    /// cancelled transfers, a full pool and a shutting-down book.
    #[test]
    fn in_place_reserves_answer_as_the_decoded_path() {
        let hex = |i: u64| format!("{i:032x}");
        let hash = |i: u64| format!("{i:064x}");
        let mut frames = vec![
            reserve(&hex(1), &hash(1), &[64, 128]),
            reserve(&hex(2), &hash(1), &[64, 128]),
            reserve(&hex(1), &hash(1), &[64, 128]),
            reserve(&hex(1), &hash(2), &[64, 128]),
            reserve(&hex(3), &hash(1), &[64, 64]),
            reserve("plain id", "some hash", &[]),
            reserve(&hex(4), &hash(4), &[1, 2, 3, 4, 5, 6, 7, 8]),
            reserve(&hex(5), &hash(5), &[1, 2, 3, 4, 5, 6, 7, 8, 9]),
            reserve(&hex(6), &hash(6), &[1 << 20]),
            br#"{"op": "cancel", "transfer_id": "t9", "reservation_id": ""}"#.to_vec(),
            reserve("t9", "h9", &[4]),
            br#"{"op": "complete", "transfer_id": "00000000000000000000000000000001", "reservation_id": "x"}"#.to_vec(),
        ];
        for i in 10..40 {
            frames.push(reserve(&hex(i), &hash(i), &[256]));
        }
        let (mut fast, mut general) = (shard(1 << 15), shard(1 << 15));
        let now = Instant::from_secs(2);
        let mut out = b"stale bytes".to_vec();
        for (step, frame) in frames.iter().enumerate() {
            if step == frames.len() - 3 {
                fast.begin_shutdown(now);
                general.begin_shutdown(now);
            }
            fast.handle_request_into(frame, now, &mut out);
            // The same request without the clients' separators: only the general path reads it.
            let compact = String::from_utf8_lossy(frame).replace(", ", ",").replace(": ", ":");
            assert!(wire::read_request_fast(compact.as_bytes(), 64).is_none(), "{compact}");
            let want = general.handle_request(compact.as_bytes(), now);
            assert_eq!(
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&want),
                "{}",
                String::from_utf8_lossy(frame)
            );
            assert_eq!(fast.stats(), general.stats());
            assert_eq!(fast.pending_events(), general.pending_events());
        }
        assert!(fast.stats().error_replies >= 4, "{:?}", fast.stats());
        assert_eq!(fast.book().allocations(), general.book().allocations());
        let in_place = |f: &[u8]| matches!(wire::read_request_fast(f, 64), Some(wire::Decoded::Reserve(_)));
        assert!(in_place(&frames[0]));
        assert!(!in_place(&frames[7]), "nine dimensions take the decoded path");
    }

    /// `drain_ready` reports every transfer a readiness event was queued for, in the
    /// events' order: a lone writer's completion (the common case, whose event is written
    /// from the record the completion holds), a writer with a follower, a batch.
    #[test]
    fn drain_ready_reports_what_the_events_announce() {
        let mut s = shard(1 << 20);
        let now = Instant::from_secs(2);
        let rid = |reply: &[u8]| -> String {
            let v: Value = serde_json::from_slice(reply).unwrap();
            v["result"]["reservation_id"].as_str().unwrap().to_string()
        };
        let complete = |tid: &str, rid: &str| {
            format!(r#"{{"op": "complete", "transfer_id": "{tid}", "reservation_id": "{rid}"}}"#).into_bytes()
        };
        let lone = rid(&s.handle_request(&reserve("t1", "h1", &[4]), now));
        let writer = rid(&s.handle_request(&reserve("t2", "h2", &[4]), now));
        s.handle_request(&reserve("t3", "h2", &[4]), now);
        let batched = rid(&s.handle_request(&reserve("t4", "h4", &[4]), now));
        assert!(s.drain_ready().is_empty(), "nothing is READY before a completion");
        s.handle_request(&complete("t1", &lone), now);
        s.handle_request(&complete("t2", &writer), now);
        let batch =
            format!(r#"{{"op": "complete_batch", "items": [{{"transfer_id": "t4", "reservation_id": "{batched}"}}]}}"#);
        s.handle_request(batch.as_bytes(), now);
        let mut announced = Vec::new();
        while let Some(frame) = s.peek_event() {
            let event: Value = serde_json::from_slice(frame).unwrap();
            announced.push(event["transfer_id"].as_str().unwrap().to_string());
            s.confirm_sent();
        }
        assert_eq!(announced, ["t1", "t3", "t2", "t4"]);
        assert_eq!(s.drain_ready(), announced);
        assert!(s.drain_ready().is_empty());
    }
}
