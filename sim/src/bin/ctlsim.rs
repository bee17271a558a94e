//! `ctlsim`: run, sweep and replay seeded simulations (see `ctlplane_sim::cli`).

use std::process::ExitCode;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    ctlplane_sim::cli::main()
}
