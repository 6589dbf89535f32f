//! TCP sockets: a snapshot of every TCP socket from the `iter/tcp` BPF
//! iterator (TIME_WAIT and LISTEN included, as `ss -tan` shows them).

use crate::offsets::{FieldOffset, MemberOffset};

/// The iterator program; each run writes one [`TcpSocket`] per socket.
pub const ITER_PROGRAM: &str = "tcp_sockets";

/// The kernel struct members the iterator reads, each at the offset in its
/// global (see [`crate::offsets`]).
#[macro_export]
macro_rules! sock_iter_members {
    ($($then:ident)::+) => {
        $($then)::+! {
            SKC_DADDR: sock.__sk_common.skc_daddr,
            SKC_RCV_SADDR: sock.__sk_common.skc_rcv_saddr,
            SKC_DPORT: sock.__sk_common.skc_dport,
            SKC_NUM: sock.__sk_common.skc_num,
            SKC_FAMILY: sock.__sk_common.skc_family,
            SKC_STATE: sock.__sk_common.skc_state,
            SKC_V6_DADDR: sock.__sk_common.skc_v6_daddr,
            SKC_V6_RCV_SADDR: sock.__sk_common.skc_v6_rcv_saddr,
            SK_ACK_BACKLOG: sock.sk_ack_backlog,
            SK_MAX_ACK_BACKLOG: sock.sk_max_ack_backlog,
            SK_SOCKET: sock.sk_socket,
            SOCKET_FILE: socket.file,
            FILE_INODE: file.f_inode,
            INODE_INO: inode.i_ino,
        }
    };
}
pub const ITER_MEMBERS: &[MemberOffset] = &sock_iter_members!(crate::member_table);

pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

/// TCP states as the kernel numbers them.
pub const TCP_ESTABLISHED: u8 = 1;
pub const TCP_SYN_SENT: u8 = 2;
pub const TCP_SYN_RECV: u8 = 3;
pub const TCP_FIN_WAIT1: u8 = 4;
pub const TCP_FIN_WAIT2: u8 = 5;
pub const TCP_TIME_WAIT: u8 = 6;
pub const TCP_CLOSE: u8 = 7;
pub const TCP_CLOSE_WAIT: u8 = 8;
pub const TCP_LAST_ACK: u8 = 9;
pub const TCP_LISTEN: u8 = 10;
pub const TCP_CLOSING: u8 = 11;
pub const TCP_NEW_SYN_RECV: u8 = 12;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpSocket {
    pub family: u16,
    pub state: u8,
    pub _pad: u8,
    /// Local port, host byte order.
    pub lport: u16,
    /// Remote port, network byte order (as the kernel keeps it).
    pub rport_be: u16,
    /// Addresses: IPv4 in the first 4 bytes, IPv6 in all 16.
    pub laddr: [u8; 16],
    pub raddr: [u8; 16],
    /// The socket's inode (0 for TIME_WAIT and request sockets, which have
    /// none): /proc/PID/fd links name it, so it tells which process owns it.
    pub ino: u64,
    /// For LISTEN sockets: connections waiting to be accepted, and the limit.
    pub ack_backlog: u32,
    pub max_ack_backlog: u32,
}

crate::assert_layout!(TcpSocket, 56, {
    family: 0,
    state: 2,
    _pad: 3,
    lport: 4,
    rport_be: 6,
    laddr: 8,
    raddr: 24,
    ino: 40,
    ack_backlog: 48,
    max_ack_backlog: 52,
});

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::TcpSocket {}
}

/// `sock/inet_sock_set_state`: every TCP state change of a socket owned by a
/// watched process.
pub const STATE_PROGRAM: &str = "tcp_state";
/// Map from a socket's address to the watched process owning it.
pub const TRACKED_MAP: &str = "TRACKED";
pub const TRACKED_MAX_ENTRIES: u32 = 65536;
/// Map from a listening port to the watched process listening on it: the
/// owner of connections that arrive there (their handshake completes in
/// softirq, where the current task is not the owner).
pub const LISTEN_OWNERS_MAP: &str = "LISTEN_OWNERS";
pub const LISTEN_OWNERS_MAX_ENTRIES: u32 = 4096;

/// The `inet_sock_set_state` record fields `tcp_state` reads, each at the
/// offset in its global (see [`crate::offsets`]).
#[macro_export]
macro_rules! sock_state_fields {
    ($($then:ident)::+) => {
        $($then)::+! {
            TP_SKADDR: skaddr,
            TP_OLDSTATE: oldstate,
            TP_NEWSTATE: newstate,
            TP_SPORT: sport,
            TP_DPORT: dport,
            TP_FAMILY: family,
            TP_PROTOCOL: protocol,
            TP_SADDR: saddr,
            TP_DADDR: daddr,
            TP_SADDR_V6: saddr_v6,
            TP_DADDR_V6: daddr_v6,
        }
    };
}
pub const STATE_FIELDS: &[FieldOffset] = &sock_state_fields!(crate::field_table);

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TcpStateEvent {
    /// Always [`crate::event::EventKind::TcpState`].
    pub kind: u32,
    /// The watched process owning the socket.
    pub owner: u32,
    pub oldstate: u8,
    pub newstate: u8,
    /// 1 when the owner's own syscall made the change (connect, listen,
    /// close): the owner is then also the process that closed first.
    pub by_owner: u8,
    pub _pad: u8,
    pub family: u16,
    /// Ports in host byte order.
    pub lport: u16,
    pub rport: u16,
    pub _pad2: u16,
    pub laddr: [u8; 16],
    pub raddr: [u8; 16],
    /// Explicit so `ts_ns` is 8-aligned with no implicit padding.
    pub _pad3: u32,
    pub ts_ns: u64,
    /// The owner's comm when `by_owner` (its own context), else zeros.
    pub comm: [u8; crate::TASK_COMM_LEN],
}

crate::assert_layout!(TcpStateEvent, 80, {
    kind: 0,
    owner: 4,
    oldstate: 8,
    newstate: 9,
    by_owner: 10,
    _pad: 11,
    family: 12,
    lport: 14,
    rport: 16,
    _pad2: 18,
    laddr: 20,
    raddr: 36,
    _pad3: 52,
    ts_ns: 56,
    comm: 64,
});

#[cfg(feature = "user")]
mod user_state {
    unsafe impl aya::Pod for super::TcpStateEvent {}
}
