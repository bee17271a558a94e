//! Oracles: the safety properties checked while a run goes on, and the liveness properties
//! checked after the faults stop and a quiet period passes.
//!
//! A host or the engine that sees a property broken calls [`violate`]; the violation is
//! traced and collected, and the run's verdict is the list [`take`] returns.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use ctlplane_core::ec::State;

use serde::Serialize;

use crate::hosts::world::{self, ItemFate};

/// One broken property.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The oracle's name, e.g. `"write-owned"`; stable, used by the race catalogue.
    pub oracle: String,
    pub t_ns: u64,
    pub host: String,
    pub detail: String,
}

thread_local! {
    static VIOLATIONS: RefCell<Vec<Violation>> = const { RefCell::new(Vec::new()) };
}

/// Forget every violation; called by the engine before a run.
pub fn reset() {
    VIOLATIONS.with(|v| v.borrow_mut().clear());
    crate::zmq::lockstep::reset();
}

/// Report a broken property on `host` at the current simulated time.
pub fn violate(oracle: &str, host: &str, detail: impl Into<String>) {
    violate_at(crate::clock::now().as_nanos(), oracle, host, detail);
}

/// Report a broken property at `t_ns` (for the engine, which is outside any host).
pub fn violate_at(t_ns: u64, oracle: &str, host: &str, detail: impl Into<String>) {
    let detail = detail.into();
    crate::trace::record_at(t_ns, host, "oracle.violation", &[("oracle", &oracle), ("detail", &detail)]);
    tracing::warn!(oracle, host, %detail, "oracle fired");
    VIOLATIONS
        .with(|v| v.borrow_mut().push(Violation { oracle: oracle.to_string(), t_ns, host: host.to_string(), detail }));
}

/// Violations so far.
pub fn count() -> usize {
    VIOLATIONS.with(|v| v.borrow().len())
}

/// End the run's verdict and hand it over.
pub fn take() -> Vec<Violation> {
    VIOLATIONS.with(|v| std::mem::take(&mut *v.borrow_mut()))
}

// ---------------------------------------------------------------------------------------
// The EC world's oracles (the P2P world's are `crate::p2p::check_safety` / `check_liveness`;
// the ownership ledger fires from the device as a write lands, `write-owned`; the
// readiness oracle from the scheduler as the core accepts an item, `accept-before-ready`).

/// Late beyond a REP's due answer time before `rep-answers` fires (the host runs in the
/// step that reaches its deadline; the timer may round up to the next millisecond).
pub const REP_SLACK: Duration = Duration::from_millis(5).saturating_add(crate::engine::COALESCE_QUIET);
/// Slack on top of `push_wait_timeout` for a request to resolve.
pub const RESOLVE_SLACK: Duration = Duration::from_secs(5);

/// From here on the EC world is settled: every fault healed at `ACTIVE`, a request
/// outstanding then has met its client timeout, and a slow handler (at most 1.5 client
/// timeouts) has answered. A request arriving later to a consumer whose ranks never
/// restarted meets a working service, so its producer pushes every item
/// (`request-resolves`), in a world whose data plane never fails a write.
pub const SETTLED: Duration =
    Duration::from_secs(crate::engine::ACTIVE.as_secs() + 2 * ctlplane_core::ec::defaults::CONTROL_TIMEOUT.as_secs());

/// `rep-answers`: what a live rank sends back is a reply its clients can read, never an
/// empty or garbled frame (a client takes one for a failed exchange, not for the refusal
/// or result the rank meant). Read with the clients' own decoder.
pub fn check_reply(host: &str, reply: &[u8]) {
    if let Err(error) = ctlplane_core::ec::wire::decode_reply(reply) {
        violate(
            "rep-answers",
            host,
            format!("a request was answered with a frame that is not a reply ({error}, {} bytes)", reply.len()),
        );
    }
}

/// Safety, after every step: for every rank whose book changed, its structural invariants
/// (no overlapping or double allocation, memory owned exactly once: `no-overlap`), the
/// event backlog bound and the drop count (`backlog-bounded`); for
/// every live rank, a request it took is answered by its due time (`rep-answers`); no
/// client sent on a REQ socket still awaiting a reply (`req-lockstep`).
pub fn check_step(now_ns: u64) {
    check_req_lockstep();
    let (dirty, owed) = world::with(|w| {
        let dirty: Vec<(String, std::rc::Rc<std::cell::RefCell<world::Shard>>)> = std::mem::take(&mut w.dirty)
            .into_iter()
            .filter_map(|h| w.ranks.get(&h).map(|r| (h, r.shard.clone())))
            .collect();
        let owed: Vec<(String, u64, u64)> = w
            .ranks
            .iter()
            .filter_map(|(h, r)| r.owed.map(|(since, by)| (h.clone(), since.as_nanos(), by.as_nanos())))
            .collect();
        (dirty, owed)
    });
    for (host, shard) in dirty {
        let s = shard.borrow();
        if let Err(e) = s.book().check_invariants() {
            violate_at(now_ns, "no-overlap", &host, e);
        }
        let bound = s.config().max_pending_events;
        if s.pending_events() > bound {
            violate_at(
                now_ns,
                "backlog-bounded",
                &host,
                format!("{} events queued, bound {bound}", s.pending_events()),
            );
        }
        let st = s.stats();
        if st.events_queued != st.events_sent + st.events_dropped + s.pending_events() as u64 {
            violate_at(
                now_ns,
                "backlog-bounded",
                &host,
                format!(
                    "queued {} != sent {} + dropped {} + pending {}",
                    st.events_queued,
                    st.events_sent,
                    st.events_dropped,
                    s.pending_events()
                ),
            );
        }
    }
    for (host, since, by) in owed {
        if now_ns > by + REP_SLACK.as_nanos() as u64 {
            violate_at(
                now_ns,
                "rep-answers",
                &host,
                format!("request received at {since} ns, due by {by} ns, unanswered at {now_ns} ns"),
            );
            // Once per request.
            world::with(|w| {
                if let Some(r) = w.ranks.get_mut(&host) {
                    r.owed = None;
                }
            });
        }
    }
}

/// `req-lockstep`: a control client never sends on a REQ socket that still awaits the reply
/// to its last request (ec-behaviour.md §5 and S9: after a timeout or an error the socket is
/// discarded and the next request uses a fresh one). The ZMQ model refuses such a send with
/// EFSM, as libzmq does, and records it (`crate::zmq::lockstep`); each one breaks the rule.
fn check_req_lockstep() {
    for r in crate::zmq::lockstep::take() {
        violate_at(
            r.t_ns,
            "req-lockstep",
            &r.host,
            format!("send on REQ socket {} (to {}) while it awaited a reply (EFSM)", r.sock, r.peers),
        );
    }
}

/// Liveness, after the faults stopped and the world was quiet: every request resolved
/// within `push_wait_timeout` plus slack (`request-resolves`), and no reservation of the
/// workload still WRITING or READY on a live rank, since the TTL moves both on
/// (`reservation-released`). Deferred reservations are the reference's documented leak when a
/// producer can no longer abandon (races S10, S11); they are counted, and flagged only when
/// their producer finished the push without sending this rank an abandon
/// ([`crate::release::never_abandoned`]).
pub fn check_ec_liveness(now_ns: u64, push_wait_timeout: Duration) -> BTreeMap<String, u64> {
    let mut stats = BTreeMap::new();
    // A scenario may configure the scheduler's wait (`Knobs::push_wait_timeout`).
    let push_wait_timeout = world::with(|w| w.knobs.push_wait_timeout).unwrap_or(push_wait_timeout);
    let bound = (push_wait_timeout + RESOLVE_SLACK).as_nanos() as u64;
    let (late, tids, ranks, young, announced) = world::with(|w| {
        let mut late = Vec::new();
        for (req, st) in w.workload.iter().zip(&w.requests) {
            // A load a lost-loads fault left unreported ends at the scheduler's LOADING
            // deadline, a push wait after the load began.
            let start = req.items.iter().filter_map(|i| w.loads_lost.get(&i.transfer_id)).max().copied();
            let start = start.map_or(req.at.as_nanos(), |l| l.as_nanos().max(req.at.as_nanos()));
            match st.resolved_at {
                None => late.push(format!("request {} (at {}) never resolved: {:?}", req.id, req.at, st.fates)),
                Some(at) if at.as_nanos() > start + bound => {
                    if !st.fates.contains(&Some(ItemFate::Aborted)) {
                        late.push(format!("request {} (at {}) resolved only at {at}", req.id, req.at));
                    }
                }
                Some(_) => {}
            }
        }
        // A request after the settled point, to a consumer whose ranks never restarted, is
        // pushed: no rank is down, unreachable or slow any more, so no reserve, write or
        // complete of its items fails. Only where the data plane never fails a write (a
        // failed write fails its push by design).
        let settled = SETTLED.as_nanos() as u64;
        let writes_fail = w.knobs.device.fail_per_million > 0;
        for (req, st) in w.workload.iter().zip(&w.requests) {
            // An aborted request's items are cancelled on its ranks: its push may fail.
            if writes_fail || req.at.as_nanos() < settled || st.fates.contains(&Some(ItemFate::Aborted)) {
                continue;
            }
            if w.rank_incarnations(req.consumer).iter().any(|(_, i)| *i != 0) {
                continue;
            }
            let failed: Vec<&str> =
                req.items.iter().map(|i| i.transfer_id.as_str()).filter(|t| w.push_failed.contains(*t)).collect();
            if !failed.is_empty() {
                late.push(format!(
                    "request {} (at {}, after every fault healed and every client timeout passed): push of {:?} failed",
                    req.id, req.at, failed
                ));
            }
        }
        // An item its producer reported pushed into its own destination on every rank,
        // while its request still waited, is announced by every rank: `complete` of a
        // live writer makes it READY (ec-behaviour.md §3.4). Only for consumers whose ranks never
        // restarted: a restarted rank loses what it had queued with its process, and its
        // new event port is not the one the scheduler subscribed to.
        for (tid, p) in &w.pushed {
            let published = w.published.get(&(p.consumer, tid.clone()));
            let restarted =
                p.incarnations.iter().any(|(h, i)| *i != 0 || w.incarnations.get(h).copied().unwrap_or(0) != *i);
            let announced = published.map_or(0, |r| r.len());
            if announced < p.incarnations.len() && !restarted {
                late.push(format!(
                    "{tid} reported pushed at {} while its request waited, announced by ranks {:?} of {}",
                    p.at,
                    published.map(|p| p.keys().copied().collect::<Vec<_>>()).unwrap_or_default(),
                    p.incarnations.len()
                ));
            }
        }
        let tids: Vec<String> = w.items.keys().cloned().collect();
        let ranks: Vec<(String, std::rc::Rc<std::cell::RefCell<world::Shard>>)> =
            w.ranks.iter().map(|(h, r)| (h.clone(), r.shard.clone())).collect();
        // READY records announced less than a TTL ago (a scenario's late encoders) have
        // not outlived it yet.
        let ttl = ctlplane_core::ec::defaults::RESERVATION_TTL.as_nanos() as u64;
        let young: std::collections::BTreeSet<(String, String)> =
            w.announced_at.iter().filter(|(_, at)| at.as_nanos() + ttl > now_ns).map(|(k, _)| k.clone()).collect();
        let announced: std::collections::BTreeSet<(String, String)> = w.announced_at.keys().cloned().collect();
        (late, tids, ranks, young, announced)
    });
    for detail in late {
        violate_at(now_ns, "request-resolves", "engine", detail);
    }
    for detail in world::with(pushed_never_available) {
        violate_at(now_ns, "request-resolves", "engine", detail);
    }
    for (host, shard) in ranks {
        let s = shard.borrow();
        for tid in &tids {
            match s.book().state_of(tid) {
                // A READY record no event announced (its rank had no subscriber, e.g. a
                // restarted consumer the scheduler never found again) is judged by the
                // deadline its rank keeps for it.
                Some(State::Ready)
                    if young.contains(&(host.clone(), tid.clone()))
                        || (!announced.contains(&(host.clone(), tid.clone()))
                            && s.book().deadline_of(tid).is_some_and(|d| d.as_nanos() > now_ns)) =>
                {
                    *stats.entry("reservations.ready_within_ttl_at_end".to_string()).or_default() += 1;
                }
                Some(state @ (State::Writing | State::Ready)) => {
                    violate_at(now_ns, "reservation-released", &host, format!("{tid} still {state} after its TTL"));
                }
                Some(state @ (State::CancelPending | State::ExpirePending)) => {
                    *stats.entry("reservations.deferred_at_end".to_string()).or_default() += 1;
                    if crate::release::never_abandoned(&host, tid) {
                        violate_at(
                            now_ns,
                            "reservation-released",
                            &host,
                            format!("{tid} still {state}, pinned for good: its producer finished without abandoning it here"),
                        );
                    }
                }
                _ => {}
            }
        }
    }
    stats
}

/// `request-resolves`, second half: an item a producer reported pushed while its request
/// waited becomes available. An item whose request failed by push-wait breaks it when a
/// rank that stayed up never published its readiness because the rank never held the
/// transfer (a push that skipped a shard) or dropped it from a full event backlog; a
/// readiness lost on the wire (published, then a link or the scheduler failed) does not.
fn pushed_never_available(w: &mut world::World) -> Vec<String> {
    let mut out = Vec::new();
    for (tid, p) in &w.held {
        let Some(&(r, i)) = w.items.get(tid) else { continue };
        if w.requests.get(r).and_then(|st| st.fates.get(i).copied().flatten()) != Some(ItemFate::Unavailable) {
            continue;
        }
        // As for the announcement check: a consumer whose ranks restarted lost state and
        // event ports the scheduler subscribed to, which push-wait covers by design.
        let restarted = w
            .topo
            .consumers
            .get(p.consumer)
            .is_some_and(|c| c.ranks.iter().any(|h| w.incarnations.get(h).copied().unwrap_or(0) != 0));
        if restarted {
            continue;
        }
        let published = w.published.get(&(p.consumer, tid.clone()));
        for (host, rank, incarnation, held) in &p.ranks {
            let Some(live) = w.ranks.get(host).filter(|l| l.incarnation == *incarnation) else { continue };
            if published.is_some_and(|s| s.contains_key(rank)) {
                continue;
            }
            let dropped = live.shard.borrow().stats().events_dropped;
            let at = p.at;
            if !held {
                out.push(format!(
                    "{tid} reported pushed at {at} while rank {host} never held it; its request failed by push-wait"
                ));
            } else if dropped > 0 {
                out.push(format!(
                    "{tid} reported pushed at {at}; rank {host} never published its readiness ({dropped} events \
                     dropped from its full backlog); its request failed by push-wait"
                ));
            }
        }
    }
    out
}
