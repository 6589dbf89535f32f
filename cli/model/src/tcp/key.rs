//! How a link is keyed: by the kernel (the owner's tgid and the other end)
//! and by a row (the owner's role and the other end as text).

use std::net::{IpAddr, SocketAddr};

use super::sockets::{Netns, netns_suffix};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Side {
    /// The watched process connected out: `process → remote ip:port`.
    Active,
    /// The watched process accepted: `local ip:port ← remote ip`.
    Passive,
}

/// Who owns a link: a watched process's role, or nobody known.
pub type Owner = Option<String>;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LinkKey {
    pub owner: Owner,
    pub side: Side,
    /// `→ 127.0.0.1:5432` or `127.0.0.1:5432 ← 127.0.0.1`.
    pub peer: String,
    /// Where the link's connections go, without the client's address: the
    /// destination of an active link, the listening address of a passive
    /// one (`127.0.0.1:5432`, with its namespace when not stackprobe's).
    pub endpoint: String,
}

/// The other end of a link as the kernel keys it: the remote address for an
/// active link; the local address and the remote IP for a passive one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Peer {
    pub side: Side,
    pub addr: SocketAddr,
    /// Passive links: the remote address.
    pub peer_ip: Option<IpAddr>,
    pub netns: Netns,
}

/// A link's texts: the peer as the views show it, and its endpoint.
#[derive(Clone, Debug)]
pub(super) struct PeerText {
    pub(super) peer: String,
    pub(super) endpoint: String,
}

impl Peer {
    pub(super) fn format(&self) -> PeerText {
        let ns = netns_suffix(self.netns);
        let endpoint = format!("{}{ns}", self.addr);
        let peer = match (self.side, self.peer_ip) {
            (Side::Passive, Some(ip)) => format!("{} ← {ip}{ns}", self.addr),
            _ => format!("→ {endpoint}"),
        };
        PeerText { peer, endpoint }
    }
}

/// A link as the kernel counts it: the owner's tgid (0: unknown) and the
/// other end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelLink {
    pub owner: u32,
    pub peer: Peer,
}
