//! TCP links counted in the kernel, shared by the state probe (opens,
//! closes, aborts, new TIME_WAIT) and the socket iterator (TIME_WAIT sockets
//! now): the link key a socket's ends make, the per-CPU counts per link,
//! the TIME_WAIT counts per link, and the watched listeners.

use aya_ebpf::{
    macros::map,
    maps::{HashMap, PerCpuHashMap},
};
use probes_common::{
    sock::{
        AF_INET6, LINKS_MAX_ENTRIES, LISTEN_OWNERS_MAX_ENTRIES, LinkCounts, LinkKey, ListenOwner,
        SIDE_ACTIVE, TW_COUNTS_MAX_ENTRIES, TwCount, listen_key,
    },
    stats::Stat,
};

use crate::{atomic, closers, events, tcp_sock::Ends};

/// Map from a listening port in its network namespace ([`listen_key`]) to
/// the watched process connections arriving there belong to (their handshake completes in softirq, where the current
/// task is not the owner): a holder of the socket, then who accepts there.
#[map]
static LISTEN_OWNERS: HashMap<u64, ListenOwner> =
    HashMap::with_max_entries(LISTEN_OWNERS_MAX_ENTRIES, 0);

#[map]
static LINKS: PerCpuHashMap<LinkKey, LinkCounts> =
    PerCpuHashMap::with_max_entries(LINKS_MAX_ENTRIES, 0);

#[map]
static TW_COUNTS: HashMap<LinkKey, TwCount> = HashMap::with_max_entries(TW_COUNTS_MAX_ENTRIES, 0);

impl Ends {
    /// The link `owner`'s socket is on, from its side.
    #[inline(always)]
    pub fn link(&self, owner: u32, side: u8) -> LinkKey {
        let active = side == SIDE_ACTIVE;
        LinkKey {
            owner,
            side,
            _pad: 0,
            family: self.family,
            port: if active {
                u16::from_be(self.rport_be)
            } else {
                self.lport
            },
            _pad2: 0,
            addr: if active { self.raddr } else { self.laddr },
            peer_ip: if active { [0; 16] } else { self.raddr },
            netns: self.netns,
        }
    }

    /// Whether the remote end is this host as seen from the local end:
    /// loopback, or the local address itself.
    #[inline(always)]
    pub fn remote_is_here(&self) -> bool {
        let loopback = if self.family == AF_INET6 {
            self.raddr[..15] == [0; 15] && self.raddr[15] == 1
        } else {
            self.raddr[0] == 127
        };
        loopback || self.raddr == self.laddr
    }
}

/// The watched process connections arriving at `port` of namespace
/// `netns` belong to, if any.
#[inline(always)]
pub fn listen_owner(netns: u32, port: u16) -> Option<u32> {
    // SAFETY: the map is preallocated (no BPF_F_NO_PREALLOC) and the value
    // copied out at once.
    unsafe { LISTEN_OWNERS.get(listen_key(netns, port)) }.map(|o| o.owner)
}

#[inline(always)]
/// Records `owner` as `port`'s listener (it just listened there); false
/// (and counted) when the map had no room.
pub fn set_listen_owner(netns: u32, port: u16, owner: u32) -> bool {
    let value = ListenOwner { owner, accepted: 0 };
    let recorded = LISTEN_OWNERS
        .insert(listen_key(netns, port), value, 0)
        .is_ok();
    if !recorded {
        events::count(Stat::ListenOwnersFull);
    }
    recorded
}

/// Process `tgid` accepted a socket that arrived at `port` of namespace
/// `netns`: if that is a watched listener whose owner has not accepted
/// there (or is gone), connections arriving there are `tgid`'s from now
/// on. A worker then owns what its master holds; workers of one pool take
/// turns, which changes nothing per role, and only the first accept writes.
#[inline(always)]
pub fn accepted(port: u16, netns: u32, tgid: u32, is_watched: impl Fn(u32) -> bool) {
    let Some(entry) = LISTEN_OWNERS.get_ptr_mut(listen_key(netns, port)) else {
        return;
    };
    // SAFETY: a value of a preallocated map, written whole u32 by u32; a
    // racing writer at worst leaves the other acceptor of the same port.
    unsafe {
        if (*entry).owner != tgid && ((*entry).accepted == 0 || !is_watched((*entry).owner)) {
            (*entry).owner = tgid;
            (*entry).accepted = 1;
        }
    }
}

#[inline(always)]
pub fn forget_listener(netns: u32, port: u16) {
    // A missing key is no failure: userspace may never have told it.
    let _ = LISTEN_OWNERS.remove(listen_key(netns, port));
}

/// Adds to `key`'s counts on this CPU: in place when the key exists, one
/// insert when it is new (a failure counted, never silent). Not inlined:
/// each call site's key and counts would take stack of their own.
#[inline(never)]
pub fn add(key: &LinkKey, delta: LinkCounts) {
    if let Some(counts) = LINKS.get_ptr_mut(key) {
        add_to(counts, &delta);
        return;
    }
    // A new key; the nested copy of the state probe may insert it at the
    // same moment, so an existing key is added to, not replaced.
    if LINKS
        .insert(key, delta, u64::from(aya_ebpf::bindings::BPF_NOEXIST))
        .is_ok()
    {
        return;
    }
    match LINKS.get_ptr_mut(key) {
        Some(counts) => add_to(counts, &delta),
        None => events::count(Stat::LinkMapFull),
    }
}

/// Adds `delta` to this CPU's counts at `counts` with atomic adds: the
/// state probe's nested copy (see tcp_state.rs) may run for another change
/// on this CPU while the first copy is between its read and its write.
#[inline(always)]
fn add_to(counts: *mut LinkCounts, delta: &LinkCounts) {
    // SAFETY: this CPU's copy of the value, which the map keeps while the
    // key lives (userspace deletes a key only when it has been quiet for a
    // while and its owner is gone), and is 8-byte aligned like every map
    // value; every writer adds atomically.
    unsafe {
        for (field, n) in [
            (&raw mut (*counts).opens, delta.opens),
            (&raw mut (*counts).closes, delta.closes),
            (&raw mut (*counts).aborts, delta.aborts),
            (&raw mut (*counts).new_time_wait, delta.new_time_wait),
        ] {
            if n != 0 {
                atomic::add(field, n);
            }
        }
    }
}

/// Counts a TIME_WAIT socket on its link in the iterator's run
/// `generation`: its closer's, or an unknown closer's on a watched
/// listener's link (either end, when both are on this host); others are
/// not ours.
#[inline(always)]
pub fn count_time_wait(e: &Ends, generation: u64) {
    let key = match closers::find(e.connection_hash()) {
        Some(c) => e.link(c.owner, c.side),
        None if listen_owner(e.netns, e.lport).is_some() => {
            e.link(0, probes_common::sock::SIDE_PASSIVE)
        }
        None if listen_owner(e.netns, u16::from_be(e.rport_be)).is_some() && e.remote_is_here() => {
            e.link(0, SIDE_ACTIVE)
        }
        None => return,
    };
    match TW_COUNTS.get_ptr_mut(key) {
        // SAFETY: a value of a preallocated map; only the iterator writes
        // it, and one run walks at a time (userspace reads it between runs).
        Some(c) => unsafe {
            if (*c).generation == generation {
                (*c).count += 1;
            } else {
                *c = TwCount {
                    generation,
                    count: 1,
                };
            }
        },
        None => {
            let first = TwCount {
                generation,
                count: 1,
            };
            if TW_COUNTS.insert(key, first, 0).is_err() {
                events::count(Stat::TimeWaitMapFull);
            }
        }
    }
}
