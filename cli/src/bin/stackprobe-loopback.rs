//! A loopback server and client whose every accept is known, for stackprobe's
//! tests and benchmarks (the demo's servers are `stackprobe demo-server`). Bounded: it exits when stdin closes, after
//! its commands, and in any case after `--max-seconds`.
//!
//! `stackprobe-loopback serve --tcp 127.0.0.1:0 [--unix PATH] [--backlog N]`
//! (the backlog of both listeners) prints
//! `pid N`, `tcp ADDR`, `unix PATH`, `ready`, then reads commands from stdin:
//!   `accept N tcp|unix accept|accept4`  accept N connections with that
//!       syscall, writing one byte to each before closing it; replies `accepted N`
//!   `fork`  fork; the child (`child PID`) takes over the commands and the
//!       parent waits for it
//!   `serve-fork N tcp|unix MS`  accept N connections and fork a child for
//!       each, as a forking server does: the child writes the byte, lives MS
//!       milliseconds and exits; replies `served N` once all are reaped.
//!       `serve-fork N tcp|unix MS hold`: the child holds the connection
//!       until it exits, as a postgres backend does
//!   `accept-wait N tcp|unix`  accept N connections, writing the byte to
//!       each, then close each only after its client has: the clients close
//!       first; replies `accepted N`
//!   `pool N COUNT tcp|unix MS`  N worker threads serve COUNT connections
//!       between them, one at a time each, as a php-fpm pool does: each
//!       reads the client's 8-byte CLOCK_MONOTONIC stamp taken before its
//!       connect, holds the connection MS milliseconds, writes the byte and
//!       closes; replies `pooling` once started, then `pooled COUNT waits
//!       SUM MIN MAX` (ns from each client's stamp to its accept's return)
//!   `threads N [RATE]`  start N threads that end at once (RATE per second);
//!       replies `threads N` (`threads N in SECONDSs` with a rate)
//!   `spawn-exec N`  fork N children that exec /bin/true; replies `execs N`
//!   `workers N CPU|any`  start N threads, pinned to CPU (or not), that
//!       wait for `work`; replies `workers TID…`
//!   `work ROUNDS SPIN_US SLEEP_US`  each worker spins SPIN_US µs then
//!       sleeps SLEEP_US µs, ROUNDS times, and waits again; replies `worked
//!       LATE` (ns the workers' sleeps ended past their due times, summed:
//!       what a wakeup and the wait for the CPU after it can take at most)
//!   `exit`  exit (as does end of input)
//!
//! `stackprobe-loopback clients tcp|unix ADDR M` opens M connections at
//! once (a thread each), each sending its CLOCK_MONOTONIC stamp taken just
//! before its connect, then reading the byte and the server's close;
//! prints `connected M`.
//!
//! `stackprobe-loopback connect tcp|unix ADDR N [--close-first]` opens N
//! connections one after another, reading the server's byte on each, then
//! waiting for the server to close (or, with `--close-first`, closing at
//! once); prints `connected N`. A unix ADDR `@name` is an abstract name.

use std::{
    io::{self, BufRead, Read, Write},
    net::{TcpListener, TcpStream},
    os::{
        fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd, RawFd},
        linux::net::SocketAddrExt as _,
        unix::net::{SocketAddr, UnixListener, UnixStream},
    },
    process::ExitCode,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("connect") => connect(&args[1..]),
        Some("clients") => clients(&args[1..]),
        _ => Err("usage: stackprobe-loopback serve --tcp ADDR [--unix PATH] [--max-seconds N] | connect tcp|unix ADDR N".into()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("stackprobe-loopback: {e}");
            ExitCode::FAILURE
        }
    }
}

type Result<T> = std::result::Result<T, String>;

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2)
        .find(|w| w[0] == name)
        .map(|w| w[1].as_str())
}

/// A unix address as `ss` writes it: a path, or `@name` for an abstract
/// one.
fn unix_addr(addr: &str) -> io::Result<SocketAddr> {
    match addr.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(addr),
    }
}

fn serve(args: &[String]) -> Result<ExitCode> {
    let max_seconds: u32 = flag(args, "--max-seconds")
        .unwrap_or("120")
        .parse()
        .map_err(|e| format!("--max-seconds: {e}"))?;
    // SAFETY: alarm only schedules SIGALRM, whose default action ends the process.
    unsafe { libc::alarm(max_seconds) };
    let tcp_addr = flag(args, "--tcp").unwrap_or("127.0.0.1:0");
    let tcp = TcpListener::bind(tcp_addr).map_err(|e| format!("bind {tcp_addr}: {e}"))?;
    let unix = match flag(args, "--unix") {
        Some(path) => {
            let _ = std::fs::remove_file(path);
            Some(UnixListener::bind(path).map_err(|e| format!("bind {path}: {e}"))?)
        }
        None => None,
    };
    if let Some(backlog) = flag(args, "--backlog") {
        let backlog: i32 = backlog.parse().map_err(|e| format!("--backlog: {e}"))?;
        let fds = std::iter::once(tcp.as_raw_fd()).chain(unix.as_ref().map(|u| u.as_raw_fd()));
        for fd in fds {
            // listen() again on a listening socket sets its accept-queue limit.
            // SAFETY: a plain syscall on a socket we own.
            if unsafe { libc::listen(fd, backlog) } != 0 {
                return Err(format!("listen: {}", io::Error::last_os_error()));
            }
        }
    }
    let mut out = io::stdout();
    let mut say = |line: String| -> Result<()> {
        writeln!(out, "{line}")
            .and_then(|()| out.flush())
            .map_err(|e| e.to_string())
    };
    say(format!("pid {}", std::process::id()))?;
    say(format!(
        "tcp {}",
        tcp.local_addr().map_err(|e| e.to_string())?
    ))?;
    if let Some(path) = flag(args, "--unix") {
        say(format!("unix {path}"))?;
    }
    say("ready".into())?;

    let mut workers = None;
    let stdin = io::stdin();
    for line in stdin.lock().lines() {
        let line = line.map_err(|e| e.to_string())?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["accept", n, which, syscall] => {
                let n: u64 = n.parse().map_err(|e| format!("accept count: {e}"))?;
                let fd = match *which {
                    "tcp" => tcp.as_raw_fd(),
                    "unix" => unix.as_ref().ok_or("no --unix listener")?.as_raw_fd(),
                    other => return Err(format!("unknown listener {other}")),
                };
                let plain = match *syscall {
                    "accept" => true,
                    "accept4" => false,
                    other => return Err(format!("unknown syscall {other}")),
                };
                for _ in 0..n {
                    accept_one(fd, plain)?;
                }
                say(format!("accepted {n}"))?;
            }
            ["fork"] => {
                // SAFETY: this process is single-threaded, so the child may
                // carry on with anything.
                match unsafe { libc::fork() } {
                    -1 => return Err(format!("fork: {}", io::Error::last_os_error())),
                    0 => say(format!("child {}", std::process::id()))?,
                    child => return Ok(wait_for(child)),
                }
            }
            ["serve-fork", n, which, ms, rest @ ..] => {
                // `hold`: the child keeps the connection until it exits, as
                // a postgres backend does, instead of closing it at once.
                let hold = rest == ["hold"];
                let n: u64 = n.parse().map_err(|e| format!("count: {e}"))?;
                let ms: u64 = ms.parse().map_err(|e| format!("lifetime: {e}"))?;
                let fd = match *which {
                    "tcp" => tcp.as_raw_fd(),
                    "unix" => unix.as_ref().ok_or("no --unix listener")?.as_raw_fd(),
                    other => return Err(format!("unknown listener {other}")),
                };
                let mut children = Vec::new();
                for _ in 0..n {
                    children.push(accept_and_fork(fd, ms, hold)?);
                }
                for child in children {
                    reap(child)?;
                }
                say(format!("served {n}"))?;
            }
            ["accept-wait", n, which] => {
                let n: u64 = n.parse().map_err(|e| format!("accept count: {e}"))?;
                let fd = match *which {
                    "tcp" => tcp.as_raw_fd(),
                    "unix" => unix.as_ref().ok_or("no --unix listener")?.as_raw_fd(),
                    other => return Err(format!("unknown listener {other}")),
                };
                let mut held = Vec::new();
                for _ in 0..n {
                    let mut conn = accept_conn(fd, false)?;
                    conn.write_all(b"x").map_err(|e| format!("write: {e}"))?;
                    held.push(conn);
                }
                for mut conn in held {
                    let mut rest = Vec::new();
                    conn.read_to_end(&mut rest)
                        .map_err(|e| format!("read: {e}"))?;
                }
                say(format!("accepted {n}"))?;
            }
            ["accept-threads", n_tcp, n_unix] => {
                // A thread per listener, each blocked in accept until its
                // connections come, as php-fpm workers and thread-per-
                // listener servers are; "accepting" once both are started.
                let n_tcp: u64 = n_tcp.parse().map_err(|e| format!("tcp count: {e}"))?;
                let n_unix: u64 = n_unix.parse().map_err(|e| format!("unix count: {e}"))?;
                let tcp_fd = tcp.as_raw_fd();
                let unix_fd = unix.as_ref().ok_or("no --unix listener")?.as_raw_fd();
                std::thread::scope(|scope| -> Result<()> {
                    let tcp =
                        scope.spawn(move || (0..n_tcp).try_for_each(|_| accept_one(tcp_fd, false)));
                    let unix = scope
                        .spawn(move || (0..n_unix).try_for_each(|_| accept_one(unix_fd, true)));
                    say("accepting".into())?;
                    for t in [tcp, unix] {
                        t.join().map_err(|_| "an accept thread panicked")??;
                    }
                    Ok(())
                })?;
                say(format!("accepted {n_tcp}+{n_unix}"))?;
            }
            ["pool", n, count, which, ms] => {
                let n: u64 = n.parse().map_err(|e| format!("workers: {e}"))?;
                let count: u64 = count.parse().map_err(|e| format!("count: {e}"))?;
                let ms: u64 = ms.parse().map_err(|e| format!("service time: {e}"))?;
                let fd = match *which {
                    "tcp" => tcp.as_raw_fd(),
                    "unix" => unix.as_ref().ok_or("no --unix listener")?.as_raw_fd(),
                    other => return Err(format!("unknown listener {other}")),
                };
                let served = pool(fd, n, count, ms, || say("pooling".into()))?;
                let (waits, holds): (Vec<u64>, Vec<u64>) = served.into_iter().unzip();
                let sum: u64 = waits.iter().sum();
                let min = waits.iter().min().copied().unwrap_or(0);
                let max = waits.iter().max().copied().unwrap_or(0);
                let held_sum: u64 = holds.iter().sum();
                let held_max = holds.iter().max().copied().unwrap_or(0);
                say(format!(
                    "pooled {count} waits {sum} {min} {max} held {held_sum} {held_max}"
                ))?;
            }
            ["threads", n] => {
                let n: u64 = n.parse().map_err(|e| format!("count: {e}"))?;
                threads(n, None)?;
                say(format!("threads {n}"))?;
            }
            ["threads", n, rate] => {
                let n: u64 = n.parse().map_err(|e| format!("count: {e}"))?;
                let rate: f64 = rate.parse().map_err(|e| format!("rate: {e}"))?;
                let took = threads(n, Some(rate))?;
                say(format!("threads {n} in {:.3}s", took.as_secs_f64()))?;
            }
            ["spawn-exec", n] => {
                let n: u64 = n.parse().map_err(|e| format!("count: {e}"))?;
                for _ in 0..n {
                    let status = std::process::Command::new("/bin/true")
                        .status()
                        .map_err(|e| format!("spawning /bin/true: {e}"))?;
                    if !status.success() {
                        return Err(format!("/bin/true: {status}"));
                    }
                }
                say(format!("execs {n}"))?;
            }
            ["workers", n, cpu] => {
                let n: usize = n.parse().map_err(|e| format!("workers: {e}"))?;
                let cpu = match *cpu {
                    "any" => None,
                    cpu => Some(cpu.parse().map_err(|e| format!("cpu: {e}"))?),
                };
                let started = Workers::start(n, cpu)?;
                let tids: Vec<String> = started.tids.iter().map(ToString::to_string).collect();
                workers = Some(started);
                say(format!("workers {}", tids.join(" ")))?;
            }
            ["work", rounds, spin_us, sleep_us] => {
                let parse = |v: &str| v.parse::<u64>().map_err(|e| format!("work: {e}"));
                let order = Order {
                    rounds: parse(rounds)?,
                    spin_us: parse(spin_us)?,
                    sleep_us: parse(sleep_us)?,
                };
                let late = workers.as_ref().ok_or("no workers")?.run(order)?;
                say(format!("worked {late}"))?;
            }
            ["exit"] => break,
            [] => {}
            _ => return Err(format!("unknown command {line:?}")),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// CLOCK_MONOTONIC in ns: the clock the probes stamp with.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `n` workers serve `count` connections from `listen_fd` between them, one
/// at a time each, holding each `ms` milliseconds; the wait of each (its
/// client's stamp to its accept's return) and its hold (the accept's return
/// to the close's: a sleep overshoots by ms where CPUs are short).
fn pool(
    listen_fd: RawFd,
    n: u64,
    count: u64,
    ms: u64,
    started: impl FnOnce() -> Result<()>,
) -> Result<Vec<(u64, u64)>> {
    use std::sync::{
        Mutex,
        atomic::{AtomicU64, Ordering},
    };
    let left = AtomicU64::new(count);
    let served = Mutex::new(Vec::new());
    std::thread::scope(|scope| -> Result<()> {
        let workers: Vec<_> = (0..n)
            .map(|_| {
                scope.spawn(|| -> Result<()> {
                    // Claim a connection before accepting it, so no worker
                    // is left in accept once all are served.
                    while left
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |l| l.checked_sub(1))
                        .is_ok()
                    {
                        let mut conn = accept_conn(listen_fd, false)?;
                        let accepted = monotonic_ns();
                        let mut stamp = [0u8; 8];
                        conn.read_exact(&mut stamp)
                            .map_err(|e| format!("read: {e}"))?;
                        let wait = accepted.saturating_sub(u64::from_le_bytes(stamp));
                        std::thread::sleep(std::time::Duration::from_millis(ms));
                        conn.write_all(b"x").map_err(|e| format!("write: {e}"))?;
                        drop(conn);
                        let held = monotonic_ns() - accepted;
                        served.lock().map_err(|_| "poisoned")?.push((wait, held));
                    }
                    Ok(())
                })
            })
            .collect();
        started()?;
        for w in workers {
            w.join().map_err(|_| "a pool worker panicked")??;
        }
        Ok(())
    })?;
    served.into_inner().map_err(|_| "poisoned".into())
}

/// Accepts one connection with accept(2) (`plain`) or accept4(2),
/// retrying on EINTR.
fn accept_conn(listen_fd: RawFd, plain: bool) -> Result<std::fs::File> {
    loop {
        // SAFETY: plain syscalls on a listening socket we own; no address wanted.
        let fd = unsafe {
            if plain {
                libc::accept(listen_fd, std::ptr::null_mut(), std::ptr::null_mut())
            } else {
                libc::accept4(
                    listen_fd,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            }
        };
        if fd >= 0 {
            // SAFETY: the kernel just returned this fd to us.
            return Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) }));
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(format!("accept: {err}"));
        }
    }
}

fn accept_one(listen_fd: RawFd, plain: bool) -> Result<()> {
    let mut stream = accept_conn(listen_fd, plain)?;
    // The client waits for this byte, so it knows its connection was accepted.
    stream.write_all(b"x").map_err(|e| format!("write: {e}"))
}

/// Accepts one connection and forks a child to serve it: the child writes the
/// byte, lives `ms` milliseconds and exits without returning.
fn accept_and_fork(listen_fd: RawFd, ms: u64, hold: bool) -> Result<libc::pid_t> {
    let conn = accept_conn(listen_fd, false)?.into_raw_fd();
    // SAFETY: the server is single-threaded here; the child only makes
    // async-signal-safe calls (write, close, nanosleep, _exit).
    match unsafe { libc::fork() } {
        -1 => {
            let err = io::Error::last_os_error();
            // SAFETY: closing the connection we could not hand to a child.
            unsafe { libc::close(conn) };
            Err(format!("fork: {err}"))
        }
        0 => unsafe {
            libc::write(conn, b"x".as_ptr().cast(), 1);
            if !hold {
                libc::close(conn);
            }
            let t = libc::timespec {
                tv_sec: (ms / 1000) as libc::time_t,
                tv_nsec: ((ms % 1000) * 1_000_000) as libc::c_long,
            };
            libc::nanosleep(&t, std::ptr::null_mut());
            libc::_exit(0)
        },
        child => {
            // SAFETY: the parent's copy of the connection is no longer needed.
            unsafe { libc::close(conn) };
            Ok(child)
        }
    }
}

fn reap(child: libc::pid_t) -> Result<()> {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if unsafe { libc::waitpid(child, &mut status, 0) } != child || !libc::WIFEXITED(status) {
        return Err(format!("child {child} did not exit cleanly"));
    }
    Ok(())
}

fn wait_for(child: libc::pid_t) -> ExitCode {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Starts `n` threads that end at once, one after another, at `rate` per
/// second if given (as fast as possible otherwise, or when behind): an event
/// source whose rate the benchmarks choose.
fn threads(n: u64, rate: Option<f64>) -> Result<std::time::Duration> {
    let start = std::time::Instant::now();
    for i in 0..n {
        if let Some(rate) = rate {
            let due = start + std::time::Duration::from_secs_f64(i as f64 / rate);
            if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        std::thread::spawn(|| ())
            .join()
            .map_err(|_| "a thread panicked")?;
    }
    Ok(start.elapsed())
}

/// What each worker does for one `work` command.
#[derive(Clone, Copy)]
struct Order {
    rounds: u64,
    spin_us: u64,
    sleep_us: u64,
}

/// Threads that sleep until given an [`Order`], for the run-queue tests:
/// between orders every one of them is blocked, so the kernel's per-thread
/// accounts hold still while a test reads them.
struct Workers {
    /// The order's number (each worker runs each number once) and the order.
    orders: std::sync::Arc<(std::sync::Mutex<(u64, Order)>, std::sync::Condvar)>,
    /// Each worker's lateness for an order (see `work`).
    done: std::sync::mpsc::Receiver<u64>,
    tids: Vec<i32>,
}

impl Workers {
    fn start(n: usize, cpu: Option<usize>) -> Result<Self> {
        use std::sync::{Arc, Condvar, Mutex, mpsc};
        let idle = Order {
            rounds: 0,
            spin_us: 0,
            sleep_us: 0,
        };
        let orders = Arc::new((Mutex::new((0, idle)), Condvar::new()));
        let (done_tx, done) = mpsc::channel();
        let (tid_tx, tid_rx) = mpsc::channel();
        for _ in 0..n {
            let (orders, done_tx, tid_tx) = (orders.clone(), done_tx.clone(), tid_tx.clone());
            std::thread::spawn(move || {
                if let Some(cpu) = cpu {
                    pin_to(cpu);
                }
                // A sleep then ends when due, not up to 50 µs later: its
                // lateness is the wakeup's own.
                // SAFETY: PR_SET_TIMERSLACK takes a number and touches no memory.
                unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
                // SAFETY: gettid has no preconditions.
                let _ = tid_tx.send(unsafe { libc::gettid() });
                let mut seen = 0;
                loop {
                    let order = {
                        let (lock, wake) = &*orders;
                        let guard = lock.lock().unwrap_or_else(|e| e.into_inner());
                        let guard = wake
                            .wait_while(guard, |(number, _)| *number == seen)
                            .unwrap_or_else(|e| e.into_inner());
                        seen = guard.0;
                        guard.1
                    };
                    let mut late = 0;
                    for _ in 0..order.rounds {
                        let until = monotonic_ns() + order.spin_us * 1000;
                        while monotonic_ns() < until {
                            std::hint::spin_loop();
                        }
                        let due = monotonic_ns() + order.sleep_us * 1000;
                        std::thread::sleep(std::time::Duration::from_micros(order.sleep_us));
                        late += monotonic_ns().saturating_sub(due);
                    }
                    if done_tx.send(late).is_err() {
                        return;
                    }
                }
            });
        }
        let tids = (0..n)
            .map(|_| tid_rx.recv().map_err(|_| "a worker died".to_string()))
            .collect::<Result<_>>()?;
        Ok(Self { orders, done, tids })
    }

    /// Gives every worker `order` and waits until all have carried it out;
    /// returns their lateness, summed.
    fn run(&self, order: Order) -> Result<u64> {
        {
            let (lock, wake) = &*self.orders;
            let mut guard = lock.lock().unwrap_or_else(|e| e.into_inner());
            *guard = (guard.0 + 1, order);
            wake.notify_all();
        }
        let mut late = 0;
        for _ in &self.tids {
            late += self.done.recv().map_err(|_| "a worker died")?;
        }
        Ok(late)
    }
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET and
    // sched_setaffinity only touch the set they are given.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set);
    }
}

fn clients(args: &[String]) -> Result<ExitCode> {
    let [kind, addr, m] = args else {
        return Err("usage: clients tcp|unix ADDR M".into());
    };
    let m: u64 = m.parse().map_err(|e| format!("count: {e}"))?;
    // Each connect's time is returned: the kernel queues the connection
    // inside it, so the stamp precedes the queueing by less than that. So
    // is each connection's whole life, the connect's start to the close's
    // return, which holds whatever the kernel times of it.
    let one = || -> io::Result<(u64, u64)> {
        let before = monotonic_ns();
        let mut s: Box<dyn ReadWrite> = match kind.as_str() {
            "tcp" => Box::new(TcpStream::connect(addr.as_str())?),
            "unix" => Box::new(UnixStream::connect_addr(&unix_addr(addr)?)?),
            other => return Err(io::Error::other(format!("unknown kind {other}"))),
        };
        let connecting = monotonic_ns().saturating_sub(before);
        s.write_all(&before.to_le_bytes())?;
        let mut rest = Vec::new();
        s.read_to_end(&mut rest)?;
        if rest != b"x" {
            return Err(io::Error::other(format!("read {rest:?}, not the byte")));
        }
        drop(s);
        Ok((connecting, monotonic_ns() - before))
    };
    let (connecting, longest) = std::thread::scope(|scope| -> Result<(u64, u64)> {
        let all: Vec<_> = (0..m).map(|_| scope.spawn(one)).collect();
        let (mut sum, mut longest) = (0, 0);
        for c in all {
            let (connecting, life) = c
                .join()
                .map_err(|_| "a client panicked")?
                .map_err(|e| format!("client of {addr}: {e}"))?;
            sum += connecting;
            longest = longest.max(life);
        }
        Ok((sum, longest))
    })?;
    println!("connected {m} in {connecting} ns of connects, the longest life {longest} ns");
    Ok(ExitCode::SUCCESS)
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn connect(args: &[String]) -> Result<ExitCode> {
    let (close_first, args) = match args {
        [rest @ .., last] if last == "--close-first" => (true, rest),
        _ => (false, args),
    };
    let [kind, addr, n] = args else {
        return Err("usage: connect tcp|unix ADDR N [--close-first]".into());
    };
    let n: u64 = n.parse().map_err(|e| format!("count: {e}"))?;
    let talk = |s: &mut dyn Read| -> io::Result<()> {
        let mut byte = [0u8; 1];
        s.read_exact(&mut byte)?;
        if !close_first {
            // Wait for the server's FIN: it closes first.
            let mut rest = Vec::new();
            s.read_to_end(&mut rest)?;
        }
        Ok(())
    };
    for _ in 0..n {
        match kind.as_str() {
            "tcp" => TcpStream::connect(addr.as_str()).and_then(|mut s| talk(&mut s)),
            "unix" => unix_addr(addr)
                .and_then(|a| UnixStream::connect_addr(&a))
                .and_then(|mut s| talk(&mut s)),
            other => return Err(format!("unknown kind {other}")),
        }
        .map_err(|e| format!("connect {addr}: {e}"))?;
    }
    println!("connected {n}");
    Ok(ExitCode::SUCCESS)
}
