//! `ctlplane ec watch`: print a consumer's readiness events as they arrive.

use crate::security::ClientCurve;
use clap::Args;
use ctlplane_core::ec::defaults::CONTROL_TIMEOUT_MS;
use ctlplane_zmq::{ControlClient, EventInbox};
use std::error::Error;
use std::io::{ErrorKind, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Args)]
pub struct WatchArgs {
    /// The consumer's base control address (rank 0), e.g. tcp://127.0.0.1:19019.
    #[arg(long)]
    addr: String,
    /// Reply timeout of the discovery requests (`control_timeout_ms`).
    #[arg(long, default_value_t = CONTROL_TIMEOUT_MS)]
    timeout_ms: u64,
    /// Exit after printing this many events.
    #[arg(long)]
    count: Option<u64>,
    #[command(flatten)]
    curve: ClientCurve,
}

/// Pause between drains that found nothing: the inbox never blocks, so this is the
/// watcher's only wait.
const IDLE: Duration = Duration::from_millis(5);

/// Subscribes to every shard through an [`EventInbox`] (so it sees what a consumer's
/// scheduler would) and prints each readiness event, one JSON line each, exactly as the
/// shard sent it, until SIGINT/SIGTERM or `--count`.
///
/// ZMQ's PUSH deals events round-robin among connected PULL sockets: a watcher next to a
/// real scheduler sees only its share.
pub fn run(args: WatchArgs) -> Result<ExitCode, Box<dyn Error>> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::Release))?;
    }
    let client = Arc::new(args.curve.apply(ControlClient::new(args.timeout_ms))?);
    let mut inbox = EventInbox::new(client.clone(), &args.addr);
    let limit = args.count.unwrap_or(u64::MAX);
    let mut printed = 0u64;
    let mut out = std::io::stdout().lock();
    let mut failure = None;
    while !stop.load(Ordering::Acquire) && printed < limit && failure.is_none() {
        let counts = inbox.drain_each(|_, frame| {
            if printed >= limit || failure.is_some() {
                return;
            }
            match print_line(&mut out, frame) {
                Ok(()) => printed += 1,
                Err(e) => failure = Some(e),
            }
        });
        if let Err(e) = out.flush() {
            failure.get_or_insert(e);
        }
        if counts.events == 0 {
            std::thread::sleep(IDLE);
        }
    }
    inbox.close();
    client.close();
    match failure {
        // A reader that went away (`| head`) ends the watch, like any filter.
        Some(e) if e.kind() == ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        Some(e) => Err(e.into()),
        None => Ok(ExitCode::SUCCESS),
    }
}

/// The frame as one line. A decoded event is valid JSON, where a raw CR or LF can only be
/// whitespace between tokens, so turning them into spaces keeps it the same JSON.
fn print_line(out: &mut impl Write, frame: &[u8]) -> std::io::Result<()> {
    let line: Vec<u8> = frame.iter().map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }).collect();
    out.write_all(&line)?;
    out.write_all(b"\n")
}
