//! Root only: two "hosts" (an agent, and a `watch --listen` that also
//! prints its own numbers), each watching a loopback server, scraped by a
//! real Prometheus (Debian's, with native histograms on) on loopback; what
//! Prometheus stores and answers is checked against what stackprobe itself
//! measured, and every query of the Grafana dashboard (dist/grafana) is run
//! against it.

mod support;

use std::{thread, time::Duration};

use serde_json::Value;
use support::*;

/// The body of a successful GET.
fn get_ok(addr: &str, path: &str) -> String {
    let (head, body) = http_get(addr, path);
    assert!(head.contains(" 200 "), "{head}\n{body}");
    body
}

/// `stackprobe agent --pid PID --probe-cost --run-queue` serving metrics on
/// a loopback port; its address.
fn agent(pid: u32) -> (Running, String) {
    let mut sp = Running::start(&[
        "agent",
        "--pid",
        &pid.to_string(),
        "--listen",
        "127.0.0.1:0",
        "--interval",
        "200ms",
        "--probe-cost",
        "--run-queue",
    ]);
    sp.wait_stderr("probes attached");
    let addr = sp.metrics_addr();
    (sp, addr)
}

/// The Grafana dashboard's queries, with its variables set as Grafana
/// would: every host, and a rate window reaching back to before the load.
fn dashboard_queries() -> Vec<(String, String)> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../dist/grafana/stackprobe.json"
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$instance", ".+")
                .replace("$__rate_interval", "1m");
            queries.push((panel["title"].as_str().unwrap().to_string(), expr));
        }
    }
    queries
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
        "--interval",
        "1s",
        "--listen",
        "127.0.0.1:0",
    ]);
    own.drain_stdout();
    own.wait_stderr("probes attached");
    let addr_a = own.metrics_addr();
    let (agent_b, addr_b) = agent(b.pid);
    // Scraping from before the load, so that the dashboard's rates see
    // it grow.
    let prometheus = Prometheus::start(&format!(
        "  - job_name: stackprobe\n    static_configs:\n      - targets: ['{addr_a}', '{addr_b}']\n"
    ));
    prometheus.query_until("up", |r| r.len() == 2 && r.iter().all(|s| value(s) == 1.0));

    // Over several scrapes, on each host: a server waiting ~20 ms in
    // accept for each connection, then forking a child per connection
    // (which makes it a master, as postgres is); host b's then accepts
    // connections already queued.
    let (slow, forks, queued) = (60, 20, 45);
    for s in [&mut a, &mut b] {
        s.send(&format!("accept {slow} tcp accept4"));
        for _ in 0..slow {
            thread::sleep(Duration::from_millis(20));
            tcp_connect_and_read(&s.tcp);
        }
        s.wait_accepted(slow);
        for _ in 0..4 {
            s.send(&format!("serve-fork {} tcp 0", forks / 4));
            for _ in 0..forks / 4 {
                tcp_connect_and_read(&s.tcp);
            }
            assert_eq!(s.line(), format!("served {}", forks / 4));
            thread::sleep(Duration::from_millis(400));
        }
    }
    b.accept_queued(queued, false, "accept4");
    let (n_a, n_b) = (slow + forks, slow + forks + queued);

    let accept = r#"stackprobe_latency_seconds{metric="accept",role="stackprobe-loop master"}"#;
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
    assert_eq!(
        stored.len(),
        2,
        "one series per agent: {stored:?}; all: {:?}",
        prometheus.query("stackprobe_latency_seconds")
    );
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
    let forked = prometheus.query(
        r#"sum(histogram_count(stackprobe_latency_seconds{metric="fork",role="stackprobe-loop master"}))"#,
    );
    assert_eq!(value(&forked[0]), 2.0 * forks as f64, "{forked:?}");

    // Every query of the dashboard answers, with numbers; but for series
    // this lone loopback server cannot have (no chain of watched roles
    // behind it, no configuration with a connection limit, no preemption
    // of a server that mostly sleeps in accept): those only parse.
    let not_here = [
        "stackprobe_hop_own_seconds",
        "stackprobe_busy_connections_limit",
        r#"metric="preempted""#,
    ];
    for (panel, q) in dashboard_queries() {
        let r = prometheus.query(&q);
        if not_here.iter().any(|family| q.contains(family)) {
            continue;
        }
        assert!(
            r.iter().any(|s| value(s).is_finite()),
            "panel {panel:?}: {q} returned no number: {r:?}"
        );
    }
    // And its host variable lists both.
    let hosts = get_ok(
        &prometheus.addr,
        &format!(
            "/api/v1/label/instance/values?match[]={}",
            encode("stackprobe_processes")
        ),
    );
    assert!(
        hosts.contains(&addr_a) && hosts.contains(&addr_b),
        "{hosts}"
    );

    // Prometheus' p99 of host a's series against stackprobe's own there.
    let q = format!(
        r#"histogram_quantile(0.99, stackprobe_latency_seconds{{metric="accept",role="stackprobe-loop master",instance="{addr_a}"}})"#
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
