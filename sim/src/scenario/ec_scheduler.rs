//! Race scenarios of the scheduler and its event inbox (`ec-s7`, `ec-s24`).

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::faults::{Fault, FaultKind};
use crate::knobs::Knobs;
use crate::topology::Topology;

/// EC S24: requests (per mille) another client collides with.
pub const S24_COLLIDING_PER_MILLE: u32 = 100;

/// EC S7: the scheduler cut from one rank other than its consumer's base from the start,
/// for 3 to 15 s: its first discovery pass gets `peers` and the base's `event_port`, and
/// the `event_port` to that rank is lost and times out.
pub fn partial_discovery(rng: &mut ChaCha8Rng, topo: &Topology) -> Vec<Fault> {
    let others: Vec<String> = topo.consumers.iter().flat_map(|c| c.ranks.iter().skip(1).cloned()).collect();
    let (Some(a), false) = (topo.schedulers.first().cloned(), others.is_empty()) else { return Vec::new() };
    let b = others[rng.gen_range(0..others.len())].clone();
    vec![Fault { at_ms: 0, kind: FaultKind::Partition { a, b, for_ms: rng.gen_range(3_000..=15_000) } }]
}

/// EC S24: production's world, with colliding client-supplied transfer ids.
pub fn knobs_s24() -> Knobs {
    Knobs { colliding_ids_per_mille: Some(S24_COLLIDING_PER_MILLE), ..Knobs::default() }
}
