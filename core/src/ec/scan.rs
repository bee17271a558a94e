//! Reading frames laid out exactly as Python's `json.dumps` writes them.
//!
//! Both peers of the EC channel write every request, reply and event with `json.dumps`
//! defaults: `", "` and `": "` separators, keys in a fixed order, ids that are plain ASCII.
//! A [`Scan`] reads that one layout byte by byte and gives up (`None`) on the first byte
//! that departs from it, so that a caller can hand the frame to the general `serde_json`
//! path, which then decides everything, errors included. What a scan accepts is JSON made
//! of printable ASCII without escapes, floats, negative numbers, leading zeros or repeated
//! keys: its general parse is the very same value, so the shortcut cannot change behaviour.

use super::dumps::escape_lanes;
use serde_json::{Map, Number, Value};

/// Deepest nesting [`value`] reads; deeper frames take the general path.
const MAX_DEPTH: usize = 32;
/// Most digits of a number a scan reads: every 19-digit integer fits a `u64`.
const MAX_DIGITS: usize = 19;

/// A cursor over one frame.
#[derive(Clone, Debug)]
pub struct Scan<'a> {
    /// The frame as text; empty (so every read fails) if it is not UTF-8.
    text: &'a str,
    b: &'a [u8],
    pos: usize,
}

impl<'a> Scan<'a> {
    /// A scan from the first byte of `frame`. The frame is checked to be UTF-8 once,
    /// here; a frame that is not reads as empty and is left to the general path.
    pub fn new(frame: &'a [u8]) -> Self {
        let text = std::str::from_utf8(frame).unwrap_or("");
        Scan { text, b: text.as_bytes(), pos: 0 }
    }

    /// Exactly the bytes `s`.
    #[inline]
    pub fn lit(&mut self, s: &[u8]) -> Option<()> {
        let end = self.pos + s.len();
        if self.b.get(self.pos..end)? == s {
            self.pos = end;
            Some(())
        } else {
            None
        }
    }

    /// The bytes `s` if they come next.
    #[inline]
    pub fn eat(&mut self, s: &[u8]) -> bool {
        self.lit(s).is_some()
    }

    /// The next byte, not consumed.
    #[inline]
    pub fn peek(&self) -> Option<u8> {
        self.b.get(self.pos).copied()
    }

    /// The whole frame was read.
    #[inline]
    pub fn end(&self) -> Option<()> {
        (self.pos == self.b.len()).then_some(())
    }

    /// A string of printable ASCII other than `"` and `\` (what `json.dumps` writes
    /// without an escape), quotes included.
    #[inline]
    pub fn str(&mut self) -> Option<&'a str> {
        self.lit(b"\"")?;
        let start = self.pos;
        let rest = &self.b[start..];
        let mut n = 0;
        // A word at a time: the first flagged byte must be the closing quote.
        while let Some(chunk) = rest.get(n..n + 8) {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            let flagged = escape_lanes(u64::from_le_bytes(word));
            if flagged != 0 {
                n += (flagged.trailing_zeros() / 8) as usize;
                break;
            }
            n += 8;
        }
        loop {
            let c = *rest.get(n)?;
            if c == b'"' {
                break;
            }
            if !(b' '..=b'~').contains(&c) || c == b'\\' {
                return None;
            }
            n += 1;
        }
        self.pos = start + n + 1;
        self.text.get(start..start + n)
    }

    /// A non-negative integer of at most [`MAX_DIGITS`] digits without a leading zero,
    /// not followed by a fraction or exponent.
    #[inline]
    pub fn uint(&mut self) -> Option<u64> {
        let rest = &self.b[self.pos..];
        let mut value: u64 = 0;
        let mut n = 0;
        while let Some(&c) = rest.get(n) {
            if !c.is_ascii_digit() {
                break;
            }
            if n == MAX_DIGITS || (n == 1 && value == 0) {
                return None;
            }
            value = value * 10 + u64::from(c - b'0');
            n += 1;
        }
        if n == 0 || matches!(rest.get(n), Some(b'.' | b'e' | b'E')) {
            return None;
        }
        self.pos += n;
        Some(value)
    }

    /// `true` or `false`.
    #[inline]
    pub fn bool(&mut self) -> Option<bool> {
        if self.eat(b"true") {
            Some(true)
        } else if self.eat(b"false") {
            Some(false)
        } else {
            None
        }
    }

    /// `[` items `]` with `", "` between them, each read by `item`.
    #[inline]
    pub fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        self.lit(b"[")?;
        let mut out = Vec::new();
        if self.eat(b"]") {
            return Some(out);
        }
        loop {
            out.push(item(self)?);
            if !self.eat(b", ") {
                self.lit(b"]")?;
                return Some(out);
            }
        }
    }

    /// A JSON value in the `json.dumps` layout, nested `depth` levels deep.
    pub fn value(&mut self, depth: usize) -> Option<Value> {
        if depth > MAX_DEPTH {
            return None;
        }
        Some(match self.peek()? {
            b'{' => {
                self.pos += 1;
                let mut entries = Vec::new();
                if !self.eat(b"}") {
                    loop {
                        let key = self.str()?;
                        self.lit(b": ")?;
                        entries.push((key.to_owned(), self.value(depth + 1)?));
                        if !self.eat(b", ") {
                            self.lit(b"}")?;
                            break;
                        }
                    }
                }
                // One sorted build instead of an insert per key.
                let n = entries.len();
                let map: Map<String, Value> = entries.into_iter().collect();
                // `json.loads` keeps the last of repeated keys; leave that to it.
                if map.len() != n {
                    return None;
                }
                Value::Object(map)
            }
            b'[' => Value::Array(self.list(|s| s.value(depth + 1))?),
            b'"' => Value::String(self.str()?.to_owned()),
            b'0'..=b'9' => Value::Number(Number::from(self.uint()?)),
            b't' | b'f' => Value::Bool(self.bool()?),
            b'n' => {
                self.lit(b"null")?;
                Value::Null
            }
            _ => return None,
        })
    }
}

/// The value of a whole frame in the `json.dumps` layout, or `None` to take the general
/// path (which then parses the frame to the same value or refuses it).
pub fn value(frame: &[u8]) -> Option<Value> {
    let mut s = Scan::new(frame);
    let v = s.value(0)?;
    s.end()?;
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_json_dumps_layout() {
        let frame = br#"{"ok": true, "result": {"ports": [19019, 0], "e": [], "o": {}, "n": null, "s": "a b"}}"#;
        let general: Value = serde_json::from_slice(frame).unwrap();
        assert_eq!(value(frame), Some(general));
    }

    #[test]
    fn departures_from_the_layout_are_left_to_the_general_path() {
        for frame in [
            &br#"{"a":1}"#[..],
            br#"{"a": 1} "#,
            br#"{"a": 01}"#,
            br#"{"a": 1.0}"#,
            br#"{"a": 1e3}"#,
            br#"{"a": -1}"#,
            br#"{"a": "\n"}"#,
            br#"{"a": "\u00e9"}"#,
            "{\"a\": \"\u{e9}\"}".as_bytes(),
            br#"{"a": 1, "a": 2}"#,
            br#"{"a": 12345678901234567890}"#,
            br#"[1, 2"#,
            b"",
        ] {
            assert_eq!(value(frame), None, "{}", String::from_utf8_lossy(frame));
        }
        assert!(value(&[b'['; 40]).is_none());
    }
}
