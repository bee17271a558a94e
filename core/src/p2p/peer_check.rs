//! Which inbound peers this node will dial back (`docs/peer-admission.md`).
//!
//! An inbound peer's routing identity is the `host:port` the node opens a DEALER to. The
//! reference trusts it, so any sender could name any address and turn every node into a
//! connection reflector. Here a peer is admitted only if its identity names the host its
//! connection comes from, or is on an allowlist. The driver supplies each message's source
//! address (libzmq's `Peer-Address` property, or the simulator's equivalent); this module
//! decides.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use thiserror::Error;

/// How inbound identities are checked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PeerCheckMode {
    /// The identity's host must be the connection's source address (or be allowlisted).
    /// The default: it holds on any network that does not rewrite source addresses and
    /// needs no configuration.
    #[default]
    Strict,
    /// Only allowlisted identities are admitted, wherever they come from.
    Allowlist,
    /// Every identity is admitted (the reference's behaviour), for networks that rewrite
    /// source addresses and are trusted as a whole.
    Off,
}

impl PeerCheckMode {
    /// The command-line spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PeerCheckMode::Strict => "strict",
            PeerCheckMode::Allowlist => "allowlist",
            PeerCheckMode::Off => "off",
        }
    }
}

impl fmt::Display for PeerCheckMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A `--peer-check` value that is none of the modes.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("unknown peer check {0:?}: expected strict, allowlist or off")]
pub struct UnknownMode(pub String);

impl FromStr for PeerCheckMode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "strict" => Ok(PeerCheckMode::Strict),
            "allowlist" => Ok(PeerCheckMode::Allowlist),
            "off" => Ok(PeerCheckMode::Off),
            other => Err(UnknownMode(other.to_string())),
        }
    }
}

/// One allowlist entry. Both kinds name what the node may dial, not where the message may
/// come from: a source-address entry would let anyone on that network make the node dial
/// anywhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AllowEntry {
    /// This exact identity (`host:port`), from any source address.
    Peer(String),
    /// Identities whose host is an address in this network, from any source address.
    Net { addr: IpAddr, prefix: u8 },
}

/// A `--peer-allow` value that is neither `host:port` nor a CIDR block.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("invalid peer allowlist entry {0:?}: expected host:port or address/prefix")]
pub struct InvalidEntry(pub String);

impl FromStr for AllowEntry {
    type Err = InvalidEntry;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidEntry(s.to_string());
        if let Some((addr, prefix)) = s.split_once('/') {
            let addr: IpAddr = unbracket(addr).parse().map_err(|_| bad())?;
            let prefix: u8 = prefix.parse().map_err(|_| bad())?;
            let bits = if addr.is_ipv4() { 32 } else { 128 };
            if prefix > bits {
                return Err(bad());
            }
            return Ok(AllowEntry::Net { addr: addr.to_canonical(), prefix });
        }
        let (host, port) = s.rsplit_once(':').ok_or_else(bad)?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(bad());
        }
        Ok(AllowEntry::Peer(s.to_string()))
    }
}

impl fmt::Display for AllowEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllowEntry::Peer(id) => f.write_str(id),
            AllowEntry::Net { addr, prefix } => write!(f, "{addr}/{prefix}"),
        }
    }
}

impl AllowEntry {
    fn matches(&self, identity: &str, host: Option<IpAddr>) -> bool {
        match self {
            AllowEntry::Peer(id) => id == identity,
            AllowEntry::Net { addr, prefix } => host.is_some_and(|h| in_net(h, *addr, *prefix)),
        }
    }
}

/// Why an inbound peer was refused.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    /// The identity is not `host:port`, so it names nothing to check.
    #[error("the identity is not host:port")]
    NotHostPort,
    /// The driver could not tell where the connection comes from.
    #[error("the connection's source address is unknown")]
    UnknownSource,
    /// The identity names another host than the one the connection comes from.
    #[error("the identity names another host than the connection's source")]
    OtherHost,
    /// Allowlist mode and the identity is not on it.
    #[error("the identity is not on the peer allowlist")]
    NotAllowed,
}

/// The admission rule: a mode and its allowlist.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PeerCheck {
    pub mode: PeerCheckMode,
    /// Identities admitted from any source (in `Strict` and `Allowlist` mode).
    pub allow: Vec<AllowEntry>,
}

impl PeerCheck {
    /// No check: every identity is admitted.
    pub fn off() -> Self {
        PeerCheck { mode: PeerCheckMode::Off, allow: Vec::new() }
    }

    /// Whether a message whose routing identity is `identity`, arriving on a connection
    /// from `source` (an address, or the name the driver knows the source host by), comes
    /// from a peer this node may dial back.
    pub fn admit(&self, identity: &str, source: Option<&str>) -> Result<(), Refusal> {
        if self.mode == PeerCheckMode::Off {
            return Ok(());
        }
        let (host, port) = identity.rsplit_once(':').ok_or(Refusal::NotHostPort)?;
        if host.is_empty() || port.parse::<u16>().is_err() {
            return Err(Refusal::NotHostPort);
        }
        let host = unbracket(host);
        let host_ip = host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
        if self.allow.iter().any(|e| e.matches(identity, host_ip)) {
            return Ok(());
        }
        if self.mode == PeerCheckMode::Allowlist {
            return Err(Refusal::NotAllowed);
        }
        let source = unbracket(source.ok_or(Refusal::UnknownSource)?);
        if source.is_empty() {
            return Err(Refusal::UnknownSource);
        }
        let source_ip = source.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
        let same = match (host_ip, source_ip) {
            (Some(h), Some(s)) => h == s,
            // `localhost` is the loopback host by definition, no resolution needed.
            (None, Some(s)) => host.eq_ignore_ascii_case("localhost") && s.is_loopback(),
            // A driver that knows sources by name (the simulator's network).
            (None, None) => host.eq_ignore_ascii_case(source),
            (Some(_), None) => false,
        };
        if same {
            Ok(())
        } else {
            Err(Refusal::OtherHost)
        }
    }
}

fn unbracket(s: &str) -> &str {
    s.strip_prefix('[').and_then(|s| s.strip_suffix(']')).unwrap_or(s)
}

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strict(allow: &[&str]) -> PeerCheck {
        PeerCheck { mode: PeerCheckMode::Strict, allow: allow.iter().map(|e| e.parse().unwrap()).collect() }
    }

    #[test]
    fn strict_admits_only_the_source_host() {
        let c = strict(&[]);
        assert_eq!(c.admit("10.0.0.2:5710", Some("10.0.0.2")), Ok(()));
        assert_eq!(c.admit("10.0.0.2:1", Some("10.0.0.2")), Ok(()), "the port is the peer's to choose");
        assert_eq!(c.admit("10.0.0.9:5710", Some("10.0.0.2")), Err(Refusal::OtherHost));
        assert_eq!(c.admit("10.0.0.2:5710", None), Err(Refusal::UnknownSource));
        assert_eq!(c.admit("10.0.0.2:5710", Some("")), Err(Refusal::UnknownSource));
        assert_eq!(c.admit("10.0.0.2", Some("10.0.0.2")), Err(Refusal::NotHostPort));
        assert_eq!(c.admit("10.0.0.2:x", Some("10.0.0.2")), Err(Refusal::NotHostPort));
        assert_eq!(c.admit("evil.example:80", Some("10.0.0.2")), Err(Refusal::OtherHost));
    }

    #[test]
    fn addresses_compare_as_addresses() {
        let c = strict(&[]);
        // A dual-stack ROUTER reports IPv4 peers as mapped IPv6 addresses.
        assert_eq!(c.admit("127.0.0.1:5710", Some("::ffff:127.0.0.1")), Ok(()));
        assert_eq!(c.admit("[::1]:5710", Some("::1")), Ok(()));
        assert_eq!(c.admit("::1:5710", Some("0:0:0:0:0:0:0:1")), Ok(()));
        assert_eq!(c.admit("localhost:5710", Some("127.0.0.1")), Ok(()));
        assert_eq!(c.admit("localhost:5710", Some("10.0.0.2")), Err(Refusal::OtherHost));
        assert_eq!(c.admit("node-a:5710", Some("node-a")), Ok(()), "a driver that knows hosts by name");
        assert_eq!(c.admit("node-b:5710", Some("node-a")), Err(Refusal::OtherHost));
        assert_eq!(c.admit("10.0.0.2:5710", Some("node-a")), Err(Refusal::OtherHost));
    }

    #[test]
    fn allowlist_entries_name_what_may_be_dialled() {
        let c = strict(&["10.1.0.0/16", "gw.example:5710"]);
        assert_eq!(c.admit("10.1.2.3:5710", Some("203.0.113.5")), Ok(()));
        assert_eq!(c.admit("10.2.0.1:5710", Some("203.0.113.5")), Err(Refusal::OtherHost));
        assert_eq!(c.admit("gw.example:5710", Some("203.0.113.5")), Ok(()));
        assert_eq!(c.admit("gw.example:5711", Some("203.0.113.5")), Err(Refusal::OtherHost));
        let only = PeerCheck { mode: PeerCheckMode::Allowlist, ..c.clone() };
        assert_eq!(only.admit("10.1.2.3:5710", None), Ok(()));
        assert_eq!(only.admit("10.2.0.1:5710", Some("10.2.0.1")), Err(Refusal::NotAllowed));
        assert_eq!(PeerCheck::off().admit("anything", None), Ok(()));
    }

    #[test]
    fn entries_and_modes_parse() {
        assert_eq!("strict".parse(), Ok(PeerCheckMode::Strict));
        assert_eq!("allowlist".parse(), Ok(PeerCheckMode::Allowlist));
        assert_eq!("off".parse(), Ok(PeerCheckMode::Off));
        assert!("on".parse::<PeerCheckMode>().is_err());
        assert_eq!("10.0.0.0/8".parse::<AllowEntry>().map(|e| e.to_string()), Ok("10.0.0.0/8".to_string()));
        assert_eq!("h:1".parse(), Ok(AllowEntry::Peer("h:1".into())));
        assert_eq!("::/0".parse::<AllowEntry>().map(|e| e.to_string()), Ok("::/0".to_string()));
        for bad in ["10.0.0.0/33", "::/129", "x/8", "10.0.0.0/", "host", ":1", "h:70000"] {
            assert!(bad.parse::<AllowEntry>().is_err(), "{bad}");
        }
        let all = strict(&["0.0.0.0/0"]);
        assert_eq!(all.admit("192.0.2.1:1", None), Ok(()));
        assert_eq!(all.admit("[2001:db8::1]:1", Some("192.0.2.9")), Err(Refusal::OtherHost));
    }
}
