//! P2P peers in the simulated world: each drives the core's `PeerManager` (the mainline
//! transport's `ConnectionRegistry` and W1 `HandshakeSession`s) over the ZeroMQ model,
//! connects to every other peer and keeps a seeded stream of requests going.
//!
//! The oracles of this world:
//! - `dealer-closed-once`, `monitor-closed-once`: every DEALER and monitor PAIR a peer
//!   opens is closed exactly once, at the latest when its connection is unregistered
//!   (checked by [`check_safety`] after every step);
//! - `p2p-message-lost`: a message that reached a live peer from a reconnecting peer is
//!   handed to a session, never thrown away with the dead connection it replaces
//!   (checked inside the peers, at the poll where it happens);
//! - `p2p-handshake-liveness`: once the faults stop and the world has been quiet, every
//!   ordered pair of peers has a ready session that answers requests ([`check_liveness`]).
//! - `sockets-bounded`: a peer never needs more ZeroMQ sockets than libzmq's context allows
//!   ([`MAX_SOCKETS`]; checked as each DEALER is opened).
//! - `p2p-progress`: a peer's manager tick never takes longer than [`MAX_TICK`]: sends never
//!   wait, so a longer tick blocked and starved every other session (race `p2p-hwm`).
//! - `p2p-dial-non-peer`: no peer opens a connection to an address that is not a peer of
//!   the world because an inbound message named it (checked as each DEALER is opened).
//! - `p2p-announced-id`: a peer's connect announces the id the receiver knows it by.
//! - `p2p-dispatch-errors`: a ready session whose handler failed five times in a row is
//!   dead, and fewer failures in a row do not kill it (a `handler_failures` fault).
//! - `p2p-peer-id`: no DEALER is opened for a peer id that is not `host:port`.
//! - `p2p-closed`: a session the application closed is dead (a `peer_close` fault).
//! - `p2p-frame-limit`: no frame above the world's frame limit reaches a DEALER (an
//!   `oversize` fault offers one).

mod ledger;
mod peer;

use std::rc::Rc;

use ctlplane_core::p2p::manager::Backoff;
use ctlplane_core::p2p::T0Switches;

use crate::topology::Topology;

pub use ledger::LIVENESS_WINDOW;
pub use peer::{answer, peer_id, session_config, PeerConfig, PeerSettings, MAX_SOCKETS, MAX_TICK, PORT};

/// How long the world needs, after the last fault heals, before [`check_liveness`] can
/// hold. W1 sends a Connect once per session, so a lost Connect or Ack is recovered only
/// by the 30 s handshake deadline, and the reconnect after it can race the other side's
/// own reconnect (duplicate connect: both die and retry) into a second deadline. Two
/// deadlines, a heartbeat timeout (10 s) and reconnect backoffs (up to 1 s each).
pub const QUIET_PERIOD: std::time::Duration = std::time::Duration::from_secs(100);

/// Adds one host per P2P peer of `topo` to `sim`; `seed` seeds their traffic.
pub fn install(sim: &mut turmoil::Sim<'_>, topo: &Topology, seed: u64) {
    install_with(sim, topo, seed, T0Switches::default());
}

/// [`install`] with historical transport behaviours switched on (race catalogue). The
/// scenario's knobs and the manager's switch come from the run's world when one is
/// installed.
pub fn install_with(sim: &mut turmoil::Sim<'_>, topo: &Topology, seed: u64, t0: T0Switches) {
    let settings = crate::hosts::world::try_with(|w| PeerSettings {
        no_handshake_deadline: w.knobs.p2p_no_handshake_deadline,
        max_peers: w.knobs.p2p_max_peers,
        immediate_reconnect: w.knobs.p2p_immediate_reconnect,
        handler_spacing: w.knobs.p2p_handler_spacing,
        backoff: w.knobs.p2p_backoff.map(|(min, max)| Backoff { min, max }),
        max_message_bytes: w.knobs.p2p_frame_limit,
        manager: w.regressions.manager,
        config_fingerprint: w.knobs.p2p_config_fingerprint,
        wildcard_peer: w.knobs.p2p_wildcard_peer,
        quiet: false,
    })
    .unwrap_or_default();
    install_tuned(sim, topo, seed, t0, settings);
}

/// [`install_with`] with explicit peer settings.
pub fn install_tuned(sim: &mut turmoil::Sim<'_>, topo: &Topology, seed: u64, t0: T0Switches, settings: PeerSettings) {
    ledger::reset(&topo.p2p_peers);
    for (i, name) in topo.p2p_peers.iter().enumerate() {
        let mut settings = settings;
        if settings.wildcard_peer == Some(i) {
            settings.config_fingerprint = None;
        }
        let cfg = Rc::new(PeerConfig { name: name.clone(), peers: topo.p2p_peers.clone(), seed, t0, settings });
        sim.host(name.as_str(), move || peer::run(cfg.clone()));
    }
}

/// Adds one P2P peer host, `cfg.name`, whose `cfg.peers` may be hosts of the caller's own
/// (scripted peers, as in the driver-conformance test).
pub fn install_peer(sim: &mut turmoil::Sim<'_>, cfg: PeerConfig) {
    ledger::reset(&cfg.peers);
    let name = cfg.name.clone();
    let cfg = Rc::new(cfg);
    sim.host(name.as_str(), move || peer::run(cfg.clone()));
}

/// Per step: DEALERs and monitors closed exactly once (cheap when nothing changed).
pub fn check_safety() {
    ledger::check_safety();
}

/// After the quiet period: every pair handshaken again and talking.
pub fn check_liveness() {
    ledger::check_liveness();
}

/// Handshakes `host` completed with `peer` over the run so far.
pub fn handshakes(host: &str, peer: &str) -> u32 {
    ledger::handshakes(host, peer)
}
