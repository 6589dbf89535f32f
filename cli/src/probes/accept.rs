//! Userspace side of the accept probe (kernel side: probes-ebpf/src/accept.rs):
//! setup before load, attachment, and decoding its events.

use anyhow::Result;
use aya::Ebpf;
use probes_common::accept::{
    ACCEPT_START_MAP, AcceptEvent, ENTER_PROGRAM, ENTER_TRACEPOINTS, EXIT_PROGRAM,
    EXIT_RET_OFFSET_GLOBAL, EXIT_TRACEPOINTS, FD_WALK_GLOBALS, QUEUE_WAIT_UNKNOWN,
};

use super::{
    btf::KernelBtf,
    events::{comm_to_string, read_record},
    loader::{Setup, attach_tracepoints},
    tracefs::Tracefs,
};
use crate::model::event::AcceptSample;

/// The `ret` offset from this kernel's tracepoint layouts (one program serves
/// accept and accept4, so their layouts must agree), and the in-flight slots.
pub fn setup(tracefs: &Tracefs, btf: &KernelBtf, slots: u32) -> Result<Setup> {
    let ret = tracefs.same_offset("syscalls", &EXIT_TRACEPOINTS, "ret", 8)?;
    let fd_walk = [
        btf.member_offset("task_struct", "files")?,
        btf.member_offset("files_struct", "fdt")?,
        btf.member_offset("fdtable", "fd")?,
        btf.member_offset("file", "private_data")?,
        btf.member_offset("socket", "sk")?,
    ];
    let mut globals = vec![(EXIT_RET_OFFSET_GLOBAL, ret)];
    globals.extend(FD_WALK_GLOBALS.iter().copied().zip(fd_walk));
    Ok(Setup {
        globals,
        map_sizes: vec![(ACCEPT_START_MAP, slots)],
    })
}

pub fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(ebpf, tracefs, ENTER_PROGRAM, "syscalls", &ENTER_TRACEPOINTS)?;
    attach_tracepoints(ebpf, tracefs, EXIT_PROGRAM, "syscalls", &EXIT_TRACEPOINTS)
}

pub fn decode(bytes: &[u8]) -> Option<AcceptSample> {
    let e: AcceptEvent = read_record(bytes)?;
    Some(AcceptSample {
        tgid: e.tgid,
        tid: e.tid,
        comm: comm_to_string(&e.comm),
        conn_fd: e.conn_fd,
        latency_ns: e.latency_ns,
        queue_wait_ns: (e.queue_wait_ns != QUEUE_WAIT_UNKNOWN).then_some(e.queue_wait_ns),
    })
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
            queue_wait_ns: QUEUE_WAIT_UNKNOWN,
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
                latency_ns: 4242,
                queue_wait_ns: None,
            }
        );
        assert!(decode(&bytes[..bytes.len() - 1]).is_none());
    }
}
