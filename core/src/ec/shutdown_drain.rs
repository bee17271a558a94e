//! A consumer rank's clean close (docs/ec-behaviour.md §3.7, race S21).
//!
//! Closing a rank while a remote producer still writes into its pool must not hand that
//! memory back: the NIC may write after the free. So the close first puts the book into
//! shutdown (new reserves refused, READY records and followers cancelled, writers
//! deferred), keeps serving so the writers can complete, and only then decides what
//! becomes of the pool: released once no record is writer-owned, kept registered when
//! the wait runs out with writers left. The drivers (the zmq server's `shutdown`, the
//! simulated rank) keep serving between polls and act on the outcome; the wait and the
//! verdict are decided here.

use super::shard::ConsumerShard;
use crate::time::Instant;
use rand_core::RngCore;
use std::time::Duration;

/// A close in progress: begun at one instant, given up on at `deadline`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShutdownDrain {
    deadline: Instant,
}

/// What the driver does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainStep {
    /// Writers are still in flight: keep serving, poll again no later than `until`.
    Wait { until: Instant },
    /// The close is decided: stop serving and act on the outcome.
    Done(DrainOutcome),
}

/// How a close ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// No record is writer-owned: the pool may be released.
    Released,
    /// The wait ran out with `writers` records still writer-owned: the pool stays
    /// registered, since a remote writer may still write into it.
    KeptPool { writers: usize },
}

impl ShutdownDrain {
    /// Puts `shard` into shutdown at `now` and starts waiting up to `timeout` for its
    /// writers (the reference waits `control_timeout_s`).
    pub fn begin<R: RngCore>(shard: &mut ConsumerShard<R>, now: Instant, timeout: Duration) -> Self {
        shard.begin_shutdown(now);
        ShutdownDrain { deadline: now + timeout }
    }

    /// When the wait runs out.
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// The next step at `now`, after the shard served whatever arrived since the last poll.
    pub fn poll<R: RngCore>(&self, shard: &ConsumerShard<R>, now: Instant) -> DrainStep {
        let writers = shard.writer_owned_count();
        if writers == 0 {
            DrainStep::Done(DrainOutcome::Released)
        } else if now >= self.deadline {
            DrainStep::Done(DrainOutcome::KeptPool { writers })
        } else {
            DrainStep::Wait { until: self.deadline }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ec::shard::ShardConfig;
    use rand_chacha::ChaCha8Rng;
    use rand_core::SeedableRng;

    fn shard() -> ConsumerShard<ChaCha8Rng> {
        ConsumerShard::new(ShardConfig::new(7000, 1 << 20), ChaCha8Rng::seed_from_u64(1), Instant::from_nanos(0))
    }

    fn at(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    fn ask(shard: &mut ConsumerShard<ChaCha8Rng>, request: &str, now: Instant) -> serde_json::Value {
        serde_json::from_slice(&shard.handle_request(request.as_bytes(), now))
            .unwrap_or_else(|e| panic!("the reply to {request} is JSON: {e}"))
    }

    fn reserve(tid: &str) -> String {
        format!(
            r#"{{"op": "reserve", "transfer_id": "{tid}", "mm_hash": "h-{tid}", "nbytes": 64, "shape": [32], "dtype": "float16"}}"#
        )
    }

    /// Reserves a fresh writer and returns its reservation id.
    fn writer(shard: &mut ConsumerShard<ChaCha8Rng>, tid: &str) -> String {
        let reply = ask(shard, &reserve(tid), at(1));
        assert_eq!(reply["result"]["write"], true, "{reply}");
        reply["result"]["reservation_id"].as_str().unwrap_or_else(|| panic!("a reservation id: {reply}")).to_string()
    }

    #[test]
    fn a_rank_with_no_writer_releases_its_pool_at_once() {
        let mut s = shard();
        let drain = ShutdownDrain::begin(&mut s, at(10), Duration::from_secs(30));
        assert_eq!(drain.poll(&s, at(10)), DrainStep::Done(DrainOutcome::Released));
    }

    #[test]
    fn a_writer_in_flight_holds_the_close_until_it_completes() {
        let mut s = shard();
        let rid = writer(&mut s, "t1");
        let drain = ShutdownDrain::begin(&mut s, at(10), Duration::from_secs(30));
        assert_eq!(drain.poll(&s, at(20)), DrainStep::Wait { until: at(30_010) });
        // New reserves are refused while it drains; the writer's complete is still served.
        let refused = ask(&mut s, &reserve("t2"), at(30));
        assert_ne!(refused["result"]["write"], true, "{refused}");
        ask(&mut s, &format!(r#"{{"op": "complete", "transfer_id": "t1", "reservation_id": "{rid}"}}"#), at(40));
        assert_eq!(drain.poll(&s, at(50)), DrainStep::Done(DrainOutcome::Released));
    }

    #[test]
    fn the_pool_stays_registered_when_the_wait_runs_out_with_writers_left() {
        let mut s = shard();
        writer(&mut s, "t1");
        writer(&mut s, "t2");
        let drain = ShutdownDrain::begin(&mut s, at(10), Duration::from_millis(500));
        assert_eq!(drain.deadline(), at(510));
        assert_eq!(drain.poll(&s, at(509)), DrainStep::Wait { until: at(510) });
        assert_eq!(drain.poll(&s, at(510)), DrainStep::Done(DrainOutcome::KeptPool { writers: 2 }));
    }
}
