//! Subcommands: each wires probes, model and views together.

pub mod demo;
pub mod diff;
pub mod report;
pub mod watch;
