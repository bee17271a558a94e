//! Simulated time for hosts, and the bookkeeping that lets the engine skip idle time.
//!
//! turmoil advances every host by one tick per step. A fixed 1 ms tick spends almost all
//! of its steps on hosts with nothing to do, so the engine picks each tick itself: one
//! millisecond while bytes are on the wire, otherwise a jump to the earliest deadline any
//! host sleeps until. For that, every sleep in the simulator goes through [`sleep_until`]
//! (which registers its deadline) and every byte written to or read from a simulated
//! stream is reported with [`net_wrote`] / [`net_read`].
//!
//! State is thread-local: a simulation runs on one thread, and a sweep runs one simulation
//! per thread at a time. [`reset`] clears it before a run.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use ctlplane_core::time::Instant;

#[derive(Default)]
struct ClockState {
    /// Registered wake-up deadlines (ns since the start of the run) and how many sleepers each.
    deadlines: BTreeMap<u64, usize>,
    /// The same per host, so a step can leave out the hosts with no timer due in it.
    host_deadlines: BTreeMap<IpAddr, BTreeMap<u64, usize>>,
    /// Bytes written to a stream and not yet read at the other end, per (from, to) host pair.
    in_flight: BTreeMap<(IpAddr, IpAddr), i64>,
    /// Streams being set up (a connect in progress).
    connecting: usize,
    /// Bumped by every read, write and connect: the engine compares it across steps.
    activity: u64,
}

thread_local! {
    static STATE: RefCell<ClockState> = RefCell::new(ClockState::default());
    /// Reads of the clock by hosts since the engine's step began ([`SPIN_BUDGET`]).
    static READS: Cell<u64> = const { Cell::new(0) };
}

/// Clock reads hosts may make within one step. Simulated time stands still inside a step,
/// so a host that reads it this often is spinning: a loop that never awaits anything
/// (say, a retry of a request its slot refuses at once) would hold the step, and the whole
/// run, forever. The main job's steps read it a few hundred times at most.
pub const SPIN_BUDGET: u64 = 1_000_000;

/// The start of the panic message [`now`] raises past [`SPIN_BUDGET`]; the engine turns
/// it into a `step-budget` verdict.
pub const SPIN_MARK: &str = "spin:";

/// A step begins: the spin budget starts afresh.
pub fn begin_step() {
    READS.with(|r| r.set(0));
}

/// Forget every deadline and byte count; called by the engine before a run.
pub fn reset() {
    STATE.with(|s| *s.borrow_mut() = ClockState::default());
}

/// Simulated time of the current host, as the core's `Instant` (zero at the start of the run).
///
/// Outside a host (the engine itself) use `Sim::elapsed` instead; this returns zero there.
pub fn now() -> Instant {
    let reads = READS.with(|r| {
        r.set(r.get() + 1);
        r.get()
    });
    let t = Instant::from_nanos(turmoil::sim_elapsed().map_or(0, |d| d.as_nanos() as u64));
    // Once: destructors that read the clock while the panic unwinds must not raise another.
    if reads > SPIN_BUDGET && !std::thread::panicking() {
        READS.with(|r| r.set(0));
        // The verdict first: the panic stops the host, and turmoil may keep a host task's
        // panic to itself.
        let host = turmoil::current_host_addr().map_or_else(|| "engine".to_string(), |a| a.to_string());
        let detail = format!("{SPIN_MARK} a host read the clock {reads} times in one step without letting time move");
        crate::oracle::violate_at(t.as_nanos(), "step-budget", &host, detail.clone());
        panic!("{detail}");
    }
    t
}

/// Sleep until `at`, registering the deadline so the engine does not jump past it.
pub async fn sleep_until(at: Instant) {
    let now = now();
    if at <= now {
        tokio::task::yield_now().await;
        return;
    }
    let key = at.as_nanos();
    let _guard = DeadlineGuard::register(turmoil::current_host_addr(), key);
    tokio::time::sleep(Duration::from_nanos(key - now.as_nanos())).await;
}

/// Sleep for `d` of simulated time.
pub async fn sleep(d: Duration) {
    sleep_until(now() + d).await;
}

/// A registered deadline, removed again when the sleep ends or is dropped.
struct DeadlineGuard {
    host: Option<IpAddr>,
    key: u64,
}

impl DeadlineGuard {
    fn register(host: Option<IpAddr>, key: u64) -> Self {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            *s.deadlines.entry(key).or_insert(0) += 1;
            if let Some(h) = host {
                *s.host_deadlines.entry(h).or_default().entry(key).or_insert(0) += 1;
            }
        });
        DeadlineGuard { host, key }
    }
}

/// Takes one sleeper off `key`, dropping the entry with the last.
fn unregister(deadlines: &mut BTreeMap<u64, usize>, key: u64) {
    if let Some(n) = deadlines.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            deadlines.remove(&key);
        }
    }
}

impl Drop for DeadlineGuard {
    fn drop(&mut self) {
        STATE.with(|s| {
            let mut s = s.borrow_mut();
            unregister(&mut s.deadlines, self.key);
            if let Some(h) = self.host {
                if let Some(d) = s.host_deadlines.get_mut(&h) {
                    unregister(d, self.key);
                }
            }
        });
    }
}

/// `n` bytes were written on a stream from `from` to `to`.
pub fn net_wrote(from: IpAddr, to: IpAddr, n: usize) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        *s.in_flight.entry((from, to)).or_insert(0) += n as i64;
        s.activity += 1;
    });
}

/// `n` bytes sent from `from` to `to` were read at `to`.
pub fn net_read(from: IpAddr, to: IpAddr, n: usize) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        let e = s.in_flight.entry((from, to)).or_insert(0);
        *e -= n as i64;
        if *e <= 0 {
            s.in_flight.remove(&(from, to));
        }
        s.activity += 1;
    });
}

/// A stream from `from` to `to` died: whatever was in flight on it never arrives.
pub fn net_reset(from: IpAddr, to: IpAddr) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        s.in_flight.remove(&(from, to));
        s.activity += 1;
    });
}

/// A connect started (`true`) or finished either way (`false`).
pub fn net_connecting(started: bool) {
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if started {
            s.connecting += 1;
        } else {
            s.connecting = s.connecting.saturating_sub(1);
        }
        s.activity += 1;
    });
}

/// Something happened that the engine should react to at a fine tick.
pub fn note_activity() {
    STATE.with(|s| s.borrow_mut().activity += 1);
}

/// Earliest registered deadline, ns since the start of the run.
pub fn next_deadline() -> Option<u64> {
    STATE.with(|s| s.borrow().deadlines.keys().next().copied())
}

/// Earliest deadline registered by a sleeper on host `host`, ns since the start of the run:
/// the engine's wake hint, which lets a turmoil step leave out hosts with nothing due.
pub fn next_deadline_of(host: IpAddr) -> Option<u64> {
    STATE.with(|s| s.borrow().host_deadlines.get(&host).and_then(|d| d.keys().next().copied()))
}

/// Host pairs with bytes on the wire, and whether a connect is in progress.
pub fn in_flight_pairs() -> (Vec<(IpAddr, IpAddr)>, bool) {
    STATE.with(|s| {
        let s = s.borrow();
        (s.in_flight.keys().copied().collect(), s.connecting > 0)
    })
}

/// Bytes on the wire per host pair (see [`in_flight_pairs`]).
pub fn in_flight_counts() -> Vec<((IpAddr, IpAddr), i64)> {
    STATE.with(|s| s.borrow().in_flight.iter().map(|(k, v)| (*k, *v)).collect())
}

/// The activity counter (see [`note_activity`]).
pub fn activity() -> u64 {
    STATE.with(|s| s.borrow().activity)
}

/// The latest registered deadline in `[first, first + window]`, where `first` is the
/// earliest one: jumping there wakes every sleeper of that window in one step (each at
/// most `window` late), which is what lets the engine skip time that hosts fill with
/// short periodic timers.
pub fn coalesced_deadline(window: Duration) -> Option<u64> {
    STATE.with(|s| {
        let s = s.borrow();
        let first = *s.deadlines.keys().next()?;
        let last = first.saturating_add(window.as_nanos() as u64);
        s.deadlines.range(first..=last).next_back().map(|(k, _)| *k)
    })
}
