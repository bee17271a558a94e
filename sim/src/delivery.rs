//! The `delivery-after-heal` oracle: progress, not only safety. An item pushed with no
//! fault in its way is delivered: the scheduler accepts its readiness from every rank and
//! the ranks load it.
//!
//! "No fault in its way" (conservative, docs/simulator.md):
//! - no fault of the plan names an EC host (a producer, a consumer rank, the scheduler:
//!   any of them can hold up the item, through the producer's sockets, the scheduler's
//!   blocking discovery, or a follower of another push) and overlaps the item's window,
//!   from [`SETTLE`] before its request arrives to the request's deadline (arrival plus
//!   push wait plus [`crate::oracle::RESOLVE_SLACK`]). [`SETTLE`] lets every request in
//!   flight at the heal meet its client timeout and every slow handler answer;
//! - its consumer's ranks never restarted (crash, or a clean close of the world's
//!   `consumer_shutdown`), so the scheduler's subscription and the ranks' books are the
//!   ones the push met;
//! - no device write of its mm_hash failed anywhere (the data plane's seeded failures fail
//!   a push by design, and a follower shares its writer's fate);
//! - its consumer refused no push for a full buffer pool from [`SETTLE`] before it arrived
//!   to its deadline (capacity pressure refuses pushes by design);
//! - the world leaves it time: its encoder run, the longest write, three of the longest
//!   producer stalls and the slack fit in the push wait, in the reservation TTL and in
//!   the producer request's own timeout, when the world draws one; and
//!   no setting ctlplane is known to be wrong under (an [`crate::world_swarm::Exposure`])
//!   is on.

use std::time::Duration;

use ctlplane_core::ec::defaults::{CONTROL_TIMEOUT, PUSH_WAIT_TIMEOUT, RESERVATION_TTL};

use crate::faults::FaultPlan;
use crate::hosts::world::{self, ItemFate, World};

/// After a fault heals, how long its effects may last: a request in flight met its client
/// timeout, and a slow handler (at most 1.5 client timeouts) answered.
pub const SETTLE: Duration = Duration::from_secs(2 * CONTROL_TIMEOUT.as_secs());

/// Judges every unhindered request at the end of the run; returns how many it judged.
pub fn check(now_ns: u64, plan: &FaultPlan) -> u64 {
    let (judged, findings) = world::with(|w| undelivered(w, plan));
    for detail in findings {
        crate::oracle::violate_at(now_ns, "delivery-after-heal", "engine", detail);
    }
    judged
}

fn undelivered(w: &World, plan: &FaultPlan) -> (u64, Vec<String>) {
    let k = &w.knobs;
    if k.max_pending_events.is_some() || k.workload.retry.is_some() {
        return (0, Vec::new());
    }
    let push_wait = k.push_wait_timeout.unwrap_or(PUSH_WAIT_TIMEOUT);
    let write = k.device.setup + k.device.jitter + Duration::from_secs(1);
    let stalls = k.producer_stalls.map_or(Duration::ZERO, |s| 3 * s.length.1);
    let fault_windows = |hosts: &[&str]| -> Vec<(u64, u64)> {
        plan.faults
            .iter()
            .filter(|f| !f.kind.excused_per_item())
            .filter(|f| f.kind.hosts().iter().any(|h| hosts.contains(h)))
            .map(|f| (f.at_ms, f.at_ms + f.kind.span_ms()))
            .collect()
    };
    let settle_ms = SETTLE.as_millis() as u64;
    let window = |req: &crate::hosts::workload::Request| {
        let at_ms = req.at.as_nanos() / 1_000_000;
        (at_ms, at_ms + (push_wait + crate::oracle::RESOLVE_SLACK).as_millis() as u64)
    };
    // A request alone: time enough, no fault on its own path (the scheduler, its
    // consumer's ranks, its producer) in its window, no restarted rank, no failed write.
    let healed_ms = plan.end_ms() + settle_ms;
    let alone = |req: &crate::hosts::workload::Request| {
        let needs = req.encode + write + stalls + crate::oracle::RESOLVE_SLACK;
        // A producer request that ends first orphans its push (race S20, by design).
        let request_ends = k.request_timeout_of(req.producer).is_some_and(|t| needs > t);
        if needs > push_wait || needs > RESERVATION_TTL || request_ends {
            return false;
        }
        let (at_ms, deadline_ms) = window(req);
        let pressure = req.items.iter().any(|i| w.write_failed.contains(&i.mm_hash))
            || w.pool_full.iter().any(|&(c, t)| {
                let t_ms = t.as_nanos() / 1_000_000;
                c == req.consumer && t_ms < deadline_ms && t_ms + settle_ms > at_ms
            });
        // A restarted rank binds a new ephemeral event port and the scheduler's inbox
        // never re-discovers (docs/ec-behaviour.md §6.1): its events are lost for good.
        let restarted = w.rank_incarnations(req.consumer).iter().any(|(_, i)| *i != 0);
        let load_lost = req.items.iter().any(|i| w.loads_lost.contains_key(&i.transfer_id));
        if pressure || restarted || load_lost {
            return false;
        }
        let mut path: Vec<&str> = w.topo.schedulers.iter().map(String::as_str).collect();
        if let Some(c) = w.topo.consumers.get(req.consumer) {
            path.extend(c.ranks.iter().map(String::as_str));
        }
        path.extend(w.topo.producers.get(req.producer).map(String::as_str));
        // A fault between the scheduler and a rank of its consumer at any time before the
        // deadline: a segment the simulated network dropped in a partition is never
        // retransmitted, so the event stream it belonged to stays silent for good while
        // both ends hold it open (docs/simulator.md, "Network fidelity").
        // Garbage in place of requests (`Malformed`) drops no segment: its own window is
        // excuse enough.
        let event_path = plan.faults.iter().any(|f| {
            let hosts = f.kind.hosts();
            f.at_ms < deadline_ms
                && !matches!(f.kind, crate::faults::FaultKind::Malformed { .. })
                && hosts.iter().any(|h| w.topo.schedulers.iter().any(|s| s == h))
                && hosts.iter().any(|h| path.contains(h) && !w.topo.schedulers.iter().any(|s| s == h))
        });
        // After every fault healed and settled, nothing else excuses a request.
        if at_ms >= healed_ms {
            return !event_path;
        }
        !event_path && !fault_windows(&path).iter().any(|&(from, to)| from < deadline_ms && to + settle_ms > at_ms)
    };
    // A request its client aborted is not owed a delivery.
    let eligible: Vec<bool> = w
        .workload
        .iter()
        .zip(&w.requests)
        .map(|(req, st)| !st.fates.contains(&Some(ItemFate::Aborted)) && alone(req))
        .collect();
    let mut out = Vec::new();
    let mut judged = 0;
    for (r, (req, st)) in w.workload.iter().zip(&w.requests).enumerate() {
        if !eligible[r] {
            continue;
        }
        // Every request of the consumer sharing an mm_hash with it and arriving before its
        // deadline must be unhindered too, unless it loaded that item and resolved before
        // this one arrived: one still running may hold the writer this one follows, and
        // one that failed may leave the hash's record behind.
        let deadline = window(req).1;
        let hindered = w.workload.iter().zip(&w.requests).enumerate().any(|(o, (other, other_st))| {
            !eligible[o]
                && other.consumer == req.consumer
                && window(other).0 < deadline
                && other.items.iter().zip(&other_st.fates).any(|(x, fate)| {
                    req.items.iter().any(|i| i.mm_hash == x.mm_hash)
                        && (*fate != Some(ItemFate::Loaded) || other_st.resolved_at.is_none_or(|t| t >= req.at))
                })
        });
        if hindered {
            continue;
        }
        judged += 1;
        let missing: Vec<(&str, Option<ItemFate>)> = req
            .items
            .iter()
            .zip(&st.fates)
            .filter(|(_, f)| **f != Some(ItemFate::Loaded))
            .map(|(i, f)| (i.transfer_id.as_str(), *f))
            .collect();
        if !missing.is_empty() {
            out.push(format!(
                "request {} (at {}, consumer {}, no fault in its way) not delivered: {missing:?}",
                req.id, req.at, req.consumer
            ));
        }
    }
    (judged, out)
}
