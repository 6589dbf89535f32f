//! Connections of watched processes, grouped into links (the owner's role and
//! the service on the other end): opens, closes, aborts, and TIME_WAIT
//! sockets now and new, attributed to the process that closed first.
//!
//! The kernel counts them (probes-ebpf/src/tcp_links.rs): opens, closes,
//! aborts and new TIME_WAIT per (owner tgid, side, other end) from the state
//! changes, and TIME_WAIT sockets now per link in the iterator's snapshots,
//! each joined by 4-tuple to the process whose close put it into FIN_WAIT1.
//! A TIME_WAIT socket whose closer is unknown (it closed before stackprobe
//! started, or an unwatched process closed it) is counted as unknown on its
//! watched listener's link (either end, when both are on this host), and
//! never guessed. This table turns the kernel's running totals into what
//! changed, names each owner by its role and formats each link once.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
};

use rustc_hash::FxHashMap;

use super::{
    counter::Counter,
    sockets::{Netns, TcpSock, TcpState, netns_suffix},
};

/// At most this many link rows; further links merge into one per process.
pub const MAX_LINKS: usize = 4096;

/// A process's role is remembered this many reads after its last link
/// counted: a close may reach TIME_WAIT well after its closer exited.
const ROLE_MEMORY: u64 = 64;

/// Role names kept before the unused ones are let go (or twice as many as
/// were in use then, if more).
const MAX_ROLE_NAMES: usize = 4096;

/// Role names, each kept once, by id.
#[derive(Clone, Debug, Default)]
struct RoleNames {
    ids: FxHashMap<String, u32>,
    names: Vec<String>,
    /// In use after the last compaction.
    in_use: usize,
}

impl RoleNames {
    fn id(&mut self, role: &str) -> u32 {
        if let Some(&id) = self.ids.get(role) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(role.to_string());
        self.ids.insert(role.to_string(), id);
        id
    }

    fn name(&self, id: u32) -> &str {
        &self.names[id as usize]
    }

    /// Whether enough names may be unused to compact them.
    fn full(&self) -> bool {
        self.names.len() > MAX_ROLE_NAMES.max(2 * self.in_use)
    }

    /// Keeps only the names `in_use` refer to, renumbering them.
    fn compact<'a>(&mut self, in_use: impl Iterator<Item = &'a mut u32>) {
        let old = std::mem::take(self);
        for id in in_use {
            *id = self.id(old.name(*id));
        }
        self.in_use = self.names.len();
    }
}

/// A kernel link whose owner exited is forgotten (in the kernel too) after
/// this many reads without a change.
const QUIET_READS: u32 = 2;

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
struct PeerText {
    peer: String,
    endpoint: String,
}

impl Peer {
    fn format(&self) -> PeerText {
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

/// A kernel link's counts since the probes loaded (summed over CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkTotals {
    pub opens: u64,
    pub closes: u64,
    pub aborts: u64,
    pub new_time_wait: u64,
}

impl LinkTotals {
    /// What grew since `earlier`; everything, if a count went down (the key
    /// was forgotten and counts from 0 again).
    fn since(&self, earlier: &LinkTotals) -> LinkTotals {
        let went_down = self.opens < earlier.opens
            || self.closes < earlier.closes
            || self.aborts < earlier.aborts
            || self.new_time_wait < earlier.new_time_wait;
        if went_down {
            return *self;
        }
        LinkTotals {
            opens: self.opens - earlier.opens,
            closes: self.closes - earlier.closes,
            aborts: self.aborts - earlier.aborts,
            new_time_wait: self.new_time_wait - earlier.new_time_wait,
        }
    }

    fn is_zero(&self) -> bool {
        *self == LinkTotals::default()
    }

    /// Every count added up (wrapping): a change in any moves it.
    pub fn changes(&self) -> u64 {
        self.opens
            .wrapping_add(self.closes)
            .wrapping_add(self.aborts)
            .wrapping_add(self.new_time_wait)
    }

    fn plus(&self, other: &LinkTotals) -> LinkTotals {
        LinkTotals {
            opens: self.opens + other.opens,
            closes: self.closes + other.closes,
            aborts: self.aborts + other.aborts,
            new_time_wait: self.new_time_wait + other.new_time_wait,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    pub opens: Counter,
    pub closes: Counter,
    /// Connections that ended without the FIN handshake: reset, refused,
    /// aborted.
    pub aborts: Counter,
    /// TIME_WAIT sockets now (from the last snapshot).
    pub time_wait: u64,
    /// Sockets that went into TIME_WAIT.
    pub new_time_wait: Counter,
}

impl LinkStats {
    /// Adds `total` counts since the start, `interval` of them in this
    /// interval.
    fn put(&mut self, total: &LinkTotals, interval: &LinkTotals) {
        for (c, t, i) in self.counters(total, interval) {
            c.total += t;
            c.interval += i;
        }
    }

    /// Takes away what [`put`](Self::put) added.
    fn take(&mut self, total: &LinkTotals, interval: &LinkTotals) {
        for (c, t, i) in self.counters(total, interval) {
            c.total = c.total.saturating_sub(t);
            c.interval = c.interval.saturating_sub(i);
        }
    }

    fn counters(
        &mut self,
        total: &LinkTotals,
        interval: &LinkTotals,
    ) -> [(&mut Counter, u64, u64); 4] {
        [
            (&mut self.opens, total.opens, interval.opens),
            (&mut self.closes, total.closes, interval.closes),
            (&mut self.aborts, total.aborts, interval.aborts),
            (
                &mut self.new_time_wait,
                total.new_time_wait,
                interval.new_time_wait,
            ),
        ]
    }

    /// Nothing counted and no TIME_WAIT now: no row to show.
    fn is_empty(&self) -> bool {
        *self == LinkStats::default()
    }
}

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

/// What the kernel's running totals were at the last read, per kernel link.
#[derive(Clone, Debug, Default)]
struct Seen {
    totals: LinkTotals,
    /// What it added in the current interval.
    interval: LinkTotals,
    /// Reads in a row that found no change.
    quiet: u32,
}

#[derive(Clone, Debug, Default)]
pub struct LinkTable {
    links: BTreeMap<LinkKey, LinkStats>,
    /// The kernel's totals at the last read.
    seen: FxHashMap<KernelLink, Seen>,
    /// Each link's text, formatted once.
    peers: FxHashMap<Peer, PeerText>,
    /// Owners' roles (as ids into `role_names`), with the read they last
    /// counted in (its low 32 bits): kept after a process exits, since its
    /// sockets count on (a socket stays on its link even after its owner
    /// exits). Every process that exits is remembered for
    /// [`ROLE_MEMORY`] reads, some 25k where postgres forks per request:
    /// 12 bytes each, where a copy of the role's name made it ~70 (3.6 MB).
    roles: FxHashMap<u32, (u32, u32)>,
    role_names: RoleNames,
    reads: u64,
    /// Watched processes' listening sockets, from the last snapshot.
    listening: Vec<Listener>,
    /// Kernel counters at the start, at the start of the interval, and now.
    counters: Option<(KernelCounters, KernelCounters, KernelCounters)>,
    /// Ephemeral ports (ip_local_port_range), when readable.
    ephemeral_ports: Option<u32>,
    /// Sockets the last snapshot walked, and how long taking it took
    /// (iterator, /proc scans and bookkeeping), in µs.
    last_snapshot: (usize, u64),
    /// Snapshots that walked the sockets.
    walks: u64,
    unwalked: Vec<Unwalked>,
    /// How old the last walk was at the last look.
    walk_age: std::time::Duration,
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

impl LinkTable {
    /// Takes in a look at the kernel: what each link gained since the last
    /// one and, with a walk, the watched listeners and their backlogs and
    /// TIME_WAIT sockets per link; the kernel's counters.
    pub fn observe_snapshot(&mut self, snapshot: SocketSnapshot) {
        self.reads += 1;
        for (pid, role) in snapshot.roles {
            self.set_role(pid, role);
        }
        self.add_totals(&snapshot.links);
        if let Some(walk) = snapshot.walk {
            self.listening = walk
                .listeners
                .iter()
                .filter(|s| s.state == TcpState::Listen)
                .filter_map(|s| {
                    Some(Listener {
                        owner: *walk.owners.get(&(s.netns, s.local.port()))?,
                        local: s.local,
                        netns: s.netns,
                        backlog: s.backlog,
                        max_backlog: s.max_backlog,
                    })
                })
                .collect();
            self.set_time_wait(&walk.time_wait);
            self.last_snapshot = (walk.sockets, snapshot.took_us);
            self.walks += 1;
            self.unwalked = walk.unwalked;
        }
        self.walk_age = snapshot.walk_age;
        self.set_counters(snapshot.counters);
        self.ephemeral_ports = snapshot.ephemeral_ports;
        let owners: rustc_hash::FxHashSet<u32> = self.seen.keys().map(|k| k.owner).collect();
        let reads = self.reads as u32;
        self.roles.retain(|pid, (_, last)| {
            reads.wrapping_sub(*last) < ROLE_MEMORY as u32 || owners.contains(pid)
        });
        if self.role_names.full() {
            self.role_names
                .compact(self.roles.values_mut().map(|(id, _)| id));
        }
        if self.peers.len() > 4 * MAX_LINKS {
            // Texts of links gone long ago: formatted again if they return.
            self.peers.clear();
        }
    }

    /// Remembers the role of a process that exited, for its links that
    /// count on.
    pub fn remember_role(&mut self, pid: u32, role: String) {
        self.set_role(pid, role);
    }

    /// Names `pid`'s links by `role` from now on. A process whose role
    /// changed (a server's first fork of its own name makes it a master; a
    /// php-fpm worker names its pool after its fork) takes what its links
    /// counted so far along, so one process never leaves rows under two
    /// roles.
    fn set_role(&mut self, pid: u32, role: String) {
        let id = self.role_names.id(&role);
        let old = match self.roles.insert(pid, (id, self.reads as u32)) {
            Some((old, _)) if old != id => self.role_names.name(old).to_string(),
            _ => return,
        };
        // What each of its kernel links added so far is what `seen` holds:
        // all of it went to the old role's rows.
        let moved: Vec<(Peer, LinkTotals, LinkTotals)> = self
            .seen
            .iter()
            .filter(|(link, _)| link.owner == pid)
            .map(|(link, seen)| (link.peer, seen.totals, seen.interval))
            .collect();
        for (peer, total, interval) in moved {
            let text = self
                .peers
                .entry(peer)
                .or_insert_with(|| peer.format())
                .clone();
            let from = LinkKey {
                owner: Some(old.clone()),
                side: peer.side,
                peer: text.peer.clone(),
                endpoint: text.endpoint.clone(),
            };
            let Some(stats) = self.links.get_mut(&from) else {
                continue;
            };
            stats.take(&total, &interval);
            if stats.is_empty() {
                self.links.remove(&from);
            }
            let to = LinkKey {
                owner: Some(role.clone()),
                side: peer.side,
                peer: text.peer,
                endpoint: text.endpoint,
            };
            self.stats(to).put(&total, &interval);
        }
    }

    /// Watched processes' listening sockets, from the last snapshot.
    pub fn listening(&self) -> &[Listener] {
        &self.listening
    }

    /// Kernel counters at the start, at the start of the interval, and now.
    pub fn counters(&self) -> Option<(KernelCounters, KernelCounters, KernelCounters)> {
        self.counters
    }

    /// Ephemeral ports (ip_local_port_range), when readable.
    pub fn ephemeral_ports(&self) -> Option<u32> {
        self.ephemeral_ports
    }

    /// Sockets in the last snapshot, and how long taking it took in µs.
    pub fn last_snapshot(&self) -> (usize, u64) {
        self.last_snapshot
    }

    /// How many snapshots walked the sockets.
    pub fn walks(&self) -> u64 {
        self.walks
    }

    /// Namespaces the last walk could not enter.
    pub fn unwalked(&self) -> &[Unwalked] {
        &self.unwalked
    }

    /// How old the TIME_WAIT counts and listeners were at the last look.
    pub fn walk_age(&self) -> std::time::Duration {
        self.walk_age
    }

    /// The row of `link`: its owner's role and its text, formatted once.
    fn key(&mut self, link: &KernelLink) -> LinkKey {
        let owner = (link.owner != 0).then(|| {
            self.roles
                .get_mut(&link.owner)
                .map(|(id, last)| {
                    *last = self.reads as u32;
                    self.role_names.name(*id).to_string()
                })
                .unwrap_or_else(|| format!("[{}]", link.owner))
        });
        let text = self
            .peers
            .entry(link.peer)
            .or_insert_with(|| link.peer.format())
            .clone();
        LinkKey {
            owner,
            side: link.peer.side,
            peer: text.peer,
            endpoint: text.endpoint,
        }
    }

    fn stats(&mut self, key: LinkKey) -> &mut LinkStats {
        let key = if self.links.len() >= MAX_LINKS && !self.links.contains_key(&key) {
            LinkKey {
                owner: key.owner,
                side: key.side,
                peer: "(other links)".into(),
                endpoint: "(other links)".into(),
            }
        } else {
            key
        };
        self.links.entry(key).or_default()
    }

    /// Adds what each kernel link gained since the last read. A link
    /// missing from `now` was forgotten in the kernel.
    fn add_totals(&mut self, now: &[(KernelLink, LinkTotals)]) {
        let mut seen = FxHashMap::default();
        seen.reserve(now.len());
        for (link, totals) in now {
            let before = self.seen.get(link);
            let delta = totals.since(&before.map(|s| s.totals).unwrap_or_default());
            // A key forgotten in the kernel counts from 0 again: what it
            // added before was an earlier link's.
            let restarted = before.is_some_and(|b| !b.totals.is_zero() && delta == *totals);
            let mut interval = before
                .filter(|_| !restarted)
                .map_or_else(LinkTotals::default, |s| s.interval);
            let quiet = if delta.is_zero() {
                before.map_or(0, |s| s.quiet) + 1
            } else {
                let key = self.key(link);
                self.stats(key).put(&delta, &delta);
                interval = interval.plus(&delta);
                0
            };
            seen.insert(
                *link,
                Seen {
                    totals: *totals,
                    interval,
                    quiet,
                },
            );
        }
        self.seen = seen;
    }

    /// Kernel links whose owner is gone (`alive` says no) and that have not
    /// changed for a while: the collector removes them from the kernel's
    /// map, so a forking server's short-lived children leave no keys behind.
    pub fn forgettable(&self, alive: impl Fn(u32) -> bool) -> Vec<KernelLink> {
        self.seen
            .iter()
            .filter(|(link, s)| s.quiet >= QUIET_READS && !alive(link.owner))
            .map(|(link, _)| *link)
            .collect()
    }

    /// Sets the TIME_WAIT sockets now per link.
    fn set_time_wait(&mut self, counts: &[(KernelLink, u64)]) {
        for stats in self.links.values_mut() {
            stats.time_wait = 0;
        }
        for (link, n) in counts {
            let key = self.key(link);
            self.stats(key).time_wait += n;
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&LinkKey, &LinkStats)> {
        self.links.iter()
    }

    /// Records the machine's TcpExt counters now.
    fn set_counters(&mut self, now: KernelCounters) {
        self.counters = Some(match self.counters {
            Some((start, interval_start, _)) => (start, interval_start, now),
            None => (now, now, now),
        });
    }

    /// Starts a new interval; links with nothing left to show are dropped.
    pub fn reset_interval(&mut self) {
        if let Some((start, _, now)) = self.counters {
            self.counters = Some((start, now, now));
        }
        for seen in self.seen.values_mut() {
            seen.interval = LinkTotals::default();
        }
        self.links.retain(|_, s| {
            s.time_wait > 0
                || s.opens.interval + s.closes.interval + s.new_time_wait.interval > 0
                || s.opens.total > 0
        });
        for s in self.links.values_mut() {
            for c in [
                &mut s.opens,
                &mut s.closes,
                &mut s.aborts,
                &mut s.new_time_wait,
            ] {
                c.interval = 0;
            }
        }
    }

    /// Remembered kernel links, link texts and roles: bounded by the links
    /// the kernel counts and the processes owning them.
    pub fn remembered(&self) -> usize {
        self.seen.len() + self.peers.len() + self.roles.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: u32 = 10;
    const SERVER: u32 = 20;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn active(owner: u32, remote: &str) -> KernelLink {
        KernelLink {
            owner,
            peer: Peer {
                side: Side::Active,
                addr: addr(remote),
                peer_ip: None,
                netns: None,
            },
        }
    }

    fn passive(owner: u32, local: &str, remote_ip: &str) -> KernelLink {
        KernelLink {
            owner,
            peer: Peer {
                side: Side::Passive,
                addr: addr(local),
                peer_ip: Some(remote_ip.parse().unwrap()),
                netns: None,
            },
        }
    }

    fn totals(opens: u64, closes: u64, aborts: u64, new_time_wait: u64) -> LinkTotals {
        LinkTotals {
            opens,
            closes,
            aborts,
            new_time_wait,
        }
    }

    fn roles() -> HashMap<u32, String> {
        HashMap::from([(CLIENT, "client".into()), (SERVER, "server".into())])
    }

    /// A read of the kernel's totals, with a walk finding `time_wait`.
    fn read(
        links: Vec<(KernelLink, LinkTotals)>,
        time_wait: Option<Vec<(KernelLink, u64)>>,
    ) -> SocketSnapshot {
        SocketSnapshot {
            links,
            walk: time_wait.map(|time_wait| Walk {
                time_wait,
                ..Walk::default()
            }),
            roles: roles(),
            ..SocketSnapshot::default()
        }
    }

    fn row<'a>(t: &'a LinkTable, owner: Option<&str>, peer: &str) -> &'a LinkStats {
        t.iter()
            .find(|(k, _)| k.owner.as_deref() == owner && k.peer == peer)
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("no link {owner:?} {peer}: {:?}", t.links))
    }

    #[test]
    fn time_wait_goes_to_the_process_that_closed_first() {
        let mut t = LinkTable::default();
        // Five connections the client opened and closed first, as the
        // kernel counts them: each end's opens and closes on its own link,
        // the TIME_WAIT on the closer's.
        let client = active(CLIENT, "127.0.0.1:80");
        let server = passive(SERVER, "127.0.0.1:80", "127.0.0.1");
        let links = vec![(client, totals(5, 5, 0, 5)), (server, totals(5, 5, 0, 0))];
        t.observe_snapshot(read(links.clone(), Some(vec![(client, 5)])));
        let c = row(&t, Some("client"), "→ 127.0.0.1:80");
        assert_eq!((c.time_wait, c.new_time_wait.interval), (5, 5));
        assert_eq!((c.opens.total, c.closes.total, c.aborts.total), (5, 5, 0));
        let s = row(&t, Some("server"), "127.0.0.1:80 ← 127.0.0.1");
        assert_eq!((s.time_wait, s.opens.total, s.closes.total), (0, 5, 5));
        // Still there at the next snapshot: not new any more.
        t.reset_interval();
        t.observe_snapshot(read(links, Some(vec![(client, 5)])));
        let c = row(&t, Some("client"), "→ 127.0.0.1:80");
        assert_eq!((c.time_wait, c.new_time_wait.interval), (5, 0));
        assert_eq!(c.new_time_wait.total, 5);
    }

    #[test]
    fn a_links_endpoint_names_the_service_never_the_client() {
        let mut t = LinkTable::default();
        let client = active(CLIENT, "127.0.0.1:80");
        let server = passive(SERVER, "127.0.0.2:80", "127.0.0.3");
        let mut in_netns = active(CLIENT, "[::1]:5432");
        in_netns.peer.netns = Some(4026532301);
        let links = vec![
            (client, totals(1, 0, 0, 0)),
            (server, totals(1, 0, 0, 0)),
            (in_netns, totals(1, 0, 0, 0)),
        ];
        t.observe_snapshot(read(links, None));
        let endpoints: Vec<(&str, &str)> = t
            .iter()
            .map(|(k, _)| (k.peer.as_str(), k.endpoint.as_str()))
            .collect();
        assert_eq!(
            endpoints,
            [
                ("→ 127.0.0.1:80", "127.0.0.1:80"),
                (
                    "→ [::1]:5432 in net:[4026532301]",
                    "[::1]:5432 in net:[4026532301]"
                ),
                ("127.0.0.2:80 ← 127.0.0.3", "127.0.0.2:80"),
            ]
        );
    }

    #[test]
    fn only_what_grew_since_the_last_read_counts() {
        let mut t = LinkTable::default();
        let c = active(CLIENT, "127.0.0.1:80");
        t.observe_snapshot(read(vec![(c, totals(3, 1, 0, 1))], None));
        t.reset_interval();
        t.observe_snapshot(read(vec![(c, totals(7, 4, 1, 2))], None));
        let r = row(&t, Some("client"), "→ 127.0.0.1:80");
        assert_eq!((r.opens.interval, r.opens.total), (4, 7));
        assert_eq!((r.closes.interval, r.aborts.interval), (3, 1));
        assert_eq!((r.new_time_wait.interval, r.new_time_wait.total), (1, 2));
        // Forgotten in the kernel, then counting from 0 again: all of it is new.
        t.observe_snapshot(read(vec![], None));
        t.observe_snapshot(read(vec![(c, totals(2, 0, 0, 0))], None));
        assert_eq!(row(&t, Some("client"), "→ 127.0.0.1:80").opens.total, 9);
        // Without a walk, TIME_WAIT now stays as the last walk found it.
        t.observe_snapshot(read(vec![(c, totals(2, 0, 0, 0))], Some(vec![(c, 4)])));
        t.observe_snapshot(read(vec![(c, totals(2, 0, 0, 0))], None));
        assert_eq!(row(&t, Some("client"), "→ 127.0.0.1:80").time_wait, 4);
    }

    #[test]
    fn a_server_that_closes_first_owns_the_time_wait() {
        let mut t = LinkTable::default();
        let server = passive(SERVER, "127.0.0.1:80", "127.0.0.1");
        let links = vec![
            (active(CLIENT, "127.0.0.1:80"), totals(3, 3, 0, 0)),
            (server, totals(3, 3, 0, 3)),
        ];
        t.observe_snapshot(read(links, Some(vec![(server, 3)])));
        let s = row(&t, Some("server"), "127.0.0.1:80 ← 127.0.0.1");
        assert_eq!((s.time_wait, s.new_time_wait.total), (3, 3));
        assert_eq!(row(&t, Some("client"), "→ 127.0.0.1:80").time_wait, 0);
    }

    #[test]
    fn unknown_closers_are_unknown() {
        let mut t = LinkTable::default();
        t.observe_snapshot(read(
            vec![],
            Some(vec![
                (passive(0, "127.0.0.1:80", "127.0.0.1"), 1),
                (active(0, "127.0.0.1:80"), 1),
                (active(0, "10.0.0.1:80"), 1),
            ]),
        ));
        assert_eq!(row(&t, None, "127.0.0.1:80 ← 127.0.0.1").time_wait, 1);
        assert_eq!(row(&t, None, "→ 127.0.0.1:80").time_wait, 1);
        assert_eq!(row(&t, None, "→ 10.0.0.1:80").time_wait, 1);
        assert_eq!(t.iter().count(), 3);
    }

    #[test]
    fn an_exited_owner_keeps_its_role_and_its_quiet_links_are_forgotten() {
        let mut t = LinkTable::default();
        let child = 30;
        // The child exited before the read: its role was remembered then.
        t.remember_role(child, "server child".into());
        let link = active(child, "127.0.0.1:5432");
        t.observe_snapshot(read(vec![(link, totals(1, 1, 0, 1))], None));
        assert_eq!(
            row(&t, Some("server child"), "→ 127.0.0.1:5432")
                .closes
                .total,
            1
        );
        // Quiet for QUIET_READS reads and its owner gone: forgettable.
        let alive = |pid| pid == CLIENT;
        assert!(t.forgettable(alive).is_empty());
        for _ in 0..QUIET_READS {
            t.observe_snapshot(read(vec![(link, totals(1, 1, 0, 1))], None));
        }
        assert_eq!(t.forgettable(alive), vec![link]);
        // Not while it keeps counting, nor while its owner lives.
        let live = active(CLIENT, "127.0.0.1:5432");
        for _ in 0..3 {
            t.observe_snapshot(read(vec![(live, totals(1, 0, 0, 0))], None));
        }
        assert!(t.forgettable(alive).is_empty());
        // An owner never seen is named by its pid.
        t.observe_snapshot(read(
            vec![(active(99, "127.0.0.1:1"), totals(1, 0, 0, 0))],
            None,
        ));
        assert_eq!(row(&t, Some("[99]"), "→ 127.0.0.1:1").opens.total, 1);
    }

    #[test]
    fn past_the_bound_unused_role_names_go_and_a_remembered_owner_keeps_its_own() {
        let mut t = LinkTable::default();
        // Processes of more distinct roles than the bound exit; one, pid
        // 100000, is still counting on a link when the others' roles age out.
        const FIRST: u32 = 100_000;
        for pid in FIRST..FIRST + MAX_ROLE_NAMES as u32 + 10 {
            t.remember_role(pid, format!("role {pid}"));
        }
        let link = active(FIRST, "127.0.0.1:5432");
        for n in 1..=ROLE_MEMORY {
            t.observe_snapshot(read(vec![(link, totals(n, 0, 0, 0))], None));
        }
        // All in use at the first read, when the bound was passed: the
        // next one is twice as many, and the names aged out stay till then.
        let first_read = MAX_ROLE_NAMES + 10 + roles().len();
        assert_eq!(t.role_names.names.len(), first_read);
        for pid in 2 * FIRST..2 * FIRST + first_read as u32 + 1 {
            t.remember_role(pid, format!("role {pid}"));
        }
        let next = ROLE_MEMORY + 1;
        t.observe_snapshot(read(vec![(link, totals(next, 0, 0, 0))], None));
        let in_use: std::collections::HashSet<u32> = t.roles.values().map(|(id, _)| *id).collect();
        assert_eq!(
            t.role_names.names.len(),
            in_use.len(),
            "unused names let go"
        );
        // pid FIRST's, the second batch's and the live processes'.
        assert_eq!(in_use.len(), 1 + first_read + 1 + roles().len());
        // The link's owner is still named by its role, and a name let go
        // is interned anew when it returns.
        t.remember_role(FIRST + 1, "role 100001".into());
        t.observe_snapshot(read(
            vec![
                (link, totals(next + 1, 0, 0, 0)),
                (active(FIRST + 1, "127.0.0.1:1"), totals(1, 0, 0, 0)),
            ],
            None,
        ));
        assert_eq!(
            row(&t, Some("role 100000"), "→ 127.0.0.1:5432").opens.total,
            next + 1
        );
        assert_eq!(row(&t, Some("role 100001"), "→ 127.0.0.1:1").opens.total, 1);
    }

    #[test]
    fn each_link_is_formatted_once() {
        let mut t = LinkTable::default();
        let c = active(CLIENT, "[::1]:443");
        for n in 1..=5 {
            t.observe_snapshot(read(vec![(c, totals(n, 0, 0, 0))], None));
        }
        assert_eq!(t.peers.len(), 1);
        assert_eq!(t.peers[&c.peer].peer, "→ [::1]:443");
        assert_eq!(row(&t, Some("client"), "→ [::1]:443").opens.total, 5);
    }

    #[test]
    fn kernel_counters_per_interval_and_since_the_start() {
        let mut t = LinkTable::default();
        let at = |n| KernelCounters {
            listen_overflows: n,
            listen_drops: n,
            time_wait_overflows: 0,
        };
        t.set_counters(at(100));
        t.set_counters(at(105));
        let (start, interval, now) = t.counters.unwrap();
        assert_eq!(now.since(&start).listen_overflows, 5);
        assert_eq!(now.since(&interval).listen_overflows, 5);
        t.reset_interval();
        t.set_counters(at(107));
        let (start, interval, now) = t.counters.unwrap();
        assert_eq!(now.since(&interval).listen_overflows, 2);
        assert_eq!(now.since(&start).listen_overflows, 7);
    }

    #[test]
    fn resets_are_aborts_and_memory_follows_kernel_links() {
        let mut t = LinkTable::default();
        let c = active(CLIENT, "127.0.0.1:81");
        t.observe_snapshot(read(vec![(c, totals(1, 1, 1, 0))], None));
        let r = row(&t, Some("client"), "→ 127.0.0.1:81");
        assert_eq!((r.opens.total, r.closes.total, r.aborts.total), (1, 1, 1));
        // Once the kernel forgot the link and the owners' roles aged out,
        // nothing of it is kept but its text.
        for _ in 0..ROLE_MEMORY {
            t.observe_snapshot(SocketSnapshot::default());
        }
        assert_eq!(t.remembered(), 1);
    }

    #[test]
    fn a_process_whose_role_settles_takes_its_links_along() {
        let mut t = LinkTable::default();
        let server = passive(SERVER, "127.0.0.1:80", "127.0.0.1");
        let other = passive(SERVER + 1, "127.0.0.1:80", "127.0.0.1");
        let as_role = |links, role: &str| SocketSnapshot {
            links,
            roles: HashMap::from([(SERVER, role.into()), (SERVER + 1, "srv master".into())]),
            ..SocketSnapshot::default()
        };
        // A server counted before its first fork of its own name…
        t.observe_snapshot(as_role(
            vec![(server, totals(3, 2, 0, 0)), (other, totals(4, 4, 0, 0))],
            "srv",
        ));
        t.reset_interval();
        t.observe_snapshot(as_role(
            vec![(server, totals(5, 4, 1, 0)), (other, totals(4, 4, 0, 0))],
            "srv",
        ));
        // …then a master, with another master already on the same link.
        t.observe_snapshot(as_role(
            vec![(server, totals(6, 6, 1, 0)), (other, totals(4, 4, 0, 0))],
            "srv master",
        ));
        let owners: Vec<_> = t.iter().map(|(k, _)| k.owner.clone()).collect();
        assert_eq!(owners, [Some("srv master".to_string())], "one row");
        let r = row(&t, Some("srv master"), "127.0.0.1:80 ← 127.0.0.1");
        assert_eq!((r.opens.total, r.closes.total, r.aborts.total), (10, 10, 1));
        // This interval: 2 + 1 opens of the server's, none of the other's.
        assert_eq!((r.opens.interval, r.closes.interval), (3, 4));
        // Retiring under the same role moves nothing.
        t.remember_role(SERVER, "srv master".into());
        assert_eq!(
            row(&t, Some("srv master"), "127.0.0.1:80 ← 127.0.0.1")
                .opens
                .total,
            10
        );
    }
}
