//! The process table: what was measured for each watched process, for the
//! current interval and since the start, and the lifecycle that links them
//! (who forked whom, when, how long children live).
//!
//! Memory stays bounded however many pids come and go: only live processes
//! have an entry; an exited process retires: its numbers join its role's
//! totals and its entry is removed. Roles are at most [`MAX_ROLES`] (further
//! ones merge into [`OTHER_ROLE`]), so the table holds O(live watched
//! processes + roles).
//!
//! What is stored per process (each metric's histograms, each count, the
//! per-listener and per-destination breakdowns) is in `activity.rs`; the
//! table and the lifecycle are here.

use std::{collections::BTreeMap, sync::Arc};

use rustc_hash::{FxHashMap, FxHashSet};

use super::{
    containers::{self, Container},
    event::{Event, ExecSample, ExitSample, HistDelta, SpawnSample, TaskKind},
    measure::{Count, Latency},
    roles,
    tcp::links::LinkTable,
};

mod activity;
#[cfg(test)]
mod tests;

pub use activity::{
    Activity, ConnectActivity, ListenerActivity, MAX_DESTINATIONS, MAX_LISTENERS, Metric,
    OTHER_DESTINATIONS, OTHER_LISTENERS, Span, UNKNOWN_DESTINATION, UNKNOWN_LISTENER,
};

pub const MAX_ROLES: usize = 256;
pub const OTHER_ROLE: &str = "(other)";

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
        // (`clear` empties a row to this, field by field.)
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

    /// Empties the row as `new` makes one, but for its name's allocation,
    /// kept for the process that reuses it.
    fn clear(&mut self) {
        // Every field named: a new one must be cleared too.
        let Process {
            pid,
            name,
            title,
            parent,
            born_ns,
            forks_own_name,
            watched,
            container,
            ns_pid,
            missed_syncs,
            activity,
        } = self;
        *pid = 0;
        name.clear();
        *title = None;
        *parent = None;
        *born_ns = None;
        *forks_own_name = false;
        *watched = true;
        *container = None;
        *ns_pid = None;
        *missed_syncs = 0;
        activity.clear();
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

    /// Whether /proc's title is worth reading (again): never read for a
    /// name whose role can depend on it, or its role still waits on it.
    /// Only a title can move a role, and only php-fpm's does: reading every
    /// new postgres backend's was 2.4 % of watch's CPU under new.php.
    pub fn needs_title(&self) -> bool {
        (self.title.is_none() && roles::reads_title(&self.name)) || !self.role_settled()
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
    exited_roles: [FxHashMap<u32, RoleName>; 2],
    /// The role each live parent's latest child retired into: where
    /// run-queue samples the kernel kept under the parent for children that
    /// are gone go (see `HistDelta::of_children`). A parent's entry moves to
    /// `exited_children_roles` when it exits, so this holds live processes
    /// only.
    children_roles: FxHashMap<u32, RoleName>,
    /// The same for parents that exited in this interval and the one
    /// before, as `exited_roles`: the kernel's last read of their
    /// children's samples comes after their exit.
    exited_children_roles: [FxHashMap<u32, RoleName>; 2],
    /// The role names the maps above hold, each kept once: a process that
    /// exits per request (postgres's backends) would otherwise copy its
    /// role's name into each of them.
    role_names: FxHashSet<RoleName>,
    /// Rows of retired processes, kept for new ones: a row is over a
    /// kilobyte, and each such allocation made malloc consolidate its
    /// small free chunks (3 % of the collector's time under new.php's fork
    /// per request).
    #[allow(clippy::vec_box, reason = "the boxes are what is reused")]
    spare: Vec<Box<Process>>,
}

/// Retired rows kept for reuse.
const SPARE_ROWS: usize = 16;

/// A role's name, shared.
type RoleName = Arc<str>;

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
        let spare = &mut self.spare;
        self.procs.entry(pid).or_insert_with(|| match spare.pop() {
            // Cleared when its process retired.
            Some(mut b) => {
                b.pid = pid;
                b.name.push_str(name);
                b
            }
            None => Box::new(Process::new(pid, name.to_string())),
        })
    }

    fn record_hist(&mut self, d: &HistDelta) {
        if d.of_children {
            let role = self.children_role(d.tgid);
            self.retired_role(&role).record_kernel(d);
            return;
        }
        let exited_role = (!self.procs.contains_key(&d.tgid))
            .then(|| {
                self.exited_roles
                    .iter()
                    .find_map(|r| r.get(&d.tgid))
                    .cloned()
            })
            .flatten();
        let a = match exited_role {
            Some(role) => self.retired_role(&role),
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
        let forked = proc.born_ns.zip(proc.parent.as_ref().map(|(pid, _)| *pid));
        if let Some((born, parent)) = forked {
            let lifetime = s.ts_ns.saturating_sub(born);
            match self.procs.get_mut(&parent) {
                Some(p) => p.activity.latency[Latency::ChildLifetime].record(lifetime),
                None => {
                    // The parent is gone: credit its role's totals.
                    let parent_name = self.procs[&s.tgid].parent.as_ref().map(|(_, n)| n);
                    let role = roles::role(parent_name.expect("forked"), None, None, true);
                    self.retired_role(&role).latency[Latency::ChildLifetime].record(lifetime);
                }
            }
        }
        self.retire(s.tgid);
    }

    /// The role of `parent`'s children, for samples the kernel kept under
    /// the parent: that of its newest live child whose role is settled,
    /// else the role its latest child retired into, else the role a child
    /// of its name that set no title takes.
    fn children_role(&self, parent: u32) -> String {
        let newest_live = self
            .procs
            .values()
            .filter(|p| p.parent.as_ref().is_some_and(|(pid, _)| *pid == parent))
            .filter(|p| p.role_settled())
            .max_by_key(|p| p.born_ns);
        if let Some(child) = newest_live {
            return child.role();
        }
        let remembered = std::iter::once(&self.children_roles)
            .chain(&self.exited_children_roles)
            .find_map(|roles| roles.get(&parent));
        if let Some(role) = remembered {
            return role.to_string();
        }
        match self.procs.get(&parent) {
            Some(p) => roles::role(&p.name, None, Some(&p.name), false),
            None => format!("[{parent}]"),
        }
    }

    /// Removes `pid`, adding its numbers to its role's totals.
    fn retire(&mut self, pid: u32) {
        let Some(mut proc) = self.procs.remove(&pid) else {
            return;
        };
        let role = self.retiring_role(&proc);
        let role = self.role_name(role);
        if let Some(children) = self.children_roles.remove(&pid) {
            self.exited_children_roles[0].insert(pid, children);
        }
        if let Some((parent, _)) = &proc.parent
            && self.procs.contains_key(parent)
        {
            self.children_roles.insert(*parent, Arc::clone(&role));
        }
        self.exited_roles[0].insert(pid, Arc::clone(&role));
        // Its sockets keep counting on its links under this role.
        self.links.remember_role(pid, &role);
        let retired = self.retired_role(&role);
        retired.add(&proc.activity, Span::Whole);
        retired.counts[Count::Exited].bump();
        if self.spare.len() < SPARE_ROWS {
            // Emptied now: a histogram it shares with its role's sum
            // would be copied at the role's next sample.
            proc.clear();
            self.spare.push(proc);
        }
    }

    /// `role`, as kept once in `role_names`.
    fn role_name(&mut self, role: String) -> RoleName {
        if let Some(name) = self.role_names.get(role.as_str()) {
            return Arc::clone(name);
        }
        let name = RoleName::from(role);
        self.role_names.insert(Arc::clone(&name));
        name
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

    fn retired_role(&mut self, role: &str) -> &mut Activity {
        activity::bounded_entry(&mut self.retired, role, MAX_ROLES - 1, OTHER_ROLE)
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
        // The one before is forgotten; its maps are this interval's, emptied.
        self.exited_roles.swap(0, 1);
        self.exited_roles[0].clear();
        self.exited_children_roles.swap(0, 1);
        self.exited_children_roles[0].clear();
        // Names no map holds any more.
        self.role_names.retain(|name| Arc::strong_count(name) > 1);
        self.links.reset_interval();
    }

    /// Number of roles holding exited processes' totals.
    #[cfg(test)]
    pub fn retired_roles(&self) -> usize {
        self.retired.len()
    }
}
