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
mod msgpack;
mod p2p;
mod utf8;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ec_client::ControlClient>()?;
    m.add_class::<ec_client::EventInbox>()?;
    m.add_class::<ec_server::ConsumerShardServer>()?;
    m.add_class::<ec_callbacks::ConsumerControlServer>()?;
    m.add_class::<p2p::ZmqTransport>()?;
    m.add_class::<p2p::ZmqConnection>()?;
    Ok(())
}
