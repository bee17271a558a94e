//! `ctlplane consumer`: one control server per TP rank until SIGINT or SIGTERM.

use clap::Args;
use ctlplane_core::ec::PortPlan;
use ctlplane_zmq::{ConsumerServers, ServerOptions};
use std::error::Error;
use std::io::Write;
use std::process::ExitCode;
use std::sync::mpsc;
use std::time::Duration;

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
}

/// How often the main thread checks that every shard still serves.
const HEALTH_TICK: Duration = Duration::from_millis(250);

pub fn run(args: ConsumerArgs) -> Result<ExitCode, Box<dyn Error>> {
    let plan = PortPlan::new(args.host, args.port, args.dp_index, args.tp)?;
    let (signal_tx, signal_rx) = mpsc::channel();
    ctrlc::set_handler(move || {
        let _ = signal_tx.send(());
    })?;
    let mut servers = ConsumerServers::start(&plan, args.pool_bytes, &ServerOptions::default(), |_| {})?;

    let mut out = std::io::stdout().lock();
    for (rank, server) in servers.servers().iter().enumerate() {
        writeln!(out, "shard rank={rank} control={} events={}", server.endpoint(), server.event_endpoint())?;
    }
    writeln!(out, "ready")?;
    out.flush()?;
    drop(out);

    let code = loop {
        match signal_rx.recv_timeout(HEALTH_TICK) {
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
