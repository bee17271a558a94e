//! `ControlClient`: REQ/REP control requests to consumer shards.
//!
//! Sockets are kept per (thread, address), as the reference keeps them in thread-local
//! storage: two threads talking to one shard use two connections and never share a REQ
//! socket's lockstep. Whether a request needs a fresh socket, what an exchange's ending
//! (reply, timeout, transport error) means and whether its socket goes are decided by the
//! core's [`RequestSlot`]; this driver moves frames and carries out its [`Outcome`]. Shard
//! discovery and its success-only cache are the core's [`TopologyCache`].

use crate::clock::Clock;
use crate::curve::CurveClient;
use crate::requests::{self, Completion, ReserveSpec};
use crate::{lock, sockets};
use ctlplane_core::ec::pyjson;
use ctlplane_core::ec::reply_text;
use ctlplane_core::ec::request_slot::{Busy, Ending, Failure, Outcome, ReplyError, RequestSlot, SlotRegressions};
use ctlplane_core::ec::reserve_outcome::{self, ReserveOutcome};
use ctlplane_core::ec::topology::{self, TopologyCache, TopologyError};
use ctlplane_core::ec::wire::{self, WireError};
use serde_json::Value;
use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Mutex;
use std::thread::ThreadId;
use std::time::Duration;
use thiserror::Error;

/// Why a control request failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// No reply within the timeout; the socket was discarded.
    #[error("control request to {addr} timed out after {timeout_ms} ms")]
    Timeout { addr: String, timeout_ms: i32 },
    /// libzmq refused the exchange; the socket was discarded.
    #[error("control request to {addr} failed")]
    Transport {
        addr: String,
        #[source]
        source: zmq::Error,
    },
    /// The server answered `ok: false`; the text is the server's (`RuntimeError(error)`).
    #[error("{message}")]
    Remote { addr: String, message: String },
    /// The reply was not one frame of UTF-8 JSON (or answered no outstanding request); the
    /// socket was discarded.
    #[error("malformed control reply from {addr}")]
    MalformedReply { addr: String },
    /// The reply was JSON but not an object; the round trip completed, so the socket stays.
    #[error("control reply from {addr} is not a JSON object")]
    NotAnObject { addr: String },
    /// The result did not have the shape its op promises.
    #[error("malformed {op} result from {addr}: {detail}")]
    UnexpectedResult { addr: String, op: &'static str, detail: String },
    /// A reserve whose `prod(shape) * itemsize` overflows.
    #[error("tensor size of transfer {transfer_id} overflows")]
    SizeOverflow { transfer_id: String },
    /// The shards of a consumer could not be confirmed; nothing was sent.
    #[error(transparent)]
    Topology(#[from] TopologyError),
    /// A request was started while the socket still waited for a reply.
    #[error(transparent)]
    Busy(#[from] Busy),
    /// `close` was called.
    #[error("control client is closed")]
    Closed,
}

/// The producer's machine tells a refusal (the server ran the request and left nothing
/// behind) from every failure after which the server may have run it.
impl From<ClientError> for ReplyError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Remote { message, .. } => ReplyError::Refused(message),
            other => ReplyError::Unanswered(other.to_string()),
        }
    }
}

thread_local! {
    /// The calling thread's request buffer: libzmq copies a frame into its own message, so
    /// the bytes can be written into the same buffer again for the next request.
    static FRAME: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// One (thread, address)'s REQ socket and its lockstep state.
struct Conn {
    slot: RequestSlot,
    socket: Option<zmq::Socket>,
}

struct Conns {
    closed: bool,
    /// Idle connections per thread, by address (a thread talks to a handful of shards, so
    /// a short list beats hashing the address twice per request). A request takes its
    /// connection out of its slot and puts it back when done, so a panicking request drops
    /// (closes) its socket, leaving the slot empty, and `close` never waits for one.
    idle: HashMap<ThreadId, Vec<(String, Option<Conn>)>, ByThread>,
}

type ByThread = BuildHasherDefault<ThreadIdHash>;

/// Hashes a `ThreadId` (a `u64` counter that the process never repeats) with one
/// multiplication: the map is looked up twice per request, and nothing an untrusted peer
/// sends reaches its keys. Nothing iterates the map but `close`, whose order is invisible.
#[derive(Default)]
struct ThreadIdHash(u64);

impl Hasher for ThreadIdHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        // Fibonacci hashing: spreads consecutive ids over the table's high bits.
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// Sends control requests over reusable per-thread REQ sockets.
///
/// As with the reference's thread-local sockets, a thread that ends leaves its idle
/// sockets open until `close` (or the client's drop).
pub struct ControlClient {
    context: zmq::Context,
    timeout: Duration,
    timeout_ms: i32,
    clock: Clock,
    regressions: SlotRegressions,
    conns: Mutex<Conns>,
    topologies: Mutex<TopologyCache>,
    curve: Option<CurveClient>,
}

impl ControlClient {
    /// A client whose requests time out after `timeout_ms` (`control_timeout_ms`).
    pub fn new(timeout_ms: u64) -> Self {
        let timeout = Duration::from_millis(timeout_ms.max(1));
        ControlClient {
            context: zmq::Context::new(),
            timeout,
            timeout_ms: sockets::millis(timeout),
            clock: Clock::new(),
            regressions: SlotRegressions::default(),
            conns: Mutex::new(Conns { closed: false, idle: HashMap::default() }),
            topologies: Mutex::new(TopologyCache::default()),
            curve: None,
        }
    }

    /// The same client speaking CURVE to servers whose public key is `curve.server_key`
    /// (its REQ sockets, and the PULL of an [`crate::EventInbox`] over it).
    pub fn with_curve(mut self, curve: CurveClient) -> Self {
        self.curve = Some(curve);
        self
    }

    /// The same client with regression switches on its REQ slots (the race catalogue,
    /// `docs/races.md`; EC S9 keeps a timed-out socket for the next request).
    pub fn with_regressions(mut self, regressions: SlotRegressions) -> Self {
        self.regressions = regressions;
        self
    }

    /// The CURVE settings, if any.
    pub fn curve(&self) -> Option<&CurveClient> {
        self.curve.as_ref()
    }

    /// Sends `payload` (as Python's `json.dumps` would write it) and returns the reply's
    /// `result`.
    pub fn request(&self, addr: &str, payload: &Value) -> Result<Value, ClientError> {
        self.request_frame(addr, &pyjson::dumps(payload))
    }

    /// Sends one already-encoded request frame and returns the reply's `result`; an
    /// `ok: false` reply is [`ClientError::Remote`] with the server's text.
    pub fn request_frame(&self, addr: &str, frame: &[u8]) -> Result<Value, ClientError> {
        self.exchange(addr, frame, wire::decode_reply)
    }

    /// [`Self::request_frame`], the result handed back as its JSON text (see
    /// `ctlplane_core::ec::reply_text`) for a caller that builds its own value from it.
    pub fn request_frame_text(&self, addr: &str, frame: &[u8]) -> Result<Vec<u8>, ClientError> {
        let decode = |reply: &[u8]| reply_text::result_text(reply).map(|r| r.map(|text| text.into_owned()));
        self.exchange(addr, frame, decode)
    }

    /// One exchange whose reply `decode` reads into `Ok(result)` or `Err(the server's
    /// text)`; the latter is [`ClientError::Remote`].
    fn exchange<T>(
        &self,
        addr: &str,
        frame: &[u8],
        decode: impl FnOnce(&[u8]) -> Result<Result<T, String>, WireError>,
    ) -> Result<T, ClientError> {
        let thread = std::thread::current().id();
        let taken = {
            let mut conns = lock(&self.conns);
            if conns.closed {
                return Err(ClientError::Closed);
            }
            conns.slot(thread, addr).take()
        };
        let mut conn = taken.unwrap_or_else(|| Conn {
            slot: RequestSlot::with_regressions(self.timeout, self.regressions),
            socket: None,
        });
        let outcome = self.exchange_on(&mut conn, addr, frame, decode);
        let mut conns = lock(&self.conns);
        if !conns.closed {
            *conns.slot(thread, addr) = Some(conn);
        }
        outcome
    }

    /// One lockstep round trip on `conn`: the transport's ending goes to the slot, whose
    /// outcome says what the result is and whether the socket is closed.
    fn exchange_on<T>(
        &self,
        conn: &mut Conn,
        addr: &str,
        frame: &[u8],
        decode: impl FnOnce(&[u8]) -> Result<Result<T, String>, WireError>,
    ) -> Result<T, ClientError> {
        // Busy is unreachable while a request owns its connection; the slot is unchanged.
        let begin = conn.slot.begin(self.clock.now())?;
        let socket = match conn.socket.take() {
            Some(socket) if !begin.open => Ok(socket),
            _ => sockets::open_req(&self.context, addr, self.timeout_ms, self.curve.as_ref()),
        };
        let received = socket.as_ref().map_err(|e| *e).and_then(|socket| round_trip(socket, frame));
        let ending = match &received {
            Ok(Received::One(reply)) => Ending::Reply(reply),
            Ok(Received::Parts(frames)) => Ending::MultiPart(*frames),
            // RCVTIMEO or SNDTIMEO ran out.
            Err(zmq::Error::EAGAIN) => Ending::TimedOut,
            Err(e) => Ending::Transport(*e),
        };
        let Outcome { discard_socket, result } = conn.slot.finish(begin.generation, ending, decode);
        if !discard_socket {
            conn.socket = socket.ok();
        }
        // A discarded socket drops here: closed with linger 0, nothing waits for unsent data.
        result.map_err(|failure| self.client_error(addr, failure))
    }

    fn client_error(&self, addr: &str, failure: Failure<zmq::Error>) -> ClientError {
        let addr = addr.to_string();
        match failure {
            Failure::Remote(message) => ClientError::Remote { addr, message },
            Failure::NotAnObject(_) => ClientError::NotAnObject { addr },
            Failure::Malformed(_) | Failure::Stale => ClientError::MalformedReply { addr },
            Failure::TimedOut => ClientError::Timeout { addr, timeout_ms: self.timeout_ms },
            Failure::Transport(source) => ClientError::Transport { addr, source },
        }
    }

    /// The control address of every shard of the consumer at `base`, from the cache or a
    /// `peers` request. `None` (logged) if the consumer did not report a usable list;
    /// failures are not cached, so the next call asks again.
    pub fn discover_shards(&self, base: &str) -> Option<Vec<String>> {
        if let Some(shards) = lock(&self.topologies).get(base) {
            return Some(shards.to_vec());
        }
        let reply = self.request_frame(base, &requests::peers()).map_err(|e| e.to_string());
        match lock(&self.topologies).record(base, reply) {
            Ok(shards) => Some(shards),
            Err(error) => {
                tracing::warn!(%error, "EC Mooncake consumer at {base} did not report its shards");
                None
            }
        }
    }

    /// [`Self::discover_shards`] as the core's `topology::confirm` repeats it; callers
    /// never fall back to the base address alone.
    pub fn shards(&self, base: &str) -> Result<Vec<String>, TopologyError> {
        topology::confirm(base, || self.discover_shards(base))
    }

    /// Runs `f` on the client's confirmed topologies. The event inbox's discovery goes
    /// through here so that it shares `discover_shards`'s success-only cache, as the
    /// reference's inbox shares its client's.
    pub(crate) fn with_topologies<T>(&self, f: impl FnOnce(&mut TopologyCache) -> T) -> T {
        f(&mut lock(&self.topologies))
    }

    /// The shard's PUSH port.
    pub fn event_port(&self, addr: &str) -> Result<Value, ClientError> {
        self.request_frame(addr, &requests::event_port())
    }

    /// The status object of an active reservation, or `null`.
    pub fn status(&self, addr: &str, transfer_id: &str) -> Result<Value, ClientError> {
        self.request_frame(addr, &requests::status(transfer_id))
    }

    /// One `reserve`; the result object as the shard sent it.
    pub fn reserve(&self, addr: &str, spec: &ReserveSpec) -> Result<Value, ClientError> {
        let frame = requests::reserve(spec).ok_or_else(|| overflow(std::slice::from_ref(spec)))?;
        self.request_frame(addr, &frame)
    }

    /// One `reserve`, its result read into fields without building a JSON value (see
    /// [`reserve_outcome`]); a result without the fields a grant needs is
    /// [`ClientError::UnexpectedResult`].
    pub fn reserve_outcome(&self, addr: &str, spec: &ReserveSpec) -> Result<ReserveOutcome, ClientError> {
        let decoded = FRAME.with_borrow_mut(|frame| {
            requests::write_reserve(frame, spec).ok_or_else(|| overflow(std::slice::from_ref(spec)))?;
            self.exchange(addr, frame, reserve_outcome::decode_reserve_reply)
        })?;
        // The producer's size rule too: one reading of a reserve result for both.
        let nbytes = spec.nbytes().ok_or_else(|| overflow(std::slice::from_ref(spec)))?;
        decoded
            .and_then(|outcome| outcome.checked(nbytes, &spec.mm_hash))
            .map_err(|detail| unexpected(addr, "reserve", detail))
    }

    /// One `reserve_batch`: per spec, the reserve result or the shard's error text.
    pub fn reserve_batch(&self, addr: &str, specs: &[ReserveSpec]) -> Result<Vec<Result<Value, String>>, ClientError> {
        let frame = requests::reserve_batch(specs).ok_or_else(|| overflow(specs))?;
        let result = self.request_frame(addr, &frame)?;
        requests::parse_reserve_batch(&result, specs.len()).map_err(|detail| unexpected(addr, "reserve_batch", detail))
    }

    /// One `complete`.
    pub fn complete(&self, addr: &str, transfer_id: &str, reservation_id: &str) -> Result<Completion, ClientError> {
        let result = self.request_frame(addr, &requests::complete(transfer_id, reservation_id))?;
        Ok(requests::parse_completion(&result))
    }

    /// One `complete_batch` of `(transfer_id, reservation_id)` pairs, outcomes in order.
    pub fn complete_batch(&self, addr: &str, items: &[(&str, &str)]) -> Result<Vec<Completion>, ClientError> {
        let frame = requests::complete_batch(items.iter().copied());
        self.exchange(addr, &frame, |reply| requests::decode_complete_batch_reply(reply, items.len()))?
            .map_err(|detail| unexpected(addr, "complete_batch", detail))
    }

    /// One `cancel`; whether the shard cancelled anything.
    pub fn cancel(
        &self,
        addr: &str,
        transfer_id: &str,
        reservation_id: &str,
        abandon: bool,
        refresh: bool,
    ) -> Result<bool, ClientError> {
        let result =
            self.request_frame(addr, &requests::make_cancel_request(transfer_id, reservation_id, abandon, refresh))?;
        Ok(requests::parse_cancel(&result))
    }

    /// Closes every idle socket (linger 0) and refuses further requests; a request in
    /// flight on another thread closes its socket when it returns. Idempotent.
    pub fn close(&self) {
        let idle = {
            let mut conns = lock(&self.conns);
            conns.closed = true;
            std::mem::take(&mut conns.idle)
        };
        drop(idle);
    }

    /// The configured timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

impl Conns {
    /// The connection slot of (`thread`, `addr`), created empty on first use.
    fn slot(&mut self, thread: ThreadId, addr: &str) -> &mut Option<Conn> {
        let list = self.idle.entry(thread).or_default();
        let at = match list.iter().position(|(a, _)| a == addr) {
            Some(at) => at,
            None => {
                list.push((addr.to_string(), None));
                list.len() - 1
            }
        };
        &mut list[at].1
    }
}

/// What one receive read.
enum Received {
    /// A single-frame reply, in libzmq's buffer.
    One(zmq::Message),
    /// A reply of this many frames, read whole and dropped.
    Parts(usize),
}

/// Sends `frame` and reads the reply: a single frame is decoded from libzmq's buffer, a
/// multi-part reply is read whole (so the socket is back in lockstep) and counted.
fn round_trip(socket: &zmq::Socket, frame: &[u8]) -> zmq::Result<Received> {
    socket.send(frame, 0)?;
    let first = socket.recv_msg(0)?;
    if !first.get_more() {
        return Ok(Received::One(first));
    }
    let mut frames = 1;
    while socket.get_rcvmore()? {
        socket.recv_msg(0)?;
        frames += 1;
    }
    Ok(Received::Parts(frames))
}

fn overflow(specs: &[ReserveSpec]) -> ClientError {
    let transfer_id = specs.iter().find(|s| s.nbytes().is_none()).map(|s| s.transfer_id.clone()).unwrap_or_default();
    ClientError::SizeOverflow { transfer_id }
}

fn unexpected(addr: &str, op: &'static str, detail: String) -> ClientError {
    ClientError::UnexpectedResult { addr: addr.into(), op, detail }
}
