//! connect(2) to a unix socket: the syscall's latency per destination path,
//! and its failures, into the kernel's histograms. A TCP connect is timed
//! by the state probe instead (SYN to ESTABLISHED, which a non-blocking
//! connect does not wait for), which also lets this probe know: its SYN
//! frees the thread's slot, so a TCP connect costs this probe no read of
//! the caller's memory (~270 ns here).

use core::ffi::c_void;

use aya_ebpf::{
    Global,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user_str_bytes,
        generated::bpf_probe_read_user as bpf_probe_read_user_raw,
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use probes_common::{
    connect::{AF_UNIX, ECONNREFUSED, UNIX_PATH_MAX, UnixDestination},
    hist::HistMetric,
    unix::EAGAIN,
};

use crate::{
    clock::now, destinations, fds, hist, memory, slots, unix_queue, watch_set::is_watched,
};

/// `fd`, which `uservaddr` and `addrlen` follow (userspace checks).
// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static CONNECT_ENTER_ARGS_OFFSET: Global<u32> = Global::new(16);

// SAFETY: as above.
#[unsafe(no_mangle)]
static CONNECT_EXIT_RET_OFFSET: Global<u32> = Global::new(16);

/// `sockaddr_un.sun_path` follows the 2-byte family.
const PATH_OFFSET: u64 = 2;

#[tracepoint]
pub fn connect_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let watched = is_watched((pid_tgid >> 32) as u32);
    // The three arguments in one read; what the address points to is read
    // at the exit, and only if no TCP SYN went out meanwhile.
    let Some([fd, addr, len]) = memory::field::<[u64; 3]>(&ctx, &CONNECT_ENTER_ARGS_OFFSET) else {
        return 0;
    };
    // Any other process's unix connect, for the unix queue: its wait (on
    // the syscall rung) and its loss to a full queue. Their other connects
    // cost this one read of the family.
    if !watched && memory::user::<u16>(addr) != Some(AF_UNIX) {
        return 0;
    }
    let tid = pid_tgid as u32;
    if let Some(slot) = slots::connect(tid) {
        slot.tid = tid;
        slot.addr = addr;
        slot.len = len as u32;
        slot.fd = fd as u32;
        slot.watched = u32::from(watched);
        slot.start_ns = now();
    }
    0
}

#[tracepoint]
pub fn connect_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // Only a thread whose connect is in flight, and sent no TCP SYN, finds
    // its start: this inlined array lookup is the whole cost for everyone
    // else.
    let Some(slot) = slots::connect(tid) else {
        return 0;
    };
    if slot.start_ns == 0 || slot.tid != tid {
        return 0;
    }
    let start_ns = slot.start_ns;
    slot.start_ns = 0;
    let end_ns = now();
    let (addr, len, fd, watched) = (slot.addr, slot.len, slot.fd, slot.watched != 0);
    // Not TCP; UDP, netlink and the rest are not timed either.
    if watched && memory::user::<u16>(addr) != Some(AF_UNIX) {
        return 0;
    }
    let Some(ret) = memory::field::<i64>(&ctx, &CONNECT_EXIT_RET_OFFSET) else {
        return 0;
    };
    if ret == 0
        && unix_queue::pairs_syscalls()
        && let Some(client) = fds::sock_of_fd(fd)
    {
        unix_queue::connected(client, start_ns);
    }
    let lost = ret == -i64::from(EAGAIN);
    if !watched && !lost {
        return 0;
    }
    let Some(d) = destinations::unix_scratch() else {
        return 0;
    };
    if read_unix_path(addr + PATH_OFFSET, len, d).is_none() {
        return 0;
    }
    let id = d.id();
    destinations::name_unix(id, d);
    if lost {
        unix_queue::lost(id);
    }
    if !watched {
        return 0;
    }
    let (metric, ns) = match ret {
        0 => (HistMetric::Connect, end_ns.saturating_sub(start_ns)),
        r if r == -i64::from(ECONNREFUSED) => (HistMetric::ConnectRefused, 0),
        _ if lost => (HistMetric::ConnectLost, 0),
        _ => (HistMetric::ConnectFailed, 0),
    };
    hist::record((pid_tgid >> 32) as u32, metric, id, ns);
    0
}

/// Reads the unix address at `path` (`len` bytes of sockaddr) into `d`: a
/// path up to its NUL, as the kernel takes it, or an abstract name (first
/// byte 0) of exactly its length. None for an unnamed or unreadable one.
#[inline(always)]
fn read_unix_path(path: u64, len: u32, d: &mut UnixDestination) -> Option<()> {
    let first = memory::user::<u8>(path)?;
    if first != 0 {
        // SAFETY: the helper checks the user address and stops at the NUL
        // or the buffer's end.
        let read = unsafe { bpf_probe_read_user_str_bytes(path as *const u8, &mut d.path) }
            .ok()?
            .len();
        d.len = read as u32;
        return Some(());
    }
    if !(PATH_OFFSET as u32 + 1..=PATH_OFFSET as u32 + UNIX_PATH_MAX as u32).contains(&len) {
        return None;
    }
    // The length again, opaque to the compiler so that it keeps the mask:
    // the check above bounds it in the register it is made on, but 6.1's
    // verifier does not carry that over to a copy reloaded from the stack,
    // which the read may be given; the mask bounds any copy, and the
    // scratch record has room for what it lets through.
    let n = (core::hint::black_box(len) as usize).wrapping_sub(PATH_OFFSET as usize)
        & destinations::UNIX_READ_MASK;
    // SAFETY: the helper checks the user address; `n` bytes fit the path
    // and the scratch record's room behind it.
    let read = unsafe {
        bpf_probe_read_user_raw(d.path.as_mut_ptr().cast(), n as u32, path as *const c_void)
    };
    if read != 0 {
        return None;
    }
    d.len = n as u32;
    Some(())
}
