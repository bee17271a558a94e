//! This module contains the simulated TCP/UDP networking types.
//!
//! They mirror [tokio::net](https://docs.rs/tokio/latest/tokio/net/) to provide
//! a high fidelity implementation.

use std::net::SocketAddr;
use std::{io, iter};

use crate::world::World;
use crate::ToSocketAddrs;

pub mod tcp;
pub use tcp::{listener::TcpListener, stream::TcpStream};

pub(crate) mod udp;
pub use udp::UdpSocket;

/// Performs a DNS resolution.
///
/// Must be called from within a turmoil simulation context.
pub async fn lookup_host<T>(host: T) -> io::Result<impl Iterator<Item = SocketAddr>>
where
    T: ToSocketAddrs,
{
    let addr = World::current(|world| host.to_socket_addr(&world.dns))?;
    Ok(iter::once(addr))
}

#[derive(Debug, Copy, Clone, Hash, Eq, PartialEq)]
pub(crate) struct SocketPair {
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
}

impl SocketPair {
    pub(crate) fn new(local: SocketAddr, remote: SocketAddr) -> SocketPair {
        assert_ne!(local, remote);
        SocketPair { local, remote }
    }
}

thread_local! {
    /// ctlplane patch: loopback messages sent and not yet delivered, on this thread's
    /// simulation.
    static LOOPBACK_IN_FLIGHT: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// ctlplane patch: one loopback message on its way. Each waits on a timer of a runtime
/// task that no wake hint knows, so while any is in flight no host is left out of a step.
/// Dropped when the message is delivered or its task is cancelled with its host.
pub(crate) struct LoopbackInFlight(());

impl LoopbackInFlight {
    pub(crate) fn new() -> Self {
        LOOPBACK_IN_FLIGHT.with(|n| n.set(n.get() + 1));
        LoopbackInFlight(())
    }
}

impl Drop for LoopbackInFlight {
    fn drop(&mut self) {
        LOOPBACK_IN_FLIGHT.with(|n| n.set(n.get().saturating_sub(1)));
    }
}

/// ctlplane patch: whether some loopback message is on its way.
pub(crate) fn loopback_in_flight() -> bool {
    LOOPBACK_IN_FLIGHT.with(|n| n.get() > 0)
}
