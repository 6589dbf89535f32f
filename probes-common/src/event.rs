//! The ring buffer carries several event types; each starts with a `u32` kind
//! so userspace can tell them apart before reading the rest. Accept and fork
//! samples are not among them: they stay in the kernel's histograms
//! ([`crate::hist`]).

/// Name of the ring buffer map every probe writes to.
pub const EVENTS_MAP: &str = "EVENTS";

/// Size of the ring buffer in bytes (a power of two, multiple of the page
/// size). 4 MiB was sized when every accept and fork still crossed the ring:
/// the lab's static page at 14k requests/s made ~150k events/s, and a
/// consumer sharing two busy cores was starved long enough to fill 1 MiB;
/// 4 MiB held ~300 ms of that. Only lifecycle events and listener changes
/// cross it now, so it holds far longer.
pub const EVENTS_RING_BYTES: u32 = 4 << 20;

/// Probes submit without waking the consumer (a wakeup per event costs
/// microseconds); they force a wakeup once this much data is waiting, and the
/// consumer also drains on a short timer.
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
