//! What a consumer rank's serving loop does next. Both loops that serve a
//! [`ConsumerShard`] (the production loop over libzmq and the simulator's consumer host)
//! ask the shard at every turn and do what it says, so they publish, reap, wait and stop
//! at the same points (ec-behaviour.md §2.5); the drivers only move frames and sleep.

use super::defaults::REP_RECV_TIMEOUT;
use super::shard::ConsumerShard;
use crate::time::Instant;
use rand_core::RngCore;

/// The serving loop's next move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeStep {
    /// Hand queued events to PUSH ([`ConsumerShard::peek_event`], then
    /// [`ConsumerShard::confirm_sent`]) until it refuses one without blocking; if one was
    /// refused, ask again with `publish_blocked` set.
    Publish,
    /// The reap is due: call [`ConsumerShard::handle_timeout`], then ask again.
    Timer,
    /// Wait for a request. Wake at `until` if none came (`None`: nothing is due, wait as
    /// long as the driver's own liveness allows); with `push_room`, room on PUSH is worth
    /// waking for too, since events wait behind it. After any wake, publishing is tried
    /// again (`publish_blocked` false).
    Wait { until: Option<Instant>, push_room: bool },
    /// Send the reply the shard wrote.
    Reply,
    /// The shard halted (a regression switch restoring the reference's dead control
    /// thread): stop serving and leave what REP holds unanswered.
    Stop,
}

impl<R: RngCore> ConsumerShard<R> {
    /// The loop's next move at `now`. `publish_blocked`: PUSH refused an event since the
    /// loop last waited, so queued events wait for room instead of being retried at once.
    pub fn next_step(&self, now: Instant, publish_blocked: bool) -> ServeStep {
        if self.halted().is_some() {
            return ServeStep::Stop;
        }
        let pending = self.pending_events() > 0;
        if pending && !publish_blocked {
            return ServeStep::Publish;
        }
        let due = self.poll_timeout();
        if due.is_some_and(|due| now >= due) {
            return ServeStep::Timer;
        }
        // Events stuck behind a full (or peerless) PUSH are retried within one tick even
        // where the driver cannot see PUSH regain room.
        let retry = pending.then(|| now + REP_RECV_TIMEOUT);
        let until = match (due, retry) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        ServeStep::Wait { until, push_room: pending }
    }

    /// Answers one request frame into `out`: [`ServeStep::Reply`], or
    /// [`ServeStep::Stop`] when the shard halted while handling it (no reply goes out).
    pub fn serve_request(&mut self, frame: &[u8], now: Instant, out: &mut Vec<u8>) -> ServeStep {
        self.handle_request_into(frame, now, out);
        if self.halted().is_some() {
            ServeStep::Stop
        } else {
            ServeStep::Reply
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec::shard::ShardConfig;
    use rand_chacha::rand_core::SeedableRng;
    use rand_chacha::ChaCha8Rng;
    use std::time::Duration;

    fn shard(now: Instant) -> ConsumerShard<ChaCha8Rng> {
        ConsumerShard::new(ShardConfig::new(5555, 1 << 20), ChaCha8Rng::seed_from_u64(7), now)
    }

    const RESERVE: &[u8] = br#"{"op": "reserve", "transfer_id": "00000000000000000000000000000001", "mm_hash": "0000000000000000000000000000000000000000000000000000000000000001", "nbytes": 16, "shape": [4], "dtype": "float32"}"#;

    #[test]
    fn an_idle_shard_waits_for_its_reap_and_then_runs_it() {
        let t0 = Instant::from_secs(1);
        let mut s = shard(t0);
        let due = s.poll_timeout().expect("a reap is scheduled");
        assert_eq!(s.next_step(t0, false), ServeStep::Wait { until: Some(due), push_room: false });
        assert_eq!(s.next_step(due, false), ServeStep::Timer);
        s.handle_timeout(due);
        assert!(matches!(s.next_step(due, false), ServeStep::Wait { until: Some(next), .. } if next > due));
    }

    #[test]
    fn queued_events_are_published_first_then_wait_for_room_within_a_tick() {
        let t0 = Instant::from_secs(1);
        let mut s = shard(t0);
        let mut out = Vec::new();
        assert_eq!(s.serve_request(RESERVE, t0, &mut out), ServeStep::Reply);
        let reply = String::from_utf8(out.clone()).expect("utf-8");
        let rid = reply.split("\"reservation_id\": \"").nth(1).and_then(|r| r.get(..32)).expect("reservation id");
        let complete = format!(
            r#"{{"op": "complete", "transfer_id": "00000000000000000000000000000001", "reservation_id": "{rid}"}}"#
        );
        assert_eq!(s.serve_request(complete.as_bytes(), t0, &mut out), ServeStep::Reply);
        assert_eq!(s.pending_events(), 1);
        assert_eq!(s.next_step(t0, false), ServeStep::Publish);
        // PUSH refused it: wait for a request or room, and look again within a tick.
        let due = s.poll_timeout().expect("reap");
        let until = due.min(t0 + REP_RECV_TIMEOUT);
        assert_eq!(s.next_step(t0, true), ServeStep::Wait { until: Some(until), push_room: true });
        s.confirm_sent();
        assert_eq!(s.next_step(t0, false), ServeStep::Wait { until: Some(due), push_room: false });
    }

    #[test]
    fn a_halted_shard_stops_the_loop_and_sends_no_reply() {
        let t0 = Instant::from_secs(1);
        let mut config = ShardConfig::new(5555, 1 << 20);
        config.regressions.s2_reap_fault_at = Some(t0);
        let mut s = ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(7), t0);
        let later = t0 + Duration::from_secs(3600);
        assert_eq!(s.next_step(later, false), ServeStep::Timer);
        s.handle_timeout(later);
        assert_eq!(s.next_step(later, false), ServeStep::Stop);
        let mut out = Vec::new();
        assert_eq!(s.serve_request(RESERVE, later, &mut out), ServeStep::Stop);
        assert!(out.is_empty());
    }
}
