//! The consumer scheduler's view of pushed items: multi-shard readiness and the transfer
//! table with its push-wait deadline (ec-behaviour.md §6.3, §6.4; races S6, S23, S24, S27).
//!
//! An item is loadable only once every distinct shard has announced it: each TP rank
//! holds its own copy, so one rank's event says nothing about the others.

use super::defaults::{PUSH_WAIT_TIMEOUT, RECORD_TTL};
use super::inbox::ReadyEvent;
use crate::time::Instant;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// Scheduler `_MAX_PENDING_EVENTS`: partially-ready transfers remembered (LRU).
pub const MAX_PARTIAL: usize = 4096;
/// `_MAX_TERMINAL_TRANSFER_RECORDS`.
pub const MAX_TERMINAL: usize = 65536;

/// Tunables of [`Readiness`].
#[derive(Clone, Debug)]
pub struct ReadinessConfig {
    pub push_wait_timeout: Duration,
    pub max_partial: usize,
    pub max_terminal: usize,
    pub record_ttl: Duration,
}

impl Default for ReadinessConfig {
    fn default() -> Self {
        ReadinessConfig {
            push_wait_timeout: PUSH_WAIT_TIMEOUT,
            max_partial: MAX_PARTIAL,
            max_terminal: MAX_TERMINAL,
            record_ttl: RECORD_TTL,
        }
    }
}

/// A scheduler transfer record's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum TransferState {
    WaitingEvent,
    Available,
    Loading,
    Ready,
    Unavailable,
    Expired,
    Failed,
    Cancelled,
}

impl TransferState {
    /// No event or load report changes it any more.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TransferState::Unavailable | TransferState::Expired | TransferState::Failed | TransferState::Cancelled
        )
    }
}

/// What the scheduler must act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// Every shard announced the item: it can be loaded.
    Available { transfer_id: String, event: ReadyEvent },
    /// The request waiting for this item fails (retryable), reported once.
    Unavailable { transfer_id: String, mm_hash: String },
    /// Send a plain cancel for this transfer to every shard.
    CancelRemote { transfer_id: String },
}

/// What became of one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventFate {
    /// The last missing shard: the item is AVAILABLE.
    Accepted,
    /// Counted; other shards are still missing.
    Partial,
    /// A repeat from a shard already counted.
    Repeat,
    /// The transfer is past waiting (cancelled, unavailable, expired, loading...).
    Ignored,
}

/// A transfer id already names another item: only the newcomer's request fails.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("transfer_id {transfer_id} already names mm_hash {existing}")]
pub struct Collision {
    pub transfer_id: String,
    pub existing: String,
}

#[derive(Clone, Debug)]
struct Transfer {
    mm_hash: String,
    state: TransferState,
    deadline: Option<Instant>,
    event: Option<ReadyEvent>,
    /// Place in the terminal order (terminal records only).
    terminal: Option<u64>,
}

/// Multi-shard readiness plus the scheduler's transfer table.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    config: ReadinessConfig,
    transfers: BTreeMap<String, Transfer>,
    /// Partially-ready transfers: shards seen, and LRU position.
    partial: BTreeMap<String, (u64, BTreeSet<i64>)>,
    partial_order: BTreeMap<u64, String>,
    terminal_order: BTreeMap<u64, (String, Instant)>,
    seq: u64,
    notices: VecDeque<Notice>,
}

impl Readiness {
    /// An empty table.
    pub fn new(config: ReadinessConfig) -> Self {
        Readiness { config, ..Readiness::default() }
    }

    /// A request needs `transfer_id` (for `mm_hash`) and has no loadable copy: wait for
    /// its events until `now + push_wait_timeout`.
    pub fn wait_for_event(
        &mut self,
        transfer_id: &str,
        mm_hash: &str,
        now: Instant,
    ) -> Result<TransferState, Collision> {
        if let Some(t) = self.transfers.get(transfer_id) {
            if t.mm_hash != mm_hash {
                return Err(Collision { transfer_id: transfer_id.into(), existing: t.mm_hash.clone() });
            }
            return Ok(t.state);
        }
        let deadline = Some(now + self.config.push_wait_timeout);
        self.transfers.insert(
            transfer_id.into(),
            Transfer {
                mm_hash: mm_hash.into(),
                state: TransferState::WaitingEvent,
                deadline,
                event: None,
                terminal: None,
            },
        );
        Ok(TransferState::WaitingEvent)
    }

    /// One decoded readiness event from a shard; `shard_count` is the inbox's.
    pub fn handle_event(&mut self, event: ReadyEvent, shard_count: usize, now: Instant) -> EventFate {
        let tid = event.transfer_id.clone();
        if let Some(t) = self.transfers.get(&tid) {
            if t.state != TransferState::WaitingEvent {
                self.forget_partial(&tid);
                return EventFate::Ignored;
            }
            if t.mm_hash != event.mm_hash {
                tracing::warn!(transfer_id = %tid, "readiness event names another mm_hash; ignored");
                return EventFate::Ignored;
            }
        }
        if shard_count > 1 {
            let (seen_before, count) = {
                let seq = self.next_seq();
                let entry = self.partial.entry(tid.clone()).or_insert_with(|| (seq, BTreeSet::new()));
                let old_seq = std::mem::replace(&mut entry.0, seq);
                let shard = event.shard.unwrap_or(entry.1.len() as i64);
                let fresh = entry.1.insert(shard);
                self.partial_order.remove(&old_seq);
                self.partial_order.insert(seq, tid.clone());
                (!fresh, self.partial.get(&tid).map_or(0, |e| e.1.len()))
            };
            if seen_before {
                return EventFate::Repeat;
            }
            if count < shard_count {
                self.bound_partial();
                return EventFate::Partial;
            }
            self.forget_partial(&tid);
        }
        let deadline = Some(now + self.config.record_ttl);
        let mm_hash = event.mm_hash.clone();
        let t = self.transfers.entry(tid.clone()).or_insert_with(|| Transfer {
            mm_hash,
            state: TransferState::WaitingEvent,
            deadline,
            event: None,
            terminal: None,
        });
        t.state = TransferState::Available;
        t.deadline = deadline;
        t.event = Some(event.clone());
        self.notices.push_back(Notice::Available { transfer_id: tid, event });
        EventFate::Accepted
    }

    /// The scheduler dispatches the load of an AVAILABLE item.
    pub fn begin_load(&mut self, transfer_id: &str, now: Instant) -> bool {
        match self.transfers.get_mut(transfer_id) {
            Some(t) if t.state == TransferState::Available => {
                t.state = TransferState::Loading;
                t.deadline = Some(now + self.config.push_wait_timeout);
                true
            }
            _ => false,
        }
    }

    /// Every rank reported the load (`loaded`) or one missed it.
    pub fn report_load(&mut self, transfer_id: &str, loaded: bool, now: Instant) {
        if let Some(t) = self.transfers.get_mut(transfer_id) {
            if t.state == TransferState::Loading {
                t.deadline = None;
                if loaded {
                    t.state = TransferState::Ready;
                } else {
                    self.make_terminal(transfer_id, TransferState::Failed, now);
                }
            }
        }
    }

    /// The request finished or aborted. Returns whether a remote cancel was queued.
    pub fn cancel(&mut self, transfer_id: &str, mm_hash: &str, now: Instant) -> bool {
        self.forget_partial(transfer_id);
        match self.transfers.get(transfer_id) {
            Some(t) if t.mm_hash != mm_hash => return false,
            Some(t) if matches!(t.state, TransferState::Cancelled | TransferState::Ready | TransferState::Failed) => {
                return false
            }
            Some(_) => {}
            None => {
                self.transfers.insert(
                    transfer_id.into(),
                    Transfer {
                        mm_hash: mm_hash.into(),
                        state: TransferState::WaitingEvent,
                        deadline: None,
                        event: None,
                        terminal: None,
                    },
                );
            }
        }
        self.make_terminal(transfer_id, TransferState::Cancelled, now);
        self.notices.push_back(Notice::CancelRemote { transfer_id: transfer_id.into() });
        true
    }

    /// The clock reached `poll_timeout`: waits and loads past their deadline fail,
    /// AVAILABLE items past their lease expire, old terminal records go.
    pub fn handle_timeout(&mut self, now: Instant) {
        let due: Vec<(String, TransferState)> = self
            .transfers
            .iter()
            .filter(|(_, t)| !t.state.is_terminal() && t.deadline.is_some_and(|d| d <= now))
            .map(|(k, t)| (k.clone(), t.state))
            .collect();
        for (tid, state) in due {
            let mm_hash = self.transfers.get(&tid).map(|t| t.mm_hash.clone()).unwrap_or_default();
            match state {
                TransferState::WaitingEvent => {
                    self.forget_partial(&tid);
                    self.make_terminal(&tid, TransferState::Unavailable, now);
                    self.notices.push_back(Notice::Unavailable { transfer_id: tid, mm_hash });
                }
                TransferState::Loading => {
                    self.make_terminal(&tid, TransferState::Unavailable, now);
                    self.notices.push_back(Notice::Unavailable { transfer_id: tid.clone(), mm_hash });
                    self.notices.push_back(Notice::CancelRemote { transfer_id: tid });
                }
                TransferState::Available => {
                    self.make_terminal(&tid, TransferState::Expired, now);
                    self.notices.push_back(Notice::CancelRemote { transfer_id: tid });
                }
                _ => {}
            }
        }
        self.reap_terminal(now);
    }

    /// The earliest deadline of a live record or terminal record.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let live = self.transfers.values().filter(|t| !t.state.is_terminal()).filter_map(|t| t.deadline).min();
        let terminal = self.terminal_order.values().map(|(_, at)| *at + self.config.record_ttl).min();
        live.into_iter().chain(terminal).min()
    }

    /// The next thing for the scheduler to act on.
    pub fn poll_notice(&mut self) -> Option<Notice> {
        self.notices.pop_front()
    }

    /// A transfer's state, if recorded.
    pub fn state(&self, transfer_id: &str) -> Option<TransferState> {
        self.transfers.get(transfer_id).map(|t| t.state)
    }

    /// Partially-ready transfers held.
    pub fn partial_count(&self) -> usize {
        self.partial.len()
    }

    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    fn forget_partial(&mut self, tid: &str) {
        if let Some((seq, _)) = self.partial.remove(tid) {
            self.partial_order.remove(&seq);
        }
    }

    fn bound_partial(&mut self) {
        while self.partial.len() > self.config.max_partial {
            let Some((_, tid)) = self.partial_order.pop_first() else { break };
            tracing::warn!(transfer_id = %tid, "dropping partial readiness of the least recently seen transfer");
            self.partial.remove(&tid);
        }
    }

    fn make_terminal(&mut self, tid: &str, to: TransferState, now: Instant) {
        let seq = self.next_seq();
        if let Some(t) = self.transfers.get_mut(tid) {
            t.state = to;
            t.deadline = None;
            if let Some(old) = t.terminal.replace(seq) {
                self.terminal_order.remove(&old);
            }
            self.terminal_order.insert(seq, (tid.to_string(), now));
        }
        self.reap_terminal(now);
    }

    fn reap_terminal(&mut self, now: Instant) {
        while let Some((&seq, (tid, at))) = self.terminal_order.first_key_value() {
            let over = self.terminal_order.len() > self.config.max_terminal;
            if !over && *at + self.config.record_ttl > now {
                break;
            }
            let tid = tid.clone();
            self.terminal_order.remove(&seq);
            self.transfers.remove(&tid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(tid: &str, shard: i64) -> ReadyEvent {
        ReadyEvent {
            transfer_id: tid.into(),
            mm_hash: "h".into(),
            nbytes: 16,
            shape: vec![8],
            dtype: "float16".into(),
            shard: Some(shard),
        }
    }

    const T0: Instant = Instant::from_secs(10);

    #[test]
    fn readiness_needs_every_consumer_shard() {
        let mut r = Readiness::default();
        r.wait_for_event("t", "h", T0).unwrap();
        assert_eq!(r.handle_event(ev("t", 19019), 3, T0), EventFate::Partial);
        assert_eq!(r.handle_event(ev("t", 19019), 3, T0), EventFate::Repeat, "repeats from one shard do not count");
        assert_eq!(r.handle_event(ev("t", 19020), 3, T0), EventFate::Partial);
        assert_eq!(r.state("t"), Some(TransferState::WaitingEvent));
        assert_eq!(r.handle_event(ev("t", 19021), 3, T0), EventFate::Accepted);
        assert_eq!(r.state("t"), Some(TransferState::Available));
        assert!(matches!(r.poll_notice(), Some(Notice::Available { .. })));
        assert_eq!(r.partial_count(), 0);
    }

    #[test]
    fn single_shard_is_ready_at_once() {
        let mut r = Readiness::default();
        assert_eq!(r.handle_event(ev("t", 1), 1, T0), EventFate::Accepted);
    }

    #[test]
    fn cancelled_transfer_ignores_late_ready_events() {
        let mut r = Readiness::default();
        r.wait_for_event("t", "h", T0).unwrap();
        r.handle_event(ev("t", 1), 2, T0);
        assert!(r.cancel("t", "h", T0));
        assert_eq!(r.poll_notice(), Some(Notice::CancelRemote { transfer_id: "t".into() }));
        assert_eq!(r.partial_count(), 0, "no partial-shard state retained");
        assert_eq!(r.handle_event(ev("t", 1), 2, T0), EventFate::Ignored);
        assert_eq!(r.handle_event(ev("t", 2), 2, T0), EventFate::Ignored);
        assert_eq!(r.partial_count(), 0);
        assert!(!r.cancel("t", "h", T0), "repeat cancel is a no-op");
    }

    #[test]
    fn item_with_no_transfer_in_flight_is_reported_unavailable_once() {
        let mut r = Readiness::default();
        r.wait_for_event("t", "h", T0).unwrap();
        assert_eq!(r.poll_timeout(), Some(T0 + PUSH_WAIT_TIMEOUT));
        r.handle_timeout(T0 + PUSH_WAIT_TIMEOUT - Duration::from_millis(1));
        assert_eq!(r.poll_notice(), None);
        r.handle_timeout(T0 + PUSH_WAIT_TIMEOUT);
        assert_eq!(r.poll_notice(), Some(Notice::Unavailable { transfer_id: "t".into(), mm_hash: "h".into() }));
        r.handle_timeout(T0 + PUSH_WAIT_TIMEOUT + Duration::from_secs(1));
        assert_eq!(r.poll_notice(), None, "reported once");
        assert_eq!(r.handle_event(ev("t", 1), 1, T0), EventFate::Ignored);
    }

    #[test]
    fn unavailable_and_expired_records_ignore_late_events_and_keep_no_partial_state() {
        let mut r = Readiness::default();
        r.wait_for_event("u", "h", T0).unwrap();
        r.handle_event(ev("u", 1), 2, T0);
        r.handle_timeout(T0 + PUSH_WAIT_TIMEOUT);
        assert_eq!(r.state("u"), Some(TransferState::Unavailable));
        assert_eq!(r.partial_count(), 0);
        assert_eq!(r.handle_event(ev("u", 2), 2, T0 + PUSH_WAIT_TIMEOUT), EventFate::Ignored);
        r.handle_event(ev("x", 1), 1, T0);
        r.handle_timeout(T0 + RECORD_TTL);
        assert_eq!(r.state("x"), Some(TransferState::Expired));
        assert_eq!(r.handle_event(ev("x", 1), 1, T0 + RECORD_TTL), EventFate::Ignored);
        assert_eq!(r.handle_event(ev("x", 2), 2, T0 + RECORD_TTL), EventFate::Ignored);
        assert_eq!(r.partial_count(), 0, "nothing retained for terminal records");
    }

    #[test]
    fn a_colliding_transfer_id_fails_only_the_newcomer() {
        let mut r = Readiness::default();
        r.wait_for_event("shared", "h", T0).unwrap();
        assert!(r.wait_for_event("shared", "other", T0).is_err());
        assert_eq!(r.state("shared"), Some(TransferState::WaitingEvent));
    }

    #[test]
    fn partial_sets_are_bounded_lru() {
        let mut r = Readiness::new(ReadinessConfig { max_partial: 2, ..ReadinessConfig::default() });
        for t in ["a", "b", "c"] {
            r.handle_event(ev(t, 1), 2, T0);
        }
        assert_eq!(r.partial_count(), 2);
        // "a" was dropped: its second shard alone does not complete it.
        assert_eq!(r.handle_event(ev("a", 2), 2, T0), EventFate::Partial);
        assert_eq!(r.handle_event(ev("c", 2), 2, T0), EventFate::Accepted);
    }

    #[test]
    fn loads_that_never_report_back_fail_and_cancel() {
        let mut r = Readiness::default();
        r.handle_event(ev("t", 1), 1, T0);
        r.poll_notice();
        assert!(r.begin_load("t", T0));
        r.handle_timeout(T0 + PUSH_WAIT_TIMEOUT);
        assert_eq!(r.poll_notice(), Some(Notice::Unavailable { transfer_id: "t".into(), mm_hash: "h".into() }));
        assert_eq!(r.poll_notice(), Some(Notice::CancelRemote { transfer_id: "t".into() }));
    }

    #[test]
    fn available_items_expire_and_terminal_records_are_reaped() {
        let mut r = Readiness::default();
        r.handle_event(ev("t", 1), 1, T0);
        r.poll_notice();
        r.handle_timeout(T0 + RECORD_TTL);
        assert_eq!(r.state("t"), Some(TransferState::Expired));
        assert_eq!(r.poll_notice(), Some(Notice::CancelRemote { transfer_id: "t".into() }));
        r.handle_timeout(T0 + RECORD_TTL + RECORD_TTL);
        assert_eq!(r.state("t"), None);
    }
}
