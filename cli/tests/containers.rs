//! Root only: servers in the namespaces and cgroups a container runtime
//! makes, made here by the tests themselves: network namespaces (their
//! clients in there too, against `ss` run inside), a cgroup v2 subtree named
//! as Docker names a container's, and a pid namespace.

mod support;

use stackprobe_model::measure::Latency;
use std::process::Command;
use std::time::Duration;

use support::*;

impl Netns {
    /// `program args…` run inside.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]).args(args);
        cmd
    }

    /// Its inode number, as the links name it.
    fn inum(&self, pid: u32) -> u32 {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(format!("/proc/{pid}/ns/net"))
            .unwrap()
            .ino() as u32
    }

    /// `ss -Htan state STATE` lines inside whose local address is `local`.
    fn ss_count(&self, state: &str, local: &str) -> u64 {
        let out = self
            .command("ss", &["-Htan", "state", state])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.split_whitespace().nth(2) == Some(local))
            .count() as u64
    }

    /// A loopback server inside, listening on `tcp`.
    fn server(&self, tcp: &str) -> Server {
        let mut cmd = self.command(LOOPBACK, &["serve", "--tcp", tcp]);
        cmd.current_dir("/");
        Server::start_command(cmd, None)
    }

    /// `n` connections from inside to `addr`, each waiting for the
    /// server's byte and its close.
    fn connect(&self, addr: &str, n: u64) {
        let out = self
            .command(LOOPBACK, &["connect", "tcp", addr, &n.to_string()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program).args(args).status().unwrap();
    assert!(status.success(), "{program} {args:?}: {status}");
}

/// The server's passive link in its namespace: (TIME_WAIT now, opens, closes).
fn passive_link(s: &Session, addr: &str, inum: u32) -> (u64, u64, u64) {
    let peer = format!("{addr} ← 127.0.0.1 in net:[{inum}]");
    s.collector
        .table()
        .links
        .iter()
        .filter(|(k, _)| k.peer == peer)
        .fold((0, 0, 0), |(tw, o, c), (_, st)| {
            (tw + st.time_wait, o + st.opens.total, c + st.closes.total)
        })
}

fn queue_waits(s: &Session, pid: u32) -> u64 {
    s.collector.table().get(pid).map_or(0, |p| {
        p.activity.latency[Latency::AcceptQueue].total.count()
    })
}

#[test]
fn a_server_in_its_own_network_namespace_is_seen_as_ss_sees_it_there() {
    let _lock = probe_lock();
    let ns = Netns::new("one");
    let mut server = ns.server("127.0.0.1:0");
    let inum = ns.inum(server.pid);
    let mut s = Session::start();
    s.collector.probes_mut().watch_pid(server.pid).unwrap();
    s.sync();
    // The first walk finds the listener in there and tells the kernel who
    // owns its port.
    s.collector.observe_sockets().unwrap();

    let n = 100;
    server.send(&format!("accept {n} tcp accept4"));
    ns.connect(&server.tcp, n);
    server.wait_accepted(n);
    observe_until(&mut s, |s| passive_link(s, &server.tcp, inum) == (n, n, n));

    assert_eq!(
        passive_link(&s, &server.tcp, inum),
        (n, n, n),
        "TIME_WAIT, opens, closes on the server's link in net:[{inum}]: {:?}",
        s.collector.table().links.iter().collect::<Vec<_>>()
    );
    assert_eq!(
        ns.ss_count("time-wait", &server.tcp),
        n,
        "ss in the namespace"
    );
    assert_eq!(s.accepts(server.pid), n);
    assert_eq!(
        queue_waits(&s, server.pid),
        n,
        "an accept-queue wait per accept"
    );
    let listeners = s.collector.table().links.listening();
    let listener = listeners
        .iter()
        .find(|l| l.owner == server.pid)
        .unwrap_or_else(|| panic!("no listener of the server: {listeners:?}"));
    assert_eq!(
        (listener.local.to_string(), listener.netns),
        (server.tcp.clone(), Some(inum))
    );
    assert_eq!(listener.max_backlog, 128, "the listener's backlog limit");
    server.stop();
}

#[test]
fn the_same_port_in_two_namespaces_is_two_listeners_with_their_own_counts() {
    let _lock = probe_lock();
    let addr = "127.0.0.1:18555";
    let (ns_a, ns_b) = (Netns::new("a"), Netns::new("b"));
    let mut a = ns_a.server(addr);
    let mut b = ns_b.server(addr);
    let (inum_a, inum_b) = (ns_a.inum(a.pid), ns_b.inum(b.pid));
    assert_ne!(inum_a, inum_b);
    let mut s = Session::start();
    for pid in [a.pid, b.pid] {
        s.collector.probes_mut().watch_pid(pid).unwrap();
    }
    s.sync();
    s.collector.observe_sockets().unwrap();

    let (n_a, n_b) = (12, 7);
    a.send(&format!("accept {n_a} tcp accept4"));
    b.send(&format!("accept {n_b} tcp accept4"));
    ns_a.connect(addr, n_a);
    ns_b.connect(addr, n_b);
    a.wait_accepted(n_a);
    b.wait_accepted(n_b);
    observe_until(&mut s, |s| {
        passive_link(s, addr, inum_a) == (n_a, n_a, n_a)
            && passive_link(s, addr, inum_b) == (n_b, n_b, n_b)
    });

    assert_eq!(
        (
            passive_link(&s, addr, inum_a),
            passive_link(&s, addr, inum_b)
        ),
        ((n_a, n_a, n_a), (n_b, n_b, n_b)),
        "links: {:?}",
        s.collector.table().links.iter().collect::<Vec<_>>()
    );
    assert_eq!(
        (
            ns_a.ss_count("time-wait", addr),
            ns_b.ss_count("time-wait", addr)
        ),
        (n_a, n_b),
        "ss in each namespace"
    );
    assert_eq!((queue_waits(&s, a.pid), queue_waits(&s, b.pid)), (n_a, n_b));
    let mut listeners: Vec<_> = s
        .collector
        .table()
        .links
        .listening()
        .iter()
        .filter(|l| l.local.to_string() == addr)
        .map(|l| (l.owner, l.netns))
        .collect();
    listeners.sort();
    let mut want = vec![(a.pid, Some(inum_a)), (b.pid, Some(inum_b))];
    want.sort();
    assert_eq!(listeners, want);
    a.stop();
    b.stop();
}

/// A cgroup v2 directory named as Docker names a container's scope, under a
/// parent of the test's own; both removed on drop.
struct Cgroup {
    parent: std::path::PathBuf,
    dir: std::path::PathBuf,
    /// From the hierarchy's root, as /proc/PID/cgroup shows it.
    path: String,
    id: String,
}

impl Cgroup {
    fn new() -> Self {
        let mount = stackprobe_probes::procfs::cgroup2_mount().expect("a cgroup v2 mount");
        let id = format!("5eed{:060x}", std::process::id());
        let slice = format!("sp-{}.slice", std::process::id());
        let path = format!("/{slice}/docker-{id}.scope");
        let parent = mount.join(&slice);
        let dir = parent.join(format!("docker-{id}.scope"));
        std::fs::create_dir_all(&dir).unwrap();
        Self {
            parent,
            dir,
            path,
            id,
        }
    }

    /// `program args…` started inside: the shell moves itself in, then
    /// execs it.
    fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$@\"",
                self.dir.display()
            ))
            .arg("sh")
            .arg(program)
            .args(args);
        cmd
    }

    fn procs(&self) -> Vec<u32> {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .unwrap()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Its processes were killed; their exits may still be under way.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir(&self.parent);
    }
}

#[test]
fn a_container_selected_by_its_cgroup_is_named_and_what_starts_there_later_is_watched() {
    let _lock = probe_lock();
    let cg = Cgroup::new();
    let short = &cg.id[..12];
    // A server in the container's cgroup and a pid namespace of its own,
    // where it is pid 1 (unshare forks it and waits).
    let mut server = Server::start_command(
        cg.command(
            "unshare",
            &["--pid", "--fork", "--kill-child", LOOPBACK, "serve"],
        ),
        None,
    );
    let in_ns = cg
        .procs()
        .into_iter()
        .find(|&p| p != server.pid)
        .expect("the server forked by unshare");
    // Outside the container: never watched.
    let mut outside = Server::start(None);

    // Reports far apart: what is counted before the first is what the
    // kernel watched by itself, from the exec in the cgroup.
    let mut sp = Running::start(&["watch", "--cgroup", &cg.path, "--json", "--interval", "20s"]);
    sp.wait_stderr("probes attached");
    server.accept_queued(9, false, "accept4");
    outside.accept_queued(3, false, "accept4");
    // Started in the container after stackprobe: watched from its exec.
    let dir = TempDir::new("later");
    let later_bin = dir.loopback_as("sp-later");
    let mut later =
        Server::start_command(cg.command(later_bin.to_str().unwrap(), &["serve"]), None);
    later.accept_queued(4, false, "accept4");
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "exit {status}; stderr:\n{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();

    let found = |pid: u32| {
        row(&summary, pid)
            .unwrap_or_else(|| panic!("no row for {pid}: {}", summary["processes"]))
            .clone()
    };
    let s = found(in_ns);
    assert_eq!(s["total"], 9, "{s}");
    assert_eq!(s["ns_pid"], 1, "its pid in its pid namespace: {s}");
    assert_eq!(
        (&s["container"]["runtime"], s["container"]["id"].as_str()),
        (&serde_json::json!("docker"), Some(cg.id.as_str())),
        "{s}"
    );
    assert_eq!(s["role"], format!("stackprobe-loop [{short}]"));
    let l = found(later.pid);
    assert_eq!(l["total"], 4, "{l}");
    assert_eq!(l["container"]["id"].as_str(), Some(cg.id.as_str()));
    assert_eq!(l["ns_pid"], serde_json::Value::Null);
    assert!(row(&summary, outside.pid).is_none(), "outside the cgroup");
    let roles: Vec<_> = summary["roles"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["container"] == short)
        .map(|r| r["role"].as_str().unwrap().to_string())
        .collect();
    assert!(
        roles.contains(&format!("stackprobe-loop [{short}]"))
            && roles.contains(&format!("sp-later [{short}]")),
        "{roles:?}"
    );

    // By the container's short id: the same processes, and nothing else.
    let out = Command::new(STACKPROBE)
        .args(["watch", "--container", short, "--json", "--duration", "1s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let summary = json_lines(&String::from_utf8_lossy(&out.stdout))
        .pop()
        .unwrap();
    let watched: Vec<_> = summary["roles"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["processes"].as_u64() > Some(0))
        .map(|r| {
            (
                r["role"].as_str().unwrap().to_string(),
                r["container"].clone(),
            )
        })
        .collect();
    assert!(
        watched.contains(&(format!("stackprobe-loop [{short}]"), short.into()))
            && watched.contains(&(format!("sp-later [{short}]"), short.into()))
            && watched.iter().all(|(_, c)| c == short),
        "{watched:?}"
    );
    let out = Command::new(STACKPROBE)
        .args(["watch", "--container", "no-such-container", "--json"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no running container no-such-container"),
        "{err}"
    );
    later.stop();
    server.stop();
    outside.stop();
}

#[test]
fn a_namespace_stackprobe_may_not_enter_is_named_in_the_warnings_not_shown_empty() {
    let _lock = probe_lock();
    let ns = Netns::new("shut");
    let mut server = ns.server("127.0.0.1:0");
    let inum = ns.inum(server.pid);
    // Without CAP_SYS_ADMIN stackprobe cannot mount tracefs either: mount
    // it for the run (and unmount it after, if it was not).
    let tracefs = std::path::Path::new("/sys/kernel/tracing");
    let mounted = tracefs.join("events").exists();
    if !mounted {
        run(
            "mount",
            &["-t", "tracefs", "tracefs", "/sys/kernel/tracing"],
        );
    }
    let out = Command::new("setpriv")
        .args(["--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin"])
        .args([STACKPROBE, "watch", "--pid", &server.pid.to_string()])
        .args(["--json", "--duration", "1s"])
        .output()
        .unwrap();
    if !mounted {
        run("umount", &["/sys/kernel/tracing"]);
    }
    assert!(out.status.success(), "{out:?}");
    let summary = json_lines(&String::from_utf8_lossy(&out.stdout))
        .pop()
        .unwrap();
    let warnings = summary["tcp"]["warnings"].as_array().unwrap();
    let want = format!(
        "net:[{inum}] (process {}'s network namespace) could not be walked: CAP_SYS_ADMIN",
        server.pid
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.as_str().unwrap().starts_with(&want)),
        "{warnings:?}"
    );
    assert_eq!(summary["tcp"]["listeners"], serde_json::json!([]));
    server.send("exit");
    server.stop();
}
