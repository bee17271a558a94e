//! Checks shared by the fuzz targets.

use serde_json::Value;

/// `reply` is one reference envelope as `json.dumps` writes it: ASCII JSON, an object
/// with exactly `{"ok": true, "result": ...}` or `{"ok": false, "error": "<text>"}`.
pub fn envelope(reply: &[u8]) {
    assert!(reply.is_ascii(), "reply is not ASCII: {:?}", String::from_utf8_lossy(reply));
    let value: Value = match serde_json::from_slice(reply) {
        Ok(v) => v,
        Err(e) => panic!("reply is not JSON ({e}): {:?}", String::from_utf8_lossy(reply)),
    };
    let Value::Object(obj) = value else { panic!("reply is not an object: {value}") };
    let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
    match obj.get("ok") {
        Some(Value::Bool(true)) => assert_eq!(keys.len(), 2, "ok reply has keys {keys:?}"),
        Some(Value::Bool(false)) => {
            assert_eq!(keys.len(), 2, "error reply has keys {keys:?}");
            assert!(obj.get("error").is_some_and(Value::is_string), "error reply without error text: {obj:?}");
        }
        other => panic!("reply's ok is {other:?}"),
    }
    assert!(obj.contains_key("result") || obj.contains_key("error"), "reply keys {keys:?}");
}
