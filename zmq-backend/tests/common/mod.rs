//! Helpers shared by the loopback tests.
#![allow(dead_code)]

use ctlplane_core::ec::inbox::ReadyEvent;
use ctlplane_core::ec::{DType, ShardConfig};
use ctlplane_zmq::{ConsumerControlServer, EventInbox, ReserveSpec};
use rand_core::OsRng;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a test waits for something that takes milliseconds when all is well; long
/// enough for a loaded 2-core machine.
pub const PATIENCE: Duration = Duration::from_secs(15);

/// `n` consecutive free loopback ports. They come from 20000..30000, below Linux's
/// ephemeral range, so a PUSH bound to port 0 never takes one; the start depends on the
/// process id so that test binaries running side by side start apart, and every block is
/// probed before use in case another process holds it.
pub fn free_ports(n: u16) -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let pid = std::process::id();
    loop {
        let k = NEXT.fetch_add(1, Ordering::SeqCst);
        let base = 20_000 + ((pid.wrapping_mul(40).wrapping_add(k * 8)) % 9_980) as u16;
        let held: Vec<_> = (0..n).map_while(|i| TcpListener::bind(("127.0.0.1", base + i)).ok()).collect();
        if held.len() == usize::from(n) {
            return base;
        }
    }
}

/// A lone shard on a free port, `config` adjusted by `tweak`.
pub fn start_server(tweak: impl FnOnce(&mut ShardConfig)) -> ConsumerControlServer<OsRng> {
    let mut config = ShardConfig::new(free_ports(1), 1 << 20);
    tweak(&mut config);
    ConsumerControlServer::start("127.0.0.1", config, OsRng).unwrap()
}

/// A 64x128 float16 tensor (16 KiB).
pub fn spec(transfer_id: &str, mm_hash: &str) -> ReserveSpec {
    ReserveSpec {
        transfer_id: transfer_id.into(),
        mm_hash: mm_hash.into(),
        shape: vec![64, 128],
        dtype: DType::Float16,
    }
}

/// A raw socket of `kind` with a receive timeout, for playing a peer by hand.
pub fn raw_socket(ctx: &zmq::Context, kind: zmq::SocketType, rcvtimeo_ms: i32) -> zmq::Socket {
    let socket = ctx.socket(kind).unwrap();
    socket.set_rcvtimeo(rcvtimeo_ms).unwrap();
    socket.set_linger(0).unwrap();
    socket
}

/// A ROUTER bound to an ephemeral loopback port, playing a REP server by hand; returns
/// it and its address. It lingers: a scripted server's thread drops it right after its
/// last reply, and a linger-0 close could discard that reply before libzmq wrote it out.
pub fn raw_router(ctx: &zmq::Context) -> (zmq::Socket, String) {
    let router = raw_socket(ctx, zmq::ROUTER, 5_000);
    router.set_linger(5_000).unwrap();
    router.bind("tcp://127.0.0.1:0").unwrap();
    let addr = router.get_last_endpoint().unwrap().unwrap();
    (router, addr)
}

/// One REQ request as a ROUTER sees it: `(identity, body)`.
pub fn router_recv(router: &zmq::Socket) -> (Vec<u8>, Vec<u8>) {
    let mut parts = router.recv_multipart(0).unwrap();
    assert_eq!(parts.len(), 3, "identity, delimiter, body");
    let body = parts.pop().unwrap();
    (parts.swap_remove(0), body)
}

/// Answers the REQ peer `identity` with `body`.
pub fn router_send(router: &zmq::Socket, identity: &[u8], body: &[u8]) {
    router.send_multipart([identity, b"", body], 0).unwrap();
}

/// The workspace root.
pub fn workspace() -> std::path::PathBuf {
    std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The interpreter with pyzmq and msgspec: `$CTLPLANE_PYTHON`, else the workspace's
/// `.venv` that `scripts/test.sh` creates. A missing one fails loudly, never skips.
pub fn python() -> std::path::PathBuf {
    let path = std::env::var_os("CTLPLANE_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"));
    let ok = std::process::Command::new(&path)
        .args(["-c", "import zmq, msgspec"])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "no Python with pyzmq and msgspec at {}: run the tests through `scripts/test.sh`, which \
         provisions .venv (or set CTLPLANE_PYTHON)",
        path.display()
    );
    path
}

/// A child process whose stdout lines and stderr text are collected by threads; killed
/// when dropped.
pub struct Proc {
    pub child: std::process::Child,
    lines: std::sync::mpsc::Receiver<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Proc {
    pub fn spawn(mut cmd: std::process::Command) -> Proc {
        use std::io::{BufRead, BufReader, Read};
        use std::process::Stdio;
        let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut err = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Proc { child, lines, stderr }
    }

    /// The next stdout line, if one comes within `timeout` (None also at end of output).
    pub fn line(&self, timeout: std::time::Duration) -> Option<String> {
        self.lines.recv_timeout(timeout).ok()
    }

    /// Skips lines until `ready` (20 s at most: Python starts slowly on a loaded machine).
    pub fn wait_ready(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.line(left) {
                Some(line) if line == "ready" => return,
                Some(_) => {}
                None => panic!("no `ready` line; stderr:\n{}", self.stderr()),
            }
        }
    }

    /// What the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Sends `signal` (e.g. `-STOP`, `-TERM`) with `kill`.
    pub fn signal(&self, signal: &str) {
        let status = std::process::Command::new("kill").args([signal, &self.child.id().to_string()]).status().unwrap();
        assert!(status.success(), "kill {signal} failed");
    }

    /// Waits for the exit (`timeout` at most) and returns its status.
    pub fn wait_exit(&mut self, timeout: std::time::Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "process did not exit; stderr:\n{}", self.stderr());
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Drains until the inbox has subscribed (drains return at once, so this polls).
pub fn until_subscribed(inbox: &mut EventInbox) {
    let deadline = Instant::now() + PATIENCE;
    while !inbox.is_subscribed() {
        assert!(inbox.drain().events.is_empty(), "no events before the subscription");
        assert!(Instant::now() < deadline, "the inbox did not subscribe");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Drains until `n` readiness events have arrived; no more than `n` may come.
pub fn next_events(inbox: &mut EventInbox, n: usize) -> Vec<ReadyEvent> {
    let deadline = Instant::now() + PATIENCE;
    let mut events = Vec::new();
    while events.len() < n {
        events.extend(inbox.drain().events);
        assert!(Instant::now() < deadline, "only {} of {n} events arrived", events.len());
        std::thread::sleep(Duration::from_millis(2));
    }
    assert_eq!(events.len(), n, "{events:?}");
    events
}

/// A child process killed when the test ends.
pub struct Running(pub std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a server process and waits for its `ready` line.
pub fn start_until_ready(mut cmd: std::process::Command) -> Running {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut child = Running(cmd.stdout(Stdio::piped()).stderr(Stdio::null()).stdin(Stdio::piped()).spawn().unwrap());
    let stdout = child.0.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    loop {
        let line = rx.recv_timeout(std::time::Duration::from_secs(20)).expect("server printed `ready`");
        if line == "ready" {
            return child;
        }
    }
}
