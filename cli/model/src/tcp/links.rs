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

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::{
    counts::{LinkStats, LinkTotals},
    key::{KernelLink, LinkKey, Peer, PeerText},
    lost::ListenerLost,
    role_names::RoleNames,
    snapshot::{KernelCounters, Listener, SocketSnapshot, Unwalked},
    sockets::TcpState,
};

#[cfg(test)]
mod tests;

/// At most this many link rows; further links merge into one per process.
pub const MAX_LINKS: usize = 4096;

/// A process's role is remembered this many reads after its last link
/// counted: a close may reach TIME_WAIT well after its closer exited.
const ROLE_MEMORY: u64 = 64;

/// A kernel link whose owner exited is forgotten (in the kernel too) after
/// this many reads without a change.
const QUIET_READS: u32 = 2;

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
    /// Every listener's drops since the start, from the walks.
    listen_lost: ListenerLost,
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

impl LinkTable {
    /// Takes in a look at the kernel: what each link gained since the last
    /// one and, with a walk, the watched listeners and their backlogs and
    /// TIME_WAIT sockets per link; the kernel's counters.
    pub fn observe_snapshot(&mut self, snapshot: SocketSnapshot) {
        self.reads += 1;
        for (pid, role) in snapshot.roles {
            self.set_role(pid, &role);
        }
        self.add_totals(&snapshot.links);
        if let Some(walk) = snapshot.walk {
            self.listen_lost
                .observe(&walk.namespaces, &walk.listen_drops);
            let lost = &self.listen_lost;
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
                        lost: lost.get((s.netns, s.ino)).unwrap_or_default(),
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
    pub fn remember_role(&mut self, pid: u32, role: &str) {
        self.set_role(pid, role);
    }

    /// Names `pid`'s links by `role` from now on. A process whose role
    /// changed (a server's first fork of its own name makes it a master; a
    /// php-fpm worker names its pool after its fork) takes what its links
    /// counted so far along, so one process never leaves rows under two
    /// roles.
    fn set_role(&mut self, pid: u32, role: &str) {
        let id = self.role_names.id(role);
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
                owner: Some(role.to_string()),
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
        self.listen_lost.reset_interval();
        for l in &mut self.listening {
            l.lost.interval = 0;
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
    #[cfg(test)]
    pub fn remembered(&self) -> usize {
        self.seen.len() + self.peers.len() + self.roles.len()
    }
}
