//! The reservation book of one consumer shard (ec-behaviour.md §3).
//!
//! It decides what `reserve`, `complete`, `cancel`, expiry, `take` and shutdown do to a
//! transfer's reservation and to the slab behind it. The rule it never breaks: memory a
//! remote writer may still write is released only by that writer's completion or by the
//! producer's abandon — never by a timeout and never by a plain cancel.

use super::defaults::RESERVATION_TTL;
use super::dtype::DType;
use super::ids::{fingerprint_str, MmHash, ReservationId, TransferId};
use super::keyed_hash::KeyedHash;
use super::pyjson::str_repr;
use super::resident::{EntryId, ResidentPool};
use super::shapes::{ShapeId, ShapeTable};
use super::slab::{aligned_size, Region, Slab, View};
use super::state::State;
use super::writer_index::WriterIndex;
use crate::time::Instant;
use rand_core::RngCore;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use thiserror::Error;

/// `_MAX_CANCELLED_TRANSFER_IDS`: tombstones kept at most.
pub const TOMBSTONE_LIMIT: usize = 65536;
/// Evicted hashes remembered for the scheduler until drained (oldest dropped beyond).
pub const RECLAIMED_LIMIT: usize = 4096;

/// "No deadline": deferred records, and terminal records' lease.
const NEVER: Instant = Instant::from_nanos(u64::MAX);

/// What `complete` of a follower answers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FollowerCompletion {
    /// Gen A (the merged connector): `(false, false)`, which a Gen A producer treats as a
    /// failed batch.
    #[default]
    Reject,
    /// Gen B (PR #58123): an idempotent no-op `(true, false)`, so one follower completion
    /// cannot fail an unrelated batch (ec-behaviour.md S15).
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
    /// Historical behaviours for the race catalogue, all off.
    pub regressions: BookRegressions,
}

/// Historical behaviours of the reservation book, each restoring one race of the
/// catalogue (`docs/races.md`). All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BookRegressions {
    /// EC S11: a deferred record (CANCEL_PENDING, EXPIRE_PENDING) is freed this long after
    /// it was deferred, as an intermediate reference version did, although its writer may
    /// still be writing; a late write then lands in memory another transfer may own.
    pub s11_grace_period_free: Option<Duration>,
    /// EC S12: `complete` matches the transfer id only, so a late completion carrying a
    /// refreshed-away reservation id completes the new reservation before its write.
    pub s12_complete_ignores_reservation_id: bool,
    /// EC S13: a cancel before the reserve leaves no tombstone (and answers `false`), so
    /// the producer's later reserve allocates and writes for a request that is gone.
    pub s13_no_cancel_tombstone: bool,
    /// EC S14: a follower's refresh (`cancel(abandon, refresh)`) abandons the writer it
    /// shares, freeing the destination the writer's producer is still writing.
    pub s14_follower_refresh_abandons_writer: bool,
    /// EC dup-push: a duplicate reserve of a transfer id (another push of it, S24) shares
    /// the first grant's reservation id, and an empty-id abandon cancels a record granted
    /// to several pushes, so one push's cleanup frees the destination the other writes.
    pub dup_push_shares_grant: bool,
}

impl Default for BookConfig {
    fn default() -> Self {
        BookConfig {
            ttl: RESERVATION_TTL,
            tombstone_limit: TOMBSTONE_LIMIT,
            follower_completion: FollowerCompletion::Reject,
            regressions: BookRegressions::default(),
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

impl ReserveRequest {
    /// The request borrowed, as [`ReservationBook::reserve_ref`] takes it.
    pub fn as_ref(&self) -> ReserveRef<'_> {
        ReserveRef {
            transfer_id: &self.transfer_id,
            mm_hash: &self.mm_hash,
            nbytes: self.nbytes,
            shape: &self.shape,
            dtype: self.dtype,
        }
    }
}

/// A validated `reserve` payload borrowed from wherever it was read (the request frame,
/// on the serving path), so that reserving allocates nothing for the request itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReserveRef<'a> {
    pub transfer_id: &'a str,
    pub mm_hash: &'a str,
    /// Exact tensor bytes (`prod(shape) * itemsize`).
    pub nbytes: u64,
    pub shape: &'a [u64],
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
    /// No destination can be carved for the payload (the text torch raises).
    #[error("{0}")]
    Unplaceable(String),
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

/// The book's records by kind: what a consumer's `stats` reports beside its counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Records not yet terminal: WRITING, READY or deferred.
    pub live: usize,
    /// Terminal records kept as tombstones.
    pub tombstones: usize,
    /// Records a remote writer may still write into.
    pub writer_owned: usize,
}

/// [`Status`] borrowed from the book, for writers that skip the owned copy (readiness
/// events are encoded from it while the completion still holds the record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StatusView<'a> {
    pub mm_hash: &'a MmHash,
    pub ready: bool,
    pub reservation_id: Option<ReservationId>,
    pub nbytes: u64,
    pub shape: &'a [u64],
    pub dtype: DType,
}

impl StatusView<'_> {
    /// The owned status object.
    pub fn to_status(&self) -> Status {
        Status {
            mm_hash: self.mm_hash.to_arc(),
            ready: self.ready,
            reservation_id: self.reservation_id,
            nbytes: self.nbytes,
            shape: self.shape.into(),
            dtype: self.dtype,
        }
    }
}

/// What [`ReservationBook::complete_with`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completed {
    /// The completion was accepted.
    pub completed: bool,
    /// The record became READY.
    pub became_ready: bool,
    /// Followers turned READY too: [`ReservationBook::drain_ready`] has them, their
    /// events go out before the writer's, and the writer's status was not handed out.
    pub followers_ready: bool,
}

/// A tensor handed to the model by `take`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taken {
    pub view: View,
    pub shape: Box<[u64]>,
    pub dtype: DType,
}

/// Where a record's destination lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dest {
    /// No memory (tombstones, terminal records).
    None,
    /// A writer's own region at this slab offset.
    Own(u64),
    /// A follower's view of its writer's region at this offset (not owned).
    Shared(u64),
    /// A lease on a resident entry, which holds the memory.
    Lease(EntryId),
}

/// Writer/follower links, boxed because shared transfers are the exception.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Link {
    /// This record follows that writer.
    Writer(TransferId),
    /// This writer's still-following followers, in arrival order.
    Followers(Vec<TransferId>),
}

/// One transfer's reservation, kept compact: the book holds tens of thousands.
#[derive(Clone, Debug)]
struct Record {
    mm_hash: MmHash,
    /// `None` only for a cancel-before-reserve tombstone (the reference's `""`).
    reservation_id: Option<ReservationId>,
    state: State,
    dtype: DType,
    shape: ShapeId,
    nbytes: u64,
    dest: Dest,
    /// Active: when the lease lapses ([`NEVER`] when deferred). Terminal: when the
    /// tombstone goes.
    deadline: Instant,
    /// Terminal records: place in the tombstone order.
    tomb_seq: u64,
    link: Option<Box<Link>>,
    /// The reservation ids handed to duplicate reserves of this transfer id (another push
    /// of the same id, ec-behaviour.md S24); empty (no allocation) for nearly every
    /// record. They never write, so cancelling with one releases that grant alone.
    dups: Vec<ReservationId>,
}

impl Record {
    fn rid_matches(&self, wire: &str) -> bool {
        match self.reservation_id {
            Some(id) => ReservationId::parse(wire) == Some(id),
            None => wire.is_empty(),
        }
    }

    /// Whether `wire` names a grant handed to a duplicate reserve.
    fn is_dup(&self, wire: &str) -> bool {
        let Some(id) = ReservationId::parse(wire) else { return false };
        self.dups.contains(&id)
    }

    fn writer(&self) -> Option<&TransferId> {
        match self.link.as_deref() {
            Some(Link::Writer(w)) => Some(w),
            _ => None,
        }
    }

    fn is_follower(&self) -> bool {
        self.writer().is_some()
    }

    fn followers(&self) -> &[TransferId] {
        match self.link.as_deref() {
            Some(Link::Followers(f)) => f,
            _ => &[],
        }
    }

    fn view_at(&self, offset: u64) -> View {
        let len = aligned_size(self.nbytes).unwrap_or(0);
        View { region: Region { offset, len }, nbytes: self.nbytes }
    }

    /// The record's own region, if it owns one.
    fn owned(&self) -> Option<View> {
        match self.dest {
            Dest::Own(offset) => Some(self.view_at(offset)),
            _ => None,
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
    shapes: ShapeTable,
    /// Records by transfer id: one hash lookup per step of an operation. Only looked up;
    /// every walk over them sorts by transfer id first, so the map's hashing never
    /// reaches an output.
    records: HashMap<TransferId, Record, KeyedHash>,
    /// WRITING writers by `mm_hash` fingerprint, for followers to join; a lookup checks
    /// the record's hash, so fingerprint collisions cost a comparison, nothing more.
    writers: WriterIndex,
    /// Terminal records oldest first.
    tombstones: BTreeMap<u64, TransferId>,
    next_tombstone: u64,
    /// No active record's deadline is earlier: `expire` before it has nothing to do.
    next_due: Instant,
    /// Followers published READY by a writer's completion, for `drain_ready`.
    ready: Vec<TransferId>,
    /// Resident hashes evicted under pool pressure, reported to the scheduler.
    reclaimed: VecDeque<Arc<str>>,
    shutting_down: bool,
}

impl<R: RngCore> ReservationBook<R> {
    /// A book over a fresh slab of `pool_bytes`; `rng` mints reservation ids.
    pub fn new(pool_bytes: u64, config: BookConfig, mut rng: R) -> Self {
        let records = HashMap::with_hasher(KeyedHash::from_rng(&mut rng));
        let writers = WriterIndex::with_hasher(KeyedHash::from_rng(&mut rng));
        ReservationBook {
            config,
            rng,
            slab: Slab::new(pool_bytes),
            resident: ResidentPool::default(),
            shapes: ShapeTable::default(),
            records,
            writers,
            tombstones: BTreeMap::new(),
            next_tombstone: 0,
            next_due: NEVER,
            ready: Vec::new(),
            reclaimed: VecDeque::new(),
            shutting_down: false,
        }
    }

    /// Reserve rules 1-8 (ec-behaviour.md §3.3), after the reap every reserve performs.
    pub fn reserve(&mut self, req: &ReserveRequest, now: Instant) -> Result<Reserved, ReserveError> {
        self.reserve_ref(req.as_ref(), now)
    }

    /// [`Self::reserve`] of a borrowed request.
    pub fn reserve_ref(&mut self, req: ReserveRef<'_>, now: Instant) -> Result<Reserved, ReserveError> {
        self.expire(now);
        if self.shutting_down {
            return Err(ReserveError::ShuttingDown);
        }
        let tid = TransferId::new(req.transfer_id);
        if let Some(rec) = self.records.get(&tid) {
            match rec.state {
                State::Cancelled => return Ok(Reserved::Cancelled),
                State::Expired => self.forget(&tid),
                State::ExpirePending => return Err(ReserveError::ActiveWriter(req.transfer_id.to_owned())),
                state => {
                    if !rec.mm_hash.matches(req.mm_hash)
                        || self.shapes.get(rec.shape) != req.shape
                        || rec.dtype != req.dtype
                    {
                        return Err(ReserveError::ConflictingReservation);
                    }
                    if state == State::CancelPending {
                        return Ok(Reserved::Cancelled);
                    }
                    let view = self.view_of(rec);
                    let cached = matches!(rec.dest, Dest::Lease(_));
                    let reservation_id = rec.reservation_id;
                    if state == State::Writing {
                        self.set_deadline(&tid, now + self.config.ttl);
                    }
                    let Some(mut reservation_id) = reservation_id else {
                        return Err(ReserveError::ConflictingReservation);
                    };
                    if !self.config.regressions.dup_push_shares_grant {
                        // A duplicate grant of its own: the push that gets it never
                        // writes, and its abandon must not free the first grant's
                        // destination while that push may still be writing (dup-push).
                        reservation_id = ReservationId::generate(&mut self.rng);
                        if let Some(rec) = self.records.get_mut(&tid) {
                            rec.dups.push(reservation_id);
                        }
                    }
                    return Ok(Reserved::Granted {
                        reservation_id,
                        view: view.unwrap_or(View { region: Region { offset: 0, len: 0 }, nbytes: 0 }),
                        write: false,
                        ready: state == State::Ready,
                        cached,
                    });
                }
            }
        }
        self.reserve_new(tid, req, now)
    }

    /// A `reserve` whose destination cannot be carved ([`super::wire::Unplaceable`]):
    /// the rules that answer before allocation answer as for any reserve (its shape
    /// matches no record, resident copy or writer, since every one of those has a
    /// placeable shape); where a destination would be allocated it fails with `error`,
    /// and nothing is allocated or evicted.
    pub fn reserve_unplaceable(
        &mut self,
        transfer_id: &str,
        mm_hash: &str,
        error: &str,
        now: Instant,
    ) -> Result<Reserved, ReserveError> {
        self.expire(now);
        if self.shutting_down {
            return Err(ReserveError::ShuttingDown);
        }
        let tid = TransferId::new(transfer_id);
        if let Some(rec) = self.records.get(&tid) {
            match rec.state {
                State::Cancelled => return Ok(Reserved::Cancelled),
                State::Expired => self.forget(&tid),
                State::ExpirePending => return Err(ReserveError::ActiveWriter(transfer_id.to_owned())),
                _ => return Err(ReserveError::ConflictingReservation),
            }
        }
        if self.resident.lookup(mm_hash).is_some() {
            return Err(ReserveError::ConflictingCached);
        }
        if self.writer_for(fingerprint_str(mm_hash), mm_hash).is_some() {
            return Err(ReserveError::ConflictingInFlight);
        }
        Err(ReserveError::Unplaceable(error.to_owned()))
    }

    fn new_record(
        &mut self,
        req: ReserveRef<'_>,
        mm_hash: MmHash,
        state: State,
        dest: Dest,
        link: Option<Link>,
        now: Instant,
    ) -> Record {
        let deadline = now + self.config.ttl;
        self.next_due = self.next_due.min(deadline);
        Record {
            mm_hash,
            reservation_id: Some(ReservationId::generate(&mut self.rng)),
            state,
            dtype: req.dtype,
            shape: self.shapes.intern(req.shape),
            nbytes: req.nbytes,
            dest,
            deadline,
            tomb_seq: 0,
            link: link.map(Box::new),
            dups: Vec::new(),
        }
    }

    fn reserve_new(&mut self, tid: TransferId, req: ReserveRef<'_>, now: Instant) -> Result<Reserved, ReserveError> {
        // Rule 6: a resident copy serves the transfer at once.
        if let Some((entry, e)) = self.resident.lookup(req.mm_hash) {
            // A resident copy is compared as a tensor: its element type, not the name.
            if *e.shape != *req.shape || e.dtype.canonical() != req.dtype.canonical() {
                return Err(ReserveError::ConflictingCached);
            }
            let view = e.view;
            self.resident.lease(entry);
            let rec = self.new_record(req, MmHash::new(req.mm_hash), State::Ready, Dest::Lease(entry), None, now);
            let reservation_id = rec.reservation_id.unwrap_or_else(|| ReservationId::generate(&mut self.rng));
            self.records.insert(tid, rec);
            return Ok(Reserved::Granted { reservation_id, view, write: false, ready: true, cached: true });
        }
        // Rule 7: share an in-flight writer's destination.
        let fp = fingerprint_str(req.mm_hash);
        if let Some(writer_tid) = self.writer_for(fp, req.mm_hash) {
            let Some(writer) = self.records.get(&writer_tid) else { return Err(ReserveError::ConflictingInFlight) };
            if self.shapes.get(writer.shape) != req.shape || writer.dtype != req.dtype {
                return Err(ReserveError::ConflictingInFlight);
            }
            let (offset, mm_hash) = match writer.dest {
                Dest::Own(offset) => (offset, writer.mm_hash.clone()),
                _ => return Err(ReserveError::ConflictingInFlight),
            };
            let view = writer.view_at(offset);
            let rec = self.new_record(
                req,
                mm_hash,
                State::Writing,
                Dest::Shared(offset),
                Some(Link::Writer(writer_tid.clone())),
                now,
            );
            let reservation_id = rec.reservation_id.unwrap_or_else(|| ReservationId::generate(&mut self.rng));
            if let Some(writer) = self.records.get_mut(&writer_tid) {
                match writer.link.as_deref_mut() {
                    Some(Link::Followers(f)) => f.push(tid.clone()),
                    _ => writer.link = Some(Box::new(Link::Followers(vec![tid.clone()]))),
                }
            }
            self.records.insert(tid, rec);
            return Ok(Reserved::Granted { reservation_id, view, write: false, ready: false, cached: false });
        }
        // Rule 8: allocate, reaping and then evicting residents under pressure.
        let view = self.allocate(req.nbytes, now).ok_or(ReserveError::PoolFull)?;
        let mm_hash = MmHash::new(req.mm_hash);
        self.writers.insert(fp, tid.clone());
        let rec = self.new_record(req, mm_hash, State::Writing, Dest::Own(view.region.offset), None, now);
        let reservation_id = rec.reservation_id.unwrap_or_else(|| ReservationId::generate(&mut self.rng));
        self.records.insert(tid, rec);
        Ok(Reserved::Granted { reservation_id, view, write: true, ready: false, cached: false })
    }

    /// The WRITING writer of `mm_hash`, if any.
    fn writer_for(&self, fp: u64, mm_hash: &str) -> Option<TransferId> {
        self.writers
            .candidates(fp)
            .iter()
            .find(|t| {
                self.records
                    .get(*t)
                    .is_some_and(|r| r.state == State::Writing && !r.is_follower() && r.mm_hash.matches(mm_hash))
            })
            .cloned()
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
            if self.reclaimed.len() >= RECLAIMED_LIMIT {
                self.reclaimed.pop_front();
            }
            self.reclaimed.push_back(mm_hash);
        }
    }

    /// Complete rules 1-8 (ec-behaviour.md §3.4): `(accepted, became_ready)`.
    pub fn complete(&mut self, transfer_id: &str, reservation_id: &str, now: Instant) -> (bool, bool) {
        let c = self.complete_with(transfer_id, reservation_id, now, |_| {});
        (c.completed, c.became_ready)
    }

    /// [`Self::complete`], handing `on_ready` the status of a record that became READY
    /// (unless followers became READY with it, see [`Completed::followers_ready`]), so its
    /// readiness event is written without a second lookup. A WRITING writer without
    /// followers (the common completion) costs one lookup in the records and one in the
    /// writer index; everything else takes the general rules.
    pub fn complete_with(
        &mut self,
        transfer_id: &str,
        reservation_id: &str,
        now: Instant,
        on_ready: impl FnOnce(&StatusView<'_>),
    ) -> Completed {
        let tid = TransferId::new(transfer_id);
        let ignore_rid = self.config.regressions.s12_complete_ignores_reservation_id;
        let refused = Completed { completed: false, became_ready: false, followers_ready: false };
        let Some(rec) = self.records.get_mut(&tid) else {
            return refused;
        };
        if !rec.rid_matches(reservation_id) && !ignore_rid {
            return refused;
        }
        if rec.state == State::Writing
            && rec.link.as_deref().is_none_or(|l| matches!(l, Link::Followers(f) if f.is_empty()))
        {
            // What `complete_general` does for this case, field by field: unindex the
            // writer, WRITING -> READY, a fresh lease.
            self.writers.remove(rec.mm_hash.fingerprint(), &tid);
            rec.state = State::Ready;
            let deadline = now + self.config.ttl;
            rec.deadline = deadline;
            self.next_due = self.next_due.min(deadline);
            on_ready(&StatusView {
                mm_hash: &rec.mm_hash,
                ready: true,
                reservation_id: rec.reservation_id,
                nbytes: rec.nbytes,
                shape: self.shapes.get(rec.shape),
                dtype: rec.dtype,
            });
            return Completed { completed: true, became_ready: true, followers_ready: false };
        }
        let ready_before = self.ready.len();
        let (completed, became_ready) = self.complete_general(&tid, reservation_id, now);
        let followers_ready = self.ready.len() > ready_before;
        if became_ready && !followers_ready {
            if let Some(view) = self.status_view(&tid) {
                on_ready(&view);
            }
        }
        Completed { completed, became_ready, followers_ready }
    }

    /// Complete rules 1-8 (ec-behaviour.md §3.4), step by step.
    fn complete_general(&mut self, tid: &TransferId, reservation_id: &str, now: Instant) -> (bool, bool) {
        let Some(rec) = self.records.get(tid) else {
            return (false, false);
        };
        if !rec.rid_matches(reservation_id) && !self.config.regressions.s12_complete_ignores_reservation_id {
            return (false, false);
        }
        if rec.state == State::Ready {
            return (true, false);
        }
        if rec.is_follower() {
            return match self.config.follower_completion {
                FollowerCompletion::Reject => (false, false),
                FollowerCompletion::AcceptNoop => (true, false),
            };
        }
        let state = rec.state;
        if state.is_writer_owned() {
            self.unindex_writer(tid);
            self.publish_followers(tid, now);
        }
        if state.is_deferred() {
            let to = if state == State::CancelPending { State::Cancelled } else { State::Expired };
            self.terminate(tid, to, now);
            return (true, false);
        }
        if state != State::Writing {
            return (false, false);
        }
        self.set_state(tid, State::Ready);
        self.set_deadline(tid, now + self.config.ttl);
        (true, true)
    }

    /// Hands a completing writer's destination to its followers through the resident
    /// pool: every one of them (and the writer) gets a lease and the followers turn READY.
    fn publish_followers(&mut self, tid: &TransferId, now: Instant) {
        let Some(writer) = self.records.get_mut(tid) else { return };
        if writer.followers().is_empty() {
            return;
        }
        let Some(view) = writer.owned() else { return };
        let followers = match writer.link.take().map(|l| *l) {
            Some(Link::Followers(f)) => f,
            _ => Vec::new(),
        };
        let (mm_hash, shape, dtype) = (writer.mm_hash.to_arc(), writer.shape, writer.dtype);
        let shape: Box<[u64]> = self.shapes.get(shape).into();
        let (entry, displaced) = self.resident.publish(mm_hash, view, shape, dtype, false);
        if let Some(v) = displaced {
            self.free(v);
        }
        self.resident.lease(entry);
        if let Some(writer) = self.records.get_mut(tid) {
            writer.dest = Dest::Lease(entry);
        }
        for f in followers {
            self.resident.lease(entry);
            self.set_state(&f, State::Ready);
            if let Some(rec) = self.records.get_mut(&f) {
                rec.link = None;
                rec.dest = Dest::Lease(entry);
            }
            self.set_deadline(&f, now + self.config.ttl);
            self.ready.push(f);
        }
    }

    /// Cancel rules 1-9 (ec-behaviour.md §3.5).
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
            if self.config.regressions.s13_no_cancel_tombstone {
                return false;
            }
            // Rule 2: cancel before reserve leaves a tombstone the later reserve will find.
            let shape = self.shapes.intern(&[]);
            self.records.insert(
                tid.clone(),
                Record {
                    mm_hash: MmHash::new(""),
                    reservation_id: None,
                    state: State::Cancelled,
                    dtype: DType::Float16,
                    shape,
                    nbytes: 0,
                    dest: Dest::None,
                    deadline: NEVER,
                    tomb_seq: 0,
                    link: None,
                    dups: Vec::new(),
                },
            );
            self.push_tombstone(&tid, now);
            self.reap_tombstones(now);
            return true;
        };
        let fixed = !self.config.regressions.dup_push_shares_grant;
        if fixed && !reservation_id.is_empty() && rec.is_dup(reservation_id) {
            // A duplicate's grant: releasing it releases nothing the first grant holds.
            if let (Some(rec), Some(id)) = (self.records.get_mut(&tid), ReservationId::parse(reservation_id)) {
                rec.dups.retain(|x| *x != id);
            }
            return true;
        }
        if !reservation_id.is_empty() && !rec.rid_matches(reservation_id) {
            return false;
        }
        let state = rec.state;
        let follower = rec.is_follower();
        if fixed && abandon && !follower && reservation_id.is_empty() && state == State::Writing && !rec.dups.is_empty()
        {
            // An empty-id abandon of a record granted to several pushes may come from a
            // push that holds no writing grant (its reserve failed here): only the
            // writer's completion or its own abandon may free the destination, so this
            // abandon defers the record as a plain cancel does (dup-push). A follower
            // owns no memory: rule 5 below cancels it.
            self.defer(&tid, State::CancelPending, now);
            return true;
        }
        if state == State::Cancelled {
            self.push_tombstone(&tid, now);
            self.reap_tombstones(now);
            return true;
        }
        if refresh {
            if !abandon || !matches!(state, State::Writing | State::ExpirePending) {
                return false;
            }
            if follower && self.config.regressions.s14_follower_refresh_abandons_writer {
                if let Some(writer) = rec.writer().cloned() {
                    // The writer's followers, this one included, are cancelled with it. A
                    // writer already deferred by a plain cancel ends CANCELLED.
                    let to = match self.records.get(&writer).map(|w| w.state) {
                        Some(State::Writing) => {
                            self.set_state(&writer, State::ExpirePending);
                            State::Expired
                        }
                        Some(State::CancelPending) => State::Cancelled,
                        _ => State::Expired,
                    };
                    self.terminate(&writer, to, now);
                    return true;
                }
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
            self.defer(&tid, State::CancelPending, now);
            return true;
        }
        if !state.is_active() {
            return false;
        }
        self.terminate(&tid, State::Cancelled, now);
        true
    }

    /// Expiry (ec-behaviour.md §3.6): READY past its deadline expires, a WRITING follower is
    /// cancelled, a WRITING writer is deferred; then old tombstones go. Returns how many
    /// READY records expired. Before the earliest deadline it costs one comparison.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut expired = 0;
        let grace = self.config.regressions.s11_grace_period_free.is_some();
        if now >= self.next_due {
            let mut due: Vec<TransferId> = self
                .records
                .iter()
                .filter(|(_, r)| r.state.is_active() && r.deadline <= now)
                .map(|(tid, _)| tid.clone())
                .collect();
            due.sort_unstable();
            for tid in due {
                let Some(rec) = self.records.get(&tid) else { continue };
                match (rec.state, rec.is_follower()) {
                    (State::Ready, _) => {
                        self.terminate(&tid, State::Expired, now);
                        expired += 1;
                    }
                    (State::Writing, true) => self.terminate(&tid, State::Cancelled, now),
                    (State::Writing, false) => self.defer(&tid, State::ExpirePending, now),
                    // Only the S11 regression gives deferred records a deadline.
                    (State::CancelPending, _) if grace => self.terminate(&tid, State::Cancelled, now),
                    (State::ExpirePending, _) if grace => self.terminate(&tid, State::Expired, now),
                    _ => {}
                }
            }
            self.next_due =
                self.records.values().filter(|r| r.state.is_active()).map(|r| r.deadline).min().unwrap_or(NEVER);
        }
        self.reap_tombstones(now);
        expired
    }

    /// The status object of an active reservation.
    pub fn status(&self, transfer_id: &str) -> Option<Status> {
        self.status_view(&TransferId::new(transfer_id)).map(|v| v.to_status())
    }

    /// The status of an active reservation, borrowed.
    pub fn status_view(&self, tid: &TransferId) -> Option<StatusView<'_>> {
        let rec = self.records.get(tid)?;
        if !rec.state.is_active() {
            return None;
        }
        Some(StatusView {
            mm_hash: &rec.mm_hash,
            ready: rec.state == State::Ready,
            reservation_id: rec.reservation_id,
            nbytes: rec.nbytes,
            shape: self.shapes.get(rec.shape),
            dtype: rec.dtype,
        })
    }

    /// Followers published READY since the last call, in publication order.
    pub fn drain_ready(&mut self) -> Vec<String> {
        std::mem::take(&mut self.ready).into_iter().map(|t| t.to_string()).collect()
    }

    /// Resident hashes evicted under pool pressure since the last call (at most the
    /// newest [`RECLAIMED_LIMIT`]).
    pub fn drain_reclaimed(&mut self) -> Vec<String> {
        std::mem::take(&mut self.reclaimed).into_iter().map(|h| h.to_string()).collect()
    }

    /// Hands a READY tensor to the model: the record goes (no tombstone) and its memory
    /// becomes a pinned resident entry, or its lease becomes the pin.
    pub fn take(&mut self, transfer_id: &str, mm_hash: &str) -> Result<Taken, TakeError> {
        let tid = TransferId::new(transfer_id);
        let not_ready = || TakeError { mm_hash: mm_hash.to_string() };
        let rec = self.records.get(&tid).ok_or_else(not_ready)?;
        if rec.state != State::Ready
            || !rec.mm_hash.matches(mm_hash)
            || matches!(rec.dest, Dest::None | Dest::Shared(_))
        {
            return Err(not_ready());
        }
        let rec = self.records.remove(&tid).ok_or_else(not_ready)?;
        let shape: Box<[u64]> = self.shapes.get(rec.shape).into();
        self.shapes.release(rec.shape);
        let view = match rec.dest {
            Dest::Lease(entry) => {
                let view = self.resident.get(entry).map(|e| e.view);
                self.resident.pin_from_lease(entry);
                view.ok_or_else(not_ready)?
            }
            Dest::Own(offset) => {
                let view = rec.view_at(offset);
                let (_, displaced) = self.resident.publish(rec.mm_hash.to_arc(), view, shape.clone(), rec.dtype, true);
                if let Some(v) = displaced {
                    self.free(v);
                }
                view
            }
            Dest::None | Dest::Shared(_) => return Err(not_ready()),
        };
        Ok(Taken { view, shape, dtype: rec.dtype })
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
        let mut ids: Vec<TransferId> = self.records.keys().cloned().collect();
        ids.sort_unstable();
        for tid in &ids {
            if let Some(rec) = self.records.get(tid) {
                if rec.state == State::Ready || (rec.state == State::Writing && rec.is_follower()) {
                    self.terminate(tid, State::Cancelled, now);
                }
            }
        }
        for tid in &ids {
            if self.records.get(tid).is_some_and(|r| r.state == State::Writing) {
                self.defer(tid, State::CancelPending, now);
            }
        }
    }

    /// What the book holds, as the drivers' `stats` report it.
    pub fn census(&self) -> Census {
        let tombstones = self.tombstone_count();
        Census { live: self.len() - tombstones, tombstones, writer_owned: self.writer_owned_count() }
    }

    /// Records a remote writer may still write into; shutdown waits for zero.
    pub fn writer_owned_count(&self) -> usize {
        self.records.values().filter(|r| r.state.is_writer_owned()).count()
    }

    /// The state of a transfer's record, if one is kept.
    pub fn state_of(&self, transfer_id: &str) -> Option<State> {
        self.records.get(&TransferId::new(transfer_id)).map(|r| r.state)
    }

    /// When a transfer's record times out (WRITING or READY) or its tombstone goes.
    pub fn deadline_of(&self, transfer_id: &str) -> Option<Instant> {
        self.records.get(&TransferId::new(transfer_id)).map(|r| r.deadline)
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

    /// Tombstones made so far, refreshes included: one the count bound evicted has at
    /// least `tombstone_limit` made after it.
    pub fn tombstones_made(&self) -> u64 {
        self.next_tombstone
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
        self.sorted_records()
            .into_iter()
            .map(|(_, r)| r)
            .filter(|r| r.state.is_writer_owned() && !r.is_follower())
            .filter_map(|r| r.owned().map(|v| v.region))
            .collect()
    }

    /// Every record in transfer id order: how every walk that can reach an output sees them.
    fn sorted_records(&self) -> Vec<(&TransferId, &Record)> {
        let mut all: Vec<(&TransferId, &Record)> = self.records.iter().collect();
        all.sort_unstable_by(|a, b| a.0.cmp(b.0));
        all
    }

    /// Every region handed out, in address order: writers' own regions and resident
    /// entries. Equal to what the slab has handed out (see [`Self::check_invariants`]).
    pub fn allocations(&self) -> Vec<Region> {
        // Empty tensors own no memory.
        let mut owned: Vec<Region> = self.records.values().filter_map(|r| r.owned().map(|v| v.region)).collect();
        owned.extend(self.resident.entries().map(|(_, e)| e.view.region));
        owned.retain(|r| r.len > 0);
        owned.sort();
        owned
    }

    fn view_of(&self, rec: &Record) -> Option<View> {
        match rec.dest {
            Dest::Lease(entry) => self.resident.get(entry).map(|e| e.view),
            Dest::Own(offset) | Dest::Shared(offset) => Some(rec.view_at(offset)),
            Dest::None => None,
        }
    }

    fn set_deadline(&mut self, tid: &TransferId, deadline: Instant) {
        if let Some(rec) = self.records.get_mut(tid) {
            rec.deadline = deadline;
            self.next_due = self.next_due.min(deadline);
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

    /// Move to a deferred state: no timeout can release it any more (unless the S11
    /// regression gives it a grace period).
    fn defer(&mut self, tid: &TransferId, to: State, now: Instant) {
        self.set_state(tid, to);
        self.unindex_writer(tid);
        let deadline = match self.config.regressions.s11_grace_period_free {
            Some(grace) => now + grace,
            None => NEVER,
        };
        if let Some(rec) = self.records.get_mut(tid) {
            rec.deadline = deadline;
        }
        self.next_due = self.next_due.min(deadline);
    }

    /// Move to a terminal state, release memory (a writer also cancels its followers) and
    /// start the tombstone.
    fn terminate(&mut self, tid: &TransferId, to: State, now: Instant) {
        self.set_state(tid, to);
        self.unindex_writer(tid);
        let Some(rec) = self.records.get_mut(tid) else { return };
        let dest = std::mem::replace(&mut rec.dest, Dest::None);
        let link = rec.link.take().map(|l| *l);
        let nbytes = rec.nbytes;
        match link {
            // A follower never owns memory: it only unlinks.
            Some(Link::Writer(w)) => {
                if let Some(Link::Followers(f)) = self.records.get_mut(&w).and_then(|wr| wr.link.as_deref_mut()) {
                    f.retain(|x| x != tid);
                }
            }
            other => {
                match dest {
                    Dest::Own(offset) => {
                        let len = aligned_size(nbytes).unwrap_or(0);
                        self.free(View { region: Region { offset, len }, nbytes });
                    }
                    Dest::Lease(entry) => {
                        if let Some(v) = self.resident.release(entry) {
                            self.free(v);
                        }
                    }
                    Dest::None | Dest::Shared(_) => {}
                }
                if let Some(Link::Followers(followers)) = other {
                    for f in followers {
                        if let Some(fr) = self.records.get_mut(&f) {
                            fr.link = None;
                            fr.dest = Dest::None;
                        }
                        self.terminate(&f, State::Cancelled, now);
                    }
                }
            }
        }
        self.push_tombstone(tid, now);
        self.reap_tombstones(now);
    }

    fn unindex_writer(&mut self, tid: &TransferId) {
        if let Some(rec) = self.records.get(tid) {
            self.writers.remove(rec.mm_hash.fingerprint(), tid);
        }
    }

    /// Appends (or moves) a terminal record to the newest end of the tombstone order.
    fn push_tombstone(&mut self, tid: &TransferId, now: Instant) {
        let seq = self.next_tombstone;
        self.next_tombstone += 1;
        let deadline = now + self.config.ttl;
        if let Some(rec) = self.records.get_mut(tid) {
            if self.tombstones.get(&rec.tomb_seq) == Some(tid) {
                self.tombstones.remove(&rec.tomb_seq);
            }
            rec.tomb_seq = seq;
            rec.deadline = deadline;
            self.tombstones.insert(seq, tid.clone());
        }
    }

    /// Drops tombstones from the oldest while they are past their deadline or too many.
    fn reap_tombstones(&mut self, now: Instant) {
        while let Some((&seq, tid)) = self.tombstones.first_key_value() {
            let deadline = self.records.get(tid).map(|r| r.deadline);
            let over = self.tombstones.len() > self.config.tombstone_limit;
            if !over && deadline.is_some_and(|d| d > now) {
                break;
            }
            let tid = tid.clone();
            self.tombstones.remove(&seq);
            self.remove_record(&tid);
        }
    }

    /// Removes a terminal record and its tombstone (an EXPIRED record replaced by a new
    /// reservation of the same transfer).
    fn forget(&mut self, tid: &TransferId) {
        if let Some(rec) = self.records.get(tid) {
            if self.tombstones.get(&rec.tomb_seq) == Some(tid) {
                self.tombstones.remove(&rec.tomb_seq);
            }
        }
        self.remove_record(tid);
    }

    fn remove_record(&mut self, tid: &TransferId) {
        if let Some(rec) = self.records.remove(tid) {
            self.shapes.release(rec.shape);
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
        let owned = self.allocations();
        let mut total = 0;
        for (i, r) in owned.iter().enumerate() {
            if i > 0 && owned[i - 1].end() > r.offset {
                return Err(format!("regions {:?} and {r:?} overlap", owned[i - 1]));
            }
            if !self.slab.is_allocated(*r) {
                return Err(format!("owned region {r:?} is free in the slab"));
            }
            total += r.len;
        }
        if total != self.slab.used_bytes() {
            return Err(format!("owned regions cover {total} bytes, the slab handed out {}", self.slab.used_bytes()));
        }
        /// What the records hold, counted in the one walk over them.
        #[derive(Default)]
        struct Tally {
            shape_refs: BTreeMap<ShapeId, u32>,
            leases: BTreeMap<EntryId, u32>,
            census: Census,
        }
        // Each record, counted as it is checked. Walked in hash order, which is fast; a
        // failure is looked for again in transfer id order, so the record an error names
        // is the same on every run.
        let check_records = |records: Vec<(&TransferId, &Record)>| -> Result<Tally, String> {
            let mut tally = Tally::default();
            for (tid, r) in records {
                *tally.shape_refs.entry(r.shape).or_default() += 1;
                if let Dest::Lease(e) = r.dest {
                    *tally.leases.entry(e).or_default() += 1;
                }
                // The census the drivers report, counted record by record.
                if r.state.is_terminal() {
                    tally.census.tombstones += 1;
                } else {
                    tally.census.live += 1;
                }
                if r.state.is_writer_owned() {
                    tally.census.writer_owned += 1;
                }
                if r.state.is_writer_owned() && !r.is_follower() && r.owned().is_none() {
                    return Err(format!("writer-owned writer {tid:?} ({}) lost its destination", r.state));
                }
                let listed = self.tombstones.get(&r.tomb_seq) == Some(tid);
                if r.state.is_terminal() != listed {
                    return Err(format!("{tid:?} in {} tombstone listing {listed}", r.state));
                }
                if r.state.is_terminal() && (r.dest != Dest::None || r.link.is_some()) {
                    return Err(format!("terminal {tid:?} still holds memory or links"));
                }
                let never = r.state.is_deferred() && self.config.regressions.s11_grace_period_free.is_none();
                if r.state.is_active() && never != (r.deadline == NEVER) {
                    return Err(format!("{tid:?} in {} has deadline {}", r.state, r.deadline));
                }
                if r.state.is_active() && r.deadline < self.next_due {
                    return Err(format!("{tid:?} is due at {} before next_due {}", r.deadline, self.next_due));
                }
                if let Some(w) = r.writer() {
                    let writer =
                        self.records.get(w).ok_or_else(|| format!("follower {tid:?} of missing writer {w:?}"))?;
                    let shares = matches!((r.dest, writer.dest), (Dest::Shared(a), Dest::Own(b)) if a == b);
                    if !writer.followers().contains(tid) || !shares || r.state != State::Writing {
                        return Err(format!("follower {tid:?} is not linked to writer {w:?}"));
                    }
                } else if matches!(r.dest, Dest::Shared(_)) {
                    return Err(format!("{tid:?} shares a destination without a writer"));
                }
                for f in r.followers() {
                    if self.records.get(f).and_then(|fr| fr.writer()) != Some(tid) {
                        return Err(format!("writer {tid:?} lists {f:?} which does not follow it"));
                    }
                }
            }
            Ok(tally)
        };
        let Tally { shape_refs, leases, census: counted } = match check_records(self.records.iter().collect()) {
            Ok(tally) => tally,
            Err(_) => check_records(self.sorted_records())?,
        };
        for (id, refs) in self.shapes.iter() {
            if shape_refs.get(&id).copied().unwrap_or(0) != refs {
                return Err(format!("shape {id} counts {refs} references, records hold {:?}", shape_refs.get(&id)));
            }
        }
        for (id, e) in self.resident.entries() {
            if leases.get(&id).copied().unwrap_or(0) != e.leases {
                return Err(format!(
                    "resident entry {id} counts {} leases, records hold {:?}",
                    e.leases,
                    leases.get(&id)
                ));
            }
        }
        if self.census() != counted {
            return Err(format!("census {:?}, the records hold {counted:?}", self.census()));
        }
        if self.tombstones.len() > self.config.tombstone_limit {
            return Err(format!("{} tombstones over the limit {}", self.tombstones.len(), self.config.tombstone_limit));
        }
        // Every terminal record is listed at its own place (checked above), so the listing
        // can hold a stale place only when it is longer than the terminal records.
        if self.tombstones.len() != counted.tombstones {
            for (seq, tid) in &self.tombstones {
                if self.records.get(tid).is_none_or(|r| r.tomb_seq != *seq || !r.state.is_terminal()) {
                    return Err(format!("tombstone {seq} -> {tid:?} is stale"));
                }
            }
        }
        for (fp, tid) in self.writers.sorted() {
            match self.records.get(tid) {
                Some(r) if r.state == State::Writing && !r.is_follower() && r.mm_hash.fingerprint() == fp => {}
                _ => return Err(format!("writer index {fp:x} -> {tid:?} is stale")),
            }
        }
        Ok(())
    }
}
