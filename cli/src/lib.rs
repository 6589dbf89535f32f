//! The `stackprobe` command: its options and the subcommands that wire the
//! layers together. Each layer is a crate of its own, and a crate can only
//! use those listed after it (the compiler holds to that):
//!
//! - `stackprobe_output`: views, exporters and sinks;
//! - `stackprobe_collector`: the per-interval loop over the probes;
//! - `stackprobe_probes`: the kernel side in userspace, and /proc;
//! - `stackprobe_model`: the pure model.

pub mod cli;
pub mod cmd;
