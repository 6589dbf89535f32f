//! Connections of watched processes, grouped into links (the owner's role and
//! the service on the other end): opens, closes, aborts, and TIME_WAIT
//! sockets now and new, attributed to the process that closed first.
//!
//! State changes come from the `tcp_state` probe; TIME_WAIT sockets (which
//! that probe never sees) from the TCP iterator's snapshots, joined by
//! 4-tuple to the process whose close put the socket into FIN_WAIT1. A
//! TIME_WAIT socket whose closer is unknown (it closed before stackprobe
//! started, or an unwatched process closed it) is counted as unknown on its
//! watched listener's link (either end, when both are on this host), and
//! never guessed.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
};

use rustc_hash::{FxHashMap, FxHashSet};

use super::{
    counter::Counter,
    event::TcpStateSample,
    sockets::{TcpSock, TcpState},
};

/// At most this many link rows; further links merge into one per process.
pub const MAX_LINKS: usize = 4096;

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
}

impl LinkKey {
    fn new(owner: Owner, side: Side, local: SocketAddr, remote: SocketAddr) -> Self {
        let peer = match side {
            Side::Active => format!("→ {remote}"),
            Side::Passive => format!("{local} ← {}", remote.ip()),
        };
        Self { owner, side, peer }
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
    /// TIME_WAIT sockets that appeared since the previous snapshot.
    pub new_time_wait: Counter,
}

/// Keyed by 4-tuple in hash maps with a fast hasher: a snapshot hashes every
/// TIME_WAIT socket on the machine (tens of thousands under load), and
/// SipHash was a tenth of stackprobe's CPU there.
type Tuple = (SocketAddr, SocketAddr);

/// A listening socket of a watched process, from the last snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listener {
    pub owner: u32,
    pub local: SocketAddr,
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

#[derive(Clone, Debug, Default)]
pub struct LinkTable {
    links: BTreeMap<LinkKey, LinkStats>,
    /// Sockets' sides and owners' roles, learned when they opened (and
    /// dropped when they close): a socket stays on its link even after its
    /// owner exits.
    sides: FxHashMap<Tuple, (Side, String)>,
    /// Who closed first, by 4-tuple: kept while the socket may be or is in
    /// TIME_WAIT. The snapshot number it was learned in, to expire it.
    closers: FxHashMap<Tuple, (String, Side, u64)>,
    /// Attributed TIME_WAIT sockets in the last snapshot.
    time_wait: FxHashSet<Tuple>,
    snapshots: u64,
    /// Watched listeners: port → owner.
    listeners: HashMap<u16, u32>,
    /// Watched processes' listening sockets, from the last snapshot.
    listening: Vec<Listener>,
    /// Kernel counters at the start, at the start of the interval, and now.
    counters: Option<(KernelCounters, KernelCounters, KernelCounters)>,
    /// Ephemeral ports (ip_local_port_range), when readable.
    ephemeral_ports: Option<u32>,
    /// Sockets in the last snapshot, and how long taking it took (iterator,
    /// /proc scans and bookkeeping), in µs.
    last_snapshot: (usize, u64),
}

/// What one look at the machine's TCP sockets found: every socket, which
/// watched process owns each listening port, and the machine's counters.
#[derive(Clone, Debug, Default)]
pub struct SocketSnapshot {
    pub sockets: Vec<TcpSock>,
    /// Listening port → the watched process that owns the socket.
    pub owners: HashMap<u16, u32>,
    pub counters: KernelCounters,
    /// Ephemeral ports (ip_local_port_range), when readable.
    pub ephemeral_ports: Option<u32>,
    /// How long taking the snapshot took, in µs.
    pub took_us: u64,
}

fn is_abort(old: TcpState, new: TcpState) -> bool {
    use TcpState::*;
    new == Close && matches!(old, Established | SynSent | SynRecv | CloseWait | FinWait1)
}

impl LinkTable {
    /// Takes in a snapshot: the watched listeners and their backlogs,
    /// TIME_WAIT sockets per link, the kernel's counters.
    pub fn observe_snapshot(&mut self, snapshot: SocketSnapshot) {
        self.listening = snapshot
            .sockets
            .iter()
            .filter(|s| s.state == TcpState::Listen)
            .filter_map(|s| {
                Some(Listener {
                    owner: *snapshot.owners.get(&s.local.port())?,
                    local: s.local,
                    backlog: s.backlog,
                    max_backlog: s.max_backlog,
                })
            })
            .collect();
        self.set_listeners(snapshot.owners);
        self.observe(&snapshot.sockets);
        self.set_counters(snapshot.counters);
        self.ephemeral_ports = snapshot.ephemeral_ports;
        self.last_snapshot = (snapshot.sockets.len(), snapshot.took_us);
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

    /// Watched processes' listening ports (their connections are passive).
    fn set_listeners(&mut self, listeners: HashMap<u16, u32>) {
        self.listeners = listeners;
    }

    fn side_of(&self, owner: u32, local: SocketAddr) -> Side {
        match self.listeners.get(&local.port()) {
            Some(&p) if p == owner => Side::Passive,
            _ => Side::Active,
        }
    }

    fn stats(&mut self, key: LinkKey) -> &mut LinkStats {
        let key = if self.links.len() >= MAX_LINKS && !self.links.contains_key(&key) {
            LinkKey {
                owner: key.owner,
                side: key.side,
                peer: "(other links)".into(),
            }
        } else {
            key
        };
        self.links.entry(key).or_default()
    }

    /// Records a state change of a socket owned by `s.owner`, whose role is
    /// `owner`.
    pub fn record_state(&mut self, s: &TcpStateSample, owner: &str) {
        use TcpState::*;
        let tuple = (s.local, s.remote);
        if s.new == Listen || s.old == Listen {
            return;
        }
        // Learn the side at the open; a socket seen first mid-life gets it
        // from whether its port is one of its owner's listeners.
        let (side, link_owner) = match (s.old, s.new) {
            (Close, SynSent) | (SynSent, Established) => (Side::Active, owner.to_string()),
            (SynRecv, Established) => (Side::Passive, owner.to_string()),
            _ => self
                .sides
                .get(&tuple)
                .cloned()
                .unwrap_or_else(|| (self.side_of(s.owner, s.local), owner.to_string())),
        };
        let key = LinkKey::new(Some(link_owner.clone()), side, s.local, s.remote);
        match (s.old, s.new) {
            // connect(): the local port is not chosen yet (the record says
            // 0), so the socket is remembered once it is established.
            (Close, SynSent) => self.stats(key).opens.bump(),
            (SynSent, Established) => {
                self.sides.insert(tuple, (side, link_owner));
            }
            (SynRecv, Established) => {
                self.sides.insert(tuple, (side, link_owner));
                self.stats(key).opens.bump();
            }
            // The owner closed first: its socket will be in TIME_WAIT.
            // The owner's own close: TIME_WAIT will be on this side, and
            // belongs to the process that closed (a forking server's child),
            // whoever opened it.
            (_, FinWait1) if s.by_owner => {
                self.closers
                    .insert(tuple, (owner.to_string(), side, self.snapshots));
            }
            (old, Close) => {
                self.sides.remove(&tuple);
                let stats = self.stats(key);
                stats.closes.bump();
                if is_abort(old, Close) {
                    stats.aborts.bump();
                }
            }
            _ => {}
        }
    }

    /// Counts TIME_WAIT sockets per link in a snapshot of every TCP socket,
    /// now and new since the last snapshot.
    fn observe(&mut self, sockets: &[TcpSock]) {
        self.snapshots += 1;
        let now: FxHashSet<Tuple> = sockets
            .iter()
            .filter(|s| s.state == TcpState::TimeWait)
            .map(|s| (s.local, s.remote))
            .collect();
        for stats in self.links.values_mut() {
            stats.time_wait = 0;
        }
        // Attributed TIME_WAIT sockets: a socket counts as new once, under
        // its closer, even if its close event arrived after the snapshot that
        // first showed it (it is then unknown for one snapshot).
        let mut attributed = FxHashSet::default();
        for &tuple in &now {
            let key = match self.closers.get(&tuple) {
                Some((owner, side, _)) => {
                    attributed.insert(tuple);
                    LinkKey::new(Some(owner.clone()), *side, tuple.0, tuple.1)
                }
                // Not known to be ours unless a watched listener's port.
                None if self.listeners.contains_key(&tuple.0.port()) => {
                    LinkKey::new(None, Side::Passive, tuple.0, tuple.1)
                }
                // Or a connection to a watched listener on this host (the
                // remote end is this machine: loopback, or our own address).
                None if self.listeners.contains_key(&tuple.1.port())
                    && (tuple.1.ip().is_loopback() || tuple.1.ip() == tuple.0.ip()) =>
                {
                    LinkKey::new(None, Side::Active, tuple.0, tuple.1)
                }
                None => continue,
            };
            let fresh = key.owner.is_some() && !self.time_wait.contains(&tuple);
            let stats = self.stats(key);
            stats.time_wait += 1;
            if fresh {
                stats.new_time_wait.bump();
            }
        }
        // A closer is kept while its socket is in TIME_WAIT, or for one more
        // snapshot while it may still be in FIN_WAIT.
        let snapshots = self.snapshots;
        self.closers
            .retain(|tuple, (_, _, seen)| now.contains(tuple) || *seen + 1 >= snapshots);
        self.time_wait = attributed;
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

    /// Remembered tuples (sides and closers): bounded by live connections and
    /// TIME_WAIT sockets.
    pub fn remembered(&self) -> usize {
        self.sides.len() + self.closers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: u32 = 10;
    const SERVER: u32 = 20;

    fn label(owner: u32) -> &'static str {
        if owner == CLIENT { "client" } else { "server" }
    }

    fn record(t: &mut LinkTable, s: TcpStateSample) {
        let owner = label(s.owner);
        t.record_state(&s, owner);
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn change(
        owner: u32,
        old: TcpState,
        new: TcpState,
        by_owner: bool,
        local: &str,
        remote: &str,
    ) -> TcpStateSample {
        TcpStateSample {
            owner,
            comm: None,
            old,
            new,
            by_owner,
            local: addr(local),
            remote: addr(remote),
            ts_ns: 0,
        }
    }

    fn time_wait(local: &str, remote: &str) -> TcpSock {
        TcpSock {
            state: TcpState::TimeWait,
            local: addr(local),
            remote: addr(remote),
            ino: 0,
            backlog: 0,
            max_backlog: 0,
        }
    }

    /// A connection from the client's port `p` to the server's :80, its
    /// open seen on both sides, closed first by `closer`.
    fn connection(t: &mut LinkTable, p: u16, closer: u32) {
        use TcpState::*;
        let (c, s) = (format!("127.0.0.1:{p}"), "127.0.0.1:80".to_string());
        // As the kernel reports it: connect() has not picked the port yet.
        record(t, change(CLIENT, Close, SynSent, true, "127.0.0.1:0", &s));
        record(t, change(CLIENT, SynSent, Established, false, &c, &s));
        record(t, change(SERVER, SynRecv, Established, false, &s, &c));
        let (first, first_local, first_remote, other, other_local, other_remote) =
            if closer == CLIENT {
                (CLIENT, &c, &s, SERVER, &s, &c)
            } else {
                (SERVER, &s, &c, CLIENT, &c, &s)
            };
        record(
            t,
            change(
                first,
                Established,
                FinWait1,
                true,
                first_local,
                first_remote,
            ),
        );
        record(
            t,
            change(first, FinWait1, FinWait2, false, first_local, first_remote),
        );
        record(
            t,
            change(
                other,
                Established,
                CloseWait,
                false,
                other_local,
                other_remote,
            ),
        );
        record(
            t,
            change(other, CloseWait, LastAck, true, other_local, other_remote),
        );
        record(
            t,
            change(other, LastAck, Close, false, other_local, other_remote),
        );
        record(
            t,
            change(first, FinWait2, Close, false, first_local, first_remote),
        );
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
        t.set_listeners(HashMap::from([(80, SERVER)]));
        for p in 40000..40005 {
            connection(&mut t, p, CLIENT);
        }
        let snapshot: Vec<TcpSock> = (40000..40005)
            .map(|p| time_wait(&format!("127.0.0.1:{p}"), "127.0.0.1:80"))
            .collect();
        t.observe(&snapshot);
        let client = row(&t, Some("client"), "→ 127.0.0.1:80");
        assert_eq!((client.time_wait, client.new_time_wait.interval), (5, 5));
        assert_eq!(
            (client.opens.total, client.closes.total, client.aborts.total),
            (5, 5, 0)
        );
        let server = row(&t, Some("server"), "127.0.0.1:80 ← 127.0.0.1");
        assert_eq!(
            (server.time_wait, server.opens.total, server.closes.total),
            (0, 5, 5)
        );
        // Still there at the next snapshot: not new any more.
        t.reset_interval();
        t.observe(&snapshot);
        assert_eq!(
            row(&t, Some("client"), "→ 127.0.0.1:80")
                .new_time_wait
                .interval,
            0
        );
        assert_eq!(row(&t, Some("client"), "→ 127.0.0.1:80").time_wait, 5);
    }

    #[test]
    fn a_server_that_closes_first_owns_the_time_wait() {
        let mut t = LinkTable::default();
        t.set_listeners(HashMap::from([(80, SERVER)]));
        for p in 41000..41003 {
            connection(&mut t, p, SERVER);
        }
        let snapshot: Vec<TcpSock> = (41000..41003)
            .map(|p| time_wait("127.0.0.1:80", &format!("127.0.0.1:{p}")))
            .collect();
        t.observe(&snapshot);
        assert_eq!(
            row(&t, Some("server"), "127.0.0.1:80 ← 127.0.0.1").time_wait,
            3
        );
        assert_eq!(row(&t, Some("client"), "→ 127.0.0.1:80").time_wait, 0);
    }

    #[test]
    fn a_close_seen_after_the_snapshot_still_counts_once_as_new() {
        use TcpState::*;
        let mut t = LinkTable::default();
        t.set_listeners(HashMap::from([(80, SERVER)]));
        let tw = [time_wait("127.0.0.1:80", "127.0.0.1:5000")];
        // The snapshot sees the TIME_WAIT socket before its close event.
        t.observe(&tw);
        assert_eq!(
            row(&t, None, "127.0.0.1:80 ← 127.0.0.1")
                .new_time_wait
                .total,
            0
        );
        record(
            &mut t,
            change(
                SERVER,
                Established,
                FinWait1,
                true,
                "127.0.0.1:80",
                "127.0.0.1:5000",
            ),
        );
        t.observe(&tw);
        t.observe(&tw);
        let server = row(&t, Some("server"), "127.0.0.1:80 ← 127.0.0.1");
        assert_eq!((server.time_wait, server.new_time_wait.total), (1, 1));
    }

    #[test]
    fn unknown_closers_are_unknown_and_unrelated_sockets_ignored() {
        let mut t = LinkTable::default();
        t.set_listeners(HashMap::from([(80, SERVER)]));
        t.observe(&[
            time_wait("127.0.0.1:80", "127.0.0.1:5000"),
            time_wait("127.0.0.1:5001", "127.0.0.1:80"),
            time_wait("10.0.0.1:5002", "10.0.0.1:80"),
            time_wait("10.0.0.1:9999", "10.0.0.2:1234"),
            // Port 80 on another host is not our listener.
            time_wait("10.0.0.1:5003", "10.0.0.2:80"),
        ]);
        let unknown = row(&t, None, "127.0.0.1:80 ← 127.0.0.1");
        assert_eq!(unknown.time_wait, 1);
        assert_eq!(row(&t, None, "→ 127.0.0.1:80").time_wait, 1);
        assert_eq!(row(&t, None, "→ 10.0.0.1:80").time_wait, 1);
        assert_eq!(t.iter().count(), 3);
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
    fn resets_are_aborts_and_memory_follows_live_sockets() {
        use TcpState::*;
        let mut t = LinkTable::default();
        record(
            &mut t,
            change(
                CLIENT,
                Close,
                SynSent,
                true,
                "127.0.0.1:42000",
                "127.0.0.1:81",
            ),
        );
        record(
            &mut t,
            change(
                CLIENT,
                SynSent,
                Close,
                false,
                "127.0.0.1:42000",
                "127.0.0.1:81",
            ),
        );
        let r = row(&t, Some("client"), "→ 127.0.0.1:81");
        assert_eq!((r.opens.total, r.closes.total, r.aborts.total), (1, 1, 1));
        assert_eq!(t.remembered(), 0);
        // Closers expire once their sockets leave TIME_WAIT.
        for p in 43000..43100 {
            connection(&mut t, p, CLIENT);
        }
        t.observe(&[]);
        t.observe(&[]);
        assert_eq!(t.remembered(), 0);
    }
}
