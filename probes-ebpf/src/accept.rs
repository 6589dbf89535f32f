//! accept(2)/accept4(2) latency and accept-queue wait, into the kernel's
//! histograms. One program for both syscalls' enter and one for both exits:
//! their tracepoint records share a layout (checked by userspace).

use aya_ebpf::{
    Global,
    helpers::bpf_get_current_pid_tgid,
    macros::{fexit, kretprobe, map, tracepoint},
    maps::Array,
    programs::{FExitContext, RetProbeContext, TracePointContext},
};
use aya_log_ebpf::debug;
use probes_common::{accept::SOCK_FROM_HOOK, connect::AF_UNIX, hist::HistMetric, stats::Stat};

/// accept(2)'s errno for a non-blocking listener with nothing waiting.
const EAGAIN: i64 = 11;

use crate::{
    clock::now,
    events, fds, hist, memory, services, slots, tcp_links,
    tcp_sock::{self, SKC_FAMILY},
    tracked, unix_queue,
    watch_set::is_watched,
};

/// Set by userspace once it has attached a hook on inet_csk_accept.
#[map]
static ACCEPT_CONFIG: Array<u32> = Array::with_max_entries(1, 0);

// SAFETY: no other symbol has this name; userspace sets the global by it.
#[unsafe(no_mangle)]
static ACCEPT_EXIT_RET_OFFSET: Global<u32> = Global::new(16);

// SAFETY: as above.
#[unsafe(no_mangle)]
static ACCEPT_ENTER_FD_OFFSET: Global<u32> = Global::new(16);

#[tracepoint]
pub fn accept_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    if !is_watched((pid_tgid >> 32) as u32) {
        return 0;
    }
    let tid = pid_tgid as u32;
    let Some(slot) = slots::accept(tid) else {
        return 0;
    };
    if slot.start_ns != 0 && slot.tid != tid {
        // Another watched thread's accept is in flight in this slot and is
        // about to lose its start time.
        events::count(Stat::AcceptSlotShared);
        debug!(
            &ctx,
            "accept slot of thread {} taken by thread {}: that accept is not timed", slot.tid, tid
        );
    }
    slot.tid = tid;
    slot.sk = 0;
    // The listening socket: accepts per listener.
    slot.listener = memory::field::<i64>(&ctx, &ACCEPT_ENTER_FD_OFFSET)
        .and_then(|fd| u32::try_from(fd).ok())
        .map_or(0, |fd| fd.saturating_add(1));
    slot.start_ns = now();
    0
}

/// Notes the socket inet_csk_accept hands over in the current thread's
/// accept, if a watched one is in flight.
#[inline(always)]
fn note_accepted(sk: u64) {
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(slot) = slots::accept(tid)
        && slot.start_ns != 0
        && slot.tid == tid
    {
        slot.sk = sk;
    }
}

// In an fexit context the return value follows the arguments, and the
// verifier takes only constant context offsets: one program per signature
// (userspace loads the one this kernel's BTF names).

/// `inet_csk_accept(sk, flags, err, kern)`, before 6.10.
#[fexit(function = "inet_csk_accept")]
pub fn inet_csk_accept_fexit4(ctx: FExitContext) -> u32 {
    note_accepted(ctx.arg(4));
    0
}

/// `inet_csk_accept(sk, arg)`, since 6.10.
#[fexit(function = "inet_csk_accept")]
pub fn inet_csk_accept_fexit2(ctx: FExitContext) -> u32 {
    note_accepted(ctx.arg(2));
    0
}

#[kretprobe]
pub fn inet_csk_accept_kretprobe(ctx: RetProbeContext) -> u32 {
    note_accepted(ctx.ret::<u64>());
    0
}

#[tracepoint]
pub fn accept_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // Only a watched thread finds its own start here: this inlined array
    // lookup is the whole cost for everyone else.
    let Some(slot) = slots::accept(tid) else {
        return 0;
    };
    if slot.start_ns == 0 || slot.tid != tid {
        untimed(&ctx, pid_tgid);
        return 0;
    }
    let start_ns = slot.start_ns;
    let hooked_sk = slot.sk;
    let listener = slot.listener;
    slot.start_ns = 0;
    let end_ns = now();
    let Some(ret) = memory::field::<i64>(&ctx, &ACCEPT_EXIT_RET_OFFSET) else {
        return 0;
    };
    if ret < 0 {
        // No connection was accepted. EAGAIN: a non-blocking accept found
        // the queue empty (another worker took the connection, or a wakeup
        // for nothing); EINTR and the rest count nothing.
        if ret == -EAGAIN {
            hist::record((pid_tgid >> 32) as u32, HistMetric::AcceptEmpty, 0, 0);
        }
        return 0;
    }
    // With the hook on inet_csk_accept, a TCP socket is known (0 for a unix
    // accept, which never passes there); else it is found through the fd.
    let from_hook = ACCEPT_CONFIG.get(0).is_some_and(|c| *c == SOCK_FROM_HOOK);
    let tgid = (pid_tgid >> 32) as u32;
    let sk = if from_hook && hooked_sk != 0 {
        Some(hooked_sk)
    } else {
        let sk = fds::sock_of_fd(ret as u32);
        if sk.is_none() {
            // Every accepted fd is a socket: a failed walk means a struct
            // offset from BTF is wrong (the load's self-check says so).
            debug!(
                &ctx,
                "accept of fd {} by {}: the walk task → files → fdtable → file → socket → sock failed",
                ret,
                tgid
            );
        }
        sk
    };
    hist::record(
        tgid,
        HistMetric::Accept,
        u64::from(listener),
        end_ns.saturating_sub(start_ns),
    );
    let Some(sk) = sk else {
        return 0;
    };
    if !from_hook || hooked_sk == 0 {
        // Only a walk can have found a unix socket.
        if tcp_sock::read::<u16>(sk, &SKC_FAMILY) == Some(AF_UNIX) {
            unix_queue::accepted(sk, tgid, listener, end_ns);
            services::started(sk, tgid, listener, end_ns, Some(ret as u32));
            return 0;
        }
    }
    // A connection seen arriving at a watched listener is followed, its
    // listener's port and namespace in its record; unknown for unix
    // sockets and connections established before attach.
    let tracked = tracked::get(sk);
    let arrived = match tracked {
        // Arrived as the acceptor's already: the listener is its, and the
        // map of listeners needs no lookup (a cold one per accept, where
        // the process that listens accepts too, as postgres does).
        // SAFETY: see tracked::get; copied out at once.
        Some(p) if unsafe { (*p.as_ptr()).owner } == tgid => None,
        // SAFETY: as above.
        Some(p) => unsafe { Some(((*p.as_ptr()).lport, (*p.as_ptr()).netns)) },
        None => tcp_sock::port_and_netns(sk),
    };
    if let Some((port, netns)) = arrived {
        tcp_links::accepted(port, netns, tgid, is_watched);
    }
    if let Some(at) = tracked.and_then(tracked::take_since) {
        hist::record(
            tgid,
            HistMetric::AcceptQueue,
            u64::from(listener),
            end_ns.saturating_sub(at),
        );
    }
    // After the queue wait took the record's `since_ns`, which the
    // service's start then takes.
    match tracked {
        Some(p) => services::started_tracked(p, tgid, listener, end_ns),
        None => services::started(sk, tgid, listener, end_ns, None),
    }
    0
}

/// An accept of a watched process whose enter was not seen (its thread was
/// blocked in accept() when the probes attached, or its slot was taken):
/// counted, since the connection was accepted, but with no latency.
#[inline(always)]
fn untimed(ctx: &TracePointContext, pid_tgid: u64) {
    let tgid = (pid_tgid >> 32) as u32;
    if !is_watched(tgid) {
        return;
    }
    let Some(fd) = memory::field::<i64>(ctx, &ACCEPT_EXIT_RET_OFFSET).filter(|&ret| ret >= 0)
    else {
        return;
    };
    hist::record(tgid, HistMetric::AcceptUntimed, 0, 0);
    // The connection is served and waited in its queue all the same: its
    // listener is what is not known.
    let Some(sk) = fds::sock_of_fd(fd as u32) else {
        return;
    };
    let at = now();
    let unix = tcp_sock::read::<u16>(sk, &SKC_FAMILY) == Some(AF_UNIX);
    if unix {
        unix_queue::accepted(sk, tgid, 0, at);
    }
    services::started(sk, tgid, 0, at, unix.then_some(fd as u32));
}
