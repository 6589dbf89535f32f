//! `stackprobe demo`: the README's story without installing anything. Two
//! loopback servers get the same load while `watch` looks at them: one forks a
//! process per connection, as postgres does for clients without persistent
//! connections; the other hands connections to threads it started in advance,
//! as a pooler does. Each server is stackprobe itself, run again with the
//! hidden `demo-server` subcommand: a process of its own, watched by pid, and
//! single-threaded where it forks.

use std::{
    ffi::CString,
    io::{self, BufRead as _, BufReader, Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::{
        fd::AsRawFd as _,
        unix::process::{CommandExt as _, ExitStatusExt as _},
    },
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};
use tokio::sync::oneshot;

use crate::{
    cli::{DemoArgs, DemoServerArgs, DemoServerKind, Selection, WatchArgs},
    cmd::watch::{self, Control},
};
use stackprobe_probes::preflight;

/// Process names newcomers can read in the roles (`demo-forking master`,
/// `demo-forking worker`, `demo-pooled`); a comm holds 15 bytes.
const FORKING: &str = "demo-forking";
const POOLED: &str = "demo-pooled";
/// What serving one connection costs the server, as a short query would.
const WORK: Duration = Duration::from_millis(2);
const POOL_THREADS: usize = 4;
/// Client threads per server: one connection takes a few milliseconds (a
/// fork, the work), so one thread alone falls behind past a few hundred per
/// second.
const CLIENTS: usize = 4;
const REQUEST: &[u8] = b"GET /demo\n";
const REPLY: &[u8] = b"ok\n";
/// Bounds every connect, read and write, so no side can hang the demo.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// A server ends by itself this long after the demo should have, should
/// stackprobe fail to stop it.
const SERVER_GRACE: Duration = Duration::from_secs(60);

pub fn run(args: DemoArgs) -> Result<()> {
    // Without privileges, watch would refuse only after the servers started.
    preflight::check_privileges()?;
    let (load_for, settle) = split(args.duration, args.output.interval);
    let max_seconds = u32::try_from((args.duration + SERVER_GRACE).as_secs()).unwrap_or(u32::MAX);
    // Started while stackprobe has a single thread, which is also the one
    // their parent-death signal is tied to: the main thread, which lives as
    // long as stackprobe does.
    let forking = Server::start(DemoServerKind::Forking, max_seconds)?;
    let pooled = Server::start(DemoServerKind::Pooled, max_seconds)?;
    eprintln!(
        "demo: {FORKING} (pid {}, {}) forks a process per connection, like postgres for clients without persistent connections",
        forking.pid, forking.addr
    );
    eprintln!(
        "demo: {POOLED} (pid {}, {}) hands connections to {POOL_THREADS} threads started in advance, like a connection pooler",
        pooled.pid, pooled.addr
    );
    eprintln!(
        "demo: {} new connections/s to each for {}, then {} more to count the last ones",
        args.rate,
        humantime::format_duration(load_for),
        humantime::format_duration(settle)
    );

    let (attached_tx, attached) = mpsc::channel();
    let (stop_tx, stop) = oneshot::channel();
    let cancel = Arc::new(AtomicBool::new(false));
    let addrs = [forking.addr, pooled.addr];
    let rate = args.rate;
    let load = {
        let cancel = Arc::clone(&cancel);
        thread::Builder::new()
            .name("demo-load".into())
            .spawn(move || -> Option<[Tally; 2]> {
                // Watch ended before attaching: nothing would count the load.
                attached.recv().ok()?;
                let cancel = &*cancel;
                let tallies = thread::scope(|s| {
                    addrs
                        .map(|addr| s.spawn(move || drive(addr, rate, load_for, cancel)))
                        .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                });
                // The forks and exits that trail the last connections reach
                // the last interval report and the summary.
                pause_until(Instant::now() + settle, cancel);
                let _ = stop_tx.send(());
                Some(tallies)
            })
            .context("starting the load generator")?
    };

    let watched = watch::run_with(
        WatchArgs {
            select: Selection {
                pids: vec![forking.pid, pooled.pid],
                ..Selection::default()
            },
            duration: None,
            output: args.output,
            listen: None,
            web_config: None,
            record: None,
            force: false,
            probe_cost: false,
            fork_hook: None,
            queue_hook: None,
            unix_queue_hook: None,
            // The demo's own servers: what the flag costs a busy host does
            // not matter here.
            unix_service_time: true,
            unix_service_hook: None,
            // Off, as in `watch`: the demo shows what a first run shows.
            run_queue: false,
            log_probes: false,
            headless: false,
        },
        Control {
            on_attached: Some(Box::new(move || {
                let _ = attached_tx.send(());
            })),
            stop: Some(stop),
        },
    );
    // Ctrl-C, `q` or an error ended the watch early: stop the clients too.
    cancel.store(true, Ordering::Relaxed);
    let tallies = load
        .join()
        .map_err(|_| anyhow!("the load generator failed"))?;
    if let Some([to_forking, to_pooled]) = &tallies {
        eprintln!(
            "demo: {} connections to {FORKING}, {} to {POOLED}",
            to_forking.completed, to_pooled.completed
        );
        for (name, tally) in [(FORKING, to_forking), (POOLED, to_pooled)] {
            if let Some(error) = &tally.first_error {
                eprintln!(
                    "demo: warning: {} connections to {name} failed (the first: {error})",
                    tally.failed
                );
            }
        }
    }
    let stopped = [forking.stop(), pooled.stop()];
    watched?;
    stopped.into_iter().collect()
}

/// How long the load runs, and how long the run goes on after it: one
/// interval (at most half the run), so the last report sees the load's tail.
fn split(duration: Duration, interval: Duration) -> (Duration, Duration) {
    let settle = interval.min(duration / 2);
    (duration - settle, settle)
}

/// A demo server; dropping it stops it and every child it forked.
struct Server {
    name: &'static str,
    pid: u32,
    addr: SocketAddr,
    /// None once stopped.
    child: Option<Child>,
}

impl Server {
    fn start(kind: DemoServerKind, max_seconds: u32) -> Result<Self> {
        let (name, kind_arg) = match kind {
            DemoServerKind::Forking => (FORKING, "forking"),
            DemoServerKind::Pooled => (POOLED, "pooled"),
        };
        let mut child = Command::new("/proc/self/exe")
            .arg0("stackprobe")
            .arg("demo-server")
            .arg(kind_arg)
            .arg("--parent")
            .arg(std::process::id().to_string())
            .arg("--max-seconds")
            .arg(max_seconds.to_string())
            // A group of its own: stopping the group stops the children it
            // forked too, and Ctrl-C on the terminal reaches only stackprobe,
            // which stops the servers once the summary is out.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting the {name} server"))?;
        let stdout = child.stdout.take();
        let mut server = Self {
            name,
            pid: child.id(),
            addr: (Ipv4Addr::LOCALHOST, 0).into(),
            child: Some(child),
        };
        // From here on, an early return drops `server`, which stops it.
        let mut line = String::new();
        BufReader::new(stdout.context("no pipe from the server")?)
            .read_line(&mut line)
            .with_context(|| format!("reading from the {name} server"))?;
        server.addr = line
            .trim_end()
            .strip_prefix("listening ")
            .and_then(|addr| addr.parse().ok())
            .ok_or_else(|| anyhow!("the {name} server ended before it was listening"))?;
        Ok(server)
    }

    /// Stops the server; an error if it had ended by itself.
    fn stop(mut self) -> Result<()> {
        let name = self.name;
        match self
            .kill()
            .with_context(|| format!("stopping the {name} server"))?
        {
            Some(status) if status.signal() != Some(libc::SIGKILL) => {
                bail!("the {name} server ended during the demo ({status})")
            }
            _ => Ok(()),
        }
    }

    fn kill(&mut self) -> io::Result<Option<ExitStatus>> {
        let Some(mut child) = self.child.take() else {
            return Ok(None);
        };
        // SAFETY: a plain syscall. The group's leader is reaped only by the
        // wait below, so its id cannot belong to anyone else yet.
        unsafe { libc::kill(-(self.pid as libc::pid_t), libc::SIGKILL) };
        child.wait().map(Some)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// What one server's clients saw.
#[derive(Debug, Default)]
struct Tally {
    completed: u64,
    failed: u64,
    first_error: Option<String>,
}

impl Tally {
    fn record(&mut self, outcome: io::Result<()>) {
        match outcome {
            Ok(()) => self.completed += 1,
            Err(e) => {
                self.failed += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    fn merge(mut self, other: Tally) -> Tally {
        self.completed += other.completed;
        self.failed += other.failed;
        self.first_error = self.first_error.or(other.first_error);
        self
    }
}

/// `rate` connections per second to `addr` for `length`: see [`drive_n`].
fn drive(addr: SocketAddr, rate: u32, length: Duration, cancel: &AtomicBool) -> Tally {
    let planned = (f64::from(rate) * length.as_secs_f64()) as u64;
    drive_n(addr, rate, planned, length, cancel)
}

/// `planned` connections to `addr`, `rate` per second: the k-th is due at
/// k/rate and made by whichever client is free, so a slow connection delays
/// no other. Ends after `planned` connections, at the end of `length` (a load
/// that falls behind does not run on), or when cancelled, whichever comes
/// first.
fn drive_n(
    addr: SocketAddr,
    rate: u32,
    planned: u64,
    length: Duration,
    cancel: &AtomicBool,
) -> Tally {
    let next = AtomicU64::new(0);
    let start = Instant::now();
    let client = || {
        let mut tally = Tally::default();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= planned {
                break;
            }
            let due = start + Duration::from_secs_f64(k as f64 / f64::from(rate));
            if !pause_until(due, cancel) || start.elapsed() >= length {
                break;
            }
            tally.record(request(addr));
        }
        tally
    };
    thread::scope(|s| {
        let clients: Vec<_> = (0..CLIENTS).map(|_| s.spawn(client)).collect();
        clients
            .into_iter()
            .map(|c| c.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .fold(Tally::default(), Tally::merge)
    })
}

/// Sleeps until `due`; false if cancelled first.
fn pause_until(due: Instant, cancel: &AtomicBool) -> bool {
    loop {
        if cancel.load(Ordering::Relaxed) {
            return false;
        }
        let now = Instant::now();
        if now >= due {
            return true;
        }
        // Short naps, so a cancel is seen within 50 ms.
        thread::sleep((due - now).min(Duration::from_millis(50)));
    }
}

/// One connection, as a client without persistent connections makes it:
/// connect, ask, read the reply until the server closes.
fn request(addr: SocketAddr) -> io::Result<()> {
    let mut conn = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    conn.write_all(REQUEST)?;
    let mut reply = Vec::new();
    (&conn).take(64).read_to_end(&mut reply)?;
    if reply != REPLY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the reply was {:?}", String::from_utf8_lossy(&reply)),
        ));
    }
    Ok(())
}

/// The hidden `demo-server` subcommand, in a process `demo` started: prints
/// `listening ADDR` once it takes connections, then serves until killed.
pub fn serve(args: DemoServerArgs) -> Result<()> {
    // SAFETY: plain syscalls with no pointers.
    unsafe {
        // Ends with stackprobe, even when stackprobe is killed outright.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
            bail!("prctl(PR_SET_PDEATHSIG): {}", io::Error::last_os_error());
        }
        // stackprobe may have ended before the line above.
        if libc::getppid() as u32 != args.parent {
            bail!("stackprobe (pid {}) has ended", args.parent);
        }
        // And in any case ends after its time: SIGALRM's default action.
        libc::alarm(args.max_seconds);
    }
    let name = match args.kind {
        DemoServerKind::Forking => FORKING,
        DemoServerKind::Pooled => POOLED,
    };
    set_name(name)?;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("listening on 127.0.0.1")?;
    let serve_one: Box<dyn FnMut(TcpStream)> = match args.kind {
        DemoServerKind::Forking => Box::new(fork_per_connection(&listener)?),
        DemoServerKind::Pooled => Box::new(pool()?),
    };
    // stackprobe attaches its probes only once it reads this: the pool's
    // threads, started above, are no part of what it sees.
    let mut out = io::stdout();
    writeln!(out, "listening {}", listener.local_addr()?)
        .and_then(|()| out.flush())
        .context("telling stackprobe the address")?;
    accept_loop(&listener, serve_one)
}

fn set_name(name: &str) -> Result<()> {
    let name = CString::new(name)?;
    // SAFETY: PR_SET_NAME reads a NUL-terminated string (the first 16 bytes).
    if unsafe { libc::prctl(libc::PR_SET_NAME, name.as_ptr()) } != 0 {
        bail!("prctl(PR_SET_NAME): {}", io::Error::last_os_error());
    }
    Ok(())
}

/// Waits until a connection is queued before calling accept, as postgres's
/// postmaster and pgbouncer do. It matters here too: the probes time an accept
/// from its start, so one already blocked when they attach would go uncounted.
fn accept_loop(listener: &TcpListener, mut serve_one: impl FnMut(TcpStream)) -> Result<()> {
    let mut queued = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one pollfd, valid for the call.
        if unsafe { libc::poll(&mut queued, 1, -1) } < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("waiting for connections");
        }
        match listener.accept() {
            Ok((conn, _)) => serve_one(conn),
            // The client gave up before its connection was accepted.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                ) => {}
            Err(e) => return Err(e).context("accepting a connection"),
        }
    }
}

/// Serves each connection in a child forked for it, which exits when done,
/// like a postgres backend for a client that does not stay.
fn fork_per_connection(listener: &TcpListener) -> Result<impl FnMut(TcpStream) + use<>> {
    // The kernel reaps the children: nothing here waits for them.
    // SAFETY: sets a signal's disposition, no handler involved.
    if unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) } == libc::SIG_ERR {
        bail!("ignoring SIGCHLD: {}", io::Error::last_os_error());
    }
    let listen_fd = listener.as_raw_fd();
    Ok(move |conn: TcpStream| {
        // SAFETY: this process has a single thread, so the child may run
        // ordinary code; it leaves through _exit, never back into the loop.
        match unsafe { libc::fork() } {
            0 => unsafe {
                // Ends with its server, as it would end with stackprobe.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                libc::close(listen_fd);
                let _ = handle(conn);
                libc::_exit(0)
            },
            // A failed fork drops the connection: its client counts a failure.
            _ => drop(conn),
        }
    })
}

/// Starts the pool's threads; each connection goes to a free one, and waits
/// in the accept queue while none is.
fn pool() -> Result<impl FnMut(TcpStream)> {
    let (handoff, connections) = mpsc::sync_channel::<TcpStream>(0);
    let connections = Arc::new(Mutex::new(connections));
    for _ in 0..POOL_THREADS {
        let connections = Arc::clone(&connections);
        thread::Builder::new()
            .spawn(move || {
                loop {
                    // The lock is held only while waiting for a connection.
                    let next = match connections.lock() {
                        Ok(connections) => connections.recv(),
                        Err(_) => return,
                    };
                    match next {
                        Ok(conn) => {
                            let _ = handle(conn);
                        }
                        Err(_) => return,
                    }
                }
            })
            .context("starting the pool's threads")?;
    }
    Ok(move |conn| {
        let _ = handoff.send(conn);
    })
}

/// Reads the request line, works, replies. The connection closes as `conn`
/// drops: the server closes first, so TIME_WAIT stays on its side, as with a
/// server that ends each conversation.
fn handle(mut conn: TcpStream) -> io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut request = [0u8; 64];
    let mut len = 0;
    while len < request.len() && !request[..len].contains(&b'\n') {
        match conn.read(&mut request[len..])? {
            0 => break,
            n => len += n,
        }
    }
    thread::sleep(WORK);
    conn.write_all(REPLY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use stackprobe_model::insights::MIN_ACCEPTS;

    #[test]
    fn the_load_stops_one_interval_before_the_end() {
        let s = Duration::from_secs;
        assert_eq!(split(s(20), s(1)), (s(19), s(1)));
        assert_eq!(split(s(4), s(1)), (s(3), s(1)));
        // A long interval leaves the load half the run.
        assert_eq!(split(s(4), s(10)), (s(2), s(2)));
    }

    #[test]
    fn the_default_rate_is_enough_for_the_fork_insight_each_second() {
        use clap::Parser as _;
        let cli = crate::cli::Cli::try_parse_from(["stackprobe", "demo"]).unwrap();
        let crate::cli::Command::Demo(args) = cli.command else {
            panic!("parsed as another command");
        };
        let per_interval = f64::from(args.rate) * args.output.interval.as_secs_f64();
        assert!(per_interval >= 2.0 * MIN_ACCEPTS as f64, "{per_interval}");
    }

    #[test]
    fn a_tally_keeps_the_first_error() {
        let mut a = Tally::default();
        a.record(Ok(()));
        a.record(Err(io::Error::other("refused")));
        let mut b = Tally::default();
        b.record(Err(io::Error::other("reset")));
        b.record(Ok(()));
        let t = a.merge(b);
        assert_eq!((t.completed, t.failed), (2, 2));
        assert_eq!(t.first_error.as_deref(), Some("refused"));
    }

    /// The pooled server and the load generator, for real over loopback:
    /// every connection is answered, and a cancel stops the load at once.
    /// (The forking server changes how its process treats SIGCHLD, so it is
    /// tested as its own process, as root, in tests/demo_e2e.rs.)
    #[test]
    fn the_pooled_server_answers_every_connection_of_the_load() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        let serve_one = pool().unwrap();
        // Left waiting for connections when the test ends.
        thread::spawn(move || accept_loop(&listener, serve_one));
        let cancel = AtomicBool::new(false);
        // The deadline is far past the 50th connection's due time (245 ms),
        // so a busy machine delays the load without cutting it short.
        let tally = drive_n(addr, 200, 50, Duration::from_secs(30), &cancel);
        assert_eq!((tally.completed, tally.failed), (50, 0), "{tally:?}");

        cancel.store(true, Ordering::Relaxed);
        let started = Instant::now();
        let tally = drive(addr, 1, Duration::from_secs(60), &cancel);
        assert_eq!(tally.completed, 0);
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
