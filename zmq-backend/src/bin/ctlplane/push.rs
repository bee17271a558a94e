//! `ctlplane push`: a producer load generator over the real control channel.
//!
//! The core's [`PushCoordinator`] decides every step of every push batch (discovery,
//! reserve fan-out, writes, completion, cleanup); this driver only carries its requests
//! to worker threads that own the [`ControlClient`] calls, performs its writes on a data
//! plane that accepts them all, and feeds back replies and the clock. The scheduler's side
//! (readiness across every shard, and releasing items with the remote-cancel retry and
//! give-up policy) is the core's `Scheduler`, run by [`SchedulerDriver`].

use crate::security::ClientCurve;
use clap::Args;
use ctlplane_core::ec::dataplane::{DataPlane, DataPlaneError};
use ctlplane_core::ec::defaults::CONTROL_TIMEOUT_MS;
use ctlplane_core::ec::producer::{
    BatchId, ItemOutcome, PushBatch, PushConfig, PushCoordinator, PushEvent, PushItem, Token, Transmit,
};
use ctlplane_core::ec::request_slot::ReplyError;
use ctlplane_core::ec::scheduler::{ConsumerId, RequestId, SchedulerConfig, SchedulerEvent};
use ctlplane_core::ec::DType;
use ctlplane_zmq::{Clock, ControlClient, SchedulerDriver};
use rand_core::{OsRng, RngCore};
use serde::Serialize;
use serde_json::Value;
use std::collections::{HashMap, HashSet, VecDeque};
use std::error::Error;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Push items to a consumer as an EC producer would: a control-plane load generator.
///
/// Mooncake is out of scope: tensor writes go to a stand-in data plane that accepts every
/// write and counts its bytes, so a run measures the control plane alone.
///
/// The tool also stands in for the consumer's scheduler: it subscribes to the readiness
/// events to count the items every shard announced (not with --no-events, which leaves the
/// events to another subscriber such as `ctlplane ec watch`), and, as `ctlplane consumer`
/// has no model that loads items, finishes each item's request once it is pushed and
/// announced (pushed, with --no-events) without loading it, so the scheduler releases it
/// with a plain cancel to every shard (not with --keep, which stands in for a model that
/// takes every item): a long run does not fill the consumer's pool.
///
/// Prints a one-line JSON summary on stdout; exits 1 if any item failed.
#[derive(Args)]
pub struct PushArgs {
    /// The consumer's base control address (rank 0's, what a producer gets as
    /// `consumer_zmq`), e.g. tcp://127.0.0.1:19019.
    #[arg(long)]
    consumer: String,
    /// Items to push.
    #[arg(long)]
    items: u64,
    /// Bytes per item: a positive even number; each item is a float16 tensor of shape
    /// [nbytes/2].
    #[arg(long, value_parser = parse_nbytes)]
    nbytes: u64,
    /// Items per push batch: one `reserve_batch` and one `complete_batch` per shard
    /// (`reserve` for a batch of one).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Reply timeout of every control request (`control_timeout_ms`).
    #[arg(long, default_value_t = CONTROL_TIMEOUT_MS)]
    timeout_ms: u64,
    /// Batches in flight at once; also the worker threads that carry control requests.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    concurrency: u32,
    /// Leave pushed items READY on the consumer instead of releasing them.
    #[arg(long)]
    keep: bool,
    /// Do not subscribe to the consumer's readiness events.
    #[arg(long)]
    no_events: bool,
    /// Least time between two batch starts, in ms (0 = as fast as replies come): paces a
    /// long run, e.g. a soak that restarts the consumer under load.
    #[arg(long, default_value_t = 0)]
    batch_interval_ms: u64,
    #[command(flatten)]
    curve: ClientCurve,
}

fn parse_nbytes(s: &str) -> Result<u64, String> {
    let n: u64 = s.parse().map_err(|e| format!("{e}"))?;
    if n == 0 || n % 2 != 0 {
        return Err(format!("{n} is not a positive even number of bytes (items are float16 tensors)"));
    }
    Ok(n)
}

/// Longest wait for the readiness events of an item once it is pushed (then it is released
/// unannounced), and of the last batches once every batch is done.
const EVENT_GRACE: Duration = Duration::from_secs(5);
/// Longest wait for a worker's answer before the loop looks at events and the clock again.
const TICK: Duration = Duration::from_millis(2);

/// The one-line JSON summary on stdout.
#[derive(Serialize)]
struct Summary {
    items: u64,
    pushed: u64,
    failed: u64,
    skipped: u64,
    /// From the first push to the last batch done.
    seconds: f64,
    items_per_s: f64,
    /// Batch latency, push to done.
    p50_ms: f64,
    p99_ms: f64,
    batches: u64,
    shards: usize,
    bytes_written: u64,
    /// Readiness events received for this run's items (0 with --no-events).
    events: u64,
    /// Items every shard announced ready (the scheduler's multi-shard readiness).
    ready: u64,
    /// Items released on every shard after their push (0 with --keep).
    released: u64,
}

pub fn run(args: PushArgs) -> Result<ExitCode, Box<dyn Error>> {
    let nbytes = usize::try_from(args.nbytes)?;
    let mut source = vec![0u8; nbytes];
    OsRng.try_fill_bytes(&mut source).map_err(rng_error)?;
    let client = Arc::new(args.curve.apply(ControlClient::new(args.timeout_ms))?);
    let (done_tx, done_rx) = mpsc::channel();
    let wake = done_tx.clone();
    let workers = Workers::spawn(&client, args.concurrency as usize, done_tx)?;
    let mut scheduler = SchedulerDriver::new(client.clone(), SchedulerConfig::default()).with_waker(move || {
        let _ = wake.send(Done::Wake);
    });
    let consumer = scheduler.add_consumer(&args.consumer);
    let mut run = Run {
        args: &args,
        clock: Clock::new(),
        coordinator: PushCoordinator::new(PushConfig::default()),
        data_plane: CountingDataPlane::default(),
        source,
        ids: Ids::default(),
        workers,
        done_rx,
        scheduler,
        consumer,
        items: HashMap::new(),
        unreleased: VecDeque::new(),
        batches: HashMap::new(),
        next_item: 0,
        next_start: Instant::now(),
        tally: Tally::default(),
    };
    let outcome = run.run();
    run.workers.stop();
    run.scheduler.close();
    client.close();
    let summary = outcome?;
    println!("{}", serde_json::to_string(&summary)?);
    eprintln!(
        "pushed {}/{} items ({} failed, {} skipped) of {} B to {} shard(s) in {:.3} s: {:.0} items/s; \
         batch latency p50 {:.3} ms, p99 {:.3} ms; {} ready, {} released",
        summary.pushed,
        summary.items,
        summary.failed,
        summary.skipped,
        args.nbytes,
        summary.shards,
        summary.seconds,
        summary.items_per_s,
        summary.p50_ms,
        summary.p99_ms,
        summary.ready,
        summary.released,
    );
    if let Some(error) = &run.tally.first_failure {
        eprintln!("first failure: {error}");
    }
    Ok(if summary.failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// A batch in flight: when it was pushed and its transfer ids (to release them).
struct InFlight {
    pushed_at: Instant,
    transfer_ids: Vec<String>,
}

#[derive(Default)]
struct Tally {
    pushed: u64,
    failed: u64,
    skipped: u64,
    batches: u64,
    latencies_ms: Vec<f64>,
    last_done: Option<Instant>,
    first_failure: Option<String>,
    events: u64,
    ready: u64,
    released: u64,
}

/// One item of this run as the scheduler side sees it.
struct Tracked {
    request: RequestId,
    pushed: bool,
    /// Every shard announced it.
    ready: bool,
    /// Its request was finished: a release is under way or done.
    finished: bool,
}

struct Run<'a> {
    args: &'a PushArgs,
    clock: Clock,
    coordinator: PushCoordinator,
    data_plane: CountingDataPlane,
    source: Vec<u8>,
    ids: Ids,
    workers: Workers,
    done_rx: Receiver<Done>,
    scheduler: SchedulerDriver,
    consumer: ConsumerId,
    /// This run's items by transfer id: a consumer's backlog may still hold events of an
    /// earlier run, which must not count.
    items: HashMap<String, Tracked>,
    /// Pushed items not released yet, in the order they were pushed, with when.
    unreleased: VecDeque<(Instant, String)>,
    batches: HashMap<BatchId, InFlight>,
    next_item: u64,
    /// When the next batch may start (`--batch-interval-ms`).
    next_start: Instant,
    tally: Tally,
}

impl Run<'_> {
    fn run(&mut self) -> Result<Summary, Box<dyn Error>> {
        let started = Instant::now();
        // Subscribing takes a discovery round trip: start it before the first push.
        self.drain_events();
        let mut all_done_at = None;
        loop {
            self.start_batches()?;
            self.pump();
            self.collect_outcomes();
            self.drain_events();
            self.scheduler_events();
            self.release_overdue(false);
            let finished = self.next_item >= self.args.items && self.batches.is_empty();
            if finished {
                let all_done = *all_done_at.get_or_insert_with(Instant::now);
                let waiting_events = !self.args.no_events && self.tally.ready < self.tally.pushed;
                if !waiting_events || all_done.elapsed() >= EVENT_GRACE {
                    self.release_overdue(true);
                    if self.scheduler.is_quiet() {
                        break;
                    }
                }
            }
            match self.done_rx.recv_timeout(TICK) {
                Ok(done) => self.handle(done),
                // The scheduler's waker keeps the channel open: look at the threads.
                Err(RecvTimeoutError::Timeout) if self.workers.all_stopped() => {
                    return Err("every push worker stopped".into())
                }
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Err("every push worker stopped".into()),
            }
            while let Ok(done) = self.done_rx.try_recv() {
                self.handle(done);
            }
        }
        let end = self.tally.last_done.unwrap_or(started);
        let seconds = end.saturating_duration_since(started).as_secs_f64();
        let t = &mut self.tally;
        t.latencies_ms.sort_by(f64::total_cmp);
        let shards = self.coordinator.topology().get(&self.args.consumer).map_or(0, <[String]>::len);
        Ok(Summary {
            items: self.args.items,
            pushed: t.pushed,
            failed: t.failed,
            skipped: t.skipped,
            seconds: round3(seconds),
            items_per_s: round3(if seconds > 0.0 { t.pushed as f64 / seconds } else { 0.0 }),
            p50_ms: round3(percentile(&t.latencies_ms, 0.50)),
            p99_ms: round3(percentile(&t.latencies_ms, 0.99)),
            batches: t.batches,
            shards,
            bytes_written: self.data_plane.bytes,
            events: t.events,
            ready: t.ready,
            released: t.released,
        })
    }

    /// Keeps `concurrency` batches in flight until every item has been pushed. Releases
    /// waiting their turn count against the same room (`concurrency * batch` items), so a
    /// run holds at most one item more of the consumer's pool than that, however slowly
    /// releases go.
    fn start_batches(&mut self) -> Result<(), Box<dyn Error>> {
        let room = u64::from(self.args.concurrency) * u64::from(self.args.batch);
        while self.batches.len() < self.args.concurrency as usize && self.next_item < self.args.items {
            let k = u64::from(self.args.batch).min(self.args.items - self.next_item);
            let pushing: u64 = self.batches.values().map(|b| b.transfer_ids.len() as u64).sum();
            let releasing = self.scheduler.core().queued_cancels(self.consumer) as u64;
            if pushing + releasing + k > room {
                break;
            }
            if self.args.batch_interval_ms > 0 {
                let now = Instant::now();
                if now < self.next_start {
                    break;
                }
                self.next_start = now + Duration::from_millis(self.args.batch_interval_ms);
            }
            let items =
                (0..k).map(|_| self.ids.item(self.args.nbytes)).collect::<Result<Vec<_>, _>>().map_err(rng_error)?;
            let transfer_ids: Vec<String> = items.iter().map(|i| i.transfer_id.clone()).collect();
            for item in &items {
                let request = self.scheduler.request(self.consumer, [(item.transfer_id.clone(), item.mm_hash.clone())]);
                let tracked = Tracked { request, pushed: false, ready: false, finished: false };
                self.items.insert(item.transfer_id.clone(), tracked);
            }
            let pushed_at = Instant::now();
            let id = self.coordinator.push(PushBatch::new(self.args.consumer.clone(), items), self.clock.now());
            self.batches.insert(id, InFlight { pushed_at, transfer_ids });
            self.next_item += k;
        }
        Ok(())
    }

    /// Hands every request the coordinator releases to the workers and performs every
    /// write at once (the data plane accepts them synchronously).
    fn pump(&mut self) {
        while let Some(transmit) = self.coordinator.poll_transmit() {
            match transmit {
                Transmit::Request { token, addr, frame, .. } => {
                    if let Err(error) = self.workers.submit(Job::Request { token, addr, frame }) {
                        self.coordinator.handle_reply(token, Err(error.into()), self.clock.now());
                    }
                }
                Transmit::Write { token, session, dst_ptr, nbytes, item: _ } => {
                    let result = usize::try_from(nbytes)
                        .ok()
                        .and_then(|n| self.source.get(..n))
                        .ok_or_else(|| format!("write of {nbytes} bytes exceeds the {} byte source", self.source.len()))
                        .and_then(|src| self.data_plane.write(&session, dst_ptr, src).map_err(|e| e.to_string()));
                    self.coordinator.handle_write(token, result, self.clock.now());
                }
            }
        }
    }

    fn collect_outcomes(&mut self) {
        while let Some(PushEvent::BatchDone { batch, outcomes }) = self.coordinator.poll_event() {
            let now = Instant::now();
            let Some(flight) = self.batches.remove(&batch) else { continue };
            let t = &mut self.tally;
            t.batches += 1;
            t.last_done = Some(now);
            t.latencies_ms.push(now.saturating_duration_since(flight.pushed_at).as_secs_f64() * 1e3);
            for (outcome, transfer_id) in outcomes.into_iter().zip(flight.transfer_ids) {
                let t = &mut self.tally;
                match outcome {
                    ItemOutcome::Pushed => {
                        t.pushed += 1;
                        if let Some(item) = self.items.get_mut(&transfer_id) {
                            item.pushed = true;
                        }
                        self.release_if_done(&transfer_id);
                        if self.items.get(&transfer_id).is_some_and(|i| !i.finished) {
                            self.unreleased.push_back((now, transfer_id));
                        }
                    }
                    // Nothing of it is left on the consumer to release.
                    ItemOutcome::Skipped { .. } => t.skipped += 1,
                    ItemOutcome::Failed { error } => {
                        t.failed += 1;
                        t.first_failure.get_or_insert(error);
                    }
                }
            }
        }
    }

    /// Finishes the item's request once it is pushed and (with events) announced by every
    /// shard: the scheduler then cancels it on every shard.
    fn release_if_done(&mut self, transfer_id: &str) {
        let Some(item) = self.items.get_mut(transfer_id) else { return };
        if self.args.keep || item.finished || !item.pushed || !(item.ready || self.args.no_events) {
            return;
        }
        item.finished = true;
        self.scheduler.finish_request(item.request);
    }

    /// Pushed items not announced by every shard within [`EVENT_GRACE`] (all of them with
    /// `all`, at the end of the run) are released all the same, so a lost subscription
    /// cannot fill the consumer's pool.
    fn release_overdue(&mut self, all: bool) {
        while let Some((at, transfer_id)) = self.unreleased.front() {
            if !all && at.elapsed() < EVENT_GRACE {
                return;
            }
            let transfer_id = transfer_id.clone();
            self.unreleased.pop_front();
            let Some(item) = self.items.get_mut(&transfer_id) else { continue };
            if !self.args.keep && !item.finished {
                item.finished = true;
                self.scheduler.finish_request(item.request);
            }
        }
    }

    /// What the scheduler reports: items every shard announced, loads (taken with
    /// --keep, else the request finishes unloaded) and releases.
    fn scheduler_events(&mut self) {
        self.scheduler.step();
        while let Some(event) = self.scheduler.poll_event() {
            match event {
                SchedulerEvent::Ready { transfer_id, .. } => {
                    let Some(item) = self.items.get_mut(&transfer_id) else { continue };
                    if !item.ready {
                        item.ready = true;
                        self.tally.ready += 1;
                    }
                    self.release_if_done(&transfer_id);
                }
                SchedulerEvent::Load { consumer, transfer_id, .. } if self.args.keep => {
                    self.scheduler.report_load(consumer, &transfer_id, true);
                }
                SchedulerEvent::Released { transfer_id, shards, gave_up, .. } => {
                    if !self.items.contains_key(&transfer_id) {
                        continue;
                    }
                    if gave_up.is_empty() {
                        self.tally.released += 1;
                    } else {
                        tracing::warn!(%transfer_id, shards, ?gave_up, "could not release a pushed item on every shard");
                    }
                }
                SchedulerEvent::Undiscovered { transfer_id, .. } => {
                    tracing::warn!(%transfer_id, "could not release a pushed item: the consumer's shards are unknown");
                }
                _ => {}
            }
        }
    }

    /// Reads readiness events; the core's multi-shard readiness says when an item is
    /// announced by every shard.
    fn drain_events(&mut self) {
        if self.args.no_events {
            return;
        }
        for heard in self.scheduler.drain() {
            if self.items.get(&heard.transfer_id).is_some_and(|i| !i.ready) {
                self.tally.events += 1;
            }
        }
    }

    fn handle(&mut self, done: Done) {
        match done {
            Done::Reply { token, reply } => self.coordinator.handle_reply(token, reply, self.clock.now()),
            // The loop steps the scheduler next.
            Done::Wake => {}
        }
    }
}

/// Nearest-rank percentile of sorted samples.
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn round3(x: f64) -> f64 {
    (x * 1e3).round() / 1e3
}

// ---------------------------------------------------------------------------------------
// Items

/// Mints distinct random ids: 32-hex transfer ids (`uuid4().hex`-sized) and 64-hex
/// mm_hashes, so every item is a fresh writer on the consumer.
#[derive(Default)]
struct Ids {
    transfer_ids: HashSet<[u8; 16]>,
    mm_hashes: HashSet<[u8; 32]>,
}

impl Ids {
    fn item(&mut self, nbytes: u64) -> Result<PushItem, rand_core::Error> {
        let transfer_id = fresh(&mut self.transfer_ids)?;
        let mm_hash = fresh(&mut self.mm_hashes)?;
        Ok(PushItem {
            transfer_id: hex(&transfer_id),
            mm_hash: hex(&mm_hash),
            nbytes,
            shape: vec![nbytes / 2],
            dtype: DType::Float16.name().to_string(),
        })
    }
}

fn rng_error(e: rand_core::Error) -> String {
    format!("the OS random source failed: {e}")
}

fn fresh<const N: usize>(seen: &mut HashSet<[u8; N]>) -> Result<[u8; N], rand_core::Error> {
    loop {
        let mut bytes = [0u8; N];
        OsRng.try_fill_bytes(&mut bytes)?;
        if seen.insert(bytes) {
            return Ok(bytes);
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for &b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

// ---------------------------------------------------------------------------------------
// Data plane

/// Stands in for Mooncake (out of scope here): accepts every write and counts it, so the
/// run measures the control plane alone.
#[derive(Default)]
struct CountingDataPlane {
    bytes: u64,
}

impl DataPlane for CountingDataPlane {
    fn write(&mut self, _session: &str, _dst_ptr: u64, src: &[u8]) -> Result<(), DataPlaneError> {
        self.bytes += src.len() as u64;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Workers

enum Job {
    /// A coordinator request.
    Request { token: Token, addr: String, frame: Vec<u8> },
}

enum Done {
    Reply {
        token: Token,
        reply: Result<Value, ReplyError>,
    },
    /// An answer reached the scheduler's driver.
    Wake,
}

/// Threads executing control requests. Each has its own REQ socket per shard (the
/// client's per-thread sockets), so no two requests ever share one socket's lockstep.
struct Workers {
    jobs: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    fn spawn(client: &Arc<ControlClient>, n: usize, done: Sender<Done>) -> std::io::Result<Self> {
        let (jobs_tx, jobs_rx) = mpsc::channel::<Job>();
        let jobs_rx = Arc::new(Mutex::new(jobs_rx));
        let mut workers = Workers { jobs: Some(jobs_tx), threads: Vec::with_capacity(n) };
        for i in 0..n {
            let (client, jobs, done) = (client.clone(), jobs_rx.clone(), done.clone());
            let thread = std::thread::Builder::new().name(format!("ec-push-{i}")).spawn(move || loop {
                let job = jobs.lock().unwrap_or_else(PoisonError::into_inner).recv();
                let Ok(job) = job else { break };
                if done.send(execute(&client, job)).is_err() {
                    break;
                }
            });
            match thread {
                Ok(t) => workers.threads.push(t),
                Err(e) => {
                    workers.stop();
                    return Err(e);
                }
            }
        }
        Ok(workers)
    }

    fn submit(&self, job: Job) -> Result<(), String> {
        let jobs = self.jobs.as_ref().ok_or("push workers stopped")?;
        jobs.send(job).map_err(|_| "push workers stopped".to_string())
    }

    /// Every worker thread ended (they only end when stopped, or by panicking).
    fn all_stopped(&self) -> bool {
        !self.threads.is_empty() && self.threads.iter().all(JoinHandle::is_finished)
    }

    /// Lets the workers finish what they hold and waits for them.
    fn stop(&mut self) {
        self.jobs = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn execute(client: &ControlClient, job: Job) -> Done {
    let Job::Request { token, addr, frame } = job;
    Done::Reply { token, reply: client.request_frame(&addr, &frame).map_err(ReplyError::from) }
}
