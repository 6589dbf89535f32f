//! Subcommands: each wires probes, model and views together.

pub mod diff;
pub mod report;
pub mod watch;
