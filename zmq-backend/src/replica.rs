//! `ConsumerServers`: the control servers of every TP rank of one consumer DP replica.

use crate::server::{ConsumerControlServer, ServerOptions, StartError};
use ctlplane_core::ec::{ConfigError, PortPlan, ShardConfig};
use rand_core::OsRng;
use thiserror::Error;

/// Where the fake receive slabs start: the driver has no device memory, so `dst_ptr`s are
/// addresses in a made-up, non-overlapping range per rank.
pub const FAKE_SLAB_BASE: u64 = 0x7f00_0000_0000;

/// Why a replica did not start; the ranks started before the failure are closed.
#[derive(Debug, Error)]
pub enum ReplicaError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("TP rank {rank} did not start")]
    Start {
        rank: u32,
        #[source]
        source: StartError,
    },
}

/// One running server per TP rank, rank order.
pub struct ConsumerServers {
    servers: Vec<ConsumerControlServer<OsRng>>,
}

impl ConsumerServers {
    /// Starts rank 0..tp of `plan`, each on `plan.host : control_port + rank`, with a
    /// `pool_bytes` slab, `dst_session` `"<host>:0"` and reservation ids from `OsRng`.
    /// `tweak` may adjust each rank's config (tests shrink the event backlog with it).
    pub fn start(
        plan: &PortPlan,
        pool_bytes: u64,
        options: &ServerOptions,
        tweak: impl Fn(&mut ShardConfig),
    ) -> Result<Self, ReplicaError> {
        let mut servers = Vec::with_capacity(plan.tp as usize);
        for rank in 0..plan.tp {
            let mut config = ShardConfig::for_rank(plan, rank, pool_bytes)?;
            config.dst_session = format!("{}:0", plan.host);
            config.slab_base = FAKE_SLAB_BASE.saturating_add(u64::from(rank).saturating_mul(pool_bytes));
            tweak(&mut config);
            // On error `servers` drops here, closing the ranks already started.
            let server = ConsumerControlServer::start_with(&plan.host, config, OsRng, options.clone())
                .map_err(|source| ReplicaError::Start { rank, source })?;
            servers.push(server);
        }
        Ok(ConsumerServers { servers })
    }

    /// The servers, rank order.
    pub fn servers(&self) -> &[ConsumerControlServer<OsRng>] {
        &self.servers
    }

    /// Every rank's loop is still running.
    pub fn all_serving(&self) -> bool {
        self.servers.iter().all(ConsumerControlServer::is_serving)
    }

    /// Closes every rank; idempotent.
    pub fn close(&mut self) {
        for server in &mut self.servers {
            server.close();
        }
    }
}
