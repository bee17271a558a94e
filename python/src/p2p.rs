//! `ctlplane.p2p.ZmqTransport` and `ZmqConnection`: the P2P control transport of vLLM's
//! KV tiering, carried out by ctlplane's driver and decided by the core's registry.

use crate::msgpack;
use ctlplane_core::p2p::peer_check::UnknownMode;
use ctlplane_core::p2p::value::Writer;
use ctlplane_core::p2p::{AllowEntry, ConnId, PeerCheck, PeerCheckMode, TransportError};
use ctlplane_zmq::{P2pError, TransportOptions};
use pyo3::exceptions::{PyAssertionError, PyConnectionError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyList;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

thread_local! {
    /// The frame buffer of this thread's sends: a control message is written into it and
    /// copied into libzmq's message, so a send allocates nothing of its own.
    static FRAME: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

type Shared = Arc<Mutex<Option<ctlplane_zmq::ZmqTransport>>>;

fn lock(shared: &Shared) -> MutexGuard<'_, Option<ctlplane_zmq::ZmqTransport>> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The exception the reference raises for each transport failure (the one place that
/// maps them): a full send queue is `ConnectionError`, a duplicate live connect
/// `AssertionError`, a send on a dead connection `RuntimeError`.
pub fn p2p_error_to_py(e: P2pError) -> PyErr {
    match e {
        P2pError::QueueFull { .. } | P2pError::Refused(TransportError::QueueFull { .. }) => {
            PyConnectionError::new_err(e.to_string())
        }
        P2pError::Refused(TransportError::AlreadyExists(peer)) => {
            PyAssertionError::new_err(format!("ZmqConnection to {peer} already exists"))
        }
        P2pError::Refused(TransportError::InvalidPeerId(peer)) => {
            PyValueError::new_err(format!("invalid peer id {peer:?}: expected host:port"))
        }
        P2pError::Refused(refused) => PyRuntimeError::new_err(refused.to_string()),
        P2pError::Bind { .. } | P2pError::Endpoint(_) | P2pError::Open { .. } | P2pError::Wait(_) => {
            PyOSError::new_err(error_text(&e))
        }
        P2pError::Send { .. } => PyConnectionError::new_err(error_text(&e)),
    }
}

fn error_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

fn closed_error() -> PyErr {
    PyRuntimeError::new_err("ZmqTransport is closed")
}

/// One node's transport: a ROUTER for inbound peers and a DEALER per peer. All I/O
/// happens in the calls (`poll` above all); callers serialise them, as the reference's
/// contract asks.
#[pyclass(module = "ctlplane._native", frozen)]
pub struct ZmqTransport {
    shared: Shared,
    local_id: String,
}

impl ZmqTransport {
    fn connection(&self, peer_id: String, conn: ConnId) -> ZmqConnection {
        ZmqConnection { shared: self.shared.clone(), peer_id, conn, closed: AtomicBool::new(false) }
    }
}

#[pymethods]
impl ZmqTransport {
    /// Binds the ROUTER on `tcp://host:port`; `local_id` is every DEALER's identity,
    /// the id peers know this node by.
    /// `peer_check` (`"strict"`, `"allowlist"` or `"off"`) and `peer_allow` (`host:port` or
    /// CIDR entries) say which inbound identities are dialled back; the core decides
    /// (docs/peer-admission.md). The default is strict, as for `ctlplane p2p`.
    #[new]
    #[pyo3(signature = (local_id, host, port, *, peer_check = "strict", peer_allow = Vec::new()))]
    fn new(
        py: Python<'_>,
        local_id: String,
        host: String,
        port: u16,
        peer_check: &str,
        peer_allow: Vec<String>,
    ) -> PyResult<Self> {
        let mode: PeerCheckMode = peer_check.parse().map_err(|e: UnknownMode| PyValueError::new_err(e.to_string()))?;
        let allow = peer_allow
            .iter()
            .map(|entry| entry.parse::<AllowEntry>().map_err(|e| PyValueError::new_err(e.to_string())))
            .collect::<PyResult<Vec<_>>>()?;
        let options = TransportOptions { peer_check: PeerCheck { mode, allow }, ..TransportOptions::default() };
        let transport = py
            .detach(|| ctlplane_zmq::ZmqTransport::bind_as(&local_id, &host, port, options))
            .map_err(p2p_error_to_py)?;
        Ok(ZmqTransport { shared: Arc::new(Mutex::new(Some(transport))), local_id })
    }

    /// This node's id.
    #[getter]
    fn local_id(&self) -> &str {
        &self.local_id
    }

    /// The ROUTER's port (the one bound when 0 was asked for).
    #[getter]
    fn port(&self) -> PyResult<u16> {
        lock(&self.shared).as_ref().map(|t| t.port()).ok_or_else(closed_error)
    }

    /// Opens an outbound connection to `peer_id` (`host:port`); messages sent at once
    /// queue until the link is up. A dead registration is replaced; a live one raises
    /// `AssertionError`.
    fn connect(&self, py: Python<'_>, peer_id: String) -> PyResult<ZmqConnection> {
        let conn = py.detach(|| {
            let mut guard = lock(&self.shared);
            let t = guard.as_mut().ok_or(P2pError::Refused(TransportError::Closed))?;
            t.connect(&peer_id)?;
            t.conn_id(&peer_id).ok_or(P2pError::Refused(TransportError::NotConnected(peer_id.clone())))
        });
        let conn = conn.map_err(p2p_error_to_py)?;
        Ok(self.connection(peer_id, conn))
    }

    /// Processes all pending I/O; returns the newly accepted inbound connections, their
    /// first messages already in `recv()`.
    fn poll(&self, py: Python<'_>) -> Vec<ZmqConnection> {
        let accepted = py.detach(|| {
            let mut guard = lock(&self.shared);
            let Some(t) = guard.as_mut() else { return Vec::new() };
            let peers = t.poll();
            peers.into_iter().filter_map(|p| t.conn_id(&p).map(|c| (p, c))).collect::<Vec<_>>()
        });
        accepted.into_iter().map(|(peer, conn)| self.connection(peer, conn)).collect()
    }

    /// Closes every connection and the ROUTER. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            let taken = lock(&self.shared).take();
            if let Some(mut t) = taken {
                t.close();
            }
        });
    }
}

/// A message channel to one peer; messages are dicts.
#[pyclass(module = "ctlplane._native", frozen)]
pub struct ZmqConnection {
    shared: Shared,
    #[pyo3(get)]
    peer_id: String,
    /// The registry's handle of this connection: a later connection to the same peer is
    /// another one, and this object stays dead.
    conn: ConnId,
    closed: AtomicBool,
}

impl ZmqConnection {
    /// Runs `f` on the transport while this is still the peer's registered connection.
    fn with_own<T>(&self, f: impl FnOnce(&mut ctlplane_zmq::ZmqTransport) -> T) -> Option<T> {
        if self.closed.load(Ordering::Acquire) {
            return None;
        }
        let mut guard = lock(&self.shared);
        let t = guard.as_mut()?;
        (t.conn_id(&self.peer_id) == Some(self.conn)).then(|| f(t))
    }
}

#[pymethods]
impl ZmqConnection {
    /// False after `mark_dead()`, `close()`, a fatal monitor event or the transport's
    /// close.
    #[getter]
    fn alive(&self) -> bool {
        self.with_own(|t| t.is_alive(&self.peer_id)).unwrap_or(false)
    }

    /// Sends `msg` as one msgpack frame, never blocking. Raises `RuntimeError` on a dead
    /// connection and `ConnectionError` when the peer's queue is full.
    ///
    /// Keeps the GIL: the send never waits on the network (the DEALER is written without
    /// blocking), and the transport's lock is only ever held briefly by a `poll`.
    fn send(&self, msg: &Bound<'_, PyAny>) -> PyResult<()> {
        let outcome = FRAME.with_borrow_mut(|frame| {
            frame.clear();
            msgpack::write(&mut Writer::new(frame), msg)?;
            Ok::<_, PyErr>(if self.closed.load(Ordering::Acquire) {
                None
            } else {
                lock(&self.shared).as_mut().map(|t| t.send_frame_on(&self.peer_id, self.conn, frame))
            })
        })?;
        match outcome {
            Some(Err(P2pError::Refused(TransportError::SendOnClosed(_)))) | None => {
                Err(PyRuntimeError::new_err(format!("ZmqConnection: send on closed connection to {}", self.peer_id)))
            }
            Some(result) => result.map_err(p2p_error_to_py),
        }
    }

    /// Every message received since the last call (may be empty).
    fn recv<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let frames = self.with_own(|t| t.recv_frames(&self.peer_id)).unwrap_or_default();
        msgpack::decode_list(py, frames.iter())
    }

    /// Liveness only: the transport releases the sockets at its next poll, and `recv()`
    /// can still be drained until then.
    fn mark_dead(&self) {
        self.with_own(|t| t.mark_dead_conn(&self.peer_id, self.conn));
    }

    /// Releases the DEALER and its monitor now. Idempotent.
    fn close(&self, py: Python<'_>) {
        py.detach(|| {
            self.with_own(|t| t.close_peer(&self.peer_id));
            self.closed.store(true, Ordering::Release);
        });
    }

    fn __repr__(&self) -> String {
        format!("ZmqConnection(peer_id={:?})", self.peer_id)
    }
}
