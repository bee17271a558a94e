//! Settings of the simulated world that a scenario may change beyond its regression
//! switches and fault bias: the workload's shape, the device's timing, a tighter bound.
//! The defaults are the production values every plain topology runs with; a race scenario
//! (`crate::scenario`) changes only what makes its race reachable, and its fixed run uses
//! the same knobs, so a difference between the two runs is the switch alone.

use std::time::Duration;

use crate::device::DeviceConfig;
use crate::hosts::workload::WorkloadConfig;

/// Per-scenario world settings.
#[derive(Clone, Debug, Default)]
pub struct Knobs {
    /// Which requests arrive, when, and what they carry.
    pub workload: WorkloadConfig,
    /// Write timing and failure rate of the data plane.
    pub device: DeviceConfig,
    /// Event backlog bound of every shard (`ShardConfig::max_pending_events`); `None`
    /// keeps the shard's default.
    pub max_pending_events: Option<usize>,
    /// The scheduler's `push_wait_timeout_s` (extra config, production default 60 s): how
    /// long a request waits for an item's readiness; `None` keeps the default.
    pub push_wait_timeout: Option<Duration>,
    /// P2P sessions without the W1+ handshake deadline (`SessionConfig::handshake_timeout =
    /// None`, mainline W1 and ctlplane's default configuration). Off: the simulated peers
    /// give a session 30 s to handshake, which heals a lost Connect.
    pub p2p_no_handshake_deadline: bool,
    /// `RegistryConfig::max_peers` of every P2P peer; `None` = unbounded (the default).
    pub p2p_max_peers: Option<usize>,
    /// Every P2P peer's frame limit (`RegistryConfig::max_message_bytes` and its sockets'
    /// `maxmsgsize`, the T2 lineage's `MAX_CONTROL_MESSAGE_BYTES`); `None` (the default):
    /// no limit.
    pub p2p_frame_limit: Option<usize>,
    /// A P2P peer whose session was reaped connects again within the same manager tick (a
    /// request naming the peer arrives right away), instead of after a 200-1000 ms backoff.
    /// A session that died of a protocol error still backs off, so its Disconnect goes out.
    pub p2p_immediate_reconnect: bool,
    /// Every P2P peer's reconnect backoff (`ManagerConfig::backoff`), shortest and longest
    /// delay; `None` keeps the manager's 200 ms to 1 s. Equal ends are a fixed delay.
    pub p2p_backoff: Option<(Duration, Duration)>,
    /// A handler-failures fault's failures come every k-th message from the peer, never in
    /// a row, so a handled message between two of them starts the count again; `None`:
    /// in a row.
    pub p2p_handler_spacing: Option<u32>,
    /// The configuration fingerprint every P2P peer announces in its Connect (a
    /// deployment that sets one); `None` (the default): the empty wildcard.
    pub p2p_config_fingerprint: Option<u64>,
    /// With a fingerprint set, the P2P peer at this index of the world's peers announces
    /// the empty wildcard instead (a node not yet configured with one), which every
    /// handshake accepts; `None`: every peer announces the same.
    pub p2p_wildcard_peer: Option<usize>,
    /// Tombstones (cancelled and expired records) each rank keeps at most
    /// (`BookConfig::tombstone_limit`); `None` keeps the book's default, which no run fills.
    pub tombstone_limit: Option<usize>,
    /// The scheduler's control timeout (`control_timeout_s`, every REQ exchange of its
    /// discovery and remote cancels); `None` keeps the production default of 30 s.
    pub scheduler_control_timeout: Option<Duration>,
    /// REQ sockets the producer host keeps per shard address (its worker threads' sockets,
    /// ec-behaviour.md §5: one per (thread, address)), and so the coordinator's
    /// `PushConfig::max_requests_per_shard`; `None` = one, the default.
    pub producer_sockets_per_shard: Option<usize>,
    /// Producer stalls: now and then a producer's control threads stop for a while (the
    /// encoder's model thread holds the interpreter, a long garbage collection), and a
    /// control request due during a stall leaves when it ends. The transfer engine's
    /// writes run on threads of their own and go on. `None` (production's idle encoders):
    /// no stall.
    pub producer_stalls: Option<ProducerStalls>,
    /// Colliding client-supplied transfer ids (ec-behaviour.md S24), per mille of the
    /// workload's requests: right after such a request reaches the scheduler, a second
    /// client request names its first item's transfer id for another mm_hash. Only the
    /// scheduler sees it (no encoder call is made for it); `None` (production's proxy
    /// mints every id): none.
    pub colliding_ids_per_mille: Option<u32>,
    /// A producer request ends this long after it arrived, whether or not its encoder
    /// output was bound (an aborted or timed-out request): a batch still waiting for its
    /// source is orphaned (`PushCoordinator::orphan`, EC S20). `None`: requests end only
    /// once their push is done.
    pub producer_request_timeout: Option<Duration>,
    /// Only this producer (an index into `Topology::producers`) applies
    /// `producer_request_timeout`; `None`: every producer does.
    pub producer_request_timeout_on: Option<usize>,
    /// One consumer replica's workers close cleanly (ec-behaviour.md §3.7, race S21) and
    /// start again; `None` (production's steady state): no worker closes.
    pub consumer_shutdown: Option<ConsumerShutdown>,
}

impl Knobs {
    /// The request timeout `producer` (an index into `Topology::producers`) applies, if any.
    pub fn request_timeout_of(&self, producer: usize) -> Option<Duration> {
        self.producer_request_timeout.filter(|_| self.producer_request_timeout_on.is_none_or(|p| p == producer))
    }
}

/// A clean close of every rank of one consumer (`Knobs::consumer_shutdown`): from `at`,
/// each rank begins its shutdown the first time it grants a writer a fresh destination
/// (so a write is on its way), or at `at + ConsumerShutdown::PATIENCE` if none comes;
/// it serves on until its writers are gone or the control timeout passes, closes, and
/// starts again (a new incarnation) `down` later.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConsumerShutdown {
    /// Index into `Topology::consumers` (taken modulo their number).
    pub consumer: usize,
    pub at: Duration,
    pub down: Duration,
}

impl ConsumerShutdown {
    /// How long a rank waits past `at` for a writer before it closes anyway.
    pub const PATIENCE: Duration = Duration::from_secs(5);
}

/// When producers stall (`Knobs::producer_stalls`), drawn per producer from the seed.
#[derive(Clone, Copy, Debug)]
pub struct ProducerStalls {
    /// Mean time from the end of one stall to the start of the next.
    pub mean_gap: Duration,
    /// Shortest and longest stall.
    pub length: (Duration, Duration),
}
