//! Collects the core's conformance events (`ctlplane_core::conformance`) of the machines
//! the calling thread drives.
//!
//! One process-wide subscriber, installed once, hands each event to the log the emitting
//! thread is recording into: a thread-local default subscriber per test would leave
//! callsites cached as uninterested when tests start and stop subscribers (`tracing`
//! caches a callsite's interest process-wide).

use ctlplane_core::conformance::TARGET;
use std::cell::RefCell;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, Once, PoisonError};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The calls, one line each: `machine call: detail`.
#[derive(Clone, Default)]
pub struct CallLog(Arc<Mutex<Vec<String>>>);

thread_local! {
    /// The log the current thread records into.
    static RECORDING: RefCell<Option<CallLog>> = const { RefCell::new(None) };
}

static INSTALL: Once = Once::new();

/// Puts the thread's previous log back, even when the recorded closure panics.
struct Restore(Option<CallLog>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        RECORDING.with(|r| *r.borrow_mut() = previous);
    }
}

impl CallLog {
    /// Runs `f` with this log recording the conformance events of the calling thread.
    pub fn record<T>(&self, f: impl FnOnce() -> T) -> T {
        INSTALL.call_once(|| {
            let layer = ToRecording.with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE));
            tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                .expect("no other global subscriber in this test binary");
            // Callsites registered before the subscriber was in place are asked again.
            tracing::callsite::rebuild_interest_cache();
        });
        let _restore = Restore(RECORDING.with(|r| r.borrow_mut().replace(self.clone())));
        f()
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    fn push(&self, line: String) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(line);
    }
}

/// The process-wide layer: each event to the emitting thread's log, if it records.
struct ToRecording;

#[derive(Default)]
struct Fields {
    machine: String,
    call: String,
    detail: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "machine" => self.machine = value.to_string(),
            "call" => self.call = value.to_string(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "detail" {
            self.detail = format!("{value:?}");
        }
    }
}

impl<S: Subscriber> Layer<S> for ToRecording {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let Some(log) = RECORDING.with(|r| r.borrow().clone()) else { return };
        let mut fields = Fields::default();
        event.record(&mut fields);
        log.push(format!("{} {}: {}", fields.machine, fields.call, fields.detail));
    }
}

/// Asserts that two logs are equal, printing both side by side from the first difference.
pub fn assert_same(what: &str, production: &[String], sim: &[String]) {
    if production == sim {
        return;
    }
    let first = production.iter().zip(sim).take_while(|(a, b)| a == b).count();
    let mut text = format!("{what}: the drivers' core calls differ from call {first}\n");
    for i in first.saturating_sub(3)..production.len().max(sim.len()).min(first + 12) {
        text.push_str(&format!(
            "  {i:3} production: {}\n      sim:        {}\n",
            production.get(i).map_or("-", String::as_str),
            sim.get(i).map_or("-", String::as_str)
        ));
    }
    panic!("{text}");
}
