//! The ring buffer carries several event types; each starts with a `u32` kind
//! so userspace can tell them apart before reading the rest. Accept and fork
//! samples are not among them: they stay in the kernel's histograms
//! ([`crate::hist`]).

/// Name of the ring buffer map every probe writes to.
pub const EVENTS_MAP: &str = "EVENTS";

/// Size of the ring buffer in bytes (a power of two, multiple of the page
/// size). Only lifecycle events and listener changes cross it (accept and
/// fork samples stay in the kernel's histograms): 1 MiB holds ≥ 11.9k
/// records of ≤ 88 bytes, ≥ 240 ms at the 50k events/s two generator
/// processes reach here, and the consumer is woken a quarter of the way in.
/// The kernel maps its data pages twice into stackprobe, all resident from
/// the start: the 4 MiB it was sized when every accept crossed it made 8 MiB
/// of a 23 MB RSS under the lab's new.php load.
pub const EVENTS_RING_BYTES: u32 = 1 << 20;

/// Probes submit without waking the consumer (a wakeup per event costs
/// microseconds); they force a wakeup once this much data is waiting, and
/// the consumer drains at each report too.
pub const EVENTS_WAKEUP_BYTES: u64 = (EVENTS_RING_BYTES / 4) as u64;

#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    // 1 and 2 were per-sample accept and fork records; they stay unused so
    // that a stale eBPF object's records are rejected, not misread.
    /// A watched process created a task (`sched_process_fork`).
    Spawn = 3,
    /// A watched process exec'd.
    Exec = 4,
    /// A watched process (its main thread) exited.
    Exit = 5,
    /// A TCP socket of a watched process changed state.
    TcpState = 6,
}

impl EventKind {
    pub fn from_u32(kind: u32) -> Option<Self> {
        match kind {
            3 => Some(Self::Spawn),
            4 => Some(Self::Exec),
            5 => Some(Self::Exit),
            6 => Some(Self::TcpState),
            _ => None,
        }
    }
}
