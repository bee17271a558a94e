//! The REQ client's exchanges (`RequestSlot`): a reply, an error reply, a reply that is
//! not an object, garbage, silence (a timeout; the late reply is lost with its socket), a
//! multi-part reply, an endpoint that cannot be opened, and a reply on a fresh socket.
//! Production: `ctlplane_zmq::ControlClient` against a scripted ROUTER on loopback. The
//! simulator: `ctlplane_sim::hosts::client::ControlClient` against the same script on a
//! simulated host.

use super::call_log::{assert_same, CallLog};
use std::time::Duration;

/// Long enough that a reply on a loaded machine never times out; only the silent step
/// waits it out.
const TIMEOUT: Duration = Duration::from_secs(3);
/// What the scripted ROUTER waits for a request at most (a hung run fails, not hangs).
const SCRIPT_WAIT: Duration = Duration::from_secs(30);
/// An endpoint libzmq refuses to connect to (and the model too).
const UNOPENABLE: &str = "tcp://127.0.0.1:notaport";

/// What the scripted server does with one request.
#[derive(Clone, Copy, Debug)]
enum Step {
    /// Answers with these frames.
    Reply(&'static [&'static [u8]]),
    /// Never answers (answered late, after the next request arrived).
    Silent,
    /// The request goes to an endpoint that cannot be opened: the server never sees it.
    Unopenable,
}

const SCRIPT: &[Step] = &[
    Step::Reply(&[br#"{"ok": true, "result": 1}"#]),
    Step::Reply(&[br#"{"ok": false, "error": "boom"}"#]),
    Step::Reply(&[b"[1, 2]"]),
    Step::Reply(&[b"{not json"]),
    Step::Silent,
    Step::Reply(&[b"{\"ok\": true}", b"second frame"]),
    Step::Unopenable,
    Step::Reply(&[br#"{"ok": true, "result": null}"#]),
];

fn request(i: usize) -> Vec<u8> {
    format!(r#"{{"op": "status", "transfer_id": "t{i}"}}"#).into_bytes()
}

/// The server's script over any ROUTER: for each request it sees (`[identity, "", body]`),
/// the frames to send back, including a late answer to a silent request's identity.
struct Server {
    steps: std::vec::IntoIter<Step>,
    silent: Option<Vec<u8>>,
}

impl Server {
    fn new() -> Self {
        let steps: Vec<Step> = SCRIPT.iter().copied().filter(|s| !matches!(s, Step::Unopenable)).collect();
        Server { steps: steps.into_iter(), silent: None }
    }

    /// Requests the server still expects.
    fn expects(&self) -> usize {
        self.steps.len()
    }

    /// What to send for the request `msg`, in order.
    fn answer(&mut self, msg: Vec<Vec<u8>>) -> Vec<Vec<Vec<u8>>> {
        let step = self.steps.next();
        let [identity, empty, _body] = msg.as_slice() else { panic!("not a REQ envelope: {msg:?}") };
        assert!(empty.is_empty(), "not a REQ envelope: {msg:?}");
        let mut out = Vec::new();
        if let Some(late) = self.silent.take() {
            // The silent request's socket was discarded: this reply has nowhere to go.
            out.push(vec![late, Vec::new(), br#"{"ok": true, "result": "late"}"#.to_vec()]);
        }
        match step {
            Some(Step::Reply(frames)) => {
                let mut reply = vec![identity.clone(), Vec::new()];
                reply.extend(frames.iter().map(|f| f.to_vec()));
                out.push(reply);
            }
            Some(Step::Silent) => self.silent = Some(identity.clone()),
            Some(Step::Unopenable) | None => panic!("a request the script does not expect"),
        }
        out
    }
}

fn production() -> Vec<String> {
    let ctx = zmq::Context::new();
    let router = ctx.socket(zmq::ROUTER).expect("ROUTER");
    router.set_linger(0).expect("linger");
    router.set_rcvtimeo(i32::try_from(SCRIPT_WAIT.as_millis()).unwrap_or(i32::MAX)).expect("rcvtimeo");
    router.bind("tcp://127.0.0.1:0").expect("bind");
    let endpoint = router.get_last_endpoint().expect("endpoint").expect("utf-8 endpoint");
    // The thread hands its ROUTER back instead of dropping it: closed with linger 0 right
    // after the last send, it could discard that reply before libzmq wrote it out.
    let server = std::thread::spawn(move || {
        let mut script = Server::new();
        while script.expects() > 0 {
            let msg = router.recv_multipart(0).map_err(|e| format!("no request within {SCRIPT_WAIT:?}: {e}"))?;
            for out in script.answer(msg) {
                router.send_multipart(out, 0).map_err(|e| e.to_string())?;
            }
        }
        Ok::<zmq::Socket, String>(router)
    });
    let log = CallLog::default();
    log.record(|| {
        let client = ctlplane_zmq::ControlClient::new(u64::try_from(TIMEOUT.as_millis()).unwrap_or(u64::MAX));
        for (i, step) in SCRIPT.iter().enumerate() {
            let addr = if matches!(step, Step::Unopenable) { UNOPENABLE } else { endpoint.as_str() };
            let _ = client.request_frame(addr, &request(i));
        }
        client.close();
    });
    // The client is done: the ROUTER may close now.
    let _router = server.join().expect("server thread").expect("the scripted server ran its script");
    log.lines()
}

fn simulated() -> Vec<String> {
    use ctlplane_sim::zmq::{Context, Socket, SocketOptions, SocketType};
    let mut sim = super::scripted_world();
    sim.host("server", || async {
        let ctx = Context::new("server");
        let router = Socket::new(&ctx, SocketType::Router, SocketOptions::default());
        router.bind("tcp://0.0.0.0:5555").await?;
        let mut script = Server::new();
        while script.expects() > 0 {
            let msg = router.recv().await?;
            for out in script.answer(msg) {
                router.send(out).await?;
            }
        }
        std::future::pending::<()>().await;
        Ok(())
    });
    let log = CallLog::default();
    sim.client("client", async {
        let ctx = Context::new("client");
        let client = ctlplane_sim::hosts::client::ControlClient::new(&ctx, "client", TIMEOUT);
        for (i, step) in SCRIPT.iter().enumerate() {
            let addr = if matches!(step, Step::Unopenable) { UNOPENABLE } else { "tcp://server:5555" };
            let _ = client.request(addr, request(i)).await;
        }
        Ok(())
    });
    log.record(|| sim.run()).expect("the simulated run");
    log.lines()
}

#[test]
fn the_req_client_makes_the_same_slot_calls_in_production_and_in_the_simulator() {
    let production = production();
    let sim = simulated();
    // Each request begins and finishes once.
    assert_eq!(production.len(), 2 * SCRIPT.len(), "{production:#?}");
    assert_same("REQ client", &production, &sim);
}
