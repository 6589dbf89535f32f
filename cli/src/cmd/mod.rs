//! Subcommands: each wires probes, model and views together.

pub mod watch;
