//! The W1 session messages (mainline wire, p2p-behaviour.md §2.1-2.2) and their validation.
//!
//! Validation follows the reference's `isinstance` rules, so a `bool` passes where an
//! `int` is expected (Python's `bool` is an `int`). A failure is a protocol error; unknown
//! extra keys are ignored.

use super::value::Value;
use thiserror::Error;

/// The key naming a message's kind.
pub const TYPE_KEY: &str = "type";

/// A message that failed the W1 validation rules (a protocol error for the session).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ValidationError {
    #[error("message is a {0}, not a dict")]
    NotAMap(&'static str),
    #[error("{kind}: missing field '{field}'")]
    Missing { kind: &'static str, field: &'static str },
    #[error("{kind}: field '{field}' must be {expected}, got {got}")]
    WrongType { kind: &'static str, field: &'static str, expected: &'static str, got: &'static str },
    #[error("{kind}: field '{field}' must be {bound}, got {value}")]
    OutOfRange { kind: &'static str, field: &'static str, bound: &'static str, value: i128 },
    #[error("{kind}: {what} length mismatch: {a} vs {b}")]
    LengthMismatch { kind: &'static str, what: &'static str, a: usize, b: usize },
    #[error("block_indexes: invalid index {0}")]
    InvalidIndex(String),
}

/// `connect`: each side announces itself and its registered KV region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connect {
    pub peer_id: String,
    pub agent_metadata: Vec<u8>,
    pub base_addr: u64,
    pub num_blocks: u64,
    pub block_len: u64,
    /// `""` = no fingerprint (a wildcard).
    pub config_fingerprint: String,
    pub hash_seed: String,
}

/// One W1 session message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Connect(Connect),
    ConnectAck { peer_id: String },
    Disconnect,
    Fetch { kv_request_id: String, keys: Vec<Vec<u8>>, block_indexes: Vec<u64>, round_seq: u64 },
    Lookup { kv_request_id: String, keys: Vec<Vec<u8>>, round_seq: u64 },
    LookupResp { kv_request_id: String, keys: Vec<Vec<u8>>, hits: Vec<bool> },
    TransferDone { kv_request_id: String, success: bool, round_seq: u64 },
    AbortFetch { kv_request_id: String, round_seq: u64 },
    AbortAck { kv_request_id: String, round_seq: u64 },
}

/// The outcome of reading one decoded payload.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    /// A known, valid message.
    Message(Message),
    /// A dict whose `type` is absent or unknown (or a non-dict): logged and skipped, not
    /// an error (it resets the session's error count, as the reference).
    Unknown(Value),
}

impl Message {
    /// The wire `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Connect(_) => "connect",
            Message::ConnectAck { .. } => "connect_ack",
            Message::Disconnect => "disconnect",
            Message::Fetch { .. } => "fetch",
            Message::Lookup { .. } => "lookup",
            Message::LookupResp { .. } => "lookup_resp",
            Message::TransferDone { .. } => "transfer_done",
            Message::AbortFetch { .. } => "abort_fetch",
            Message::AbortAck { .. } => "abort_ack",
        }
    }

    /// The msgpack map a Python peer builds: `type` first, then the fields in catalogue
    /// order; block keys and metadata as `bin`.
    pub fn to_value(&self) -> Value {
        let bins = |keys: &[Vec<u8>]| Value::Array(keys.iter().map(|k| Value::Bin(k.clone())).collect());
        let mut m: Vec<(String, Value)> = vec![(TYPE_KEY.into(), Value::from(self.kind()))];
        let mut put = |k: &str, v: Value| m.push((k.into(), v));
        match self {
            Message::Connect(c) => {
                put("peer_id", Value::from(c.peer_id.as_str()));
                put("agent_metadata", Value::Bin(c.agent_metadata.clone()));
                put("base_addr", Value::from(c.base_addr));
                put("num_blocks", Value::from(c.num_blocks));
                put("block_len", Value::from(c.block_len));
                put("config_fingerprint", Value::from(c.config_fingerprint.as_str()));
                put("hash_seed", Value::from(c.hash_seed.as_str()));
            }
            Message::ConnectAck { peer_id } => put("peer_id", Value::from(peer_id.as_str())),
            Message::Disconnect => {}
            Message::Fetch { kv_request_id, keys, block_indexes, round_seq } => {
                put("kv_request_id", Value::from(kv_request_id.as_str()));
                put("keys", bins(keys));
                put("block_indexes", Value::Array(block_indexes.iter().map(|&i| Value::from(i)).collect()));
                put("round_seq", Value::from(*round_seq));
            }
            Message::Lookup { kv_request_id, keys, round_seq } => {
                put("kv_request_id", Value::from(kv_request_id.as_str()));
                put("keys", bins(keys));
                put("round_seq", Value::from(*round_seq));
            }
            Message::LookupResp { kv_request_id, keys, hits } => {
                put("kv_request_id", Value::from(kv_request_id.as_str()));
                put("keys", bins(keys));
                put("hits", Value::Array(hits.iter().map(|&h| Value::Bool(h)).collect()));
            }
            Message::TransferDone { kv_request_id, success, round_seq } => {
                put("kv_request_id", Value::from(kv_request_id.as_str()));
                put("success", Value::Bool(*success));
                put("round_seq", Value::from(*round_seq));
            }
            Message::AbortFetch { kv_request_id, round_seq } | Message::AbortAck { kv_request_id, round_seq } => {
                put("kv_request_id", Value::from(kv_request_id.as_str()));
                put("round_seq", Value::from(*round_seq));
            }
        }
        Value::Map(m)
    }

    /// Reads a decoded payload with the W1 rules.
    pub fn parse(v: &Value) -> Result<Parsed, ValidationError> {
        let Value::Map(_) = v else {
            return Ok(Parsed::Unknown(v.clone()));
        };
        let kind = match v.get(TYPE_KEY) {
            Some(Value::Str(s)) => s.as_str(),
            _ => return Ok(Parsed::Unknown(v.clone())),
        };
        let f = Fields { v, kind: static_kind(kind) };
        let msg = match kind {
            "connect" => Message::Connect(Connect {
                peer_id: f.str("peer_id")?,
                agent_metadata: f.bin("agent_metadata")?,
                base_addr: f.int("base_addr", 0, ">= 0")?,
                num_blocks: f.int("num_blocks", 1, "> 0")?,
                block_len: f.int("block_len", 1, "> 0")?,
                config_fingerprint: f.opt_str("config_fingerprint")?,
                hash_seed: f.str("hash_seed")?,
            }),
            "connect_ack" => Message::ConnectAck { peer_id: f.str("peer_id")? },
            "disconnect" => Message::Disconnect,
            "fetch" => {
                let kv_request_id = f.str("kv_request_id")?;
                let round_seq = f.int("round_seq", 0, ">= 0")?;
                let keys = f.keys("keys")?;
                let idx = f.list("block_indexes")?;
                if keys.len() != idx.len() {
                    return Err(ValidationError::LengthMismatch {
                        kind: "fetch",
                        what: "keys/block_indexes",
                        a: keys.len(),
                        b: idx.len(),
                    });
                }
                let block_indexes = idx
                    .iter()
                    .map(|i| match int_of(i) {
                        Some(n) if (0..=i128::from(u64::MAX)).contains(&n) => Ok(n as u64),
                        _ => Err(ValidationError::InvalidIndex(i.to_string())),
                    })
                    .collect::<Result<_, _>>()?;
                Message::Fetch { kv_request_id, keys, block_indexes, round_seq }
            }
            "lookup" => Message::Lookup {
                kv_request_id: f.str("kv_request_id")?,
                keys: f.keys("keys")?,
                round_seq: f.int("round_seq", 0, ">= 0")?,
            },
            "lookup_resp" => {
                let kv_request_id = f.str("kv_request_id")?;
                let keys = f.keys("keys")?;
                let hits = f.list("hits")?;
                if keys.len() != hits.len() {
                    return Err(ValidationError::LengthMismatch {
                        kind: "lookup_resp",
                        what: "keys/hits",
                        a: keys.len(),
                        b: hits.len(),
                    });
                }
                let hits = hits
                    .iter()
                    .map(|h| match h {
                        Value::Bool(b) => Ok(*b),
                        other => Err(ValidationError::WrongType {
                            kind: "lookup_resp",
                            field: "hits",
                            expected: "bool",
                            got: other.type_name(),
                        }),
                    })
                    .collect::<Result<_, _>>()?;
                Message::LookupResp { kv_request_id, keys, hits }
            }
            "transfer_done" => Message::TransferDone {
                kv_request_id: f.str("kv_request_id")?,
                success: f.bool("success")?,
                round_seq: f.int("round_seq", 0, ">= 0")?,
            },
            "abort_fetch" => Message::AbortFetch {
                kv_request_id: f.str("kv_request_id")?,
                round_seq: f.int("round_seq", 0, ">= 0")?,
            },
            "abort_ack" => {
                Message::AbortAck { kv_request_id: f.str("kv_request_id")?, round_seq: f.int("round_seq", 0, ">= 0")? }
            }
            _ => return Ok(Parsed::Unknown(v.clone())),
        };
        Ok(Parsed::Message(msg))
    }
}

fn static_kind(kind: &str) -> &'static str {
    const KINDS: [&str; 9] = [
        "connect",
        "connect_ack",
        "disconnect",
        "fetch",
        "lookup",
        "lookup_resp",
        "transfer_done",
        "abort_fetch",
        "abort_ack",
    ];
    KINDS.iter().find(|k| **k == kind).copied().unwrap_or("message")
}

/// `isinstance(v, int)`: ints and bools.
fn int_of(v: &Value) -> Option<i128> {
    match v {
        Value::Int(i) => Some(*i),
        Value::Bool(b) => Some(i128::from(*b)),
        _ => None,
    }
}

struct Fields<'a> {
    v: &'a Value,
    kind: &'static str,
}

impl Fields<'_> {
    fn get(&self, field: &'static str) -> Result<&Value, ValidationError> {
        self.v.get(field).ok_or(ValidationError::Missing { kind: self.kind, field })
    }

    fn wrong(&self, field: &'static str, expected: &'static str, got: &Value) -> ValidationError {
        ValidationError::WrongType { kind: self.kind, field, expected, got: got.type_name() }
    }

    fn str(&self, field: &'static str) -> Result<String, ValidationError> {
        match self.get(field)? {
            Value::Str(s) => Ok(s.clone()),
            other => Err(self.wrong(field, "str", other)),
        }
    }

    fn opt_str(&self, field: &'static str) -> Result<String, ValidationError> {
        match self.v.get(field) {
            None => Ok(String::new()),
            Some(Value::Str(s)) => Ok(s.clone()),
            Some(other) => Err(self.wrong(field, "str", other)),
        }
    }

    fn bin(&self, field: &'static str) -> Result<Vec<u8>, ValidationError> {
        match self.get(field)? {
            Value::Bin(b) => Ok(b.clone()),
            other => Err(self.wrong(field, "bytes", other)),
        }
    }

    fn bool(&self, field: &'static str) -> Result<bool, ValidationError> {
        match self.get(field)? {
            Value::Bool(b) => Ok(*b),
            other => Err(self.wrong(field, "bool", other)),
        }
    }

    fn int(&self, field: &'static str, min: i128, bound: &'static str) -> Result<u64, ValidationError> {
        let v = self.get(field)?;
        let n = int_of(v).ok_or_else(|| self.wrong(field, "int", v))?;
        if n < min || n > i128::from(u64::MAX) {
            return Err(ValidationError::OutOfRange { kind: self.kind, field, bound, value: n });
        }
        Ok(n as u64)
    }

    fn list(&self, field: &'static str) -> Result<&[Value], ValidationError> {
        match self.get(field)? {
            Value::Array(items) => Ok(items),
            other => Err(self.wrong(field, "list", other)),
        }
    }

    /// Block keys: the reference converts each with `bytes(...)`; a `bin` is taken as is,
    /// a list of byte values as those bytes, anything else is refused.
    fn keys(&self, field: &'static str) -> Result<Vec<Vec<u8>>, ValidationError> {
        self.list(field)?
            .iter()
            .map(|k| match k {
                Value::Bin(b) => Ok(b.clone()),
                Value::Array(items) => items
                    .iter()
                    .map(|i| match i {
                        Value::Int(n) if (0..=255).contains(n) => Ok(*n as u8),
                        other => Err(self.wrong(field, "bytes", other)),
                    })
                    .collect(),
                other => Err(self.wrong(field, "bytes", other)),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::p2p::value::{decode, encode};

    fn connect() -> Message {
        Message::Connect(Connect {
            peer_id: "10.0.0.1:5710".into(),
            agent_metadata: vec![0, 1, 2],
            base_addr: 1 << 40,
            num_blocks: 1024,
            block_len: 65536,
            config_fingerprint: "abcd".into(),
            hash_seed: "0".into(),
        })
    }

    #[test]
    fn every_message_round_trips() {
        let msgs = vec![
            connect(),
            Message::ConnectAck { peer_id: "a:1".into() },
            Message::Disconnect,
            Message::Fetch {
                kv_request_id: "r".into(),
                keys: vec![vec![9; 36]],
                block_indexes: vec![20],
                round_seq: 3,
            },
            Message::Lookup { kv_request_id: "r".into(), keys: vec![vec![1], vec![2]], round_seq: 0 },
            Message::LookupResp { kv_request_id: "r".into(), keys: vec![vec![1]], hits: vec![true] },
            Message::TransferDone { kv_request_id: "r".into(), success: false, round_seq: u64::MAX },
            Message::AbortFetch { kv_request_id: "r".into(), round_seq: 1 },
            Message::AbortAck { kv_request_id: "r".into(), round_seq: 1 },
        ];
        for m in msgs {
            let v = decode(&encode(&m.to_value())).unwrap();
            assert_eq!(Message::parse(&v), Ok(Parsed::Message(m)));
        }
    }

    #[test]
    fn validation_follows_isinstance_rules() {
        let mut v = connect().to_value();
        if let Value::Map(m) = &mut v {
            m.retain(|(k, _)| k != "config_fingerprint");
            for (k, val) in m.iter_mut() {
                if k == "base_addr" {
                    *val = Value::Bool(true); // bool is an int in Python
                }
            }
        }
        let Ok(Parsed::Message(Message::Connect(c))) = Message::parse(&v) else { panic!() };
        assert_eq!((c.base_addr, c.config_fingerprint.as_str()), (1, ""));

        let bad = Value::map([("type", Value::from("connect_ack")), ("peer_id", Value::Bin(vec![1]))]);
        assert_eq!(
            Message::parse(&bad).unwrap_err().to_string(),
            "connect_ack: field 'peer_id' must be str, got bytes"
        );
        let bad = Value::map([
            ("type", Value::from("fetch")),
            ("kv_request_id", Value::from("r")),
            ("round_seq", Value::Int(0)),
            ("keys", Value::Array(vec![Value::Bin(vec![1])])),
            ("block_indexes", Value::Array(vec![])),
        ]);
        assert_eq!(Message::parse(&bad).unwrap_err().to_string(), "fetch: keys/block_indexes length mismatch: 1 vs 0");
        let neg = Value::map([
            ("type", Value::from("abort_ack")),
            ("kv_request_id", Value::from("r")),
            ("round_seq", Value::Int(-1)),
        ]);
        assert!(matches!(Message::parse(&neg), Err(ValidationError::OutOfRange { .. })));
    }

    #[test]
    fn unknown_types_and_non_dicts_are_not_errors() {
        assert!(matches!(Message::parse(&Value::Map(vec![])), Ok(Parsed::Unknown(_))));
        assert!(matches!(Message::parse(&Value::Int(3)), Ok(Parsed::Unknown(_))));
        let v = Value::map([("type", Value::from("gossip"))]);
        assert!(matches!(Message::parse(&v), Ok(Parsed::Unknown(_))));
    }
}
