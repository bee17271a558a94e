//! A serde serializer that writes Python's `json.dumps` layout straight into a `Vec<u8>`.
//!
//! It writes what `serde_json` with [`super::pyjson::PythonFormatter`] writes, byte for
//! byte, in one pass over each string (serde_json scans a string for its own escapes and
//! the formatter scans it again for `ensure_ascii`) and without `io::Write` in between.
//! Anything rare (floats, exotic map keys, errors) is refused with [`Fallback`], and
//! [`super::pyjson::dumps`] then writes the whole value the general way.

use serde::ser::{self, Impossible, Serialize};
use std::fmt;
use std::io::Write as _;
use thiserror::Error;

/// The value needs the general `serde_json` writer.
#[derive(Debug, Error)]
#[error("left to the general JSON writer")]
pub struct Fallback;

impl ser::Error for Fallback {
    fn custom<T: fmt::Display>(_msg: T) -> Self {
        Fallback
    }
}

/// How `serde_json` names the one-field struct that carries an `arbitrary_precision`
/// number's digits.
const NUMBER_TOKEN: &str = "$serde_json::private::Number";

/// Appends `value` in the `json.dumps` layout; on `Err` the caller discards what was
/// appended.
pub fn write<T: Serialize + ?Sized>(out: &mut Vec<u8>, value: &T) -> Result<(), Fallback> {
    value.serialize(&mut PyWriter { out })
}

/// `s` as a JSON string with `ensure_ascii` escapes, as Python writes it.
#[inline]
pub fn write_str(out: &mut Vec<u8>, s: &str) {
    out.reserve(s.len() + 2);
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    let mut i = plain_prefix(bytes);
    while i < bytes.len() {
        let b = bytes[i];
        if (b' '..=b'~').contains(&b) && b != b'"' && b != b'\\' {
            i += 1;
            continue;
        }
        out.extend_from_slice(&bytes[start..i]);
        if b < 0x80 {
            match b {
                b'"' => out.extend_from_slice(b"\\\""),
                b'\\' => out.extend_from_slice(b"\\\\"),
                0x08 => out.extend_from_slice(b"\\b"),
                0x0c => out.extend_from_slice(b"\\f"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b'\t' => out.extend_from_slice(b"\\t"),
                _ => write_unit(out, u32::from(b)),
            }
            i += 1;
        } else {
            // `i` is a character boundary: only whole characters are stepped over.
            let c = s[i..].chars().next().unwrap_or('\u{fffd}');
            if let Some(surrogate) = super::pyjson::carried_surrogate(c) {
                write_unit(out, surrogate);
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write_unit(out, u32::from(*unit));
                }
            }
            i += c.len_utf8();
        }
        start = i;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Repeats a byte in every lane of a word.
const fn lanes(b: u8) -> u64 {
    0x0101_0101_0101_0101 * b as u64
}

/// Whether any byte of the word may need an escape: below `' '`, above `'~'`, `"` or `\`.
/// It may answer `true` for a word that needs none (callers then look byte by byte),
/// never `false` for one that does.
///
/// Branch-free, one pass of word arithmetic: a lane's high bit ends up set by `b - 0x20`
/// when `b < 0x20`, by `b + 1` when `b >= 0x7f`, by `b` itself when `b >= 0x80`, and by the
/// zero-lane test when `b` is `"` or `\`. A borrow or carry that crosses into the next
/// lane starts only in a lane that is itself flagged, so it can add false alarms but never
/// hide one.
#[inline]
pub fn may_need_escape(w: u64) -> bool {
    escape_lanes(w) != 0
}

/// The high bit of every lane of `w` (little-endian) flagged by [`may_need_escape`]'s
/// arithmetic. The lowest flagged lane is exact: nothing crosses into it from below, so it
/// is the first byte that needs an escape.
#[inline]
pub fn escape_lanes(w: u64) -> u64 {
    const HIGH: u64 = lanes(0x80);
    let zero = |x: u64| x.wrapping_sub(lanes(1)) & !x;
    let range = w.wrapping_sub(lanes(b' ')) | w.wrapping_add(lanes(1)) | w;
    (range | zero(w ^ lanes(b'"')) | zero(w ^ lanes(b'\\'))) & HIGH
}

/// Length of the leading run of whole 8-byte words that surely need no escape.
#[inline]
pub fn plain_prefix(bytes: &[u8]) -> usize {
    let mut i = 0;
    for chunk in bytes.chunks_exact(8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        if may_need_escape(u64::from_le_bytes(word)) {
            break;
        }
        i += 8;
    }
    i
}

/// `\uXXXX` with lowercase hex digits.
#[inline]
fn write_unit(out: &mut Vec<u8>, unit: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(&[
        b'\\',
        b'u',
        HEX[(unit >> 12 & 0xf) as usize],
        HEX[(unit >> 8 & 0xf) as usize],
        HEX[(unit >> 4 & 0xf) as usize],
        HEX[(unit & 0xf) as usize],
    ]);
}

/// The decimal digits of `n`.
#[inline]
pub fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    // Two digits per division, from a table of "00".."99".
    const PAIRS: [u8; 200] = {
        let mut t = [0u8; 200];
        let mut i = 0;
        while i < 100 {
            t[2 * i] = b'0' + (i / 10) as u8;
            t[2 * i + 1] = b'0' + (i % 10) as u8;
            i += 1;
        }
        t
    };
    let mut buf = [0u8; 20];
    let mut at = buf.len();
    while n >= 100 {
        let pair = (n % 100) as usize * 2;
        n /= 100;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = n as usize * 2;
        at -= 2;
        buf[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        at -= 1;
        buf[at] = b'0' + n as u8;
    }
    out.extend_from_slice(&buf[at..]);
}

#[inline]
fn write_i64(out: &mut Vec<u8>, n: i64) {
    if n < 0 {
        out.push(b'-');
    }
    write_u64(out, n.unsigned_abs());
}

struct PyWriter<'a> {
    out: &'a mut Vec<u8>,
}

/// An open array or object: `close` is written at its end.
struct Compound<'w, 'a> {
    w: &'w mut PyWriter<'a>,
    first: bool,
    close: &'static [u8],
    /// `serde_json`'s number struct: its one field is the digits, written bare.
    number: bool,
}

impl Compound<'_, '_> {
    #[inline]
    fn separator(&mut self) {
        if self.first {
            self.first = false;
        } else {
            self.w.out.extend_from_slice(b", ");
        }
    }

    #[inline]
    fn entry<V: Serialize + ?Sized>(&mut self, key: &str, value: &V) -> Result<(), Fallback> {
        self.separator();
        write_str(self.w.out, key);
        self.w.out.extend_from_slice(b": ");
        value.serialize(&mut *self.w)
    }
}

impl<'w, 'a> PyWriter<'a> {
    fn open(&'w mut self, open: &[u8], close: &'static [u8]) -> Compound<'w, 'a> {
        self.out.extend_from_slice(open);
        Compound { w: self, first: true, close, number: false }
    }

    /// `{"variant": ` of an externally tagged enum variant.
    fn tag(&mut self, variant: &str) {
        self.out.push(b'{');
        write_str(self.out, variant);
        self.out.extend_from_slice(b": ");
    }
}

impl<'w, 'a> ser::Serializer for &'w mut PyWriter<'a> {
    type Ok = ();
    type Error = Fallback;
    type SerializeSeq = Compound<'w, 'a>;
    type SerializeTuple = Compound<'w, 'a>;
    type SerializeTupleStruct = Compound<'w, 'a>;
    type SerializeTupleVariant = Compound<'w, 'a>;
    type SerializeMap = Compound<'w, 'a>;
    type SerializeStruct = Compound<'w, 'a>;
    type SerializeStructVariant = Compound<'w, 'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Fallback> {
        self.out.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Fallback> {
        write_i64(self.out, i64::from(v));
        Ok(())
    }
    fn serialize_i16(self, v: i16) -> Result<(), Fallback> {
        write_i64(self.out, i64::from(v));
        Ok(())
    }
    fn serialize_i32(self, v: i32) -> Result<(), Fallback> {
        write_i64(self.out, i64::from(v));
        Ok(())
    }
    fn serialize_i64(self, v: i64) -> Result<(), Fallback> {
        write_i64(self.out, v);
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), Fallback> {
        write!(self.out, "{v}").map_err(|_| Fallback)
    }
    fn serialize_u8(self, v: u8) -> Result<(), Fallback> {
        write_u64(self.out, u64::from(v));
        Ok(())
    }
    fn serialize_u16(self, v: u16) -> Result<(), Fallback> {
        write_u64(self.out, u64::from(v));
        Ok(())
    }
    fn serialize_u32(self, v: u32) -> Result<(), Fallback> {
        write_u64(self.out, u64::from(v));
        Ok(())
    }
    fn serialize_u64(self, v: u64) -> Result<(), Fallback> {
        write_u64(self.out, v);
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), Fallback> {
        write!(self.out, "{v}").map_err(|_| Fallback)
    }
    fn serialize_f32(self, _v: f32) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_f64(self, _v: f64) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_char(self, v: char) -> Result<(), Fallback> {
        write_str(self.out, v.encode_utf8(&mut [0u8; 4]));
        Ok(())
    }
    fn serialize_str(self, v: &str) -> Result<(), Fallback> {
        write_str(self.out, v);
        Ok(())
    }
    fn serialize_bytes(self, v: &[u8]) -> Result<(), Fallback> {
        self.out.push(b'[');
        for (i, b) in v.iter().enumerate() {
            if i > 0 {
                self.out.extend_from_slice(b", ");
            }
            write_u64(self.out, u64::from(*b));
        }
        self.out.push(b']');
        Ok(())
    }
    fn serialize_none(self) -> Result<(), Fallback> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Fallback> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Fallback> {
        self.serialize_none()
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Fallback> {
        self.serialize_none()
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<(), Fallback> {
        write_str(self.out, variant);
        Ok(())
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<(), Fallback> {
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Fallback> {
        self.tag(variant);
        value.serialize(&mut *self)?;
        self.out.push(b'}');
        Ok(())
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'w, 'a>, Fallback> {
        Ok(self.open(b"[", b"]"))
    }
    fn serialize_tuple(self, _len: usize) -> Result<Compound<'w, 'a>, Fallback> {
        Ok(self.open(b"[", b"]"))
    }
    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Compound<'w, 'a>, Fallback> {
        Ok(self.open(b"[", b"]"))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'w, 'a>, Fallback> {
        self.tag(variant);
        Ok(self.open(b"[", b"]}"))
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'w, 'a>, Fallback> {
        Ok(self.open(b"{", b"}"))
    }
    fn serialize_struct(self, name: &'static str, _len: usize) -> Result<Compound<'w, 'a>, Fallback> {
        if name == NUMBER_TOKEN {
            return Ok(Compound { w: self, first: true, close: b"", number: true });
        }
        Ok(self.open(b"{", b"}"))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'w, 'a>, Fallback> {
        self.tag(variant);
        Ok(self.open(b"{", b"}}"))
    }
}

impl ser::SerializeSeq for Compound<'_, '_> {
    type Ok = ();
    type Error = Fallback;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fallback> {
        self.separator();
        value.serialize(&mut *self.w)
    }
    fn end(self) -> Result<(), Fallback> {
        self.w.out.extend_from_slice(self.close);
        Ok(())
    }
}

impl ser::SerializeTuple for Compound<'_, '_> {
    type Ok = ();
    type Error = Fallback;
    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fallback> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), Fallback> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Fallback;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fallback> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), Fallback> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeTupleVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Fallback;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fallback> {
        ser::SerializeSeq::serialize_element(self, value)
    }
    fn end(self) -> Result<(), Fallback> {
        ser::SerializeSeq::end(self)
    }
}

impl ser::SerializeMap for Compound<'_, '_> {
    type Ok = ();
    type Error = Fallback;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Fallback> {
        self.separator();
        key.serialize(MapKey { out: self.w.out })
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Fallback> {
        self.w.out.extend_from_slice(b": ");
        value.serialize(&mut *self.w)
    }
    fn end(self) -> Result<(), Fallback> {
        self.w.out.extend_from_slice(self.close);
        Ok(())
    }
}

impl ser::SerializeStruct for Compound<'_, '_> {
    type Ok = ();
    type Error = Fallback;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Fallback> {
        if self.number {
            return if key == NUMBER_TOKEN { value.serialize(Digits { out: self.w.out }) } else { Err(Fallback) };
        }
        self.entry(key, value)
    }
    fn end(self) -> Result<(), Fallback> {
        self.w.out.extend_from_slice(self.close);
        Ok(())
    }
}

impl ser::SerializeStructVariant for Compound<'_, '_> {
    type Ok = ();
    type Error = Fallback;
    fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), Fallback> {
        self.entry(key, value)
    }
    fn end(self) -> Result<(), Fallback> {
        self.w.out.extend_from_slice(self.close);
        Ok(())
    }
}

/// The associated types and the refusals shared by the scalar-only serializers below: any
/// value they cannot write sends the whole document to the general path.
macro_rules! scalar_only_serializer {
    () => {
        type Ok = ();
        type Error = Fallback;
        type SerializeSeq = Impossible<(), Fallback>;
        type SerializeTuple = Impossible<(), Fallback>;
        type SerializeTupleStruct = Impossible<(), Fallback>;
        type SerializeTupleVariant = Impossible<(), Fallback>;
        type SerializeMap = Impossible<(), Fallback>;
        type SerializeStruct = Impossible<(), Fallback>;
        type SerializeStructVariant = Impossible<(), Fallback>;

        fn serialize_f32(self, _v: f32) -> Result<(), Fallback> {
            Err(Fallback)
        }
        fn serialize_f64(self, _v: f64) -> Result<(), Fallback> {
            Err(Fallback)
        }
        fn serialize_bytes(self, _v: &[u8]) -> Result<(), Fallback> {
            Err(Fallback)
        }
        fn serialize_none(self) -> Result<(), Fallback> {
            Err(Fallback)
        }
        fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<(), Fallback> {
            Err(Fallback)
        }
        fn serialize_unit(self) -> Result<(), Fallback> {
            Err(Fallback)
        }
        fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Fallback> {
            Err(Fallback)
        }
        fn serialize_newtype_variant<T: Serialize + ?Sized>(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _value: &T,
        ) -> Result<(), Fallback> {
            Err(Fallback)
        }
        fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Fallback> {
            Err(Fallback)
        }
        fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Fallback> {
            Err(Fallback)
        }
        fn serialize_tuple_struct(
            self,
            _name: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeTupleStruct, Fallback> {
            Err(Fallback)
        }
        fn serialize_tuple_variant(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeTupleVariant, Fallback> {
            Err(Fallback)
        }
        fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Fallback> {
            Err(Fallback)
        }
        fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Self::SerializeStruct, Fallback> {
            Err(Fallback)
        }
        fn serialize_struct_variant(
            self,
            _name: &'static str,
            _index: u32,
            _variant: &'static str,
            _len: usize,
        ) -> Result<Self::SerializeStructVariant, Fallback> {
            Err(Fallback)
        }
    };
}

/// Map keys as `serde_json` writes them: strings, and integers and bools in quotes.
/// Every other key is left to the general writer (which quotes finite floats and refuses
/// the rest).
struct MapKey<'a> {
    out: &'a mut Vec<u8>,
}

impl MapKey<'_> {
    fn quoted(self, digits: impl FnOnce(&mut Vec<u8>)) -> Result<(), Fallback> {
        self.out.push(b'"');
        digits(self.out);
        self.out.push(b'"');
        Ok(())
    }
}

impl ser::Serializer for MapKey<'_> {
    fn serialize_str(self, v: &str) -> Result<(), Fallback> {
        write_str(self.out, v);
        Ok(())
    }
    fn serialize_char(self, v: char) -> Result<(), Fallback> {
        self.serialize_str(v.encode_utf8(&mut [0u8; 4]))
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, variant: &'static str) -> Result<(), Fallback> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, value: &T) -> Result<(), Fallback> {
        value.serialize(self)
    }
    fn serialize_bool(self, v: bool) -> Result<(), Fallback> {
        self.quoted(|out| out.extend_from_slice(if v { b"true" } else { b"false" }))
    }
    fn serialize_i8(self, v: i8) -> Result<(), Fallback> {
        self.quoted(|out| write_i64(out, i64::from(v)))
    }
    fn serialize_i16(self, v: i16) -> Result<(), Fallback> {
        self.quoted(|out| write_i64(out, i64::from(v)))
    }
    fn serialize_i32(self, v: i32) -> Result<(), Fallback> {
        self.quoted(|out| write_i64(out, i64::from(v)))
    }
    fn serialize_i64(self, v: i64) -> Result<(), Fallback> {
        self.quoted(|out| write_i64(out, v))
    }
    fn serialize_u8(self, v: u8) -> Result<(), Fallback> {
        self.quoted(|out| write_u64(out, u64::from(v)))
    }
    fn serialize_u16(self, v: u16) -> Result<(), Fallback> {
        self.quoted(|out| write_u64(out, u64::from(v)))
    }
    fn serialize_u32(self, v: u32) -> Result<(), Fallback> {
        self.quoted(|out| write_u64(out, u64::from(v)))
    }
    fn serialize_u64(self, v: u64) -> Result<(), Fallback> {
        self.quoted(|out| write_u64(out, v))
    }
    scalar_only_serializer!();
}

/// The digits of an `arbitrary_precision` number, written bare.
struct Digits<'a> {
    out: &'a mut Vec<u8>,
}

impl ser::Serializer for Digits<'_> {
    fn serialize_str(self, v: &str) -> Result<(), Fallback> {
        self.out.extend_from_slice(v.as_bytes());
        Ok(())
    }
    fn serialize_char(self, _v: char) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_unit_variant(self, _name: &'static str, _index: u32, _variant: &'static str) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, _name: &'static str, _value: &T) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_bool(self, _v: bool) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_i8(self, _v: i8) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_i16(self, _v: i16) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_i32(self, _v: i32) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_i64(self, _v: i64) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_u8(self, _v: u8) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_u16(self, _v: u16) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_u32(self, _v: u32) -> Result<(), Fallback> {
        Err(Fallback)
    }
    fn serialize_u64(self, _v: u64) -> Result<(), Fallback> {
        Err(Fallback)
    }
    scalar_only_serializer!();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_byte_that_needs_an_escape_passes_as_plain() {
        for b in 0..=255u8 {
            let needs = !(b' '..=b'~').contains(&b) || b == b'"' || b == b'\\';
            for lane in 0..8 {
                let mut word = [b'a'; 8];
                word[lane] = b;
                let flagged = may_need_escape(u64::from_le_bytes(word));
                assert!(flagged || !needs, "byte {b:#04x} in lane {lane}");
                if !needs {
                    assert!(!flagged, "plain byte {b:#04x} in lane {lane} flagged");
                }
            }
        }
        assert_eq!(plain_prefix(b"0123456789abcdef01234\"x"), 16);
    }

    #[test]
    fn words_are_flagged_exactly_when_a_byte_needs_an_escape() {
        // Bytes around every boundary, mixed into words by a fixed LCG: borrows and carries
        // between lanes must never hide a byte that needs an escape.
        const EDGES: &[u8] = b"\x00\x01\x1e\x1f !\"#[\\]}~\x7f\x80\x81\x9f\xa0\xdf\xe0\xfe\xffa0";
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            let mut word = [0u8; 8];
            for b in &mut word {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                *b = EDGES[(state >> 33) as usize % EDGES.len()];
            }
            let bad = |b: u8| !(b' '..=b'~').contains(&b) || b == b'"' || b == b'\\';
            let w = u64::from_le_bytes(word);
            assert_eq!(may_need_escape(w), word.iter().any(|&b| bad(b)), "{word:?}");
            let first = word.iter().position(|&b| bad(b)).map_or(64, |i| 8 * i as u32 + 7);
            assert_eq!(escape_lanes(w).trailing_zeros(), first, "{word:?}");
        }
    }

    #[test]
    fn strings_are_written_as_python_writes_them() {
        let mut out = Vec::new();
        write_str(&mut out, "0123456789abcdef\"\\\n\u{7f}\u{e9}\u{1F600}\u{F0001}");
        assert_eq!(out, br#""0123456789abcdef\"\\\n\u007f\u00e9\ud83d\ude00\ud801""#);
    }
}
