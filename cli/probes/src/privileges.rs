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

/// Kept permitted but not effective: entering another network namespace
/// (setns), to walk the TCP sockets of a watched process in a container,
/// needs it. [`entering_namespaces`] raises it on the walking thread around
/// its setns calls only; every other moment, on every thread, it is off.
pub const ENTER_NAMESPACES: Capability = Capability::CAP_SYS_ADMIN;

/// Drops every other capability from this thread's permitted, effective and
/// inheritable sets, the ambient set, and (when allowed) the bounding set,
/// so not even an exec can bring them back ([`ENTER_NAMESPACES`] stays
/// permitted only). Threads started afterwards inherit the reduced sets;
/// call it before starting any.
pub fn drop_unneeded() -> Result<()> {
    let effective: CapsHashSet = KEPT.into_iter().collect();
    let mut kept = effective.clone();
    kept.insert(ENTER_NAMESPACES);
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
    for (set, keep) in [(CapSet::Effective, &effective), (CapSet::Permitted, &kept)] {
        let now = caps::read(None, set).context("reading this thread's capabilities")?;
        let keep: CapsHashSet = now.intersection(keep).copied().collect();
        caps::set(None, set, &keep)
            .with_context(|| format!("reducing the {set:?} capabilities"))?;
    }
    Ok(())
}

/// Runs `f` with [`ENTER_NAMESPACES`] effective on this thread, and only
/// for that long: dropped again after if it was not effective before (a
/// thread that has not loaded the probes yet keeps it, to mount tracefs).
pub fn entering_namespaces<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    let had = caps::has_cap(None, CapSet::Effective, ENTER_NAMESPACES)
        .context("reading this thread's capabilities")?;
    if !had {
        caps::raise(None, CapSet::Effective, ENTER_NAMESPACES)
            .context("CAP_SYS_ADMIN, which entering a network namespace needs, is not permitted")?;
    }
    let result = f();
    if !had {
        caps::drop(None, CapSet::Effective, ENTER_NAMESPACES)
            .context("dropping CAP_SYS_ADMIN after entering a network namespace")?;
    }
    result
}

/// The capability bitmask of [`KEPT`], as /proc/PID/status prints it: the
/// effective set after attaching.
pub fn kept_mask() -> u64 {
    KEPT.iter().map(|c| c.bitmask()).fold(0, |a, b| a | b)
}

/// The permitted (and bounding) set after attaching: [`KEPT`] and
/// [`ENTER_NAMESPACES`].
#[cfg(any(test, feature = "test-support"))]
pub fn permitted_mask() -> u64 {
    kept_mask() | ENTER_NAMESPACES.bitmask()
}
