//! The host at each report: /proc/stat read once (its CPUs and the threads
//! runnable now); the model parses it. A few kilobytes, read in tens of
//! microseconds: nothing beside a report's other reads.

use stackprobe_model::host::HostRow;

use super::proc_file::ProcFile;

/// /proc/stat, kept open.
pub struct Host(ProcFile);

impl Default for Host {
    fn default() -> Self {
        Self(ProcFile::new("/proc/stat"))
    }
}

impl Host {
    /// The host now; None if /proc/stat could not be read or parsed, which
    /// the report shows as a null `host`.
    pub fn read(&mut self) -> Option<HostRow> {
        HostRow::parse_proc_stat(self.0.read()?)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_host_has_a_cpu_and_this_thread_is_not_counted_as_runnable() {
        let mut stat = super::Host::default();
        let host = stat.read().expect("/proc/stat parses");
        assert_eq!(stat.read().map(|h| h.cpus), Some(host.cpus), "read again");
        assert!(host.cpus >= 1, "{host:?}");
        // Every thread of the machine runnable at once is beyond any test
        // host; a runaway count (this thread counted twice, a field
        // misread) would not be.
        assert!(host.runnable < 100_000, "{host:?}");
    }
}
