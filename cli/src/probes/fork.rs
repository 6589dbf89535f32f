//! Userspace side of the clone probes (kernel side: probes-ebpf/src/fork.rs):
//! setup before load, attachment, and decoding their events.

use anyhow::Result;
use aya::Ebpf;
use probes_common::fork::{
    CLONE_FLAGS_OFFSET_GLOBAL, CLONE3_UARGS_OFFSET_GLOBAL, ENTER_CLONE_PROGRAM,
    ENTER_CLONE3_PROGRAM, ENTER_FORK_PROGRAM, ENTER_FORK_TRACEPOINTS, EXIT_PROGRAM,
    EXIT_RET_OFFSET_GLOBAL, EXIT_TRACEPOINTS, FORK_START_MAP, ForkEvent,
};

use super::{
    events::{comm_to_string, read_record},
    loader::{Setup, attach_tracepoints},
    tracefs::Tracefs,
};
use crate::model::event::{ForkSample, TaskKind};

pub fn setup(tracefs: &Tracefs, slots: u32) -> Result<Setup> {
    let flags = tracefs.offset("syscalls", "sys_enter_clone", "clone_flags", 8)?;
    let uargs = tracefs.offset("syscalls", "sys_enter_clone3", "uargs", 8)?;
    let ret = tracefs.same_offset("syscalls", &EXIT_TRACEPOINTS, "ret", 8)?;
    Ok(Setup {
        globals: vec![
            (CLONE_FLAGS_OFFSET_GLOBAL, flags),
            (CLONE3_UARGS_OFFSET_GLOBAL, uargs),
            (EXIT_RET_OFFSET_GLOBAL, ret),
        ],
        map_sizes: vec![(FORK_START_MAP, slots)],
    })
}

pub fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(
        ebpf,
        tracefs,
        ENTER_CLONE_PROGRAM,
        "syscalls",
        &["sys_enter_clone"],
    )?;
    attach_tracepoints(
        ebpf,
        tracefs,
        ENTER_CLONE3_PROGRAM,
        "syscalls",
        &["sys_enter_clone3"],
    )?;
    attach_tracepoints(
        ebpf,
        tracefs,
        ENTER_FORK_PROGRAM,
        "syscalls",
        &ENTER_FORK_TRACEPOINTS,
    )?;
    attach_tracepoints(ebpf, tracefs, EXIT_PROGRAM, "syscalls", &EXIT_TRACEPOINTS)
}

pub fn decode(bytes: &[u8]) -> Option<ForkSample> {
    let e: ForkEvent = read_record(bytes)?;
    Some(ForkSample {
        tgid: e.tgid,
        tid: e.tid,
        comm: comm_to_string(&e.comm),
        ret: e.ret,
        kind: TaskKind::from_flags((e.flags_known != 0).then_some(e.flags)),
        latency_ns: e.latency_ns,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use probes_common::{event::EventKind, fork::CLONE_THREAD};

    fn bytes_of<T>(v: &T) -> &[u8] {
        // SAFETY: viewing a plain-old-data struct without padding as bytes.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
    }

    #[test]
    fn decodes_threads_processes_and_unknown_kinds() {
        let event = |flags: u64, known: u32| ForkEvent {
            kind: EventKind::Fork as u32,
            tgid: 10,
            tid: 11,
            ret: 12,
            flags,
            flags_known: known,
            _pad: 0,
            latency_ns: 900,
            comm: [0; 16],
        };
        let thread = event(CLONE_THREAD | 0x100, 1);
        let process = event(17, 1);
        let unknown = event(CLONE_THREAD, 0);
        assert_eq!(decode(bytes_of(&thread)).unwrap().kind, TaskKind::Thread);
        assert_eq!(decode(bytes_of(&process)).unwrap().kind, TaskKind::Process);
        assert_eq!(decode(bytes_of(&unknown)).unwrap().kind, TaskKind::Unknown);
        let s = decode(bytes_of(&process)).unwrap();
        assert_eq!((s.tgid, s.tid, s.ret, s.latency_ns), (10, 11, 12, 900));
        assert!(decode(&bytes_of(&process)[..20]).is_none());
    }
}
