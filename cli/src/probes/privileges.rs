//! Once the probes are attached, stackprobe keeps only the capabilities the
//! rest of the run needs, as ebpf_exporter does: a bug or a hostile input
//! later in a long run then cannot use the rest of root's power.

use anyhow::{Context as _, Result};
use caps::{CapSet, Capability, CapsHashSet};

/// What a run needs after attaching:
/// - CAP_BPF: reading and updating maps and walking the TCP iterator (older
///   kernels check it on every bpf() call when unprivileged BPF is off);
/// - CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH: reading /proc/PID/fd and
///   /proc/PID/exe of processes owned by other users (postgres, www-data),
///   to find who owns a listening socket and which processes match a name.
pub const KEPT: [Capability; 3] = [
    Capability::CAP_BPF,
    Capability::CAP_SYS_PTRACE,
    Capability::CAP_DAC_READ_SEARCH,
];

/// Drops every other capability from this thread's permitted, effective and
/// inheritable sets, the ambient set, and (when allowed) the bounding set,
/// so not even an exec can bring them back. Threads started afterwards
/// inherit the reduced sets; call it before starting any.
pub fn drop_unneeded() -> Result<()> {
    let kept: CapsHashSet = KEPT.into_iter().collect();
    // The bounding set first: dropping from it needs CAP_SETPCAP, which goes next.
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        for cap in caps::runtime::thread_all_supported() {
            if !kept.contains(&cap) {
                caps::drop(None, CapSet::Bounding, cap)
                    .with_context(|| format!("dropping {cap} from the bounding set"))?;
            }
        }
    }
    // Ambient capabilities arrived in 4.3; a kernel without them has none to clear.
    if caps::runtime::ambient_set_supported().is_ok() {
        caps::clear(None, CapSet::Ambient).context("clearing the ambient capabilities")?;
    }
    caps::clear(None, CapSet::Inheritable).context("clearing the inheritable capabilities")?;
    for set in [CapSet::Effective, CapSet::Permitted] {
        let now = caps::read(None, set).context("reading this thread's capabilities")?;
        let keep: CapsHashSet = now.intersection(&kept).copied().collect();
        caps::set(None, set, &keep)
            .with_context(|| format!("reducing the {set:?} capabilities"))?;
    }
    Ok(())
}

/// The capability bitmask of [`KEPT`], as /proc/PID/status prints it.
pub fn kept_mask() -> u64 {
    KEPT.iter().map(|c| c.bitmask()).fold(0, |a, b| a | b)
}
