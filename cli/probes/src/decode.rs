//! Records from the kernel (ring buffer events, TCP iterator output) turned
//! into model events: every decoder of a record shared with the kernel, and
//! nothing that loads or attaches. A record must be exactly its type's size
//! (probes-common asserts each layout): one that grew or shrank on the other
//! side of the boundary, as a stale eBPF object would send, is rejected
//! rather than half read.

use probes_common::{
    event::EventKind,
    lifecycle::{ExecEvent, ExitEvent, SpawnEvent},
    sock::{AF_INET6, LinkCounts, LinkKey, SIDE_ACTIVE, SIDE_PASSIVE, TcpSocket, TcpStateEvent},
};

use crate::procfs;
use stackprobe_model::{
    event::{Event, ExecSample, ExitSample, SpawnSample, TaskKind, TcpStateSample},
    tcp::{
        counts::LinkTotals,
        key::{KernelLink, Peer, Side},
        sockets::{Netns, TcpSock, TcpState, address},
    },
};

/// stackprobe's own network namespace, read once (before any walk enters
/// another).
pub fn home_netns() -> u32 {
    static HOME: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *HOME.get_or_init(|| procfs::netns(std::process::id()).unwrap_or(0))
}

/// A namespace the kernel names, in model terms: None for stackprobe's own.
pub fn netns(inum: u32) -> Netns {
    (inum != home_netns()).then_some(inum)
}

/// One ring buffer record; None for an unknown kind or a record whose size
/// is not its kind's.
pub fn decode(bytes: &[u8]) -> Option<Event> {
    let kind = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    match EventKind::from_u32(kind)? {
        EventKind::Spawn => spawn(bytes).map(Event::Spawn),
        EventKind::Exec => exec(bytes).map(Event::Exec),
        EventKind::Exit => exit(bytes).map(Event::Exit),
        EventKind::TcpState => tcp_state(bytes).map(Event::TcpState),
    }
}

/// What one read of the TCP iterator wrote: a [`TcpSocket`] per socket.
/// Sockets in a state the model does not know are left out.
pub fn tcp_sockets(bytes: &[u8]) -> Vec<TcpSock> {
    bytes
        .chunks_exact(size_of::<TcpSocket>())
        .filter_map(|chunk| tcp_socket(&read_record(chunk)?))
        .collect()
}

/// A link as the kernel keys it; None for an unknown side.
pub fn kernel_link(k: &LinkKey) -> Option<KernelLink> {
    let v6 = k.family == AF_INET6;
    let side = match k.side {
        SIDE_ACTIVE => Side::Active,
        SIDE_PASSIVE => Side::Passive,
        _ => return None,
    };
    Some(KernelLink {
        owner: k.owner,
        peer: Peer {
            side,
            addr: address(v6, k.addr, k.port),
            peer_ip: (side == Side::Passive).then(|| address(v6, k.peer_ip, 0).ip()),
            netns: netns(k.netns),
        },
    })
}

/// A link's counts, summed over the CPUs' copies.
pub fn link_totals<'a>(per_cpu: impl IntoIterator<Item = &'a LinkCounts>) -> LinkTotals {
    per_cpu
        .into_iter()
        .fold(LinkTotals::default(), |t, c| LinkTotals {
            opens: t.opens + c.opens,
            closes: t.closes + c.closes,
            aborts: t.aborts + c.aborts,
            new_time_wait: t.new_time_wait + c.new_time_wait,
        })
}

/// Reads a plain-old-data record of type `T`, which must fill `bytes` exactly.
fn read_record<T: aya::Pod>(bytes: &[u8]) -> Option<T> {
    if bytes.len() != size_of::<T>() {
        return None;
    }
    // SAFETY: T is plain old data (aya::Pod) and the length was checked; the
    // ring buffer gives no alignment guarantee beyond 8, hence read_unaligned.
    Some(unsafe { bytes.as_ptr().cast::<T>().read_unaligned() })
}

/// A NUL-padded comm as a string.
fn comm_to_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

fn spawn(bytes: &[u8]) -> Option<SpawnSample> {
    let e: SpawnEvent = read_record(bytes)?;
    Some(SpawnSample {
        parent_tgid: e.parent_tgid,
        child: e.child,
        kind: TaskKind::from_flags((e.flags_known != 0).then_some(e.flags)),
        ts_ns: e.ts_ns,
        comm: comm_to_string(&e.comm),
    })
}

fn exec(bytes: &[u8]) -> Option<ExecSample> {
    let e: ExecEvent = read_record(bytes)?;
    Some(ExecSample {
        tgid: e.tgid,
        ts_ns: e.ts_ns,
        comm: comm_to_string(&e.comm),
    })
}

fn exit(bytes: &[u8]) -> Option<ExitSample> {
    let e: ExitEvent = read_record(bytes)?;
    Some(ExitSample {
        tgid: e.tgid,
        ts_ns: e.ts_ns,
    })
}

fn tcp_state(bytes: &[u8]) -> Option<TcpStateSample> {
    let e: TcpStateEvent = read_record(bytes)?;
    let v6 = e.family == AF_INET6;
    let comm = comm_to_string(&e.comm);
    Some(TcpStateSample {
        owner: e.owner,
        comm: (!comm.is_empty()).then_some(comm),
        old: TcpState::from_kernel(e.oldstate)?,
        new: TcpState::from_kernel(e.newstate)?,
        by_owner: e.by_owner != 0,
        local: address(v6, e.laddr, e.lport),
        remote: address(v6, e.raddr, e.rport),
        netns: netns(e.netns),
        ts_ns: e.ts_ns,
    })
}

fn tcp_socket(s: &TcpSocket) -> Option<TcpSock> {
    let v6 = s.family == AF_INET6;
    Some(TcpSock {
        state: TcpState::from_kernel(s.state)?,
        local: address(v6, s.laddr, s.lport),
        remote: address(v6, s.raddr, u16::from_be(s.rport_be)),
        ino: s.ino,
        backlog: s.ack_backlog,
        max_backlog: s.max_ack_backlog,
        netns: netns(s.netns),
    })
}

#[cfg(test)]
mod tests {
    use probes_common::{
        fork::{CLONE_THREAD, FORK_FLAGS},
        sock::{AF_INET, TCP_ESTABLISHED, TCP_LISTEN, TCP_SYN_RECV},
    };

    use super::*;

    fn bytes_of<T>(v: &T) -> &[u8] {
        // SAFETY: viewing a plain-old-data struct as bytes; probes-common
        // asserts that the shared records have no padding, so every byte is
        // initialised.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }
    }

    /// `record`'s bytes with one more byte at the end, as a record that grew
    /// on the kernel side would arrive.
    fn grown<T>(record: &T) -> Vec<u8> {
        let mut bytes = bytes_of(record).to_vec();
        bytes.push(0);
        bytes
    }

    #[test]
    fn decodes_lifecycle_events_of_their_exact_size_only() {
        let mut comm = [0u8; 16];
        comm[..5].copy_from_slice(b"nginx");
        let spawn_event = SpawnEvent {
            kind: EventKind::Spawn as u32,
            parent_tgid: 1,
            parent_tid: 2,
            child: 3,
            flags: CLONE_THREAD,
            flags_known: 1,
            _pad: 0,
            ts_ns: 4,
            comm,
        };
        let exec_event = ExecEvent {
            kind: EventKind::Exec as u32,
            tgid: 5,
            ts_ns: 6,
            comm,
        };
        let exit_event = ExitEvent {
            kind: EventKind::Exit as u32,
            tgid: 7,
            ts_ns: 8,
        };
        assert_eq!(
            decode(bytes_of(&spawn_event)),
            Some(Event::Spawn(SpawnSample {
                parent_tgid: 1,
                child: 3,
                kind: TaskKind::Thread,
                ts_ns: 4,
                comm: "nginx".into(),
            }))
        );
        assert_eq!(
            decode(bytes_of(&exec_event)),
            Some(Event::Exec(ExecSample {
                tgid: 5,
                ts_ns: 6,
                comm: "nginx".into(),
            }))
        );
        assert_eq!(
            decode(bytes_of(&exit_event)),
            Some(Event::Exit(ExitSample { tgid: 7, ts_ns: 8 }))
        );
        // What the child is comes from the flags, when they were seen.
        for (flags, flags_known, kind) in [
            (FORK_FLAGS, 1, TaskKind::Process),
            (CLONE_THREAD, 0, TaskKind::Unknown),
        ] {
            let e = SpawnEvent {
                flags,
                flags_known,
                ..spawn_event
            };
            assert_eq!(spawn(bytes_of(&e)).map(|s| s.kind), Some(kind));
        }
        assert!(decode(&grown(&spawn_event)).is_none());
        assert!(decode(&grown(&exec_event)).is_none());
        assert!(decode(&grown(&exit_event)).is_none());
        let exit_bytes = bytes_of(&exit_event);
        assert!(decode(&exit_bytes[..exit_bytes.len() - 1]).is_none());
    }

    #[test]
    fn decodes_a_tcp_state_change_and_rejects_a_grown_one() {
        let mut laddr = [0u8; 16];
        laddr[..4].copy_from_slice(&[127, 0, 0, 1]);
        let mut raddr = [0u8; 16];
        raddr[..4].copy_from_slice(&[10, 0, 0, 2]);
        let event = TcpStateEvent {
            kind: EventKind::TcpState as u32,
            owner: 42,
            oldstate: TCP_SYN_RECV,
            newstate: TCP_ESTABLISHED,
            by_owner: 0,
            _pad: 0,
            family: AF_INET,
            lport: 8080,
            rport: 51000,
            _pad2: 0,
            laddr,
            raddr,
            netns: home_netns(),
            ts_ns: 99,
            comm: [0; 16],
        };
        assert_eq!(
            decode(bytes_of(&event)),
            Some(Event::TcpState(TcpStateSample {
                owner: 42,
                comm: None,
                old: TcpState::SynRecv,
                new: TcpState::Established,
                by_owner: false,
                local: "127.0.0.1:8080".parse().unwrap(),
                remote: "10.0.0.2:51000".parse().unwrap(),
                netns: None,
                ts_ns: 99,
            }))
        );
        assert!(decode(&grown(&event)).is_none());
        let unknown_state = TcpStateEvent {
            newstate: 0,
            ..event
        };
        assert!(decode(bytes_of(&unknown_state)).is_none());
    }

    #[test]
    fn unknown_kinds_and_stubs_are_undecodable() {
        assert!(decode(&[]).is_none());
        assert!(decode(&[3, 0]).is_none());
        assert!(decode(&99u32.to_ne_bytes()).is_none());
        // The retired per-sample accept and fork kinds, as a stale eBPF
        // object would still send them, sized as their records were.
        for retired in [1u32, 2] {
            let mut record = [0u8; 56];
            record[..4].copy_from_slice(&retired.to_ne_bytes());
            assert!(decode(&record).is_none(), "kind {retired}");
        }
    }

    #[test]
    fn iterator_output_is_one_socket_per_record() {
        let mut laddr = [0u8; 16];
        laddr[..4].copy_from_slice(&[127, 0, 0, 1]);
        let listener = TcpSocket {
            family: AF_INET,
            state: TCP_LISTEN,
            lport: 5432,
            laddr,
            ino: 77,
            ack_backlog: 1,
            max_ack_backlog: 128,
            netns: 4026532001,
            ..TcpSocket::default()
        };
        let unknown = TcpSocket {
            state: 0,
            ..listener
        };
        let mut bytes = bytes_of(&listener).to_vec();
        bytes.extend_from_slice(bytes_of(&unknown));
        let sockets = tcp_sockets(&bytes);
        assert_eq!(
            sockets,
            [TcpSock {
                state: TcpState::Listen,
                local: "127.0.0.1:5432".parse().unwrap(),
                remote: "0.0.0.0:0".parse().unwrap(),
                ino: 77,
                backlog: 1,
                max_backlog: 128,
                netns: Some(4026532001),
            }]
        );
    }
}
