//! `ctlplane.ec.ControlClient` and `EventInbox` over the production drivers.

use crate::{json, json_reader, utf8};
use ctlplane_zmq::client::ClientError;
use pyo3::exceptions::{PyAssertionError, PyConnectionError, PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyList, PyString};
use std::sync::{Arc, Mutex, PoisonError};

/// The exception vLLM's callers see for each failure of a request: the server's error
/// text as `RuntimeError`, a timeout as `TimeoutError`, an undecodable reply as
/// `ValueError` (as `recv_json` raises), a reply that is not an object as
/// `AssertionError` (as the reference asserts).
pub fn client_error_to_py(e: ClientError) -> PyErr {
    match e {
        ClientError::Remote { message, .. } => PyRuntimeError::new_err(message),
        ClientError::Timeout { .. } => PyTimeoutError::new_err(e.to_string()),
        ClientError::Transport { .. } => PyConnectionError::new_err(e.to_string()),
        ClientError::MalformedReply { .. } => PyValueError::new_err(e.to_string()),
        ClientError::NotAnObject { .. } => PyAssertionError::new_err(e.to_string()),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// `json.loads`, looked up once.
static JSON_LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// Sends control requests through reusable REQ sockets, one per (calling thread,
/// address); a failed exchange discards its socket.
#[pyclass(module = "ctlplane._native", frozen)]
pub struct ControlClient {
    pub(crate) inner: Arc<ctlplane_zmq::ControlClient>,
}

#[pymethods]
impl ControlClient {
    #[new]
    fn new(timeout_ms: i64) -> Self {
        let timeout = u64::try_from(timeout_ms).unwrap_or(0);
        ControlClient { inner: Arc::new(ctlplane_zmq::ControlClient::new(timeout)) }
    }

    /// Sends `payload` (a dict, written as `json.dumps` writes it) to `addr` and returns
    /// the reply's `result`. Releases the GIL while waiting.
    fn request<'py>(
        &self,
        py: Python<'py>,
        addr: &Bound<'py, PyString>,
        payload: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let addr_text;
        let addr = match utf8::as_str(addr) {
            Some(addr) => addr,
            None => {
                addr_text = addr.to_cow()?.into_owned();
                &addr_text
            }
        };
        let mut frame = Vec::with_capacity(256);
        if json::write(&mut frame, payload).is_none() {
            let text: String = py.import("json")?.call_method1("dumps", (payload,))?.extract()?;
            frame = text.into_bytes();
        }
        let inner = &self.inner;
        let text = py.detach(|| inner.request_frame_text(addr, &frame)).map_err(client_error_to_py)?;
        if let Some(result) = json_reader::loads(py, &text) {
            return Ok(result);
        }
        let loads = JSON_LOADS.import(py, "json", "loads")?;
        match std::str::from_utf8(&text) {
            Ok(text) => loads.call1((PyString::new(py, text),)),
            Err(_) => loads.call1((PyBytes::new(py, &text),)),
        }
    }

    /// The control address of every shard of the consumer at `base_addr`, or None when it
    /// did not report them (not cached, so the next call asks again).
    fn discover_shards(&self, py: Python<'_>, base_addr: &str) -> Option<Vec<String>> {
        let inner = &self.inner;
        py.detach(|| inner.discover_shards(base_addr))
    }

    /// Closes every socket; later requests fail. Idempotent.
    fn close(&self, py: Python<'_>) {
        let inner = &self.inner;
        py.detach(|| inner.close());
    }
}

/// Receives a consumer's readiness events without blocking: subscription (one control
/// request per shard) runs on ctlplane's own thread, whatever executor is given.
#[pyclass(module = "ctlplane._native", frozen)]
pub struct EventInbox {
    client: Arc<ctlplane_zmq::ControlClient>,
    state: Mutex<InboxState>,
}

#[derive(Default)]
struct InboxState {
    inbox: Option<ctlplane_zmq::EventInbox>,
    closed: bool,
}

#[pymethods]
impl EventInbox {
    #[new]
    #[pyo3(signature = (client, executor=None))]
    fn new(client: &ControlClient, executor: Option<Bound<'_, PyAny>>) -> Self {
        let _ = executor;
        EventInbox { client: client.inner.clone(), state: Mutex::new(InboxState::default()) }
    }

    /// Every event queued so far, as dicts; never blocks. The first call only starts
    /// subscribing to the consumer at `base_addr`.
    fn drain<'py>(&self, py: Python<'py>, base_addr: &str) -> PyResult<Bound<'py, PyList>> {
        let frames = py.detach(|| {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let mut frames: Vec<Vec<u8>> = Vec::new();
            if state.closed {
                return frames;
            }
            let client = &self.client;
            let inbox = state.inbox.get_or_insert_with(|| ctlplane_zmq::EventInbox::new(client.clone(), base_addr));
            inbox.drain_each(|_, frame| frames.push(frame.to_vec()));
            frames
        });
        let list = PyList::empty(py);
        if frames.is_empty() {
            return Ok(list);
        }
        let loads = JSON_LOADS.import(py, "json", "loads")?;
        for frame in frames {
            // The frame decoded as a readiness event in the core; Python's own reader
            // rebuilds the dict exactly as the reference's `recv_json` does.
            list.append(loads.call1((PyBytes::new(py, &frame),))?)?;
        }
        Ok(list)
    }

    /// Shards subscribed to: 1 until subscribed, as the reference.
    #[getter]
    fn shard_count(&self) -> usize {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.inbox.as_ref().map_or(1, |i| i.shard_count())
    }

    /// Stops discovery and closes the subscription. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.closed = true;
            if let Some(mut inbox) = state.inbox.take() {
                inbox.close();
            }
        });
    }
}
