//! The Mooncake data-plane boundary of an EC producer (ec-behaviour.md §4).
//!
//! Tensor bytes never cross the control channel: a producer writes them straight into the
//! consumer's registered receive slab at the `dst_ptr` its reservation granted. A driver
//! performs the [`super::producer::Transmit::Write`]s of a push coordinator through a
//! [`DataPlane`]; production backs it with Mooncake's `batch_transfer_sync_write`, tests and
//! the simulator with [`InProcessDataPlane`], which also refuses any write outside the
//! memory a session registered, so a stray `dst_ptr` is caught instead of silently landing.

use std::collections::{BTreeMap, VecDeque};
use thiserror::Error;

/// Why a write did not land. `Display` of [`DataPlaneError::Status`] is the reference's
/// text, which is what a producer reports as the failed batch's error.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum DataPlaneError {
    /// The transfer engine returned a non-zero status.
    #[error("Mooncake EC push to {session} failed with status {status}")]
    Status { session: String, status: i64 },
    /// No memory is registered under this session.
    #[error("Mooncake EC push to {session} failed: no memory registered for that session")]
    UnknownSession { session: String },
    /// The write does not fit inside the session's registered memory.
    #[error(
        "Mooncake EC push to {session} failed: {len} bytes at {dst_ptr:#x} fall outside the registered \
         region [{base:#x}, {end:#x})"
    )]
    OutOfRange { session: String, dst_ptr: u64, len: u64, base: u64, end: u64 },
}

/// Writes tensor bytes into a remote session's registered memory, synchronously: `Ok`
/// means the bytes are in place (Mooncake's terminal status), so completing the
/// reservation afterwards is safe.
pub trait DataPlane {
    /// Copies `src` to `dst_ptr` (an absolute address in `session`'s registered memory).
    fn write(&mut self, session: &str, dst_ptr: u64, src: &[u8]) -> Result<(), DataPlaneError>;
}

#[derive(Clone, Debug)]
struct Registered {
    base: u64,
    bytes: Vec<u8>,
    /// One-shot failures to report on the next writes, oldest first.
    failures: VecDeque<i64>,
}

/// One write that landed, for tests and oracles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteRecord {
    pub session: String,
    pub dst_ptr: u64,
    pub len: u64,
}

/// A data plane in one process: every session is a byte vector standing for a consumer's
/// registered slab at a fixed base address.
#[derive(Clone, Debug, Default)]
pub struct InProcessDataPlane {
    sessions: BTreeMap<String, Registered>,
    log: Vec<WriteRecord>,
}

impl InProcessDataPlane {
    /// An empty data plane (no session registered).
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `len` zeroed bytes at `base` as `session`'s memory, replacing any earlier
    /// registration (a restarted consumer registers a fresh slab).
    pub fn register(&mut self, session: &str, base: u64, len: usize) {
        self.sessions.insert(session.to_string(), Registered { base, bytes: vec![0; len], failures: VecDeque::new() });
    }

    /// Forgets `session`; later writes to it fail.
    pub fn unregister(&mut self, session: &str) -> bool {
        self.sessions.remove(session).is_some()
    }

    /// Makes the next write to `session` fail with `status` without copying anything
    /// (queued: several calls fail several writes).
    pub fn fail_next(&mut self, session: &str, status: i64) {
        if let Some(reg) = self.sessions.get_mut(session) {
            reg.failures.push_back(status);
        }
    }

    /// The `len` bytes at `ptr` of `session`'s memory, if registered and in range.
    pub fn read(&self, session: &str, ptr: u64, len: usize) -> Option<&[u8]> {
        let reg = self.sessions.get(session)?;
        let start = usize::try_from(ptr.checked_sub(reg.base)?).ok()?;
        reg.bytes.get(start..start.checked_add(len)?)
    }

    /// Every write that landed, in order.
    pub fn writes(&self) -> &[WriteRecord] {
        &self.log
    }
}

impl DataPlane for InProcessDataPlane {
    fn write(&mut self, session: &str, dst_ptr: u64, src: &[u8]) -> Result<(), DataPlaneError> {
        let reg = self
            .sessions
            .get_mut(session)
            .ok_or_else(|| DataPlaneError::UnknownSession { session: session.to_string() })?;
        if let Some(status) = reg.failures.pop_front() {
            return Err(DataPlaneError::Status { session: session.to_string(), status });
        }
        let len = src.len() as u64;
        if len == 0 {
            // An empty tensor (null `dst_ptr`): nothing to copy.
            self.log.push(WriteRecord { session: session.to_string(), dst_ptr, len });
            return Ok(());
        }
        let end = reg.base.saturating_add(reg.bytes.len() as u64);
        let range = dst_ptr
            .checked_sub(reg.base)
            .and_then(|start| usize::try_from(start).ok())
            .and_then(|start| Some(start..start.checked_add(src.len())?))
            .filter(|r| r.end <= reg.bytes.len());
        let Some(range) = range else {
            return Err(DataPlaneError::OutOfRange { session: session.to_string(), dst_ptr, len, base: reg.base, end });
        };
        reg.bytes[range].copy_from_slice(src);
        self.log.push(WriteRecord { session: session.to_string(), dst_ptr, len });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x7f00_0000_0000;

    #[test]
    fn writes_land_and_read_back() {
        let mut dp = InProcessDataPlane::new();
        dp.register("10.0.0.5:15417", BASE, 1024);
        dp.write("10.0.0.5:15417", BASE + 256, &[1, 2, 3]).unwrap();
        assert_eq!(dp.read("10.0.0.5:15417", BASE + 256, 4).unwrap(), &[1, 2, 3, 0]);
        assert_eq!(dp.writes(), &[WriteRecord { session: "10.0.0.5:15417".into(), dst_ptr: BASE + 256, len: 3 }]);
        assert!(dp.read("10.0.0.5:15417", BASE + 1023, 2).is_none());
        assert!(dp.read("10.0.0.5:15417", BASE - 1, 1).is_none());
    }

    #[test]
    fn out_of_range_and_unknown_sessions_are_refused() {
        let mut dp = InProcessDataPlane::new();
        dp.register("s", BASE, 512);
        let err = dp.write("s", BASE + 500, &[0; 16]).unwrap_err();
        assert!(matches!(err, DataPlaneError::OutOfRange { len: 16, .. }), "{err}");
        assert!(err.to_string().starts_with("Mooncake EC push to s failed"), "{err}");
        assert!(matches!(dp.write("s", BASE - 8, &[0; 4]), Err(DataPlaneError::OutOfRange { .. })));
        assert!(matches!(dp.write("s", u64::MAX, &[0; 4]), Err(DataPlaneError::OutOfRange { .. })));
        assert_eq!(dp.write("t", BASE, &[0]), Err(DataPlaneError::UnknownSession { session: "t".into() }));
        assert!(dp.writes().is_empty());
        assert!(dp.unregister("s"));
        assert!(matches!(dp.write("s", BASE, &[0]), Err(DataPlaneError::UnknownSession { .. })));
    }

    #[test]
    fn injected_failures_carry_the_reference_text_and_copy_nothing() {
        let mut dp = InProcessDataPlane::new();
        dp.register("10.0.0.5:15418", BASE, 64);
        dp.fail_next("10.0.0.5:15418", -1);
        let err = dp.write("10.0.0.5:15418", BASE, &[9; 8]).unwrap_err();
        assert_eq!(err.to_string(), "Mooncake EC push to 10.0.0.5:15418 failed with status -1");
        assert_eq!(dp.read("10.0.0.5:15418", BASE, 8).unwrap(), &[0; 8]);
        dp.write("10.0.0.5:15418", BASE, &[9; 8]).unwrap();
        assert_eq!(dp.read("10.0.0.5:15418", BASE, 8).unwrap(), &[9; 8]);
    }
}
