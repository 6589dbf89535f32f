//! Userspace side of the accept probe (kernel side: probes-ebpf/src/accept.rs):
//! setup before load, attachment, and decoding its events.

use anyhow::{Result, bail};
use aya::Ebpf;
use probes_common::accept::{
    ACCEPT_START_MAP, ACCEPT_START_MAX_SLOTS, AcceptEvent, ENTER_PROGRAM, ENTER_TRACEPOINTS,
    EXIT_PROGRAM, EXIT_RET_OFFSET_GLOBAL, EXIT_TRACEPOINTS, SLOT_MASK_GLOBAL,
};

use super::{
    loader::{Setup, attach_tracepoints},
    tracefs::Tracefs,
};
use crate::{model::process::AcceptSample, procfs};

/// The `ret` offset from this kernel's tracepoint layouts (one program serves
/// accept and accept4, so their layouts must agree), and the in-flight slot
/// array sized from `pid_max`.
pub fn setup(tracefs: &Tracefs) -> Result<Setup> {
    let ret = same_offset(tracefs, &EXIT_TRACEPOINTS, "ret")?;
    let slots = slot_count(procfs::pid_max());
    Ok(Setup {
        globals: vec![(EXIT_RET_OFFSET_GLOBAL, ret), (SLOT_MASK_GLOBAL, slots - 1)],
        map_sizes: vec![(ACCEPT_START_MAP, slots)],
    })
}

/// Enough slots for every thread id when `pid_max` allows (16 bytes each,
/// 4 MiB at most); beyond that, a shared slot is counted as a drop.
pub fn slot_count(pid_max: u32) -> u32 {
    pid_max
        .max(2)
        .checked_next_power_of_two()
        .unwrap_or(u32::MAX)
        .min(ACCEPT_START_MAX_SLOTS)
}

fn same_offset(tracefs: &Tracefs, events: &[&str], field: &str) -> Result<u32> {
    let offsets = events
        .iter()
        .map(|e| tracefs.offset("syscalls", e, field, 8))
        .collect::<Result<Vec<_>>>()?;
    if offsets.windows(2).any(|w| w[0] != w[1]) {
        bail!("{events:?} put {field} at different offsets ({offsets:?}) on this kernel");
    }
    Ok(offsets[0])
}

pub fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(ebpf, tracefs, ENTER_PROGRAM, "syscalls", &ENTER_TRACEPOINTS)?;
    attach_tracepoints(ebpf, tracefs, EXIT_PROGRAM, "syscalls", &EXIT_TRACEPOINTS)
}

pub fn decode(bytes: &[u8]) -> Option<AcceptSample> {
    if bytes.len() < size_of::<AcceptEvent>() {
        return None;
    }
    // SAFETY: AcceptEvent is plain old data and the length was checked; the
    // ring buffer gives no alignment guarantee beyond 8, hence read_unaligned.
    let e: AcceptEvent = unsafe { bytes.as_ptr().cast::<AcceptEvent>().read_unaligned() };
    Some(AcceptSample {
        tgid: e.tgid,
        tid: e.tid,
        comm: comm_to_string(&e.comm),
        conn_fd: e.conn_fd,
        latency_ns: e.latency_ns,
    })
}

pub fn comm_to_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes_common::event::EventKind;

    #[test]
    fn decodes_an_event_and_rejects_short_records() {
        let mut comm = [0u8; 16];
        comm[..8].copy_from_slice(b"postgres");
        let event = AcceptEvent {
            kind: EventKind::Accept as u32,
            tgid: 7,
            tid: 8,
            conn_fd: 9,
            start_ns: 100,
            latency_ns: 4242,
            comm,
        };
        // SAFETY: reading the bytes of a plain-old-data struct without padding.
        let bytes = unsafe {
            std::slice::from_raw_parts((&raw const event).cast::<u8>(), size_of::<AcceptEvent>())
        };
        let sample = decode(bytes).unwrap();
        assert_eq!(
            sample,
            AcceptSample {
                tgid: 7,
                tid: 8,
                comm: "postgres".into(),
                conn_fd: 9,
                latency_ns: 4242
            }
        );
        assert!(decode(&bytes[..bytes.len() - 1]).is_none());
    }

    #[test]
    fn slots_cover_pid_max_up_to_the_cap() {
        assert_eq!(slot_count(32768), 32768);
        assert_eq!(slot_count(100_000), 131072);
        assert_eq!(slot_count(4_194_304), ACCEPT_START_MAX_SLOTS);
        assert_eq!(slot_count(0), 2);
    }
}
