//! Root only: the backlog of listening unix sockets the test makes itself,
//! from NETLINK_SOCK_DIAG, against what was queued and against `ss -xl`.
//! No probes are loaded.

mod support;

use std::{
    io::ErrorKind,
    os::{
        fd::{AsFd, AsRawFd as _, FromRawFd as _, OwnedFd},
        linux::net::SocketAddrExt as _,
        unix::net::{SocketAddr, UnixListener, UnixStream},
    },
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

use stackprobe_probes::unix_listeners::{self, by_inode, unix_listeners};
use support::*;

/// A path for this test's socket, removed when dropped.
struct SocketPath(PathBuf);

impl SocketPath {
    fn new(test: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "stackprobe-unix-listeners-{}-{test}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        Self(path)
    }
}

impl Drop for SocketPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn inode(fd: impl AsFd) -> u64 {
    // SAFETY: stat is plain data; fstat fills it for a live fd.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::fstat(fd.as_fd().as_raw_fd(), &mut st) };
    assert_eq!(ok, 0, "fstat: {}", std::io::Error::last_os_error());
    st.st_ino
}

/// Sets the listener's backlog: std listens with 128, a second listen()
/// on a listening unix socket changes only its backlog.
fn set_backlog(listener: &UnixListener, backlog: i32) {
    // SAFETY: a plain syscall on a live fd.
    let ok = unsafe { libc::listen(listener.as_raw_fd(), backlog) };
    assert_eq!(ok, 0, "listen: {}", std::io::Error::last_os_error());
}

/// The entry of the socket `inode`, which must be listed exactly once.
fn entry(inode: u64) -> unix_listeners::UnixListener {
    let all = unix_listeners().expect("listing the unix listeners");
    let mut found: Vec<_> = all.into_iter().filter(|l| l.inode == inode).collect();
    assert_eq!(found.len(), 1, "socket {inode} listed {found:?}");
    found.pop().unwrap()
}

/// `(Recv-Q, Send-Q, path)` of `ss -Hxl`'s line for socket `inode`, whose
/// local address is the path (or `*`) and then the inode.
fn ss_queues(inode: u64) -> Option<(u32, u32, String)> {
    let out = Command::new("ss").args(["-Hxl"]).output();
    let out = match out {
        Ok(out) => out,
        Err(e) if e.kind() == ErrorKind::NotFound => return None,
        Err(e) => panic!("running ss: {e}"),
    };
    assert!(out.status.success(), "ss -Hxl: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|cols| cols.get(5) == Some(&inode.to_string().as_str()))
        .collect();
    assert_eq!(lines.len(), 1, "ss -Hxl lines for socket {inode}: {text}");
    let cols = &lines[0];
    assert_eq!(cols[..2], ["u_str", "LISTEN"], "{cols:?}");
    Some((
        cols[2].parse().unwrap(),
        cols[3].parse().unwrap(),
        cols[4].to_string(),
    ))
}

/// Connects a client the listener does not accept yet.
fn connect(path: &Path) -> UnixStream {
    UnixStream::connect(path).expect("connecting to the listener")
}

#[test]
fn a_listener_shows_its_queue_and_backlog_until_one_is_accepted() {
    require_root();
    let path = SocketPath::new("backlog");
    let listener = UnixListener::bind(&path.0).unwrap();
    set_backlog(&listener, 3);
    let ino = inode(&listener);

    let idle = entry(ino);
    assert_eq!(idle.path, path.0.to_str().unwrap());
    assert_eq!((idle.queued, idle.max_backlog), (0, 3));

    let _clients = [connect(&path.0), connect(&path.0)];
    let waiting = entry(ino);
    assert_eq!(
        waiting,
        unix_listeners::UnixListener {
            inode: ino,
            path: path.0.to_str().unwrap().to_string(),
            queued: 2,
            max_backlog: 3,
        }
    );

    let (_accepted, _) = listener.accept().unwrap();
    let after = entry(ino);
    assert_eq!((after.queued, after.max_backlog), (1, 3));

    // by_inode finds it among every other listener on the machine.
    let all = unix_listeners().unwrap();
    assert_eq!(by_inode(&all)[&ino].queued, 1);
}

#[test]
fn an_abstract_listener_is_named_with_an_at() {
    require_root();
    let name = format!("stackprobe-unix-listeners-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    set_backlog(&listener, 7);
    let _client = UnixStream::connect_addr(&addr).unwrap();

    let found = entry(inode(&listener));
    assert_eq!(found.path, format!("@{name}"));
    assert_eq!((found.queued, found.max_backlog), (1, 7));
}

#[test]
fn a_socket_not_listening_is_not_listed() {
    require_root();
    let path = SocketPath::new("bound");
    // Bound, never listening: a stream socket in the CLOSE state.
    // SAFETY: a plain syscall; the fd is owned at once.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0, "socket: {}", std::io::Error::last_os_error());
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_un is plain data; zeroes end the path copied in.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.0.as_os_str().as_encoded_bytes();
    assert!(bytes.len() < sun.sun_path.len());
    for (d, s) in sun.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    // SAFETY: `sun` is live for the call, of the size given.
    let ok = unsafe {
        libc::bind(
            sock.as_raw_fd(),
            (&raw const sun).cast(),
            size_of::<libc::sockaddr_un>() as libc::socklen_t,
        )
    };
    assert_eq!(ok, 0, "bind: {}", std::io::Error::last_os_error());

    let ino = inode(&sock);
    let all = unix_listeners().unwrap();
    assert!(all.iter().all(|l| l.inode != ino), "{all:?}");
    assert!(all.iter().all(|l| l.path != path.0.to_str().unwrap()));
}

#[test]
fn the_queues_are_those_ss_shows() {
    require_root();
    let path = SocketPath::new("ss");
    let listener = UnixListener::bind(&path.0).unwrap();
    set_backlog(&listener, 5);
    let _clients = [connect(&path.0), connect(&path.0), connect(&path.0)];
    let ino = inode(&listener);

    let ours = entry(ino);
    assert_eq!((ours.queued, ours.max_backlog), (3, 5));
    let Some((recv_q, send_q, ss_path)) = ss_queues(ino) else {
        eprintln!("no ss here: skipping the comparison");
        return;
    };
    assert_eq!((recv_q, send_q), (ours.queued, ours.max_backlog));
    assert_eq!(ss_path, ours.path);
}

/// More listeners than one part of the dump holds (the kernel's first part
/// is a page or two, some 100 bytes a listener): every one is listed, with
/// its own backlog. Prints what one listing costs here (`--nocapture`).
#[test]
fn many_listeners_span_several_parts_of_the_dump() {
    require_root();
    const N: usize = 300;
    let prefix = format!("stackprobe-unix-listeners-{}-many", std::process::id());
    let listeners: Vec<(UnixListener, u64, String, u32)> = (0..N)
        .map(|i| {
            let name = format!("{prefix}-{i}");
            let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
            let listener = UnixListener::bind_addr(&addr).unwrap();
            let backlog = (i % 17 + 1) as u32;
            set_backlog(&listener, backlog as i32);
            let ino = inode(&listener);
            (listener, ino, format!("@{name}"), backlog)
        })
        .collect();

    let all = unix_listeners().unwrap();
    let index = by_inode(&all);
    for (_, ino, path, backlog) in &listeners {
        let found = index
            .get(ino)
            .unwrap_or_else(|| panic!("{path} not listed"));
        assert_eq!(
            (&found.path, found.queued, found.max_backlog),
            (path, 0, *backlog)
        );
    }
    let ours = all
        .iter()
        .filter(|l| l.path.starts_with(&format!("@{prefix}-")))
        .count();
    assert_eq!(ours, N);

    let mut times: Vec<Duration> = (0..50)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(unix_listeners().unwrap());
            start.elapsed()
        })
        .collect();
    times.sort();
    println!(
        "unix_listeners(): {} listeners, median {:?}, min {:?}, max {:?} over {} calls",
        all.len(),
        times[times.len() / 2],
        times[0],
        times[times.len() - 1],
        times.len()
    );
    assert!(times[times.len() / 2] < Duration::from_millis(100));
}
