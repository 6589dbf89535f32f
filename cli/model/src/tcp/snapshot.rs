//! What one look at the kernel's TCP side finds: the links' running
//! totals, maybe a walk of the sockets (listeners, TIME_WAIT sockets per
//! link, namespaces it could not enter), and the machine's TcpExt
//! counters.

use std::{collections::HashMap, net::SocketAddr};

use super::{
    counts::LinkTotals,
    key::KernelLink,
    sockets::{ListenDrops, Netns, TcpSock},
};
use crate::counter::Counter;

/// A network namespace a watched process lives in that the walk could not
/// enter: its sockets are not counted, which the report says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unwalked {
    pub netns: u32,
    /// The process the walk tried to enter it through.
    pub pid: u32,
    pub reason: String,
}

/// A listening socket of a watched process, from the last snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub owner: u32,
    pub local: SocketAddr,
    pub netns: Netns,
    /// Connections established and waiting to be accepted, and the limit.
    pub backlog: u32,
    pub max_backlog: u32,
    /// Connections the kernel dropped at it (its `sk_drops`: a full accept
    /// queue, a full SYN queue, no memory) since stackprobe started, in
    /// this interval and in all, as of the last walk.
    pub lost: Counter,
}

/// Machine-wide TcpExt counters (cumulative since boot).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelCounters {
    /// Connections dropped because an accept queue was full.
    pub listen_overflows: u64,
    pub listen_drops: u64,
    /// Sockets that closed without TIME_WAIT because the TIME_WAIT table was full.
    pub time_wait_overflows: u64,
}

impl KernelCounters {
    pub fn since(&self, earlier: &KernelCounters) -> KernelCounters {
        KernelCounters {
            listen_overflows: self
                .listen_overflows
                .saturating_sub(earlier.listen_overflows),
            listen_drops: self.listen_drops.saturating_sub(earlier.listen_drops),
            time_wait_overflows: self
                .time_wait_overflows
                .saturating_sub(earlier.time_wait_overflows),
        }
    }
}

/// One walk of the machine's TCP sockets: the listeners (with the watched
/// process owning each port) and the TIME_WAIT sockets per link.
#[derive(Clone, Debug, Default)]
pub struct Walk {
    pub listeners: Vec<TcpSock>,
    /// Listening port (in its namespace) → the watched process that owns
    /// the socket.
    pub owners: HashMap<(Netns, u16), u32>,
    /// TIME_WAIT sockets now per kernel link.
    pub time_wait: Vec<(KernelLink, u64)>,
    /// Sockets walked.
    pub sockets: usize,
    /// Network namespaces of watched processes the walk could not enter.
    pub unwalked: Vec<Unwalked>,
    /// Every listener's `sk_drops` (not only watched processes').
    pub listen_drops: Vec<ListenDrops>,
    /// The namespaces the walk went through (None: stackprobe's own).
    pub namespaces: Vec<Netns>,
}

/// What one look at the kernel found: the links' running totals, maybe a
/// walk of the sockets (not every time when they are many), and the
/// machine's counters.
#[derive(Clone, Debug, Default)]
pub struct SocketSnapshot {
    pub links: Vec<(KernelLink, LinkTotals)>,
    pub walk: Option<Walk>,
    /// Roles of the live processes owning links now.
    pub roles: HashMap<u32, String>,
    pub counters: KernelCounters,
    /// Ephemeral ports (ip_local_port_range), when readable.
    pub ephemeral_ports: Option<u32>,
    /// How long taking the snapshot took, in µs.
    pub took_us: u64,
    /// How old the last walk is: TIME_WAIT and listeners are as it found
    /// them.
    pub walk_age: std::time::Duration,
}
