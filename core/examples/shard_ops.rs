//! Drives a warm `ConsumerShard` through N reserve + complete_batch pairs, for
//! instruction counting: `valgrind --tool=callgrind target/release/examples/shard_ops 2000`.

use ctlplane_core::ec::{ConsumerShard, ShardConfig};
use ctlplane_core::Instant;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;

fn main() {
    let n: u64 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(2000);
    let mut config = ShardConfig::new(19019, 1 << 40);
    config.dst_session = "10.0.0.5:15417".into();
    let mut shard = ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(1), Instant::ZERO);
    let now = Instant::from_secs(1);
    for i in 0..n {
        let tid = format!("{i:032x}");
        let hash = format!("{i:064x}");
        let reserve = format!(
            r#"{{"op": "reserve", "transfer_id": "{tid}", "mm_hash": "{hash}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16"}}"#
        );
        let reply = shard.handle_request(reserve.as_bytes(), now);
        let text = std::str::from_utf8(&reply).unwrap_or_default();
        let rid = text.split("\"reservation_id\": \"").nth(1).map(|r| &r[..32]).unwrap_or_default();
        let complete =
            format!(r#"{{"op": "complete_batch", "items": [{{"transfer_id": "{tid}", "reservation_id": "{rid}"}}]}}"#);
        shard.handle_request(complete.as_bytes(), now);
        while shard.peek_event().is_some() {
            shard.confirm_sent();
        }
    }
    println!("{} records", shard.book().len());
}
