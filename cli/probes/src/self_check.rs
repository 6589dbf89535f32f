//! Proof, at every load, that the struct offsets taken from the kernel's BTF
//! read this kernel right (rustc emits no CO-RE relocations, so nothing else
//! would notice a wrong one): stackprobe opens a loopback connection of its
//! own, watched, and checks what the probes saw of it. The TCP iterator must
//! list the listener and both ends with their exact addresses, states,
//! inode and backlog limit (struct sock_common, sock, socket, file, inode),
//! and the accept probe's walk from the accepted fd to its socket
//! (task_struct, files_struct, fdtable, file, socket) must find the
//! handshake the state probe recorded: the accept's queue wait is then in
//! the kernel's histogram. A wrong offset fails the load with a
//! message that says so, instead of showing wrong numbers.

use std::{
    io,
    net::{SocketAddr, TcpListener, TcpStream},
    os::fd::{AsRawFd, RawFd},
};

use anyhow::{Context as _, Result, anyhow, bail};
use aya::{Ebpf, maps::RingBuf};
use probes_common::{event::EVENTS_MAP, hist::HistMetric};

use super::{hist, services, tcp, watch::WatchSet};
use stackprobe_model::tcp::sockets::TcpState;

/// Runs the check; the probes must be attached, and nothing else watched yet.
pub fn run(ebpf: &mut Ebpf, watch_set: &WatchSet) -> Result<()> {
    let me = std::process::id();
    let listener = TcpListener::bind("127.0.0.1:0").context("self-check: binding a listener")?;
    let addr = listener.local_addr()?;
    tcp::set_listen_owner(ebpf, None, addr.port(), me)?;
    watch_set.add(me)?;
    // Every socket is closed inside, while still watched, so the probes
    // forget them as they do any watched socket.
    let checked = connect_and_check(ebpf, listener, addr);
    watch_set.remove(me);
    tcp::forget_listen_owner(ebpf, addr.port())?;
    // What the probes kept and sent of stackprobe's own sockets is not the
    // user's.
    let queue_waits = hist::take(ebpf, me, HistMetric::AcceptQueue)?;
    let mut ring = RingBuf::try_from(
        ebpf.map_mut(EVENTS_MAP)
            .ok_or_else(|| anyhow!("the probes lack {EVENTS_MAP}"))?,
    )?;
    while ring.next().is_some() {}
    // Nor are the counts of its links, or the connection it served.
    tcp::forget_owner(ebpf, me)?;
    services::forget_server(ebpf, me)?;
    checked?;
    if queue_waits != 1 {
        bail!(
            "self-check failed: the accept probe did not find stackprobe's own test connection \
             through task_struct → files → fdtable → file → socket → sock: the offsets the \
             kernel's BTF gives do not match this kernel"
        );
    }
    Ok(())
}

/// Connects to `listener`, accepts, checks the iterator's view, closes all
/// three sockets (with RST: no TIME_WAIT of stackprobe's own is left).
fn connect_and_check(ebpf: &mut Ebpf, listener: TcpListener, addr: SocketAddr) -> Result<()> {
    let client = TcpStream::connect(addr).context("self-check: connecting")?;
    let (server, _) = listener.accept().context("self-check: accepting")?;
    let client_addr = client.local_addr()?;
    let sockets = tcp::snapshot(ebpf)?;
    let find = |state: TcpState, local: SocketAddr, remote: Option<SocketAddr>| {
        sockets
            .iter()
            .find(|s| s.state == state && s.local == local && remote.is_none_or(|r| s.remote == r))
    };
    let wrong = |what: &str| {
        anyhow!(
            "self-check failed: the TCP iterator, reading struct sock at the offsets the kernel's \
             BTF gives, {what}: those offsets do not match this kernel"
        )
    };
    let listening = find(TcpState::Listen, addr, None)
        .ok_or_else(|| wrong(&format!("did not list stackprobe's own listener {addr}")))?;
    if listening.ino != inode(listener.as_raw_fd())? {
        return Err(wrong("read a wrong inode for the listener"));
    }
    // std listens with a backlog of 128.
    if (listening.backlog, listening.max_backlog) != (0, 128) {
        return Err(wrong(&format!(
            "read backlog {}/{} for a listener with none queued of 128",
            listening.backlog, listening.max_backlog
        )));
    }
    for (local, remote) in [(client_addr, addr), (addr, client_addr)] {
        if find(TcpState::Established, local, Some(remote)).is_none() {
            return Err(wrong(&format!(
                "did not list the connection {local} → {remote}"
            )));
        }
    }
    for s in [client.as_raw_fd(), server.as_raw_fd(), listener.as_raw_fd()] {
        reset_on_close(s)?;
    }
    Ok(())
}

fn inode(fd: RawFd) -> Result<u64> {
    // SAFETY: fstat fills the struct for an fd we own.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error().into());
    }
    Ok(st.st_ino)
}

/// SO_LINGER 0: close sends RST and frees the socket at once.
fn reset_on_close(fd: RawFd) -> Result<()> {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt reads a correctly sized linger from a live pointer.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error()).context("self-check: SO_LINGER");
    }
    Ok(())
}
