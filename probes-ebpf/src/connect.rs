//! connect(2) to a unix socket: the syscall's latency per destination path,
//! and its failures, into the kernel's histograms. A TCP connect is timed
//! by the state probe instead (SYN to ESTABLISHED, which a non-blocking
//! connect does not wait for).

use aya_ebpf::{
    Global,
    helpers::{
        bpf_get_current_pid_tgid, bpf_probe_read_user, bpf_probe_read_user_buf,
        bpf_probe_read_user_str_bytes,
    },
    macros::tracepoint,
    programs::TracePointContext,
};
use probes_common::{
    connect::{AF_UNIX, ECONNREFUSED, UNIX_PATH_MAX},
    hist::HistMetric,
};

use crate::{clock::now, destinations, hist, memory, slots, watch_set::is_watched};

// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static CONNECT_ENTER_ADDR_OFFSET: Global<u32> = Global::new(24);

// SAFETY: as above.
#[unsafe(no_mangle)]
static CONNECT_ENTER_LEN_OFFSET: Global<u32> = Global::new(32);

// SAFETY: as above.
#[unsafe(no_mangle)]
static CONNECT_EXIT_RET_OFFSET: Global<u32> = Global::new(16);

/// `sockaddr_un.sun_path` follows the 2-byte family.
const PATH_OFFSET: u64 = 2;

#[tracepoint]
pub fn connect_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_watched((pid_tgid >> 32) as u32) {
        return 0;
    }
    let (Some(addr), Some(len)) = (
        memory::field::<u64>(&ctx, &CONNECT_ENTER_ADDR_OFFSET),
        memory::field::<i64>(&ctx, &CONNECT_ENTER_LEN_OFFSET),
    ) else {
        return 0;
    };
    // SAFETY: the helper checks the user address; a bad one is an error.
    let family = unsafe { bpf_probe_read_user(addr as *const u16) };
    if family != Ok(AF_UNIX) {
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
    let tid = pid_tgid as u32;
    if let Some(slot) = slots::connect(tid) {
        slot.tid = tid;
        slot.destination = id;
        slot.start_ns = now();
    }
    0
}

/// Reads the unix address at `path` (`len` bytes of sockaddr) into `d`: a
/// path up to its NUL, as the kernel takes it, or an abstract name (first
/// byte 0) of exactly its length. None for an unnamed or unreadable one.
#[inline(always)]
fn read_unix_path(
    path: u64,
    len: i64,
    d: &mut probes_common::connect::UnixDestination,
) -> Option<()> {
    // SAFETY: as above.
    let first = unsafe { bpf_probe_read_user(path as *const u8) }.ok()?;
    if first != 0 {
        // SAFETY: as above; the helper stops at the NUL or the buffer's end.
        let read = unsafe { bpf_probe_read_user_str_bytes(path as *const u8, &mut d.path) }
            .ok()?
            .len();
        d.len = read as u32;
        return Some(());
    }
    let n = usize::try_from(len - PATH_OFFSET as i64).ok()?;
    if n == 0 || n > UNIX_PATH_MAX {
        return None;
    }
    let buf = d.path.get_mut(..n)?;
    // SAFETY: as above.
    unsafe { bpf_probe_read_user_buf(path as *const u8, buf) }.ok()?;
    d.len = n as u32;
    Some(())
}

#[tracepoint]
pub fn connect_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // Only a thread whose unix connect is in flight finds its start: this
    // inlined array lookup is the whole cost for everyone else.
    let Some(slot) = slots::connect(tid) else {
        return 0;
    };
    if slot.start_ns == 0 || slot.tid != tid {
        return 0;
    }
    let start_ns = slot.start_ns;
    slot.start_ns = 0;
    let end_ns = now();
    let Some(ret) = memory::field::<i64>(&ctx, &CONNECT_EXIT_RET_OFFSET) else {
        return 0;
    };
    let (metric, ns) = match ret {
        0 => (HistMetric::Connect, end_ns.saturating_sub(start_ns)),
        r if r == -i64::from(ECONNREFUSED) => (HistMetric::ConnectRefused, 0),
        _ => (HistMetric::ConnectFailed, 0),
    };
    hist::record((pid_tgid >> 32) as u32, metric, slot.destination, ns);
    0
}
