//! Sends a REQ refused because the socket still awaits the reply to its last request
//! (EFSM). The model answers them as libzmq does; it also keeps a record of each, because
//! a client that sends on a REQ in that state breaks the lockstep rule (ec-behaviour.md §5:
//! after a timeout or an error the socket is discarded and the next request uses a fresh
//! one), and the `req-lockstep` oracle reads the record after every step.

use std::cell::RefCell;

/// One refused send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// Simulated nanoseconds since the start of the run.
    pub t_ns: u64,
    /// The host whose socket refused the send.
    pub host: String,
    /// The socket's number in its context.
    pub sock: u64,
    /// The endpoints its pipes lead to.
    pub peers: String,
}

thread_local! {
    static REFUSALS: RefCell<Vec<Refusal>> = const { RefCell::new(Vec::new()) };
}

/// Records a REQ send refused with EFSM on `host`'s socket `sock` (connected to `peers`), now.
pub(crate) fn refused(host: &str, sock: u64, peers: &str) {
    let t_ns = crate::clock::now().as_nanos();
    crate::trace::record_at(t_ns, host, "zmq.req_efsm", &[("sock", &sock), ("peers", &peers)]);
    let peers = peers.to_string();
    REFUSALS.with(|r| r.borrow_mut().push(Refusal { t_ns, host: host.to_string(), sock, peers }));
}

/// The refusals recorded since the last call.
pub fn take() -> Vec<Refusal> {
    REFUSALS.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// Forgets every refusal (before a run).
pub fn reset() {
    REFUSALS.with(|r| r.borrow_mut().clear());
}
