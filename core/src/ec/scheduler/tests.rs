use super::*;
use crate::ec::defaults::PUSH_WAIT_TIMEOUT;
use serde_json::json;

const BASE: &str = "tcp://h:19019";
const T0: Instant = Instant::from_secs(10);

fn ev(tid: &str, shard: i64) -> Vec<u8> {
    format!(
        r#"{{"transfer_id": "{tid}", "mm_hash": "h", "ready": true, "nbytes": 16, "shape": [8], "dtype": "float16", "shard": {shard}}}"#
    )
    .into_bytes()
}

fn events(s: &mut Scheduler) -> Vec<SchedulerEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

/// Answers every queued request with `reply(addr, frame)`; returns what was asked.
fn serve(s: &mut Scheduler, mut reply: impl FnMut(&str, &str) -> Result<Value, String>) -> Vec<(String, String)> {
    let mut asked = Vec::new();
    while let Some(t) = s.poll_transmit() {
        let frame = String::from_utf8(t.frame).unwrap();
        let r = reply(&t.addr, &frame);
        asked.push((t.addr, frame));
        s.handle_reply(t.token, r, T0);
    }
    asked
}

/// A consumer of two shards (19019, 19020) the scheduler subscribed to.
fn subscribed() -> (Scheduler, ConsumerId) {
    let mut s = Scheduler::default();
    let c = s.add_consumer(BASE);
    s.handle_drain(T0);
    serve(&mut s, |addr, frame| match (addr, frame) {
        (_, r#"{"op": "peers"}"#) => Ok(json!({"ports": [19019, 19020]})),
        ("tcp://h:19019", _) => Ok(json!(20001)),
        _ => Ok(json!(20002)),
    });
    assert_eq!(
        events(&mut s),
        [SchedulerEvent::Subscribe { consumer: c, endpoints: vec!["tcp://h:20001".into(), "tcp://h:20002".into()] }]
    );
    (s, c)
}

#[test]
fn the_inbox_shard_count_reaches_readiness() {
    let (mut s, c) = subscribed();
    assert_eq!(s.shard_count(c), 2);
    let r = s.request(c, [("t".to_string(), "h".to_string())], T0);
    assert_eq!(s.handle_event_frame(c, &ev("t", 19019), T0), Ok(Some(EventFate::Partial)));
    assert_eq!(s.handle_event_frame(c, &ev("t", 19019), T0), Ok(Some(EventFate::Repeat)));
    assert!(events(&mut s).is_empty(), "one shard of two says nothing");
    assert_eq!(s.handle_event_frame(c, &ev("t", 19020), T0), Ok(Some(EventFate::Accepted)));
    assert_eq!(
        events(&mut s),
        [
            SchedulerEvent::Ready { consumer: c, transfer_id: "t".into(), mm_hash: "h".into() },
            SchedulerEvent::Load { consumer: c, request: r, transfer_id: "t".into(), mm_hash: "h".into() },
        ]
    );
    assert!(s.handle_event_frame(c, b"[]", T0).is_err(), "a bad frame costs itself only");
}

#[test]
fn a_loaded_item_finishes_its_request_and_is_retired_not_cancelled() {
    let mut s = Scheduler::default();
    let c = s.add_consumer(BASE);
    let r = s.request(c, [("t".to_string(), "h".to_string())], T0);
    s.handle_event_frame(c, &ev("t", 1), T0).unwrap();
    assert_eq!(events(&mut s).len(), 2, "ready, load");
    s.report_load(c, "t", true, T0);
    assert_eq!(
        events(&mut s),
        [
            SchedulerEvent::ItemDone { consumer: c, request: r, transfer_id: "t".into(), fate: ItemFate::Loaded },
            SchedulerEvent::RequestDone { consumer: c, request: r },
            SchedulerEvent::Retire { consumer: c, mm_hash: "h".into() },
        ]
    );
    assert_eq!(s.poll_transmit(), None, "a loaded item is not cancelled remotely");
    s.report_load(c, "t", true, T0);
    assert!(events(&mut s).is_empty(), "a repeated report is ignored");
    assert_eq!(s.active_requests(), 0);
}

#[test]
fn an_item_never_announced_fails_unavailable_and_is_cancelled_remotely() {
    let mut s = Scheduler::default();
    let c = s.add_consumer(BASE);
    let r = s.request(c, [("t".to_string(), "h".to_string())], T0);
    assert_eq!(s.poll_timeout(), Some(T0 + PUSH_WAIT_TIMEOUT));
    s.handle_timeout(T0 + PUSH_WAIT_TIMEOUT);
    assert_eq!(
        events(&mut s),
        [
            SchedulerEvent::ItemDone { consumer: c, request: r, transfer_id: "t".into(), fate: ItemFate::Unavailable },
            SchedulerEvent::RequestDone { consumer: c, request: r },
        ]
    );
    // No topology yet: peers first, then the cancel on every shard, in order.
    let asked = serve(&mut s, |_, frame| match frame {
        r#"{"op": "peers"}"# => Ok(json!({"ports": [19019, 19020]})),
        _ => Ok(json!({"cancelled": true})),
    });
    let cancel = r#"{"op": "cancel", "transfer_id": "t", "reservation_id": ""}"#;
    assert_eq!(
        asked,
        [
            (BASE.to_string(), r#"{"op": "peers"}"#.to_string()),
            (BASE.to_string(), cancel.to_string()),
            ("tcp://h:19020".to_string(), cancel.to_string()),
        ]
    );
    assert_eq!(
        events(&mut s),
        [SchedulerEvent::Released { consumer: c, transfer_id: "t".into(), shards: 2, gave_up: vec![] }]
    );
    assert!(s.is_quiet());
}

#[test]
fn a_remote_cancel_retries_each_shard_then_gives_up_after_the_attempt_limit() {
    let (mut s, c) = subscribed();
    let r = s.request(c, [("t".to_string(), "h".to_string())], T0);
    s.finish_request(r, T0);
    assert_eq!(events(&mut s), [SchedulerEvent::RequestDone { consumer: c, request: r }]);
    // Shard 19019 answers the second attempt; 19020 never does.
    let mut first = true;
    let asked = serve(&mut s, |addr, _| {
        if addr == BASE && std::mem::take(&mut first) {
            return Err("Resource temporarily unavailable".into());
        }
        if addr == BASE {
            Ok(json!({"cancelled": true}))
        } else {
            Err("Resource temporarily unavailable".into())
        }
    });
    let addrs: Vec<&str> = asked.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(addrs, [BASE, BASE, "tcp://h:19020", "tcp://h:19020"], "CANCEL_ATTEMPTS = 2 per shard");
    assert_eq!(
        events(&mut s),
        [SchedulerEvent::Released {
            consumer: c,
            transfer_id: "t".into(),
            shards: 2,
            gave_up: vec!["tcp://h:19020".into()]
        }]
    );
}

#[test]
fn a_remote_cancel_without_a_topology_gives_up_after_the_discovery_limit() {
    let mut s = Scheduler::default();
    let c = s.add_consumer(BASE);
    let a = s.request(c, [("a".to_string(), "h".to_string())], T0);
    let b = s.request(c, [("b".to_string(), "h".to_string())], T0);
    s.finish_request(a, T0);
    s.finish_request(b, T0);
    events(&mut s);
    assert_eq!(s.queued_cancels(c), 1, "b waits for a");
    let first = s.poll_transmit().unwrap();
    assert_eq!(s.poll_transmit(), None, "one request in flight per lane");
    assert_eq!(first.lane, Lane::Cancel(c));
    s.handle_reply(first.token, Err("timeout".into()), T0);
    let asked = serve(&mut s, |_, _| Err("timeout".into()));
    assert_eq!(asked.len(), 1 + 2, "peers twice for a, then twice for b (one answered above)");
    assert!(asked.iter().all(|(addr, frame)| addr == BASE && frame == r#"{"op": "peers"}"#));
    assert_eq!(
        events(&mut s),
        [
            SchedulerEvent::Undiscovered { consumer: c, transfer_id: "a".into() },
            SchedulerEvent::Undiscovered { consumer: c, transfer_id: "b".into() },
        ]
    );
    assert_eq!(s.queued_cancels(c), 0);
}

#[test]
fn requests_resolve_item_by_item_and_a_collision_fails_only_the_newcomer() {
    let mut s = Scheduler::default();
    let c = s.add_consumer(BASE);
    let r = s.request(c, [("a".to_string(), "h".to_string()), ("b".to_string(), "h".to_string())], T0);
    let clash = s.request(c, [("a".to_string(), "other".to_string())], T0);
    assert_eq!(
        events(&mut s),
        [
            SchedulerEvent::ItemDone {
                consumer: c,
                request: clash,
                transfer_id: "a".into(),
                fate: ItemFate::Unavailable
            },
            SchedulerEvent::RequestDone { consumer: c, request: clash },
        ]
    );
    s.handle_event_frame(c, &ev("a", 1), T0).unwrap();
    events(&mut s);
    s.report_load(c, "a", false, T0);
    assert_eq!(
        events(&mut s),
        [
            SchedulerEvent::ItemDone { consumer: c, request: r, transfer_id: "a".into(), fate: ItemFate::LoadFailed },
            SchedulerEvent::Retire { consumer: c, mm_hash: "h".into() },
        ],
        "b still waits"
    );
    s.handle_timeout(T0 + PUSH_WAIT_TIMEOUT);
    let ev = events(&mut s);
    assert_eq!(ev.last(), Some(&SchedulerEvent::RequestDone { consumer: c, request: r }));
    // Only b, never announced, may still be held by the consumer: one cancel job.
    let t = s.poll_transmit().unwrap();
    assert_eq!(t.frame, peers_request());
}

#[test]
fn s5_runs_discovery_inline_and_s6_counts_the_base_shard_only() {
    let config = SchedulerConfig {
        inbox: InboxRegressions { s5_inline_discovery: true, s6_base_shard_only: true, ..InboxRegressions::default() },
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config);
    let c = s.add_consumer(BASE);
    s.handle_drain(T0);
    let t = s.poll_transmit().unwrap();
    assert!(t.inline);
    assert_eq!((t.addr.as_str(), t.frame.as_slice()), (BASE, br#"{"op": "event_port"}"#.as_slice()));
    s.handle_reply(t.token, Ok(json!(20001)), T0);
    assert_eq!(events(&mut s), [SchedulerEvent::Subscribe { consumer: c, endpoints: vec!["tcp://h:20001".into()] }]);
    assert_eq!(s.shard_count(c), 1);
    s.request(c, [("t".to_string(), "h".to_string())], T0);
    assert_eq!(s.handle_event_frame(c, &ev("t", 19019), T0), Ok(Some(EventFate::Accepted)));
}

#[test]
fn a_failed_discovery_or_subscribe_is_retried_on_a_later_drain() {
    let mut s = Scheduler::default();
    let c = s.add_consumer(BASE);
    s.handle_drain(T0);
    serve(&mut s, |_, _| Err("timeout".into()));
    assert!(events(&mut s).is_empty());
    s.handle_drain(T0);
    serve(&mut s, |_, frame| match frame {
        r#"{"op": "peers"}"# => Ok(json!({"ports": [19019]})),
        _ => Ok(json!(20001)),
    });
    assert_eq!(events(&mut s).len(), 1);
    s.subscribe_failed(c, "Too many open files");
    assert_eq!(s.shard_count(c), 1);
    s.handle_drain(T0);
    let asked = serve(&mut s, |_, _| Ok(json!(20001)));
    assert_eq!(asked, [(BASE.to_string(), r#"{"op": "event_port"}"#.to_string())], "peers stays cached");
}

#[test]
fn s7_a_partial_event_port_pass_subscribes_nothing_and_is_retried_whole() {
    let mut s = Scheduler::default();
    let c = s.add_consumer(BASE);
    s.handle_drain(T0);
    serve(&mut s, |addr, frame| match (addr, frame) {
        (_, r#"{"op": "peers"}"#) => Ok(json!({"ports": [19019, 19020]})),
        ("tcp://h:19019", _) => Ok(json!(20001)),
        _ => Err("Resource temporarily unavailable".into()),
    });
    assert!(events(&mut s).is_empty(), "no PULL for a partial topology");
    assert_eq!(s.shard_count(c), 1);
    s.handle_drain(T0);
    let asked = serve(&mut s, |addr, _| Ok(json!(if addr == BASE { 20001 } else { 20002 })));
    let addrs: Vec<&str> = asked.iter().map(|(a, _)| a.as_str()).collect();
    assert_eq!(addrs, [BASE, "tcp://h:19020"], "the whole event_port pass again, peers cached");
    assert_eq!(
        events(&mut s),
        [SchedulerEvent::Subscribe { consumer: c, endpoints: vec!["tcp://h:20001".into(), "tcp://h:20002".into()] }]
    );
    assert_eq!(s.shard_count(c), 2);
}

#[test]
fn s7_switch_subscribes_to_the_shards_that_answered() {
    let config = SchedulerConfig {
        inbox: InboxRegressions { s7_partial_subscribe: true, ..InboxRegressions::default() },
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config);
    let c = s.add_consumer(BASE);
    s.handle_drain(T0);
    serve(&mut s, |addr, frame| match (addr, frame) {
        (_, r#"{"op": "peers"}"#) => Ok(json!({"ports": [19019, 19020]})),
        ("tcp://h:19019", _) => Ok(json!(20001)),
        _ => Err("Resource temporarily unavailable".into()),
    });
    assert_eq!(events(&mut s), [SchedulerEvent::Subscribe { consumer: c, endpoints: vec!["tcp://h:20001".into()] }]);
    assert_eq!(s.shard_count(c), 1);
    s.request(c, [("t".to_string(), "h".to_string())], T0);
    assert_eq!(s.handle_event_frame(c, &ev("t", 19019), T0), Ok(Some(EventFate::Accepted)), "one rank of two");
}

#[test]
fn s24_switch_halts_the_scheduler_on_a_colliding_transfer_id() {
    let fixed = {
        let mut s = Scheduler::default();
        let c = s.add_consumer(BASE);
        s.request(c, [("shared".to_string(), "h".to_string())], T0);
        s.request(c, [("shared".to_string(), "other".to_string())], T0);
        s.halted().cloned()
    };
    assert_eq!(fixed, None, "ctlplane fails the newcomer's item and keeps serving");
    let config = SchedulerConfig {
        regressions: SchedulerRegressions { s24_collision_raises: true },
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config);
    let c = s.add_consumer(BASE);
    s.request(c, [("shared".to_string(), "h".to_string())], T0);
    assert_eq!(s.halted(), None);
    s.request(c, [("shared".to_string(), "other".to_string())], T0);
    assert_eq!(
        s.halted(),
        Some(&SchedulerHalt::TransferIdCollision { transfer_id: "shared".into(), existing: "h".into() })
    );
}
