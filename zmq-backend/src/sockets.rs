//! Socket construction with the options the reference sets, in the order it sets them.

use crate::curve::{as_zmq, CurveClient};
use std::time::Duration;

/// The milliseconds of `d` as libzmq's `int` option, clamped rather than wrapped.
pub(crate) fn millis(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

/// A control client's REQ socket: `IPV6=1, RCVTIMEO, SNDTIMEO, LINGER=0` (the reference's
/// tests assert this order), then connected to `addr`.
pub(crate) fn open_req(
    ctx: &zmq::Context,
    addr: &str,
    timeout_ms: i32,
    curve: Option<&CurveClient>,
) -> zmq::Result<zmq::Socket> {
    let socket = ctx.socket(zmq::REQ)?;
    socket.set_ipv6(true)?;
    socket.set_rcvtimeo(timeout_ms)?;
    socket.set_sndtimeo(timeout_ms)?;
    socket.set_linger(0)?;
    if let Some(curve) = curve {
        curve.apply(&socket).map_err(as_zmq)?;
    }
    socket.connect(addr)?;
    Ok(socket)
}

/// A server's REP socket, not yet bound. `RCVTIMEO` is the loop's tick: how often it
/// flushes events and reaps while no request arrives. `LINGER=0` so a closing server
/// drops unsent replies instead of blocking its context's termination. `MAXMSGSIZE` bounds
/// what one request may make libzmq allocate.
pub(crate) fn new_rep(
    ctx: &zmq::Context,
    recv_timeout: Duration,
    max_request_bytes: Option<usize>,
) -> zmq::Result<zmq::Socket> {
    let socket = ctx.socket(zmq::REP)?;
    socket.set_ipv6(true)?;
    socket.set_rcvtimeo(millis(recv_timeout))?;
    socket.set_linger(0)?;
    if let Some(limit) = max_request_bytes {
        socket.set_maxmsgsize(i64::try_from(limit).unwrap_or(i64::MAX))?;
    }
    Ok(socket)
}

/// A server's PUSH socket for readiness events, not yet bound.
pub(crate) fn new_push(ctx: &zmq::Context) -> zmq::Result<zmq::Socket> {
    let socket = ctx.socket(zmq::PUSH)?;
    socket.set_ipv6(true)?;
    socket.set_linger(0)?;
    Ok(socket)
}

/// The port of a bound endpoint such as `tcp://127.0.0.1:41237` or `tcp://[::1]:41237`.
pub(crate) fn endpoint_port(endpoint: &str) -> Option<u16> {
    endpoint.rsplit_once(':').and_then(|(_, port)| port.parse().ok()).filter(|&p| p != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_read_back_from_endpoints() {
        assert_eq!(endpoint_port("tcp://127.0.0.1:41237"), Some(41237));
        assert_eq!(endpoint_port("tcp://[::1]:5000"), Some(5000));
        assert_eq!(endpoint_port("tcp://127.0.0.1:0"), None);
        assert_eq!(endpoint_port("tcp://host"), None);
        assert_eq!(millis(Duration::from_secs(u64::MAX)), i32::MAX);
    }
}
