//! The encoder-cache (EC) reservation channel of the Mooncake EC connector.
//!
//! Consumer side: [`shard::ConsumerShard`] answers one TP rank's REP requests and queues
//! its readiness events, deciding with a [`reservations::ReservationBook`] over a
//! [`slab::Slab`]. [`wire`] is the JSON both sides speak.

pub mod callbacks;
pub mod config;
pub mod dataplane;
pub mod defaults;
pub mod dtype;
pub mod dumps;
mod event_queue;
pub mod ids;
pub mod inbox;
pub(crate) mod keyed_hash;
pub mod producer;
pub mod pyjson;
pub mod readiness;
pub mod reply_text;
pub mod request_slot;
pub mod requests;
pub mod reservations;
pub mod reserve_outcome;
pub mod resident;
pub mod scan;
pub mod scheduler;
pub mod serve_step;
pub mod shapes;
pub mod shard;
pub mod shutdown_drain;
pub mod slab;
pub mod state;
pub mod token;
pub mod topology;
pub mod wire;
pub(crate) mod writer_index;

pub use config::{ConfigError, PortPlan};
pub use dtype::DType;
pub use reservations::{
    BookConfig, Census, FollowerCompletion, ReservationBook, ReserveError, ReserveRef, ReserveRequest, Reserved,
};
pub use serve_step::ServeStep;
pub use shard::{ConsumerShard, ShardConfig, ShardStats};
pub use shutdown_drain::{DrainOutcome, DrainStep, ShutdownDrain};
pub use state::State;
