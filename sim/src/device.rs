//! The mocked-timing device: consumer receive slabs and the Mooncake writes into them.
//!
//! Every consumer rank registers one slab of pool bytes under a Mooncake session (the
//! `dst_session` its reservations hand out). A write takes `bytes / bandwidth` plus a fixed
//! setup latency plus seeded jitter, and fails with a seeded non-zero status at a seeded
//! rate. Bytes are not copied: what matters is *where* a write lands. The ownership
//! ledger checks, when a write lands, that a live writer reservation owns every byte of
//! it; a write into memory nobody owns (freed, or handed to another transfer) is the
//! corruption the reference's writer-grace rule (race S11) exists to prevent.

use std::collections::BTreeMap;
use std::time::Duration;

use ctlplane_core::ec::dataplane::DataPlaneError;
use ctlplane_core::ec::slab::Region;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Timing and failure model of the data plane.
#[derive(Clone, Debug)]
pub struct DeviceConfig {
    /// Link bandwidth of one write, bytes per second.
    pub bandwidth: u64,
    /// Fixed cost of one `batch_transfer_sync_write`.
    pub setup: Duration,
    /// Uniform extra latency in `[0, jitter]`.
    pub jitter: Duration,
    /// Writes that fail, per million.
    pub fail_per_million: u32,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            bandwidth: 12_500_000_000,
            setup: Duration::from_micros(20),
            jitter: Duration::from_micros(200),
            fail_per_million: 2_000,
        }
    }
}

/// A registered receive slab.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlabReg {
    /// The rank host that registered it.
    pub host: String,
    /// Address of its first byte.
    pub base: u64,
    pub len: u64,
}

/// How a write will go, decided when it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WritePlan {
    /// When the write returns, after it started.
    pub latency: Duration,
    /// `Some(status)`: the transfer engine reports this non-zero status and nothing lands.
    pub fail_status: Option<i64>,
}

/// The data plane of the simulated world.
#[derive(Debug)]
pub struct Device {
    config: DeviceConfig,
    sessions: BTreeMap<String, SlabReg>,
    rng: ChaCha8Rng,
    /// Writes started, landed, failed (by status or refusal), and ledger violations.
    pub stats: DeviceStats,
}

/// Counters of the data plane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DeviceStats {
    pub started: u64,
    pub landed: u64,
    pub failed: u64,
    pub bytes: u64,
    pub unowned: u64,
}

impl Device {
    /// A data plane with no session; `rng` draws jitter and failures.
    pub fn new(config: DeviceConfig, rng: ChaCha8Rng) -> Self {
        Device { config, sessions: BTreeMap::new(), rng, stats: DeviceStats::default() }
    }

    /// A rank registered its slab under `session` (a restarted rank registers a fresh one
    /// under a new session; the old session is gone with the old process).
    pub fn register(&mut self, session: &str, host: &str, base: u64, len: u64) {
        self.sessions.insert(session.to_string(), SlabReg { host: host.to_string(), base, len });
    }

    /// The rank of `session` died: writes to it fail.
    pub fn unregister(&mut self, session: &str) {
        self.sessions.remove(session);
    }

    /// Sessions registered by `host` (its current incarnation's, after a restart).
    pub fn sessions_of(&self, host: &str) -> Vec<String> {
        self.sessions.iter().filter(|(_, r)| r.host == host).map(|(s, _)| s.clone()).collect()
    }

    /// The slab registered under `session`.
    pub fn slab(&self, session: &str) -> Option<&SlabReg> {
        self.sessions.get(session)
    }

    /// A write of `nbytes` starts: draws its latency and whether it fails.
    pub fn plan_write(&mut self, nbytes: u64) -> WritePlan {
        self.stats.started += 1;
        let transfer_ns = u128::from(nbytes) * 1_000_000_000 / u128::from(self.config.bandwidth.max(1));
        let jitter_ns = self.rng.gen_range(0..=self.config.jitter.as_nanos() as u64);
        let latency = self.config.setup + Duration::from_nanos(transfer_ns as u64 + jitter_ns);
        let fails = self.rng.gen_range(0..1_000_000u32) < self.config.fail_per_million;
        let fail_status = fails.then(|| -self.rng.gen_range(1..=5i64));
        WritePlan { latency, fail_status }
    }

    /// The write returns: it lands unless it failed or its destination is not registered
    /// memory. `owned` gives the regions (slab offsets) a live writer reservation owns
    /// on the session's rank; a landing outside them is returned as the ledger's finding
    /// in `Ok(Some(detail))` (the bytes did land: the corruption happened).
    pub fn land(
        &mut self,
        session: &str,
        dst_ptr: u64,
        nbytes: u64,
        plan: &WritePlan,
        owned: impl FnOnce(&str) -> Vec<Region>,
    ) -> Result<Option<String>, DataPlaneError> {
        let result = self.land_inner(session, dst_ptr, nbytes, plan, owned);
        match &result {
            Ok(finding) => {
                self.stats.landed += 1;
                self.stats.bytes += nbytes;
                if finding.is_some() {
                    self.stats.unowned += 1;
                }
            }
            Err(_) => self.stats.failed += 1,
        }
        result
    }

    fn land_inner(
        &mut self,
        session: &str,
        dst_ptr: u64,
        nbytes: u64,
        plan: &WritePlan,
        owned: impl FnOnce(&str) -> Vec<Region>,
    ) -> Result<Option<String>, DataPlaneError> {
        let reg = self
            .sessions
            .get(session)
            .ok_or_else(|| DataPlaneError::UnknownSession { session: session.to_string() })?;
        if let Some(status) = plan.fail_status {
            return Err(DataPlaneError::Status { session: session.to_string(), status });
        }
        if nbytes == 0 {
            // An empty tensor (null `dst_ptr`): nothing moves, nothing can land out of place.
            return Ok(None);
        }
        let end = reg.base.saturating_add(reg.len);
        let offset =
            dst_ptr.checked_sub(reg.base).filter(|off| off.checked_add(nbytes).is_some_and(|e| e <= reg.len)).ok_or(
                DataPlaneError::OutOfRange { session: session.to_string(), dst_ptr, len: nbytes, base: reg.base, end },
            )?;
        Ok(ledger_check(offset, nbytes, &owned(&reg.host)).err())
    }
}

/// The ownership ledger's rule: `[offset, offset + nbytes)` must lie inside one region a
/// live writer owns. `Err` says which bytes nobody owned.
pub fn ledger_check(offset: u64, nbytes: u64, owned: &[Region]) -> Result<(), String> {
    let end = offset.saturating_add(nbytes.max(1));
    if owned.iter().any(|r| r.offset <= offset && end <= r.end()) {
        return Ok(());
    }
    let overlapping: Vec<String> = owned
        .iter()
        .filter(|r| r.offset < end && offset < r.end())
        .map(|r| format!("[{}, {})", r.offset, r.end()))
        .collect();
    Err(format!(
        "write of {nbytes} bytes at slab offset {offset} lands on memory no live writer owns (overlapping writer regions: {})",
        if overlapping.is_empty() { "none".to_string() } else { overlapping.join(", ") }
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn device(fail_per_million: u32) -> Device {
        let config = DeviceConfig { fail_per_million, ..DeviceConfig::default() };
        Device::new(config, ChaCha8Rng::seed_from_u64(7))
    }

    const BASE: u64 = 0x7f00_0000_0000;

    #[test]
    fn latency_grows_with_bytes_and_is_seeded() {
        let mut a = device(0);
        let mut b = device(0);
        let small: Vec<WritePlan> = (0..20).map(|_| a.plan_write(1024)).collect();
        let again: Vec<WritePlan> = (0..20).map(|_| b.plan_write(1024)).collect();
        assert_eq!(small, again, "same seed, same draws");
        let cfg = DeviceConfig::default();
        for p in &small {
            assert!(p.latency >= cfg.setup && p.latency <= cfg.setup + cfg.jitter + Duration::from_micros(1));
            assert_eq!(p.fail_status, None);
        }
        let big = a.plan_write(1 << 30);
        assert!(big.latency >= Duration::from_millis(85), "1 GiB at 12.5 GB/s: {:?}", big.latency);
        assert!(small.windows(2).any(|w| w[0].latency != w[1].latency), "jitter varies");
    }

    #[test]
    fn failures_follow_the_rate() {
        let mut d = device(500_000);
        let fails = (0..1000).filter(|_| d.plan_write(16).fail_status.is_some()).count();
        assert!((400..600).contains(&fails), "{fails}");
        let mut never = device(0);
        assert!((0..1000).all(|_| never.plan_write(16).fail_status.is_none()));
    }

    #[test]
    fn writes_land_only_in_registered_memory() {
        let mut d = device(0);
        d.register("c0-r0:15000", "c0-r0", BASE, 4096);
        let plan = d.plan_write(256);
        let owned = |_: &str| vec![Region { offset: 256, len: 256 }];
        assert_eq!(d.land("c0-r0:15000", BASE + 256, 256, &plan, owned), Ok(None));
        let err = d.land("nope:1", BASE, 16, &plan, owned).unwrap_err();
        assert!(matches!(err, DataPlaneError::UnknownSession { .. }));
        let err = d.land("c0-r0:15000", BASE + 4000, 256, &plan, owned).unwrap_err();
        assert!(matches!(err, DataPlaneError::OutOfRange { .. }), "{err}");
        assert!(matches!(d.land("c0-r0:15000", BASE - 1, 1, &plan, owned), Err(DataPlaneError::OutOfRange { .. })));
        d.unregister("c0-r0:15000");
        assert!(d.land("c0-r0:15000", BASE + 256, 256, &plan, owned).is_err());
        assert_eq!((d.stats.landed, d.stats.failed), (1, 4));
    }

    #[test]
    fn a_failed_write_lands_nothing_and_carries_its_status() {
        let mut d = device(0);
        d.register("s", "h", BASE, 1024);
        let plan = WritePlan { latency: Duration::ZERO, fail_status: Some(-3) };
        let err = d.land("s", BASE, 16, &plan, |_| Vec::new()).unwrap_err();
        assert_eq!(err.to_string(), "Mooncake EC push to s failed with status -3");
        assert_eq!(d.stats.unowned, 0);
    }

    #[test]
    fn ledger_flags_writes_outside_live_writer_regions() {
        let owned = [Region { offset: 0, len: 512 }, Region { offset: 1024, len: 256 }];
        assert!(ledger_check(0, 512, &owned).is_ok());
        assert!(ledger_check(1024, 200, &owned).is_ok());
        let e = ledger_check(256, 512, &owned).unwrap_err();
        assert!(e.contains("[0, 512)"), "{e}");
        assert!(ledger_check(512, 256, &owned).unwrap_err().contains("none"));
        assert!(ledger_check(0, 16, &[]).is_err(), "freed memory");
        let mut d = device(0);
        d.register("s", "h", BASE, 2048);
        let plan = d.plan_write(16);
        let finding = d.land("s", BASE + 600, 16, &plan, |h| {
            assert_eq!(h, "h");
            owned.to_vec()
        });
        assert!(finding.unwrap().is_some());
        assert_eq!(d.stats.unowned, 1);
    }
}
