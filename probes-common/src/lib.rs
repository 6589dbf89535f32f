//! Types shared by the kernel programs (`probes-ebpf`) and userspace (`cli`).
//!
//! Everything here is `#[repr(C)]` and `Copy`, with explicit padding fields so
//! both sides agree on the layout byte for byte; each record's layout is
//! asserted at compile time ([`assert_layout!`]), on both sides' targets.
#![no_std]

pub mod accept;
pub mod connect;
pub mod event;
pub mod fork;
pub mod hist;
pub mod layout;
pub mod lifecycle;
pub mod offsets;
pub mod run_queue;
pub mod service;
pub mod sock;
pub mod stats;
pub mod unix;
pub mod watch;

/// Length of `task_struct::comm`, including the trailing NUL.
pub const TASK_COMM_LEN: usize = 16;

/// Per-thread in-flight syscalls are kept in arrays of slots indexed by thread
/// id modulo their size: an array lookup is a few inlined instructions where a
/// hash update costs hundreds of ns. Userspace sizes them to cover `pid_max`
/// when that is at most [`MAX_SLOTS`], so slots are then never shared.
pub const DEFAULT_SLOTS: u32 = 32768;
pub const MAX_SLOTS: u32 = 1 << 18;
/// Global holding the slot count minus one (slot counts are powers of two).
pub const SLOT_MASK_GLOBAL: &str = "SLOT_MASK";
