//! Driver conformance: the same scripted socket events, fed through a production driver
//! over libzmq (loopback, ports from the OS) and through the simulator's host over its
//! ZeroMQ model, make the core machine receive the same calls and give the same outputs
//! (the conformance log of `ctlplane_core::conformance`). Drivers decide nothing
//! (`docs/architecture.md`); a difference here is a decision one of them took.
//!
//! The scripted peer acts only after it has seen what it answers, so both runs see one
//! order of events; only what must differ between a loopback and a simulated network
//! (addresses and ports, times) is normalised.

mod call_log;
mod peer_manager;
mod request_slot;

/// The turmoil world both simulated runs take place in: a fixed seed and a fixed 1 ms
/// latency, so the scripted peer's order of events is the only thing that varies, and the
/// simulator's clock reset for the new world.
fn scripted_world() -> turmoil::Sim<'static> {
    ctlplane_sim::clock::reset();
    turmoil::Builder::new()
        .simulation_duration(std::time::Duration::from_secs(120))
        .min_message_latency(std::time::Duration::from_millis(1))
        .max_message_latency(std::time::Duration::from_millis(1))
        .rng_seed(7)
        .build()
}
