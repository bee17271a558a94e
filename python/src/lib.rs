//! `ctlplane._native`: the PyO3 bindings behind the `ctlplane` Python package.
//!
//! The classes here only carry Python values to ctlplane's production drivers
//! (`ctlplane-zmq`) and back; every decision stays in `ctlplane-core`. Every call that can
//! wait on the network or a thread releases the GIL.

mod ec_callbacks;
mod ec_client;
mod ec_server;
mod json;
mod json_reader;
mod keys;
mod msgpack;
mod p2p;
mod utf8;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The `cancel` request as vLLM 0.33.0's `make_cancel_request` builds it, from the core's one
/// cancel encoder: `abandon` and `refresh` are present only when true.
#[pyfunction]
#[pyo3(signature = (transfer_id, reservation_id = "", *, abandon = false, refresh = false))]
fn make_cancel_request<'py>(
    py: Python<'py>,
    transfer_id: &str,
    reservation_id: &str,
    abandon: bool,
    refresh: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let frame = ctlplane_core::ec::requests::make_cancel_request(transfer_id, reservation_id, abandon, refresh);
    json_reader::loads(py, &frame).ok_or_else(|| PyValueError::new_err("cancel request did not encode as JSON"))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ec_client::ControlClient>()?;
    m.add_class::<ec_client::EventInbox>()?;
    m.add_class::<ec_server::ConsumerShardServer>()?;
    m.add_class::<ec_callbacks::ConsumerControlServer>()?;
    m.add_class::<p2p::ZmqTransport>()?;
    m.add_class::<p2p::ZmqConnection>()?;
    m.add_function(wrap_pyfunction!(make_cancel_request, m)?)?;
    Ok(())
}
