//! Host programs: each drives one core machine over simulated sockets.
//!
//! Every host is a turmoil host program, so a `bounce` re-runs it from the start as a
//! restarted process would: consumer ranks ([`consumer`]), producers ([`producer`]) and
//! the consumer scheduler ([`scheduler`]). What they share in-process (the workload, the
//! shards the scheduler loads from, the device) is the [`world`].

pub mod client;
pub mod consumer;
pub mod producer;
pub mod scheduler;
pub mod workload;
pub mod world;

use crate::topology::Topology;

/// Registers every EC host of `topo` on `sim` (the world must be installed first).
pub fn install(sim: &mut turmoil::Sim<'_>, topo: &Topology) {
    for (_, _, host) in topo.ranks() {
        let name = host.to_string();
        sim.host(host, move || consumer::run(name.clone()));
    }
    for host in &topo.producers {
        let name = host.clone();
        sim.host(host.as_str(), move || producer::run(name.clone()));
    }
    for host in &topo.schedulers {
        let name = host.clone();
        sim.host(host.as_str(), move || scheduler::run(name.clone()));
    }
}
