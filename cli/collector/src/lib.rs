//! The pipeline, written once: the collector owns the probes, their event
//! stream and the process table. Between reports it moves events into the
//! table as they come; each interval (`tick`) and once at the end (`finish`)
//! it runs the same sequence — drain the ring, merge what the kernel's
//! histograms gained,
//! follow the watch set, look at the sockets, build the report, look at the
//! host's CPUs, explain it —
//! and hands the result to whoever asked, as a [`Frame`].

mod busy;
pub mod cgroups;
pub mod containers;
mod cost;
mod fds;
mod host;
mod proc_file;
mod sockets;
mod unix_sockets;
mod watch_set;

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use stackprobe_model::{
    counter::Counter,
    frame::Frame,
    insights,
    process::{LiveProcess, ProcessTable},
    report::{CountRow, Report, ReportKind},
    selector::Selector,
};
use stackprobe_probes::procfs;
use stackprobe_probes::{Options, Probes, events::EventStream};

pub struct Collector {
    probes: Probes,
    events: EventStream,
    table: ProcessTable,
    selector: Selector,
    watch_set: watch_set::WatchSet,
    sockets: sockets::Sockets,
    unix_sockets: unix_sockets::UnixSockets,
    busy: busy::Busy,
    /// Watched processes alive at the last look, by pid and name.
    watching: Vec<(u32, String)>,
    /// Ring buffer events received: this interval and since the start.
    received: Counter,
    /// Events, histogram gains or a change of the watch set since the last
    /// look at the sockets: what a walk could see anew.
    stirred: bool,
    cost: cost::Meter,
    host: host::Host,
    probe_cost: bool,
    start: Instant,
    last_tick: Instant,
}

impl Collector {
    /// Loads and attaches the probes, watches what `selector` names, and
    /// takes a first look at the processes and sockets. A selector that
    /// names nothing leaves it to the caller to watch pids through
    /// `probes_mut`. Needs a tokio runtime (the event stream registers with
    /// it).
    pub fn start(selector: Selector, options: Options) -> Result<Self> {
        for &pid in selector.pids() {
            match procfs::read(pid) {
                Some(p) if p.is_process() => {}
                Some(p) => bail!(
                    "{pid} is a thread of process {}; pass the process id",
                    p.tgid
                ),
                None => bail!("no process with pid {pid}"),
            }
        }
        let mut probes = Probes::load(options)?;
        probes.watch_names(&selector.kernel_comm_keys())?;
        if !selector.cgroups().is_empty() {
            probes.watch_cgroups(&cgroups::ids(&cgroups::mount()?, selector.cgroups()))?;
        }
        for &pid in selector.pids() {
            probes.watch_pid(pid)?;
        }
        // Loading parsed the kernel's BTF (aya's parse and our offsets' one):
        // some 25 MB now free that malloc would otherwise keep for the whole run.
        // musl has none: its malloc hands freed pages back by itself.
        // SAFETY: malloc_trim only returns free heap pages to the kernel.
        #[cfg(target_env = "gnu")]
        unsafe {
            libc::malloc_trim(0)
        };
        let events = EventStream::new(probes.take_events()?).context("polling the ring buffer")?;
        let now = Instant::now();
        let mut collector = Self {
            cost: cost::Meter::new(&probes, options.probe_cost),
            host: host::Host::default(),
            probes,
            events,
            table: ProcessTable::default(),
            selector,
            watch_set: watch_set::WatchSet::default(),
            sockets: sockets::Sockets::default(),
            unix_sockets: unix_sockets::UnixSockets::default(),
            // The period the summary's numbers are over starts here, as
            // `start` does: nothing was served before (the self-check's
            // connection is forgotten).
            busy: busy::Busy::new(busy::probes_clock_ns()),
            watching: Vec::new(),
            received: Counter::default(),
            stirred: false,
            probe_cost: options.probe_cost,
            start: now,
            last_tick: now,
        };
        collector.refresh()?;
        collector.observe_sockets()?;
        Ok(collector)
    }

    /// Watched processes alive at the last look, by pid and name.
    pub fn watching(&self) -> &[(u32, String)] {
        &self.watching
    }

    /// Waits until the kernel signals a filling ring, then moves what
    /// arrived into the table; every report drains it too, so between
    /// reports nothing wakes stackprobe but a burst (an idle wakeup cost
    /// it a quarter of its CPU when it drained every 250 ms). Cancel-safe:
    /// nothing is taken from the ring before the wait ends.
    pub async fn pump(&mut self) -> Result<()> {
        self.events
            .readable()
            .await
            .context("waiting on the ring buffer")?;
        self.drain_ring();
        Ok(())
    }

    /// Moves every event waiting in the ring buffer into the table, and what
    /// the kernel's latency histograms gained; returns how many ring buffer
    /// events there were.
    pub fn drain(&mut self) -> Result<usize> {
        let n = self.drain_ring();
        let mut gained = Vec::new();
        let table = &self.table;
        self.probes
            .drain_histograms(|pid| table.get(pid).is_some(), |e| gained.push(e))?;
        self.stirred |= !gained.is_empty();
        for e in &gained {
            self.table.apply(e);
        }
        Ok(n)
    }

    fn drain_ring(&mut self) -> usize {
        let table = &mut self.table;
        let n = self.events.drain(|e| table.apply(&e));
        self.received.add(n as u64);
        self.stirred |= n > 0;
        n
    }

    /// Ends an interval: hands `sink` its frame, then starts the next one.
    pub fn tick<T>(&mut self, sink: impl FnOnce(&Frame) -> Result<T>) -> Result<T> {
        let out = self.report(ReportKind::Interval, sink)?;
        self.last_tick = Instant::now();
        self.received.interval = 0;
        self.table.reset_interval();
        self.unix_sockets.reset_interval();
        Ok(out)
    }

    /// The summary since the start (after the last interval's events).
    pub fn finish<T>(&mut self, sink: impl FnOnce(&Frame) -> Result<T>) -> Result<T> {
        self.report(ReportKind::Summary, sink)
    }

    fn report<T>(&mut self, kind: ReportKind, sink: impl FnOnce(&Frame) -> Result<T>) -> Result<T> {
        self.drain()?;
        // Children forked while the histograms were read: their spawn
        // events name them and their parents, so the watch set needs no
        // read of their /proc entries (a postgres backend per request).
        self.drain_ring();
        self.refresh()?;
        // The summary's TIME_WAIT is from a walk at its end.
        self.look_at_sockets(kind == ReportKind::Summary)?;
        let now = Instant::now();
        // The busy counts' period ends with the report's.
        let now_ns = busy::probes_clock_ns();
        let interval = now - self.last_tick;
        let elapsed = now - self.start;
        let period = match kind {
            ReportKind::Interval => interval,
            ReportKind::Summary => elapsed,
        };
        let mut report = Report::build(kind, &self.table, period, elapsed, self.probes.drops()?);
        report.events = CountRow {
            count: match kind {
                ReportKind::Interval => self.received.interval,
                ReportKind::Summary => self.received.total,
            },
            total: self.received.total,
        };
        if self.probe_cost {
            report.probe_cost = self.probes.costs()?;
        }
        report.rungs = self.probes.rungs_in_use();
        report.host = self.host.read();
        self.unix_backlogs(&mut report)?;
        self.busy
            .fill(&mut self.probes, &self.table, now_ns, &mut report)?;
        // The chains again, with the busy rows and unix listeners' losses.
        stackprobe_model::report::link_chains(&mut report);
        insights::annotate(&mut report);
        sink(&Frame {
            report,
            table: &self.table,
            interval_start: self.last_tick - self.start,
            interval,
            cost: self.cost.sample(&self.probes),
            watching: &self.watching,
        })
    }

    /// Each watched unix listener's backlog now, as the last refresh
    /// listed it, and the connects its full queue refused, on the rows that
    /// show it (TCP listeners' come from the walk of the sockets); a
    /// listener that lost connects has a row even if nothing accepted from
    /// it.
    fn unix_backlogs(&mut self, report: &mut Report) -> Result<()> {
        self.unix_sockets.observe_lost(&self.probes)?;
        for (owner, l) in self.unix_sockets.listeners() {
            let Some(holder) = self.table.get(*owner).map(|p| p.role()) else {
                continue;
            };
            let lost = self.unix_sockets.lost(l.inode);
            let lost = CountRow {
                count: match report.kind {
                    ReportKind::Interval => lost.interval,
                    ReportKind::Summary => lost.total,
                },
                total: lost.total,
            };
            let backlog = self
                .unix_sockets
                .queues_known()
                .then_some((l.queued, l.max_backlog));
            report.attach_listener(&holder, &l.path, backlog, lost);
        }
        Ok(())
    }

    /// Forgets everything measured so far (the dashboard's reset key).
    pub fn reset(&mut self) {
        self.table = ProcessTable::default();
        self.unix_sockets.forget_lost();
    }

    /// Follows the watch set: new processes with a selected name, children
    /// of watched ones; mirrors it into the table.
    pub fn refresh(&mut self) -> Result<()> {
        let live: Vec<LiveProcess> =
            self.watch_set
                .refresh(&self.selector, &mut self.probes, &self.table)?;
        let watching: Vec<(u32, String)> = live.iter().map(|p| (p.pid, p.name.clone())).collect();
        self.stirred |= watching != self.watching;
        self.watching = watching;
        self.table.sync_watched(&live);
        self.unix_sockets.refresh(&mut self.probes, &self.table)
    }

    /// Looks at every TCP socket: links' counts, listeners, their owners
    /// and backlogs, TIME_WAIT per link.
    pub fn observe_sockets(&mut self) -> Result<()> {
        self.look_at_sockets(true)
    }

    /// Takes in the links' counts; walks the sockets if `force_walk` or
    /// when due (less often when they are many).
    fn look_at_sockets(&mut self, force_walk: bool) -> Result<()> {
        let stirred = std::mem::take(&mut self.stirred);
        let snapshot = self
            .sockets
            .snapshot(&mut self.probes, &self.table, force_walk, stirred)?;
        self.table.links.observe_snapshot(snapshot);
        // Links of exited processes that stopped counting: forgotten in the
        // kernel, so short-lived owners leave no keys behind.
        let table = &self.table;
        let gone = table.links.forgettable(|pid| table.get(pid).is_some());
        if !gone.is_empty() {
            self.probes.forget_tcp_links(&gone)?;
        }
        Ok(())
    }

    /// Ring buffer records that matched no known layout (a probe/userspace
    /// mismatch).
    pub fn undecodable(&self) -> u64 {
        self.events.undecodable()
    }

    pub fn probes(&self) -> &Probes {
        &self.probes
    }

    pub fn probes_mut(&mut self) -> &mut Probes {
        &mut self.probes
    }

    pub fn table(&self) -> &ProcessTable {
        &self.table
    }

    #[cfg(any(test, feature = "test-support"))]
    pub fn table_mut(&mut self) -> &mut ProcessTable {
        &mut self.table
    }

    /// Time since the probes were attached.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}
