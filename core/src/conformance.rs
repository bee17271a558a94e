//! The conformance log: what a core machine was asked and what it answered, as `tracing`
//! events at [`TARGET`], so a test can check that two drivers (production over libzmq,
//! the simulator over its ZeroMQ model) make the same calls with the same inputs and get
//! the same outputs for the same socket events (`docs/architecture.md`, "Driver
//! conformance").
//!
//! Each event has the fields `machine`, `call` and `detail` (a canonical rendering of the
//! call's arguments and result). Times are rendered relative to the call's own `now`, and
//! a wire frame is rendered as what it decodes to, so the rendering holds what the
//! machine decides on and nothing a driver cannot control. With no subscriber interested
//! in [`TARGET`], `tracing` skips an event before its fields are rendered.

use std::fmt;

/// The `tracing` target of every conformance event.
pub const TARGET: &str = "ctlplane::conformance";

/// Records one call of a core machine at [`TARGET`] (level TRACE); the `detail` is only
/// formatted when a subscriber wants it.
macro_rules! record {
    ($machine:literal, $call:literal, $($fmt:tt)+) => {
        ::tracing::trace!(
            target: $crate::conformance::TARGET,
            machine = $machine,
            call = $call,
            detail = %format_args!($($fmt)+)
        )
    };
}
pub(crate) use record;

/// Bytes as escaped ASCII, for frames that are text on the wire.
pub(crate) struct Text<'a>(pub &'a [u8]);

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_ascii())
    }
}

/// A P2P frame as the msgpack value it decodes to, or its length if it does not decode.
pub(crate) struct Msgpack<'a>(pub &'a [u8]);

impl fmt::Display for Msgpack<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match crate::p2p::value::decode(self.0) {
            Ok(value) => write!(f, "{value:?}"),
            Err(_) => write!(f, "undecodable({} bytes)", self.0.len()),
        }
    }
}
