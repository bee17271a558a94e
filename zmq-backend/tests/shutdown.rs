//! A consumer rank's clean close over real sockets (race S21): the server serves on while
//! its writers drain, then closes, and says whether the pool may be released.

mod common;

use common::start_server;
use ctlplane_core::ec::DrainOutcome;
use ctlplane_zmq::{ClientError, ControlClient};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn reserve(transfer_id: &str) -> Value {
    json!({"op": "reserve", "transfer_id": transfer_id, "mm_hash": format!("h-{transfer_id}"), "nbytes": 16384,
           "shape": [64, 128], "dtype": "float16"})
}

/// A fresh writer's reservation id.
fn writer(client: &ControlClient, endpoint: &str, transfer_id: &str) -> String {
    let reply = client.request(endpoint, &reserve(transfer_id)).expect("reserve answered");
    assert_eq!(reply["write"], true, "{reply}");
    reply["reservation_id"].as_str().expect("a reservation id").to_string()
}

#[test]
fn a_writer_that_completes_during_the_wait_lets_the_pool_be_released() {
    let mut server = start_server(|_| {});
    let endpoint = server.endpoint().to_string();
    let client = ControlClient::new(5_000);
    let rid = writer(&client, &endpoint, "t1");

    let completer = std::thread::spawn(move || {
        let client = ControlClient::new(5_000);
        // A repeated reserve of the live writer is a duplicate until the book shuts down,
        // then refused: the sign that the close is waiting.
        let give_up = Instant::now() + Duration::from_secs(20);
        loop {
            match client.request(&endpoint, &reserve("t1")) {
                Err(ClientError::Remote { message, .. }) => {
                    assert!(message.contains("shutting down"), "{message}");
                    break;
                }
                reply => assert!(reply.is_ok(), "{reply:?}"),
            }
            assert!(Instant::now() < give_up, "the book never began its shutdown");
            std::thread::sleep(Duration::from_millis(2));
        }
        let done = client
            .request(&endpoint, &json!({"op": "complete", "transfer_id": "t1", "reservation_id": rid}))
            .expect("complete answered");
        assert_eq!(done["completed"], true, "{done}");
    });

    let outcome = server.shutdown(Duration::from_secs(30));
    completer.join().expect("the completer's checks hold");
    assert_eq!(outcome, DrainOutcome::Released);
    assert!(!server.is_serving());
}

#[test]
fn a_writer_still_in_flight_at_the_timeout_keeps_the_pool_registered() {
    let mut server = start_server(|_| {});
    let client = ControlClient::new(5_000);
    writer(&client, server.endpoint(), "t1");
    writer(&client, server.endpoint(), "t2");
    let started = Instant::now();
    let outcome = server.shutdown(Duration::from_millis(200));
    assert!(started.elapsed() >= Duration::from_millis(200), "closed before the wait ran out");
    assert_eq!(outcome, DrainOutcome::KeptPool { writers: 2 });
    assert!(!server.is_serving());
}

#[test]
fn a_rank_with_no_writer_closes_at_once_and_releases() {
    let mut server = start_server(|_| {});
    let started = Instant::now();
    assert_eq!(server.shutdown(Duration::from_secs(30)), DrainOutcome::Released);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!server.is_serving());
}
