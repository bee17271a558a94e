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
    encode_into(&mut out, v);
    out
}

/// Appends `v`'s encoding to `out`: a sender that keeps one buffer writes each frame
/// without growing a fresh `Vec` as it goes.
pub fn encode_into(out: &mut Vec<u8>, v: &Value) {
    Writer::new(out).value(v);
}

/// The one msgpack writer: every encoding of a value, whatever holds it (a [`Value`]
/// here, a Python object in the bindings), goes through these methods, so every sender
/// writes the smallest encoding msgspec writes. A container's header comes first, then
/// its items (a map's as key, value, key, value...).
pub struct Writer<'a> {
    out: &'a mut Vec<u8>,
}

impl<'a> Writer<'a> {
    /// Appends to `out`.
    pub fn new(out: &'a mut Vec<u8>) -> Self {
        Writer { out }
    }

    pub fn nil(&mut self) {
        self.out.push(0xc0);
    }

    pub fn bool(&mut self, b: bool) {
        self.out.push(if b { 0xc3 } else { 0xc2 });
    }

    /// Any integer; beyond msgpack's range (`-2^63 ..= 2^64 - 1`) it is clamped, so a
    /// caller that must refuse those checks first.
    pub fn int(&mut self, i: i128) {
        let out = &mut *self.out;
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

    /// A float64, as msgspec writes every Python `float`.
    pub fn float(&mut self, x: f64) {
        self.out.push(0xcb);
        self.out.extend_from_slice(&x.to_be_bytes());
    }

    #[inline]
    pub fn str(&mut self, s: &str) {
        match u8::try_from(s.len()) {
            // A fixstr, as nearly every key and short value is.
            Ok(n @ 0..=31) => self.out.push(0xa0 | n),
            _ => self.len(s.len(), Some((0xa0, 31)), Some(0xd9), 0xda, 0xdb),
        }
        self.out.extend_from_slice(s.as_bytes());
    }

    pub fn bin(&mut self, b: &[u8]) {
        self.len(b.len(), None, Some(0xc4), 0xc5, 0xc6);
        self.out.extend_from_slice(b);
    }

    /// The header of an array of `len` items.
    pub fn array(&mut self, len: usize) {
        self.len(len, Some((0x90, 15)), None, 0xdc, 0xdd);
    }

    /// The header of a map of `len` entries.
    pub fn map(&mut self, len: usize) {
        self.len(len, Some((0x80, 15)), None, 0xde, 0xdf);
    }

    /// All of `v`.
    pub fn value(&mut self, v: &Value) {
        match v {
            Value::Nil => self.nil(),
            Value::Bool(b) => self.bool(*b),
            Value::Int(i) => self.int(*i),
            Value::Float(x) => self.float(*x),
            Value::Str(s) => self.str(s),
            Value::Bin(b) => self.bin(b),
            Value::Array(items) => {
                self.array(items.len());
                for item in items {
                    self.value(item);
                }
            }
            Value::Map(entries) => {
                self.map(entries.len());
                for (k, item) in entries {
                    self.str(k);
                    self.value(item);
                }
            }
        }
    }

    fn len(&mut self, len: usize, fix: Option<(u8, usize)>, m8: Option<u8>, m16: u8, m32: u8) {
        let out = &mut *self.out;
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
}

/// What a frame's values become: the one msgpack parser ([`read`]) hands each value it
/// finds to a builder, so the registry's check ([`validate`]), the core's [`Value`]
/// ([`decode`]) and the bindings' Python objects come from the same reading of the bytes,
/// with the same limits and errors.
pub trait Build {
    /// A built value.
    type Node;
    /// An array being filled.
    type Seq;
    /// A map being filled.
    type Map;
    /// The builder's own failures, beside the frame's.
    type Error: From<DecodeError>;

    fn nil(&mut self) -> Result<Self::Node, Self::Error>;
    fn bool(&mut self, b: bool) -> Result<Self::Node, Self::Error>;
    fn int(&mut self, i: i128) -> Result<Self::Node, Self::Error>;
    fn float(&mut self, x: f64) -> Result<Self::Node, Self::Error>;
    fn str(&mut self, s: &str) -> Result<Self::Node, Self::Error>;
    fn bin(&mut self, b: &[u8]) -> Result<Self::Node, Self::Error>;
    /// An array of `len` items (`len` is already checked against the frame's length).
    fn seq(&mut self, len: usize) -> Result<Self::Seq, Self::Error>;
    fn push(&mut self, seq: &mut Self::Seq, item: Self::Node) -> Result<(), Self::Error>;
    fn end_seq(&mut self, seq: Self::Seq) -> Result<Self::Node, Self::Error>;
    /// A map of `len` entries (checked as for `seq`).
    fn map(&mut self, len: usize) -> Result<Self::Map, Self::Error>;
    fn insert(&mut self, map: &mut Self::Map, key: &str, value: Self::Node) -> Result<(), Self::Error>;
    fn end_map(&mut self, map: Self::Map) -> Result<Self::Node, Self::Error>;
}

/// Reads exactly one value filling the whole frame into `builder`.
pub fn read<B: Build>(frame: &[u8], builder: &mut B) -> Result<B::Node, B::Error> {
    let mut r = Reader { data: frame, pos: 0 };
    let v = r.value(0, builder)?;
    if r.pos != frame.len() {
        return Err(DecodeError::TrailingBytes.into());
    }
    Ok(v)
}

/// Decodes exactly one value filling the whole frame.
pub fn decode(frame: &[u8]) -> Result<Value, DecodeError> {
    read(frame, &mut ValueBuilder)
}

/// Whether `frame` decodes (the same verdict as [`decode`]), building nothing.
///
/// Every received frame is checked here before it is queued, so the common case takes
/// [`skim`]'s plain walk; only a frame it does not pass is read again by the parser, whose
/// error is the one reported. Either way the verdict is the parser's.
pub fn validate(frame: &[u8]) -> Result<(), DecodeError> {
    if skim(frame) {
        return Ok(());
    }
    read(frame, &mut Check).map(|_| ())
}

/// True only if `frame` is one value that [`read`] accepts: the parser's checks (markers,
/// lengths, UTF-8, string keys, the depth bound, no trailing bytes) without its generic
/// builder. `false` is no verdict; the caller asks the parser.
fn skim(frame: &[u8]) -> bool {
    let mut pos = 0;
    skim_value(frame, &mut pos, 0) && pos == frame.len()
}

fn skim_value(d: &[u8], pos: &mut usize, depth: usize) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    let Some(&m) = d.get(*pos) else { return false };
    *pos += 1;
    match m {
        0x00..=0x7f | 0xc0 | 0xc2 | 0xc3 | 0xe0..=0xff => true,
        0x80..=0x8f => skim_map(d, pos, usize::from(m & 0x0f), depth),
        0x90..=0x9f => skim_array(d, pos, usize::from(m & 0x0f), depth),
        0xa0..=0xbf => skim_str(d, pos, usize::from(m & 0x1f)),
        0xc4..=0xc6 => skim_len(d, pos, 1 << (m - 0xc4)).is_some_and(|n| skim_bytes(d, pos, n).is_some()),
        0xca => skim_bytes(d, pos, 4).is_some(),
        0xcb => skim_bytes(d, pos, 8).is_some(),
        0xcc..=0xcf => skim_bytes(d, pos, 1 << (m - 0xcc)).is_some(),
        0xd0..=0xd3 => skim_bytes(d, pos, 1 << (m - 0xd0)).is_some(),
        0xd9..=0xdb => skim_len(d, pos, 1 << (m - 0xd9)).is_some_and(|n| skim_str(d, pos, n)),
        0xdc | 0xdd => skim_len(d, pos, if m == 0xdc { 2 } else { 4 }).is_some_and(|n| skim_array(d, pos, n, depth)),
        0xde | 0xdf => skim_len(d, pos, if m == 0xde { 2 } else { 4 }).is_some_and(|n| skim_map(d, pos, n, depth)),
        _ => false,
    }
}

fn skim_array(d: &[u8], pos: &mut usize, len: usize, depth: usize) -> bool {
    // Each element takes a byte at least, so a lying length runs out of frame.
    (0..len).all(|_| skim_value(d, pos, depth + 1))
}

fn skim_map(d: &[u8], pos: &mut usize, len: usize, depth: usize) -> bool {
    (0..len).all(|_| {
        // Keys as `Reader::key` takes them: a `str`, above the depth bound.
        let key = match d.get(*pos) {
            Some(&k @ 0xa0..=0xbf) if depth < MAX_DEPTH => {
                *pos += 1;
                skim_str(d, pos, usize::from(k & 0x1f))
            }
            Some(&k @ 0xd9..=0xdb) if depth < MAX_DEPTH => {
                *pos += 1;
                skim_len(d, pos, 1 << (k - 0xd9)).is_some_and(|n| skim_str(d, pos, n))
            }
            _ => false,
        };
        key && skim_value(d, pos, depth + 1)
    })
}

fn skim_str(d: &[u8], pos: &mut usize, n: usize) -> bool {
    skim_bytes(d, pos, n).is_some_and(|s| s.is_ascii() || std::str::from_utf8(s).is_ok())
}

/// A big-endian length of `width` bytes.
fn skim_len(d: &[u8], pos: &mut usize, width: usize) -> Option<usize> {
    let bytes = skim_bytes(d, pos, width)?;
    usize::try_from(bytes.iter().fold(0u64, |acc, &b| (acc << 8) | u64::from(b))).ok()
}

fn skim_bytes<'a>(d: &'a [u8], pos: &mut usize, n: usize) -> Option<&'a [u8]> {
    let end = pos.checked_add(n)?;
    let s = d.get(*pos..end)?;
    *pos = end;
    Some(s)
}

/// Builds [`Value`]s.
struct ValueBuilder;

impl Build for ValueBuilder {
    type Node = Value;
    type Seq = Vec<Value>;
    type Map = Vec<(String, Value)>;
    type Error = DecodeError;

    fn nil(&mut self) -> Result<Value, DecodeError> {
        Ok(Value::Nil)
    }
    fn bool(&mut self, b: bool) -> Result<Value, DecodeError> {
        Ok(Value::Bool(b))
    }
    fn int(&mut self, i: i128) -> Result<Value, DecodeError> {
        Ok(Value::Int(i))
    }
    fn float(&mut self, x: f64) -> Result<Value, DecodeError> {
        Ok(Value::Float(x))
    }
    fn str(&mut self, s: &str) -> Result<Value, DecodeError> {
        Ok(Value::Str(s.to_string()))
    }
    fn bin(&mut self, b: &[u8]) -> Result<Value, DecodeError> {
        Ok(Value::Bin(b.to_vec()))
    }
    fn seq(&mut self, len: usize) -> Result<Vec<Value>, DecodeError> {
        Ok(Vec::with_capacity(len))
    }
    fn push(&mut self, seq: &mut Vec<Value>, item: Value) -> Result<(), DecodeError> {
        seq.push(item);
        Ok(())
    }
    fn end_seq(&mut self, seq: Vec<Value>) -> Result<Value, DecodeError> {
        Ok(Value::Array(seq))
    }
    fn map(&mut self, len: usize) -> Result<Vec<(String, Value)>, DecodeError> {
        Ok(Vec::with_capacity(len))
    }
    fn insert(&mut self, map: &mut Vec<(String, Value)>, key: &str, value: Value) -> Result<(), DecodeError> {
        map.push((key.to_string(), value));
        Ok(())
    }
    fn end_map(&mut self, map: Vec<(String, Value)>) -> Result<Value, DecodeError> {
        Ok(Value::Map(map))
    }
}

/// Builds nothing: the parser's checks alone. Its nodes carry the Python type name, which
/// a non-string map key's error names.
struct Check;

impl Build for Check {
    type Node = &'static str;
    type Seq = ();
    type Map = ();
    type Error = DecodeError;

    fn nil(&mut self) -> Result<&'static str, DecodeError> {
        Ok("NoneType")
    }
    fn bool(&mut self, _: bool) -> Result<&'static str, DecodeError> {
        Ok("bool")
    }
    fn int(&mut self, _: i128) -> Result<&'static str, DecodeError> {
        Ok("int")
    }
    fn float(&mut self, _: f64) -> Result<&'static str, DecodeError> {
        Ok("float")
    }
    fn str(&mut self, _: &str) -> Result<&'static str, DecodeError> {
        Ok("str")
    }
    fn bin(&mut self, _: &[u8]) -> Result<&'static str, DecodeError> {
        Ok("bytes")
    }
    fn seq(&mut self, _: usize) -> Result<(), DecodeError> {
        Ok(())
    }
    fn push(&mut self, _: &mut (), _: &'static str) -> Result<(), DecodeError> {
        Ok(())
    }
    fn end_seq(&mut self, _: ()) -> Result<&'static str, DecodeError> {
        Ok("list")
    }
    fn map(&mut self, _: usize) -> Result<(), DecodeError> {
        Ok(())
    }
    fn insert(&mut self, _: &mut (), _: &str, _: &'static str) -> Result<(), DecodeError> {
        Ok(())
    }
    fn end_map(&mut self, _: ()) -> Result<&'static str, DecodeError> {
        Ok("dict")
    }
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

    fn str(&mut self, len: usize) -> Result<&'a str, DecodeError> {
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8)
    }

    fn array<B: Build>(&mut self, len: usize, depth: usize, b: &mut B) -> Result<B::Node, B::Error> {
        // Each element takes at least one byte: a claimed length beyond the frame is a lie.
        if len > self.data.len() - self.pos {
            return Err(DecodeError::Truncated.into());
        }
        let mut seq = b.seq(len)?;
        for _ in 0..len {
            let item = self.value(depth + 1, b)?;
            b.push(&mut seq, item)?;
        }
        b.end_seq(seq)
    }

    fn map<B: Build>(&mut self, len: usize, depth: usize, b: &mut B) -> Result<B::Node, B::Error> {
        if len > (self.data.len() - self.pos) / 2 {
            return Err(DecodeError::Truncated.into());
        }
        let mut map = b.map(len)?;
        for _ in 0..len {
            let key = self.key(depth)?;
            let value = self.value(depth + 1, b)?;
            b.insert(&mut map, key, value)?;
        }
        b.end_map(map)
    }

    /// A map key, borrowed from the frame. A fixstr key (every W1 key) is read directly;
    /// anything else is read whole first (so the depth bound and truncation still apply)
    /// and refused unless it is a `str`.
    fn key(&mut self, depth: usize) -> Result<&'a str, DecodeError> {
        match self.data.get(self.pos) {
            Some(&b @ 0xa0..=0xbf) if depth < MAX_DEPTH => {
                self.pos += 1;
                self.str(usize::from(b & 0x1f))
            }
            Some(&b @ 0xd9..=0xdb) if depth < MAX_DEPTH => {
                self.pos += 1;
                let n = self.be(1 << (b - 0xd9))? as usize;
                self.str(n)
            }
            // Every `str` marker is taken above, so this value is not one.
            _ => Err(DecodeError::NonStringKey(self.value(depth + 1, &mut Check)?)),
        }
    }

    fn value<B: Build>(&mut self, depth: usize, b: &mut B) -> Result<B::Node, B::Error> {
        if depth > MAX_DEPTH {
            return Err(DecodeError::TooDeep.into());
        }
        let m = self.byte()?;
        match m {
            0x00..=0x7f => b.int(i128::from(m)),
            0x80..=0x8f => self.map(usize::from(m & 0x0f), depth, b),
            0x90..=0x9f => self.array(usize::from(m & 0x0f), depth, b),
            0xa0..=0xbf => {
                let s = self.str(usize::from(m & 0x1f))?;
                b.str(s)
            }
            0xc0 => b.nil(),
            0xc2 => b.bool(false),
            0xc3 => b.bool(true),
            0xc4..=0xc6 => {
                let n = self.be(1 << (m - 0xc4))? as usize;
                let bytes = self.take(n)?;
                b.bin(bytes)
            }
            0xca => {
                let x = f64::from(f32::from_bits(self.be(4)? as u32));
                b.float(x)
            }
            0xcb => {
                let x = f64::from_bits(self.be(8)?);
                b.float(x)
            }
            0xcc..=0xcf => {
                let i = i128::from(self.be(1 << (m - 0xcc))?);
                b.int(i)
            }
            0xd0 => {
                let i = i128::from(self.be(1)? as u8 as i8);
                b.int(i)
            }
            0xd1 => {
                let i = i128::from(self.be(2)? as u16 as i16);
                b.int(i)
            }
            0xd2 => {
                let i = i128::from(self.be(4)? as u32 as i32);
                b.int(i)
            }
            0xd3 => {
                let i = i128::from(self.be(8)? as i64);
                b.int(i)
            }
            0xd9..=0xdb => {
                let n = self.be(1 << (m - 0xd9))? as usize;
                let s = self.str(n)?;
                b.str(s)
            }
            0xdc | 0xdd => {
                let n = self.be(if m == 0xdc { 2 } else { 4 })? as usize;
                self.array(n, depth, b)
            }
            0xde | 0xdf => {
                let n = self.be(if m == 0xde { 2 } else { 4 })? as usize;
                self.map(n, depth, b)
            }
            0xe0..=0xff => b.int(i128::from(m as i8)),
            other => Err(DecodeError::Unsupported(other).into()),
        }
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

    proptest::proptest! {
        /// The skim never passes a frame the parser refuses, on random bytes and on
        /// valid frames with one byte changed or cut.
        #[test]
        fn skim_passes_only_what_the_parser_accepts(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64),
            at in 0usize..64,
            to in proptest::num::u8::ANY,
            cut in 0usize..64,
        ) {
            let good = encode(&Value::map([
                ("type", Value::from("block")),
                ("seq", Value::Int(300)),
                ("key", Value::Bin(vec![7; 33])),
                ("list", Value::Array(vec![Value::Float(0.5), Value::Nil, Value::Int(-40000)])),
                ("name", Value::Str("é".repeat(20))),
            ]));
            let mut changed = good.clone();
            let i = at % changed.len();
            changed[i] = to;
            for frame in [bytes.as_slice(), changed.as_slice(), &good[..cut.min(good.len())]] {
                let parsed = read(frame, &mut Check).map(|_| ());
                proptest::prop_assert!(!skim(frame) || parsed.is_ok(), "skim passed {frame:02x?}: {parsed:?}");
                proptest::prop_assert_eq!(validate(frame), parsed);
            }
            proptest::prop_assert!(skim(&good));
        }
    }

    #[test]
    fn skim_keeps_the_depth_bound_and_string_keys() {
        let mut deep = vec![0x91; MAX_DEPTH];
        deep.push(0x80);
        assert!(skim(&deep));
        assert_eq!(validate(&deep), Ok(()));
        let mut too_deep = vec![0x91; MAX_DEPTH + 1];
        too_deep.push(0x80);
        assert!(!skim(&too_deep));
        assert_eq!(validate(&too_deep), Err(DecodeError::TooDeep));
        assert!(!skim(&[0x81, 0x01, 0x02]));
        assert_eq!(validate(&[0x81, 0x01, 0x02]), Err(DecodeError::NonStringKey("int")));
        assert!(!skim(&[0xa1, 0xff]));
        assert_eq!(validate(&[0xa1, 0xff]), Err(DecodeError::InvalidUtf8));
        assert!(!skim(&[0xc0, 0xc0]));
        assert_eq!(validate(&[0xc0, 0xc0]), Err(DecodeError::TrailingBytes));
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

    #[test]
    fn validate_gives_the_verdict_of_decode() {
        let mut deep_key = vec![0x81; MAX_DEPTH];
        deep_key.extend_from_slice(&[0xa1, b'k', 0x01]);
        let frames: Vec<Vec<u8>> = vec![
            vec![],
            vec![0xdd, 0xff, 0xff, 0xff, 0xff],
            vec![0xc1],
            vec![0xa1, 0xff],
            vec![0x81, 0x01, 0x02],
            vec![0x81, 0x91, 0x01, 0x02],
            vec![0x81, 0xd9, 0x01, b'k', 0x02],
            vec![0x81, 0xd9, 0x05, b'k'],
            vec![0x01, 0x02],
            vec![0x91; 100],
            deep_key,
            encode(&Value::map([("type", Value::from("lookup")), ("keys", Value::Array(vec![Value::Bin(vec![1])]))])),
        ];
        for frame in &frames {
            assert_eq!(validate(frame), decode(frame).map(|_| ()), "frame {frame:02x?}");
        }
    }
}
