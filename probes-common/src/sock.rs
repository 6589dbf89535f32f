//! TCP sockets: a snapshot of every TCP socket from the `iter/tcp` BPF
//! iterator (TIME_WAIT and LISTEN included, as `ss -tan` shows them).

use crate::offsets::{FieldOffset, MemberOffset};

/// The iterator program. In [`ITER_EVERY_SOCKET`] mode each run writes one
/// [`TcpSocket`] per socket; in [`ITER_AGGREGATE`] mode only listeners, and
/// it counts TIME_WAIT sockets per link in [`TW_COUNTS_MAP`] instead.
pub const ITER_PROGRAM: &str = "tcp_sockets";
/// One-entry array holding the iterator's [`IterConfig`].
pub const ITER_CONFIG_MAP: &str = "ITER_CONFIG";
pub const ITER_EVERY_SOCKET: u32 = 0;
pub const ITER_AGGREGATE: u32 = 1;

/// What userspace tells the iterator before a run, and what the run counted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IterConfig {
    /// [`ITER_EVERY_SOCKET`] or [`ITER_AGGREGATE`].
    pub mode: u32,
    /// The run's number: [`TW_COUNTS_MAP`] entries of older runs are stale.
    pub generation: u32,
    /// Sockets the run walked (aggregate mode).
    pub walked: u64,
}

crate::assert_layout!(IterConfig, 16, { mode: 0, generation: 4, walked: 8 });

/// TIME_WAIT sockets per link in the run numbered `generation`.
pub const TW_COUNTS_MAP: &str = "TW_COUNTS";
pub const TW_COUNTS_MAX_ENTRIES: u32 = 16384;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TwCount {
    pub generation: u64,
    pub count: u64,
}

crate::assert_layout!(TwCount, 16, { generation: 0, count: 8 });

/// The kernel reads `struct sock_common`'s members from one copy of its
/// first bytes (one helper call instead of one per member); userspace checks
/// that every member read this way lies inside.
pub const SOCK_WINDOW: usize = 96;

/// The `sock_common` members both the iterator and the state probe read,
/// each at the offset in its global (see [`crate::offsets`]), from one copy
/// of the struct's first [`SOCK_WINDOW`] bytes.
#[macro_export]
macro_rules! sock_common_members {
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
        }
    };
}
pub const SOCK_COMMON_MEMBERS: &[MemberOffset] = &sock_common_members!(crate::member_table);

/// Bytes read of each [`SOCK_COMMON_MEMBERS`] entry, in its order: each
/// must end inside the [`SOCK_WINDOW`].
pub const SOCK_COMMON_SIZES: [u32; 8] = [4, 4, 2, 2, 2, 1, 16, 16];

/// A socket's network namespace: the `struct net` pointer in its
/// `sock_common` (read from the same copy, so it must lie inside the
/// [`SOCK_WINDOW`]), then that namespace's inode number, the one
/// `/proc/PID/ns/net` names. Sockets are keyed by it, so the same address
/// in two namespaces (two containers' 127.0.0.1:5432) never mixes.
#[macro_export]
macro_rules! sock_net_members {
    ($($then:ident)::+) => {
        $($then)::+! {
            SKC_NET: sock.__sk_common.skc_net.net,
            NET_INUM: net.ns.inum,
        }
    };
}
pub const NET_MEMBERS: &[MemberOffset] = &sock_net_members!(crate::member_table);

/// The other kernel struct members the iterator reads (listeners' backlog
/// and the connections they dropped, and inodes), each at the offset in
/// its global. `sk_drops` is an `atomic_t`: its `counter` is read.
#[macro_export]
macro_rules! sock_iter_members {
    ($($then:ident)::+) => {
        $($then)::+! {
            SK_ACK_BACKLOG: sock.sk_ack_backlog,
            SK_MAX_ACK_BACKLOG: sock.sk_max_ack_backlog,
            SK_DROPS: sock.sk_drops.counter,
            SK_SOCKET: sock.sk_socket,
            SOCKET_FILE: socket.file,
            FILE_INODE: file.f_inode,
            INODE_INO: inode.i_ino,
        }
    };
}
const LISTENER_MEMBERS: [MemberOffset; 7] = sock_iter_members!(crate::member_table);
/// Every member the iterator reads: the `sock_common` ones, then the rest.
pub const ITER_MEMBERS: &[MemberOffset] = &{
    let common: [MemberOffset; 8] = sock_common_members!(crate::member_table);
    let mut all = [common[0]; 15];
    let mut i = 0;
    while i < 15 {
        all[i] = if i < 8 {
            common[i]
        } else {
            LISTENER_MEMBERS[i - 8]
        };
        i += 1;
    }
    all
};

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
    /// The socket's network namespace (inode number).
    pub netns: u32,
    /// For LISTEN sockets: `sk_drops`, the packets the kernel dropped at
    /// it since it was made (wrapping): each connection it dropped at a
    /// full accept queue (`ListenOverflows`), or for a full SYN queue or
    /// want of memory (with those, `ListenDrops`), and rarer drops.
    pub drops: u32,
}

crate::assert_layout!(TcpSocket, 64, {
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
    netns: 56,
    drops: 60,
});

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::TcpSocket {}
}

/// `sock/inet_sock_set_state`, classic tracepoint: every TCP state change
/// of a socket owned by a watched process, counted per link.
pub const STATE_PROGRAM: &str = "tcp_state";
/// The same as a BTF tracepoint (tp_btf), where the kernel offers it: its
/// arguments are plain loads, and it has a recursion guard of its own (the
/// classic tracepoints share one per CPU, so a state change in softirq that
/// interrupts another probe is skipped).
pub const STATE_BTF_PROGRAM: &str = "tcp_state_btf";
pub const STATE_BTF_EVENT: &str = "inet_sock_set_state";
/// A second copy of [`STATE_BTF_PROGRAM`] on the same hook, which handles
/// only the changes the first did not run for: those that interrupt it on
/// its CPU (a change in a softirq while the first runs for one in process
/// context), which the kernel skips it for, since a program does not nest
/// on a CPU.
pub const STATE_BTF_NESTED_PROGRAM: &str = "tcp_state_btf_nested";
/// The watched sockets' records ([`TrackedSlot`]), each in the slot its
/// address picks; a socket whose slot is taken goes to [`TRACKED_MAP`].
pub const TRACKED_SLOTS_MAP: &str = "TRACKED_SLOTS";
pub const TRACKED_SLOT_COUNT: u32 = 65536;
/// Map from a socket's address to its [`TrackedSocket`], for the sockets
/// whose slot another held when they opened.
pub const TRACKED_MAP: &str = "TRACKED";
pub const TRACKED_MAX_ENTRIES: u32 = 16384;
/// Map from a listening port (in its network namespace, [`listen_key`]) to the watched process listening on it: the
/// owner of connections that arrive there (their handshake completes in
/// softirq, where the current task is not the owner).
pub const LISTEN_OWNERS_MAP: &str = "LISTEN_OWNERS";
pub const LISTEN_OWNERS_MAX_ENTRIES: u32 = 4096;

/// `inet_sock.inet_sport`: a closing socket's local port. The kernel
/// releases the port (zeroing `skc_num`) before it reports the change to
/// CLOSE; this copy stays. `sock.sk_err`: why a connect's SYN_SENT ended in
/// CLOSE (ECONNREFUSED for a reset).
#[macro_export]
macro_rules! sock_close_members {
    ($($then:ident)::+) => {
        $($then)::+! {
            INET_SPORT: inet_sock.inet_sport,
            SK_ERR: sock.sk_err,
        }
    };
}
pub const CLOSE_MEMBERS: &[MemberOffset] = &sock_close_members!(crate::member_table);

/// `sock.sk_protocol`, which the tp_btf program reads to keep TCP only (a
/// bitfield before 5.6: the classic tracepoint then serves).
#[macro_export]
macro_rules! sock_protocol_member {
    ($($then:ident)::+) => {
        $($then)::+! {
            SK_PROTOCOL: sock.sk_protocol,
        }
    };
}
pub const PROTOCOL_MEMBER: &[MemberOffset] = &sock_protocol_member!(crate::member_table);

/// The `inet_sock_set_state` record fields `tcp_state` reads, each at the
/// offset in its global (see [`crate::offsets`]), from one copy of the
/// record's first [`RECORD_WINDOW`] bytes.
#[macro_export]
macro_rules! sock_state_fields {
    ($($then:ident)::+) => {
        $($then)::+! {
            TP_SKADDR: skaddr,
            TP_OLDSTATE: oldstate,
            TP_NEWSTATE: newstate,
            TP_PROTOCOL: protocol,
        }
    };
}
pub const STATE_FIELDS: &[FieldOffset] = &sock_state_fields!(crate::field_table);
/// Bytes read of each [`STATE_FIELDS`] entry, in its order.
pub const STATE_FIELD_SIZES: [u32; 4] = [8, 4, 4, 2];
pub const RECORD_WINDOW: usize = 40;

/// Which end of a connection a watched process is.
pub const SIDE_ACTIVE: u8 = 1;
pub const SIDE_PASSIVE: u8 = 2;

/// What the kernel keeps per watched socket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrackedSocket {
    /// The process whose link the socket counts on: the one that opened it
    /// (or first touched it, for a socket older than stackprobe).
    pub owner: u32,
    /// The watched process whose close sent the first FIN, 0 until then:
    /// the socket's TIME_WAIT is its.
    pub closer: u32,
    /// [`SIDE_ACTIVE`] or [`SIDE_PASSIVE`].
    pub side: u8,
    pub _pad: u8,
    /// Passive side: the local port, the listener's (host byte order). An
    /// active socket's is not yet chosen when it is first seen.
    pub lport: u16,
    /// The inode number of the socket's network namespace, kept so that
    /// its later changes and its accept need not read it again (two
    /// dependent reads).
    pub netns: u32,
    /// Passive side: when the connection completed its handshake (entered
    /// its listener's accept queue), taken by its accept. Active side: when
    /// its connect sent the SYN, taken when it is answered. 0: not known,
    /// or taken.
    pub since_ns: u64,
    /// Active side: the id of where it connects to
    /// ([`crate::connect::Destination::id`]), 0 if not known.
    pub destination: u64,
    /// Passive side, while its accept's service lasts (see
    /// [`crate::service`]): who accepted it; 0 before its accept and once
    /// the service ended. Its start is then in `since_ns`, which the
    /// accept took.
    pub served_tgid: u32,
    /// The listener's fd plus one in the acceptor.
    pub served_listener: u32,
    /// The server's key in [`crate::service::BUSY_MAP`].
    pub served_server: u32,
    pub _pad2: u32,
}

crate::assert_layout!(TrackedSocket, 48, {
    owner: 0, closer: 4, side: 8, _pad: 9, lport: 10, netns: 12, since_ns: 16, destination: 24,
    served_tgid: 32, served_listener: 36, served_server: 40, _pad2: 44,
});

/// One slot of [`TRACKED_SLOTS_MAP`]: a cache line, so that following a
/// socket costs one line, not a hash map's bucket and element.
#[repr(C, align(64))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrackedSlot {
    /// The socket's address; 0 for a free slot.
    pub sk: u64,
    /// How many CPUs hold or are claiming the slot (see the eBPF side's
    /// `tracked` module): 1 while a socket holds it.
    pub claims: u64,
    pub socket: TrackedSocket,
}

crate::assert_layout!(TrackedSlot, 64, { sk: 0, claims: 8, socket: 16 });

/// Per-CPU counts per link: `LinkKey` → `LinkCounts`.
pub const LINKS_MAP: &str = "LINKS";
pub const LINKS_MAX_ENTRIES: u32 = 16384;

/// A link as the kernel counts it: the owner's tgid (0: unknown, for
/// TIME_WAIT sockets whose closer is not known), its side, and the other
/// end — the remote address and port for an active link; the local address
/// and port and the remote address for a passive one.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LinkKey {
    pub owner: u32,
    pub side: u8,
    pub _pad: u8,
    pub family: u16,
    /// Host byte order.
    pub port: u16,
    pub _pad2: u16,
    /// Addresses: IPv4 in the first 4 bytes, IPv6 in all 16.
    pub addr: [u8; 16],
    /// Passive links: the remote address; zeros for active ones.
    pub peer_ip: [u8; 16],
    /// The socket's network namespace (inode number).
    pub netns: u32,
}

crate::assert_layout!(LinkKey, 48, {
    owner: 0,
    side: 4,
    _pad: 5,
    family: 6,
    port: 8,
    _pad2: 10,
    addr: 12,
    peer_ip: 28,
    netns: 44,
});

/// Counts since load, on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkCounts {
    pub opens: u64,
    pub closes: u64,
    /// Closes without the FIN handshake: reset, refused, aborted.
    pub aborts: u64,
    /// Sockets of a known closer that went into TIME_WAIT (FIN_WAIT2 or
    /// CLOSING → CLOSE: the kernel has just made their timewait socket),
    /// counted on the closer's link.
    pub new_time_wait: u64,
}

crate::assert_layout!(LinkCounts, 32, {
    opens: 0,
    closes: 8,
    aborts: 16,
    new_time_wait: 24,
});

/// Slots of the table from a TIME_WAIT socket's connection (4-tuple and
/// network namespace, hashed) to who closed first (the kernel's
/// TW_CLOSERS). A timewait socket is a new object: its ends (the same
/// `sock_common` members) are what the iterator can find it by.
pub const TW_CLOSERS_MAX_ENTRIES: u32 = 262_144;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Closer {
    pub owner: u32,
    pub side: u8,
    pub _pad: [u8; 3],
}

crate::assert_layout!(Closer, 8, { owner: 0, side: 4, _pad: 5 });

/// Who the connections arriving at a watched listening port belong to:
/// first the holder of the listening socket userspace chose, then, once
/// one accepts there, the process that accepts (an nginx or php-fpm worker,
/// not the master that holds the socket and accepts nothing).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ListenOwner {
    pub owner: u32,
    /// Non-zero once `owner` was seen accepting on the port.
    pub accepted: u32,
}

crate::assert_layout!(ListenOwner, 8, { owner: 0, accepted: 4 });

/// [`LISTEN_OWNERS_MAP`]'s key: a port in a network namespace.
pub const fn listen_key(netns: u32, port: u16) -> u64 {
    (netns as u64) << 16 | port as u64
}

/// A listening socket of a watched process opened or closed: the rare TCP
/// changes that still go through the ring buffer.
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
    /// The socket's network namespace (inode number).
    pub netns: u32,
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
    netns: 52,
    ts_ns: 56,
    comm: 64,
});

#[cfg(feature = "user")]
mod user_state {
    unsafe impl aya::Pod for super::TcpStateEvent {}
    unsafe impl aya::Pod for super::ListenOwner {}
    unsafe impl aya::Pod for super::IterConfig {}
    unsafe impl aya::Pod for super::TwCount {}
    unsafe impl aya::Pod for super::TrackedSocket {}
    unsafe impl aya::Pod for super::LinkKey {}
    unsafe impl aya::Pod for super::LinkCounts {}
}
