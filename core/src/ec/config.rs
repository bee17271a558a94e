//! Ports and addresses of a consumer's control shards, derived as the reference does.

use thiserror::Error;

/// A consumer configuration the reference would refuse.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// `1 <= control_port <= highest_port <= 65535` does not hold.
    #[error("ECMooncakeConnector ec_port must be in 1..65535.")]
    PortOutOfRange,
    /// A replica needs at least one TP rank.
    #[error("tensor_parallel_size must be at least 1")]
    NoRanks,
    /// A rank outside `0..tp`.
    #[error("TP rank {rank} is outside 0..{tp}")]
    RankOutOfRange { rank: u32, tp: u32 },
}

/// The control ports of one DP replica of a consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortPlan {
    /// `ec_ip`: bound by every shard and advertised to producers.
    pub host: String,
    /// `ec_port + dp_index * tp`: rank 0's REP port, the replica's base address.
    pub control_port: u16,
    /// Tensor-parallel size: one shard per rank.
    pub tp: u32,
}

impl PortPlan {
    /// `control_port = ec_port + dp_index * tp`, refusing any plan whose ports leave
    /// `1..=65535`.
    pub fn new(host: impl Into<String>, ec_port: i64, dp_index: u32, tp: u32) -> Result<Self, ConfigError> {
        if tp == 0 {
            return Err(ConfigError::NoRanks);
        }
        let control = i128::from(ec_port) + i128::from(dp_index) * i128::from(tp);
        let highest = control + i128::from(tp) - 1;
        if !(1..=65535).contains(&control) || highest > 65535 {
            return Err(ConfigError::PortOutOfRange);
        }
        let control_port = u16::try_from(control).map_err(|_| ConfigError::PortOutOfRange)?;
        Ok(PortPlan { host: host.into(), control_port, tp })
    }

    /// REP port of TP rank `rank`.
    pub fn rank_port(&self, rank: u32) -> Result<u16, ConfigError> {
        if rank >= self.tp {
            return Err(ConfigError::RankOutOfRange { rank, tp: self.tp });
        }
        // `new` proved control_port + tp - 1 <= 65535.
        Ok(self.control_port + rank as u16)
    }

    /// The `peers` list every rank reports: all REP ports of the replica.
    pub fn peer_ports(&self) -> Vec<u16> {
        (0..self.tp).map(|r| self.control_port + r as u16).collect()
    }

    /// The replica's base address (rank 0), `tcp://host:port`.
    pub fn control_addr(&self) -> String {
        zmq_path("tcp", &self.host, self.control_port)
    }
}

/// `make_zmq_path`: IPv6 literals are bracketed.
pub fn zmq_path(scheme: &str, host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("{scheme}://[{host}]:{port}")
    } else {
        format!("{scheme}://{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_derive_like_the_reference() {
        let plan = PortPlan::new("127.0.0.1", 5000, 1, 2).unwrap();
        assert_eq!(plan.control_port, 5002);
        assert_eq!(plan.control_addr(), "tcp://127.0.0.1:5002");
        assert_eq!(plan.peer_ports(), vec![5002, 5003]);
        assert_eq!(plan.rank_port(1), Ok(5003));
        assert_eq!(plan.rank_port(2), Err(ConfigError::RankOutOfRange { rank: 2, tp: 2 }));
        assert_eq!(PortPlan::new("::1", 5000, 0, 1).unwrap().control_addr(), "tcp://[::1]:5000");
    }

    #[test]
    fn out_of_range_ports_are_refused() {
        let msg = "ECMooncakeConnector ec_port must be in 1..65535.";
        for (port, dp, tp) in [(0, 0, 1), (65535, 0, 2), (65000, 1, 600), (-5, 0, 1), (70000, 0, 1)] {
            let err = PortPlan::new("h", port, dp, tp).unwrap_err();
            assert_eq!(err.to_string(), msg, "{port} {dp} {tp}");
        }
        assert!(PortPlan::new("h", 65534, 0, 2).is_ok());
        assert_eq!(PortPlan::new("h", 1, 0, 0), Err(ConfigError::NoRanks));
    }
}
