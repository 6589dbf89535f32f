//! Userspace side of the connect probe (kernel side:
//! probes-ebpf/src/connect.rs, and the state probe for TCP): setup before
//! load, attachment, and the names of destinations.

use anyhow::{Result, ensure};
use aya::{
    Ebpf,
    maps::{HashMap, MapData},
};
use probes_common::connect::{
    AF_INET6, CONNECT_START_MAP, ENTER_ARGS_OFFSET_GLOBAL, ENTER_PROGRAM, ENTER_TRACEPOINT,
    EXIT_PROGRAM, EXIT_RET_OFFSET_GLOBAL, EXIT_TRACEPOINT, TCP_DESTINATIONS_MAP, TcpDestination,
    UNIX_DESTINATIONS_MAP, UnixDestination,
};

use super::{
    attach::{Setup, attach_tracepoints},
    decode,
    tracefs::Tracefs,
};
use stackprobe_model::tcp::sockets;

/// The `fd` and `ret` offsets from this kernel's tracepoint layouts, and
/// the in-flight slots.
pub fn setup(tracefs: &Tracefs, slots: u32) -> Result<Setup> {
    let enter = [ENTER_TRACEPOINT];
    let fd = tracefs.same_offset("syscalls", &enter, "fd", 8)?;
    let addr = tracefs.same_offset("syscalls", &enter, "uservaddr", 8)?;
    let len = tracefs.same_offset("syscalls", &enter, "addrlen", 8)?;
    // The probe reads the three in one copy.
    ensure!(
        addr == fd + 8 && len == addr + 8,
        "{ENTER_TRACEPOINT} puts fd, uservaddr and addrlen at {fd}, {addr} and {len}, not 8 bytes apart"
    );
    let ret = tracefs.same_offset("syscalls", &[EXIT_TRACEPOINT], "ret", 8)?;
    Ok(Setup {
        globals: vec![
            (ENTER_ARGS_OFFSET_GLOBAL, fd),
            (EXIT_RET_OFFSET_GLOBAL, ret),
        ],
        map_sizes: vec![(CONNECT_START_MAP, slots)],
    })
}

pub fn attach(ebpf: &mut Ebpf, tracefs: &Tracefs) -> Result<()> {
    attach_tracepoints(
        ebpf,
        tracefs,
        ENTER_PROGRAM,
        "syscalls",
        &[ENTER_TRACEPOINT],
    )?;
    attach_tracepoints(ebpf, tracefs, EXIT_PROGRAM, "syscalls", &[EXIT_TRACEPOINT])
}

/// The name of the destination the kernel ids `id`, as views show it: a
/// TCP `address:port` (in another network namespace than stackprobe's,
/// with its suffix), or a unix path (`@name` for an abstract one). None if
/// the kernel has not named it (its table was full).
pub fn destination_name(ebpf: &Ebpf, id: u64) -> Option<String> {
    // The state probe's nested copy clears the lowest bit (ids have it set).
    let id = id | 1;
    let tcp: HashMap<&MapData, u64, TcpDestination> =
        HashMap::try_from(ebpf.map(TCP_DESTINATIONS_MAP)?).ok()?;
    if let Ok(d) = tcp.get(&id, 0) {
        return Some(tcp_name(&d));
    }
    let unix: HashMap<&MapData, u64, UnixDestination> =
        HashMap::try_from(ebpf.map(UNIX_DESTINATIONS_MAP)?).ok()?;
    unix.get(&id, 0).ok().map(|d| unix_name(&d))
}

fn tcp_name(d: &TcpDestination) -> String {
    let addr = sockets::address(d.family == AF_INET6, d.addr, d.port);
    format!("{addr}{}", sockets::netns_suffix(decode::netns(d.netns)))
}

fn unix_name(d: &UnixDestination) -> String {
    let path = &d.path[..(d.len as usize).min(d.path.len())];
    match path.split_first() {
        Some((0, name)) => format!("@{}", String::from_utf8_lossy(name)),
        _ => {
            let end = path.iter().position(|&b| b == 0).unwrap_or(path.len());
            String::from_utf8_lossy(&path[..end]).into_owned()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_read_as_an_address_a_path_or_an_abstract_name() {
        let mut tcp = TcpDestination {
            family: probes_common::connect::AF_INET,
            port: 15432,
            netns: decode::home_netns(),
            ..TcpDestination::default()
        };
        tcp.addr[..4].copy_from_slice(&[127, 0, 0, 1]);
        assert_eq!(tcp_name(&tcp), "127.0.0.1:15432");
        tcp.family = AF_INET6;
        tcp.addr = std::net::Ipv6Addr::LOCALHOST.octets();
        assert_eq!(tcp_name(&tcp), "[::1]:15432");

        let mut unix = UnixDestination::ZERO;
        let p = b"/run/postgresql/.s.PGSQL.5432";
        unix.path[..p.len()].copy_from_slice(p);
        unix.len = p.len() as u32;
        assert_eq!(unix_name(&unix), "/run/postgresql/.s.PGSQL.5432");
        let mut abs = UnixDestination::ZERO;
        abs.path[1..4].copy_from_slice(b"app");
        abs.len = 4;
        assert_eq!(unix_name(&abs), "@app");
    }
}
