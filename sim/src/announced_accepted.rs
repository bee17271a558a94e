//! `announced-accepted`: an item every rank of its consumer announced in time is
//! accepted by the scheduler (ec-behaviour.md §6.1, §6.3: the scheduler's inbox reads
//! every shard's events, and the last missing shard makes the item available).
//!
//! `delivery-after-heal` judges the whole path and so excuses any request with a fault
//! near it. This judges the scheduler's half alone: once every rank published the
//! item's readiness (the push landed, the ranks did their part), only the event stream
//! and the scheduler stand between the item and its request. So it excuses only what can
//! break that stream: a rank or scheduler restart (a new event port, a lost
//! subscription) and any fault naming the scheduler or a rank of the consumer before the
//! request's deadline (the simulated network never retransmits a dropped segment).

use std::time::Duration;

use ctlplane_core::ec::defaults::PUSH_WAIT_TIMEOUT;

use crate::faults::FaultPlan;
use crate::hosts::world::{self, ItemFate};

/// Time for the last event to cross the link and be read: far more than the link latency
/// plus the scheduler's coalescing.
const SLACK: Duration = Duration::from_secs(1);

/// At the end of the run: every item the scheduler gave up waiting for had not been
/// announced by every rank by its deadline (less [`SLACK`]). Returns how many it judged.
pub fn check(now_ns: u64, plan: &FaultPlan) -> u64 {
    let (judged, findings) = world::with(|w| {
        let mut findings = Vec::new();
        let mut judged = 0u64;
        if w.topo.schedulers.iter().any(|s| w.incarnations.get(s).copied().unwrap_or(0) != 0) {
            return (judged, findings);
        }
        let push_wait = w.knobs.push_wait_timeout.unwrap_or(PUSH_WAIT_TIMEOUT);
        for (req, st) in w.workload.iter().zip(&w.requests) {
            let Some(consumer) = w.topo.consumers.get(req.consumer) else { continue };
            if w.rank_incarnations(req.consumer).iter().any(|(_, i)| *i != 0) {
                continue;
            }
            let deadline_ns = req.at.as_nanos() + push_wait.as_nanos() as u64;
            let deadline_ms = deadline_ns / 1_000_000;
            let stream_hit = plan.faults.iter().any(|f| {
                !f.kind.excused_per_item()
                    && f.at_ms < deadline_ms
                    && f.kind
                        .hosts()
                        .iter()
                        .any(|h| w.topo.schedulers.iter().any(|s| s == h) || consumer.ranks.iter().any(|r| r == h))
            });
            if stream_hit {
                continue;
            }
            for (item, fate) in req.items.iter().zip(&st.fates) {
                if *fate != Some(ItemFate::Unavailable) || w.loads_lost.contains_key(&item.transfer_id) {
                    continue;
                }
                let Some(ranks) = w.published.get(&(req.consumer, item.transfer_id.clone())) else { continue };
                if ranks.len() < consumer.ranks.len() {
                    continue;
                }
                let Some(last) = ranks.values().map(|t| t.as_nanos()).max() else { continue };
                judged += 1;
                if last + (SLACK.as_nanos() as u64) < deadline_ns {
                    findings.push(format!(
                        "{} of request {} (consumer {}): every rank announced it by {} ns, the scheduler gave up \
                         waiting at its deadline {} ns",
                        item.transfer_id, req.id, req.consumer, last, deadline_ns
                    ));
                }
            }
        }
        (judged, findings)
    });
    for detail in findings {
        crate::oracle::violate_at(now_ns, "announced-accepted", "engine", detail);
    }
    judged
}
