//! The simulated deployment: which hosts exist and what each one runs.
//!
//! A consumer replica is one *logical* host (`consumer0`) whose TP ranks are separate
//! turmoil hosts (`consumer0-r0`, `consumer0-r1`, ...), so that one rank can crash, stall or
//! be partitioned on its own. On the wire every rank shares the replica's address, as in
//! production (ec-behaviour.md §1.2: the ranks bind `ec_ip : control_port + r`, and discovery keeps the
//! host part of the base address), so a host turns a logical endpoint into the rank host
//! serving it with [`Topology::resolve`] before it connects.

use ctlplane_core::ec::config::zmq_path;
use ctlplane_core::ec::{ConfigError, PortPlan};
use std::collections::BTreeMap;

/// Default receive slab of one consumer rank (`ec_buffer_size`).
pub const DEFAULT_POOL_BYTES: u64 = 8 << 20;

/// The hosts of one simulated world.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Encoder workers, each with a push coordinator.
    pub producers: Vec<String>,
    /// Consumer replicas, each with one control shard per TP rank.
    pub consumers: Vec<ConsumerSpec>,
    /// Consumer schedulers (event inbox + readiness + waiting table for every consumer).
    pub schedulers: Vec<String>,
    /// P2P KV-tiering peers.
    pub p2p_peers: Vec<String>,
}

/// One consumer replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerSpec {
    /// The logical host name in every endpoint of this replica (`ec_ip`).
    pub name: String,
    /// Tensor-parallel size.
    pub tp: u32,
    /// turmoil host of each rank, by rank.
    pub ranks: Vec<String>,
    /// Rank 0's REP port; rank `r` binds `control_port + r`.
    pub control_port: u16,
    /// Receive slab of each rank.
    pub pool_bytes: u64,
}

impl ConsumerSpec {
    fn new(index: usize, tp: u32, control_port: u16, pool_bytes: u64) -> Self {
        let name = format!("consumer{index}");
        let ranks = (0..tp).map(|r| format!("{name}-r{r}")).collect();
        ConsumerSpec { name, tp, ranks, control_port, pool_bytes }
    }

    /// The replica's ports as the core derives them (DP index 0: each simulated consumer
    /// is its own replica); a spec whose ports leave `1..=65535` is refused.
    pub fn plan(&self) -> Result<PortPlan, ConfigError> {
        PortPlan::new(self.name.clone(), i64::from(self.control_port), 0, self.tp)
    }

    /// The replica's base address (rank 0): what producers get as `consumer_zmq`.
    pub fn base_addr(&self) -> String {
        zmq_path("tcp", &self.name, self.control_port)
    }
}

impl Topology {
    /// 2 producers, 2 consumers x TP 4, 1 scheduler, 4 P2P peers.
    pub fn full() -> Self {
        Topology {
            producers: names("producer", 2),
            consumers: vec![
                ConsumerSpec::new(0, 4, 19000, DEFAULT_POOL_BYTES),
                ConsumerSpec::new(1, 4, 19100, DEFAULT_POOL_BYTES),
            ],
            schedulers: names("scheduler", 1),
            p2p_peers: names("peer", 4),
        }
    }

    /// 1 producer, 1 consumer x TP 2, 1 scheduler, 2 P2P peers: quick to run and read.
    pub fn small() -> Self {
        Topology {
            producers: names("producer", 1),
            consumers: vec![ConsumerSpec::new(0, 2, 19000, DEFAULT_POOL_BYTES)],
            schedulers: names("scheduler", 1),
            p2p_peers: names("peer", 2),
        }
    }

    /// [`Self::small`] with a second producer: a retried encoder call can run on another
    /// encoder than the first (ec-behaviour.md S24's client-supplied transfer ids).
    pub fn small_two_producers() -> Self {
        Topology { producers: names("producer", 2), ..Self::small() }
    }

    /// The topology of a named scenario (`"full"`, `"small"`, `"small-2p"`).
    pub fn by_name(name: &str) -> Option<Self> {
        match name {
            "full" => Some(Self::full()),
            "small" => Some(Self::small()),
            "small-2p" => Some(Self::small_two_producers()),
            _ => None,
        }
    }

    /// Names of the scenarios [`Self::by_name`] knows.
    pub fn names() -> &'static [&'static str] {
        &["full", "small", "small-2p"]
    }

    /// Every turmoil host, in registration order: producers, consumer ranks, schedulers,
    /// P2P peers.
    pub fn hosts(&self) -> Vec<String> {
        let mut hosts = self.producers.clone();
        hosts.extend(self.consumers.iter().flat_map(|c| c.ranks.iter().cloned()));
        hosts.extend(self.schedulers.iter().cloned());
        hosts.extend(self.p2p_peers.iter().cloned());
        hosts
    }

    /// Every consumer rank host with its replica and rank.
    pub fn ranks(&self) -> Vec<(&ConsumerSpec, u32, &str)> {
        self.consumers
            .iter()
            .flat_map(|c| c.ranks.iter().enumerate().map(move |(r, h)| (c, r as u32, h.as_str())))
            .collect()
    }

    /// The consumer replica a rank host belongs to, and its rank.
    pub fn rank_of(&self, host: &str) -> Option<(&ConsumerSpec, u32)> {
        self.ranks().into_iter().find(|(_, _, h)| *h == host).map(|(c, r, _)| (c, r))
    }

    /// The turmoil host serving `tcp://<logical host>:<port>`: a consumer rank for a REP
    /// port (fixed by the topology) or an event port (`event_ports`: what each rank bound,
    /// by logical host and port); any other host name is already a turmoil host.
    pub fn resolve(&self, endpoint: &str, event_ports: &BTreeMap<(String, u16), String>) -> Option<String> {
        let rest = endpoint.strip_prefix("tcp://")?;
        let (host, port) = rest.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        if let Some(c) = self.consumers.iter().find(|c| c.name == host) {
            if let Some(r) = port.checked_sub(c.control_port).filter(|r| u32::from(*r) < c.tp) {
                return Some(format!("tcp://{}:{port}", c.ranks[usize::from(r)]));
            }
            let rank_host = event_ports.get(&(host.to_string(), port))?;
            return Some(format!("tcp://{rank_host}:{port}"));
        }
        Some(endpoint.to_string())
    }
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_topology_has_the_documented_shape() {
        let t = Topology::full();
        assert_eq!(t.producers.len(), 2);
        assert_eq!(t.consumers.len(), 2);
        assert!(t.consumers.iter().all(|c| c.tp == 4 && c.ranks.len() == 4));
        assert_eq!(t.schedulers.len(), 1);
        assert_eq!(t.p2p_peers.len(), 4);
        let hosts = t.hosts();
        assert_eq!(hosts.len(), 2 + 8 + 1 + 4);
        let mut sorted = hosts.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), hosts.len(), "host names are distinct");
        assert_eq!(Topology::by_name("small").map(|t| t.hosts().len()), Some(1 + 2 + 1 + 2));
        assert!(Topology::by_name("nope").is_none());
    }

    #[test]
    fn logical_endpoints_resolve_to_rank_hosts() {
        let t = Topology::full();
        let mut events = BTreeMap::new();
        events.insert(("consumer1".to_string(), 41002), "consumer1-r2".to_string());
        assert_eq!(t.resolve("tcp://consumer0:19003", &events).as_deref(), Some("tcp://consumer0-r3:19003"));
        assert_eq!(t.resolve("tcp://consumer1:19100", &events).as_deref(), Some("tcp://consumer1-r0:19100"));
        assert_eq!(t.resolve("tcp://consumer1:41002", &events).as_deref(), Some("tcp://consumer1-r2:41002"));
        assert_eq!(t.resolve("tcp://consumer1:41003", &events), None, "an event port nobody bound");
        assert_eq!(t.resolve("tcp://consumer0:19004", &events), None, "past the last rank");
        assert_eq!(t.resolve("tcp://peer1:5710", &events).as_deref(), Some("tcp://peer1:5710"));
        assert_eq!(t.resolve("inproc://x", &events), None);
        assert_eq!(t.consumers[0].base_addr(), "tcp://consumer0:19000");
        assert_eq!(t.rank_of("consumer1-r3").map(|(c, r)| (c.name.as_str(), r)), Some(("consumer1", 3)));
    }
}
