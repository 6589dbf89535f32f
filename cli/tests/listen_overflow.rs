//! Root only: connections lost at a listener's full queue, per listener,
//! counted exactly against what the clients and the kernel saw: a unix
//! listener's connects refused with EAGAIN (from watched clients and
//! unwatched ones, through another path to the same socket file, and an
//! abstract name), and a TCP listener's drops against the kernel's
//! ListenDrops in a network namespace of its own (nothing else there
//! overflows).

mod support;

use std::{
    ffi::CString,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::Path,
    process::Command,
    time::Duration,
};

use stackprobe_model::report::{CountRow, ListenerLatencyRow, Report};
use stackprobe_probes::procfs;
use support::*;

/// A `sockaddr_un` for a path, or for an abstract name (`@name`).
fn unix_addr(name: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; zeroes are a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let (bytes, skip) = match name.strip_prefix('@') {
        Some(abstract_name) => (abstract_name.as_bytes(), 1),
        None => (name.as_bytes(), 0),
    };
    assert!(
        skip + bytes.len() < addr.sun_path.len(),
        "{name} is too long"
    );
    for (dst, &b) in addr.sun_path[skip..].iter_mut().zip(bytes) {
        *dst = b as libc::c_char;
    }
    let base = std::mem::offset_of!(libc::sockaddr_un, sun_path);
    // A path ends at its NUL; an abstract name is exactly its bytes.
    let len = base + skip + bytes.len() + usize::from(skip == 0);
    (addr, len as libc::socklen_t)
}

/// One non-blocking unix stream connect: Ok(the connected socket), or
/// Err(errno).
fn unix_connect(addr: &(libc::sockaddr_un, libc::socklen_t)) -> Result<OwnedFd, i32> {
    // SAFETY: plain syscalls; the fd is owned at once, and `addr` lives for
    // the call, of the length given.
    unsafe {
        let fd = libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
        let fd = OwnedFd::from_raw_fd(fd);
        if libc::connect(fd.as_raw_fd(), (&raw const addr.0).cast(), addr.1) == 0 {
            Ok(fd)
        } else {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
        }
    }
}

/// `n` non-blocking connects to `name` from this (unwatched) process: the
/// connections made, kept open, and how many the full queue refused
/// (EAGAIN); any other failure fails the test.
fn unix_burst(name: &str, n: usize) -> (Vec<OwnedFd>, u64) {
    let addr = unix_addr(name);
    let mut made = Vec::new();
    let mut refused = 0;
    for _ in 0..n {
        match unix_connect(&addr) {
            Ok(fd) => made.push(fd),
            Err(libc::EAGAIN) => refused += 1,
            Err(e) => panic!(
                "connecting to {name}: {}",
                std::io::Error::from_raw_os_error(e)
            ),
        }
    }
    (made, refused)
}

/// A child process that, once told, connects `n` times to each of `names`
/// (non-blocking) from the directory `cwd`, and says how many a full queue
/// refused: forked, so that it can be watched before it connects. Between
/// the fork and its exit it makes only async-signal-safe calls.
struct Connector {
    pid: u32,
    go: OwnedFd,
    result: OwnedFd,
}

impl Connector {
    fn fork(cwd: &Path, names: &[&str], n: usize) -> Self {
        let addrs: Vec<_> = names.iter().map(|name| unix_addr(name)).collect();
        let cwd = CString::new(cwd.as_os_str().as_encoded_bytes()).unwrap();
        let pipe = || {
            let mut fds = [0; 2];
            // SAFETY: a plain syscall filling `fds`.
            assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
            // SAFETY: both fds are new and owned here.
            unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) }
        };
        let (go_read, go_write) = pipe();
        let (result_read, result_write) = pipe();
        // SAFETY: the child makes only async-signal-safe calls (read,
        // chdir, socket, connect, close, write, _exit) on memory prepared
        // before the fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: see above; the child never returns.
            unsafe {
                let mut byte = 0u8;
                if libc::read(go_read.as_raw_fd(), (&raw mut byte).cast(), 1) != 1
                    || libc::chdir(cwd.as_ptr()) != 0
                {
                    libc::_exit(2);
                }
                let mut refused: u32 = 0;
                for addr in &addrs {
                    for _ in 0..n {
                        let fd =
                            libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
                        if fd < 0 {
                            libc::_exit(3);
                        }
                        if libc::connect(fd, (&raw const addr.0).cast(), addr.1) != 0 {
                            if *libc::__errno_location() != libc::EAGAIN {
                                libc::_exit(4);
                            }
                            refused += 1;
                        }
                        // Connections made stay open until the exit.
                    }
                }
                libc::write(result_write.as_raw_fd(), (&raw const refused).cast(), 4);
                // Wait to be told to exit, so that the parent reads the
                // count while the process is still watched.
                libc::read(go_read.as_raw_fd(), (&raw mut byte).cast(), 1);
                libc::_exit(0);
            }
        }
        drop((go_read, result_write));
        Self {
            pid: pid as u32,
            go: go_write,
            result: result_read,
        }
    }

    /// Lets it connect; returns how many connects the full queue refused.
    fn connect(&self) -> u64 {
        // SAFETY: plain syscalls on pipes held open here.
        unsafe {
            assert_eq!(
                libc::write(self.go.as_raw_fd(), [1u8].as_ptr().cast(), 1),
                1
            );
            let mut refused: u32 = 0;
            assert_eq!(
                libc::read(self.result.as_raw_fd(), (&raw mut refused).cast(), 4),
                4,
                "the connector failed"
            );
            u64::from(refused)
        }
    }

    /// Tells it to exit, and reaps it.
    fn finish(self) {
        // SAFETY: plain syscalls; the child is ours to reap.
        unsafe {
            libc::write(self.go.as_raw_fd(), [1u8].as_ptr().cast(), 1);
            let mut status = 0;
            libc::waitpid(self.pid as i32, &mut status, 0);
            assert!(
                libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                "connector status {status:#x}"
            );
        }
    }
}

/// A child process listening on an abstract unix name with a backlog of
/// `backlog`, accepting nothing until it is told to exit (the loopback
/// server binds paths only). Between the fork and its exit it makes only
/// async-signal-safe calls.
struct AbstractListener {
    pid: u32,
    exit: OwnedFd,
}

impl AbstractListener {
    fn fork(name: &str, backlog: i32) -> Self {
        let addr = unix_addr(name);
        let mut fds = [0; 2];
        // SAFETY: a plain syscall filling `fds`, both then owned here.
        let (exit_read, exit_write, ready_read, ready_write) = unsafe {
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
            let exit = (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]));
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC), 0);
            (
                exit.0,
                exit.1,
                OwnedFd::from_raw_fd(fds[0]),
                OwnedFd::from_raw_fd(fds[1]),
            )
        };
        // SAFETY: the child makes only async-signal-safe calls (socket,
        // bind, listen, write, read, _exit) on memory prepared before the
        // fork.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: see above; the child never returns.
            unsafe {
                let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                if fd < 0
                    || libc::bind(fd, (&raw const addr.0).cast(), addr.1) != 0
                    || libc::listen(fd, backlog) != 0
                {
                    libc::_exit(2);
                }
                libc::write(ready_write.as_raw_fd(), [1u8].as_ptr().cast(), 1);
                let mut byte = 0u8;
                libc::read(exit_read.as_raw_fd(), (&raw mut byte).cast(), 1);
                libc::_exit(0);
            }
        }
        drop((exit_read, ready_write));
        let mut byte = 0u8;
        // SAFETY: a plain read from a pipe held open here.
        let ready = unsafe { libc::read(ready_read.as_raw_fd(), (&raw mut byte).cast(), 1) };
        assert_eq!(ready, 1, "the abstract listener {name} failed to listen");
        Self {
            pid: pid as u32,
            exit: exit_write,
        }
    }

    fn stop(self) {
        // SAFETY: plain syscalls; the child is ours to reap.
        unsafe {
            libc::write(self.exit.as_raw_fd(), [1u8].as_ptr().cast(), 1);
            let mut status = 0;
            libc::waitpid(self.pid as i32, &mut status, 0);
        }
    }
}

/// The report's row for `listener`, in whichever role shows it.
fn listener_row<'a>(report: &'a Report, listener: &str) -> &'a ListenerLatencyRow {
    report
        .roles
        .iter()
        .flat_map(|r| &r.listeners)
        .find(|l| l.listener == listener)
        .unwrap_or_else(|| {
            let rows: Vec<_> = report
                .roles
                .iter()
                .map(|r| {
                    (
                        &r.role,
                        r.listeners.iter().map(|l| &l.listener).collect::<Vec<_>>(),
                    )
                })
                .collect();
            panic!("no listener row {listener}; rows: {rows:?}")
        })
}

fn tick(s: &mut Session) -> Report {
    s.collector.tick(|f| Ok(f.report.clone())).unwrap()
}

#[test]
fn unix_connects_a_full_queue_refused_count_on_its_listener_exactly() {
    let _lock = probe_lock();
    let dir = TempDir::new("unix-lost");
    let path = dir.0.join("full.sock");
    let path_name = path.to_str().unwrap().to_string();
    let link = dir.0.join("link.sock");
    std::os::unix::fs::symlink(&path, &link).unwrap();
    let abstract_name = format!("@stackprobe-test-lost-{}", std::process::id());
    // Listening with a backlog of 2, accepting nothing: a unix listener
    // holds backlog + 1 connections, then refuses.
    let backlog = ["--tcp", "127.0.0.1:0", "--backlog", "2"];
    let server = Server::start_args(Path::new(LOOPBACK), &backlog, Some(&path));
    let other = AbstractListener::fork(&abstract_name, 2);
    let mut s = Session::start();
    for pid in [server.pid, other.pid] {
        s.collector.probes_mut().watch_pid(pid).unwrap();
    }
    s.collector.refresh().unwrap();
    tick(&mut s);

    // A burst from this process, which is not watched.
    let (held, refused) = unix_burst(&path_name, 10);
    assert_eq!((held.len(), refused), (3, 7), "backlog 2 holds 3");
    let (held_abstract, refused_abstract) = unix_burst(&abstract_name, 10);
    assert_eq!(held_abstract.len(), 3);
    let r = tick(&mut s);
    let row = listener_row(&r, &path_name);
    assert_eq!(
        row.lost,
        Some(CountRow {
            count: refused,
            total: refused
        })
    );
    assert_eq!((row.backlog, row.max_backlog), (Some(3), Some(2)));
    assert_eq!(
        listener_row(&r, &abstract_name).lost,
        Some(CountRow {
            count: refused_abstract,
            total: refused_abstract
        })
    );
    assert!(
        r.insights.iter().any(|i| i.contains(&format!(
            "{path_name} lost {refused} connections at its full queue (backlog 3/2 now)"
        ))),
        "{:?}",
        r.insights
    );

    // Through a symlink (unwatched), then from a watched process by the
    // absolute path and by a path relative to its working directory.
    let (_, by_link) = unix_burst(link.to_str().unwrap(), 10);
    let connector = Connector::fork(&dir.0, &[&path_name, "full.sock", "./full.sock"], 5);
    s.collector.probes_mut().watch_pid(connector.pid).unwrap();
    s.collector.refresh().unwrap();
    let by_watched = connector.connect();
    eprintln!(
        "refused: {refused} (unwatched), {refused_abstract} (abstract), {by_link} (symlink), {by_watched} (watched, absolute and relative)"
    );
    assert_eq!((by_link, by_watched), (10, 15), "the queue stayed full");
    let r = tick(&mut s);
    connector.finish();
    let total = refused + by_link + by_watched;
    assert_eq!(
        listener_row(&r, &path_name).lost,
        Some(CountRow {
            count: by_link + by_watched,
            total
        }),
        "{refused} refused, then {by_link} through the symlink and {by_watched} from the watched client"
    );
    // Nothing new for the abstract one in this interval.
    assert_eq!(
        listener_row(&r, &abstract_name).lost,
        Some(CountRow {
            count: 0,
            total: refused_abstract
        })
    );
    // The summary counts everything since the start.
    let summary = s.collector.finish(|f| Ok(f.report.clone())).unwrap();
    assert_eq!(
        listener_row(&summary, &path_name).lost,
        Some(CountRow {
            count: total,
            total
        })
    );
    drop((held, held_abstract));
    server.stop();
    other.stop();
}

/// (ListenDrops, ListenOverflows) of the namespace process `pid` lives in.
fn listen_counters(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/netstat")).unwrap();
    let section = procfs::net_section(&text, "TcpExt:");
    let value = |name: &str| {
        section
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or_else(|| panic!("no TcpExt {name}"))
    };
    (value("ListenDrops"), value("ListenOverflows"))
}

/// `n` non-blocking TCP connects to `addr` from inside `ns`; after a moment
/// for their handshakes (loopback's run inside the connect), each is reset
/// (SO_LINGER 0), so that no retransmission, nor a FIN meeting the full
/// queue, drops anything later.
fn tcp_burst(ns: &Netns, addr: std::net::SocketAddrV4, n: usize) {
    let fds: Vec<OwnedFd> = ns.enter(|| {
        (0..n)
            .map(|_| {
                // SAFETY: plain syscalls; the fd is owned at once, and the
                // address lives for the call, of the length given.
                unsafe {
                    let fd = libc::socket(
                        libc::AF_INET,
                        libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                        0,
                    );
                    assert!(fd >= 0);
                    let fd = OwnedFd::from_raw_fd(fd);
                    let sin = libc::sockaddr_in {
                        sin_family: libc::AF_INET as libc::sa_family_t,
                        sin_port: addr.port().to_be(),
                        sin_addr: libc::in_addr {
                            s_addr: u32::from(*addr.ip()).to_be(),
                        },
                        sin_zero: [0; 8],
                    };
                    let r = libc::connect(
                        fd.as_raw_fd(),
                        (&raw const sin).cast(),
                        size_of::<libc::sockaddr_in>() as libc::socklen_t,
                    );
                    let e = std::io::Error::last_os_error();
                    assert!(
                        r == 0 || e.raw_os_error() == Some(libc::EINPROGRESS),
                        "connect: {e}"
                    );
                    fd
                }
            })
            .collect()
    });
    std::thread::sleep(Duration::from_millis(200));
    for fd in fds {
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a plain syscall on a socket we own, with its option's size.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                size_of::<libc::linger>() as libc::socklen_t,
            );
        }
    }
    std::thread::sleep(Duration::from_millis(100));
}

/// Walks the sockets until the namespace's counters did not move during
/// the walk (bounded), so that the walk saw what they say; returns them.
fn settled_walk(s: &mut Session, pid: u32) -> (u64, u64) {
    for _ in 0..50 {
        let before = listen_counters(pid);
        s.collector.observe_sockets().unwrap();
        if listen_counters(pid) == before {
            return before;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the listener kept dropping connections for 5 s");
}

#[test]
fn a_tcp_listeners_drops_at_a_full_queue_count_from_the_first_walk_exactly() {
    let _lock = probe_lock();
    let ns = Netns::new("lost");
    // Listening with a backlog of 1, accepting nothing: it holds 2.
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, LOOPBACK])
        .args(["serve", "--tcp", "127.0.0.1:0", "--backlog", "1"])
        .current_dir("/");
    let server = Server::start_command(cmd, None);
    let addr: std::net::SocketAddrV4 = server.tcp.parse().unwrap();
    let start = listen_counters(server.pid);

    // Drops before stackprobe walks the namespace: not its to count.
    tcp_burst(&ns, addr, 5);
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    s.collector.refresh().unwrap();
    let (baseline, baseline_overflows) = settled_walk(&mut s, server.pid);
    let baseline_drops = baseline - start.0;
    assert!(baseline_drops > 0, "the first burst dropped nothing");

    tcp_burst(&ns, addr, 20);
    let (drops, overflows) = settled_walk(&mut s, server.pid);
    let (dropped, overflowed) = (drops - baseline, overflows - baseline_overflows);
    let listener = s
        .collector
        .table()
        .links
        .listening()
        .iter()
        .find(|l| l.owner == server.pid)
        .expect("the server's listener")
        .clone();
    assert_eq!(listener.max_backlog, 1);
    assert_eq!(
        listener.lost.total, dropped,
        "the walk's count against ListenDrops (+{dropped}; ListenOverflows +{overflowed}) since the first walk, which found {baseline_drops} older drops"
    );
    eprintln!(
        "listener lost {}: ListenDrops +{dropped}, ListenOverflows +{overflowed} since the first walk ({baseline_drops} drops before it)",
        listener.lost.total
    );
    assert!(
        dropped >= 18,
        "20 connects to a full queue dropped {dropped}"
    );
    assert!(
        overflowed <= dropped,
        "ListenOverflows +{overflowed}, ListenDrops +{dropped}"
    );

    // The report: the role's row for the listener (which accepted
    // nothing), and the TCP listener row.
    let r = tick(&mut s);
    assert_eq!(
        listen_counters(server.pid).0,
        drops,
        "the kernel dropped more since the walk"
    );
    let row = listener_row(&r, &server.tcp);
    assert_eq!(
        row.lost,
        Some(CountRow {
            count: dropped,
            total: dropped
        })
    );
    assert_eq!(row.max_backlog, Some(1));
    let tcp_row = r
        .tcp
        .listeners
        .iter()
        .find(|l| l.pid == server.pid)
        .expect("the TCP listener row");
    assert_eq!(tcp_row.lost.total, dropped);
    assert!(
        r.insights.iter().any(|i| i.contains(&format!(
            "{} lost {dropped} connections at its full queue",
            server.tcp
        )) && i.contains("net.core.somaxconn")),
        "{:?}",
        r.insights
    );
    // The next interval, with nothing new: the total stays, none in it.
    let r = tick(&mut s);
    assert_eq!(
        listener_row(&r, &server.tcp).lost,
        Some(CountRow {
            count: 0,
            total: dropped
        })
    );
    server.stop();
}
