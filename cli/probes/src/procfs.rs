//! What /proc says about processes: the userspace half of process selection
//! (the kernel half follows exec and fork).

use std::{fs, path::Path};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcInfo {
    pub pid: u32,
    pub tgid: u32,
    pub ppid: u32,
    pub comm: String,
    pub exe_basename: Option<String>,
    /// A zombie: exited, not yet reaped.
    pub zombie: bool,
    /// Its pid in its own pid namespace, where that differs (a container's).
    pub ns_pid: Option<u32>,
}

impl ProcInfo {
    /// A process (thread-group leader) rather than one of its other threads.
    pub fn is_process(&self) -> bool {
        self.pid == self.tgid
    }
}

pub fn read(pid: u32) -> Option<ProcInfo> {
    let dir = Path::new("/proc").join(pid.to_string());
    let status = fs::read_to_string(dir.join("status")).ok()?;
    let (tgid, ppid) = parse_status(&status)?;
    let zombie = status
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .is_some_and(|s| matches!(s.trim_start().chars().next(), Some('Z' | 'X')));
    let comm = fs::read_to_string(dir.join("comm"))
        .ok()?
        .trim_end_matches('\n')
        .to_string();
    // Unreadable for kernel threads and vanished processes.
    let exe_basename = fs::read_link(dir.join("exe")).ok().and_then(|p| {
        let name = p.file_name()?.to_string_lossy().into_owned();
        // An executable replaced on disk reads as "name (deleted)".
        Some(
            name.strip_suffix(" (deleted)")
                .map(str::to_string)
                .unwrap_or(name),
        )
    });
    Some(ProcInfo {
        pid,
        tgid,
        ppid,
        comm,
        exe_basename,
        zombie,
        ns_pid: parse_ns_pid(&status, pid),
    })
}

/// Every process (thread-group leader) now running; zombies (exited, not
/// yet reaped) are not running.
pub fn processes() -> Vec<ProcInfo> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(read)
        .filter(|p| !p.zombie)
        .collect()
}

/// Whether `pid` still has a /proc entry (one stat, where `read` reads
/// three files).
pub fn alive(pid: u32) -> bool {
    Path::new("/proc").join(pid.to_string()).exists()
}

/// The process's comm (`task_struct::comm`).
pub fn comm(pid: u32) -> Option<String> {
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end_matches('\n').to_string())
}

/// The process's command line as one string: how forking servers title their
/// processes (`postgres: app db 127.0.0.1(51234) idle`, `php-fpm: pool www`).
pub fn cmdline(pid: u32) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let text = String::from_utf8_lossy(&raw).replace('\0', " ");
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// Inodes of the sockets `pid` holds open (its `socket:[N]` fd links).
pub fn socket_inodes(pid: u32) -> Vec<u64> {
    let Ok(entries) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| fs::read_link(e.ok()?.path()).ok())
        .filter_map(|target| {
            let t = target.to_str()?;
            t.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// The address of the listening socket `pid` holds as `fd`: `127.0.0.1:5432`
/// or `[::1]:5432` for TCP, the path for a unix socket (`@name` in the
/// abstract namespace). None if the fd is not a listening socket, or the
/// process is gone. Asked of a duplicate of the fd (pidfd_getfd), not of
/// /proc/PID/net/tcp: reading that walks the kernel's whole table of
/// connections, tens of milliseconds with thousands of TIME_WAIT sockets.
pub fn listener_name(pid: u32, fd: u32) -> Option<String> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    // SAFETY: plain syscalls; each fd they return is owned at once.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let pidfd = unsafe { OwnedFd::from_raw_fd(i32::try_from(pidfd).ok().filter(|&f| f >= 0)?) };
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    let dup = unsafe { OwnedFd::from_raw_fd(i32::try_from(dup).ok().filter(|&f| f >= 0)?) };
    let mut listening: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: the option is an int, and `len` says so.
    let ok = unsafe {
        libc::getsockopt(
            dup.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ACCEPTCONN,
            (&raw mut listening).cast(),
            &mut len,
        )
    };
    if ok != 0 || listening == 0 {
        return None;
    }
    // SAFETY: sockaddr_storage is plain data, zeroes included, and holds
    // any address getsockname writes; `len` says how much it may.
    let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let ok = unsafe { libc::getsockname(dup.as_raw_fd(), (&raw mut addr).cast(), &mut len) };
    (ok == 0)
        .then(|| socket_address(&addr, len as usize))
        .flatten()
}

/// A socket address as the views write it.
fn socket_address(addr: &libc::sockaddr_storage, len: usize) -> Option<String> {
    let family = libc::c_int::from(addr.ss_family);
    // SAFETY (each cast): sockaddr_storage is large and aligned enough for
    // every address type, and the family says which one it holds.
    match family {
        libc::AF_INET => {
            let a = unsafe { &*(&raw const *addr).cast::<libc::sockaddr_in>() };
            let ip = std::net::Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(std::net::SocketAddr::from((ip, u16::from_be(a.sin_port))).to_string())
        }
        libc::AF_INET6 => {
            let a = unsafe { &*(&raw const *addr).cast::<libc::sockaddr_in6>() };
            let ip = std::net::Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(std::net::SocketAddr::from((ip, u16::from_be(a.sin6_port))).to_string())
        }
        libc::AF_UNIX => {
            let a = unsafe { &*(&raw const *addr).cast::<libc::sockaddr_un>() };
            let path_len = len.saturating_sub(size_of::<libc::sa_family_t>());
            let path: Vec<u8> = a.sun_path[..path_len.min(a.sun_path.len())]
                .iter()
                .map(|&c| c as u8)
                .collect();
            Some(match path.split_first() {
                None => "(unnamed unix socket)".to_string(),
                // The abstract namespace: a leading NUL, no terminating one.
                Some((0, name)) => format!("@{}", String::from_utf8_lossy(name)),
                Some(_) => String::from_utf8_lossy(path.split(|&c| c == 0).next().unwrap_or(&[]))
                    .into_owned(),
            })
        }
        _ => None,
    }
}

/// The TcpExt counters of /proc/net/netstat named in `names` (cumulative
/// since boot, for the whole machine: `ListenOverflows`, `ListenDrops`,
/// `TCPTimeWaitOverflow`…), None where absent. Read each interval: only the
/// named are kept, none of the hundred others.
pub fn tcp_ext_counters<const N: usize>(names: [&str; N]) -> [Option<u64>; N] {
    fs::read_to_string("/proc/net/netstat")
        .map(|text| parse_netstat(&text, "TcpExt:", names))
        .unwrap_or([None; N])
}

fn parse_netstat<const N: usize>(text: &str, section: &str, names: [&str; N]) -> [Option<u64>; N] {
    let mut out = [None; N];
    for (name, value) in net_section(text, section) {
        if let Some(i) = names.iter().position(|n| *n == name) {
            out[i] = value.parse().ok();
        }
    }
    out
}

/// The (name, value) pairs of one section (`Tcp:`, `TcpExt:`…) of
/// /proc/net/snmp or /proc/net/netstat's text: a line of names, then one of
/// values, each starting with the section's name. Empty if it is missing.
pub fn net_section<'a>(text: &'a str, section: &str) -> Vec<(&'a str, &'a str)> {
    let mut lines = text.lines().filter(|l| l.starts_with(section));
    let (Some(names), Some(values)) = (lines.next(), lines.next()) else {
        return Vec::new();
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .skip(1)
        .collect()
}

/// `net.ipv4.ip_local_port_range`: the ephemeral ports connections use.
pub fn local_port_range() -> Option<(u16, u16)> {
    let text = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<u16>());
    Some((it.next()?.ok()?, it.next()?.ok()?))
}

/// The largest pid plus one (`kernel.pid_max`); 2^22, the kernel's ceiling,
/// if unreadable.
/// The inode number of `pid`'s network namespace (`/proc/PID/ns/net`).
pub fn netns(pid: u32) -> Option<u32> {
    use std::os::unix::fs::MetadataExt as _;
    fs::metadata(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|m| m.ino() as u32)
}

pub fn pid_max() -> u32 {
    fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1 << 22)
}

/// Whether `pid` is gone or a zombie (exited, not yet reaped).
pub fn has_exited(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => parse_state(&stat).is_none_or(|s| matches!(s, 'Z' | 'X' | 'x')),
        Err(_) => true,
    }
}

/// The state letter of /proc/PID/stat, after the parenthesised comm (which
/// may itself contain ") ").
fn parse_state(stat: &str) -> Option<char> {
    stat.rsplit_once(") ")?.1.chars().next()
}

/// The innermost pid of /proc/PID/status's `NSpid:` line (the pid as the
/// process's own pid namespace sees it), where it is not `pid`.
pub fn parse_ns_pid(status: &str, pid: u32) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
    let inner: u32 = line.split_whitespace().last()?.parse().ok()?;
    (inner != pid).then_some(inner)
}

/// `pid`'s pid in its own pid namespace, where that differs.
pub fn ns_pid(pid: u32) -> Option<u32> {
    parse_ns_pid(
        &fs::read_to_string(format!("/proc/{pid}/status")).ok()?,
        pid,
    )
}

/// `pid`'s cgroup v2 path (the `0::` line of /proc/PID/cgroup).
pub fn cgroup(pid: u32) -> Option<String> {
    let text = fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(str::to_string)
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` beside v1 controllers).
pub fn cgroup2_mount() -> Option<std::path::PathBuf> {
    let text = fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (mount, fs_type) = l.split_once(" - ")?;
        fs_type.starts_with("cgroup2 ").then(|| {
            mount
                .split_whitespace()
                .nth(4)
                .map(std::path::PathBuf::from)
        })?
    })
}

/// `(Tgid, PPid)` from /proc/PID/status.
pub fn parse_status(status: &str) -> Option<(u32, u32)> {
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    Some((field("Tgid:")?, field("PPid:")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tgid_and_ppid() {
        let status = "Name:\tpostgres\nUmask:\t0077\nState:\tS (sleeping)\nTgid:\t812\nNgid:\t0\nPid:\t813\nPPid:\t1\n";
        assert_eq!(parse_status(status), Some((812, 1)));
        assert_eq!(parse_status("Name:\tx\n"), None);
    }

    #[test]
    fn parses_the_pid_inside_a_pid_namespace() {
        assert_eq!(parse_ns_pid("Pid:\t5120\nNSpid:\t5120\t1\n", 5120), Some(1));
        assert_eq!(parse_ns_pid("NSpid:\t812\n", 812), None);
        assert_eq!(parse_ns_pid("Pid:\t812\n", 812), None);
    }

    #[test]
    fn parses_tcp_ext_counters() {
        let text = "TcpExt: SyncookiesSent ListenOverflows ListenDrops\nTcpExt: 0 7 9\nIpExt: InNoRoutes\nIpExt: 3\n";
        let names = ["ListenDrops", "ListenOverflows", "TCPTimeWaitOverflow"];
        assert_eq!(
            parse_netstat(text, "TcpExt:", names),
            [Some(9), Some(7), None]
        );
        assert_eq!(parse_netstat("garbage", "TcpExt:", names), [None; 3]);
        assert!(tcp_ext_counters(["ListenOverflows"])[0].is_some());
        let (lo, hi) = local_port_range().unwrap();
        assert!(lo < hi);
    }

    #[test]
    fn parses_the_state_after_a_tricky_comm() {
        assert_eq!(parse_state("42 (a) b) S 1 42"), Some('S'));
        assert_eq!(parse_state("42 (x) Z 1"), Some('Z'));
        assert_eq!(parse_state("garbage"), None);
        assert!(!has_exited(std::process::id()));
    }

    #[test]
    fn names_a_processs_listeners_from_their_fds() {
        use std::os::fd::AsRawFd as _;
        let me = std::process::id();
        let name = |fd: &dyn std::os::fd::AsRawFd| listener_name(me, fd.as_raw_fd() as u32);
        let v4 = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(name(&v4), Some(v4.local_addr().unwrap().to_string()));
        let v6 = std::net::TcpListener::bind("[::1]:0").unwrap();
        assert_eq!(name(&v6), Some(v6.local_addr().unwrap().to_string()));
        let dir = std::env::temp_dir().join(format!("procfs-listener-{me}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("srv.sock");
        let unix = std::os::unix::net::UnixListener::bind(&path).unwrap();
        assert_eq!(name(&unix).as_deref(), path.to_str());
        // A connected socket is not a listener.
        let client = std::net::TcpStream::connect(v4.local_addr().unwrap()).unwrap();
        assert_eq!(name(&client), None);
        assert_eq!(listener_name(me, 999_999), None, "no such fd");
        assert!(client.as_raw_fd() > 0);
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reads_this_process() {
        let me = read(std::process::id()).unwrap();
        assert!(me.is_process());
        assert!(!me.zombie);
        assert_eq!(me.ppid, std::os::unix::process::parent_id());
        assert!(!me.comm.is_empty());
    }
}
