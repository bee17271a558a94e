//! P2P msgpack decoding: any ROUTER payload decodes to a value or a typed error, and the
//! registry's allocation-free check (`value::validate`) gives the same verdict. A
//! decoded value re-encodes canonically (encode . decode is idempotent) and reads as a
//! W1 message or a typed validation error.

#![no_main]

use ctlplane_core::p2p::messages::{Message, Parsed};
use ctlplane_core::p2p::value;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|frame: &[u8]| {
    let decoded = value::decode(frame);
    assert_eq!(value::validate(frame), decoded.as_ref().map(|_| ()).map_err(Clone::clone), "validate disagrees");
    let Ok(v) = decoded else { return };
    let canonical = value::encode(&v);
    let again = match value::decode(&canonical) {
        Ok(again) => again,
        Err(e) => panic!("re-encoded value does not decode ({e}): {canonical:02x?}"),
    };
    assert_eq!(value::encode(&again), canonical, "encoding is not canonical");
    // Only float32 widens (to float64, 5 to 9 bytes): a frame never re-encodes to more
    // than twice its size.
    assert!(canonical.len() <= 2 * frame.len(), "{} bytes re-encode to {}", frame.len(), canonical.len());
    let _ = v.to_string();
    if let Ok(Parsed::Message(msg)) = Message::parse(&v) {
        // A valid message written back reads as the same message.
        match Message::parse(&msg.to_value()) {
            Ok(Parsed::Message(back)) => assert_eq!(back, msg),
            other => panic!("{msg:?} written back reads as {other:?}"),
        }
    }
});
