//! Unix stream sockets: how long a connection waits in a watched
//! listener's queue, and connects lost to a full queue.
//!
//! The wait ends at the accept that takes the connection (the accept probe,
//! which finds the server-side socket, `newsk`, through the accepted fd).
//! Where it starts depends on the kernel, best first ([`ENQUEUE_PROGRAM`],
//! [`DATA_READY_PROGRAM`] or the connect probe; userspace picks the rung):
//! - fentry on `security_unix_stream_connect(sk, other, newsk)`, an LSM
//!   hook inside the client's connect once the listener (`other`) had room,
//!   just before `newsk` is queued: the exact enqueue, one run per unix
//!   connect. Where the kernel takes fentry (not on this project's own
//!   machines).
//! - `sock:sk_data_ready` (6.3 and later) fires inside the client's
//!   connect right after the connection is queued, with the listener as its
//!   socket: the tail of the listener's queue is the skb the connect queued,
//!   whose owner is `newsk`. The exact enqueue.
//! - Before 6.3 no tracepoint sees the enqueue: the connect's enter stamps
//!   the thread, and its exit finds `newsk` as its socket's peer. The accept
//!   often comes first (the connect wakes a waiting worker before it
//!   returns), so whichever of the two comes second computes the wait. It
//!   includes the connect syscall's own time, and a blocking client's sleep
//!   for room in a full backlog.

use crate::offsets::MemberOffset;

/// Hash of a watched unix listener's socket inode → its owner's tgid,
/// which userspace fills from the watched processes' fds: only their
/// queues are stamped.
pub const UNIX_LISTENERS_MAP: &str = "UNIX_LISTENERS";
pub const UNIX_LISTENERS_MAX_ENTRIES: u32 = 1024;

/// LRU hash of a connection's server-side socket (`newsk`) → [`UnixQueued`].
pub const UNIX_QUEUED_MAP: &str = "UNIX_QUEUED";
pub const UNIX_QUEUED_MAX_ENTRIES: u32 = 8192;

/// One-entry array holding the rung in use ([`RUNG_FENTRY`],
/// [`RUNG_DATA_READY`] or [`RUNG_SYSCALLS`]; 0: unix queue wait off).
pub const UNIX_CONFIG_MAP: &str = "UNIX_CONFIG";
pub const RUNG_DATA_READY: u32 = 1;
pub const RUNG_SYSCALLS: u32 = 2;
pub const RUNG_FENTRY: u32 = 3;

/// The fentry program on the enqueue's LSM hook, and its function.
pub const ENQUEUE_PROGRAM: &str = "unix_enqueue";
pub const ENQUEUE_FUNCTION: &str = "security_unix_stream_connect";

/// The `sock:sk_data_ready` program, and its tracepoint's fields.
pub const DATA_READY_PROGRAM: &str = "unix_data_ready";
pub const DATA_READY_CATEGORY: &str = "sock";
pub const DATA_READY_TRACEPOINT: &str = "sk_data_ready";
/// Globals holding the offsets of `skaddr` and `family` in its record.
pub const DATA_READY_SK_OFFSET_GLOBAL: &str = "DATA_READY_SK_OFFSET";
pub const DATA_READY_FAMILY_OFFSET_GLOBAL: &str = "DATA_READY_FAMILY_OFFSET";

/// LRU hash of a unix destination's id (see [`crate::connect`]) → the
/// connects to it that a full queue refused, from every process on the
/// host (`EAGAIN`): userspace matches each path to a watched listener.
pub const UNIX_LOST_MAP: &str = "UNIX_LOST";
pub const UNIX_LOST_MAX_ENTRIES: u32 = 1024;

/// A unix connect's errno when the listener's queue is full (a
/// non-blocking client at once, a blocking one after its send timeout).
pub const EAGAIN: i32 = 11;

/// What the first of a connection's two ends left for the second.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct UnixQueued {
    /// When the connection was queued (or, before 6.3, its connect
    /// entered), or when it was accepted, by `accepted`.
    pub ns: u64,
    /// The client's socket, on the syscall rung: a later connection whose
    /// `newsk` reuses a freed one's address is told apart by its peer.
    pub peer: u64,
    /// The accepting process; 0 when `ns` is the connection's start.
    pub tgid: u32,
    /// The listening socket's fd plus one in the accepting process.
    pub listener: u32,
}

crate::assert_layout!(UnixQueued, 24, { ns: 0, peer: 8, tgid: 16, listener: 20 });

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::UnixQueued {}
}

/// The kernel struct members the unix queue probes read, each at the
/// offset in its global (see [`crate::offsets`]).
#[macro_export]
macro_rules! unix_queue_members {
    ($($then:ident)::+) => {
        $($then)::+! {
            SK_RECEIVE_QUEUE: sock.sk_receive_queue,
            SK_RECEIVE_QUEUE_PREV: sock.sk_receive_queue.prev,
            SKB_PREV: sk_buff.prev,
            SKB_SK: sk_buff.sk,
            UNIX_PEER: unix_sock.peer,
        }
    };
}
pub const UNIX_QUEUE_MEMBERS: &[MemberOffset] = &unix_queue_members!(crate::member_table);
