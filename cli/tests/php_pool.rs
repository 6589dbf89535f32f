//! Root only, with Debian's php-fpm and nginx (`cargo xtask test` installs
//! them): a real nginx → php-fpm stack of the test's own, serving a page
//! that sleeps, under more concurrent requests than the pool has workers.
//! With the pool cut to 2 workers, stackprobe's summary shows php-fpm's
//! queue wait, 2 of 2 busy against `pm.max_children`, and the insight that
//! names it; with a pool larger than the load, no such insight.

mod support;

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use support::*;

/// Each request sleeps this long in PHP.
const SLEEP_MS: u64 = 200;
const REQUESTS: usize = 12;

/// nginx and php-fpm, in the foreground, stopped when dropped.
struct Stack {
    dir: TempDir,
    port: u16,
    php: Child,
    nginx: Child,
}

fn php_fpm() -> PathBuf {
    std::fs::read_dir("/usr/sbin")
        .unwrap()
        .filter_map(|e| Some(e.ok()?.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("php-fpm"))
        })
        .expect("php-fpm is not installed (cargo xtask test installs it)")
}

impl Stack {
    fn start(workers: u32) -> Self {
        let dir = TempDir::new(&format!("php-pool-{workers}"));
        let d = dir.0.to_str().unwrap().to_string();
        let port = free_port();
        std::fs::create_dir_all(dir.0.join("www")).unwrap();
        std::fs::create_dir_all(dir.0.join("tmp")).unwrap();
        // www-data runs the workers: they must reach the page.
        for p in [&dir.0, &dir.0.join("www")] {
            std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
        std::fs::write(
            dir.0.join("www/sleep.php"),
            format!("<?php usleep({}); echo \"ok\";\n", SLEEP_MS * 1000),
        )
        .unwrap();
        std::fs::write(
            dir.0.join("php-fpm.conf"),
            format!(
                "[global]\npid = {d}/php-fpm.pid\nerror_log = {d}/php-fpm.log\ndaemonize = no\n\
                 [pool]\nuser = www-data\ngroup = www-data\nlisten = {d}/php.sock\n\
                 listen.owner = www-data\nlisten.group = www-data\n\
                 pm = static\npm.max_children = {workers}\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.0.join("nginx.conf"),
            format!(
                "daemon off;\nworker_processes 1;\nuser www-data;\npid {d}/nginx.pid;\n\
                 error_log {d}/nginx-error.log;\nevents {{ worker_connections 256; }}\n\
                 http {{ access_log off;\n client_body_temp_path {d}/tmp; fastcgi_temp_path {d}/tmp;\n\
                 proxy_temp_path {d}/tmp; uwsgi_temp_path {d}/tmp; scgi_temp_path {d}/tmp;\n\
                 server {{ listen 127.0.0.1:{port}; root {d}/www;\n\
                 location ~ \\.php$ {{ include /etc/nginx/fastcgi_params;\n\
                 fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n\
                 fastcgi_pass unix:{d}/php.sock; }} }} }}\n"
            ),
        )
        .unwrap();
        let quiet = |mut c: Command| {
            c.stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        };
        let mut php = Command::new(php_fpm());
        php.args(["-F", "-y", &format!("{d}/php-fpm.conf")]);
        let php = quiet(php);
        let mut nginx = Command::new("nginx");
        nginx.args(["-c", &format!("{d}/nginx.conf"), "-p", &d]);
        let nginx = quiet(nginx);
        let stack = Self {
            dir,
            port,
            php,
            nginx,
        };
        let deadline = Instant::now() + Duration::from_secs(15);
        while !get(port).ends_with("ok") {
            assert!(
                Instant::now() < deadline,
                "the stack never served: {}",
                std::fs::read_to_string(stack.dir.0.join("nginx-error.log")).unwrap_or_default()
            );
            thread::sleep(Duration::from_millis(100));
        }
        // Until each worker is back in accept().
        thread::sleep(Duration::from_millis(300));
        stack
    }

    fn master(&self) -> u32 {
        self.php.id()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for c in [&mut self.nginx, &mut self.php] {
            // SIGQUIT: both stop gracefully, their workers with them.
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGQUIT) };
            let _ = c.wait();
        }
    }
}

/// One GET of the sleeping page; its body, or the error ("" if none).
fn get(port: u16) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(20)));
    let _ = write!(
        s,
        "GET /sleep.php HTTP/1.0\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    );
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.trim_end().to_string()
}

/// Watches the pool while [`REQUESTS`] requests come at once; the summary.
fn summary_under_load(stack: &Stack) -> Value {
    let master = stack.master().to_string();
    let mut sp = Running::start(&[
        "watch",
        "--pid",
        &master,
        "--json",
        "--interval",
        "1s",
        "--unix-service-time",
    ]);
    sp.wait_stderr("probes attached");
    sp.drain_stdout();
    let port = stack.port;
    let bodies: Vec<String> = (0..REQUESTS)
        .map(|_| thread::spawn(move || get(port)))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|t| t.join().unwrap())
        .collect();
    assert!(bodies.iter().all(|b| b.ends_with("ok")), "{bodies:?}");
    // nginx answers once php-fpm's response ends, which may be before the
    // worker's close of the connection, the end of its service.
    thread::sleep(Duration::from_millis(500));
    sp.signal(libc::SIGINT);
    let (status, stdout, stderr) = sp.finish();
    assert!(status.success(), "{stderr}");
    json_lines(&stdout).pop().expect("a summary")
}

/// The role whose processes accepted the requests: the pool's workers.
fn workers(summary: &Value) -> &Value {
    let accepted = |r: &Value| {
        r["accept"]["total"].as_u64().unwrap_or(0)
            + r["accept_untimed"]["total"].as_u64().unwrap_or(0)
    };
    summary["roles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| accepted(r) > 0)
        .unwrap_or_else(|| panic!("no role accepted: {summary}"))
}

fn insights(summary: &Value) -> Vec<&str> {
    summary["insights"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap())
        .collect()
}

#[test]
fn a_pool_cut_to_two_workers_is_named_full_and_a_large_one_is_not() {
    let _lock = probe_lock();
    require_root();
    let stack = Stack::start(2);
    let summary = summary_under_load(&stack);
    let role = workers(&summary);
    let accepted = role["accept"]["total"].as_u64().unwrap()
        + role["accept_untimed"]["total"].as_u64().unwrap();
    assert_eq!(accepted, REQUESTS as u64, "{role}");
    // Two workers were already waiting in accept() when stackprobe
    // attached: their first accepts have no latency, but their connections
    // still waited in the queue and were served.
    assert_eq!(role["accept_untimed"]["total"], 2, "{role}");
    assert_eq!(role["accept_queue"]["total"], REQUESTS, "{role}");
    assert_eq!(role["service"]["total"], REQUESTS, "{role}");
    // 12 requests of 200 ms on 2 workers: the last ones waited ~1 s.
    let max_wait = role["accept_queue"]["max_ns"].as_u64().unwrap();
    assert!(max_wait >= 800_000_000, "{role}");
    let service_min = role["service"]["min_ns"].as_u64().unwrap();
    assert!(service_min >= SLEEP_MS * 1_000_000, "{role}");
    let busy = &role["busy"];
    assert_eq!(busy["max"], 2, "{role}");
    assert_eq!(busy["processes"], 2, "{role}");
    assert_eq!(busy["limit"]["setting"], "pm.max_children", "{role}");
    assert_eq!(busy["limit"]["value"], 2, "{role}");
    let full: Vec<&str> = insights(&summary)
        .into_iter()
        .filter(|i| i.contains("all workers busy"))
        .collect();
    assert_eq!(full.len(), 1, "{summary}");
    assert!(
        full[0].contains("pm.max_children is 2") && full[0].contains("raise pm.max_children"),
        "{}",
        full[0]
    );
    drop(stack);

    let stack = Stack::start(16);
    let summary = summary_under_load(&stack);
    let role = workers(&summary);
    // Every request found a worker waiting: each was served, none waited
    // behind another.
    assert_eq!(role["service"]["total"], REQUESTS, "{role}");
    assert_eq!(role["busy"]["max"], REQUESTS, "{role}");
    assert_eq!(role["busy"]["processes"], 16, "{role}");
    assert_eq!(role["busy"]["limit"]["value"], 16, "{role}");
    assert!(
        insights(&summary)
            .iter()
            .all(|i| !i.contains("all workers busy")),
        "{summary}"
    );
}
