//! How many connections a watched server's pool can serve at once, by its
//! configuration: php-fpm's `pm.max_children`, postgres's `max_connections`,
//! nginx's `worker_connections` × `worker_processes`. A queue that builds up
//! in front of a full pool looks like latency; knowing the ceiling tells the
//! two apart.
//!
//! What the files say now: a server edited without a reload runs with what
//! it read at start. Files are read through `/proc/PID/root` so a process in
//! a container reads its own, with its absolute symlinks resolved inside
//! that root (a plain open would follow them into ours).

use std::{
    ffi::OsString,
    fs,
    io::Read as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Component, Path, PathBuf},
};

use crate::procfs;

/// A pool's connection ceiling and where it was read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limit {
    /// The configuration setting the value comes from.
    pub setting: &'static str,
    pub value: u32,
    /// The file that set it, as the process sees it (inside its container);
    /// `/proc/PID/cmdline` for a value given on the command line; the main
    /// configuration file when the value is the server's default.
    pub source: PathBuf,
}

/// The connection ceiling of `pid`'s server, by its configuration files:
///
/// - php-fpm: a worker's pool's `pm.max_children`; for the master, the sum
///   over its pools (what all its workers can serve together), with the main
///   configuration file as the source.
/// - postgres (postmaster or any backend): `max_connections`, 100 (the
///   server's default) when nothing sets it. Superuser-reserved slots are
///   included.
/// - nginx (master or worker): `worker_connections` (default 512) ×
///   `worker_processes` (default 1; `auto` is the CPUs the master may run
///   on). An upper bound on open connections, upstream ones counted too.
///
/// None when the process is none of these, or its configuration cannot be
/// read (the process gone, no permission to its root, a garbled main file).
pub fn limit_of(pid: u32) -> Option<Limit> {
    let comm = procfs::comm(pid)?;
    if comm.starts_with("php-fpm") {
        php_fpm_limit_of(pid)
    } else if comm == "postgres" || comm == "postmaster" {
        postgres_limit_of(pid)
    } else if comm == "nginx" {
        nginx_limit_of(pid)
    } else {
        None
    }
}

/// Include directives nest at most this deep; a file that includes itself
/// stops here.
const MAX_DEPTH: usize = 8;
/// Configuration files are small; anything larger is not one.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// A glob matching more files than this is not a configuration directory.
const MAX_GLOB_MATCHES: usize = 256;
/// How many parents to climb from a worker to its master.
const MAX_PARENTS: usize = 3;

// ---------------------------------------------------------------- /proc

/// The process's arguments (NUL-separated in /proc/PID/cmdline). A server
/// that retitles itself (`php-fpm: pool www`) leaves one argument, padded.
fn args(pid: u32) -> Option<Vec<String>> {
    let raw = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut args: Vec<String> = raw
        .split(|&b| b == 0)
        .map(|a| String::from_utf8_lossy(a).trim_end().to_string())
        .collect();
    while args.last().is_some_and(String::is_empty) {
        args.pop();
    }
    (!args.is_empty()).then_some(args)
}

/// The parent's pid, from /proc/PID/stat (after the parenthesised comm,
/// which may itself hold ") ").
fn ppid(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// The nearest of `pid` and its ancestors that `is_master` accepts, among
/// processes whose comm `is_server` accepts.
fn master_of(
    pid: u32,
    is_server: impl Fn(&str) -> bool,
    is_master: impl Fn(&[String]) -> bool,
) -> Option<(u32, Vec<String>)> {
    let mut pid = pid;
    for _ in 0..=MAX_PARENTS {
        if !is_server(&procfs::comm(pid)?) {
            return None;
        }
        let args = args(pid)?;
        if is_master(&args) {
            return Some((pid, args));
        }
        pid = ppid(pid)?;
    }
    None
}

fn cmdline_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/cmdline"))
}

/// An environment variable the process started with.
fn environ_var(pid: u32, name: &str) -> Option<String> {
    let raw = fs::read(format!("/proc/{pid}/environ")).ok()?;
    raw.split(|&b| b == 0).find_map(|entry| {
        let entry = std::str::from_utf8(entry).ok()?;
        let (key, value) = entry.split_once('=')?;
        (key == name).then(|| value.to_string())
    })
}

/// How many CPUs the process may run on (`Cpus_allowed_list`).
fn cpus_allowed(pid: u32) -> Option<u32> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_cpu_list(
        status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?,
    )
}

/// `0-3,8,10-11` → 7.
fn parse_cpu_list(list: &str) -> Option<u32> {
    let mut count = 0u32;
    for part in list.trim().split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (lo, hi): (u32, u32) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
        count = count.checked_add(hi.checked_sub(lo)? + 1)?;
    }
    (count > 0).then_some(count)
}

// ---------------------------------------------------------------- files

/// A process's filesystem as it sees it: paths here are the process's own,
/// read beneath `root`.
struct View {
    /// Its root directory as reachable from here (`/proc/PID/root`).
    root: PathBuf,
    /// Its working directory as it sees it, when that could be told.
    cwd: Option<PathBuf>,
}

impl View {
    fn of(pid: u32) -> View {
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        // The cwd link reads as a path from our root, or from the process's
        // when ours is out of its reach (another mount namespace); the root
        // link reads "/" then.
        let cwd = match (
            fs::read_link(&root),
            fs::read_link(format!("/proc/{pid}/cwd")),
        ) {
            (Ok(r), Ok(c)) => c
                .strip_prefix(&r)
                .ok()
                .map(|rest| Path::new("/").join(rest)),
            _ => None,
        };
        View { root, cwd }
    }

    /// `path` made absolute against the working directory.
    fn absolute(&self, path: &str) -> Option<PathBuf> {
        let path = Path::new(path);
        if path.is_absolute() {
            Some(path.to_path_buf())
        } else {
            Some(self.cwd.as_ref()?.join(path))
        }
    }

    /// Where the process's absolute `path` is from here: each symlink on the
    /// way resolved as the process would, `..` never climbing above its root.
    fn host(&self, path: &Path) -> Option<PathBuf> {
        if !path.is_absolute() {
            return None;
        }
        let mut resolved: Vec<OsString> = Vec::new();
        let mut pending: Vec<OsString> = components(path);
        pending.reverse();
        let mut links = 0;
        while let Some(name) = pending.pop() {
            if name == ".." {
                resolved.pop();
                continue;
            }
            resolved.push(name);
            let here = self.beneath(&resolved);
            if let Ok(target) = fs::read_link(&here) {
                // The kernel's own limit on links followed in one lookup.
                links += 1;
                if links > 40 {
                    return None;
                }
                resolved.pop();
                if target.is_absolute() {
                    resolved.clear();
                }
                let mut more = components(&target);
                more.reverse();
                pending.extend(more);
            }
        }
        Some(self.beneath(&resolved))
    }

    fn beneath(&self, names: &[OsString]) -> PathBuf {
        let mut path = self.root.clone();
        path.extend(names);
        path
    }

    /// A regular file's text; None for anything else (a FIFO would block),
    /// or a file too large to be configuration.
    fn read(&self, path: &Path) -> Option<String> {
        let file = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(self.host(path)?)
            .ok()?;
        if !file.metadata().ok()?.is_file() {
            return None;
        }
        let mut bytes = Vec::new();
        file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).ok()?;
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return None;
        }
        Some(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn is_file(&self, path: &Path) -> bool {
        self.host(path)
            .and_then(|p| fs::metadata(p).ok())
            .is_some_and(|m| m.is_file())
    }

    /// The names in a directory, sorted.
    fn list(&self, dir: &Path) -> Vec<String> {
        let Some(Ok(entries)) = self.host(dir).map(fs::read_dir) else {
            return Vec::new();
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }

    /// The files an absolute `pattern` names, sorted, as glob(3) finds them
    /// for `*` and `?` (in any component); `[...]` is taken literally.
    fn glob(&self, pattern: &Path) -> Vec<PathBuf> {
        if !pattern.is_absolute() {
            return Vec::new();
        }
        let mut found = vec![PathBuf::from("/")];
        for name in components(pattern) {
            let name = name.to_string_lossy();
            if !name.contains(['*', '?']) {
                found.iter_mut().for_each(|p| p.push(&*name));
                continue;
            }
            found = found
                .iter()
                .flat_map(|dir| {
                    self.list(dir)
                        .into_iter()
                        // As glob(3): a leading dot is matched only by one.
                        .filter(|n| {
                            (n.starts_with('.') == name.starts_with('.')) && wildcard(&name, n)
                        })
                        .map(move |n| dir.join(n))
                })
                .take(MAX_GLOB_MATCHES)
                .collect();
        }
        found.retain(|p| self.is_file(p));
        found.sort();
        found
    }
}

/// A path's names and `..`s, `.` and the root dropped.
fn components(path: &Path) -> Vec<OsString> {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some(OsString::from("..")),
            _ => None,
        })
        .collect()
}

/// Whether `name` matches `pattern`'s `*` (any run) and `?` (any one).
fn wildcard(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    let (mut i, mut j) = (0, 0);
    // Where the last `*` was, and the name position it now covers up to.
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        match p.get(i) {
            Some('*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(&c) if c == '?' || c == n[j] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    star = Some((si, sj + 1));
                    i = si + 1;
                    j = sj + 1;
                }
                None => return false,
            },
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

fn parent(path: &Path) -> &Path {
    path.parent().unwrap_or(Path::new("/"))
}

// ---------------------------------------------------------------- php-fpm

fn php_fpm_limit_of(pid: u32) -> Option<Limit> {
    let args = args(pid)?;
    let pool = php_fpm_pool_name(&args);
    let (master, master_args) = match pool {
        Some(_) => master_of(
            ppid(pid)?,
            |c| c.starts_with("php-fpm"),
            |a| php_fpm_conf(a).is_some(),
        )?,
        None => (pid, args),
    };
    let view = View::of(master);
    let conf = view.absolute(&php_fpm_conf(&master_args)?)?;
    php_fpm_limit(&php_fpm_pools(&view, &conf)?, pool.as_deref(), &conf)
}

/// A worker's pool, from its title (`php-fpm: pool www`).
fn php_fpm_pool_name(args: &[String]) -> Option<String> {
    let name = args.first()?.strip_prefix("php-fpm: pool ")?.trim();
    (!name.is_empty()).then(|| name.to_string())
}

/// The master's configuration file, from its title (`php-fpm: master
/// process (/etc/php/8.2/fpm/php-fpm.conf)`), or before it retitles itself,
/// from `-y`/`--fpm-config`.
fn php_fpm_conf(args: &[String]) -> Option<String> {
    if let Some(rest) = args.first()?.strip_prefix("php-fpm: master process (") {
        return Some(rest.rsplit_once(')')?.0.to_string());
    }
    let mut it = args.iter().skip(1);
    while let Some(arg) = it.next() {
        if arg == "-y" || arg == "--fpm-config" {
            return it.next().cloned();
        }
        if let Some(path) = arg.strip_prefix("--fpm-config=") {
            return Some(path.to_string());
        }
    }
    None
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Pool {
    name: String,
    max_children: Option<u32>,
    /// Where `max_children` was set (else where the pool was opened).
    source: PathBuf,
}

/// A worker's pool's `pm.max_children` (`pool` given), or the master's sum
/// over its pools; None when nothing in it sets one.
fn php_fpm_limit(pools: &[Pool], pool: Option<&str>, conf: &Path) -> Option<Limit> {
    let (value, source) = match pool {
        Some(name) => {
            let pool = pools.iter().find(|p| p.name == name)?;
            (pool.max_children?, pool.source.clone())
        }
        None => {
            let mut values = pools.iter().filter_map(|p| p.max_children).peekable();
            values.peek()?;
            (values.try_fold(0u32, u32::checked_add)?, conf.to_path_buf())
        }
    };
    Some(Limit {
        setting: "pm.max_children",
        value,
        source,
    })
}

/// The pools of the php-fpm configuration at `conf` (absolute), in the order
/// they first appear; None if `conf` cannot be read.
fn php_fpm_pools(view: &View, conf: &Path) -> Option<Vec<Pool>> {
    let mut pools = Vec::new();
    let mut section = None;
    php_fpm_file(view, conf, 0, &mut section, &mut pools).then_some(pools)
}

/// Reads one file into `pools`; whether it could be read. `section` carries
/// over into included files and back, as in php-fpm.
fn php_fpm_file(
    view: &View,
    path: &Path,
    depth: usize,
    section: &mut Option<usize>,
    pools: &mut Vec<Pool>,
) -> bool {
    let Some(text) = view.read(path) else {
        return false;
    };
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[') {
            let Some((name, _)) = name.split_once(']') else {
                continue;
            };
            let name = name.trim();
            *section = (name != "global").then(|| {
                // A pool named again (in another file) is the same pool.
                pools
                    .iter()
                    .position(|p| p.name == name)
                    .unwrap_or_else(|| {
                        pools.push(Pool {
                            name: name.to_string(),
                            max_children: None,
                            source: path.to_path_buf(),
                        });
                        pools.len() - 1
                    })
            });
            continue;
        }
        if line.starts_with(';') {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        let (key, value) = (key.trim(), ini_value(value));
        if key.eq_ignore_ascii_case("include") && depth < MAX_DEPTH {
            for file in php_fpm_include(view, parent(path), value) {
                php_fpm_file(view, &file, depth + 1, section, pools);
            }
        } else if key.eq_ignore_ascii_case("pm.max_children")
            && let Some(pool) = section.and_then(|i| pools.get_mut(i))
        {
            pool.max_children = value.parse().ok();
            pool.source = path.to_path_buf();
        }
    }
    true
}

/// The files an `include=` names. php-fpm resolves a relative one against
/// its install prefix (`/usr`, `/usr/local`…), which cannot be seen from
/// here; the nearest of the including file's directory and its ancestors
/// where the pattern finds files stands in (`/usr/local/etc/php-fpm.conf`'s
/// `include=etc/php-fpm.d/*.conf` finds `/usr/local/etc/php-fpm.d`).
fn php_fpm_include(view: &View, dir: &Path, pattern: &str) -> Vec<PathBuf> {
    if Path::new(pattern).is_absolute() {
        return view.glob(Path::new(pattern));
    }
    dir.ancestors()
        .map(|d| view.glob(&d.join(pattern)))
        .find(|files| !files.is_empty())
        .unwrap_or_default()
}

/// An INI value: quoted, or up to a `;` comment.
fn ini_value(raw: &str) -> &str {
    let raw = raw.trim();
    for quote in ['"', '\''] {
        if let Some(rest) = raw.strip_prefix(quote) {
            return rest.split_once(quote).map_or(rest, |(v, _)| v);
        }
    }
    raw.split_once(';').map_or(raw, |(v, _)| v).trim()
}

// ---------------------------------------------------------------- postgres

/// PostgreSQL's own default.
const POSTGRES_DEFAULT_MAX_CONNECTIONS: u32 = 100;

fn postgres_limit_of(pid: u32) -> Option<Limit> {
    // A backend's title is `postgres: 15/main: user db host idle`; the
    // postmaster keeps the arguments it started with.
    let (master, args) = master_of(
        pid,
        |c| c == "postgres" || c == "postmaster",
        |a| !a[0].starts_with("postgres: "),
    )?;
    postgres_limit(
        &View::of(master),
        &PostgresArgs::parse(&args),
        environ_var(master, "PGDATA").as_deref(),
        &cmdline_path(master),
    )
}

/// What the postmaster's command line says about its files and settings.
#[derive(Debug, Default, PartialEq, Eq)]
struct PostgresArgs {
    /// `-D`.
    data_dir: Option<String>,
    /// `-c name=value`, `--name=value`, `-N` (as `max_connections`); names
    /// lowercased, as GUC names are case-insensitive.
    settings: Vec<(String, String)>,
}

impl PostgresArgs {
    fn parse(args: &[String]) -> PostgresArgs {
        let mut out = PostgresArgs::default();
        let mut it = args.iter().skip(1);
        while let Some(arg) = it.next() {
            if let Some(long) = arg.strip_prefix("--") {
                if let Some((name, value)) = long.split_once('=') {
                    out.set(&name.replace('-', "_"), value);
                }
                continue;
            }
            let Some(short) = arg.strip_prefix('-') else {
                continue;
            };
            let mut chars = short.chars();
            let Some(flag) = chars.next() else {
                continue;
            };
            // postgres's getopt string: the options that take a value.
            if !"BcCDdfhkNprStW".contains(flag) {
                continue;
            }
            let attached = chars.as_str();
            let value = if attached.is_empty() {
                match it.next() {
                    Some(v) => v.as_str(),
                    None => break,
                }
            } else {
                attached
            };
            match flag {
                'D' => out.data_dir = Some(value.to_string()),
                'N' => out.set("max_connections", value),
                'c' => {
                    if let Some((name, value)) = value.split_once('=') {
                        out.set(&name.replace('-', "_"), value);
                    }
                }
                _ => {}
            }
        }
        out
    }

    fn set(&mut self, name: &str, value: &str) {
        self.settings
            .push((name.to_ascii_lowercase(), value.to_string()));
    }

    fn setting(&self, name: &str) -> Option<&str> {
        self.settings
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What the configuration files set, last setting winning.
#[derive(Clone, Debug, Default)]
struct PostgresFound {
    max_connections: Option<(u32, PathBuf)>,
    data_directory: Option<String>,
}

/// `max_connections` as the postmaster reads it: the main file
/// (`config_file`, else `postgresql.conf` in the data directory) with its
/// includes, then `postgresql.auto.conf` in the data directory (where ALTER
/// SYSTEM writes), then the command line over both. None if the main file
/// cannot be read.
fn postgres_limit(
    view: &View,
    args: &PostgresArgs,
    pgdata: Option<&str>,
    cmdline: &Path,
) -> Option<Limit> {
    let config_dir = args
        .data_dir
        .as_deref()
        .or(pgdata)
        .and_then(|d| view.absolute(d));
    let conf = match args.setting("config_file") {
        Some(file) => view.absolute(file)?,
        None => config_dir.as_ref()?.join("postgresql.conf"),
    };
    let mut found = PostgresFound::default();
    if !postgres_file(view, &conf, 0, &mut found) {
        return None;
    }
    // As the postmaster: data_directory, wherever set, over -D.
    let data_dir = args
        .setting("data_directory")
        .or(found.data_directory.as_deref())
        .and_then(|d| view.absolute(d))
        .or(config_dir);
    if let Some(dir) = data_dir {
        postgres_file(view, &dir.join("postgresql.auto.conf"), 0, &mut found);
    }
    let (value, source) = match args.setting("max_connections").and_then(postgres_int) {
        Some(value) => (value, cmdline.to_path_buf()),
        None => found
            .max_connections
            .unwrap_or((POSTGRES_DEFAULT_MAX_CONNECTIONS, conf)),
    };
    Some(Limit {
        setting: "max_connections",
        value,
        source,
    })
}

/// Reads one file into `found`, following its includes where they appear;
/// whether it could be read.
fn postgres_file(view: &View, path: &Path, depth: usize, found: &mut PostgresFound) -> bool {
    let Some(text) = view.read(path) else {
        return false;
    };
    let dir = parent(path);
    for (name, value) in text.lines().filter_map(postgres_line) {
        match name.as_str() {
            "include" | "include_if_exists" if depth < MAX_DEPTH => {
                postgres_file(view, &dir.join(&value), depth + 1, found);
            }
            "include_dir" if depth < MAX_DEPTH => {
                let dir = dir.join(&value);
                for name in view.list(&dir) {
                    let file = dir.join(&name);
                    if name.ends_with(".conf") && !name.starts_with('.') && view.is_file(&file) {
                        postgres_file(view, &file, depth + 1, found);
                    }
                }
            }
            "max_connections" => {
                if let Some(v) = postgres_int(&value) {
                    found.max_connections = Some((v, path.to_path_buf()));
                }
            }
            "data_directory" => found.data_directory = Some(value),
            _ => {}
        }
    }
    true
}

/// One `name [=] value [# comment]` line, the name lowercased, the value
/// unquoted; None for a comment, blank or garbled line.
fn postgres_line(line: &str) -> Option<(String, String)> {
    let line = line.trim_start();
    let end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '$')))
        .unwrap_or(line.len());
    if end == 0 {
        return None;
    }
    let name = line[..end].to_ascii_lowercase();
    let rest = line[end..].trim_start();
    let rest = rest.strip_prefix('=').unwrap_or(rest).trim_start();
    let value = match rest.strip_prefix('\'') {
        Some(quoted) => {
            let mut value = String::new();
            let mut chars = quoted.chars();
            loop {
                match chars.next()? {
                    '\'' if chars.as_str().starts_with('\'') => {
                        chars.next();
                        value.push('\'');
                    }
                    '\'' => break,
                    '\\' => value.push(chars.next()?),
                    c => value.push(c),
                }
            }
            value
        }
        None => {
            let value = rest.split(|c: char| c.is_whitespace() || c == '#').next()?;
            if value.is_empty() {
                return None;
            }
            value.to_string()
        }
    };
    Some((name, value))
}

/// An integer setting as postgres parses one: decimal, `0x` hex, `0`
/// octal (strtol's base 0), or a number with a fraction, rounded.
fn postgres_int(value: &str) -> Option<u32> {
    let v = value.trim();
    let parsed = if let Some(hex) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        u32::from_str_radix(hex, 16).ok()
    } else if v.len() > 1
        && let Some(oct) = v.strip_prefix('0')
        && oct.bytes().all(|b| b.is_ascii_digit())
    {
        u32::from_str_radix(oct, 8).ok()
    } else {
        v.parse().ok()
    };
    parsed.or_else(|| {
        let f: f64 = v.parse().ok()?;
        let r = f.round();
        (r.is_finite() && (0.0..=f64::from(u32::MAX)).contains(&r)).then_some(r as u32)
    })
}

// ---------------------------------------------------------------- nginx

/// nginx's defaults.
const NGINX_DEFAULT_WORKER_CONNECTIONS: u32 = 512;
const NGINX_DEFAULT_CONF: &str = "/etc/nginx/nginx.conf";

fn nginx_limit_of(pid: u32) -> Option<Limit> {
    let (master, args) = master_of(pid, |c| c == "nginx", |a| nginx_words(a).is_some())?;
    let view = View::of(master);
    let options = NginxArgs::parse(&nginx_words(&args)?);
    nginx_limit(&view, &options, cpus_allowed(master), &cmdline_path(master))
}

/// The master's arguments as words: from its title (`nginx: master process
/// /usr/sbin/nginx -c /etc/nginx/nginx.conf`), or its arguments when it did
/// not retitle itself (`master_process off`). None for a worker, cache
/// manager or loader.
fn nginx_words(args: &[String]) -> Option<Vec<String>> {
    let first = args.first()?;
    let Some(title) = first.strip_prefix("nginx: ") else {
        return Some(args.to_vec());
    };
    let command = title.strip_prefix("master process")?;
    Some(
        command
            .split_whitespace()
            .map(str::to_string)
            .chain(args[1..].iter().cloned())
            .collect(),
    )
}

#[derive(Debug, Default, PartialEq, Eq)]
struct NginxArgs {
    /// `-c`.
    conf: Option<String>,
    /// `-p`.
    prefix: Option<String>,
    /// `-g`: directives of the main context.
    globals: String,
}

impl NginxArgs {
    /// `words[0]` is the program. A title joins the arguments with spaces,
    /// so `-g daemon on; master_process on;` runs to the next option.
    fn parse(words: &[String]) -> NginxArgs {
        let mut out = NginxArgs::default();
        let mut it = words.iter().skip(1).peekable();
        while let Some(word) = it.next() {
            let Some(rest) = word.strip_prefix('-') else {
                continue;
            };
            let mut chars = rest.chars();
            let Some(flag) = chars.next() else {
                continue;
            };
            let attached = chars.as_str();
            let mut value = || match attached {
                "" => it.next().cloned(),
                a => Some(a.to_string()),
            };
            match flag {
                'c' => out.conf = value(),
                'p' => out.prefix = value(),
                'g' => {
                    let mut globals = value().unwrap_or_default();
                    while let Some(more) = it.next_if(|w| !w.starts_with('-')) {
                        globals.push(' ');
                        globals.push_str(more);
                    }
                    out.globals.push_str(&globals);
                    out.globals.push('\n');
                }
                _ => {}
            }
        }
        out
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NginxProcesses {
    Count(u32),
    Auto,
}

#[derive(Clone, Debug, Default)]
struct NginxFound {
    processes: Option<NginxProcesses>,
    connections: Option<(u32, PathBuf)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NginxContext {
    Main,
    Events,
    /// http, stream, mail…: nothing there bounds connections.
    Other,
}

/// `worker_connections` × `worker_processes` by the configuration `args`
/// name (`-c`, else `/etc/nginx/nginx.conf`, else `conf/nginx.conf` under
/// the prefix) and `-g`; `cpus` stands for `auto`. None if the main file
/// cannot be read or is garbled.
fn nginx_limit(view: &View, args: &NginxArgs, cpus: Option<u32>, cmdline: &Path) -> Option<Limit> {
    let prefix = args.prefix.as_deref().and_then(|p| view.absolute(p));
    let conf = match args.conf.as_deref() {
        Some(conf) => match &prefix {
            Some(prefix) => prefix.join(conf),
            None => view.absolute(conf)?,
        },
        None => {
            // Where a build from source looks, under its prefix.
            let built_in = prefix
                .unwrap_or_else(|| PathBuf::from("/usr/local/nginx"))
                .join("conf/nginx.conf");
            [PathBuf::from(NGINX_DEFAULT_CONF), built_in]
                .into_iter()
                .find(|c| view.is_file(c))?
        }
    };
    let mut found = NginxFound::default();
    // Includes are relative to the main file's directory, wherever they are.
    let conf_dir = parent(&conf).to_path_buf();
    let text = view.read(&conf)?;
    if !nginx_text(
        view,
        &text,
        &conf,
        &conf_dir,
        NginxContext::Main,
        0,
        &mut found,
    ) {
        return None;
    }
    if !args.globals.is_empty() {
        nginx_text(
            view,
            &args.globals,
            cmdline,
            &conf_dir,
            NginxContext::Main,
            0,
            &mut found,
        );
    }
    let processes = match found.processes {
        None => 1,
        Some(NginxProcesses::Count(n)) => n,
        Some(NginxProcesses::Auto) => cpus?,
    };
    let (connections, source) = found
        .connections
        .unwrap_or((NGINX_DEFAULT_WORKER_CONNECTIONS, conf));
    Some(Limit {
        setting: "worker_connections",
        value: connections.checked_mul(processes)?,
        source,
    })
}

/// Reads one file's (or `-g`'s) directives into `found`, only when it is
/// whole (nginx would refuse a garbled one); whether it was.
fn nginx_text(
    view: &View,
    text: &str,
    path: &Path,
    conf_dir: &Path,
    context: NginxContext,
    depth: usize,
    found: &mut NginxFound,
) -> bool {
    let Some(tokens) = nginx_tokens(text) else {
        return false;
    };
    let mut here = found.clone();
    let mut stack = vec![context];
    for token in tokens {
        let context = *stack.last().unwrap_or(&NginxContext::Other);
        match token {
            NginxToken::Open(words) => stack.push(match (context, words[0].as_str()) {
                (NginxContext::Main, "events") => NginxContext::Events,
                _ => NginxContext::Other,
            }),
            NginxToken::Close => {
                if stack.len() == 1 {
                    return false;
                }
                stack.pop();
            }
            NginxToken::Directive(words) => {
                let arg = words.get(1).map(String::as_str);
                match (context, words[0].as_str(), arg) {
                    (NginxContext::Main, "worker_processes", Some("auto")) => {
                        here.processes = Some(NginxProcesses::Auto);
                    }
                    (NginxContext::Main, "worker_processes", Some(n)) => {
                        if let Ok(n) = n.parse() {
                            here.processes = Some(NginxProcesses::Count(n));
                        }
                    }
                    (NginxContext::Events, "worker_connections", Some(n)) => {
                        if let Ok(n) = n.parse() {
                            here.connections = Some((n, path.to_path_buf()));
                        }
                    }
                    (NginxContext::Main | NginxContext::Events, "include", Some(pattern))
                        if depth < MAX_DEPTH =>
                    {
                        let pattern = conf_dir.join(pattern);
                        // glob(3) only for a pattern; a plain name may name
                        // a missing file, which nginx would refuse.
                        let files = if pattern.to_string_lossy().contains(['*', '?']) {
                            view.glob(&pattern)
                        } else {
                            vec![pattern]
                        };
                        for file in files {
                            if let Some(text) = view.read(&file) {
                                nginx_text(
                                    view,
                                    &text,
                                    &file,
                                    conf_dir,
                                    context,
                                    depth + 1,
                                    &mut here,
                                );
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    if stack.len() != 1 {
        return false;
    }
    *found = here;
    true
}

#[derive(Debug, PartialEq, Eq)]
enum NginxToken {
    /// `name args…;`
    Directive(Vec<String>),
    /// `name args… {`
    Open(Vec<String>),
    Close,
}

/// nginx's configuration syntax as tokens: words split by blanks, quoted
/// with `"` or `'` (backslash escapes), `#` comments at a word's start,
/// `${var}` kept whole. None if garbled (an unclosed quote, a directive
/// without its `;`, a brace with nothing before it).
fn nginx_tokens(text: &str) -> Option<Vec<NginxToken>> {
    let mut tokens = Vec::new();
    let mut words: Vec<String> = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {}
            '#' => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
            }
            ';' | '{' if words.is_empty() => return None,
            ';' => tokens.push(NginxToken::Directive(std::mem::take(&mut words))),
            '{' => tokens.push(NginxToken::Open(std::mem::take(&mut words))),
            '}' if !words.is_empty() => return None,
            '}' => tokens.push(NginxToken::Close),
            '"' | '\'' => {
                let mut word = String::new();
                loop {
                    match chars.next()? {
                        q if q == c => break,
                        '\\' => match chars.next()? {
                            'n' => word.push('\n'),
                            't' => word.push('\t'),
                            'r' => word.push('\r'),
                            e @ ('"' | '\'' | '\\') => word.push(e),
                            e => {
                                word.push('\\');
                                word.push(e);
                            }
                        },
                        other => word.push(other),
                    }
                }
                words.push(word);
            }
            first => {
                let mut word = String::new();
                let mut next = Some(first);
                while let Some(c) = next {
                    match c {
                        '\\' => {
                            if let Some(e) = chars.next() {
                                word.push(e);
                            }
                        }
                        '$' if chars.peek() == Some(&'{') => {
                            word.push('$');
                            for c in chars.by_ref() {
                                word.push(c);
                                if c == '}' {
                                    break;
                                }
                            }
                        }
                        c => word.push(c),
                    }
                    next = chars.next_if(|&c| !c.is_whitespace() && !matches!(c, ';' | '{' | '}'));
                }
                words.push(word);
            }
        }
    }
    words.is_empty().then_some(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the temp dir standing in for a process's root.
    struct Root(PathBuf);

    impl Root {
        fn new(name: &str) -> Root {
            use std::sync::atomic::{AtomicU32, Ordering};
            static NEXT: AtomicU32 = AtomicU32::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dir = std::env::temp_dir().join(format!(
                "stackprobe-limits-{name}-{}-{n}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&dir);
            fs::create_dir_all(&dir).unwrap();
            Root(dir)
        }

        /// Writes `text` at the process's absolute `path`.
        fn write(&self, path: &str, text: &str) -> &Root {
            let host = self.0.join(path.trim_start_matches('/'));
            fs::create_dir_all(host.parent().unwrap()).unwrap();
            fs::write(host, text).unwrap();
            self
        }

        fn symlink(&self, path: &str, target: &str) -> &Root {
            let host = self.0.join(path.trim_start_matches('/'));
            fs::create_dir_all(host.parent().unwrap()).unwrap();
            std::os::unix::fs::symlink(target, host).unwrap();
            self
        }

        fn view(&self, cwd: &str) -> View {
            View {
                root: self.0.clone(),
                cwd: Some(PathBuf::from(cwd)),
            }
        }
    }

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    fn limit(setting: &'static str, value: u32, source: &str) -> Option<Limit> {
        Some(Limit {
            setting,
            value,
            source: PathBuf::from(source),
        })
    }

    #[test]
    fn php_fpm_pools_across_includes_comments_and_quotes() {
        let root = Root::new("php");
        root.write(
            "/etc/php/8.2/fpm/php-fpm.conf",
            "[global]\n; pm.max_children = 999 is not a pool's\npid = /run/php/php8.2-fpm.pid\n\
             include=/etc/php/8.2/fpm/pool.d/*.conf\n",
        )
        .write(
            "/etc/php/8.2/fpm/pool.d/www.conf",
            "[www]\nuser = www-data\npm = dynamic\n;pm.max_children = 1\npm.max_children = 5\n",
        )
        .write(
            "/etc/php/8.2/fpm/pool.d/api.conf",
            "[api]  ; the JSON pool\npm = static\npm.max_children = \"12\" ; quoted\n",
        )
        .write(
            "/etc/php/8.2/fpm/pool.d/nolimit.conf",
            "[nolimit]\npm = ondemand\n",
        )
        .write(
            "/etc/php/8.2/fpm/pool.d/www.conf.dpkg-old",
            "[old]\npm.max_children = 70\n",
        )
        .write(
            "/etc/php/8.2/fpm/pool.d/.hidden.conf",
            "[hidden]\npm.max_children = 80\n",
        );
        let view = root.view("/");
        let conf = Path::new("/etc/php/8.2/fpm/php-fpm.conf");
        let pools = php_fpm_pools(&view, conf).unwrap();
        let names: Vec<&str> = pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["api", "nolimit", "www"], "sorted as glob(3) sorts");
        assert_eq!(
            php_fpm_limit(&pools, Some("www"), conf),
            limit("pm.max_children", 5, "/etc/php/8.2/fpm/pool.d/www.conf")
        );
        assert_eq!(
            php_fpm_limit(&pools, Some("api"), conf),
            limit("pm.max_children", 12, "/etc/php/8.2/fpm/pool.d/api.conf")
        );
        assert_eq!(php_fpm_limit(&pools, Some("nolimit"), conf), None);
        assert_eq!(php_fpm_limit(&pools, Some("absent"), conf), None);
        assert_eq!(
            php_fpm_limit(&pools, None, conf),
            limit("pm.max_children", 17, "/etc/php/8.2/fpm/php-fpm.conf"),
            "the master: the sum over its pools"
        );
        assert_eq!(
            php_fpm_pools(&view, Path::new("/etc/php/missing.conf")),
            None
        );
    }

    #[test]
    fn php_fpm_relative_include_and_pool_named_twice() {
        // The official docker image: prefix /usr/local, relative include.
        let root = Root::new("php-docker");
        root.write(
            "/usr/local/etc/php-fpm.conf",
            "[global]\ninclude=etc/php-fpm.d/*.conf\n",
        )
        .write(
            "/usr/local/etc/php-fpm.d/www.conf",
            "[www]\npm.max_children = 5\n",
        )
        .write(
            "/usr/local/etc/php-fpm.d/zz-docker.conf",
            "[www]\npm.max_children = '40'\n",
        );
        let conf = Path::new("/usr/local/etc/php-fpm.conf");
        let pools = php_fpm_pools(&root.view("/"), conf).unwrap();
        assert_eq!(pools.len(), 1);
        assert_eq!(
            php_fpm_limit(&pools, Some("www"), conf),
            limit(
                "pm.max_children",
                40,
                "/usr/local/etc/php-fpm.d/zz-docker.conf"
            )
        );
    }

    #[test]
    fn php_fpm_include_loop_is_bounded() {
        let root = Root::new("php-loop");
        root.write(
            "/etc/fpm.conf",
            "include=/etc/fpm.conf\n[www]\npm.max_children=3\n",
        );
        let conf = Path::new("/etc/fpm.conf");
        let pools = php_fpm_pools(&root.view("/"), conf).unwrap();
        assert_eq!(php_fpm_limit(&pools, None, conf).unwrap().value, 3);
    }

    #[test]
    fn php_fpm_titles() {
        let master = strings(&["php-fpm: master process (/etc/php/8.2/fpm/php-fpm.conf)   "]);
        assert_eq!(
            php_fpm_conf(&master).as_deref(),
            Some("/etc/php/8.2/fpm/php-fpm.conf")
        );
        assert_eq!(php_fpm_pool_name(&master), None);
        let worker = strings(&["php-fpm: pool www        "]);
        assert_eq!(php_fpm_pool_name(&worker).as_deref(), Some("www"));
        assert_eq!(php_fpm_conf(&worker), None);
        let starting = strings(&[
            "/usr/sbin/php-fpm8.2",
            "--nodaemonize",
            "--fpm-config",
            "/etc/x.conf",
        ]);
        assert_eq!(php_fpm_conf(&starting).as_deref(), Some("/etc/x.conf"));
        assert_eq!(php_fpm_conf(&[]), None);
    }

    #[test]
    fn postgres_include_dir_auto_conf_and_default() {
        let root = Root::new("pg");
        root.write(
            "/etc/postgresql/15/main/postgresql.conf",
            "data_directory = '/var/lib/postgresql/15/main'\t# use data in another directory\n\
             #max_connections = 7\n\
             max_connections = 100\t\t\t# (change requires restart)\n\
             include_dir = 'conf.d'\n\
             include_if_exists 'missing.conf'\n",
        )
        .write(
            "/etc/postgresql/15/main/conf.d/10-tuning.conf",
            "MAX_CONNECTIONS 150\n",
        )
        .write(
            "/etc/postgresql/15/main/conf.d/20-more.conf",
            "include '../extra/more.conf'\n",
        )
        .write(
            "/etc/postgresql/15/main/extra/more.conf",
            "max_connections='180'\n",
        )
        .write(
            "/etc/postgresql/15/main/conf.d/30.conf.off",
            "max_connections = 1\n",
        )
        .write(
            "/etc/postgresql/15/main/conf.d/.40.conf",
            "max_connections = 2\n",
        );
        let view = root.view("/");
        let debian = PostgresArgs::parse(&strings(&[
            "/usr/lib/postgresql/15/bin/postgres",
            "-D",
            "/var/lib/postgresql/15/main",
            "-c",
            "config_file=/etc/postgresql/15/main/postgresql.conf",
        ]));
        let cmdline = Path::new("/proc/1/cmdline");
        assert_eq!(
            postgres_limit(&view, &debian, None, cmdline),
            limit(
                "max_connections",
                180,
                "/etc/postgresql/15/main/conf.d/../extra/more.conf"
            ),
            "include_dir's files in order, an include relative to its file"
        );
        // ALTER SYSTEM's file in the data directory overrides.
        root.write(
            "/var/lib/postgresql/15/main/postgresql.auto.conf",
            "# Do not edit this file manually!\nmax_connections = '250'\n",
        );
        assert_eq!(
            postgres_limit(&view, &debian, None, cmdline),
            limit(
                "max_connections",
                250,
                "/var/lib/postgresql/15/main/postgresql.auto.conf"
            )
        );
        // And the command line over both.
        let mut with_n = debian;
        with_n
            .settings
            .push(("max_connections".into(), "300".into()));
        assert_eq!(
            postgres_limit(&view, &with_n, None, cmdline),
            limit("max_connections", 300, "/proc/1/cmdline")
        );

        // The docker image: `postgres` alone, PGDATA in the environment, the
        // main file in the data directory and nothing setting the value.
        root.write(
            "/var/lib/postgresql/data/postgresql.conf",
            "listen_addresses = '*'\n",
        );
        let bare = PostgresArgs::parse(&strings(&["postgres"]));
        assert_eq!(
            postgres_limit(&view, &bare, Some("/var/lib/postgresql/data"), cmdline),
            limit(
                "max_connections",
                100,
                "/var/lib/postgresql/data/postgresql.conf"
            ),
            "PostgreSQL's default, the main file as the source"
        );
        assert_eq!(
            postgres_limit(&view, &bare, None, cmdline),
            None,
            "no data directory"
        );
        // A relative -D against the working directory.
        let relative = PostgresArgs::parse(&strings(&["postgres", "-Ddata"]));
        assert_eq!(
            postgres_limit(&root.view("/var/lib/postgresql"), &relative, None, cmdline)
                .map(|l| l.value),
            Some(100)
        );
    }

    #[test]
    fn postgres_include_loop_is_bounded() {
        let root = Root::new("pg-loop");
        root.write(
            "/pg/postgresql.conf",
            "include 'postgresql.conf'\nmax_connections 20\n",
        );
        let args = PostgresArgs::parse(&strings(&["postgres", "-D", "/pg"]));
        assert_eq!(
            postgres_limit(&root.view("/"), &args, None, Path::new("/c")).map(|l| l.value),
            Some(20)
        );
    }

    #[test]
    fn postgres_lines_and_arguments() {
        let line = postgres_line;
        assert_eq!(
            line("max_connections = 100 # x"),
            Some(("max_connections".into(), "100".into()))
        );
        assert_eq!(
            line("  Max_Connections 100"),
            Some(("max_connections".into(), "100".into()))
        );
        assert_eq!(
            line("search_path = 'a''b\\'c' # q"),
            Some(("search_path".into(), "a'b'c".into()))
        );
        assert_eq!(line("# max_connections = 1"), None);
        assert_eq!(line("max_connections ="), None);
        assert_eq!(line("x = 'unterminated"), None);
        assert_eq!(line(""), None);
        assert_eq!(postgres_int("100"), Some(100));
        assert_eq!(postgres_int("0x64"), Some(100));
        assert_eq!(postgres_int("0144"), Some(100));
        assert_eq!(postgres_int("99.6"), Some(100));
        assert_eq!(postgres_int("-1"), None);
        assert_eq!(postgres_int("many"), None);

        let args = PostgresArgs::parse(&strings(&[
            "postgres",
            "-p",
            "5433",
            "-N",
            "40",
            "--config-file=/c.conf",
            "-cmax_connections=50",
            "-D",
        ]));
        assert_eq!(args.data_dir, None, "-D without its value");
        assert_eq!(args.setting("config_file"), Some("/c.conf"));
        assert_eq!(args.setting("max_connections"), Some("50"), "the last wins");
        assert_eq!(args.setting("port"), None);
    }

    #[test]
    fn nginx_auto_workers_and_includes() {
        let root = Root::new("nginx");
        root.write(
            "/etc/nginx/nginx.conf",
            "user www-data;\nworker_processes auto; # one per CPU\npid /run/nginx.pid;\n\
             include /etc/nginx/modules-enabled/*.conf;\n\
             events {\n\tinclude events.d/*.conf;\n\t# worker_connections 1;\n}\n\
             http {\n\tworker_connections 3;\n\tinclude /etc/nginx/sites-enabled/*;\n\
             \tlog_format main '$remote_addr \"$request\" ${status}';\n}\n",
        )
        .write(
            "/etc/nginx/modules-enabled/50-mod.conf",
            "load_module modules/x.so;\n",
        )
        .write(
            "/etc/nginx/events.d/size.conf",
            "worker_connections \"768\";\nmulti_accept on;\n",
        )
        .write(
            "/etc/nginx/sites-enabled/default",
            "events { worker_connections 5; }\n",
        );
        let view = root.view("/");
        let cmdline = Path::new("/proc/1/cmdline");
        let args = NginxArgs::parse(
            &nginx_words(&strings(&[
                "nginx: master process /usr/sbin/nginx -g daemon on; master_process on;",
            ]))
            .unwrap(),
        );
        assert_eq!(args.conf, None);
        assert_eq!(
            nginx_limit(&view, &args, Some(4), cmdline),
            limit(
                "worker_connections",
                768 * 4,
                "/etc/nginx/events.d/size.conf"
            )
        );
        assert_eq!(
            nginx_limit(&view, &args, None, cmdline),
            None,
            "auto, CPUs unknown"
        );

        // -c, -g over the file, and nginx's defaults.
        root.write(
            "/srv/nginx.conf",
            "events {}\nhttp { server { listen 80; } }\n",
        );
        let args = NginxArgs::parse(
            &nginx_words(&strings(&[
                "nginx: master process nginx -c /srv/nginx.conf -g daemon off; worker_processes 3;",
            ]))
            .unwrap(),
        );
        assert_eq!(args.conf.as_deref(), Some("/srv/nginx.conf"));
        assert_eq!(
            nginx_limit(&view, &args, Some(4), cmdline),
            limit("worker_connections", 512 * 3, "/srv/nginx.conf")
        );

        // A garbled main file, a garbled include (skipped).
        root.write("/srv/broken.conf", "events { worker_connections 10;\n");
        let broken = NginxArgs {
            conf: Some("/srv/broken.conf".into()),
            ..NginxArgs::default()
        };
        assert_eq!(nginx_limit(&view, &broken, Some(1), cmdline), None);
        root.write(
            "/srv/ok.conf",
            "worker_processes 2; include bad.conf; events { worker_connections 10; }\n",
        )
        .write("/srv/bad.conf", "worker_processes 9 events {\n");
        let ok = NginxArgs {
            conf: Some("ok.conf".into()),
            prefix: Some("/srv".into()),
            ..NginxArgs::default()
        };
        assert_eq!(
            nginx_limit(&view, &ok, Some(1), cmdline),
            limit("worker_connections", 20, "/srv/ok.conf")
        );
    }

    #[test]
    fn nginx_titles_and_tokens() {
        assert_eq!(nginx_words(&strings(&["nginx: worker process"])), None);
        assert_eq!(
            nginx_words(&strings(&["nginx: cache manager process"])),
            None
        );
        let plain = strings(&["/usr/sbin/nginx", "-g", "daemon off;", "-c", "/x.conf"]);
        let args = NginxArgs::parse(&nginx_words(&plain).unwrap());
        assert_eq!(args.conf.as_deref(), Some("/x.conf"));
        assert_eq!(args.globals, "daemon off;\n");
        assert_eq!(
            NginxArgs::parse(&strings(&["nginx", "-c/y.conf"]))
                .conf
                .as_deref(),
            Some("/y.conf")
        );

        use NginxToken::*;
        let w = |ws: &[&str]| strings(ws);
        assert_eq!(
            nginx_tokens("a 'b c' \"d\\\"e\";#x\n k{ l $a${b c}; }"),
            Some(vec![
                Directive(w(&["a", "b c", "d\"e"])),
                Open(w(&["k"])),
                Directive(w(&["l", "$a${b c}"])),
                Close
            ])
        );
        assert_eq!(nginx_tokens("a 'b;"), None);
        assert_eq!(nginx_tokens("a b"), None);
        assert_eq!(nginx_tokens(";"), None);
        assert_eq!(nginx_tokens("{}"), None);
        assert_eq!(nginx_tokens(""), Some(vec![]));
    }

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), Some(7));
        assert_eq!(parse_cpu_list("0"), Some(1));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn globs_and_symlinks_stay_in_the_root() {
        assert!(wildcard("*.conf", "www.conf"));
        assert!(wildcard("*", "x"));
        assert!(wildcard("a*b*c", "aXbYbc"));
        assert!(wildcard("?.c*", "a.conf"));
        assert!(!wildcard("*.conf", "www.conf.bak"));
        assert!(!wildcard("?", ""));

        let root = Root::new("glob");
        root.write("/etc/a/one.conf", "1")
            .write("/etc/b/two.conf", "2")
            .write("/etc/b/skip.txt", "x")
            .symlink("/etc/link", "/etc/b")
            .symlink("/etc/up", "../../../../etc/a/one.conf");
        let view = root.view("/");
        assert_eq!(
            view.glob(Path::new("/etc/*/*.conf")),
            ["/etc/a/one.conf", "/etc/b/two.conf", "/etc/link/two.conf"].map(PathBuf::from),
            "through a linked directory too"
        );
        // An absolute link resolves inside the root, `..` stops at it.
        assert_eq!(
            view.read(Path::new("/etc/link/two.conf")).as_deref(),
            Some("2")
        );
        assert_eq!(view.read(Path::new("/../../etc/up")).as_deref(), Some("1"));
        assert_eq!(view.read(Path::new("/etc/b")), None, "a directory");
        assert_eq!(view.read(Path::new("relative")), None);
        root.symlink("/etc/loop", "/etc/loop");
        assert_eq!(view.read(Path::new("/etc/loop")), None);
    }

    /// End to end through /proc: a script named `nginx` (so its comm is)
    /// stands in for a master started with `-c`; it waits on its stdin, so
    /// it leaves no child behind.
    #[test]
    fn reads_a_running_nginx_masters_limit() {
        let root = Root::new("proc");
        root.write(
            "/nginx.conf",
            "worker_processes auto;\nevents { worker_connections 1000; }\n",
        )
        .write("/nginx", "#!/bin/sh\nread line\n");
        let script = root.0.join("nginx");
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        let conf = root.0.join("nginx.conf");
        // Another test's fork may briefly hold the script open for writing.
        let mut child = (0..50)
            .find_map(|_| {
                match std::process::Command::new(&script)
                    .arg("-c")
                    .arg(&conf)
                    .stdin(std::process::Stdio::piped())
                    .spawn()
                {
                    Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {
                        std::thread::sleep(std::time::Duration::from_millis(20));
                        None
                    }
                    spawned => Some(spawned.unwrap()),
                }
            })
            .unwrap();
        // spawn returns once execve has let go of our memory, a moment
        // before the kernel renames the child and, later still, sets up its
        // arguments.
        for _ in 0..200 {
            let comm = procfs::comm(child.id());
            let args = args(child.id()).unwrap_or_default();
            if comm.as_deref() == Some("nginx") && args.iter().any(|a| a == "-c") {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let found = limit_of(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        // SAFETY: cpu_set_t is plain data; sched_getaffinity fills it.
        let cpus = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            assert_eq!(
                libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set),
                0
            );
            libc::CPU_COUNT(&set) as u32
        };
        assert_eq!(
            found,
            limit("worker_connections", 1000 * cpus, conf.to_str().unwrap())
        );
        assert_eq!(limit_of(std::process::id()), None, "no server");
    }
}
