//! The backlog of every listening unix stream socket in stackprobe's network
//! namespace, as `ss -xl` shows it: the same NETLINK_SOCK_DIAG dump, asking
//! for the name and the queue lengths of each socket in the LISTEN state.
//! Connections waiting to be accepted against the backlog's limit tell a
//! php-fpm pool that is saturated before its clients see errors.

use std::{
    collections::HashMap,
    io,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

use anyhow::{Context as _, Result, bail, ensure};

/// A listening unix stream socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnixListener {
    /// The socket's inode, the N of `socket:[N]` in /proc/PID/fd.
    pub inode: u64,
    /// The bound path, `@name` in the abstract namespace (each NUL of the
    /// name shown as `@`, as `ss` does), empty if unnamed.
    pub path: String,
    /// Connections waiting to be accepted (`ss`'s Recv-Q).
    pub queued: u32,
    /// The backlog given to listen(), as the kernel capped it (`ss`'s Send-Q).
    pub max_backlog: u32,
}

/// Every listening unix stream socket of stackprobe's network namespace, in
/// the order the kernel lists them.
pub fn unix_listeners() -> Result<Vec<UnixListener>> {
    // SAFETY: a plain syscall; the fd it returns is owned at once.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error()).context("opening a NETLINK_SOCK_DIAG socket");
    }
    // SAFETY: `fd` is a new socket nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };

    let request = Request {
        header: NlMsgHdr {
            len: size_of::<Request>() as u32,
            kind: SOCK_DIAG_BY_FAMILY,
            flags: (libc::NLM_F_REQUEST | libc::NLM_F_DUMP) as u16,
            seq: SEQ,
            pid: 0,
        },
        req: UnixDiagReq {
            family: libc::AF_UNIX as u8,
            protocol: 0,
            pad: 0,
            states: 1 << TCP_LISTEN,
            ino: 0,
            show: UDIAG_SHOW_NAME | UDIAG_SHOW_RQLEN,
            cookie: [u32::MAX; 2],
        },
    };
    // SAFETY: sockaddr_nl is plain data; zeroes address the kernel.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    // SAFETY: `request` and `kernel` are live for the call, of the sizes given.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            (&raw const request).cast(),
            size_of::<Request>(),
            0,
            (&raw const kernel).cast(),
            size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if sent < 0 {
        return Err(io::Error::last_os_error()).context("sending the unix_diag request");
    }
    ensure!(
        sent as usize == size_of::<Request>(),
        "the unix_diag request was sent short ({sent} bytes)"
    );

    let mut listeners = Vec::new();
    // The kernel fills each part of a dump up to what the reader last asked
    // for, capped at 32 KiB: a datagram never outgrows this buffer.
    let mut buf = vec![0u8; RECV_BUF];
    loop {
        // SAFETY: `buf` is live and writable for its length. MSG_TRUNC has
        // netlink return the datagram's whole length, to tell truncation.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("receiving the unix_diag dump");
        }
        let n = n as usize;
        ensure!(
            n <= buf.len(),
            "a part of the unix_diag dump ({n} bytes) outgrew the {} byte buffer",
            buf.len()
        );
        ensure!(n > 0, "the unix_diag dump ended without NLMSG_DONE");
        if parse(&buf[..n], &mut listeners)? == Parsed::Done {
            return Ok(listeners);
        }
    }
}

/// Every listening unix stream socket's inode and path from
/// /proc/net/unix, for kernels whose sock_diag has no unix part (its
/// `unix_diag` module absent): it lists no queue lengths.
pub fn from_proc_net_unix() -> Result<Vec<(u64, String)>> {
    let text = std::fs::read_to_string("/proc/net/unix").context("reading /proc/net/unix")?;
    Ok(parse_proc_net_unix(&text))
}

/// `Num RefCount Protocol Flags Type St Inode [Path]`, hexadecimal but for
/// the inode: a listener has `__SO_ACCEPTCON` (0x10000) in its flags.
fn parse_proc_net_unix(text: &str) -> Vec<(u64, String)> {
    const ACCEPTCON: u32 = 0x10000;
    const SOCK_STREAM: u32 = 1;
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let flags = u32::from_str_radix(f.get(3)?, 16).ok()?;
            let kind = u32::from_str_radix(f.get(4)?, 16).ok()?;
            let inode = f.get(6)?.parse().ok()?;
            (flags & ACCEPTCON != 0 && kind == SOCK_STREAM)
                .then(|| (inode, f.get(7).map_or(String::new(), |p| (*p).to_string())))
        })
        .collect()
}

/// The listeners by inode, to match the `socket:[N]` of /proc/PID/fd.
pub fn by_inode(list: &[UnixListener]) -> HashMap<u64, &UnixListener> {
    list.iter().map(|l| (l.inode, l)).collect()
}

const RECV_BUF: usize = 32 * 1024;
/// Every request gets this sequence number: the socket is new, its only
/// request is ours.
const SEQ: u32 = 1;

// linux/sock_diag.h, linux/unix_diag.h, net/tcp_states.h.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const TCP_LISTEN: u32 = 10;
const UDIAG_SHOW_NAME: u32 = 0x01;
const UDIAG_SHOW_RQLEN: u32 = 0x10;
const UNIX_DIAG_NAME: u16 = 0;
const UNIX_DIAG_RQLEN: u16 = 4;
/// The attribute type's top bits are flags (nested, net byte order).
const NLA_TYPE_MASK: u16 = !(3 << 14);

/// struct nlmsghdr.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct NlMsgHdr {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
}

/// struct unix_diag_req.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct UnixDiagReq {
    family: u8,
    protocol: u8,
    pad: u16,
    states: u32,
    ino: u32,
    show: u32,
    cookie: [u32; 2],
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Request {
    header: NlMsgHdr,
    req: UnixDiagReq,
}

/// struct unix_diag_msg.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct UnixDiagMsg {
    family: u8,
    kind: u8,
    state: u8,
    pad: u8,
    ino: u32,
    cookie: [u32; 2],
}

/// struct unix_diag_rqlen.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct UnixDiagRqlen {
    rqueue: u32,
    wqueue: u32,
}

/// struct rtattr (struct nlattr has the same layout).
const RTA_HDR: usize = 4;
/// struct nlmsgerr begins with the error, an int.
const NLMSGERR_ERROR: usize = 4;

const _: () = assert!(size_of::<NlMsgHdr>() == 16);
const _: () = assert!(size_of::<UnixDiagReq>() == 24);
const _: () = assert!(size_of::<Request>() == 40);
const _: () = assert!(size_of::<UnixDiagMsg>() == 16);
const _: () = assert!(size_of::<UnixDiagRqlen>() == 8);
const _: () = assert!(size_of::<libc::nlmsghdr>() == size_of::<NlMsgHdr>());

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// More parts of the dump follow.
    More,
    /// NLMSG_DONE was seen.
    Done,
}

/// Adds the listeners of one datagram of the dump to `out`; an error for a
/// truncated or malformed message, or one the kernel sent to say it failed.
fn parse(mut buf: &[u8], out: &mut Vec<UnixListener>) -> Result<Parsed> {
    const HDR: usize = size_of::<NlMsgHdr>();
    while !buf.is_empty() {
        let (Some(len), Some(kind), Some(seq)) = (
            u32_at(buf, std::mem::offset_of!(NlMsgHdr, len)),
            u16_at(buf, std::mem::offset_of!(NlMsgHdr, kind)),
            u32_at(buf, std::mem::offset_of!(NlMsgHdr, seq)),
        ) else {
            bail!("a truncated netlink header ({} bytes)", buf.len());
        };
        let len = len as usize;
        ensure!(
            (HDR..=buf.len()).contains(&len),
            "a netlink message of {len} bytes in {} bytes received",
            buf.len()
        );
        let payload = &buf[HDR..len];
        buf = buf.get(align4(len)..).unwrap_or_default();
        if seq != SEQ {
            continue;
        }
        match i32::from(kind) {
            libc::NLMSG_DONE => {
                // A dump that failed part way ends with the error here.
                if let Some(err) = u32_at(payload, 0).map(|e| e as i32)
                    && err < 0
                {
                    return Err(io::Error::from_raw_os_error(-err))
                        .context("the unix_diag dump failed");
                }
                return Ok(Parsed::Done);
            }
            libc::NLMSG_ERROR => {
                ensure!(
                    payload.len() >= NLMSGERR_ERROR,
                    "a truncated NLMSG_ERROR ({} bytes)",
                    payload.len()
                );
                let err = u32_at(payload, 0).unwrap_or_default() as i32;
                if err == 0 {
                    // An acknowledgement; a dump is not asked for one.
                    continue;
                }
                return Err(io::Error::from_raw_os_error(err.saturating_neg()))
                    .context("the kernel refused the unix_diag request");
            }
            libc::NLMSG_NOOP => {}
            _ if kind == SOCK_DIAG_BY_FAMILY => {
                if let Some(listener) = listener(payload)? {
                    out.push(listener);
                }
            }
            _ => bail!("an unexpected netlink message of type {kind} in the unix_diag dump"),
        }
    }
    Ok(Parsed::More)
}

/// The listener one unix_diag message describes, None if it is not a
/// listening stream socket.
fn listener(msg: &[u8]) -> Result<Option<UnixListener>> {
    use std::mem::offset_of;
    const MSG: usize = size_of::<UnixDiagMsg>();
    ensure!(
        msg.len() >= MSG,
        "a truncated unix_diag message ({} bytes)",
        msg.len()
    );
    let (family, kind, state) = (
        msg[offset_of!(UnixDiagMsg, family)],
        msg[offset_of!(UnixDiagMsg, kind)],
        msg[offset_of!(UnixDiagMsg, state)],
    );
    let inode = u32_at(msg, offset_of!(UnixDiagMsg, ino)).unwrap_or_default();
    ensure!(
        i32::from(family) == libc::AF_UNIX,
        "a unix_diag message of family {family}"
    );

    let mut path = String::new();
    let mut rqlen = None;
    let mut attrs = &msg[MSG..];
    while !attrs.is_empty() {
        let (Some(len), Some(kind)) = (u16_at(attrs, 0), u16_at(attrs, 2)) else {
            bail!("a truncated attribute header in the unix_diag message of socket {inode}");
        };
        let len = usize::from(len);
        ensure!(
            (RTA_HDR..=attrs.len()).contains(&len),
            "an attribute of {len} bytes in {} bytes left of the unix_diag message of socket {inode}",
            attrs.len()
        );
        let data = &attrs[RTA_HDR..len];
        attrs = attrs.get(align4(len)..).unwrap_or_default();
        match kind & NLA_TYPE_MASK {
            UNIX_DIAG_NAME => path = name(data),
            UNIX_DIAG_RQLEN => {
                let (Some(rqueue), Some(wqueue)) = (
                    u32_at(data, offset_of!(UnixDiagRqlen, rqueue)),
                    u32_at(data, offset_of!(UnixDiagRqlen, wqueue)),
                ) else {
                    bail!(
                        "a truncated UNIX_DIAG_RQLEN ({} bytes) for socket {inode}",
                        data.len()
                    );
                };
                rqlen = Some(UnixDiagRqlen { rqueue, wqueue });
            }
            _ => {}
        }
    }
    if i32::from(kind) != libc::SOCK_STREAM || u32::from(state) != TCP_LISTEN {
        return Ok(None);
    }
    let rqlen = rqlen.with_context(|| format!("no UNIX_DIAG_RQLEN for socket {inode}"))?;
    Ok(Some(UnixListener {
        inode: u64::from(inode),
        path,
        queued: rqlen.rqueue,
        max_backlog: rqlen.wqueue,
    }))
}

/// A UNIX_DIAG_NAME as `ss` shows it: a path up to its NUL; an abstract
/// name (its first byte NUL) with every NUL as `@`.
fn name(data: &[u8]) -> String {
    if data.first() == Some(&0) {
        let shown: Vec<u8> = data
            .iter()
            .map(|&b| if b == 0 { b'@' } else { b })
            .collect();
        String::from_utf8_lossy(&shown).into_owned()
    } else {
        let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
        String::from_utf8_lossy(&data[..end]).into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_net_unix_lists_stream_listeners_only() {
        let text = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 7001 /run/php/php-fpm.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 7002 @abstract\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 7003 /run/php/php-fpm.sock\n\
            0000000000000000: 00000002 00000000 00010000 0005 01 7004 /run/seq.sock\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 7005\n";
        assert_eq!(
            parse_proc_net_unix(text),
            [
                (7001, "/run/php/php-fpm.sock".to_string()),
                (7002, "@abstract".to_string()),
                (7005, String::new()),
            ]
        );
    }

    fn attr(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut a = Vec::new();
        a.extend_from_slice(&((RTA_HDR + data.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&kind.to_ne_bytes());
        a.extend_from_slice(data);
        a.resize(align4(a.len()), 0);
        a
    }

    fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&2u16.to_ne_bytes()); // NLM_F_MULTI
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(payload);
        m.resize(align4(m.len()), 0);
        m
    }

    fn diag(kind: u8, state: u8, ino: u32, attrs: &[Vec<u8>]) -> Vec<u8> {
        let mut d = vec![libc::AF_UNIX as u8, kind, state, 0];
        d.extend_from_slice(&ino.to_ne_bytes());
        d.extend_from_slice(&[0xff; 8]);
        for a in attrs {
            d.extend_from_slice(a);
        }
        d
    }

    fn rqlen(rqueue: u32, wqueue: u32) -> Vec<u8> {
        let mut r = rqueue.to_ne_bytes().to_vec();
        r.extend_from_slice(&wqueue.to_ne_bytes());
        attr(UNIX_DIAG_RQLEN, &r)
    }

    const STREAM: u8 = libc::SOCK_STREAM as u8;
    const LISTEN: u8 = TCP_LISTEN as u8;

    fn dump() -> Vec<u8> {
        let mut buf = Vec::new();
        // A path with its NUL, as the kernel sends it.
        let path = diag(
            STREAM,
            LISTEN,
            1234,
            &[attr(UNIX_DIAG_NAME, b"/run/php/fpm.sock\0"), rqlen(2, 511)],
        );
        buf.extend(message(SOCK_DIAG_BY_FAMILY, SEQ, &path));
        // An odd-length abstract name, so the next attribute is padded.
        let abs = diag(
            STREAM,
            LISTEN,
            99,
            &[attr(UNIX_DIAG_NAME, b"\0a\0b"), rqlen(0, 4096)],
        );
        buf.extend(message(SOCK_DIAG_BY_FAMILY, SEQ, &abs));
        // Unnamed, and an attribute nobody asked for (UNIX_DIAG_UID).
        let unnamed = diag(
            STREAM,
            LISTEN,
            7,
            &[attr(7, &0u32.to_ne_bytes()), rqlen(1, 3)],
        );
        buf.extend(message(SOCK_DIAG_BY_FAMILY, SEQ, &unnamed));
        // A seqpacket listener is no stream socket.
        let seqpacket = diag(libc::SOCK_SEQPACKET as u8, LISTEN, 8, &[rqlen(0, 1)]);
        buf.extend(message(SOCK_DIAG_BY_FAMILY, SEQ, &seqpacket));
        buf
    }

    #[test]
    fn a_dump_gives_each_listener_its_name_and_queues() {
        let mut out = Vec::new();
        assert_eq!(parse(&dump(), &mut out).unwrap(), Parsed::More);
        let done = message(libc::NLMSG_DONE as u16, SEQ, &0i32.to_ne_bytes());
        assert_eq!(parse(&done, &mut out).unwrap(), Parsed::Done);
        let expected = [
            (1234, "/run/php/fpm.sock", 2, 511),
            (99, "@a@b", 0, 4096),
            (7, "", 1, 3),
        ];
        let got: Vec<_> = out
            .iter()
            .map(|l| (l.inode, l.path.as_str(), l.queued, l.max_backlog))
            .collect();
        assert_eq!(got, expected);
        let index = by_inode(&out);
        assert_eq!(index.len(), 3);
        assert_eq!(index[&99].path, "@a@b");
    }

    #[test]
    fn every_truncation_of_a_dump_is_an_error_not_a_panic() {
        let buf = dump();
        for cut in 1..buf.len() {
            let mut out = Vec::new();
            // Cut at a message boundary, the rest parses (and is More); cut
            // anywhere else, it is an error.
            let boundary = {
                let mut at = 0;
                let mut ends = vec![];
                while at < buf.len() {
                    at += align4(u32_at(&buf, at).unwrap() as usize);
                    ends.push(at);
                }
                ends.contains(&cut)
            };
            let parsed = parse(&buf[..cut], &mut out);
            assert_eq!(parsed.is_ok(), boundary, "cut at {cut}: {parsed:?}");
        }
    }

    #[test]
    fn malformed_messages_are_errors() {
        let mut out = Vec::new();
        // A length shorter than the header, and one past the datagram.
        let mut short = message(SOCK_DIAG_BY_FAMILY, SEQ, &[]);
        short[..4].copy_from_slice(&8u32.to_ne_bytes());
        assert!(parse(&short, &mut out).is_err());
        let mut long = message(SOCK_DIAG_BY_FAMILY, SEQ, &[]);
        long[..4].copy_from_slice(&1000u32.to_ne_bytes());
        assert!(parse(&long, &mut out).is_err());
        // An attribute whose length runs past its message, one shorter than
        // its own header, and an RQLEN too short for its two queues.
        let mut over = attr(UNIX_DIAG_NAME, b"/x\0\0");
        over[..2].copy_from_slice(&64u16.to_ne_bytes());
        let over = diag(STREAM, LISTEN, 1, &[over]);
        assert!(parse(&message(SOCK_DIAG_BY_FAMILY, SEQ, &over), &mut out).is_err());
        let mut under = attr(UNIX_DIAG_NAME, b"/x\0\0");
        under[..2].copy_from_slice(&2u16.to_ne_bytes());
        let under = diag(STREAM, LISTEN, 1, &[under]);
        assert!(parse(&message(SOCK_DIAG_BY_FAMILY, SEQ, &under), &mut out).is_err());
        let short_rq = diag(STREAM, LISTEN, 1, &[attr(UNIX_DIAG_RQLEN, &[0; 4])]);
        assert!(parse(&message(SOCK_DIAG_BY_FAMILY, SEQ, &short_rq), &mut out).is_err());
        // A listener without RQLEN, and a message of another family.
        let no_rq = diag(STREAM, LISTEN, 1, &[]);
        assert!(parse(&message(SOCK_DIAG_BY_FAMILY, SEQ, &no_rq), &mut out).is_err());
        let mut inet = diag(STREAM, LISTEN, 1, &[rqlen(0, 1)]);
        inet[0] = libc::AF_INET as u8;
        assert!(parse(&message(SOCK_DIAG_BY_FAMILY, SEQ, &inet), &mut out).is_err());
        // A message of a type a dump does not send.
        assert!(parse(&message(0x42, SEQ, &[]), &mut out).is_err());
        assert!(out.is_empty());
    }

    #[test]
    fn the_kernel_s_errors_are_errors() {
        let mut out = Vec::new();
        let mut err = (-libc::EINVAL).to_ne_bytes().to_vec();
        err.extend_from_slice(&[0; 16]); // the request's header, echoed
        let e = parse(&message(libc::NLMSG_ERROR as u16, SEQ, &err), &mut out).unwrap_err();
        assert_eq!(
            e.root_cause().to_string(),
            io::Error::from_raw_os_error(libc::EINVAL).to_string()
        );
        let truncated = message(libc::NLMSG_ERROR as u16, SEQ, &[0xff; 2]);
        assert!(parse(&truncated, &mut out).is_err());
        let failed = message(
            libc::NLMSG_DONE as u16,
            SEQ,
            &(-libc::ENOBUFS).to_ne_bytes(),
        );
        assert!(parse(&failed, &mut out).is_err());
        // An acknowledgement is no error; another request's message is skipped.
        let ack = message(libc::NLMSG_ERROR as u16, SEQ, &[0; 20]);
        assert_eq!(parse(&ack, &mut out).unwrap(), Parsed::More);
        let other = message(libc::NLMSG_DONE as u16, SEQ + 1, &0i32.to_ne_bytes());
        assert_eq!(parse(&other, &mut out).unwrap(), Parsed::More);
        // A DONE without its int (older kernels' dumps) still ends the dump.
        let bare = message(libc::NLMSG_DONE as u16, SEQ, &[]);
        assert_eq!(parse(&bare, &mut out).unwrap(), Parsed::Done);
        assert!(out.is_empty());
    }
}
