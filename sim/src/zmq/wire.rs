//! The model's wire format on a simulated TCP stream.
//!
//! Not ZMTP, but the same pieces: each side first sends a greeting carrying its socket
//! type and routing id, then frames. A frame is a flags byte ([`MORE`], [`COMMAND`]), a
//! big-endian `u32` body length and the body. Commands are heartbeat PING (with the
//! sender's TTL in deciseconds, as ZMTP 3.1) and PONG. Decoding never trusts the peer:
//! every malformed input is a [`WireError`], and a frame's body is buffered only as its
//! bytes arrive.

use super::{Multipart, SocketType};
use std::time::Duration;

/// Greeting magic.
pub const MAGIC: &[u8; 4] = b"ZSIM";
/// Greeting version byte.
pub const VERSION: u8 = 1;
/// Flags bit: more frames of this message follow.
pub const MORE: u8 = 0x01;
/// Flags bit: this frame is a command, not message data.
pub const COMMAND: u8 = 0x04;
/// Frame header length: flags + u32 length.
pub const HEADER: usize = 5;

const CMD_PING: u8 = 1;
const CMD_PONG: u8 = 2;

/// Why a peer's bytes were refused. Any of these drops the connection.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("bad greeting magic or version")]
    BadGreeting,
    #[error("unknown socket type {0} in greeting")]
    UnknownType(u8),
    #[error("frame of {len} bytes above MAXMSGSIZE {max}")]
    TooBig { len: usize, max: usize },
    #[error("unknown flags {0:#04x}")]
    BadFlags(u8),
    #[error("malformed command")]
    BadCommand,
}

/// What a peer said in its greeting.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Greeting {
    pub kind: SocketType,
    pub routing_id: Vec<u8>,
}

/// A greeting's bytes. A routing id longer than 255 bytes is cut, as libzmq refuses one.
pub fn encode_greeting(kind: SocketType, routing_id: &[u8]) -> Vec<u8> {
    let id = &routing_id[..routing_id.len().min(255)];
    let mut out = Vec::with_capacity(7 + id.len());
    out.extend_from_slice(MAGIC);
    out.push(VERSION);
    out.push(kind.code());
    out.push(id.len() as u8);
    out.extend_from_slice(id);
    out
}

/// A greeting off the front of `buf`: `Ok(None)` until all of it has arrived, else the
/// greeting and its length.
pub fn decode_greeting(buf: &[u8]) -> Result<Option<(Greeting, usize)>, WireError> {
    let magic_seen = buf.len().min(MAGIC.len());
    if buf[..magic_seen] != MAGIC[..magic_seen] {
        return Err(WireError::BadGreeting);
    }
    let [_, _, _, _, version, kind, id_len, ..] = *buf else { return Ok(None) };
    if version != VERSION {
        return Err(WireError::BadGreeting);
    }
    let kind = SocketType::from_code(kind).ok_or(WireError::UnknownType(kind))?;
    let end = 7 + usize::from(id_len);
    if buf.len() < end {
        return Ok(None);
    }
    Ok(Some((Greeting { kind, routing_id: buf[7..end].to_vec() }, end)))
}

/// A command frame's meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Heartbeat; the sender drops us after `ttl` without traffic (zero: never).
    Ping {
        ttl: Duration,
    },
    Pong,
}

/// One decoded frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Data { more: bool, body: Vec<u8> },
    Command(Command),
}

/// Appends one message, all its frames, to `out`. Written with one call, a message is
/// either on the stream whole or not at all.
pub fn encode_message(msg: &Multipart, out: &mut Vec<u8>) {
    for (i, frame) in msg.iter().enumerate() {
        let flags = if i + 1 < msg.len() { MORE } else { 0 };
        push_frame(out, flags, frame);
    }
}

/// The bytes of a command frame.
pub fn encode_command(cmd: Command) -> Vec<u8> {
    let body = match cmd {
        Command::Ping { ttl } => {
            let ds = u16::try_from(ttl.as_millis() / 100).unwrap_or(u16::MAX);
            let [hi, lo] = ds.to_be_bytes();
            vec![CMD_PING, hi, lo]
        }
        Command::Pong => vec![CMD_PONG],
    };
    let mut out = Vec::with_capacity(HEADER + body.len());
    push_frame(&mut out, COMMAND, &body);
    out
}

fn push_frame(out: &mut Vec<u8>, flags: u8, body: &[u8]) {
    out.push(flags);
    // A frame above 4 GiB cannot be built in the simulator's memory anyway.
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(body);
}

/// Incremental frame decoder over the bytes read so far.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    max: Option<usize>,
}

impl Decoder {
    /// A decoder refusing frames above `max` bytes (libzmq's MAXMSGSIZE, checked per frame).
    pub fn new(max: Option<usize>) -> Self {
        Decoder { buf: Vec::new(), max }
    }

    /// Bytes read off the stream.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The buffered bytes not yet decoded (the greeting is read from here).
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Drops the first `n` buffered bytes (after a greeting was decoded).
    pub fn consume(&mut self, n: usize) {
        self.buf.drain(..n.min(self.buf.len()));
    }

    /// The next complete frame, `Ok(None)` while it has not all arrived. An oversize
    /// length is refused as soon as the header is in, before its body is buffered.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, WireError> {
        let [flags, a, b, c, d, ..] = *self.buf else { return Ok(None) };
        if flags & !(MORE | COMMAND) != 0 {
            return Err(WireError::BadFlags(flags));
        }
        let len = u32::from_be_bytes([a, b, c, d]) as usize;
        if let Some(max) = self.max {
            if flags & COMMAND == 0 && len > max {
                return Err(WireError::TooBig { len, max });
            }
        }
        if flags & COMMAND != 0 && len > 64 {
            return Err(WireError::BadCommand);
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        let body: Vec<u8> = self.buf[HEADER..HEADER + len].to_vec();
        self.buf.drain(..HEADER + len);
        if flags & COMMAND == 0 {
            return Ok(Some(Frame::Data { more: flags & MORE != 0, body }));
        }
        let cmd = match body.as_slice() {
            [CMD_PING, hi, lo] => {
                Command::Ping { ttl: Duration::from_millis(u64::from(u16::from_be_bytes([*hi, *lo])) * 100) }
            }
            [CMD_PONG] => Command::Pong,
            _ => return Err(WireError::BadCommand),
        };
        Ok(Some(Frame::Command(cmd)))
    }
}

/// Gathers data frames into messages.
#[derive(Debug, Default)]
pub struct Assembler {
    parts: Multipart,
}

impl Assembler {
    /// Adds a data frame; returns the message when it was the last one.
    pub fn push(&mut self, more: bool, body: Vec<u8>) -> Option<Multipart> {
        self.parts.push(body);
        if more {
            None
        } else {
            Some(std::mem::take(&mut self.parts))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_round_trips_and_waits_for_all_bytes() {
        let g = encode_greeting(SocketType::Dealer, b"peer-1");
        for cut in 0..g.len() {
            assert_eq!(decode_greeting(&g[..cut]), Ok(None), "cut at {cut}");
        }
        let (greeting, n) = decode_greeting(&g).unwrap().unwrap();
        assert_eq!(n, g.len());
        assert_eq!(greeting, Greeting { kind: SocketType::Dealer, routing_id: b"peer-1".to_vec() });
        assert_eq!(decode_greeting(b"HTTP/1.1"), Err(WireError::BadGreeting));
        assert_eq!(decode_greeting(b"ZSIM\x01\x63\x00"), Err(WireError::UnknownType(0x63)));
    }

    #[test]
    fn frames_decode_as_they_arrive() {
        let mut bytes = Vec::new();
        encode_message(&vec![b"a".to_vec(), Vec::new(), b"xyz".to_vec()], &mut bytes);
        bytes.extend(encode_command(Command::Ping { ttl: Duration::from_secs(10) }));
        let mut dec = Decoder::new(None);
        let mut asm = Assembler::default();
        let mut messages = Vec::new();
        let mut commands = Vec::new();
        for b in bytes {
            dec.extend(&[b]);
            while let Some(frame) = dec.next_frame().unwrap() {
                match frame {
                    Frame::Data { more, body } => messages.extend(asm.push(more, body)),
                    Frame::Command(c) => commands.push(c),
                }
            }
        }
        assert_eq!(messages, vec![vec![b"a".to_vec(), Vec::new(), b"xyz".to_vec()]]);
        assert_eq!(commands, vec![Command::Ping { ttl: Duration::from_secs(10) }]);
    }

    #[test]
    fn oversize_and_malformed_frames_are_refused() {
        let mut dec = Decoder::new(Some(4));
        dec.extend(&[0, 0, 0, 0, 5]);
        assert_eq!(dec.next_frame(), Err(WireError::TooBig { len: 5, max: 4 }));
        let mut dec = Decoder::new(None);
        dec.extend(&[0x80, 0, 0, 0, 0]);
        assert_eq!(dec.next_frame(), Err(WireError::BadFlags(0x80)));
        let mut dec = Decoder::new(None);
        dec.extend(&[COMMAND, 0, 0, 0, 1, 9]);
        assert_eq!(dec.next_frame(), Err(WireError::BadCommand));
        let mut dec = Decoder::new(None);
        dec.extend(&[COMMAND, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(dec.next_frame(), Err(WireError::BadCommand));
    }
}
