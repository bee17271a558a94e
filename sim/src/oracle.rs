//! Oracles: the safety properties checked while a run goes on, and the liveness properties
//! checked after the faults stop and a quiet period passes.
//!
//! A host or the engine that sees a property broken calls [`violate`]; the violation is
//! traced and collected, and the run's verdict is the list [`take`] returns.

use std::cell::RefCell;

use serde::Serialize;

/// One broken property.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// The oracle's name, e.g. `"write-owned"`; stable, used by the race catalogue.
    pub oracle: String,
    pub t_ns: u64,
    pub host: String,
    pub detail: String,
}

thread_local! {
    static VIOLATIONS: RefCell<Vec<Violation>> = const { RefCell::new(Vec::new()) };
}

/// Forget every violation; called by the engine before a run.
pub fn reset() {
    VIOLATIONS.with(|v| v.borrow_mut().clear());
}

/// Report a broken property on `host` at the current simulated time.
pub fn violate(oracle: &str, host: &str, detail: impl Into<String>) {
    violate_at(crate::clock::now().as_nanos(), oracle, host, detail);
}

/// Report a broken property at `t_ns` (for the engine, which is outside any host).
pub fn violate_at(t_ns: u64, oracle: &str, host: &str, detail: impl Into<String>) {
    let detail = detail.into();
    crate::trace::record_at(t_ns, host, "oracle.violation", &[("oracle", &oracle), ("detail", &detail)]);
    tracing::warn!(oracle, host, %detail, "oracle fired");
    VIOLATIONS.with(|v| {
        v.borrow_mut().push(Violation { oracle: oracle.to_string(), t_ns, host: host.to_string(), detail })
    });
}

/// Violations so far.
pub fn count() -> usize {
    VIOLATIONS.with(|v| v.borrow().len())
}

/// End the run's verdict and hand it over.
pub fn take() -> Vec<Violation> {
    VIOLATIONS.with(|v| std::mem::take(&mut *v.borrow_mut()))
}
