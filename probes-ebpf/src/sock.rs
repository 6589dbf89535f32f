//! TCP sockets. `tcp_sockets` is an `iter/tcp` iterator: each read of its file
//! walks every TCP socket (TIME_WAIT and LISTEN included) and writes one
//! TcpSocket record per socket. Struct offsets come from BTF at load time.
//! `tcp_state` reports the state changes of watched processes' sockets.

use core::ffi::c_void;

use aya_ebpf::{
    Global,
    bindings::seq_file,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel,
        bpf_seq_write,
    },
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap},
    programs::TracePointContext,
};
use probes_common::{
    event::EventKind,
    sock::{
        AF_INET, AF_INET6, LISTEN_OWNERS_MAX_ENTRIES, TCP_CLOSE, TCP_CLOSE_WAIT, TCP_ESTABLISHED,
        TCP_FIN_WAIT1, TCP_LAST_ACK, TCP_LISTEN, TCP_NEW_SYN_RECV, TCP_SYN_RECV, TCP_SYN_SENT,
        TCP_TIME_WAIT, TRACKED_MAX_ENTRIES, TcpSocket, TcpStateEvent,
    },
    stats::Stat,
};

use crate::{events, offsets::offset_globals, watch::is_watched};

probes_common::sock_iter_members!(offset_globals);

#[inline(always)]
unsafe fn read<T: Copy>(base: *const u8, offset: &Global<u32>) -> Option<T> {
    unsafe { bpf_probe_read_kernel(base.add(offset.load() as usize).cast::<T>()) }.ok()
}

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

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub fn tcp_sockets(ctx: *const c_void) -> i32 {
    let ctx = unsafe { &*(ctx as *const IterTcpCtx) };
    let sk = ctx.sk;
    if sk.is_null() {
        // The end of the walk.
        return 0;
    }
    let seq = unsafe { (*ctx.meta).seq };
    let mut rec = TcpSocket::default();
    unsafe {
        rec.family = read(sk, &SKC_FAMILY).unwrap_or(0);
        rec.state = read(sk, &SKC_STATE).unwrap_or(0);
        rec.lport = read(sk, &SKC_NUM).unwrap_or(0);
        rec.rport_be = read(sk, &SKC_DPORT).unwrap_or(0);
        if rec.family == AF_INET {
            let l: [u8; 4] = read(sk, &SKC_RCV_SADDR).unwrap_or([0; 4]);
            let r: [u8; 4] = read(sk, &SKC_DADDR).unwrap_or([0; 4]);
            rec.laddr[..4].copy_from_slice(&l);
            rec.raddr[..4].copy_from_slice(&r);
        } else if rec.family == AF_INET6 {
            rec.laddr = read(sk, &SKC_V6_RCV_SADDR).unwrap_or([0; 16]);
            rec.raddr = read(sk, &SKC_V6_DADDR).unwrap_or([0; 16]);
        }
        // TIME_WAIT and request sockets are not full `struct sock`s: only the
        // sock_common part may be read.
        if rec.state != TCP_TIME_WAIT && rec.state != TCP_NEW_SYN_RECV {
            if rec.state == TCP_LISTEN {
                rec.ack_backlog = read(sk, &SK_ACK_BACKLOG).unwrap_or(0);
                rec.max_ack_backlog = read(sk, &SK_MAX_ACK_BACKLOG).unwrap_or(0);
            }
            rec.ino = inode(sk).unwrap_or(0);
        }
        bpf_seq_write(seq, (&raw const rec).cast(), size_of::<TcpSocket>() as u32);
    }
    0
}

/// sk->sk_socket->file->f_inode->i_ino: the inode /proc/PID/fd links name.
#[inline(always)]
unsafe fn inode(sk: *const u8) -> Option<u64> {
    unsafe {
        let socket: *const u8 = read(sk, &SK_SOCKET)?;
        if socket.is_null() {
            return None;
        }
        let file: *const u8 = read(socket, &SOCKET_FILE)?;
        if file.is_null() {
            return None;
        }
        let inode: *const u8 = read(file, &FILE_INODE)?;
        if inode.is_null() {
            return None;
        }
        read(inode, &INODE_INO)
    }
}

probes_common::sock_state_fields!(offset_globals);

#[map]
static TRACKED: LruHashMap<u64, u32> = LruHashMap::with_max_entries(TRACKED_MAX_ENTRIES, 0);

#[map]
static LISTEN_OWNERS: HashMap<u32, u32> = HashMap::with_max_entries(LISTEN_OWNERS_MAX_ENTRIES, 0);

/// When connections to watched listeners completed their handshake, by
/// socket: the accept probe turns it into the accept-queue wait.
#[map]
static ESTABLISHED_AT: LruHashMap<u64, u64> = LruHashMap::with_max_entries(TRACKED_MAX_ENTRIES, 0);

/// When `sk` entered its listener's accept queue, if seen; forgets it.
#[inline(always)]
pub fn take_established(sk: u64) -> Option<u64> {
    let at = ESTABLISHED_AT.get_ptr_mut(sk)?;
    // Zeroed, not removed: an LRU delete costs more than the rest of the
    // accept probe, and a zero reads as "not seen" just like a missing key.
    let value = unsafe { core::mem::replace(&mut *at, 0) };
    (value != 0).then_some(value)
}

const IPPROTO_TCP: u16 = 6;

/// Changes only the owner's own syscalls make (connect, listen, close,
/// shutdown): the current task is the socket's owner. Everything else may run
/// in softirq, where the current task is whoever happened to be running (the
/// record's `common_flags` do not tell reliably: 6.18 sets the softirq bit for
/// listen()).
#[inline(always)]
fn by_owner(old: u8, new: u8) -> bool {
    matches!(
        (old, new),
        (TCP_CLOSE, TCP_SYN_SENT)
            | (TCP_CLOSE, TCP_LISTEN)
            | (TCP_ESTABLISHED | TCP_SYN_RECV, TCP_FIN_WAIT1)
            | (TCP_CLOSE_WAIT, TCP_LAST_ACK)
    )
}

#[inline(always)]
fn field<T: Copy + Default>(ctx: &TracePointContext, offset: &Global<u32>) -> T {
    unsafe { ctx.read_at::<T>(offset.load() as usize) }.unwrap_or_default()
}

#[tracepoint]
pub fn tcp_state(ctx: TracePointContext) -> u32 {
    if field::<u16>(&ctx, &TP_PROTOCOL) != IPPROTO_TCP {
        return 0;
    }
    let sk: u64 = field(&ctx, &TP_SKADDR);
    // Ints in the record; TCP states fit a byte (the event keeps a byte).
    let old = field::<i32>(&ctx, &TP_OLDSTATE) as u8;
    let new = field::<i32>(&ctx, &TP_NEWSTATE) as u8;
    let lport: u16 = field(&ctx, &TP_SPORT);
    let by_owner = by_owner(old, new);
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;

    // Whose socket is it? For changes made by the owner's own syscalls, the
    // caller's; otherwise one we learned about, or a connection arriving at a
    // watched listener.
    let tracked = unsafe { TRACKED.get(sk) }.copied();
    let owner = if by_owner && is_watched(tgid) {
        tgid
    } else if let Some(owner) = tracked {
        owner
    } else if old == TCP_SYN_RECV && new == TCP_ESTABLISHED {
        match unsafe { LISTEN_OWNERS.get(u32::from(lport)) } {
            Some(owner) => *owner,
            None => return 0,
        }
    } else {
        return 0;
    };

    let ts_ns = unsafe { bpf_ktime_get_ns() };
    if old == TCP_SYN_RECV && new == TCP_ESTABLISHED {
        let _ = ESTABLISHED_AT.insert(sk, ts_ns, 0);
    }
    if new == TCP_CLOSE {
        let _ = TRACKED.remove(sk);
        let _ = ESTABLISHED_AT.remove(sk);
        if old == TCP_LISTEN {
            let _ = LISTEN_OWNERS.remove(u32::from(lport));
        }
    } else {
        // An LRU update costs more than the rest of the program: only when
        // the socket is new to us or changes hands.
        if tracked != Some(owner) {
            let _ = TRACKED.insert(sk, owner, 0);
        }
        if new == TCP_LISTEN {
            let _ = LISTEN_OWNERS.insert(u32::from(lport), owner, 0);
        }
    }

    let Some(mut entry) = events::reserve::<TcpStateEvent>(Stat::LostTcpState) else {
        return 0;
    };
    let family: u16 = field(&ctx, &TP_FAMILY);
    let (mut laddr, mut raddr) = ([0u8; 16], [0u8; 16]);
    if family == AF_INET6 {
        laddr = field(&ctx, &TP_SADDR_V6);
        raddr = field(&ctx, &TP_DADDR_V6);
    } else {
        let l: [u8; 4] = field(&ctx, &TP_SADDR);
        let r: [u8; 4] = field(&ctx, &TP_DADDR);
        laddr[..4].copy_from_slice(&l);
        raddr[..4].copy_from_slice(&r);
    }
    entry.write(TcpStateEvent {
        kind: EventKind::TcpState as u32,
        owner,
        oldstate: old,
        newstate: new,
        by_owner: by_owner as u8,
        _pad: 0,
        family,
        lport,
        rport: field(&ctx, &TP_DPORT),
        _pad2: 0,
        laddr,
        raddr,
        _pad3: 0,
        ts_ns,
        comm: if by_owner {
            bpf_get_current_comm().unwrap_or([0; 16])
        } else {
            [0; 16]
        },
    });
    events::submit(entry);
    0
}
