//! The reservation book's rules, one test per rule of ec-behaviour.md §3, named after it.

use ctlplane_core::ec::reservations::{
    BookConfig, FollowerCompletion, ReservationBook, ReserveError, ReserveRequest, Reserved, TakeError,
};
use ctlplane_core::ec::slab::View;
use ctlplane_core::ec::{DType, State};
use ctlplane_core::Instant;
use rand_chacha::rand_core::SeedableRng;
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

type Book = ReservationBook<ChaCha8Rng>;

const T0: Instant = Instant::from_secs(1000);
const TTL: Duration = Duration::from_secs(300);

fn book(pool: u64) -> Book {
    ReservationBook::new(pool, BookConfig::default(), ChaCha8Rng::seed_from_u64(1))
}

fn book_with(pool: u64, config: BookConfig) -> Book {
    ReservationBook::new(pool, config, ChaCha8Rng::seed_from_u64(1))
}

/// A float16 tensor of `elems` elements.
fn req(tid: &str, hash: &str, elems: u64) -> ReserveRequest {
    ReserveRequest {
        transfer_id: tid.into(),
        mm_hash: hash.into(),
        nbytes: elems * 2,
        shape: vec![elems],
        dtype: DType::Float16,
    }
}

struct Grant {
    rid: String,
    view: View,
    write: bool,
    ready: bool,
    cached: bool,
}

fn grant(r: Result<Reserved, ReserveError>) -> Grant {
    match r {
        Ok(Reserved::Granted { reservation_id, view, write, ready, cached }) => {
            Grant { rid: reservation_id.to_string(), view, write, ready, cached }
        }
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn check(b: &Book) {
    if let Err(e) = b.check_invariants() {
        panic!("invariant broken: {e}");
    }
}

fn writer(b: &mut Book, tid: &str, hash: &str) -> Grant {
    let g = grant(b.reserve(&req(tid, hash, 32), T0));
    assert!(g.write);
    g
}

// ---- reserve (3.3) ----

#[test]
fn reserve_rule1_shutting_down_refuses_new_reservations() {
    let mut b = book(4096);
    b.begin_shutdown(T0);
    let err = b.reserve(&req("t", "h", 8), T0).unwrap_err();
    assert_eq!(err.to_string(), "Consumer reservation manager is shutting down");
}

#[test]
fn reserve_rule2_tombstone_answers_cancelled_without_memory() {
    let mut b = book(4096);
    assert!(b.cancel("t", "", false, false, T0));
    assert_eq!(b.reserve(&req("t", "h", 8), T0), Ok(Reserved::Cancelled));
    assert_eq!(b.slab().used_bytes(), 0);
    check(&b);
}

#[test]
fn reserve_rule3_expired_record_is_replaced_by_a_fresh_reservation() {
    let mut b = book(4096);
    let first = writer(&mut b, "t", "h");
    assert!(b.cancel("t", &first.rid, true, true, T0));
    assert_eq!(b.state_of("t"), Some(State::Expired));
    let second = grant(b.reserve(&req("t", "h", 32), T0));
    assert!(second.write);
    assert_ne!(first.rid, second.rid);
    check(&b);
}

#[test]
fn reserve_rule4_expire_pending_writer_refuses_a_re_reserve() {
    let mut b = book(4096);
    writer(&mut b, "t", "h");
    b.expire(T0 + TTL);
    assert_eq!(b.state_of("t"), Some(State::ExpirePending));
    let err = b.reserve(&req("t", "h", 32), T0 + TTL).unwrap_err();
    assert_eq!(err.to_string(), "Transfer 't' still has an active writer");
}

#[test]
fn reserve_rule5_duplicate_shares_the_destination_under_its_own_id_and_refreshes_the_lease() {
    let mut b = book(4096);
    let first = writer(&mut b, "t", "h");
    let later = T0 + Duration::from_secs(200);
    let dup = grant(b.reserve(&req("t", "h", 32), later));
    assert_eq!((dup.write, dup.ready, dup.cached), (false, false, false));
    assert_ne!(dup.rid, first.rid, "a duplicate's grant is its own (dup-push)");
    assert_eq!(dup.view, first.view);
    // The lease now runs from `later`: still WRITING 300 s after T0.
    b.expire(T0 + TTL);
    assert_eq!(b.state_of("t"), Some(State::Writing));
    b.expire(later + TTL);
    assert_eq!(b.state_of("t"), Some(State::ExpirePending));
}

#[test]
fn reserve_rule5_mismatched_duplicate_is_a_conflict() {
    let mut b = book(4096);
    writer(&mut b, "t", "h");
    for other in [req("t", "other", 32), req("t", "h", 16)] {
        assert_eq!(b.reserve(&other, T0), Err(ReserveError::ConflictingReservation));
    }
    let mut float32 = req("t", "h", 16);
    float32.dtype = DType::Float32;
    assert_eq!(b.reserve(&float32, T0).unwrap_err().to_string(), "conflicting reservation for transfer_id");
}

#[test]
fn reserve_rule5_duplicate_of_a_ready_record_reports_ready() {
    let mut b = book(4096);
    let g = writer(&mut b, "t", "h");
    assert_eq!(b.complete("t", &g.rid, T0), (true, true));
    let dup = grant(b.reserve(&req("t", "h", 32), T0));
    assert_ne!(dup.rid, g.rid);
    assert_eq!((dup.write, dup.ready, dup.cached), (false, true, false));
    assert!(b.cancel("t", &dup.rid, true, false, T0), "the duplicate's abandon releases its own grant");
    assert_eq!(b.state_of("t"), Some(State::Ready), "and not the record the first grant made READY");
}

#[test]
fn reserve_rule5_cancel_pending_record_answers_cancelled() {
    let mut b = book(4096);
    writer(&mut b, "t", "h");
    assert!(b.cancel("t", "", false, false, T0));
    assert_eq!(b.reserve(&req("t", "h", 32), T0), Ok(Reserved::Cancelled));
}

#[test]
fn reserve_rule6_resident_hit_is_ready_at_once_with_a_lease() {
    let mut b = book(4096);
    let g = writer(&mut b, "a", "h");
    b.complete("a", &g.rid, T0);
    b.take("a", "h").unwrap();
    let hit = grant(b.reserve(&req("b", "h", 32), T0));
    assert_eq!((hit.write, hit.ready, hit.cached), (false, true, true));
    assert_eq!(hit.view.region, g.view.region);
    assert_eq!(b.state_of("b"), Some(State::Ready));
    assert_eq!(b.slab().used_bytes(), 256);
    check(&b);
}

#[test]
fn reserve_rule6_resident_hit_with_other_shape_is_a_conflict() {
    let mut b = book(4096);
    let g = writer(&mut b, "a", "h");
    b.complete("a", &g.rid, T0);
    b.take("a", "h").unwrap();
    let err = b.reserve(&req("b", "h", 16), T0).unwrap_err();
    assert_eq!(err.to_string(), "conflicting cached tensor for mm_hash");
}

#[test]
fn reserve_rule7_follower_shares_the_writers_destination() {
    let mut b = book(4096);
    let w = writer(&mut b, "w", "h");
    let f = grant(b.reserve(&req("f", "h", 32), T0));
    assert_eq!((f.write, f.ready, f.cached), (false, false, false));
    assert_eq!(f.view, w.view);
    assert_ne!(f.rid, w.rid);
    assert_eq!(b.slab().used_bytes(), 256, "a follower allocates nothing");
    check(&b);
}

#[test]
fn reserve_rule7_follower_with_other_shape_is_a_conflict() {
    let mut b = book(4096);
    writer(&mut b, "w", "h");
    let err = b.reserve(&req("f", "h", 16), T0).unwrap_err();
    assert_eq!(err.to_string(), "conflicting in-flight tensor for mm_hash");
}

#[test]
fn reserve_rule8_full_pool_expires_then_evicts_then_refuses() {
    let mut b = book(512);
    let a = writer(&mut b, "a", "ha");
    b.complete("a", &a.rid, T0);
    b.take("a", "ha").unwrap();
    b.retire("ha");
    let c = writer(&mut b, "c", "hc");
    b.complete("c", &c.rid, T0);
    // Pool full: one READY record and one retired resident. The resident is evicted.
    let d = grant(b.reserve(&req("d", "hd", 32), T0));
    assert!(d.write);
    assert_eq!(d.view.region, a.view.region);
    assert_eq!(b.drain_reclaimed(), vec!["ha".to_string()]);
    // Nothing evictable and nothing expired: full.
    let err = b.reserve(&req("e", "he", 32), T0).unwrap_err();
    assert_eq!(err.to_string(), "EC consumer buffer pool is full");
    // Once the READY record's lease lapses, expiry frees it and the retry succeeds.
    let later = T0 + TTL;
    let e = grant(b.reserve(&req("e", "he", 32), later));
    assert_eq!(e.view.region, c.view.region);
    check(&b);
}

#[test]
fn reserve_sizing_aligns_to_256_and_keeps_exact_nbytes() {
    let mut b = book(4096);
    let g = grant(b.reserve(&req("t", "h", 150), T0));
    assert_eq!((g.view.nbytes, g.view.region.len, g.view.region.offset), (300, 512, 0));
}

// ---- complete (3.4) ----

#[test]
fn complete_rule1_unknown_or_stale_reservation_is_rejected() {
    let mut b = book(4096);
    assert_eq!(b.complete("nobody", "", T0), (false, false));
    let old = writer(&mut b, "t", "h");
    assert!(b.cancel("t", &old.rid, true, true, T0));
    let new = writer(&mut b, "t", "h");
    assert_eq!(b.complete("t", &old.rid, T0), (false, false));
    assert_eq!(b.state_of("t"), Some(State::Writing), "the new reservation is untouched");
    assert_eq!(b.complete("t", &new.rid, T0), (true, true));
}

#[test]
fn complete_rule2_repeat_is_idempotent() {
    let mut b = book(4096);
    let g = writer(&mut b, "t", "h");
    assert_eq!(b.complete("t", &g.rid, T0), (true, true));
    assert_eq!(b.complete("t", &g.rid, T0), (true, false));
}

#[test]
fn complete_rule3_follower_completion_is_rejected_in_gen_a() {
    let mut b = book(4096);
    writer(&mut b, "w", "h");
    let f = grant(b.reserve(&req("f", "h", 32), T0));
    assert_eq!(b.complete("f", &f.rid, T0), (false, false));
    assert_eq!(b.state_of("f"), Some(State::Writing));
}

#[test]
fn complete_rule3_follower_completion_is_a_noop_in_gen_b() {
    let config = BookConfig { follower_completion: FollowerCompletion::AcceptNoop, ..BookConfig::default() };
    let mut b = book_with(4096, config);
    writer(&mut b, "w", "h");
    let f = grant(b.reserve(&req("f", "h", 32), T0));
    assert_eq!(b.complete("f", &f.rid, T0), (true, false));
    assert_eq!(b.state_of("f"), Some(State::Writing));
}

#[test]
fn complete_rule4_writer_completion_publishes_followers_ready() {
    let mut b = book(4096);
    let w = writer(&mut b, "w", "h");
    grant(b.reserve(&req("f1", "h", 32), T0));
    grant(b.reserve(&req("f2", "h", 32), T0));
    assert_eq!(b.complete("w", &w.rid, T0), (true, true));
    assert_eq!(b.drain_ready(), vec!["f1".to_string(), "f2".to_string()]);
    assert!(b.drain_ready().is_empty());
    for t in ["w", "f1", "f2"] {
        assert_eq!(b.state_of(t), Some(State::Ready), "{t}");
    }
    // The destination now lives in the resident pool, leased three times.
    let (_, entry) = b.resident().lookup("h").unwrap();
    assert_eq!((entry.leases, entry.pinned), (3, false));
    check(&b);
}

#[test]
fn complete_rule5_deferred_writer_completion_terminates_and_frees() {
    let mut b = book(4096);
    let g = writer(&mut b, "t", "h");
    assert!(b.cancel("t", "", false, false, T0));
    assert_eq!(b.state_of("t"), Some(State::CancelPending));
    assert_eq!(b.complete("t", &g.rid, T0), (true, false));
    assert_eq!(b.state_of("t"), Some(State::Cancelled));
    assert_eq!(b.slab().used_bytes(), 0);

    let g = writer(&mut b, "u", "h2");
    b.expire(T0 + TTL);
    assert_eq!(b.complete("u", &g.rid, T0 + TTL), (true, false));
    assert_eq!(b.state_of("u"), Some(State::Expired));
    assert_eq!(b.slab().used_bytes(), 0);
    check(&b);
}

#[test]
fn complete_rule5_deferred_writer_still_publishes_its_followers() {
    let mut b = book(4096);
    let w = writer(&mut b, "w", "h");
    grant(b.reserve(&req("f", "h", 32), T0));
    assert!(b.cancel("w", "", false, false, T0));
    assert_eq!(b.complete("w", &w.rid, T0), (true, false));
    assert_eq!(b.drain_ready(), vec!["f".to_string()]);
    assert_eq!(b.state_of("f"), Some(State::Ready));
    assert_eq!(b.state_of("w"), Some(State::Cancelled));
    assert_eq!(b.slab().used_bytes(), 256, "the follower's lease keeps the region");
    check(&b);
}

#[test]
fn complete_rule6_terminal_record_is_not_completed() {
    let mut b = book(4096);
    let g = writer(&mut b, "t", "h");
    assert!(b.cancel("t", &g.rid, true, false, T0));
    assert_eq!(b.complete("t", &g.rid, T0), (false, false));
}

#[test]
fn complete_rule7_writing_writer_becomes_ready_with_a_fresh_lease() {
    let mut b = book(4096);
    let g = writer(&mut b, "t", "h");
    let at = T0 + Duration::from_secs(100);
    assert_eq!(b.complete("t", &g.rid, at), (true, true));
    b.expire(T0 + TTL);
    assert_eq!(b.state_of("t"), Some(State::Ready));
    assert_eq!(b.expire(at + TTL), 1);
    assert_eq!(b.state_of("t"), Some(State::Expired));
    assert_eq!(b.slab().used_bytes(), 0);
}

// ---- cancel (3.5) ----

#[test]
fn cancel_rule1_wrong_reservation_id_is_refused() {
    let mut b = book(4096);
    writer(&mut b, "t", "h");
    assert!(!b.cancel("t", "00000000000000000000000000000000", true, false, T0));
    assert!(!b.cancel("t", "not-an-id", true, false, T0));
    assert_eq!(b.state_of("t"), Some(State::Writing));
}

#[test]
fn cancel_rule2_cancel_before_reserve_leaves_a_tombstone() {
    let mut b = book(4096);
    assert!(b.cancel("t", "", false, false, T0));
    assert_eq!(b.state_of("t"), Some(State::Cancelled));
    assert_eq!(b.tombstone_count(), 1);
    assert!(b.status("t").is_none());
}

#[test]
fn cancel_rule3_repeat_refreshes_the_tombstone() {
    let config = BookConfig { tombstone_limit: 3, ..BookConfig::default() };
    let mut b = book_with(4096, config);
    for t in ["a", "b", "c"] {
        assert!(b.cancel(t, "", false, false, T0));
    }
    assert!(b.cancel("a", "", false, false, T0), "repeat moves a to the newest end");
    assert!(b.cancel("d", "", false, false, T0));
    // Bounded order c, a, d: b was the oldest.
    assert_eq!(b.state_of("b"), None);
    for t in ["c", "a", "d"] {
        assert_eq!(b.state_of(t), Some(State::Cancelled), "{t}");
    }
    assert_eq!(b.tombstone_count(), 3);
}

#[test]
fn cancel_rule4_refresh_requires_abandon() {
    let mut b = book(4096);
    writer(&mut b, "t", "h");
    assert!(!b.cancel("t", "", false, true, T0));
    assert_eq!(b.state_of("t"), Some(State::Writing));
    assert!(b.cancel("t", "", true, true, T0));
    assert_eq!(b.state_of("t"), Some(State::Expired));
    assert_eq!(b.slab().used_bytes(), 0);
}

#[test]
fn cancel_rule4_refresh_of_a_ready_record_is_refused() {
    let mut b = book(4096);
    let g = writer(&mut b, "t", "h");
    b.complete("t", &g.rid, T0);
    assert!(!b.cancel("t", &g.rid, true, true, T0));
    assert_eq!(b.state_of("t"), Some(State::Ready));
}

#[test]
fn cancel_rule4_refresh_of_a_follower_leaves_the_writer_alone() {
    let mut b = book(4096);
    let w = writer(&mut b, "w", "h");
    let f = grant(b.reserve(&req("f", "h", 32), T0));
    assert!(b.cancel("f", &f.rid, true, true, T0));
    assert_eq!(b.state_of("f"), Some(State::Expired));
    assert_eq!(b.state_of("w"), Some(State::Writing));
    assert_eq!(b.complete("w", &w.rid, T0), (true, true));
    assert!(b.drain_ready().is_empty());
    check(&b);
}

#[test]
fn cancel_rule5_follower_cancel_terminates_only_the_follower() {
    let mut b = book(4096);
    writer(&mut b, "w", "h");
    grant(b.reserve(&req("f", "h", 32), T0));
    assert!(b.cancel("f", "", false, false, T0));
    assert_eq!(b.state_of("f"), Some(State::Cancelled));
    assert_eq!(b.state_of("w"), Some(State::Writing));
    assert_eq!(b.slab().used_bytes(), 256);
    check(&b);
}

#[test]
fn cancel_rule6_plain_cancel_of_a_deferred_record_changes_nothing() {
    let mut b = book(4096);
    writer(&mut b, "t", "h");
    b.expire(T0 + TTL);
    assert!(b.cancel("t", "", false, false, T0 + TTL));
    assert_eq!(b.state_of("t"), Some(State::ExpirePending));
    assert_eq!(b.slab().used_bytes(), 256);
}

#[test]
fn cancel_of_writing_writer_defers_and_keeps_memory() {
    let mut b = book(4096);
    writer(&mut b, "t", "h");
    assert!(b.cancel("t", "", false, false, T0));
    assert_eq!(b.state_of("t"), Some(State::CancelPending));
    // No deadline can release it any more.
    b.expire(Instant::from_nanos(u64::MAX));
    assert_eq!(b.state_of("t"), Some(State::CancelPending));
    assert_eq!(b.slab().used_bytes(), 256);
    check(&b);
}

#[test]
fn cancel_rule8_expired_record_is_not_cancelled() {
    let mut b = book(4096);
    let g = writer(&mut b, "t", "h");
    b.complete("t", &g.rid, T0);
    b.expire(T0 + TTL);
    assert_eq!(b.state_of("t"), Some(State::Expired));
    assert!(!b.cancel("t", "", true, false, T0 + TTL));
}

#[test]
fn cancel_rule9_abandon_terminates_writer_and_its_followers() {
    let mut b = book(4096);
    let w = writer(&mut b, "w", "h");
    grant(b.reserve(&req("f", "h", 32), T0));
    assert!(b.cancel("w", &w.rid, true, false, T0));
    assert_eq!(b.state_of("w"), Some(State::Cancelled));
    assert_eq!(b.state_of("f"), Some(State::Cancelled));
    assert_eq!(b.slab().used_bytes(), 0);
    check(&b);
}

#[test]
fn cancel_rule9_plain_cancel_of_ready_releases_it() {
    let mut b = book(4096);
    let g = writer(&mut b, "t", "h");
    b.complete("t", &g.rid, T0);
    assert!(b.cancel("t", "", false, false, T0));
    assert_eq!(b.state_of("t"), Some(State::Cancelled));
    assert_eq!(b.slab().used_bytes(), 0);
}

#[test]
fn a_deferred_release_requires_writer_completion() {
    // ec-behaviour.md S11: 768 bytes hold three 64-byte reservations; plain cancels defer them and
    // no deadline frees them; only an abandon does.
    let mut b = book(768);
    let mut rids = Vec::new();
    for t in ["a", "b", "c"] {
        rids.push(grant(b.reserve(&req(t, &format!("h{t}"), 32), T0)).rid);
        assert!(b.cancel(t, "", false, false, T0));
    }
    b.expire(Instant::from_nanos(u64::MAX));
    assert_eq!(b.reserve(&req("d", "hd", 32), T0), Err(ReserveError::PoolFull));
    for (t, rid) in ["a", "b", "c"].iter().zip(&rids) {
        assert!(b.cancel(t, rid, true, false, T0));
    }
    assert_eq!(b.slab().used_bytes(), 0);
    check(&b);
}

// ---- expiry (3.6) ----

#[test]
fn expire_moves_each_state_as_the_reference() {
    let mut b = book(8192);
    let r = writer(&mut b, "ready", "h1");
    b.complete("ready", &r.rid, T0);
    writer(&mut b, "writer", "h2");
    grant(b.reserve(&req("follower", "h2", 32), T0));
    writer(&mut b, "deferred", "h3");
    b.cancel("deferred", "", false, false, T0);
    assert_eq!(b.expire(T0 + TTL), 1);
    assert_eq!(b.state_of("ready"), Some(State::Expired));
    assert_eq!(b.state_of("writer"), Some(State::ExpirePending));
    assert_eq!(b.state_of("follower"), Some(State::Cancelled));
    assert_eq!(b.state_of("deferred"), Some(State::CancelPending));
    check(&b);
}

#[test]
fn tombstones_are_bounded_by_age() {
    let mut b = book(4096);
    b.cancel("old", "", false, false, T0);
    b.expire(T0 + TTL - Duration::from_nanos(1));
    assert_eq!(b.state_of("old"), Some(State::Cancelled));
    b.expire(T0 + TTL);
    assert_eq!(b.state_of("old"), None);
    assert_eq!(b.tombstone_count(), 0);
}

#[test]
fn tombstones_are_bounded_by_count_at_the_default_limit() {
    let mut b = book(4096);
    for i in 0..65536 + 10 {
        b.cancel(&format!("t{i}"), "", false, false, T0);
    }
    assert_eq!(b.tombstone_count(), 65536);
    assert_eq!(b.state_of("t9"), None);
    assert_eq!(b.state_of("t10"), Some(State::Cancelled));
}

// ---- take / shutdown (3.7) ----

#[test]
fn take_requires_ready_and_matching_hash() {
    let mut b = book(4096);
    let g = writer(&mut b, "t", "h");
    let not_ready = TakeError { mm_hash: "h".into() };
    assert_eq!(b.take("t", "h"), Err(not_ready.clone()));
    b.complete("t", &g.rid, T0);
    assert_eq!(b.take("t", "other").unwrap_err().to_string(), "Pushed EC tensor is not ready for mm_hash=other");
    let taken = b.take("t", "h").unwrap();
    assert_eq!(taken.view, g.view);
    assert_eq!(b.state_of("t"), None, "take removes the record without a tombstone");
    assert_eq!(b.tombstone_count(), 0);
    assert_eq!(b.take("t", "h"), Err(not_ready));
    // The memory stays, pinned, until the encoder cache retires it.
    assert_eq!(b.slab().used_bytes(), 256);
    assert!(b.resident().lookup("h").unwrap().1.pinned);
    check(&b);
}

#[test]
fn shutdown_cancels_ready_and_followers_and_defers_writers() {
    let mut b = book(8192);
    let r = writer(&mut b, "ready", "h1");
    b.complete("ready", &r.rid, T0);
    let w = writer(&mut b, "writer", "h2");
    grant(b.reserve(&req("follower", "h2", 32), T0));
    b.begin_shutdown(T0);
    assert_eq!(b.state_of("ready"), Some(State::Cancelled));
    assert_eq!(b.state_of("follower"), Some(State::Cancelled));
    assert_eq!(b.state_of("writer"), Some(State::CancelPending));
    assert_eq!(b.writer_owned_count(), 1);
    assert_eq!(b.complete("writer", &w.rid, T0), (true, false));
    assert_eq!(b.writer_owned_count(), 0);
    assert_eq!(b.slab().used_bytes(), 0);
    check(&b);
}

#[test]
fn reservation_ids_are_32_lowercase_hex_from_the_injected_rng() {
    let mut a = book(4096);
    let mut b = book(4096);
    let ga = grant(a.reserve(&req("t", "h", 8), T0));
    let gb = grant(b.reserve(&req("t", "h", 8), T0));
    assert_eq!(ga.rid, gb.rid, "same seed, same id");
    assert_eq!(ga.rid.len(), 32);
    assert!(ga.rid.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')));
    let _ = (ga.ready, ga.cached, ga.view);
}
