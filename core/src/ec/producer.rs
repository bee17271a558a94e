//! `PushCoordinator`: the push side of one EC producer worker as a sans-IO machine.
//!
//! A push batch (the items one producer request sends to one consumer replica) goes
//! through the reference worker's steps (ec-behaviour.md §1.3, §2.3, §4, races S8-S20):
//!
//! 1. **Discover** the consumer's TP shards with `peers` (cached on success, tried
//!    [`DISCOVERY_ATTEMPTS`] times). An unconfirmed topology fails every item and sends no
//!    reserve or cancel anywhere (S8).
//! 2. **Reserve** a destination on every shard (`reserve` for one item, `reserve_batch`
//!    for several). An item that any shard refused fails with that shard's error, and
//!    cleanup abandons it on every shard that granted it, and with the empty id on every
//!    shard whose answer is unknown, so a reserve the server ran after the producer gave up
//!    is still freed (S10, S16). A shard that answered with a refusal holds nothing of the
//!    push and gets no abandon: another push of the same id may be writing there
//!    (ec-dup-push). An item a shard reports `cancelled` is skipped and its writer grants
//!    abandoned (S13).
//! 3. Wait for the **source** (the encoder output) if the batch was reserved early. If it
//!    arrives [`RESERVATION_REFRESH`] or more after the reservation, every stale shard is
//!    `cancel(abandon, refresh)`ed and the item re-reserved with new ids, because the
//!    consumer's TTL may have deferred the old writer (S12).
//! 4. **Write** every `write: true` grant, then `complete_batch` per shard. Gen A: one
//!    rejected completion fails the batch and every reservation of the batch is abandoned
//!    (S15, S17); a failed write does the same (S19).
//!
//! The batch is reported done only when none of its requests or writes is outstanding
//! (S17, S18): the driver may release the source as soon as it sees
//! [`PushEvent::BatchDone`], so no write can still be reading it.
//!
//! The driver sends each [`Transmit::Request`] with its control client and answers with
//! [`PushCoordinator::handle_reply`] (`Err` = [`ReplyError::Refused`] for an `ok: false`
//! reply, [`ReplyError::Unanswered`] for a timeout, transport failure or unreadable reply), and performs each [`Transmit::Write`] through its
//! [`super::dataplane::DataPlane`], answering with [`PushCoordinator::handle_write`]. The
//! coordinator keeps no timers: request timeouts are the control client's (ec-behaviour.md §5), and
//! the refresh decision uses the `now` of the input that makes the batch writable.

use super::pyjson::{to_str, truthy};
use super::request_slot::ReplyError;
use super::requests::ReserveFields;
use super::reserve_outcome::{ReserveGrant, ReserveOutcome};
use super::topology::{peers_request, TopologyCache, TopologyError, DISCOVERY_ATTEMPTS};
use crate::time::Instant;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;
use thiserror::Error;

/// `_RESERVATION_REFRESH_SECONDS`: reservations this old are refreshed before writing.
pub const RESERVATION_REFRESH: Duration = Duration::from_secs(150);
/// `_CANCEL_ATTEMPTS`: a cleanup, orphan or refresh cancel is retried once.
pub const CANCEL_ATTEMPTS: u32 = 2;

/// The error of a `reserve_batch` reply whose item count differs from the request's.
pub const MALFORMED_RESERVE_BATCH: &str = "Malformed EC reservation batch response";
/// The error of a `reserve` result that is not a reservation.
pub use super::reserve_outcome::MALFORMED_RESERVE;
/// The error of a `complete_batch` reply whose item count differs from the request's.
pub const MALFORMED_COMPLETE_BATCH: &str = "Malformed EC completion batch response";

/// Tunables of a [`PushCoordinator`].
#[derive(Clone, Debug)]
pub struct PushConfig {
    /// Gen B (PR #58123): a rejected completion is logged ("rejected", with the mm_hash)
    /// and fails only its own item; the rest of the batch completes (S15). Gen A (default)
    /// fails the whole batch and abandons all of its reservations.
    pub gen_b_completion: bool,
    /// Age at which reservations are refreshed before the first write.
    pub reservation_refresh: Duration,
    /// `peers` attempts before a batch fails on an unconfirmed topology.
    pub discovery_attempts: u32,
    /// Attempts of every cancel the producer sends.
    pub cancel_attempts: u32,
    /// Control requests in flight to one shard address at once. One matches a driver
    /// that keeps a single REQ socket per address (REQ is lockstep); further requests
    /// wait in order.
    pub max_requests_per_shard: usize,
    /// Historical behaviours for the race catalogue, all off.
    pub regressions: PushRegressions,
}

/// Historical behaviours of the push coordinator, each restoring one race of the
/// catalogue (`docs/races.md`). All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PushRegressions {
    /// EC S8: when the first `peers` exchange fails, push to the base address alone (the
    /// removed "one-attempt data-plane fallback"), so only rank 0 of a TP>1 consumer is
    /// reserved, written and completed. The fallback is not cached.
    pub s8_base_fallback: bool,
    /// EC S10: a failed item is abandoned only where a reservation was granted; the shard
    /// whose reserve failed (timed out) gets no empty-id abandon, so a reserve it runs
    /// after the producer gave up keeps its destination.
    pub s10_no_compensating_cancel: bool,
    /// EC S12: reservations are never refreshed, however old: the write goes to whatever
    /// the consumer's TTL left of them.
    pub s12_no_refresh: bool,
    /// EC S16: a failed item's grants on the shards that accepted it are not abandoned.
    pub s16_failed_item_keeps_grants: bool,
    /// EC S17: the first failed `complete_batch` fails the batch at once: the abandons of
    /// its reservations go out while other shards' completions are still in flight, and
    /// those completions' replies are ignored.
    pub s17_abandon_before_settle: bool,
    /// EC S20: a batch orphaned before its source arrived (its producer request finished,
    /// or the worker shut down) skips its items without abandoning what they were granted,
    /// so those reservations stay WRITING until the consumer's TTL defers them for good.
    pub s20_orphan_keeps_grants: bool,
    /// ec-dup-push: a shard that refused an item's reserve still gets the empty-id abandon
    /// (the reference's compensation), which frees what another push of the same transfer
    /// id holds there.
    pub dup_push_abandons_refused: bool,
}

impl Default for PushConfig {
    fn default() -> Self {
        PushConfig {
            gen_b_completion: false,
            reservation_refresh: RESERVATION_REFRESH,
            discovery_attempts: DISCOVERY_ATTEMPTS,
            cancel_attempts: CANCEL_ATTEMPTS,
            max_requests_per_shard: 1,
            regressions: PushRegressions::default(),
        }
    }
}

/// One encoder output to push (an `ECMooncakePushSpec`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushItem {
    pub transfer_id: String,
    pub mm_hash: String,
    /// Exact tensor bytes, `prod(shape) * itemsize(dtype)`.
    pub nbytes: u64,
    pub shape: Vec<u64>,
    /// Bare torch dtype name (`"float16"`).
    pub dtype: String,
}

/// The items one producer request pushes to one consumer replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushBatch {
    /// The consumer's base address (rank 0's control address, `consumer_zmq`).
    pub consumer: String,
    pub items: Vec<PushItem>,
    /// The encoder output is already there. `false` reserves early; writes then wait for
    /// [`PushCoordinator::bind_source`].
    pub source_ready: bool,
}

impl PushBatch {
    /// A batch whose source is ready.
    pub fn new(consumer: impl Into<String>, items: Vec<PushItem>) -> Self {
        PushBatch { consumer: consumer.into(), items, source_ready: true }
    }

    /// The same batch, reserved before its source exists.
    pub fn awaiting_source(mut self) -> Self {
        self.source_ready = false;
        self
    }
}

/// Names one push batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BatchId(u64);

impl BatchId {
    /// The raw number (unique per coordinator).
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for BatchId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "batch#{}", self.0)
    }
}

pub use super::token::Token;

/// Which item's source bytes a write copies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ItemRef {
    pub batch: BatchId,
    /// Index into the batch's `items`.
    pub index: usize,
}

/// Something the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transmit {
    /// Send `frame` to the control server at `addr` for `batch`; answer with
    /// [`PushCoordinator::handle_reply`].
    Request { token: Token, batch: BatchId, addr: String, frame: Vec<u8> },
    /// Write the first `nbytes` of `item`'s source to `dst_ptr` in `session`; answer with
    /// [`PushCoordinator::handle_write`].
    Write { token: Token, session: String, dst_ptr: u64, nbytes: u64, item: ItemRef },
}

/// Why an item was not written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// A shard answered `cancelled: true`: the consumer cancelled the transfer first.
    ConsumerCancelled,
    /// Every shard answered `write: false` (a duplicate, a follower of an in-flight
    /// writer, or a cache hit): someone else's write or a resident copy serves it.
    NotWriter,
    /// The producer request finished before the source was bound; its reservations were
    /// abandoned (S20).
    Unbound,
}

/// How one item of a batch ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ItemOutcome {
    /// Written to every shard that asked for it and completed.
    Pushed,
    /// Nothing was written, by design.
    Skipped { reason: SkipReason },
    /// The push failed; the consumer waits for it in vain until its push-wait timeout.
    Failed { error: String },
}

/// What the coordinator reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PushEvent {
    /// Nothing of the batch is outstanding any more; `outcomes` follows `items`.
    BatchDone { batch: BatchId, outcomes: Vec<ItemOutcome> },
}

/// A misuse of the coordinator's inputs.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PushError {
    #[error("no unfinished push batch {0}")]
    UnknownBatch(BatchId),
    #[error("push batch {0} already has its source")]
    AlreadyBound(BatchId),
    #[error("push batch {0} was orphaned before its source arrived")]
    Orphaned(BatchId),
}

// ---------------------------------------------------------------------------------------
// Frames (Python `json.dumps` style, keys in the reference's order)

impl PushItem {
    /// The item's wire fields.
    pub fn fields(&self) -> ReserveFields<'_> {
        ReserveFields {
            transfer_id: &self.transfer_id,
            mm_hash: &self.mm_hash,
            nbytes: self.nbytes,
            shape: &self.shape,
            dtype: &self.dtype,
        }
    }
}

/// `{"op": "reserve", "transfer_id": .., "mm_hash": .., "nbytes": .., "shape": .., "dtype": ..}`.
pub fn reserve_request(item: &PushItem) -> Vec<u8> {
    let mut out = Vec::new();
    super::requests::write_reserve_fields(&mut out, &item.fields());
    out
}

/// `{"op": "reserve_batch", "items": [<reserve payload without "op">, ...]}`.
pub fn reserve_batch_request<'a>(items: impl IntoIterator<Item = &'a PushItem>) -> Vec<u8> {
    super::requests::reserve_batch_fields(items.into_iter().map(PushItem::fields))
}

/// `{"op": "complete_batch", "items": [{"transfer_id": .., "reservation_id": ..}, ...]}`.
pub fn complete_batch_request<'a>(items: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<u8> {
    super::requests::complete_batch(items)
}

/// `{"op": "cancel", "transfer_id": .., "reservation_id": ..}` plus `abandon`/`refresh`
/// only when true: 0.33's `make_cancel_request` (the encoder of [`super::requests`]).
pub use super::requests::make_cancel_request;

// ---------------------------------------------------------------------------------------
// Reply parsing

/// What the producer knows about one item on one shard.
#[derive(Clone, Debug, PartialEq, Eq)]
enum ShardSlot {
    /// Reserve not answered yet.
    Pending,
    Granted(ReserveGrant),
    /// The consumer cancelled the transfer first (`cancelled: true`).
    Cancelled,
    /// The reserve failed with this error, and the shard may still have run it.
    Failed(String),
    /// The shard answered the reserve with this refusal: this push holds nothing there.
    Refused(String),
    /// The producer cancelled what it held here (refreshed or cleaned up).
    Released,
}

/// One `reserve` result, checked against what was asked (the one reader,
/// [`ReserveOutcome`], with the size rule of [`ReserveOutcome::checked`]).
fn parse_reserve(result: &Value, item: &PushItem) -> ShardSlot {
    match ReserveOutcome::from_result(result).and_then(|o| o.checked(item.nbytes, &item.mm_hash)) {
        Ok(ReserveOutcome::Granted(grant)) => ShardSlot::Granted(grant),
        Ok(ReserveOutcome::Cancelled) => ShardSlot::Cancelled,
        Err(error) => ShardSlot::Failed(error),
    }
}

/// The per-item entries of a batch op's `{"items": [...]}` result, if it has `expected`.
fn batch_entries(result: &Value, expected: usize) -> Option<&[Value]> {
    match result.get("items") {
        Some(Value::Array(items)) if items.len() == expected => Some(items),
        _ => None,
    }
}

/// A `reserve_batch` entry: `{"ok": true, "result": ..}` or `{"ok": false, "error": ..}`.
fn parse_reserve_entry(entry: &Value, item: &PushItem) -> ShardSlot {
    if entry.get("ok").is_some_and(truthy) {
        return parse_reserve(entry.get("result").unwrap_or(&Value::Null), item);
    }
    ShardSlot::Refused(match entry.get("error") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "EC control request failed".into(),
        Some(other) => to_str(other),
    })
}

// ---------------------------------------------------------------------------------------
// Batch state

#[derive(Clone, Debug)]
struct ItemEntry {
    spec: PushItem,
    shards: Vec<ShardSlot>,
    /// `None` while the item is still on its way.
    outcome: Option<ItemOutcome>,
}

impl ItemEntry {
    fn live(&self) -> bool {
        self.outcome.is_none()
    }

    fn writes(&self) -> bool {
        self.shards.iter().any(|s| matches!(s, ShardSlot::Granted(g) if g.write))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Start,
    Discovering,
    Reserving,
    AwaitingSource,
    Refreshing,
    Writing,
    Completing,
    /// The batch failed: its reservations are being abandoned.
    Abandoning,
    /// Every item has its outcome; only cleanup cancels may be outstanding.
    Finished,
}

/// Why a cancel is sent, which decides what its permanent failure means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Purpose {
    /// Releasing what a failed, skipped or orphaned item held.
    Cleanup,
    /// `abandon + refresh` of a stale reservation before re-reserving.
    Refresh,
    /// Abandoning the reservations of a failed batch.
    Abandon,
}

#[derive(Clone, Debug)]
struct CancelOp {
    shard: usize,
    item: usize,
    reservation_id: String,
    purpose: Purpose,
    attempt: u32,
}

#[derive(Clone, Debug)]
enum OpKind {
    Peers { attempt: u32 },
    Reserve { shard: usize, items: Vec<usize>, single: bool },
    Cancel(CancelOp),
    Complete { shard: usize, items: Vec<usize> },
    Write { shard: usize, item: usize },
}

impl OpKind {
    /// Cleanup cancels do not hold the batch's phase back, only its completion.
    fn is_cleanup(&self) -> bool {
        matches!(self, OpKind::Cancel(CancelOp { purpose: Purpose::Cleanup, .. }))
    }
}

/// An operation a batch wants performed, before it gets a token.
#[derive(Clone, Debug)]
struct NewOp {
    kind: OpKind,
    what: NewTransmit,
}

#[derive(Clone, Debug)]
enum NewTransmit {
    Request { addr: String, frame: Vec<u8> },
    Write { session: String, dst_ptr: u64, nbytes: u64, index: usize },
}

#[derive(Debug)]
struct Batch {
    consumer: String,
    items: Vec<ItemEntry>,
    shards: Vec<String>,
    /// When the source was bound (`None`: not yet).
    source: Option<Instant>,
    orphaned: bool,
    /// When the current reservations were requested (the consumer's TTL starts later).
    reserved_at: Instant,
    phase: Phase,
    /// Outstanding operations the current phase waits for.
    phase_ops: usize,
    /// Outstanding cleanup cancels (the batch waits for them before it is done).
    cleanup_ops: usize,
    /// Items whose stale shards are being refreshed.
    refreshing: BTreeSet<usize>,
    /// Failed writes by (item, shard).
    write_errors: BTreeMap<(usize, usize), String>,
    /// `complete_batch` answers by shard: the items asked and the reply.
    completions: BTreeMap<usize, (Vec<usize>, Result<Value, String>)>,
    /// Operations decided but not yet handed to the coordinator.
    out: Vec<NewOp>,
}

impl Batch {
    fn request(&mut self, kind: OpKind, addr: String, frame: Vec<u8>) {
        self.count(&kind);
        self.out.push(NewOp { kind, what: NewTransmit::Request { addr, frame } });
    }

    fn count(&mut self, kind: &OpKind) {
        if kind.is_cleanup() {
            self.cleanup_ops += 1;
        } else {
            self.phase_ops += 1;
        }
    }

    fn settle(&mut self, kind: &OpKind) {
        let counter = if kind.is_cleanup() { &mut self.cleanup_ops } else { &mut self.phase_ops };
        *counter = counter.saturating_sub(1);
    }

    fn cancel(&mut self, item: usize, shard: usize, reservation_id: String, purpose: Purpose, attempt: u32) {
        let Some(addr) = self.shards.get(shard).cloned() else { return };
        let Some(entry) = self.items.get(item) else { return };
        let frame = make_cancel_request(&entry.spec.transfer_id, &reservation_id, true, purpose == Purpose::Refresh);
        let op = CancelOp { shard, item, reservation_id, purpose, attempt };
        self.request(OpKind::Cancel(op), addr, frame);
    }

    fn queue_peers(&mut self, attempt: u32) {
        self.phase = Phase::Discovering;
        let addr = self.consumer.clone();
        self.request(OpKind::Peers { attempt }, addr, peers_request());
    }

    fn resolve(&mut self, item: usize, outcome: ItemOutcome) {
        if let Some(entry) = self.items.get_mut(item) {
            if entry.outcome.is_none() {
                entry.outcome = Some(outcome);
            }
        }
    }

    fn live_items(&self) -> Vec<usize> {
        (0..self.items.len()).filter(|&i| self.items[i].live()).collect()
    }

    /// Reserves `items` on every shard: `reserve` for one, `reserve_batch` for several.
    fn begin_reserve(&mut self, items: Vec<usize>, now: Instant) {
        let shard_count = self.shards.len();
        for &i in &items {
            self.items[i].shards = vec![ShardSlot::Pending; shard_count];
        }
        self.reserved_at = now;
        self.phase = Phase::Reserving;
        for shard in 0..shard_count {
            let frame = match items.as_slice() {
                [one] => reserve_request(&self.items[*one].spec),
                many => reserve_batch_request(many.iter().map(|&i| &self.items[i].spec)),
            };
            let addr = self.shards[shard].clone();
            self.request(OpKind::Reserve { shard, single: items.len() == 1, items: items.clone() }, addr, frame);
        }
    }

    /// All reserve answers are in: fail, skip or keep each item (S10, S13, S16).
    fn judge_reservations(&mut self, regressions: &PushRegressions) {
        for i in self.live_items() {
            let slots = self.items[i].shards.clone();
            let failed = slots.iter().find_map(|s| match s {
                ShardSlot::Failed(e) | ShardSlot::Refused(e) => Some(e.clone()),
                ShardSlot::Pending => Some("EC reservation was not answered".to_string()),
                _ => None,
            });
            if let Some(error) = failed {
                tracing::warn!(
                    transfer_id = %self.items[i].spec.transfer_id,
                    mm_hash = %self.items[i].spec.mm_hash,
                    consumer = %self.consumer,
                    %error,
                    "EC reservation failed; abandoning the item on every shard"
                );
                self.resolve(i, ItemOutcome::Failed { error });
                // Every shard, with the empty id where nothing was granted: the shard may
                // still run a reserve whose reply was lost (S10). Not a shard that refused:
                // it holds nothing of this push, and another push of the same transfer id
                // may be writing there (ec-dup-push).
                for (shard, slot) in slots.iter().enumerate() {
                    let rid = match slot {
                        ShardSlot::Granted(_) if regressions.s16_failed_item_keeps_grants => continue,
                        ShardSlot::Granted(g) => g.reservation_id.clone(),
                        ShardSlot::Released => continue,
                        ShardSlot::Refused(_) if !regressions.dup_push_abandons_refused => continue,
                        _ if regressions.s10_no_compensating_cancel => continue,
                        _ => String::new(),
                    };
                    self.cancel(i, shard, rid, Purpose::Cleanup, 1);
                }
            } else if slots.contains(&ShardSlot::Cancelled) {
                tracing::debug!(
                    transfer_id = %self.items[i].spec.transfer_id,
                    "EC consumer cancelled the transfer before it was reserved; skipping the write"
                );
                self.resolve(i, ItemOutcome::Skipped { reason: SkipReason::ConsumerCancelled });
                for (shard, slot) in slots.iter().enumerate() {
                    if let ShardSlot::Granted(g) = slot {
                        if g.write {
                            self.cancel(i, shard, g.reservation_id.clone(), Purpose::Cleanup, 1);
                        }
                    }
                }
            }
        }
    }

    /// The source is bound and the reservations settled: refresh stale ones or write.
    fn refresh_or_write(&mut self, config: &PushConfig, now: Instant) {
        if !config.regressions.s12_no_refresh
            && now.saturating_duration_since(self.reserved_at) >= config.reservation_refresh
        {
            for i in self.live_items() {
                let stale: Vec<(usize, String)> = self.items[i]
                    .shards
                    .iter()
                    .enumerate()
                    .filter_map(|(shard, slot)| match slot {
                        ShardSlot::Granted(g) if !g.ready && !g.cached => Some((shard, g.reservation_id.clone())),
                        _ => None,
                    })
                    .collect();
                if stale.is_empty() {
                    continue;
                }
                self.refreshing.insert(i);
                for (shard, rid) in stale {
                    self.cancel(i, shard, rid, Purpose::Refresh, 1);
                }
            }
            if !self.refreshing.is_empty() {
                tracing::debug!(
                    consumer = %self.consumer,
                    items = self.refreshing.len(),
                    age_s = now.saturating_duration_since(self.reserved_at).as_secs(),
                    "refreshing stale EC reservations before writing"
                );
                self.phase = Phase::Refreshing;
                return;
            }
        }
        self.begin_writes();
    }

    /// Refresh cancels settled: re-reserve what was refreshed, clean up what failed.
    fn after_refresh(&mut self, now: Instant) {
        let refreshed = std::mem::take(&mut self.refreshing);
        let mut again = Vec::new();
        for i in refreshed {
            if self.items[i].live() {
                again.push(i);
                continue;
            }
            // The refresh failed: abandon what this item still holds.
            let held = self.held_grants(i);
            for (shard, rid) in held {
                self.cancel(i, shard, rid, Purpose::Cleanup, 1);
            }
        }
        if again.is_empty() {
            self.begin_writes();
        } else {
            self.begin_reserve(again, now);
        }
    }

    fn begin_writes(&mut self) {
        self.phase = Phase::Writing;
        for i in self.live_items() {
            let nbytes = self.items[i].spec.nbytes;
            let grants: Vec<(usize, ReserveGrant)> = self.items[i]
                .shards
                .iter()
                .enumerate()
                .filter_map(|(shard, slot)| match slot {
                    ShardSlot::Granted(g) if g.write => Some((shard, g.clone())),
                    _ => None,
                })
                .collect();
            for (shard, g) in grants {
                let kind = OpKind::Write { shard, item: i };
                self.count(&kind);
                self.out.push(NewOp {
                    kind,
                    what: NewTransmit::Write { session: g.dst_session, dst_ptr: g.dst_ptr, nbytes, index: i },
                });
            }
        }
        if self.phase_ops == 0 {
            self.begin_completion();
        }
    }

    fn begin_completion(&mut self) {
        self.phase = Phase::Completing;
        for shard in 0..self.shards.len() {
            let items: Vec<usize> = self
                .live_items()
                .into_iter()
                .filter(|&i| matches!(&self.items[i].shards[shard], ShardSlot::Granted(g) if g.write))
                .collect();
            if items.is_empty() {
                continue;
            }
            let frame = complete_batch_request(items.iter().filter_map(|&i| {
                let entry = &self.items[i];
                match &entry.shards[shard] {
                    ShardSlot::Granted(g) => Some((entry.spec.transfer_id.as_str(), g.reservation_id.as_str())),
                    _ => None,
                }
            }));
            let addr = self.shards[shard].clone();
            self.request(OpKind::Complete { shard, items }, addr, frame);
        }
        if self.phase_ops == 0 {
            self.finish_success();
        }
    }

    /// Every `complete_batch` answered: Gen A needs every item accepted (S15, S17).
    fn judge_completions(&mut self, config: &PushConfig) {
        let completions = std::mem::take(&mut self.completions);
        let mut batch_error: Option<String> = None;
        let mut rejected: BTreeSet<usize> = BTreeSet::new();
        for (shard, (items, reply)) in &completions {
            let flags = match reply {
                Err(e) => Err(e.clone()),
                Ok(result) => batch_entries(result, items.len())
                    .map(|entries| {
                        entries.iter().map(|e| e.get("completed").is_some_and(truthy)).collect::<Vec<bool>>()
                    })
                    .ok_or_else(|| MALFORMED_COMPLETE_BATCH.to_string()),
            };
            match flags {
                Err(e) => {
                    tracing::warn!(consumer = %self.consumer, shard = %self.shards[*shard], error = %e, "EC completion failed");
                    batch_error.get_or_insert(e);
                }
                Ok(flags) => {
                    for (&i, completed) in items.iter().zip(flags) {
                        if completed {
                            continue;
                        }
                        let mm_hash = &self.items[i].spec.mm_hash;
                        if config.gen_b_completion {
                            tracing::warn!(
                                transfer_id = %self.items[i].spec.transfer_id,
                                shard = %self.shards[*shard],
                                "EC consumer rejected completion for mm_hash={mm_hash}"
                            );
                            rejected.insert(i);
                        } else {
                            batch_error.get_or_insert_with(|| format!("Unknown EC reservation for mm_hash={mm_hash}"));
                        }
                    }
                }
            }
        }
        if let Some(error) = batch_error {
            self.fail_batch(error);
            return;
        }
        for i in rejected {
            let error = format!("EC consumer rejected completion for mm_hash={}", self.items[i].spec.mm_hash);
            self.resolve(i, ItemOutcome::Failed { error });
        }
        self.finish_success();
    }

    fn finish_success(&mut self) {
        for i in self.live_items() {
            let outcome = if self.items[i].writes() {
                ItemOutcome::Pushed
            } else {
                ItemOutcome::Skipped { reason: SkipReason::NotWriter }
            };
            self.resolve(i, outcome);
        }
        self.phase = Phase::Finished;
    }

    /// The reservations item `i` holds, by shard: what an abandon must release.
    fn held_grants(&self, i: usize) -> Vec<(usize, String)> {
        self.items[i]
            .shards
            .iter()
            .enumerate()
            .filter_map(|(shard, slot)| match slot {
                ShardSlot::Granted(g) if !g.reservation_id.is_empty() => Some((shard, g.reservation_id.clone())),
                _ => None,
            })
            .collect()
    }

    /// The batch failed after reserving: fail its live items and abandon every
    /// reservation they hold (S17, S19).
    fn fail_batch(&mut self, error: String) {
        tracing::warn!(consumer = %self.consumer, %error, "EC push batch failed; abandoning its reservations");
        for i in self.live_items() {
            self.resolve(i, ItemOutcome::Failed { error: error.clone() });
            let held = self.held_grants(i);
            for (shard, rid) in held {
                self.cancel(i, shard, rid, Purpose::Abandon, 1);
            }
        }
        self.phase = if self.phase_ops == 0 { Phase::Finished } else { Phase::Abandoning };
    }

    /// The producer request finished before the source arrived: abandon everything held
    /// (S20). A cleanup that fails for good turns the skip into a failure.
    fn orphan_abandon(&mut self, regressions: &PushRegressions) {
        for i in self.live_items() {
            self.resolve(i, ItemOutcome::Skipped { reason: SkipReason::Unbound });
            if regressions.s20_orphan_keeps_grants {
                continue;
            }
            let held = self.held_grants(i);
            for (shard, rid) in held {
                self.cancel(i, shard, rid, Purpose::Cleanup, 1);
            }
        }
        self.phase = Phase::Finished;
    }

    fn after_reserve(&mut self, config: &PushConfig, now: Instant) {
        if self.live_items().is_empty() {
            self.phase = Phase::Finished;
        } else if self.orphaned {
            self.orphan_abandon(&config.regressions);
        } else if self.source.is_none() {
            self.phase = Phase::AwaitingSource;
        } else {
            self.refresh_or_write(config, now);
        }
    }

    /// One phase step, taken only when the phase waits for nothing. Returns whether the
    /// phase moved (the caller loops until it does not).
    fn advance(&mut self, config: &PushConfig, topology: &TopologyCache, now: Instant) -> bool {
        if self.phase_ops > 0 {
            return false;
        }
        let before = self.phase;
        match self.phase {
            Phase::Start => {
                if self.items.is_empty() {
                    self.phase = Phase::Finished;
                } else if let Some(shards) = topology.get(&self.consumer) {
                    self.shards = shards.to_vec();
                    self.phase = Phase::Discovering;
                } else {
                    self.queue_peers(1);
                }
            }
            Phase::Discovering => {
                if self.shards.is_empty() {
                    // Only reachable if a reply went missing; the reply handler decides.
                    return false;
                }
                if self.orphaned {
                    self.orphan_abandon(&config.regressions);
                } else {
                    self.begin_reserve((0..self.items.len()).collect(), now);
                }
            }
            Phase::Reserving => {
                self.judge_reservations(&config.regressions);
                self.after_reserve(config, now);
            }
            Phase::AwaitingSource => {
                if self.orphaned {
                    self.orphan_abandon(&config.regressions);
                } else if self.source.is_some() {
                    self.refresh_or_write(config, now);
                }
            }
            Phase::Refreshing => self.after_refresh(now),
            Phase::Writing => match self.write_errors.values().next().cloned() {
                Some(error) => self.fail_batch(error),
                None => self.begin_completion(),
            },
            Phase::Completing => self.judge_completions(config),
            Phase::Abandoning => self.phase = Phase::Finished,
            Phase::Finished => {}
        }
        self.phase != before
    }

    fn is_done(&self) -> bool {
        self.phase == Phase::Finished && self.phase_ops == 0 && self.cleanup_ops == 0
    }

    fn outcomes(&self) -> Vec<ItemOutcome> {
        self.items
            .iter()
            .map(|e| {
                e.outcome.clone().unwrap_or_else(|| ItemOutcome::Failed { error: "EC push was not resolved".into() })
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// The coordinator

struct Outgoing {
    token: Token,
    batch: BatchId,
    kind: OpKind,
    transmit: Transmit,
}

struct InFlight {
    batch: BatchId,
    /// The shard address a request occupies (`None` for writes).
    addr: Option<String>,
    kind: OpKind,
}

/// The push coordinator of one producer worker. See the module documentation.
pub struct PushCoordinator {
    config: PushConfig,
    topology: TopologyCache,
    batches: BTreeMap<BatchId, Batch>,
    /// Decided operations not yet handed out, in decision order.
    outbox: VecDeque<Outgoing>,
    in_flight: BTreeMap<Token, InFlight>,
    /// Requests in flight per shard address.
    busy: BTreeMap<String, usize>,
    events: VecDeque<PushEvent>,
    next_token: u64,
    next_batch: u64,
}

impl fmt::Debug for PushCoordinator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PushCoordinator")
            .field("batches", &self.batches.len())
            .field("queued", &self.outbox.len())
            .field("in_flight", &self.in_flight.len())
            .field("events", &self.events.len())
            .finish()
    }
}

impl Default for PushCoordinator {
    fn default() -> Self {
        Self::new(PushConfig::default())
    }
}

impl PushCoordinator {
    /// A coordinator with an empty topology cache.
    pub fn new(config: PushConfig) -> Self {
        PushCoordinator {
            config,
            topology: TopologyCache::default(),
            batches: BTreeMap::new(),
            outbox: VecDeque::new(),
            in_flight: BTreeMap::new(),
            busy: BTreeMap::new(),
            events: VecDeque::new(),
            next_token: 0,
            next_batch: 0,
        }
    }

    /// Input: push `batch` to its consumer. Reserving starts at once; writes wait for the
    /// source if `batch.source_ready` is false.
    pub fn push(&mut self, batch: PushBatch, now: Instant) -> BatchId {
        self.next_batch += 1;
        let id = BatchId(self.next_batch);
        tracing::debug!(batch = %id, consumer = %batch.consumer, items = batch.items.len(), "EC push batch");
        let items = batch.items.into_iter().map(|spec| ItemEntry { spec, shards: Vec::new(), outcome: None }).collect();
        self.batches.insert(
            id,
            Batch {
                consumer: batch.consumer,
                items,
                shards: Vec::new(),
                source: batch.source_ready.then_some(now),
                orphaned: false,
                reserved_at: now,
                phase: Phase::Start,
                phase_ops: 0,
                cleanup_ops: 0,
                refreshing: BTreeSet::new(),
                write_errors: BTreeMap::new(),
                completions: BTreeMap::new(),
                out: Vec::new(),
            },
        );
        self.progress(id, now);
        id
    }

    /// Input: the encoder output of a batch pushed with `source_ready: false` arrived.
    pub fn bind_source(&mut self, batch: BatchId, now: Instant) -> Result<(), PushError> {
        let b = self.batches.get_mut(&batch).ok_or(PushError::UnknownBatch(batch))?;
        if b.orphaned {
            return Err(PushError::Orphaned(batch));
        }
        if b.source.is_some() {
            return Err(PushError::AlreadyBound(batch));
        }
        b.source = Some(now);
        self.progress(batch, now);
        Ok(())
    }

    /// Input: the producer request of a batch finished before its source was bound.
    /// Whatever the batch reserved is abandoned once its reservations settle (S20).
    pub fn orphan(&mut self, batch: BatchId, now: Instant) -> Result<(), PushError> {
        let b = self.batches.get_mut(&batch).ok_or(PushError::UnknownBatch(batch))?;
        if b.source.is_some() {
            return Err(PushError::AlreadyBound(batch));
        }
        if !b.orphaned {
            b.orphaned = true;
            self.progress(batch, now);
        }
        Ok(())
    }

    /// Input: worker shutdown. Every batch still waiting for its source is orphaned, so
    /// its reservations are abandoned before the driver stops (S20). Returns how many.
    pub fn orphan_unbound(&mut self, now: Instant) -> usize {
        let ids: Vec<BatchId> =
            self.batches.iter().filter(|(_, b)| b.source.is_none() && !b.orphaned).map(|(id, _)| *id).collect();
        for &id in &ids {
            let _ = self.orphan(id, now);
        }
        ids.len()
    }

    /// Output: the next request to send or write to perform. A request waits while its
    /// shard address already has `max_requests_per_shard` in flight.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        let limit = self.config.max_requests_per_shard.max(1);
        let pos = self.outbox.iter().position(|o| match &o.transmit {
            Transmit::Request { addr, .. } => self.busy.get(addr).copied().unwrap_or(0) < limit,
            Transmit::Write { .. } => true,
        })?;
        let out = self.outbox.remove(pos)?;
        let addr = match &out.transmit {
            Transmit::Request { addr, .. } => {
                *self.busy.entry(addr.clone()).or_default() += 1;
                Some(addr.clone())
            }
            Transmit::Write { .. } => None,
        };
        self.in_flight.insert(out.token, InFlight { batch: out.batch, addr, kind: out.kind });
        Some(out.transmit)
    }

    /// Input: the answer to a [`Transmit::Request`]: the reply's `result`, or the error
    /// (timeout, transport failure, or the text of an `ok: false` reply).
    pub fn handle_reply(&mut self, token: Token, reply: Result<Value, ReplyError>, now: Instant) {
        let Some(op) = self.in_flight.remove(&token) else {
            tracing::debug!(token = token.0, "reply for no outstanding EC push request");
            return;
        };
        if let Some(addr) = &op.addr {
            if let Some(n) = self.busy.get_mut(addr) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.busy.remove(addr);
                }
            }
        }
        self.settle(op.batch, op.kind, reply);
        self.progress(op.batch, now);
    }

    /// Input: the outcome of a [`Transmit::Write`].
    pub fn handle_write(&mut self, token: Token, result: Result<(), String>, now: Instant) {
        self.handle_reply(token, result.map(|()| Value::Null).map_err(ReplyError::from), now);
    }

    /// Output: the next outcome.
    pub fn poll_event(&mut self) -> Option<PushEvent> {
        self.events.pop_front()
    }

    /// The confirmed consumer topologies.
    pub fn topology(&self) -> &TopologyCache {
        &self.topology
    }

    /// Requests and writes handed out and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Nothing to do and nothing outstanding.
    pub fn is_idle(&self) -> bool {
        self.batches.is_empty() && self.outbox.is_empty() && self.in_flight.is_empty() && self.events.is_empty()
    }

    /// Applies one answer to its batch.
    fn settle(&mut self, id: BatchId, kind: OpKind, reply: Result<Value, ReplyError>) {
        let Some(batch) = self.batches.get_mut(&id) else { return };
        let refused = matches!(reply, Err(ReplyError::Refused(_)));
        let reply = reply.map_err(|e| e.to_string());
        // A completion answered after the batch left Completing (S17 regression) was
        // already written off: it holds no phase count.
        if !matches!(kind, OpKind::Complete { .. }) || batch.phase == Phase::Completing {
            batch.settle(&kind);
        }
        match kind {
            OpKind::Peers { attempt } => match self.topology.record(&batch.consumer, reply) {
                Ok(shards) => batch.shards = shards,
                Err(error) => {
                    tracing::warn!(consumer = %batch.consumer, attempt, %error, "EC shard discovery failed");
                    if self.config.regressions.s8_base_fallback {
                        // The removed fallback: the base address alone, not cached.
                        batch.shards = vec![batch.consumer.clone()];
                    } else if attempt < self.config.discovery_attempts {
                        batch.queue_peers(attempt + 1);
                    } else {
                        // No fallback to the base address alone (S8): nothing is sent.
                        let error = TopologyError { base: batch.consumer.clone() }.to_string();
                        for i in batch.live_items() {
                            batch.resolve(i, ItemOutcome::Failed { error: error.clone() });
                        }
                        batch.phase = Phase::Finished;
                    }
                }
            },
            OpKind::Reserve { shard, items, single } => {
                let slots: Vec<ShardSlot> = match &reply {
                    Err(e) if refused => vec![ShardSlot::Refused(e.clone()); items.len()],
                    Err(e) => vec![ShardSlot::Failed(e.clone()); items.len()],
                    Ok(result) if single => {
                        items.iter().map(|&i| parse_reserve(result, &batch.items[i].spec)).collect()
                    }
                    Ok(result) => match batch_entries(result, items.len()) {
                        Some(entries) => items
                            .iter()
                            .zip(entries)
                            .map(|(&i, e)| parse_reserve_entry(e, &batch.items[i].spec))
                            .collect(),
                        None => vec![ShardSlot::Failed(MALFORMED_RESERVE_BATCH.into()); items.len()],
                    },
                };
                for (&i, slot) in items.iter().zip(slots) {
                    if let Some(s) = batch.items.get_mut(i).and_then(|e| e.shards.get_mut(shard)) {
                        *s = slot;
                    }
                }
            }
            OpKind::Cancel(op) => {
                let result = match reply {
                    Ok(v) if v.get("cancelled").is_some_and(truthy) => Ok(()),
                    Ok(_) => Err(format!(
                        "EC consumer {} refused to cancel transfer_id={}",
                        batch.shards.get(op.shard).map(String::as_str).unwrap_or("?"),
                        batch.items.get(op.item).map(|e| e.spec.transfer_id.as_str()).unwrap_or("?"),
                    )),
                    Err(e) => Err(e),
                };
                match result {
                    Ok(()) => {
                        if let Some(s) = batch.items.get_mut(op.item).and_then(|e| e.shards.get_mut(op.shard)) {
                            *s = ShardSlot::Released;
                        }
                    }
                    Err(error) if op.attempt < self.config.cancel_attempts => {
                        tracing::info!(shard = %batch.shards[op.shard], %error, "EC cancel failed; retrying");
                        batch.cancel(op.item, op.shard, op.reservation_id, op.purpose, op.attempt + 1);
                    }
                    Err(error) => {
                        tracing::warn!(
                            shard = %batch.shards[op.shard],
                            transfer_id = %batch.items[op.item].spec.transfer_id,
                            reservation_id = %op.reservation_id,
                            %error,
                            "EC cancel failed for good; the consumer keeps the reservation until it expires"
                        );
                        let entry = &mut batch.items[op.item];
                        match (op.purpose, &entry.outcome) {
                            // A refresh that did not happen: the item cannot be written.
                            (Purpose::Refresh, None) => entry.outcome = Some(ItemOutcome::Failed { error }),
                            // A skip whose release failed is a failure (S20).
                            (Purpose::Cleanup, Some(ItemOutcome::Skipped { .. })) => {
                                entry.outcome = Some(ItemOutcome::Failed { error })
                            }
                            // A failed item keeps the error that failed it.
                            _ => {}
                        }
                    }
                }
            }
            OpKind::Complete { .. } if batch.phase != Phase::Completing => {
                // Only the S17 regression leaves Completing with completions in flight.
                tracing::debug!(batch = %id, "completion reply after the batch was failed; ignored");
            }
            OpKind::Complete { shard, items } => {
                let failed = self.config.regressions.s17_abandon_before_settle
                    && match &reply {
                        Err(_) => true,
                        Ok(result) => match batch_entries(result, items.len()) {
                            None => true,
                            Some(entries) => {
                                !self.config.gen_b_completion
                                    && entries.iter().any(|e| !e.get("completed").is_some_and(truthy))
                            }
                        },
                    };
                batch.completions.insert(shard, (items, reply));
                if failed {
                    // Fail now: the other shards' completions are forgotten, not awaited.
                    batch.phase_ops = 0;
                    batch.judge_completions(&self.config);
                }
            }
            OpKind::Write { shard, item } => {
                if let Err(error) = reply {
                    tracing::warn!(transfer_id = %batch.items[item].spec.transfer_id, %error, "EC write failed");
                    batch.write_errors.insert((item, shard), error);
                }
            }
        }
    }

    /// Moves a batch as far as its answers allow, hands its new operations out and reports
    /// it once nothing of it is outstanding.
    fn progress(&mut self, id: BatchId, now: Instant) {
        loop {
            let Some(batch) = self.batches.get_mut(&id) else { return };
            let moved = batch.advance(&self.config, &self.topology, now);
            let out = std::mem::take(&mut batch.out);
            let done = batch.is_done();
            for op in out {
                self.next_token += 1;
                let token = Token(self.next_token);
                let transmit = match op.what {
                    NewTransmit::Request { addr, frame } => Transmit::Request { token, batch: id, addr, frame },
                    NewTransmit::Write { session, dst_ptr, nbytes, index } => {
                        Transmit::Write { token, session, dst_ptr, nbytes, item: ItemRef { batch: id, index } }
                    }
                };
                self.outbox.push_back(Outgoing { token, batch: id, kind: op.kind, transmit });
            }
            if done {
                if let Some(batch) = self.batches.remove(&id) {
                    let outcomes = batch.outcomes();
                    tracing::debug!(batch = %id, ?outcomes, "EC push batch done");
                    self.events.push_back(PushEvent::BatchDone { batch: id, outcomes });
                }
                return;
            }
            if !moved {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn item(t: &str) -> PushItem {
        PushItem {
            transfer_id: t.into(),
            mm_hash: "h\u{e9}".into(),
            nbytes: 16,
            shape: vec![2, 4],
            dtype: "float16".into(),
        }
    }

    /// The producer and the client read every reserve reply alike: the producer through
    /// `parse_reserve` on the decoded result, the client through the frame reader
    /// (`decode_reserve_reply`, scan or general path) and the same size rule.
    #[test]
    fn producer_and_client_read_every_reserve_reply_alike() {
        use crate::ec::reserve_outcome::decode_reserve_reply;
        let it = item("t1");
        let rid = "9c1e".repeat(8);
        let replies: Vec<String> = vec![
            format!(r#"{{"ok": true, "result": {{"reservation_id": "{rid}", "dst_session": "10.0.0.5:15417", "dst_ptr": 4096, "nbytes": 16, "write": true, "ready": false, "cached": false}}}}"#),
            format!(r#"{{"ok": true, "result": {{"reservation_id": "{rid}", "dst_session": "s", "dst_ptr": 0, "nbytes": 16, "write": false, "ready": true, "cached": true}}}}"#),
            format!(r#"{{"ok": true, "result": {{"reservation_id": "{rid}", "dst_session": "s", "dst_ptr": 8, "nbytes": 32, "write": true, "ready": false, "cached": false}}}}"#),
            format!(r#"{{"ok": true, "result": {{"reservation_id": "{rid}", "dst_session": "s", "dst_ptr": 8, "nbytes": 32, "write": false, "ready": false, "cached": false}}}}"#),
            r#"{"ok": true, "result": {"reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": 0, "write": false, "ready": false, "cancelled": true}}"#.into(),
            r#"{"ok": true, "result": {"cancelled": 1}}"#.into(),
            r#"{"ok": true, "result": {"cancelled": false, "reservation_id": 7, "dst_session": null, "dst_ptr": true, "nbytes": 16, "write": 1, "ready": "", "cached": []}}"#.into(),
            r#"{"ok": true, "result": {"reservation_id": "r", "dst_session": "s", "dst_ptr": -1, "nbytes": 16, "write": true}}"#.into(),
            r#"{"ok": true, "result": {"reservation_id": "r", "dst_session": "s", "dst_ptr": 4096.0, "nbytes": 16, "write": true}}"#.into(),
            r#"{"ok": true, "result": {"reservation_id": "r", "dst_session": "s", "dst_ptr": "4096", "nbytes": "16", "write": true}}"#.into(),
            r#"{"ok": true, "result": {"dst_session": "s", "dst_ptr": 1, "nbytes": 16}}"#.into(),
            r#"{"ok": true, "result": null}"#.into(),
            r#"{"ok": true, "result": [1, 2]}"#.into(),
        ];
        for frame in &replies {
            let client = match decode_reserve_reply(frame.as_bytes()) {
                Ok(Ok(read)) => read.and_then(|o| o.checked(it.nbytes, &it.mm_hash)),
                other => panic!("{frame} is a success reply, read as {other:?}"),
            };
            let result = match crate::ec::wire::decode_reply(frame.as_bytes()) {
                Ok(Ok(result)) => result,
                other => panic!("{frame}: {other:?}"),
            };
            let producer = match parse_reserve(&result, &it) {
                ShardSlot::Granted(g) => Ok(ReserveOutcome::Granted(g)),
                ShardSlot::Cancelled => Ok(ReserveOutcome::Cancelled),
                ShardSlot::Failed(e) | ShardSlot::Refused(e) => Err(e),
                other => panic!("{frame}: {other:?}"),
            };
            assert_eq!(client, producer, "{frame}");
        }
    }

    #[test]
    fn frames_are_python_json_dumps() {
        assert_eq!(
            String::from_utf8(reserve_request(&item("t1"))).unwrap(),
            r#"{"op": "reserve", "transfer_id": "t1", "mm_hash": "h\u00e9", "nbytes": 16, "shape": [2, 4], "dtype": "float16"}"#
        );
        assert_eq!(
            String::from_utf8(reserve_batch_request([&item("a"), &item("b")])).unwrap(),
            r#"{"op": "reserve_batch", "items": [{"transfer_id": "a", "mm_hash": "h\u00e9", "nbytes": 16, "shape": [2, 4], "dtype": "float16"}, {"transfer_id": "b", "mm_hash": "h\u00e9", "nbytes": 16, "shape": [2, 4], "dtype": "float16"}]}"#
        );
        assert_eq!(
            String::from_utf8(complete_batch_request([("a", "r1")])).unwrap(),
            r#"{"op": "complete_batch", "items": [{"transfer_id": "a", "reservation_id": "r1"}]}"#
        );
        assert_eq!(
            make_cancel_request("t1", "", false, false),
            br#"{"op": "cancel", "transfer_id": "t1", "reservation_id": ""}"#
        );
        assert_eq!(
            make_cancel_request("t1", "r0", true, false),
            br#"{"op": "cancel", "transfer_id": "t1", "reservation_id": "r0", "abandon": true}"#
        );
        assert_eq!(
            make_cancel_request("t1", "r0", true, true),
            br#"{"op": "cancel", "transfer_id": "t1", "reservation_id": "r0", "abandon": true, "refresh": true}"#
        );
    }

    #[test]
    fn reserve_results_are_read_leniently_but_sizes_must_match() {
        let it = item("t");
        let granted = json!({"reservation_id": "r", "dst_session": "s", "dst_ptr": 4096, "nbytes": 16, "write": true, "ready": false, "cached": false});
        assert!(matches!(
            parse_reserve(&granted, &it),
            ShardSlot::Granted(ReserveGrant { dst_ptr: 4096, write: true, .. })
        ));
        let cancelled = json!({"reservation_id": "", "dst_session": "", "dst_ptr": 0, "nbytes": 16, "write": false, "ready": false, "cancelled": true});
        assert_eq!(parse_reserve(&cancelled, &it), ShardSlot::Cancelled);
        let short = json!({"reservation_id": "r", "dst_session": "s", "dst_ptr": 0, "nbytes": 8, "write": true});
        assert!(matches!(parse_reserve(&short, &it), ShardSlot::Failed(e) if e.contains("granted 8 bytes")));
        assert_eq!(parse_reserve(&json!([1]), &it), ShardSlot::Failed(MALFORMED_RESERVE.into()));
        assert_eq!(parse_reserve(&json!({"reservation_id": "r"}), &it), ShardSlot::Failed(MALFORMED_RESERVE.into()));
        assert_eq!(
            parse_reserve_entry(&json!({"ok": false, "error": "EC consumer buffer pool is full"}), &it),
            ShardSlot::Refused("EC consumer buffer pool is full".into())
        );
        assert_eq!(
            parse_reserve_entry(&json!({"ok": false}), &it),
            ShardSlot::Refused("EC control request failed".into())
        );
    }

    #[test]
    fn an_empty_batch_is_done_at_once_without_traffic() {
        let mut c = PushCoordinator::default();
        let id = c.push(PushBatch::new("tcp://h:1", vec![]), Instant::ZERO);
        assert_eq!(c.poll_transmit(), None);
        assert_eq!(c.poll_event(), Some(PushEvent::BatchDone { batch: id, outcomes: vec![] }));
        assert!(c.is_idle());
    }

    #[test]
    fn requests_to_one_shard_wait_for_the_previous_reply() {
        let mut c = PushCoordinator::default();
        c.push(PushBatch::new("tcp://h:1", vec![item("a")]), Instant::ZERO);
        c.push(PushBatch::new("tcp://h:1", vec![item("b")]), Instant::ZERO);
        let Some(Transmit::Request { token, frame, .. }) = c.poll_transmit() else { panic!() };
        assert_eq!(frame, peers_request());
        assert_eq!(c.poll_transmit(), None, "the second peers waits for the first reply");
        c.handle_reply(token, Ok(json!({"ports": [1]})), Instant::ZERO);
        let Some(Transmit::Request { frame, .. }) = c.poll_transmit() else { panic!() };
        assert_eq!(frame, peers_request());
        assert_eq!(c.in_flight(), 1);
    }

    #[test]
    fn misuse_of_inputs_is_refused() {
        let mut c = PushCoordinator::default();
        let id = c.push(PushBatch::new("tcp://h:1", vec![item("a")]).awaiting_source(), Instant::ZERO);
        assert_eq!(c.bind_source(BatchId(99), Instant::ZERO), Err(PushError::UnknownBatch(BatchId(99))));
        c.bind_source(id, Instant::ZERO).unwrap();
        assert_eq!(c.bind_source(id, Instant::ZERO), Err(PushError::AlreadyBound(id)));
        assert_eq!(c.orphan(id, Instant::ZERO), Err(PushError::AlreadyBound(id)));
        let id2 = c.push(PushBatch::new("tcp://h:1", vec![item("b")]).awaiting_source(), Instant::ZERO);
        c.orphan(id2, Instant::ZERO).unwrap();
        assert_eq!(c.bind_source(id2, Instant::ZERO), Err(PushError::Orphaned(id2)));
        c.handle_reply(Token(12345), Ok(Value::Null), Instant::ZERO);
    }
}
