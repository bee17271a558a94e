//! One host's ZeroMQ context: its name for traces, its inproc endpoints, and the
//! deterministic counters that number its sockets and connections.

use super::state::SocketState;
use super::ZmqError;
use ctlplane_core::time::Instant;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::rc::{Rc, Weak};
use std::time::Duration;

/// How long after `close` an inproc endpoint stays taken by default. libzmq releases it
/// on its reaper thread after `close` returns (race S4 of the P2P transport).
pub const DEFAULT_INPROC_RELEASE_LAG: Duration = Duration::from_millis(1);

/// Who holds an inproc name.
pub(crate) struct InprocBinding {
    pub socket: Weak<RefCell<SocketState>>,
    /// Set when the bound socket closed: the name is free from then on.
    pub released_at: Option<Instant>,
}

struct Inner {
    host: String,
    ip: Cell<Option<IpAddr>>,
    next_socket: Cell<u64>,
    next_fd: Cell<u32>,
    inproc: RefCell<BTreeMap<String, InprocBinding>>,
    release_lag: Cell<Duration>,
}

/// One per host; cheap to clone (an `Rc`).
#[derive(Clone)]
pub struct Context {
    inner: Rc<Inner>,
}

impl Context {
    /// The context of turmoil host `host` (its name, used in traces and to find its IP).
    pub fn new(host: &str) -> Context {
        Context {
            inner: Rc::new(Inner {
                host: host.to_string(),
                ip: Cell::new(None),
                next_socket: Cell::new(1),
                next_fd: Cell::new(10),
                inproc: RefCell::new(BTreeMap::new()),
                release_lag: Cell::new(DEFAULT_INPROC_RELEASE_LAG),
            }),
        }
    }

    /// The host name given to [`Context::new`].
    pub fn host(&self) -> &str {
        &self.inner.host
    }

    /// The host's own address (`turmoil::lookup(host)`); must be called inside the simulation.
    pub fn ip(&self) -> IpAddr {
        if let Some(ip) = self.inner.ip.get() {
            return ip;
        }
        let ip = turmoil::lookup(self.inner.host.as_str());
        self.inner.ip.set(Some(ip));
        ip
    }

    /// How long a closed socket's inproc endpoint stays taken.
    pub fn set_inproc_release_lag(&self, lag: Duration) {
        self.inner.release_lag.set(lag);
    }

    /// See [`set_inproc_release_lag`](Self::set_inproc_release_lag).
    pub fn inproc_release_lag(&self) -> Duration {
        self.inner.release_lag.get()
    }

    pub(crate) fn next_socket_id(&self) -> u64 {
        let id = self.inner.next_socket.get();
        self.inner.next_socket.set(id + 1);
        id
    }

    /// A file-descriptor-like number for monitor events, unique in this context.
    pub(crate) fn next_fd(&self) -> u32 {
        let fd = self.inner.next_fd.get();
        self.inner.next_fd.set(fd.wrapping_add(1));
        fd
    }

    /// Registers `name` for `socket`: EADDRINUSE while a live socket holds it or while a
    /// closed one's release has not happened yet.
    pub(crate) fn bind_inproc(&self, name: &str, socket: Weak<RefCell<SocketState>>) -> Result<(), ZmqError> {
        let now = crate::clock::now();
        let mut table = self.inner.inproc.borrow_mut();
        if let Some(b) = table.get(name) {
            let free = match b.released_at {
                Some(at) => now >= at,
                None => b.socket.upgrade().is_none(),
            };
            if !free {
                return Err(ZmqError::AddrInUse);
            }
        }
        table.insert(name.to_string(), InprocBinding { socket, released_at: None });
        Ok(())
    }

    /// The live socket bound at `name`, if any (a closing one no longer accepts peers).
    pub(crate) fn lookup_inproc(&self, name: &str) -> Option<Rc<RefCell<SocketState>>> {
        let table = self.inner.inproc.borrow();
        let b = table.get(name)?;
        if b.released_at.is_some() {
            return None;
        }
        b.socket.upgrade()
    }

    /// The socket bound at `name` closed: the name is free after the release lag.
    pub(crate) fn release_inproc(&self, name: &str) {
        let at = crate::clock::now() + self.inproc_release_lag();
        if let Some(b) = self.inner.inproc.borrow_mut().get_mut(name) {
            b.released_at = Some(at);
        }
    }
}
