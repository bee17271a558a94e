//! The EC channel's protocol timings, each stated once: every driver (the libzmq client
//! and server, the `ctlplane` CLI, the simulator's hosts, the Python bindings) reads them
//! from here. Their values are the reference's (`docs/ec-behaviour.md` §9).

use std::time::Duration;

/// `control_timeout_s`: bounds each send and each receive of a control client's REQ
/// exchange; past it the request fails and its socket is discarded (ec-behaviour.md §2.1,
/// §5, §9). Also how long a shutting-down consumer waits for its writers.
pub const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// [`CONTROL_TIMEOUT`] in milliseconds, the unit of `ControlClient::new` and of the CLI's
/// `--timeout-ms` flags.
pub const CONTROL_TIMEOUT_MS: u64 = CONTROL_TIMEOUT.as_millis() as u64;

/// The REP receive timeout of a shard's server loop: the longest one turn of the loop
/// waits for a request before it looks at its events and deadlines again
/// (ec-behaviour.md §2.1, §2.5, §9).
pub const REP_RECV_TIMEOUT: Duration = Duration::from_millis(100);

/// `_RESERVATION_TTL_SECONDS`: how long a WRITING or READY reservation lives without
/// progress, and how long its tombstone is kept (ec-behaviour.md §3.1, §3.6, §9).
pub const RESERVATION_TTL: Duration = Duration::from_secs(300);

/// `push_wait_timeout_s`: how long a scheduler request waits for an item's readiness
/// events before the item is UNAVAILABLE, and a load's deadline (ec-behaviour.md §6.4,
/// §9).
pub const PUSH_WAIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The scheduler's AVAILABLE deadline and terminal-record lifetime
/// (`_RESERVATION_TTL_SECONDS`; ec-behaviour.md §6.3, §6.4, §9).
pub const RECORD_TTL: Duration = Duration::from_secs(300);
