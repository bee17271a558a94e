//! Endpoint strings: `tcp://host:port` and `inproc://name`.

use super::ZmqError;

/// A parsed endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `tcp://host:port`; `host` may be `*`, an IP or a turmoil host name.
    Tcp { host: String, port: u16 },
    /// `inproc://name` (a non-empty name).
    Inproc(String),
}

impl Endpoint {
    /// Parses `s` as libzmq would, EINVAL for anything else.
    pub fn parse(s: &str) -> Result<Endpoint, ZmqError> {
        let bad = || ZmqError::Invalid(format!("bad endpoint {s:?}"));
        if let Some(name) = s.strip_prefix("inproc://") {
            if name.is_empty() {
                return Err(bad());
            }
            return Ok(Endpoint::Inproc(name.to_string()));
        }
        let rest = s.strip_prefix("tcp://").ok_or_else(bad)?;
        let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || host.contains('\0') {
            return Err(bad());
        }
        let port = if port == "*" { 0 } else { port.parse::<u16>().map_err(|_| bad())? };
        Ok(Endpoint::Tcp { host: host.to_string(), port })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_and_bad_ones_are_einval() {
        assert_eq!(Endpoint::parse("tcp://a:5"), Ok(Endpoint::Tcp { host: "a".into(), port: 5 }));
        assert_eq!(Endpoint::parse("tcp://*:*"), Ok(Endpoint::Tcp { host: "*".into(), port: 0 }));
        assert_eq!(Endpoint::parse("inproc://m-1"), Ok(Endpoint::Inproc("m-1".into())));
        for bad in ["", "tcp://", "tcp://a", "tcp://a:x", "tcp://:5", "udp://a:5", "inproc://", "tcp://a:70000"] {
            assert!(matches!(Endpoint::parse(bad), Err(ZmqError::Invalid(_))), "{bad}");
        }
    }
}
