//! The Perfetto export of a failing race run parses as Chrome trace-event JSON and holds
//! the flow arrow of the exchange the oracle caught.

use ctlplane_sim::engine::RunConfig;
use ctlplane_sim::{perfetto, scenario};
use serde_json::Value;

/// Runs a race seed with the trace kept and returns the violation of `oracle` and the
/// parsed document.
fn failing(scenario_name: &str, seed: u64, oracle: &str) -> (ctlplane_sim::oracle::Violation, Value) {
    let cfg = RunConfig { seed, scenario: scenario_name.to_string(), plan: None, keep_trace: true };
    let report = scenario::run(&cfg);
    let v = report
        .violations
        .iter()
        .find(|v| v.oracle == oracle)
        .cloned()
        .unwrap_or_else(|| panic!("{scenario_name} seed {seed} fires {oracle}: {:?}", report.violations));
    let mut bytes = Vec::new();
    perfetto::write(&report.trace, &mut bytes).expect("writes to memory");
    let doc: Value = serde_json::from_slice(&bytes).expect("the export is JSON");
    (v, doc)
}

fn events(doc: &Value) -> &Vec<Value> {
    doc["traceEvents"].as_array().expect("traceEvents is an array")
}

fn pid_of(doc: &Value, host: &str) -> u64 {
    events(doc)
        .iter()
        .find(|e| e["ph"] == "M" && e["name"] == "process_name" && e["args"]["name"] == host)
        .and_then(|e| e["pid"].as_u64())
        .unwrap_or_else(|| panic!("process {host} is named"))
}

/// Every flow start has exactly one end with its id, on another process, not earlier.
fn flows_are_paired(doc: &Value) {
    let mut starts = std::collections::BTreeMap::new();
    let mut ends = std::collections::BTreeMap::new();
    for e in events(doc) {
        let id = e["id"].as_u64();
        match e["ph"].as_str() {
            Some("s") => assert!(starts.insert(id.expect("flow id"), e.clone()).is_none()),
            Some("f") => {
                assert_eq!(e["bp"], "e");
                assert!(ends.insert(id.expect("flow id"), e.clone()).is_none());
            }
            _ => {}
        }
    }
    assert!(!starts.is_empty(), "messages are drawn as flows");
    assert_eq!(starts.keys().collect::<Vec<_>>(), ends.keys().collect::<Vec<_>>());
    for (id, s) in &starts {
        let f = &ends[id];
        assert_ne!(s["pid"], f["pid"], "flow {id} crosses hosts");
        assert!(s["ts"].as_f64() <= f["ts"].as_f64(), "flow {id} goes forward in time");
    }
}

#[test]
fn ec_s1_export_shows_the_unanswered_request_arriving() {
    let (v, doc) = failing("ec-s1", 1, "rep-answers");
    flows_are_paired(&doc);
    let rank = pid_of(&doc, &v.host);
    // "request received at <ns> ns, ..."
    let since: u64 = v
        .detail
        .strip_prefix("request received at ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the violation names when the request arrived");
    let ts = since as f64 / 1000.0;
    let end = events(&doc)
        .iter()
        .find(|e| e["ph"] == "f" && e["pid"] == rank && e["ts"].as_f64() == Some(ts))
        .expect("a flow ends at the rank when the unanswered request arrived");
    let start = events(&doc).iter().find(|e| e["ph"] == "s" && e["id"] == end["id"]).expect("its start");
    assert_ne!(start["pid"], rank, "sent by a client");
    assert!(
        events(&doc).iter().any(|e| e["ph"] == "i" && e["name"] == "violation rep-answers"),
        "the violation is an instant event"
    );
    assert!(events(&doc).iter().any(|e| e["ph"] == "i" && e["cat"] == "fault.malformed"), "the fault is shown");
}

/// The thread of `host`'s socket of `kind` (`"sock N KIND"`).
fn socket_thread(doc: &Value, pid: u64, kind: &str) -> Vec<u64> {
    events(doc)
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == pid)
        .filter(|e| e["args"]["name"].as_str().is_some_and(|n| n.ends_with(&format!(" {kind}"))))
        .filter_map(|e| e["tid"].as_u64())
        .collect()
}

#[test]
fn ec_s6_export_shows_readiness_from_the_base_shard_only() {
    let (v, doc) = failing("ec-s6", 0, "accept-before-ready");
    flows_are_paired(&doc);
    let scheduler = pid_of(&doc, &v.host);
    let at = v.t_ns as f64 / 1000.0;
    let flows_from = |host: &str| -> Vec<(f64, u64)> {
        let pid = pid_of(&doc, host);
        let push = socket_thread(&doc, pid, "PUSH");
        assert_eq!(push.len(), 1, "{host} has one PUSH socket");
        events(&doc)
            .iter()
            .filter(|s| s["ph"] == "s" && s["pid"] == pid && s["tid"].as_u64() == Some(push[0]))
            .filter_map(|s| events(&doc).iter().find(|f| f["ph"] == "f" && f["id"] == s["id"]))
            .filter(|f| f["pid"] == scheduler)
            .map(|f| (f["ts"].as_f64().unwrap_or(f64::MAX), f["id"].as_u64().unwrap_or(0)))
            .collect()
    };
    let base = flows_from("consumer0-r0");
    assert!(base.iter().any(|(ts, _)| *ts <= at), "rank 0's readiness reached the scheduler before the accept");
    let other = flows_from("consumer0-r1");
    assert!(other.iter().all(|(ts, _)| *ts > at), "rank 1's readiness had not arrived when the item was accepted");
    assert!(events(&doc).iter().any(|e| e["ph"] == "i" && e["name"] == "violation accept-before-ready"));
}
