//! TCP sockets as the iterator sees them, in model terms.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use probes_common::sock::{
    TCP_CLOSE, TCP_CLOSE_WAIT, TCP_CLOSING, TCP_ESTABLISHED, TCP_FIN_WAIT1, TCP_FIN_WAIT2,
    TCP_LAST_ACK, TCP_LISTEN, TCP_NEW_SYN_RECV, TCP_SYN_RECV, TCP_SYN_SENT, TCP_TIME_WAIT,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TcpState {
    Established,
    SynSent,
    SynRecv,
    FinWait1,
    FinWait2,
    TimeWait,
    Close,
    CloseWait,
    LastAck,
    Listen,
    Closing,
    NewSynRecv,
}

impl TcpState {
    /// From the kernel's number for it (probes_common::sock, after
    /// include/net/tcp_states.h).
    pub fn from_kernel(state: u8) -> Option<Self> {
        use TcpState::*;
        Some(match state {
            TCP_ESTABLISHED => Established,
            TCP_SYN_SENT => SynSent,
            TCP_SYN_RECV => SynRecv,
            TCP_FIN_WAIT1 => FinWait1,
            TCP_FIN_WAIT2 => FinWait2,
            TCP_TIME_WAIT => TimeWait,
            TCP_CLOSE => Close,
            TCP_CLOSE_WAIT => CloseWait,
            TCP_LAST_ACK => LastAck,
            TCP_LISTEN => Listen,
            TCP_CLOSING => Closing,
            TCP_NEW_SYN_RECV => NewSynRecv,
            _ => return None,
        })
    }
}

/// One TCP socket in a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSock {
    pub state: TcpState,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// The socket's inode, 0 for TIME_WAIT and request sockets.
    pub ino: u64,
    /// LISTEN sockets: connections waiting to be accepted, and the limit.
    pub backlog: u32,
    pub max_backlog: u32,
    pub netns: Netns,
}

/// A listening socket's `sk_drops` as a walk read it: the connections the
/// kernel dropped at it since it was made (at a full accept queue, a full
/// SYN queue or for want of memory, as `ListenDrops` counts them for the
/// machine), wrapping at 2^32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenDrops {
    pub netns: Netns,
    pub ino: u64,
    pub drops: u32,
}

/// A socket's network namespace: None for stackprobe's own, else the
/// inode number of another (a container's), as `/proc/PID/ns/net` names it.
pub type Netns = Option<u32>;

/// How a text names a namespace after an address: nothing for
/// stackprobe's own.
pub fn netns_suffix(netns: Netns) -> String {
    netns.map_or_else(String::new, |n| format!(" in net:[{n}]"))
}

/// Builds an address from the kernel's bytes (IPv4 in the first 4).
pub fn address(ipv6: bool, bytes: [u8; 16], port: u16) -> SocketAddr {
    let ip = if ipv6 {
        IpAddr::V6(Ipv6Addr::from(bytes))
    } else {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    };
    SocketAddr::new(ip, port)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_states() {
        let mut b = [0u8; 16];
        b[..4].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(address(false, b, 80).to_string(), "127.0.0.1:80");
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        assert_eq!(address(true, v6, 443).to_string(), "[::1]:443");
        assert_eq!(TcpState::from_kernel(6), Some(TcpState::TimeWait));
        assert_eq!(TcpState::from_kernel(10), Some(TcpState::Listen));
        assert_eq!(TcpState::from_kernel(0), None);
    }
}
