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
}
