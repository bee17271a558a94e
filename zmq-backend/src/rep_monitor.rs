//! The REP socket's connection log. libzmq refuses a request frame larger than
//! `ZMQ_MAXMSGSIZE` ([`crate::ServerOptions::max_request_bytes`]) by closing the sender's
//! connection before the frame is ever allocated: no reply can carry that refusal, so
//! this log is where it shows. A thread reads the REP's monitor and logs every dropped
//! client connection with the limit in force; it ends when the REP closes or when the
//! server stops it.

use crate::server::{SetupCause, StartError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// `ZMQ_EVENT_DISCONNECTED`.
const EVENT_DISCONNECTED: u16 = 0x0200;
/// `ZMQ_EVENT_MONITOR_STOPPED`: the monitored socket closed.
const EVENT_MONITOR_STOPPED: u16 = 0x0400;

/// The event number of a (v1) monitor message's first frame: `u16` event, `u32` value.
fn parse_event(frame: &[u8]) -> Option<u16> {
    let [lo, hi, _, _, _, _] = <[u8; 6]>::try_from(frame).ok()?;
    Some(u16::from_le_bytes([lo, hi]))
}

/// How often the watcher looks at its stop flag while no event arrives.
const STOP_CHECK_MS: i32 = 100;

/// The running watcher. Its PAIR holds the server's context, so the context can only
/// terminate (and libzmq only finish closing the REP's listener) once it has ended.
/// Dropped without [`RepMonitor::stop`] (a failed start), it only tells the watcher to end.
pub(crate) struct RepMonitor {
    thread: Option<JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl RepMonitor {
    /// Ends the watcher and waits for it; call after the REP is closed.
    pub(crate) fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RepMonitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// Starts logging `rep`'s dropped connections. The PAIR is connected before this returns,
/// so no event is missed.
pub(crate) fn spawn(
    ctx: &zmq::Context,
    rep: &zmq::Socket,
    port: u16,
    limit: Option<usize>,
) -> Result<RepMonitor, StartError> {
    let socket_err = |e| StartError::Setup(SetupCause::Socket(e));
    let endpoint = format!("inproc://ec-rep-monitor-{port}");
    rep.monitor(&endpoint, i32::from(EVENT_DISCONNECTED | EVENT_MONITOR_STOPPED)).map_err(socket_err)?;
    let pair = ctx.socket(zmq::PAIR).map_err(socket_err)?;
    pair.set_linger(0).map_err(socket_err)?;
    pair.set_rcvtimeo(STOP_CHECK_MS).map_err(socket_err)?;
    pair.connect(&endpoint).map_err(socket_err)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name(format!("ec-rep-monitor-{port}"))
        .spawn(move || watch(&pair, port, limit, &flag))
        .map_err(|e| StartError::Setup(SetupCause::Spawn(e)))?;
    Ok(RepMonitor { thread: Some(thread), stop })
}

fn watch(pair: &zmq::Socket, port: u16, limit: Option<usize>, stop: &AtomicBool) {
    loop {
        let frames = match pair.recv_multipart(0) {
            Ok(frames) => frames,
            Err(zmq::Error::EINTR) => continue,
            Err(zmq::Error::EAGAIN) if !stop.load(Ordering::Acquire) => continue,
            Err(_) => break,
        };
        let event = frames.first().and_then(|f| parse_event(f));
        let peer = frames.get(1).map(|a| String::from_utf8_lossy(a).into_owned()).unwrap_or_default();
        match event {
            Some(EVENT_MONITOR_STOPPED) => break,
            Some(EVENT_DISCONNECTED) => match limit {
                Some(limit) => tracing::warn!(
                    port,
                    %peer,
                    max_request_bytes = limit,
                    "EC control client connection closed (a request over {limit} bytes is refused this way)"
                ),
                None => tracing::info!(port, %peer, "EC control client connection closed"),
            },
            _ => {}
        }
    }
}
