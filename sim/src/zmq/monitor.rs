//! Socket monitors, as `zmq_socket_monitor`: events go out on a PAIR the monitored socket
//! binds at an inproc endpoint, two frames each: `[u16 event LE, u32 value LE]` and the
//! endpoint string. An event nobody reads yet (no PAIR connected, or its queue full) is
//! lost, as in libzmq.

use super::state::SocketState;
use super::Multipart;
use std::cell::RefCell;
use std::rc::Rc;

pub const CONNECTED: u16 = 0x0001;
pub const CONNECT_DELAYED: u16 = 0x0002;
pub const CONNECT_RETRIED: u16 = 0x0004;
pub const LISTENING: u16 = 0x0008;
pub const BIND_FAILED: u16 = 0x0010;
pub const ACCEPTED: u16 = 0x0020;
pub const ACCEPT_FAILED: u16 = 0x0040;
pub const CLOSED: u16 = 0x0080;
pub const CLOSE_FAILED: u16 = 0x0100;
pub const DISCONNECTED: u16 = 0x0200;
pub const MONITOR_STOPPED: u16 = 0x0400;
pub const HANDSHAKE_FAILED_NO_DETAIL: u16 = 0x0800;
pub const HANDSHAKE_SUCCEEDED: u16 = 0x1000;
pub const HANDSHAKE_FAILED_PROTOCOL: u16 = 0x2000;
pub const HANDSHAKE_FAILED_AUTH: u16 = 0x4000;
pub const ALL: u16 = 0xffff;

/// libzmq's `EINPROGRESS`, the value of CONNECT_DELAYED.
pub const EINPROGRESS: u32 = 115;

/// The two frames of one event.
pub fn encode(event: u16, value: u32, endpoint: &str) -> Multipart {
    let mut head = Vec::with_capacity(6);
    head.extend_from_slice(&event.to_le_bytes());
    head.extend_from_slice(&value.to_le_bytes());
    vec![head, endpoint.as_bytes().to_vec()]
}

/// `(event, value, endpoint)` of a monitor message; `None` if it is not one.
pub fn decode(msg: &Multipart) -> Option<(u16, u32, String)> {
    let [head, endpoint] = msg.as_slice() else { return None };
    let [e0, e1, v0, v1, v2, v3] = <[u8; 6]>::try_from(head.as_slice()).ok()?;
    let endpoint = String::from_utf8(endpoint.clone()).ok()?;
    Some((u16::from_le_bytes([e0, e1]), u32::from_le_bytes([v0, v1, v2, v3]), endpoint))
}

/// A monitored socket's end: the internal PAIR and the events it publishes.
pub(crate) struct MonitorSink {
    pub pair: Rc<RefCell<SocketState>>,
    pub events: u16,
    pub endpoint: String,
}

impl MonitorSink {
    /// Publishes one event if subscribed; dropped when the reader is absent or behind.
    pub fn emit(&self, event: u16, value: u32, endpoint: &str) {
        if self.events & event == 0 {
            return;
        }
        let Ok(mut pair) = self.pair.try_borrow_mut() else { return };
        let host = pair.ctx.host().to_string();
        let delivered = pair.try_send(encode(event, value, endpoint)).is_ok();
        crate::trace::record(
            &host,
            "zmq.monitor_event",
            &[("event", &event), ("value", &value), ("endpoint", &endpoint), ("delivered", &delivered)],
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_round_trip_and_junk_is_not_one() {
        let msg = encode(DISCONNECTED, 17, "tcp://192.168.0.2:5710");
        assert_eq!(msg[0], vec![0x00, 0x02, 17, 0, 0, 0]);
        assert_eq!(decode(&msg), Some((DISCONNECTED, 17, "tcp://192.168.0.2:5710".to_string())));
        assert_eq!(decode(&vec![vec![0; 5], Vec::new()]), None);
        assert_eq!(decode(&vec![vec![0; 6]]), None);
    }
}
