//! TCP sockets. `tcp_sockets` is an `iter/tcp` iterator: each read of its file
//! walks every TCP socket (TIME_WAIT and LISTEN included) and writes one
//! TcpSocket record per socket. Struct offsets come from BTF at load time.
//! `tcp_state` reports the state changes of watched processes' sockets.

use core::ffi::c_void;

use aya_ebpf::{
    Global,
    bindings::seq_file,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_seq_write},
    macros::{map, tracepoint},
    maps::{HashMap, LruHashMap},
    programs::TracePointContext,
};
use aya_log_ebpf::debug;
use probes_common::{
    event::EventKind,
    sock::{
        AF_INET, AF_INET6, LISTEN_OWNERS_MAX_ENTRIES, TCP_CLOSE, TCP_CLOSE_WAIT, TCP_ESTABLISHED,
        TCP_FIN_WAIT1, TCP_LAST_ACK, TCP_LISTEN, TCP_NEW_SYN_RECV, TCP_SYN_RECV, TCP_SYN_SENT,
        TCP_TIME_WAIT, TRACKED_MAX_ENTRIES, TcpSocket, TcpStateEvent,
    },
    stats::Stat,
};

use crate::{
    clock::now,
    events, handshakes,
    memory::{self, Bits},
    offsets::offset_globals,
    watch_set::is_watched,
};

probes_common::sock_iter_members!(offset_globals);

/// The `T` in the member at `offset` of the struct at `base`.
#[inline(always)]
fn read<T: Bits>(base: u64, offset: &Global<u32>) -> Option<T> {
    memory::kernel(base + u64::from(offset.load()))
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
    let sk = ctx.sk as u64;
    if sk == 0 {
        // The end of the walk.
        return 0;
    }
    // SAFETY: `meta` is never null in an iterator's context and points to
    // the walk's bpf_iter_meta. A direct load: the verifier accepts only
    // such a seq_file pointer for bpf_seq_write.
    let seq = unsafe { (*ctx.meta).seq };
    let mut rec = TcpSocket {
        family: read(sk, &SKC_FAMILY).unwrap_or(0),
        state: read(sk, &SKC_STATE).unwrap_or(0),
        lport: read(sk, &SKC_NUM).unwrap_or(0),
        rport_be: read(sk, &SKC_DPORT).unwrap_or(0),
        ..TcpSocket::default()
    };
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
    // SAFETY: `seq` is the walk's seq_file, from the kernel; the pointer and
    // length describe `rec`, a live local. A record that does not fit is
    // not written, and the kernel retries it in the next buffer.
    unsafe { bpf_seq_write(seq, (&raw const rec).cast(), size_of::<TcpSocket>() as u32) };
    0
}

/// sk->sk_socket->file->f_inode->i_ino: the inode /proc/PID/fd links name.
#[inline(always)]
fn inode(sk: u64) -> Option<u64> {
    let socket: u64 = read(sk, &SK_SOCKET).filter(|&p| p != 0)?;
    let file: u64 = read(socket, &SOCKET_FILE).filter(|&p| p != 0)?;
    let inode: u64 = read(file, &FILE_INODE).filter(|&p| p != 0)?;
    read(inode, &INODE_INO)
}

probes_common::sock_state_fields!(offset_globals);

#[map]
static TRACKED: LruHashMap<u64, u32> = LruHashMap::with_max_entries(TRACKED_MAX_ENTRIES, 0);

#[map]
static LISTEN_OWNERS: HashMap<u32, u32> = HashMap::with_max_entries(LISTEN_OWNERS_MAX_ENTRIES, 0);

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

/// A field of the record, 0 if it cannot be read.
#[inline(always)]
fn field<T: Bits + Default>(ctx: &TracePointContext, offset: &Global<u32>) -> T {
    memory::field(ctx, offset).unwrap_or_default()
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
    // SAFETY: the value is copied out at once. LRU maps are preallocated, so
    // the reference stays inside the map's memory even if the entry is
    // deleted and its node reused meanwhile: at worst this one change is
    // reported for another watched process. 0 stands for none (no process
    // has tgid 0), not an Option: LLVM may leave a None's payload register
    // unset and then copy it, which the verifier refuses as a read of an
    // uninitialised register.
    let tracked = unsafe { TRACKED.get(sk) }.map_or(0, |owner| *owner);
    let owner = if by_owner && is_watched(tgid) {
        tgid
    } else if tracked != 0 {
        tracked
    } else if old == TCP_SYN_RECV && new == TCP_ESTABLISHED {
        // SAFETY: as for TRACKED: the map is preallocated (no
        // BPF_F_NO_PREALLOC) and the value copied out at once.
        match unsafe { LISTEN_OWNERS.get(u32::from(lport)) } {
            Some(owner) => *owner,
            None => return 0,
        }
    } else {
        return 0;
    };

    let ts_ns = now();
    if old == TCP_SYN_RECV && new == TCP_ESTABLISHED {
        handshakes::note(sk, ts_ns);
    }
    if new == TCP_CLOSE {
        // A missing key is no failure: most closing sockets were never
        // listeners, or were forgotten already.
        let _ = TRACKED.remove(sk);
        handshakes::forget(sk);
        if old == TCP_LISTEN {
            let _ = LISTEN_OWNERS.remove(u32::from(lport));
        }
    } else {
        // An LRU update costs more than the rest of the program: only when
        // the socket is new to us or changes hands.
        if tracked != owner
            && let Err(error) = TRACKED.insert(sk, owner, 0)
        {
            // An LRU map evicts to make room: this fails only when the
            // kernel found no free node (contention across CPUs).
            events::count(Stat::TrackedInsertFailed);
            debug!(
                &ctx,
                "TRACKED: socket {:x} of {} not recorded (error {})", sk, owner, error
            );
        }
        if new == TCP_LISTEN {
            match LISTEN_OWNERS.insert(u32::from(lport), owner, 0) {
                Ok(()) => debug!(
                    &ctx,
                    "port {} listened on by {}: connections arriving there are its", lport, owner
                ),
                Err(error) => {
                    events::count(Stat::ListenOwnersFull);
                    debug!(
                        &ctx,
                        "LISTEN_OWNERS full: port {} of {} not recorded (error {})",
                        lport,
                        owner,
                        error
                    );
                }
            }
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
