//! The machine's TCP settings and counters as the tests read and restore them.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use stackprobe_probes::procfs;

/// A sysctl set for a test and put back as it was when dropped (also when
/// the test panics).
pub struct Sysctl {
    path: PathBuf,
    was: String,
}

impl Sysctl {
    pub fn set(name: &str, value: &str) -> Self {
        let path = Path::new("/proc/sys").join(name.replace('.', "/"));
        let was = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, value).unwrap();
        Self { path, was }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.path, self.was.trim());
    }
}

/// The kernel's TCP counters (/proc/net/snmp's `Tcp:` and /proc/net/netstat's
/// `TcpExt:`), so a failing test can say what the kernel did meanwhile
/// (retransmits, resets, TIME_WAIT overflows or reuse).
pub struct TcpCounters(Vec<(String, i64)>);

impl TcpCounters {
    pub fn now() -> Self {
        let mut all = Vec::new();
        for (file, section) in [("/proc/net/snmp", "Tcp:"), ("/proc/net/netstat", "TcpExt:")] {
            let text = std::fs::read_to_string(file).unwrap_or_default();
            all.extend(
                procfs::net_section(&text, section)
                    .into_iter()
                    .filter_map(|(n, v)| Some((format!("{section}{n}"), v.parse().ok()?))),
            );
        }
        Self(all)
    }

    /// The counter `name` (`TcpExt:TCPTimeWaitOverflow`), 0 if absent.
    fn value(&self, name: &str) -> i64 {
        self.0
            .iter()
            .find(|(n, _)| n == name)
            .map_or(0, |(_, v)| *v)
    }

    /// How much the counter `name` gained since `before`.
    pub fn gained(&self, before: &Self, name: &str) -> i64 {
        self.value(name) - before.value(name)
    }

    /// The counters that changed since `before`, with by how much.
    pub fn since(&self, before: &Self) -> Vec<(String, i64)> {
        self.0
            .iter()
            .filter_map(|(name, now)| {
                let gained = now - before.value(name);
                (gained != 0).then(|| (name.clone(), gained))
            })
            .collect()
    }
}

/// How many TCP sockets towards `peer` (ip:port) ss lists in each state
/// (`TIME-WAIT`, `FIN-WAIT-2`…), from one listing.
pub fn ss_states_towards(peer: &str) -> BTreeMap<String, usize> {
    let out = Command::new("ss").args(["-Htan"]).output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let mut states = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.get(4) == Some(&peer) {
            *states.entry(cols[0].to_string()).or_default() += 1;
        }
    }
    states
}
