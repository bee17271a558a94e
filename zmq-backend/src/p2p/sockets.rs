//! The P2P transport's sockets, built with the reference's options in the reference's
//! order (`_apply_heartbeat`, then identity, high-water mark, linger, monitor, PAIR,
//! connect), and the libzmq monitor frame they report lost links in. The values are the
//! core's (`ctlplane_core::p2p::options`).

use super::TransportOptions;
use crate::curve::{as_zmq, CurveServer};
use crate::sockets::millis;
use ctlplane_core::p2p::options::{DEALER_LINGER, DEALER_SNDHWM, MONITOR_EVENT_MASK};
use ctlplane_core::p2p::MonitorEvent;

/// Heartbeats (and the T2 frame limit when configured); `IPV6` is left unset, as upstream.
fn apply_options(socket: &zmq::Socket, options: &TransportOptions) -> zmq::Result<()> {
    socket.set_heartbeat_ivl(millis(options.heartbeat_ivl))?;
    socket.set_heartbeat_timeout(millis(options.heartbeat_timeout))?;
    socket.set_heartbeat_ttl(millis(options.heartbeat_ttl))?;
    if let Some(limit) = options.max_message_bytes {
        socket.set_maxmsgsize(i64::try_from(limit).unwrap_or(i64::MAX))?;
    }
    Ok(())
}

/// The zmq crate panics on an endpoint with a NUL byte, and a peer id off the wire may
/// hold one: refuse it as libzmq refuses any other malformed endpoint.
fn checked(endpoint: &str) -> zmq::Result<&str> {
    if endpoint.contains('\0') {
        Err(zmq::Error::EINVAL)
    } else {
        Ok(endpoint)
    }
}

/// The ROUTER, options set before `bind`.
pub(crate) fn bind_router(ctx: &zmq::Context, endpoint: &str, options: &TransportOptions) -> zmq::Result<zmq::Socket> {
    let router = ctx.socket(zmq::ROUTER)?;
    apply_options(&router, options)?;
    if let Some(curve) = &options.curve {
        CurveServer { keys: curve.keys.clone() }.apply(&router).map_err(as_zmq)?;
    }
    if let Err(e) = router.bind(checked(endpoint)?) {
        close_now(router);
        return Err(e);
    }
    Ok(router)
}

/// One peer's DEALER and the PAIR reading its monitor.
pub(crate) struct Dealer {
    pub dealer: zmq::Socket,
    pub monitor: zmq::Socket,
}

impl Dealer {
    /// DEALER with the heartbeat options, `identity`, the core's high-water mark and
    /// linger, monitored for the core's fatal events on `monitor` (read by a PAIR of the same context: inproc endpoints are per context),
    /// then connected to `endpoint`.
    pub fn open(
        ctx: &zmq::Context,
        endpoint: &str,
        identity: &str,
        monitor: &str,
        options: &TransportOptions,
    ) -> zmq::Result<Self> {
        let (endpoint, monitor) = (checked(endpoint)?, checked(monitor)?);
        let dealer = ctx.socket(zmq::DEALER)?;
        let pair = match Self::monitored(ctx, &dealer, identity, monitor, options) {
            Ok(pair) => pair,
            Err(e) => {
                close_now(dealer);
                return Err(e);
            }
        };
        let opened = Dealer { dealer, monitor: pair };
        if let Err(e) = opened.dealer.connect(endpoint) {
            opened.close();
            return Err(e);
        }
        Ok(opened)
    }

    fn monitored(
        ctx: &zmq::Context,
        dealer: &zmq::Socket,
        identity: &str,
        monitor: &str,
        options: &TransportOptions,
    ) -> zmq::Result<zmq::Socket> {
        apply_options(dealer, options)?;
        if let Some(curve) = &options.curve {
            curve.apply(dealer).map_err(as_zmq)?;
        }
        dealer.set_identity(identity.as_bytes())?;
        dealer.set_sndhwm(DEALER_SNDHWM)?;
        dealer.set_linger(millis(DEALER_LINGER))?;
        dealer.monitor(monitor, i32::from(MONITOR_EVENT_MASK))?;
        let pair = ctx.socket(zmq::PAIR)?;
        if let Err(e) = pair.connect(monitor) {
            close_now(pair);
            return Err(e);
        }
        Ok(pair)
    }

    /// Closes the PAIR, then the DEALER with the linger it was opened with: what it
    /// queued (a best-effort Disconnect) is flushed for at most `DEALER_LINGER`.
    pub fn close(self) {
        close_now(self.monitor);
        drop(self.dealer);
    }

    /// Reads monitor events without blocking until none is pending or one is fatal (the
    /// rest stay unread), appending each to `out` with `conn`.
    pub fn monitor_events(&self, conn: u64, out: &mut Vec<(u64, MonitorEvent)>) -> zmq::Result<()> {
        loop {
            let frames = match self.monitor.recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => frames,
                Err(zmq::Error::EAGAIN) => return Ok(()),
                Err(e) => return Err(e),
            };
            let Some(event) = frames.first().and_then(|f| parse_monitor_frame(f)) else { continue };
            out.push((conn, event));
            if event.is_fatal() {
                return Ok(());
            }
        }
    }
}

/// Closes `socket` with linger 0.
pub(crate) fn close_now(socket: zmq::Socket) {
    close_after(socket, std::time::Duration::ZERO);
}

/// Closes `socket`, letting it flush for at most `linger`.
pub(crate) fn close_after(socket: zmq::Socket, linger: std::time::Duration) {
    if let Err(error) = socket.set_linger(millis(linger)) {
        tracing::debug!(%error, "cannot set LINGER before close");
    }
    drop(socket);
}

/// The event of a libzmq (v1) monitor message's first frame: `u16` event, then `u32`
/// value, both little-endian on the platforms libzmq runs on here.
pub(crate) fn parse_monitor_frame(frame: &[u8]) -> Option<MonitorEvent> {
    let [lo, hi, _, _, _, _] = <[u8; 6]>::try_from(frame).ok()?;
    Some(MonitorEvent::from_code(u16::from_le_bytes([lo, hi])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_frames_are_read_and_malformed_ones_ignored() {
        assert_eq!(parse_monitor_frame(&[0x00, 0x02, 7, 0, 0, 0]), Some(MonitorEvent::Disconnected));
        assert_eq!(parse_monitor_frame(&[0x01, 0x00, 0, 0, 0, 0]), Some(MonitorEvent::Other(1)));
        assert_eq!(parse_monitor_frame(&[0x80, 0x00, 0, 0, 0, 0]), Some(MonitorEvent::Closed));
        assert_eq!(parse_monitor_frame(&[0x00, 0x20, 0, 0, 0, 0]), Some(MonitorEvent::HandshakeFailed(0x2000)));
        assert_eq!(parse_monitor_frame(&[0x00, 0x02]), None);
        assert_eq!(parse_monitor_frame(&[0; 10]), None);
    }

    #[test]
    fn nul_bytes_in_endpoints_are_refused_not_panicked_on() {
        let ctx = zmq::Context::new();
        let options = TransportOptions::default();
        let opened = Dealer::open(&ctx, "tcp://a\0b:1", "me:1", "inproc://m", &options);
        assert_eq!(opened.err(), Some(zmq::Error::EINVAL));
        assert_eq!(bind_router(&ctx, "tcp://a\0:1", &options).err(), Some(zmq::Error::EINVAL));
    }
}
