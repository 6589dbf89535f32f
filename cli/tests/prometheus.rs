//! Root only: two "hosts" (an agent, and a `watch --listen` that also
//! prints its own numbers), each watching a loopback server, scraped by a
//! real Prometheus (Debian's, with native histograms on) on loopback; what
//! Prometheus stores and answers is checked against what stackprobe itself
//! measured.

mod support;

use std::{
    io::{Read as _, Write as _},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use support::*;

/// A port free now on loopback.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn http_get(addr: &str, path: &str) -> String {
    let mut conn = std::net::TcpStream::connect(addr).unwrap();
    write!(conn, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(head.contains(" 200 "), "{head}\n{body}");
    body.to_string()
}

/// Percent-encodes a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A Prometheus server on loopback, killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    _dir: TempDir,
}

impl Prometheus {
    fn start(targets: &[String]) -> Self {
        let dir = TempDir::new("prometheus");
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        let config = format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: stackprobe\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        );
        let config_path = dir.0.join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.0.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--enable-feature=native-histograms")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("running prometheus (cargo xtask setup installs it)");
        Self {
            child,
            addr,
            _dir: dir,
        }
    }

    /// The result vector of an instant query.
    fn query(&self, q: &str) -> Vec<Value> {
        let body = http_get(&self.addr, &format!("/api/v1/query?query={}", encode(q)));
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{q}: {v}");
        v["data"]["result"].as_array().unwrap().clone()
    }

    /// Queries until `done` holds on the result (bounded: Prometheus
    /// starts, then scrapes each second).
    fn query_until(&self, q: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = std::net::TcpStream::connect(&self.addr).is_ok();
            if ready {
                let r = self.query(q);
                if done(&r) || Instant::now() > deadline {
                    return r;
                }
            } else if Instant::now() > deadline {
                panic!("prometheus did not start on {}", self.addr);
            }
            thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `stackprobe agent --pid PID` serving metrics on a loopback port; its
/// address.
fn agent(pid: u32) -> (Running, String) {
    let mut sp = Running::start(&[
        "agent",
        "--pid",
        &pid.to_string(),
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "200ms",
    ]);
    sp.wait_stderr("probes attached");
    let addr = sp.metrics_addr();
    (sp, addr)
}

fn value(r: &Value) -> f64 {
    r["value"][1].as_str().unwrap().parse().unwrap()
}

#[test]
fn prometheus_stores_two_hosts_native_histograms_with_stackprobes_precision() {
    let _lock = probe_lock();
    let mut a = Server::start(None);
    let mut b = Server::start(None);
    // Host a runs `watch --json --listen`, which serves the same metrics as
    // an agent and also prints stackprobe's own numbers: Prometheus' are
    // compared with those of the same process (two tracers on one hook
    // would time each accept differently, most of all in the tail). Host
    // b runs the agent.
    let mut own = Running::start(&[
        "watch",
        "--pid",
        &a.pid.to_string(),
        "--json",
        // Its reports go to a pipe the test reads only at the end: few
        // enough that the pipe never fills (a full one would stall it).
        "--interval",
        "1s",
        "--listen",
        "127.0.0.1:0",
    ]);
    own.wait_stderr("probes attached");
    let addr_a = own.metrics_addr();
    let (agent_b, addr_b) = agent(b.pid);
    let (n_a, n_b) = (120, 45);
    // Server a waits ~2 ms in accept for each connection.
    a.send(&format!("accept {n_a} tcp accept4"));
    for _ in 0..n_a {
        thread::sleep(Duration::from_millis(2));
        tcp_connect_and_read(&a.tcp);
    }
    a.wait_accepted(n_a);
    b.accept_queued(n_b, false, "accept4");
    let prometheus = Prometheus::start(&[addr_a.clone(), addr_b.clone()]);

    let accept = r#"stackprobe_latency_seconds{metric="accept",role="stackprobe-loop"}"#;
    // Until both hosts' last snapshots, after every accept, are scraped.
    let count = |s: &Value| -> u64 {
        s["histogram"][1]["count"]
            .as_str()
            .and_then(|c| c.parse().ok())
            .unwrap_or(0)
    };
    let stored = prometheus.query_until(accept, |r| {
        r.len() == 2 && r.iter().map(count).sum::<u64>() == n_a + n_b
    });
    assert_eq!(stored.len(), 2, "one series per agent: {stored:?}");
    for s in &stored {
        assert!(
            s.get("histogram").is_some(),
            "a native histogram, not classic buckets: {s}"
        );
    }

    // Counts across both agents add up.
    let sum = prometheus.query(&format!("sum by (role) (histogram_count({accept}))"));
    assert_eq!(sum.len(), 1, "{sum:?}");
    assert_eq!(value(&sum[0]), (n_a + n_b) as f64);

    // Prometheus' p99 of host a's series against stackprobe's own there.
    let q = format!(
        r#"histogram_quantile(0.99, stackprobe_latency_seconds{{metric="accept",role="stackprobe-loop",instance="{addr_a}"}})"#
    );
    let theirs = value(&prometheus.query(&q)[0]);
    own.signal(libc::SIGINT);
    let (status, stdout, stderr) = own.finish();
    assert!(status.success(), "{stderr}");
    let summary = json_lines(&stdout).pop().unwrap();
    let mine = row(&summary, a.pid).unwrap()["p99_ns"].as_f64().unwrap() / 1e9;
    // Within two native buckets (2^(2/64) − 1 ≈ 2.2 %): one of Prometheus'
    // interpolation, one of stackprobe's own bucket.
    let off = (theirs / mine - 1.0).abs();
    assert!(
        off < 0.022,
        "Prometheus p99 {theirs} s, stackprobe's {mine} s"
    );

    agent_b.signal(libc::SIGTERM);
    let (status, stdout, stderr) = agent_b.finish();
    assert!(status.success(), "agent exit {status}: {stderr}");
    assert!(stdout.is_empty(), "an agent prints no reports: {stdout}");
    a.stop();
    b.stop();
}
