//! A socket as the TCP probes read it (the state probe, and the socket
//! iterator): its ends, from one copy of its `sock_common` or as plain loads
//! through a pointer the verifier knows, and single members of its structs.

use core::mem::MaybeUninit;

use aya_ebpf::Global;
use probes_common::sock::{AF_INET6, SOCK_WINDOW};

use crate::{
    memory::{self, Bits},
    offsets::offset_globals,
};

probes_common::sock_common_members!(offset_globals);
probes_common::sock_net_members!(offset_globals);
probes_common::sock_iter_members!(offset_globals);

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

/// The local port and network namespace of the socket at `sk`, read from
/// it (for an accepted socket: its listener's).
#[inline(always)]
pub fn port_and_netns(sk: u64) -> Option<(u16, u32)> {
    Some((read::<u16>(sk, &SKC_NUM)?, netns(sk)))
}

/// sk->sk_socket->file->f_inode->i_ino: the inode /proc/PID/fd links name
/// (None for a socket with no file yet: one still in a listener's queue).
#[inline(always)]
pub fn inode(sk: u64) -> Option<u64> {
    let socket: u64 = read(sk, &SK_SOCKET).filter(|&p| p != 0)?;
    let file: u64 = read(socket, &SOCKET_FILE).filter(|&p| p != 0)?;
    let inode: u64 = read(file, &FILE_INODE).filter(|&p| p != 0)?;
    read(inode, &INODE_INO)
}
