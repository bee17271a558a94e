//! The dynamic msgpack value model of the P2P control transport.
//!
//! Python peers decode frames with `msgspec.msgpack.decode` and no schema, so what
//! matters is exactly which msgpack family each value uses: `bin` must stay distinct from
//! `str` (block keys and agent metadata are `bytes` in Python), integers may take any
//! width, and map keys are strings. The codec is hand-written so that it writes the
//! smallest encoding of every value, as msgspec does, and so that a hostile frame can
//! cost no more than its own length.

use std::fmt;
use thiserror::Error;

/// Deepest nesting accepted on decode.
pub const MAX_DEPTH: usize = 64;

/// One msgpack value as a Python peer sees it.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Nil,
    Bool(bool),
    /// Any msgpack integer: `-2^63 ..= 2^64 - 1`.
    Int(i128),
    Float(f64),
    /// msgpack `str` (Python `str`).
    Str(String),
    /// msgpack `bin` (Python `bytes`).
    Bin(Vec<u8>),
    Array(Vec<Value>),
    /// A map with string keys, in wire order (Python dicts keep insertion order).
    Map(Vec<(String, Value)>),
}

impl Value {
    /// The entry `key` of a map.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(entries) => entries.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Python's type name, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::Nil => "NoneType",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Str(_) => "str",
            Value::Bin(_) => "bytes",
            Value::Array(_) => "list",
            Value::Map(_) => "dict",
        }
    }

    /// Builds a map from `(key, value)` pairs.
    pub fn map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }
}

impl From<&str> for Value {
    fn from(s: &str) -> Self {
        Value::Str(s.to_string())
    }
}

impl From<String> for Value {
    fn from(s: String) -> Self {
        Value::Str(s)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Self {
        Value::Bool(b)
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Self {
        Value::Int(i128::from(n))
    }
}

impl From<i64> for Value {
    fn from(n: i64) -> Self {
        Value::Int(i128::from(n))
    }
}

impl fmt::Display for Value {
    /// A JSON-like rendering for logs and the `ctlplane p2p` tools; `bin` as `b"hex"`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Nil => f.write_str("null"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Int(i) => write!(f, "{i}"),
            Value::Float(x) => write!(f, "{x:?}"),
            Value::Str(s) => write!(f, "{s:?}"),
            Value::Bin(b) => {
                f.write_str("b\"")?;
                for byte in b {
                    write!(f, "{byte:02x}")?;
                }
                f.write_str("\"")
            }
            Value::Array(items) => {
                f.write_str("[")?;
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{v}")?;
                }
                f.write_str("]")
            }
            Value::Map(entries) => {
                f.write_str("{")?;
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{k:?}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

/// Why a frame did not decode.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("truncated msgpack data")]
    Truncated,
    #[error("trailing bytes after the msgpack value")]
    TrailingBytes,
    #[error("unsupported msgpack type byte 0x{0:02x}")]
    Unsupported(u8),
    #[error("msgpack str is not valid UTF-8")]
    InvalidUtf8,
    #[error("msgpack map key is a {0}, not a str")]
    NonStringKey(&'static str),
    #[error("msgpack nesting deeper than {MAX_DEPTH}")]
    TooDeep,
}

/// Encodes `v` with the smallest representation of every value.
pub fn encode(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    write_value(&mut out, v);
    out
}

/// Appends `v`'s encoding to `out`: a sender that keeps one buffer writes each frame
/// without growing a fresh `Vec` as it goes.
pub fn encode_into(out: &mut Vec<u8>, v: &Value) {
    write_value(out, v);
}

fn write_len(out: &mut Vec<u8>, len: usize, fix: Option<(u8, usize)>, m8: Option<u8>, m16: u8, m32: u8) {
    match (fix, m8) {
        (Some((base, max)), _) if len <= max => out.push(base | len as u8),
        (_, Some(marker)) if len <= 0xff => out.extend_from_slice(&[marker, len as u8]),
        _ if len <= 0xffff => {
            out.push(m16);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        _ => {
            out.push(m32);
            out.extend_from_slice(&(len as u32).to_be_bytes());
        }
    }
}

fn write_int(out: &mut Vec<u8>, i: i128) {
    if (0..=0x7f).contains(&i) {
        out.push(i as u8);
    } else if (-32..0).contains(&i) {
        out.push(i as i8 as u8);
    } else if i >= 0 {
        if i <= 0xff {
            out.extend_from_slice(&[0xcc, i as u8]);
        } else if i <= 0xffff {
            out.push(0xcd);
            out.extend_from_slice(&(i as u16).to_be_bytes());
        } else if i <= 0xffff_ffff {
            out.push(0xce);
            out.extend_from_slice(&(i as u32).to_be_bytes());
        } else {
            out.push(0xcf);
            out.extend_from_slice(&(i.min(i128::from(u64::MAX)) as u64).to_be_bytes());
        }
    } else if i >= -0x80 {
        out.extend_from_slice(&[0xd0, i as i8 as u8]);
    } else if i >= -0x8000 {
        out.push(0xd1);
        out.extend_from_slice(&(i as i16).to_be_bytes());
    } else if i >= -0x8000_0000 {
        out.push(0xd2);
        out.extend_from_slice(&(i as i32).to_be_bytes());
    } else {
        out.push(0xd3);
        out.extend_from_slice(&(i.max(i128::from(i64::MIN)) as i64).to_be_bytes());
    }
}

fn write_str(out: &mut Vec<u8>, s: &str) {
    write_len(out, s.len(), Some((0xa0, 31)), Some(0xd9), 0xda, 0xdb);
    out.extend_from_slice(s.as_bytes());
}

fn write_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::Nil => out.push(0xc0),
        Value::Bool(false) => out.push(0xc2),
        Value::Bool(true) => out.push(0xc3),
        Value::Int(i) => write_int(out, *i),
        Value::Float(x) => {
            out.push(0xcb);
            out.extend_from_slice(&x.to_be_bytes());
        }
        Value::Str(s) => write_str(out, s),
        Value::Bin(b) => {
            write_len(out, b.len(), None, Some(0xc4), 0xc5, 0xc6);
            out.extend_from_slice(b);
        }
        Value::Array(items) => {
            write_len(out, items.len(), Some((0x90, 15)), None, 0xdc, 0xdd);
            for item in items {
                write_value(out, item);
            }
        }
        Value::Map(entries) => {
            write_len(out, entries.len(), Some((0x80, 15)), None, 0xde, 0xdf);
            for (k, item) in entries {
                write_str(out, k);
                write_value(out, item);
            }
        }
    }
}

/// Decodes exactly one value filling the whole frame.
pub fn decode(frame: &[u8]) -> Result<Value, DecodeError> {
    let mut r = Reader { data: frame, pos: 0 };
    let v = r.value(0)?;
    if r.pos != frame.len() {
        return Err(DecodeError::TrailingBytes);
    }
    Ok(v)
}

struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self.pos.checked_add(n).ok_or(DecodeError::Truncated)?;
        let s = self.data.get(self.pos..end).ok_or(DecodeError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }

    fn be(&mut self, n: usize) -> Result<u64, DecodeError> {
        Ok(self.take(n)?.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
    }

    fn str(&mut self, len: usize) -> Result<String, DecodeError> {
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map(str::to_string).map_err(|_| DecodeError::InvalidUtf8)
    }

    fn array(&mut self, len: usize, depth: usize) -> Result<Value, DecodeError> {
        // Each element takes at least one byte: a claimed length beyond the frame is a lie.
        if len > self.data.len() - self.pos {
            return Err(DecodeError::Truncated);
        }
        let mut items = Vec::with_capacity(len);
        for _ in 0..len {
            items.push(self.value(depth + 1)?);
        }
        Ok(Value::Array(items))
    }

    fn map(&mut self, len: usize, depth: usize) -> Result<Value, DecodeError> {
        if len > (self.data.len() - self.pos) / 2 {
            return Err(DecodeError::Truncated);
        }
        let mut entries = Vec::with_capacity(len);
        for _ in 0..len {
            let key = match self.data.get(self.pos) {
                // A fixstr key (every W1 key) is read directly; anything else goes through
                // `value`, which also applies the depth bound.
                Some(&b @ 0xa0..=0xbf) if depth < MAX_DEPTH => {
                    self.pos += 1;
                    self.str(usize::from(b & 0x1f))?
                }
                _ => match self.value(depth + 1)? {
                    Value::Str(s) => s,
                    other => return Err(DecodeError::NonStringKey(other.type_name())),
                },
            };
            entries.push((key, self.value(depth + 1)?));
        }
        Ok(Value::Map(entries))
    }

    fn value(&mut self, depth: usize) -> Result<Value, DecodeError> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep);
        }
        let b = self.byte()?;
        Ok(match b {
            0x00..=0x7f => Value::Int(i128::from(b)),
            0x80..=0x8f => return self.map(usize::from(b & 0x0f), depth),
            0x90..=0x9f => return self.array(usize::from(b & 0x0f), depth),
            0xa0..=0xbf => Value::Str(self.str(usize::from(b & 0x1f))?),
            0xc0 => Value::Nil,
            0xc2 => Value::Bool(false),
            0xc3 => Value::Bool(true),
            0xc4..=0xc6 => {
                let n = self.be(1 << (b - 0xc4))? as usize;
                Value::Bin(self.take(n)?.to_vec())
            }
            0xca => Value::Float(f64::from(f32::from_bits(self.be(4)? as u32))),
            0xcb => Value::Float(f64::from_bits(self.be(8)?)),
            0xcc..=0xcf => Value::Int(i128::from(self.be(1 << (b - 0xcc))?)),
            0xd0 => Value::Int(i128::from(self.be(1)? as u8 as i8)),
            0xd1 => Value::Int(i128::from(self.be(2)? as u16 as i16)),
            0xd2 => Value::Int(i128::from(self.be(4)? as u32 as i32)),
            0xd3 => Value::Int(i128::from(self.be(8)? as i64)),
            0xd9..=0xdb => {
                let n = self.be(1 << (b - 0xd9))? as usize;
                Value::Str(self.str(n)?)
            }
            0xdc | 0xdd => {
                let n = self.be(if b == 0xdc { 2 } else { 4 })? as usize;
                return self.array(n, depth);
            }
            0xde | 0xdf => {
                let n = self.be(if b == 0xde { 2 } else { 4 })? as usize;
                return self.map(n, depth);
            }
            0xe0..=0xff => Value::Int(i128::from(b as i8)),
            other => return Err(DecodeError::Unsupported(other)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smallest_encodings_as_msgspec_writes_them() {
        assert_eq!(encode(&Value::Int(5)), [0x05]);
        assert_eq!(encode(&Value::Int(-1)), [0xff]);
        assert_eq!(encode(&Value::Int(-33)), [0xd0, 0xdf]);
        assert_eq!(encode(&Value::Int(200)), [0xcc, 200]);
        assert_eq!(encode(&Value::Int(65536)), [0xce, 0, 1, 0, 0]);
        assert_eq!(encode(&Value::Int(i128::from(u64::MAX))), [0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(encode(&Value::Int(i128::from(i64::MIN)))[0], 0xd3);
        assert_eq!(encode(&Value::Str("ab".into())), [0xa2, b'a', b'b']);
        assert_eq!(encode(&Value::Bin(vec![1, 2])), [0xc4, 2, 1, 2]);
        assert_eq!(encode(&Value::map([("type", Value::from("connect_ack"))]))[..2], [0x81, 0xa4]);
    }

    #[test]
    fn encode_into_appends_the_same_bytes() {
        let v = Value::map([("type", Value::from("lookup")), ("n", Value::Int(-70000))]);
        let mut out = vec![0xee];
        encode_into(&mut out, &v);
        assert_eq!(out[0], 0xee);
        assert_eq!(out[1..], encode(&v)[..]);
    }

    #[test]
    fn round_trips_keep_bin_and_str_apart() {
        let v = Value::map([
            ("type", Value::from("fetch")),
            ("keys", Value::Array(vec![Value::Bin(vec![0; 36]), Value::Bin(vec![])])),
            ("name", Value::Str("é".into())),
            ("big", Value::Int(i128::from(u64::MAX))),
            ("neg", Value::Int(-70000)),
            ("f", Value::Float(1.5)),
            ("n", Value::Nil),
            ("long", Value::Str("x".repeat(300))),
            ("blob", Value::Bin(vec![7; 70000])),
        ]);
        assert_eq!(decode(&encode(&v)), Ok(v));
    }

    #[test]
    fn hostile_frames_fail_cleanly() {
        assert_eq!(decode(&[]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0xdd, 0xff, 0xff, 0xff, 0xff]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0xc6, 0xff, 0xff, 0xff, 0xff, 1]), Err(DecodeError::Truncated));
        assert_eq!(decode(&[0xc1]), Err(DecodeError::Unsupported(0xc1)));
        assert_eq!(decode(&[0xa1, 0xff]), Err(DecodeError::InvalidUtf8));
        assert_eq!(decode(&[0x81, 0x01, 0x02]), Err(DecodeError::NonStringKey("int")));
        assert_eq!(decode(&[0x01, 0x02]), Err(DecodeError::TrailingBytes));
        assert_eq!(decode(&[0x91; 100]), Err(DecodeError::TooDeep));
    }
}
