//! Collects the core's conformance events (`ctlplane_core::conformance`) of the machines
//! the calling thread drives.

use ctlplane_core::conformance::TARGET;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// The calls, one line each: `machine call: detail`.
#[derive(Clone, Default)]
pub struct CallLog(Arc<Mutex<Vec<String>>>);

impl CallLog {
    /// Runs `f` with this log recording the conformance events of the calling thread.
    pub fn record<T>(&self, f: impl FnOnce() -> T) -> T {
        let layer = self.clone().with_filter(Targets::new().with_target(TARGET, tracing::Level::TRACE));
        let subscriber = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(subscriber, f)
    }

    /// Every line so far.
    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

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

impl<S: Subscriber> Layer<S> for CallLog {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let line = format!("{} {}: {}", fields.machine, fields.call, fields.detail);
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(line);
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
