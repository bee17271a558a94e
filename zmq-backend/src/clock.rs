//! The wall clock as the core sees it.

use ctlplane_core::Instant;

/// Converts the process's monotonic clock into the core's [`Instant`], counted from the
/// moment the clock was made (the core only ever compares and subtracts instants).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    origin: std::time::Instant,
}

impl Clock {
    /// A clock whose origin is now.
    pub fn new() -> Self {
        Clock { origin: std::time::Instant::now() }
    }

    /// Nanoseconds since the origin, saturating after ~584 years.
    pub fn now(&self) -> Instant {
        Instant::from_nanos(u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_moves_forward_from_zero() {
        let clock = Clock::new();
        let a = clock.now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = clock.now();
        assert!(b > a && b.as_nanos() >= 2_000_000);
    }
}
