//! `cargo xtask lab up | load | status | down`: the stack stackprobe is for,
//! on loopback, from Debian's packages, in one private directory.
//!
//! ```text
//! wrk → nginx frontend :18080 (upstream without keepalive) ┐
//!       nginx frontend :18090 (upstream keepalive)         ┴→ nginx backend :18081
//!       nginx backend → php-fpm (unix socket, pool "lab", 4 workers)
//!       php-fpm → postgres :15432 (TCP) or its unix socket
//! ```
//!
//! Pages: `static.html`; `new.php` (a new TCP connection to postgres per
//! request), `persistent.php` (`pg_pconnect`: one connection per php-fpm
//! worker), `unix.php` (a new connection per request over the unix socket).
//! Everything runs as the users the packages expect (nginx workers and
//! php-fpm pool as www-data, postgres as postgres); `down` stops it all and
//! removes the directory.

use std::{
    fs,
    io::{Read as _, Write as _},
    net::TcpStream,
    os::unix::fs::{MetadataExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::{
    process::{capture, is_root, run_cmd},
    setup::apt_packages,
};

pub const DIR: &str = "/tmp/stackprobe-lab";
pub const FRONTEND: u16 = 18080;
pub const FRONTEND_KEEPALIVE: u16 = 18090;
pub const BACKEND: u16 = 18081;
pub const POSTGRES: u16 = 15432;
const PHP_WORKERS: u32 = 4;

/// What the lab runs, plus bpftrace for the tests' independent count.
pub const PACKAGES: [&str; 6] = [
    "nginx",
    "php-fpm",
    "php-pgsql",
    "postgresql",
    "wrk",
    "bpftrace",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Page {
    Static,
    New,
    Persistent,
    Unix,
}

impl Page {
    fn path(self) -> &'static str {
        match self {
            Page::Static => "/static.html",
            Page::New => "/new.php",
            Page::Persistent => "/persistent.php",
            Page::Unix => "/unix.php",
        }
    }
}

#[derive(clap::Args)]
pub struct LoadArgs {
    /// Which page to request.
    #[arg(long, value_enum, default_value = "new")]
    pub page: Page,
    /// Go through the frontend whose upstream connections are kept alive
    /// (port 18090) instead of the one that opens one per request (18080).
    #[arg(long)]
    pub keepalive: bool,
    /// Seconds of load (at most 600).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=600))]
    pub seconds: u64,
    /// Concurrent client connections.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub connections: u32,
}

fn dir() -> &'static Path {
    Path::new(DIR)
}

fn need_root() -> Result<()> {
    if !is_root() {
        bail!(
            "the lab starts services as their own users: run it as root (sudo -E cargo xtask lab …)"
        );
    }
    Ok(())
}

pub fn up() -> Result<()> {
    need_root()?;
    apt_packages(&PACKAGES)?;
    if running().iter().any(|(_, pid)| pid.is_some()) {
        bail!("the lab is already up (see `cargo xtask lab status`); `cargo xtask lab down` first");
    }
    let started = Instant::now();
    prepare_dir()?;
    let result = start_all();
    if result.is_err() {
        // Never leave half a lab behind.
        let _ = down();
    }
    result?;
    eprintln!(
        "lab: up in {:.1}s: http://127.0.0.1:{FRONTEND}/ (no upstream keepalive), \
         http://127.0.0.1:{FRONTEND_KEEPALIVE}/ (keepalive); pages static.html new.php persistent.php unix.php",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn start_all() -> Result<()> {
    start_postgres()?;
    run_cmd(daemon(php_fpm()?).args(["--fpm-config", &path("php-fpm.conf")]))?;
    for conf in ["nginx-backend.conf", "nginx-frontend.conf"] {
        run_cmd(daemon("nginx").args([
            "-c",
            &path(conf),
            "-p",
            DIR,
            "-e",
            &path("log/nginx-error.log"),
        ]))?;
    }
    // Every page through both frontends, so `up` only succeeds on a stack
    // that serves.
    for port in [FRONTEND, FRONTEND_KEEPALIVE] {
        for page in [Page::Static, Page::New, Page::Persistent, Page::Unix] {
            let body = wait_for_page(port, page.path())?;
            if page != Page::Static && !body.contains("rows=3") {
                bail!(
                    "http://127.0.0.1:{port}{} answered without the query's result: {body}",
                    page.path()
                );
            }
        }
    }
    Ok(())
}

fn path(name: &str) -> String {
    format!("{DIR}/{name}")
}

/// A fresh directory we own: refuses a symlink or someone else's directory
/// at the fixed path, since root writes configs into it.
fn prepare_dir() -> Result<()> {
    if let Ok(meta) = fs::symlink_metadata(dir()) {
        if meta.file_type().is_symlink() || meta.uid() != 0 {
            bail!("{DIR} exists and is not a directory owned by root; remove it first");
        }
        fs::remove_dir_all(dir()).with_context(|| format!("removing the old {DIR}"))?;
    }
    fs::create_dir(dir()).with_context(|| format!("creating {DIR}"))?;
    for sub in ["www", "run", "log", "pgsock", "pgdata", "nginx-temp"] {
        fs::create_dir(dir().join(sub))?;
    }
    for d in ["", "www", "run", "log", "nginx-temp"] {
        fs::set_permissions(dir().join(d), fs::Permissions::from_mode(0o755))?;
    }
    fs::set_permissions(dir().join("pgdata"), fs::Permissions::from_mode(0o700))?;
    fs::write(dir().join("log/postgres.log"), "")?;
    run_cmd(Command::new("chown").args([
        "postgres:postgres",
        &path("pgdata"),
        &path("pgsock"),
        &path("log/postgres.log"),
    ]))?;
    run_cmd(Command::new("chown").args(["-R", "www-data:www-data", &path("nginx-temp")]))?;
    write_pages()?;
    fs::write(dir().join("php-fpm.conf"), php_fpm_conf())?;
    fs::write(dir().join("nginx-backend.conf"), nginx_backend_conf())?;
    fs::write(dir().join("nginx-frontend.conf"), nginx_frontend_conf())?;
    Ok(())
}

fn write_pages() -> Result<()> {
    let www = dir().join("www");
    fs::write(
        www.join("static.html"),
        "<html><body>static page</body></html>\n",
    )?;
    let tcp = format!("host=127.0.0.1 port={POSTGRES} dbname=lab user=postgres");
    let unix = format!("host={DIR}/pgsock port={POSTGRES} dbname=lab user=postgres");
    for (name, connect, conninfo, close) in [
        ("new.php", "pg_connect", &tcp, true),
        ("persistent.php", "pg_pconnect", &tcp, false),
        ("unix.php", "pg_connect", &unix, true),
    ] {
        let close = if close { "pg_close($db);\n" } else { "" };
        fs::write(
            www.join(name),
            format!(
                "<?php\n\
                 $db = {connect}('{conninfo}');\n\
                 if (!$db) {{ http_response_code(500); exit('no database'); }}\n\
                 $r = pg_query($db, 'SELECT count(*) FROM items');\n\
                 echo 'rows=', pg_fetch_result($r, 0, 0), \"\\n\";\n\
                 {close}"
            ),
        )?;
    }
    Ok(())
}

fn php_fpm_conf() -> String {
    format!(
        "[global]\n\
         pid = {DIR}/run/php-fpm.pid\n\
         error_log = {DIR}/log/php-fpm.log\n\
         daemonize = yes\n\
         [lab]\n\
         user = www-data\n\
         group = www-data\n\
         listen = {DIR}/run/php-fpm.sock\n\
         listen.owner = www-data\n\
         listen.group = www-data\n\
         listen.mode = 0660\n\
         pm = static\n\
         pm.max_children = {PHP_WORKERS}\n"
    )
}

/// Shared by both nginx instances: workers as www-data, temp files and
/// logs inside the lab.
fn nginx_common(name: &str) -> String {
    format!(
        "user www-data;\n\
         worker_processes 2;\n\
         pid {DIR}/run/nginx-{name}.pid;\n\
         error_log {DIR}/log/nginx-{name}-error.log;\n\
         events {{ worker_connections 1024; }}\n"
    )
}

fn nginx_http_common() -> String {
    format!(
        "access_log off;\n\
         client_body_temp_path {DIR}/nginx-temp/body;\n\
         proxy_temp_path {DIR}/nginx-temp/proxy;\n\
         fastcgi_temp_path {DIR}/nginx-temp/fastcgi;\n\
         uwsgi_temp_path {DIR}/nginx-temp/uwsgi;\n\
         scgi_temp_path {DIR}/nginx-temp/scgi;\n"
    )
}

fn nginx_backend_conf() -> String {
    format!(
        "{}http {{\n{}\
         keepalive_requests 1000000;\n\
         server {{\n\
           listen 127.0.0.1:{BACKEND};\n\
           root {DIR}/www;\n\
           location ~ \\.php$ {{\n\
             include /etc/nginx/fastcgi_params;\n\
             fastcgi_param SCRIPT_FILENAME $document_root$fastcgi_script_name;\n\
             fastcgi_pass unix:{DIR}/run/php-fpm.sock;\n\
           }}\n\
         }}\n\
         }}\n",
        nginx_common("backend"),
        nginx_http_common()
    )
}

fn nginx_frontend_conf() -> String {
    format!(
        "{}http {{\n{}\
         keepalive_requests 1000000;\n\
         upstream backend {{ server 127.0.0.1:{BACKEND}; }}\n\
         upstream backend_keepalive {{ server 127.0.0.1:{BACKEND}; keepalive 32; }}\n\
         server {{\n\
           listen 127.0.0.1:{FRONTEND};\n\
           location / {{ proxy_pass http://backend; }}\n\
         }}\n\
         server {{\n\
           listen 127.0.0.1:{FRONTEND_KEEPALIVE};\n\
           location / {{\n\
             proxy_pass http://backend_keepalive;\n\
             proxy_http_version 1.1;\n\
             proxy_set_header Connection \"\";\n\
           }}\n\
         }}\n\
         }}\n",
        nginx_common("frontend"),
        nginx_http_common()
    )
}

/// The newest installed postgres's binaries (Debian keeps them per version).
fn pg_bin(tool: &str) -> Result<PathBuf> {
    let mut versions: Vec<u32> = fs::read_dir("/usr/lib/postgresql")
        .context("postgresql is not installed (/usr/lib/postgresql)")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    versions.sort_unstable();
    let v = versions
        .last()
        .ok_or_else(|| anyhow!("no postgres version in /usr/lib/postgresql"))?;
    Ok(PathBuf::from(format!("/usr/lib/postgresql/{v}/bin/{tool}")))
}

fn php_fpm() -> Result<PathBuf> {
    fs::read_dir("/usr/sbin")?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("php-fpm"))
        })
        .max()
        .ok_or_else(|| anyhow!("php-fpm is not installed (/usr/sbin/php-fpm*)"))
}

/// A command whose daemons keep none of our open files but stdio: a lock
/// held by whoever ran `lab up` (`flock … cargo xtask lab up`) would
/// otherwise stay held as long as the lab runs.
fn daemon(program: impl AsRef<std::ffi::OsStr>) -> Command {
    use std::os::unix::process::CommandExt as _;
    let mut cmd = Command::new(program);
    // SAFETY: close_range only closes descriptors; nothing else runs
    // between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

fn as_postgres(program: &Path) -> Command {
    let mut cmd = daemon("runuser");
    cmd.args(["-u", "postgres", "--"])
        .arg(program)
        .current_dir("/");
    cmd
}

fn start_postgres() -> Result<()> {
    run_cmd(
        as_postgres(&pg_bin("initdb")?)
            .args([
                "-D",
                &path("pgdata"),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-instructions",
            ])
            .stdout(std::process::Stdio::null()),
    )?;
    // autovacuum off: its workers are forks too, and would blur "forks per
    // connection" in a lab that exists to show exactly that.
    let mut conf = fs::OpenOptions::new()
        .append(true)
        .open(dir().join("pgdata/postgresql.conf"))?;
    write!(
        conf,
        "\n# stackprobe lab\nport = {POSTGRES}\nlisten_addresses = '127.0.0.1'\n\
         unix_socket_directories = '{DIR}/pgsock'\nmax_connections = 200\nautovacuum = off\n\
         fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
    )?;
    run_cmd(as_postgres(&pg_bin("pg_ctl")?).args([
        "-D",
        &path("pgdata"),
        "-l",
        &path("log/postgres.log"),
        "-w",
        "-t",
        "60",
        "start",
    ]))?;
    let psql = |sql: &str, db: &str| {
        run_cmd(as_postgres(&pg_bin("psql")?).args([
            "-q",
            "-h",
            &path("pgsock"),
            "-p",
            &POSTGRES.to_string(),
            "-d",
            db,
            "-c",
            sql,
        ]))
    };
    psql("CREATE DATABASE lab", "postgres")?;
    psql(
        "CREATE TABLE items (id int PRIMARY KEY, name text); \
         INSERT INTO items VALUES (1, 'one'), (2, 'two'), (3, 'three')",
        "lab",
    )
}

/// Fetches a page until it answers 200 (services take a moment to listen).
fn wait_for_page(port: u16, page: &str) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match http_get(port, page) {
            Ok(body) => return Ok(body),
            Err(e) if Instant::now() > deadline => {
                return Err(e.context(format!("http://127.0.0.1:{port}{page} never answered")));
            }
            Err(_) => thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// The body of `page` at 127.0.0.1:`port`, if it answers 200.
pub fn http_get(port: u16, page: &str) -> Result<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {page} HTTP/1.0\r\nHost: lab\r\n\r\n")?;
    let mut reply = String::new();
    s.read_to_string(&mut reply)?;
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{}", head.lines().next().unwrap_or("no reply"));
    }
    Ok(body.to_string())
}

/// Each service's pid file and the master it names, if alive.
fn running() -> Vec<(&'static str, Option<u32>)> {
    [
        ("nginx frontend", "run/nginx-frontend.pid"),
        ("nginx backend", "run/nginx-backend.pid"),
        ("php-fpm", "run/php-fpm.pid"),
        ("postgres", "pgdata/postmaster.pid"),
    ]
    .into_iter()
    .map(|(name, file)| {
        let pid = fs::read_to_string(dir().join(file))
            .ok()
            .and_then(|s| s.lines().next()?.trim().parse::<u32>().ok())
            .filter(|pid| Path::new(&format!("/proc/{pid}")).exists());
        (name, pid)
    })
    .collect()
}

/// Whether every service of the lab is running.
pub fn is_up() -> bool {
    running().iter().all(|(_, pid)| pid.is_some())
}

pub fn status() -> Result<()> {
    for (name, pid) in running() {
        match pid {
            Some(pid) => println!("{name:16} running, pid {pid}"),
            None => println!("{name:16} stopped"),
        }
    }
    Ok(())
}

/// Stops every service (fast shutdown, then SIGKILL after 10 s), waits for
/// their processes to be gone and removes the directory.
pub fn down() -> Result<()> {
    need_root()?;
    if !dir().exists() {
        eprintln!("lab: not up");
        return Ok(());
    }
    for (name, pid) in running() {
        let Some(pid) = pid else { continue };
        if name == "postgres" {
            let stopped = run_cmd(as_postgres(&pg_bin("pg_ctl")?).args([
                "-D",
                &path("pgdata"),
                "-m",
                "fast",
                "-w",
                "stop",
            ]));
            if stopped.is_ok() {
                continue;
            }
        }
        stop_process_tree(pid)?;
    }
    fs::remove_dir_all(dir()).with_context(|| format!("removing {DIR}"))?;
    eprintln!("lab: down");
    Ok(())
}

/// SIGTERM to a master (nginx, php-fpm and postgres all stop their workers on
/// it), then waits for it and its children; SIGKILL after 10 s.
fn stop_process_tree(pid: u32) -> Result<()> {
    let children = children_of(pid);
    let pid_t = pid as libc::pid_t;
    // SAFETY: kill has no memory preconditions.
    unsafe { libc::kill(pid_t, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(10);
    let alive = |p: &u32| Path::new(&format!("/proc/{p}")).exists();
    while (alive(&pid) || children.iter().any(alive)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
    }
    for p in std::iter::once(&pid).chain(&children).filter(|p| alive(p)) {
        eprintln!("lab: process {p} ignored SIGTERM for 10 s; killing it");
        // SAFETY: as above.
        unsafe { libc::kill(*p as libc::pid_t, libc::SIGKILL) };
    }
    Ok(())
}

fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                // Fields after the parenthesised comm: state, ppid, …
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// Load summary, parsed from wrk's output.
#[derive(Debug, PartialEq)]
pub struct Load {
    pub requests: u64,
    pub per_s: f64,
    pub non_2xx: u64,
    pub socket_errors: u64,
}

impl Load {
    /// Fails if any response was an error or any socket failed; `what`
    /// names the load in the message.
    pub fn ensure_clean(&self, what: &str) -> Result<()> {
        if self.non_2xx > 0 || self.socket_errors > 0 {
            bail!(
                "{what}: {} error responses, {} socket errors",
                self.non_2xx,
                self.socket_errors
            );
        }
        Ok(())
    }
}

pub fn load(args: &LoadArgs) -> Result<()> {
    let (url, out, load) = wrk(args)?;
    print!("{out}");
    // One machine-readable line for scripts and the lab tests.
    println!(
        "lab load: url={url} requests={} per_s={:.1} non_2xx={} socket_errors={}",
        load.requests, load.per_s, load.non_2xx, load.socket_errors
    );
    load.ensure_clean(&url)
}

/// Runs wrk against the lab: (url, wrk's output, its totals).
pub fn wrk(args: &LoadArgs) -> Result<(String, String, Load)> {
    if running().iter().any(|(_, pid)| pid.is_none()) {
        bail!("the lab is not (fully) up: run `cargo xtask lab up` first");
    }
    let port = if args.keepalive {
        FRONTEND_KEEPALIVE
    } else {
        FRONTEND
    };
    let url = format!("http://127.0.0.1:{port}{}", args.page.path());
    let out = capture(Command::new("wrk").args([
        "-t",
        "2",
        "-c",
        &args.connections.to_string(),
        "-d",
        &format!("{}s", args.seconds),
        "--latency",
        &url,
    ]))?;
    let load = parse_wrk(&out)?;
    Ok((url, out, load))
}

/// The comm php-fpm's processes have (Debian's binary carries its version).
pub fn php_fpm_comm() -> Result<String> {
    let path = php_fpm()?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("php-fpm");
    Ok(name.chars().take(15).collect())
}

fn parse_wrk(out: &str) -> Result<Load> {
    let number_before = |line: &str, word: &str| -> Option<u64> {
        let words: Vec<&str> = line.split_whitespace().collect();
        let i = words.iter().position(|w| w.starts_with(word))?;
        words.get(i.checked_sub(1)?)?.parse().ok()
    };
    let mut load = Load {
        requests: 0,
        per_s: 0.0,
        non_2xx: 0,
        socket_errors: 0,
    };
    let mut seen = false;
    for line in out.lines().map(str::trim) {
        if line.contains("requests in") {
            load.requests =
                number_before(line, "requests").ok_or_else(|| anyhow!("wrk: {line}"))?;
            seen = true;
        } else if let Some(rate) = line.strip_prefix("Requests/sec:") {
            load.per_s = rate
                .trim()
                .parse()
                .with_context(|| format!("wrk: {line}"))?;
        } else if let Some(n) = line.strip_prefix("Non-2xx or 3xx responses:") {
            load.non_2xx = n.trim().parse().with_context(|| format!("wrk: {line}"))?;
        } else if let Some(errors) = line.strip_prefix("Socket errors:") {
            // "connect 0, read 0, write 0, timeout 0"
            load.socket_errors = errors
                .split(',')
                .filter_map(|part| part.split_whitespace().last()?.parse::<u64>().ok())
                .sum();
        }
    }
    if !seen {
        bail!("wrk printed no request count:\n{out}");
    }
    Ok(load)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrk_output_is_parsed() {
        let out = "Running 5s test @ http://127.0.0.1:18080/new.php\n\
  2 threads and 8 connections\n\
  Thread Stats   Avg      Stdev     Max   +/- Stdev\n\
    Latency     3.10ms    1.02ms  20.47ms   84.96%\n\
  12345 requests in 5.00s, 2.03MB read\n\
  Socket errors: connect 0, read 2, write 0, timeout 1\n\
  Non-2xx or 3xx responses: 7\n\
Requests/sec:   2468.97\n\
Transfer/sec:    415.83KB\n";
        assert_eq!(
            parse_wrk(out).unwrap(),
            Load {
                requests: 12345,
                per_s: 2468.97,
                non_2xx: 7,
                socket_errors: 3
            }
        );
        assert!(parse_wrk("wrk: connection refused").is_err());
    }

    #[test]
    fn configs_point_inside_the_lab() {
        for conf in [php_fpm_conf(), nginx_backend_conf(), nginx_frontend_conf()] {
            for line in conf.lines().filter(|l| l.contains('/')) {
                let paths_ok = line
                    .split_whitespace()
                    .filter(|w| w.len() > 1 && (w.starts_with('/') || w.starts_with("unix:/")))
                    .all(|w| w.contains(DIR) || w.starts_with("/etc/nginx/"));
                assert!(paths_ok, "{line}");
            }
        }
        assert!(nginx_frontend_conf().contains("keepalive 32"));
    }
}
