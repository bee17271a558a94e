//! `cancel-attempts`: the scheduler's remote cancel tries each request as often as the
//! reference says, no more and no fewer (ec-behaviour.md §6.4: `peers` up to
//! [`DISCOVERY_ATTEMPTS`] times, each shard's cancel up to [`CANCEL_ATTEMPTS`] times, then
//! the shard is given up and keeps the transfer until its TTL).
//!
//! A cancel given up too early leaves a reservation to its TTL after one lost reply; one
//! retried past its bound holds the consumer's cancel lane (every later cancel waits
//! behind it). Neither changes a request's fate, so only counting shows them. A lane
//! carries one request at a time, so its requests form one sequence: a request that failed
//! is followed by the same request (a retry) until the bound, and by another only once the
//! bound is reached. Counted from what the host sends and receives, with the bounds named
//! here.

use std::collections::{BTreeMap, BTreeSet};

use ctlplane_core::ec::producer::{BatchId, Token, CANCEL_ATTEMPTS};
use ctlplane_core::ec::topology::DISCOVERY_ATTEMPTS;
use ctlplane_core::ec::wire::{decode_request, Request};
use serde_json::Value;

use crate::oracle::violate;

/// The oracle's name.
const ORACLE: &str = "cancel-attempts";

/// One request on the lane and how it went.
#[derive(Clone, Debug)]
struct Sent {
    addr: String,
    frame: Vec<u8>,
    /// Which attempt of its request this is (1 = first).
    attempt: u32,
    /// The bound of its kind.
    limit: u32,
    /// `None` while in flight; `Some(true)` when it failed (no reply, or an error reply).
    failed: Option<bool>,
    /// Its job was reported ended: the next request starts afresh.
    closed: bool,
}

/// One consumer's cancel lane, as the scheduler host sees it.
#[derive(Clone, Debug, Default)]
pub struct CancelLane {
    last: Option<Sent>,
}

impl CancelLane {
    /// The core sent `frame` to `addr` on this lane.
    pub fn sent(&mut self, host: &str, addr: &str, frame: &[u8]) {
        let limit = match decode_request(frame, usize::MAX) {
            Ok(Request::Peers) => DISCOVERY_ATTEMPTS,
            _ => CANCEL_ATTEMPTS,
        };
        let mut attempt = 1;
        if let Some(prev) = self.last.take() {
            let same = prev.addr == addr && prev.frame == frame;
            if prev.failed == Some(true) && !prev.closed {
                if same {
                    attempt = prev.attempt + 1;
                } else if prev.attempt < prev.limit {
                    gave_up_early(host, &prev);
                }
            }
        }
        self.last =
            Some(Sent { addr: addr.to_string(), frame: frame.to_vec(), attempt, limit, failed: None, closed: false });
    }

    /// The request in flight was answered (`ok`) or failed.
    pub fn answered(&mut self, host: &str, ok: bool) {
        let Some(s) = self.last.as_mut() else { return };
        s.failed = Some(!ok);
        if s.attempt > s.limit {
            violate(
                ORACLE,
                host,
                format!("{} sent to {} {} times; the bound is {}", describe(&s.frame), s.addr, s.attempt, s.limit),
            );
        }
    }

    /// The core reported the lane's job done (released, or its shards undiscovered). The
    /// next job's first request may already be in flight: it was handed out in the same
    /// step, before the report.
    pub fn job_ended(&mut self, host: &str) {
        let Some(s) = self.last.as_mut() else { return };
        match s.failed {
            None => s.attempt = 1,
            Some(failed) => {
                if failed && s.attempt < s.limit {
                    gave_up_early(host, s);
                }
                s.closed = true;
            }
        }
    }
}

fn gave_up_early(host: &str, s: &Sent) {
    violate(
        ORACLE,
        host,
        format!(
            "{} to {} given up after {} failed attempt(s); the bound is {}",
            describe(&s.frame),
            s.addr,
            s.attempt,
            s.limit
        ),
    );
}

fn describe(frame: &[u8]) -> String {
    match decode_request(frame, usize::MAX) {
        Ok(Request::Peers) => "peers".to_string(),
        Ok(Request::Cancel { transfer_id, .. }) => format!("cancel of {transfer_id}"),
        _ => "a request".to_string(),
    }
}

/// A producer's retried requests, as its host sees them: a cancel (abandon, refresh,
/// cleanup) that failed (no reply, an error, or `cancelled` not true) is sent again to the
/// same shard, [`CANCEL_ATTEMPTS`] times in all, and a `peers` that failed (no reply or
/// an error) up to [`DISCOVERY_ATTEMPTS`] times (ec-behaviour.md §1.3, §5). Each batch
/// retries its own requests, so they are told apart by batch, address and frame.
#[derive(Clone, Debug, Default)]
pub struct ProducerRetries {
    /// (batch, address, frame) to (attempts in a row, whether the last one failed; `None`
    /// in flight).
    tries: BTreeMap<Key, (u32, Option<bool>)>,
    in_flight: BTreeMap<Token, Key>,
    /// The S8 regression answers a failed `peers` with the base address instead of a
    /// retry: its discovery is not judged.
    judge_peers: bool,
}

/// A producer's request: its batch, address and frame.
type Key = (BatchId, String, Vec<u8>);

/// A request the producer retries, and its bound.
fn bound(frame: &[u8], judge_peers: bool) -> Option<u32> {
    match decode_request(frame, usize::MAX) {
        Ok(Request::Cancel { .. }) => Some(CANCEL_ATTEMPTS),
        Ok(Request::Peers) if judge_peers => Some(DISCOVERY_ATTEMPTS),
        _ => None,
    }
}

impl ProducerRetries {
    /// `judge_peers`: whether failed discoveries are retried (every world but the S8
    /// regression's).
    pub fn new(judge_peers: bool) -> Self {
        ProducerRetries { judge_peers, ..ProducerRetries::default() }
    }

    /// The producer sent `frame` to `addr` for `batch` as request `token`.
    pub fn sent(&mut self, host: &str, token: Token, batch: BatchId, addr: &str, frame: &[u8]) {
        let Some(limit) = bound(frame, self.judge_peers) else { return };
        let key = (batch, addr.to_string(), frame.to_vec());
        let entry = self.tries.entry(key.clone()).or_insert((0, Some(false)));
        // A repeat of a failed request is its retry; anything else starts afresh.
        entry.0 = if entry.1 == Some(true) { entry.0 + 1 } else { 1 };
        entry.1 = None;
        if entry.0 > limit {
            violate(
                ORACLE,
                host,
                format!(
                    "{} sent to {addr} {} times in a row after failures by {batch}; the bound is {limit}",
                    describe(frame),
                    entry.0
                ),
            );
        }
        self.in_flight.insert(token, key);
    }

    /// Request `token` was answered with `reply`.
    pub fn answered<E>(&mut self, token: Token, reply: &Result<Value, E>) {
        let Some(key) = self.in_flight.remove(&token) else { return };
        let failed = match decode_request(&key.2, usize::MAX) {
            Ok(Request::Cancel { .. }) => !matches!(reply, Ok(v) if v.get("cancelled") == Some(&Value::Bool(true))),
            _ => reply.is_err(),
        };
        if let Some(entry) = self.tries.get_mut(&key) {
            entry.1 = Some(failed);
        }
    }

    /// `batch` reported done: none of its requests will be retried any more, so one that
    /// failed fewer times than its bound was given up early. Returns the transfer ids whose
    /// cancel failed at its bound: the consumer keeps those reservations until the TTL.
    pub fn batch_done(&mut self, host: &str, batch: BatchId) -> BTreeSet<String> {
        let mut kept = BTreeSet::new();
        let keys: Vec<Key> = self
            .tries
            .range((batch, String::new(), Vec::new())..)
            .take_while(|(k, _)| k.0 == batch)
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let Some((attempts, failed)) = self.tries.remove(&key) else { continue };
            let limit = bound(&key.2, self.judge_peers).unwrap_or(0);
            if failed == Some(true) && attempts >= limit {
                if let Ok(Request::Cancel { transfer_id, .. }) = decode_request(&key.2, usize::MAX) {
                    kept.insert(transfer_id);
                }
            }
            if failed == Some(true) && attempts < limit {
                violate(
                    ORACLE,
                    host,
                    format!(
                        "{} to {} given up by {batch} after {attempts} failed attempt(s); the bound is {limit}",
                        describe(&key.2),
                        key.1
                    ),
                );
            }
        }
        kept
    }
}
