//! A loaded program's run statistics in one bpf() call. aya 0.14's
//! `ProgramInfo` leaves out `recursion_misses` (the runs the kernel skipped
//! because a BPF program was already running on that CPU), which
//! /proc/self/fdinfo also gives, but for an open, a read, a close and a
//! parse per program every interval (5 % of stackprobe's CPU on new.php).

use std::{
    io,
    mem::{MaybeUninit, size_of},
    os::fd::{AsRawFd as _, BorrowedFd},
};

use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Runs and their time: counted only while BPF run-time statistics
    /// are enabled.
    pub runs: u64,
    pub run_time_ns: u64,
    /// Runs skipped for recursion (5.12+; older kernels leave it 0).
    pub recursion_misses: u64,
}

/// The kernel's `bpf_prog_info` for the program `fd`: it fills as much of
/// the struct as it knows, leaving what it is older than at 0.
pub fn run_stats(fd: BorrowedFd<'_>) -> io::Result<RunStats> {
    // SAFETY: both are plain integer structs (and unions of them), for
    // which all zeros is a valid value.
    let mut info: bpf_prog_info = unsafe { MaybeUninit::zeroed().assume_init() };
    let mut attr: bpf_attr = unsafe { MaybeUninit::zeroed().assume_init() };
    // The union's member the kernel reads for BPF_OBJ_GET_INFO_BY_FD.
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = size_of::<bpf_prog_info>() as u32;
    attr.info.info = (&raw mut info) as u64;
    // SAFETY: `attr` describes `info`, a live local of the length given,
    // which the kernel writes at most that much of.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_int,
            &raw mut attr,
            size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(RunStats {
        runs: info.run_cnt,
        run_time_ns: info.run_time_ns,
        recursion_misses: info.recursion_misses,
    })
}
