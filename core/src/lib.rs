//! ctlplane's sans-IO core.
//!
//! Every protocol decision of the control plane lives here as a state machine that takes
//! bytes, time and randomness as inputs and hands back what to send or do. The production
//! drivers (libzmq) and the simulator drive these same types, so whatever the simulator
//! proves about a decision holds for production too.

pub mod conformance;
pub mod ec;
pub mod p2p;
pub mod regressions;
pub mod time;

pub use time::Instant;
