//! stackprobe's own cost, measured as it runs: BPF run time per program run
//! (when the kernel's run-time statistics are on) and its CPU use.

use std::time::{Duration, Instant};

use super::proc_file::ProcFile;
use stackprobe_model::frame::OwnCost;
use stackprobe_probes::Probes;

pub struct Meter {
    /// Program runs and their run time at the last sample.
    runs_and_ns: Option<(u64, u64)>,
    /// CPU time used, and when, at the last sample.
    cpu: (Duration, Instant),
    statm: ProcFile,
}

impl Meter {
    pub fn new(probes: &Probes, measured: bool) -> Self {
        Self {
            runs_and_ns: measured.then(|| totals(probes)).flatten(),
            cpu: (cpu_time(), Instant::now()),
            statm: ProcFile::new("/proc/self/statm"),
        }
    }

    /// The cost since the last sample, and the totals now.
    pub fn sample(&mut self, probes: &Probes) -> OwnCost {
        OwnCost {
            ns_per_run: self.ns_per_run(probes),
            cpu_percent: self.cpu_percent(),
            cpu_seconds: self.cpu.0.as_secs_f64(),
            resident_bytes: resident_bytes(&mut self.statm).unwrap_or(0),
        }
    }

    fn ns_per_run(&mut self, probes: &Probes) -> Option<f64> {
        let (runs0, ns0) = self.runs_and_ns?;
        let (runs, ns) = totals(probes)?;
        self.runs_and_ns = Some((runs, ns));
        (runs > runs0).then(|| (ns - ns0) as f64 / (runs - runs0) as f64)
    }

    fn cpu_percent(&mut self) -> f64 {
        let (cpu, at) = (cpu_time(), Instant::now());
        let used = cpu.saturating_sub(self.cpu.0).as_secs_f64();
        let wall = (at - self.cpu.1).as_secs_f64();
        self.cpu = (cpu, at);
        if wall > 0.0 { 100.0 * used / wall } else { 0.0 }
    }
}

fn totals(probes: &Probes) -> Option<(u64, u64)> {
    let costs = probes.costs().ok()?;
    Some(
        costs
            .iter()
            .fold((0, 0), |(r, n), c| (r + c.runs, n + c.run_time_ns)),
    )
}

/// Resident memory from /proc/self/statm (its second field, in pages).
fn resident_bytes(statm: &mut ProcFile) -> Option<u64> {
    let statm = statm.read()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

fn cpu_time() -> Duration {
    // SAFETY: getrusage fills the struct we pass, and RUSAGE_SELF is valid.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}
