//! Benchmarks of a warm `ConsumerShard`, plus the heap cost of a live reservation.
//!
//! Run with `cargo bench -p ctlplane-core --bench shard`. Before the timings, the binary
//! prints how many heap bytes the shard keeps per live WRITING writer, measured with a
//! counting global allocator (requested bytes, without malloc's own per-block overhead).
//!
//! Frames are written the way Python's `json.dumps` writes them. Every timed operation
//! goes through `handle_request` against a shard that already holds thousands of live
//! reservations; the bookkeeping that keeps the shard at that size (taking READY tensors,
//! completing cancelled writers) runs in divan's input generation, outside the timing.

use ctlplane_core::ec::shard::reply_result;
use ctlplane_core::ec::{ConsumerShard, ShardConfig};
use ctlplane_core::Instant;
use divan::counter::ItemsCount;
use divan::Bencher;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::RefCell;
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts the heap bytes currently handed out (as requested by the program).
struct CountingAlloc;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`; the counter only observes sizes.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which `System` shares.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by this allocator (hence `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by this allocator (hence `System`) with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(new_size as isize - layout.size() as isize, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// The clock never moves: nothing expires while a benchmark runs.
const NOW: Instant = Instant::from_secs(1_000_000);
/// Live WRITING reservations a warm shard holds before a benchmark starts.
const WARM: u64 = 4096;
/// Offsets only (no device memory behind it): big enough never to fill.
const POOL_BYTES: u64 = 1 << 50;
/// Reservations counted by the memory measurement (`SHARD_BENCH_MEMORY_N` overrides it:
/// every reserve scans the whole book, so filling 100k takes minutes).
const MEMORY_RESERVATIONS: u64 = 100_000;
/// The same in `cargo test --benches` (a smoke run).
const MEMORY_RESERVATIONS_TEST: u64 = 2_000;
/// Keys of benchmark traffic start here, away from the warm keys.
const FRESH_KEYS: u64 = 1 << 40;

/// `{"ok": true, "result": {"reservation_id": "` : the id follows at this offset.
const RESERVE_REPLY_PREFIX: &[u8] = br#"{"ok": true, "result": {"reservation_id": ""#;

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `uuid4().hex`-shaped transfer id of key `k` (32 lowercase hex, random order).
fn transfer_id(k: u64) -> String {
    format!("{:016x}{:016x}", splitmix64(k), splitmix64(k ^ 0x5555_5555_5555_5555))
}

/// sha256-hex-shaped mm_hash of key `k` (64 lowercase hex).
fn mm_hash(k: u64) -> String {
    let w = |i: u64| splitmix64(k.wrapping_mul(4).wrapping_add(i) ^ 0xa5a5_a5a5_0000_0000);
    format!("{:016x}{:016x}{:016x}{:016x}", w(0), w(1), w(2), w(3))
}

/// The fields of a reserve request (64 x 128 float16 = 16 KiB), as `json.dumps` orders them.
fn reserve_fields(k: u64) -> String {
    format!(
        r#""transfer_id": "{}", "mm_hash": "{}", "nbytes": 16384, "shape": [64, 128], "dtype": "float16""#,
        transfer_id(k),
        mm_hash(k)
    )
}

fn reserve_frame(k: u64) -> Vec<u8> {
    format!(r#"{{"op": "reserve", {}}}"#, reserve_fields(k)).into_bytes()
}

fn reserve_batch_frame(keys: std::ops::Range<u64>) -> Vec<u8> {
    let items: Vec<String> = keys.map(|k| format!("{{{}}}", reserve_fields(k))).collect();
    format!(r#"{{"op": "reserve_batch", "items": [{}]}}"#, items.join(", ")).into_bytes()
}

fn complete_batch_frame(k: u64, reservation_id: &str) -> Vec<u8> {
    format!(
        r#"{{"op": "complete_batch", "items": [{{"transfer_id": "{}", "reservation_id": "{reservation_id}"}}]}}"#,
        transfer_id(k)
    )
    .into_bytes()
}

fn cancel_frame(k: u64, reservation_id: &str) -> Vec<u8> {
    format!(r#"{{"op": "cancel", "transfer_id": "{}", "reservation_id": "{reservation_id}"}}"#, transfer_id(k))
        .into_bytes()
}

fn status_frame(k: u64) -> Vec<u8> {
    format!(r#"{{"op": "status", "transfer_id": "{}"}}"#, transfer_id(k)).into_bytes()
}

type Shard = ConsumerShard<ChaCha8Rng>;

fn new_shard() -> Shard {
    let mut config = ShardConfig::new(19019, POOL_BYTES);
    config.dst_session = "10.0.0.2:17001".into();
    config.slab_base = 0x7f3a_0000_0000;
    ConsumerShard::new(config, ChaCha8Rng::seed_from_u64(0x5eed), NOW)
}

/// The `result` object of an `ok` reply; panics on an error reply.
fn ok_result(reply: &[u8]) -> serde_json::Value {
    match reply_result(reply) {
        Ok(v) => v,
        Err(e) => panic!("request failed: {e} ({})", String::from_utf8_lossy(reply)),
    }
}

/// The reservation id of a granted single reserve, sliced without parsing (timed code).
fn granted_id(reply: &[u8]) -> &[u8] {
    let at = RESERVE_REPLY_PREFIX.len();
    match reply.get(at..at + 32) {
        Some(id) if reply.starts_with(RESERVE_REPLY_PREFIX) => id,
        _ => panic!("reserve refused: {}", String::from_utf8_lossy(reply)),
    }
}

/// Reserves key `k` as a new writer and returns its reservation id.
fn reserve(shard: &mut Shard, k: u64) -> String {
    let result = ok_result(&shard.handle_request(&reserve_frame(k), NOW));
    assert_eq!(result["write"], true, "{result}");
    result["reservation_id"].as_str().expect("reservation_id").to_owned()
}

/// Completes writer `k` and asserts the completion was accepted.
fn complete(shard: &mut Shard, k: u64, reservation_id: &str) {
    let result = ok_result(&shard.handle_request(&complete_batch_frame(k, reservation_id), NOW));
    assert_eq!(result["items"][0]["completed"], true, "{result}");
}

/// Hands READY tensor `k` to the model: its record leaves the book.
fn take(shard: &mut Shard, k: u64) {
    if let Err(e) = shard.take(&transfer_id(k), &mm_hash(k)) {
        panic!("take of key {k}: {e}");
    }
}

/// A shard holding `warm` live WRITING writers (keys `0..warm`).
fn warm_shard(warm: u64) -> Shard {
    let mut shard = new_shard();
    for k in 0..warm {
        reserve(&mut shard, k);
    }
    assert_eq!(shard.writer_owned_count() as u64, warm);
    shard
}

/// A warm shard, the next fresh key, and work finished in timed sections that the next
/// input generation cleans up (outside the timing).
struct Harness<T> {
    shard: Shard,
    next: u64,
    done: Vec<T>,
}

impl<T> Harness<T> {
    fn new(warm: u64) -> RefCell<Self> {
        RefCell::new(Harness { shard: warm_shard(warm), next: FRESH_KEYS, done: Vec::with_capacity(1 << 16) })
    }

    fn fresh_key(&mut self) -> u64 {
        self.next += 1;
        self.next
    }
}

/// Input of the reserve + complete pair: key, reserve frame, complete frame whose
/// reservation id (at `id_at`) is filled in from the reserve reply.
struct PairInput {
    key: u64,
    reserve: Vec<u8>,
    complete: Vec<u8>,
    id_at: usize,
}

/// `reserve` of a new writer, then `complete_batch` of it with the id from the reply.
/// Parameter: live WRITING reservations already in the shard.
#[divan::bench(args = [256, 4096, 16384], sample_count = 1000)]
fn reserve_complete(bencher: Bencher, warm: u64) {
    let harness = Harness::<u64>::new(warm);
    let placeholder = "0".repeat(32);
    bencher
        .with_inputs(|| {
            let mut h = harness.borrow_mut();
            let h = &mut *h;
            for k in h.done.drain(..) {
                take(&mut h.shard, k);
            }
            let key = h.fresh_key();
            let complete = complete_batch_frame(key, &placeholder);
            let id_at = complete.len() - br#""}]}"#.len() - 32;
            PairInput { key, reserve: reserve_frame(key), complete, id_at }
        })
        .bench_local_values(|mut input| {
            let mut h = harness.borrow_mut();
            let reserved = h.shard.handle_request(&input.reserve, NOW);
            input.complete[input.id_at..input.id_at + 32].copy_from_slice(granted_id(&reserved));
            let completed = h.shard.handle_request(&input.complete, NOW);
            h.done.push(input.key);
            (reserved, completed, input)
        });
    let mut h = harness.borrow_mut();
    let h = &mut *h;
    for k in h.done.drain(..) {
        take(&mut h.shard, k);
    }
    assert_eq!(h.shard.writer_owned_count() as u64, warm, "the shard did not stay warm");
}

/// Plain `cancel` (no abandon) of a live WRITING writer: it turns CANCEL_PENDING and
/// keeps its memory. Its completion (outside the timing) then leaves a tombstone.
#[divan::bench(sample_count = 1000)]
fn cancel(bencher: Bencher) {
    let harness = Harness::<(u64, String)>::new(WARM);
    bencher
        .with_inputs(|| {
            let mut h = harness.borrow_mut();
            let h = &mut *h;
            for (k, rid) in h.done.drain(..) {
                complete(&mut h.shard, k, &rid);
            }
            let key = h.fresh_key();
            let rid = reserve(&mut h.shard, key);
            (cancel_frame(key, &rid), (key, rid))
        })
        .bench_local_values(|(frame, ticket)| {
            let mut h = harness.borrow_mut();
            let reply = h.shard.handle_request(&frame, NOW);
            h.done.push(ticket);
            (reply, frame)
        });
}

/// `status` of a live writer, cycling through the warm transfers.
#[divan::bench(sample_count = 1000)]
fn status(bencher: Bencher) {
    let mut shard = warm_shard(WARM);
    let frames: Vec<Vec<u8>> = (0..WARM).map(status_frame).collect();
    assert!(ok_result(&shard.handle_request(&frames[0], NOW)).is_object());
    let mut i = 0;
    bencher.bench_local(|| {
        i = (i + 1) % frames.len();
        shard.handle_request(&frames[i], NOW)
    });
}

/// `reserve_batch` of 16 new writers (completed and taken outside the timing).
#[divan::bench(sample_count = 1000)]
fn reserve_batch_16(bencher: Bencher) {
    const ITEMS: u64 = 16;
    let harness = Harness::<(u64, Vec<u8>)>::new(WARM);
    bencher
        .counter(ItemsCount::new(ITEMS))
        .with_inputs(|| {
            let mut h = harness.borrow_mut();
            let h = &mut *h;
            for (first, reply) in std::mem::take(&mut h.done) {
                let items = ok_result(&reply)["items"].as_array().cloned().expect("items");
                assert_eq!(items.len() as u64, ITEMS);
                for (k, item) in (first..).zip(items) {
                    let rid = item["result"]["reservation_id"].as_str().expect("granted item");
                    complete(&mut h.shard, k, rid);
                    take(&mut h.shard, k);
                }
            }
            let first = h.fresh_key();
            h.next += ITEMS - 1;
            (first, reserve_batch_frame(first..first + ITEMS))
        })
        .bench_local_values(|(first, frame)| {
            let mut h = harness.borrow_mut();
            let reply = h.shard.handle_request(&frame, NOW);
            h.done.push((first, reply));
            frame
        });
}

/// Heap bytes the shard keeps per live WRITING writer: everything `reserve` adds (record,
/// writer index, slab `used` entry, map nodes), with no events queued.
fn bytes_per_live_reservation(n: u64) -> (f64, std::time::Duration) {
    let mut shard = new_shard();
    let before = live_bytes();
    let started = std::time::Instant::now();
    for k in 0..n {
        let reply = shard.handle_request(&reserve_frame(k), NOW);
        // Every reserve must be a new writer (`"write": true`), or the count means nothing.
        if k == 0 {
            assert_eq!(ok_result(&reply)["write"], true);
        }
    }
    let elapsed = started.elapsed();
    let after = live_bytes();
    assert_eq!(shard.writer_owned_count() as u64, n);
    assert_eq!(shard.book().len() as u64, n);
    assert_eq!(shard.book().allocations().len() as u64, n);
    assert_eq!(shard.pending_events(), 0, "events would count as reservation memory");
    assert_eq!(shard.stats().error_replies, 0);
    ((after - before) as f64 / n as f64, elapsed)
}

fn main() {
    let benching = std::env::args().any(|a| a == "--bench") && !std::env::args().any(|a| a == "--test");
    let n = match std::env::var("SHARD_BENCH_MEMORY_N") {
        Ok(v) => v.parse().expect("SHARD_BENCH_MEMORY_N must be a count"),
        Err(_) if benching => MEMORY_RESERVATIONS,
        Err(_) => MEMORY_RESERVATIONS_TEST,
    };
    let (bytes, elapsed) = bytes_per_live_reservation(n);
    println!("memory: {bytes:.1} bytes per live reservation ({n} WRITING writers)");
    println!(
        "        goal <= 256 B: {}; filling took {:.2?} ({:.1} us per reserve on average)",
        if bytes <= 256.0 { "met" } else { "NOT met" },
        elapsed,
        elapsed.as_secs_f64() * 1e6 / n as f64
    );
    divan::main();
}
