//! `ctlplane`: run a consumer's control servers, or talk to one as an operator.

mod consumer;
mod ec;
mod p2p;
mod p2p_json;
mod push;
mod security;
mod watch;

use clap::{Parser, Subcommand};
use std::error::Error;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

/// mimalloc: decoding a P2P message allocates a handful of small objects that the reader
/// frees soon after, in batches glibc's per-thread cache does not hold.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "ctlplane", version, about = "ctlplane control plane: EC consumer servers and operator tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve one EC control shard per TP rank of a consumer replica.
    Consumer(consumer::ConsumerArgs),
    /// Send EC control requests to a consumer (an operator's tool).
    Ec(ec::EcArgs),
    // Its help text is `PushArgs`'s doc comment.
    Push(push::PushArgs),
    /// Run a P2P control-transport peer: an echo peer, or send one message.
    P2p(p2p::P2pArgs),
    /// Write a fresh CURVE key pair to a file and print its public key.
    #[cfg(feature = "curve")]
    CurveKeygen(security::KeygenArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Logs go to stderr so stdout stays machine-readable.
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();
    let outcome = match cli.command {
        Command::Consumer(args) => consumer::run(args),
        Command::Ec(args) => ec::run(args),
        Command::Push(args) => push::run(args),
        Command::P2p(args) => p2p::run(args),
        #[cfg(feature = "curve")]
        Command::CurveKeygen(args) => security::keygen(args),
    };
    match outcome {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {}", chain(error.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// `error: cause: cause's cause ...`, so a bind failure shows why it failed.
pub(crate) fn chain(error: &dyn Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
