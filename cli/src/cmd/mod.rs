//! Subcommands: each wires probes, model and views together.

pub mod completions;
pub mod demo;
pub mod diff;
pub mod doctor;
pub mod report;
pub mod watch;
