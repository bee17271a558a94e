//! Python's view of JSON values.
//!
//! The reference peers are Python: they write frames with `json.dumps` defaults and coerce
//! fields with `str()`, `bool()` and `int()`, and their error replies are `str(exc)` of the
//! exception those coercions raise. This module reproduces exactly that much of Python so
//! that ctlplane answers a malformed request with the text a Python peer would.

use serde::Serialize;
use serde_json::ser::Formatter;
use serde_json::Value;
use std::io;

/// Serialises `value` the way Python's `json.dumps(value)` does with default arguments:
/// `", "` and `": "` separators and `ensure_ascii` escapes.
///
/// Written by the one-pass writer of [`super::dumps`]; a value it leaves alone (floats,
/// unusual map keys) is written by [`dumps_general`], which gives the same bytes.
pub fn dumps<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    match super::dumps::write(&mut out, value) {
        Ok(()) => out,
        Err(_) => dumps_general(value),
    }
}

/// [`dumps`] through `serde_json` and [`PythonFormatter`] alone.
pub fn dumps_general<T: Serialize + ?Sized>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(128);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonFormatter);
    // Serialising owned, string-keyed data into a Vec cannot fail.
    if value.serialize(&mut ser).is_err() {
        out.clear();
        out.extend_from_slice(b"null");
    }
    out
}

/// `serde_json` formatter producing Python `json.dumps` default output.
#[derive(Clone, Copy, Debug, Default)]
pub struct PythonFormatter;

impl Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }

    /// `ensure_ascii=True`: everything outside printable ASCII becomes `\uXXXX`
    /// (UTF-16 surrogate pairs above the BMP), as Python's encoder writes it.
    fn write_string_fragment<W: ?Sized + io::Write>(&mut self, w: &mut W, fragment: &str) -> io::Result<()> {
        if fragment.bytes().all(|b| (b' '..=b'~').contains(&b)) {
            return w.write_all(fragment.as_bytes());
        }
        let mut start = 0;
        for (i, c) in fragment.char_indices() {
            if (' '..='~').contains(&c) {
                continue;
            }
            w.write_all(&fragment.as_bytes()[start..i])?;
            if let Some(surrogate) = carried_surrogate(c) {
                write!(w, "\\u{:04x}", surrogate)?;
            } else {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(w, "\\u{:04x}", unit)?;
                }
            }
            start = i + c.len_utf8();
        }
        w.write_all(&fragment.as_bytes()[start..])
    }
}

/// First code point of the private-use block that carries lone UTF-16 surrogates.
///
/// Python strings may hold lone surrogates (`json.loads('"\\ud800"')` succeeds); Rust
/// strings may not. [`carry_lone_surrogates`] maps each lone surrogate `U+D800+n` of a
/// frame to `U+F0000+n`, and the writers of this module map it back, so such an id
/// round-trips exactly. A genuine `U+F0000..U+F07FF` character would be read as a
/// surrogate on the way out: that corner of plane 15 is given up for exact round trips.
const SURROGATE_CARRIER: u32 = 0xF0000;

/// The lone surrogate a carrier character stands for.
pub fn carried_surrogate(c: char) -> Option<u32> {
    let c = c as u32;
    (SURROGATE_CARRIER..SURROGATE_CARRIER + 0x800).contains(&c).then(|| c - SURROGATE_CARRIER + 0xD800)
}

/// Rewrites every lone `\uD800`-`\uDFFF` escape of a JSON text as its carrier character;
/// `None` if there is none (then the text failed for another reason).
pub fn carry_lone_surrogates(text: &str) -> Option<String> {
    let b = text.as_bytes();
    let hex4 = |at: usize| -> Option<u32> {
        let h = b.get(at..at + 4)?;
        u32::from_str_radix(std::str::from_utf8(h).ok()?, 16).ok()
    };
    let escape_at = |at: usize| -> Option<u32> {
        if b.get(at) == Some(&b'\\') && b.get(at + 1) == Some(&b'u') {
            hex4(at + 2)
        } else {
            None
        }
    };
    let mut out = String::with_capacity(text.len());
    let mut changed = false;
    let mut copied = 0;
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        match escape_at(i) {
            Some(hi @ 0xD800..=0xDBFF) if matches!(escape_at(i + 6), Some(0xDC00..=0xDFFF)) => {
                let _ = hi;
                i += 12;
            }
            Some(unit @ 0xD800..=0xDFFF) => {
                out.push_str(&text[copied..i]);
                out.push(char::from_u32(SURROGATE_CARRIER + unit - 0xD800)?);
                changed = true;
                i += 6;
                copied = i;
            }
            // Any other escape is two characters long (`\uXXXX` is skipped whole).
            Some(_) => i += 6,
            None => i += 2,
        }
    }
    out.push_str(&text[copied..]);
    changed.then_some(out)
}

/// Whether a JSON number literal is an integer (Python `int`) rather than a float
/// (`NaN`, `Infinity` and `-Infinity`, which `json.loads` reads as floats, included).
pub fn is_int_literal(n: &serde_json::Number) -> bool {
    n.is_i64() || n.is_u64() || n.to_string().trim_start_matches('-').bytes().all(|b| b.is_ascii_digit())
}

/// Python's float value of a number literal (`NaN` and the infinities included).
fn float_of(n: &serde_json::Number) -> f64 {
    n.to_string().parse().unwrap_or(f64::NAN)
}

/// Most decimal digits Python converts between `int` and `str`
/// (`sys.get_int_max_str_digits()` by default): `json.loads` of a longer integer literal
/// fails, and so does `int()` of a longer string.
pub const INT_MAX_STR_DIGITS: usize = 4300;

/// Python's `iter(v)` of a decoded JSON value: a list's items, a string's characters, a
/// dict's keys (each a `str`); anything else is not iterable (the error is its type name).
pub fn iterate(v: &Value) -> Result<Vec<std::borrow::Cow<'_, Value>>, &'static str> {
    use std::borrow::Cow;
    match v {
        Value::Array(items) => Ok(items.iter().map(Cow::Borrowed).collect()),
        Value::String(s) => Ok(s.chars().map(|c| Cow::Owned(Value::String(c.to_string()))).collect()),
        Value::Object(map) => Ok(map.keys().map(|k| Cow::Owned(Value::String(k.clone()))).collect()),
        other => Err(type_name(other)),
    }
}

/// How many items [`iterate`] would give, without building them.
pub fn iter_len(v: &Value) -> Option<usize> {
    match v {
        Value::Array(items) => Some(items.len()),
        Value::String(s) => Some(s.chars().count()),
        Value::Object(map) => Some(map.len()),
        _ => None,
    }
}

/// Where [`mark_constants`] put the placeholders of Python's `NaN`, `Infinity` and
/// `-Infinity` constants: three number literals the original text does not contain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstantMarks {
    nan: String,
    inf: String,
    neg_inf: String,
}

impl ConstantMarks {
    /// Turns every placeholder of `value` back into the constant it stands for, kept as
    /// a number whose text is the constant's name ([`is_int_literal`] is false for it,
    /// and its float value is the constant).
    pub fn restore(&self, value: &mut Value) {
        match value {
            Value::Number(n) => {
                let text = n.to_string();
                let name = if text == self.nan {
                    "NaN"
                } else if text == self.inf {
                    "Infinity"
                } else if text == self.neg_inf {
                    "-Infinity"
                } else {
                    return;
                };
                *n = serde_json::Number::from_string_unchecked(name.to_owned());
            }
            Value::Array(items) => items.iter_mut().for_each(|v| self.restore(v)),
            Value::Object(map) => map.values_mut().for_each(|v| self.restore(v)),
            _ => {}
        }
    }
}

/// Replaces the `NaN`, `Infinity` and `-Infinity` tokens outside strings (which
/// `json.loads` reads as floats) with number literals found nowhere else in `text`;
/// `None` if there is none.
pub fn mark_constants(text: &str) -> Option<(String, ConstantMarks)> {
    let mut nines = String::from("9");
    while text.contains(&nines) {
        nines.push('9');
    }
    let marks =
        ConstantMarks { nan: format!("0e-{nines}1"), inf: format!("0e-{nines}2"), neg_inf: format!("0e-{nines}3") };
    let b = text.as_bytes();
    let (mut out, mut copied, mut i, mut in_str, mut changed) = (String::new(), 0, 0, false, false);
    while i < b.len() {
        if in_str {
            match b[i] {
                b'\\' => i += 1,
                b'"' => in_str = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        let token = [("-Infinity", &marks.neg_inf), ("Infinity", &marks.inf), ("NaN", &marks.nan)]
            .into_iter()
            .find(|(name, _)| b[i..].starts_with(name.as_bytes()));
        match token {
            Some((name, mark)) => {
                out.push_str(&text[copied..i]);
                out.push_str(mark);
                i += name.len();
                copied = i;
                changed = true;
            }
            None => {
                in_str = b[i] == b'"';
                i += 1;
            }
        }
    }
    out.push_str(&text[copied..]);
    changed.then_some((out, marks))
}

/// Whether `value` holds an integer literal Python will not convert (more than
/// [`INT_MAX_STR_DIGITS`] digits).
pub fn has_overlong_int(value: &Value) -> bool {
    match value {
        Value::Number(n) => {
            !(n.is_i64() || n.is_u64())
                && is_int_literal(n)
                && n.to_string().trim_start_matches('-').len() > INT_MAX_STR_DIGITS
        }
        Value::Array(items) => items.iter().any(has_overlong_int),
        Value::Object(map) => map.values().any(has_overlong_int),
        _ => false,
    }
}

/// Python's type name of a decoded JSON value (`type(v).__name__`).
pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "NoneType",
        Value::Bool(_) => "bool",
        Value::Number(n) if !is_int_literal(n) => "float",
        Value::Number(_) => "int",
        Value::String(_) => "str",
        Value::Array(_) => "list",
        Value::Object(_) => "dict",
    }
}

/// Python's `bool(v)`: empty, zero and null are false, everything else (even `"false"`) true.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) if is_int_literal(n) => n.to_string().bytes().any(|d| (b'1'..=b'9').contains(&d)),
        Value::Number(n) => float_of(n) != 0.0,
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

/// Python's `str(v)`: strings as they are, everything else as its `repr`.
pub fn to_str(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => repr(other),
    }
}

/// Python's `repr(v)` of a decoded JSON value.
pub fn repr(v: &Value) -> String {
    let mut out = String::new();
    write_repr(&mut out, v);
    out
}

fn write_repr(out: &mut String, v: &Value) {
    match v {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) if is_int_literal(n) => {
            // Arbitrary precision keeps every digit, as Python's int does.
            let digits = n.to_string();
            if digits.trim_start_matches('-').bytes().all(|d| d == b'0') {
                out.push('0');
            } else {
                out.push_str(&digits);
            }
        }
        Value::Number(n) => out.push_str(&float_repr(float_of(n))),
        Value::String(s) => out.push_str(&str_repr(s)),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                out.push_str(&str_repr(k));
                out.push_str(": ");
                write_repr(out, item);
            }
            out.push('}');
        }
    }
}

/// Python's `repr(float)`: shortest round-trip digits, `.0` on integral values,
/// exponent form outside `[1e-4, 1e16)` with a signed two-digit exponent.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf".into() } else { "-inf".into() };
    }
    let abs = f.abs();
    if abs == 0.0 || (1e-4..1e16).contains(&abs) {
        let s = format!("{f:?}");
        return s;
    }
    let s = format!("{f:e}");
    match s.split_once('e') {
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// Python's `repr(str)`: single quotes unless the text holds `'` and no `"`.
pub fn str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') { '"' } else { '\'' };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c => match carried_surrogate(c).unwrap_or(c as u32) {
                u if u < 0x100 && !is_printable(u) => out.push_str(&format!("\\x{u:02x}")),
                u if u < 0x10000 && !is_printable(u) => out.push_str(&format!("\\u{u:04x}")),
                u if !is_printable(u) => out.push_str(&format!("\\U{u:08x}")),
                _ => out.push(c),
            },
        }
    }
    out.push(quote);
    out
}

/// `str.isprintable()` for one code point, as `repr` uses it: control and format
/// characters, separators other than the ASCII space, surrogates and private-use code
/// points are escaped. (Unassigned code points, which Python also escapes, are shown.)
fn is_printable(u: u32) -> bool {
    const NOT_PRINTABLE: &[(u32, u32)] = &[
        (0x00, 0x1f),
        (0x7f, 0xa0),
        (0xad, 0xad),
        (0x600, 0x605),
        (0x61c, 0x61c),
        (0x6dd, 0x6dd),
        (0x70f, 0x70f),
        (0x1680, 0x1680),
        (0x180e, 0x180e),
        (0x2000, 0x200f),
        (0x2028, 0x202f),
        (0x205f, 0x2064),
        (0x2066, 0x206f),
        (0x3000, 0x3000),
        (0xd800, 0xf8ff),
        (0xfeff, 0xfeff),
        (0xfff9, 0xfffb),
        (0x110bd, 0x110bd),
        (0x1bca0, 0x1bca3),
        (0x1d173, 0x1d17a),
        (0xe0001, 0xe0001),
        (0xe0020, 0xe007f),
        (0xf0000, 0x10ffff),
    ];
    !NOT_PRINTABLE.iter().any(|&(lo, hi)| (lo..=hi).contains(&u))
}

/// Python's `int(v)` of a decoded JSON value, or the text of the exception it raises.
pub fn to_int(v: &Value) -> Result<i128, String> {
    match v {
        Value::Bool(b) => Ok(i128::from(*b)),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Ok(i128::from(i))
            } else if let Some(u) = n.as_u64() {
                Ok(i128::from(u))
            } else if is_int_literal(n) {
                // Beyond i128: saturate; every caller bounds sizes far below this.
                let digits = n.to_string();
                Ok(digits.parse::<i128>().unwrap_or(if digits.starts_with('-') { i128::MIN } else { i128::MAX }))
            } else {
                let f = float_of(n);
                if f.is_nan() {
                    Err("cannot convert float NaN to integer".into())
                } else if f.is_infinite() {
                    Err("cannot convert float infinity to integer".into())
                } else if f.abs() >= 1.7e38 {
                    Err(format!("integer {} is out of range", float_repr(f)))
                } else {
                    // `int()` truncates toward zero; the range check above keeps the cast exact.
                    Ok(f.trunc() as i128)
                }
            }
        }
        Value::String(s) => parse_int_literal(s),
        other => Err(format!(
            "int() argument must be a string, a bytes-like object or a real number, not '{}'",
            type_name(other)
        )),
    }
}

/// `int("…")` in base 10: surrounding whitespace, an optional sign, decimal digits of
/// any script (`int("٥٣٠")` is 530) with single underscores between them, at most
/// [`INT_MAX_STR_DIGITS`] of them.
fn parse_int_literal(s: &str) -> Result<i128, String> {
    let invalid = || format!("invalid literal for int() with base 10: {}", str_repr(s));
    let t = s.trim_matches(is_py_space);
    let (neg, digits) = match t.chars().next() {
        Some('-') => (true, &t[1..]),
        Some('+') => (false, &t[1..]),
        Some(_) => (false, t),
        None => return Err(invalid()),
    };
    if digits.is_empty() || digits.starts_with('_') || digits.ends_with('_') || digits.contains("__") {
        return Err(invalid());
    }
    let mut value: Option<i128> = Some(0);
    let mut count = 0usize;
    for c in digits.chars() {
        if c == '_' {
            continue;
        }
        let d = decimal_value(c).ok_or_else(invalid)?;
        count += 1;
        value = value.and_then(|v| v.checked_mul(10)?.checked_add(i128::from(d)));
    }
    if count > INT_MAX_STR_DIGITS {
        return Err(format!(
            "Exceeds the limit ({INT_MAX_STR_DIGITS} digits) for integer string conversion: value has {count} \
             digits; use sys.set_int_max_str_digits() to increase the limit"
        ));
    }
    // Beyond i128: saturate; every caller bounds sizes far below this.
    let value = value.unwrap_or(i128::MAX);
    Ok(if neg { -value } else { value })
}

/// `str.isspace()`, which `int()` strips.
fn is_py_space(c: char) -> bool {
    matches!(c, '\t'..='\r' | '\x1c'..='\x1f' | ' ' | '\u{85}' | '\u{a0}' | '\u{1680}' | '\u{2000}'..='\u{200a}')
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}')
}

/// First code point of every run of ten decimal digits (Unicode category Nd, the
/// Unicode 14 table of Python 3.11's `unicodedata`).
const DECIMAL_ZEROS: [u32; 66] = [
    0x30, 0x660, 0x6F0, 0x7C0, 0x966, 0x9E6, 0xA66, 0xAE6, 0xB66, 0xBE6, 0xC66, 0xCE6, 0xD66, 0xDE6, 0xE50, 0xED0,
    0xF20, 0x1040, 0x1090, 0x17E0, 0x1810, 0x1946, 0x19D0, 0x1A80, 0x1A90, 0x1B50, 0x1BB0, 0x1C40, 0x1C50, 0xA620,
    0xA8D0, 0xA900, 0xA9D0, 0xA9F0, 0xAA50, 0xABF0, 0xFF10, 0x104A0, 0x10D30, 0x11066, 0x110F0, 0x11136, 0x111D0,
    0x112F0, 0x11450, 0x114D0, 0x11650, 0x116C0, 0x11730, 0x118E0, 0x11950, 0x11C50, 0x11D50, 0x11DA0, 0x16A60,
    0x16AC0, 0x16B50, 0x1D7CE, 0x1D7D8, 0x1D7E2, 0x1D7EC, 0x1D7F6, 0x1E140, 0x1E2F0, 0x1E950, 0x1FBF0,
];

/// `unicodedata.decimal(c)`: the digit value of a decimal digit of any script.
fn decimal_value(c: char) -> Option<u8> {
    let u = c as u32;
    let i = DECIMAL_ZEROS.partition_point(|&z| z <= u).checked_sub(1)?;
    let d = u - DECIMAL_ZEROS[i];
    (d < 10).then_some(d as u8)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn dumps_matches_python_defaults() {
        let v = json!({"ok": true, "result": {"ports": [19019, 19020], "e": "é😀\u{7f}\n"}});
        assert_eq!(
            String::from_utf8(dumps(&v)).unwrap(),
            r#"{"ok": true, "result": {"ports": [19019, 19020], "e": "\u00e9\ud83d\ude00\u007f\n"}}"#
        );
        assert_eq!(dumps(&json!({})), b"{}");
        assert_eq!(dumps(&json!([])), b"[]");
    }

    #[test]
    fn coercions_follow_python() {
        assert_eq!(to_str(&json!(5)), "5");
        assert_eq!(to_str(&json!(null)), "None");
        assert_eq!(to_str(&json!(true)), "True");
        assert_eq!(to_str(&json!(1.5)), "1.5");
        assert_eq!(to_str(&json!(["a", 1])), "['a', 1]");
        assert_eq!(to_str(&json!({"k": "it's"})), "{'k': \"it's\"}");
        // Dicts keep the frame's key order, as Python's do.
        let v: Value = serde_json::from_str(r#"{"b": 1, "a": 2, "b": 3}"#).unwrap();
        assert_eq!(to_str(&v), "{'b': 3, 'a': 2}");
        assert!(truthy(&json!("false")));
        assert!(!truthy(&json!(0)));
        assert!(!truthy(&json!(0.0)));
        assert!(!truthy(&json!([])));
        assert_eq!(to_int(&json!(16)), Ok(16));
        assert_eq!(to_int(&json!(16.0)), Ok(16));
        assert_eq!(to_int(&json!(16.9)), Ok(16));
        assert_eq!(to_int(&json!("16")), Ok(16));
        assert_eq!(to_int(&json!(" -1_6 ")), Ok(-16));
        assert_eq!(to_int(&json!(true)), Ok(1));
        assert_eq!(to_int(&json!("٥٣٠")), Ok(530));
        assert_eq!(to_int(&json!("\u{3000}-1\u{0665}\x1f")), Ok(-15));
        assert!(to_int(&json!("1".repeat(4301))).unwrap_err().starts_with("Exceeds the limit (4300 digits)"));
        assert_eq!(to_int(&json!("1".repeat(4300))), Ok(i128::MAX));
        assert_eq!(to_int(&json!("½")), Err("invalid literal for int() with base 10: '½'".into()));
        assert_eq!(to_int(&json!("16.0")), Err("invalid literal for int() with base 10: '16.0'".into()));
        assert_eq!(
            to_int(&json!(null)),
            Err("int() argument must be a string, a bytes-like object or a real number, not 'NoneType'".into())
        );
    }

    #[test]
    fn float_repr_uses_python_exponent_form() {
        assert_eq!(float_repr(16.0), "16.0");
        assert_eq!(float_repr(1e20), "1e+20");
        assert_eq!(float_repr(1.5e-7), "1.5e-07");
        assert_eq!(float_repr(0.5), "0.5");
    }
}
