//! The `ctlsim` command's subcommands as a library: run, sweep, replay (in progress).
