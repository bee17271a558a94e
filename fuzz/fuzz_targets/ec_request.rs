//! EC request decoding: any frame off the REP socket decodes to a request or a typed
//! error (never a panic), and the shard answers it with exactly one reference envelope.

#![no_main]

use ctlplane_core::ec::wire::{self, DEFAULT_MAX_BATCH_ITEMS};
use ctlplane_core::ec::{ConsumerShard, ShardConfig};
use ctlplane_core::Instant;
use libfuzzer_sys::fuzz_target;
use rand_chacha::ChaCha8Rng;
use rand_core::SeedableRng;

fuzz_target!(|frame: &[u8]| {
    // A small batch limit too, so the limit path is reached by short inputs.
    let _ = wire::decode_request(frame, DEFAULT_MAX_BATCH_ITEMS);
    let _ = wire::decode_request(frame, 2);

    let mut config = ShardConfig::new(19020, 1 << 20);
    config.max_batch_items = 4;
    let mut shard = ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(1), Instant::ZERO);
    let reply = shard.handle_request(frame, Instant::from_secs(1));
    ctlplane_fuzz::envelope(&reply);
    if let Err(e) = shard.book().check_invariants() {
        panic!("invariant broken after {:?}: {e}", String::from_utf8_lossy(frame));
    }
});
