//! Everything that talks to the kernel: preflight checks, tracefs layouts,
//! loading and attaching the probes, reading their maps and ring into model
//! events, and /proc. One module per probe, mirroring probes-ebpf; the
//! records they send are decoded in one place, `decode`.

pub mod accept;
pub mod attach;
pub mod attach_check;
pub mod batch;
pub mod btf;
pub mod connect;
pub mod decode;
pub mod events;
pub mod fork;
pub mod hist;
pub mod kernel_log;
pub mod limits;
pub mod loader;
pub mod preflight;
pub mod privileges;
pub mod procfs;
pub mod prog_info;
pub mod run_queue;
pub mod rungs;
pub mod self_check;
pub mod services;
pub mod tcp;
pub mod tracefs;
pub mod unix_listeners;
pub mod unix_queue;
pub mod watch;

pub use loader::{Options, Probes};
