//! What the whole host looks like at a report: its CPUs and the threads
//! runnable on them, parsed from /proc/stat's text (the collector reads the
//! file; the model only parses it). A role waiting for a CPU is a role on a
//! host with more runnable threads than CPUs, and the insight says both.

use serde::Serialize;

/// The host at the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HostRow {
    /// Online CPUs: /proc/stat's `cpuN` lines.
    pub cpus: u32,
    /// Threads runnable now, running or waiting for a CPU, host-wide
    /// (`procs_running`, the kernel's count of every run queue), less the
    /// one thread of stackprobe's that was running to read it.
    pub runnable: u32,
}

impl HostRow {
    /// Parses /proc/stat: None if it has no `procs_running` or no
    /// `cpuN` line (not /proc/stat, or a kernel that changed it).
    pub fn parse_proc_stat(stat: &str) -> Option<Self> {
        let mut cpus = 0;
        let mut running = None;
        for line in stat.lines() {
            let mut fields = line.split_ascii_whitespace();
            match fields.next() {
                Some(name)
                    if name.strip_prefix("cpu").is_some_and(|n| {
                        !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                    }) =>
                {
                    cpus += 1;
                }
                Some("procs_running") => running = fields.next()?.parse::<u32>().ok(),
                _ => {}
            }
        }
        Some(Self {
            cpus: (cpus > 0).then_some(cpus)?,
            runnable: running?.saturating_sub(1),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// /proc/stat of a 4-CPU machine (6.1), cut to what matters and the
    /// lines around it.
    const STAT: &str = "cpu  10132153 290696 3084719 46828483 16683 0 25195 0 0 0
cpu0 1393827 56817 291520 5841429 2185 0 13476 0 0 0
cpu1 1259543 42102 268845 6038521 2056 0 3010 0 0 0
cpu2 1256848 36617 256982 6066213 1911 0 4069 0 0 0
cpu3 1262032 35213 254620 6068735 1885 0 2052 0 0 0
intr 1462898 0 9 0 0 0 0 3 0 1 1 0 0 125 0 0
ctxt 2542203
btime 1769000000
processes 16870
procs_running 9
procs_blocked 1
softirq 1026374 0 265472 11 17392 13968 0 65 406620 1 322845
";

    #[test]
    fn counts_the_cpus_and_the_runnable_threads_but_its_own() {
        assert_eq!(
            HostRow::parse_proc_stat(STAT),
            Some(HostRow {
                cpus: 4,
                runnable: 8
            })
        );
    }

    #[test]
    fn anything_else_is_none() {
        assert_eq!(HostRow::parse_proc_stat(""), None);
        let no_running: String = STAT
            .lines()
            .filter(|l| !l.starts_with("procs_running"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(HostRow::parse_proc_stat(&no_running), None);
        assert_eq!(
            HostRow::parse_proc_stat("cpu 1 2 3\nprocs_running 3\n"),
            None,
            "no cpuN line"
        );
        assert_eq!(
            HostRow::parse_proc_stat("cpu0 1 2\nprocs_running x\n"),
            None
        );
    }
}
