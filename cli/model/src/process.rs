//! The process table: what was measured for each watched process, for the
//! current interval and since the start, and the lifecycle that links them
//! (who forked whom, when, how long children live).
//!
//! Memory stays bounded however many pids come and go: only live processes
//! have an entry; an exited process retires: its numbers join its role's
//! totals and its entry is removed. Roles are at most [`MAX_ROLES`] (further
//! ones merge into [`OTHER_ROLE`]), so the table holds O(live watched
//! processes + roles).

use std::collections::BTreeMap;

use super::{
    containers::{self, Container},
    counter::Counter,
    event::{Event, ExecSample, ExitSample, HistDelta, SpawnSample, TaskKind},
    histogram::LatencyHistogram,
    links::LinkTable,
    measure::{Count, Counts, DestinationCount, Feeds, Latencies, Latency, Per},
    roles,
};

pub const MAX_ROLES: usize = 256;
pub const OTHER_ROLE: &str = "(other)";
/// Listeners kept apart per process or role; further ones are summed under
/// [`OTHER_LISTENERS`].
pub const MAX_LISTENERS: usize = 64;
pub const OTHER_LISTENERS: &str = "(other listeners)";
/// Accepts from a listener that could not be named (its process exited
/// before it was asked).
pub const UNKNOWN_LISTENER: &str = "(unknown listener)";
/// Destinations kept apart per process or role; further ones are summed
/// under [`OTHER_DESTINATIONS`].
pub const MAX_DESTINATIONS: usize = 64;
pub const OTHER_DESTINATIONS: &str = "(other destinations)";
/// Connects to a destination the kernel could not name (its table of
/// names was full).
pub const UNKNOWN_DESTINATION: &str = "(unknown destination)";

/// One latency metric: the current interval and everything since the start.
#[derive(Clone, Debug, Default)]
pub struct Metric {
    pub interval: LatencyHistogram,
    pub total: LatencyHistogram,
    /// Samples since the start that are counted but not in `total` (a sum
    /// over [`Span::Interval`] merges only the totals' counts).
    pub total_uncounted: u64,
}

/// What a sum of activities needs. An interval report needs the interval's
/// histograms and only the count of the totals: merging every process's
/// total histograms (213 KB each) was 40% of an interval's 80 ms at 1000
/// processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Span {
    Interval,
    Whole,
}

impl Metric {
    pub fn record(&mut self, ns: u64) {
        self.interval.record(ns);
        self.total.record(ns);
    }

    fn record_kernel(&mut self, d: &HistDelta) {
        for h in [&mut self.interval, &mut self.total] {
            h.record_kernel(&d.buckets, d.sum_ns, d.min_ns, d.max_ns);
        }
    }

    /// Samples since the start.
    pub fn total_count(&self) -> u64 {
        self.total.count() + self.total_uncounted
    }

    fn add(&mut self, other: &Metric, span: Span) {
        self.interval.add(&other.interval);
        match span {
            Span::Whole => {
                self.total.add(&other.total);
                self.total_uncounted += other.total_uncounted;
            }
            Span::Interval => self.total_uncounted += other.total_count(),
        }
    }

    fn reset_interval(&mut self) {
        self.interval.reset();
    }
}

/// Everything measured about one process (or, summed, about a role): each
/// declared latency and count, and the per-listener and per-destination
/// breakdowns of those declared so.
#[derive(Clone, Debug, Default)]
pub struct Activity {
    pub latency: Latencies<Metric>,
    pub counts: Counts<Counter>,
    /// The [`Per::Listener`] latencies per listening socket accepted from,
    /// by its address or path.
    pub listeners: BTreeMap<String, ListenerActivity>,
    /// Connects per destination (TCP address:port or unix path).
    pub connects: BTreeMap<String, ConnectActivity>,
}

/// What one destination's connects measured.
#[derive(Clone, Debug, Default)]
pub struct ConnectActivity {
    /// Successful connects: TCP, SYN to ESTABLISHED; unix, the syscall.
    pub latency: Metric,
    /// Connects refused (ECONNREFUSED).
    pub refused: Counter,
    /// Connects that failed otherwise.
    pub failed: Counter,
}

impl ConnectActivity {
    fn add(&mut self, other: &ConnectActivity, span: Span) {
        self.latency.add(&other.latency, span);
        self.refused.add_counter(&other.refused);
        self.failed.add_counter(&other.failed);
    }

    fn reset_interval(&mut self) {
        self.latency.reset_interval();
        self.refused.interval = 0;
        self.failed.interval = 0;
    }

    pub fn is_empty(&self) -> bool {
        self.latency.total.is_empty() && self.refused.total == 0 && self.failed.total == 0
    }
}

/// `name`'s entry in `map`, which keeps at most `max` names apart: past
/// that, a new name's numbers go under `other`.
fn bounded_entry<'a, T: Default>(
    map: &'a mut BTreeMap<String, T>,
    name: &str,
    max: usize,
    other: &str,
) -> &'a mut T {
    let name = if map.len() >= max && !map.contains_key(name) {
        other
    } else {
        name
    };
    map.entry(name.to_string()).or_default()
}

/// What one listening socket's accepts measured: its [`Per::Listener`]
/// latencies (the others stay empty).
#[derive(Clone, Debug, Default)]
pub struct ListenerActivity {
    pub latency: Latencies<Metric>,
}

impl ListenerActivity {
    fn add(&mut self, other: &ListenerActivity, span: Span) {
        for (l, m) in self.latency.iter_mut() {
            m.add(&other.latency[l], span);
        }
    }

    fn reset_interval(&mut self) {
        for (_, m) in self.latency.iter_mut() {
            m.reset_interval();
        }
    }
}

impl Activity {
    /// Nothing recorded since the start.
    pub fn is_empty(&self) -> bool {
        self.latency.iter().all(|(_, m)| m.total.is_empty())
            && self.counts.iter().all(|(_, c)| c.total == 0)
            && self.connects.values().all(ConnectActivity::is_empty)
    }

    /// The listener `name`'s numbers (past [`MAX_LISTENERS`], those of
    /// [`OTHER_LISTENERS`]).
    fn listener(&mut self, name: &str) -> &mut ListenerActivity {
        bounded_entry(&mut self.listeners, name, MAX_LISTENERS, OTHER_LISTENERS)
    }

    /// The destination `name`'s numbers (past [`MAX_DESTINATIONS`], those
    /// of [`OTHER_DESTINATIONS`]).
    fn destination(&mut self, name: &str) -> &mut ConnectActivity {
        bounded_entry(
            &mut self.connects,
            name,
            MAX_DESTINATIONS,
            OTHER_DESTINATIONS,
        )
    }

    pub fn add(&mut self, other: &Activity, span: Span) {
        for (name, l) in &other.listeners {
            self.listener(name).add(l, span);
        }
        for (name, c) in &other.connects {
            self.destination(name).add(c, span);
        }
        for (l, m) in self.latency.iter_mut() {
            m.add(&other.latency[l], span);
        }
        for (c, n) in self.counts.iter_mut() {
            n.add_counter(&other.counts[c]);
        }
    }

    fn reset_interval(&mut self) {
        for (_, m) in self.latency.iter_mut() {
            m.reset_interval();
        }
        for l in self.listeners.values_mut() {
            l.reset_interval();
        }
        for c in self.connects.values_mut() {
            c.reset_interval();
        }
        for (_, c) in self.counts.iter_mut() {
            c.interval = 0;
        }
    }

    /// Records what a kernel histogram gained, where its declaration says.
    fn record_kernel(&mut self, d: &HistDelta) {
        let listener = || d.path.as_deref().unwrap_or(UNKNOWN_LISTENER);
        let destination = || d.path.as_deref().unwrap_or(UNKNOWN_DESTINATION);
        match Feeds::of(d.metric) {
            Feeds::Latency(l) => {
                self.latency[l].record_kernel(d);
                match l.decl().per {
                    Per::Process => {}
                    Per::Listener => self.listener(listener()).latency[l].record_kernel(d),
                    Per::Destination => self.destination(destination()).latency.record_kernel(d),
                }
            }
            Feeds::Count(c) => self.counts[c].add(d.count),
            Feeds::Destination(DestinationCount::Refused) => {
                self.destination(destination()).refused.add(d.count);
            }
            Feeds::Destination(DestinationCount::Failed) => {
                self.destination(destination()).failed.add(d.count);
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct Process {
    pub pid: u32,
    pub name: String,
    /// How the process titles itself (/proc/PID/cmdline), once read.
    pub title: Option<String>,
    /// The parent's pid and name, when known.
    pub parent: Option<(u32, String)>,
    /// When it was forked, if that happened while stackprobe watched.
    pub born_ns: Option<u64>,
    /// Has forked a child process with its own name (a master).
    pub forks_own_name: bool,
    /// In the kernel's watch set as of the last sync.
    pub watched: bool,
    /// The container it runs in, if any: its role is counted per container.
    pub container: Option<Container>,
    /// Its pid inside its own pid namespace, where that differs (a
    /// container's).
    pub ns_pid: Option<u32>,
    /// Consecutive syncs that did not find it in /proc.
    missed_syncs: u8,
    pub activity: Activity,
}

impl Process {
    fn new(pid: u32, name: String) -> Self {
        Self {
            pid,
            name,
            title: None,
            parent: None,
            born_ns: None,
            forks_own_name: false,
            watched: true,
            container: None,
            ns_pid: None,
            missed_syncs: 0,
            activity: Activity::default(),
        }
    }

    pub fn role(&self) -> String {
        let role = roles::role(
            &self.name,
            self.title.as_deref(),
            self.parent.as_ref().map(|(_, n)| n.as_str()),
            self.forks_own_name,
        );
        containers::role_in(role, self.container.as_ref())
    }

    /// Whether the role can still change: a php-fpm worker that has not
    /// named its pool yet. (A process that turns out to be a master moves
    /// too, and takes everything it did along: roles are summed from live
    /// processes at each report.)
    pub fn role_settled(&self) -> bool {
        let child_of_same = self.parent.as_ref().is_some_and(|(_, n)| *n == self.name);
        self.forks_own_name
            || !child_of_same
            || roles::title_settled(&self.name, self.title.as_deref().unwrap_or(""))
    }

    /// Whether /proc's title is worth reading (again): never read, or its
    /// role still waits on it.
    pub fn needs_title(&self) -> bool {
        self.title.is_none() || !self.role_settled()
    }
}

/// What /proc says about a watched process (the sync's input).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LiveProcess {
    pub pid: u32,
    pub name: String,
    pub title: Option<String>,
    pub parent: Option<(u32, String)>,
    pub container: Option<Container>,
    pub ns_pid: Option<u32>,
}

#[derive(Clone, Debug, Default)]
pub struct ProcessTable {
    /// Connections of the watched processes.
    pub links: LinkTable,
    /// Boxed: a process row is most of a kilobyte, and a B-tree moves
    /// values within its nodes on every insert and remove (2–3 % of the
    /// collector's time under new.php's fork per request before).
    procs: BTreeMap<u32, Box<Process>>,
    /// Exited processes' numbers, by role.
    retired: BTreeMap<String, Activity>,
    /// The roles of processes that exited in this interval and the one
    /// before: what the kernel's histograms gained for them is read after
    /// their exit was applied, and goes to their role.
    exited_roles: [BTreeMap<u32, String>; 2],
}

impl ProcessTable {
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::Spawn(s) => self.record_spawn(s),
            Event::Exec(s) => self.record_exec(s),
            Event::Exit(s) => self.record_exit(s),
            Event::Hist(d) => self.record_hist(d),
            // A listener opened or closed (links are counted in the kernel).
            Event::TcpState(s) => {
                if let Some(comm) = &s.comm {
                    self.entry(s.owner, comm);
                }
            }
        }
    }

    fn entry(&mut self, pid: u32, name: &str) -> &mut Process {
        self.procs
            .entry(pid)
            .or_insert_with(|| Box::new(Process::new(pid, name.to_string())))
    }

    fn record_hist(&mut self, d: &HistDelta) {
        let exited_role = (!self.procs.contains_key(&d.tgid))
            .then(|| {
                self.exited_roles
                    .iter()
                    .find_map(|r| r.get(&d.tgid))
                    .cloned()
            })
            .flatten();
        let a = match exited_role {
            Some(role) => self.retired_role(role),
            None => {
                let name = d.comm.clone().unwrap_or_else(|| format!("[{}]", d.tgid));
                &mut self.entry(d.tgid, &name).activity
            }
        };
        a.record_kernel(d);
    }

    fn record_spawn(&mut self, s: &SpawnSample) {
        if s.kind == TaskKind::Thread {
            return;
        }
        let parent = self.entry(s.parent_tgid, &s.comm);
        let parent_name = parent.name.clone();
        parent.forks_own_name |= parent_name == s.comm;
        // A child starts in its parent's container (its cgroup), so its
        // role is the container's from its first event.
        let container = parent.container.clone();
        match self.procs.get(&s.child) {
            // /proc showed the child before its spawn event was drained:
            // the same process.
            Some(p) if p.born_ns.is_none() && p.activity.is_empty() => {}
            // A process whose exit was never seen: its pid was recycled.
            Some(_) => self.retire(s.child),
            None => {}
        }
        let child = self.entry(s.child, &s.comm);
        child.parent = Some((s.parent_tgid, parent_name));
        child.born_ns = Some(s.ts_ns);
        child.container = container;
    }

    fn record_exec(&mut self, s: &ExecSample) {
        let parent = {
            let proc = self.entry(s.tgid, &s.comm);
            proc.name.clone_from(&s.comm);
            // The title set before exec belonged to the old program.
            proc.title = None;
            proc.activity.counts[Count::Execs].bump();
            proc.parent.as_ref().map(|(pid, _)| *pid)
        };
        if let Some(parent) = parent.and_then(|p| self.procs.get_mut(&p)) {
            parent.activity.counts[Count::ChildrenExec].bump();
        }
    }

    fn record_exit(&mut self, s: &ExitSample) {
        let Some(proc) = self.procs.get(&s.tgid) else {
            return;
        };
        if let (Some(born), Some((parent, parent_name))) = (proc.born_ns, proc.parent.clone()) {
            let lifetime = s.ts_ns.saturating_sub(born);
            match self.procs.get_mut(&parent) {
                Some(p) => p.activity.latency[Latency::ChildLifetime].record(lifetime),
                None => {
                    // The parent is gone: credit its role's totals.
                    let role = roles::role(&parent_name, None, None, true);
                    self.retired_role(role).latency[Latency::ChildLifetime].record(lifetime);
                }
            }
        }
        self.retire(s.tgid);
    }

    /// Removes `pid`, adding its numbers to its role's totals.
    fn retire(&mut self, pid: u32) {
        if let Some(proc) = self.procs.remove(&pid) {
            let role = self.retiring_role(&proc);
            self.exited_roles[0].insert(pid, role.clone());
            // Its sockets keep counting on its links under this role.
            self.links.remember_role(pid, role.clone());
            let retired = self.retired_role(role);
            retired.add(&proc.activity, Span::Whole);
            retired.counts[Count::Exited].bump();
        }
    }

    /// The role `proc` retires into: its own, unless it left before it
    /// settled. A php-fpm worker that exited before naming its pool belongs
    /// to a pool of its master: the one its live siblings all name, when
    /// they name one; with siblings in several pools (or none) it stays a
    /// worker of no known pool rather than be guessed into one.
    fn retiring_role(&self, proc: &Process) -> String {
        let role = proc.role();
        if proc.role_settled() {
            return role;
        }
        let parent = proc.parent.as_ref().map(|(pid, _)| *pid);
        let mut siblings = self
            .procs
            .values()
            .filter(|p| {
                p.parent.as_ref().map(|(pid, _)| *pid) == parent
                    && p.name == proc.name
                    && !p.forks_own_name
                    && p.role_settled()
            })
            .map(|p| p.role());
        match siblings.next() {
            Some(first) if siblings.all(|r| r == first) => first,
            _ => role,
        }
    }

    fn retired_role(&mut self, role: String) -> &mut Activity {
        let key = if self.retired.len() >= MAX_ROLES - 1 && !self.retired.contains_key(&role) {
            OTHER_ROLE.to_string()
        } else {
            role
        };
        self.retired.entry(key).or_default()
    }

    /// Mirrors the kernel's watch set: `live` lists every watched process now.
    /// A process missing from two syncs in a row left without an exit event
    /// (a drop) and retires; one miss is not enough, since a process spawned
    /// after the /proc scan reaches the table through its event first.
    pub fn sync_watched(&mut self, live: &[LiveProcess]) {
        let alive: std::collections::HashSet<u32> = live.iter().map(|p| p.pid).collect();
        let mut gone = Vec::new();
        for proc in self.procs.values_mut() {
            if alive.contains(&proc.pid) {
                proc.missed_syncs = 0;
            } else {
                proc.missed_syncs += 1;
                proc.watched = false;
                if proc.missed_syncs >= 2 {
                    gone.push(proc.pid);
                }
            }
        }
        for pid in gone {
            self.retire(pid);
        }
        for l in live {
            let proc = self.entry(l.pid, &l.name);
            proc.watched = true;
            proc.name.clone_from(&l.name);
            if l.title.is_some() {
                proc.title.clone_from(&l.title);
            }
            if proc.parent.is_none() {
                proc.parent.clone_from(&l.parent);
            }
            proc.container.clone_from(&l.container);
            proc.ns_pid = l.ns_pid;
        }
        // Masters that were already running: they have children of their name.
        let masters: Vec<u32> = self
            .procs
            .values()
            .filter_map(|p| {
                p.parent
                    .as_ref()
                    .filter(|(_, n)| *n == p.name)
                    .map(|(pid, _)| *pid)
            })
            .collect();
        for pid in masters {
            if let Some(p) = self.procs.get_mut(&pid) {
                p.forks_own_name = true;
            }
        }
    }

    pub fn get(&self, pid: u32) -> Option<&Process> {
        self.procs.get(&pid).map(|p| &**p)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Process> {
        self.procs.values().map(|p| &**p)
    }

    pub fn len(&self) -> usize {
        self.procs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.procs.is_empty()
    }

    pub fn watched_count(&self) -> usize {
        self.procs.values().filter(|p| p.watched).count()
    }

    /// Live children (processes) of `pid`.
    pub fn children_alive(&self, pid: u32) -> usize {
        self.procs
            .values()
            .filter(|p| p.parent.as_ref().is_some_and(|(ppid, _)| *ppid == pid))
            .count()
    }

    /// Every role with its live pids and its activity: exited members' retired
    /// totals plus the live members' numbers (histograms for `span`).
    pub fn roles(&self, span: Span) -> BTreeMap<String, (Vec<u32>, Activity)> {
        // Only what `span` needs of the retired too: an interval report
        // would otherwise copy every retired role's total histograms.
        let mut out: BTreeMap<String, (Vec<u32>, Activity)> = self
            .retired
            .iter()
            .map(|(role, a)| {
                let mut sum = Activity::default();
                sum.add(a, span);
                (role.clone(), (Vec::new(), sum))
            })
            .collect();
        for p in self.procs.values() {
            let (pids, activity) = out.entry(p.role()).or_default();
            pids.push(p.pid);
            activity.add(&p.activity, span);
        }
        out
    }

    /// Starts a new interval: the interval numbers empty, the totals stay.
    pub fn reset_interval(&mut self) {
        for proc in self.procs.values_mut() {
            proc.activity.reset_interval();
        }
        for activity in self.retired.values_mut() {
            activity.reset_interval();
        }
        self.exited_roles[1] = std::mem::take(&mut self.exited_roles[0]);
        self.links.reset_interval();
    }

    /// Number of roles holding exited processes' totals.
    pub fn retired_roles(&self) -> usize {
        self.retired.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{event::HistMetric, fixtures::kernel_hist};

    /// One accept of `ns` by `tgid`, as a read of the kernel's histograms hands it over.
    fn accept(tgid: u32, ns: u64) -> Event {
        kernel_hist(tgid, &format!("srv{tgid}"), HistMetric::Accept, &[ns])
    }

    fn spawn(parent: u32, child: u32, comm: &str, ts: u64) -> Event {
        Event::Spawn(SpawnSample {
            parent_tgid: parent,
            child,
            kind: TaskKind::Process,
            ts_ns: ts,
            comm: comm.into(),
        })
    }

    /// One clone by `tgid` that returned `ret`, filed as the kernel files it.
    fn fork(tgid: u32, ret: i32, kind: TaskKind, ns: u64) -> Event {
        let metric = HistMetric::of_clone(i64::from(ret), kind);
        kernel_hist(tgid, "srv", metric, &[ns])
    }

    fn exit(tgid: u32, ts: u64) -> Event {
        Event::Exit(ExitSample { tgid, ts_ns: ts })
    }

    fn live(pid: u32, name: &str) -> LiveProcess {
        LiveProcess {
            pid,
            name: name.into(),
            title: None,
            parent: None,
            container: None,
            ns_pid: None,
        }
    }

    #[test]
    fn accepts_land_in_their_process() {
        let mut t = ProcessTable::default();
        t.apply(&accept(10, 100));
        t.apply(&accept(10, 300));
        t.apply(&accept(11, 50));
        assert_eq!(
            t.get(10).unwrap().activity.latency[Latency::Accept]
                .total
                .count(),
            2
        );
        assert_eq!(
            t.get(11).unwrap().activity.latency[Latency::Accept]
                .total
                .count(),
            1
        );
        assert_eq!(t.get(10).unwrap().name, "srv10");
    }

    fn hist(tgid: u32, metric: HistMetric, count: u64) -> Event {
        Event::Hist(HistDelta {
            tgid,
            comm: None,
            metric,
            path: None,
            count,
            sum_ns: 2_000 * count,
            min_ns: 2_000,
            max_ns: 2_000,
            buckets: vec![(2_000, count)],
        })
    }

    #[test]
    fn kernel_histograms_add_to_the_metric_they_name() {
        let mut t = ProcessTable::default();
        t.apply(&accept(10, 100));
        for (metric, count) in [
            (HistMetric::Accept, 5),
            (HistMetric::AcceptQueue, 4),
            (HistMetric::Fork, 3),
            (HistMetric::Thread, 2),
            (HistMetric::ForkUnknown, 6),
            (HistMetric::ForkFailed, 7),
            (HistMetric::AcceptUntimed, 8),
        ] {
            t.apply(&hist(10, metric, count));
        }
        // A process first heard of through a histogram gets a placeholder name.
        t.apply(&hist(12, HistMetric::Accept, 1));
        let a = &t.get(10).unwrap().activity;
        assert_eq!(a.latency[Latency::Accept].total.count(), 6);
        assert_eq!(a.latency[Latency::Accept].total.summary().min_ns, 100);
        assert_eq!(a.latency[Latency::Accept].total.sum_ns(), 100 + 5 * 2_000);
        assert_eq!(a.latency[Latency::AcceptQueue].total.count(), 4);
        assert_eq!(a.latency[Latency::Fork].total.count(), 3);
        assert_eq!(a.latency[Latency::Thread].total.count(), 2);
        assert_eq!(
            (
                a.counts[Count::ForkUnknown].total,
                a.counts[Count::ForkFailed].total
            ),
            (6, 7)
        );
        // Untimed accepts are counted apart: no sample joins the latencies.
        assert_eq!(a.counts[Count::AcceptUntimed].total, 8);
        assert_eq!(t.get(10).unwrap().name, "srv10");
        assert_eq!(t.get(12).unwrap().name, "[12]");
    }

    #[test]
    fn what_a_process_did_before_its_exit_is_read_after_it_and_goes_to_its_role() {
        let mut t = ProcessTable::default();
        t.apply(&accept(10, 100));
        t.apply(&Event::Exit(ExitSample { tgid: 10, ts_ns: 5 }));
        t.apply(&hist(10, HistMetric::Accept, 3));
        assert!(
            t.get(10).is_none(),
            "no entry comes back for an exited process"
        );
        let roles = t.roles(Span::Whole);
        let (_, a) = &roles["srv10"];
        assert_eq!(a.latency[Latency::Accept].total.count(), 4);
        assert_eq!(a.counts[Count::Exited].total, 1);
        // Two intervals on, the pid is taken to be a new process's.
        t.reset_interval();
        t.reset_interval();
        t.apply(&hist(10, HistMetric::Accept, 1));
        assert_eq!(
            t.get(10).unwrap().activity.latency[Latency::Accept]
                .total
                .count(),
            1
        );
    }

    #[test]
    fn interval_resets_but_totals_stay() {
        let mut t = ProcessTable::default();
        t.apply(&accept(10, 100));
        t.reset_interval();
        t.apply(&accept(10, 200));
        let a = &t.get(10).unwrap().activity.latency[Latency::Accept];
        assert_eq!((a.interval.count(), a.total.count()), (1, 2));
    }

    #[test]
    fn forks_are_counted_by_kind_and_children_get_lifetimes() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "srv")]);
        for (i, child) in [100u32, 101, 102].into_iter().enumerate() {
            let born = 1_000_000 * i as u64;
            t.apply(&spawn(1, child, "srv", born));
            t.apply(&fork(1, child as i32, TaskKind::Process, 40_000));
            t.apply(&exit(child, born + 50_000_000));
        }
        t.apply(&Event::Spawn(SpawnSample {
            parent_tgid: 1,
            child: 200,
            kind: TaskKind::Thread,
            ts_ns: 0,
            comm: "srv".into(),
        }));
        t.apply(&fork(1, 200, TaskKind::Thread, 20_000));
        t.apply(&fork(1, -11, TaskKind::Process, 1_000));
        let a = &t.get(1).unwrap().activity;
        assert_eq!(a.latency[Latency::Fork].total.count(), 3);
        assert_eq!(a.latency[Latency::Thread].total.count(), 1);
        assert_eq!(a.counts[Count::ForkFailed].total, 1);
        let life = a.latency[Latency::ChildLifetime].total.summary();
        assert_eq!(
            (life.count, life.min_ns, life.max_ns),
            (3, 50_000_000, 50_000_000)
        );
        // Exited children are gone from the table; threads never had an entry.
        assert_eq!(t.len(), 1);
        assert_eq!(t.children_alive(1), 0);
        assert_eq!(t.get(1).unwrap().role(), "srv master");
    }

    #[test]
    fn exited_children_retire_into_their_role() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "postgres")]);
        t.apply(&spawn(1, 50, "postgres", 0));
        t.apply(&spawn(1, 51, "postgres", 0));
        t.apply(&fork(50, 60, TaskKind::Process, 7));
        t.apply(&exit(50, 9_000_000));
        let roles = t.roles(Span::Whole);
        let (pids, backend) = &roles["postgres backend"];
        assert_eq!(pids, &[51]);
        assert_eq!(
            backend.latency[Latency::Fork].total.count(),
            1,
            "the exited backend's fork stays counted"
        );
        assert_eq!(roles["postgres postmaster"].0, [1]);
        assert_eq!(backend.counts[Count::Exited].total, 1);
        assert_eq!(t.children_alive(1), 1);
    }

    #[test]
    fn a_recycled_pid_is_a_new_process() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "srv")]);
        t.apply(&spawn(1, 77, "srv", 0));
        t.apply(&accept(77, 5));
        // Its exit was lost; pid 77 comes back as another child.
        t.apply(&spawn(1, 77, "srv", 1_000));
        let p = t.get(77).unwrap();
        assert_eq!(p.activity.latency[Latency::Accept].total.count(), 0);
        assert_eq!(p.born_ns, Some(1_000));
        assert_eq!(
            t.roles(Span::Whole)["srv worker"].1.latency[Latency::Accept]
                .total
                .count(),
            1,
            "the old one retired"
        );
    }

    #[test]
    fn memory_stays_bounded_however_many_pids_come_and_go() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "postgres")]);
        for i in 0..200_000u64 {
            let pid = 2 + (i % 30_000) as u32;
            t.apply(&spawn(1, pid, "postgres", i * 1000));
            if i % 7 != 0 {
                t.apply(&exit(pid, i * 1000 + 9_000_000));
            }
        }
        // The forks' latencies, as one read of the kernel's histogram.
        t.apply(&kernel_hist(
            1,
            "postgres",
            HistMetric::Fork,
            &vec![30_000; 200_000],
        ));
        // Only the children whose exit was not seen are still live (a recycled
        // pid replaces its predecessor), and one role holds all the retired rest.
        assert!(t.len() <= 30_001, "{}", t.len());
        assert_eq!(t.retired_roles(), 1);
        assert_eq!(
            t.get(1).unwrap().activity.latency[Latency::Fork]
                .total
                .count(),
            200_000
        );
    }

    #[test]
    fn roles_are_capped() {
        let mut t = ProcessTable::default();
        for i in 0..(MAX_ROLES as u32 + 50) {
            t.sync_watched(&[live(i + 1, &format!("p{i}"))]);
        }
        t.sync_watched(&[]);
        t.sync_watched(&[]);
        assert!(t.retired_roles() <= MAX_ROLES);
        assert!(t.roles(Span::Whole).contains_key(OTHER_ROLE));
    }

    #[test]
    fn sync_retires_processes_that_left_and_finds_running_masters() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[
            live(1, "nginx"),
            LiveProcess {
                pid: 2,
                name: "nginx".into(),
                title: Some("nginx: worker process".into()),
                parent: Some((1, "nginx".into())),
                container: None,
                ns_pid: None,
            },
        ]);
        assert_eq!(t.get(1).unwrap().role(), "nginx master");
        assert_eq!(t.get(2).unwrap().role(), "nginx worker");
        t.apply(&accept(2, 10));
        // Gone from /proc without an exit event: one miss is not enough…
        t.sync_watched(&[live(1, "nginx")]);
        assert!(!t.get(2).unwrap().watched);
        // …two are.
        t.sync_watched(&[live(1, "nginx")]);
        assert!(t.get(2).is_none());
        let worker = &t.roles(Span::Whole)["nginx worker"].1;
        assert_eq!(worker.latency[Latency::Accept].total.count(), 1);
        assert_eq!(worker.counts[Count::Exited].total, 1);
    }

    #[test]
    fn a_child_seen_in_proc_before_its_spawn_event_is_one_process() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[
            live(1, "srv"),
            LiveProcess {
                pid: 5,
                name: "srv".into(),
                title: None,
                parent: Some((1, "srv".into())),
                container: None,
                ns_pid: None,
            },
        ]);
        t.apply(&spawn(1, 5, "srv", 1_000));
        t.apply(&exit(5, 51_000));
        assert_eq!(
            t.get(1).unwrap().activity.latency[Latency::ChildLifetime]
                .total
                .count(),
            1
        );
        assert_eq!(
            t.roles(Span::Whole)["srv worker"].1.counts[Count::Exited].total,
            1,
            "retired once, not twice"
        );
    }

    #[test]
    fn a_child_spawned_after_the_proc_scan_survives_one_sync() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "srv")]);
        t.apply(&spawn(1, 6, "srv", 1_000));
        // The scan ran before the spawn: 6 is not listed yet.
        t.sync_watched(&[live(1, "srv")]);
        t.apply(&exit(6, 2_001_000));
        assert_eq!(
            t.get(1).unwrap().activity.latency[Latency::ChildLifetime]
                .total
                .summary()
                .max_ns,
            2_000_000
        );
    }

    #[test]
    fn children_that_exec_are_counted_for_the_parent() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[live(1, "srv")]);
        t.apply(&spawn(1, 9, "srv", 0));
        t.apply(&Event::Exec(ExecSample {
            tgid: 9,
            ts_ns: 5,
            comm: "true".into(),
        }));
        assert_eq!(
            t.get(1).unwrap().activity.counts[Count::ChildrenExec].total,
            1
        );
        assert_eq!(t.get(9).unwrap().activity.counts[Count::Execs].total, 1);
        assert_eq!(t.get(9).unwrap().role(), "true");
    }

    const MASTER_TITLE: &str = "php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)";

    /// A php-fpm process as /proc shows it.
    fn fpm(pid: u32, parent: Option<u32>, title: &str) -> LiveProcess {
        LiveProcess {
            pid,
            name: "php-fpm8.2".into(),
            title: Some(title.into()),
            parent: parent.map(|p| (p, "php-fpm8.2".to_string())),
            container: None,
            ns_pid: None,
        }
    }

    fn role_names(t: &ProcessTable) -> Vec<String> {
        t.roles(Span::Whole).into_keys().collect()
    }

    #[test]
    fn a_worker_seen_before_its_title_settles_into_one_role_with_everything_it_did() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[
            fpm(1, None, MASTER_TITLE),
            fpm(2, Some(1), "php-fpm: pool www"),
            // Read between its fork and its naming its pool: its master's title.
            fpm(3, Some(1), MASTER_TITLE),
        ]);
        t.apply(&hist(3, HistMetric::Accept, 4));
        assert_eq!(t.get(3).unwrap().role(), "php-fpm8.2 worker");
        assert!(
            t.get(3).unwrap().needs_title(),
            "read again at the next sync"
        );
        assert!(!t.get(2).unwrap().needs_title());
        assert!(!t.get(1).unwrap().needs_title());
        t.reset_interval();
        t.apply(&hist(3, HistMetric::Accept, 1));
        t.sync_watched(&[
            fpm(1, None, MASTER_TITLE),
            fpm(2, Some(1), "php-fpm: pool www"),
            fpm(3, Some(1), "php-fpm: pool www"),
        ]);
        assert_eq!(role_names(&t), ["php-fpm8.2 master", "php-fpm8.2 pool www"]);
        let (pids, pool) = &t.roles(Span::Whole)["php-fpm8.2 pool www"];
        assert_eq!(pids, &[2, 3]);
        assert_eq!(pool.latency[Latency::Accept].total.count(), 5);
        assert_eq!(
            t.roles(Span::Interval)["php-fpm8.2 pool www"].1.latency[Latency::Accept]
                .interval
                .count(),
            1
        );
        // It exits: its numbers stay in its pool.
        t.apply(&exit(3, 10));
        assert_eq!(role_names(&t), ["php-fpm8.2 master", "php-fpm8.2 pool www"]);
        assert_eq!(
            t.roles(Span::Whole)["php-fpm8.2 pool www"].1.latency[Latency::Accept]
                .total
                .count(),
            5
        );
    }

    #[test]
    fn a_worker_that_exits_before_naming_its_pool_joins_its_siblings_pool() {
        let mut t = ProcessTable::default();
        t.sync_watched(&[
            fpm(1, None, MASTER_TITLE),
            fpm(2, Some(1), "php-fpm: pool www"),
            fpm(3, Some(1), MASTER_TITLE),
        ]);
        t.apply(&hist(3, HistMetric::Accept, 2));
        t.apply(&exit(3, 10));
        assert_eq!(role_names(&t), ["php-fpm8.2 master", "php-fpm8.2 pool www"]);
        let pool = &t.roles(Span::Whole)["php-fpm8.2 pool www"].1;
        assert_eq!(
            (
                pool.latency[Latency::Accept].total.count(),
                pool.counts[Count::Exited].total
            ),
            (2, 1)
        );
        // With pools of two names, which one it served is not known.
        t.sync_watched(&[
            fpm(1, None, MASTER_TITLE),
            fpm(2, Some(1), "php-fpm: pool www"),
            fpm(4, Some(1), "php-fpm: pool api"),
            fpm(5, Some(1), MASTER_TITLE),
        ]);
        t.apply(&exit(5, 20));
        assert!(role_names(&t).contains(&"php-fpm8.2 worker".to_string()));
    }

    #[test]
    fn a_daemonized_master_is_one_master_with_its_short_lived_parent() {
        let mut t = ProcessTable::default();
        // php-fpm forks its master and exits; the master forks the workers.
        t.sync_watched(&[fpm(1, None, "php-fpm8.2 --fpm-config lab.conf")]);
        t.apply(&spawn(1, 2, "php-fpm8.2", 0));
        t.apply(&exit(1, 1_000));
        t.apply(&hist(2, HistMetric::Thread, 1));
        t.apply(&spawn(2, 3, "php-fpm8.2", 2_000));
        t.apply(&spawn(2, 4, "php-fpm8.2", 3_000));
        t.sync_watched(&[
            fpm(2, Some(1), MASTER_TITLE),
            fpm(3, Some(2), "php-fpm: pool www"),
            fpm(4, Some(2), "php-fpm: pool www"),
        ]);
        assert_eq!(role_names(&t), ["php-fpm8.2 master", "php-fpm8.2 pool www"]);
        let (pids, master) = &t.roles(Span::Whole)["php-fpm8.2 master"];
        assert_eq!(pids, &[2]);
        assert_eq!(
            (
                master.counts[Count::Exited].total,
                master.latency[Latency::Thread].total.count()
            ),
            (1, 1)
        );
    }
}
