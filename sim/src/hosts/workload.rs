//! The run's workload: which consumer requests arrive, when, and which items they need.
//!
//! In production an EPD proxy mints one transfer id per multimodal item and hands the same
//! ids to an encoder (producer) and to the consumer's scheduler. Here the workload is drawn
//! from the seed and both sides read it from the world. Items are drawn from a small,
//! skewed set of mm_hashes, so that two requests often need one item: concurrent pushes
//! of one hash make followers, a push after a load hits the resident cache, and a retried
//! reserve is a duplicate.

use std::time::Duration;

use ctlplane_core::ec::producer::PushItem;
use ctlplane_core::ec::DType;
use ctlplane_core::time::Instant;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Shape of the workload.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    /// Requests arrive during `[start, start + span)`.
    pub start: Duration,
    pub span: Duration,
    /// Mean gap between two requests.
    pub mean_gap: Duration,
    /// Distinct mm_hashes the items are drawn from.
    pub hashes: usize,
    /// Every `k`-th mm_hash is an empty tensor (`[0, 128]`, zero bytes): torch hands such a
    /// tensor a null data pointer, so its reservation takes no slab memory. `None`: none is.
    pub empty_every: Option<usize>,
    /// Items per request, at most.
    pub max_items: usize,
    /// Longest encoder run: a push's source is bound this long (at most) after it starts.
    pub max_encode: Duration,
    /// Shortest encoder run (production's are all short: zero).
    pub min_encode: Duration,
    /// A second wave of requests arriving during `[start, start + span)`, after the main
    /// one (`None`: production's single wave). A scenario sets it past the heal and every
    /// client timeout, to see whether the service works again once the faults are gone.
    pub late_wave: Option<(Duration, Duration)>,
    /// Encoder calls the proxy retries (`None`: production's workload, no retry). ec-behaviour.md S24:
    /// transfer ids may be client-supplied, so a retried request carries the same ids and
    /// its push runs on another producer while the first one is still on its way.
    pub retry: Option<RetryConfig>,
    /// Requests the client gives up on before they resolve (`None`: none is aborted).
    pub abort: Option<AbortConfig>,
}

/// Aborted requests: vLLM finishes a request whose client went away, its items still
/// waiting; the scheduler cancels them while their pushes may still be on the way.
#[derive(Clone, Debug)]
pub struct AbortConfig {
    /// Requests aborted, per mille.
    pub per_mille: u32,
    /// The abort comes this long after the request arrives (at least, at most).
    pub after: (Duration, Duration),
}

/// Retried encoder calls: the same items pushed a second time by another producer.
#[derive(Clone, Debug)]
pub struct RetryConfig {
    /// Requests retried, per mille.
    pub per_mille: u32,
    /// The retry starts this long after the request (at least, at most).
    pub after: (Duration, Duration),
    /// The retried encoder's run time (at least, at most).
    pub encode: (Duration, Duration),
}

/// The second push of a retried request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retry {
    /// When the retried call reaches the producer.
    pub at: Instant,
    /// Index into `Topology::producers`: never the first push's.
    pub producer: usize,
    /// Its encoder run time.
    pub encode: Duration,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        WorkloadConfig {
            start: Duration::from_millis(200),
            span: Duration::from_secs(19),
            mean_gap: Duration::from_millis(80),
            hashes: 64,
            empty_every: None,
            max_items: 3,
            max_encode: Duration::from_millis(40),
            min_encode: Duration::ZERO,
            late_wave: None,
            retry: None,
            abort: None,
        }
    }
}

/// One consumer request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub id: u64,
    /// When the proxy hands it to the producer and the scheduler.
    pub at: Instant,
    /// Index into `Topology::consumers`.
    pub consumer: usize,
    /// Index into `Topology::producers`.
    pub producer: usize,
    pub items: Vec<PushItem>,
    /// Encoder run time: the push is reserved at once and its source bound this much later.
    pub encode: Duration,
    /// A retried encoder call pushing the same items again (`WorkloadConfig::retry`).
    pub retry: Option<Retry>,
    /// When the client aborts the request, if it does (`WorkloadConfig::abort`).
    pub abort: Option<Instant>,
}

/// Draws the requests of a run, in arrival order.
pub fn draw(config: &WorkloadConfig, consumers: usize, producers: usize, rng: &mut ChaCha8Rng) -> Vec<Request> {
    let hashes: Vec<(String, u64)> = (0..config.hashes)
        .map(|i| {
            // Rows per hash fixed, so every push of one hash has one shape.
            let empty = config.empty_every.is_some_and(|k| i % k.max(1) == k.max(1) - 1);
            let rows = if empty { 0 } else { [16u64, 64, 256, 1024][i % 4] };
            (hex(rng, 32), rows)
        })
        .collect();
    let mut out = Vec::new();
    draw_wave(config, &hashes, config.start, config.span, consumers, producers, rng, &mut out);
    if let Some((start, span)) = config.late_wave {
        draw_wave(config, &hashes, start, span, consumers, producers, rng, &mut out);
    }
    // Drawn after everything else, so a workload without retries is drawn as before.
    if let Some(retry) = &config.retry {
        draw_retries(retry, producers, rng, &mut out);
    }
    if let Some(abort) = &config.abort {
        draw_aborts(abort, rng, &mut out);
    }
    out
}

/// Marks the aborted requests, each `after` its arrival.
fn draw_aborts(config: &AbortConfig, rng: &mut ChaCha8Rng, out: &mut [Request]) {
    let (lo, hi) = (config.after.0.as_nanos() as u64, config.after.1.max(config.after.0).as_nanos() as u64);
    for req in out.iter_mut() {
        if rng.gen_range(0..1000) >= config.per_mille {
            continue;
        }
        req.abort = Some(Instant::from_nanos(req.at.as_nanos() + rng.gen_range(lo..=hi)));
    }
}

/// Marks the retried requests: each retry starts `after` its request, on another producer.
/// With one producer there is none: its push manager would merge the duplicate spec into
/// the push in flight (ec-behaviour.md §3.9).
fn draw_retries(config: &RetryConfig, producers: usize, rng: &mut ChaCha8Rng, out: &mut [Request]) {
    if producers < 2 {
        return;
    }
    let span = |rng: &mut ChaCha8Rng, (lo, hi): (Duration, Duration)| {
        Duration::from_nanos(rng.gen_range(lo.as_nanos() as u64..=hi.max(lo).as_nanos() as u64))
    };
    for req in out.iter_mut() {
        if rng.gen_range(0..1000) >= config.per_mille {
            continue;
        }
        let after = span(rng, config.after);
        let encode = span(rng, config.encode);
        let producer = (req.producer + rng.gen_range(1..producers)) % producers;
        let at = Instant::from_nanos(req.at.as_nanos() + after.as_nanos() as u64);
        req.retry = Some(Retry { at, producer, encode });
    }
}

/// Appends the requests arriving during `[start, start + span)` to `out`.
#[allow(clippy::too_many_arguments)]
fn draw_wave(
    config: &WorkloadConfig,
    hashes: &[(String, u64)],
    start: Duration,
    span: Duration,
    consumers: usize,
    producers: usize,
    rng: &mut ChaCha8Rng,
    out: &mut Vec<Request>,
) {
    let mut t = start;
    let end = start + span;
    let gap_ns = config.mean_gap.as_nanos() as u64;
    while t < end && consumers > 0 && producers > 0 && !hashes.is_empty() {
        // No more items than distinct hashes: a request names each hash once.
        let n = rng.gen_range(1..=config.max_items.max(1)).min(hashes.len());
        let mut items: Vec<PushItem> = Vec::with_capacity(n);
        while items.len() < n {
            // Skewed: the low indices are popular.
            let a = rng.gen_range(0..hashes.len());
            let b = rng.gen_range(0..hashes.len());
            let (mm_hash, rows) = &hashes[a.min(b)];
            if items.iter().any(|i| &i.mm_hash == mm_hash) {
                continue;
            }
            let dtype = DType::Float16;
            items.push(PushItem {
                transfer_id: hex(rng, 16),
                mm_hash: mm_hash.clone(),
                nbytes: rows * 128 * dtype.itemsize(),
                shape: vec![*rows, 128],
                dtype: dtype.name().to_string(),
            });
        }
        out.push(Request {
            id: out.len() as u64,
            at: Instant::from_nanos(t.as_nanos() as u64),
            consumer: rng.gen_range(0..consumers),
            producer: rng.gen_range(0..producers),
            items,
            encode: Duration::from_nanos(rng.gen_range(
                config.min_encode.as_nanos() as u64..=config.max_encode.max(config.min_encode).as_nanos() as u64,
            )),
            retry: None,
            abort: None,
        });
        t += Duration::from_nanos(rng.gen_range(0..=2 * gap_ns));
    }
}

fn hex(rng: &mut ChaCha8Rng, bytes: usize) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    (0..bytes * 2).map(|_| char::from(DIGITS[rng.gen_range(0..16)])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use std::collections::BTreeSet;

    #[test]
    fn every_kth_hash_is_an_empty_tensor_and_nothing_else_changes() {
        let plain = WorkloadConfig::default();
        let cfg = WorkloadConfig { empty_every: Some(3), ..plain.clone() };
        let a = draw(&plain, 2, 2, &mut ChaCha8Rng::seed_from_u64(5));
        let b = draw(&cfg, 2, 2, &mut ChaCha8Rng::seed_from_u64(5));
        assert_eq!(a.len(), b.len());
        let (mut empty, mut sized) = (0, 0);
        for (x, y) in a.iter().zip(&b).flat_map(|(x, y)| x.items.iter().zip(&y.items)) {
            assert_eq!((&x.transfer_id, &x.mm_hash), (&y.transfer_id, &y.mm_hash));
            if y.nbytes == 0 {
                assert_eq!(y.shape, vec![0, 128]);
                empty += 1;
            } else {
                assert_eq!(x, y);
                sized += 1;
            }
        }
        assert!(empty > 0 && sized > 0, "{empty} empty, {sized} sized");
    }

    #[test]
    fn workload_is_seeded_and_shares_hashes() {
        let cfg = WorkloadConfig::default();
        let a = draw(&cfg, 2, 2, &mut ChaCha8Rng::seed_from_u64(1));
        let b = draw(&cfg, 2, 2, &mut ChaCha8Rng::seed_from_u64(1));
        let c = draw(&cfg, 2, 2, &mut ChaCha8Rng::seed_from_u64(2));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.len() > 100, "{}", a.len());
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        let items: Vec<&PushItem> = a.iter().flat_map(|r| &r.items).collect();
        let tids: BTreeSet<&str> = items.iter().map(|i| i.transfer_id.as_str()).collect();
        assert_eq!(tids.len(), items.len(), "transfer ids are unique");
        let hashes: BTreeSet<&str> = items.iter().map(|i| i.mm_hash.as_str()).collect();
        assert!(hashes.len() < items.len() / 4, "hashes repeat");
        for i in &items {
            assert_eq!(i.nbytes, i.shape.iter().product::<u64>() * 2);
        }
        assert!(a.iter().all(|r| r.retry.is_none()), "no retry unless configured");
    }

    #[test]
    fn retries_repeat_a_request_on_another_producer_and_leave_the_rest_as_drawn() {
        let plain = WorkloadConfig::default();
        let retry = RetryConfig {
            per_mille: 500,
            after: (Duration::from_millis(100), Duration::from_millis(500)),
            encode: (Duration::from_secs(150), Duration::from_secs(151)),
        };
        let cfg = WorkloadConfig { retry: Some(retry), ..plain.clone() };
        let base = draw(&plain, 1, 2, &mut ChaCha8Rng::seed_from_u64(3));
        let retried = draw(&cfg, 1, 2, &mut ChaCha8Rng::seed_from_u64(3));
        assert_eq!(base.len(), retried.len());
        let mut n = 0;
        for (b, r) in base.iter().zip(&retried) {
            assert_eq!(Request { retry: None, ..r.clone() }, *b, "the requests themselves are unchanged");
            let Some(t) = &r.retry else { continue };
            n += 1;
            assert_ne!(t.producer, r.producer, "another producer");
            let after = t.at.as_nanos() - r.at.as_nanos();
            assert!((100_000_000..=500_000_000).contains(&after), "{after}");
            assert!(t.encode >= Duration::from_secs(150) && t.encode <= Duration::from_secs(151));
        }
        assert!(n > base.len() / 4 && n < base.len() * 3 / 4, "{n} of {}", base.len());
    }

    #[test]
    fn aborts_mark_requests_within_their_window_and_leave_the_rest_as_drawn() {
        let plain = WorkloadConfig::default();
        let abort = AbortConfig { per_mille: 300, after: (Duration::from_millis(10), Duration::from_secs(2)) };
        let cfg = WorkloadConfig { abort: Some(abort), ..plain.clone() };
        let base = draw(&plain, 2, 2, &mut ChaCha8Rng::seed_from_u64(4));
        let aborted = draw(&cfg, 2, 2, &mut ChaCha8Rng::seed_from_u64(4));
        assert_eq!(base.len(), aborted.len());
        let mut n = 0;
        for (b, r) in base.iter().zip(&aborted) {
            assert_eq!(Request { abort: None, ..r.clone() }, *b, "the requests themselves are unchanged");
            let Some(at) = r.abort else { continue };
            n += 1;
            let after = at.as_nanos() - r.at.as_nanos();
            assert!((10_000_000..=2_000_000_000).contains(&after), "{after}");
        }
        assert!(n > base.len() / 10 && n < base.len() / 2, "{n} of {}", base.len());
        assert!(base.iter().all(|r| r.abort.is_none()), "no abort unless configured");
    }
}
