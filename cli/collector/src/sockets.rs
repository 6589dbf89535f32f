//! One look at the machine's TCP connections: the links' counts the kernel
//! keeps, a walk of every socket (listeners, which watched process owns
//! each listening socket by inode as `ss -p` finds it, and TIME_WAIT
//! sockets per link counted by the iterator), and the kernel's TCP
//! counters. Owners are told to the kernel, which needs them to attribute
//! connections whose handshake completes in softirq.
//!
//! Owners are cached by inode: /proc/PID/fd is read only for a listening
//! socket not seen before (every watched process), or, for one no watched
//! process held, for processes new to the watch set that are no copy of a
//! parent read before (fds.rs).

use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

use anyhow::Result;

use super::{busy::probes_clock_ns, fds, proc_file::ProcFile};
use stackprobe_model::{
    process::ProcessTable,
    tcp::{
        snapshot::{KernelCounters, SocketSnapshot, Walk},
        sockets::{Netns, TcpSock, TcpState},
    },
};
use stackprobe_probes::procfs;
use stackprobe_probes::{Probes, decode};

/// A walk is due once this many times its own cost has passed since the
/// last one, which keeps walking under 0.05 % of a core however many
/// sockets there are (a walk of 10k sockets takes ~10 ms here, so one each
/// 20 s). A TIME_WAIT socket lives 60 s, so the count changes slowly; new
/// TIME_WAIT is counted exactly from the state changes between walks, and
/// the count's age is shown with it.
const WALK_BUDGET: u32 = 2000;
/// The oldest a TIME_WAIT count gets, however costly a walk: half a
/// TIME_WAIT socket's life. (At 15 s, the walks of new.php's 17k sockets,
/// 30 ms of CPU each, were half of stackprobe's CPU there.)
const MAX_WALK_PERIOD: Duration = Duration::from_secs(30);

/// When the sockets were last walked, what that walk cost, and whether
/// anything a walk counts could have changed since.
#[derive(Debug, Default)]
pub struct Walks {
    generation: u32,
    last: Option<(Instant, Duration)>,
    /// Ring events, histogram gains or a change of the watch set since the
    /// last walk.
    stirred: bool,
    /// TIME_WAIT sockets on watched links at the last walk: while any,
    /// their expiry (which no hook sees) changes the count.
    time_wait: u64,
    /// The sum of every link's counts at the last walk.
    link_counts: u64,
    /// When the last walk's counts were last known to be current: the walk,
    /// or a later look at which nothing could have changed them.
    current_at: Option<Instant>,
}

impl Walks {
    /// Whether what the last walk counted for watched processes is still
    /// exact with the links' counts now at `link_counts`: nothing was
    /// stirred, no link counted an open, close or new TIME_WAIT (a
    /// connection arriving at or accepted from a listener, which changes
    /// its backlog, is one or stirs the histograms), and no TIME_WAIT
    /// socket of ours was left to expire.
    fn unchanged(&self, link_counts: u64) -> bool {
        self.last.is_some()
            && !self.stirred
            && self.time_wait == 0
            && link_counts == self.link_counts
    }

    /// Whether a look at `now` walks the sockets: always when `forced` or
    /// never walked, else once the budget allows, and while `unchanged`
    /// only when the last walk is as old as the cap (a listening socket
    /// handed over without a syscall we see, say).
    fn due(&self, forced: bool, unchanged: bool, now: Instant) -> bool {
        match self.last {
            None => true,
            Some(_) if forced => true,
            Some((at, cost)) => {
                let since = now.saturating_duration_since(at);
                since >= MAX_WALK_PERIOD || (!unchanged && since >= cost * WALK_BUDGET)
            }
        }
    }

    fn walked(&mut self, at: Instant, cost: Duration, time_wait: u64, link_counts: u64) {
        self.last = Some((at, cost));
        self.stirred = false;
        self.time_wait = time_wait;
        self.link_counts = link_counts;
        self.current_at = Some(at);
    }

    /// Nothing could have changed the last walk's counts by `at`.
    fn still_current(&mut self, at: Instant) {
        self.current_at = Some(at);
    }

    /// How old the walk's counts are at `now`.
    fn age(&self, now: Instant) -> Duration {
        self.current_at
            .map_or(Duration::ZERO, |at| now.saturating_duration_since(at))
    }
}

/// The /proc files each look reads.
struct Files {
    netstat: ProcFile,
    port_range: ProcFile,
}

impl Default for Files {
    fn default() -> Self {
        Self {
            netstat: ProcFile::new("/proc/net/netstat"),
            port_range: ProcFile::new("/proc/sys/net/ipv4/ip_local_port_range"),
        }
    }
}

impl Files {
    /// The TcpExt counters of /proc/net/netstat named in `names` (as
    /// `procfs::tcp_ext_counters`), None where absent.
    fn tcp_ext_counters<const N: usize>(&mut self, names: [&str; N]) -> [Option<u64>; N] {
        let mut out = [None; N];
        if let Some(text) = self.netstat.read() {
            for (name, value) in procfs::net_section(text, "TcpExt:") {
                if let Some(i) = names.iter().position(|n| *n == name) {
                    out[i] = value.parse().ok();
                }
            }
        }
        out
    }

    /// `net.ipv4.ip_local_port_range` (as `procfs::local_port_range`).
    fn local_port_range(&mut self) -> Option<(u16, u16)> {
        let text = self.port_range.read()?;
        let mut it = text.split_whitespace().map(|v| v.parse::<u16>());
        Some((it.next()?.ok()?, it.next()?.ok()?))
    }
}

#[derive(Default)]
pub struct Sockets {
    /// Listening socket inode → the watched process holding it (the lowest
    /// pid: a master and its workers share it), None if none does.
    owner_of: HashMap<u64, Option<u32>>,
    /// Listening socket inode → who the kernel first gives its connections
    /// to: a worker holding it when its parent (the master) holds it too,
    /// since masters hold and workers accept; else the owner. The accept
    /// probe then moves them to whoever really accepts.
    seed_of: HashMap<u64, u32>,
    /// Watched pids whose fds were read for the inodes that are still
    /// unowned (or copied from a parent's), and when.
    scanned: fds::Known,
    /// What the kernel was told: port (in its namespace) → owner.
    told: HashMap<(Netns, u16), u32>,
    /// Watched pid → the network namespace it lives in (read once).
    netns_of: HashMap<u32, Option<u32>>,
    walks: Walks,
    files: Files,
}

impl Sockets {
    /// The links' counts now, and a walk of every socket if `force_walk` or
    /// when due (less often when they are many, and rarely while nothing
    /// watched changes). `stirred`: the watched processes had events or a
    /// change of the watch set since the last look.
    pub fn snapshot(
        &mut self,
        probes: &mut Probes,
        table: &ProcessTable,
        force_walk: bool,
        stirred: bool,
    ) -> Result<SocketSnapshot> {
        let started = Instant::now();
        let links = probes.tcp_links()?;
        self.walks.stirred |= stirred;
        let link_counts = links
            .iter()
            .fold(0u64, |n, (_, t)| n.wrapping_add(t.changes()));
        let unchanged = self.walks.unchanged(link_counts);
        let walk = if self.walks.due(force_walk, unchanged, started) {
            self.walks.generation = self.walks.generation.wrapping_add(1).max(1);
            let elsewhere = self.other_namespaces(table);
            let walked = probes.tcp_walk(self.walks.generation, &elsewhere)?;
            // The iterator's time is what recurs; reading /proc for a new
            // listener's owner happens once.
            let time_wait = walked.time_wait.iter().map(|(_, n)| n).sum();
            self.walks
                .walked(started, started.elapsed(), time_wait, link_counts);
            let owners = self.listen_owners(probes, table, &walked.listeners)?;
            // The namespaces walked: stackprobe's own, and those entered.
            let namespaces = std::iter::once(None)
                .chain(
                    elsewhere
                        .iter()
                        .filter(|(n, _)| !walked.unwalked.iter().any(|u| u.netns == *n))
                        .map(|&(n, _)| decode::netns(n)),
                )
                .collect();
            Some(Walk {
                listeners: walked.listeners,
                owners,
                time_wait: walked.time_wait,
                sockets: walked.sockets,
                unwalked: walked.unwalked,
                listen_drops: walked.listen_drops,
                namespaces,
            })
        } else {
            if unchanged {
                self.walks.still_current(started);
            }
            None
        };
        let mut owners: HashSet<u32> = links.iter().map(|(l, _)| l.owner).collect();
        if let Some(w) = &walk {
            owners.extend(w.time_wait.iter().map(|(l, _)| l.owner));
        }
        let roles = owners
            .into_iter()
            .filter_map(|pid| Some((pid, table.get(pid)?.role())))
            .collect();
        let [listen_overflows, listen_drops, time_wait_overflows] = self
            .files
            .tcp_ext_counters(["ListenOverflows", "ListenDrops", "TCPTimeWaitOverflow"])
            .map(|c| c.unwrap_or(0));
        Ok(SocketSnapshot {
            links,
            walk,
            roles,
            counters: KernelCounters {
                listen_overflows,
                listen_drops,
                time_wait_overflows,
            },
            ephemeral_ports: self
                .files
                .local_port_range()
                .map(|(lo, hi)| u32::from(hi.saturating_sub(lo)) + 1),
            took_us: started.elapsed().as_micros() as u64,
            walk_age: self.walks.age(Instant::now()),
        })
    }

    /// The network namespaces watched processes live in besides
    /// stackprobe's own (a container's): each with a process living there,
    /// which the walk enters it through.
    fn other_namespaces(&mut self, table: &ProcessTable) -> Vec<(u32, u32)> {
        let watched: HashSet<u32> = table.iter().filter(|p| p.watched).map(|p| p.pid).collect();
        self.netns_of.retain(|pid, _| watched.contains(pid));
        let home = decode::home_netns();
        let mut found: HashMap<u32, u32> = HashMap::new();
        for &pid in &watched {
            let netns = *self
                .netns_of
                .entry(pid)
                .or_insert_with(|| procfs::netns(pid));
            if let Some(n) = netns.filter(|&n| n != home) {
                found
                    .entry(n)
                    .and_modify(|p| *p = (*p).min(pid))
                    .or_insert(pid);
            }
        }
        let mut elsewhere: Vec<(u32, u32)> = found.into_iter().collect();
        elsewhere.sort_unstable();
        elsewhere
    }

    /// Which watched process owns each listening port; told to the kernel
    /// when it changes.
    fn listen_owners(
        &mut self,
        probes: &mut Probes,
        table: &ProcessTable,
        listeners: &[TcpSock],
    ) -> Result<HashMap<(Netns, u16), u32>> {
        let listening: HashMap<u64, (Netns, u16)> = listeners
            .iter()
            .filter(|s| s.state == TcpState::Listen && s.ino != 0)
            .map(|s| (s.ino, (s.netns, s.local.port())))
            .collect();
        let mut pids: Vec<u32> = table.iter().filter(|p| p.watched).map(|p| p.pid).collect();
        pids.sort_unstable();
        self.find_owners(
            &listening,
            &pids,
            procfs::socket_inodes,
            |pid| fds::parent(table, pid),
            |pid| fds::forked(table, pid),
            probes_clock_ns,
        );
        let mut owners: HashMap<(Netns, u16), u32> = HashMap::new();
        let mut seeds: HashMap<(Netns, u16), u32> = HashMap::new();
        for (ino, owner) in &self.owner_of {
            if let (Some(pid), Some(&port)) = (owner, listening.get(ino)) {
                owners
                    .entry(port)
                    .and_modify(|p| *p = (*p).min(*pid))
                    .or_insert(*pid);
                let seed = self.seed_of.get(ino).copied().unwrap_or(*pid);
                seeds
                    .entry(port)
                    .and_modify(|p| *p = (*p).min(seed))
                    .or_insert(seed);
            }
        }
        for (&(netns, port), &seed) in &seeds {
            if self.told.get(&(netns, port)) != Some(&seed) {
                probes.set_listen_owner(netns, port, seed)?;
                self.told.insert((netns, port), seed);
            }
        }
        Ok(owners)
    }

    /// Brings `owner_of` up to date for the listening sockets now, reading
    /// as few processes' fds as that needs; `pids` are the watched
    /// processes, lowest first; `forked`, a process's parent and fork time
    /// if it was forked while watched; `clock`, the probes' clock.
    fn find_owners<V>(
        &mut self,
        listening: &HashMap<u64, V>,
        pids: &[u32],
        socket_inodes: impl Fn(u32) -> Vec<u64>,
        parent_of: impl Fn(u32) -> Option<u32>,
        forked: impl Fn(u32) -> Option<(u32, u64)>,
        clock: impl Fn() -> u64,
    ) {
        let watched: HashSet<u32> = pids.iter().copied().collect();
        // Closed sockets go; a socket whose owner left is looked for again.
        self.owner_of.retain(|ino, owner| {
            listening.contains_key(ino) && owner.is_none_or(|pid| watched.contains(&pid))
        });
        let unseen: HashSet<u64> = listening
            .keys()
            .filter(|ino| !self.owner_of.contains_key(ino))
            .copied()
            .collect();
        let unowned: HashSet<u64> = self
            .owner_of
            .iter()
            .filter(|(_, owner)| owner.is_none())
            .map(|(&ino, _)| ino)
            .collect();
        let (wanted, readers): (HashSet<u64>, Vec<u32>) = if !unseen.is_empty() {
            (&unseen | &unowned, pids.to_vec())
        } else {
            let new: Vec<u32> = pids
                .iter()
                .copied()
                .filter(|pid| !self.scanned.contains_key(pid))
                .collect();
            (unowned, new)
        };
        for &ino in &unseen {
            self.owner_of.insert(ino, None);
        }
        let mut holders: HashMap<u64, Vec<u32>> = HashMap::new();
        let mut copied = fds::Known::new();
        if !wanted.is_empty() {
            for pid in readers {
                // A copy of a parent read before holds no listener it did
                // not, so none of the unowned.
                if unseen.is_empty()
                    && let Some(at) = fds::inherited(forked(pid), &self.scanned)
                {
                    copied.insert(pid, at);
                    continue;
                }
                for ino in socket_inodes(pid) {
                    if wanted.contains(&ino)
                        && let Some(owner) = self.owner_of.get_mut(&ino)
                    {
                        *owner = Some(owner.map_or(pid, |o| fds::first_holder(o, pid, &parent_of)));
                        holders.entry(ino).or_default().push(pid);
                    }
                }
            }
        }
        for (ino, pids) in holders {
            let worker = pids
                .iter()
                .copied()
                .filter(|&pid| parent_of(pid).is_some_and(|parent| pids.contains(&parent)))
                .min();
            match worker {
                Some(pid) => self.seed_of.insert(ino, pid),
                None => self.seed_of.remove(&ino),
            };
        }
        let owner_of = &self.owner_of;
        self.seed_of
            .retain(|ino, pid| owner_of.contains_key(ino) && watched.contains(pid));
        // Known now: every pid read, and those whose read would have
        // looked for nothing (no listener was unowned); the others since
        // their last read, or their fork.
        let read_at = clock();
        self.scanned = fds::after_scan(pids, &copied, !unseen.is_empty(), &self.scanned, read_at);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// Processes' socket inodes, and which pids had their fds read.
    struct Fds {
        held: HashMap<u32, Vec<u64>>,
        read: RefCell<Vec<u32>>,
    }

    impl Fds {
        fn new(held: &[(u32, &[u64])]) -> Self {
            Self {
                held: held
                    .iter()
                    .map(|&(pid, inos)| (pid, inos.to_vec()))
                    .collect(),
                read: RefCell::default(),
            }
        }

        fn inodes(&self, pid: u32) -> Vec<u64> {
            self.read.borrow_mut().push(pid);
            self.held.get(&pid).cloned().unwrap_or_default()
        }

        fn taken(&self) -> Vec<u32> {
            std::mem::take(&mut *self.read.borrow_mut())
        }
    }

    fn no_parent(_: u32) -> Option<u32> {
        None
    }

    fn not_forked(_: u32) -> Option<(u32, u64)> {
        None
    }

    fn clock() -> u64 {
        1_000_000_000
    }

    #[test]
    fn a_worker_holding_its_masters_socket_is_told_to_the_kernel_first() {
        let mut s = Sockets::default();
        // nginx: master 10 and workers 11, 12 hold listener 100. postgres:
        // postmaster 20 holds 300 and its backend 21 does not.
        let fds = Fds::new(&[(10, &[100]), (11, &[100]), (12, &[100]), (20, &[300])]);
        let parents = HashMap::from([(11, 10), (12, 10), (21, 20)]);
        let listening = HashMap::from([(100, 80), (300, 5432)]);
        s.find_owners(
            &listening,
            &[10, 11, 12, 20, 21],
            |p| fds.inodes(p),
            |p| parents.get(&p).copied(),
            not_forked,
            clock,
        );
        assert_eq!(s.owner_of[&100], Some(10), "the master holds it");
        assert_eq!(s.seed_of.get(&100), Some(&11), "a worker accepts there");
        assert_eq!(s.owner_of[&300], Some(20));
        assert_eq!(s.seed_of.get(&300), None, "the postmaster accepts itself");
        // The worker leaves: the seed goes with it.
        s.find_owners(
            &listening,
            &[10, 12, 20, 21],
            |p| fds.inodes(p),
            |p| parents.get(&p).copied(),
            not_forked,
            clock,
        );
        assert_eq!(s.seed_of.get(&100), None);
    }

    #[test]
    fn owners_are_cached_and_only_what_changed_is_read() {
        let mut s = Sockets::default();
        // A master (10) and a worker (11) share listener 100; 12 holds nothing.
        let fds = Fds::new(&[(10, &[100]), (11, &[100]), (12, &[7])]);
        let listening = HashMap::from([(100, 80), (200, 22)]);
        s.find_owners(
            &listening,
            &[10, 11, 12],
            |p| fds.inodes(p),
            no_parent,
            not_forked,
            clock,
        );
        assert_eq!(
            fds.taken(),
            vec![10, 11, 12],
            "new inodes: every watched pid"
        );
        assert_eq!(
            s.owner_of[&100],
            Some(10),
            "the lowest pid owns a shared socket"
        );
        assert_eq!(
            s.owner_of[&200], None,
            "no watched process holds sshd's socket"
        );

        s.find_owners(
            &listening,
            &[10, 11, 12],
            |p| fds.inodes(p),
            no_parent,
            not_forked,
            clock,
        );
        assert!(fds.taken().is_empty(), "nothing changed: no fd read");

        // A new watched process: only it is read, for the unowned socket.
        let fds = Fds::new(&[(10, &[100]), (11, &[100]), (13, &[200])]);
        s.find_owners(
            &listening,
            &[10, 11, 12, 13],
            |p| fds.inodes(p),
            no_parent,
            not_forked,
            clock,
        );
        assert_eq!(fds.taken(), vec![13]);
        assert_eq!(s.owner_of[&200], Some(13));

        // The master leaves: its socket is looked for again among all.
        s.find_owners(
            &listening,
            &[11, 12, 13],
            |p| fds.inodes(p),
            no_parent,
            not_forked,
            clock,
        );
        assert_eq!(fds.taken(), vec![11, 12, 13]);
        assert_eq!(s.owner_of[&100], Some(11));

        // A closed socket is forgotten.
        s.find_owners(
            &HashMap::from([(200, 22)]),
            &[11, 12, 13],
            |p| fds.inodes(p),
            no_parent,
            not_forked,
            clock,
        );
        assert!(!s.owner_of.contains_key(&100));
    }

    #[test]
    fn the_files_read_as_procfs_reads_them() {
        let mut files = Files::default();
        assert_eq!(files.local_port_range(), procfs::local_port_range());
        assert_eq!(files.local_port_range(), procfs::local_port_range());
        // Cumulative counters: between a read before and one after.
        let names = [
            "ListenOverflows",
            "ListenDrops",
            "TCPTimeWaitOverflow",
            "NoSuch",
        ];
        for _ in 0..2 {
            let before = procfs::tcp_ext_counters(names);
            let ours = files.tcp_ext_counters(names);
            let after = procfs::tcp_ext_counters(names);
            for i in 0..names.len() {
                assert_eq!(ours[i].is_some(), before[i].is_some(), "{}", names[i]);
                assert!(before[i] <= ours[i] && ours[i] <= after[i], "{}", names[i]);
            }
        }
        assert!(files.tcp_ext_counters(names)[0].is_some());
    }

    #[test]
    fn a_child_forked_after_its_parents_read_is_not_read() {
        let mut s = Sockets::default();
        // Postmaster 20 holds 300; sshd's 22 (200) is no watched
        // process's, so each new process is read for it.
        let fds = Fds::new(&[(20, &[300, 400]), (21, &[300]), (5, &[300, 400])]);
        let listening = HashMap::from([(300, 5432), (200, 22)]);
        let clock = || 1_000_000_000;
        s.find_owners(
            &listening,
            &[20],
            |p| fds.inodes(p),
            no_parent,
            not_forked,
            clock,
        );
        assert_eq!(fds.taken(), vec![20]);
        // Forked by 20 after its read: a copy of its fds, even with a pid
        // below its parent's (pids wrapped). Forked by 20 as it was read:
        // read.
        let after = 2_000_000_000;
        let forks = HashMap::from([
            (21, (20, after)),
            (22, (20, 1_000_000_000)),
            (5, (20, after)),
        ]);
        let forked = |p: u32| forks.get(&p).copied();
        s.find_owners(
            &listening,
            &[5, 20, 21, 22],
            |p| fds.inodes(p),
            no_parent,
            forked,
            clock,
        );
        assert_eq!(fds.taken(), vec![22]);
        assert_eq!((s.owner_of[&300], s.owner_of[&200]), (Some(20), None));
        assert_eq!(s.scanned[&21], after, "known since its fork");
        // Its own child is a copy of a copy.
        let forks = HashMap::from([(23, (21, after + 1_000_000_000))]);
        s.find_owners(
            &listening,
            &[5, 20, 21, 22, 23],
            |p| fds.inodes(p),
            no_parent,
            |p| forks.get(&p).copied(),
            clock,
        );
        assert!(fds.taken().is_empty());
        // A new listener: every process is read, copies too. 20 and its
        // child 5 hold it: it is 20's, the lower pid notwithstanding.
        let listening = HashMap::from([(300, 5432), (200, 22), (400, 80)]);
        let parent_of = |p: u32| (p != 20).then_some(if p == 23 { 21 } else { 20 });
        s.find_owners(
            &listening,
            &[5, 20, 21, 22, 23],
            |p| fds.inodes(p),
            parent_of,
            |p| forks.get(&p).copied(),
            clock,
        );
        assert_eq!(fds.taken(), vec![5, 20, 21, 22, 23]);
        assert_eq!(s.owner_of[&400], Some(20));
    }

    #[test]
    fn costly_walks_run_less_often_but_a_forced_walk_always_runs() {
        let t0 = Instant::now();
        let mut w = Walks::default();
        assert!(w.due(false, false, t0), "the first look walks");
        // A cheap walk (few sockets): due again by the next interval.
        w.walked(t0, Duration::from_micros(300), 5, 0);
        assert!(!w.due(false, false, t0 + Duration::from_millis(500)));
        assert!(w.due(false, false, t0 + Duration::from_millis(600)));
        // A 5 ms walk: the next one 10 s later, not before.
        w.walked(t0, Duration::from_millis(5), 5, 0);
        assert!(!w.due(false, false, t0 + Duration::from_millis(9900)));
        assert!(w.due(false, false, t0 + Duration::from_secs(10)));
        assert!(w.due(true, false, t0 + Duration::from_millis(1)));
        assert_eq!(w.age(t0 + Duration::from_secs(3)), Duration::from_secs(3));
        // However costly, never older than the cap.
        w.walked(t0, Duration::from_secs(1), 5, 0);
        assert!(!w.due(
            false,
            false,
            t0 + MAX_WALK_PERIOD - Duration::from_millis(1)
        ));
        assert!(w.due(false, false, t0 + MAX_WALK_PERIOD));
    }

    #[test]
    fn while_nothing_watched_changes_a_walk_waits_for_the_cap() {
        let t0 = Instant::now();
        let mut w = Walks::default();
        assert!(!w.unchanged(0), "never walked: nothing is known");
        // A cheap walk that found no TIME_WAIT of ours, links at 40 counts.
        w.walked(t0, Duration::from_micros(300), 0, 40);
        assert!(w.unchanged(40));
        let later = t0 + Duration::from_secs(5);
        assert!(!w.due(false, true, later), "budget allows, nothing new");
        assert!(w.due(false, true, t0 + MAX_WALK_PERIOD));
        assert!(w.due(true, true, later), "a forced walk still runs");
        // Any of these makes the next look walk.
        assert!(!w.unchanged(41), "a link counted something");
        w.stirred = true;
        assert!(!w.unchanged(40), "events or a new watched process");
        w.walked(t0, Duration::from_micros(300), 3, 40);
        assert!(
            !w.unchanged(40),
            "TIME_WAIT sockets of ours expire unseen: walk as budget allows"
        );
    }
}
