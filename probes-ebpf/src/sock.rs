//! TCP sockets. `tcp_sockets` is an `iter/tcp` iterator: each read of its file
//! walks every TCP socket (TIME_WAIT and LISTEN included) and writes one
//! TcpSocket record per socket. Struct offsets come from BTF at load time.

use core::ffi::c_void;

use aya_ebpf::{
    Global,
    bindings::seq_file,
    helpers::{bpf_probe_read_kernel, bpf_seq_write},
};
use probes_common::sock::{
    AF_INET, AF_INET6, TCP_LISTEN, TCP_NEW_SYN_RECV, TCP_TIME_WAIT, TcpSocket,
};

macro_rules! offsets {
    ($($name:ident),*) => {
        $(
            #[unsafe(no_mangle)]
            static $name: Global<u32> = Global::new(0);
        )*
    };
}

offsets!(
    SKC_DADDR,
    SKC_RCV_SADDR,
    SKC_DPORT,
    SKC_NUM,
    SKC_FAMILY,
    SKC_STATE,
    SKC_V6_DADDR,
    SKC_V6_RCV_SADDR,
    SK_ACK_BACKLOG,
    SK_MAX_ACK_BACKLOG,
    SK_SOCKET,
    SOCKET_FILE,
    FILE_INODE,
    INODE_INO
);

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
