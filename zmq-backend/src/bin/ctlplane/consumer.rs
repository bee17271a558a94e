//! `ctlplane consumer`: one control server per TP rank until SIGINT or SIGTERM.

use crate::security::ServerCurve;
use clap::Args;
use ctlplane_core::ec::wire::DEFAULT_MAX_BATCH_ITEMS;
use ctlplane_core::ec::PortPlan;
use ctlplane_zmq::{ConsumerServers, ServerOptions, DEFAULT_MAX_REQUEST_BYTES};
use std::error::Error;
use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct ConsumerArgs {
    /// Address to bind and advertise (`ec_ip`); loopback unless told otherwise.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// `ec_port`: rank 0's REP port of DP replica 0.
    #[arg(long)]
    port: i64,
    /// Tensor-parallel size: one shard per rank, on consecutive ports.
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// DP replica index: its ports start at `port + dp_index * tp`.
    #[arg(long, default_value_t = 0)]
    dp_index: u32,
    /// Receive slab size per rank, in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pool_bytes: u64,
    /// Largest request frame (ZMQ_MAXMSGSIZE on every REP): libzmq closes the connection
    /// of a client that sends more, and the consumer logs it; 0 = unbounded.
    #[arg(long, default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    max_request_bytes: usize,
    /// Most items a `reserve_batch` / `complete_batch` may carry; larger batches are
    /// answered `<op> carries N items; the limit is L` and change nothing.
    #[arg(long, default_value_t = DEFAULT_MAX_BATCH_ITEMS as u32, value_parser = clap::value_parser!(u32).range(1..))]
    max_batch_items: u32,
    /// Lifetime of WRITING and READY reservations and of tombstones, in ms (the
    /// reference's 300 s by default).
    #[arg(long)]
    ttl_ms: Option<u64>,
    /// Print every rank's counters as a JSON line on stdout this often (0 = never):
    /// `{"rank", "requests", "error_replies", "malformed", "events_queued", "records",
    /// "tombstones", "writer_owned"}`; `records` counts live reservations.
    #[arg(long, default_value_t = 0)]
    stats_interval_ms: u64,
    #[command(flatten)]
    curve: ServerCurve,
}

/// How often the main thread checks that every shard still serves.
const HEALTH_TICK: Duration = Duration::from_millis(250);

pub fn run(args: ConsumerArgs) -> Result<ExitCode, Box<dyn Error>> {
    let plan = PortPlan::new(args.host, args.port, args.dp_index, args.tp)?;
    let (signal_tx, signal_rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = signal_tx.send(());
    })?;
    let options = ServerOptions {
        max_request_bytes: (args.max_request_bytes > 0).then_some(args.max_request_bytes),
        curve: args.curve.server()?,
        ..ServerOptions::default()
    };
    let max_batch_items = args.max_batch_items as usize;
    let ttl = args.ttl_ms.map(Duration::from_millis);
    let mut servers = ConsumerServers::start(&plan, args.pool_bytes, &options, |config| {
        config.max_batch_items = max_batch_items;
        if let Some(ttl) = ttl {
            config.book.ttl = ttl;
        }
    })?;

    let mut out = std::io::stdout().lock();
    for (rank, server) in servers.servers().iter().enumerate() {
        writeln!(out, "shard rank={rank} control={} events={}", server.endpoint(), server.event_endpoint())?;
    }
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);

    let stats_every = (args.stats_interval_ms > 0).then(|| Duration::from_millis(args.stats_interval_ms));
    let mut next_stats = Instant::now();
    let code = loop {
        if let Some(every) = stats_every.filter(|_| Instant::now() >= next_stats) {
            print_stats(&servers)?;
            next_stats = Instant::now() + every;
        }
        let tick = stats_every.map_or(HEALTH_TICK, |every| every.min(HEALTH_TICK));
        match signal_rx.recv_timeout(tick) {
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                tracing::info!("signal received; closing the control channels");
                break ExitCode::SUCCESS;
            }
            Err(mpsc::RecvTimeoutError::Timeout) if servers.all_serving() => {}
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // The failing loop logged why; a consumer missing a shard is no consumer.
                tracing::error!("a control channel stopped serving; shutting down");
                break ExitCode::FAILURE;
            }
        }
    };
    servers.close();
    Ok(code)
}

/// One JSON line of counters per rank.
fn print_stats(servers: &ConsumerServers) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    for (rank, server) in servers.servers().iter().enumerate() {
        let line = server.with_shard(|shard| {
            let stats = shard.stats();
            let census = shard.book().census();
            serde_json::json!({
                "rank": rank,
                "requests": stats.requests,
                "error_replies": stats.error_replies,
                "malformed": stats.malformed,
                "events_queued": stats.events_queued,
                "records": census.live,
                "tombstones": census.tombstones,
                "writer_owned": census.writer_owned,
            })
        });
        writeln!(out, "{line}")?;
    }
    out.flush()
}
