//! A reply's `result` as JSON text, for callers that build their own value from it (the
//! Python bindings hand the text to `json.loads`, exactly as the reference's `recv_json`
//! reads the whole reply).

use super::wire::{self, WireError};
use std::borrow::Cow;

const OK_PREFIX: &[u8] = b"{\"ok\": true, \"result\": ";

/// `Ok(result text)` or `Err(the server's error text)`, with the rules of
/// [`wire::decode_reply`]. A success in the server's own layout is sliced out without
/// parsing (the client parses it next); any other reply is read whole and its result
/// written back as `json.dumps` would.
pub fn result_text(frame: &[u8]) -> Result<Result<Cow<'_, [u8]>, String>, WireError> {
    if let Some(inner) = frame.strip_prefix(OK_PREFIX).and_then(|rest| rest.strip_suffix(b"}")) {
        // The slice must be one value, not the first of further envelope keys (as in
        // `{"ok": true, "result": {}, "x": 2}`). Only the structure is checked: the
        // caller parses the text next, and a text that does not parse is malformed there.
        if is_one_value(inner) {
            return Ok(Ok(Cow::Borrowed(inner)));
        }
    }
    Ok(wire::decode_reply(frame)?.map(|result| Cow::Owned(super::pyjson::dumps(&result))))
}

/// No `,` or `:` outside strings and brackets: `text` holds at most one top-level value.
/// Strings (most of a reply) are skipped to their closing quote in one search each.
fn is_one_value(text: &[u8]) -> bool {
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(&b) = text.get(i) {
        match b {
            b'"' => {
                i += 1;
                loop {
                    let Some(rest) = text.get(i..) else { return false };
                    let Some(at) = rest.iter().position(|&c| c == b'"' || c == b'\\') else { return false };
                    i += at;
                    if text[i] == b'"' {
                        break;
                    }
                    // An escape: skip the backslash and the byte it escapes.
                    i += 2;
                }
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            b',' | b':' if depth == 0 => return false,
            _ => {}
        }
        i += 1;
    }
    depth == 0 && !text.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(frame: &str) -> Result<String, String> {
        result_text(frame.as_bytes()).unwrap().map(|t| String::from_utf8(t.into_owned()).unwrap())
    }

    #[test]
    fn slices_the_servers_layout_and_reads_the_rest() {
        assert_eq!(text(r#"{"ok": true, "result": {"a": [1, 2]}}"#), Ok(r#"{"a": [1, 2]}"#.into()));
        assert_eq!(text(r#"{"ok": true, "result": null}"#), Ok("null".into()));
        assert_eq!(text(r#"{"result": 5, "ok": 1}"#), Ok("5".into()));
        assert_eq!(text(r#"{"ok": false, "error": "no"}"#), Err("no".into()));
        assert_eq!(text(r#"{"ok": true, "result": {"a": 1}, "x": {"y": 2}}"#), Ok(r#"{"a": 1}"#.into()));
        assert_eq!(text(r#"{"ok": true, "result": "a,}\\"}"#), Ok(r#""a,}\\""#.into()));
        assert_eq!(text(r#"{"ok": true, "result": 1, "x": "}"}"#), Ok("1".into()));
        assert_eq!(text(r#"{"ok": true, "result": "\\"}"#), Ok(r#""\\""#.into()));
        assert!(is_one_value(br#"{"a": "x\"y", "b": [1, 2]}"#));
        assert!(!is_one_value(br#""unterminated"#));
        assert!(!is_one_value(br#""ends in escape\"#));
        assert!(!is_one_value(b"1, 2"));
        assert!(result_text(b"[1]").is_err());
    }
}
