//! EC event decoding in the inbox: any PULL frame decodes to an event, a skip or a typed
//! error, and a decoded event fed to the scheduler's readiness table keeps it consistent.

#![no_main]

use ctlplane_core::ec::inbox::decode_event;
use ctlplane_core::ec::readiness::{Readiness, ReadinessConfig};
use ctlplane_core::Instant;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte: how many shards the replica has and whether a request waits for it.
    let (head, frame) = data.split_first().unwrap_or((&0, data));
    let event = match decode_event(frame) {
        Ok(Some(event)) => event,
        Ok(None) | Err(_) => return,
    };
    // Whatever decoded must survive a display of its error-free fields.
    let _ = format!("{event:?}");
    let shards = usize::from(head & 0x07) + 1;
    let mut readiness = Readiness::new(ReadinessConfig::default());
    let now = Instant::from_secs(1);
    if head & 0x08 != 0 {
        let _ = readiness.wait_for_event(&event.transfer_id, &event.mm_hash, now);
    }
    // The same event from every shard in turn (duplicates included) and a timeout.
    for _ in 0..=shards {
        let _ = readiness.handle_event(event.clone(), shards, now);
    }
    readiness.handle_timeout(Instant::from_secs(1_000));
    while readiness.poll_notice().is_some() {}
    assert!(readiness.partial_count() <= 1, "one transfer id left {} partial entries", readiness.partial_count());
});
