//! connect(2) latency on the client side, per destination: for TCP, from
//! the connect's SYN to ESTABLISHED (the state probe, both ends of which it
//! already sees); for unix sockets, the syscall itself, whose enter and exit
//! are paired per thread. Samples go to the kernel's histograms
//! ([`crate::hist`]) under the destination's id; the kernel names each id
//! once, in [`TCP_DESTINATIONS_MAP`] or [`UNIX_DESTINATIONS_MAP`].

/// LRU hashes of destination id → [`TcpDestination`] and
/// [`UnixDestination`].
pub const TCP_DESTINATIONS_MAP: &str = "TCP_DESTINATIONS";
pub const UNIX_DESTINATIONS_MAP: &str = "UNIX_DESTINATIONS";
pub const DESTINATIONS_MAX_ENTRIES: u32 = 4096;
/// Array of [`ConnectStart`] slots (see [`crate::DEFAULT_SLOTS`]).
pub const CONNECT_START_MAP: &str = "CONNECT_START";
/// Global holding the offset of `fd` in `sys_enter_connect`, which
/// `uservaddr` and `addrlen` follow 8 bytes apart (the probe reads the
/// three at once).
pub const ENTER_ARGS_OFFSET_GLOBAL: &str = "CONNECT_ENTER_ARGS_OFFSET";
/// Global holding the offset of `ret` in `sys_exit_connect`.
pub const EXIT_RET_OFFSET_GLOBAL: &str = "CONNECT_EXIT_RET_OFFSET";

pub const ENTER_PROGRAM: &str = "connect_enter";
pub const EXIT_PROGRAM: &str = "connect_exit";
pub const ENTER_TRACEPOINT: &str = "sys_enter_connect";
pub const EXIT_TRACEPOINT: &str = "sys_exit_connect";

pub const AF_UNIX: u16 = 1;
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;
/// `sizeof(sockaddr_un.sun_path)`.
pub const UNIX_PATH_MAX: usize = 108;
/// The errno of a connect nobody listened for: a TCP reset answering the
/// SYN, or a unix socket file with no listener behind it.
pub const ECONNREFUSED: i32 = 111;

/// A TCP destination: the address and port, in a network namespace.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpDestination {
    /// [`AF_INET`] or [`AF_INET6`].
    pub family: u16,
    /// Host order.
    pub port: u16,
    /// The network namespace's inode number.
    pub netns: u32,
    /// IPv4 in the first 4 bytes.
    pub addr: [u8; 16],
}

crate::assert_layout!(TcpDestination, 24, { family: 0, port: 2, netns: 4, addr: 8 });

/// A unix socket's address: a path, or an abstract name (`path[0] == 0`).
/// Bytes past `len` are zero, so equal addresses have equal bytes and the
/// same id.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnixDestination {
    /// Bytes of `path` used.
    pub len: u32,
    pub path: [u8; UNIX_PATH_MAX],
}

crate::assert_layout!(UnixDestination, 112, { len: 0, path: 4 });

impl UnixDestination {
    pub const ZERO: Self = Self {
        len: 0,
        path: [0; UNIX_PATH_MAX],
    };

    /// The id its histograms carry: a 64-bit hash of its bytes (two
    /// destinations would need to collide in 64 bits to mix). The kernel
    /// ids a TCP destination with a hash of its own; 0 is never an id.
    #[inline(always)]
    pub fn id(&self) -> u64 {
        // SAFETY: repr(C) with no padding (asserted above): every byte is
        // initialised; 112 bytes are 14 u64 words, and the struct is 4-byte
        // aligned, so they are read unaligned.
        let base = (self as *const Self).cast::<u64>();
        let mut h: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut i = 0;
        while i < 14 {
            let w = unsafe { base.add(i).read_unaligned() };
            h = (h ^ w).wrapping_mul(0x0100_0000_01b3).rotate_left(23);
            i += 1;
        }
        h ^= h >> 31;
        h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
        (h ^ (h >> 29)) | 1
    }
}

/// A connect in flight: `start_ns` is 0 when the slot is free, or once the
/// state probe saw it send a TCP SYN (a TCP connect, which it times).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ConnectStart {
    pub start_ns: u64,
    /// The caller's `struct sockaddr *` and its length, read at the exit.
    pub addr: u64,
    pub tid: u32,
    pub len: u32,
    /// The connecting socket's fd.
    pub fd: u32,
    /// 1 for a watched process; 0 for a unix connect of any other, which
    /// only the unix queue (its wait, its losses) follows.
    pub watched: u32,
}

crate::assert_layout!(ConnectStart, 32, { start_ns: 0, addr: 8, tid: 16, len: 20, fd: 24, watched: 28 });

#[cfg(feature = "user")]
mod user {
    unsafe impl aya::Pod for super::TcpDestination {}
    unsafe impl aya::Pod for super::UnixDestination {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_ids_differ_by_any_byte_and_are_never_zero() {
        let mut a = UnixDestination::ZERO;
        a.path[..4].copy_from_slice(b"/run");
        a.len = 4;
        let mut b = a;
        b.path[107] = 1;
        let mut c = a;
        c.len = 5;
        let ids = [a.id(), b.id(), c.id(), UnixDestination::ZERO.id()];
        for (i, x) in ids.iter().enumerate() {
            assert_ne!(*x, 0);
            for y in &ids[i + 1..] {
                assert_ne!(x, y);
            }
        }
        assert_eq!(a.id(), { a }.id());
    }
}
