//! The core's scheduler over real sockets on loopback (`SchedulerDriver`): readiness from
//! every shard of a TP2 consumer, releases by remote cancel, and the production driver
//! carrying out the core's retry and give-up policy against a shard that never answers.

mod common;

use common::{free_ports, raw_router, router_recv, router_send, spec};
use ctlplane_core::ec::scheduler::{ConsumerId, SchedulerConfig, SchedulerEvent};
use ctlplane_core::ec::PortPlan;
use ctlplane_zmq::{ConsumerServers, ControlClient, SchedulerDriver, ServerOptions};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Steps `scheduler` (draining with `drain`) until `f` has seen what it wants.
fn until(scheduler: &mut SchedulerDriver, drain: bool, mut f: impl FnMut(SchedulerEvent) -> bool) {
    let deadline = Instant::now() + common::PATIENCE;
    loop {
        if drain {
            scheduler.drain();
        } else {
            scheduler.wait(Duration::from_millis(5));
        }
        while let Some(event) = scheduler.poll_event() {
            if f(event) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "the scheduler never got there");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn subscribe(scheduler: &mut SchedulerDriver, consumer: ConsumerId) {
    let deadline = Instant::now() + common::PATIENCE;
    while !scheduler.is_subscribed(consumer) {
        assert!(scheduler.drain().is_empty(), "no events before the subscription");
        assert!(Instant::now() < deadline, "the scheduler did not subscribe");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn an_item_is_loaded_once_both_shards_announced_it_and_a_finished_request_releases_it() {
    let port = free_ports(2);
    let plan = PortPlan::new("127.0.0.1", i64::from(port), 0, 2).unwrap();
    let servers = ConsumerServers::start(&plan, 1 << 20, &ServerOptions::default(), |_| {}).unwrap();
    let client = Arc::new(ControlClient::new(5_000));
    let mut scheduler = SchedulerDriver::new(client.clone(), SchedulerConfig::default());
    let consumer = scheduler.add_consumer(&plan.control_addr());
    subscribe(&mut scheduler, consumer);
    assert_eq!(scheduler.core().shard_count(consumer), 2);

    let request = scheduler.request(consumer, [("t".to_string(), "h".to_string())]);
    let servers = servers.servers();
    let rank0 = servers[0].endpoint();
    let granted = client.reserve(rank0, &spec("t", "h")).unwrap();
    assert!(client.complete(rank0, "t", granted["reservation_id"].as_str().unwrap()).unwrap().became_ready);
    // One shard of two: nothing to load yet.
    let deadline = Instant::now() + Duration::from_millis(300);
    while Instant::now() < deadline {
        scheduler.drain();
        assert_eq!(scheduler.poll_event(), None);
        std::thread::sleep(Duration::from_millis(5));
    }
    let rank1 = servers[1].endpoint();
    let granted = client.reserve(rank1, &spec("t", "h")).unwrap();
    assert!(client.complete(rank1, "t", granted["reservation_id"].as_str().unwrap()).unwrap().became_ready);
    let mut seen = Vec::new();
    until(&mut scheduler, true, |event| {
        let load = matches!(event, SchedulerEvent::Load { .. });
        seen.push(event);
        load
    });
    assert!(
        matches!(&seen[..], [SchedulerEvent::Ready { .. }, SchedulerEvent::Load { request: r, .. }] if *r == request)
    );

    // Not loaded after all: the request finishes and the item is cancelled on every shard.
    scheduler.finish_request(request);
    until(&mut scheduler, false, |event| match event {
        SchedulerEvent::Released { transfer_id, shards, gave_up, .. } => {
            assert_eq!((transfer_id.as_str(), shards, gave_up.len()), ("t", 2, 0));
            true
        }
        _ => false,
    });
    for server in servers {
        assert_eq!(server.with_shard(|s| s.book().state_of("t").filter(|st| !st.is_terminal())), None);
    }
    scheduler.close();
    client.close();
}

#[test]
fn a_remote_cancel_tries_each_shard_twice_then_gives_up_on_it() {
    // Two shards played by hand: rank 0 answers, rank 1 takes requests and never replies.
    let ctx = zmq::Context::new();
    let (router0, base) = raw_router(&ctx);
    let (router1, shard1) = raw_router(&ctx);
    let port_of = |addr: &str| -> u16 { addr.rsplit_once(':').unwrap().1.parse().unwrap() };
    let (p0, p1) = (port_of(&base), port_of(&shard1));
    let rank0 = std::thread::spawn(move || {
        let mut asked = Vec::new();
        for reply in [format!(r#"{{"ports": [{p0}, {p1}]}}"#), r#"{"cancelled": true}"#.to_string()] {
            let (peer, body) = router_recv(&router0);
            asked.push(String::from_utf8(body).unwrap());
            router_send(&router0, &peer, format!(r#"{{"ok": true, "result": {reply}}}"#).as_bytes());
        }
        asked
    });
    let rank1 =
        std::thread::spawn(move || (0..2).map(|_| String::from_utf8(router_recv(&router1).1).unwrap()).collect());

    let client = Arc::new(ControlClient::new(200));
    let mut scheduler = SchedulerDriver::new(client.clone(), SchedulerConfig::default());
    let consumer = scheduler.add_consumer(&base);
    let request = scheduler.request(consumer, [("t".to_string(), "h".to_string())]);
    scheduler.finish_request(request);
    until(&mut scheduler, false, |event| match event {
        SchedulerEvent::Released { gave_up, shards, .. } => {
            assert_eq!((shards, gave_up), (2, vec![shard1.clone()]));
            true
        }
        _ => false,
    });
    let cancel = r#"{"op": "cancel", "transfer_id": "t", "reservation_id": ""}"#;
    assert_eq!(rank0.join().unwrap(), [r#"{"op": "peers"}"#, cancel]);
    let asked: Vec<String> = rank1.join().unwrap();
    assert_eq!(asked, [cancel, cancel], "two attempts on the silent shard");
    assert!(scheduler.is_quiet());
    scheduler.close();
    client.close();
}
