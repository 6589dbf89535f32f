//! Subcommands: each wires probes, model and views together.

pub mod report;
pub mod watch;
