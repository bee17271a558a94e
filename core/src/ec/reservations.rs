//! The reservation book of one consumer shard (spec section 3).
//!
//! It decides what `reserve`, `complete`, `cancel`, expiry, `take` and shutdown do to a
//! transfer's reservation and to the slab behind it. The rule it never breaks: memory a
//! remote writer may still write is released only by that writer's completion or by the
//! producer's abandon — never by a timeout and never by a plain cancel.

use super::dtype::DType;
use super::ids::{ReservationId, TransferId};
use super::pyjson::str_repr;
use super::resident::{EntryId, ResidentPool};
use super::slab::{Region, Slab, View};
use super::state::State;
use crate::time::Instant;
use rand_core::RngCore;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// `_RESERVATION_TTL_SECONDS`: WRITING/READY lease and tombstone lifetime.
pub const RESERVATION_TTL: Duration = Duration::from_secs(300);
/// `_MAX_CANCELLED_TRANSFER_IDS`: tombstones kept at most.
pub const TOMBSTONE_LIMIT: usize = 65536;

/// What `complete` of a follower answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FollowerCompletion {
    /// Gen A (the merged connector): `(false, false)`, which a Gen A producer treats as a
    /// failed batch.
    #[default]
    Reject,
    /// Gen B (PR #58123): an idempotent no-op `(true, false)`, so one follower completion
    /// cannot fail an unrelated batch (spec S15).
    AcceptNoop,
}

/// Tunables of a [`ReservationBook`].
#[derive(Clone, Debug)]
pub struct BookConfig {
    /// Lifetime of WRITING and READY records and of tombstones.
    pub ttl: Duration,
    /// Most terminal records kept (oldest dropped first).
    pub tombstone_limit: usize,
    /// Gen A or Gen B follower completion.
    pub follower_completion: FollowerCompletion,
}

impl Default for BookConfig {
    fn default() -> Self {
        BookConfig {
            ttl: RESERVATION_TTL,
            tombstone_limit: TOMBSTONE_LIMIT,
            follower_completion: FollowerCompletion::Reject,
        }
    }
}

/// A validated `reserve` payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReserveRequest {
    pub transfer_id: String,
    pub mm_hash: String,
    /// Exact tensor bytes (`prod(shape) * itemsize`).
    pub nbytes: u64,
    pub shape: Vec<u64>,
    pub dtype: DType,
}

/// What a `reserve` grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reserved {
    /// A destination: new (`write`), shared with an in-flight writer, a cache hit or a
    /// duplicate of an existing reservation.
    Granted {
        reservation_id: ReservationId,
        view: View,
        /// The producer must write (only for a newly allocated destination).
        write: bool,
        /// Already loadable; a readiness event is due.
        ready: bool,
        /// Holds a lease on a resident tensor.
        cached: bool,
    },
    /// The consumer cancelled this transfer first: the producer must not write.
    Cancelled,
}

/// Why a `reserve` was refused; `Display` is the reference's error text.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ReserveError {
    #[error("Consumer reservation manager is shutting down")]
    ShuttingDown,
    #[error("Transfer {} still has an active writer", str_repr(.0))]
    ActiveWriter(String),
    #[error("conflicting reservation for transfer_id")]
    ConflictingReservation,
    #[error("conflicting cached tensor for mm_hash")]
    ConflictingCached,
    #[error("conflicting in-flight tensor for mm_hash")]
    ConflictingInFlight,
    #[error("EC consumer buffer pool is full")]
    PoolFull,
}

/// Why a `take` was refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("Pushed EC tensor is not ready for mm_hash={mm_hash}")]
pub struct TakeError {
    pub mm_hash: String,
}

/// The status object of an active reservation (`status` op and readiness events).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub mm_hash: Arc<str>,
    pub ready: bool,
    pub reservation_id: Option<ReservationId>,
    pub nbytes: u64,
    pub shape: Box<[u64]>,
    pub dtype: DType,
}

/// A tensor handed to the model by `take`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub view: View,
    pub shape: Box<[u64]>,
    pub dtype: DType,
}

#[derive(Clone, Debug)]
struct Record {
    mm_hash: Arc<str>,
    /// `None` only for a cancel-before-reserve tombstone (the reference's `""`).
    reservation_id: Option<ReservationId>,
    state: State,
    shape: Box<[u64]>,
    dtype: DType,
    nbytes: u64,
    /// The destination: owned by a writer, shared (not owned) by a follower.
    view: Option<View>,
    /// A borrow of a resident entry, which then holds the memory.
    lease: Option<EntryId>,
    /// `None` = never (deferred and terminal records).
    expires_at: Option<Instant>,
    /// Set on a follower: the writer whose destination it shares.
    writer: Option<TransferId>,
    /// On a writer: its still-following followers, in arrival order.
    followers: Vec<TransferId>,
    /// On a terminal record: its place in the tombstone order and its deadline.
    tombstone: Option<(u64, Instant)>,
}

impl Record {
    fn rid_matches(&self, wire: &str) -> bool {
        match self.reservation_id {
            Some(id) => ReservationId::parse(wire) == Some(id),
            None => wire.is_empty(),
        }
    }
}

/// The reservations of one consumer shard, its slab and its resident tensors.
#[derive(Debug)]
pub struct ReservationBook<R> {
    config: BookConfig,
    rng: R,
    slab: Slab,
    resident: ResidentPool,
    records: BTreeMap<TransferId, Record>,
    /// `mm_hash` -> its WRITING writer, for followers to join.
    writers: BTreeMap<Arc<str>, TransferId>,
    /// Terminal records oldest first.
    tombstones: BTreeMap<u64, TransferId>,
    next_tombstone: u64,
    /// Followers published READY by a writer's completion, for `drain_ready`.
    ready: Vec<TransferId>,
    /// Resident hashes evicted under pool pressure, reported to the scheduler.
    reclaimed: Vec<Arc<str>>,
    shutting_down: bool,
}

impl<R: RngCore> ReservationBook<R> {
    /// A book over a fresh slab of `pool_bytes`; `rng` mints reservation ids.
    pub fn new(pool_bytes: u64, config: BookConfig, rng: R) -> Self {
        ReservationBook {
            config,
            rng,
            slab: Slab::new(pool_bytes),
            resident: ResidentPool::default(),
            records: BTreeMap::new(),
            writers: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            next_tombstone: 0,
            ready: Vec::new(),
            reclaimed: Vec::new(),
            shutting_down: false,
        }
    }

    /// Reserve rules 1-8 (spec 3.3), after the reap every reserve performs.
    pub fn reserve(&mut self, req: &ReserveRequest, now: Instant) -> Result<Reserved, ReserveError> {
        self.expire(now);
        if self.shutting_down {
            return Err(ReserveError::ShuttingDown);
        }
        let tid = TransferId::new(&req.transfer_id);
        if let Some(rec) = self.records.get_mut(&tid) {
            match rec.state {
                State::Cancelled => return Ok(Reserved::Cancelled),
                State::Expired => {
                    self.forget(&tid);
                }
                State::ExpirePending => return Err(ReserveError::ActiveWriter(req.transfer_id.clone())),
                state => {
                    if *rec.mm_hash != *req.mm_hash || *rec.shape != *req.shape || rec.dtype != req.dtype {
                        return Err(ReserveError::ConflictingReservation);
                    }
                    if state == State::CancelPending {
                        return Ok(Reserved::Cancelled);
                    }
                    if state == State::Writing {
                        rec.expires_at = Some(now + self.config.ttl);
                    }
                    let cached = rec.lease.is_some();
                    let rec = rec.clone();
                    return Ok(Reserved::Granted {
                        reservation_id: rec.reservation_id.unwrap_or_else(|| ReservationId::generate(&mut self.rng)),
                        view: self.view_of(&rec).unwrap_or(View { region: Region { offset: 0, len: 0 }, nbytes: 0 }),
                        write: false,
                        ready: state == State::Ready,
                        cached,
                    });
                }
            }
        }
        self.reserve_new(tid, req, now)
    }

    fn reserve_new(&mut self, tid: TransferId, req: &ReserveRequest, now: Instant) -> Result<Reserved, ReserveError> {
        let expires_at = Some(now + self.config.ttl);
        // Rule 6: a resident copy serves the transfer at once.
        if let Some((entry, e)) = self.resident.lookup(&req.mm_hash) {
            if *e.shape != *req.shape || e.dtype != req.dtype {
                return Err(ReserveError::ConflictingCached);
            }
            let (view, mm_hash) = (e.view, e.mm_hash.clone());
            self.resident.lease(entry);
            let reservation_id = ReservationId::generate(&mut self.rng);
            self.records.insert(
                tid,
                Record {
                    mm_hash,
                    reservation_id: Some(reservation_id),
                    state: State::Ready,
                    shape: req.shape.clone().into(),
                    dtype: req.dtype,
                    nbytes: req.nbytes,
                    view: None,
                    lease: Some(entry),
                    expires_at,
                    writer: None,
                    followers: Vec::new(),
                    tombstone: None,
                },
            );
            return Ok(Reserved::Granted { reservation_id, view, write: false, ready: true, cached: true });
        }
        // Rule 7: share an in-flight writer's destination.
        if let Some(writer_tid) = self.writers.get(req.mm_hash.as_str()).cloned() {
            if let Some(writer) = self.records.get_mut(&writer_tid).filter(|w| w.state == State::Writing) {
                if *writer.shape != *req.shape || writer.dtype != req.dtype {
                    return Err(ReserveError::ConflictingInFlight);
                }
                writer.followers.push(tid.clone());
                let (view, mm_hash) = (writer.view, writer.mm_hash.clone());
                let reservation_id = ReservationId::generate(&mut self.rng);
                self.records.insert(
                    tid,
                    Record {
                        mm_hash,
                        reservation_id: Some(reservation_id),
                        state: State::Writing,
                        shape: req.shape.clone().into(),
                        dtype: req.dtype,
                        nbytes: req.nbytes,
                        view,
                        lease: None,
                        expires_at,
                        writer: Some(writer_tid),
                        followers: Vec::new(),
                        tombstone: None,
                    },
                );
                let view = view.unwrap_or(View { region: Region { offset: 0, len: 0 }, nbytes: 0 });
                return Ok(Reserved::Granted { reservation_id, view, write: false, ready: false, cached: false });
            }
        }
        // Rule 8: allocate, reaping and then evicting residents under pressure.
        let view = self.allocate(req.nbytes, now).ok_or(ReserveError::PoolFull)?;
        let mm_hash: Arc<str> = Arc::from(req.mm_hash.as_str());
        let reservation_id = ReservationId::generate(&mut self.rng);
        self.writers.insert(mm_hash.clone(), tid.clone());
        self.records.insert(
            tid,
            Record {
                mm_hash,
                reservation_id: Some(reservation_id),
                state: State::Writing,
                shape: req.shape.clone().into(),
                dtype: req.dtype,
                nbytes: req.nbytes,
                view: Some(view),
                lease: None,
                expires_at,
                writer: None,
                followers: Vec::new(),
                tombstone: None,
            },
        );
        Ok(Reserved::Granted { reservation_id, view, write: true, ready: false, cached: false })
    }

    fn allocate(&mut self, nbytes: u64, now: Instant) -> Option<View> {
        if let Some(v) = self.slab.allocate(nbytes) {
            return Some(v);
        }
        self.expire(now);
        loop {
            if let Some(v) = self.slab.allocate(nbytes) {
                return Some(v);
            }
            let (mm_hash, view) = self.resident.evict_one()?;
            tracing::debug!(mm_hash = %mm_hash, "evicting resident tensor under pool pressure");
            self.free(view);
            self.reclaimed.push(mm_hash);
        }
    }

    /// Complete rules 1-8 (spec 3.4): `(accepted, became_ready)`.
    pub fn complete(&mut self, transfer_id: &str, reservation_id: &str, now: Instant) -> (bool, bool) {
        let tid = TransferId::new(transfer_id);
        let Some(rec) = self.records.get(&tid) else {
            return (false, false);
        };
        if !rec.rid_matches(reservation_id) {
            return (false, false);
        }
        if rec.state == State::Ready {
            return (true, false);
        }
        if rec.writer.is_some() {
            return match self.config.follower_completion {
                FollowerCompletion::Reject => (false, false),
                FollowerCompletion::AcceptNoop => (true, false),
            };
        }
        let state = rec.state;
        if state.is_writer_owned() {
            self.unindex_writer(&tid);
            self.publish_followers(&tid, now);
        }
        if state.is_deferred() {
            let to = if state == State::CancelPending { State::Cancelled } else { State::Expired };
            self.terminate(&tid, to, now);
            return (true, false);
        }
        if state != State::Writing {
            return (false, false);
        }
        self.set_state(&tid, State::Ready);
        if let Some(rec) = self.records.get_mut(&tid) {
            rec.expires_at = Some(now + self.config.ttl);
        }
        (true, true)
    }

    /// Hands a completing writer's destination to its followers through the resident
    /// pool: every one of them (and the writer) gets a lease and the followers turn READY.
    fn publish_followers(&mut self, tid: &TransferId, now: Instant) {
        let Some(writer) = self.records.get_mut(tid) else { return };
        if writer.followers.is_empty() {
            return;
        }
        let followers = std::mem::take(&mut writer.followers);
        let Some(view) = writer.view.take() else { return };
        let (mm_hash, shape, dtype) = (writer.mm_hash.clone(), writer.shape.clone(), writer.dtype);
        let (entry, displaced) = self.resident.publish(mm_hash, view, shape, dtype, false);
        if let Some(v) = displaced {
            self.free(v);
        }
        self.resident.lease(entry);
        if let Some(writer) = self.records.get_mut(tid) {
            writer.lease = Some(entry);
        }
        for f in followers {
            self.resident.lease(entry);
            self.set_state(&f, State::Ready);
            if let Some(rec) = self.records.get_mut(&f) {
                rec.writer = None;
                rec.view = None;
                rec.lease = Some(entry);
                rec.expires_at = Some(now + self.config.ttl);
            }
            self.ready.push(f);
        }
    }

    /// Cancel rules 1-9 (spec 3.5).
    pub fn cancel(
        &mut self,
        transfer_id: &str,
        reservation_id: &str,
        abandon: bool,
        refresh: bool,
        now: Instant,
    ) -> bool {
        let tid = TransferId::new(transfer_id);
        let Some(rec) = self.records.get(&tid) else {
            // Rule 2: cancel before reserve leaves a tombstone the later reserve will find.
            self.records.insert(
                tid.clone(),
                Record {
                    mm_hash: Arc::from(""),
                    reservation_id: None,
                    state: State::Cancelled,
                    shape: Box::new([]),
                    dtype: DType::Float16,
                    nbytes: 0,
                    view: None,
                    lease: None,
                    expires_at: None,
                    writer: None,
                    followers: Vec::new(),
                    tombstone: None,
                },
            );
            self.push_tombstone(&tid, now);
            self.reap_tombstones(now);
            return true;
        };
        if !reservation_id.is_empty() && !rec.rid_matches(reservation_id) {
            return false;
        }
        let state = rec.state;
        let follower = rec.writer.is_some();
        if state == State::Cancelled {
            self.push_tombstone(&tid, now);
            self.reap_tombstones(now);
            return true;
        }
        if refresh {
            if !abandon || !matches!(state, State::Writing | State::ExpirePending) {
                return false;
            }
            if state == State::Writing {
                self.set_state(&tid, State::ExpirePending);
            }
            self.terminate(&tid, State::Expired, now);
            return true;
        }
        if follower {
            self.terminate(&tid, State::Cancelled, now);
            return true;
        }
        if state.is_deferred() && !abandon {
            return true;
        }
        if state == State::Writing && !abandon {
            self.defer(&tid, State::CancelPending);
            return true;
        }
        if !state.is_active() {
            return false;
        }
        self.terminate(&tid, State::Cancelled, now);
        true
    }

    /// Expiry (spec 3.6): READY past its deadline expires, a WRITING follower is
    /// cancelled, a WRITING writer is deferred; then old tombstones go. Returns how many
    /// READY records expired.
    pub fn expire(&mut self, now: Instant) -> usize {
        let due: Vec<TransferId> = self
            .records
            .iter()
            .filter(|(_, r)| r.state.is_active() && r.expires_at.is_some_and(|t| t <= now))
            .map(|(tid, _)| tid.clone())
            .collect();
        let mut expired = 0;
        for tid in due {
            let Some(rec) = self.records.get(&tid) else { continue };
            match (rec.state, rec.writer.is_some()) {
                (State::Ready, _) => {
                    self.terminate(&tid, State::Expired, now);
                    expired += 1;
                }
                (State::Writing, true) => self.terminate(&tid, State::Cancelled, now),
                (State::Writing, false) => self.defer(&tid, State::ExpirePending),
                _ => {}
            }
        }
        self.reap_tombstones(now);
        expired
    }

    /// The status object of an active reservation.
    pub fn status(&self, transfer_id: &str) -> Option<Status> {
        let rec = self.records.get(&TransferId::new(transfer_id))?;
        if !rec.state.is_active() {
            return None;
        }
        Some(Status {
            mm_hash: rec.mm_hash.clone(),
            ready: rec.state == State::Ready,
            reservation_id: rec.reservation_id,
            nbytes: rec.nbytes,
            shape: rec.shape.clone(),
            dtype: rec.dtype,
        })
    }

    /// Followers published READY since the last call, in publication order.
    pub fn drain_ready(&mut self) -> Vec<String> {
        std::mem::take(&mut self.ready).into_iter().map(|t| t.to_string()).collect()
    }

    /// Resident hashes evicted under pool pressure since the last call.
    pub fn drain_reclaimed(&mut self) -> Vec<String> {
        std::mem::take(&mut self.reclaimed).into_iter().map(|h| h.to_string()).collect()
    }

    /// Hands a READY tensor to the model: the record goes (no tombstone) and its memory
    /// becomes a pinned resident entry, or its lease becomes the pin.
    pub fn take(&mut self, transfer_id: &str, mm_hash: &str) -> Result<Taken, TakeError> {
        let tid = TransferId::new(transfer_id);
        let not_ready = || TakeError { mm_hash: mm_hash.to_string() };
        let rec = self.records.get(&tid).ok_or_else(not_ready)?;
        if rec.state != State::Ready || *rec.mm_hash != *mm_hash || (rec.view.is_none() && rec.lease.is_none()) {
            return Err(not_ready());
        }
        let rec = self.records.remove(&tid).ok_or_else(not_ready)?;
        let view = match (rec.lease, rec.view) {
            (Some(entry), _) => {
                let view = self.resident.get(entry).map(|e| e.view);
                self.resident.pin_from_lease(entry);
                view.ok_or_else(not_ready)?
            }
            (None, Some(view)) => {
                let (_, displaced) = self.resident.publish(rec.mm_hash, view, rec.shape.clone(), rec.dtype, true);
                if let Some(v) = displaced {
                    self.free(v);
                }
                view
            }
            (None, None) => return Err(not_ready()),
        };
        Ok(Taken { view, shape: rec.shape, dtype: rec.dtype })
    }

    /// The encoder cache dropped `mm_hash`: its resident copies become evictable.
    pub fn retire(&mut self, mm_hash: &str) {
        for view in self.resident.retire(mm_hash) {
            self.free(view);
        }
    }

    /// Shutdown: refuse new reserves, cancel followers and READY records, and defer
    /// WRITING writers (their memory stays until they complete or are abandoned).
    pub fn begin_shutdown(&mut self, now: Instant) {
        self.shutting_down = true;
        let ids: Vec<TransferId> = self.records.keys().cloned().collect();
        for tid in &ids {
            if let Some(rec) = self.records.get(tid) {
                if rec.state == State::Ready || (rec.state == State::Writing && rec.writer.is_some()) {
                    self.terminate(tid, State::Cancelled, now);
                }
            }
        }
        for tid in &ids {
            if self.records.get(tid).is_some_and(|r| r.state == State::Writing) {
                self.defer(tid, State::CancelPending);
            }
        }
    }

    /// Whether shutdown began.
    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down
    }

    /// Records a remote writer may still write into; shutdown waits for zero.
    pub fn writer_owned_count(&self) -> usize {
        self.records.values().filter(|r| r.state.is_writer_owned()).count()
    }

    /// The state of a transfer's record, if one is kept.
    pub fn state_of(&self, transfer_id: &str) -> Option<State> {
        self.records.get(&TransferId::new(transfer_id)).map(|r| r.state)
    }

    /// Number of records, terminal ones included.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// No records at all.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Terminal records kept as tombstones.
    pub fn tombstone_count(&self) -> usize {
        self.tombstones.len()
    }

    /// The slab, read-only.
    pub fn slab(&self) -> &Slab {
        &self.slab
    }

    /// The resident pool, read-only.
    pub fn resident(&self) -> &ResidentPool {
        &self.resident
    }

    /// The book's configuration.
    pub fn config(&self) -> &BookConfig {
        &self.config
    }

    /// Regions whose memory a remote writer may still write (writer-owned writers).
    pub fn writer_owned_regions(&self) -> Vec<Region> {
        self.records
            .values()
            .filter(|r| r.state.is_writer_owned() && r.writer.is_none())
            .filter_map(|r| r.view.map(|v| v.region))
            .collect()
    }

    fn view_of(&self, rec: &Record) -> Option<View> {
        match rec.lease {
            Some(entry) => self.resident.get(entry).map(|e| e.view),
            None => rec.view,
        }
    }

    fn set_state(&mut self, tid: &TransferId, to: State) {
        if let Some(rec) = self.records.get_mut(tid) {
            if !rec.state.can_become(to) {
                tracing::error!(transfer_id = %tid, "Cannot transition {} from {} to {}", str_repr(&tid.to_string()), rec.state, to);
                debug_assert!(false, "illegal transition {} -> {to}", rec.state);
                return;
            }
            rec.state = to;
        }
    }

    /// Move to a deferred state: no timeout can release it any more.
    fn defer(&mut self, tid: &TransferId, to: State) {
        self.set_state(tid, to);
        self.unindex_writer(tid);
        if let Some(rec) = self.records.get_mut(tid) {
            rec.expires_at = None;
        }
    }

    /// Move to a terminal state, release memory (a writer also cancels its followers) and
    /// start the tombstone.
    fn terminate(&mut self, tid: &TransferId, to: State, now: Instant) {
        self.set_state(tid, to);
        self.unindex_writer(tid);
        let Some(rec) = self.records.get_mut(tid) else { return };
        rec.expires_at = None;
        let writer = rec.writer.take();
        let view = rec.view.take();
        let lease = rec.lease.take();
        let followers = std::mem::take(&mut rec.followers);
        match writer {
            // A follower never owns memory: it only unlinks.
            Some(w) => {
                if let Some(wr) = self.records.get_mut(&w) {
                    wr.followers.retain(|f| f != tid);
                }
            }
            None => {
                if let Some(v) = view {
                    self.free(v);
                }
                if let Some(entry) = lease {
                    if let Some(v) = self.resident.release(entry) {
                        self.free(v);
                    }
                }
                for f in followers {
                    if let Some(fr) = self.records.get_mut(&f) {
                        fr.writer = None;
                        fr.view = None;
                    }
                    self.terminate(&f, State::Cancelled, now);
                }
            }
        }
        self.push_tombstone(tid, now);
        self.reap_tombstones(now);
    }

    fn unindex_writer(&mut self, tid: &TransferId) {
        if let Some(rec) = self.records.get(tid) {
            if self.writers.get(&rec.mm_hash) == Some(tid) {
                self.writers.remove(&rec.mm_hash);
            }
        }
    }

    /// Appends (or moves) a terminal record to the newest end of the tombstone order.
    fn push_tombstone(&mut self, tid: &TransferId, now: Instant) {
        let seq = self.next_tombstone;
        self.next_tombstone += 1;
        let deadline = now + self.config.ttl;
        if let Some(rec) = self.records.get_mut(tid) {
            if let Some((old, _)) = rec.tombstone.replace((seq, deadline)) {
                self.tombstones.remove(&old);
            }
            self.tombstones.insert(seq, tid.clone());
        }
    }

    /// Drops tombstones from the oldest while they are past their deadline or too many.
    fn reap_tombstones(&mut self, now: Instant) {
        while let Some((&seq, tid)) = self.tombstones.first_key_value() {
            let deadline = self.records.get(tid).and_then(|r| r.tombstone).map(|(_, d)| d);
            let over = self.tombstones.len() > self.config.tombstone_limit;
            if !over && deadline.is_some_and(|d| d > now) {
                break;
            }
            let tid = tid.clone();
            self.tombstones.remove(&seq);
            self.records.remove(&tid);
        }
    }

    /// Removes a terminal record and its tombstone (an EXPIRED record replaced by a new
    /// reservation of the same transfer).
    fn forget(&mut self, tid: &TransferId) {
        if let Some(rec) = self.records.remove(tid) {
            if let Some((seq, _)) = rec.tombstone {
                self.tombstones.remove(&seq);
            }
        }
    }

    fn free(&mut self, view: View) {
        if let Err(e) = self.slab.free(view.region) {
            tracing::error!(error = %e, "reservation book released memory it does not own");
            debug_assert!(false, "{e}");
        }
    }

    /// Checks every structural invariant of the book; the property tests and the
    /// simulator's oracles call this after each step.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.slab.check()?;
        // Memory: what the slab has handed out is exactly what writers and resident
        // entries own, each region once.
        let mut owned: Vec<Region> = Vec::new();
        for (tid, r) in &self.records {
            if r.writer.is_none() {
                if let Some(v) = r.view {
                    owned.push(v.region);
                    if r.lease.is_some() {
                        return Err(format!("{tid:?} owns memory and holds a lease"));
                    }
                }
            }
            if r.state.is_writer_owned() && r.writer.is_none() && r.view.is_none() {
                return Err(format!("writer-owned writer {tid:?} ({}) lost its destination", r.state));
            }
            if r.state.is_terminal() != r.tombstone.is_some() {
                return Err(format!("{tid:?} in {} has tombstone {:?}", r.state, r.tombstone));
            }
            if r.state.is_terminal() && (r.view.is_some() || r.lease.is_some() || r.writer.is_some()) {
                return Err(format!("terminal {tid:?} still holds memory"));
            }
            if r.state.is_deferred() != (r.state.is_active() && r.expires_at.is_none()) {
                return Err(format!("{tid:?} in {} has deadline {:?}", r.state, r.expires_at));
            }
            if let Some(w) = &r.writer {
                let writer = self.records.get(w).ok_or_else(|| format!("follower {tid:?} of missing writer {w:?}"))?;
                if !writer.followers.contains(tid) || writer.view != r.view || r.state != State::Writing {
                    return Err(format!("follower {tid:?} is not linked to writer {w:?}"));
                }
            }
            for f in &r.followers {
                if self.records.get(f).and_then(|fr| fr.writer.as_ref()) != Some(tid) {
                    return Err(format!("writer {tid:?} lists {f:?} which does not follow it"));
                }
            }
        }
        let mut leases: BTreeMap<EntryId, u32> = BTreeMap::new();
        for r in self.records.values() {
            if let Some(e) = r.lease {
                *leases.entry(e).or_default() += 1;
            }
        }
        for (id, e) in self.resident.entries() {
            owned.push(e.view.region);
            if leases.get(&id).copied().unwrap_or(0) != e.leases {
                return Err(format!(
                    "resident entry {id} counts {} leases, records hold {:?}",
                    e.leases,
                    leases.get(&id)
                ));
            }
        }
        owned.sort();
        let allocated: Vec<Region> = self.slab.allocations().collect();
        if owned != allocated {
            return Err(format!("owned regions {owned:?} != slab allocations {allocated:?}"));
        }
        if self.tombstones.len() > self.config.tombstone_limit {
            return Err(format!("{} tombstones over the limit {}", self.tombstones.len(), self.config.tombstone_limit));
        }
        let terminal: BTreeSet<&TransferId> =
            self.records.iter().filter(|(_, r)| r.state.is_terminal()).map(|(t, _)| t).collect();
        let listed: BTreeSet<&TransferId> = self.tombstones.values().collect();
        if terminal != listed || listed.len() != self.tombstones.len() {
            return Err("tombstone order does not match terminal records".into());
        }
        for (hash, tid) in &self.writers {
            match self.records.get(tid) {
                Some(r) if r.state == State::Writing && r.writer.is_none() && r.mm_hash == *hash => {}
                _ => return Err(format!("writer index {hash} -> {tid:?} is stale")),
            }
        }
        Ok(())
    }
}
