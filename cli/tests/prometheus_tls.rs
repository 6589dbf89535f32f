//! Root only: `stackprobe agent --web.config.file` serving its metrics over
//! TLS to one user, watching a loopback server. A real Prometheus (Debian's)
//! scrapes it trusting only the test's CA, with the user's password, and
//! stores what stackprobe counted; its jobs with a wrong password, or over
//! plain HTTP, see the target down. Plain HTTP, no password and a wrong one
//! get no metrics from it directly either. A bad web config stops the start,
//! before any probe loads.

mod support;

use std::{path::Path, process::Command};

use serde_json::Value;
use support::*;

/// `up` of each job, by job name.
fn up_by_job(r: &[Value]) -> Vec<(String, f64)> {
    let mut jobs: Vec<_> = r
        .iter()
        .map(|s| (s["metric"]["job"].as_str().unwrap().to_owned(), value(s)))
        .collect();
    jobs.sort_by(|a, b| a.0.cmp(&b.0));
    jobs
}

const USER: &str = "prometheus";
const PASSWORD: &str = "correct horse";

#[test]
fn prometheus_scrapes_the_agent_over_tls_with_basic_auth_and_nobody_else_does() {
    let _lock = probe_lock();
    require_root();
    let pki = Pki::new("tls-pki");
    let web = pki.path("web.yml");
    std::fs::write(
        &web,
        format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n\
             basic_auth_users:\n  {USER}: {}\n",
            bcrypt_hash(PASSWORD)
        ),
    )
    .unwrap();
    let mut server = Server::start(None);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut agent = Running::start(&[
        "agent",
        "--pid",
        &server.pid.to_string(),
        "--listen",
        &addr,
        "--interval",
        "200ms",
        "--web.config.file",
        web.to_str().unwrap(),
    ]);
    agent.wait_stderr("probes attached");
    assert!(
        agent
            .seen
            .contains(&format!("stackprobe: metrics on https://{addr}/metrics")),
        "{}",
        agent.seen
    );

    // Connections the agent counts, then a scraper that must see all of them.
    let accepts = 25;
    server.send(&format!("accept {accepts} tcp accept4"));
    for _ in 0..accepts {
        tcp_connect_and_read(&server.tcp);
    }
    server.wait_accepted(accepts);

    let ca = pki.path("ca.pem");
    let job = |name: &str, scheme: &str, password: &str| {
        format!(
            "  - job_name: {name}\n    scheme: {scheme}\n    tls_config:\n      ca_file: {}\n    \
             basic_auth:\n      username: {USER}\n      password: '{password}'\n    \
             static_configs:\n      - targets: ['{addr}']\n",
            ca.display()
        )
    };
    let prometheus = Prometheus::start(
        &[
            job("scraper", "https", PASSWORD),
            job("intruder", "https", "wrong horse"),
            job("plain", "http", PASSWORD),
        ]
        .concat(),
    );
    let expected = [
        ("intruder".to_owned(), 0.0),
        ("plain".to_owned(), 0.0),
        ("scraper".to_owned(), 1.0),
    ];
    let up = prometheus.query_until("up", |r| up_by_job(r) == expected);
    assert_eq!(up_by_job(&up), expected, "{up:?}");

    let q = r#"sum(histogram_count(stackprobe_latency_seconds{metric="accept",job="scraper"}))"#;
    let stored = prometheus.query_until(q, |r| r.len() == 1 && value(&r[0]) == accepts as f64);
    assert_eq!(stored.len(), 1, "{q}: {stored:?}");
    assert_eq!(value(&stored[0]), accepts as f64, "{q}");
    let strays = prometheus.query(r#"{__name__=~"stackprobe_.+",job!="scraper"}"#);
    assert!(strays.is_empty(), "metrics reached other jobs: {strays:?}");

    // The endpoint by hand: only the right password over TLS gets metrics.
    let (head, body) = http_get(&addr, "/metrics");
    assert!(
        head.starts_with("HTTP/1.0 400 "),
        "plain HTTP: {head}\n{body}"
    );
    assert!(!body.contains("stackprobe_"), "{body}");
    for (what, headers) in [
        ("no credentials", String::new()),
        ("a wrong password", basic_auth(USER, "wrong horse")),
        ("an unknown user", basic_auth("nobody", PASSWORD)),
    ] {
        let (head, body) = https_get(&addr, "/metrics", &headers, &ca);
        assert!(
            head.starts_with("HTTP/1.1 401 Unauthorized"),
            "{what}: {head}"
        );
        assert!(
            head.contains("\r\nWWW-Authenticate: Basic"),
            "{what}: {head}"
        );
        assert!(!body.contains("stackprobe_"), "{what}: {body}");
    }
    let (head, body) = https_get(&addr, "/metrics", &basic_auth(USER, PASSWORD), &ca);
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(body.contains("stackprobe_latency_seconds"), "{body}");

    agent.signal(libc::SIGTERM);
    let (status, _, stderr) = agent.finish();
    assert!(status.success(), "agent exit {status}: {stderr}");
    server.stop();
}

/// `stackprobe agent` with `web.yml` holding `yaml` (beside a valid
/// certificate and key) fails with `message`, before loading any probe.
fn refused(pki: &Pki, yaml: &str, message: &str) {
    let web = pki.path("web.yml");
    std::fs::write(&web, yaml).unwrap();
    refused_file(&web, message);
}

fn refused_file(web: &Path, message: &str) {
    let out = run(Command::new(STACKPROBE).args([
        "agent",
        "--pid",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--web.config.file",
        web.to_str().unwrap(),
    ]));
    assert_fails(&out, 1, message);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("probes attached"), "{stderr}");
}

#[test]
fn a_bad_web_config_stops_the_start_with_the_fault_named() {
    let _lock = probe_lock();
    let pki = Pki::new("tls-bad");
    let tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
    refused_file(
        &pki.path("absent.yml"),
        &format!(
            "reading the web config file {}",
            pki.path("absent.yml").display()
        ),
    );
    refused(&pki, "tls_server_config: [", "in the web config file");
    refused(
        &pki,
        &format!("{tls}  cert_fil: x\n"),
        "unknown field `cert_fil`",
    );
    refused(
        &pki,
        &format!("{tls}  client_allowed_sans: [a]\n"),
        "`client_allowed_sans` is not supported",
    );
    refused(
        &pki,
        "tls_server_config:\n  cert_file: server.pem\n",
        "key_file is missing",
    );
    refused(
        &pki,
        "tls_server_config:\n  cert_file: missing.pem\n  key_file: server.key\n",
        "reading cert_file",
    );
    refused(
        &pki,
        "tls_server_config:\n  cert_file: ca.pem\n  key_file: server.key\n",
        "ca.pem",
    );
    refused(
        &pki,
        "basic_auth_users:\n  prometheus: secret\n",
        "user `prometheus`: not a bcrypt hash",
    );
    // --web.config.file guards --listen's endpoint: watch needs both.
    let out = run(Command::new(STACKPROBE).args(["watch", "x", "--web.config.file", "w.yml"]));
    assert_fails(&out, 2, "--listen");
}
