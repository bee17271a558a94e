//! JSON <-> P2P msgpack values for `ctlplane p2p`: JSON has no `bin`, so bytes are written
//! as `{"$bin": "hex"}` (or named with `--bin-field`), and integers keep every digit.

use ctlplane_core::p2p::Value;
use std::fmt::Write;

/// Why a JSON message could not become a P2P value.
#[derive(Debug, thiserror::Error)]
pub enum JsonError {
    #[error("invalid JSON: {0}")]
    Syntax(#[from] serde_json::Error),
    #[error("integer {0} is outside msgpack's range (-2^63 ..= 2^64-1)")]
    IntRange(String),
    #[error("invalid hex in a bin value: {0:?}")]
    Hex(String),
    #[error("--bin-field {0}: the message has no such field")]
    NoField(String),
    #[error("--bin-field {0}: the field is not a hex string or a list of them")]
    NotHex(String),
    #[error("--bin-field needs a JSON object message")]
    NotAnObject,
}

/// Parses `text` into a value; `bin_fields` name top-level fields whose hex string (or
/// list of hex strings) become `bin`. Object keys come out sorted (JSON objects carry no
/// order a Python dict could tell apart).
pub fn parse(text: &str, bin_fields: &[String]) -> Result<Value, JsonError> {
    let json: serde_json::Value = serde_json::from_str(text)?;
    let mut value = from_json(&json)?;
    for name in bin_fields {
        let Value::Map(entries) = &mut value else { return Err(JsonError::NotAnObject) };
        let (_, field) = entries.iter_mut().find(|(k, _)| k == name).ok_or_else(|| JsonError::NoField(name.clone()))?;
        *field = match field {
            Value::Str(s) => Value::Bin(hex(s)?),
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| match item {
                        Value::Str(s) => hex(s).map(Value::Bin),
                        Value::Bin(b) => Ok(Value::Bin(b.clone())),
                        _ => Err(JsonError::NotHex(name.clone())),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            Value::Bin(b) => Value::Bin(std::mem::take(b)),
            _ => return Err(JsonError::NotHex(name.clone())),
        };
    }
    Ok(value)
}

fn from_json(json: &serde_json::Value) -> Result<Value, JsonError> {
    use serde_json::Value as J;
    Ok(match json {
        J::Null => Value::Nil,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => {
            // serde_json keeps the literal (arbitrary_precision): integers of any width.
            let text = n.to_string();
            if text.contains(['.', 'e', 'E']) {
                Value::Float(n.as_f64().ok_or_else(|| JsonError::IntRange(text.clone()))?)
            } else {
                let i: i128 = text.parse().map_err(|_| JsonError::IntRange(text.clone()))?;
                if i < i128::from(i64::MIN) || i > i128::from(u64::MAX) {
                    return Err(JsonError::IntRange(text));
                }
                Value::Int(i)
            }
        }
        J::String(s) => Value::Str(s.clone()),
        J::Array(items) => Value::Array(items.iter().map(from_json).collect::<Result<_, _>>()?),
        J::Object(map) => match (map.len(), map.get("$bin")) {
            (1, Some(J::String(h))) => Value::Bin(hex(h)?),
            _ => Value::Map(
                map.iter().map(|(k, v)| Ok::<_, JsonError>((k.clone(), from_json(v)?))).collect::<Result<_, _>>()?,
            ),
        },
    })
}

fn hex(s: &str) -> Result<Vec<u8>, JsonError> {
    let digit = |c: u8| (c as char).to_digit(16).ok_or_else(|| JsonError::Hex(s.to_string()));
    if s.len() % 2 != 0 {
        return Err(JsonError::Hex(s.to_string()));
    }
    s.as_bytes().chunks(2).map(|pair| Ok((digit(pair[0])? * 16 + digit(pair[1])?) as u8)).collect()
}

/// Exact JSON of `v`, map entries in wire order, `bin` as `{"$bin": "hex"}`, non-finite
/// floats as `null`.
pub fn render(v: &Value) -> String {
    let mut out = String::new();
    write_json(&mut out, v);
    out
}

fn write_json(out: &mut String, v: &Value) {
    match v {
        Value::Nil => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Int(i) => {
            let _ = write!(out, "{i}");
        }
        Value::Float(x) if x.is_finite() => {
            let _ = write!(out, "{x:?}");
        }
        Value::Float(_) => out.push_str("null"),
        Value::Str(s) => write_str(out, s),
        Value::Bin(b) => {
            out.push_str("{\"$bin\": \"");
            for byte in b {
                let _ = write!(out, "{byte:02x}");
            }
            out.push_str("\"}");
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json(out, item);
            }
            out.push(']');
        }
        Value::Map(entries) => {
            out.push('{');
            for (i, (k, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_str(out, k);
                out.push_str(": ");
                write_json(out, item);
            }
            out.push('}');
        }
    }
}

fn write_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_keep_every_digit_and_bins_come_from_hex() {
        let v = parse(
            r#"{"big": 18446744073709551615, "neg": -9223372036854775808, "k": "00ff", "s": "00ff"}"#,
            &["k".to_string()],
        )
        .unwrap();
        assert_eq!(v.get("big"), Some(&Value::Int(i128::from(u64::MAX))));
        assert_eq!(v.get("neg"), Some(&Value::Int(i128::from(i64::MIN))));
        assert_eq!(v.get("k"), Some(&Value::Bin(vec![0, 0xff])));
        assert_eq!(v.get("s"), Some(&Value::Str("00ff".into())));
        assert!(matches!(parse("18446744073709551616", &[]), Err(JsonError::IntRange(_))));
        assert!(matches!(parse(r#"{"k": "0g"}"#, &["k".to_string()]), Err(JsonError::Hex(_))));
        assert!(matches!(parse(r#"{"k": 1}"#, &["x".to_string()]), Err(JsonError::NoField(_))));
    }

    #[test]
    fn rendering_is_exact_json_that_parses_back() {
        let v = Value::map([
            ("type", Value::from("fetch")),
            ("keys", Value::Array(vec![Value::Bin(vec![1, 0xab]), Value::Str("q\"\u{1}".into())])),
            ("n", Value::Int(-5)),
            ("f", Value::Float(1.5)),
            ("z", Value::Nil),
        ]);
        let text = render(&v);
        assert_eq!(text, r#"{"type": "fetch", "keys": [{"$bin": "01ab"}, "q\"\u0001"], "n": -5, "f": 1.5, "z": null}"#);
        let back = parse(&text, &[]).unwrap();
        assert_eq!(back.get("keys"), v.get("keys"));
    }
}
