//! Shard discovery: from a consumer's base address to the control address of every TP
//! rank, as the reference client does it (ec-behaviour.md §1.3).
//!
//! Only a confirmed topology is ever used: a caller that cannot discover every shard fails
//! without sending a reserve or cancel anywhere (the removed base-address fallback is
//! race S8). Successes are cached for the life of the client; failures are not.

use super::pyjson::{to_int, type_name};
use serde_json::Value;
use std::collections::BTreeMap;
use thiserror::Error;

/// `_CANCEL_ATTEMPTS`: discovery (and cancel) attempts before a caller gives up.
pub const DISCOVERY_ATTEMPTS: u32 = 2;

/// How a blocking client confirms a topology: `discover` (the cache, else one `peers`
/// request, its reply recorded) is tried up to [`DISCOVERY_ATTEMPTS`] times; the caller
/// never falls back to the base address alone (race S8).
pub fn confirm(base: &str, mut discover: impl FnMut() -> Option<Vec<String>>) -> Result<Vec<String>, TopologyError> {
    (0..DISCOVERY_ATTEMPTS).find_map(|_| discover()).ok_or_else(|| TopologyError { base: base.to_string() })
}

/// Why a `peers` reply did not yield a topology.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum PeersError {
    /// The request itself failed (timeout, transport error, error reply).
    #[error("peers request failed: {0}")]
    Request(String),
    /// The reply's result was not an object with a non-empty list `ports`.
    #[error("invalid or empty peer list")]
    InvalidPeerList,
    /// A port did not convert with `int()` or is not a TCP port.
    #[error("invalid port in peer list: {0}")]
    InvalidPort(String),
    /// The base address has no `:port` part to replace.
    #[error("consumer address {0} has no port")]
    NoPort(String),
}

/// A caller could not confirm the consumer's topology; nothing was sent.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("Could not discover every EC consumer shard at {base}")]
pub struct TopologyError {
    /// The consumer's base address.
    pub base: String,
}

/// `<prefix>:<port>` with `prefix` everything before the last `:` of `base` (so the host
/// part, brackets of an IPv6 literal included, is kept and only the port changes).
pub fn with_port(base: &str, port: u16) -> Result<String, PeersError> {
    let (prefix, _) = base.rsplit_once(':').ok_or_else(|| PeersError::NoPort(base.to_string()))?;
    Ok(format!("{prefix}:{port}"))
}

/// Turns the result of a `peers` reply into shard addresses.
pub fn shards_from_peers(base: &str, result: &Value) -> Result<Vec<String>, PeersError> {
    let ports = match result {
        Value::Object(obj) => obj.get("ports"),
        _ => None,
    };
    let Some(Value::Array(ports)) = ports else {
        return Err(PeersError::InvalidPeerList);
    };
    if ports.is_empty() {
        return Err(PeersError::InvalidPeerList);
    }
    ports
        .iter()
        .map(|p| {
            let n = to_int(p).map_err(PeersError::InvalidPort)?;
            let port = u16::try_from(n)
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| PeersError::InvalidPort(format!("{n} ({})", type_name(p))))?;
            with_port(base, port)
        })
        .collect()
}

/// Confirmed topologies, by base address. Successes only, never invalidated (a consumer
/// restarted with a different TP size is not re-discovered, as the reference).
#[derive(Clone, Debug, Default)]
pub struct TopologyCache {
    shards: BTreeMap<String, Vec<String>>,
}

impl TopologyCache {
    /// The confirmed shards of `base`, if discovery succeeded before.
    pub fn get(&self, base: &str) -> Option<&[String]> {
        self.shards.get(base).map(Vec::as_slice)
    }

    /// Records the outcome of a `peers` exchange with `base`: a success is cached and
    /// returned; a failure is logged by the caller and leaves the cache untouched.
    pub fn record(&mut self, base: &str, reply: Result<Value, String>) -> Result<Vec<String>, PeersError> {
        let result = reply.map_err(PeersError::Request)?;
        let shards = shards_from_peers(base, &result)?;
        self.shards.insert(base.to_string(), shards.clone());
        Ok(shards)
    }
}

/// The `peers` request frame (the encoder of [`super::requests`]).
pub use super::requests::peers as peers_request;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn host_part_is_kept_including_ipv6_brackets() {
        let r = json!({"ports": [19019, "19020", 19021.0]});
        assert_eq!(
            shards_from_peers("tcp://10.0.0.5:19019", &r).unwrap(),
            vec!["tcp://10.0.0.5:19019", "tcp://10.0.0.5:19020", "tcp://10.0.0.5:19021"]
        );
        assert_eq!(shards_from_peers("tcp://[::1]:5000", &json!({"ports": [5001]})).unwrap(), vec!["tcp://[::1]:5001"]);
    }

    #[test]
    fn bad_peer_lists_are_refused() {
        for bad in [json!(null), json!([19019]), json!({}), json!({"ports": []}), json!({"ports": "19019"})] {
            assert_eq!(shards_from_peers("tcp://h:1", &bad), Err(PeersError::InvalidPeerList), "{bad}");
        }
        assert!(matches!(shards_from_peers("tcp://h:1", &json!({"ports": ["x"]})), Err(PeersError::InvalidPort(_))));
        assert!(matches!(shards_from_peers("tcp://h:1", &json!({"ports": [70000]})), Err(PeersError::InvalidPort(_))));
    }

    #[test]
    fn only_successes_are_cached() {
        let mut cache = TopologyCache::default();
        assert!(cache.record("tcp://h:1", Err("Resource temporarily unavailable".into())).is_err());
        assert!(cache.get("tcp://h:1").is_none());
        assert!(cache.record("tcp://h:1", Ok(json!({"ports": []}))).is_err());
        assert!(cache.get("tcp://h:1").is_none());
        cache.record("tcp://h:1", Ok(json!({"ports": [1, 2]}))).unwrap();
        assert_eq!(cache.get("tcp://h:1").unwrap(), ["tcp://h:1", "tcp://h:2"]);
        assert_eq!(
            TopologyError { base: "tcp://h:1".into() }.to_string(),
            "Could not discover every EC consumer shard at tcp://h:1"
        );
    }
}
