//! The TCP sockets iterator, `tcp_sockets` (`iter/tcp`): each read of its
//! file walks every TCP socket (TIME_WAIT and LISTEN included). In
//! every-socket mode it writes one TcpSocket record per socket (the
//! self-check and tests); in aggregate mode only listeners', and it counts
//! TIME_WAIT sockets per link in the kernel instead (tcp_links), so a
//! machine with tens of thousands of them costs userspace nothing per
//! socket. Struct offsets come from BTF at load time.

use core::ffi::c_void;

use aya_ebpf::{bindings::seq_file, helpers::bpf_seq_write, macros::map, maps::Array};
use probes_common::sock::{
    AF_INET6, ITER_AGGREGATE, IterConfig, TCP_LISTEN, TCP_NEW_SYN_RECV, TCP_TIME_WAIT, TcpSocket,
};

use crate::{
    tcp_links,
    tcp_sock::{self, SK_ACK_BACKLOG, SK_DROPS, SK_MAX_ACK_BACKLOG, Sock as _, SockBtf},
};

#[map]
static ITER_CONFIG: Array<IterConfig> = Array::with_max_entries(1, 0);

/// The iterator's context: `bpf_iter_meta *meta; sock_common *sk; uid_t uid`.
#[repr(C)]
struct IterTcpCtx {
    meta: *const IterMeta,
    sk: *const u8,
}

#[repr(C)]
struct IterMeta {
    seq: *mut seq_file,
}

// SAFETY: the section tells the loader this is an iter/tcp program, which
// the kernel calls with its iterator context, as the signature expects; no
// other symbol is named tcp_sockets.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub fn tcp_sockets(ctx: *const c_void) -> i32 {
    // SAFETY: the kernel runs an iter/tcp program with a pointer to its
    // `struct bpf_iter__tcp`, which starts as IterTcpCtx does and lives for
    // the run.
    let ctx = unsafe { &*(ctx as *const IterTcpCtx) };
    // Read once: a second load from the context would be a pointer the
    // verifier knows only as maybe null, whatever was checked before.
    // SAFETY: a field of the live context (see above).
    let sk_common = unsafe { core::ptr::read_volatile(&raw const ctx.sk) };
    if sk_common.is_null() {
        // The end of the walk.
        return 0;
    }
    let sk = sk_common as u64;
    let Some(config) = ITER_CONFIG.get_ptr_mut(0) else {
        return 0;
    };
    // The verifier types the context's socket as the `sock_common` it is:
    // its members are plain loads, no copy (every socket of a walk pays
    // for this).
    let sock = SockBtf(sk_common);
    let Some(mut e) = sock.ends() else {
        return 0;
    };
    e.netns = sock.netns();
    // SAFETY: the array's only value, which lives as long as the map; one
    // run walks at a time, and userspace writes it only between runs.
    let config = unsafe { &mut *config };
    if config.mode == ITER_AGGREGATE {
        config.walked += 1;
        if e.state == TCP_TIME_WAIT {
            tcp_links::count_time_wait(&e, u64::from(config.generation));
            return 0;
        }
        if e.state != TCP_LISTEN {
            return 0;
        }
    }
    let mut rec = TcpSocket {
        family: e.family,
        state: e.state,
        lport: e.lport,
        rport_be: e.rport_be,
        netns: e.netns,
        ..TcpSocket::default()
    };
    if e.family == AF_INET6 {
        rec.laddr = e.laddr;
        rec.raddr = e.raddr;
    } else {
        rec.laddr[..4].copy_from_slice(&e.laddr[..4]);
        rec.raddr[..4].copy_from_slice(&e.raddr[..4]);
    }
    // TIME_WAIT and request sockets are not full `struct sock`s: only the
    // sock_common part may be read.
    if rec.state != TCP_TIME_WAIT && rec.state != TCP_NEW_SYN_RECV {
        if rec.state == TCP_LISTEN {
            rec.ack_backlog = tcp_sock::read(sk, &SK_ACK_BACKLOG).unwrap_or(0);
            rec.max_ack_backlog = tcp_sock::read(sk, &SK_MAX_ACK_BACKLOG).unwrap_or(0);
            // Counted where the kernel drops a connection at a full queue
            // (tcp_listendrop), beside ListenOverflows/ListenDrops.
            rec.drops = tcp_sock::read(sk, &SK_DROPS).unwrap_or(0);
        }
        rec.ino = tcp_sock::inode(sk).unwrap_or(0);
    }
    // SAFETY: `meta` is never null in an iterator's context and points to
    // the walk's bpf_iter_meta. A direct load: the verifier accepts only
    // such a seq_file pointer for bpf_seq_write.
    let seq = unsafe { (*ctx.meta).seq };
    // SAFETY: `seq` is the walk's seq_file, from the kernel; the pointer and
    // length describe `rec`, a live local. A record that does not fit is
    // not written, and the kernel retries it in the next buffer.
    unsafe { bpf_seq_write(seq, (&raw const rec).cast(), size_of::<TcpSocket>() as u32) };
    0
}
