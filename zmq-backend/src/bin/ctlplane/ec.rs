//! `ctlplane ec ...`: one control request to a shard, or to every shard of a consumer.

use crate::security::ClientCurve;
use clap::{Args, Subcommand};
use ctlplane_core::ec::defaults::CONTROL_TIMEOUT_MS;
use ctlplane_core::ec::DType;
use ctlplane_zmq::requests::{self, ReserveSpec};
use ctlplane_zmq::{ClientError, ControlClient};
use serde::Serialize;
use serde_json::Value;
use std::error::Error;
use std::process::ExitCode;

#[derive(Args)]
pub struct EcArgs {
    #[command(subcommand)]
    op: Op,
}

/// Where to send and how long to wait.
#[derive(Args)]
struct Target {
    /// Control address of a shard, e.g. tcp://127.0.0.1:19019 (rank 0 with --all-shards).
    #[arg(long)]
    addr: String,
    /// Reply timeout (`control_timeout_ms`).
    #[arg(long, default_value_t = CONTROL_TIMEOUT_MS)]
    timeout_ms: u64,
    /// Discover the consumer's shards from --addr and send to every one of them.
    #[arg(long)]
    all_shards: bool,
    #[command(flatten)]
    curve: ClientCurve,
}

#[derive(Subcommand)]
enum Op {
    /// The consumer's shard ports.
    Peers {
        #[command(flatten)]
        target: Target,
    },
    /// The shard's readiness-event port.
    EventPort {
        #[command(flatten)]
        target: Target,
    },
    /// The status object of an active reservation (or null).
    Status {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        transfer_id: String,
    },
    /// Reserve room for a tensor; nbytes is computed from --shape and --dtype.
    Reserve {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        transfer_id: String,
        #[arg(long)]
        mm_hash: String,
        /// Dimensions, comma-separated: 64,128.
        #[arg(long, value_delimiter = ',', required = true)]
        shape: Vec<u64>,
        /// Torch dtype name: float16, bfloat16, float32, ...
        #[arg(long, value_parser = parse_dtype)]
        dtype: DType,
    },
    /// Report a reservation written.
    Complete {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        transfer_id: String,
        #[arg(long)]
        reservation_id: String,
    },
    /// Cancel a transfer (plain, as the scheduler does, or --abandon as a producer does).
    Cancel {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        transfer_id: String,
        #[arg(long, default_value = "")]
        reservation_id: String,
        #[arg(long)]
        abandon: bool,
        #[arg(long)]
        refresh: bool,
    },
    /// Subscribe to every shard's readiness events and print each as one JSON line.
    Watch(crate::watch::WatchArgs),
}

fn parse_dtype(name: &str) -> Result<DType, String> {
    DType::from_name(name).ok_or_else(|| format!("unsupported torch dtype {name:?}"))
}

pub fn run(args: EcArgs) -> Result<ExitCode, Box<dyn Error>> {
    let (target, frame) = match args.op {
        Op::Watch(args) => return crate::watch::run(args),
        Op::Peers { target } => (target, requests::peers()),
        Op::EventPort { target } => (target, requests::event_port()),
        Op::Status { target, transfer_id } => (target, requests::status(&transfer_id)),
        Op::Reserve { target, transfer_id, mm_hash, shape, dtype } => {
            let spec = ReserveSpec { transfer_id, mm_hash, shape, dtype };
            let frame = requests::reserve(&spec)
                .ok_or_else(|| ClientError::SizeOverflow { transfer_id: spec.transfer_id.clone() })?;
            (target, frame)
        }
        Op::Complete { target, transfer_id, reservation_id } => {
            (target, requests::complete(&transfer_id, &reservation_id))
        }
        Op::Cancel { target, transfer_id, reservation_id, abandon, refresh } => {
            (target, requests::make_cancel_request(&transfer_id, &reservation_id, abandon, refresh))
        }
    };
    let client = target.curve.apply(ControlClient::new(target.timeout_ms))?;
    let code =
        if target.all_shards { fan_out(&client, &target.addr, &frame)? } else { one(&client, &target.addr, &frame)? };
    client.close();
    Ok(code)
}

fn one(client: &ControlClient, addr: &str, frame: &[u8]) -> Result<ExitCode, Box<dyn Error>> {
    let result = client.request_frame(addr, frame)?;
    println!("{result}");
    Ok(ExitCode::SUCCESS)
}

#[derive(Serialize)]
struct ShardResult<'a> {
    shard: &'a str,
    result: &'a Value,
}

/// One JSON line per shard, `{"shard": addr, "result": ...}`; a failing shard is reported
/// on stderr and makes the exit code 1, the others are still asked.
fn fan_out(client: &ControlClient, base: &str, frame: &[u8]) -> Result<ExitCode, Box<dyn Error>> {
    let shards = client.shards(base)?;
    let mut code = ExitCode::SUCCESS;
    for shard in shards {
        match client.request_frame(&shard, frame) {
            Ok(result) => println!("{}", serde_json::to_string(&ShardResult { shard: &shard, result: &result })?),
            Err(error) => {
                eprintln!("error: shard {shard}: {}", crate::chain(&error));
                code = ExitCode::FAILURE;
            }
        }
    }
    Ok(code)
}
