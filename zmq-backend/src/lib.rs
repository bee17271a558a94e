//! ctlplane's production drivers over libzmq.
//!
//! Every decision (what a request does, when an event is dropped, when a REQ socket is
//! discarded, which shards a consumer has) is made by `ctlplane-core`; the types here only
//! own sockets, threads and the wall clock, feed bytes and time into the core and carry
//! out what it returns. That keeps the simulator, which drives the same core types, a
//! faithful test of production.

pub mod callback_server;
pub mod client;
pub mod clock;
pub mod curve;
pub mod inbox;
pub mod p2p;
mod rep_monitor;
pub mod replica;
pub mod requests;
pub mod scheduler;
mod serve_loop;
pub mod server;
mod sockets;

pub use callback_server::CallbackControlServer;
pub use client::{ClientError, ControlClient};
pub use clock::Clock;
pub use ctlplane_core::ec::reserve_outcome::{ReserveGrant, ReserveOutcome};
pub use curve::{CurveClient, CurveError, CurveServer, KeyPair};
pub use inbox::{DrainCounts, Drained, EventInbox};
pub use p2p::{ManagerLoop, P2pError, TransportOptions, ZmqTransport};
pub use replica::ConsumerServers;
pub use requests::{make_cancel_request, Completion, ReserveSpec};
pub use scheduler::{HeardEvent, SchedulerDriver};
pub use server::{BindCause, ConsumerControlServer, ServerOptions, SetupCause, StartError, DEFAULT_MAX_REQUEST_BYTES};

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `m`, taking the data over from a thread that panicked while holding it: the
/// core's state stays consistent between calls, and a dead serving thread must not take
/// the caller down with it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
