//! Helpers shared by the loopback tests.
#![allow(dead_code)]

use ctlplane_core::ec::{DType, ShardConfig};
use ctlplane_zmq::{ConsumerControlServer, ReserveSpec};
use rand_core::OsRng;
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

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
/// it and its address.
pub fn raw_router(ctx: &zmq::Context) -> (zmq::Socket, String) {
    let router = raw_socket(ctx, zmq::ROUTER, 5_000);
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
