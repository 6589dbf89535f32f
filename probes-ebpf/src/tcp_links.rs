//! TCP links counted in the kernel, shared by the state probe (opens,
//! closes, aborts, new TIME_WAIT) and the socket iterator (TIME_WAIT sockets
//! now): a socket's ends read from one copy of its `sock_common`, the link
//! key they make, the per-CPU counts per link and the watched listeners.

use core::mem::MaybeUninit;

use aya_ebpf::{
    Global,
    macros::map,
    maps::{HashMap, PerCpuHashMap},
};
use probes_common::{
    connect::TcpDestination,
    sock::{
        AF_INET6, Closer, LINKS_MAX_ENTRIES, LISTEN_OWNERS_MAX_ENTRIES, LinkCounts, LinkKey,
        ListenOwner, SIDE_ACTIVE, SOCK_WINDOW, TW_COUNTS_MAX_ENTRIES, TwCount, listen_key,
    },
    stats::Stat,
};

use crate::{
    atomic, closers, events,
    memory::{self, Bits},
    offsets::offset_globals,
};

probes_common::sock_common_members!(offset_globals);
probes_common::sock_net_members!(offset_globals);

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

/// The `T` at the offset in `offset` of a copy of kernel memory, the default
/// if it would lie outside (userspace checks every offset fits at load).
#[inline(always)]
pub fn at<T: Bits + Default, const N: usize>(copy: &[u8; N], offset: &Global<u32>) -> T {
    let o = offset.load() as usize;
    if o > N - size_of::<T>() {
        return T::default();
    }
    // SAFETY: `o + size_of::<T>()` lies inside `copy` (checked above); the
    // read is unaligned-safe and T: Bits takes any bytes.
    unsafe { core::ptr::read_unaligned(copy.as_ptr().add(o).cast::<T>()) }
}

/// A socket's ends, as its `sock_common` holds them (a timewait socket's
/// too: it starts with the same struct). Aligned so that the addresses are
/// too: BPF has no unaligned stores, and LLVM turns an unaligned 16-byte
/// fill or copy into a call to a byte-at-a-time memset or memcpy.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct Ends {
    pub family: u16,
    pub state: u8,
    /// Host byte order.
    pub lport: u16,
    /// Network byte order.
    pub rport_be: u16,
    /// IPv4 in the first 4 bytes, IPv6 in all 16.
    pub laddr: [u8; 16],
    pub raddr: [u8; 16],
    /// The network namespace's inode number.
    pub netns: u32,
}

/// The ends of the socket at `sk`, from one copy of its first bytes; None
/// if it cannot be read.
#[inline(always)]
fn read_ends(sk: u64) -> Option<Ends> {
    let mut ends = MaybeUninit::<Ends>::uninit();
    // SAFETY: on true every field was written (see `copy_ends`).
    copy_ends(sk, &mut ends).then(|| unsafe { ends.assume_init() })
}

/// Writes the ends of the socket at `sk` into `out`, all its fields, and
/// says so; false if the socket cannot be read. Not inlined, and writing
/// into the caller's frame: the copy then takes stack only while it is
/// read, and the ends none of the callee's (the classic state probe's call
/// chain must stay within 6.1's 512 bytes).
#[inline(never)]
fn copy_ends(sk: u64, out: &mut MaybeUninit<Ends>) -> bool {
    let mut copy = MaybeUninit::<[u8; SOCK_WINDOW]>::uninit();
    let Some(w) = memory::kernel_in_place(sk, &mut copy) else {
        return false;
    };
    let family = at(w, &SKC_FAMILY);
    let o = out.as_mut_ptr();
    // SAFETY: `o` points to the caller's Ends, each of whose fields is
    // written here, field by field so that no whole Ends is built on this
    // frame first.
    unsafe {
        if family == AF_INET6 {
            (*o).laddr = at(w, &SKC_V6_RCV_SADDR);
            (*o).raddr = at(w, &SKC_V6_DADDR);
        } else {
            (*o).laddr = v4(at(w, &SKC_RCV_SADDR));
            (*o).raddr = v4(at(w, &SKC_DADDR));
        }
        (*o).family = family;
        (*o).state = at(w, &SKC_STATE);
        (*o).lport = at(w, &SKC_NUM);
        (*o).rport_be = at(w, &SKC_DPORT);
        (*o).netns = 0;
    }
    true
}

/// A socket the state probe reads. Its `struct sock` members come through
/// the kernel's fault-handling copy helper for a socket known by address
/// ([`SockAt`]), and as plain loads through a pointer the verifier knows
/// for a `struct sock` ([`SockBtf`], a tp_btf argument): a helper call
/// saved per member (its offsets are load-time constants, which the
/// verifier checks against the kernel's BTF).
pub trait Sock: Copy {
    /// The member of `struct sock` at `offset`.
    fn member<T: Bits>(self, offset: &Global<u32>) -> Option<T>;
    /// Its ends, without the network namespace.
    fn ends(self) -> Option<Ends>;
    /// The inode number of its network namespace (0 if unreadable).
    fn netns(self) -> u32;
}

/// A socket by address.
#[derive(Clone, Copy)]
pub struct SockAt(pub u64);

impl Sock for SockAt {
    #[inline(always)]
    fn member<T: Bits>(self, offset: &Global<u32>) -> Option<T> {
        read(self.0, offset)
    }

    #[inline(always)]
    fn ends(self) -> Option<Ends> {
        read_ends(self.0)
    }

    #[inline(always)]
    fn netns(self) -> u32 {
        netns(self.0)
    }
}

/// A socket through a pointer the verifier types as a `struct sock` (a
/// tp_btf argument) or a `struct sock_common` (the iterator's, which reads
/// only those members here; see `memory::btf`): a load that faults reads 0,
/// as a failed copy would.
#[derive(Clone, Copy)]
pub struct SockBtf(pub *const u8);

impl SockBtf {
    #[inline(always)]
    fn load<T: Bits>(self, offset: &Global<u32>) -> T {
        memory::btf(self.0, offset)
    }

    /// An IPv6 address, as two loads of its halves.
    #[inline(always)]
    fn v6(self, offset: &Global<u32>) -> [u8; 16] {
        let first = self.load::<u64>(offset);
        let second = memory::btf::<u64>(self.0.wrapping_add(8), offset);
        // SAFETY: [u64; 2] and [u8; 16] have the same size, and any bytes
        // are valid u8s.
        unsafe { core::mem::transmute::<[u64; 2], [u8; 16]>([first, second]) }
    }
}

impl Sock for SockBtf {
    #[inline(always)]
    fn member<T: Bits>(self, offset: &Global<u32>) -> Option<T> {
        Some(self.load(offset))
    }

    #[inline(always)]
    fn ends(self) -> Option<Ends> {
        let family = self.load::<u16>(&SKC_FAMILY);
        let (laddr, raddr) = if family == AF_INET6 {
            (self.v6(&SKC_V6_RCV_SADDR), self.v6(&SKC_V6_DADDR))
        } else {
            (
                v4(self.load::<u32>(&SKC_RCV_SADDR).to_ne_bytes()),
                v4(self.load::<u32>(&SKC_DADDR).to_ne_bytes()),
            )
        };
        Some(Ends {
            family,
            state: self.load(&SKC_STATE),
            lport: self.load(&SKC_NUM),
            rport_be: self.load(&SKC_DPORT),
            laddr,
            raddr,
            netns: 0,
        })
    }

    #[inline(always)]
    fn netns(self) -> u32 {
        // The verifier types the loaded pointer as the `struct net` it is.
        let net = self.load::<u64>(&SKC_NET) as *const u8;
        if net.is_null() {
            return 0;
        }
        memory::btf(net, &NET_INUM)
    }
}

/// The inode number of the socket at `sk`'s network namespace (0 if
/// unreadable). Not inlined, and not read inside [`read_ends`]: its reads'
/// spills would push the state probe's stack past what 6.1's verifier
/// allows (512 bytes over the call chain).
#[inline(never)]
pub fn netns(sk: u64) -> u32 {
    read::<u64>(sk, &SKC_NET).map_or(0, |net| read(net, &NET_INUM).unwrap_or(0))
}

/// An IPv4 address in the first 4 bytes of 16, as whole words: a byte
/// array filled piecewise costs a call to a byte-at-a-time memset.
#[inline(always)]
fn v4(a: [u8; 4]) -> [u8; 16] {
    let words = [u32::from_ne_bytes(a), 0, 0, 0];
    // SAFETY: [u32; 4] and [u8; 16] have the same size, and any bytes are
    // valid u8s.
    unsafe { core::mem::transmute::<[u32; 4], [u8; 16]>(words) }
}

/// The member at `offset` of the struct at `base` (past the copied window).
#[inline(always)]
pub fn read<T: Bits>(base: u64, offset: &Global<u32>) -> Option<T> {
    memory::kernel(base + u64::from(offset.load()))
}

impl Ends {
    /// What names the connection, whatever its state (a timewait socket has
    /// the same), as one hash: its family, ports, addresses and namespace.
    #[inline(always)]
    pub fn connection_hash(&self) -> u64 {
        let word = |b: &[u8; 16], i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(w)
        };
        let ports =
            u64::from(self.family) | u64::from(self.lport) << 16 | u64::from(self.rport_be) << 32;
        let mut h = closers::mix(0, ports);
        h = closers::mix(h, u64::from(self.netns));
        h = closers::mix(h, word(&self.laddr, 0));
        h = closers::mix(h, word(&self.laddr, 1));
        h = closers::mix(h, word(&self.raddr, 0));
        h = closers::mix(h, word(&self.raddr, 1));
        closers::finish(h)
    }

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

    /// Where an active socket connects to, and the id its connect samples
    /// carry: a hash of the remote address, port and namespace (a unix
    /// destination's id hashes its path; see probes_common::connect).
    #[inline(always)]
    pub fn destination(&self) -> (u64, TcpDestination) {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&self.raddr[i * 8..i * 8 + 8]);
            u64::from_ne_bytes(w)
        };
        let port = u16::from_be(self.rport_be);
        let mut h = closers::mix(0, u64::from(self.family) | u64::from(port) << 16);
        h = closers::mix(h, u64::from(self.netns));
        h = closers::mix(h, word(0));
        h = closers::mix(h, word(1));
        let d = TcpDestination {
            family: self.family,
            port,
            netns: self.netns,
            addr: self.raddr,
        };
        (closers::finish(h) | 1, d)
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

/// The local port and network namespace of the socket at `sk`, read from
/// it (for an accepted socket: its listener's).
#[inline(always)]
pub fn port_and_netns(sk: u64) -> Option<(u16, u32)> {
    Some((read::<u16>(sk, &SKC_NUM)?, netns(sk)))
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

/// Notes who closed the socket with these ends first (`owner`, from its
/// `side`): its timewait socket, which has the same ends, is theirs. Not
/// inlined, to keep the state probe's own stack small.
#[inline(never)]
pub fn note_closer(e: &Ends, owner: u32, side: u8) {
    let closer = Closer {
        owner,
        side,
        _pad: [0; 3],
    };
    if !closers::note(e.connection_hash(), closer) {
        events::count(Stat::TimeWaitMapFull);
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
