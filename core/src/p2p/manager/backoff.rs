//! The reconnect backoff: how long the manager waits before dialling a peer again after
//! its session was reaped or its connect was refused (p2p-behaviour.md §3.3).
//!
//! The delay is drawn from the RNG the manager was given, never from an ambient source, so
//! the simulator replays it from the seed; spreading reconnects keeps two peers that lost
//! each other from dialling at the same instant again and again (duplicate connects).

use rand_core::RngCore;
use std::time::Duration;

/// A uniform delay in `[min, max)` at millisecond grain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub min: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    /// 200 ms to 1 s, the mainline manager's reconnect spread.
    fn default() -> Self {
        Backoff { min: Duration::from_millis(200), max: Duration::from_millis(1_000) }
    }
}

impl Backoff {
    /// One delay drawn from `rng`; `min` when the range is empty.
    pub fn draw(&self, rng: &mut impl RngCore) -> Duration {
        let min = u64::try_from(self.min.as_millis()).unwrap_or(u64::MAX);
        let max = u64::try_from(self.max.as_millis()).unwrap_or(u64::MAX);
        let span = max.saturating_sub(min);
        if span == 0 {
            return self.min;
        }
        Duration::from_millis(min + rng.next_u64() % span)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;
    use rand_core::SeedableRng;

    #[test]
    fn delays_fall_in_range_and_replay_from_the_seed() {
        let b = Backoff::default();
        let draws = |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            (0..64).map(|_| b.draw(&mut rng)).collect::<Vec<_>>()
        };
        let a = draws(7);
        assert_eq!(a, draws(7));
        assert_ne!(a, draws(8));
        assert!(a.iter().all(|d| *d >= b.min && *d < b.max));
        let fixed = Backoff { min: Duration::from_millis(5), max: Duration::from_millis(5) };
        assert_eq!(fixed.draw(&mut ChaCha8Rng::seed_from_u64(1)), Duration::from_millis(5));
    }
}
