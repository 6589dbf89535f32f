//! Types shared by the kernel programs (`probes-ebpf`) and userspace (`cli`).
//!
//! Everything here is `#[repr(C)]` and `Copy`, with explicit padding fields so
//! both sides agree on the layout byte for byte.
#![no_std]

pub mod accept;
pub mod event;
pub mod stats;
pub mod watch;

/// Length of `task_struct::comm`, including the trailing NUL.
pub const TASK_COMM_LEN: usize = 16;
