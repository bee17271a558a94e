//! What the P2P peers report about themselves, and the oracles that judge it.
//!
//! Peers write facts here as they happen (a DEALER or monitor opened or closed, a
//! connection unregistered, a session ready or gone, a response received); the engine
//! asks [`check_safety`] after every step and [`check_liveness`] once the faults have
//! stopped and the world has been quiet. State is thread-local, like every other piece of
//! a simulation, and [`reset`] starts a run afresh.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::oracle;

/// A ready pair must have answered a request this recently when liveness is checked.
pub const LIVENESS_WINDOW: Duration = Duration::from_secs(5);

/// One DEALER (and its monitor PAIR) of one incarnation of a host.
#[derive(Clone, Copy, Debug, Default)]
struct SocketRecord {
    dealer_closes: u32,
    monitor_closes: u32,
    /// The registry no longer lists the connection.
    unregistered: bool,
    /// A violation was reported for it already (each is reported once).
    reported: bool,
}

/// One direction of a peer pair, as seen by the first peer's current incarnation.
#[derive(Clone, Copy, Debug, Default)]
struct PairRecord {
    /// The session of this incarnation for the peer is ready and alive.
    ready: bool,
    /// Handshakes completed with the peer over the run.
    handshakes: u32,
    /// When the last response to one of our requests arrived on a ready session, ns.
    last_response_ns: Option<u64>,
}

#[derive(Default)]
struct Ledger {
    peers: Vec<String>,
    /// Current incarnation of each peer host (bumped by every start).
    incarnation: BTreeMap<String, u32>,
    /// `(host, incarnation, connection)` → its sockets.
    sockets: BTreeMap<(String, u32, u64), SocketRecord>,
    /// The keys of `sockets` not yet unregistered: what [`registered`] walks after every
    /// poll, so a run that churns through many connections does not rescan them all.
    listed: BTreeSet<(String, u32, u64)>,
    /// Sockets to look at in the next [`check_safety`].
    dirty: BTreeSet<(String, u32, u64)>,
    pairs: BTreeMap<(String, String), PairRecord>,
    /// Latest simulated time any peer reported, ns.
    last_ns: u64,
    /// Incarnations already reported by `sockets-bounded` (once each).
    over_sockets: BTreeSet<(String, u32)>,
}

thread_local! {
    static LEDGER: RefCell<Ledger> = RefCell::new(Ledger::default());
}

/// Starts a run with these P2P peers.
pub fn reset(peers: &[String]) {
    LEDGER.with(|l| *l.borrow_mut() = Ledger { peers: peers.to_vec(), ..Ledger::default() });
}

fn now_ns() -> u64 {
    crate::clock::now().as_nanos()
}

fn with<R>(f: impl FnOnce(&mut Ledger) -> R) -> R {
    LEDGER.with(|l| {
        let mut l = l.borrow_mut();
        let t = now_ns();
        l.last_ns = l.last_ns.max(t);
        f(&mut l)
    })
}

/// `host` (re)starts: a new incarnation, whose sessions start from nothing. What the
/// previous incarnation held died with it (a crash drops sockets without closing them).
pub fn start(host: &str) -> u32 {
    with(|l| {
        let inc = l.incarnation.get(host).map_or(0, |i| i + 1);
        l.incarnation.insert(host.to_string(), inc);
        for ((a, _), p) in l.pairs.iter_mut() {
            if a == host {
                p.ready = false;
            }
        }
        inc
    })
}

/// A DEALER and its monitor PAIR were opened for connection `conn`.
pub fn opened(host: &str, inc: u32, conn: u64) {
    with(|l| {
        let key = (host.to_string(), inc, conn);
        l.sockets.insert(key.clone(), SocketRecord::default());
        l.listed.insert(key);
    });
}

/// The DEALER of `conn` was closed.
pub fn dealer_closed(host: &str, inc: u32, conn: u64) {
    with(|l| {
        let key = (host.to_string(), inc, conn);
        if !l.sockets.contains_key(&key) {
            l.listed.insert(key.clone());
        }
        l.sockets.entry(key.clone()).or_default().dealer_closes += 1;
        l.dirty.insert(key);
    });
}

/// The monitor PAIR of `conn` was closed.
pub fn monitor_closed(host: &str, inc: u32, conn: u64) {
    with(|l| {
        let key = (host.to_string(), inc, conn);
        if !l.sockets.contains_key(&key) {
            l.listed.insert(key.clone());
        }
        l.sockets.entry(key.clone()).or_default().monitor_closes += 1;
        l.dirty.insert(key);
    });
}

/// After a poll: the connections the registry of `host` still lists. Every other
/// connection of this incarnation has been unregistered and must have been closed.
pub fn registered(host: &str, inc: u32, conns: &BTreeSet<u64>) {
    with(|l| {
        let (first, last) = ((host.to_string(), inc, 0), (host.to_string(), inc, u64::MAX));
        let gone: Vec<(String, u32, u64)> =
            l.listed.range(first..=last).filter(|(_, _, c)| !conns.contains(c)).cloned().collect();
        for k in gone {
            l.listed.remove(&k);
            if let Some(s) = l.sockets.get_mut(&k) {
                s.unregistered = true;
            }
            l.dirty.insert(k);
        }
    });
}

/// `host` (incarnation `inc`) is about to hold `sockets` sockets in its context, whose
/// limit is `max`. `sockets-bounded`: the P2P transport never needs more sockets than
/// libzmq's context allows (p2p-behaviour.md S10: about 340 unreachable peers exhaust 1023, and
/// EngineCore dies). Reported once per incarnation.
pub fn sockets_needed(host: &str, inc: u32, sockets: usize, max: usize) {
    if sockets <= max {
        return;
    }
    let first = with(|l| l.over_sockets.insert((host.to_string(), inc)));
    if first {
        oracle::violate_at(
            now_or_last(),
            "sockets-bounded",
            host,
            format!("incarnation {inc} needs {sockets} ZeroMQ sockets, the context allows {max}"),
        );
    }
}

/// `host`'s session with `peer` completed its handshake.
pub fn ready(host: &str, peer: &str) {
    with(|l| {
        let p = l.pairs.entry((host.to_string(), peer.to_string())).or_default();
        p.ready = true;
        p.handshakes += 1;
    });
}

/// `host`'s session with `peer` died or was closed.
pub fn gone(host: &str, peer: &str) {
    with(|l| {
        if let Some(p) = l.pairs.get_mut(&(host.to_string(), peer.to_string())) {
            p.ready = false;
        }
    });
}

/// A response from `peer` to one of `host`'s requests arrived on a ready session.
pub fn responded(host: &str, peer: &str) {
    with(|l| {
        let t = l.last_ns;
        let p = l.pairs.entry((host.to_string(), peer.to_string())).or_default();
        p.last_response_ns = Some(t);
    });
}

/// Handshakes `host` completed with `peer` so far.
pub fn handshakes(host: &str, peer: &str) -> u32 {
    LEDGER.with(|l| l.borrow().pairs.get(&(host.to_string(), peer.to_string())).map_or(0, |p| p.handshakes))
}

/// Per step: every DEALER and monitor PAIR of a live incarnation is closed at most once,
/// and exactly once by the time its connection is unregistered.
pub fn check_safety() {
    let found = LEDGER.with(|l| {
        let mut l = l.borrow_mut();
        if l.dirty.is_empty() {
            return Vec::new();
        }
        let dirty = std::mem::take(&mut l.dirty);
        let mut found = Vec::new();
        for key in dirty {
            let current = l.incarnation.get(&key.0) == Some(&key.1);
            let Some(s) = l.sockets.get_mut(&key) else { continue };
            if s.reported || !current {
                continue;
            }
            let (host, inc, conn) = &key;
            let before = found.len();
            for (oracle, closes, what) in [
                ("dealer-closed-once", s.dealer_closes, "DEALER"),
                ("monitor-closed-once", s.monitor_closes, "monitor PAIR"),
            ] {
                if closes > 1 {
                    found.push((
                        oracle,
                        host.clone(),
                        format!("{what} of connection {conn} (incarnation {inc}) closed {closes} times"),
                    ));
                } else if closes == 0 && s.unregistered {
                    found.push((
                        oracle,
                        host.clone(),
                        format!("{what} of connection {conn} (incarnation {inc}) unregistered without being closed"),
                    ));
                }
            }
            if found.len() > before {
                s.reported = true;
            }
        }
        found
    });
    for (name, host, detail) in found {
        oracle::violate_at(now_or_last(), name, &host, detail);
    }
}

fn now_or_last() -> u64 {
    let t = now_ns();
    if t > 0 {
        t
    } else {
        LEDGER.with(|l| l.borrow().last_ns)
    }
}

/// After the faults stop and a quiet period: every ordered pair of peers has a ready
/// session that answered a request within [`LIVENESS_WINDOW`] of the latest report.
pub fn check_liveness() {
    let found = LEDGER.with(|l| {
        let l = l.borrow();
        let window = LIVENESS_WINDOW.as_nanos() as u64;
        let mut found = Vec::new();
        for a in &l.peers {
            for b in &l.peers {
                if a == b {
                    continue;
                }
                let p = l.pairs.get(&(a.clone(), b.clone())).copied().unwrap_or_default();
                let detail = if !p.ready {
                    Some(format!("no ready session with {b} ({} handshakes over the run)", p.handshakes))
                } else {
                    match p.last_response_ns {
                        Some(t) if t + window >= l.last_ns => None,
                        Some(t) => Some(format!("session with {b} ready but silent since t={t} ns")),
                        None => Some(format!("session with {b} ready but never answered")),
                    }
                };
                if let Some(d) = detail {
                    found.push((a.clone(), d));
                }
            }
        }
        (found, l.last_ns)
    });
    let (found, t) = found;
    for (host, detail) in found {
        oracle::violate_at(t, "p2p-handshake-liveness", &host, detail);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["a".into(), "b".into()]
    }

    #[test]
    fn a_leaked_and_a_double_closed_dealer_are_each_reported_once() {
        reset(&names());
        oracle::reset();
        let inc = start("a");
        opened("a", inc, 0);
        opened("a", inc, 1);
        monitor_closed("a", inc, 0);
        dealer_closed("a", inc, 0);
        registered("a", inc, &BTreeSet::from([1]));
        check_safety();
        assert_eq!(oracle::count(), 0, "closed once, then unregistered: fine");
        registered("a", inc, &BTreeSet::new());
        check_safety();
        check_safety();
        let v = oracle::take();
        assert_eq!(
            v.iter().map(|v| v.oracle.as_str()).collect::<Vec<_>>(),
            ["dealer-closed-once", "monitor-closed-once"]
        );
        opened("a", inc, 2);
        monitor_closed("a", inc, 2);
        dealer_closed("a", inc, 2);
        dealer_closed("a", inc, 2);
        check_safety();
        let v = oracle::take();
        assert_eq!(v.len(), 1);
        assert!(v[0].detail.contains("closed 2 times"), "{v:?}");
    }

    #[test]
    fn a_crashed_incarnation_is_not_a_leak() {
        reset(&names());
        oracle::reset();
        let inc = start("a");
        opened("a", inc, 0);
        let _ = start("a");
        registered("a", inc, &BTreeSet::new());
        check_safety();
        assert_eq!(oracle::count(), 0);
    }

    #[test]
    fn liveness_wants_every_pair_ready_and_answering() {
        reset(&names());
        oracle::reset();
        start("a");
        start("b");
        ready("a", "b");
        responded("a", "b");
        check_liveness();
        let v = oracle::take();
        assert_eq!(v.len(), 1, "b never got ready: {v:?}");
        assert_eq!(v[0].host, "b");
        ready("b", "a");
        responded("b", "a");
        check_liveness();
        assert_eq!(oracle::count(), 0);
        gone("a", "b");
        check_liveness();
        assert_eq!(oracle::take().len(), 1);
    }
}
