//! The race catalogue (`docs/races.md`): each known race of the reference, the scenario
//! name that replays it, the regression switches that restore it in the core, and the
//! oracles that must catch it.
//!
//! A simulator looks a scenario up with [`race`] and hands each machine its part of
//! [`Regressions`]. Races ctlplane still has carry no switches: the simulator must find
//! them with every switch off.

use crate::ec::inbox::InboxRegressions;
use crate::ec::producer::PushRegressions;
use crate::ec::request_slot::SlotRegressions;
use crate::ec::reservations::BookRegressions;
use crate::ec::scheduler::SchedulerRegressions;
use crate::ec::shard::ShardRegressions;
use crate::p2p::manager::ManagerRegressions;
use crate::p2p::T0Switches;
use crate::time::Instant;
use std::time::Duration;

/// When the `ec-s2` scenario makes the reap fail (simulated time since the run began).
pub const S2_REAP_FAULT_AT: Instant = Instant::from_secs(10);
/// The grace period the `ec-s11` scenario gives deferred reservations. The reference's
/// intermediate value is not known; 2 s is shorter than a slow write.
pub const S11_GRACE: Duration = Duration::from_secs(2);

/// Every machine's regression switches, all off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regressions {
    /// `ShardConfig::regressions`.
    pub shard: ShardRegressions,
    /// `ShardConfig::book.regressions`.
    pub book: BookRegressions,
    /// `Inbox::new`.
    pub inbox: InboxRegressions,
    /// `SchedulerConfig::regressions`.
    pub scheduler: SchedulerRegressions,
    /// `RequestSlot::with_regressions` (every control client's REQ slots).
    pub slot: SlotRegressions,
    /// `PushConfig::regressions`.
    pub push: PushRegressions,
    /// `RegistryConfig::t0`.
    pub t0: T0Switches,
    /// `p2p::manager::ManagerConfig::regressions` (the argument of `p2p::manager::admit`).
    pub manager: ManagerRegressions,
}

impl Regressions {
    /// No switch is on: ctlplane's own behaviour.
    pub fn is_fixed(&self) -> bool {
        *self == Regressions::default()
    }
}

/// One race of the catalogue.
#[derive(Clone, Copy, Debug)]
pub struct Race {
    /// The scenario name (`ctlsim replay --scenario <name>`).
    pub scenario: &'static str,
    /// One line on what goes wrong.
    pub title: &'static str,
    /// The switches that restore it; `None` when ctlplane has the race as it is.
    pub switches: Option<fn() -> Regressions>,
    /// Oracles that must catch it.
    pub oracles: &'static [&'static str],
}

impl Race {
    /// The switches of this scenario (all off for a race ctlplane still has).
    pub fn regressions(&self) -> Regressions {
        self.switches.map(|f| f()).unwrap_or_default()
    }
}

fn with(f: impl FnOnce(&mut Regressions)) -> Regressions {
    let mut r = Regressions::default();
    f(&mut r);
    r
}

/// The catalogue, in the order of `docs/races.md`.
pub const RACES: &[Race] = &[
    Race {
        scenario: "ec-s1",
        title: "an undecodable request kills the REP thread",
        switches: Some(|| with(|r| r.shard.s1_undecodable_kills_server = true)),
        oracles: &["rep-answers"],
    },
    Race {
        scenario: "ec-s2",
        title: "silent death of the control thread",
        switches: Some(|| with(|r| r.shard.s2_reap_fault_at = Some(S2_REAP_FAULT_AT))),
        oracles: &["rep-answers", "request-resolves"],
    },
    Race {
        scenario: "ec-s4",
        title: "event backlog full, oldest dropped",
        switches: None,
        oracles: &["backlog-bounded", "request-resolves", "reservation-released"],
    },
    Race {
        scenario: "ec-s5",
        title: "inline discovery blocks the scheduler",
        switches: Some(|| with(|r| r.inbox.s5_inline_discovery = true)),
        oracles: &["request-resolves"],
    },
    Race {
        scenario: "ec-s6",
        title: "subscribing to one shard only",
        switches: Some(|| with(|r| r.inbox.s6_base_shard_only = true)),
        oracles: &["accept-before-ready"],
    },
    Race {
        scenario: "ec-s8",
        title: "fallback to the base shard",
        switches: Some(|| with(|r| r.push.s8_base_fallback = true)),
        oracles: &["request-resolves"],
    },
    Race {
        scenario: "ec-s9",
        title: "a REQ socket reused after a timeout",
        switches: Some(|| with(|r| r.slot.s9_reuse_after_timeout = true)),
        oracles: &["req-lockstep", "request-resolves", "write-owned"],
    },
    Race {
        scenario: "ec-s10",
        title: "reserve executed after the producer gave up",
        switches: Some(|| with(|r| r.push.s10_no_compensating_cancel = true)),
        oracles: &["reservation-released"],
    },
    Race {
        scenario: "ec-s11",
        title: "grace-period free: a late write into freed memory",
        switches: Some(|| with(|r| r.book.s11_grace_period_free = Some(S11_GRACE))),
        oracles: &["write-owned", "no-overlap"],
    },
    Race {
        scenario: "ec-s12",
        title: "stale reservation written without refresh",
        switches: Some(|| with(|r| r.push.s12_no_refresh = true)),
        oracles: &["request-resolves"],
    },
    Race {
        scenario: "ec-s12b",
        title: "late completion completes the refreshed reservation",
        // Its world reaches a replaced record through a retried push's refresh of the
        // grant it holds as a duplicate, which only the reference's sharing allows.
        switches: Some(|| {
            with(|r| {
                r.book.s12_complete_ignores_reservation_id = true;
                r.book.dup_push_shares_grant = true;
            })
        }),
        oracles: &["accept-before-ready"],
    },
    Race {
        scenario: "ec-s13",
        title: "cancel before reserve leaves no tombstone",
        switches: Some(|| with(|r| r.book.s13_no_cancel_tombstone = true)),
        oracles: &["reservation-released"],
    },
    Race {
        scenario: "ec-s14",
        title: "a follower's refresh abandons the shared writer",
        switches: Some(|| with(|r| r.book.s14_follower_refresh_abandons_writer = true)),
        oracles: &["write-owned"],
    },
    Race {
        scenario: "ec-s16",
        title: "partial multi-shard reserve keeps the other grants",
        switches: Some(|| with(|r| r.push.s16_failed_item_keeps_grants = true)),
        oracles: &["reservation-released"],
    },
    Race {
        scenario: "ec-s17",
        title: "partial completion failure abandons before the other shards settle",
        switches: Some(|| with(|r| r.push.s17_abandon_before_settle = true)),
        oracles: &["push-settled", "request-resolves"],
    },
    Race {
        scenario: "p2p-s1",
        title: "connect assertion on a dead registration",
        // The T0 lineage's assertion ended the engine: the manager lets it escape.
        switches: Some(|| {
            with(|r| {
                r.t0.connect_refuses_any = true;
                r.manager.errors_escape = true;
            })
        }),
        oracles: &["p2p-handshake-liveness"],
    },
    Race {
        scenario: "p2p-s2",
        title: "a reconnecting peer's first message swallowed",
        switches: Some(|| with(|r| r.t0.sweep_last = true)),
        oracles: &["p2p-message-lost", "p2p-handshake-liveness"],
    },
    Race {
        scenario: "p2p-s3",
        title: "mark_dead makes close a no-op: socket leak",
        switches: Some(|| with(|r| r.t0.mark_dead_closes = true)),
        oracles: &["dealer-closed-once", "monitor-closed-once"],
    },
    Race {
        scenario: "p2p-s4",
        title: "EADDRINUSE on a reused monitor endpoint",
        // The T0 lineage's EADDRINUSE ended the engine: the manager lets it escape.
        switches: Some(|| {
            with(|r| {
                r.t0.monitor_without_seq = true;
                r.manager.errors_escape = true;
            })
        }),
        oracles: &["monitor-closed-once", "p2p-handshake-liveness"],
    },
    Race {
        scenario: "p2p-s5",
        title: "death inside a poll drops the restarted peer's Connect",
        switches: None,
        oracles: &["p2p-message-lost", "p2p-handshake-liveness"],
    },
    Race {
        scenario: "p2p-s6",
        title: "a replacement refused as a duplicate connection",
        switches: Some(|| with(|r| r.manager.s6_accept_before_reap = true)),
        oracles: &["p2p-message-lost", "p2p-handshake-liveness"],
    },
    Race {
        scenario: "p2p-s7",
        title: "identity collision at the ROUTER",
        switches: None,
        oracles: &["p2p-message-lost", "p2p-handshake-liveness"],
    },
    Race {
        scenario: "p2p-hwm",
        title: "blocking send at HWM: a peer that stops reading stalls the manager",
        switches: Some(|| with(|r| r.t0.blocking_send_at_hwm = true)),
        oracles: &["p2p-progress"],
    },
    Race {
        scenario: "p2p-s10",
        title: "socket exhaustion by unbounded peers",
        switches: None,
        oracles: &["sockets-bounded", "p2p-handshake-liveness"],
    },
    Race {
        scenario: "p2p-s18",
        title: "a forged identity makes a node dial an address of the sender's choosing",
        switches: Some(|| with(|r| r.t0.trust_identity = true)),
        oracles: &["p2p-dial-non-peer"],
    },
    Race {
        scenario: "ec-s7",
        title: "partial event-port discovery subscribes to the shards that answered",
        switches: Some(|| with(|r| r.inbox.s7_partial_subscribe = true)),
        oracles: &["accept-before-ready"],
    },
    Race {
        scenario: "ec-s24",
        title: "a colliding client-supplied transfer id stops the scheduler",
        switches: Some(|| with(|r| r.scheduler.s24_collision_raises = true)),
        oracles: &["request-resolves"],
    },
    Race {
        scenario: "ec-s20",
        title: "an orphaned push keeps its reservations",
        switches: Some(|| with(|r| r.push.s20_orphan_keeps_grants = true)),
        oracles: &["reservation-released"],
    },
    Race {
        scenario: "ec-dup-push",
        title: "two pushes of one transfer id: one's abandon frees the other's destination",
        switches: Some(|| {
            with(|r| {
                r.book.dup_push_shares_grant = true;
                r.push.dup_push_abandons_refused = true;
            })
        }),
        oracles: &["write-owned", "accept-before-ready"],
    },
];

/// The race a scenario name replays.
pub fn race(scenario: &str) -> Option<&'static Race> {
    RACES.iter().find(|r| r.scenario == scenario)
}
