//! A real Prometheus (Debian's, native histograms on) on loopback, scraping
//! each second as the test's jobs say, queried over its HTTP API.

use std::{
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{TempDir, free_port, http_get};

/// Percent-encodes a PromQL query for a URL.
pub fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Killed on drop.
pub struct Prometheus {
    child: Child,
    pub addr: String,
    _dir: TempDir,
}

impl Prometheus {
    /// Scraping as `jobs` (YAML list items under scrape_configs) say.
    pub fn start(jobs: &str) -> Self {
        let dir = TempDir::new("prometheus");
        let config = format!("global:\n  scrape_interval: 1s\nscrape_configs:\n{jobs}");
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
    pub fn query(&self, q: &str) -> Vec<Value> {
        let (head, body) = http_get(&self.addr, &format!("/api/v1/query?query={}", encode(q)));
        assert!(head.contains(" 200 "), "{q}: {head}\n{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["status"], "success", "{q}: {v}");
        v["data"]["result"].as_array().unwrap().clone()
    }

    /// Queries until `done` holds on the result, 30 s at most (Prometheus
    /// starts, then scrapes each second); the last result.
    pub fn query_until(&self, q: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(&self.addr).is_ok() {
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

/// A sample's value in an instant query's result.
pub fn value(r: &Value) -> f64 {
    r["value"][1].as_str().unwrap().parse().unwrap()
}
