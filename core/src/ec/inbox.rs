//! The scheduler's event inbox: subscribing to every shard's readiness events without
//! ever blocking the scheduler, and decoding what arrives (ec-behaviour.md §6.1, races S5, S7, S22).
//!
//! Discovery needs blocking control requests, so the driver runs the [`EndpointDiscovery`]
//! pass the inbox hands it somewhere else (a background thread in production, a task in
//! the simulator) and reports the outcome; [`Inbox`] decides when to start a pass, which
//! pass, where it runs, when to adopt its result and when to retry. The driver carries out
//! [`StartDiscovery`] and [`Subscribe`] as they come.

use super::pyjson::{to_int, to_str, truthy, type_name};
use super::topology::{with_port, TopologyCache};
use serde_json::Value;
use thiserror::Error;

/// The `event_port` request frame.
pub fn event_port_request() -> Vec<u8> {
    br#"{"op": "event_port"}"#.to_vec()
}

/// One step of endpoint discovery: what to ask next, or the outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DiscoveryStep {
    /// Send `frame` to `addr` and report the reply with [`EndpointDiscovery::handle_reply`].
    Request { addr: String, frame: Vec<u8> },
    /// Every shard's event endpoint, in shard order.
    Done(Vec<String>),
    /// Some exchange failed: retry the complete topology later (peers stay cached).
    Failed(String),
}

/// `peers` (unless cached) then `event_port` of every shard in order; any failure ends
/// the pass, as the reference's `_endpoints`.
#[derive(Clone, Debug)]
pub struct EndpointDiscovery {
    base: String,
    shards: Option<Vec<String>>,
    endpoints: Vec<String>,
    outcome: Option<DiscoveryStep>,
    /// EC S7 regression: a failed `event_port` ends the pass with the endpoints found so
    /// far instead of failing it.
    keep_partial: bool,
}

impl EndpointDiscovery {
    /// A pass over `base`, reusing a topology `cache` already confirmed.
    pub fn new(base: &str, cache: &TopologyCache) -> Self {
        EndpointDiscovery {
            base: base.to_string(),
            shards: cache.get(base).map(<[String]>::to_vec),
            endpoints: Vec::new(),
            outcome: None,
            keep_partial: false,
        }
    }

    /// A pass that asks only `base` for its event port, as the inbox did before it
    /// subscribed to every shard (EC S6).
    fn base_only(base: &str) -> Self {
        EndpointDiscovery {
            base: base.to_string(),
            shards: Some(vec![base.to_string()]),
            endpoints: Vec::new(),
            outcome: None,
            keep_partial: false,
        }
    }

    /// What to do now.
    pub fn step(&self) -> DiscoveryStep {
        if let Some(done) = &self.outcome {
            return done.clone();
        }
        match &self.shards {
            None => DiscoveryStep::Request { addr: self.base.clone(), frame: super::topology::peers_request() },
            Some(shards) => match shards.get(self.endpoints.len()) {
                Some(addr) => DiscoveryStep::Request { addr: addr.clone(), frame: event_port_request() },
                None => DiscoveryStep::Done(self.endpoints.clone()),
            },
        }
    }

    /// The reply to the request of the last [`Self::step`]: `Ok(result)` or the error.
    pub fn handle_reply(&mut self, cache: &mut TopologyCache, reply: Result<Value, String>) -> DiscoveryStep {
        if self.outcome.is_some() {
            return self.step();
        }
        match &self.shards {
            None => match cache.record(&self.base, reply) {
                Ok(shards) => self.shards = Some(shards),
                Err(e) => {
                    tracing::warn!(base = %self.base, error = %e, "EC consumer did not report its shards");
                    self.outcome = Some(DiscoveryStep::Failed(e.to_string()));
                }
            },
            Some(shards) => {
                let Some(addr) = shards.get(self.endpoints.len()).cloned() else { return self.step() };
                let endpoint = reply.and_then(|v| {
                    let port = to_int(&v)?;
                    let port = u16::try_from(port).map_err(|_| format!("event port {port} out of range"))?;
                    with_port(&addr, port).map_err(|e| e.to_string())
                });
                match endpoint {
                    Ok(ep) => self.endpoints.push(ep),
                    Err(e) if self.keep_partial && !self.endpoints.is_empty() => {
                        tracing::warn!(shard = %addr, error = %e,
                            "could not subscribe to the event channel of consumer shard; subscribing to the others");
                        self.outcome = Some(DiscoveryStep::Done(self.endpoints.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(shard = %addr, error = %e,
                            "could not subscribe to the event channel of consumer shard; retrying the complete topology later");
                        self.outcome = Some(DiscoveryStep::Failed(e));
                    }
                }
            }
        }
        self.step()
    }
}

/// Run this discovery pass, then report its outcome with [`Inbox::on_discovery`].
#[derive(Clone, Debug)]
pub struct StartDiscovery {
    /// What to ask, in order.
    pub pass: EndpointDiscovery,
    /// Run the pass to its end inside the drain that asked for it (the S5 regression), not
    /// off the caller's thread.
    pub inline: bool,
}

/// Create the PULL socket (IPV6 on) and connect it to every endpoint; report a failure
/// with [`Inbox::on_subscribe_failed`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Subscribe {
    pub endpoints: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum InboxState {
    Unsubscribed,
    Discovering,
    Subscribed,
    Closed,
}

/// Historical behaviours of the event inbox, each restoring one race of the catalogue
/// (`docs/races.md`). All off by default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxRegressions {
    /// EC S5: discovery runs inline in the drain (inside the scheduler's `schedule()`):
    /// [`StartDiscovery::inline`] tells the driver to finish the pass before the
    /// drain returns, costing up to one control timeout per shard on every drain while
    /// the consumer is unreachable.
    pub s5_inline_discovery: bool,
    /// EC S6: subscribe to the base shard only and count one shard, so one rank's event
    /// makes an item loadable.
    pub s6_base_shard_only: bool,
    /// EC S7: a pass whose `event_port` fails on a later shard subscribes to the shards
    /// that answered and counts only those, so their events alone make an item loadable
    /// (the fixed pass fails whole and is retried on a later drain).
    pub s7_partial_subscribe: bool,
}

/// Subscription state of the scheduler's event inbox.
#[derive(Clone, Debug)]
pub struct Inbox {
    state: InboxState,
    shard_count: usize,
    regressions: InboxRegressions,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox::new(InboxRegressions::default())
    }
}

impl Inbox {
    /// An unsubscribed inbox with the given regression switches.
    pub fn new(regressions: InboxRegressions) -> Self {
        Inbox { state: InboxState::Unsubscribed, shard_count: 1, regressions }
    }

    /// A drain of the consumer at `base` began. Never blocks: at most it asks for a
    /// background discovery pass over every shard (reusing a topology `cache` already
    /// confirmed; only `base` under the S6 regression), so the first drain of a healthy
    /// consumer still returns nothing.
    pub fn on_drain(&mut self, base: &str, cache: &TopologyCache) -> Option<StartDiscovery> {
        if self.state != InboxState::Unsubscribed {
            return None;
        }
        self.state = InboxState::Discovering;
        let mut pass = if self.regressions.s6_base_shard_only {
            EndpointDiscovery::base_only(base)
        } else {
            EndpointDiscovery::new(base, cache)
        };
        pass.keep_partial = self.regressions.s7_partial_subscribe;
        Some(StartDiscovery { pass, inline: self.regressions.s5_inline_discovery })
    }

    /// The background discovery finished (adopted on the draining thread, which alone
    /// touches the PULL socket). A failure or an empty topology retries on a later drain.
    pub fn on_discovery(&mut self, outcome: Result<Vec<String>, String>) -> Option<Subscribe> {
        if self.state != InboxState::Discovering {
            return None;
        }
        match outcome {
            Ok(mut endpoints) if !endpoints.is_empty() => {
                if self.regressions.s6_base_shard_only {
                    endpoints.truncate(1);
                }
                self.state = InboxState::Subscribed;
                self.shard_count = endpoints.len();
                Some(Subscribe { endpoints })
            }
            Ok(_) => {
                self.state = InboxState::Unsubscribed;
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "EC event-channel discovery failed; retrying");
                self.state = InboxState::Unsubscribed;
                None
            }
        }
    }

    /// The driver could not create or connect the PULL socket for a
    /// [`Subscribe`]: a later drain discovers again (peers stay cached), as the
    /// reference drops a failed install and resubmits discovery.
    pub fn on_subscribe_failed(&mut self, error: &str) {
        if self.state == InboxState::Subscribed {
            tracing::warn!(%error, "could not open the EC event channel; retrying");
            self.state = InboxState::Unsubscribed;
            self.shard_count = 1;
        }
    }

    /// Closing: a discovery still running is abandoned and nothing is installed after.
    pub fn close(&mut self) {
        self.state = InboxState::Closed;
    }

    /// Shards the inbox listens to (1 until subscribed, as the reference).
    pub fn shard_count(&self) -> usize {
        self.shard_count
    }

    /// The PULL socket is installed.
    pub fn is_subscribed(&self) -> bool {
        self.state == InboxState::Subscribed
    }
}

/// A readiness event as the scheduler reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadyEvent {
    pub transfer_id: String,
    pub mm_hash: String,
    pub nbytes: u64,
    pub shape: Vec<u64>,
    pub dtype: String,
    /// The publishing shard's REP port, if the event names it.
    pub shard: Option<i64>,
}

/// Why an event frame was discarded (each costs that one frame, nothing more).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum EventError {
    #[error("undecodable EC event frame")]
    Undecodable,
    #[error("EC event is a '{0}', not an object")]
    NotAnObject(&'static str),
    #[error("EC event lacks '{0}'")]
    Missing(&'static str),
    #[error("EC event field '{field}' is invalid: {reason}")]
    Invalid { field: &'static str, reason: String },
}

/// Decodes one PULL frame. `Ok(None)`: a well-formed event that is not a readiness
/// (`ready` falsy), skipped.
pub fn decode_event(frame: &[u8]) -> Result<Option<ReadyEvent>, EventError> {
    let value = super::wire::parse_json(frame).map_err(|_| EventError::Undecodable)?;
    let Value::Object(obj) = value else {
        return Err(EventError::NotAnObject(type_name(&value)));
    };
    if !obj.get("ready").is_some_and(truthy) {
        return Ok(None);
    }
    let field = |name: &'static str| obj.get(name).ok_or(EventError::Missing(name));
    let uint = |name: &'static str, v: &Value| -> Result<u64, EventError> {
        let n = to_int(v).map_err(|reason| EventError::Invalid { field: name, reason })?;
        u64::try_from(n).map_err(|_| EventError::Invalid { field: name, reason: format!("{n} is negative") })
    };
    let transfer_id = to_str(field("transfer_id")?);
    let mm_hash = to_str(field("mm_hash")?);
    let nbytes = uint("nbytes", field("nbytes")?)?;
    let shape = match field("shape")? {
        Value::Array(dims) => dims.iter().map(|d| uint("shape", d)).collect::<Result<Vec<_>, _>>()?,
        other => {
            return Err(EventError::Invalid { field: "shape", reason: format!("'{}' is not a list", type_name(other)) })
        }
    };
    let dtype = to_str(field("dtype")?);
    let shard = match obj.get("shard") {
        None => None,
        Some(v) => {
            let n = to_int(v).map_err(|reason| EventError::Invalid { field: "shard", reason })?;
            Some(i64::try_from(n).map_err(|_| EventError::Invalid { field: "shard", reason: "out of range".into() })?)
        }
    };
    Ok(Some(ReadyEvent { transfer_id, mm_hash, nbytes, shape, dtype, shard }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A drain of `inbox`; whether it asked for a discovery pass.
    fn starts(inbox: &mut Inbox) -> bool {
        inbox.on_drain("tcp://h:1", &TopologyCache::default()).is_some()
    }

    fn reply_for(step: &DiscoveryStep) -> (String, Vec<u8>) {
        match step {
            DiscoveryStep::Request { addr, frame } => (addr.clone(), frame.clone()),
            other => panic!("expected a request, got {other:?}"),
        }
    }

    #[test]
    fn discovery_retries_the_whole_event_port_pass_with_peers_cached() {
        // ec-behaviour.md §6.1's exact request order: peers, peers, event_port(19019),
        // event_port(19020), event_port(19019), event_port(19020).
        let base = "tcp://127.0.0.1:19019";
        let mut cache = TopologyCache::default();
        let mut asked = Vec::new();

        let mut d = EndpointDiscovery::new(base, &cache);
        asked.push(reply_for(&d.step()));
        assert!(matches!(d.handle_reply(&mut cache, Err("timeout".into())), DiscoveryStep::Failed(_)));

        let mut d = EndpointDiscovery::new(base, &cache);
        asked.push(reply_for(&d.step()));
        let s = d.handle_reply(&mut cache, Ok(json!({"ports": [19019, 19020]})));
        asked.push(reply_for(&s));
        let s = d.handle_reply(&mut cache, Ok(json!(20001)));
        asked.push(reply_for(&s));
        assert!(matches!(d.handle_reply(&mut cache, Err("timeout".into())), DiscoveryStep::Failed(_)));

        let mut d = EndpointDiscovery::new(base, &cache);
        asked.push(reply_for(&d.step()));
        let s = d.handle_reply(&mut cache, Ok(json!(20001)));
        asked.push(reply_for(&s));
        let done = d.handle_reply(&mut cache, Ok(json!(20002)));
        assert_eq!(done, DiscoveryStep::Done(vec!["tcp://127.0.0.1:20001".into(), "tcp://127.0.0.1:20002".into()]));

        let order: Vec<(String, String)> = asked.into_iter().map(|(a, f)| (a, String::from_utf8(f).unwrap())).collect();
        let peers = r#"{"op": "peers"}"#.to_string();
        let ep = r#"{"op": "event_port"}"#.to_string();
        let s1 = "tcp://127.0.0.1:19019".to_string();
        let s2 = "tcp://127.0.0.1:19020".to_string();
        assert_eq!(
            order,
            vec![
                (s1.clone(), peers.clone()),
                (s1.clone(), peers),
                (s1.clone(), ep.clone()),
                (s2.clone(), ep.clone()),
                (s1, ep.clone()),
                (s2, ep)
            ]
        );
    }

    #[test]
    fn inbox_never_blocks_and_subscribes_once() {
        let mut inbox = Inbox::default();
        assert_eq!(inbox.shard_count(), 1);
        assert!(starts(&mut inbox));
        assert!(!starts(&mut inbox), "discovery in flight: the drain returns at once");
        assert_eq!(inbox.on_discovery(Err("timeout".into())), None);
        assert!(starts(&mut inbox), "retried after a failure");
        let eps = vec!["tcp://h:1".to_string(), "tcp://h:2".to_string(), "tcp://h:3".to_string()];
        assert_eq!(inbox.on_discovery(Ok(eps.clone())), Some(Subscribe { endpoints: eps }));
        assert_eq!(inbox.shard_count(), 3);
        assert!(!starts(&mut inbox));
        assert!(inbox.is_subscribed());
    }

    #[test]
    fn a_failed_subscribe_is_retried_from_discovery() {
        let mut inbox = Inbox::default();
        assert!(starts(&mut inbox));
        let eps = vec!["tcp://h:1".to_string(), "tcp://h:2".to_string()];
        assert_eq!(inbox.on_discovery(Ok(eps.clone())), Some(Subscribe { endpoints: eps }));
        inbox.on_subscribe_failed("Too many open files");
        assert_eq!((inbox.is_subscribed(), inbox.shard_count()), (false, 1));
        assert!(starts(&mut inbox));
        inbox.close();
        inbox.on_subscribe_failed("late");
        assert!(!starts(&mut inbox), "a closed inbox stays closed");
    }

    #[test]
    fn closing_abandons_a_running_discovery() {
        let mut inbox = Inbox::default();
        assert!(starts(&mut inbox));
        inbox.close();
        assert_eq!(inbox.on_discovery(Ok(vec!["tcp://h:1".into()])), None);
        assert!(!starts(&mut inbox));
    }

    #[test]
    fn events_decode_or_cost_one_frame() {
        let e = br#"{"transfer_id": "t", "mm_hash": "h", "ready": true, "reservation_id": "r", "nbytes": 16, "shape": [2, 4], "dtype": "float16", "shard": 19020}"#;
        let ev = decode_event(e).unwrap().unwrap();
        assert_eq!(
            (ev.transfer_id.as_str(), ev.nbytes, ev.shape.as_slice(), ev.shard),
            ("t", 16, &[2u64, 4][..], Some(19020))
        );
        assert_eq!(decode_event(b"\xff"), Err(EventError::Undecodable));
        assert_eq!(decode_event(b"{not json"), Err(EventError::Undecodable));
        for (frame, name) in [("[]", "list"), ("\"ready\"", "str"), ("1", "int"), ("null", "NoneType")] {
            assert_eq!(decode_event(frame.as_bytes()), Err(EventError::NotAnObject(name)));
        }
        assert_eq!(decode_event(br#"{"ready": false, "transfer_id": "t"}"#), Ok(None));
        assert_eq!(decode_event(br#"{"ready": true, "transfer_id": "t"}"#), Err(EventError::Missing("mm_hash")));
    }
}
