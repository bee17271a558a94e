//! `CallbackControlServer`: a consumer control server whose reservation manager is a
//! [`ControlHandler`] (the Python callbacks of a vLLM consumer, through the bindings).
//!
//! It binds and serves exactly as [`crate::ConsumerControlServer`] does (same sockets,
//! multi-part and oversized frame handling, event flushing); the core's
//! [`CallbackServer`] decides every reply and event.

use crate::clock::Clock;
use crate::serve_loop::{self, Bound, LoopError};
use crate::server::{ServerOptions, SetupCause, StartError};
use ctlplane_core::ec::callbacks::{CallbackConfig, CallbackServer, ControlHandler};
use ctlplane_core::ec::config::zmq_path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

/// A running callback-mode server for one TP rank.
pub struct CallbackControlServer {
    port: u16,
    event_port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl CallbackControlServer {
    /// Binds `tcp://host:config.port` (REP) and an ephemeral PUSH port on `host`, and
    /// serves on a thread that calls `handler`.
    pub fn start<H: ControlHandler + Send + 'static>(
        host: &str,
        config: CallbackConfig,
        handler: H,
        options: ServerOptions,
    ) -> Result<Self, StartError> {
        let port = config.port;
        let endpoint = zmq_path("tcp", host, port);
        let stop = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = mpsc::sync_channel(1);
        let thread = {
            let (host, endpoint, stop, options) = (host.to_string(), endpoint.clone(), stop.clone(), options.clone());
            std::thread::Builder::new()
                .name(format!("ec-control-{port}"))
                .spawn(move || {
                    let bound = match serve_loop::bind(&host, &endpoint, port, &options) {
                        Ok(bound) => bound,
                        Err(e) => {
                            let _ = started_tx.send(Err(e));
                            return;
                        }
                    };
                    let clock = Clock::new();
                    let mut server = CallbackServer::new(config, clock.now());
                    server.set_event_port(bound.event_port);
                    let _ = started_tx.send(Ok(bound.event_port));
                    let mut handler = handler;
                    match run(&bound, &mut server, &mut handler, &clock, &stop) {
                        Ok(()) => tracing::debug!(port, "EC control channel closed"),
                        Err(error) => {
                            tracing::error!(port, %error, "EC control channel on port {port} stopped serving")
                        }
                    }
                    bound.close();
                })
                .map_err(|e| StartError::Setup(SetupCause::Spawn(e)))?
        };
        let (event_port, thread) = serve_loop::await_started(&started_rx, thread, &stop, options.start_timeout)?;
        tracing::info!("EC Mooncake control channel listening on {endpoint} (callback mode, events port {event_port})");
        Ok(CallbackControlServer { port, event_port, stop, thread: Some(thread) })
    }

    /// This rank's REP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The PUSH socket's ephemeral port.
    pub fn event_port(&self) -> u16 {
        self.event_port
    }

    /// Stops the loop and waits for the thread (up to one tick plus a request in
    /// flight, callbacks included). Idempotent.
    pub fn close(&mut self) {
        let Some(thread) = self.thread.take() else { return };
        self.stop.store(true, Ordering::Release);
        if thread.join().is_err() {
            tracing::error!(port = self.port, "EC control channel thread panicked");
        }
    }
}

impl Drop for CallbackControlServer {
    fn drop(&mut self) {
        self.close();
    }
}

/// Each turn: publish queued events until EAGAIN, reap if due, wait one tick for a
/// request, answer it.
fn run<H: ControlHandler>(
    bound: &Bound,
    server: &mut CallbackServer,
    handler: &mut H,
    clock: &Clock,
    stop: &AtomicBool,
) -> Result<(), LoopError> {
    while !stop.load(Ordering::Acquire) {
        while let Some(frame) = server.peek_event() {
            match bound.push.send(frame, zmq::DONTWAIT) {
                Ok(()) => server.confirm_sent(),
                Err(zmq::Error::EAGAIN) => break,
                Err(zmq::Error::EINTR) => continue,
                Err(e) => return Err(LoopError::Event(e)),
            }
        }
        server.handle_timeout(clock.now(), handler);
        let Some(frame) = serve_loop::recv_request(&bound.rep)? else { continue };
        let reply = server.handle_request(&frame, handler);
        serve_loop::send_retrying(&bound.rep, &reply, 0).map_err(LoopError::Reply)?;
    }
    Ok(())
}
