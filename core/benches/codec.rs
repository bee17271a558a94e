//! Benchmarks of the hot wire codecs, each fast path next to its general path.
//!
//! Run with `cargo bench -p ctlplane-core --bench codec`. Frames are the ones the EC
//! round-trip and event benchmarks send (32-hex transfer ids, 64-hex mm_hashes, 64x128
//! float16) and the W1 `lookup` of the P2P benchmark.

use ctlplane_core::ec::dtype::DType;
use ctlplane_core::ec::ids::ReservationId;
use ctlplane_core::ec::requests::{self, ReserveSpec};
use ctlplane_core::ec::reservations::Status;
use ctlplane_core::ec::wire::{self, CompleteResult, Items, ReserveReply, ReserveResult};
use ctlplane_core::p2p::messages::Message;
use ctlplane_core::p2p::value::{self, Value};
use divan::{black_box, Bencher};
use std::sync::Arc;

fn main() {
    divan::main();
}

fn spec() -> ReserveSpec {
    ReserveSpec {
        transfer_id: format!("{:032x}", 0x3f2a_9c1e_u64),
        mm_hash: format!("{:064x}", 0x9c1e_5d7a_u64),
        shape: vec![64, 128],
        dtype: DType::Float16,
    }
}

fn reserve_frame() -> Vec<u8> {
    requests::reserve(&spec()).unwrap_or_default()
}

fn complete_batch_frame(n: usize) -> Vec<u8> {
    let ids: Vec<(String, String)> = (0..n).map(|i| (format!("{i:032x}"), format!("{:032x}", i + 1))).collect();
    requests::complete_batch(ids.iter().map(|(t, r)| (t.as_str(), r.as_str())))
}

fn reserve_reply() -> ReserveReply {
    ReserveReply::Granted(ReserveResult {
        reservation_id: format!("{:032x}", 0x5d1c_0b9a_u64),
        dst_session: "10.0.0.5:15417".into(),
        dst_ptr: 140_213_339_553_792,
        nbytes: 16384,
        write: true,
        ready: false,
        cached: false,
    })
}

fn status() -> Status {
    Status {
        mm_hash: Arc::from(format!("{:064x}", 0x9c1e_5d7a_u64).as_str()),
        ready: true,
        reservation_id: ReservationId::parse(&format!("{:032x}", 0x5d1c_0b9a_u64)),
        nbytes: 16384,
        shape: vec![64, 128].into_boxed_slice(),
        dtype: DType::Float16,
    }
}

mod ec_decode {
    use super::*;

    #[divan::bench]
    fn reserve_request(b: Bencher) {
        let frame = reserve_frame();
        b.bench(|| wire::decode_request(black_box(&frame), wire::DEFAULT_MAX_BATCH_ITEMS));
    }

    #[divan::bench]
    fn reserve_request_general(b: Bencher) {
        let frame = reserve_frame();
        b.bench(|| wire::decode_request_general(black_box(&frame), wire::DEFAULT_MAX_BATCH_ITEMS));
    }

    #[divan::bench(args = [1, 1024])]
    fn complete_batch_request(b: Bencher, n: usize) {
        let frame = complete_batch_frame(n);
        b.counter(divan::counter::ItemsCount::new(n))
            .bench(|| wire::decode_request(black_box(&frame), wire::DEFAULT_MAX_BATCH_ITEMS));
    }

    #[divan::bench(args = [1, 1024])]
    fn complete_batch_request_general(b: Bencher, n: usize) {
        let frame = complete_batch_frame(n);
        b.counter(divan::counter::ItemsCount::new(n))
            .bench(|| wire::decode_request_general(black_box(&frame), wire::DEFAULT_MAX_BATCH_ITEMS));
    }

    #[divan::bench]
    fn reserve_reply(b: Bencher) {
        let frame = wire::encode_ok(&super::reserve_reply());
        b.bench(|| wire::decode_reply(black_box(&frame)));
    }

    #[divan::bench]
    fn reserve_reply_general(b: Bencher) {
        let frame = wire::encode_ok(&super::reserve_reply());
        b.bench(|| wire::parse_json_general(black_box(&frame)));
    }
}

mod ec_encode {
    use super::*;

    #[divan::bench]
    fn reserve_request() -> Option<Vec<u8>> {
        requests::reserve(black_box(&spec()))
    }

    #[divan::bench]
    fn reserve_reply(b: Bencher) {
        let reply = super::reserve_reply();
        b.bench(|| wire::encode_ok(black_box(&reply)));
    }

    #[divan::bench]
    fn reserve_reply_general(b: Bencher) {
        let reply = super::reserve_reply();
        b.bench(|| wire::encode_ok_general(black_box(&reply)));
    }

    #[divan::bench]
    fn complete_batch_reply(b: Bencher) {
        let items = Items { items: vec![CompleteResult { completed: true, became_ready: true }; 16] };
        b.bench(|| wire::encode_ok(black_box(&items)));
    }

    #[divan::bench]
    fn complete_batch_reply_general(b: Bencher) {
        let items = Items { items: vec![CompleteResult { completed: true, became_ready: true }; 16] };
        b.bench(|| wire::encode_ok_general(black_box(&items)));
    }

    #[divan::bench]
    fn ready_event(b: Bencher) {
        let (tid, status) = (format!("{:032x}", 0x3f2a_9c1e_u64), status());
        b.bench(|| wire::encode_event(black_box(&tid), black_box(&status), 19019));
    }

    #[divan::bench]
    fn ready_event_general(b: Bencher) {
        let (tid, status) = (format!("{:032x}", 0x3f2a_9c1e_u64), status());
        b.bench(|| wire::encode_event_general(black_box(&tid), black_box(&status), 19019));
    }
}

mod p2p {
    use super::*;

    /// The P2P benchmark's W1 `lookup`.
    fn lookup() -> Vec<u8> {
        value::encode(&Value::map([
            ("type", Value::from("lookup")),
            ("kv_request_id", Value::from("req-000001")),
            ("keys", Value::Array(vec![Value::Bin(vec![0; 8])])),
            ("round_seq", Value::from(7u64)),
        ]))
    }

    #[divan::bench]
    fn decode_value(b: Bencher) {
        let frame = lookup();
        b.bench(|| value::decode(black_box(&frame)));
    }

    #[divan::bench]
    fn decode_and_parse(b: Bencher) {
        let frame = lookup();
        b.bench(|| value::decode(black_box(&frame)).map(|v| Message::parse(&v)));
    }

    #[divan::bench]
    fn encode_value(b: Bencher) {
        let msg = value::decode(&lookup()).unwrap_or(Value::Nil);
        b.bench(|| value::encode(black_box(&msg)));
    }
}
