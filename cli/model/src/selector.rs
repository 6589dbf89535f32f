//! Which processes `stackprobe watch` selects: by name (the process's comm or
//! its executable's basename), by pid, or by cgroup (everything in a cgroup
//! v2 subtree: `--cgroup`, and `--container`, resolved to its cgroup). The kernel applies the same name rule
//! at exec (probes-ebpf/src/watch.rs), on comm alone; the version rule both
//! use is probes_common::watch::version_start.

use anyhow::{Result, bail};
use probes_common::watch::version_start;

/// `task_struct::comm` holds 15 bytes and a NUL.
pub const COMM_MAX: usize = 15;

#[derive(Clone, Debug, Default)]
pub struct Selector {
    names: Vec<String>,
    pids: Vec<u32>,
    /// cgroup v2 paths as /proc/PID/cgroup gives them (`/system.slice/x`).
    cgroups: Vec<String>,
}

impl Selector {
    pub fn new(names: Vec<String>, pids: Vec<u32>) -> Result<Self> {
        if names.is_empty() && pids.is_empty() {
            bail!(
                "name at least one process to watch (NAME, --pid PID, --container NAME|ID or --cgroup PATH)"
            );
        }
        for name in &names {
            if name.is_empty() || name.contains(['/', '\0']) {
                bail!(
                    "{name:?} is not a process name (a comm or executable basename, without '/')"
                );
            }
        }
        if let Some(pid) = pids.iter().find(|&&p| p == 0) {
            bail!("{pid} is not a process id");
        }
        Ok(Self {
            names,
            pids,
            cgroups: Vec::new(),
        })
    }

    /// Names, pids and cgroups (v2 paths from the hierarchy's root); at
    /// least one of them.
    pub fn with_cgroups(names: Vec<String>, pids: Vec<u32>, cgroups: Vec<String>) -> Result<Self> {
        if cgroups.is_empty() {
            return Self::new(names, pids);
        }
        if let Some(c) = cgroups.iter().find(|c| !c.starts_with('/')) {
            bail!("{c:?} is not a cgroup path from the hierarchy's root");
        }
        // Names and pids are checked as `new` checks them, but none is needed.
        let mut s = if names.is_empty() && pids.is_empty() {
            Self::default()
        } else {
            Self::new(names, pids)?
        };
        s.cgroups = cgroups;
        Ok(s)
    }

    pub fn cgroups(&self) -> &[String] {
        &self.cgroups
    }

    /// Whether a process in cgroup `path` is selected: it lies in a selected
    /// cgroup or below one.
    pub fn matches_cgroup(&self, path: &str) -> bool {
        self.cgroups.iter().any(|c| {
            path == c
                || c == "/"
                || path
                    .strip_prefix(c.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
        })
    }

    pub fn names(&self) -> &[String] {
        &self.names
    }

    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// Whether a process with this comm and executable basename is selected by
    /// name. A trailing version (`php-fpm8.2`, `postgres15`) is ignored, so
    /// `watch php-fpm` finds Debian's versioned binaries.
    pub fn matches_name(&self, comm: &str, exe_basename: Option<&str>) -> bool {
        self.names.iter().any(|name| {
            let short = truncate_comm(name);
            comm == short
                || strip_version(comm) == short
                || exe_basename.is_some_and(|exe| exe == name || strip_version(exe) == name)
        })
    }

    /// The keys the kernel looks comm up in: each name cut to comm's length and
    /// NUL-padded.
    pub fn kernel_comm_keys(&self) -> Vec<[u8; COMM_MAX + 1]> {
        self.names
            .iter()
            .map(|name| {
                let mut key = [0u8; COMM_MAX + 1];
                let short = truncate_comm(name).as_bytes();
                key[..short.len()].copy_from_slice(short);
                key
            })
            .collect()
    }
}

fn truncate_comm(name: &str) -> &str {
    let mut end = name.len().min(COMM_MAX);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Drops a trailing run of digits and dots, unless that would leave nothing:
/// the kernel's rule at exec (probes_common::watch::version_start).
pub fn strip_version(name: &str) -> &str {
    // The cut is before an ASCII byte, so on a char boundary.
    match version_start(name.as_bytes()) {
        Some(start) => &name[..start],
        None => name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(names: &[&str]) -> Selector {
        Selector::new(names.iter().map(|s| s.to_string()).collect(), vec![]).unwrap()
    }

    #[test]
    fn a_cgroup_selects_its_subtree_only() {
        let s =
            Selector::with_cgroups(vec![], vec![], vec!["/system.slice/a.scope".into()]).unwrap();
        assert!(s.matches_cgroup("/system.slice/a.scope"));
        assert!(s.matches_cgroup("/system.slice/a.scope/init"));
        assert!(!s.matches_cgroup("/system.slice/a.scope2"));
        assert!(!s.matches_cgroup("/system.slice"));
        assert!(!s.matches_name("a", None));
        assert!(Selector::with_cgroups(vec![], vec![], vec!["x".into()]).is_err());
        assert!(Selector::with_cgroups(vec![], vec![], vec![]).is_err());
    }

    #[test]
    fn exact_comm_and_exe_match() {
        let s = sel(&["postgres"]);
        assert!(s.matches_name("postgres", None));
        assert!(s.matches_name("postmaster", Some("postgres")));
        assert!(!s.matches_name("postgres_export", Some("postgres_exporter")));
        assert!(!s.matches_name("post", None));
    }

    #[test]
    fn versioned_binaries_match_their_base_name() {
        let s = sel(&["php-fpm"]);
        assert!(s.matches_name("php-fpm8.2", Some("php-fpm8.2")));
        assert!(!s.matches_name("php-fpm-exporter", None));
        assert!(sel(&["7"]).matches_name("7", None));
    }

    #[test]
    fn long_names_match_the_truncated_comm() {
        let s = sel(&["a-very-long-daemon-name"]);
        assert!(s.matches_name("a-very-long-dae", None));
        assert!(s.matches_name("other", Some("a-very-long-daemon-name")));
        assert_eq!(&s.kernel_comm_keys()[0], b"a-very-long-dae\0");
    }

    #[test]
    fn kernel_keys_are_nul_padded() {
        assert_eq!(
            &sel(&["nginx"]).kernel_comm_keys()[0],
            b"nginx\0\0\0\0\0\0\0\0\0\0\0"
        );
    }

    #[test]
    fn rejects_empty_and_path_names_and_pid_zero() {
        assert!(Selector::new(vec![], vec![]).is_err());
        assert!(Selector::new(vec!["".into()], vec![]).is_err());
        assert!(Selector::new(vec!["/usr/bin/nginx".into()], vec![]).is_err());
        assert!(Selector::new(vec![], vec![0]).is_err());
        assert!(Selector::new(vec![], vec![42]).is_ok());
    }

    #[test]
    fn strip_version_keeps_names_that_are_all_digits() {
        assert_eq!(strip_version("python3.11"), "python");
        assert_eq!(strip_version("123"), "123");
        assert_eq!(strip_version("nginx"), "nginx");
    }
}
