//! ctlplane-sim: the deterministic simulator.
//!
//! It drives the same `ctlplane-core` state machines as production through turmoil, with a
//! model of ZeroMQ socket semantics in place of libzmq. Nothing here decides a protocol
//! question: hosts move bytes and time into core machines and carry out what they return.
//! Everything observable is traced, and the trace hash of a seed is the same on every run.

pub mod announce_once;
pub mod announced_accepted;
pub mod cancel_attempts;
pub mod cancel_rules;
pub mod catalogue;
pub mod cli;
pub mod clock;
pub mod delivery;
pub mod device;
pub mod engine;
pub mod expire_on_time;
pub mod faults;
pub mod hosts;
pub mod knobs;
pub mod landed;
pub mod load_report;
pub mod oracle;
pub mod p2p;
pub mod perfetto;
pub mod pool_full;
pub mod push_returns;
pub mod ready_log;
pub mod ready_ttl;
pub mod records_reaped;
pub mod release;
pub mod reserve_duplicate;
pub mod reserve_follower;
pub mod reserve_items;
pub mod scenario;
pub mod scheduler_quiet;
pub mod shard_counters;
pub mod shrink;
pub mod shutdown;
pub mod sweep_record;
pub mod topology;
pub mod trace;
pub mod world_swarm;
pub mod zmq;
