//! The main job's world, drawn per seed swarm style: each setting a race scenario of the
//! catalogue picks by hand (encoder and write durations, REQ sockets per shard, push-wait
//! timeout, batch sizes, popular or distinct items, retried encoder calls, producer
//! stalls, immediate P2P reconnects) is on for some seeds, with a value drawn from a wide
//! range, and off (production's value) for the others. So many seeds visit the default
//! world and others extreme regimes, and a race needs no hand-picked knobs to be reachable.
//!
//! Each setting draws from its own `rand_chacha` stream of the seed ([`stream`]), so adding
//! a setting never shifts another's draw. The drawn world is a plain value: it prints with
//! the seed's fault plan (`FaultPlan::world`), and a plan file replays it.
//!
//! Settings under which ctlplane is *known* not to be correct (the races it still has,
//! `docs/races.md`: no W1+ handshake deadline, unbounded P2P peers under a flood, an event
//! backlog bound that a control timeout of undrained events exceeds, and two producers
//! pushing one transfer id) are drawn only where
//! an [`Exposure`] allows them: never in the main job, and for a race ctlplane has as it
//! is in `ctlsim catalogue --generic`, since the setting is that race's only switch.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::device::DeviceConfig;
use crate::hosts::workload::{AbortConfig, RetryConfig, WorkloadConfig};
use crate::knobs::{ConsumerShutdown, Knobs, ProducerStalls};

/// RNG stream of each setting (apart from every stream the fault plan and the hosts use).
mod stream {
    pub const BASE: u64 = 0x5741_0000;
    pub const ENCODE: u64 = BASE + 1;
    pub const WRITE: u64 = BASE + 2;
    pub const SOCKETS: u64 = BASE + 3;
    pub const PUSH_WAIT: u64 = BASE + 4;
    pub const BACKLOG: u64 = BASE + 5;
    pub const BATCH: u64 = BASE + 6;
    pub const HASHES: u64 = BASE + 7;
    pub const GAP: u64 = BASE + 8;
    pub const RETRY: u64 = BASE + 9;
    pub const STALLS: u64 = BASE + 10;
    pub const RECONNECT: u64 = BASE + 11;
    pub const DEADLINE: u64 = BASE + 12;
    pub const MAX_PEERS: u64 = BASE + 13;
    pub const SHUTDOWN: u64 = BASE + 14;
    pub const LATE_WAVE: u64 = BASE + 15;
    pub const COLLIDING: u64 = BASE + 16;
    pub const REQUEST_TIMEOUT: u64 = BASE + 17;
    pub const FRAME_LIMIT: u64 = BASE + 18;
    pub const ABORT: u64 = BASE + 19;
    pub const FINGERPRINT: u64 = BASE + 20;
    pub const TOMBSTONES: u64 = BASE + 21;
    pub const SCHEDULER_TIMEOUT: u64 = BASE + 22;
    pub const EMPTY: u64 = BASE + 23;
    pub const BACKOFF: u64 = BASE + 24;
    pub const HANDLER_SPACING: u64 = BASE + 25;
    pub const WILDCARD: u64 = BASE + 26;
}

/// The production reservation TTL and refresh age the encoder regimes straddle.
const REFRESH_AGE_MS: u64 = 150_000;
const TTL_MS: u64 = 300_000;
/// The longest push wait: a request of the active phase must resolve (its wait plus the
/// oracle's 5 s) before the run ends (`engine::END`), and its TTL of cancelled leftovers
/// with it.
const MAX_PUSH_WAIT_MS: u64 = 450_000;
/// A late wave's last request resolves (push wait plus the oracle's 5 s) this long before
/// the run ends, at the latest.
const LATE_WAVE_MARGIN_MS: u64 = 10_000;

/// Which settings of a race ctlplane still has a draw may turn on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Exposure {
    /// An event backlog bound of 4 to 64 (`ec-s4`).
    pub small_backlog: bool,
    /// P2P sessions without the W1+ handshake deadline (`p2p-s5`, `p2p-s7`).
    pub no_handshake_deadline: bool,
    /// No `max_peers` bound however many peers a flood names (`p2p-s10`).
    pub unbounded_peers: bool,
    /// Retried encoder calls that push the same transfer ids from a second producer
    /// (`ec-s12b`). Open in ctlplane (`docs/races.md`, "Found by the swarmed world"): when
    /// one of the two pushes fails on some rank, its cleanup abandons the grant the two
    /// share on the others, and the other push writes into the freed reservation.
    pub shared_transfer_ids: bool,
}

impl Exposure {
    /// The exposure of a race ctlplane has as it is (none for the others).
    pub fn of(scenario: &str) -> Self {
        match scenario {
            "ec-s4" => Exposure { small_backlog: true, ..Exposure::default() },
            "p2p-s5" | "p2p-s7" => Exposure { no_handshake_deadline: true, ..Exposure::default() },
            "p2p-s10" => Exposure { unbounded_peers: true, no_handshake_deadline: true, ..Exposure::default() },
            "ec-s12b" | "ec-dup-push" => Exposure { shared_transfer_ids: true, ..Exposure::default() },
            _ => Exposure::default(),
        }
    }
}

/// Retried encoder calls (`WorkloadConfig::retry`), ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryDraw {
    pub per_mille: u32,
    pub after_ms: (u64, u64),
    pub encode_ms: (u64, u64),
}

/// Aborted requests (`WorkloadConfig::abort`), ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortDraw {
    pub per_mille: u32,
    pub after_ms: (u64, u64),
}

/// Producer stalls (`Knobs::producer_stalls`), ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StallDraw {
    pub mean_gap_ms: u64,
    pub length_ms: (u64, u64),
}

/// One seed's world: `None` / `false` is production's setting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorldSwarm {
    /// Encoder run, shortest and longest (default 0 to 40 ms).
    pub encode_ms: Option<(u64, u64)>,
    /// Device write setup and jitter (default 20 us and 200 us).
    pub write_ms: Option<(u64, u64)>,
    /// REQ sockets the producer keeps per shard address (default 1).
    pub sockets_per_shard: Option<usize>,
    /// The scheduler's push-wait timeout (default 60 s).
    pub push_wait_ms: Option<u64>,
    /// Event backlog bound of every shard (default 4096).
    pub max_pending_events: Option<usize>,
    /// Items per request, at most (default 3).
    pub max_items: Option<usize>,
    /// Distinct mm_hashes (default 64): few make popular items and followers, many make
    /// distinct items and pool pressure.
    pub hashes: Option<usize>,
    /// Mean gap between requests (default 80 ms).
    pub mean_gap_ms: Option<u64>,
    /// Retried encoder calls on the other producer, with the same transfer ids (only
    /// under an [`Exposure`]).
    pub retry: Option<RetryDraw>,
    /// Producer control threads stall now and then.
    pub producer_stalls: Option<StallDraw>,
    /// A reaped P2P session reconnects within the same tick.
    pub immediate_reconnect: bool,
    /// The P2P managers' reconnect backoff, shortest and longest delay, ms: half the time
    /// a fixed delay, as a deployment that sets one (default 200 to 1,000 ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p2p_backoff_ms: Option<(u64, u64)>,
    /// A P2P handler's faulted failures come every 2nd or 3rd message, never in a row
    /// (default: in a row).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub handler_spacing: Option<u32>,
    /// P2P sessions without the W1+ handshake deadline (only under an [`Exposure`]).
    pub no_handshake_deadline: bool,
    /// `RegistryConfig::max_peers` of every P2P peer (default unbounded).
    pub max_peers: Option<usize>,
    /// A consumer's workers close cleanly during the workload, writers possibly in
    /// flight, and start again (default: none closes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shutdown: Option<ShutdownDraw>,
    /// A second wave of requests (start, span; ms) after the heal and the settling time
    /// (`crate::delivery::SETTLE`), so the progress oracle `delivery-after-heal` judges a
    /// world whose faults are gone (default: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub late_wave_ms: Option<(u64, u64)>,
    /// Per mille of workload requests another client's request collides with: it names the
    /// request's first transfer id for another mm_hash (race S24; default: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub colliding_per_mille: Option<u32>,
    /// The first producer's requests end this long after they arrive, their push bound or
    /// not (race S20: an unbound batch is orphaned; default: a request waits for its push).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_timeout_ms: Option<u64>,
    /// P2P peers run with a frame limit, bytes: half the time the T2 lineage's
    /// `MAX_CONTROL_MESSAGE_BYTES`, half the time 4 KiB to 1 MiB, so that an oversize
    /// message is cheap to make (default: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p2p_frame_limit: Option<usize>,
    /// Clients abort some requests before they resolve: the scheduler finishes them and
    /// cancels their items while the pushes may still be on the way (default: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abort: Option<AbortDraw>,
    /// The configuration fingerprint every P2P peer announces (default: none, the
    /// wildcard), so the handshake compares two set fingerprints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p2p_fingerprint: Option<u64>,
    /// With a fingerprint, the index of the P2P peer that announces the empty wildcard
    /// instead (default: none does).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p2p_wildcard_peer: Option<usize>,
    /// Each rank keeps at most this many tombstones, few enough that cancels and expiries
    /// reach the bound (default: the book's 65,536).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tombstone_limit: Option<usize>,
    /// The scheduler's `control_timeout_s`, ms: short enough that a remote cancel's
    /// requests (its `peers` among them) fail inside a partition or crash more than once
    /// in a row (default: 30 s).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler_timeout_ms: Option<u64>,
    /// Every `k`-th mm_hash is a zero-byte tensor, whose reservation holds no slab memory.
    pub empty_every: Option<usize>,
}

/// A clean consumer close (`Knobs::consumer_shutdown`), ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownDraw {
    pub consumer: usize,
    pub at_ms: u64,
    pub down_ms: u64,
}

fn rng(seed: u64, stream: u64) -> ChaCha8Rng {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    r.set_stream(stream);
    r
}

/// Log-uniform in `[lo, hi]`: as many draws per decade, so the short end is visited too.
fn log_uniform(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> u64 {
    let (l, h) = ((lo.max(1) as f64).ln(), (hi.max(lo).max(1) as f64).ln());
    let v = rng.gen_range(0.0..=1.0f64);
    ((l + (h - l) * v).exp().round() as u64).clamp(lo, hi.max(lo))
}

/// Encoder run time: one of four regimes, so the thresholds are crossed from both sides.
fn draw_encode(rng: &mut ChaCha8Rng) -> (u64, u64) {
    match rng.gen_range(0..4) {
        // Seconds: longer than a write, the grace and some client timeouts.
        0 => {
            let max = log_uniform(rng, 500, 30_000);
            (rng.gen_range(0..=max / 2), max)
        }
        // Around the refresh age.
        1 => {
            let lo = rng.gen_range(REFRESH_AGE_MS - 15_000..=REFRESH_AGE_MS);
            (lo, lo + rng.gen_range(0..=15_000))
        }
        // Past the TTL.
        2 => {
            let lo = rng.gen_range(TTL_MS + 1_000..=TTL_MS + 60_000);
            (lo, lo + rng.gen_range(0..=60_000))
        }
        // Anywhere from milliseconds to past the TTL.
        _ => {
            let max = log_uniform(rng, 10, TTL_MS + 120_000);
            (log_uniform(rng, 0, max), max)
        }
    }
}

impl WorldSwarm {
    /// The world of `seed`, with the settings of `exposure` allowed.
    pub fn draw(seed: u64, exposure: Exposure) -> Self {
        let on = |stream: u64, p: f64| {
            let mut r = rng(seed, stream);
            r.gen_bool(p).then_some(r)
        };
        let encode_ms = on(stream::ENCODE, 0.6).map(|mut r| draw_encode(&mut r));
        let write_ms = on(stream::WRITE, 0.5).map(|mut r| (r.gen_range(0..=3_000), r.gen_range(0..=10_000)));
        let sockets_per_shard = on(stream::SOCKETS, 0.5).map(|mut r| r.gen_range(2..=6));
        // Half the time anywhere, half the time long enough to outlast the encoder (so an
        // item is still wanted when its write lands): independent draws would rarely pair
        // an encoder past the TTL with a wait past it.
        let push_wait_ms = on(stream::PUSH_WAIT, 0.6).map(|mut r| {
            if r.gen_bool(0.5) {
                log_uniform(&mut r, 5_000, MAX_PUSH_WAIT_MS)
            } else {
                let encoder = encode_ms.map_or(40, |(_, hi)| hi);
                (encoder + r.gen_range(10_000..=120_000)).min(MAX_PUSH_WAIT_MS)
            }
        });
        let max_pending_events =
            if exposure.small_backlog { on(stream::BACKLOG, 0.7).map(|mut r| r.gen_range(4..=64)) } else { None };
        let max_items = on(stream::BATCH, 0.4).map(|mut r| r.gen_range(1..=8));
        let hashes = on(stream::HASHES, 0.5).map(|mut r| log_uniform(&mut r, 2, 4096) as usize);
        let mean_gap_ms = on(stream::GAP, 0.3).map(|mut r| log_uniform(&mut r, 40, 800));
        let retry = on(stream::RETRY, 0.5).filter(|_| exposure.shared_transfer_ids).map(|mut r| {
            let after = log_uniform(&mut r, 10, 5_000);
            let encode = if r.gen_bool(0.5) {
                draw_encode(&mut r)
            } else {
                let lo = log_uniform(&mut r, 0, 1_000);
                (lo, lo + r.gen_range(0..=1_000))
            };
            RetryDraw {
                per_mille: r.gen_range(50..=1000),
                after_ms: (after, after + r.gen_range(0..=after)),
                encode_ms: encode,
            }
        });
        let producer_stalls = on(stream::STALLS, 0.2).map(|mut r| {
            let lo = r.gen_range(200..=3_000);
            StallDraw { mean_gap_ms: r.gen_range(5_000..=30_000), length_ms: (lo, lo + r.gen_range(0..=4_000)) }
        });
        let immediate_reconnect = on(stream::RECONNECT, 0.5).is_some();
        let p2p_backoff_ms = on(stream::BACKOFF, 0.3).map(|mut r| {
            let lo = r.gen_range(50..=1_000);
            if r.gen_bool(0.5) {
                (lo, lo)
            } else {
                (lo, lo + r.gen_range(1..=2_000))
            }
        });
        let handler_spacing = on(stream::HANDLER_SPACING, 0.3).map(|mut r| r.gen_range(2..=3));
        let no_handshake_deadline = exposure.no_handshake_deadline && on(stream::DEADLINE, 0.5).is_some();
        let max_peers = on(stream::MAX_PEERS, 0.3).map(|mut r| r.gen_range(16..=300));
        // Within the workload, so writers are about; the restart comes before the heal.
        let shutdown = on(stream::SHUTDOWN, 0.3).map(|mut r| ShutdownDraw {
            consumer: r.gen_range(0..=1),
            at_ms: r.gen_range(1_000..=14_000),
            down_ms: r.gen_range(0..=3_000),
        });
        // Only where the wave's last request can still resolve before the run ends.
        let wait = push_wait_ms.unwrap_or(ctlplane_core::ec::defaults::PUSH_WAIT_TIMEOUT.as_millis() as u64);
        let late_wave_ms = on(stream::LATE_WAVE, 0.5)
            .map(|mut r| {
                let settled = (crate::engine::ACTIVE + crate::delivery::SETTLE).as_millis() as u64;
                (settled + r.gen_range(0..=10_000), r.gen_range(2_000..=10_000))
            })
            .filter(|(start, span)| start + span + wait + LATE_WAVE_MARGIN_MS <= crate::engine::END.as_millis() as u64);
        let colliding_per_mille = on(stream::COLLIDING, 0.25).map(|mut r| log_uniform(&mut r, 5, 300) as u32);
        let request_timeout_ms = on(stream::REQUEST_TIMEOUT, 0.15).map(|mut r| log_uniform(&mut r, 1_000, 120_000));
        let p2p_frame_limit = on(stream::FRAME_LIMIT, 0.4).map(|mut r| {
            if r.gen_bool(0.5) {
                ctlplane_core::p2p::registry::MAX_CONTROL_MESSAGE_BYTES
            } else {
                1 << r.gen_range(12..=20)
            }
        });
        // From before the push lands to around the push wait.
        let abort = on(stream::ABORT, 0.3).map(|mut r| {
            let lo = log_uniform(&mut r, 1, 60_000);
            AbortDraw { per_mille: log_uniform(&mut r, 5, 500) as u32, after_ms: (lo, lo + r.gen_range(0..=lo)) }
        });
        let p2p_fingerprint = on(stream::FINGERPRINT, 0.5).map(|mut r| r.gen());
        let p2p_wildcard_peer =
            on(stream::WILDCARD, 0.5).filter(|_| p2p_fingerprint.is_some()).map(|mut r| r.gen_range(0..4));
        let tombstone_limit = on(stream::TOMBSTONES, 0.3).map(|mut r| log_uniform(&mut r, 1, 256) as usize);
        let scheduler_timeout_ms = on(stream::SCHEDULER_TIMEOUT, 0.3).map(|mut r| log_uniform(&mut r, 500, 10_000));
        let empty_every = on(stream::EMPTY, 0.2).map(|mut r| r.gen_range(2..=12));
        WorldSwarm {
            encode_ms,
            write_ms,
            sockets_per_shard,
            push_wait_ms,
            max_pending_events,
            max_items,
            hashes,
            mean_gap_ms,
            retry,
            producer_stalls,
            immediate_reconnect,
            p2p_backoff_ms,
            handler_spacing,
            no_handshake_deadline,
            max_peers,
            shutdown,
            late_wave_ms,
            colliding_per_mille,
            request_timeout_ms,
            p2p_frame_limit,
            abort,
            p2p_fingerprint,
            p2p_wildcard_peer,
            tombstone_limit,
            scheduler_timeout_ms,
            empty_every,
        }
    }

    /// The knobs a run of this world uses.
    pub fn knobs(&self) -> Knobs {
        let d = Duration::from_millis;
        let mut workload = WorkloadConfig::default();
        if let Some((lo, hi)) = self.encode_ms {
            workload.min_encode = d(lo);
            workload.max_encode = d(hi.max(lo));
        }
        if let Some(n) = self.max_items {
            workload.max_items = n.max(1);
        }
        if let Some(n) = self.hashes {
            workload.hashes = n.max(1);
        }
        workload.empty_every = self.empty_every;
        if let Some(g) = self.mean_gap_ms {
            workload.mean_gap = d(g.max(1));
        }
        workload.late_wave = self.late_wave_ms.map(|(start, span)| (d(start), d(span)));
        workload.retry = self.retry.map(|r| RetryConfig {
            per_mille: r.per_mille,
            after: (d(r.after_ms.0), d(r.after_ms.1)),
            encode: (d(r.encode_ms.0), d(r.encode_ms.1)),
        });
        workload.abort =
            self.abort.map(|a| AbortConfig { per_mille: a.per_mille, after: (d(a.after_ms.0), d(a.after_ms.1)) });
        let mut device = DeviceConfig::default();
        if let Some((setup, jitter)) = self.write_ms {
            device.setup = d(setup);
            device.jitter = d(jitter);
        }
        Knobs {
            workload,
            device,
            max_pending_events: self.max_pending_events,
            push_wait_timeout: self.push_wait_ms.map(d),
            p2p_no_handshake_deadline: self.no_handshake_deadline,
            p2p_max_peers: self.max_peers,
            p2p_frame_limit: self.p2p_frame_limit,
            p2p_immediate_reconnect: self.immediate_reconnect,
            p2p_handler_spacing: self.handler_spacing,
            p2p_backoff: self.p2p_backoff_ms.map(|(lo, hi)| (d(lo), d(hi.max(lo)))),
            p2p_config_fingerprint: self.p2p_fingerprint,
            p2p_wildcard_peer: self.p2p_wildcard_peer,
            tombstone_limit: self.tombstone_limit,
            scheduler_control_timeout: self.scheduler_timeout_ms.map(d),
            producer_sockets_per_shard: self.sockets_per_shard,
            producer_stalls: self
                .producer_stalls
                .map(|s| ProducerStalls { mean_gap: d(s.mean_gap_ms), length: (d(s.length_ms.0), d(s.length_ms.1)) }),
            colliding_ids_per_mille: self.colliding_per_mille,
            producer_request_timeout: self.request_timeout_ms.map(d),
            // One producer's requests time out; the other's wait for their pushes.
            producer_request_timeout_on: self.request_timeout_ms.map(|_| 0),
            consumer_shutdown: self.shutdown.map(|s| ConsumerShutdown {
                consumer: s.consumer,
                at: d(s.at_ms),
                down: d(s.down_ms),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_draw_is_a_function_of_the_seed_and_visits_default_and_extreme_worlds() {
        let worlds: Vec<WorldSwarm> = (0..200).map(|s| WorldSwarm::draw(s, Exposure::default())).collect();
        assert_eq!(worlds[7], WorldSwarm::draw(7, Exposure::default()));
        assert!(worlds.iter().any(|w| w.encode_ms.is_none()));
        assert!(worlds.iter().any(|w| w.encode_ms.is_some_and(|(_, hi)| hi > TTL_MS)));
        assert!(worlds.iter().any(|w| w.encode_ms.is_some_and(|(lo, hi)| lo < REFRESH_AGE_MS && hi > REFRESH_AGE_MS)));
        assert!(worlds.iter().any(|w| w.hashes.is_some() && w.sockets_per_shard.is_some()));
        assert!(worlds.iter().any(|w| w.abort.is_some()) && worlds.iter().any(|w| w.abort.is_none()));
        // Short scheduler timeouts, as well as production's 30 s.
        assert!(worlds.iter().any(|w| w.scheduler_timeout_ms.is_none()));
        assert!(worlds.iter().any(|w| w.scheduler_timeout_ms.is_some_and(|t| t < 1_000)));
        assert!(worlds.iter().all(|w| w.scheduler_timeout_ms.is_none_or(|t| (500..=10_000).contains(&t))));
        // Some worlds hold zero-byte tensors; most do not.
        assert!(worlds.iter().filter(|w| w.empty_every.is_some()).count() > 20);
        assert!(worlds.iter().filter(|w| w.empty_every.is_none()).count() > 100);
        assert!(worlds.iter().all(|w| w.empty_every.is_none_or(|k| (2..=12).contains(&k))));
        // Fixed reconnect delays as well as ranges; spaced handler failures; a wildcard
        // peer only where the others announce a fingerprint.
        assert!(worlds.iter().any(|w| w.p2p_backoff_ms.is_some_and(|(lo, hi)| lo == hi)));
        assert!(worlds.iter().any(|w| w.p2p_backoff_ms.is_some_and(|(lo, hi)| lo < hi)));
        assert!(worlds.iter().any(|w| w.handler_spacing.is_some()));
        assert!(worlds.iter().all(|w| w.handler_spacing.is_none_or(|k| (2..=3).contains(&k))));
        assert!(worlds.iter().any(|w| w.p2p_wildcard_peer.is_some()));
        assert!(worlds.iter().all(|w| w.p2p_wildcard_peer.is_none() || w.p2p_fingerprint.is_some()));
        assert!(worlds.iter().all(|w| !w.no_handshake_deadline && w.max_pending_events.is_none()));
        assert!(worlds.iter().all(|w| w.retry.is_none()));
        let exposed: Vec<WorldSwarm> = (0..50).map(|s| WorldSwarm::draw(s, Exposure::of("p2p-s5"))).collect();
        assert!(exposed.iter().any(|w| w.no_handshake_deadline));
        assert!((0..50).any(|s| WorldSwarm::draw(s, Exposure::of("ec-s12b")).retry.is_some()));
    }

    #[test]
    fn an_exposure_changes_only_its_own_setting() {
        for seed in 0..50 {
            let plain = WorldSwarm::draw(seed, Exposure::default());
            let exposed = WorldSwarm::draw(seed, Exposure::of("ec-s4"));
            assert_eq!(WorldSwarm { max_pending_events: None, ..exposed }, plain);
        }
    }
}
