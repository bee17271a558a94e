//! ZMTP 3.1 heartbeat timers of one connection, as libzmq's stream engine keeps them.
//!
//! With `heartbeat_ivl` set, a PING goes out every interval; sending one arms the timeout
//! timer (unless it is armed) for `heartbeat_timeout` (default: the interval). A PING
//! received with a non-zero TTL arms the TTL timer (unless armed). Any frame received
//! disarms both, before a PING in it re-arms the TTL. Either timer firing drops the
//! connection. A partition that wedges a stream is detected only this way.

use super::SocketOptions;
use ctlplane_core::time::Instant;
use std::time::Duration;

/// What the connection must do when [`Heartbeat::on_timer`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeartbeatAction {
    /// Nothing is due.
    Idle,
    /// Send a PING carrying this TTL.
    Ping { ttl: Duration },
    /// No traffic in time: drop the connection.
    Expired,
}

/// The heartbeat timers of one connection.
#[derive(Clone, Debug)]
pub struct Heartbeat {
    ivl: Option<Duration>,
    timeout: Duration,
    ttl: Duration,
    next_ping: Option<Instant>,
    timeout_at: Option<Instant>,
    ttl_at: Option<Instant>,
}

impl Heartbeat {
    /// Timers of a connection whose handshake completed at `now`.
    pub fn new(opts: &SocketOptions, now: Instant) -> Self {
        let ivl = opts.heartbeat_ivl.filter(|d| !d.is_zero());
        Heartbeat {
            ivl,
            timeout: opts.heartbeat_timeout.or(ivl).unwrap_or_default(),
            ttl: opts.heartbeat_ttl.unwrap_or_default(),
            next_ping: ivl.map(|d| now + d),
            timeout_at: None,
            ttl_at: None,
        }
    }

    /// Any frame arrived (data or command).
    pub fn on_frame(&mut self) {
        self.timeout_at = None;
        self.ttl_at = None;
    }

    /// A PING arrived (after [`on_frame`](Self::on_frame)) carrying the peer's TTL.
    pub fn on_ping(&mut self, ttl: Duration, now: Instant) {
        if self.ttl_at.is_none() && !ttl.is_zero() {
            self.ttl_at = Some(now + ttl);
        }
    }

    /// When [`on_timer`](Self::on_timer) must run next, if ever.
    pub fn next_deadline(&self) -> Option<Instant> {
        [self.next_ping, self.timeout_at, self.ttl_at].into_iter().flatten().min()
    }

    /// The clock reached a deadline: expiry wins over a due PING.
    pub fn on_timer(&mut self, now: Instant) -> HeartbeatAction {
        if self.timeout_at.is_some_and(|t| now >= t) || self.ttl_at.is_some_and(|t| now >= t) {
            return HeartbeatAction::Expired;
        }
        match (self.next_ping, self.ivl) {
            (Some(due), Some(ivl)) if now >= due => {
                self.next_ping = Some(now + ivl);
                if self.timeout_at.is_none() && !self.timeout.is_zero() {
                    self.timeout_at = Some(now + self.timeout);
                }
                HeartbeatAction::Ping { ttl: self.ttl }
            }
            _ => HeartbeatAction::Idle,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Instant {
        Instant::from_nanos(n * 1_000_000)
    }

    fn opts(ivl: u64, timeout: Option<u64>, ttl: Option<u64>) -> SocketOptions {
        SocketOptions {
            heartbeat_ivl: Some(Duration::from_millis(ivl)),
            heartbeat_timeout: timeout.map(Duration::from_millis),
            heartbeat_ttl: ttl.map(Duration::from_millis),
            ..SocketOptions::default()
        }
    }

    #[test]
    fn silent_peer_expires_timeout_after_first_ping() {
        let mut hb = Heartbeat::new(&opts(2000, Some(10_000), Some(10_000)), ms(0));
        assert_eq!(hb.next_deadline(), Some(ms(2000)));
        assert_eq!(hb.on_timer(ms(2000)), HeartbeatAction::Ping { ttl: Duration::from_secs(10) });
        // Later PINGs do not push the timeout out.
        assert_eq!(hb.on_timer(ms(4000)), HeartbeatAction::Ping { ttl: Duration::from_secs(10) });
        assert_eq!(hb.next_deadline(), Some(ms(6000)));
        for t in [6000, 8000, 10_000] {
            assert!(matches!(hb.on_timer(ms(t)), HeartbeatAction::Ping { .. }));
        }
        assert_eq!(hb.next_deadline(), Some(ms(12_000)));
        assert_eq!(hb.on_timer(ms(12_000)), HeartbeatAction::Expired);
    }

    #[test]
    fn traffic_disarms_the_timeout_and_default_timeout_is_the_interval() {
        let mut hb = Heartbeat::new(&opts(100, None, None), ms(0));
        assert!(matches!(hb.on_timer(ms(100)), HeartbeatAction::Ping { ttl } if ttl.is_zero()));
        hb.on_frame();
        assert_eq!(hb.next_deadline(), Some(ms(200)));
        assert!(matches!(hb.on_timer(ms(200)), HeartbeatAction::Ping { .. }));
        assert_eq!(hb.on_timer(ms(300)), HeartbeatAction::Expired);
    }

    #[test]
    fn peer_ttl_applies_without_own_heartbeats() {
        let mut hb = Heartbeat::new(&SocketOptions::default(), ms(0));
        assert_eq!(hb.next_deadline(), None);
        hb.on_frame();
        hb.on_ping(Duration::from_secs(10), ms(5));
        hb.on_ping(Duration::from_secs(10), ms(7)); // armed once
        assert_eq!(hb.next_deadline(), Some(ms(10_005)));
        assert_eq!(hb.on_timer(ms(10_004)), HeartbeatAction::Idle);
        assert_eq!(hb.on_timer(ms(10_005)), HeartbeatAction::Expired);
    }
}
