//! `ctlplane.ec.ConsumerControlServer`: the callback mode, a literal drop-in for the
//! reference's server. ctlplane's serving loop (zmq-backend, deciding in the core) calls
//! the Python callbacks where the reference does; the GIL is taken only for those calls.

use crate::json;
use ctlplane_core::ec::callbacks::{CallbackConfig, ControlHandler, Outcome};
use ctlplane_zmq::{CallbackControlServer, ServerOptions};
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use serde_json::Value;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// The Python callbacks, called with the GIL taken.
struct PyCallbacks {
    reserve: Py<PyAny>,
    status: Py<PyAny>,
    complete: Py<PyAny>,
    cancel: Py<PyAny>,
    reap: Py<PyAny>,
    drain_ready: Option<Py<PyAny>>,
    dumps: Py<PyAny>,
}

impl PyCallbacks {
    /// Calls `f` and returns `json.dumps` of its result, or `str()` of what it raised.
    fn call(&self, f: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyAny>>) -> Outcome {
        Python::attach(|py| {
            let outcome = f(py).and_then(|result| {
                let text = self.dumps.bind(py).call1((result,))?;
                text.extract::<String>()
            });
            outcome.map(String::into_bytes).map_err(|e| exception_text(py, &e))
        })
    }
}

/// `str(exc)`, as the reference puts it in the error reply.
fn exception_text(py: Python<'_>, e: &PyErr) -> String {
    e.value(py).str().map(|s| s.to_string()).unwrap_or_else(|_| "EC control request failed".to_string())
}

impl ControlHandler for PyCallbacks {
    fn reserve(&mut self, item: &Value) -> Outcome {
        self.call(|py| self.reserve.bind(py).call1((json::to_py(py, item)?,)))
    }

    fn status(&mut self, transfer_id: &str) -> Outcome {
        self.call(|py| self.status.bind(py).call1((transfer_id,)))
    }

    fn complete(&mut self, transfer_id: &str, reservation_id: &str) -> Outcome {
        self.call(|py| self.complete.bind(py).call1((transfer_id, reservation_id)))
    }

    fn cancel(&mut self, transfer_id: &str, reservation_id: &str, abandon: bool, refresh: bool) -> Outcome {
        self.call(|py| self.cancel.bind(py).call1((transfer_id, reservation_id, abandon, refresh)))
    }

    fn reap(&mut self) -> Result<(), String> {
        Python::attach(|py| self.reap.bind(py).call0().map(drop).map_err(|e| exception_text(py, &e)))
    }

    fn drain_ready(&mut self) -> Outcome {
        match &self.drain_ready {
            Some(f) => self.call(|py| f.bind(py).call0()),
            None => Ok(b"[]".to_vec()),
        }
    }
}

/// The reference's `ConsumerControlServer`, served by ctlplane.
#[pyclass(module = "ctlplane._native", frozen)]
pub struct ConsumerControlServer {
    #[pyo3(get)]
    host: String,
    #[pyo3(get)]
    port: u16,
    #[pyo3(get)]
    peer_ports: Vec<u16>,
    callbacks: Mutex<Option<PyCallbacks>>,
    server: Mutex<Option<CallbackControlServer>>,
}

impl ConsumerControlServer {
    fn server(&self) -> MutexGuard<'_, Option<CallbackControlServer>> {
        self.server.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[pymethods]
impl ConsumerControlServer {
    #[new]
    #[pyo3(signature = (host, port, reserve, status, complete, cancel, reap, peer_ports=None, device=None, drain_ready=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        host: String,
        port: u16,
        reserve: Py<PyAny>,
        status: Py<PyAny>,
        complete: Py<PyAny>,
        cancel: Py<PyAny>,
        reap: Py<PyAny>,
        peer_ports: Option<Vec<u16>>,
        device: Option<Py<PyAny>>,
        drain_ready: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        // The device only pins the reference's thread to a CUDA device; the callbacks
        // pin themselves if they need to.
        let _ = device;
        let dumps = py.import("json")?.getattr("dumps")?.unbind();
        let peer_ports = peer_ports.filter(|p| !p.is_empty()).unwrap_or_else(|| vec![port]);
        let callbacks = PyCallbacks { reserve, status, complete, cancel, reap, drain_ready, dumps };
        Ok(ConsumerControlServer {
            host,
            port,
            peer_ports,
            callbacks: Mutex::new(Some(callbacks)),
            server: Mutex::new(None),
        })
    }

    /// The PUSH port readiness events go out on; None until started.
    #[getter]
    fn event_port(&self) -> Option<u16> {
        self.server().as_ref().map(|s| s.event_port())
    }

    /// Binds and serves on ctlplane's thread. `RuntimeError("EC Mooncake control channel
    /// failed to bind")` (its cause chained) as the reference when it cannot.
    fn start(&self, py: Python<'_>) -> PyResult<()> {
        let Some(callbacks) = self.callbacks.lock().unwrap_or_else(PoisonError::into_inner).take() else {
            return Err(PyRuntimeError::new_err("EC Mooncake control channel was already started"));
        };
        let mut config = CallbackConfig::new(self.port);
        config.peer_ports = self.peer_ports.clone();
        let started =
            py.detach(|| CallbackControlServer::start(&self.host, config, callbacks, ServerOptions::default()));
        match started {
            Ok(server) => {
                *self.server() = Some(server);
                Ok(())
            }
            Err(e) => {
                let err = PyRuntimeError::new_err(e.to_string());
                if let Some(cause) = std::error::Error::source(&e) {
                    err.set_cause(py, Some(PyRuntimeError::new_err(cause.to_string())));
                }
                Err(err)
            }
        }
    }

    /// Stops serving (after a request in flight) and frees both ports. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            let taken = self.server().take();
            if let Some(mut server) = taken {
                server.close();
            }
        });
    }
}
