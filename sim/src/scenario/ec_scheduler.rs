//! Race scenarios of the scheduler and its event inbox (`ec-s7`, `ec-s24`).

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::faults::{Fault, FaultKind};
use crate::knobs::Knobs;
use crate::topology::Topology;

/// EC S24: requests (per mille) another client collides with.
pub const S24_COLLIDING_PER_MILLE: u32 = 100;

/// EC S7: the segments of one rank other than its consumer's base to the scheduler
/// dropped from the start for 2 to 8 s: the scheduler's first discovery pass gets `peers`
/// and the base's `event_port`, and the `event_port` reply of that rank is lost, so the
/// request times out after the 30 s control timeout. (A two-way cut only delays the
/// request: it leaves when the link heals and is answered in time.)
pub fn partial_discovery(rng: &mut ChaCha8Rng, topo: &Topology) -> Vec<Fault> {
    let others: Vec<String> = topo.consumers.iter().flat_map(|c| c.ranks.iter().skip(1).cloned()).collect();
    let (Some(to), false) = (topo.schedulers.first().cloned(), others.is_empty()) else { return Vec::new() };
    let from = others[rng.gen_range(0..others.len())].clone();
    let kind = FaultKind::OneWay { from, to, for_ms: rng.gen_range(2_000..=8_000) };
    vec![Fault { at_ms: rng.gen_range(0..=5), kind }]
}

/// EC S24: production's world, with colliding client-supplied transfer ids.
pub fn knobs_s24() -> Knobs {
    Knobs { colliding_ids_per_mille: Some(S24_COLLIDING_PER_MILLE), ..Knobs::default() }
}
