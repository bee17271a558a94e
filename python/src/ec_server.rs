//! `ctlplane.ec.ConsumerShardServer`: the native-book consumer shard server. Requests
//! are answered by the core's `ConsumerShard` on ctlplane's own thread, so no request
//! takes the GIL; Python reads the book between requests.

use crate::json;
use ctlplane_core::ec::defaults::{CONTROL_TIMEOUT, RESERVATION_TTL};
use ctlplane_core::ec::shard::ShardConfig;
use ctlplane_core::ec::wire::StatusResult;
use ctlplane_core::ec::DrainOutcome;
use ctlplane_zmq::ConsumerControlServer;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rand_core::OsRng;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// A consumer shard server whose reservation book and slab are ctlplane's core.
#[pyclass(module = "ctlplane._native", frozen)]
pub struct ConsumerShardServer {
    host: String,
    config: ShardConfig,
    server: Mutex<Option<ConsumerControlServer<OsRng>>>,
}

impl ConsumerShardServer {
    fn server(&self) -> MutexGuard<'_, Option<ConsumerControlServer<OsRng>>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn with_shard<T>(&self, f: impl FnOnce(&mut ctlplane_core::ec::ConsumerShard<OsRng>) -> T) -> PyResult<T> {
        match self.server().as_ref() {
            Some(server) => Ok(server.with_shard(f)),
            None => Err(not_running()),
        }
    }
}

#[pymethods]
impl ConsumerShardServer {
    #[new]
    #[pyo3(signature = (host, port, pool_bytes, *, pool_base=0, peer_ports=None, ttl_s=RESERVATION_TTL.as_secs_f64()))]
    fn new(
        host: String,
        port: u16,
        pool_bytes: u64,
        pool_base: u64,
        peer_ports: Option<Vec<u16>>,
        ttl_s: f64,
    ) -> PyResult<Self> {
        let ttl = Duration::try_from_secs_f64(ttl_s).map_err(|e| PyValueError::new_err(format!("ttl_s: {e}")))?;
        let mut config = ShardConfig::new(port, pool_bytes);
        config.slab_base = pool_base;
        config.book.ttl = ttl;
        if let Some(ports) = peer_ports.filter(|p| !p.is_empty()) {
            config.peer_ports = ports;
        }
        Ok(ConsumerShardServer { host, config, server: Mutex::new(None) })
    }

    /// Binds REP on `host:port` and PUSH on an ephemeral port, then serves on ctlplane's
    /// thread. Raises `RuntimeError` as the reference does when it cannot bind or start.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut slot = self.server();
            if slot.is_some() {
                return Ok(());
            }
            let server = ConsumerControlServer::start(&self.host, self.config.clone(), OsRng)
                .map_err(|e| PyRuntimeError::new_err(format!("{e}: {}", source_chain(&e))))?;
            *slot = Some(server);
            Ok(())
        })
    }

    /// Stops serving and releases both ports. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            let taken = self.server().take();
            if let Some(mut server) = taken {
                server.close();
            }
        });
    }

    /// Worker close with writers in flight (race S21): refuses new reserves, serves on
    /// while the core's drain waits up to `timeout_s` for the writers, then closes.
    /// Returns the writers left: 0 when the pool may be released, more when it must stay
    /// registered (a remote writer may still write into it). Not running: `RuntimeError`.
    #[pyo3(signature = (timeout_s=CONTROL_TIMEOUT.as_secs_f64()))]
    fn shutdown(&self, py: Python<'_>, timeout_s: f64) -> PyResult<usize> {
        let timeout =
            Duration::try_from_secs_f64(timeout_s).map_err(|e| PyValueError::new_err(format!("timeout_s: {e}")))?;
        py.detach(|| {
            let taken = self.server().take();
            let Some(mut server) = taken else {
                return Err(not_running());
            };
            Ok(match server.shutdown(timeout) {
                DrainOutcome::Released => 0,
                DrainOutcome::KeptPool { writers } => writers,
            })
        })
    }

    /// This shard's REP port.
    #[getter]
    fn port(&self) -> u16 {
        self.config.port
    }

    /// The REP ports of every shard of the replica (what `peers` answers).
    #[getter]
    fn peer_ports(&self) -> Vec<u16> {
        self.config.peer_ports.clone()
    }

    /// The PUSH port readiness events go out on; None until started.
    #[getter]
    fn event_port(&self) -> Option<u16> {
        self.server().as_ref().map(|s| s.event_port())
    }

    /// The status object of an active reservation (as the `status` op answers), or None.
    fn status<'py>(&self, py: Python<'py>, transfer_id: &str) -> PyResult<Bound<'py, PyAny>> {
        let status = self.with_shard(|shard| shard.book().status(transfer_id))?;
        match status {
            None => Ok(py.None().into_bound(py)),
            Some(status) => {
                let value = serde_json::to_value(StatusResult::from(&status))
                    .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
                json::to_py(py, &value)
            }
        }
    }

    /// The model loads a READY tensor: `(offset, nbytes)` in the pool (the region starts
    /// at `pool_base + offset`), or None when `transfer_id` is not READY for `mm_hash`.
    fn take(&self, transfer_id: &str, mm_hash: &str) -> PyResult<Option<(u64, u64)>> {
        let taken = self.with_shard(|shard| shard.take(transfer_id, mm_hash))?;
        Ok(taken.ok().map(|t| (t.view.region.offset, t.view.nbytes)))
    }

    /// Every transfer id that turned READY since the last call (completed writers and the
    /// followers they published), in the order their readiness events went out.
    fn drain_ready(&self) -> PyResult<Vec<String>> {
        self.with_shard(|shard| shard.drain_ready())
    }

    /// The encoder cache dropped `mm_hash`: its region may be reused.
    fn retire(&self, mm_hash: &str) -> PyResult<()> {
        self.with_shard(|shard| shard.retire(mm_hash))
    }

    /// The shard's counters.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.with_shard(|shard| shard.stats())?;
        let dict = PyDict::new(py);
        dict.set_item("requests", stats.requests)?;
        dict.set_item("error_replies", stats.error_replies)?;
        dict.set_item("malformed", stats.malformed)?;
        dict.set_item("events_queued", stats.events_queued)?;
        dict.set_item("events_sent", stats.events_sent)?;
        dict.set_item("events_dropped", stats.events_dropped)?;
        dict.set_item("reaps", stats.reaps)?;
        dict.set_item("ready_log_dropped", stats.ready_log_dropped)?;
        let census = self.with_shard(|shard| shard.book().census())?;
        dict.set_item("records", census.live)?;
        dict.set_item("tombstones", census.tombstones)?;
        dict.set_item("writer_owned", census.writer_owned)?;
        Ok(dict)
    }
}

/// The error of a call made after `stop` or `shutdown`.
fn not_running() -> PyErr {
    PyRuntimeError::new_err("the consumer shard server is not running")
}

/// `e`'s causes, for the exception text.
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut parts = Vec::new();
    let mut cause = e.source();
    while let Some(c) = cause {
        parts.push(c.to_string());
        cause = c.source();
    }
    parts.join(": ")
}
